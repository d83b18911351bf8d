"""Random sequences of appends, partial lines, Manager rotations, copy-truncates,
delete + re-create, polls, commits and follower restarts on real files: the lines handled
(committed) in the end are exactly the lines written, in order, none twice.

The model keeps to the follower's documented limits (logtail's module docstring):
- a copy-truncate or a delete happens only when everything written was read and committed;
- at most two Manager rotations happen between two such sync points (Manager keeps two old
  names; the third rotation deletes the file);
- a file re-created after a delete is polled once before it is rotated away (a file the
  follower never saw cannot be ordered among the rotated ones), and before a restart: a
  re-created live file that reuses the deleted one's inode, found by a restart, cannot be told
  from the cursor's file rotated out of existence, so the Manager copies are read again (the
  limit logtail's docstring states).
A restart may come at any time, also with read-but-uncommitted lines and a partial line.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from logtail_helpers import append, copy_truncate, manager_rotate

from oom_sentinel.daemon.logs.cursors import MemoryOffsetStore
from oom_sentinel.daemon.logs.tail import LogFollower, LogLine


class FollowedLog(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="logtail-model-"))
        self.live = self.dir / "comfyui_8188.log"
        self.store = MemoryOffsetStore()
        self.seq = 0
        self.written: list[str] = []
        self.handled: list[str] = []
        self.uncommitted: list[LogLine] = []
        #: text of the line being written without its newline yet
        self.partial: str | None = None
        #: a write, rotation, truncate, delete or restart happened since the last poll
        self.dirty = False
        #: everything written has been read and committed (and nothing happened since)
        self.synced = False
        self.rotations_since_sync = 0
        #: the live file was re-created and no poll has seen it yet
        self.unseen = False
        self.follower: LogFollower

    @initialize()
    def start(self) -> None:
        self.live.touch()
        self.follower = LogFollower(self.live, self.store, from_start=True)
        self.poll()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _next(self, tag: str) -> str:
        self.seq += 1
        return f"{self.seq:06d} {tag}"

    def _changed(self) -> None:
        self.dirty = True
        self.synced = False

    # -- the writer ---------------------------------------------------------------------------

    @rule(count=st.integers(1, 4), crlf=st.booleans())
    def append_lines(self, count: int, crlf: bool) -> None:
        data = ""
        if self.partial is not None:
            self.written.append(self.partial + " end")
            data += " end\n"
            self.partial = None
        ending = "\r\n" if crlf else "\n"
        for _ in range(count):
            text = self._next("line")
            self.written.append(text)
            data += text + ending
        append(self.live, data)
        self._changed()

    @precondition(lambda self: self.partial is None)
    @rule()
    def start_partial_line(self) -> None:
        self.partial = self._next("partial")
        append(self.live, self.partial)
        self._changed()

    @precondition(lambda self: self.rotations_since_sync < 2 and not self.unseen)
    @rule()
    def manager_rotation(self) -> None:
        if self.partial is not None:
            # The run ended mid-line: its file ends without a newline, read as a last line.
            self.written.append(self.partial)
            self.partial = None
        manager_rotate(self.live)
        self.rotations_since_sync += 1
        self._changed()

    @precondition(lambda self: self.synced and self.partial is None)
    @rule()
    def copy_truncate(self) -> None:
        copy_truncate(self.live)
        self.dirty = True

    @precondition(lambda self: self.synced and self.partial is None)
    @rule()
    def delete_and_recreate(self) -> None:
        self.live.unlink()
        self.live.touch()
        self.dirty = True
        self.unseen = True

    # -- the daemon ---------------------------------------------------------------------------

    @rule()
    def poll(self) -> None:
        self.uncommitted += self.follower.poll()
        self.dirty = False
        self.unseen = False

    @rule()
    def commit(self) -> None:
        if self.uncommitted:
            last = self.uncommitted[-1]
            self.follower.commit(last.path, last.end_offset)
            self.handled += [line.text for line in self.uncommitted]
            self.uncommitted = []
        if not self.dirty and self.partial is None:
            self.synced = True
            self.rotations_since_sync = 0

    @precondition(lambda self: not self.unseen)
    @rule()
    def restart(self) -> None:
        self.uncommitted = []  # read but never handled: they must come again
        self.follower = LogFollower(self.live, self.store)
        self._changed()  # the cursor stays where the last commit put it until a poll

    @invariant()
    def emitted_lines_are_the_written_ones_in_order(self) -> None:
        emitted = self.handled + [line.text for line in self.uncommitted]
        assert emitted == self.written[: len(emitted)]

    def check_everything_arrives(self) -> None:
        """Complete the line in progress, read everything, and compare."""
        if self.partial is not None:
            self.append_lines(1, False)
        for _ in range(3):
            self.poll()
        self.commit()
        assert self.handled == self.written


class FollowedLogToTheEnd(FollowedLog):
    def teardown(self) -> None:
        try:
            self.check_everything_arrives()
        finally:
            super().teardown()


FollowedLogToTheEnd.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_followed_log_loses_and_repeats_nothing = FollowedLogToTheEnd.TestCase


def test_a_restart_after_two_copy_truncates_reads_no_manager_copy_twice() -> None:
    """Found by this model: a Manager rotation, lines read and committed, then two
    copy-truncates (the second overwrites ``X.log.1`` with the truncated, empty file) and a
    restart. No copy holds the cursor's bytes any more, and the restart read the Manager copy
    rotated before the cursor's file again: its line came twice."""
    state = FollowedLogToTheEnd()
    try:
        state.start()
        state.start_partial_line()
        state.manager_rotation()
        state.append_lines(count=1, crlf=False)
        state.poll()
        state.commit()
        state.copy_truncate()
        state.copy_truncate()
        state.restart()
        state.poll()
        state.emitted_lines_are_the_written_ones_in_order()
        state.check_everything_arrives()
    finally:
        FollowedLog.teardown(state)
