"""Start-up recovery, so a crash anywhere costs at most a re-read: recent snapshots tell which
log records and prompts are handled already, a snapshot whose store row was lost (killed
between the two writes) gets its row and records back, storms still open are resumed, and
what the bucket and the metrics missed is caught up."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oom_sentinel.daemon.incidents.snapshot import (
    Snapshot,
    list_snapshots,
    parse_iso_utc,
    snapshot_records,
)
from oom_sentinel.daemon.incidents.tracker import IncidentTracker
from oom_sentinel.daemon.service.actions import IncidentActions
from oom_sentinel.daemon.store.db import IncidentRow, Store

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    pass

log = logging.getLogger("oom_sentinel")

#: How many recent snapshots are read at start-up to learn which log records are handled.
RECOVERY_SNAPSHOTS = 200


def _row_from_snapshot(data: Mapping[str, Any], snapshot_id: str) -> IncidentRow | None:
    """The store row of a snapshot whose row was lost (the daemon died between the two)."""
    try:
        inc = data["incident"]
        event = data.get("event") or {}
        first = parse_iso_utc(str(inc["first_seen"])) or 0.0
        last = parse_iso_utc(str(inc["last_seen"])) or first
        return IncidentRow(
            id=str(inc["id"]),
            snapshot_id=snapshot_id,
            instance=str((data.get("instance") or {}).get("name") or ""),
            pool=str(event.get("pool") or "gpu"),
            backend=str(event.get("backend") or "unknown"),
            node_type=event.get("node_type"),
            exception_type=event.get("exception_type"),
            first_seen_s=first,
            last_seen_s=last,
            count=int(inc.get("count") or 1),
            sources=tuple(str(s) for s in data.get("sources") or ()),
            summary=str(data.get("summary") or ""),
            fingerprint=str(inc.get("fingerprint") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def recover(
    store: Store,
    snapshots_dir: Path,
    remember_record: Callable[[str], None],
    handled_prompts: set[str],
) -> list[Snapshot]:
    """Learn which log records (``remember_record``) and API prompts (``handled_prompts``)
    recent snapshots were built from, and give any snapshot that missed its store row its
    row. Returns those snapshots, newest first."""
    snaps, problems = list_snapshots(snapshots_dir, newest=RECOVERY_SNAPSHOTS)
    for problem in problems:
        log.warning("snapshots: %s", problem)
    for snap in snaps:
        for obs in snap.data.get("observations") or []:
            evidence = obs.get("evidence") or {} if isinstance(obs, dict) else {}
            rid = evidence.get("record_id")
            if isinstance(rid, str):
                remember_record(rid)
            prompt_id = evidence.get("prompt_id")
            if isinstance(prompt_id, str) and obs.get("source") == "api":
                handled_prompts.add(prompt_id)
        if store.incident_for_snapshot(snap.id) is None:
            row = _row_from_snapshot(snap.data, snap.id)
            if row is not None:
                store.save_incident(row, snapshot_records(snap.data))
                log.info("snapshot %s had no store row; restored it", snap.id)
    return snaps


def resume_storms(store: Store, tracker: IncidentTracker, now: float) -> None:
    """Re-admit the incidents whose storm was still open when the daemon stopped, so the
    storm's next repeat grows the same incident instead of writing a second snapshot."""
    for row in store.open_incidents():
        last = store.incident_records(row.id, failure=row.count)
        tracker.resume(row.to_incident(), now, last_failure=last)
        log.debug("resumed open incident %s (count %d)", row.id, row.count)


def catch_up_fleet(
    recent: Sequence[Snapshot], now: float, actions: IncidentActions, retry_max_age_s: float
) -> None:
    """At start: a snapshot that a crash kept out of the bucket's queue (killed between
    writing it and queueing it), or one written before bucket_url was set, is queued now
    if it is younger than the alerts' retry_max_age_s (the outbox keeps each once: one
    already queued, sent or given up is left alone); and each instance's latest incident
    is named in the metrics again, with the time it was recorded."""
    alerts, metrics = actions.alerts, actions.metrics
    if alerts is not None and alerts.upload_channel is not None:
        for snap in recent:
            created_s = parse_iso_utc(snap.created)
            if created_s is not None and now - created_s <= retry_max_age_s:
                actions.queue_upload(snap.instance_name, snap.id, snap.path)
    if metrics is not None:
        named: set[str] = set()
        for snap in recent:  # newest first: the first of each instance is its latest
            created_s = parse_iso_utc(snap.created)
            if snap.instance_name in named or created_s is None:
                continue
            named.add(snap.instance_name)
            regression = snap.data.get("regression")
            metrics.set_last_incident(
                snap.instance_name,
                str(snap.event.get("pool") or ""),
                str(snap.event.get("node_type") or ""),
                snap.id,
                regression=isinstance(regression, dict) and regression.get("suspected") is True,
                at_s=created_s,
            )
