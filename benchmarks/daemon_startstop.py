"""Start-up and shutdown of ``oom-sentinel run``: process start → the ready line, and SIGTERM →
exit. Targets (issue 3): ready in under 2 s, stopped within 1 s.

    .venv/bin/python benchmarks/daemon_startstop.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ready_s: list[float] = []
    stop_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text("[discovery]\nprocesses = false\n")
        argv = [sys.executable, "-m", "oom_sentinel.daemon", "run", "--config", str(config)]
        argv += ["--data-dir", str(Path(tmp) / "data")]
        env = {**os.environ, "HOME": tmp}
        for _ in range(args.runs):
            start = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
            assert proc.stderr is not None
            for line in proc.stderr:
                if "watching " in line:
                    break
            ready_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
            stop_s.append(time.perf_counter() - start)
            if rc != 0:
                print(f"exit status {rc}", file=sys.stderr)
                return 1
    print(f"runs: {args.runs}")
    print(
        f"start -> ready line: median {statistics.median(ready_s):.2f} s, max {max(ready_s):.2f} s (target < 2 s)"
    )
    print(
        f"SIGTERM -> exit:     median {statistics.median(stop_s):.2f} s, max {max(stop_s):.2f} s (target <= 1 s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
