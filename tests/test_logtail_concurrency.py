"""A real writer thread and a real follower loop at the same time: Manager rotations and a
follower restart in the middle, every line handled exactly once and in order."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path

from logtail_helpers import append, manager_rotate

from oom_sentinel.daemon.logs.cursors import MemoryOffsetStore
from oom_sentinel.daemon.logs.tail import LogLine, LogTailManager

LINES = 3000
ROTATE_EVERY = 500
RESTART_AT = 1700
DEADLINE_S = 120.0


def test_writer_and_follower_threads_with_rotations_and_a_restart(tmp_path: Path) -> None:
    live = tmp_path / "comfyui_8188.log"
    store = MemoryOffsetStore()
    handled: list[str] = []
    progress = threading.Condition()
    failures: list[str] = []

    def handled_count() -> int:
        with progress:
            return len(handled)

    def reached(count: int) -> bool:
        return len(handled) >= count

    def writer() -> None:
        rotated_at = 0
        for i in range(LINES):
            if i and i % ROTATE_EVERY == 0:
                # At most one unread rotation (Manager keeps two old names, see the limits
                # in logtail's docstring): wait until the run before the last one is read.
                with progress:
                    if not progress.wait_for(partial(reached, rotated_at), DEADLINE_S):
                        failures.append(f"follower stalled at {len(handled)}")
                        return
                rotated_at = i
                manager_rotate(live)
            # Several lines per write sometimes, a line split over two writes sometimes.
            if i % 7 == 0:
                append(live, f"[{i:06d}] part one")
                append(live, " and two\n")
            else:
                append(live, f"[{i:06d}] line\n")

    expected = [
        f"[{i:06d}] part one and two" if i % 7 == 0 else f"[{i:06d}] line" for i in range(LINES)
    ]
    live.touch()
    tails = LogTailManager(store, poll_interval_ms=50, from_start=True)
    tails.add(live)
    tails.start()
    thread = threading.Thread(target=writer, name="log-writer")
    thread.start()
    restarted = False
    give_up = time.monotonic() + DEADLINE_S  # a guard against hanging, not a speed check
    try:
        while handled_count() < LINES and not failures and time.monotonic() < give_up:
            lines: list[LogLine] = tails.poll()
            if not restarted and handled_count() + len(lines) > RESTART_AT:
                # The daemon dies with these lines read but not handled, then restarts.
                tails.close()
                tails = LogTailManager(store, poll_interval_ms=50)
                tails.add(live)
                tails.start()
                restarted = True
                continue
            if lines:
                with progress:
                    handled.extend(line.text for line in lines)
                    progress.notify_all()
                tails.commit(lines[-1].key, lines[-1].path, lines[-1].end_offset)
            else:
                tails.wait()
    finally:
        thread.join(DEADLINE_S)
        tails.close()
    assert failures == []
    assert restarted
    assert handled == expected
