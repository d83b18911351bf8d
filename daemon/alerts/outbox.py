"""The alert outbox: an alert is written to the store before anything tries to send it, so a
notification service that is down, or a daemon restart, delays it instead of losing it.

One ``alert_outbox`` row per (alert key, channel id): Discord succeeding while ntfy is down
means only ntfy is retried, and Discord never gets the message twice. A failed send is retried
with exponential backoff (``retry_initial_s`` doubling up to ``retry_max_interval_s``); an alert
still unsent ``retry_max_age_s`` after it was created is given up and the log says so once (the
state change happens once, in one transaction). Rows for a channel that is no longer configured
are given up the same way. Delivery is at-least-once: a crash between a successful send and
marking it sent repeats that one message after the restart.

``Outbox`` is the table and one synchronous delivery pass (``deliver_due``); ``OutboxSender``
is the thread that runs passes when woken or when the next retry is due, so the main loop never
waits on the network.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oom_sentinel.daemon.alerts.notifiers import AlertChannel, SendResult, scrub
from oom_sentinel.daemon.alerts.policy import Alert
from oom_sentinel.daemon.core.errors import StoreError
from oom_sentinel.daemon.service.workers import Worker
from oom_sentinel.daemon.store.db import Store

if TYPE_CHECKING:
    from oom_sentinel.config.settings import AlertSettings

__all__ = ["Outbox", "OutboxRow", "OutboxSender", "RetryPolicy"]

log = logging.getLogger("oom_sentinel.alerts")

PENDING = "pending"
SENT = "sent"
GIVEN_UP = "given_up"
#: finished rows are kept this long (``alert test`` and debugging read them), then pruned
KEEP_DONE_S = 30 * 86400.0
#: how often the sender thread prunes finished rows
PRUNE_EVERY_S = 6 * 3600.0
#: rows one delivery pass handles at most (the rest wait for the next pass)
BATCH = 100


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    initial_s: float = 30.0
    max_interval_s: float = 1800.0
    max_age_s: float = 86400.0

    @classmethod
    def from_settings(cls, alerts: AlertSettings) -> RetryPolicy:
        return cls(
            initial_s=float(alerts.retry_initial_s),
            max_interval_s=float(alerts.retry_max_interval_s),
            max_age_s=float(alerts.retry_max_age_s),
        )

    def delay_s(self, failures: int) -> float:
        """Wait before the next try after ``failures`` failed tries (1, 2, 4 ... x initial)."""
        exponent = min(max(failures - 1, 0), 40)
        return min(self.initial_s * (2.0**exponent), self.max_interval_s)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    key: str
    channel: str
    alert: Alert
    created_s: float
    attempts: int
    next_attempt_s: float
    last_error: str | None
    state: str
    done_s: float | None


_COLUMNS = (
    "id, key, channel, payload, created_s, attempts, next_attempt_s, last_error, state, done_s"
)


def _row(values: tuple[Any, ...]) -> OutboxRow:
    """One outbox row from SQLite (its column types are the table's, so ``Any``)."""
    (row_id, key, channel, payload, created, attempts, next_s, error, state, done) = values
    try:
        alert = Alert.from_json(json.loads(str(payload)))
    except (ValueError, TypeError):
        alert = Alert(str(key), "unknown", "info", "(unreadable alert)", "", float(created))
    return OutboxRow(
        id=int(row_id),
        key=str(key),
        channel=str(channel),
        alert=alert,
        created_s=float(created),
        attempts=int(attempts),
        next_attempt_s=float(next_s),
        last_error=None if error is None else str(error),
        state=str(state),
        done_s=None if done is None else float(done),
    )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Outbox:
    """The ``alert_outbox`` table of an open ``Store``."""

    def __init__(self, store: Store, retry: RetryPolicy | None = None) -> None:
        self.store = store
        self.retry = retry or RetryPolicy()

    # -- writing -----------------------------------------------------------------------------
    def enqueue(self, alert: Alert, channel_ids: Iterable[str], now: float) -> int:
        """Queue ``alert`` for each channel, durably; a (key, channel) already queued is kept
        as it is. Returns the rows added."""
        payload = alert.dumps()
        rows = [(alert.key, cid, payload, alert.created_s, now) for cid in channel_ids]
        if not rows:
            return 0
        with self.store.transaction("queue an alert", durable=True) as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO alert_outbox "
                "(key, channel, payload, created_s, next_attempt_s, state) "
                f"VALUES (?, ?, ?, ?, ?, '{PENDING}')",
                rows,
            )
            return db.total_changes - before

    def has_key(self, key: str) -> bool:
        """Whether an alert with ``key`` was ever queued (on any channel, in any state)."""
        rows = self.store.query(
            "look up an alert", "SELECT 1 FROM alert_outbox WHERE key = ? LIMIT 1", (key,)
        )
        return bool(rows)

    def _mark_sent(self, row: OutboxRow, now: float) -> None:
        with self.store.transaction("mark an alert sent") as db:
            db.execute(
                f"UPDATE alert_outbox SET state = '{SENT}', done_s = ?, attempts = attempts + 1, "
                "last_error = NULL WHERE id = ?",
                (now, row.id),
            )

    def _mark_failed(self, row: OutboxRow, error: str, now: float) -> str:
        """Record a failed try; returns the row's new state (pending or given up)."""
        attempts = row.attempts + 1
        next_s = now + self.retry.delay_s(attempts)
        gives_up = next_s - row.created_s > self.retry.max_age_s
        with self.store.transaction("record a failed alert") as db:
            cur = db.execute(
                "UPDATE alert_outbox SET attempts = ?, last_error = ?, next_attempt_s = ?, "
                "state = ?, done_s = ? WHERE id = ? AND state = ?",
                (
                    attempts,
                    error,
                    next_s,
                    GIVEN_UP if gives_up else PENDING,
                    now if gives_up else None,
                    row.id,
                    PENDING,
                ),
            )
            changed = cur.rowcount == 1
        if gives_up and changed:
            log.warning(
                "alert %r to %s given up after %d attempt(s) over %s: %s",
                row.alert.title,
                row.channel,
                attempts,
                _age(now - row.created_s),
                error,
            )
            return GIVEN_UP
        return PENDING

    def _give_up(self, row: OutboxRow, reason: str, now: float) -> None:
        with self.store.transaction("give up an alert") as db:
            cur = db.execute(
                f"UPDATE alert_outbox SET state = '{GIVEN_UP}', done_s = ?, "
                "last_error = coalesce(last_error, ?) WHERE id = ? AND state = ?",
                (now, reason, row.id, PENDING),
            )
            changed = cur.rowcount == 1
        if changed:
            log.warning(
                "alert %r to %s given up after %d attempt(s) over %s: %s",
                row.alert.title,
                row.channel,
                row.attempts,
                _age(now - row.created_s),
                reason if row.last_error is None else f"{reason}; last error: {row.last_error}",
            )

    def prune(self, now: float, keep_s: float = KEEP_DONE_S) -> int:
        with self.store.transaction("prune the alert outbox") as db:
            cur = db.execute(
                f"DELETE FROM alert_outbox WHERE state != '{PENDING}' AND done_s < ?",
                (now - keep_s,),
            )
            return int(cur.rowcount)

    # -- reading -----------------------------------------------------------------------------
    def rows(self, state: str | None = None) -> list[OutboxRow]:
        sql = f"SELECT {_COLUMNS} FROM alert_outbox"
        params: list[object] = []
        if state is not None:
            sql += " WHERE state = ?"
            params.append(state)
        sql += " ORDER BY id"
        return [_row(tuple(r)) for r in self.store.query("read the alert outbox", sql, params)]

    def counts(self) -> dict[str, int]:
        rows = self.store.query(
            "count the alert outbox", "SELECT state, count(*) FROM alert_outbox GROUP BY state"
        )
        out = {PENDING: 0, SENT: 0, GIVEN_UP: 0}
        out.update({str(state): int(n) for state, n in rows})
        return out

    def next_due_s(self) -> float | None:
        rows = self.store.query(
            "read the alert outbox",
            f"SELECT min(next_attempt_s) FROM alert_outbox WHERE state = '{PENDING}'",
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def _due(self, now: float) -> list[OutboxRow]:
        rows = self.store.query(
            "read due alerts",
            f"SELECT {_COLUMNS} FROM alert_outbox WHERE state = '{PENDING}' "
            "AND next_attempt_s <= ? ORDER BY id LIMIT ?",
            (now, BATCH),
        )
        return [_row(tuple(r)) for r in rows]

    # -- delivering --------------------------------------------------------------------------
    def deliver_due(
        self,
        channels: Mapping[str, AlertChannel],
        now: float,
        on_result: Callable[[SendResult], None] | None = None,
    ) -> list[SendResult]:
        """One pass: try every due row once. Never raises for a channel's failure."""
        results: list[SendResult] = []
        for row in self._due(now):
            channel = channels.get(row.channel)
            if channel is None:
                self._give_up(row, "the channel is no longer configured", now)
                continue
            if now - row.created_s > self.retry.max_age_s:
                self._give_up(
                    row, f"older than retry_max_age_s ({_age(self.retry.max_age_s)})", now
                )
                continue
            try:
                result = channel.send(row.alert)
            except Exception as exc:  # a channel broke its contract: count it as a failure
                result = SendResult(
                    channel.id, channel.name, False, scrub(f"{type(exc).__name__}: {exc}")
                )
            results.append(result)
            if on_result is not None:
                on_result(result)
            if result.ok:
                self._mark_sent(row, now)
                continue
            state = self._mark_failed(row, result.detail, now)
            if state == PENDING:
                level = logging.WARNING if row.attempts == 0 else logging.INFO
                log.log(
                    level,
                    "alert %r to %s failed (attempt %d), will retry in %s: %s",
                    row.alert.title,
                    channel.name,
                    row.attempts + 1,
                    _age(self.retry.delay_s(row.attempts + 1)),
                    result.detail,
                )
        return results


class OutboxSender:
    """The thread that delivers: a pass when ``wake()`` is called, when the next retry is due,
    and at least every ``idle_s``. ``stop()`` returns within one send's timeout."""

    def __init__(
        self,
        outbox: Outbox,
        channels: Mapping[str, AlertChannel],
        *,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[SendResult], None] | None = None,
        idle_s: float = 60.0,
    ) -> None:
        self.outbox = outbox
        self._channels = dict(channels)
        self._clock = clock
        self._on_result = on_result
        self._idle_s = idle_s
        self._wake = threading.Event()
        #: the sender's thread (service.workers): its health gates the watchdog ping
        self.worker = Worker("alerts", self._run, thread_name="alert-sender")
        self._lock = threading.Lock()
        self.passes = 0
        self.last_error: str | None = None
        self._pruned_s: float | None = None

    def set_channels(self, channels: Mapping[str, AlertChannel]) -> None:
        with self._lock:
            self._channels = dict(channels)
        self.wake()

    def start(self) -> None:
        self.worker.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask the thread to end; True when it did within ``timeout_s``."""
        return self.worker.stop(timeout_s, wake=self._wake.set)

    def is_alive(self) -> bool:
        return self.worker.is_alive()

    def run_once(self) -> list[SendResult]:
        with self._lock:
            channels = dict(self._channels)
        now = self._clock()
        results = self.outbox.deliver_due(channels, now, self._on_result)
        if self._pruned_s is None or now - self._pruned_s >= PRUNE_EVERY_S:
            self.outbox.prune(now)
            self._pruned_s = now
        self.passes += 1
        return results

    def _run(self) -> None:
        while not self.worker.stopping.is_set():
            self.worker.beat()
            self._wake.clear()
            try:
                self.run_once()
                self.last_error = None
                next_due = self.outbox.next_due_s()
            except StoreError as exc:  # the store went away for a moment: try again later
                if self.last_error != str(exc):
                    log.error("alert delivery paused: %s", exc)
                self.last_error = str(exc)
                next_due = None
            wait_s = self._idle_s
            if next_due is not None:
                wait_s = min(wait_s, max(0.0, next_due - self._clock()))
            self._wake.wait(max(wait_s, 0.05))
