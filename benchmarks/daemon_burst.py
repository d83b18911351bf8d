"""A 100,000-line burst into a followed log: lines/s through the whole daemon path (follow,
assemble, classify, incident, snapshot) and proof that no OOM record was missed.

Every 1,000th line is part of an OOM record 10 minutes (log time) after the previous one, so
the burst must produce exactly ``lines / 1000`` snapshots.

    .venv/bin/python benchmarks/daemon_burst.py [--lines 100000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import (
    Daemon,
    cuda_oom_record,
    manager_prefix,
    snapshot_dirs,
)


def build(lines: int) -> tuple[str, int]:
    t0 = datetime(2026, 11, 30, 10, 0, 0)
    out: list[str] = []
    n = 0
    incidents = 0
    while n < lines:
        if n % 1000 == 999:
            record = cuda_oom_record(t0 + timedelta(minutes=10 * incidents))
            out.append(record)
            n += record.count("\n")
            incidents += 1
        else:
            at = t0 + timedelta(minutes=10 * incidents, milliseconds=n % 1000)
            out.append(
                f"{manager_prefix(at)}100%|##########| 20/20 [00:03<00:00,  6.1it/s] step {n}\n"
            )
            n += 1
    return "".join(out), incidents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args()
    text, incidents = build(args.lines)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        log = tmp_path / "comfyui.log"
        log.write_text("")
        config = "[discovery]\nenabled = false\n[incidents]\nstorm_window_s = 60\n"
        daemon = Daemon(tmp_path, logs=[log], config=config).start()
        try:
            start = time.perf_counter()
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(text)
            while len(snapshot_dirs(daemon.data_dir)) < incidents:
                if time.perf_counter() - start > 300:
                    break
                time.sleep(0.01)
            elapsed = time.perf_counter() - start
            time.sleep(2)  # nothing more may arrive
            got = len(snapshot_dirs(daemon.data_dir))
        finally:
            daemon.stop()
    print(f"burst: {args.lines} lines ({len(text) / 2**20:.1f} MiB), {incidents} OOM records")
    print(
        f"all handled in {elapsed:.2f} s = {args.lines / elapsed:,.0f} lines/s (incl. {incidents} snapshots written)"
    )
    print(
        f"snapshots: {got} of {incidents} expected -> {'none missed, none duplicated' if got == incidents else 'MISMATCH'}"
    )
    return 0 if got == incidents else 1


if __name__ == "__main__":
    raise SystemExit(main())
