"""Exactly once, named cases (issue 11, item 2) against the real daemon process: a storm's
repeats release their log position, a storm spanning a restart stays one snapshot, and a
snapshot that could not be written is written while the daemon runs once there is room."""

from __future__ import annotations

import shutil
import signal
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from daemon_harness import Daemon, append, cuda_oom_record, snapshot_dirs, wait_for

T0 = datetime(2026, 11, 30, 10, 0, 0)
CONFIG = (
    "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 200\n"
    "[incidents]\nstorm_window_s = 60\n"
)

pytestmark = pytest.mark.timeout(120)


def _rows(data_dir: Path) -> list[tuple[str, str | None, int]]:
    conn = sqlite3.connect(f"file:{data_dir / 'oom-sentinel.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT id, snapshot_id, count FROM incidents").fetchall()
    finally:
        conn.close()


def _saved_offset(data_dir: Path) -> int:
    conn = sqlite3.connect(f"file:{data_dir / 'oom-sentinel.db'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT offset FROM log_offsets").fetchone()[0])
    finally:
        conn.close()


def _count(data_dir: Path) -> int:
    return sum(c for _, _, c in _rows(data_dir))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_storm_is_one_snapshot_across_a_restart_and_its_repeats_release_the_position(
    tmp_path: Path, stop: signal.Signals
) -> None:
    log = tmp_path / "comfyui.log"
    log.write_text("")
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    try:
        for i in range(10):
            append(log, cuda_oom_record(T0 + timedelta(seconds=5 * i)))
        wait_for(lambda: _count(daemon.data_dir) == 10, 30, "a storm of 10")
        # the repeats folded into the storm no longer hold the position at the first record
        size = log.stat().st_size
        wait_for(lambda: _saved_offset(daemon.data_dir) == size, 10, "the position saved")
    finally:
        daemon.stop(stop)
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    try:
        # the storm goes on after the restart: the same incident grows
        for i in range(10, 13):
            append(log, cuda_oom_record(T0 + timedelta(seconds=5 * i)))
        wait_for(lambda: _count(daemon.data_dir) >= 13, 30, "the storm to reach 13")
    finally:
        daemon.stop()
    rows = _rows(daemon.data_dir)
    assert [c for _, _, c in rows] == [13], rows
    assert len(snapshot_dirs(daemon.data_dir)) == 1


def test_a_snapshot_that_could_not_be_written_is_written_while_running(tmp_path: Path) -> None:
    log = tmp_path / "comfyui.log"
    log.write_text("")
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    snapshots = daemon.data_dir / "snapshots"
    try:
        # No room for snapshots: the directory is replaced by a file (a full disk answers
        # every write the same way: an OSError the writer cannot get around).
        shutil.rmtree(snapshots)
        snapshots.write_text("not a directory")
        for i in range(3):  # three separate incidents (10 minutes apart, window 1 minute)
            append(log, cuda_oom_record(T0 + timedelta(minutes=10 * i)))
        wait_for(
            lambda: daemon.stderr().count("could not write the snapshot") >= 3,
            20,
            "three failed snapshot writes",
        )
        assert _rows(daemon.data_dir) == []
        snapshots.unlink()
        snapshots.mkdir(mode=0o700)
        wait_for(lambda: len(snapshot_dirs(daemon.data_dir)) == 3, 20, "the retried snapshots")
        wait_for(lambda: _count(daemon.data_dir) == 3, 10, "their rows")
        assert daemon.proc is not None and daemon.proc.poll() is None
    finally:
        daemon.stop()
    assert len(snapshot_dirs(daemon.data_dir)) == 3
    assert "Traceback" not in daemon.all_stderr()


@pytest.mark.timeout(180)
def test_a_storm_row_that_could_not_be_saved_is_saved_while_running(tmp_path: Path) -> None:
    """The store refusing writes (a full disk fails SQLite's too; here another process holds
    its write lock past the busy timeout) delays a storm's count, never drops or repeats it."""
    log = tmp_path / "comfyui.log"
    log.write_text("")
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    db = daemon.data_dir / "oom-sentinel.db"
    try:
        append(log, cuda_oom_record(T0))
        wait_for(lambda: _count(daemon.data_dir) == 1, 30, "the first failure")
        blocker = sqlite3.connect(db, isolation_level=None, timeout=30)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            for i in range(1, 4):
                append(log, cuda_oom_record(T0 + timedelta(seconds=5 * i)))
            wait_for(lambda: "could not save incident" in daemon.stderr(), 60, "a failed row save")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        wait_for(lambda: _count(daemon.data_dir) == 4, 60, "the storm saved on a later try")
    finally:
        daemon.stop(signal.SIGKILL)
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    try:
        append(log, cuda_oom_record(T0 + timedelta(seconds=20)))
        wait_for(lambda: _count(daemon.data_dir) == 5, 30, "the next repeat")
    finally:
        daemon.stop()
    assert [c for _, _, c in _rows(daemon.data_dir)] == [5]
    assert len(snapshot_dirs(daemon.data_dir)) == 1


@pytest.mark.timeout(180)
def test_the_position_is_saved_while_a_backlog_is_worked_through(tmp_path: Path) -> None:
    """A backlog of 200 incidents: killed half-way, the saved position is near the last
    failure counted, not at byte 0 (it was saved only when the whole batch ended)."""
    log = tmp_path / "comfyui.log"
    log.write_text("")
    daemon = Daemon(tmp_path, logs=[log], config=CONFIG).start()
    daemon.stop()
    starts: list[int] = []
    with open(log, "a", encoding="utf-8") as fh:
        for i in range(200):  # each its own incident: 10 minutes apart, window 1 minute
            starts.append(fh.tell())
            fh.write(cuda_oom_record(T0 + timedelta(minutes=10 * i)))
    daemon.spawn()
    try:
        wait_for(lambda: _count(daemon.data_dir) >= 40, 60, "40 of the backlog counted")
    finally:
        daemon.stop(signal.SIGKILL)
    counted = _count(daemon.data_dir)
    assert counted < 200, "the backlog was done before the kill: nothing measured"
    # at most one batch (16 records, i.e. a few failures) behind the last failure counted
    assert _saved_offset(daemon.data_dir) >= starts[counted - 8]
