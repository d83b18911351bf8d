"""Wake-ups: the watchdog observer is a hint that ends ``wait()`` early; the poll interval is
the safety net. Every check waits on a condition with a generous timeout and asserts what
happened (the event fired or not), never how long it took."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from logtail_helpers import append, manager_rotate

from oom_sentinel.daemon.logs.cursors import MemoryOffsetStore
from oom_sentinel.daemon.logs.tail import LogTailManager

#: Far longer than any wait below: a wait that returns True was woken by a hint.
NEVER_MS = 3_600_000
NATIVE = sys.platform.startswith(("linux", "win32", "darwin"))


@pytest.fixture
def manager() -> Iterator[LogTailManager]:
    tails = LogTailManager(MemoryOffsetStore(), poll_interval_ms=NEVER_MS, from_start=True)
    yield tails
    tails.close()


def _drain_wakeups(tails: LogTailManager) -> None:
    while tails.wait(timeout_s=0):
        tails.poll()


@pytest.mark.skipif(not NATIVE, reason="no native watchdog backend")
def test_observer_wakes_the_follower_long_before_the_poll_interval(
    manager: LogTailManager, tmp_path: Path
) -> None:
    live = tmp_path / "comfyui.log"
    manager.add(live)
    manager.start()
    assert manager.wake_backend.startswith("watchdog ")
    assert manager.watched_dirs == [str(tmp_path)]
    _drain_wakeups(manager)
    append(live, "got prompt\n")
    assert manager.wait(timeout_s=30) is True
    assert [line.text for line in manager.poll()] == ["got prompt"]


@pytest.mark.skipif(not NATIVE, reason="no native watchdog backend")
def test_manager_rotation_wakes_the_follower(manager: LogTailManager, tmp_path: Path) -> None:
    live = tmp_path / "comfyui.log"
    manager.add(live)
    manager.start()
    append(live, "a\n")
    manager.poll()
    _drain_wakeups(manager)
    manager_rotate(live)
    assert manager.wait(timeout_s=30) is True


@pytest.mark.skipif(not NATIVE, reason="no native watchdog backend")
def test_reading_the_log_and_unrelated_files_do_not_wake(
    manager: LogTailManager, tmp_path: Path
) -> None:
    live = tmp_path / "comfyui.log"
    manager.add(live)
    manager.start()
    append(live, "a\n")
    assert manager.wait(timeout_s=30) is True
    assert len(manager.poll()) == 1
    while manager.wait(timeout_s=1.0):  # let the append's trailing events pass
        manager.poll()
    # Readers open and close the followed file (inotify reports both) ...
    for _ in range(5):
        reader = LogTailManager(MemoryOffsetStore(), from_start=True, use_observer=False)
        reader.add(live)
        assert len(reader.poll()) == 1
    # ... and ComfyUI writes other files next to the log.
    (tmp_path / "comfyui.db").write_bytes(b"sqlite\n")
    assert manager.wait(timeout_s=0.5) is False


@pytest.mark.skipif(not NATIVE, reason="no native watchdog backend")
def test_directory_created_later_is_watched_after_a_poll(
    manager: LogTailManager, tmp_path: Path
) -> None:
    live = tmp_path / "later" / "comfyui.log"
    manager.add(live)
    manager.start()
    assert manager.watched_dirs == []
    live.parent.mkdir()
    manager.poll()  # the safety poll schedules the new directory
    assert manager.watched_dirs == [str(live.parent)]
    _drain_wakeups(manager)
    append(live, "hello\n")
    assert manager.wait(timeout_s=30) is True
    assert [line.text for line in manager.poll()] == ["hello"]


@pytest.mark.skipif(not NATIVE, reason="no native watchdog backend")
def test_observer_is_restarted_after_it_stopped(
    manager: LogTailManager, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = tmp_path / "comfyui.log"
    manager.add(live)
    manager.start()
    observer = manager._waker._observer
    observer.stop()
    observer.join()
    assert manager.wake_backend == "poll"
    with caplog.at_level(logging.WARNING, logger="oom_sentinel.daemon.logs.tail"):
        manager.poll()
    assert manager.wake_backend.startswith("watchdog ")
    assert any("starting a new one" in r.getMessage() for r in caplog.records)
    _drain_wakeups(manager)
    append(live, "after restart\n")
    assert manager.wait(timeout_s=30) is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify ends the watch")
def test_watch_of_a_deleted_directory_is_renewed(manager: LogTailManager, tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    live = user / "comfyui.log"
    manager.add(live)
    manager.start()
    assert manager.watched_dirs == [str(user)]
    old = list(manager._waker._observer.emitters)
    user.rmdir()  # inotify ends the watch: its emitter thread stops
    for emitter in old:
        emitter.join(timeout=30)
    assert not any(emitter.is_alive() for emitter in old)
    user.mkdir()
    manager.poll()  # the safety poll notices and schedules the new directory
    assert manager.watched_dirs == [str(user)]
    _drain_wakeups(manager)
    append(live, "in the new directory\n")
    assert manager.wait(timeout_s=30) is True


def test_startup_logs_which_backend_is_active(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for use_observer in (True, False):
        caplog.clear()
        tails = LogTailManager(MemoryOffsetStore(), use_observer=use_observer)
        tails.add(tmp_path / "comfyui.log")
        with caplog.at_level(logging.INFO, logger="oom_sentinel.daemon.logs.tail"), tails:
            pass
        lines = [r.getMessage() for r in caplog.records if "log follower" in r.getMessage()]
        assert len(lines) == 1
        if use_observer and NATIVE:
            assert "woken by watchdog" in lines[0] and "safety poll every 2000 ms" in lines[0]
        else:
            assert "polled every 2000 ms only (disabled by configuration)" in lines[0]


def test_poll_only_manager_times_out_and_wake_ends_a_wait_from_another_thread(
    tmp_path: Path,
) -> None:
    tails = LogTailManager(MemoryOffsetStore(), poll_interval_ms=NEVER_MS, use_observer=False)
    tails.add(tmp_path / "comfyui.log")
    with tails:
        assert tails.wake_backend == "poll"
        assert tails.wait(timeout_s=0) is True  # add() asks for an immediate first poll
        assert tails.poll() == []  # the file does not exist yet: it is read from 0 later
        assert tails.wait(timeout_s=0.05) is False
        append(tmp_path / "comfyui.log", "not seen by any observer\n")
        assert tails.wait(timeout_s=0.05) is False
        waker = threading.Thread(target=tails.wake)
        waker.start()
        assert tails.wait(timeout_s=30) is True
        waker.join()
        assert [line.text for line in tails.poll()] == ["not seen by any observer"]
