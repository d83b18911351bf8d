"""Incidents → snapshot → store and alerts: the stage that acts on what the incident tracker
decided. A ``WriteSnapshot`` is assembled (``assembly``), written (``snapshot.write_snapshot``)
and saved as a store row with the records it counted; only then are those records released
(``release``: their log positions may move past them) and the alert dispatcher told. A write
that fails (full disk) keeps the records held and is retried every SNAPSHOT_RETRY_S, so an
incident is delayed, never lost or counted twice. Main loop only."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oom_sentinel.config.settings import FleetSettings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.core.errors import SentinelError, StoreError
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef, write_snapshot
from oom_sentinel.daemon.incidents.tracker import (
    CloseIncident,
    CountSoftOom,
    FoldedRecord,
    Incident,
    IncidentTracker,
    UpdateIncident,
    WriteSnapshot,
)
from oom_sentinel.daemon.service.assembly import SnapshotAssembler
from oom_sentinel.daemon.service.instances import InstanceRegistry, WatchedInstance
from oom_sentinel.daemon.store.db import IncidentRow, Store

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter

log = logging.getLogger("oom_sentinel")

#: a snapshot that could not be written (disk full, permissions) is tried again this often
SNAPSHOT_RETRY_S = 2.0


def counted_by(store: Store, rid: str) -> str | None:
    """The incident that counted a source record, from the store (None: none yet)."""
    try:
        return store.counted_by(rid)
    except SentinelError as exc:
        log.warning("could not check whether a record was counted: %s", exc)
        return None


@dataclass
class _Unwritten:
    """An incident whose snapshot or row could not be written yet, with the records it
    counted meanwhile (they keep their hold on the log position until it is)."""

    incident: Incident
    records: list[FoldedRecord]
    retry_at_s: float
    #: the snapshot is on disk (its id, or "" when the row already has it): only the row and
    #: the records are missing -- a full disk fails SQLite's writes too
    snapshot_id: str | None = None


class IncidentActions:
    """Applies the tracker's actions: snapshots, rows, releases, alerts, metrics."""

    def __init__(
        self,
        store: Store,
        tracker: IncidentTracker,
        registry: InstanceRegistry,
        assembler: SnapshotAssembler,
        *,
        snapshots_dir: Path,
        release: Callable[[Iterable[FoldedRecord]], None],
        clock: Callable[[], float],
        fleet: FleetSettings,
        alerts: AlertDispatcher | None = None,
        metrics: MetricsExporter | None = None,
        on_incident: Callable[[Incident, SnapshotRef], None] | None = None,
    ) -> None:
        self.store = store
        self.tracker = tracker  # read only: a retried incident's latest state
        self.registry = registry
        self.assembler = assembler
        self.snapshots_dir = snapshots_dir
        self._release = release
        self.clock = clock
        self.fleet = fleet
        self.alerts = alerts
        self.metrics = metrics
        self.on_incident = on_incident
        #: incidents whose snapshot write failed, retried while running (by incident id)
        self._unwritten: dict[str, _Unwritten] = {}
        self.incidents_written = 0
        self.last_incident: str | None = None

    def next_retry(self) -> float | None:
        """When the next failed write is tried again (the loop wakes then)."""
        if not self._unwritten:
            return None
        return min(u.retry_at_s for u in self._unwritten.values())

    def apply(self, actions: Iterable[Any]) -> None:
        for action in actions:
            if isinstance(action, WriteSnapshot):
                self._write(action.incident, action.records)
                continue  # _write alerts with the snapshot it wrote
            if isinstance(action, UpdateIncident):
                pending = self._unwritten.get(action.incident.id)
                if pending is not None:  # its snapshot or row is not saved yet: it carries these
                    pending.incident = action.incident
                    pending.records.extend(action.records)
                    continue
                try:
                    self.store.save_incident(
                        IncidentRow.from_incident(action.incident), action.records
                    )
                except SentinelError as exc:
                    log.error(
                        "could not save incident %s (trying again every %.0f s): %s",
                        action.incident.id,
                        SNAPSHOT_RETRY_S,
                        exc,
                    )
                    self._unwritten[action.incident.id] = _Unwritten(
                        action.incident,
                        list(action.records),
                        self.clock() + SNAPSHOT_RETRY_S,
                        snapshot_id="",
                    )
                    continue
                self._release(action.records)
            elif isinstance(action, CloseIncident) and action.incident.id in self._unwritten:
                self._unwritten[action.incident.id].incident = action.incident
                continue  # closed once its snapshot is written
            elif isinstance(action, CountSoftOom):
                log.info(
                    "ComfyUI %r recovered from a soft OOM (%d so far): %s",
                    action.instance,
                    action.count,
                    action.observation.event.message[:200],
                )
                if self.metrics is not None:
                    self.metrics.observe_soft_oom(action.instance)
            elif isinstance(action, CloseIncident):
                log.debug(
                    "incident %s closed after %d failure(s)",
                    action.incident.id,
                    action.incident.count,
                )
                try:
                    self.store.close_incident(action.incident.id, self.clock())
                except SentinelError as exc:
                    log.warning("could not close incident %s: %s", action.incident.id, exc)
            if self.metrics is not None and isinstance(action, (UpdateIncident, CloseIncident)):
                self.metrics.observe_incident(action.incident)
            if self.alerts is not None:
                self.alerts.handle(action)

    def retry_unwritten(self, now: float) -> None:
        """Write the snapshots that failed earlier (a full disk that has room again)."""
        for incident_id, pending in list(self._unwritten.items()):
            if now < pending.retry_at_s:
                continue
            current = self.tracker.current(incident_id)
            incident = current if current is not None else pending.incident
            del self._unwritten[incident_id]
            if pending.snapshot_id is not None:
                self._save_row(incident, pending.snapshot_id or None, pending.records)
            else:
                self._write(incident, pending.records, retry=True)
            if current is None and incident_id not in self._unwritten:
                # its storm ended while it waited: close it now that it is saved
                self.apply([CloseIncident(incident)])

    def _save_row(
        self, incident: Incident, snapshot_id: str | None, records: Sequence[FoldedRecord]
    ) -> None:
        """The row and the records it counted; on failure tried again while running (and a
        restart restores them from the snapshot, which lists its records)."""
        try:
            self.store.save_incident(IncidentRow.from_incident(incident, snapshot_id), records)
        except SentinelError as exc:
            log.error("could not save incident %s: %s", incident.id, exc)
            self._unwritten[incident.id] = _Unwritten(
                incident, list(records), self.clock() + SNAPSHOT_RETRY_S, snapshot_id or ""
            )
            return
        self._release(records)

    def _write(
        self, incident: Incident, records: Sequence[FoldedRecord] = (), *, retry: bool = False
    ) -> None:
        inst = self.registry.get(incident.instance) or WatchedInstance(
            name=incident.instance, path=None, url=None, log_paths=()
        )
        assembled = self.assembler.assemble(incident, inst, records)
        try:
            ref = write_snapshot(self.snapshots_dir, assembled.content)
        except SentinelError as exc:
            # Delayed, never dropped: its records keep their hold and it is tried again.
            if not retry:
                log.error(
                    "could not write the snapshot of incident %s (trying again every %.0f s): %s",
                    incident.id,
                    SNAPSHOT_RETRY_S,
                    exc,
                )
            self._unwritten[incident.id] = _Unwritten(
                incident, list(records), self.clock() + SNAPSHOT_RETRY_S
            )
            return
        if retry:
            log.info("snapshot of incident %s written on a later try", incident.id)
        self._save_row(incident, ref.id, records)
        self.incidents_written += 1
        self.last_incident = ref.id
        if self.metrics is not None:
            self.metrics.observe_incident(incident)
            self.metrics.observe_snapshot(
                incident, ref.id, regression=assembled.regression_suspected
            )
        if self.alerts is not None:
            self.alerts.on_incident_written(incident, ref)
            if self.alerts.upload_channel is not None:
                self.queue_upload(incident.instance, ref.id, ref.path)
        log.warning("OOM on %s: %s -- snapshot %s", incident.instance, incident.summary, ref.path)
        if assembled.summary_suffix:
            log.warning("suspected regression after an install change: run oom-bisect %s", ref.id)
        if self.on_incident is not None:
            try:
                self.on_incident(incident, ref)
            except Exception:
                log.exception("incident callback failed for %s", ref.id)

    def queue_upload(self, instance: str, snapshot_id: str, path: Path) -> None:
        """[fleet] bucket_url: the finished (redacted) snapshot goes to the bucket, via the
        outbox (retried, kept across restarts)."""
        from oom_sentinel.daemon.fleet.bucket import upload_item

        assert self.alerts is not None
        item = upload_item(
            self.fleet,
            snapshot_id=snapshot_id,
            path=path,
            instance=instance,
            created_s=self.clock(),
        )
        try:
            self.alerts.queue_upload(item)
        except StoreError as exc:
            log.error("could not queue the upload of snapshot %s: %s", snapshot_id, exc)
