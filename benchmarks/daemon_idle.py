"""Idle footprint of ``oom-sentinel run`` at the default sampling: RSS and CPU % of one core
over a quiet minute.

Target (issue 3): RSS <= 60 MB (60,000,000 bytes), CPU <= 0.5 % of one core.

Two scenarios, each a real daemon process:

1. **no-comfyui**: the service waits for a ComfyUI to appear (the usual state of a service
   that runs all day while ComfyUI runs now and then): one followed log, discovery on, one
   watched (sleeping) process;
2. **watching**: an idle stand-in ComfyUI from a git checkout, watched through its API and
   websocket, its Manager log followed, its install state captured, a fake GPU sampled every
   second. What the daemon carries while a ComfyUI is up but does nothing.

    .venv/bin/python benchmarks/daemon_idle.py [--seconds 60] [--scenario no-comfyui|watching]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from daemon_harness import Daemon, noise_lines, wait_for  # noqa: E402
from standin_proc import STANDIN_DIR, start_standin  # noqa: E402

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir  # noqa: E402

MIB = 1024 * 1024
TARGET_RSS = 60_000_000
TARGET_CPU_PCT = 0.5


def _git_install(path: Path) -> Path:
    path.mkdir(parents=True)
    for source in STANDIN_DIR.glob("*.py"):
        shutil.copy(source, path / source.name)
    (path / "comfyui_version.py").write_text('__version__ = "0.8.0"\n')
    (path / "custom_nodes").mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=b", "-c", "user.email=b@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "master"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "stand-in"], check=True)
    return path


def _measure(daemon: Daemon, seconds: float, warmup: float) -> dict[str, float]:
    assert daemon.proc is not None
    proc = psutil.Process(daemon.proc.pid)
    time.sleep(warmup)
    cpu0 = proc.cpu_times()
    t0 = time.monotonic()
    peak_rss = 0
    while time.monotonic() - t0 < seconds:
        peak_rss = max(peak_rss, proc.memory_info().rss)
        time.sleep(1.0)
    cpu1 = proc.cpu_times()
    wall = time.monotonic() - t0
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "wall": wall,
        "cpu_s": cpu_s,
        "cpu_pct": 100 * cpu_s / wall,
        "rss": proc.memory_info().rss,
        "peak_rss": max(peak_rss, proc.memory_info().rss),
        "uss": proc.memory_full_info().uss,
        "threads": proc.num_threads(),
        "fds": proc.num_fds(),
    }


def no_comfyui(tmp: Path, seconds: float, warmup: float) -> dict[str, float]:
    log = tmp / "comfyui.log"
    log.write_text(noise_lines(datetime(2026, 11, 30), 100))
    daemon = Daemon(tmp, logs=[log], config="[discovery]\nenabled = true\n").start()
    try:
        return _measure(daemon, seconds, warmup)
    finally:
        daemon.stop()


def watching(tmp: Path, seconds: float, warmup: float) -> dict[str, float]:
    install = _git_install(tmp / "ComfyUI")
    gpu = tmp / "gpu"
    FakeGpuDir(gpu).create([FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)])
    srv = start_standin(
        tmp / "base", code_dir=install, base_directory=False, fake_gpu=gpu, manager_log=True
    )
    daemon = Daemon(
        tmp,
        comfyui=[str(install)],
        config="[discovery]\nenabled = true\n",
        env={"OOM_SENTINEL_FAKE_GPU": str(gpu)},
    )
    try:
        daemon.start()
        wait_for(lambda: f"API at {srv.url} is up" in daemon.stderr(), 30, "the API watcher")
        return _measure(daemon, seconds, warmup)
    finally:
        daemon.stop()
        srv.stop()


SCENARIOS = {"no-comfyui": no_comfyui, "watching": watching}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    # start-up is not idle: the first captures, the API handshake and the first heap trim
    # (service.HEAP_TRIM_FIRST_S) fall in the warm-up
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    missed = False
    for name in args.scenario or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix="oom-idle-") as tmp:
            m = SCENARIOS[name](Path(tmp), args.seconds, args.warmup)
        cpu_ok = m["cpu_pct"] <= TARGET_CPU_PCT
        rss_ok = m["peak_rss"] <= TARGET_RSS
        missed |= not (cpu_ok and rss_ok)
        print(f"{name}: idle over {m['wall']:.0f} s (after {args.warmup:.0f} s warm-up)")
        print(
            f"  CPU: {m['cpu_s'] * 1000:.0f} ms = {m['cpu_pct']:.3f} % of one core "
            f"(target <= {TARGET_CPU_PCT} %: {'met' if cpu_ok else 'MISSED'})"
        )
        print(
            f"  RSS: {m['rss'] / MIB:.1f} MiB now, {m['peak_rss'] / MIB:.1f} MiB "
            f"= {m['peak_rss'] / 1e6:.1f} MB peak, USS {m['uss'] / MIB:.1f} MiB "
            f"(target <= 60 MB: {'met' if rss_ok else 'MISSED'})"
        )
        print(f"  threads: {m['threads']:.0f}, open fds: {m['fds']:.0f}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
