"""The words of an alert: what a person reading it on a phone needs to act, and nothing secret.

An incident alert names the instance and host, the pool and node, the key numbers in human
units (what was asked for, what was free, what PyTorch held, what else was on the GPU), the
snapshot id and path with the command that tells the whole story, the top advice and -- when
the snapshot's ``regression`` section says ``suspected: true`` -- the ``oom-bisect`` command
that finds the update that broke it. The snapshot document is the source (it is what the user
will open), read as its model (``snapshot_model.SnapshotDoc``): an optional section may be
absent; a snapshot that does not read makes an alert from the incident's facts alone.

Pure functions; every text passes through ``redact_text`` before it leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from oom_sentinel.daemon.alerts.policy import (
    Alert,
    AlertKind,
    HeldBackSummary,
    IncidentAlert,
    Intent,
    Severity,
    SoftOomAlert,
    SoftOomWarning,
    StormSummary,
)
from oom_sentinel.daemon.core.redact import redact_text
from oom_sentinel.daemon.core.units import format_bytes
from oom_sentinel.daemon.incidents.snapshot_model import (
    AdviceEntry,
    EventModel,
    MemorySection,
    RegressionSection,
    SnapshotDoc,
)

__all__ = ["render", "render_incident", "sample_alert"]

#: advice items shown in an alert (the snapshot has them all)
TOP_ADVICE = 2

_POOL_NAMES = {
    "gpu": "GPU out of memory",
    "gpu-fragmentation": "GPU out of memory (fragmentation)",
    "ram": "System RAM exhausted",
    "swap-pagefile": "Paging file exhausted",
    "unified-mps": "Apple unified memory exhausted",
    "killed-by-os": "Killed for lack of memory",
}


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _finish(
    *,
    key: str,
    kind: AlertKind,
    severity: Severity,
    title: str,
    lines: Sequence[str],
    now: float,
    group: str = "",
    instance: str | None = None,
    pool: str | None = None,
    snapshot_id: str | None = None,
    snapshot_path: str | None = None,
) -> Alert:
    return Alert(
        key=key,
        kind=str(kind),
        severity=str(severity),
        title=redact_text(title),
        body=redact_text("\n".join(line for line in lines if line is not None)),
        created_s=now,
        group=group,
        instance=instance,
        pool=pool,
        snapshot_id=snapshot_id,
        snapshot_path=snapshot_path,
    )


# --- incident ---------------------------------------------------------------------------------


def _numbers(event: EventModel) -> list[str]:
    parts: list[str] = []
    requested, free, total = event.requested_bytes, event.free_bytes, event.total_bytes
    if requested is not None:
        parts.append(f"tried to allocate {format_bytes(requested)}")
    if free is not None and total is not None:
        parts.append(f"{format_bytes(free)} free of {format_bytes(total)}")
    elif total is not None:
        parts.append(f"capacity {format_bytes(total)}")
    if event.allocated_bytes is not None:
        parts.append(f"{format_bytes(event.allocated_bytes)} allocated by PyTorch")
    if event.reserved_unallocated_bytes is not None:
        parts.append(f"{format_bytes(event.reserved_unallocated_bytes)} reserved but unallocated")
    if event.mps_max_allowed_bytes is not None:
        parts.append(f"MPS limit {format_bytes(event.mps_max_allowed_bytes)}")
    return parts


def _memory_lines(memory: MemorySection | None) -> list[str]:
    if memory is None:
        return []
    lines: list[str] = []
    for gpu in memory.gpus[:4]:
        if gpu.used_bytes is None and gpu.total_bytes is None:
            continue
        lines.append(
            f"GPU {gpu.index} ({gpu.name or 'GPU'}): {format_bytes(gpu.used_bytes)} used of "
            f"{format_bytes(gpu.total_bytes)}"
        )
    host = memory.host
    if host is not None and None not in (host.ram_available_bytes, host.ram_total_bytes):
        lines.append(
            f"RAM: {format_bytes(host.ram_available_bytes)} available of "
            f"{format_bytes(host.ram_total_bytes)}"
        )
    return lines


def _other_processes(doc: SnapshotDoc) -> str | None:
    procs: list[str] = []
    for proc in doc.memory.gpu_processes if doc.memory is not None else ():
        if proc.watched:
            continue
        text = f"pid {proc.pid}" + (f" ({proc.name})" if proc.name else "")
        if proc.used_bytes is not None:
            text += f" {format_bytes(proc.used_bytes)}"
        procs.append(text)
    if not procs:
        for other in doc.event.other_processes:
            used = other.bytes
            procs.append(f"pid {other.pid}" + (f" {format_bytes(used)}" if used else ""))
    if not procs:
        return None
    shown = ", ".join(procs[:4]) + (f" and {len(procs) - 4} more" if len(procs) > 4 else "")
    return f"Other processes on the GPU: {shown}"


def _regression_lines(regression: RegressionSection | None, snapshot_id: str | None) -> list[str]:
    if regression is None or not regression.suspected:
        return []
    command = regression.bisect_command
    if command is None or not command.startswith("oom-bisect"):
        command = f"oom-bisect {snapshot_id}" if snapshot_id else None
    lines = [
        "Suspected regression: this workflow ran without running out of memory before "
        "the install changed."
    ]
    if regression.reason:
        lines.append(f"  {regression.reason}")
    if command:
        lines.append(f"  Find the update that broke it: {command}")
    return lines


def _advice_lines(advice: Sequence[AdviceEntry]) -> list[str]:
    texts = [item.text for item in advice if item.text][:TOP_ADVICE]
    return [("Try first: " if n == 0 else "Then: ") + text for n, text in enumerate(texts)]


def render_incident(alert: IncidentAlert, snapshot: SnapshotDoc | None, now: float) -> Alert:
    """The message for a new incident, from its snapshot.json (None: unreadable, or not
    written: from the facts alone)."""
    facts = alert.facts
    doc = snapshot
    event = doc.event if doc is not None else None
    instance = (doc.instance.name if doc is not None else "") or facts.instance
    host = (doc.host.hostname if doc is not None else "") or None
    pool = event.pool if event is not None else facts.pool
    node_type = event.node_type if event is not None else None
    node_id = event.node_id if event is not None else None
    where = f"{instance} on {host}" if host else instance
    title = f"OOM: {_POOL_NAMES.get(pool, pool + ' out of memory')} on {where}"
    if node_type:
        title += f" in {node_type}"

    lines: list[str] = [(doc.summary if doc is not None else "") or facts.summary]
    install = doc.instance.path if doc is not None else None
    lines.append(
        f"Instance: {instance}"
        + (f" ({install})" if install else "")
        + (f" on host {host}" if host else "")
    )
    detail = [f"pool {pool}"]
    if event is not None and event.backend != "unknown":
        detail[0] += f" ({event.backend})"
    if node_type:
        detail.append(f"node {node_type}" + (f" #{node_id}" if node_id else ""))
    if event is not None and event.exception_type:
        detail.append(event.exception_type)
    if event is not None and event.killer:
        detail.append(f"killed by {event.killer}")
    lines.append("What: " + ", ".join(detail))
    numbers = _numbers(event) if event is not None else []
    if numbers:
        lines.append("Numbers: " + ", ".join(numbers))
    if doc is not None:
        lines += _memory_lines(doc.memory)
        others = _other_processes(doc)
        if others:
            lines.append(others)
    count = doc.incident.count if doc is not None else facts.count
    if count > 1:
        lines.append(f"Repeats: {count} failures so far in this storm")
    if alert.earlier_failures:
        lines.append(
            f"Also {alert.earlier_failures} earlier failure(s) of the same kind not yet reported"
        )
    snapshot_id = facts.snapshot_id or (doc.id if doc is not None else None)
    if snapshot_id:
        lines.append(f"Snapshot: {snapshot_id}")
        if facts.snapshot_path:
            lines.append(f"  {facts.snapshot_path}")
        lines.append(f"  Read it: oom-sentinel snapshots show {snapshot_id}")
    if doc is not None:
        lines += _advice_lines(doc.advice)
        lines += _regression_lines(doc.regression, snapshot_id)
    return _finish(
        key=alert.key,
        kind=AlertKind.INCIDENT,
        severity=Severity.CRITICAL,
        title=title,
        lines=lines,
        now=now,
        group=alert.group,
        instance=instance,
        pool=pool,
        snapshot_id=snapshot_id,
        snapshot_path=facts.snapshot_path,
    )


# --- the others -------------------------------------------------------------------------------


def _render_summary(summary: StormSummary, now: float) -> Alert:
    span = _duration(summary.last_s - summary.first_s)
    what = _POOL_NAMES.get(summary.pool, summary.pool)
    if summary.soft:
        title = f"{summary.failures} more recovered OOM(s) on {summary.instance}"
        lines = [
            f"{summary.failures} more recovered OOM(s) on {summary.instance} between "
            f"{_clock(summary.first_s)} and {_clock(summary.last_s)} ({span})."
        ]
    else:
        state = "storm over" if summary.ended else "still failing"
        title = f"OOM storm on {summary.instance}: {summary.failures} more failure(s) ({state})"
        lines = [
            f"{what} on {summary.instance}: {summary.failures} more failure(s) between "
            f"{_clock(summary.first_s)} and {_clock(summary.last_s)} ({span})"
            + (f", in {summary.incidents} new incident(s)" if summary.incidents else "")
            + ".",
            "The storm is over: no failure of this kind for the storm window."
            if summary.ended
            else "It is still going on; the next reminder comes after the repeat interval.",
        ]
    if summary.previous_s is not None:
        lines.append(f"Previous alert: {_clock(summary.previous_s)}")
    latest = summary.latest
    if latest is not None and latest.snapshot_id:
        lines.append(f"Latest snapshot: {latest.snapshot_id}")
        if latest.snapshot_path:
            lines.append(f"  {latest.snapshot_path}")
        lines.append(f"  Read it: oom-sentinel snapshots show {latest.snapshot_id}")
    return _finish(
        key=summary.key,
        kind=AlertKind.STORM_SUMMARY,
        severity=Severity.WARNING,
        title=title,
        lines=lines,
        now=now,
        group=summary.group,
        instance=summary.instance,
        pool=summary.pool,
        snapshot_id=latest.snapshot_id if latest is not None else None,
        snapshot_path=latest.snapshot_path if latest is not None else None,
    )


def _render_soft_warning(warning: SoftOomWarning, now: float) -> Alert:
    minutes = _duration(warning.window_s)
    return _finish(
        key=warning.key,
        kind=AlertKind.SOFT_OOM_WARNING,
        severity=Severity.WARNING,
        title=f"Early warning: {warning.count} recovered OOMs on {warning.instance}",
        lines=[
            f"ComfyUI on {warning.instance} ran out of memory and recovered {warning.count} "
            f"times within {minutes} (between {_clock(warning.first_s)} and "
            f"{_clock(warning.last_s)}).",
            "Memory is running tight: the next one may not recover. Lower the resolution or "
            "batch size, or close other programs that use the GPU.",
            "Details: oom-sentinel snapshots list (recovered OOMs are counted, not snapshotted)",
        ],
        now=now,
        group=f"soft:{warning.instance}",
        instance=warning.instance,
    )


def _render_soft(alert: SoftOomAlert, now: float) -> Alert:
    lines = [
        f"ComfyUI on {alert.instance} ran out of memory at {_clock(alert.at_s)} and recovered"
        + (f" (in {alert.node_type})" if alert.node_type else "")
        + "."
    ]
    if alert.message:
        lines.append(f"Message: {alert.message}")
    return _finish(
        key=alert.key,
        kind=AlertKind.SOFT_OOM,
        severity=Severity.INFO,
        title=f"Recovered OOM on {alert.instance}",
        lines=lines,
        now=now,
        group=alert.group,
        instance=alert.instance,
    )


def _render_held(held: HeldBackSummary, now: float) -> Alert:
    lines = [
        f"{held.count} alert(s) between {_clock(held.first_s)} and {_clock(held.last_s)} were "
        f"held back by the rate limit ({held.max_per_hour} per hour):"
    ]
    lines += [f"- {sample}" for sample in held.samples]
    if held.count > len(held.samples):
        lines.append(f"- and {held.count - len(held.samples)} more")
    lines.append("All of them are in: oom-sentinel snapshots list")
    return _finish(
        key=held.key,
        kind=AlertKind.HELD_BACK,
        severity=Severity.WARNING,
        title=f"{held.count} alert(s) held back by the rate limit",
        lines=lines,
        now=now,
    )


def render(intent: Intent, now: float, snapshot: SnapshotDoc | None = None) -> Alert:
    """The message for any policy output (``snapshot``: the incident's snapshot.json)."""
    if isinstance(intent, IncidentAlert):
        return render_incident(intent, snapshot, now)
    if isinstance(intent, StormSummary):
        return _render_summary(intent, now)
    if isinstance(intent, SoftOomWarning):
        return _render_soft_warning(intent, now)
    if isinstance(intent, SoftOomAlert):
        return _render_soft(intent, now)
    return _render_held(intent, now)


def sample_alert(now: float, *, host: str | None = None) -> Alert:
    """What ``oom-sentinel alert test`` sends: an incident alert as it would look, marked TEST."""
    where = f" on {host}" if host else ""
    return _finish(
        key=f"test:{now:.3f}",
        kind=AlertKind.TEST,
        severity=Severity.INFO,
        title=f"TEST from oom-sentinel{where}: alerts reach you",
        lines=[
            "This is a test. If you read it, oom-sentinel's alerts reach you through this channel.",
            "A real alert looks like this:",
            "  OOM: GPU out of memory on main in KSampler",
            "  Numbers: tried to allocate 2.00 GiB, 512.00 MiB free of 24.00 GiB",
            "  Snapshot: 20260102T101112Z_gpu_KSampler",
            "  Try first: close the other program using 6.00 GiB of the GPU",
        ],
        now=now,
        group="test",
    )
