"""Which install state each ComfyUI was in, and when: the history that turns "it ran
yesterday, after updating it runs out of memory" into two concrete states and their diff.

Two tables (``store.MIGRATIONS`` entry 3): ``install_states`` holds each distinct state once,
keyed by its ``state_id`` (``InstallState.to_json()``); ``state_observations`` says that an
instance was in a state from a moment on (``at_s``), and how we know (``source``):

- ``capture``: the daemon read the install -- at start (with ComfyUI's interpreter, for pip
  and torch facts), after ``.git/HEAD``, refs or ``custom_nodes/`` changed (watchdog,
  debounced; git and nodes only, the last environment facts carried over), whenever ComfyUI
  restarts (a new process is when new packages take effect) and periodically. A capture is
  stored only when its id differs from the instance's current state, and is dated from the
  first file event of the change, not from when the capture finished.
- ``reflog``: states rebuilt from the git reflogs of ComfyUI and every node
  (``reflog.import_install_history``), so updates made before the daemon was installed, or
  while it was down, are known. Imported with every full capture (start, ComfyUI restarts,
  ``full_interval_s``); an observation is keyed by its moment, so a re-import adds only moves
  that are new (the first reconstruction of a moment wins).
- ``manager``: ComfyUI-Manager's snapshot files (every layout's folder, under the running
  process's ``--user-directory`` when known), keyed by file. Listed and diffable, but not
  used to attribute runs: Manager names packs by URL and leaves disabled registry packs out,
  so its states differ from our captures in ways that are not updates.

A run ran under the state that was current when its ComfyUI *process* started (Python loads
ComfyUI and the custom nodes once; a ``git pull`` while it runs changes nothing until the
restart), else when the prompt started. ``attribute_run`` answers that, without depending on
a sub-second race between a launcher's ``git pull`` and the start it does right after:

1. The capture a ComfyUI (re)start triggers is recorded for that process (keyed by its start
   time, even when nothing changed) and wins: it read the install just after the start.
   ``settle`` waits, bounded, for one still in flight.
2. Else the process's start time, with ``PROCESS_START_TOLERANCE_S``: psutil builds it from
   the kernel's boot time in whole seconds, so it reads up to a second early. The state in
   effect at start + tolerance is taken; when another state was in effect at start -
   tolerance, the attribution is *ambiguous* (a change landed within a second of the start),
   the later state is kept, and the snapshot says so (``install_state.attribution``).
3. Else the prompt's start; else the current state.

The regression check (``regression.py``) compares the state of an OOM with the state of the
last success.

Threads: the ``InstallStateTracker`` captures in its own worker thread (GitPython, ``git
status`` and the interpreter can take seconds) and writes to the store directly -- ``Store``
serialises every call with its lock. The watchdog observer and the scheduler jobs only mark
work as due. The main loop calls ``update`` (cheap: it compares pids) and, when it writes a
snapshot, ``snapshot_parts``, which waits a bounded time for a capture still in flight.

Security: when the daemon runs as root, ComfyUI's interpreter (which imports whatever the
user's environment holds: ``sitecustomize``, ``.pth`` files, torch) runs as the owner of the
install, never as root; a root-owned install's interpreter runs as root, since only root could
have put code there. ``[install_state] probe_interpreter = false`` never runs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from oom_sentinel.config.settings import InstallStateSettings
from oom_sentinel.daemon.classify.advice import Advice
from oom_sentinel.daemon.comfy.interpreter import find_interpreter
from oom_sentinel.daemon.comfy.prompt_fingerprint import workflow_fingerprint
from oom_sentinel.daemon.core.errors import InputError, SentinelError
from oom_sentinel.daemon.incidents.regression import (
    GoodRun,
    RegressionVerdict,
    assess_regression,
    good_run_from_record,
    same_code_state,
)
from oom_sentinel.daemon.incidents.snapshot import iso_utc
from oom_sentinel.daemon.install.diff import diff_states, repos_for_state
from oom_sentinel.daemon.install.manager_snapshots import ManagerSnapshotFile, manager_states
from oom_sentinel.daemon.install.reflog import HistoricalState, import_install_history
from oom_sentinel.daemon.install.state import (
    InstallState,
    capture_install,
    resolve_comfyui_root,
    watch_paths,
)
from oom_sentinel.daemon.service.workers import Worker
from oom_sentinel.daemon.store.db import Store

__all__ = [
    "ALL_SOURCES",
    "ATTRIBUTION_SOURCES",
    "PROCESS_START_TOLERANCE_S",
    "Attribution",
    "InstallStateTracker",
    "SnapshotParts",
    "StateListing",
    "StateObservation",
    "attribute_run",
    "choose_run_as",
    "current_state",
    "import_manager_snapshots",
    "import_reflog_history",
    "list_states",
    "load_state",
    "observations",
    "record_capture",
    "record_observation",
    "resolve_state_ref",
    "save_state",
    "state_at",
    "state_for_run",
    "successful_runs",
]

log = logging.getLogger("oom_sentinel")

ALL_SOURCES: tuple[str, ...] = ("capture", "reflog", "manager")
#: Sources whose states say what code an instance ran (see the module docstring on Manager).
ATTRIBUTION_SOURCES: tuple[str, ...] = ("capture", "reflog")
#: How long ``snapshot_parts`` and ``state_id_for_run`` wait for a capture still in flight.
SETTLE_TIMEOUT_S = 5.0
#: A stream of file events (a long clone) is captured at the latest after this many debounces.
DEBOUNCE_CAP_FACTOR = 5
#: How many successful runs of an instance the regression check looks at (newest first).
RUNS_CONSIDERED = 500
#: psutil's process start time is the boot time in whole seconds (read up to 1 s early) plus
#: the start in clock ticks; a quarter second more covers the ticks and the capture's clock.
PROCESS_START_TOLERANCE_S = 1.25


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True, slots=True)
class StateObservation:
    """``instance`` was in ``state_id`` from ``at_s`` on (until its next observation)."""

    instance: str
    state_id: str
    at_s: float
    #: "capture" | "reflog" | "manager"
    source: str
    #: the reflog event, the Manager file, or what triggered a capture
    detail: str | None
    recorded_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "state_id": self.state_id,
            "at": iso_utc(self.at_s),
            "at_s": self.at_s,
            "source": self.source,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class StateListing:
    """One stored state with a digest of where and when it was observed."""

    state_id: str
    #: the state's own origin: "capture", "reflog", "manager:<file>", "file:<path>"
    source: str
    comfyui_commit: str | None
    node_count: int
    has_pip: bool
    recorded_s: float
    first_at_s: float | None
    last_at_s: float | None
    instances: tuple[str, ...]
    sources: tuple[str, ...]
    #: instances whose current state this is
    current_for: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "state_id": self.state_id,
            "source": self.source,
            "comfyui": self.comfyui_commit,
            "nodes": self.node_count,
            "pip": self.has_pip,
            "instances": list(self.instances),
            "observed_by": list(self.sources),
            "first_observed": iso_utc(self.first_at_s) if self.first_at_s is not None else None,
            "last_observed": iso_utc(self.last_at_s) if self.last_at_s is not None else None,
            "current_for": list(self.current_for),
        }


# ---------------------------------------------------------------------------------------------
# The store (any thread: every call holds the store's lock)


def _state_row(state: InstallState, now_s: float) -> tuple[Any, ...]:
    return (
        state.state_id,
        state.to_json(),
        state.source,
        state.comfyui.commit,
        len(state.nodes),
        int(state.pip is not None),
        now_s,
    )


_INSERT_STATE = (
    "INSERT INTO install_states (state_id, state_json, source, comfyui_commit, node_count, "
    "has_pip, recorded_s) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (state_id) DO NOTHING"
)


def save_state(store: Store, state: InstallState, *, now_s: float | None = None) -> bool:
    """Store ``state`` under its id; False when that id is already stored."""
    with store.transaction("save an install state") as db:
        cur = db.execute(_INSERT_STATE, _state_row(state, time.time() if now_s is None else now_s))
        return cur.rowcount > 0


def record_observation(
    store: Store,
    instance: str,
    state: InstallState,
    *,
    at_s: float,
    source: str,
    detail: str | None = None,
    dedup_key: str | None = None,
    now_s: float | None = None,
) -> bool:
    """Store the state (once) and that ``instance`` was in it from ``at_s``; False when an
    observation with the same ``dedup_key`` (default: source, moment and state) exists."""
    if source not in ALL_SOURCES:
        raise ValueError(f"unknown observation source {source!r}")
    now = time.time() if now_s is None else now_s
    key = dedup_key or f"{source}@{at_s!r}:{state.state_id}"
    with store.transaction("record an install state") as db:
        db.execute(_INSERT_STATE, _state_row(state, now))
        cur = db.execute(
            "INSERT INTO state_observations (instance, state_id, at_s, source, detail, "
            "dedup_key, recorded_s) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (instance, dedup_key) DO NOTHING",
            (instance, state.state_id, at_s, source, detail, key, now),
        )
        return cur.rowcount > 0


def record_capture(
    store: Store,
    instance: str,
    state: InstallState,
    *,
    at_s: float,
    detail: str | None = None,
    now_s: float | None = None,
) -> bool:
    """Record a capture when it differs (by id) from the instance's current state; True when
    it was recorded (the state changed, or the instance had none)."""
    current = _latest(store, instance, None, ATTRIBUTION_SOURCES)
    if current is not None and current.state_id == state.state_id:
        return False
    return record_observation(
        store, instance, state, at_s=at_s, source="capture", detail=detail, now_s=now_s
    )


def import_reflog_history(
    store: Store,
    instance: str,
    history: Sequence[HistoricalState],
    *,
    now_s: float | None = None,
) -> int:
    """Store reconstructed states as earlier observations; returns how many were new.

    Keyed by moment: importing again (the next start) adds only moments not seen before."""
    added = 0
    for item in history:
        at = item.at_epoch_s if item.at_epoch_s is not None else item.state.captured_at_epoch_s
        if at is None:
            continue
        added += record_observation(
            store,
            instance,
            item.state,
            at_s=at,
            source="reflog",
            detail=item.description,
            dedup_key=f"reflog@{at!r}",
            now_s=now_s,
        )
    return added


def import_manager_snapshots(
    store: Store,
    instance: str,
    found: Iterable[tuple[ManagerSnapshotFile, InstallState | InputError]],
    *,
    now_s: float | None = None,
) -> int:
    """Store ComfyUI-Manager snapshot files as observations keyed by file; returns how many
    were new. Unreadable files are logged and skipped (one bad file hides no other)."""
    added = 0
    for file, state in found:
        if isinstance(state, InputError):
            log.warning("ComfyUI-Manager snapshot skipped: %s", state)
            continue
        at = state.captured_at_epoch_s if state.captured_at_epoch_s is not None else file.at_epoch_s
        added += record_observation(
            store,
            instance,
            state,
            at_s=at,
            source="manager",
            detail=str(file.path),
            dedup_key=f"manager:{file.path}",
            now_s=now_s,
        )
    return added


def load_state(store: Store, state_id: str) -> InstallState | None:
    rows = store.query(
        "read an install state",
        "SELECT state_json FROM install_states WHERE state_id = ?",
        (state_id,),
    )
    if not rows:
        return None
    return InstallState.from_json(rows[0][0], f"{store.path}: install state {state_id}")


def resolve_state_ref(store: Store, ref: str) -> str:
    """The stored state id ``ref`` names (the id or a unique prefix of at least 4 digits)."""
    text = ref.strip().lower()
    if len(text) < 4 or any(c not in "0123456789abcdef" for c in text):
        raise InputError(f"{ref!r}: not a state id (16 hex digits, or a unique prefix of 4+)")
    rows = store.query(
        "look up an install state",
        "SELECT state_id FROM install_states WHERE state_id >= ? AND state_id < ? "
        "ORDER BY state_id LIMIT 6",
        (text, text + "g"),
    )
    ids = [str(r[0]) for r in rows]
    if not ids:
        raise InputError(f"no install state {ref!r} in {store.path}")
    if len(ids) > 1 and text not in ids:
        shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise InputError(f"{ref!r} matches several install states ({shown}); give more digits")
    return text if text in ids else ids[0]


_OBS_COLUMNS = "instance, state_id, at_s, source, detail, recorded_s"


def _obs(row: Sequence[Any]) -> StateObservation:
    return StateObservation(
        instance=row[0],
        state_id=row[1],
        at_s=row[2],
        source=row[3],
        detail=row[4],
        recorded_s=row[5],
    )


def _latest(
    store: Store, instance: str, at_s: float | None, sources: Sequence[str]
) -> StateObservation | None:
    marks = ", ".join("?" for _ in sources)
    sql = (
        f"SELECT {_OBS_COLUMNS} FROM state_observations WHERE instance = ? AND source IN ({marks})"
    )
    params: list[Any] = [instance, *sources]
    if at_s is not None:
        sql += " AND at_s <= ?"
        params.append(at_s)
    # Equal moments: a capture (which read the install) before a reconstruction.
    sql += " ORDER BY at_s DESC, source = 'capture' DESC, id DESC LIMIT 1"
    rows = store.query("read install-state history", sql, params)
    return _obs(rows[0]) if rows else None


def observations(
    store: Store,
    *,
    instance: str | None = None,
    state_id: str | None = None,
    sources: Sequence[str] = ALL_SOURCES,
) -> list[StateObservation]:
    """Observations oldest first, optionally of one instance or one state."""
    marks = ", ".join("?" for _ in sources)
    sql = f"SELECT {_OBS_COLUMNS} FROM state_observations WHERE source IN ({marks})"
    params: list[Any] = list(sources)
    if instance is not None:
        sql += " AND instance = ?"
        params.append(instance)
    if state_id is not None:
        sql += " AND state_id = ?"
        params.append(state_id)
    sql += " ORDER BY at_s, id"
    return [_obs(r) for r in store.query("read install-state history", sql, params)]


def state_at(
    store: Store,
    instance: str,
    at_s: float,
    *,
    sources: Sequence[str] = ATTRIBUTION_SOURCES,
) -> tuple[StateObservation, InstallState] | None:
    """The state ``instance`` was in at ``at_s`` (its last observation at or before it)."""
    obs = _latest(store, instance, at_s, sources)
    if obs is None:
        return None
    state = load_state(store, obs.state_id)
    return None if state is None else (obs, state)


def current_state(
    store: Store, instance: str, *, sources: Sequence[str] = ATTRIBUTION_SOURCES
) -> tuple[StateObservation, InstallState] | None:
    """The state ``instance`` is in now (its latest observation)."""
    obs = _latest(store, instance, None, sources)
    if obs is None:
        return None
    state = load_state(store, obs.state_id)
    return None if state is None else (obs, state)


def restart_key(process_start_s: float) -> str:
    """The dedup key of the capture a ComfyUI start triggered (its psutil start time: the
    same float every time the daemon reads that process)."""
    return f"restart@{process_start_s!r}"


@dataclass(frozen=True, slots=True)
class Attribution:
    """Which observation a run is attributed to, and how sure that is."""

    observation: StateObservation
    #: "restart-capture" | "process-start" | "prompt-start" | "current"
    by: str
    #: the other state in effect within the tolerance of the process start (the earlier one)
    ambiguous_with: StateObservation | None = None

    def to_json(self) -> dict[str, Any]:
        other = self.ambiguous_with
        reasons = {
            "restart-capture": "the capture taken when this ComfyUI process started",
            "process-start": "the state in effect when this ComfyUI process started",
            "prompt-start": "the state in effect when the prompt started (process unknown)",
            "current": "the current state (no start time known)",
        }
        reason = reasons.get(self.by, self.by)
        if other is not None:
            reason += (
                f"; ambiguous: the install changed from {other.state_id} within "
                f"{PROCESS_START_TOLERANCE_S:g} s of the process start, so the later state is used"
            )
        return {
            "by": self.by,
            "ambiguous": other is not None,
            "other_state_id": other.state_id if other is not None else None,
            "other_observed_at": iso_utc(other.at_s) if other is not None else None,
            "reason": reason,
        }


def _restart_capture(
    store: Store, instance: str, process_start_s: float
) -> StateObservation | None:
    rows = store.query(
        "read install-state history",
        f"SELECT {_OBS_COLUMNS} FROM state_observations WHERE instance = ? AND dedup_key = ? "
        "LIMIT 1",
        (instance, restart_key(process_start_s)),
    )
    return _obs(rows[0]) if rows else None


def attribute_run(
    store: Store,
    instance: str,
    *,
    started_s: float | None,
    process_start_s: float | None = None,
    tolerance_s: float = PROCESS_START_TOLERANCE_S,
) -> Attribution | None:
    """The observation of the state a prompt ran under (see the module docstring for the
    order); a reconstructed state gives way to the capture that followed it when the code did
    not change in between."""
    if process_start_s is not None:
        restart = _restart_capture(store, instance, process_start_s)
        if restart is not None:
            return Attribution(restart, "restart-capture")
        late = _latest(store, instance, process_start_s + tolerance_s, ATTRIBUTION_SOURCES)
        if late is not None:
            early = _latest(store, instance, process_start_s - tolerance_s, ATTRIBUTION_SOURCES)
            other = None
            if early is not None and early.state_id != late.state_id:
                base, later = load_state(store, early.state_id), load_state(store, late.state_id)
                if base is None or later is None or not same_code_state(base, later):
                    other = early
            return Attribution(_prefer_capture(store, late), "process-start", other)
    if started_s is not None:
        found = _latest(store, instance, started_s, ATTRIBUTION_SOURCES)
        if found is not None:
            return Attribution(_prefer_capture(store, found), "prompt-start")
    if started_s is None and process_start_s is None:
        found = _latest(store, instance, None, ATTRIBUTION_SOURCES)
        if found is not None:
            return Attribution(_prefer_capture(store, found), "current")
    return None


def state_for_run(
    store: Store,
    instance: str,
    *,
    started_s: float | None,
    process_start_s: float | None = None,
) -> StateObservation | None:
    """The observation of the state a prompt ran under (``attribute_run``'s, without how)."""
    found = attribute_run(store, instance, started_s=started_s, process_start_s=process_start_s)
    return found.observation if found is not None else None


def _prefer_capture(store: Store, obs: StateObservation) -> StateObservation:
    if obs.source == "capture":
        return obs
    return _captured_equivalent(store, obs) or obs


def _captured_equivalent(store: Store, obs: StateObservation) -> StateObservation | None:
    """The first capture after ``obs`` when the code did not change in between: it is the same
    state with more facts (pip, versions, dirty files) than a reflog reconstruction has."""
    rows = store.query(
        "read install-state history",
        f"SELECT {_OBS_COLUMNS} FROM state_observations WHERE instance = ? AND at_s > ? "
        "AND source IN ('capture', 'reflog') ORDER BY at_s, id LIMIT 50",
        (obs.instance, obs.at_s),
    )
    base = load_state(store, obs.state_id)
    if base is None:
        return None
    for row in rows:
        later = _obs(row)
        state = load_state(store, later.state_id)
        if state is None or not same_code_state(base, state):
            return None
        if later.source == "capture":
            return later
    return None


def list_states(store: Store, *, instance: str | None = None) -> list[StateListing]:
    """Stored states, most recently observed first (states without observations last)."""
    params: list[Any] = []
    where = ""
    if instance is not None:
        where = "WHERE o.instance = ?"
        params.append(instance)
    rows = store.query(
        "list install states",
        "SELECT s.state_id, s.source, s.comfyui_commit, s.node_count, s.has_pip, s.recorded_s, "
        "min(o.at_s), max(o.at_s), group_concat(DISTINCT o.instance), "
        "group_concat(DISTINCT o.source) "
        "FROM install_states s "
        f"{'JOIN' if instance is not None else 'LEFT JOIN'} state_observations o "
        f"ON o.state_id = s.state_id {where} "
        "GROUP BY s.state_id ORDER BY max(o.at_s) IS NULL, max(o.at_s) DESC, s.recorded_s DESC",
        params,
    )
    names = [instance] if instance is not None else _instances(store)
    current: dict[str, list[str]] = {}
    for name in names:
        obs = _latest(store, name, None, ATTRIBUTION_SOURCES)
        if obs is not None:
            current.setdefault(obs.state_id, []).append(name)
    out: list[StateListing] = []
    for r in rows:
        out.append(
            StateListing(
                state_id=r[0],
                source=r[1],
                comfyui_commit=r[2],
                node_count=int(r[3]),
                has_pip=bool(r[4]),
                recorded_s=r[5],
                first_at_s=r[6],
                last_at_s=r[7],
                instances=tuple(sorted((r[8] or "").split(","))) if r[8] else (),
                sources=tuple(sorted((r[9] or "").split(","))) if r[9] else (),
                current_for=tuple(sorted(current.get(r[0], ()))),
            )
        )
    return out


def _instances(store: Store) -> list[str]:
    rows = store.query(
        "list instances", "SELECT DISTINCT instance FROM state_observations ORDER BY instance"
    )
    return [str(r[0]) for r in rows]


def successful_runs(store: Store, instance: str, *, limit: int = RUNS_CONSIDERED) -> list[GoodRun]:
    """The newest successful runs of ``instance`` (the ``runs`` table of ``runs.py``)."""
    from oom_sentinel.daemon.store.runs import list_runs

    return [
        good_run_from_record(r)
        for r in list_runs(store, instance=instance, outcome="success", limit=limit)
    ]


# ---------------------------------------------------------------------------------------------
# Who runs the interpreter (pure)


def choose_run_as(euid: int | None, owner_uid: int, owner_gid: int) -> tuple[int, int] | None:
    """(uid, gid) to run ComfyUI's interpreter as, or None for "as we are".

    Only root changes identity: to the install's owner, unless root owns it too. ``euid`` is
    None where there are no uids (Windows: the service account reads, the interpreter runs as
    the service; installs there live in the user's profile and the service runs as that
    user by default)."""
    if euid is None or euid != 0 or owner_uid == 0:
        return None
    return owner_uid, owner_gid


# ---------------------------------------------------------------------------------------------
# The service component


class _InstanceLike(Protocol):
    name: str
    path: str | None
    python: str | None
    pid: int | None
    process: Any


@dataclass(frozen=True)
class SnapshotParts:
    """What the history adds to a snapshot: sections, a first advice item, a summary tail."""

    sections: Mapping[str, Mapping[str, Any]]
    advice: Advice | None
    summary_suffix: str | None
    verdict: RegressionVerdict | None


@dataclass(eq=False)
class _Target:
    """One watched install (guarded by the tracker's condition)."""

    name: str
    path: str
    python: str | None
    #: ComfyUI's --user-directory when its process is known (Manager keeps snapshots there)
    user_dir: str | None = None
    root: Path | None = None
    last: InstallState | None = None
    last_pid: int | None = None
    started: bool = False
    #: wall time of the first file event not yet captured, and its monotonic twin
    pending_since: float | None = None
    first_event_mono: float | None = None
    #: monotonic times a capture is due: asked for (start, restart, periodic) / after events
    requested_mono: float | None = None
    event_due_mono: float | None = None
    want_full: bool = True
    busy: bool = False
    #: the capture in flight records a change announced by file events
    busy_with_change: bool = False
    #: settle() calls waiting on this install: while any waits, events are not debounced
    settling: int = 0
    why: str = "start"
    #: the psutil start time of a ComfyUI process whose start capture is due / in flight
    restart_start_s: float | None = None
    restart_busy: bool = False
    #: settle() timed out waiting for that capture once: later runs do not wait for it again
    restart_gave_up: bool = False
    error: str | None = None
    #: watched directory -> (recursive, names that matter or None for any)
    specs: dict[str, tuple[bool, frozenset[str] | None]] = field(default_factory=dict)

    @property
    def due_mono(self) -> float | None:
        dues = [d for d in (self.requested_mono, self.event_due_mono) if d is not None]
        return min(dues) if dues else None


class InstallStateTracker:
    """Captures every watched install's state at start, on change and periodically, and
    answers which state a run or an OOM ran under. ``start(scheduler)``, ``update(instances)``
    from the main loop, ``close()``."""

    def __init__(
        self,
        store: Store,
        settings: InstallStateSettings,
        *,
        clock: Callable[[], float] = time.time,
        euid: int | None = None,
        use_observer: bool = True,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self._euid = (
            euid if euid is not None else (os.geteuid() if hasattr(os, "geteuid") else None)
        )
        self._use_observer = use_observer
        self._targets: dict[str, _Target] = {}
        self._cond = threading.Condition()
        self._stopping = False
        #: the capture thread (service.workers): its health gates the watchdog ping
        self.worker = Worker("install-state", self._work, thread_name="install-state")
        self._observer: Any = None
        self._watches: dict[str, Any] = {}
        self.backend = "poll"
        self.captures = 0

    # -- life cycle ----------------------------------------------------------------------------

    def start(self, scheduler: Any | None = None) -> None:
        self.worker.start()
        if self._use_observer:
            self._start_observer()
        if scheduler is not None:
            scheduler.add_job(
                self.request_all,
                "interval",
                seconds=self.settings.interval_s,
                id="install-state",
                coalesce=True,
                max_instances=1,
            )
            scheduler.add_job(
                lambda: self.request_all(full=True, why="periodic full capture"),
                "interval",
                seconds=self.settings.full_interval_s,
                id="install-state-full",
                coalesce=True,
                max_instances=1,
            )

    def is_alive(self) -> bool:
        """Whether the capture thread runs (a worker the watchdog checks)."""
        return self.worker.is_alive()

    def _ask_to_stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def close(self) -> None:
        # A capture in flight finishes first (the interpreter has its own timeout); the
        # thread is a daemon thread, so a stuck one cannot hold the process.
        self.worker.stop(10, wake=self._ask_to_stop)
        observer, self._observer = self._observer, None
        if observer is not None:
            with contextlib.suppress(Exception):
                observer.stop()
                observer.join(timeout=5)

    # -- from the main loop --------------------------------------------------------------------

    def update(self, instances: Iterable[_InstanceLike]) -> None:
        """Adopt new instances (their start capture is due at once) and notice restarts (a
        new ComfyUI process: capture with the interpreter). Cheap; the service calls it
        whenever its instances change (``Service._sync_watchers``)."""
        now = time.monotonic()
        with self._cond:
            wake = False
            for inst in instances:
                if not inst.path:
                    continue  # an URL-only instance: no install to read
                t = self._targets.get(inst.name)
                user_dir = getattr(getattr(inst, "process", None), "user_dir", None)
                if t is None:
                    t = _Target(inst.name, inst.path, inst.python, user_dir, last_pid=inst.pid)
                    t.requested_mono = now
                    self._targets[inst.name] = t
                    wake = True
                    continue
                if isinstance(user_dir, str):
                    t.user_dir = user_dir
                if inst.python and inst.python != t.python:
                    t.python = inst.python
                    wake |= self._due(t, now, full=True, why="interpreter found")
                if inst.pid is not None and inst.pid != t.last_pid:
                    if t.last_pid is not None or t.started:
                        wake |= self._due(
                            t, now, full=True, why=f"ComfyUI started (pid {inst.pid})"
                        )
                        start_s = getattr(getattr(inst, "process", None), "create_time_s", None)
                        if isinstance(start_s, int | float):
                            t.restart_start_s = float(start_s)
                            t.restart_gave_up = False
                    t.last_pid = inst.pid
            if wake:
                self._cond.notify_all()

    def request_all(self, *, full: bool = False, why: str = "periodic capture") -> None:
        """Capture every install soon (the scheduler's jobs; any thread)."""
        now = time.monotonic()
        with self._cond:
            for t in self._targets.values():
                self._due(t, now, full=full, why=why)
            self._cond.notify_all()

    @staticmethod
    def _due(t: _Target, when: float, *, full: bool, why: str) -> bool:
        t.want_full |= full
        if t.requested_mono is None or when < t.requested_mono:
            t.requested_mono = when
            t.why = why
        return True

    def settle(
        self, instance: str, timeout_s: float = SETTLE_TIMEOUT_S, *, everything: bool = False
    ) -> bool:
        """Wait (bounded) until the changes file events announced for ``instance`` are
        recorded (debouncing is cut short); True when settled. ``everything``: also wait for
        the first capture and any other due or running one (tests, tools). The main loop uses
        the default: a change seconds before a run matters, while the start capture (the
        interpreter may take a minute) must not stall the loop."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            t = self._targets.get(instance)
            if t is None:
                return True
            if t.pending_since is not None:
                t.event_due_mono = time.monotonic()  # no more debouncing
                self._cond.notify_all()

            def restart_pending() -> bool:
                return (t.restart_start_s is not None or t.restart_busy) and not t.restart_gave_up

            def waiting() -> bool:
                if t.pending_since is not None or (t.busy and t.busy_with_change):
                    return True
                if restart_pending():  # the capture that says what a new process loaded
                    return True
                return everything and (t.busy or not t.started or t.due_mono is not None)

            t.settling += 1
            try:
                while waiting():
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stopping:
                        if restart_pending():
                            t.restart_gave_up = True  # its interpreter probe is slow: once
                        return False
                    self._cond.wait(left)
                return True
            finally:
                t.settling -= 1

    def change_pending(self, instance: str) -> bool:
        """Whether file events announced a change of ``instance`` not yet recorded."""
        with self._cond:
            t = self._targets.get(instance)
            return t is not None and (t.pending_since is not None or t.busy_with_change)

    def tracks(self, instance: str) -> bool:
        with self._cond:
            return instance in self._targets

    def state_id_for_run(
        self, instance: str, *, started_s: float | None, process_start_s: float | None
    ) -> str | None:
        """The id of the state a run ran under (None: unknown). Main thread."""
        if not self.tracks(instance):
            return None
        self.settle(instance)
        try:
            obs = state_for_run(
                self.store, instance, started_s=started_s, process_start_s=process_start_s
            )
        except SentinelError as exc:
            log.warning("install state of run on %r unknown: %s", instance, exc)
            return None
        return obs.state_id if obs is not None else None

    def snapshot_parts(
        self,
        instance: str,
        *,
        prompt: Mapping[str, Any] | None,
        started_s: float | None,
        process_start_s: float | None,
    ) -> SnapshotParts | None:
        """The ``install_state`` and ``regression`` sections (and the oom-bisect advice and
        summary tail when suspected) for an OOM on ``instance``; None when its install is not
        tracked (an URL-only instance). Main thread; reads the store and the user's repos."""
        if not self.tracks(instance):
            return None
        self.settle(instance)
        try:
            return self._snapshot_parts(instance, prompt, started_s, process_start_s)
        except SentinelError as exc:
            log.warning("no install-state sections for the snapshot of %r: %s", instance, exc)
            return None

    def _snapshot_parts(
        self,
        instance: str,
        prompt: Mapping[str, Any] | None,
        started_s: float | None,
        process_start_s: float | None,
    ) -> SnapshotParts:
        found = attribute_run(
            self.store, instance, started_s=started_s, process_start_s=process_start_s
        )
        obs = found.observation if found is not None else None
        bad = load_state(self.store, obs.state_id) if obs is not None else None
        fp: str | None = None
        if prompt:
            try:
                fp = workflow_fingerprint(prompt)
            except (TypeError, ValueError):
                fp = None
        verdict = assess_regression(
            instance=instance,
            bad_state=bad,
            fingerprint=fp,
            runs=successful_runs(self.store, instance),
            state=lambda sid: load_state(self.store, sid),
            full_diff=lambda a, b: diff_states(a, b, repos=repos_for_state(a, b)),
        )
        sections: dict[str, Mapping[str, Any]] = {"regression": verdict.to_section()}
        if bad is not None and obs is not None and found is not None:
            sections["install_state"] = {
                **bad.to_dict(),
                "observed_at": iso_utc(obs.at_s),
                "observed_source": obs.source,
                "attribution": found.to_json(),
            }
            if found.ambiguous_with is not None:
                log.warning(
                    "install state of the OOM on %r: %s", instance, found.to_json()["reason"]
                )
        return SnapshotParts(sections, verdict.advice(), verdict.summary_suffix(), verdict)

    # -- the worker ----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            self.worker.beat()
            with self._cond:
                target = self._next_due()
                while target is None and not self._stopping:
                    self._cond.wait(self._wait_s())
                    target = self._next_due()
                if self._stopping:
                    return
                assert target is not None
                target.busy = True
                target.requested_mono = target.event_due_mono = target.first_event_mono = None
                full = target.want_full or not target.started
                target.want_full = False
                pending = target.pending_since
                target.pending_since = None
                target.busy_with_change = pending is not None
                why = target.why
                restart, target.restart_start_s = target.restart_start_s, None
                target.restart_busy = restart is not None
            try:
                self._capture(target, full=full, pending_since=pending, why=why, restart=restart)
            except Exception:  # a bug must not end the thread: the next change retries
                log.exception("install state of %r: capture failed", target.name)
            finally:
                with self._cond:
                    target.busy = target.busy_with_change = target.restart_busy = False
                    target.started = True
                    self._cond.notify_all()

    def _next_due(self) -> _Target | None:
        now = time.monotonic()
        due = [
            t
            for t in self._targets.values()
            if t.due_mono is not None and t.due_mono <= now and not t.busy
        ]
        return min(due, key=lambda t: t.due_mono or 0.0) if due else None

    def _wait_s(self) -> float | None:
        dues = [t.due_mono for t in self._targets.values() if t.due_mono is not None]
        if not dues:
            return None
        return max(0.0, min(dues) - time.monotonic())

    def _capture(
        self,
        t: _Target,
        *,
        full: bool,
        pending_since: float | None,
        why: str,
        restart: float | None = None,
    ) -> None:
        if t.root is None:
            try:
                t.root = resolve_comfyui_root(t.path)
            except InputError as exc:
                if t.error != str(exc):
                    log.warning("install state of %r not recorded: %s", t.name, exc)
                t.error = str(exc)
                return
        root = t.root
        interpreter, run_as = self._interpreter(t, root) if full else (None, None)
        now = self.clock()
        state = capture_install(
            root,
            interpreter=interpreter,
            timeout_s=float(self.settings.probe_timeout_s),
            run_as=run_as,
            now_epoch_s=now,
        )
        env = state.interpreter
        if t.last is not None and (env is None or env.error is not None):
            # git-only capture, or a probe that failed this time: the last facts still hold
            if env is not None and env.error is not None:
                log.warning("install state of %r: interpreter probe failed: %s", t.name, env.error)
            state = state.with_environment(t.last.pip, t.last.interpreter)
        elif env is not None and env.error is not None and t.error != env.error:
            log.warning("install state of %r: interpreter probe failed: %s", t.name, env.error)
        self.captures += 1
        if full:  # at start, restarts and periodic full captures; idempotent
            self._import_history(t, root, state)
        at = pending_since if pending_since is not None else now
        previous = current_state(self.store, t.name)
        if restart is not None:
            # What this process loaded: recorded for it even when nothing changed, so the
            # runs of this process are attributed to it whatever their clocks say.
            record_observation(
                self.store,
                t.name,
                state,
                at_s=at,
                source="capture",
                detail=why,
                dedup_key=restart_key(restart),
                now_s=now,
            )
            if previous is None or previous[1].state_id != state.state_id:
                self._log_change(t.name, previous[1] if previous else None, state)
        elif record_capture(self.store, t.name, state, at_s=at, detail=why, now_s=now):
            self._log_change(t.name, previous[1] if previous else None, state)
        t.last = state
        t.error = None
        self._resync_watches(t, root)

    def _interpreter(self, t: _Target, root: Path) -> tuple[str | None, tuple[int, int] | None]:
        if not self.settings.probe_interpreter:
            return None, None
        python = t.python or (str(p) if (p := find_interpreter(root)) is not None else None)
        if python is None:
            return None, None
        try:
            st = os.stat(root)
        except OSError:
            return None, None
        return python, choose_run_as(self._euid, st.st_uid, st.st_gid)

    def _import_history(self, t: _Target, root: Path, current: InstallState) -> None:
        try:
            history = import_install_history(root, current)
            added = import_reflog_history(self.store, t.name, history)
            manager = import_manager_snapshots(self.store, t.name, manager_states(root, t.user_dir))
        except (OSError, SentinelError) as exc:
            log.warning("install history of %r not imported: %s", t.name, exc)
            return
        if added or manager:
            log.info(
                "install history of %r: %d earlier state(s) from the git reflogs, %d from "
                "ComfyUI-Manager snapshots",
                t.name,
                added,
                manager,
            )

    def _log_change(self, name: str, old: InstallState | None, new: InstallState) -> None:
        lines: list[str] = []
        if old is not None:
            lines = diff_states(old, new, repos=repos_for_state(old, new)).summary_lines()
            lines = [line for line in lines if not line.startswith("pip: unknown")]
        if not lines:  # the first state, or the same code with more facts than before
            core = new.comfyui.commit[:12] if new.comfyui.commit else "no git"
            log.info(
                "install state of %r: %s (ComfyUI %s, %d custom node(s)%s)",
                name,
                new.state_id,
                core,
                len(new.nodes),
                ", pip recorded" if new.pip is not None else "",
            )
            return
        shown = "; ".join(lines[:5]) + (f"; {len(lines) - 5} more" if len(lines) > 5 else "")
        log.info(
            "install state of %r changed: %s -> %s (%s)",
            name,
            old.state_id if old is not None else "none",
            new.state_id,
            shown,
        )

    # -- file events ---------------------------------------------------------------------------

    def _start_observer(self) -> None:
        try:
            from watchdog.observers import Observer
            from watchdog.observers.polling import PollingObserver
        except ImportError as exc:
            log.info("install-state changes: watchdog unavailable (%s); periodic capture only", exc)
            return
        if Observer is PollingObserver:
            log.info("install-state changes: no native file events here; periodic capture only")
            return
        try:
            observer = Observer()
            observer.daemon = True
            observer.start()
        except OSError as exc:
            log.warning(
                "install-state changes: file events unavailable (%s); periodic capture only",
                exc.strerror or exc,
            )
            return
        self._observer = observer
        self.backend = f"watchdog {type(observer).__name__}"

    def _resync_watches(self, t: _Target, root: Path) -> None:
        """Watch what this install's next change will touch (new node repos included)."""
        if self._observer is None or self._stopping:
            return
        specs = _watch_specs(root)
        with self._cond:
            t.specs = specs
            wanted: dict[str, bool] = {}
            for target in self._targets.values():
                for directory, (recursive, _names) in target.specs.items():
                    wanted[directory] = wanted.get(directory, False) or recursive
        observer = self._observer
        for directory in list(self._watches):
            if directory not in wanted:
                with contextlib.suppress(KeyError, OSError, Exception):
                    observer.unschedule(self._watches.pop(directory))
        alive = {emitter.watch for emitter in list(observer.emitters) if emitter.is_alive()}
        for directory, recursive in wanted.items():
            watch = self._watches.get(directory)
            if watch is not None and watch in alive and watch.is_recursive == recursive:
                continue
            if watch is not None:
                with contextlib.suppress(KeyError, OSError, Exception):
                    observer.unschedule(watch)
                del self._watches[directory]
            if not os.path.isdir(directory):
                continue
            try:
                self._watches[directory] = observer.schedule(
                    _ChangeHandler(self),
                    directory,
                    recursive=recursive,
                    event_filter=_event_filter(),
                )
            except OSError as exc:
                log.debug("install-state changes: cannot watch %s: %s", directory, exc)

    def on_path_event(self, paths: Iterable[str]) -> None:
        """A file event (observer thread): mark the install it belongs to as changed."""
        wall = self.clock()
        now = time.monotonic()
        debounce = self.settings.debounce_ms / 1000
        with self._cond:
            hit = False
            for t in self._targets.values():
                if not any(_matches(t.specs, p) for p in paths):
                    continue
                hit = True
                if t.pending_since is None or t.first_event_mono is None:
                    t.pending_since, t.first_event_mono = wall, now
                # Trailing debounce (a pull writes many files), capped so a stream of events
                # (a long clone) is still captured. Someone in settle() wants it now: the
                # later events of the same checkout must not push it back out.
                t.event_due_mono = (
                    now
                    if t.settling
                    else min(now + debounce, t.first_event_mono + debounce * DEBOUNCE_CAP_FACTOR)
                )
                if t.requested_mono is None:
                    t.why = "file change"
            if hit:
                self._cond.notify_all()


def _watch_specs(root: Path) -> dict[str, tuple[bool, frozenset[str] | None]]:
    """Directories to watch for ``root`` (from ``install_state.watch_paths``): each git dir
    for HEAD and packed-refs, its ``refs/heads`` (a pull on a branch moves only the branch
    ref) and ``logs`` (HEAD's reflog: every move), and ``custom_nodes/`` (+ ``.disabled/``)."""
    specs: dict[str, tuple[bool, frozenset[str] | None]] = {}
    heads = frozenset({"HEAD", "packed-refs"})
    for path in watch_paths(root):
        if path.name == "HEAD":
            gitdir = path.parent
            specs[str(gitdir)] = (False, heads)
            specs[str(gitdir / "refs" / "heads")] = (True, None)
            specs[str(gitdir / "logs")] = (False, frozenset({"HEAD"}))
        elif path.name in ("heads", "packed-refs"):
            continue  # covered by their git dir above
        else:
            specs[str(path)] = (False, None)
    return specs


def _matches(specs: Mapping[str, tuple[bool, frozenset[str] | None]], path: str) -> bool:
    name = os.path.basename(path)
    if not name or name.endswith(".lock") or name == "__pycache__" or name.endswith(".pyc"):
        return False
    parent = os.path.dirname(path)
    spec = specs.get(parent)
    if spec is not None and (spec[1] is None or name in spec[1]):
        return True
    for directory, (recursive, _names) in specs.items():
        if recursive and path.startswith(directory + os.sep):
            return True
    return False


def _event_filter() -> list[type]:
    """Changes only: reads (our own captures open these files) must not count."""
    from watchdog.events import (
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileModifiedEvent,
        FileMovedEvent,
    )

    return [
        FileCreatedEvent,
        FileDeletedEvent,
        FileModifiedEvent,
        FileMovedEvent,
        FileClosedEvent,
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
    ]


class _ChangeHandler:
    """watchdog calls ``dispatch``; we only pass the paths on."""

    def __init__(self, tracker: InstallStateTracker) -> None:
        self._tracker = tracker

    def dispatch(self, event: Any) -> None:
        paths = [os.fsdecode(event.src_path)]
        dest = getattr(event, "dest_path", "")
        if dest:
            paths.append(os.fsdecode(dest))
        self._tracker.on_path_event(paths)
