"""The words of an alert: what a person reading it on a phone needs to act, and nothing secret.

An incident alert names the instance and host, the pool and node, the key numbers in human
units (what was asked for, what was free, what PyTorch held, what else was on the GPU), the
snapshot id and path with the command that tells the whole story, the top advice and -- when
the snapshot's ``regression`` section says ``suspected: true`` -- the ``oom-bisect`` command
that finds the update that broke it. The snapshot document is the source (it is what the user
will open), read defensively: any section may be missing or of an older shape.

Pure functions; every text passes through ``redact_text`` before it leaves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from oom_sentinel.daemon.alerts import (
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
from oom_sentinel.daemon.redact import redact_text
from oom_sentinel.daemon.units import format_bytes

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


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


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


def _numbers(event: Any) -> list[str]:
    parts: list[str] = []
    requested = _int(_get(event, "requested_bytes"))
    free = _int(_get(event, "free_bytes"))
    total = _int(_get(event, "total_bytes"))
    allocated = _int(_get(event, "allocated_bytes"))
    reserved = _int(_get(event, "reserved_unallocated_bytes"))
    if requested is not None:
        parts.append(f"tried to allocate {format_bytes(requested)}")
    if free is not None and total is not None:
        parts.append(f"{format_bytes(free)} free of {format_bytes(total)}")
    elif total is not None:
        parts.append(f"capacity {format_bytes(total)}")
    if allocated is not None:
        parts.append(f"{format_bytes(allocated)} allocated by PyTorch")
    if reserved is not None:
        parts.append(f"{format_bytes(reserved)} reserved but unallocated")
    mps_max = _int(_get(event, "mps_max_allowed_bytes"))
    if mps_max is not None:
        parts.append(f"MPS limit {format_bytes(mps_max)}")
    return parts


def _memory_lines(memory: Any) -> list[str]:
    lines: list[str] = []
    gpus = _get(memory, "gpus")
    if isinstance(gpus, list):
        for gpu in gpus[:4]:
            used, total = _int(_get(gpu, "used_bytes")), _int(_get(gpu, "total_bytes"))
            if used is None and total is None:
                continue
            name = _str(_get(gpu, "name")) or "GPU"
            index = _int(_get(gpu, "index"))
            label = f"GPU {index} ({name})" if index is not None else name
            lines.append(f"{label}: {format_bytes(used)} used of {format_bytes(total)}")
    host = _get(memory, "host")
    available, total = _int(_get(host, "ram_available_bytes")), _int(_get(host, "ram_total_bytes"))
    if available is not None and total is not None:
        lines.append(f"RAM: {format_bytes(available)} available of {format_bytes(total)}")
    return lines


def _other_processes(data: Mapping[str, Any]) -> str | None:
    procs: list[str] = []
    gpu_procs = _get(data, "memory", "gpu_processes")
    if isinstance(gpu_procs, list):
        for proc in gpu_procs:
            if _get(proc, "watched") is True:
                continue
            pid = _int(_get(proc, "pid"))
            if pid is None:
                continue
            name = _str(_get(proc, "name"))
            used = _int(_get(proc, "used_bytes"))
            text = f"pid {pid}" + (f" ({name})" if name else "")
            if used is not None:
                text += f" {format_bytes(used)}"
            procs.append(text)
    if not procs:
        others = _get(data, "event", "other_processes")
        if isinstance(others, list):
            for proc in others:
                pid = _int(_get(proc, "pid"))
                if pid is not None:
                    used = _int(_get(proc, "bytes"))
                    procs.append(f"pid {pid}" + (f" {format_bytes(used)}" if used else ""))
    if not procs:
        return None
    shown = ", ".join(procs[:4]) + (f" and {len(procs) - 4} more" if len(procs) > 4 else "")
    return f"Other processes on the GPU: {shown}"


def _regression_lines(data: Mapping[str, Any], snapshot_id: str | None) -> list[str]:
    regression = data.get("regression")
    if not isinstance(regression, Mapping) or regression.get("suspected") is not True:
        return []
    command = _str(regression.get("bisect_command"))
    if command is None or not command.startswith("oom-bisect"):
        command = f"oom-bisect {snapshot_id}" if snapshot_id else None
    why = _str(regression.get("summary")) or _str(regression.get("reason"))
    lines = [
        "Suspected regression: this workflow ran without running out of memory before "
        "the install changed."
    ]
    if why:
        lines.append(f"  {why}")
    if command:
        lines.append(f"  Find the update that broke it: {command}")
    return lines


def _advice_lines(data: Mapping[str, Any]) -> list[str]:
    advice = data.get("advice")
    if not isinstance(advice, list):
        return []
    texts = [text for item in advice if (text := _str(_get(item, "text")))][:TOP_ADVICE]
    lines: list[str] = []
    for n, text in enumerate(texts):
        lines.append(("Try first: " if n == 0 else "Then: ") + text)
    return lines


def render_incident(alert: IncidentAlert, snapshot: Mapping[str, Any] | None, now: float) -> Alert:
    """The message for a new incident, from its snapshot.json (None: from the facts alone)."""
    facts = alert.facts
    data: Mapping[str, Any] = snapshot if isinstance(snapshot, Mapping) else {}
    event = data.get("event") if isinstance(data.get("event"), Mapping) else {}
    instance = _str(_get(data, "instance", "name")) or facts.instance
    host = _str(_get(data, "host", "hostname"))
    pool = _str(_get(event, "pool")) or facts.pool
    node_type = _str(_get(event, "node_type"))
    node_id = _str(_get(event, "node_id"))
    where = f"{instance} on {host}" if host else instance
    title = f"OOM: {_POOL_NAMES.get(pool, pool + ' out of memory')} on {where}"
    if node_type:
        title += f" in {node_type}"

    lines: list[str] = [_str(data.get("summary")) or facts.summary]
    install = _str(_get(data, "instance", "path"))
    lines.append(
        f"Instance: {instance}"
        + (f" ({install})" if install else "")
        + (f" on host {host}" if host else "")
    )
    detail = [f"pool {pool}"]
    backend = _str(_get(event, "backend"))
    if backend and backend != "unknown":
        detail[0] += f" ({backend})"
    if node_type:
        detail.append(f"node {node_type}" + (f" #{node_id}" if node_id else ""))
    exception = _str(_get(event, "exception_type"))
    if exception:
        detail.append(exception)
    killer = _str(_get(event, "killer"))
    if killer:
        detail.append(f"killed by {killer}")
    lines.append("What: " + ", ".join(detail))
    numbers = _numbers(event)
    if numbers:
        lines.append("Numbers: " + ", ".join(numbers))
    lines += _memory_lines(data.get("memory"))
    others = _other_processes(data)
    if others:
        lines.append(others)
    count = _int(_get(data, "incident", "count")) or facts.count
    if count > 1:
        lines.append(f"Repeats: {count} failures so far in this storm")
    if alert.earlier_failures:
        lines.append(
            f"Also {alert.earlier_failures} earlier failure(s) of the same kind not yet reported"
        )
    snapshot_id = facts.snapshot_id or _str(data.get("id"))
    if snapshot_id:
        lines.append(f"Snapshot: {snapshot_id}")
        if facts.snapshot_path:
            lines.append(f"  {facts.snapshot_path}")
        lines.append(f"  Read it: oom-sentinel snapshots show {snapshot_id}")
    lines += _advice_lines(data)
    lines += _regression_lines(data, snapshot_id)
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


def render(intent: Intent, now: float, snapshot: Mapping[str, Any] | None = None) -> Alert:
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
