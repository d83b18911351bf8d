"""Run history: peaks from the timeline, outcomes, the runs table and ``oom-sentinel runs``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.comfy.prompt_fingerprint import workflow_fingerprint
from oom_sentinel.daemon.comfy.watch import PromptDone
from oom_sentinel.daemon.probes.base import (
    GpuDeviceSample,
    GpuProcessSample,
    HostSample,
    MemorySample,
    ProcessTreeSample,
)
from oom_sentinel.daemon.store.db import MIGRATIONS, Store
from oom_sentinel.daemon.store.runs import (
    PeakMemory,
    RunRecord,
    has_run,
    list_runs,
    peak_memory,
    record_run,
    run_from_done,
    run_outcome,
)

MIB = 1024 * 1024
PID = 4242


def sample(
    t: float, rss_mib: int | None, vram_mib: int | None, device_mib: int = 0
) -> MemorySample:
    trees = (ProcessTreeSample(PID, rss_mib * MIB),) if rss_mib is not None else ()
    procs = (GpuProcessSample(PID, 0, vram_mib * MIB, "python"),) if vram_mib is not None else ()
    return MemorySample(
        time_s=t,
        gpus=(GpuDeviceSample(0, "GPU", 8192 * MIB, device_mib * MIB, None),),
        gpu_processes=(*procs, GpuProcessSample(999, 0, 100 * MIB, "other")),
        host=HostSample(32768 * MIB, 16384 * MIB, 0, 0),
        process_trees=(*trees, ProcessTreeSample(7, 50_000 * MIB)),
    )


PROMPT = {
    "3": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 20, "model": ["4", 0]}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "x"}},
}


def done(
    outcome: str = "success",
    *,
    prompt: dict[str, Any] | None = None,
    started_s: float | None = 100.0,
    ended_s: float | None = 102.0,
    seen_s: float = 102.1,
    event: OomEvent | None = None,
    error: dict[str, Any] | None = None,
    prompt_id: str = "p1",
) -> PromptDone:
    return PromptDone(
        instance="main",
        prompt_id=prompt_id,
        outcome=outcome,  # type: ignore[arg-type]
        prompt=PROMPT if prompt is None else prompt,
        workflow=None,
        number=0,
        started_s=started_s,
        ended_s=ended_s,
        seen_s=seen_s,
        error=error,
        event=event,
        cached_nodes=("4",),
        node_count=3,
    )


# ---- pure ----------------------------------------------------------------------------------


def test_peaks_come_from_the_samples_inside_the_run_only() -> None:
    samples = [
        sample(99.0, 9000, 7000, 8000),  # before the run: ignored
        sample(100.0, 1000, 2000, 3000),
        sample(101.0, 3000, 5000, 6000),
        sample(102.0, 2000, 4000, 5000),
        sample(103.0, 9000, 7000, 8000),  # after: ignored
    ]
    peak = peak_memory(samples, PID, 100.0, 102.0)
    assert peak == PeakMemory(
        rss_bytes=3000 * MIB, vram_bytes=5000 * MIB, gpu_used_bytes=6000 * MIB, samples=3
    )


@pytest.mark.parametrize(
    ("samples", "pid", "expected"),
    [
        ([], PID, PeakMemory()),
        ([sample(100.5, 10, 10)], None, PeakMemory(samples=1)),
        # a process NVML does not list on any GPU: VRAM and device unknown, never 0
        ([sample(100.5, 10, None)], PID, PeakMemory(rss_bytes=10 * MIB, samples=1)),
        # RSS unknown (the process tree was not sampled)
        (
            [sample(100.5, None, 30, 40)],
            PID,
            PeakMemory(vram_bytes=30 * MIB, gpu_used_bytes=40 * MIB, samples=1),
        ),
    ],
    ids=["no-samples", "no-pid", "not-on-gpu", "no-rss"],
)
def test_unknown_peaks_are_none(
    samples: list[MemorySample], pid: int | None, expected: PeakMemory
) -> None:
    assert peak_memory(samples, pid, 100.0, 101.0) == expected


GPU_OOM = OomEvent(Pool.GPU, Backend.CUDA, False, "CUDA out of memory")


@pytest.mark.parametrize(
    ("outcome", "event", "killed", "expected"),
    [
        ("success", None, False, "success"),
        ("interrupted", None, False, "interrupted"),
        ("error", None, False, "error"),
        ("error", GPU_OOM, False, "oom"),
        ("lost", None, False, "crashed"),
        ("lost", None, True, "killed"),
    ],
    ids=["success", "interrupted", "other-error", "oom", "lost", "lost-killed"],
)
def test_run_outcome(outcome: str, event: OomEvent | None, killed: bool, expected: str) -> None:
    assert run_outcome(done(outcome, event=event), killed=killed) == expected


def test_a_run_row_carries_the_fingerprint_error_and_peaks() -> None:
    error = {"node_id": "3", "node_type": "KSampler", "exception_type": "torch.OutOfMemoryError"}
    run = run_from_done(
        done("error", event=GPU_OOM, error=error),
        recorded_s=200.0,
        pid=PID,
        samples=[sample(101.0, 3000, 5000, 6000)],
    )
    assert run.outcome == "oom" and run.pool == "gpu"
    assert (run.node_id, run.node_type, run.exception_type) == (
        "3",
        "KSampler",
        "torch.OutOfMemoryError",
    )
    assert run.fingerprint == workflow_fingerprint(PROMPT)
    assert run.peak_rss_bytes == 3000 * MIB and run.peak_vram_bytes == 5000 * MIB
    assert (run.cached_nodes, run.node_count, run.pid) == (1, 3, PID)
    assert run.install_state_id is None
    assert run.duration_s == pytest.approx(2.0)


def test_the_same_workflow_with_a_new_seed_matches_but_is_not_the_same_prompt() -> None:
    reseeded = json.loads(json.dumps(PROMPT))
    reseeded["3"]["inputs"]["seed"] = 987654321
    reseeded["9"]["inputs"]["filename_prefix"] = "other"
    a = run_from_done(done(prompt=PROMPT), recorded_s=1.0)
    b = run_from_done(done(prompt=reseeded, prompt_id="p2"), recorded_s=1.0)
    assert a.fingerprint == b.fingerprint
    assert a.workflow_hash != b.workflow_hash
    bigger = json.loads(json.dumps(PROMPT))
    bigger["3"]["inputs"]["steps"] = 50
    c = run_from_done(done(prompt=bigger, prompt_id="p3"), recorded_s=1.0)
    assert c.fingerprint != a.fingerprint


def test_a_lost_prompt_is_measured_from_when_it_was_seen_running() -> None:
    lost = done("lost", started_s=None, ended_s=None, seen_s=105.0)
    run = run_from_done(
        lost,
        recorded_s=106.0,
        pid=PID,
        samples=[sample(103.0, 500, None), sample(104.5, 1500, None), sample(106.0, 10, None)],
        started_s=102.5,
    )
    assert run.outcome == "crashed"
    assert (run.started_s, run.ended_s) == (102.5, 105.0)
    assert run.peak_rss_bytes == 1500 * MIB
    assert run.cached_nodes is None  # nothing is known of what ran


# ---- the store -----------------------------------------------------------------------------


def row(
    prompt_id: str, outcome: str = "success", ended_s: float | None = 10.0, **kw: Any
) -> RunRecord:
    base: dict[str, Any] = {
        "instance": "main",
        "prompt_id": prompt_id,
        "outcome": outcome,
        "started_s": ended_s - 1 if ended_s is not None else None,
        "ended_s": ended_s,
        "fingerprint": "fp-a",
        "workflow_hash": "wh",
        "peak_rss_bytes": 1,
        "peak_vram_bytes": None,
        "peak_gpu_used_bytes": None,
        "pool": None,
        "node_id": None,
        "node_type": None,
        "exception_type": None,
        "cached_nodes": 0,
        "node_count": 3,
        "pid": 1,
        "install_state_id": None,
        "incident_id": None,
        "recorded_s": ended_s + 1 if ended_s is not None else 0.0,
    }
    base.update(kw)
    return RunRecord(**base)


def test_the_runs_table_is_a_migration_of_the_store(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        assert store.schema_version() == len(MIGRATIONS) >= 2
        columns = {r[1] for r in store.query("columns", "PRAGMA table_info(runs)")}
    assert {"prompt_id", "outcome", "fingerprint", "peak_rss_bytes", "install_state_id"} <= columns


def test_a_prompt_is_recorded_once(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        assert record_run(store, row("p1"))
        assert not record_run(store, row("p1", outcome="error"))
        assert has_run(store, "main", "p1") and not has_run(store, "other", "p1")
        (only,) = list_runs(store)
        assert only == row("p1")
        # the same prompt id on another instance is another run
        assert record_run(store, row("p1", instance="second"))


def test_runs_list_newest_first_with_filters(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        record_run(store, row("a", ended_s=10.0))
        record_run(store, row("b", "oom", ended_s=30.0, fingerprint="fp-b", pool="gpu"))
        record_run(store, row("c", ended_s=20.0, instance="second"))
        record_run(store, row("d", "crashed", ended_s=None, started_s=None, recorded_s=25.0))
        assert [r.prompt_id for r in list_runs(store)] == ["b", "d", "c", "a"]
        assert [r.prompt_id for r in list_runs(store, limit=2)] == ["b", "d"]
        assert [r.prompt_id for r in list_runs(store, instance="second")] == ["c"]
        assert [r.prompt_id for r in list_runs(store, outcome="oom")] == ["b"]
        assert [r.prompt_id for r in list_runs(store, fingerprint="fp-a")] == ["d", "c", "a"]
        assert [r.prompt_id for r in list_runs(store, since_s=20.0)] == ["b", "d", "c"]


# ---- the command ---------------------------------------------------------------------------


def runs_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "runs", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runs_command_prints_json_and_a_table(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        record_run(store, row("a", ended_s=1_800_000_000.0, peak_rss_bytes=3 * 1024**3))
        record_run(
            store,
            row(
                "b",
                "oom",
                ended_s=1_800_000_100.0,
                node_id="3",
                node_type="KSampler",
                exception_type="torch.OutOfMemoryError",
                pool="gpu",
            ),
        )
    out = runs_cli("--json", "--data-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["prompt_id"] for r in data] == ["b", "a"]
    assert data[0]["outcome"] == "oom" and data[0]["node_type"] == "KSampler"
    assert data[1]["peak_rss_bytes"] == 3 * 1024**3 and data[1]["install_state_id"] is None
    table = runs_cli("--data-dir", str(tmp_path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["started", "instance", "outcome"]
    assert "oom" in lines[1] and "KSampler (node 3): torch.OutOfMemoryError" in lines[1]
    assert "3.00 GiB" in lines[2]
    only = runs_cli("--json", "--data-dir", str(tmp_path), "--outcome", "success")
    assert [r["prompt_id"] for r in json.loads(only.stdout)] == ["a"]


def test_runs_command_without_a_store_says_so(tmp_path: Path) -> None:
    out = runs_cli("--data-dir", str(tmp_path / "empty"))
    assert out.returncode == 0 and "no runs recorded" in out.stdout
    assert json.loads(runs_cli("--json", "--data-dir", str(tmp_path / "empty")).stdout) == []


def test_runs_command_on_a_foreign_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "oom-sentinel.db").write_text("not a database at all, just text\n")
    out = runs_cli("--data-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.startswith("oom-sentinel: error: ") and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr
