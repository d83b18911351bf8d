"""Latency from ComfyUI's error to the crash snapshot on disk, through the API watcher.

The clock starts at the API's error event -- the ``timestamp`` ComfyUI puts in the
``execution_error`` message, which the stand-in writes into history the same moment -- and
stops when the snapshot directory appears under its final name (it is written under a
temporary name and renamed, so appearing means complete). Both ends are this machine's
wall clock. The snapshots directory is polled every 2 ms, so figures are exact to ~2 ms.

Two setups, each a real ``oom-sentinel run`` watching a real stand-in ComfyUI process with
a fake GPU, ``--incidents.storm_window_s 0`` so every OOM gets its own snapshot:

1. **api**: the API is the only source (core ComfyUI writes no log file);
2. **api+log**: ComfyUI-Manager's log is followed too, so the snapshot waits (up to
   ``settle_ms``) for the log's record and carries both.

    .venv/bin/python benchmarks/api_latency.py [--incidents N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from daemon_harness import Daemon, wait_for  # noqa: E402
from standin_proc import STANDIN_DIR, StandinProcess, start_standin  # noqa: E402

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir  # noqa: E402

MIB = 1024 * 1024


def make_install(path: Path) -> Path:
    path.mkdir(parents=True)
    for source in STANDIN_DIR.glob("*.py"):
        shutil.copy(source, path / source.name)
    (path / "comfyui_version.py").write_text('__version__ = "0.8.0"\n')
    return path


def oom_prompt(i: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 9000 + i}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def snapshot_names(data_dir: Path) -> set[str]:
    try:
        return {e.name for e in os.scandir(data_dir / "snapshots") if not e.name.startswith(".")}
    except FileNotFoundError:
        return set()


def error_time_s(srv: StandinProcess, prompt_id: str) -> float:
    entry = wait_for(lambda: srv.get_json(f"/history/{prompt_id}"), 30, "history")[prompt_id]
    for name, payload in entry["status"]["messages"]:
        if name == "execution_error":
            return float(payload["timestamp"]) / 1000.0
    raise RuntimeError(f"{prompt_id} did not fail: {entry['status']}")


def measure(tmp: Path, n: int, with_log: bool) -> list[float]:
    install = make_install(tmp / "ComfyUI")
    gpu = tmp / "gpu"
    FakeGpuDir(gpu).create([FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)])
    srv = start_standin(
        tmp / "base", code_dir=install, base_directory=False, fake_gpu=gpu, manager_log=with_log
    )
    config = (
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
        "[incidents]\nstorm_window_s = 0\n"
    )
    daemon = Daemon(
        tmp,
        comfyui=[str(install) if with_log else srv.url],
        config=config,
        env={"OOM_SENTINEL_FAKE_GPU": str(gpu)},
    )
    latencies: list[float] = []
    try:
        daemon.start()
        wait_for(lambda: f"API at {srv.url} is up" in daemon.stderr(), 30, "the API")
        time.sleep(1.5)  # the log follower takes its position at its first poll
        for i in range(n):
            before = snapshot_names(daemon.data_dir)
            status, answer = srv.post_json("/prompt", {"prompt": oom_prompt(i), "client_id": "b"})
            assert status == 200, answer
            while not (snapshot_names(daemon.data_dir) - before):
                time.sleep(0.002)
            appeared = time.time()
            latencies.append(appeared - error_time_s(srv, answer["prompt_id"]))
            time.sleep(0.05)
    finally:
        daemon.stop()
        srv.stop()
    if "Traceback" in daemon.stderr():
        raise RuntimeError(daemon.stderr())
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--incidents", type=int, default=40, help="OOMs per setup")
    args = parser.parse_args()
    for label, with_log in (("api", False), ("api+log", True)):
        with tempfile.TemporaryDirectory(prefix="oom-latency-") as tmp:
            values = measure(Path(tmp), args.incidents, with_log)
        ms = [v * 1000 for v in values]
        print(
            f"{label:8s} n={len(ms):3d}  p50 {statistics.median(ms):7.1f} ms  "
            f"p90 {pct(ms, 90):7.1f} ms  p99 {pct(ms, 99):7.1f} ms  max {max(ms):7.1f} ms"
        )


if __name__ == "__main__":
    main()
