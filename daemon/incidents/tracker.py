"""Turn OOM observations from several sources into incidents, and say when to write a snapshot.

One ComfyUI failure is reported several times: the log has the ``!!! Exception during
processing !!!`` line, the traceback and ``Got an OOM, unloading all loaded models.``; the API
sends an ``execution_error``; a kill shows up as a process exit and as kernel evidence. A queue
of prompts that all run out of memory is a *storm* of such failures. Users want one snapshot
and one alert per problem, with the best evidence each source had, so this module decides:

* **merge** -- an observation belongs to the incident's current failure when it arrives within
  ``merge_window_s`` of that failure's first record and either carries the same ``prompt_id``
  (or ``pid``) as the failure, or, with no ids to compare, is not a source repeating a record it
  already sent after a pause of ``repeat_gap_s`` (that is the next failure). The most specific evidence wins per
  field: node and exception type from the API, numbers and message from the log, killer and
  victim from the kernel.
* **storm** -- a repeat of the *same* failure (same instance, pool family, node type and
  exception type, and the same workflow fingerprint when known) within ``storm_window_s`` of
  the previous one grows the open incident's ``count``; no new snapshot. A different node or
  workflow is a failure of its own: its own incident and snapshot, even inside the window. A
  field one side does not know (a log record names no workflow) never tells two failures apart.
  ``gpu`` and ``gpu-fragmentation`` are one family: which of the two a failure reads as depends
  on the allocator's state at that instant, not on a different problem.
* **records** -- every observation that carries a ``record_id`` (a log record) is reported once,
  in the ``records`` of the first ``WriteSnapshot``/``UpdateIncident`` after it joined, with the
  failure number it counts towards. The caller persists them with the row, so a restart knows
  which records are already counted and ``resume`` can carry an open storm on.
* **soft OOMs** (``OomEvent.recovered``: tiled-VAE retries and the like) are counted per
  instance and never open an incident.
* **when to write** -- a snapshot is written once per incident and never rewritten. It is due
  at once when every source expected to report this kind of failure on this instance has
  reported (by default only the observing source is expected), otherwise ``settle_s`` later, so
  the API's node and the log's numbers land in the same snapshot. Later merges and storm
  repeats only update the store row.

It is a pure state machine: the caller passes the clock value (``now``, wall-clock seconds)
into ``observe``/``tick`` and executes the returned actions. ``Observation.at_s`` is the
event's own time (a log line's timestamp, the API message's ``timestamp``) where known, else
the time it was read; the merge and storm windows compare those, while settle deadlines and
closing use ``now``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from oom_sentinel.daemon.classify.events import MERGED_FIELDS, Backend, OomEvent, Pool, unknown
from oom_sentinel.daemon.core.units import format_bytes

if TYPE_CHECKING:
    from oom_sentinel.config.settings import IncidentSettings

__all__ = [
    "Action",
    "CloseIncident",
    "CountSoftOom",
    "FoldedRecord",
    "Incident",
    "IncidentTracker",
    "Observation",
    "Source",
    "TrackerConfig",
    "UpdateIncident",
    "WriteSnapshot",
    "expected_sources",
    "incident_fingerprint",
    "merge_events",
    "pool_family",
    "storm_key",
    "summarize",
    "workflow_fingerprint",
]


class Source(StrEnum):
    LOG = "log"
    API = "api"
    PROCESS = "process"
    KERNEL = "kernel"


@dataclass(frozen=True, slots=True)
class Observation:
    """One source's report of one OOM record."""

    instance: str
    #: "log", "api", "process" or "kernel" (see ``Source``)
    source: str
    event: OomEvent
    #: the event's own time in epoch seconds where known, else when it was read
    at_s: float
    #: small JSON-ready facts the source had (``prompt_id``, ``pid``, ``path``, ``line_no``...).
    #: ``prompt_id`` and ``pid`` also tell failures apart.
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    merge_window_s: float = 10.0
    storm_window_s: float = 300.0
    settle_s: float = 1.0
    #: a source sending a record it already sent for this failure, this long after the
    #: failure's last record, starts the next failure (one failure's records come within ms)
    repeat_gap_s: float = 0.5
    #: observations kept per incident (those of its first failure); a storm stays bounded
    max_observations: int = 32

    @classmethod
    def from_settings(cls, incidents: IncidentSettings) -> TrackerConfig:
        """From ``Settings.incidents`` (``merge_window_s``, ``storm_window_s``, ``settle_ms``)."""
        return cls(
            merge_window_s=float(incidents.merge_window_s),
            storm_window_s=float(incidents.storm_window_s),
            settle_s=float(incidents.settle_ms) / 1000.0,
        )


@dataclass(frozen=True, slots=True)
class Incident:
    """An incident as the snapshot writer and the store see it at one moment."""

    id: str
    instance: str
    #: the merged event of the first failure (most specific evidence per field)
    event: OomEvent
    #: the first failure's observations, in arrival order (what the snapshot describes)
    observations: tuple[Observation, ...]
    first_seen_s: float
    last_seen_s: float
    #: failures grouped into this incident (1 + storm repeats)
    count: int
    #: every source that reported any of its failures, sorted
    sources: tuple[str, ...]
    fingerprint: str
    summary: str
    #: whether a WriteSnapshot for it has been emitted (or it was resumed from the store)
    snapshot_written: bool
    #: the workflow fingerprint of its first failure, when a source knew it (API prompts)
    workflow_fingerprint: str | None = None

    @property
    def pool(self) -> Pool:
        return self.event.pool

    @property
    def backend(self) -> Backend:
        return self.event.backend

    @property
    def node_type(self) -> str | None:
        return self.event.node_type

    @property
    def exception_type(self) -> str | None:
        return self.event.exception_type


@dataclass(frozen=True, slots=True)
class FoldedRecord:
    """One source record counted into an incident (what makes a re-read after a restart a no-op)."""

    record_id: str
    #: the failure it belongs to: 1 for the first, ``count`` for the latest storm repeat
    failure: int
    source: str
    #: the record's kind within its source (``_record_key``); a repeat of a kind starts a failure
    rule: str
    at_s: float
    prompt_id: str | None = None


@dataclass(frozen=True, slots=True)
class WriteSnapshot:
    """Write this incident's snapshot now, then insert its store row and ``records``."""

    incident: Incident
    #: every record folded into the incident so far
    records: tuple[FoldedRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class UpdateIncident:
    """The incident changed after its snapshot (count, sources, or records that joined it):
    update the store row and add ``records`` (those folded since the last action)."""

    incident: Incident
    records: tuple[FoldedRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class CloseIncident:
    """Nothing more will join this incident (its storm window passed); final state."""

    incident: Incident


@dataclass(frozen=True, slots=True)
class CountSoftOom:
    """A recovered (soft) OOM on ``instance``; ``count`` is its running total since start."""

    instance: str
    count: int
    observation: Observation


Action = WriteSnapshot | UpdateIncident | CloseIncident | CountSoftOom


# --- pure helpers -----------------------------------------------------------------------------

_FAMILY = {
    Pool.GPU: "gpu",
    Pool.GPU_FRAGMENTATION: "gpu",
    Pool.RAM: "ram",
    Pool.SWAP_PAGEFILE: "swap-pagefile",
    Pool.UNIFIED_MPS: "unified-mps",
    Pool.KILLED_BY_OS: "killed-by-os",
}


def pool_family(pool: Pool) -> str:
    """Pools that are one problem for grouping: gpu and gpu-fragmentation are one family."""
    return _FAMILY.get(pool, str(pool))


def expected_sources(event: OomEvent, available: Iterable[str]) -> frozenset[str]:
    """Which of the instance's available sources will report a failure like ``event``.

    A Python-level OOM shows in the log and the API (the process lives on); a kill by the
    OS shows as a process exit and kernel evidence (the log and the API just go quiet).
    """
    if event.pool is Pool.KILLED_BY_OS:
        reporters = {Source.PROCESS.value, Source.KERNEL.value}
    else:
        reporters = {Source.LOG.value, Source.API.value}
    return frozenset(reporters & set(available))


# Per-field source preference: "the more specific evidence wins".
_NUMBERS_FIRST = ("log", "api", "kernel", "process")
_NODE_FIRST = ("api", "log", "process", "kernel")
_KILL_FIRST = ("kernel", "process", "log", "api")
_FIELD_ORDER: dict[str, tuple[str, ...]] = {
    "node_type": _NODE_FIRST,
    "node_id": _NODE_FIRST,
    "exception_type": _NODE_FIRST,
    "killer": _KILL_FIRST,
    "killed_pid": _KILL_FIRST,
}
#: what counts as "more numbers" when two records of one source compete: every fact but the
#: backend and the message (events.MERGED_FIELDS, derived from OomEvent)
_INFO_FIELDS = tuple(name for name in MERGED_FIELDS if name not in ("backend", "message"))


def _info(event: OomEvent) -> int:
    return sum(not unknown(getattr(event, name)) for name in _INFO_FIELDS)


def _rank(order: tuple[str, ...], source: str) -> int:
    return order.index(source) if source in order else len(order)


def merge_events(observations: Iterable[Observation]) -> OomEvent:
    """One event from one failure's observations: per field, the most specific source wins.

    Within a source the record with more numbers wins (the traceback over ``Got an OOM``),
    then the earlier one.
    """
    obs = list(observations)
    if not obs:
        raise ValueError("merge_events needs at least one observation")
    indexed = list(enumerate(obs))

    def ordered(order: tuple[str, ...]) -> list[Observation]:
        return [
            o
            for _, o in sorted(
                indexed, key=lambda p: (_rank(order, p[1].source), -_info(p[1].event), p[0])
            )
        ]

    by_order: dict[tuple[str, ...], list[Observation]] = {}
    values: dict[str, Any] = {}
    for name in MERGED_FIELDS:
        order = _FIELD_ORDER.get(name, _NUMBERS_FIRST)
        candidates = by_order.setdefault(order, ordered(order))
        for o in candidates:
            value = getattr(o.event, name)
            if not unknown(value):
                values[name] = value
                break
    primary = ordered(_NUMBERS_FIRST)[0].event
    pools = [o.event.pool for o in obs]
    pool = Pool.GPU_FRAGMENTATION if Pool.GPU_FRAGMENTATION in pools else primary.pool
    extra: dict[str, Any] = {}
    for o in ordered(_NUMBERS_FIRST):
        for key, value in o.event.extra:
            extra.setdefault(key, value)
    return replace(
        primary,
        pool=pool,
        recovered=False,
        other_process_named=any(o.event.other_process_named for o in obs),
        extra=tuple(extra.items()),
        **values,
    )


def incident_fingerprint(instance: str, event: OomEvent) -> str:
    """Groups "the same failure" across incidents and restarts: instance, pool family,
    exception type and node type (never numbers, which vary run to run)."""
    key = "\0".join(
        [instance, pool_family(event.pool), event.exception_type or "", event.node_type or ""]
    )
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:16]


_POOL_PHRASE = {
    Pool.GPU: "GPU out of memory",
    Pool.GPU_FRAGMENTATION: "GPU out of memory (fragmented)",
    Pool.RAM: "System RAM exhausted",
    Pool.SWAP_PAGEFILE: "Paging file / commit limit exhausted",
    Pool.UNIFIED_MPS: "Apple unified memory (MPS) exhausted",
    Pool.KILLED_BY_OS: "Killed by the OS for lack of memory",
}


def summarize(instance: str, event: OomEvent) -> str:
    """One line for lists and alerts: what ran out, where, and the key numbers."""
    text = _POOL_PHRASE.get(event.pool, f"{event.pool} out of memory")
    if event.pool is Pool.KILLED_BY_OS and event.killer:
        text = f"Killed by {event.killer} for lack of memory"
    if event.node_type:
        node = f" (node {event.node_id})" if event.node_id else ""
        text += f" in {event.node_type}{node}"
    text += f" on {instance}"
    details: list[str] = []
    if event.requested_bytes is not None:
        details.append(f"tried to allocate {format_bytes(event.requested_bytes)}")
    if event.free_bytes is not None and event.total_bytes is not None:
        details.append(
            f"{format_bytes(event.free_bytes)} free of {format_bytes(event.total_bytes)}"
        )
    elif event.total_bytes is not None:
        details.append(f"capacity {format_bytes(event.total_bytes)}")
    if event.pool is Pool.GPU_FRAGMENTATION and event.reserved_unallocated_bytes is not None:
        details.append(f"{format_bytes(event.reserved_unallocated_bytes)} reserved but unallocated")
    if event.killed_pid is not None:
        details.append(f"pid {event.killed_pid}")
    if details:
        text += ": " + ", ".join(details)
    return text


def workflow_fingerprint(obs: Observation) -> str | None:
    """The workflow fingerprint a source attached to an observation (``evidence``), if any."""
    value = obs.evidence.get("workflow_fingerprint") if isinstance(obs.evidence, Mapping) else None
    return value if isinstance(value, str) and value else None


def storm_key(
    instance: str, event: OomEvent, workflow: str | None
) -> tuple[str, str, str | None, str | None, str | None]:
    """What makes two failures "the same failure" for a storm; ``None`` parts are unknown."""
    return (instance, pool_family(event.pool), event.node_type, event.exception_type, workflow)


def _compatible(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Same instance and family, and no part both sides know differs."""
    return a[:2] == b[:2] and all(
        x is None or y is None or x == y for x, y in zip(a[2:], b[2:], strict=True)
    )


def _default_id() -> str:
    return uuid.uuid4().hex[:16]


# --- the state machine ------------------------------------------------------------------------


@dataclass(slots=True)
class _Failure:
    started_s: float
    last_s: float
    seen: set[tuple[str, str]] = field(default_factory=set)
    prompt_id: str | None = None
    pid: int | None = None


@dataclass(slots=True)
class _Open:
    id: str
    instance: str
    family: str
    workflow: str | None
    observations: list[Observation]
    event: OomEvent
    first_seen_s: float
    last_seen_s: float
    count: int
    sources: set[str]
    failure: _Failure
    touched_now_s: float
    written: bool = False
    due_s: float | None = None
    #: records folded in and not yet handed out in an action
    records: list[FoldedRecord] = field(default_factory=list)

    def key(self) -> tuple[str, str, str | None, str | None, str | None]:
        return storm_key(self.instance, self.event, self.workflow)


def _record_key(obs: Observation) -> tuple[str, str]:
    event = obs.event
    return (obs.source, event.rule or event.exception_type or event.message[:80])


def _ids(obs: Observation) -> tuple[str | None, int | None]:
    prompt_id = obs.evidence.get("prompt_id") if isinstance(obs.evidence, Mapping) else None
    pid = obs.evidence.get("pid") if isinstance(obs.evidence, Mapping) else None
    if pid is None:
        pid = obs.event.killed_pid
    return (
        str(prompt_id) if prompt_id not in (None, "") else None,
        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
    )


class IncidentTracker:
    """Pure incident state machine; see the module docstring for the rules.

    Call ``observe`` (or ``observe_many`` for a batch read at once) with each observation and
    the current wall-clock time, call ``tick`` at ``next_deadline()`` (or every loop), and
    execute the returned actions in order. Within one call, actions are coalesced: at most one
    ``WriteSnapshot`` or ``UpdateIncident`` per incident, carrying its final state.
    """

    def __init__(
        self, config: TrackerConfig | None = None, *, new_id: Callable[[], str] = _default_id
    ) -> None:
        self.config = config or TrackerConfig()
        self._new_id = new_id
        #: open incidents by id, in opening order
        self._open: dict[str, _Open] = {}
        self._available: dict[str, frozenset[str]] = {}
        self._soft: dict[str, int] = {}

    # -- inputs ------------------------------------------------------------------------------
    def set_available_sources(self, instance: str, sources: Iterable[str]) -> None:
        """Which sources currently watch ``instance`` (e.g. {"log", "api"} while its websocket
        is connected). A pending snapshot waits only for these; unknown instance: none."""
        self._available[instance] = frozenset(str(s) for s in sources)

    def observe(self, obs: Observation, now: float) -> list[Action]:
        return self.observe_many([obs], now)

    def observe_many(self, observations: Iterable[Observation], now: float) -> list[Action]:
        """Feed several observations read together; their merges land in one snapshot."""
        actions: list[Action] = []
        dirty: list[str] = []
        for obs in observations:
            self._observe(obs, now, actions, dirty)
        return self._flush(now, actions, dirty)

    def tick(self, now: float) -> list[Action]:
        """Emit snapshots whose settle time has come and close incidents gone quiet."""
        return self._flush(now, [], [])

    def resume(
        self,
        incident: Incident,
        now: float,
        *,
        last_failure: Iterable[FoldedRecord] = (),
    ) -> None:
        """Re-admit an incident from the store after a restart so a storm that goes on joins
        it instead of opening a second snapshot. It counts as written.

        ``last_failure``: the stored records of its latest failure, so a record of that
        failure read after the restart (ComfyUI's second log call) joins it, and the next
        repeat of a kind it already had counts as the next failure."""
        records = [r for r in last_failure if r.failure == incident.count]
        failure = _Failure(started_s=incident.last_seen_s, last_s=incident.last_seen_s)
        if records:
            failure = _Failure(
                started_s=min(r.at_s for r in records),
                last_s=max(r.at_s for r in records),
                seen={(r.source, r.rule) for r in records},
                prompt_id=next((r.prompt_id for r in records if r.prompt_id), None),
            )
        self._open[incident.id] = _Open(
            id=incident.id,
            instance=incident.instance,
            family=pool_family(incident.pool),
            workflow=incident.workflow_fingerprint,
            observations=list(incident.observations),
            event=incident.event,
            first_seen_s=incident.first_seen_s,
            last_seen_s=incident.last_seen_s,
            count=incident.count,
            sources=set(incident.sources),
            failure=failure,
            touched_now_s=now,
            written=True,
        )

    # -- queries -----------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """The earliest ``now`` at which ``tick`` has something to do (None: nothing open)."""
        times: list[float] = []
        for inc in self._open.values():
            if not inc.written and inc.due_s is not None:
                times.append(inc.due_s)
            times.append(inc.touched_now_s + self.config.storm_window_s)
        return min(times) if times else None

    def current(self, incident_id: str) -> Incident | None:
        inc = self._open.get(incident_id)
        return self._freeze(inc) if inc is not None else None

    def open_incidents(self) -> tuple[Incident, ...]:
        return tuple(self._freeze(inc) for inc in self._open.values())

    def soft_oom_count(self, instance: str) -> int:
        return self._soft.get(instance, 0)

    # -- internals ---------------------------------------------------------------------------
    def _observe(
        self, obs: Observation, now: float, actions: list[Action], dirty: list[str]
    ) -> None:
        if obs.event.recovered:
            self._soft[obs.instance] = self._soft.get(obs.instance, 0) + 1
            actions.append(CountSoftOom(obs.instance, self._soft[obs.instance], obs))
            return
        cfg = self.config
        family = pool_family(obs.event.pool)
        key = storm_key(obs.instance, obs.event, workflow_fingerprint(obs))
        same_family = [inc for inc in self._open.values() if (inc.instance, inc.family) == key[:2]]
        for inc in same_family:
            if abs(obs.at_s - inc.last_seen_s) > cfg.storm_window_s and _compatible(inc.key(), key):
                # A new failure long after the last one (e.g. catching up on an old log):
                # close the open incident, first writing its snapshot if it was still pending.
                self._close_now(inc, actions, dirty)
        live = [inc for inc in same_family if inc.id in self._open]
        # One failure's records: the incident whose latest failure this record continues
        # (newest failure first; one instance runs one prompt at a time).
        target: _Open | None = None
        joined = False
        for inc in sorted(live, key=lambda i: i.failure.started_s, reverse=True):
            if self._same_failure(inc.failure, obs):
                target, joined = inc, True
                break
        if target is None:
            # A repeat of the same failure: the most specific compatible open incident.
            fits = [inc for inc in live if _compatible(inc.key(), key)]
            if fits:
                target = max(fits, key=lambda i: (_specificity(i.key(), key), i.last_seen_s))
        if target is None:
            inc = self._start(obs, family, now)
            self._open[inc.id] = inc
            self._fold(inc, obs)
            return
        inc = target
        inc.touched_now_s = now
        inc.first_seen_s = min(inc.first_seen_s, obs.at_s)
        inc.last_seen_s = max(inc.last_seen_s, obs.at_s)
        before = (inc.count, len(inc.sources))
        inc.sources.add(obs.source)
        if joined:
            self._join_failure(inc, obs)
        else:
            inc.count += 1
            prompt_id, pid = _ids(obs)
            inc.failure = _Failure(
                started_s=obs.at_s,
                last_s=obs.at_s,
                seen={_record_key(obs)},
                prompt_id=prompt_id,
                pid=pid,
            )
        folded = self._fold(inc, obs)
        changed = (inc.count, len(inc.sources)) != before or folded
        if inc.written and changed and inc.id not in dirty:
            dirty.append(inc.id)

    def _close_now(self, inc: _Open, actions: list[Action], dirty: list[str]) -> None:
        if not inc.written:
            inc.written = True
            actions.append(WriteSnapshot(self._freeze(inc), self._take_records(inc)))
        elif inc.id in dirty or inc.records:
            actions.append(UpdateIncident(self._freeze(inc), self._take_records(inc)))
        if inc.id in dirty:
            dirty.remove(inc.id)
        actions.append(CloseIncident(self._freeze(inc)))
        del self._open[inc.id]

    def _fold(self, inc: _Open, obs: Observation) -> bool:
        """Note the record ``obs`` came from as counted in ``inc``; False if it has none."""
        rid = obs.evidence.get("record_id") if isinstance(obs.evidence, Mapping) else None
        if not isinstance(rid, str):
            return False
        source, rule = _record_key(obs)
        inc.records.append(FoldedRecord(rid, inc.count, source, rule, obs.at_s, _ids(obs)[0]))
        return True

    @staticmethod
    def _take_records(inc: _Open) -> tuple[FoldedRecord, ...]:
        records = tuple(inc.records)
        inc.records.clear()
        return records

    def _start(self, obs: Observation, family: str, now: float) -> _Open:
        prompt_id, pid = _ids(obs)
        inc = _Open(
            id=self._new_id(),
            instance=obs.instance,
            family=family,
            workflow=workflow_fingerprint(obs),
            observations=[obs],
            event=merge_events([obs]),
            first_seen_s=obs.at_s,
            last_seen_s=obs.at_s,
            count=1,
            sources={obs.source},
            failure=_Failure(
                started_s=obs.at_s,
                last_s=obs.at_s,
                seen={_record_key(obs)},
                prompt_id=prompt_id,
                pid=pid,
            ),
            touched_now_s=now,
        )
        inc.due_s = now if self._all_expected_seen(inc) else now + self.config.settle_s
        return inc

    def _same_failure(self, failure: _Failure, obs: Observation) -> bool:
        cfg = self.config
        if abs(obs.at_s - failure.started_s) > cfg.merge_window_s:
            return False
        prompt_id, pid = _ids(obs)
        # One prompt fails once and one process dies once: ids decide when both sides have one.
        if prompt_id and failure.prompt_id:
            return prompt_id == failure.prompt_id
        if pid is not None and failure.pid is not None:
            return pid == failure.pid
        return not (
            _record_key(obs) in failure.seen and abs(obs.at_s - failure.last_s) > cfg.repeat_gap_s
        )

    def _join_failure(self, inc: _Open, obs: Observation) -> None:
        failure = inc.failure
        failure.seen.add(_record_key(obs))
        failure.last_s = max(failure.last_s, obs.at_s)
        prompt_id, pid = _ids(obs)
        failure.prompt_id = failure.prompt_id or prompt_id
        failure.pid = failure.pid if failure.pid is not None else pid
        # Only the first failure is described by the snapshot, and only until it is written.
        if (
            inc.count == 1
            and not inc.written
            and len(inc.observations) < self.config.max_observations
        ):
            inc.observations.append(obs)
            inc.event = merge_events(inc.observations)
            inc.workflow = inc.workflow or workflow_fingerprint(obs)

    def _all_expected_seen(self, inc: _Open) -> bool:
        expected = expected_sources(inc.event, self._available.get(inc.instance, ()))
        return expected <= inc.sources

    def _flush(self, now: float, actions: list[Action], dirty: list[str]) -> list[Action]:
        writes: list[Action] = []
        updates: list[Action] = []
        closes: list[Action] = []
        for inc in list(self._open.values()):
            if not inc.written:
                if inc.due_s is not None and inc.due_s > now and self._all_expected_seen(inc):
                    inc.due_s = now  # the last expected source arrived, or one went away
                if inc.due_s is not None and inc.due_s <= now:
                    inc.written = True
                    writes.append(WriteSnapshot(self._freeze(inc), self._take_records(inc)))
                continue
            if inc.id in dirty or inc.records:
                updates.append(UpdateIncident(self._freeze(inc), self._take_records(inc)))
            if now - inc.touched_now_s > self.config.storm_window_s:
                closes.append(CloseIncident(self._freeze(inc)))
                del self._open[inc.id]
        return actions + writes + updates + closes

    def _freeze(self, inc: _Open) -> Incident:
        return Incident(
            id=inc.id,
            instance=inc.instance,
            event=inc.event,
            observations=tuple(inc.observations),
            first_seen_s=inc.first_seen_s,
            last_seen_s=inc.last_seen_s,
            count=inc.count,
            sources=tuple(sorted(inc.sources)),
            fingerprint=incident_fingerprint(inc.instance, inc.event),
            summary=summarize(inc.instance, inc.event),
            snapshot_written=inc.written,
            workflow_fingerprint=inc.workflow,
        )


def _specificity(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    """How many parts of two compatible keys are known on both sides (and so equal)."""
    return sum(x is not None and y is not None for x, y in zip(a[2:], b[2:], strict=True))
