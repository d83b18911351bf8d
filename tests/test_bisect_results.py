"""The answer goes back where the question came from: a bisect report attached to a snapshot
(written by the bisect's own writer) is what ``snapshots show`` tells first, what ``snapshots
export`` ships, and what the alert outbox sends one follow-up for -- once, across restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from webhook_receiver import Receiver, serve

from oom_sentinel.bisect.session.report import attach_to_snapshot
from oom_sentinel.config.settings import Settings, parse_settings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.alerts.notifiers import AppriseChannel
from oom_sentinel.daemon.classify.advice import Advice
from oom_sentinel.daemon.incidents.bisect_results import latest_report
from oom_sentinel.daemon.incidents.regression import BISECT_ADVICE_KEY, SUMMARY_SUFFIX
from oom_sentinel.daemon.incidents.snapshot import (
    SNAPSHOT_ID_PLACEHOLDER,
    SnapshotRef,
    snapshots_dir,
    write_snapshot,
)
from oom_sentinel.daemon.store.db import Store

CORE_BAD = "c" * 40
NODE_BAD = "d" * 40


def report(result: str = "found", **extra: Any) -> dict[str, Any]:
    """A report as bisect/session/report.py's build_report shapes it (the fields the daemon reads)."""
    culprits = [
        {
            "repo": "comfyui",
            "label": "ComfyUI",
            "commit": CORE_BAD,
            "subject": "Keep offloaded weights pinned between steps",
            "delta": {
                "pool": "vram",
                "parent_bytes": 2_340_000_000,
                "bytes": 3_972_000_000,
                "delta_bytes": 1_632_000_000,
                "lower_bound": False,
            },
        },
        {
            "repo": "node:ComfyUI-FastAlloc",
            "label": "custom_nodes/ComfyUI-FastAlloc",
            "commit": NODE_BAD,
            "subject": "Double the scratch buffer",
        },
    ]
    return {
        "format": 1,
        "tool": "oom-bisect",
        "result": result,
        "message": None if result == "found" else "good and bad used the same memory",
        "culprits": culprits if result == "found" else [],
        "measurements": 9,
        **extra,
    }


def _files(doc: dict[str, Any]) -> dict[str, bytes]:
    """What the bisect attaches: report.json and report.html (a page; the daemon only links it)."""
    return {
        "report.json": (json.dumps(doc, indent=2) + "\n").encode(),
        "report.html": b"<html><body>oom-bisect report</body></html>\n",
    }


def suspected(data_dir: Path, at: float = samples.T0) -> SnapshotRef:
    """A snapshot of a suspected regression, with the advice and summary that say to bisect."""
    content = samples.content(at=at)
    content = replace(
        content,
        incident=replace(
            content.incident,
            summary=content.incident.summary + SUMMARY_SUFFIX + SNAPSHOT_ID_PLACEHOLDER,
        ),
        advice=(
            Advice(
                BISECT_ADVICE_KEY,
                f"This workflow succeeded before the install changed. Run `oom-bisect "
                f"{SNAPSHOT_ID_PLACEHOLDER}` to find the commit.",
            ),
            *content.advice,
        ),
    )
    return write_snapshot(snapshots_dir(data_dir), content)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "OOM_SENTINEL_CONFIG")}
    env["TZ"] = "UTC"
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "snapshots", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_show_names_the_culprits_first_and_stops_asking_for_a_bisect(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ref = suspected(data)
    before = cli("show", ref.id, "--data-dir", str(data))
    assert before.returncode == 0, before.stderr
    assert f"oom-bisect {ref.id}" in before.stdout and "The answer" not in before.stdout

    attach_to_snapshot(ref.path, _files(report()))
    after = cli("show", ref.id, "--data-dir", str(data))
    assert after.returncode == 0, after.stderr
    text = after.stdout
    assert "oom-bisect" not in text.replace("The answer (oom-bisect)", "").replace(
        "oom-bisect found", ""
    )
    answer = text.index("oom-bisect found the changes that made it run out of memory:")
    assert answer < text.index("What failed")
    assert f'ComfyUI {CORE_BAD[:10]} "Keep offloaded weights pinned between steps" (+' in text
    assert f"custom_nodes/ComfyUI-FastAlloc {NODE_BAD[:10]}" in text
    assert str(ref.path / "bisect" / "report.html") in text
    assert "suspected regression" not in text.splitlines()[0]
    # the JSON view carries the answer too
    doc = json.loads(cli("show", ref.id, "--data-dir", str(data), "--json").stdout)
    assert doc["bisect"]["result"] == "found"
    assert [c["commit"] for c in doc["bisect"]["culprits"]] == [CORE_BAD, NODE_BAD]


def test_a_later_bisect_is_the_one_shown_and_not_reproduced_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ref = suspected(data)
    attach_to_snapshot(ref.path, _files(report("not-reproduced")))
    text = cli("show", ref.id, "--data-dir", str(data)).stdout
    assert "could not reproduce it" in text and "good and bad used the same memory" in text
    attach_to_snapshot(ref.path, _files(report()))  # bisect-2/
    latest = latest_report(ref.path)
    assert latest is not None and latest.folder == "bisect-2" and latest.result == "found"


def test_export_ships_the_attached_reports(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ref = suspected(data)
    attach_to_snapshot(ref.path, _files(report()))
    out = tmp_path / "bug.zip"
    proc = cli("export", ref.id, "--data-dir", str(data), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert {f"{ref.id}/bisect/report.json", f"{ref.id}/bisect/report.html"} <= names
        shipped = json.loads(zf.read(f"{ref.id}/bisect/report.json"))
    assert shipped["culprits"][0]["commit"] == CORE_BAD


def _settings(tmp_path: Path, receiver: Receiver) -> Settings:
    return parse_settings(
        {
            "data_dir": str(tmp_path / "data"),
            "alerts": {"urls": [receiver.url(path="hook")], "desktop_feed": False},
        },
        "config.toml",
    )


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _dispatcher(store: Store, settings: Settings, clock: Clock) -> AlertDispatcher:
    return AlertDispatcher(
        store,
        settings,
        [AppriseChannel(u) for u in settings.alerts.urls],
        clock=clock,
        snapshots_dir=snapshots_dir(settings.resolved_data_dir()),
    )


def test_one_follow_up_alert_per_finished_bisect_and_none_twice_after_a_restart(
    tmp_path: Path,
) -> None:
    import time

    with serve() as receiver:
        settings = _settings(tmp_path, receiver)
        data = settings.resolved_data_dir()
        ref = suspected(data)
        other = suspected(data, at=samples.T0 + 600)
        clock = Clock(time.time())
        store = Store.open(data)
        dispatcher = _dispatcher(store, settings, clock)
        assert dispatcher.tick() == []  # nothing attached yet
        attach_to_snapshot(other.path, _files(report("error")))  # answers nothing
        attach_to_snapshot(ref.path, _files(report()))
        assert dispatcher.tick() == []  # the next scan is not due yet
        clock.now += 31
        (alert,) = dispatcher.tick()
        assert alert.title == (
            f"Culprit found for {ref.id}: ComfyUI, custom_nodes/ComfyUI-FastAlloc"
        )
        assert (
            'ComfyUI cccccccccc "Keep offloaded weights pinned between steps" (+1.52 GiB)'
            in alert.body
        )
        assert f"oom-sentinel snapshots show {ref.id}" in alert.body
        (sent,) = dispatcher.deliver_now()
        assert sent.ok
        clock.now += 31
        assert dispatcher.tick() == []  # seen
        store.close()

        # a restart: everything is scanned again, nothing is news
        store = Store.open(data)
        dispatcher = _dispatcher(store, settings, clock)
        clock.now += 31
        assert dispatcher.tick() == []
        # a second bisect of the same snapshot is news
        attach_to_snapshot(ref.path, _files(report()))
        clock.now += 31
        (again,) = dispatcher.tick()
        assert again.key.endswith("/bisect-2")
        dispatcher.deliver_now()
        store.close()
        bodies = [r.json() for r in receiver.received()]
        assert [b["title"] for b in bodies] == [alert.title, again.title]


@pytest.mark.parametrize("age_s", [8 * 86400.0])
def test_an_old_report_found_at_start_is_not_news(tmp_path: Path, age_s: float) -> None:
    import time

    with serve() as receiver:
        settings = _settings(tmp_path, receiver)
        data = settings.resolved_data_dir()
        ref = suspected(data)
        attached = attach_to_snapshot(ref.path, _files(report()))
        old = time.time() - age_s
        os.utime(attached / "report.json", (old, old))
        with Store.open(data) as store:
            assert _dispatcher(store, settings, Clock(time.time())).tick() == []


def test_the_bisect_reports_own_delta_line_is_the_one_shown(tmp_path: Path) -> None:
    """The daemon shows the line the bisect wrote (``delta_text``), not a figure of its own."""
    from oom_sentinel.bisect.session.report import delta_text

    doc = report()
    first = doc["culprits"][0]
    first["delta"]["lower_bound"] = True
    first["delta_text"] = delta_text(first)
    assert first["delta_text"].startswith("≥ +1.52 GiB VRAM in ComfyUI's state")
    ref = suspected(tmp_path / "data")
    attach_to_snapshot(ref.path, _files(doc))
    answer = latest_report(ref.path)
    assert answer is not None
    assert answer.culprits[0].delta == first["delta_text"]
    assert answer.culprits[1].delta is None  # no figure: none invented


def test_the_snapshot_answer_names_the_nodes_whose_peak_rose(tmp_path: Path) -> None:
    """A report's ``nodes_text`` (bisect/measure/node_peaks.py) reaches the daemon's answer line."""
    from oom_sentinel.bisect.measure.node_peaks import culprit_nodes, nodes_text

    doc = report()
    first = doc["culprits"][0]
    parent = [{"node_id": "2", "class_type": "ImageScaleBy", "peak_vram_bytes": 2459 * 1024**2}]
    mine = [{"node_id": "2", "class_type": "ImageScaleBy", "peak_vram_bytes": 4091 * 1024**2}]
    first["nodes_text"] = nodes_text(culprit_nodes(parent, mine, "vram"))
    ref = suspected(tmp_path / "data")
    attach_to_snapshot(ref.path, _files(doc))
    answer = latest_report(ref.path)
    assert answer is not None
    assert answer.culprits[0].nodes == "ImageScaleBy #2: 2.40 GiB → 4.00 GiB VRAM"
    assert answer.culprits[0].line().endswith("; nodes: ImageScaleBy #2: 2.40 GiB → 4.00 GiB VRAM")
    assert answer.culprits[1].nodes is None
    assert answer.to_json()["culprits"][0]["nodes"] == answer.culprits[0].nodes


# -- the report's model (daemon/incidents/bisect_report_model.py) -----------------------------------------


def test_a_report_of_an_older_or_newer_bisect_reads_with_defaults(tmp_path: Path) -> None:
    """An older bisect wrote fewer fields, a newer one more: both read; what is absent is
    unknown, not invented."""
    ref = suspected(tmp_path / "data")
    old = {"result": "found", "culprits": [{"repo": "ComfyUI/", "commit": "b" * 40}]}
    attach_to_snapshot(ref.path, _files(old))
    answer = latest_report(ref.path)
    assert answer is not None and answer.measurements is None and answer.message is None
    assert [c.line() for c in answer.culprits] == ["ComfyUI/ " + "b" * 10]
    newer = {**report(), "format": 2, "confidence_model": {"kind": "bayes"}}
    newer["culprits"][0]["blame"] = ["someone"]
    attach_to_snapshot(ref.path, _files(newer))
    answer = latest_report(ref.path)
    assert answer is not None and answer.folder == "bisect-2" and answer.measurements == 9


def test_a_report_with_a_field_of_another_type_is_not_read(tmp_path: Path) -> None:
    """Not half-read either: a culprit whose figures are text is not shown as an answer."""
    ref = suspected(tmp_path / "data")
    doc = report()
    doc["culprits"][0]["delta"]["delta_bytes"] = "1.5 GiB"
    attach_to_snapshot(ref.path, _files(doc))
    assert latest_report(ref.path) is None


def test_the_bisect_refuses_to_write_a_report_its_model_does_not_match(tmp_path: Path) -> None:
    from oom_sentinel.bisect.session.report import write_reports

    doc = report()
    doc["measurements"] = "nine"
    with pytest.raises(ValueError, match=r"^report.json: measurements: input should be a valid"):
        write_reports(doc, tmp_path / "report")
    assert not (tmp_path / "report" / "report.json").exists()
