"""The daemon's durable state in one SQLite file, opened so that it can never eat someone's data.

``<data_dir>/oom-sentinel.db`` holds what must outlive a restart and is small: the incident rows
(snapshots on disk stay the source of truth for incident content), the followed logs' offsets
a key/value ``meta`` table, the ``runs`` of every prompt (``runs.py``) and the install states
with their observations (``state_history.py``); later issues add the alert outbox.

Opening is careful because the data dir is user-chosen (``--data-dir``): a file that is not
SQLite, a corrupt one, an SQLite database of another program (we stamp ``PRAGMA
application_id``) or one written by a newer oom-sentinel (``PRAGMA user_version`` beyond what we
know) raises ``StoreError`` naming the file; we never overwrite or "repair" it.

Schema changes are the append-only ``MIGRATIONS`` list: entry *i* takes ``user_version`` from
*i* to *i + 1*. Adding a table is appending one string -- never edit a released entry. Pending
migrations run in one ``BEGIN IMMEDIATE`` transaction at open, so two processes opening the
same file at once (daemon and CLI) cannot both apply them.

Threads: one connection, serialised by a lock held for each public call. The daemon's writes are
tiny and rare (an incident, a batch of offsets), SQLite serialises writers anyway, and one
connection avoids per-thread connections that APScheduler's pool threads would leak.

Durability: WAL with ``synchronous=NORMAL`` by default, ``FULL`` for incident writes. An
incident row must survive power loss (it is what alert retry and ``status`` read). Offsets
change every batch of lines, and an fsync per batch costs 1-20 ms on a busy disk; with NORMAL a
power cut may roll back the last offsets, so the follower re-reads a few seconds of log -- but
never past an incident: the WAL is one ordered log, so the fsync of an incident commit makes
every earlier offset commit durable too. An application crash (kill -9) loses nothing in
either mode.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.core.errors import StoreError
from oom_sentinel.daemon.incidents.tracker import FoldedRecord, Incident
from oom_sentinel.daemon.logs.cursors import FileCursor

__all__ = ["APPLICATION_ID", "DB_NAME", "MIGRATIONS", "IncidentRow", "Store"]

DB_NAME = "oom-sentinel.db"
#: at most this many open incidents are resumed after a restart (the newest)
OPEN_INCIDENTS_RESUMED = 256
#: stamped into the file header so we never mistake another program's database for ours
APPLICATION_ID = 0x4F4F4D53  # "OOMS"
_SQLITE_MAGIC = b"SQLite format 3\x00"

# Append-only. Entry i migrates user_version i -> i + 1. Never edit a released entry.
MIGRATIONS: tuple[str, ...] = (
    # 1: incidents, followed-log offsets, meta
    """
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        snapshot_id TEXT UNIQUE,
        instance TEXT NOT NULL,
        pool TEXT NOT NULL,
        backend TEXT NOT NULL,
        node_type TEXT,
        exception_type TEXT,
        first_seen_s REAL NOT NULL,
        last_seen_s REAL NOT NULL,
        count INTEGER NOT NULL,
        sources TEXT NOT NULL,
        summary TEXT NOT NULL,
        fingerprint TEXT NOT NULL
    );
    CREATE INDEX incidents_by_last_seen ON incidents (last_seen_s);
    CREATE INDEX incidents_by_fingerprint ON incidents (fingerprint, last_seen_s);
    CREATE TABLE log_offsets (
        key TEXT PRIMARY KEY,
        dev INTEGER NOT NULL,
        ino INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        fingerprint TEXT NOT NULL
    );
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 2: alert outbox (alert_outbox.py): one row per (alert, channel) until sent or given up
    """
    CREATE TABLE alert_outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL,
        channel TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_s REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_s REAL NOT NULL,
        last_error TEXT,
        state TEXT NOT NULL DEFAULT 'pending',
        done_s REAL,
        UNIQUE (key, channel)
    );
    CREATE INDEX alert_outbox_due ON alert_outbox (state, next_attempt_s);
    """,
    # 3: every prompt ComfyUI ran (runs.py): outcome, peak memory, workflow fingerprint
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        instance TEXT NOT NULL,
        prompt_id TEXT NOT NULL,
        outcome TEXT NOT NULL,
        started_s REAL,
        ended_s REAL,
        fingerprint TEXT,
        workflow_hash TEXT,
        peak_rss_bytes INTEGER,
        peak_vram_bytes INTEGER,
        peak_gpu_used_bytes INTEGER,
        pool TEXT,
        node_id TEXT,
        node_type TEXT,
        exception_type TEXT,
        cached_nodes INTEGER,
        node_count INTEGER,
        pid INTEGER,
        install_state_id TEXT,
        incident_id TEXT,
        recorded_s REAL NOT NULL,
        UNIQUE (instance, prompt_id)
    );
    CREATE INDEX runs_by_fingerprint ON runs (fingerprint, ended_s);
    CREATE INDEX runs_by_recorded ON runs (recorded_s);
    """,
    # 4: install states and when each instance was seen in which (state_history.py)
    """
    CREATE TABLE install_states (
        state_id TEXT PRIMARY KEY,
        state_json TEXT NOT NULL,
        source TEXT NOT NULL,
        comfyui_commit TEXT,
        node_count INTEGER NOT NULL,
        has_pip INTEGER NOT NULL,
        recorded_s REAL NOT NULL
    );
    CREATE TABLE state_observations (
        id INTEGER PRIMARY KEY,
        instance TEXT NOT NULL,
        state_id TEXT NOT NULL REFERENCES install_states (state_id),
        at_s REAL NOT NULL,
        source TEXT NOT NULL,
        detail TEXT,
        dedup_key TEXT NOT NULL,
        recorded_s REAL NOT NULL,
        UNIQUE (instance, dedup_key)
    );
    CREATE INDEX state_observations_by_time ON state_observations (instance, at_s);
    CREATE INDEX state_observations_by_state ON state_observations (state_id);
    """,
    # 5: exactly once across restarts: which source records each incident counted, the
    # workflow an incident is about (its storm key), and whether its storm is over (rows from
    # before are taken as over: a restart resumes only storms it knows are open)
    """
    ALTER TABLE incidents ADD COLUMN workflow_fingerprint TEXT;
    ALTER TABLE incidents ADD COLUMN closed_s REAL;
    UPDATE incidents SET closed_s = last_seen_s;
    CREATE INDEX incidents_open ON incidents (closed_s);
    CREATE TABLE incident_records (
        record_id TEXT PRIMARY KEY,
        incident_id TEXT NOT NULL,
        failure INTEGER NOT NULL,
        source TEXT NOT NULL,
        rule TEXT NOT NULL,
        at_s REAL NOT NULL,
        prompt_id TEXT
    );
    CREATE INDEX incident_records_by_incident ON incident_records (incident_id, failure);
    """,
)


@dataclass(frozen=True, slots=True)
class IncidentRow:
    """One ``incidents`` row: enough to list, group and alert without opening the snapshot."""

    id: str
    #: the snapshot directory's name (None until its snapshot is written)
    snapshot_id: str | None
    instance: str
    pool: str
    backend: str
    node_type: str | None
    exception_type: str | None
    first_seen_s: float
    last_seen_s: float
    count: int
    sources: tuple[str, ...]
    summary: str
    fingerprint: str
    #: the workflow fingerprint of its first failure, when known (part of its storm key)
    workflow_fingerprint: str | None = None
    #: when its storm window passed (None: it may still grow -- a restart resumes it)
    closed_s: float | None = None

    @classmethod
    def from_incident(cls, incident: Incident, snapshot_id: str | None = None) -> IncidentRow:
        return cls(
            id=incident.id,
            snapshot_id=snapshot_id,
            instance=incident.instance,
            pool=str(incident.pool),
            backend=str(incident.backend),
            node_type=incident.node_type,
            exception_type=incident.exception_type,
            first_seen_s=incident.first_seen_s,
            last_seen_s=incident.last_seen_s,
            count=incident.count,
            sources=tuple(incident.sources),
            summary=incident.summary,
            fingerprint=incident.fingerprint,
            workflow_fingerprint=incident.workflow_fingerprint,
        )

    def to_incident(self) -> Incident:
        """An ``Incident`` to ``IncidentTracker.resume`` after a restart (no observations)."""
        try:
            pool = Pool(self.pool)
        except ValueError:
            pool = Pool.GPU
        try:
            backend = Backend(self.backend)
        except ValueError:
            backend = Backend.UNKNOWN
        event = OomEvent(
            pool=pool,
            backend=backend,
            recovered=False,
            message=self.summary,
            exception_type=self.exception_type,
            node_type=self.node_type,
        )
        return Incident(
            id=self.id,
            instance=self.instance,
            event=event,
            observations=(),
            first_seen_s=self.first_seen_s,
            last_seen_s=self.last_seen_s,
            count=self.count,
            sources=self.sources,
            fingerprint=self.fingerprint,
            summary=self.summary,
            snapshot_written=self.snapshot_id is not None,
            workflow_fingerprint=self.workflow_fingerprint,
        )


_INCIDENT_COLUMNS = (
    "id, snapshot_id, instance, pool, backend, node_type, exception_type, first_seen_s, "
    "last_seen_s, count, sources, summary, fingerprint, workflow_fingerprint, closed_s"
)


def _row_to_incident(row: Sequence[Any]) -> IncidentRow:
    try:
        sources = tuple(str(s) for s in json.loads(row[10]))
    except (ValueError, TypeError):
        sources = ()
    return IncidentRow(
        id=row[0],
        snapshot_id=row[1],
        instance=row[2],
        pool=row[3],
        backend=row[4],
        node_type=row[5],
        exception_type=row[6],
        first_seen_s=row[7],
        last_seen_s=row[8],
        count=row[9],
        sources=sources,
        summary=row[11],
        fingerprint=row[12],
        workflow_fingerprint=row[13],
        closed_s=row[14],
    )


def _split_sql(script: str) -> list[str]:
    """Statements of a migration script (``executescript`` would commit our transaction)."""
    statements: list[str] = []
    buf = ""
    for part in script.split(";"):
        buf += part + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \t\r\n;"):
                statements.append(buf.strip())
            buf = ""
    if buf.strip(" \t\r\n;"):
        raise ValueError(f"incomplete SQL statement in migration: {buf.strip()[:60]!r}")
    return statements


class Store:
    """The open store. Use ``Store.open(data_dir)``; close it (or use ``with``)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn
        self._lock = threading.RLock()

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, data_dir: str | os.PathLike[str]) -> Store:
        """Open (creating if absent) ``<data_dir>/oom-sentinel.db`` and apply migrations."""
        directory = Path(data_dir)
        path = directory / DB_NAME
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StoreError(
                f"{directory}: cannot create the data directory: {exc.strerror or exc}"
            ) from None
        _check_header(path)
        _precreate_private(path)
        try:
            conn = sqlite3.connect(
                path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the database: {exc}") from None
        store = cls(path, conn)
        try:
            store._prepare()
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def open_existing(cls, data_dir: str | os.PathLike[str]) -> Store | None:
        """Like ``open``, but None when there is no database yet (read-mostly CLI commands)."""
        if not (Path(data_dir) / DB_NAME).exists():
            return None
        return cls.open(data_dir)

    def _prepare(self) -> None:
        conn = self._conn
        with self._translate("open the database"):
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if app_id not in (0, APPLICATION_ID):
                raise StoreError(
                    f"{self.path}: an SQLite database of another program "
                    f"(application_id {app_id:#x}); not touching it -- choose another --data-dir"
                )
            if app_id == 0:
                tables = conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
                ).fetchone()[0]
                if tables or version:
                    raise StoreError(
                        f"{self.path}: an SQLite database of another program (it has tables "
                        "but no oom-sentinel stamp); not touching it -- choose another --data-dir"
                    )
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"{self.path}: schema version {version} was written by a newer oom-sentinel "
                    f"(this one knows up to {len(MIGRATIONS)}); upgrade oom-sentinel"
                )
            check = conn.execute("PRAGMA quick_check").fetchall()
            if [tuple(r) for r in check] != [("ok",)]:
                first = " ".join(str(check[0][0]).split())[:200] if check else "no answer"
                raise StoreError(
                    f"{self.path}: the database is corrupt ({first}); move it aside to "
                    "start a new one"
                )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch the database to WAL mode ({mode})")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()

    def _migrate(self) -> None:
        conn = self._conn
        if conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another process may have migrated meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for script in MIGRATIONS[version:]:
                for statement in _split_sql(script):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- plumbing ----------------------------------------------------------------------------
    @contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as exc:
            detail = " ".join(str(exc).split())
            if "not a database" in detail or "malformed" in detail:
                raise StoreError(
                    f"{self.path}: the database is corrupt ({detail}); move it aside to start "
                    "a new one"
                ) from None
            raise StoreError(f"{self.path}: cannot {what}: {detail}") from None
        except sqlite3.Error as exc:
            detail = " ".join(str(exc).split())
            raise StoreError(f"{self.path}: cannot {what}: {detail}") from None

    @contextmanager
    def transaction(self, what: str, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock; ``durable`` fsyncs the commit (FULL).

        For the modules that add tables: ``with store.transaction("save run") as db: ...``.
        """
        with self._lock, self._translate(what):
            conn = self._conn
            if durable:
                conn.execute("PRAGMA synchronous=FULL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                if durable:
                    conn.execute("PRAGMA synchronous=NORMAL")

    def query(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read-only statement, under the lock, errors translated."""
        with self._lock, self._translate(what):
            return self._conn.execute(sql, params).fetchall()

    def schema_version(self) -> int:
        return int(self.query("read the schema version", "PRAGMA user_version")[0][0])

    def close(self) -> None:
        with self._lock, suppress(sqlite3.Error):
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- incidents ---------------------------------------------------------------------------
    def save_incident(self, row: IncidentRow, records: Iterable[FoldedRecord] = ()) -> None:
        """Insert or update one incident row and add the records it counted, durably (fsynced
        before returning), in one transaction: a record is in the store exactly when the
        count that includes it is.

        A row saved with ``snapshot_id=None`` keeps the snapshot id it already had, so an
        ``UpdateIncident`` need not know it. A record already stored keeps its incident.
        """
        with self.transaction("save an incident", durable=True) as db:
            db.execute(
                "INSERT INTO incidents (id, snapshot_id, instance, pool, backend, node_type, "
                "exception_type, first_seen_s, last_seen_s, count, sources, summary, "
                "fingerprint, workflow_fingerprint) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET "
                "snapshot_id = coalesce(excluded.snapshot_id, snapshot_id), "
                "instance = excluded.instance, pool = excluded.pool, "
                "backend = excluded.backend, node_type = excluded.node_type, "
                "exception_type = excluded.exception_type, "
                "first_seen_s = min(first_seen_s, excluded.first_seen_s), "
                "last_seen_s = max(last_seen_s, excluded.last_seen_s), "
                "count = max(count, excluded.count), sources = excluded.sources, "
                "summary = excluded.summary, fingerprint = excluded.fingerprint, "
                "workflow_fingerprint = "
                "coalesce(workflow_fingerprint, excluded.workflow_fingerprint)",
                (
                    row.id,
                    row.snapshot_id,
                    row.instance,
                    row.pool,
                    row.backend,
                    row.node_type,
                    row.exception_type,
                    row.first_seen_s,
                    row.last_seen_s,
                    row.count,
                    json.dumps(list(row.sources)),
                    row.summary,
                    row.fingerprint,
                    row.workflow_fingerprint,
                ),
            )
            db.executemany(
                "INSERT OR IGNORE INTO incident_records (record_id, incident_id, failure, "
                "source, rule, at_s, prompt_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (r.record_id, row.id, r.failure, r.source, r.rule, r.at_s, r.prompt_id)
                    for r in records
                ],
            )

    def counted_by(self, record_id: str) -> str | None:
        """The incident that already counted this source record (a re-read after a crash)."""
        rows = self.query(
            "read a counted record",
            "SELECT incident_id FROM incident_records WHERE record_id = ?",
            (record_id,),
        )
        return str(rows[0][0]) if rows else None

    def incident_records(
        self, incident_id: str, *, failure: int | None = None
    ) -> list[FoldedRecord]:
        """The records an incident counted (of one failure when ``failure`` is given)."""
        sql = (
            "SELECT record_id, failure, source, rule, at_s, prompt_id FROM incident_records "
            "WHERE incident_id = ?"
        )
        params: list[Any] = [incident_id]
        if failure is not None:
            sql += " AND failure = ?"
            params.append(failure)
        rows = self.query("read counted records", sql + " ORDER BY failure, at_s", params)
        return [FoldedRecord(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def open_incidents(self) -> list[IncidentRow]:
        """Incidents with a snapshot whose storm was not closed: a restart resumes them."""
        rows = self.query(
            "list open incidents",
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents "
            "WHERE closed_s IS NULL AND snapshot_id IS NOT NULL "
            "ORDER BY last_seen_s DESC LIMIT ?",
            (OPEN_INCIDENTS_RESUMED,),
        )
        return [_row_to_incident(r) for r in rows]

    def close_incident(self, incident_id: str, at_s: float) -> None:
        """Its storm window passed: nothing more joins it, a restart does not resume it."""
        with self.transaction("close an incident") as db:
            db.execute(
                "UPDATE incidents SET closed_s = ? WHERE id = ? AND closed_s IS NULL",
                (at_s, incident_id),
            )

    def incident(self, incident_id: str) -> IncidentRow | None:
        rows = self.query(
            "read an incident",
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE id = ?",
            (incident_id,),
        )
        return _row_to_incident(rows[0]) if rows else None

    def incident_for_snapshot(self, snapshot_id: str) -> IncidentRow | None:
        rows = self.query(
            "read an incident",
            f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE snapshot_id = ?",
            (snapshot_id,),
        )
        return _row_to_incident(rows[0]) if rows else None

    def incidents(
        self, *, since_s: float | None = None, limit: int | None = None
    ) -> list[IncidentRow]:
        """Newest first (by ``last_seen_s``)."""
        sql = f"SELECT {_INCIDENT_COLUMNS} FROM incidents"
        params: list[Any] = []
        if since_s is not None:
            sql += " WHERE last_seen_s >= ?"
            params.append(since_s)
        sql += " ORDER BY last_seen_s DESC, first_seen_s DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [_row_to_incident(r) for r in self.query("list incidents", sql, params)]

    def delete_incidents_for_snapshots(self, snapshot_ids: Iterable[str]) -> int:
        """Remove the rows of pruned snapshots; returns how many went."""
        ids = list(snapshot_ids)
        if not ids:
            return 0
        deleted = 0
        with self.transaction("delete pruned incidents", durable=True) as db:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ", ".join("?" for _ in chunk)
                db.execute(
                    "DELETE FROM incident_records WHERE incident_id IN "
                    f"(SELECT id FROM incidents WHERE snapshot_id IN ({marks}))",
                    chunk,
                )
                cur = db.execute(f"DELETE FROM incidents WHERE snapshot_id IN ({marks})", chunk)
                deleted += cur.rowcount
        return deleted

    # -- log offsets (the OffsetStore protocol of cursors.py) --------------------------------
    def load_cursor(self, key: str) -> FileCursor | None:
        rows = self.query(
            "read a log offset",
            "SELECT key, dev, ino, offset, fingerprint FROM log_offsets WHERE key = ?",
            (key,),
        )
        if not rows:
            return None
        k, dev, ino, offset, fp = rows[0]
        return FileCursor(key=k, dev=dev, ino=ino, offset=offset, fingerprint=fp)

    def save_cursor(self, cursor: FileCursor) -> None:
        self.save_cursors([cursor])

    def save_cursors(self, cursors: Iterable[FileCursor]) -> None:
        """Several offsets in one transaction (one commit for a whole poll round)."""
        batch = [(c.key, c.dev, c.ino, c.offset, c.fingerprint) for c in cursors]
        if not batch:
            return
        with self.transaction("save log offsets") as db:
            db.executemany(
                "INSERT INTO log_offsets (key, dev, ino, offset, fingerprint) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET dev = excluded.dev, "
                "ino = excluded.ino, offset = excluded.offset, "
                "fingerprint = excluded.fingerprint",
                batch,
            )

    # -- meta --------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self.query("read meta", "SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction("write meta") as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )


def _check_header(path: Path) -> None:
    """Refuse a non-empty file that is not SQLite before SQLite gets a chance to touch it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except IsADirectoryError:
        raise StoreError(f"{path}: is a directory, not a database file") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the database: {exc.strerror or exc}") from None
    if head and head != _SQLITE_MAGIC:
        raise StoreError(
            f"{path}: not an SQLite database (another program's file?); not touching it -- "
            "choose another --data-dir"
        )


def _precreate_private(path: Path) -> None:
    """Create the database file 0600 ourselves: SQLite would use 0644, and its -wal/-shm files
    copy the main file's mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the database: {exc.strerror or exc}") from None
    os.close(fd)
