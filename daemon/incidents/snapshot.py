"""Crash snapshots: one directory per incident, complete on disk or not there at all.

A snapshot is the evidence a user attaches to a bug report and what ``oom-bisect`` replays, so
it must never be half-written (the daemon may be killed by the same OOM it records) and never
change after the fact. The writer builds it under ``.tmp-<name>-<random>`` in the snapshots
directory, fsyncs every file and the directory, then renames it to
``<UTC YYYYmmddTHHMMSSZ>_<pool>_<node type or source>`` (``_2``, ``_3``... on collision) and
fsyncs the parent. Directory 0700, files 0600: prompts and logs are private. Everything goes
through ``redact`` on the way out.

Files: ``snapshot.json`` (versioned; its models are ``snapshot_model.SnapshotDoc``, and
``snapshot.schema.json``, generated from them, ships next to this module), ``log.txt`` (the
record and the lines before it), ``timeline.csv`` (the memory ring buffer), and when captured
``prompt.json`` (API format) and ``workflow.json`` (UI format).

Only the daemon writes; ``clean_leftovers`` (at daemon start) removes ``.tmp-*`` and ``.trash-*``
directories a crash left behind. Retention lives in ``retention.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from oom_sentinel.daemon.classify.advice import Advice
from oom_sentinel.daemon.core.atomic import fsync_dir, write_bytes_atomic
from oom_sentinel.daemon.core.errors import InputError, SentinelError
from oom_sentinel.daemon.core.redact import redact, redact_text
from oom_sentinel.daemon.incidents.snapshot_model import (
    SCHEMA_FILE,
    SCHEMA_VERSION,
    AdviceEntry,
    EventModel,
    FilesSection,
    GpuEntry,
    GpuProcessEntry,
    HostMemory,
    HostSection,
    IncidentSection,
    InstanceSection,
    MemorySection,
    ObservationEntry,
    ProcessTreeEntry,
    RecordEntry,
    SnapshotDoc,
    SnapshotHead,
    SnapshotRecords,
    parse_snapshot_doc,
    validation_problem,
)
from oom_sentinel.daemon.incidents.tracker import FoldedRecord, Incident
from oom_sentinel.daemon.probes.base import MemorySample

__all__ = [
    "OPTIONAL_SECTIONS",
    "SCHEMA_VERSION",
    "SNAPSHOTS_SUBDIR",
    "SNAPSHOT_ID_PLACEHOLDER",
    "SNAPSHOT_NAME_RE",
    "AdviceItem",
    "HostFacts",
    "InstanceInfo",
    "Snapshot",
    "SnapshotContent",
    "SnapshotNotFound",
    "SnapshotRef",
    "SnapshotWriteError",
    "build_snapshot",
    "build_snapshot_json",
    "clean_leftovers",
    "collect_host_facts",
    "export_snapshot",
    "find_snapshot",
    "iso_utc",
    "list_snapshots",
    "load_snapshot",
    "parse_iso_utc",
    "snapshot_dirs",
    "snapshot_name",
    "snapshot_records",
    "snapshots_dir",
    "validate_snapshot_json",
    "write_snapshot",
]

#: generated from ``snapshot_model`` (``scripts/snapshot_schema.py``), shipped for other tools
SCHEMA_PATH = SCHEMA_FILE
#: names of snapshot directories we wrote (retention and lookup touch nothing else)
SNAPSHOT_NAME_RE = re.compile(r"^(\d{8}T\d{6}Z)_[A-Za-z0-9._+-]+$")
#: optional top-level sections later issues fill; each is a JSON object when present
OPTIONAL_SECTIONS = (
    "process",
    "kernel",
    "install_state",
    "regression",
    "system_stats",
    "internal_logs",
)
#: Stands for the snapshot's id in ``summary``, ``advice[].text`` and the ``regression``
#: section until the writer has named the directory (``oom-bisect <snapshot-id>``).
SNAPSHOT_ID_PLACEHOLDER = "<snapshot-id>"
#: where snapshots live inside the data dir
SNAPSHOTS_SUBDIR = "snapshots"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"


class SnapshotNotFound(SentinelError):
    """No snapshot (or more than one) matches the id the user gave."""


class SnapshotWriteError(SentinelError):
    """A snapshot could not be written (disk full, permissions); nothing partial is left."""


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    name: str
    path: str | None = None
    url: str | None = None


#: one ranked suggestion in ``snapshot.json``'s ``advice``: the advice module's own dataclass
#: (``key``, a stable machine key such as "expandable-segments", and ``text``), not a copy
AdviceItem = Advice


@dataclass(frozen=True, slots=True)
class HostFacts:
    hostname: str
    os: str
    os_release: str
    kernel: str
    python: str
    cpu_count: int | None
    version: str

    def to_json(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "os": self.os,
            "os_release": self.os_release,
            "kernel": self.kernel,
            "python": self.python,
            "cpu_count": self.cpu_count,
            "version": self.version,
        }


def collect_host_facts() -> HostFacts:
    """Facts about this machine; never raises (unknowns read as "unknown" / None)."""

    def safe(fn: Any, default: str = "unknown") -> str:
        try:
            return str(fn()) or default
        except Exception:
            return default

    def os_release() -> str:
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                info = platform.freedesktop_os_release()
                return info.get("PRETTY_NAME") or platform.platform()
        return platform.platform()

    def version() -> str:
        from importlib.metadata import version as dist_version

        return dist_version("oom-sentinel")

    return HostFacts(
        hostname=safe(socket.gethostname),
        os=safe(platform.system),
        os_release=safe(os_release),
        kernel=safe(platform.release),
        python=safe(platform.python_version),
        cpu_count=os.cpu_count(),
        version=safe(version),
    )


@dataclass(frozen=True)
class SnapshotContent:
    """Everything one snapshot holds; the caller gathers it, ``write_snapshot`` persists it."""

    incident: Incident
    instance: InstanceInfo
    host: HostFacts
    #: wall-clock seconds the snapshot is taken at (names the directory)
    created_s: float
    #: ranked advice, first to try first
    advice: Sequence[AdviceItem] = ()
    #: the memory sample nearest the incident
    memory: MemorySample | None = None
    #: the record and the lines before it (log.txt)
    log_text: str = ""
    #: the timeline ring buffer as CSV text (timeline.csv)
    timeline_csv: str = ""
    #: the API-format prompt that was running (prompt.json)
    prompt: Mapping[str, Any] | None = None
    #: the UI-format workflow (workflow.json)
    workflow: Mapping[str, Any] | None = None
    #: optional sections by name (see OPTIONAL_SECTIONS), each a JSON-ready mapping
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the source records the incident had counted when the snapshot was written: a restart
    #: that finds this snapshot without its store row restores them with the row
    records: Sequence[FoldedRecord] = ()


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    id: str
    path: Path
    created_s: float


def snapshots_dir(data_dir: str | os.PathLike[str]) -> Path:
    """``<data_dir>/snapshots``."""
    return Path(data_dir) / SNAPSHOTS_SUBDIR


def iso_utc(seconds: float) -> str:
    """``2026-01-02T10:11:12.345Z``."""
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_iso_utc(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError, TypeError):
        return None


_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]+")


def _sanitize(part: str, limit: int = 48) -> str:
    cleaned = _UNSAFE.sub("-", part).strip("-.")[:limit].strip("-.")
    return cleaned or "unknown"


def snapshot_name(created_s: float, incident: Incident) -> str:
    """``20260102T101112Z_gpu_KSampler`` (or the first source when the node is unknown)."""
    stamp = datetime.fromtimestamp(created_s, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    first_source = incident.observations[0].source if incident.observations else None
    what = incident.node_type or first_source or (incident.sources[:1] or ("unknown",))[0]
    return f"{stamp}_{_sanitize(str(incident.pool))}_{_sanitize(what)}"


# --- snapshot.json ----------------------------------------------------------------------------


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Plain JSON types only: tuples become lists, NaN/inf become null, odd objects text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 100:
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _memory_section(sample: MemorySample) -> MemorySection:
    watched = {tree.root_pid for tree in sample.process_trees}
    host = sample.host
    return MemorySection(
        time=iso_utc(sample.time_s),
        gpus=[
            GpuEntry(
                index=g.index,
                name=g.name,
                uuid=g.uuid,
                total_bytes=g.total_bytes,
                used_bytes=g.used_bytes,
                free_bytes=g.free_bytes,
                reserved_bytes=g.reserved_bytes,
            )
            for g in sample.gpus
        ],
        gpu_processes=[
            GpuProcessEntry(
                pid=p.pid,
                device_index=p.device_index,
                used_bytes=p.used_bytes,
                name=p.name,
                cmdline=list(p.cmdline) if p.cmdline is not None else None,
                watched=p.pid in watched,
            )
            for p in sample.gpu_processes
        ],
        host=None
        if host is None
        else HostMemory(
            ram_total_bytes=host.ram_total_bytes,
            ram_available_bytes=host.ram_available_bytes,
            swap_total_bytes=host.swap_total_bytes,
            swap_used_bytes=host.swap_used_bytes,
            commit_limit_bytes=host.commit_limit_bytes,
            committed_bytes=host.committed_bytes,
        ),
        process_trees=[
            ProcessTreeEntry(
                root_pid=t.root_pid, rss_bytes=t.rss_bytes, peak_rss_bytes=t.peak_rss_bytes
            )
            for t in sample.process_trees
        ],
    )


def _advice_entries(items: Sequence[AdviceItem]) -> list[AdviceEntry]:
    return [AdviceEntry(key=item.key or "", text=item.text) for item in items if item.text]


def _record_entry(record: FoldedRecord) -> RecordEntry:
    return RecordEntry(
        id=record.record_id,
        failure=record.failure,
        source=record.source,
        rule=record.rule,
        at_s=record.at_s,
        prompt_id=record.prompt_id,
    )


def snapshot_records(data: Snapshot | Mapping[str, Any]) -> list[FoldedRecord]:
    """The records a snapshot says its incident had counted (none for old ones); a record
    that does not read as one is left out, the others still count."""
    try:
        items = SnapshotRecords.model_validate(
            data.data if isinstance(data, Snapshot) else data
        ).incident.records
    except ValidationError:
        return []
    out: list[FoldedRecord] = []
    for item in items:
        try:
            r = RecordEntry.model_validate(item)
        except ValidationError:
            continue
        out.append(FoldedRecord(r.id, r.failure, r.source, r.rule, r.at_s, r.prompt_id))
    return out


def build_snapshot(content: SnapshotContent, snapshot_id: str) -> SnapshotDoc:
    """The ``snapshot.json`` document for ``content``, redacted.

    Built as models (a field of the wrong type fails here, in the writer's tests, not in a
    reader months later), redacted as plain JSON, and checked again after redaction, so
    what is written is a valid document."""
    inc = content.incident
    unknown_sections = set(content.sections) - set(OPTIONAL_SECTIONS)
    if unknown_sections:
        raise ValueError(f"unknown snapshot sections: {sorted(unknown_sections)}")
    files = FilesSection(
        log="log.txt",
        timeline="timeline.csv",
        prompt="prompt.json" if content.prompt is not None else None,
        workflow="workflow.json" if content.workflow is not None else None,
    )
    built = SnapshotDoc(
        schema_version=SCHEMA_VERSION,
        id=snapshot_id,
        created=iso_utc(content.created_s),
        incident=IncidentSection(
            id=inc.id,
            fingerprint=inc.fingerprint,
            first_seen=iso_utc(inc.first_seen_s),
            last_seen=iso_utc(inc.last_seen_s),
            count=inc.count,
            # absent, not empty, when there are none: the shape snapshots always had
            **({"records": [_record_entry(r) for r in content.records]} if content.records else {}),
        ),
        instance=InstanceSection(
            name=content.instance.name, path=content.instance.path, url=content.instance.url
        ),
        summary=inc.summary,
        event=EventModel.model_validate(_jsonable(inc.event.to_json())),
        observations=[
            ObservationEntry(
                source=o.source,
                at=iso_utc(o.at_s),
                event=EventModel.model_validate(_jsonable(o.event.to_json())),
                evidence=_jsonable(dict(o.evidence)),
            )
            for o in inc.observations
        ],
        sources=list(inc.sources),
        advice=_advice_entries(content.advice),
        memory=_memory_section(content.memory) if content.memory is not None else None,
        host=HostSection.model_validate(content.host.to_json()),
        files=files,
    )
    data = built.model_dump(mode="json", exclude_unset=True)
    for name in OPTIONAL_SECTIONS:
        if name in content.sections:
            data[name] = _jsonable(dict(content.sections[name]))
    cleaned = redact(data)
    # Structural fields must survive redaction untouched (a key named "token" in evidence is
    # redacted, but the id and file names are ours).
    cleaned["id"] = snapshot_id
    cleaned["files"] = files.model_dump(mode="json")
    doc = _checked(cleaned, snapshot_id)
    return _fill_snapshot_id(doc, snapshot_id)


def _checked(data: dict[str, Any], snapshot_id: str) -> SnapshotDoc:
    """``data`` as a valid document. An optional section that does not match its model (a
    bug in the module that made it) is left out and named in ``dropped_sections``: the
    incident is still recorded, and readable, rather than lost with its snapshot."""
    while True:
        try:
            return SnapshotDoc.model_validate(data)
        except ValidationError as exc:
            bad = sorted(
                {str(e["loc"][0]) for e in exc.errors() if e["loc"]} & set(OPTIONAL_SECTIONS)
            )
            if not bad:  # our own part: a bug in this writer or in redact's rules
                raise ValueError(f"snapshot {snapshot_id}: {validation_problem(exc)}") from None
            dropped = dict(data.get("dropped_sections") or {})
            for name in bad:
                del data[name]
                dropped[name] = validation_problem(exc, within=name)
            data["dropped_sections"] = dropped


def build_snapshot_json(content: SnapshotContent, snapshot_id: str) -> dict[str, Any]:
    """``build_snapshot`` as JSON-ready data (what ``snapshot.json`` holds)."""
    return build_snapshot(content, snapshot_id).model_dump(mode="json", exclude_unset=True)


def _fill_snapshot_id(doc: SnapshotDoc, snapshot_id: str) -> SnapshotDoc:
    """Replace ``SNAPSHOT_ID_PLACEHOLDER`` where the text names this snapshot (the id is only
    known once the directory has its name)."""

    def fill(value: str) -> str:
        return value.replace(SNAPSHOT_ID_PLACEHOLDER, snapshot_id)

    update: dict[str, Any] = {
        "summary": fill(doc.summary),
        "advice": [a.model_copy(update={"text": fill(a.text)}) for a in doc.advice],
    }
    if doc.regression is not None:
        command = doc.regression.bisect_command
        update["regression"] = doc.regression.model_copy(
            update={
                "reason": fill(doc.regression.reason),
                "bisect_command": None if command is None else fill(command),
            }
        )
    return doc.model_copy(update=update)


def _dump_json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def _dump_doc(doc: SnapshotDoc) -> bytes:
    """snapshot.json: the fields the writer set (an optional section it had nothing for stays
    absent, as in every earlier version)."""
    return doc.model_dump_json(indent=2, exclude_unset=True).encode() + b"\n"


def _dump_document(document: Mapping[str, Any]) -> bytes:
    """prompt.json / workflow.json: redacted, otherwise as ComfyUI gave them (they are replayed),
    on one line -- the C encoder is ~10x faster than indenting a large workflow."""
    return (json.dumps(redact(document), ensure_ascii=False, default=str) + "\n").encode()


# --- writing ----------------------------------------------------------------------------------


def _write_private(path: Path, data: bytes) -> None:
    """A new file inside the snapshot's private temp directory: no rename per file, since the
    whole directory is renamed into place once every file is written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def write_snapshot(snapshots_dir: str | os.PathLike[str], content: SnapshotContent) -> SnapshotRef:
    """Write one snapshot atomically and return where it is; never rewrites an existing one."""
    root = Path(snapshots_dir)
    base = snapshot_name(content.created_s, content.incident)
    tmp: Path | None = None
    try:
        _ensure_private_dir(root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{base}-", dir=root))
        os.chmod(tmp, 0o700)
        log_text = redact_text(content.log_text)
        if log_text and not log_text.endswith("\n"):
            log_text += "\n"
        _write_private(tmp / "log.txt", log_text.encode("utf-8", "replace"))
        _write_private(tmp / "timeline.csv", redact_text(content.timeline_csv).encode())
        if content.prompt is not None:
            _write_private(tmp / "prompt.json", _dump_document(content.prompt))
        if content.workflow is not None:
            _write_private(tmp / "workflow.json", _dump_document(content.workflow))
        for attempt in range(1, 1000):
            name = base if attempt == 1 else f"{base}_{attempt}"
            final = root / name
            if os.path.lexists(final):
                continue
            _write_private(tmp / "snapshot.json", _dump_doc(build_snapshot(content, name)))
            fsync_dir(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if os.path.lexists(final):  # lost a race for the name: take the next one
                    continue
                raise
            tmp = None
            fsync_dir(root)
            return SnapshotRef(id=name, path=final, created_s=content.created_s)
        raise SnapshotWriteError(f"{root}: no free snapshot name for {base}")
    except OSError as exc:
        raise SnapshotWriteError(
            f"{exc.filename or root}: cannot write the snapshot: {exc.strerror or exc}"
        ) from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def clean_leftovers(snapshots_dir: str | os.PathLike[str]) -> list[str]:
    """Remove ``.tmp-*`` (a crash mid-write) and ``.trash-*`` (a crash mid-prune) directories.

    Call at daemon start, before any writer runs. Returns the names removed.
    """
    root = Path(snapshots_dir)
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)) and entry.is_dir(
            follow_symlinks=False
        ):
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(entry.name)
    return sorted(removed)


# --- reading ----------------------------------------------------------------------------------


def _newer_version(data: Mapping[str, Any]) -> str | None:
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        return (
            f"schema_version {version} was written by a newer oom-sentinel "
            f"(this one reads up to {SCHEMA_VERSION})"
        )
    return None


def validate_snapshot_json(data: Any) -> str | None:
    """None when ``data`` is a valid snapshot.json document, else one line saying where not."""
    if not isinstance(data, Mapping):
        return "snapshot.json is not a JSON object"
    newer = _newer_version(data)
    if newer:
        return newer
    try:
        SnapshotDoc.model_validate(data)
    except ValidationError as exc:
        return validation_problem(exc)
    return None


@dataclass(frozen=True)
class Snapshot:
    """A snapshot read back from disk.

    ``data`` is its snapshot.json as written (``show --json`` and ``export`` pass it on
    unchanged); ``head`` the fields a listing reads; ``doc`` the whole typed document, checked
    when ``load_snapshot`` was asked to validate, else on first use (``InputError`` then)."""

    id: str
    path: Path
    data: Mapping[str, Any]
    head: SnapshotHead
    _doc: SnapshotDoc | None = field(default=None, repr=False, compare=False)

    @property
    def doc(self) -> SnapshotDoc:
        if self._doc is None:
            object.__setattr__(
                self, "_doc", parse_snapshot_doc(self.data, str(self.path / "snapshot.json"))
            )
        assert self._doc is not None
        return self._doc

    @property
    def created(self) -> str:
        return self.head.created

    @property
    def event(self) -> dict[str, Any]:
        """The event as a plain dict (the listing's fields checked, the rest as written), for
        the callers that still read it as a mapping (the service's recovery)."""
        return self.head.event.model_dump()

    @property
    def instance_name(self) -> str:
        return self.head.instance.name

    @property
    def summary(self) -> str:
        return self.head.summary

    def list_entry(self) -> dict[str, Any]:
        """The ``snapshots list --json`` object for this snapshot."""
        event = self.head.event
        return {
            "id": self.id,
            "created": self.created,
            "instance": self.instance_name,
            "pool": event.pool,
            "backend": event.backend,
            "node_type": event.node_type,
            "exception_type": event.exception_type,
            "summary": self.summary,
            "count": self.head.incident.count if self.head.incident is not None else None,
            "path": str(self.path),
        }


def load_snapshot(path: str | os.PathLike[str], *, validate: bool = True) -> Snapshot:
    """Read one snapshot directory; ``InputError`` (one line: the file, the field, what is
    wrong) for a foreign or corrupt one. ``validate=False`` checks only what a listing reads
    (hundreds list quickly, and one odd snapshot does not hide from the restart recovery)."""
    directory = Path(path)
    doc = directory / "snapshot.json"
    try:
        raw = doc.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{directory}: not an oom-sentinel snapshot (no snapshot.json)") from None
    except OSError as exc:
        raise InputError(f"{doc}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{doc}: not UTF-8 text; the snapshot is corrupt") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{doc}: not valid JSON (line {exc.lineno}, column {exc.colno}); "
            "the snapshot is corrupt"
        ) from None
    except RecursionError:
        raise InputError(f"{doc}: nested too deeply; the snapshot is corrupt") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError(f"{doc}: not an oom-sentinel snapshot (no schema_version)")
    newer = _newer_version(data)
    if newer:
        raise InputError(f"{doc}: {newer}")
    try:
        head = SnapshotHead.model_validate(data)
        full = parse_snapshot_doc(data, str(doc)) if validate else None
    except ValidationError as exc:
        raise InputError(f"{doc}: {validation_problem(exc)}") from None
    except RecursionError:
        raise InputError(f"{doc}: nested too deeply; the snapshot is corrupt") from None
    return Snapshot(id=directory.name, path=directory, data=data, head=head, _doc=full)


def snapshot_dirs(snapshots_dir: str | os.PathLike[str]) -> list[Path]:
    """Our snapshot directories, oldest first by name (never ``.tmp-``/``.trash-`` ones)."""
    root = Path(snapshots_dir)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"{root}: cannot list snapshots: {exc.strerror or exc}") from None
    dirs = [
        Path(e.path)
        for e in entries
        if SNAPSHOT_NAME_RE.match(e.name) and e.is_dir(follow_symlinks=False)
    ]
    return sorted(dirs, key=lambda p: p.name)


def list_snapshots(
    snapshots_dir: str | os.PathLike[str], *, newest: int | None = None
) -> tuple[list[Snapshot], list[str]]:
    """Readable snapshots newest first, and one line per snapshot that could not be read;
    only the ``newest`` directories are read when given."""
    snapshots: list[Snapshot] = []
    problems: list[str] = []
    for directory in list(reversed(snapshot_dirs(snapshots_dir)))[:newest]:
        try:
            snapshots.append(load_snapshot(directory, validate=False))
        except InputError as exc:
            problems.append(str(exc))
    return snapshots, problems


def find_snapshot(snapshots_dir: str | os.PathLike[str], ref: str) -> Path:
    """The snapshot a user means: its id, a unique prefix of it, or a path to its directory."""
    root = Path(snapshots_dir)
    given = Path(ref)
    if ref and (given.is_absolute() or os.sep in ref) and (given / "snapshot.json").is_file():
        return given
    names = [p.name for p in snapshot_dirs(root)]
    if ref in names:
        return root / ref
    matches = [n for n in names if ref and n.startswith(ref)]
    if len(matches) == 1:
        return root / matches[0]
    if not matches:
        raise SnapshotNotFound(f"no snapshot {ref!r} in {root}")
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    raise SnapshotNotFound(
        f"{ref!r} matches {len(matches)} snapshots in {root}: {shown}; give more of the id"
    )


# --- export -----------------------------------------------------------------------------------

_EXPORT_FILES = ("snapshot.json", "log.txt", "timeline.csv", "prompt.json", "workflow.json")


def export_snapshot(snapshot: Snapshot, out_file: str | os.PathLike[str]) -> Path:
    """A zip of the snapshot for a bug report, written atomically (0600).

    Everything passes through ``redact`` again, so rules added since the snapshot was written
    apply to what leaves the machine.
    """
    out = Path(out_file)
    buffer = io.BytesIO()
    try:
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name in _EXPORT_FILES:
                source = snapshot.path / name
                if source.is_file():
                    zf.writestr(f"{snapshot.id}/{name}", _export_bytes(source))
            for name in _attached_report_files(snapshot.path):
                zf.writestr(f"{snapshot.id}/{name}", _export_bytes(snapshot.path / name))
        return write_bytes_atomic(out, buffer.getvalue(), mode=0o600)
    except OSError as exc:
        raise SnapshotWriteError(
            f"{exc.filename or out}: cannot write the export: {exc.strerror or exc}"
        ) from exc


def _attached_report_files(path: Path) -> list[str]:
    """``bisect/report.json`` … of every bisect report attached to the snapshot (the folders
    ``oom-bisect`` adds; see ``bisect_results.py``), relative to the snapshot."""
    out: list[str] = []
    try:
        folders = sorted(
            p.name for p in path.iterdir() if re.match(r"^bisect(?:-\d+)?$", p.name) and p.is_dir()
        )
    except OSError:
        return out
    for folder in folders:
        for name in ("report.json", "report.html"):
            if (path / folder / name).is_file():
                out.append(f"{folder}/{name}")
    return out


def _export_bytes(source: Path) -> bytes:
    raw = source.read_bytes()
    text = raw.decode("utf-8", "replace")
    if source.suffix == ".json":
        try:
            return _dump_json(_keep_ids(json.loads(text), redact(json.loads(text))))
        except ValueError:
            pass
    return redact_text(text).encode("utf-8")


def _keep_ids(original: Any, cleaned: Any) -> Any:
    if isinstance(original, dict) and isinstance(cleaned, dict) and "schema_version" in original:
        for key in ("id", "files"):
            if key in original:
                cleaned[key] = original[key]
    return cleaned
