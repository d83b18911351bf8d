"""What the daemon's loop calls to alert: the policy decides, the formatter words, the outbox
keeps, the sender thread delivers.

The loop hands over the incident tracker's actions as they are executed::

    dispatcher = AlertDispatcher(store, settings, build_channels(settings))
    dispatcher.start()                                   # the sender thread
    ...
    ref = write_snapshot(...)                            # for a WriteSnapshot action
    dispatcher.on_incident_written(incident, ref)        # or .handle(action, ref)
    dispatcher.on_incident_updated(incident)             # UpdateIncident
    dispatcher.on_incident_closed(incident)              # CloseIncident
    dispatcher.on_soft_oom(instance, at_s)               # CountSoftOom
    dispatcher.tick()                                    # every loop: due summaries, and
                                                         # a follow-up for each bisect report
                                                         # attached to a snapshot
    ...
    dispatcher.stop()

Every ``on_*`` call is quick (a few SQLite writes) and never touches the network. The policy's
state is kept in the store's ``meta`` table, so grouping and rate limits hold across restarts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.alerts.format import render
from oom_sentinel.daemon.alerts.notifiers import AlertChannel, SendResult
from oom_sentinel.daemon.alerts.outbox import Outbox, OutboxSender, RetryPolicy
from oom_sentinel.daemon.alerts.policy import (
    Alert,
    AlertPolicy,
    IncidentAlert,
    IncidentFacts,
    Intent,
    PolicyConfig,
)
from oom_sentinel.daemon.core.errors import InputError, StoreError
from oom_sentinel.daemon.incidents.bisect_results import ReportWatch, followup_alert
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef, load_snapshot
from oom_sentinel.daemon.incidents.snapshot_model import SnapshotDoc
from oom_sentinel.daemon.incidents.tracker import (
    Action,
    CloseIncident,
    CountSoftOom,
    Incident,
    UpdateIncident,
    WriteSnapshot,
)
from oom_sentinel.daemon.service.workers import Worker
from oom_sentinel.daemon.store.db import Store

__all__ = ["POLICY_META_KEY", "AlertDispatcher"]

log = logging.getLogger("oom_sentinel.alerts")

POLICY_META_KEY = "alerts.policy"


def _read_snapshot(ref: SnapshotRef) -> SnapshotDoc | None:
    """The snapshot just written, as its model; None when it does not read (the alert is
    then made from the incident's facts alone, and says less)."""
    try:
        return load_snapshot(ref.path).doc
    except InputError as exc:
        log.warning("alert for snapshot %s without its details: %s", ref.id, exc)
        return None


class AlertDispatcher:
    """Glue between the incident tracker's actions and the alert outbox (see module doc)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        channels: Sequence[AlertChannel],
        *,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[SendResult], None] | None = None,
        sender_idle_s: float = 60.0,
        upload_channel: AlertChannel | None = None,
        snapshots_dir: Path | None = None,
    ) -> None:
        self.store = store
        #: notices oom-bisect reports attached to snapshots (None: no follow-ups)
        self.reports = ReportWatch(snapshots_dir) if snapshots_dir is not None else None
        self._clock = clock
        self.outbox = Outbox(store, RetryPolicy.from_settings(settings.alerts))
        self.channels: tuple[AlertChannel, ...] = tuple(channels)
        #: [fleet] bucket_url: snapshot uploads share the outbox but never receive alerts
        self.upload_channel = upload_channel
        self._saved_state: str | None = None
        self.policy = AlertPolicy(PolicyConfig.from_settings(settings.alerts), self._load_state())
        self.sender = OutboxSender(
            self.outbox,
            self._sender_channels(),
            clock=clock,
            on_result=on_result,
            idle_s=sender_idle_s,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sender thread (it first delivers whatever a previous run left queued)."""
        self.sender.start()
        self.sender.wake()

    def stop(self, timeout_s: float = 10.0) -> bool:
        return self.sender.stop(timeout_s)

    def is_alive(self) -> bool:
        """Whether the sender thread runs (a worker the watchdog checks)."""
        return self.sender.is_alive()

    @property
    def worker(self) -> Worker:
        """The sender's thread, for the service's health."""
        return self.sender.worker

    def reconfigure(self, settings: Settings, channels: Sequence[AlertChannel]) -> None:
        """Apply a reloaded config (SIGHUP): new limits and channels; the state is kept.
        Queued rows for a channel no longer configured are given up on the next pass."""
        self.outbox.retry = RetryPolicy.from_settings(settings.alerts)
        self.policy.config = PolicyConfig.from_settings(settings.alerts)
        self.channels = tuple(channels)
        self.sender.set_channels(self._sender_channels())

    def _sender_channels(self) -> dict[str, AlertChannel]:
        """What the sender delivers to: the alert channels and the upload channel, if any."""
        out = {c.id: c for c in self.channels}
        if self.upload_channel is not None:
            out[self.upload_channel.id] = self.upload_channel
        return out

    def queue_upload(self, item: Alert) -> bool:
        """Queue a snapshot upload (``bucket.upload_item``) on the upload channel, durably;
        False when no bucket is configured or it was queued before."""
        if self.upload_channel is None:
            return False
        added = self.outbox.enqueue(item, [self.upload_channel.id], self._clock())
        if added:
            self.sender.wake()
        return added > 0

    # -- inputs from the loop ----------------------------------------------------------------
    def on_incident_written(
        self,
        incident: Incident,
        ref: SnapshotRef,
        snapshot: SnapshotDoc | None = None,
    ) -> list[Alert]:
        """After a ``WriteSnapshot``: alert the new incident (or fold it into its group).
        ``snapshot`` saves re-reading ``ref``'s snapshot.json when the caller has it."""
        now = self._clock()
        snapshot = snapshot if snapshot is not None else _read_snapshot(ref)
        facts = IncidentFacts.from_incident(incident, ref)
        regression = snapshot.regression if snapshot is not None else None
        if regression is not None and regression.suspected:
            # The same failure under a new install state is news, not a storm repeat: an update
            # made it happen, and the alert must carry the oom-bisect command at once.
            facts = dataclasses.replace(
                facts, group=f"{facts.group}@{regression.bad_state_id or 'changed'}"
            )
        intents = self.policy.on_incident_written(facts, now)
        return self._queue(intents, now, snapshot)

    def on_incident_updated(self, incident: Incident) -> list[Alert]:
        """After an ``UpdateIncident`` (more failures joined: a storm)."""
        now = self._clock()
        return self._queue(self.policy.on_incident_updated(self._facts(incident), now), now)

    def on_incident_closed(self, incident: Incident) -> list[Alert]:
        """After a ``CloseIncident`` (its storm window passed)."""
        now = self._clock()
        return self._queue(self.policy.on_incident_closed(self._facts(incident), now), now)

    def on_soft_oom(
        self, instance: str, at_s: float, *, message: str = "", node_type: str | None = None
    ) -> list[Alert]:
        """After a ``CountSoftOom`` (a recovered OOM): maybe an early warning."""
        now = self._clock()
        intents = self.policy.on_soft_oom(instance, at_s, now, message=message, node_type=node_type)
        return self._queue(intents, now)

    def handle(
        self,
        action: Action,
        ref: SnapshotRef | None = None,
        snapshot: SnapshotDoc | None = None,
    ) -> list[Alert]:
        """Any tracker action; a ``WriteSnapshot`` needs the ``ref`` of the snapshot written."""
        if isinstance(action, WriteSnapshot):
            if ref is None:
                raise ValueError("a WriteSnapshot action needs the SnapshotRef it produced")
            return self.on_incident_written(action.incident, ref, snapshot)
        if isinstance(action, UpdateIncident):
            return self.on_incident_updated(action.incident)
        if isinstance(action, CloseIncident):
            return self.on_incident_closed(action.incident)
        if isinstance(action, CountSoftOom):
            event = action.observation.event
            return self.on_soft_oom(
                action.instance,
                action.observation.at_s,
                message=event.message,
                node_type=event.node_type,
            )
        return []

    def tick(self) -> list[Alert]:
        """Every loop: summaries whose time has come, and (every ``SCAN_INTERVAL_S``) one
        follow-up alert per bisect report newly attached to a snapshot."""
        now = self._clock()
        alerts = self._queue(self.policy.tick(now), now)
        if self.reports is not None and self.reports.due(now):
            alerts += self.on_bisect_reports(now)
        return alerts

    def on_bisect_reports(self, now: float | None = None) -> list[Alert]:
        """Queue the follow-up of every finished bisect report not alerted yet; the outbox
        remembers the keys, so a restart sends none twice."""
        if self.reports is None:
            return []
        now = self._clock() if now is None else now
        try:
            news = self.reports.scan(now, self.outbox.has_key)
        except StoreError as exc:
            log.warning("bisect reports not checked: %s", exc)
            return []
        ids = [c.id for c in self.channels]
        alerts: list[Alert] = []
        for snapshot_id, path, report in news:
            alert = followup_alert(snapshot_id, path, report, now)
            try:
                self.outbox.enqueue(alert, ids, now)
            except StoreError as exc:
                log.warning("follow-up alert for %s not queued: %s", snapshot_id, exc)
                continue
            log.info("oom-bisect answered snapshot %s: %s", snapshot_id, alert.title)
            alerts.append(alert)
        if alerts:
            self.sender.wake()
        return alerts

    def deliver_now(self) -> list[SendResult]:
        """One delivery pass on the calling thread (tools and tests; the thread does this)."""
        return self.sender.run_once()

    # -- internals ---------------------------------------------------------------------------
    def _facts(self, incident: Incident) -> IncidentFacts:
        return IncidentFacts.from_incident(incident)

    def _queue(
        self, intents: list[Intent], now: float, snapshot: SnapshotDoc | None = None
    ) -> list[Alert]:
        alerts: list[Alert] = []
        ids = [c.id for c in self.channels]
        for intent in intents:
            alert = render(intent, now, snapshot if isinstance(intent, IncidentAlert) else None)
            self.outbox.enqueue(alert, ids, now)
            alerts.append(alert)
        self._save_state()
        if alerts:
            self.sender.wake()
        return alerts

    def _load_state(self) -> Mapping[str, Any] | None:
        try:
            raw = self.store.get_meta(POLICY_META_KEY)
        except StoreError as exc:
            log.warning("alert grouping state not read (%s); starting afresh", exc)
            return None
        if not raw:
            return None
        self._saved_state = raw
        try:
            state = json.loads(raw)
        except ValueError:
            return None
        return state if isinstance(state, Mapping) else None

    def _save_state(self) -> None:
        """Persist the policy's state when it changed (a tick that did nothing writes nothing)."""
        raw = json.dumps(self.policy.to_state(), sort_keys=True)
        if raw == self._saved_state:
            return
        try:
            self.store.set_meta(POLICY_META_KEY, raw)
            self._saved_state = raw
        except StoreError as exc:
            log.warning("alert grouping state not saved: %s", exc)
