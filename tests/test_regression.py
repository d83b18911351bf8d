"""Suspected regression or not: the decision, its snapshot section, advice and summary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import snapshot_samples as samples

from oom_sentinel.daemon.incidents.regression import (
    BISECT_ADVICE_KEY,
    GoodRun,
    RegressionVerdict,
    assess_regression,
    good_run_from_record,
    same_code_state,
)
from oom_sentinel.daemon.incidents.snapshot import (
    SNAPSHOT_ID_PLACEHOLDER,
    load_snapshot,
    write_snapshot,
)
from oom_sentinel.daemon.install.state import CoreState, CustomNode, InstallState
from oom_sentinel.daemon.store.runs import RunRecord

CORE, NODE_OLD, NODE_NEW = ("c" * 40, "1" * 40, "2" * 40)
A = InstallState(
    CoreState(commit=CORE),
    (CustomNode("pack", "git", commit=NODE_OLD, entry="pack"),),
    pip=("torch==2.5.1",),
)
B = InstallState(
    CoreState(commit=CORE),
    (CustomNode("pack", "git", commit=NODE_NEW, entry="pack"),),
    pip=("torch==2.5.1",),
)
STATES = {A.state_id: A, B.state_id: B}
W, OTHER = "fp-w", "fp-other"


def run(
    prompt_id: str,
    state: InstallState | None,
    ended_s: float,
    fingerprint: str | None = W,
    *,
    instance: str = "main",
    cached: bool = False,
) -> GoodRun:
    return GoodRun(
        prompt_id=prompt_id,
        instance=instance,
        fingerprint=fingerprint,
        state_id=state.state_id if state is not None else None,
        ended_s=ended_s,
        peak_vram_bytes=5 << 30,
        peak_ram_bytes=3 << 30,
        peak_gpu_used_bytes=6 << 30,
        fully_cached=cached,
    )


def assess(
    bad: InstallState | None, runs: Sequence[GoodRun], fingerprint: str | None = W
) -> RegressionVerdict:
    return assess_regression(
        instance="main", bad_state=bad, fingerprint=fingerprint, runs=runs, state=STATES.get
    )


def test_a_workflow_that_fit_under_an_earlier_state_is_a_suspected_regression() -> None:
    verdict = assess(B, [run("p1", A, 100.0), run("p0", A, 50.0)])
    assert verdict.suspected and verdict.match == "workflow"
    assert verdict.last_good_run is not None and verdict.last_good_run.prompt_id == "p1"
    assert verdict.last_good_state == A and verdict.bad_state == B
    section = verdict.to_section()
    assert section["suspected"] is True
    assert section["bisect_command"] == f"oom-bisect {SNAPSHOT_ID_PLACEHOLDER}"
    assert section["last_good_state"]["state_id"] == A.state_id
    assert InstallState.from_dict(section["bad_state"]) == B
    assert section["last_good_run"] == {
        "prompt_id": "p1",
        "instance": "main",
        "finished": "1970-01-01T00:01:40.000Z",
        "state_id": A.state_id,
        "peak_vram_bytes": 5 << 30,
        "peak_ram_bytes": 3 << 30,
        "peak_gpu_used_bytes": 6 << 30,
    }
    (repo,) = section["diff"]["repos"]
    assert (repo["repo"], repo["old_commit"], repo["new_commit"]) == ("pack", NODE_OLD, NODE_NEW)
    assert section["diff"]["pip"] == []
    advice = verdict.advice()
    assert advice is not None and advice.key == BISECT_ADVICE_KEY
    assert f"`oom-bisect {SNAPSHOT_ID_PLACEHOLDER}`" in advice.text
    assert "custom_nodes/pack moved" in advice.text
    assert verdict.summary_suffix() is not None
    assert json.loads(json.dumps(section)) == section


@pytest.mark.parametrize(
    ("runs", "bad", "fingerprint", "reason"),
    [
        ([run("p1", A, 10.0), run("p2", B, 20.0)], B, W, "has not changed since this workflow"),
        ([], B, W, "no earlier successful run"),
        ([run("p1", A, 10.0)], None, W, "is unknown"),
        ([run("p1", None, 10.0)], B, W, "no install state was recorded"),
        (
            [run("p1", InstallState(CoreState(commit="d" * 40)), 10.0)],
            B,
            W,
            "no longer in the store",
        ),
        ([run("p1", A, 10.0, cached=True)], B, W, "no earlier successful run"),
        ([run("p1", A, 10.0, instance="other")], B, W, "no earlier successful run"),
    ],
    ids=[
        "fit-under-the-same-state-later",
        "never-succeeded",
        "bad-state-unknown",
        "good-run-without-state",
        "good-state-pruned",
        "only-fully-cached-runs",
        "another-instance",
    ],
)
def test_no_suspicion_without_evidence_of_a_change(
    runs: list[GoodRun], bad: InstallState | None, fingerprint: str | None, reason: str
) -> None:
    verdict = assess(bad, runs, fingerprint)
    assert not verdict.suspected and reason in verdict.reason
    assert verdict.advice() is None and verdict.summary_suffix() is None
    section = verdict.to_section()
    assert section["suspected"] is False and section["bisect_command"] is None
    assert section["diff"] is None and section["reason"] == verdict.reason


def test_a_reconstructed_state_with_the_same_commits_is_not_a_change() -> None:
    from_reflog = replace(A, pip=None)  # the reflog knows commits, not packages
    assert from_reflog.state_id != A.state_id
    assert same_code_state(from_reflog, A)
    states = {from_reflog.state_id: from_reflog}
    verdict = assess_regression(
        instance="main",
        bad_state=A,
        fingerprint=W,
        runs=[run("p1", from_reflog, 10.0)],
        state=states.get,
    )
    assert not verdict.suspected and "has not changed" in verdict.reason


def test_without_a_matching_workflow_the_instance_decides() -> None:
    runs = [run("p1", A, 10.0, fingerprint=OTHER)]
    for fingerprint in (None, W):  # no prompt captured / this workflow never succeeded
        verdict = assess(B, runs, fingerprint)
        assert verdict.suspected and verdict.match == "instance"
        assert "A workflow on this ComfyUI" in verdict.advice().text  # type: ignore[union-attr]
    same = assess(A, runs, None)
    assert not same.suspected and "a workflow on this instance" in same.reason


def test_the_full_diff_is_what_the_section_shows() -> None:
    calls: list[tuple[str, str]] = []

    def full(a: InstallState, b: InstallState):  # type: ignore[no-untyped-def]
        from oom_sentinel.daemon.install.diff import diff_states

        calls.append((a.state_id, b.state_id))
        return diff_states(a, b)

    verdict = assess_regression(
        instance="main",
        bad_state=B,
        fingerprint=W,
        runs=[run("p1", A, 10.0)],
        state=STATES.get,
        full_diff=full,
    )
    assert calls == [(A.state_id, B.state_id)] and verdict.diff is not None


def test_a_run_record_becomes_a_good_run() -> None:
    record = RunRecord(
        instance="main",
        prompt_id="p",
        outcome="success",
        started_s=1.0,
        ended_s=2.0,
        fingerprint=W,
        workflow_hash="h",
        peak_rss_bytes=10,
        peak_vram_bytes=20,
        peak_gpu_used_bytes=30,
        pool=None,
        node_id=None,
        node_type=None,
        exception_type=None,
        cached_nodes=2,
        node_count=2,
        pid=7,
        install_state_id="s",
        incident_id=None,
        recorded_s=3.0,
    )
    good = good_run_from_record(record)
    assert (good.state_id, good.ended_s, good.peak_ram_bytes, good.peak_vram_bytes) == (
        "s",
        2.0,
        10,
        20,
    )
    assert good.fully_cached
    assert not good_run_from_record(replace(record, cached_nodes=0)).fully_cached


def test_the_snapshot_names_itself_in_the_command_advice_and_summary(tmp_path: Path) -> None:
    verdict = assess(B, [run("p1", A, 10.0)])
    content = samples.content()
    content = replace(
        content,
        incident=replace(
            content.incident, summary=content.incident.summary + verdict.summary_suffix()
        ),
        advice=(verdict.advice(),),
        sections={"regression": verdict.to_section(), "install_state": B.to_dict()},
    )
    first = write_snapshot(tmp_path, content)
    second = write_snapshot(tmp_path, content)  # same second, same node: "_2"
    assert second.id == first.id + "_2"
    for ref in (first, second):
        data = load_snapshot(ref.path).data  # valid against the schema
        command = f"oom-bisect {ref.id}"
        assert data["regression"]["bisect_command"] == command
        assert data["summary"].endswith(command)
        assert f"`{command}`" in data["advice"][0]["text"]
        assert SNAPSHOT_ID_PLACEHOLDER not in json.dumps(data)
        assert InstallState.from_dict(data["regression"]["last_good_state"]) == A
