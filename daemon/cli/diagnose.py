"""``oom-sentinel diagnose FILE...``: what ran out, by how much, where, and what to try — from a
log the user already has, without the daemon.

Reads ComfyUI logs in any of their wrappers (ComfyUI-Manager's ``comfyui.log``, Desktop's
electron-log, a console capture, journald output, a pasted excerpt, gzip-rotated files), saved
``/internal/logs`` dumps (a JSON string, or ``{"entries": [{"t": ..., "m": ...}]}``), or ``-``
for stdin. Files are streamed (``classify.scan_stream``): memory stays flat for a 1 GB log.

Exit status: 0 when no OOM failure was found (recovered soft OOMs do not count), 1 when at
least one was, 3 when a file cannot be read (one line on stderr).
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import click

from oom_sentinel.daemon.classify import Finding, scan_stream
from oom_sentinel.daemon.classify.advice import advise, human_bytes
from oom_sentinel.daemon.classify.events import OomEvent, Pool
from oom_sentinel.daemon.core.clikit import handle_errors
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.logs.textenc import UTF8, detect_encoding

__all__ = ["diagnose", "finding_json", "open_log", "scan_log"]

PROG = "oom-sentinel"
#: a file that looks like JSON and is at most this big is tried as an /internal/logs dump
JSON_MAX_BYTES = 64 * 1024 * 1024
EXIT_FOUND = 1

POOL_NAMES = {
    Pool.GPU: "GPU memory",
    Pool.GPU_FRAGMENTATION: "GPU memory, fragmented",
    Pool.RAM: "system RAM",
    Pool.SWAP_PAGEFILE: "Windows page file (commit limit)",
    Pool.UNIFIED_MPS: "Apple unified memory (MPS)",
    Pool.KILLED_BY_OS: "killed by the OS (out of RAM)",
}


def _entries_text(entries: list[Any]) -> str:
    """Rebuild the console text of ``/internal/logs`` entries (each one a raw write).

    A write that starts a line gets the ``t - `` prefix the UI's copy shows, so records still
    start where ComfyUI started them.
    """
    parts: list[str] = []
    at_line_start = True
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        message = entry.get("m")
        if not isinstance(message, str) or not message:
            continue
        stamp = entry.get("t")
        if at_line_start and isinstance(stamp, str) and message != "\n":
            parts.append(f"{stamp} - ")
        parts.append(message)
        at_line_start = message.endswith("\n")
    return "".join(parts)


def _json_dump_text(data: bytes) -> str | None:
    """The log text inside an ``/internal/logs`` dump, or None when ``data`` is not one."""
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("entries"), list):
        return _entries_text(value["entries"])
    if isinstance(value, list) and value and all(isinstance(e, dict) and "m" in e for e in value):
        return _entries_text(value)
    return None


def _looks_like_json(head: bytes) -> bool:
    """A JSON object, string, or array of objects; not ``[2026-01-02 ...`` (Manager's prefix)."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b'"'):
        return True
    return text[:1] == b"[" and text[1:].lstrip(b" \t\r\n")[:1] in (b"{", b"]")


def _read_up_to(stream: BinaryIO, size: int) -> bytes:
    parts: list[bytes] = []
    while size > 0:
        data = stream.read(size)
        if not data:
            break
        parts.append(data)
        size -= len(data)
    return b"".join(parts)


def scan_log(stream: BinaryIO) -> Iterator[Finding]:
    """The findings in one opened log (``open_log``), as ``diagnose`` scans it."""
    return scan_stream(stream)


@contextmanager
def open_log(path: str) -> Iterator[BinaryIO]:
    """A binary stream of the log text in ``path`` (``-`` is stdin); InputError if unreadable."""
    try:
        if path == "-":
            raw: BinaryIO = sys.stdin.buffer
            close = False
        else:
            raw = open(path, "rb")  # noqa: SIM115 - closed below; a context manager would hide the InputError
            close = True
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        base: BinaryIO = raw
        start = raw.tell() if raw.seekable() else None
        head = _read_up_to(raw, 65536)
        if head[:2] == b"\x1f\x8b":  # a gzip-rotated log
            base = gzip.GzipFile(fileobj=_Prepend(head, raw), mode="rb")  # type: ignore[assignment]
            head = _read_up_to(base, 65536)
        stream: BinaryIO = _Prepend(head, base)  # type: ignore[assignment]
        encoding = detect_encoding(head)
        if encoding != UTF8:  # PowerShell 5's `>`: UTF-16, scanned as the UTF-8 it says
            stream = _Transcode(stream, encoding)  # type: ignore[assignment]
        elif base is raw and start is not None and not _looks_like_json(head):
            # a plain file: hand over the file itself, so the scan reads it without a copy
            # through _Prepend
            raw.seek(start)
            stream = raw
        elif _looks_like_json(head):
            data = head + _read_up_to(base, JSON_MAX_BYTES + 1 - len(head))
            text = _json_dump_text(data) if len(data) <= JSON_MAX_BYTES else None
            stream = io.BytesIO(text.encode("utf-8")) if text is not None else _Prepend(data, base)  # type: ignore[assignment]
        yield stream
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except EOFError as exc:  # a truncated gzip file
        raise InputError(f"{path}: cannot read: {exc}") from exc
    except zlib.error as exc:  # a corrupt gzip file (bad deflate data, not an OSError)
        raise InputError(f"{path}: not a readable gzip file ({exc})") from exc
    finally:
        if close:
            raw.close()


class _Transcode(io.RawIOBase):
    """``stream`` decoded from ``encoding`` and re-encoded as UTF-8 (a leading BOM dropped)."""

    def __init__(self, stream: BinaryIO, encoding: str) -> None:
        super().__init__()
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        self._out = b""
        self._first = True
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = size if size is not None and size >= 0 else None
        while not self._done and (want is None or len(self._out) < want):
            data = self._stream.read(65536)
            text = self._decoder.decode(data, final=not data)
            if self._first and text:
                text, self._first = text.removeprefix("\ufeff"), False
            self._out += text.encode("utf-8")
            self._done = not data
        if want is None:
            data, self._out = self._out, b""
        else:
            data, self._out = self._out[:want], self._out[want:]
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _Prepend(io.RawIOBase):
    """``head`` followed by the rest of ``stream``: lets us peek without seeking (stdin)."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        super().__init__()
        self._head = head
        self._stream = stream

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size is None or size < 0:
                data, self._head = self._head + self._stream.read(), b""
                return data
            data, self._head = self._head[:size], self._head[size:]
            return data
        return self._stream.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def finding_json(source: str, finding: Finding) -> dict[str, Any]:
    """The documented JSON object for one finding (README, "diagnose")."""
    event = finding.event
    advice = advise(event)
    return {
        "source": source,
        "line": finding.line_no,
        "pool": str(event.pool),
        "backend": str(event.backend),
        "recovered": event.recovered,
        "count": event.count,
        "node_type": event.node_type,
        "node_id": event.node_id,
        "exception_type": event.exception_type,
        "requested_bytes": event.requested_bytes,
        "total_bytes": event.total_bytes,
        "free_bytes": event.free_bytes,
        "allocated_bytes": event.allocated_bytes,
        "reserved_unallocated_bytes": event.reserved_unallocated_bytes,
        "reserved_bytes": event.reserved_bytes,
        "process_used_bytes": event.process_used_bytes,
        "other_processes": [{"pid": p.pid, "bytes": p.bytes} for p in event.other_processes],
        "other_process_named": event.other_process_named,
        "gpu_index": event.gpu_index,
        "mps_allocated_bytes": event.mps_allocated_bytes,
        "mps_other_bytes": event.mps_other_bytes,
        "mps_max_allowed_bytes": event.mps_max_allowed_bytes,
        "killer": event.killer,
        "killed_pid": event.killed_pid,
        "message": event.message,
        "rule": event.rule,
        "timestamp": finding.record.timestamp,
        "extra": {k: v for k, v in event.extra},
        "advice": [a.text for a in advice],
        "advice_keys": [a.key for a in advice],
    }


def _numbers(event: OomEvent) -> str:
    parts = [
        ("requested", event.requested_bytes),
        ("capacity", event.total_bytes),
        ("free", event.free_bytes),
        ("allocated by PyTorch", event.allocated_bytes),
        ("reserved but unallocated", event.reserved_unallocated_bytes),
        ("this process in all", event.process_used_bytes),
        ("MPS other allocations", event.mps_other_bytes),
        ("MPS max allowed", event.mps_max_allowed_bytes),
    ]
    if event.pool is Pool.UNIFIED_MPS:
        parts[3] = ("MPS allocated", event.mps_allocated_bytes)
    return " · ".join(f"{name} {human_bytes(value)}" for name, value in parts if value is not None)


def _human(source: str, finding: Finding) -> list[str]:
    event = finding.event
    head = f"{source}:{finding.line_no}  "
    if event.recovered:
        times = f" ×{event.count}" if event.count > 1 else ""
        head += f"soft OOM, recovered{times} · {POOL_NAMES[event.pool]}"
    else:
        times = f" (×{event.count})" if event.count > 1 else ""
        head += f"OOM failure{times} · {POOL_NAMES[event.pool]}"
    if event.backend.value != "unknown":
        head += f" ({event.backend.value})"
    if event.node_type:
        head += f" · node {event.node_type}" + (f" #{event.node_id}" if event.node_id else "")
    if event.exception_type:
        head += f" · {event.exception_type}"
    lines = [head]
    if event.message:
        message = event.message if len(event.message) <= 160 else event.message[:157] + "..."
        lines.append(f"  {message}")
    numbers = _numbers(event)
    if numbers:
        lines.append(f"  {numbers}")
    if event.other_processes:
        others = ", ".join(f"pid {p.pid} ({human_bytes(p.bytes)})" for p in event.other_processes)
        lines.append(f"  other processes on the GPU: {others}")
    if event.pool is Pool.KILLED_BY_OS:
        who = event.killer or "unknown killer"
        pid = f", pid {event.killed_pid}" if event.killed_pid is not None else ""
        lines.append(f"  killed by: {who}{pid}")
    advice = advise(event)
    if advice:
        lines.append("  what to try:")
        lines += [f"    {i}. {a.text}" for i, a in enumerate(advice, 1)]
    return lines


@click.command("diagnose")
@click.argument("files", nargs=-1, required=True)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON array of events (documented in the README).",
)
@handle_errors(PROG)
def diagnose(files: tuple[str, ...], as_json: bool) -> None:
    """Find out-of-memory events in ComfyUI logs (FILE, an /internal/logs dump, or - for stdin).

    Exit status: 0 no OOM failure found (recovered soft OOMs do not count), 1 at least one
    found, 3 a file cannot be read.
    """
    for path in files:  # fail before printing anything if a file cannot be opened at all
        if path != "-":
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    failures = recovered = 0
    first = True
    if as_json:
        click.echo("[", nl=False)
    for path in files:
        source = "-" if path == "-" else path
        with open_log(path) as stream:
            for finding in scan_log(stream):
                if finding.event.recovered:
                    recovered += 1
                else:
                    failures += 1
                if as_json:
                    text = json.dumps(finding_json(source, finding), ensure_ascii=False, indent=2)
                    click.echo(("\n" if first else ",\n") + _indent(text), nl=False)
                else:
                    if not first:
                        click.echo("")
                    click.echo("\n".join(_human(source, finding)))
                first = False
    if as_json:
        click.echo("\n]" if not first else "]")
    else:
        where = f"{len(files)} file{'s' if len(files) != 1 else ''}"
        if first:
            click.echo(f"No out-of-memory event found in {where}.")
        else:
            click.echo(
                f"\n{failures} OOM failure{'s' if failures != 1 else ''}, "
                f"{recovered} recovered soft OOM{'s' if recovered != 1 else ''} in {where}."
            )
    if failures:
        sys.exit(EXIT_FOUND)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
