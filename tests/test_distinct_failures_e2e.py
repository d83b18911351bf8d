"""One incident per distinct failure (issue 11, item 1), through the real daemon watching the
stand-in ComfyUI: inside one storm window, a different node or a different workflow is its own
incident and snapshot, and a repeat of the same one grows its count."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from daemon_harness import Daemon, load_snapshot_json, snapshot_dirs, wait_for
from standin_proc import start_standin
from test_watch_e2e import config, make_install, one_node, post, wait_api_up, wait_run

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024


def _counts(data_dir: Path) -> dict[str | None, int]:
    conn = sqlite3.connect(f"file:{data_dir / 'oom-sentinel.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT node_type, count FROM incidents").fetchall()
    finally:
        conn.close()
    out: dict[str | None, int] = {}
    for node, count in rows:
        out[node] = out.get(node, 0) + count
    return out


def test_different_nodes_and_workflows_in_one_storm_window_are_separate_incidents(
    tmp_path: Path,
) -> None:
    gpu = tmp_path / "gpu"
    FakeGpuDir(gpu).create([FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)])
    install = make_install(tmp_path / "ComfyUI")
    srv = start_standin(tmp_path / "base", code_dir=install, base_directory=False, fake_gpu=gpu)
    daemon: Daemon | None = None
    try:
        daemon = Daemon(
            tmp_path,
            comfyui=[srv.url],
            config=config(storm_window_s=300),
            env={"OOM_SENTINEL_FAKE_GPU": str(gpu)},
        ).start()
        wait_api_up(daemon, srv.url)
        vram = one_node("AllocateVRAM", mib=9000)
        fake_oom = one_node(
            "Fail",
            message="CUDA out of memory. Tried to allocate 1.00 GiB",
            exception="torch.OutOfMemoryError",
        )
        vram_other_workflow = {
            **one_node("AllocateVRAM", mib=9000),
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }
        prompts = [vram, fake_oom, vram, vram_other_workflow]
        ids = []
        for prompt in prompts:
            ids.append(post(srv, prompt))
            wait_run(daemon, ids[-1])
        data_dir = daemon.data_dir
        wait_for(lambda: sum(_counts(data_dir).values()) == 4, 30, "four failures counted")
        time.sleep(1.0)  # nothing else arrives
    finally:
        if daemon is not None:
            daemon.stop()
        srv.kill()
    snaps = snapshot_dirs(daemon.data_dir)
    nodes = sorted(load_snapshot_json(s)["event"]["node_type"] for s in snaps)
    # AllocateVRAM twice in one workflow (a storm: one snapshot, count 2), Fail on its own,
    # and AllocateVRAM in another workflow on its own
    assert nodes == ["AllocateVRAM", "AllocateVRAM", "Fail"]
    counts = sorted(
        (load_snapshot_json(s)["event"]["node_type"], c)
        for s in snaps
        for c in [_row_count(daemon.data_dir, load_snapshot_json(s)["incident"]["id"])]
    )
    assert counts == [("AllocateVRAM", 1), ("AllocateVRAM", 2), ("Fail", 1)]


def _row_count(data_dir: Path, incident_id: str) -> int:
    conn = sqlite3.connect(f"file:{data_dir / 'oom-sentinel.db'}?mode=ro", uri=True)
    try:
        return int(
            conn.execute("SELECT count FROM incidents WHERE id = ?", (incident_id,)).fetchone()[0]
        )
    finally:
        conn.close()
