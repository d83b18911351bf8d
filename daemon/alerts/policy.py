"""Decide which alerts go out, so that one problem is one message and a storm is not a flood.

The incident tracker already folds the repeats of one failure into one incident (one snapshot);
this module decides what people are *told*, with the semantics of Alertmanager and netdata that
operators already know:

* **group** -- failures are grouped by the incident fingerprint (instance, pool family,
  exception type, node type). The first incident of a group is alerted at once. Failures that
  follow -- storm repeats of that incident, or new incidents of the same group within
  ``repeat_interval_s`` -- are not sent one by one: they are counted, and one follow-up summary
  says how many, when the storm is over (no incident of the group still open) and at least
  ``group_window_s`` after the previous message. A storm that goes on is reminded of at most
  every ``repeat_interval_s`` (Alertmanager's ``repeat_interval``).
* **rate limit** -- at most ``max_per_hour`` messages in any hour, over all groups. What the
  limit holds back is not lost: one "held back" summary lists it when a slot frees.
* **soft OOMs** -- recovered OOMs (ComfyUI retried with tiling and went on) never alert by
  default. When ``soft_oom_warning_count`` of them land on one instance within
  ``soft_oom_warning_window_s``, one early warning goes out; it re-arms when the rate falls
  below half the threshold (hysteresis, as netdata's ``delay``) or after ``repeat_interval_s``.
  ``send_recovered`` alerts each one too, grouped like incidents.

It is pure: every input carries the clock value (``now``, wall-clock seconds) and the outputs
are ``Intent`` records that ``alert_format`` turns into text and ``alert_outbox`` delivers.
The state survives a restart through ``to_state()`` / ``AlertPolicy(state=...)`` (plain JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oom_sentinel.config.settings import AlertSettings
    from oom_sentinel.daemon.incidents.snapshot import SnapshotRef
    from oom_sentinel.daemon.incidents.tracker import Incident

__all__ = [
    "Alert",
    "AlertKind",
    "AlertPolicy",
    "HeldBackSummary",
    "IncidentAlert",
    "IncidentFacts",
    "Intent",
    "PolicyConfig",
    "Severity",
    "SoftOomAlert",
    "SoftOomWarning",
    "StormSummary",
]

HOUR_S = 3600.0
#: samples of held-back alerts kept for the summary (the count is exact)
_HELD_SAMPLES = 10
#: soft-OOM times kept per instance (bounded whatever the window)
_SOFT_TIMES_MAX = 10_000


class AlertKind(StrEnum):
    INCIDENT = "incident"
    STORM_SUMMARY = "storm-summary"
    SOFT_OOM = "soft-oom"
    SOFT_OOM_WARNING = "soft-oom-warning"
    HELD_BACK = "held-back"
    TEST = "test"
    #: the follow-up when oom-bisect attached its answer to a snapshot (bisect_results.py)
    BISECT_RESULT = "bisect-result"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    group_window_s: float = 300.0
    repeat_interval_s: float = 14400.0
    #: 0: no limit
    max_per_hour: int = 20
    #: 0: never warn
    soft_oom_warning_count: int = 5
    soft_oom_warning_window_s: float = 600.0
    send_recovered: bool = False

    @classmethod
    def from_settings(cls, alerts: AlertSettings) -> PolicyConfig:
        return cls(
            group_window_s=float(alerts.group_window_s),
            repeat_interval_s=float(alerts.repeat_interval_s),
            max_per_hour=int(alerts.max_per_hour),
            soft_oom_warning_count=int(alerts.soft_oom_warning_count),
            soft_oom_warning_window_s=float(alerts.soft_oom_warning_window_s),
            send_recovered=bool(alerts.send_recovered),
        )


# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IncidentFacts:
    """What the policy needs of an incident (and what a summary names)."""

    incident_id: str
    #: the grouping key: the incident's fingerprint
    group: str
    instance: str
    pool: str
    #: failures in the incident so far (1 + storm repeats)
    count: int
    first_seen_s: float
    last_seen_s: float
    summary: str
    snapshot_id: str | None = None
    snapshot_path: str | None = None

    @classmethod
    def from_incident(cls, incident: Incident, ref: SnapshotRef | None = None) -> IncidentFacts:
        return cls(
            incident_id=incident.id,
            group=incident.fingerprint,
            instance=incident.instance,
            pool=str(incident.pool),
            count=incident.count,
            first_seen_s=incident.first_seen_s,
            last_seen_s=incident.last_seen_s,
            summary=incident.summary,
            snapshot_id=ref.id if ref is not None else None,
            snapshot_path=str(ref.path) if ref is not None else None,
        )


# --- outputs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IncidentAlert:
    """Tell about a new incident (its snapshot is written)."""

    key: str
    group: str
    facts: IncidentFacts
    #: failures of this group counted since the previous message and not yet told
    earlier_failures: int = 0


@dataclass(frozen=True, slots=True)
class StormSummary:
    """How many more failures of a group followed its last message."""

    key: str
    group: str
    instance: str
    pool: str
    #: failures not yet told (storm repeats and folded incidents)
    failures: int
    #: incidents (snapshots) among them
    incidents: int
    first_s: float
    last_s: float
    #: True: no incident of the group is open any more (the storm is over)
    ended: bool
    #: when the group's previous message went out
    previous_s: float | None
    #: the group's latest incident (its snapshot is the one to read)
    latest: IncidentFacts | None
    #: a group of recovered (soft) OOMs rather than incidents
    soft: bool = False


@dataclass(frozen=True, slots=True)
class SoftOomWarning:
    """Recovered OOMs are becoming frequent on one instance: the next may not recover."""

    key: str
    instance: str
    count: int
    window_s: float
    first_s: float
    last_s: float


@dataclass(frozen=True, slots=True)
class SoftOomAlert:
    """One recovered OOM (only with ``send_recovered``)."""

    key: str
    group: str
    instance: str
    at_s: float
    message: str
    node_type: str | None = None


@dataclass(frozen=True, slots=True)
class HeldBackSummary:
    """What the hourly rate limit held back."""

    key: str
    count: int
    #: one line per held-back message (the first few)
    samples: tuple[str, ...]
    first_s: float
    last_s: float
    max_per_hour: int


Intent = IncidentAlert | StormSummary | SoftOomWarning | SoftOomAlert | HeldBackSummary


@dataclass(frozen=True, slots=True)
class Alert:
    """One rendered message, as the outbox stores it and every channel sends it.

    ``key`` is unique per message: the outbox delivers each (key, channel) once.
    """

    key: str
    kind: str
    severity: str
    title: str
    body: str
    created_s: float
    group: str = ""
    instance: str | None = None
    pool: str | None = None
    snapshot_id: str | None = None
    snapshot_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Alert:
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        return cls(**known)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False)


# --- the policy -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Group:
    instance: str
    pool: str
    soft: bool = False
    last_sent_s: float | None = None
    pending_failures: int = 0
    pending_incidents: int = 0
    pending_first_s: float | None = None
    pending_last_s: float | None = None
    latest: IncidentFacts | None = None
    #: open incidents of the group -> failures already accounted for
    open: dict[str, int] = field(default_factory=dict)

    def add_pending(self, failures: int, first_s: float, last_s: float) -> None:
        if failures <= 0:
            return
        self.pending_failures += failures
        self.pending_first_s = (
            first_s if self.pending_first_s is None else min(self.pending_first_s, first_s)
        )
        self.pending_last_s = (
            last_s if self.pending_last_s is None else max(self.pending_last_s, last_s)
        )

    def clear_pending(self) -> None:
        self.pending_failures = 0
        self.pending_incidents = 0
        self.pending_first_s = None
        self.pending_last_s = None


@dataclass(slots=True)
class _Soft:
    times: list[float] = field(default_factory=list)
    armed: bool = True
    warned_s: float | None = None


@dataclass(slots=True)
class _Held:
    count: int = 0
    samples: list[str] = field(default_factory=list)
    first_s: float | None = None
    last_s: float | None = None


def _facts_from_json(data: Any) -> IncidentFacts | None:
    if not isinstance(data, Mapping):
        return None
    try:
        return IncidentFacts(**{f: data[f] for f in IncidentFacts.__dataclass_fields__})
    except (KeyError, TypeError):
        return None


class AlertPolicy:
    """The grouping, rate-limit and early-warning state machine (see the module docstring).

    Feed it ``on_incident_written`` / ``on_incident_updated`` / ``on_incident_closed`` /
    ``on_soft_oom`` as the tracker's actions arrive, call ``tick(now)`` every loop, and send
    what they return, in order.
    """

    def __init__(self, config: PolicyConfig | None = None, state: Mapping[str, Any] | None = None):
        self.config = config or PolicyConfig()
        self._groups: dict[str, _Group] = {}
        self._soft: dict[str, _Soft] = {}
        self._sent: list[float] = []
        self._held = _Held()
        self._seq = 0
        if state:
            self._restore(state)

    # -- inputs ------------------------------------------------------------------------------
    def on_incident_written(self, facts: IncidentFacts, now: float) -> list[Intent]:
        """A new incident's snapshot is on disk: alert it, or fold it into its group."""
        group = self._group(facts.group, facts.instance, facts.pool)
        group.latest = facts
        if facts.incident_id in group.open:  # told already (a repeated call after a restart)
            return self.tick(now)
        group.open[facts.incident_id] = facts.count
        out: list[Intent] = []
        if group.last_sent_s is None or now - group.last_sent_s >= self.config.repeat_interval_s:
            earlier = group.pending_failures
            group.clear_pending()
            group.last_sent_s = now
            self._emit(
                IncidentAlert(
                    key=f"incident:{facts.incident_id}",
                    group=facts.group,
                    facts=facts,
                    earlier_failures=earlier,
                ),
                now,
                out,
            )
        else:
            group.add_pending(facts.count, facts.first_seen_s, facts.last_seen_s)
            group.pending_incidents += 1
        return out + self.tick(now)

    def on_incident_updated(self, facts: IncidentFacts, now: float) -> list[Intent]:
        """More failures joined an incident after its snapshot (a storm)."""
        group = self._group(facts.group, facts.instance, facts.pool)
        group.latest = facts if group.latest is None else _newer(group.latest, facts)
        told = group.open.get(facts.incident_id)
        if told is None:  # resumed after a restart: what it had was accounted before
            group.open[facts.incident_id] = facts.count
        elif facts.count > told:
            group.add_pending(facts.count - told, facts.last_seen_s, facts.last_seen_s)
            group.open[facts.incident_id] = facts.count
        return self.tick(now)

    def on_incident_closed(self, facts: IncidentFacts, now: float) -> list[Intent]:
        """Nothing more will join the incident (its storm window passed)."""
        self.on_incident_updated(facts, now)
        group = self._groups.get(facts.group)
        if group is not None:
            group.open.pop(facts.incident_id, None)
        return self.tick(now)

    def on_soft_oom(
        self,
        instance: str,
        at_s: float,
        now: float,
        *,
        message: str = "",
        node_type: str | None = None,
    ) -> list[Intent]:
        """A recovered OOM on ``instance`` at ``at_s`` (its own time)."""
        cfg = self.config
        out: list[Intent] = []
        soft = self._soft.setdefault(instance, _Soft())
        soft.times.append(at_s)
        if len(soft.times) > _SOFT_TIMES_MAX:
            del soft.times[: len(soft.times) - _SOFT_TIMES_MAX]
        if cfg.send_recovered:
            key = f"soft:{instance}"
            group = self._group(key, instance, "soft", soft=True)
            if group.last_sent_s is None or now - group.last_sent_s >= cfg.repeat_interval_s:
                group.clear_pending()
                group.last_sent_s = now
                self._seq += 1
                self._emit(
                    SoftOomAlert(
                        key=f"soft-oom:{instance}:{at_s:.3f}:{self._seq}",
                        group=key,
                        instance=instance,
                        at_s=at_s,
                        message=message,
                        node_type=node_type,
                    ),
                    now,
                    out,
                )
            else:
                group.add_pending(1, at_s, at_s)
        return out + self.tick(now)

    # -- time --------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Intent]:
        """Summaries and warnings that are due now, and housekeeping."""
        cfg = self.config
        out: list[Intent] = []
        self._prune_sent(now)
        if self._held.count and self._allowed():
            held = self._held
            self._held = _Held()
            self._seq += 1
            self._record_sent(now)
            out.append(
                HeldBackSummary(
                    key=f"held-back:{now:.3f}:{self._seq}",
                    count=held.count,
                    samples=tuple(held.samples),
                    first_s=held.first_s if held.first_s is not None else now,
                    last_s=held.last_s if held.last_s is not None else now,
                    max_per_hour=cfg.max_per_hour,
                )
            )
        for key, group in list(self._groups.items()):
            if group.pending_failures > 0:
                since = None if group.last_sent_s is None else now - group.last_sent_s
                ended = not group.open
                due = (
                    since is None
                    or (ended and since >= cfg.group_window_s)
                    or since >= cfg.repeat_interval_s
                )
                if due:
                    self._seq += 1
                    summary = StormSummary(
                        key=f"summary:{key}:{now:.3f}:{self._seq}",
                        group=key,
                        instance=group.instance,
                        pool=group.pool,
                        failures=group.pending_failures,
                        incidents=group.pending_incidents,
                        first_s=group.pending_first_s if group.pending_first_s is not None else now,
                        last_s=group.pending_last_s if group.pending_last_s is not None else now,
                        ended=ended,
                        previous_s=group.last_sent_s,
                        latest=group.latest,
                        soft=group.soft,
                    )
                    group.clear_pending()
                    group.last_sent_s = now
                    self._emit(summary, now, out)
            elif (
                not group.open
                and group.last_sent_s is not None
                and now - group.last_sent_s >= cfg.repeat_interval_s
            ):
                del self._groups[key]  # nothing left to tell or to remember
        for instance, soft in list(self._soft.items()):
            self._check_soft(instance, soft, now, out)
            if not soft.times and soft.armed:
                del self._soft[instance]
        return out

    # -- state -------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Plain JSON to persist; ``AlertPolicy(config, state)`` resumes from it."""
        return {
            "version": 1,
            "seq": self._seq,
            "sent": list(self._sent),
            "held": {
                "count": self._held.count,
                "samples": list(self._held.samples),
                "first_s": self._held.first_s,
                "last_s": self._held.last_s,
            },
            "groups": {
                key: {
                    "instance": g.instance,
                    "pool": g.pool,
                    "soft": g.soft,
                    "last_sent_s": g.last_sent_s,
                    "pending_failures": g.pending_failures,
                    "pending_incidents": g.pending_incidents,
                    "pending_first_s": g.pending_first_s,
                    "pending_last_s": g.pending_last_s,
                    "latest": asdict(g.latest) if g.latest is not None else None,
                    "open": dict(g.open),
                }
                for key, g in self._groups.items()
            },
            "soft": {
                instance: {"times": list(s.times), "armed": s.armed, "warned_s": s.warned_s}
                for instance, s in self._soft.items()
            },
        }

    def pending_failures(self, group: str) -> int:
        g = self._groups.get(group)
        return g.pending_failures if g is not None else 0

    # -- internals ---------------------------------------------------------------------------
    def _group(self, key: str, instance: str, pool: str, *, soft: bool = False) -> _Group:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(instance=instance, pool=pool, soft=soft)
        return group

    def _allowed(self) -> bool:
        limit = self.config.max_per_hour
        return limit <= 0 or len(self._sent) < limit

    def _prune_sent(self, now: float) -> None:
        cutoff = now - HOUR_S
        self._sent = [t for t in self._sent if t > cutoff]

    def _record_sent(self, now: float) -> None:
        self._sent.append(now)

    def _emit(self, intent: Intent, now: float, out: list[Intent]) -> None:
        self._prune_sent(now)
        if self._allowed() and not self._held.count:
            self._record_sent(now)
            out.append(intent)
            return
        held = self._held
        held.count += 1
        held.first_s = now if held.first_s is None else held.first_s
        held.last_s = now
        if len(held.samples) < _HELD_SAMPLES:
            held.samples.append(_describe(intent))

    def _check_soft(self, instance: str, soft: _Soft, now: float, out: list[Intent]) -> None:
        cfg = self.config
        window = cfg.soft_oom_warning_window_s
        soft.times = [t for t in soft.times if t >= now - window]
        count = len(soft.times)
        threshold = cfg.soft_oom_warning_count
        if threshold <= 0:
            return
        if not soft.armed:
            rearm = count < max(1, threshold // 2) or (
                soft.warned_s is not None and now - soft.warned_s >= cfg.repeat_interval_s
            )
            if rearm:
                soft.armed = True
        if soft.armed and count >= threshold:
            soft.armed = False
            soft.warned_s = now
            self._seq += 1
            self._emit(
                SoftOomWarning(
                    key=f"soft-warning:{instance}:{now:.3f}:{self._seq}",
                    instance=instance,
                    count=count,
                    window_s=window,
                    first_s=min(soft.times),
                    last_s=max(soft.times),
                ),
                now,
                out,
            )

    def _restore(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != 1:
            return
        self._seq = int(state.get("seq", 0) or 0)
        self._sent = [float(t) for t in state.get("sent", []) if isinstance(t, int | float)]
        held = state.get("held") or {}
        if isinstance(held, Mapping):
            self._held = _Held(
                count=int(held.get("count", 0) or 0),
                samples=[str(s) for s in held.get("samples", [])][:_HELD_SAMPLES],
                first_s=held.get("first_s"),
                last_s=held.get("last_s"),
            )
        groups = state.get("groups") or {}
        if isinstance(groups, Mapping):
            for key, g in groups.items():
                if not isinstance(g, Mapping):
                    continue
                self._groups[str(key)] = _Group(
                    instance=str(g.get("instance", "")),
                    pool=str(g.get("pool", "")),
                    soft=bool(g.get("soft", False)),
                    last_sent_s=g.get("last_sent_s"),
                    pending_failures=int(g.get("pending_failures", 0) or 0),
                    pending_incidents=int(g.get("pending_incidents", 0) or 0),
                    pending_first_s=g.get("pending_first_s"),
                    pending_last_s=g.get("pending_last_s"),
                    latest=_facts_from_json(g.get("latest")),
                    open={str(k): int(v) for k, v in (g.get("open") or {}).items()},
                )
        soft = state.get("soft") or {}
        if isinstance(soft, Mapping):
            for instance, s in soft.items():
                if isinstance(s, Mapping):
                    self._soft[str(instance)] = _Soft(
                        times=[float(t) for t in s.get("times", [])][-_SOFT_TIMES_MAX:],
                        armed=bool(s.get("armed", True)),
                        warned_s=s.get("warned_s"),
                    )


def _newer(a: IncidentFacts, b: IncidentFacts) -> IncidentFacts:
    return b if b.last_seen_s >= a.last_seen_s else a


def _describe(intent: Intent) -> str:
    """One line for the held-back list."""
    if isinstance(intent, IncidentAlert):
        snap = f" (snapshot {intent.facts.snapshot_id})" if intent.facts.snapshot_id else ""
        return f"{intent.facts.summary}{snap}"
    if isinstance(intent, StormSummary):
        what = "recovered OOM(s)" if intent.soft else "more failure(s)"
        return f"{intent.failures} {what} of {intent.pool} on {intent.instance}"
    if isinstance(intent, SoftOomWarning):
        return f"{intent.count} recovered OOMs on {intent.instance} (early warning)"
    if isinstance(intent, SoftOomAlert):
        return f"recovered OOM on {intent.instance}"
    return f"{intent.count} held-back alert(s)"
