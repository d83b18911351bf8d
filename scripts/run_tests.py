"""Run the test suite in parallel shards: the README's test command.

Most of the suite's wall time is spent waiting -- on a replayed ComfyUI to start, a daemon to
notice a line, a websocket to answer -- not computing: one pytest process keeps about half of
one core busy. So the test files are split into shards (one per core, two at most unless
``OOM_SENTINEL_TEST_SHARDS`` says otherwise), balanced by the seconds each file took
(``tests/durations.json``; ``--shard`` in tests/conftest.py does the split), and run at once.
Each shard is a whole pytest session with its own temp root, so each sees only the processes it
started (``OOM_SENTINEL_PROCESS_SCOPE``) -- the suite is built to pass beside another copy of
itself. Extra arguments go to every shard (``-x``, ``-k``, a test path); with one shard this is
plain ``python -m pytest``.

Usage: python scripts/run_tests.py [pytest arguments]
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def shard_count() -> int:
    raw = os.environ.get("OOM_SENTINEL_TEST_SHARDS", "").strip()
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            sys.exit(f"run_tests: OOM_SENTINEL_TEST_SHARDS={raw!r} is not a number")
    return max(1, min(2, os.cpu_count() or 1))


def main(argv: list[str]) -> int:
    n = shard_count()
    pytest = [sys.executable, "-m", "pytest"]
    if n == 1:
        return subprocess.call([*pytest, *argv], cwd=ROOT)
    with contextlib.ExitStack() as stack:
        logs = [
            stack.enter_context(tempfile.TemporaryFile(mode="w+", encoding="utf-8"))
            for _ in range(n - 1)
        ]
        return _run_shards(pytest, argv, n, logs)


def _run_shards(pytest: list[str], argv: list[str], n: int, logs: list[IO[str]]) -> int:
    started = time.monotonic()
    procs = []
    for i in range(n):
        out = None if i == 0 else logs[i - 1]  # shard 0 streams; the others are shown after
        procs.append(
            subprocess.Popen(
                [*pytest, f"--shard={i}/{n}", *argv],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
            )
        )
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        return 130
    for i, log in enumerate(logs, start=1):
        log.seek(0)
        text = log.read()
        print(f"\n===== shard {i}/{n} =====", flush=True)
        print(text, end="" if text.endswith("\n") else "\n", flush=True)
    worst = max(codes)
    verdict = "ok" if worst == 0 else f"FAILED (exit statuses {codes})"
    print(
        f"\n===== {n} shards in {time.monotonic() - started:.1f} s: {verdict}; "
        "each shard's summary line is above =====",
        flush=True,
    )
    return worst if worst in (0, 1, 2, 3, 4, 5) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
