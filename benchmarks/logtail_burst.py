"""A 100,000-line burst through the log follower: lines/s, and proof that no line was missed
or handled twice.

Two figures:
1. read: 100,000 Manager-style lines already on disk, read from the start by one follower.
2. live: a writer thread appends 100,000 lines (one write per line or a few, flushed, as
   Manager's tee does) while the follower loop runs as the service will run it
   (``wait`` → ``poll`` → hand on → ``commit``), with three Manager rotations and one
   follower restart in the middle that throws away read-but-uncommitted lines.
Both check that the handled sequence is exactly 0..99,999 in order.

    .venv/bin/python benchmarks/logtail_burst.py [--lines N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

from oom_sentinel.daemon.logs.cursors import MemoryOffsetStore
from oom_sentinel.daemon.logs.tail import LogFollower, LogTailManager

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from logtail_helpers import manager_rotate


def line_text(i: int) -> str:
    return f"[2026-01-02 10:11:12.{i % 1000:03d}] burst line {i:06d} got prompt / executing node 42"


def seq_of(text: str) -> int:
    return int(text.split("burst line ", 1)[1][:6])


def check(handled: list[int], total: int) -> str:
    if handled == list(range(total)):
        return "OK: every line handled exactly once, in order"
    seen = set(handled)
    missing = total - len(seen & set(range(total)))
    repeated = len(handled) - len(seen)
    return f"FAILED: {missing} missing, {repeated} repeated"


def bench_read(root: Path, total: int) -> bool:
    live = root / "read" / "comfyui.log"
    live.parent.mkdir()
    with open(live, "w", encoding="utf-8") as fh:
        for i in range(total):
            fh.write(line_text(i) + "\n")
    size = live.stat().st_size
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    handled: list[int] = []
    polls = 0
    start = time.perf_counter()
    while len(handled) < total:
        lines = follower.poll()
        polls += 1
        handled.extend(seq_of(line.text) for line in lines)
        if lines:
            follower.commit(lines[-1].path, lines[-1].end_offset)
        elif polls > total:
            break
    elapsed = time.perf_counter() - start
    verdict = check(handled, total)
    print(
        f"read : {total:,} lines, {size / 1e6:.1f} MB in {elapsed * 1000:.0f} ms over "
        f"{polls} poll(s): {total / elapsed:,.0f} lines/s, {size / 1e6 / elapsed:.0f} MB/s -- "
        f"{verdict}"
    )
    return verdict.startswith("OK")


def bench_live(root: Path, total: int) -> bool:
    live = root / "live" / "comfyui_8188.log"
    live.parent.mkdir()
    live.touch()
    rotate_at = {total // 4, total // 2, 3 * total // 4}
    restart_at = int(total * 0.6)
    store = MemoryOffsetStore()
    handled: list[int] = []
    cond = threading.Condition()
    stalled: list[str] = []

    def reached(count: int) -> bool:
        return len(handled) >= count

    def writer() -> None:
        last_rotation = 0
        i = 0
        while i < total:
            if i in rotate_at:
                # Manager keeps two old names: never let the follower fall two rotations
                # behind (a limit of any follower, see logtail's docstring).
                with cond:
                    if not cond.wait_for(partial(reached, last_rotation), 120):
                        stalled.append(f"follower stalled at {len(handled)}")
                        return
                last_rotation = i
                manager_rotate(live)
            batch = 1 + (i % 4)  # one to four lines per write, flushed
            batch = min(batch, total - i, *(r - i for r in rotate_at if r > i))
            with open(live, "a", encoding="utf-8") as fh:
                fh.write("".join(line_text(j) + "\n" for j in range(i, i + batch)))
            i += batch

    tails = LogTailManager(store, from_start=True)
    tails.add(live)
    tails.start()
    backend = tails.wake_backend
    thread = threading.Thread(target=writer, name="burst-writer")
    polls = reemitted = 0
    restarted = False
    start = time.perf_counter()
    thread.start()
    give_up = time.monotonic() + 300
    try:
        while len(handled) < total and not stalled and time.monotonic() < give_up:
            lines = tails.poll()
            polls += 1
            if not restarted and len(handled) + len(lines) > restart_at:
                reemitted = len(handled) + len(lines) - restart_at
                tails.close()  # the daemon dies with these lines read but not handled
                tails = LogTailManager(store)
                tails.add(live)
                tails.start()
                restarted = True
                continue
            if lines:
                with cond:
                    handled.extend(seq_of(line.text) for line in lines)
                    cond.notify_all()
                tails.commit(lines[-1].key, lines[-1].path, lines[-1].end_offset)
            else:
                tails.wait()
    finally:
        thread.join(60)
        tails.close()
    elapsed = time.perf_counter() - start
    verdict = check(handled, total) if not stalled else f"FAILED: {stalled[0]}"
    print(
        f"live : {total:,} lines written by a thread while followed ({backend}), "
        f"3 Manager rotations, 1 restart (~{reemitted:,} read-but-uncommitted lines read "
        f"again): {elapsed * 1000:.0f} ms, {total / elapsed:,.0f} lines/s end to end, "
        f"{polls} polls -- {verdict}"
    )
    return verdict.startswith("OK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} CPU(s)")
    with tempfile.TemporaryDirectory(prefix="logtail-burst-") as tmp:
        root = Path(tmp)
        ok = bench_read(root, args.lines)
        ok = bench_live(root, args.lines) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
