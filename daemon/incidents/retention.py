"""Snapshot retention: keep at most ``max_count`` snapshots and none older than
``max_age_days``, and never the newest -- the one a user is most likely about to look at.

The decision (``plan_prune``) is pure; ``prune_snapshots`` carries it out in an order that a
crash at any point leaves consistent or converging: first the store rows go (one transaction),
then each directory is renamed to ``.trash-<name>-<random>`` (atomic: it vanishes from listings
at once) and removed. A crash after the rows leaves directories that the next prune selects
again; a crash mid-removal leaves ``.trash-*`` that ``snapshot.clean_leftovers`` removes at
start. Only directories named like ours are ever considered.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from oom_sentinel.daemon.incidents.snapshot import SNAPSHOT_NAME_RE, TRASH_PREFIX, snapshot_dirs

__all__ = ["SECONDS_PER_DAY", "plan_prune", "prune_snapshots", "snapshot_time_s"]

SECONDS_PER_DAY = 86400


class _IncidentRows(Protocol):
    def delete_incidents_for_snapshots(self, snapshot_ids: Sequence[str]) -> int: ...


def snapshot_time_s(name: str) -> float | None:
    """When a snapshot was taken, from its directory name (None: not one of ours)."""
    match = SNAPSHOT_NAME_RE.match(name)
    if not match:
        return None
    try:
        return datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def plan_prune(
    entries: Sequence[tuple[str, float]], *, max_count: int, max_age_days: float, now_s: float
) -> tuple[str, ...]:
    """Which snapshot ids to delete. ``entries`` are (id, created_s); 0 disables a limit.

    The newest (latest time, then greatest id) is always kept, whatever the limits say.
    """
    ordered = sorted(entries, key=lambda e: (e[1], e[0]), reverse=True)
    doomed: list[str] = []
    cutoff = now_s - max_age_days * SECONDS_PER_DAY if max_age_days > 0 else None
    for position, (snapshot_id, created_s) in enumerate(ordered):
        if position == 0:
            continue
        too_many = max_count > 0 and position >= max_count
        too_old = cutoff is not None and created_s < cutoff
        if too_many or too_old:
            doomed.append(snapshot_id)
    return tuple(doomed)


def prune_snapshots(
    snapshots_dir: str | os.PathLike[str],
    *,
    max_count: int,
    max_age_days: float,
    now_s: float,
    store: _IncidentRows | None = None,
) -> tuple[str, ...]:
    """Apply the retention limits; returns the ids removed. Store rows go with their dirs."""
    root = Path(snapshots_dir)
    entries: list[tuple[str, float]] = []
    for directory in snapshot_dirs(root):
        created_s = snapshot_time_s(directory.name)
        if created_s is not None:
            entries.append((directory.name, created_s))
    doomed = plan_prune(entries, max_count=max_count, max_age_days=max_age_days, now_s=now_s)
    if not doomed:
        return ()
    if store is not None:
        store.delete_incidents_for_snapshots(list(doomed))
    removed: list[str] = []
    for snapshot_id in doomed:
        trash = root / f"{TRASH_PREFIX}{snapshot_id}-{secrets.token_hex(4)}"
        try:
            os.rename(root / snapshot_id, trash)
        except OSError:
            continue  # vanished or not ours to move; the next prune looks again
        removed.append(snapshot_id)
        shutil.rmtree(trash, ignore_errors=True)
    return tuple(removed)
