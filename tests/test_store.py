"""The SQLite store: migrations, refusal of foreign/corrupt/newer files, offsets, durability."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.core.errors import StoreError
from oom_sentinel.daemon.incidents.tracker import IncidentTracker, Observation, WriteSnapshot
from oom_sentinel.daemon.logs.cursors import FileCursor, OffsetStore
from oom_sentinel.daemon.store import db as store_mod
from oom_sentinel.daemon.store.db import APPLICATION_ID, DB_NAME, MIGRATIONS, IncidentRow, Store


def row(n: int = 1, **changes: object) -> IncidentRow:
    base = IncidentRow(
        id=f"inc{n}",
        snapshot_id=f"20260102T101112Z_gpu_KSampler_{n}",
        instance="main",
        pool="gpu",
        backend="cuda",
        node_type="KSampler",
        exception_type="torch.OutOfMemoryError",
        first_seen_s=1000.0 + n,
        last_seen_s=1000.0 + n,
        count=1,
        sources=("api", "log"),
        summary="GPU out of memory in KSampler on main",
        fingerprint="abc123",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fresh_store_is_wal_private_stamped_and_migrated(tmp_path: Path) -> None:
    with Store.open(tmp_path / "data") as store:
        assert store.schema_version() == len(MIGRATIONS)
        store.set_meta("k", "v")
    path = tmp_path / "data" / DB_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"incidents", "log_offsets", "meta"} <= tables
    finally:
        conn.close()


def test_wal_side_files_are_private_too(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.save_cursor(FileCursor("k", 1, 2, 3, "f"))
        wal = tmp_path / f"{DB_NAME}-wal"
        assert wal.exists()
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_data_survives_reopen(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.save_incident(row(1))
        store.save_cursor(FileCursor("/logs/comfyui.log", 64768, 1234, 4096, "ab12"))
        store.set_meta("last_start", "2026-01-02")
    with Store.open(tmp_path) as store:
        assert store.incident("inc1") == row(1)
        assert store.incident_for_snapshot("20260102T101112Z_gpu_KSampler_1") == row(1)
        assert store.load_cursor("/logs/comfyui.log") == FileCursor(
            "/logs/comfyui.log", 64768, 1234, 4096, "ab12"
        )
        assert store.load_cursor("/logs/other.log") is None
        assert store.get_meta("last_start") == "2026-01-02"
        assert store.get_meta("missing") is None


def test_store_implements_offset_store_protocol(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        offsets: OffsetStore = store
        offsets.save_cursor(FileCursor("a", 1, 1, 10, ""))
        offsets.save_cursor(FileCursor("a", 1, 2, 0, "new"))  # re-created file: replaced
        assert offsets.load_cursor("a") == FileCursor("a", 1, 2, 0, "new")


def test_update_keeps_snapshot_id_and_never_lowers_count(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.save_incident(row(1))
        store.save_incident(row(1, snapshot_id=None, count=5, last_seen_s=2000.0))
        store.save_incident(row(1, snapshot_id=None, count=3, last_seen_s=1500.0))
        got = store.incident("inc1")
        assert got is not None
        assert (got.snapshot_id, got.count, got.last_seen_s) == (
            "20260102T101112Z_gpu_KSampler_1",
            5,
            2000.0,
        )


def test_incidents_are_listed_newest_first_and_deleted_by_snapshot(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        for n in range(1, 6):
            store.save_incident(row(n))
        assert [r.id for r in store.incidents()] == ["inc5", "inc4", "inc3", "inc2", "inc1"]
        assert [r.id for r in store.incidents(limit=2)] == ["inc5", "inc4"]
        assert [r.id for r in store.incidents(since_s=1004.0)] == ["inc5", "inc4"]
        deleted = store.delete_incidents_for_snapshots(
            ["20260102T101112Z_gpu_KSampler_1", "20260102T101112Z_gpu_KSampler_2", "nope"]
        )
        assert deleted == 2
        assert [r.id for r in store.incidents()] == ["inc5", "inc4", "inc3"]
        assert store.delete_incidents_for_snapshots([]) == 0


def test_tracker_incident_round_trips_through_the_store(tmp_path: Path) -> None:
    event = OomEvent(
        Pool.GPU, Backend.CUDA, False, "CUDA out of memory", node_type="VAEDecode", rule="r"
    )
    tracker = IncidentTracker(new_id=lambda: "inc-x")
    (write,) = tracker.observe(Observation("main", "log", event, 50.0), now=50.0)
    assert isinstance(write, WriteSnapshot)
    with Store.open(tmp_path) as store:
        store.save_incident(IncidentRow.from_incident(write.incident, "snap-x"))
        saved = store.incident("inc-x")
    assert saved is not None and saved.node_type == "VAEDecode" and saved.sources == ("log",)
    restored = saved.to_incident()
    assert (restored.id, restored.pool, restored.fingerprint) == (
        "inc-x",
        Pool.GPU,
        write.incident.fingerprint,
    )
    again = IncidentTracker(new_id=lambda: "never")
    again.resume(restored, now=60.0)
    (update,) = again.observe(Observation("main", "log", event, 70.0), now=70.0)
    assert update.incident.id == "inc-x" and update.incident.count == 2  # type: ignore[union-attr]


# --- refusing files that are not ours -----------------------------------------------------------


def _assert_refused(tmp_path: Path, match: str) -> None:
    path = tmp_path / DB_NAME
    before = digest(path)
    with pytest.raises(StoreError) as info:
        Store.open(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert match in message
    assert "\n" not in message
    assert digest(path) == before  # never overwritten or "repaired"


def test_a_text_file_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_text("these are my notes, not a database\n" * 20)
    _assert_refused(tmp_path, "not an SQLite database")


def test_a_directory_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        Store.open(tmp_path)


def test_another_programs_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO photos (name) VALUES ('cat.png')")
    conn.commit()
    conn.close()
    _assert_refused(tmp_path, "another program")


def test_a_foreign_application_id_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("PRAGMA application_id = 1234")
    conn.commit()
    conn.close()
    _assert_refused(tmp_path, "application_id 0x4d2")


def test_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    Store.open(tmp_path).close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    _assert_refused(tmp_path, "newer oom-sentinel")


def _filled_store(tmp_path: Path) -> Path:
    with Store.open(tmp_path) as store:
        for n in range(400):
            store.save_incident(row(n, summary="x" * 300))
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return tmp_path / DB_NAME


def test_a_scribbled_database_is_reported_corrupt(tmp_path: Path) -> None:
    path = _filled_store(tmp_path)
    data = bytearray(path.read_bytes())
    assert len(data) > 4096 * 8
    data[4096 * 3 : 4096 * 6] = b"\xa5" * (4096 * 3)  # not a valid b-tree page type
    path.write_bytes(bytes(data))
    _assert_refused(tmp_path, "corrupt")


def test_a_truncated_database_is_reported_corrupt(tmp_path: Path) -> None:
    path = _filled_store(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _assert_refused(tmp_path, "corrupt")


def test_an_empty_file_becomes_a_new_store(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"")
    with Store.open(tmp_path) as store:
        assert store.schema_version() == len(MIGRATIONS)


def test_open_existing_returns_none_without_creating(tmp_path: Path) -> None:
    assert Store.open_existing(tmp_path / "nothing") is None
    assert not (tmp_path / "nothing").exists()


# --- migrations ---------------------------------------------------------------------------------


def test_a_new_migration_applies_on_open_and_keeps_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(tmp_path) as store:
        store.save_incident(row(1))
    extended = (
        *MIGRATIONS,
        "CREATE TABLE later_table (id INTEGER PRIMARY KEY, peak_bytes INTEGER);"
        "CREATE TRIGGER later_guard BEFORE INSERT ON later_table BEGIN SELECT 1; END;",
    )
    monkeypatch.setattr(store_mod, "MIGRATIONS", extended)
    with Store.open(tmp_path) as store:
        assert store.schema_version() == len(extended)
        assert store.incident("inc1") == row(1)
        with store.transaction("save a row") as db:
            db.execute("INSERT INTO later_table (peak_bytes) VALUES (?)", (123,))
        assert store.query("read rows", "SELECT peak_bytes FROM later_table") == [(123,)]


def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store.open(tmp_path).close()
    broken = (*MIGRATIONS, "CREATE TABLE good_one (x); CREATE TABLE incidents (dup);")
    monkeypatch.setattr(store_mod, "MIGRATIONS", broken)
    with pytest.raises(StoreError, match="already exists"):
        Store.open(tmp_path)
    monkeypatch.setattr(store_mod, "MIGRATIONS", MIGRATIONS)
    with Store.open(tmp_path) as store:
        assert store.schema_version() == len(MIGRATIONS)
        tables = {r[0] for r in store.query("t", "SELECT name FROM sqlite_master")}
        assert "good_one" not in tables


# --- threads, processes, crashes ----------------------------------------------------------------


def test_many_threads_share_one_store(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    with Store.open(tmp_path) as store:

        def work(t: int) -> None:
            try:
                for i in range(40):
                    store.save_cursor(FileCursor(f"log{t}", 1, 1, i, ""))
                    if i % 10 == 0:
                        store.save_incident(row(t * 100 + i))
                    store.load_cursor(f"log{t}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        assert len(store.incidents()) == 6 * 4
        assert all(store.load_cursor(f"log{t}").offset == 39 for t in range(6))  # type: ignore[union-attr]


CHILD = """
import os, signal, sys
from oom_sentinel.daemon.logs.cursors import FileCursor
from oom_sentinel.daemon.store.db import IncidentRow, Store
store = Store.open(sys.argv[1])
store.save_incident(IncidentRow("inc-child", "snap-child", "main", "ram", "cpu", None, None,
                                1.0, 2.0, 1, ("log",), "System RAM exhausted on main", "fp"))
store.save_cursor(FileCursor("/log", 1, 2, 777, "fp"))
print("saved", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_rows_written_before_a_kill_9_are_there_after(tmp_path: Path) -> None:
    with Store.open(tmp_path) as held:  # another process holds the store open meanwhile
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.stdout == "saved\n", proc.stderr
        assert proc.returncode == -9
        got = held.incident("inc-child")
        assert got is not None and got.pool == "ram"
    with Store.open(tmp_path) as store:
        assert store.load_cursor("/log") == FileCursor("/log", 1, 2, 777, "fp")
        assert store.incident("inc-child") is not None


def test_incidents_from_before_the_records_table_are_not_resumed(tmp_path: Path) -> None:
    """Migration 5 takes every older incident's storm as over, so the first start after the
    upgrade does not re-open the whole history."""
    conn = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    for script in MIGRATIONS[:4]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version = 4")
    conn.execute(f"PRAGMA application_id = {0x4F4F4D53}")
    conn.execute(
        "INSERT INTO incidents VALUES ('old', 'snap', 'main', 'gpu', 'cuda', NULL, NULL, "
        "1.0, 2.0, 3, '[]', 'old storm', 'fp')"
    )
    conn.close()
    with Store.open(tmp_path) as store:
        assert store.open_incidents() == []
        (row,) = store.incidents()
        assert (row.id, row.count, row.closed_s) == ("old", 3, 2.0)


def test_records_are_saved_with_their_incident_once_and_go_with_it(tmp_path: Path) -> None:
    from oom_sentinel.daemon.incidents.tracker import FoldedRecord

    first = FoldedRecord("log|0|a", 1, "log", "cuda-oom", 10.0)
    second = FoldedRecord("log|900|b", 2, "log", "cuda-oom", 13.0)
    with Store.open(tmp_path) as store:
        store.save_incident(row(1), [first])
        store.save_incident(row(1, count=2), [second, first])  # a repeat of `first`: ignored
        store.save_incident(row(2), [first])  # another incident claims it: it keeps its own
        assert store.counted_by("log|0|a") == store.counted_by("log|900|b") == row(1).id
        assert store.counted_by("log|1800|c") is None
        assert store.incident_records(row(1).id, failure=2) == [second]
        assert {r.id for r in store.open_incidents()} == {row(1).id, row(2).id}
        store.close_incident(row(1).id, 99.0)
        assert [r.id for r in store.open_incidents()] == [row(2).id]
        store.delete_incidents_for_snapshots([str(row(1).snapshot_id)])
        assert store.counted_by("log|0|a") is None
