"""``oom-sentinel snapshots list|show|export``: read what the daemon recorded.

The snapshot directories are the source of truth, so these commands read them directly and
work while the daemon runs, after it stopped, or on a copy of a data dir; the store only adds
the storm count (how often the failure repeated after its snapshot), when it can be opened.
``show`` tells the incident as a story a user can act on: what failed and in which pool, the
numbers in human units, memory at the time, what else held the GPU, timeline highlights, and
the advice last, where the eye lands. Once ``oom-bisect`` has attached its answer to the
snapshot (``bisect/report.json``), that answer comes first -- the culprits -- and the story no
longer tells the user to run the bisect; ``export`` ships the attached reports too.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from oom_sentinel.daemon.core.clikit import echo_json, handle_errors
from oom_sentinel.daemon.core.errors import StoreError
from oom_sentinel.daemon.core.units import format_bytes
from oom_sentinel.daemon.incidents.bisect_results import AttachedReport, latest_report
from oom_sentinel.daemon.incidents.regression import BISECT_ADVICE_KEY, SUMMARY_SUFFIX
from oom_sentinel.daemon.incidents.snapshot import (
    Snapshot,
    export_snapshot,
    find_snapshot,
    list_snapshots,
    load_snapshot,
    parse_iso_utc,
    snapshots_dir,
)
from oom_sentinel.daemon.incidents.snapshot_model import EventModel, MemorySection
from oom_sentinel.daemon.store.db import IncidentRow, Store

__all__ = ["snapshots_group"]

PROG = "oom-sentinel"


def _data_dir(data_dir: str | None, config_path: str | None) -> Path:
    if data_dir:
        return Path(data_dir).expanduser()
    from oom_sentinel.config.settings import load_settings

    return load_settings(config_path).settings.resolved_data_dir()


def _warn(message: str) -> None:
    click.echo(f"{PROG}: warning: {message}", err=True)


def _store_rows(data_dir: Path) -> dict[str, IncidentRow]:
    """Incident rows by snapshot id; empty (with a warning) when the store cannot be read."""
    try:
        store = Store.open_existing(data_dir)
    except StoreError as exc:
        _warn(f"{exc} (storm counts not shown)")
        return {}
    if store is None:
        return {}
    with store:
        try:
            return {r.snapshot_id: r for r in store.incidents() if r.snapshot_id}
        except StoreError as exc:
            _warn(f"{exc} (storm counts not shown)")
            return {}


def _local_time(iso: str, with_zone: bool = False) -> str:
    seconds = parse_iso_utc(iso)
    if seconds is None:
        return iso
    moment = datetime.fromtimestamp(seconds).astimezone()
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text} {moment.strftime('%Z')}".rstrip() if with_zone else text


def _clock(iso: str) -> str:
    seconds = parse_iso_utc(iso)
    if seconds is None:
        return iso
    return datetime.fromtimestamp(seconds).astimezone().strftime("%H:%M:%S")


_data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Data directory (default: from the config, else the platform's data dir).",
)
_config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Config file."
)
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_from_option = click.option(
    "--from",
    "from_url",
    metavar="s3://BUCKET[/PREFIX]",
    help="Read the fleet's snapshots from this bucket ([fleet] bucket_url) instead.",
)
_endpoint_option = click.option(
    "--endpoint-url",
    help="S3-compatible endpoint for --from (default: [fleet] endpoint_url, $AWS_ENDPOINT_URL).",
)


def _bucket(from_url: str, endpoint_url: str | None, config_path: str | None) -> Any:
    """The bucket --from names; endpoint and region default to the config's [fleet]."""
    from oom_sentinel.config.settings import load_settings
    from oom_sentinel.daemon.fleet.bucket import Bucket, BucketUrl

    url = BucketUrl.parse(from_url)
    fleet = load_settings(config_path).settings.fleet
    endpoint = endpoint_url if endpoint_url is not None else fleet.endpoint_url
    return Bucket(url, endpoint_url=endpoint, region=fleet.region)


def _remote_entries(bucket: Any) -> list[dict[str, Any]]:
    """``list`` entries for every complete snapshot in the bucket (their snapshot.json are
    read in parallel: a farm's bucket holds hundreds)."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from oom_sentinel.daemon.core.errors import InputError
    from oom_sentinel.daemon.fleet.bucket import MARKER, download, remote_snapshots

    found = remote_snapshots(bucket)
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="oom-sentinel-fleet-") as tmp:

        def fetch(item: Any) -> dict[str, Any] | None:
            where = Path(tmp) / item.host / item.instance
            try:
                snap = load_snapshot(download(bucket, item, where, only=MARKER), validate=False)
            except InputError as exc:
                _warn(f"{bucket.url}/{item.key}: {str(exc).rpartition(': ')[2]}")
                return None
            entry = snap.list_entry()
            entry.update(host=item.host, ref=item.ref, path=f"{bucket.url}/{item.ref}")
            return entry

        with ThreadPoolExecutor(max_workers=8) as pool:
            entries = [e for e in pool.map(fetch, found) if e is not None]
    return entries


@click.group("snapshots")
def snapshots_group() -> None:
    """List, read and export the crash snapshots the watchdog recorded."""


@snapshots_group.command("list")
@_json_option
@_data_dir_option
@_config_option
@_from_option
@_endpoint_option
@handle_errors(PROG)
def list_command(
    as_json: bool,
    data_dir: str | None,
    config_path: str | None,
    from_url: str | None,
    endpoint_url: str | None,
) -> None:
    """List snapshots, newest first (--from: every box's, from the fleet's bucket)."""
    if from_url:
        bucket = _bucket(from_url, endpoint_url, config_path)
        entries = _remote_entries(bucket)
        if as_json:
            echo_json(entries)
        elif not entries:
            click.echo(f"No snapshots in {bucket.url}.")
        else:
            _print_table([{**e, "id": e["ref"], "instance": e["instance"]} for e in entries])
        return
    directory = _data_dir(data_dir, config_path)
    snaps, problems = list_snapshots(snapshots_dir(directory))
    for problem in problems:
        _warn(problem)
    rows = _store_rows(directory) if snaps else {}
    entries = []
    for snap in snaps:
        entry = snap.list_entry()
        row = rows.get(snap.id)
        if row is not None:
            entry["count"] = max(row.count, entry.get("count") or 0)
            entry["last_seen"] = _iso_from_s(row.last_seen_s)
        entries.append(entry)
    if as_json:
        echo_json(entries)
        return
    if not entries:
        click.echo(f"No snapshots in {snapshots_dir(directory)}.")
        return
    _print_table(entries)


def _print_table(entries: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Piped output is not cut at 80 columns: `| grep` should see whole rows.
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    console = Console(highlight=False, width=400 if piped else None)
    rows = [
        (
            _local_time(e["created"]),
            e["id"],
            e["instance"] or "-",
            e["pool"] or "-",
            e["node_type"] or "-",
            str(e["count"] or 1),
            e["summary"],
        )
        for e in entries
    ]
    headers = ("Time", "ID", "Instance", "Pool", "Node", "×", "Summary")
    fixed = sum(max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(headers[:-1]))
    if console.width < fixed + 30:
        # Too narrow for a table with a readable summary: two lines per snapshot instead.
        for time, snap_id, instance, pool, node, count, summary in rows:
            repeat = f" ×{count}" if count != "1" else ""
            click.echo(f"{time}  {snap_id}  [{instance} {pool} {node}{repeat}]")
            for part in textwrap.wrap(summary, max(20, console.width - 4)) or [""]:
                click.echo(f"    {part}")
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for header in headers[:-1]:
        table.add_column(header, no_wrap=True, justify="right" if header == "×" else "left")
    table.add_column("Summary")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _iso_from_s(seconds: float) -> str:
    from oom_sentinel.daemon.incidents.snapshot import iso_utc

    return iso_utc(seconds)


@snapshots_group.command("show")
@click.argument("snapshot_id", metavar="ID")
@_json_option
@_data_dir_option
@_config_option
@_from_option
@_endpoint_option
@handle_errors(PROG)
def show_command(
    snapshot_id: str,
    as_json: bool,
    data_dir: str | None,
    config_path: str | None,
    from_url: str | None,
    endpoint_url: str | None,
) -> None:
    """Tell the story of one snapshot (ID may be a unique prefix; with --from, also
    HOST/INSTANCE/ID)."""
    if from_url:
        _show_remote(snapshot_id, as_json, _bucket(from_url, endpoint_url, config_path))
        return
    directory = _data_dir(data_dir, config_path)
    snap = load_snapshot(find_snapshot(snapshots_dir(directory), snapshot_id))
    if as_json:
        report = latest_report(snap.path)
        data = dict(snap.data)
        if report is not None:
            data["bisect"] = report.to_json()
        echo_json(data)
        return
    row = _store_rows(directory).get(snap.id)
    click.echo(render_story(snap, row))


def _show_remote(ref: str, as_json: bool, bucket: Any) -> None:
    import tempfile

    from oom_sentinel.daemon.fleet.bucket import download, find_remote, remote_snapshots

    item = find_remote(remote_snapshots(bucket), ref, str(bucket.url))
    with tempfile.TemporaryDirectory(prefix="oom-sentinel-fleet-") as tmp:
        snap = load_snapshot(download(bucket, item, Path(tmp)))
        if as_json:
            echo_json(snap.data)
            return
        # the story names where the files are: in the bucket, not in this temporary copy
        story = render_story(snap).replace(str(snap.path), f"{bucket.url}/{item.ref}")
    click.echo(f"From {item.host}, instance {item.instance}")
    click.echo(story)


@snapshots_group.command("export")
@click.argument("snapshot_id", metavar="ID")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Zip file to write (default: ./<ID>.zip).",
)
@_json_option
@_data_dir_option
@_config_option
@handle_errors(PROG)
def export_command(
    snapshot_id: str,
    output: str | None,
    as_json: bool,
    data_dir: str | None,
    config_path: str | None,
) -> None:
    """Write one snapshot as a zip to attach to a bug report (secrets redacted)."""
    directory = _data_dir(data_dir, config_path)
    snap = load_snapshot(find_snapshot(snapshots_dir(directory), snapshot_id))
    out = export_snapshot(snap, Path(output) if output else Path(f"{snap.id}.zip"))
    if as_json:
        echo_json({"id": snap.id, "path": str(out.resolve())})
        return
    click.echo(f"Wrote {out} (snapshot {snap.id}).")


# --- the story --------------------------------------------------------------------------------

_POOL_STORY = {
    "gpu": "GPU memory: the card's VRAM was exhausted.",
    "gpu-fragmentation": (
        "GPU memory, fragmented: PyTorch held enough free memory in its cache, but not in one "
        "piece."
    ),
    "ram": "System RAM.",
    "swap-pagefile": "The Windows commit limit: RAM plus the paging file were used up.",
    "unified-mps": "Apple unified memory, through the MPS backend.",
    "killed-by-os": "None inside ComfyUI: the operating system killed it to free memory.",
}


def _bisect_lines(report: AttachedReport) -> list[str]:
    lines = [report.headline()]
    lines += [f"  {c.line()}" for c in report.culprits]
    if report.message and not report.culprits:
        lines.append(f"  {report.message}")
    if report.measurements is not None:
        lines.append(f"  ({report.measurements} measurements)")
    lines.append(f"  Report: {report.html or report.path / 'report.json'}")
    return lines


def render_story(snap: Snapshot, row: IncidentRow | None = None) -> str:
    """The human account of one snapshot (its typed document: every optional part may be
    absent)."""
    doc = snap.doc
    event = doc.event
    report = latest_report(snap.path)
    answered = report is not None and report.finished
    summary = doc.summary.strip() or "An out-of-memory incident"
    if answered:
        summary = summary.split(SUMMARY_SUFFIX, 1)[0]
    lines: list[str] = [summary]
    lines += _fit_lead(snap.path)
    lines.append(f"Snapshot {snap.id}, taken {_local_time(snap.created, with_zone=True)}")
    where = [v for v in (doc.instance.name, doc.instance.path, doc.instance.url) if v]
    if where:
        lines.append("Instance " + " · ".join(where))
    if report is not None:
        lines += ["", "The answer (oom-bisect)"]
        lines += [f"  {text}" for text in _bisect_lines(report)]

    lines += ["", "What failed"]
    lines += [f"  {text}" for text in _what_failed(event)]
    sources = ", ".join(doc.sources)
    if sources:
        lines.append(f"  Reported by: {sources}.")
    count = doc.incident.count
    if row is not None and row.count > count:
        count = row.count
        lines.append(
            f"  It happened {count} times, the last at {_clock(_iso_from_s(row.last_seen_s))}; "
            "this snapshot describes the first."
        )
    elif count > 1:
        lines.append(f"  It happened {count} times; this snapshot describes the first.")

    lines += ["", "Which memory ran out"]
    pool = event.pool
    story = _POOL_STORY.get(pool, f"{pool}.")
    if pool == "killed-by-os" and event.killer:
        story = story.rstrip(".") + f" (killer: {event.killer})."
    lines.append(f"  {story}")

    memory = doc.memory
    lines += ["", "Memory at the time" + (f" ({_clock(memory.time)})" if memory else "")]
    lines += [f"  {text}" for text in _memory_lines(memory)]

    lines += ["", "What else held the GPU"]
    lines += [f"  {text}" for text in _others_lines(memory, event)]

    highlights = _timeline_highlights(snap.path / "timeline.csv")
    if highlights:
        lines += ["", "Timeline"]
        lines += [f"  {text}" for text in highlights]

    tail = _log_tail(snap.path / "log.txt", 6)
    if tail:
        lines += ["", "Log (last lines of log.txt)"]
        lines += [f"  | {text}" for text in tail]

    files = doc.files
    lines += ["", f"Files in {snap.path}"]
    lines.append("  log.txt (the failure and the lines before it), timeline.csv (memory over time)")
    if files.prompt:
        replay = "" if answered else f"; replay it with `oom-bisect {snap.id}`"
        lines.append(f"  prompt.json: the prompt that ran{replay}")
    if report is not None:
        lines.append(f"  {report.folder}/: the bisect's report (report.html, report.json)")
    if files.workflow:
        lines.append("  workflow.json: the workflow; drag it into ComfyUI to open it")
    lines.append(f"  Attach it to a bug report: oom-sentinel snapshots export {snap.id}")

    advice = [a for a in doc.advice if a.text]
    if answered:  # the bisect ran: its answer is above, not a request to run it
        advice = [a for a in advice if a.key != BISECT_ADVICE_KEY]
    lines += ["", "What to try"]
    if advice:
        lines += [f"  {i}. {a.text}" for i, a in enumerate(advice, 1)]
    else:
        lines.append("  No specific advice was recorded for this incident.")
    return "\n".join(lines)


def _fit_lead(path: Path) -> list[str]:
    """The answer of the latest ``oom-bisect fit`` attached to the snapshot (``fit/``,
    ``fit-2/`` …), one line: what makes the workflow fit. Read from its ``fit.json`` so the
    daemon side never imports the bisect."""
    import json

    found: list[tuple[int, Path]] = []
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            name = child.name
            n = 1 if name == "fit" else None
            if name.startswith("fit-") and name[4:].isdigit():
                n = int(name[4:])
            if n is not None and (child / "fit.json").is_file():
                found.append((n, child))
    if not found:
        return []
    try:
        doc = json.loads((max(found)[1] / "fit.json").read_text("utf-8"))
    except (OSError, ValueError):
        return []
    text = str(doc.get("headline") or "").strip() if isinstance(doc, Mapping) else ""
    return [f"oom-bisect fit: {text}"] if text else []


def _what_failed(event: EventModel) -> list[str]:
    out: list[str] = []
    node, node_id, exc = event.node_type, event.node_id, event.exception_type
    backend, gpu = event.backend, event.gpu_index
    who = f"{node} (node {node_id})" if node and node_id else (node or "A node")
    if event.pool == "killed-by-os":
        pid = event.killed_pid
        out.append(f"ComfyUI{f' (pid {pid})' if pid is not None else ''} was killed.")
    else:
        device = ""
        if backend != "unknown":
            device = f" on {backend}" + (f" device {gpu}" if gpu is not None else "")
        out.append(f"{who} raised {exc or 'an out-of-memory error'}{device}.")
    numbers: list[str] = []
    if event.requested_bytes is not None:
        numbers.append(f"It asked for {format_bytes(event.requested_bytes)}")
    if event.free_bytes is not None and event.total_bytes is not None:
        numbers.append(
            f"{format_bytes(event.free_bytes)} of {format_bytes(event.total_bytes)} was free"
        )
    if numbers:
        out.append("; ".join(numbers) + ".")
    torch: list[str] = []
    if event.allocated_bytes is not None:
        torch.append(f"{format_bytes(event.allocated_bytes)} allocated")
    if event.reserved_unallocated_bytes is not None:
        torch.append(f"{format_bytes(event.reserved_unallocated_bytes)} reserved but unallocated")
    if torch:
        out.append("PyTorch had " + " and ".join(torch) + ".")
    message = event.message.strip()
    if message:
        out.append(f"Message: {message if len(message) <= 300 else message[:297] + '...'}")
    return out


def _memory_lines(memory: MemorySection | None) -> list[str]:
    if memory is None:
        return ["No memory sample was taken."]
    out: list[str] = []
    for gpu in memory.gpus:
        out.append(
            f"GPU {gpu.index} {gpu.name}".rstrip() + f": {format_bytes(gpu.used_bytes)} used of "
            f"{format_bytes(gpu.total_bytes)}, {format_bytes(gpu.free_bytes)} free"
        )
    host = memory.host
    if host is not None:
        out.append(
            f"RAM: {format_bytes(host.ram_available_bytes)} available of "
            f"{format_bytes(host.ram_total_bytes)}; swap: "
            f"{format_bytes(host.swap_used_bytes)} used of "
            f"{format_bytes(host.swap_total_bytes)}"
        )
        if host.committed_bytes is not None:
            out.append(
                f"Commit charge: {format_bytes(host.committed_bytes)} of "
                f"{format_bytes(host.commit_limit_bytes)}"
            )
    for tree in memory.process_trees:
        peak = tree.peak_rss_bytes
        out.append(
            f"ComfyUI process {tree.root_pid}: {format_bytes(tree.rss_bytes)} "
            "resident" + (f" (peak {format_bytes(peak)})" if peak is not None else "")
        )
    return out or ["The sample holds no devices or processes."]


def _others_lines(memory: MemorySection | None, event: EventModel) -> list[str]:
    out: list[str] = []
    seen: set[int] = set()
    for proc in memory.gpu_processes if memory is not None else ():
        if proc.watched:
            continue
        seen.add(proc.pid)
        cmdline = " ".join(proc.cmdline or ())
        label = f"pid {proc.pid} {proc.name or '?'}" + (f" ({cmdline[:80]})" if cmdline else "")
        out.append(
            f"{label}: {format_bytes(proc.used_bytes, 'amount unknown')} on GPU {proc.device_index}"
        )
    for other in event.other_processes:
        if other.pid in seen:
            continue
        out.append(
            f"pid {other.pid} (named in the error): {format_bytes(other.bytes, 'amount unknown')}"
        )
    if not out:
        if event.other_process_named:
            return ["The error says another process held GPU memory, but no sample names it."]
        if memory is None:
            return ["Unknown: no GPU process sample was taken."]
        return ["Nothing else: only the watched ComfyUI used the GPU."]
    return out


def _timeline_highlights(path: Path, limit: int = 6) -> list[str]:
    """For each ``*_bytes`` column: first and last value, and its peak with the time."""
    try:
        text = path.read_text("utf-8", "replace")
    except OSError:
        return []
    rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].startswith("#")]
    if len(rows) < 2:
        return []
    header, body = rows[0], rows[1:]
    out = [f"{len(body)} samples from {_short_time(body[0][0])} to {_short_time(body[-1][0])}"]
    for col, name in enumerate(header):
        if not name.endswith("_bytes") or col == 0:
            continue
        values: list[tuple[float, str]] = []
        for r in body:
            if col < len(r):
                try:
                    values.append((float(r[col]), r[0]))
                except ValueError:
                    continue
        if not values or name.endswith("total_bytes"):
            continue
        # For what is "left" (available, free) the low point matters; for use, the peak.
        low_is_bad = "available" in name or "free" in name
        pick = min if low_is_bad else max
        extreme = pick(values, key=lambda v: v[0])
        out.append(
            f"{name}: {format_bytes(values[0][0])} → {format_bytes(values[-1][0])} "
            f"({'lowest' if low_is_bad else 'peak'} {format_bytes(extreme[0])} "
            f"at {_short_time(extreme[1])})"
        )
        if len(out) > limit:
            break
    return out


def _short_time(value: str) -> str:
    seconds = parse_iso_utc(value)
    if seconds is None:
        try:
            seconds = float(value)
        except ValueError:
            return value
    return datetime.fromtimestamp(seconds).astimezone().strftime("%H:%M:%S")


def _log_tail(path: Path, count: int) -> Sequence[str]:
    try:
        lines = path.read_text("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [line[:200] for line in lines[-count:]]
