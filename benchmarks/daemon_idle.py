"""Idle footprint of ``oom-sentinel run`` at the default sampling: RSS and CPU % of one core
over a quiet minute, with one followed log and one watched (sleeping) process.

Target (issue 3): RSS <= 60 MB, CPU <= 0.5 % of one core.

    .venv/bin/python benchmarks/daemon_idle.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import Daemon, noise_lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        log = tmp_path / "comfyui.log"
        from datetime import datetime

        log.write_text(noise_lines(datetime(2026, 11, 30), 100))
        daemon = Daemon(tmp_path, logs=[log], config="[discovery]\nenabled = true\n").start()
        try:
            assert daemon.proc is not None
            proc = psutil.Process(daemon.proc.pid)
            time.sleep(args.warmup)
            cpu0 = proc.cpu_times()
            t0 = time.monotonic()
            peak_rss = 0
            while time.monotonic() - t0 < args.seconds:
                peak_rss = max(peak_rss, proc.memory_info().rss)
                time.sleep(1.0)
            cpu1 = proc.cpu_times()
            wall = time.monotonic() - t0
            rss = proc.memory_info().rss
            uss = proc.memory_full_info().uss
            threads = proc.num_threads()
            fds = proc.num_fds()
        finally:
            daemon.stop()
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    cpu_pct = 100 * cpu_s / wall
    print(f"idle over {wall:.0f} s (after {args.warmup:.0f} s warm-up):")
    print(
        f"  CPU: {cpu_s * 1000:.0f} ms = {cpu_pct:.3f} % of one core (target <= 0.5 %: {'met' if cpu_pct <= 0.5 else 'MISSED'})"
    )
    print(
        f"  RSS: {rss / 2**20:.1f} MiB now, {peak_rss / 2**20:.1f} MiB peak, USS {uss / 2**20:.1f} MiB (target <= 60 MB: {'met' if peak_rss <= 60e6 else 'MISSED'})"
    )
    print(f"  threads: {threads}, open fds: {fds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
