"""The log follower on real files: rotation as ComfyUI-Manager does it, restarts with the
same offset store, copy-truncate, delete + re-create, late files, partial and huge lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from logtail_helpers import append, copy_truncate, manager_rotate

from oom_sentinel.daemon.core.errors import StoreError
from oom_sentinel.daemon.logs import tail as logtail
from oom_sentinel.daemon.logs.cursors import FileCursor, MemoryOffsetStore
from oom_sentinel.daemon.logs.tail import (
    FINGERPRINT_BYTES,
    LineSplitter,
    LogFollower,
    LogLine,
    LogTailManager,
    head_digest,
)


@pytest.fixture
def live(tmp_path: Path) -> Path:
    user = tmp_path / "user"
    user.mkdir()
    return user / "comfyui_8188.log"


def texts(lines: list[LogLine]) -> list[str]:
    return [line.text for line in lines]


def commit_all(follower: LogFollower, lines: list[LogLine]) -> None:
    follower.commit(lines[-1].path, lines[-1].end_offset)


# -- start-up policy ---------------------------------------------------------------------------


def test_unseen_file_is_followed_from_its_end(live: Path) -> None:
    append(live, "old history 1\nold history 2\n")
    follower = LogFollower(live, MemoryOffsetStore())
    assert follower.poll() == []
    append(live, "new line\n")
    assert texts(follower.poll()) == ["new line"]


def test_unseen_file_start_keeps_the_line_in_progress_whole(live: Path) -> None:
    append(live, "old\nhalf of a ")
    follower = LogFollower(live, MemoryOffsetStore())
    assert follower.poll() == []
    append(live, "line\n")
    assert texts(follower.poll()) == ["half of a line"]


def test_from_start_reads_existing_history(live: Path) -> None:
    append(live, "one\ntwo\n")
    lines = LogFollower(live, MemoryOffsetStore(), from_start=True).poll()
    assert texts(lines) == ["one", "two"]
    assert [(line.start_offset, line.end_offset) for line in lines] == [(0, 4), (4, 8)]
    assert {line.key for line in lines} == {str(live)}
    assert {line.path for line in lines} == {str(live)}


def test_start_position_is_saved_before_any_commit(live: Path) -> None:
    append(live, "history\n")
    store = MemoryOffsetStore()
    LogFollower(live, store).poll()
    append(live, "written while the daemon restarts\n")
    # A restart before the first commit must not start at the (new) end again.
    assert texts(LogFollower(live, store).poll()) == ["written while the daemon restarts"]


def test_file_created_later_is_read_from_its_start(tmp_path: Path) -> None:
    live = tmp_path / "not-yet" / "user" / "comfyui.log"
    follower = LogFollower(live, MemoryOffsetStore())
    assert follower.poll() == []
    assert follower.state.path is None
    live.parent.mkdir(parents=True)
    append(live, "first line ever\nsecond\n")
    assert texts(follower.poll()) == ["first line ever", "second"]


# -- line shapes -------------------------------------------------------------------------------


def test_partial_last_line_is_emitted_only_when_its_newline_arrives(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "complete\nTraceback (most")
    assert texts(follower.poll()) == ["complete"]
    assert follower.state.partial_bytes == len("Traceback (most")
    append(live, " recent call last):")
    assert follower.poll() == []
    append(live, "\n")
    lines = follower.poll()
    assert texts(lines) == ["Traceback (most recent call last):"]
    assert lines[0].start_offset == len("complete\n")


def test_crlf_endings_are_stripped_and_offsets_count_raw_bytes(live: Path) -> None:
    append(live, b"a\r\nbb\r\n\r\nc\rd\n")
    lines = LogFollower(live, MemoryOffsetStore(), from_start=True).poll()
    assert texts(lines) == ["a", "bb", "", "c\rd"]
    assert [line.end_offset for line in lines] == [3, 7, 9, 13]


def test_invalid_utf8_is_replaced_and_following_lines_are_intact(live: Path) -> None:
    append(live, b"bad \xff\xfe bytes\n\xe2\x82\n" + "fine \u20ac\n".encode())
    lines = LogFollower(live, MemoryOffsetStore(), from_start=True).poll()
    assert texts(lines) == ["bad \ufffd\ufffd bytes", "\ufffd", "fine \u20ac"]


def test_one_mebibyte_line_arrives_whole_across_polls(live: Path) -> None:
    big = "x" * (1024 * 1024)
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, big[: 600 * 1024])
    assert follower.poll() == []
    append(live, big[600 * 1024 :] + "\nafter\n")
    lines = follower.poll()
    assert [len(t) for t in texts(lines)] == [1024 * 1024, 5]
    assert lines[0].text == big
    assert lines[1].start_offset == 1024 * 1024 + 1


def test_overlong_line_is_cut_at_a_utf8_boundary() -> None:
    splitter = LineSplitter(0, max_line_bytes=8)
    pieces = splitter.feed(("é" * 6 + "\n").encode())
    assert [raw.decode() for raw, _, _ in pieces] == ["éééé", "éé"]
    assert [(start, end) for _, start, end in pieces] == [(0, 8), (8, 13)]


def test_flush_partial_emits_a_stale_line_and_the_rest_arrives_separately(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "progress 50%")
    assert follower.poll() == []
    flushed = follower.flush_partial()
    assert texts(flushed) == ["progress 50%"]
    append(live, " done\n")
    lines = follower.poll()
    assert texts(lines) == [" done"]
    assert lines[0].start_offset == flushed[0].end_offset == len("progress 50%")


def test_partial_line_is_flushed_after_the_configured_idle_time(live: Path) -> None:
    now = [100.0]
    follower = LogFollower(
        live, MemoryOffsetStore(), from_start=True, partial_timeout_s=5.0, clock=lambda: now[0]
    )
    append(live, "no newline yet")
    assert follower.poll() == []
    now[0] += 4.0
    assert follower.poll() == []
    append(live, ", still growing")  # growth restarts the idle clock
    now[0] += 4.0
    assert follower.poll() == []
    now[0] += 5.0
    assert texts(follower.poll()) == ["no newline yet, still growing"]


# -- rotation as ComfyUI-Manager does it ---------------------------------------------------------


def test_lines_written_just_before_manager_rotation_are_read_from_prev_log(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "[2026-01-02 10:00:00.000] got prompt\n")
    assert texts(follower.poll()) == ["[2026-01-02 10:00:00.000] got prompt"]
    append(live, "torch.OutOfMemoryError: Allocation on device\nGot an OOM\n")
    manager_rotate(live)  # ComfyUI restarts before the follower polls
    append(live, "[2026-01-02 10:05:00.000] ** ComfyUI startup time\n")
    lines = follower.poll()
    assert texts(lines) == [
        "torch.OutOfMemoryError: Allocation on device",
        "Got an OOM",
        "[2026-01-02 10:05:00.000] ** ComfyUI startup time",
    ]
    prev = str(live.with_name("comfyui_8188.prev.log"))
    assert [line.path for line in lines] == [prev, prev, str(live)]
    assert lines[2].start_offset == 0


def test_double_rotation_between_polls_reads_every_run_in_order(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "run 1 a\n")
    follower.poll()
    append(live, "run 1 crash\n")
    manager_rotate(live)
    append(live, "run 2 install scripts, re-exec\n")
    manager_rotate(live)
    append(live, "run 3\n")
    lines = follower.poll()
    assert texts(lines) == ["run 1 crash", "run 2 install scripts, re-exec", "run 3"]
    assert [Path(line.path).name for line in lines] == [
        "comfyui_8188.prev2.log",
        "comfyui_8188.prev.log",
        "comfyui_8188.log",
    ]


def test_follower_stays_on_rotated_file_until_a_newer_one_exists(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "a\n")
    follower.poll()
    prev = live.with_name("comfyui_8188.prev.log")
    os.rename(live, prev)  # the rename is done, the new file not yet created
    append(prev, "still written to the renamed file\n")
    assert texts(follower.poll()) == ["still written to the renamed file"]
    append(prev, "more\n")
    append(live, "new file\n")
    assert texts(follower.poll()) == ["more", "new file"]


def test_rotated_file_ending_without_newline_yields_its_last_line(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "ok\nkilled mid-li")
    assert texts(follower.poll()) == ["ok"]
    manager_rotate(live)
    append(live, "next run\n")
    assert texts(follower.poll()) == ["killed mid-li", "next run"]


def test_desktop_style_timestamped_rotation_is_read_to_the_end(tmp_path: Path) -> None:
    live = tmp_path / "comfyui.log"
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "[2025-03-28 01:40:15.296] [info]  a\n")
    follower.poll()
    append(live, "[2025-03-28 01:40:16.000] [error]  CUDA out of memory\n")
    os.rename(live, tmp_path / "comfyui.log_2026-04-03T16-34-11-099Z.log")
    append(live, "[2026-04-03 16:34:12.000] [info]  started\n")
    assert texts(follower.poll()) == [
        "[2025-03-28 01:40:16.000] [error]  CUDA out of memory",
        "[2026-04-03 16:34:12.000] [info]  started",
    ]


# -- restarts and commits ------------------------------------------------------------------------


def test_restart_after_rotation_resumes_in_the_rotated_file(live: Path) -> None:
    store = MemoryOffsetStore()
    first = LogFollower(live, store, from_start=True)
    append(live, "handled\n")
    commit_all(first, first.poll())
    append(live, "Memory summary: ...\ntorch.OutOfMemoryError: CUDA out of memory\n")
    del first  # the daemon dies before reading the crash lines
    manager_rotate(live)  # ComfyUI is restarted while the daemon is down
    append(live, "fresh start\n")
    second = LogFollower(live, store)
    lines = second.poll()
    assert texts(lines) == [
        "Memory summary: ...",
        "torch.OutOfMemoryError: CUDA out of memory",
        "fresh start",
    ]
    assert Path(lines[0].path).name == "comfyui_8188.prev.log"


def test_restart_after_double_rotation_walks_prev2_prev_then_live(live: Path) -> None:
    store = MemoryOffsetStore()
    first = LogFollower(live, store, from_start=True)
    append(live, "handled\n")
    commit_all(first, first.poll())
    append(live, "crash of run 1\n")
    manager_rotate(live)
    append(live, "run 2\n")
    manager_rotate(live)
    append(live, "run 3\n")
    assert texts(LogFollower(live, store).poll()) == ["crash of run 1", "run 2", "run 3"]


def test_uncommitted_tail_is_emitted_again_after_restart_and_nothing_twice_after(
    live: Path,
) -> None:
    store = MemoryOffsetStore()
    first = LogFollower(live, store, from_start=True)
    append(live, "record 1\nTraceback (most recent call last):\n  File x\n")
    lines = first.poll()
    # The assembler completed "record 1" but still holds the traceback: commit before it.
    first.commit(lines[1].path, lines[1].start_offset)
    second = LogFollower(live, store)
    again = second.poll()
    assert texts(again) == ["Traceback (most recent call last):", "  File x"]
    commit_all(second, again)
    append(live, "torch.OutOfMemoryError: boom\n")
    assert texts(LogFollower(live, store).poll()) == ["torch.OutOfMemoryError: boom"]


def test_commit_of_a_line_from_a_rotated_file_survives_restart(live: Path) -> None:
    store = MemoryOffsetStore()
    first = LogFollower(live, store, from_start=True)
    append(live, "a\n")
    first.poll()
    append(live, "b\nc\n")
    manager_rotate(live)
    append(live, "d\n")
    lines = first.poll()
    assert texts(lines) == ["b", "c", "d"]
    first.commit(lines[1].path, lines[1].end_offset)  # handled up to "c" in .prev.log
    assert texts(LogFollower(live, store).poll()) == ["d"]


def test_cursor_moves_on_once_a_finished_file_is_fully_committed(live: Path) -> None:
    store = MemoryOffsetStore()
    first = LogFollower(live, store, from_start=True)
    append(live, "run 1\n")
    commit_all(first, first.poll())
    manager_rotate(live)
    assert first.poll() == []  # moved on to the new, empty file: nothing to commit
    append(live, "run 2 crash\n")
    assert texts(first.poll()) == ["run 2 crash"]  # read, never handled
    manager_rotate(live)
    manager_rotate(live)  # run 1's file is deleted now
    append(live, "run 4\n")
    # The cursor followed to run 2's file when run 1's was done, so nothing is skipped.
    assert texts(LogFollower(live, store).poll()) == ["run 2 crash", "run 4"]


def test_commit_at_the_end_of_a_finished_file_points_at_the_next(live: Path) -> None:
    store = MemoryOffsetStore()
    live.touch()
    first = LogFollower(live, store, from_start=True)
    assert first.poll() == []
    append(live, "a\n")
    manager_rotate(live)
    lines = first.poll()
    assert texts(lines) == ["a"]
    first.commit(lines[0].path, lines[0].end_offset)
    saved = store.load_cursor(str(live))
    assert saved is not None
    assert (saved.ino, saved.offset) == (live.stat().st_ino, 0)


def test_commit_of_a_position_never_emitted_is_refused(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "a\nb\n")
    lines = follower.poll()
    follower.commit(lines[1].path, lines[1].end_offset)
    with pytest.raises(ValueError, match="not emitted since the last commit"):
        follower.commit(lines[0].path, lines[0].end_offset)
    with pytest.raises(ValueError):
        follower.commit(str(live) + ".other", 2)


def test_cursor_whose_file_is_gone_reads_the_current_file_from_its_start(live: Path) -> None:
    store = MemoryOffsetStore()
    append(live, "old run\n")
    first = LogFollower(live, store, from_start=True)
    commit_all(first, first.poll())
    for _ in range(3):  # the third rotation deletes the file the cursor names
        manager_rotate(live)
    append(live, "current run\n")
    assert texts(LogFollower(live, store).poll()) == ["current run"]


def test_cursor_fingerprint_mismatch_on_reused_inode_reads_from_start(live: Path) -> None:
    append(live, "[2026-01-01 00:00:00.000] current content\n")
    st = live.stat()
    head = b"[2025-12-31 23:59:59.999] other content that was here before\n"
    store = MemoryOffsetStore()
    store.save_cursor(FileCursor(str(live), st.st_dev, st.st_ino, 20, head_digest(head, 20)))
    lines = LogFollower(live, store).poll()
    assert texts(lines) == ["[2026-01-01 00:00:00.000] current content"]


def test_unrelated_port_log_is_never_taken_for_a_rotated_copy(tmp_path: Path) -> None:
    live = tmp_path / "comfyui.log"
    other = tmp_path / "comfyui_8188.log"
    append(other, "another instance\n")
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "ours\n")
    follower.poll()
    live.unlink()
    append(other, "another instance, later\n")
    assert follower.poll() == []
    append(live, "ours again\n")
    assert texts(follower.poll()) == ["ours again"]


# -- truncation, deletion ----------------------------------------------------------------------


def test_copy_truncate_restarts_at_zero(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "before 1\nbefore 2\n")
    assert len(follower.poll()) == 2
    copy_truncate(live)
    assert follower.poll() == []
    append(live, "after\n")
    lines = follower.poll()
    assert texts(lines) == ["after"]
    assert lines[0].start_offset == 0


def test_truncate_and_regrow_past_the_offset_is_caught_by_the_fingerprint(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "[10:00:00] first run\n")
    follower.poll()
    copy_truncate(live)
    append(live, "[11:00:00] second run, a longer line than before\n")
    assert texts(follower.poll()) == ["[11:00:00] second run, a longer line than before"]


def test_commit_after_copy_truncate_names_the_new_content(live: Path) -> None:
    store = MemoryOffsetStore()
    follower = LogFollower(live, store, from_start=True)
    append(live, "[10:00:00] a\n")
    follower.poll()
    copy_truncate(live)
    append(live, "[11:00:00] b\n[11:00:01] c\n")
    lines = follower.poll()
    follower.commit(lines[0].path, lines[0].end_offset)
    assert texts(LogFollower(live, store).poll()) == ["[11:00:01] c"]


def test_delete_and_recreate_is_followed_from_the_start(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "[10:00:00] first file\n")
    follower.poll()
    live.unlink()
    assert follower.poll() == []  # gone: wait for it
    append(live, "[10:00:05] second file\n")  # may reuse the inode
    assert texts(follower.poll()) == ["[10:00:05] second file"]


def test_delete_and_recreate_before_a_poll_reads_the_new_file(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "[10:00:00] first file, long enough\n")
    follower.poll()
    live.unlink()
    append(live, "[10:00:05] second\n")
    assert texts(follower.poll()) == ["[10:00:05] second"]


# -- resources and errors ------------------------------------------------------------------------


def _fds_naming(path: Path) -> list[str]:
    fd_dir = Path("/proc/self/fd")
    found = []
    for entry in fd_dir.iterdir():
        try:
            if os.readlink(entry).startswith(str(path.parent)):
                found.append(entry.name)
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_no_file_stays_open_between_polls(live: Path) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "a\npartial")
    follower.poll()
    manager_rotate(live)
    follower.poll()
    assert _fds_naming(live) == []


def test_idle_polls_only_stat(live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "a\n")
    follower.poll()
    opened: list[str] = []
    real_open = logtail.open_shared

    def spy(path: str):  # type: ignore[no-untyped-def]
        opened.append(path)
        return real_open(path)

    monkeypatch.setattr(logtail, "open_shared", spy)
    for _ in range(5):
        assert follower.poll() == []
    assert opened == []
    append(live, "b\n")
    assert texts(follower.poll()) == ["b"]
    assert opened == [str(live)]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_reported_once_and_recovers(
    live: Path, caplog: pytest.LogCaptureFixture
) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    append(live, "a\n")
    follower.poll()
    append(live, "b\n")
    live.chmod(0)
    try:
        assert follower.poll() == []
        assert follower.poll() == []
        assert follower.error is not None and "Permission denied" in follower.error
        assert sum("cannot read" in r.getMessage() for r in caplog.records) == 1
    finally:
        live.chmod(0o644)
    assert texts(follower.poll()) == ["b"]
    assert follower.error is None


def test_backlog_larger_than_the_read_budget_wakes_the_next_wait(live: Path) -> None:
    append(live, "".join(f"line {i:04d}\n" for i in range(1000)))
    manager = LogTailManager(
        MemoryOffsetStore(), from_start=True, use_observer=False, max_read_bytes=4096
    )
    manager.add(live)
    manager.wait(0)  # consume the wake-up that add() sets
    got: list[str] = []
    got += texts(manager.poll())
    assert 0 < len(got) < 1000
    while manager.wait(timeout_s=0):
        got += texts(manager.poll())
    assert got == [f"line {i:04d}" for i in range(1000)]


def test_manager_commit_and_state_per_key(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    store = MemoryOffsetStore()
    manager = LogTailManager(store, from_start=True, use_observer=False)
    manager.add(a)
    manager.add(str(b))
    assert manager.add(a) is manager.followers[str(a)]
    append(a, "a1\n")
    append(b, "b1\nb2\n")
    lines = manager.poll()
    assert [(Path(line.key).name, line.text) for line in lines] == [
        ("a.log", "a1"),
        ("b.log", "b1"),
        ("b.log", "b2"),
    ]
    manager.commit(str(b), lines[1].path, lines[1].end_offset)
    saved = store.load_cursor(str(b))
    assert saved is not None and saved.offset == 3
    state = manager.followers[str(b)].state
    assert state.path == str(b) and state.offset == 6 and state.error is None
    manager.remove(str(a))
    assert list(manager.followers) == [str(b)]


@pytest.mark.skipif(sys.platform != "win32", reason="Windows sharing modes")
def test_open_shared_does_not_block_rename_on_windows(live: Path) -> None:
    append(live, "a\n")
    with logtail.open_shared(str(live)) as fh:
        os.rename(live, live.with_name("comfyui_8188.prev.log"))
        assert fh.read() == b"a\n"


def test_fingerprint_covers_only_bytes_before_the_offset() -> None:
    head = b"0123456789" * 200
    assert head_digest(head, 0) == ""
    assert head_digest(head, 5) == head_digest(b"01234 other bytes", 5)
    assert head_digest(head, 10_000) == head_digest(head[:FINGERPRINT_BYTES], 10_000)


def test_stat_failure_is_reported_once_and_recovers(
    live: Path, caplog: pytest.LogCaptureFixture
) -> None:
    follower = LogFollower(live, MemoryOffsetStore(), from_start=True)
    os.symlink(live.name, live)  # a link to itself: stat fails with ELOOP
    assert follower.poll() == []
    assert follower.poll() == []
    assert follower.error is not None and "cannot stat" in follower.error
    assert sum("cannot stat" in r.getMessage() for r in caplog.records) == 1
    live.unlink()
    append(live, "readable\n")
    assert texts(follower.poll()) == ["readable"]
    assert follower.error is None


def test_a_start_that_failed_is_retried_from_the_saved_cursor(live: Path) -> None:
    store = MemoryOffsetStore()
    first = LogFollower(live, store, from_start=True)
    append(live, "handled\n")
    commit_all(first, first.poll())
    append(live, "crash\n")
    manager_rotate(live)
    loop = live.with_name(live.name + ".1")
    os.symlink(loop.name, loop)  # a rotated name that cannot be stat()ed (ELOOP)
    second = LogFollower(live, store)
    assert second.poll() == []
    assert second.error is not None
    loop.unlink()
    assert texts(second.poll()) == ["crash"]


class _FailingStore(MemoryOffsetStore):
    """The store contract's error path: every save raises StoreError."""

    def save_cursor(self, cursor: FileCursor) -> None:
        raise StoreError(f"oom-sentinel.db: cannot save the position of {cursor.key}")


def test_store_failure_while_polling_still_delivers_the_lines(
    live: Path, caplog: pytest.LogCaptureFixture
) -> None:
    follower = LogFollower(live, _FailingStore(), from_start=True)
    append(live, "a\nb\n")
    lines = follower.poll()
    assert texts(lines) == ["a", "b"]  # although the start position could not be saved
    assert any("could not save the log position" in r.getMessage() for r in caplog.records)
    with pytest.raises(StoreError, match="cannot save the position"):
        commit_all(follower, lines)  # a commit reports it to its caller


class _CountingStore(MemoryOffsetStore):
    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    def save_cursor(self, cursor: FileCursor) -> None:
        self.saves += 1
        super().save_cursor(cursor)


def test_committing_the_same_position_again_writes_nothing(live: Path) -> None:
    store = _CountingStore()
    follower = LogFollower(live, store, from_start=True)
    append(live, "a\nTraceback (most recent call last):\n")
    lines = follower.poll()
    before = store.saves
    for _ in range(3):  # the service commits the pending record's start after every poll
        follower.commit(lines[1].path, lines[1].start_offset)
        assert follower.poll() == []
    assert store.saves == before + 1


def test_lines_written_between_start_and_the_first_poll_are_read(live: Path) -> None:
    # The daemon says it is ready after start(); a record appended right then is new, not
    # part of the old content the follower skips.
    append(live, "old 1\nold 2\n")
    manager = LogTailManager(MemoryOffsetStore(), use_observer=False)
    manager.add(live)
    manager.start()
    append(live, "new\n")
    assert texts(manager.poll()) == ["new"]
    manager.close()


def _unreadable_probe(work: Path) -> dict[str, object]:
    live = work / "comfyui.log"
    live.write_text("old 1\nold 2\n")
    live.chmod(0o200)  # its writer may append, we may not read
    follower = LogFollower(live, MemoryOffsetStore())
    out: dict[str, object] = {"first": texts(follower.poll()), "error": follower.error}
    append(live, "written while unreadable\n")
    follower.poll()
    live.chmod(0o600)
    append(live, "after\n")
    out["then"] = texts(follower.poll())
    return out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork to drop root")
def test_a_log_unreadable_when_first_seen_is_read_from_there_once_readable(
    tmp_path: Path,
) -> None:
    """Issue 11: OOMs written while the log was unreadable were skipped once it was readable
    again -- the follower started at the end it found then. Root reads any file, so as root
    the probe runs in a forked child that has become ``nobody``."""
    import shutil
    import tempfile

    root = os.geteuid() == 0
    # pytest's tmp dirs are private to root; nobody needs a path it can walk
    work = Path(tempfile.mkdtemp(prefix="unreadable-")) if root else tmp_path
    if root:
        work.chmod(0o755)
        os.chown(work, 65534, 65534)
    try:
        out = _probe_in_child(work, root)
    finally:
        if root:
            shutil.rmtree(work, ignore_errors=True)
    assert "crash" not in out, out
    assert out["first"] == [] and "Permission denied" in str(out["error"])
    assert out["then"] == ["written while unreadable", "after"]


def _probe_in_child(work: Path, root: bool) -> dict[str, object]:
    import json

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(rfd)
            if root:
                os.setgid(65534)
                os.setuid(65534)
            payload = json.dumps(_unreadable_probe(work))
        except BaseException as exc:
            payload, code = json.dumps({"crash": repr(exc)}), 1
        os.write(wfd, payload.encode())
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)  # type: ignore[no-any-return]


def test_cursor_whose_file_was_rotated_away_reads_every_copy_rotated_after_it(
    live: Path,
) -> None:
    """Issue 11: after three Manager rotations while the daemon was down, the restart read only
    the live file ("no longer in its rotation family", or "truncated or replaced" when the new
    live file reused the deleted file's inode); the runs in .prev2.log and .prev.log were
    skipped. They were all written after the cursor's file, oldest first."""
    store = MemoryOffsetStore()
    append(live, "old run\n")
    first = LogFollower(live, store, from_start=True)
    commit_all(first, first.poll())
    for run in (2, 3, 4):
        manager_rotate(live)  # the third one deletes the file the cursor names
        append(live, f"run {run} crash\n")
    assert texts(LogFollower(live, store).poll()) == ["run 2 crash", "run 3 crash", "run 4 crash"]


def test_a_restart_after_a_copy_truncate_reads_no_manager_copy_twice(tmp_path: Path) -> None:
    """Found by the stateful model: a Manager rotation, then logrotate's copytruncate of the
    live file, then a restart. The truncated live file (the cursor's inode, other content) was
    taken for a deleted file whose inode was reused, so the restart re-read ``.prev.log`` from
    its start: line 1 counted twice. The copy holds the cursor's content; resume there."""

    live = tmp_path / "comfyui_8188.log"
    live.touch()
    store = MemoryOffsetStore()
    follower = LogFollower(live, store, from_start=True)
    assert follower.poll() == []
    append(live, "000001 line\n")
    manager_rotate(live)
    append(live, "000002 line\n")
    got = follower.poll()
    assert [ln.text for ln in got] == ["000001 line", "000002 line"]
    follower.commit(got[-1].path, got[-1].end_offset)
    copy_truncate(live)
    append(live, "000003 line\n")  # written after the truncate: read once, from byte 0
    follower = LogFollower(live, store)
    got = follower.poll()
    assert [ln.text for ln in got] == ["000003 line"]
    follower.commit(got[-1].path, got[-1].end_offset)
    follower = LogFollower(live, store)  # and a second restart repeats nothing
    assert follower.poll() == []
