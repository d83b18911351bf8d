"""Every prompt is seen however fast: 600 prompts of 5-25 ms through the stand-in, one in four
running out of VRAM, with ``oom-sentinel run`` killed (SIGKILL) a third of the way through and
started again after 200 more prompts ran unwatched. Every prompt gets one run row, every OOM
one incident (``storm_window_s = 0``: each its own snapshot), and the prompts that ran while
no daemon watched are read back from ``/history`` after the restart.

    .venv/bin/python -m pytest -s tests/test_watch_fast_prompts.py   # prints the figures
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Daemon, load_snapshot_json, snapshot_dirs, wait_for
from standin_proc import StandinProcess, start_standin
from test_watch_e2e import make_install

from oom_sentinel.daemon.fake_gpu import FakeDevice, FakeGpuDir
from oom_sentinel.daemon.runs import RunRecord, list_runs
from oom_sentinel.daemon.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MIB = 1024 * 1024
PROMPTS = 600
KILL_AT = 200  # the daemon is SIGKILLed once this many were posted ...
BACK_AT = 400  # ... and started again once this many were


def fast_prompt(i: int, rng: random.Random) -> tuple[dict[str, Any], bool]:
    """A 5-25 ms prompt; every fourth one asks the 8 GiB fake GPU for 64 GiB (an OOM)."""
    oom = i % 4 == 3
    if oom:
        node = {"class_type": "AllocateVRAM", "inputs": {"mib": 64 * 1024, "value": i}}
    else:
        seconds = round(rng.uniform(0.005, 0.025), 4)
        node = {"class_type": "Sleep", "inputs": {"seconds": seconds, "value": i}}
    return {"1": node, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}, oom


def all_runs(data_dir: Path) -> list[RunRecord]:
    store = Store.open_existing(data_dir)
    if store is None:
        return []
    with store:
        return list_runs(store, limit=10 * PROMPTS)


def queue_empty(srv: StandinProcess) -> bool:
    q = srv.get_json("/queue")
    return not q["queue_running"] and not q["queue_pending"]


def test_600_fast_prompts_with_a_kill_9_each_get_one_run_row_and_every_oom_an_incident(
    tmp_path: Path,
) -> None:
    gpu = FakeGpuDir(tmp_path / "gpu").create([FakeDevice(0, "NVIDIA RTX 4060", 8192 * MIB)])
    install = make_install(tmp_path / "ComfyUI")
    srv = start_standin(
        tmp_path / "base", code_dir=install, base_directory=False, fake_gpu=gpu.root
    )
    daemon = Daemon(
        tmp_path,
        comfyui=[srv.url],
        config=(
            "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
            "[incidents]\nstorm_window_s = 0\n"
        ),
        env={"OOM_SENTINEL_FAKE_GPU": str(gpu.root)},
    )
    rng = random.Random(11)
    posted: dict[str, bool] = {}  # prompt id -> an OOM
    t0 = time.monotonic()
    try:
        daemon.start()
        wait_for(lambda: "is up" in daemon.stderr(), 30, "the API")
        for i in range(PROMPTS):
            if i == KILL_AT:
                daemon.stop(signal.SIGKILL)
            if i == BACK_AT:
                wait_for(lambda: queue_empty(srv), 120, "the unwatched prompts to run")
                daemon.start()
            prompt, oom = fast_prompt(i, rng)
            status, answer = srv.post_json("/prompt", {"prompt": prompt, "client_id": "tab"})
            assert status == 200, answer
            posted[str(answer["prompt_id"])] = oom
        wait_for(lambda: queue_empty(srv), 120, "every prompt to run")
        wait_for(
            lambda: len(all_runs(daemon.data_dir)) >= PROMPTS,
            180,
            f"{PROMPTS} run rows (have {len(all_runs(daemon.data_dir))})",
        )
        ooms = {pid for pid, oom in posted.items() if oom}
        wait_for(lambda: len(snapshot_dirs(daemon.data_dir)) >= len(ooms), 120, "the snapshots")
        time.sleep(1.0)  # an extra row or snapshot would show now (an absence: a wait)
        runs = all_runs(daemon.data_dir)
        history = srv.get_json("/history")
        took = time.monotonic() - t0
        durations = [
            h["status"]["messages"][-1][1]["timestamp"] - h["status"]["messages"][0][1]["timestamp"]
            for h in history.values()
        ]
        per_prompt: Counter[str] = Counter(r.prompt_id for r in runs)
        snapshot_prompts: Counter[str] = Counter()
        for snap in snapshot_dirs(daemon.data_dir):
            data = load_snapshot_json(snap)
            for obs in data["observations"]:
                if obs["source"] == "api":
                    snapshot_prompts[obs["evidence"]["prompt_id"]] += 1
        lost = set(posted) - set(per_prompt)
        doubled = {p for p, n in per_prompt.items() if n > 1}
        oom_rows = {r.prompt_id for r in runs if r.outcome == "oom"}
        no_incident = {r.prompt_id for r in runs if r.outcome == "oom" and not r.incident_id}
        print(
            f"\n[fast prompts] {len(posted)} prompts ({len(ooms)} OOMs), server-side "
            f"{min(durations)}-{max(durations)} ms each; daemon SIGKILLed after {KILL_AT}, "
            f"back after {BACK_AT}; {len(runs)} run rows, {len(lost)} lost, {len(doubled)} "
            f"doubled; {len(oom_rows)} oom rows, {len(snapshot_dirs(daemon.data_dir))} "
            f"snapshots, {len(ooms - set(snapshot_prompts))} OOMs without an incident, "
            f"{len(no_incident)} oom rows without an incident id; {took:.1f} s"
        )
        assert not lost and not doubled and len(runs) == PROMPTS
        assert oom_rows == ooms
        assert set(snapshot_prompts) == ooms and max(snapshot_prompts.values()) == 1
        assert len(snapshot_dirs(daemon.data_dir)) == len(ooms)
        assert not no_incident
        assert daemon.stop() == 0
        assert "Traceback" not in daemon.all_stderr()
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        srv.kill()
        (tmp_path / "figures.json").write_text(json.dumps({"posted": len(posted)}))
