"""Log lines → records → observations: the log source's stage. Each followed log has a record
assembler; a record the classifier calls an OOM becomes an ``Observation`` handed to the next
stage (the incident tracker, through ``act``), and keeps its *hold* on the log's read position
until the incident that counted it is durable (``release``), so a crash costs a re-read, never
a loss. Positions are committed from here (``commit_offsets``)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from oom_sentinel.daemon.classify import classify_record
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.incidents.tracker import FoldedRecord, Incident, Observation
from oom_sentinel.daemon.logs.records import Record, RecordAssembler
from oom_sentinel.daemon.logs.tail import LogLine, LogTailManager

log = logging.getLogger("oom_sentinel")

#: After the last line of a file, a pending record is closed this soon when nothing follows:
#: ComfyUI writes a traceback in one write, so 50 ms of quiet means the record is whole.
RECORD_IDLE_S = 0.05
#: Lines after the OOM record kept for log.txt (ComfyUI's "Memory summary" and "Got an OOM"
#: follow the traceback).
AFTER_LINES = 60
#: log.txt is bounded in bytes as well as lines: a line is kept up to this many characters
#: (a 50 MB line must not make every later snapshot 63 MB), the whole text up to LOG_TEXT_BYTES
CONTEXT_LINE_CHARS = 4096
LOG_TEXT_BYTES = 256 * 1024
#: Log record ids remembered as read (soft OOMs included) without asking the store again.
RECENT_RECORD_IDS = 20_000
#: while a backlog is read, incidents are acted on and read positions saved at least this often
#: (in records and in seconds), so a restart in the middle repeats little work
BACKLOG_BATCH_RECORDS = 16
BACKLOG_BATCH_S = 0.25


@dataclass
class _LogKeyState:
    """Per followed log: its record assembler, recent lines and where it was read up to."""

    instance: str
    assembler: RecordAssembler = field(default_factory=RecordAssembler)
    #: (path, start_offset, text) of recent lines, for log.txt
    recent: deque[tuple[str, int, str]] = field(default_factory=lambda: deque(maxlen=400))
    path: str | None = None
    end_offset: int = 0
    last_line_at: float = 0.0


@dataclass(frozen=True)
class _Held:
    key: str
    path: str
    start_offset: int
    #: emission order: the oldest hold of a key is where its read position must stay
    seq: int


def _record_id(key: str, record: Record) -> str:
    digest = hashlib.sha1(record.text.encode("utf-8", "replace")).hexdigest()[:16]
    return f"{key}|{record.start_offset}|{digest}"


def _record_time(record: Record, fallback: float) -> float:
    """The record's own time (Manager/Desktop prefix, local time) where it has one."""
    stamp = record.timestamp
    if not stamp:
        return fallback
    text = stamp.strip("[] ").replace("T", " ")
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    return fallback


def _clip_line(text: str) -> str:
    """A log line as kept for context: at most CONTEXT_LINE_CHARS characters."""
    if len(text) <= CONTEXT_LINE_CHARS:
        return text
    return f"{text[:CONTEXT_LINE_CHARS]} [... {len(text) - CONTEXT_LINE_CHARS} characters cut]"


def _bounded_context(header: str, before: Sequence[str], after: Sequence[str]) -> str:
    """log.txt's text within LOG_TEXT_BYTES: the record and what follows it first, then as
    many of the lines before it as fit (the oldest go first)."""
    budget = LOG_TEXT_BYTES - len(header.encode("utf-8", "replace")) - 1
    kept_after: list[str] = []
    for line in after:
        cost = len(line.encode("utf-8", "replace")) + 1
        if cost > budget:
            break
        kept_after.append(line)
        budget -= cost
    kept_before: list[str] = []
    for line in reversed(before):
        cost = len(line.encode("utf-8", "replace")) + 1
        if cost > budget:
            break
        kept_before.append(line)
        budget -= cost
    kept_before.reverse()
    return "\n".join([header, *kept_before, *kept_after])


#: the next stage: the tracker observes a batch and its actions are applied
Act = Callable[[list[Observation]], None]


class LogRecords:
    """Every followed log's assembler, holds and recent lines; main loop only."""

    def __init__(
        self,
        tails: LogTailManager,
        counted_by: Callable[[str], str | None],
        *,
        context_lines: int,
    ) -> None:
        self.tails = tails
        self._counted_by = counted_by
        #: log lines kept before an OOM record (``[logs] context_lines``; a reload changes it)
        self.context_lines = context_lines
        self.keys: dict[str, _LogKeyState] = {}
        self._holds: dict[str, _Held] = {}
        self._hold_seq = 0
        #: record ids seen lately (recent snapshots' at start-up, then every record read);
        #: bounded -- the store's incident_records is the durable answer
        self._handled: OrderedDict[str, None] = OrderedDict()
        #: log lines before each OOM record, until its snapshot is written
        self._contexts: dict[str, tuple[str, ...]] = {}

    def follow(self, path: str, *, instance: str) -> None:
        key = os.path.abspath(os.path.expanduser(path))
        if key in self.keys:
            return
        self.keys[key] = _LogKeyState(instance=instance)
        self.tails.add(key)
        log.info("following %s (%s)", key, instance)

    def instance_of(self, key: str) -> str | None:
        state = self.keys.get(key)
        return state.instance if state is not None else None

    def reading(self) -> set[str]:
        """The instances whose log is read now, or there to be read at the next poll (a file
        that does not exist yet -- Manager's log before its first start -- is not waited for)."""
        out: set[str] = set()
        for key, follower in self.tails.followers.items():
            state = self.keys.get(key)
            if state is None or state.instance in out:
                continue
            if follower.state.path is not None or os.path.exists(key):
                out.add(state.instance)
        return out

    def assembling(self) -> bool:
        """Whether a record is being assembled (the loop wakes RECORD_IDLE_S later)."""
        return any(s.assembler.pending_start_offset is not None for s in self.keys.values())

    def remember(self, rid: str) -> None:
        self._handled[rid] = None
        while len(self._handled) > RECENT_RECORD_IDS:
            self._handled.popitem(last=False)

    def handle_lines(self, lines: Sequence[LogLine], now: float, act: Act) -> None:
        observations: list[Observation] = []
        batch_start = time.monotonic()
        for line in lines:
            if observations and (
                len(observations) >= BACKLOG_BATCH_RECORDS
                or time.monotonic() - batch_start >= BACKLOG_BATCH_S
            ):
                # A backlog: act on what was read so far and save the positions, so a restart
                # in the middle of it repeats at most one batch.
                act(observations)
                observations = []
                self.commit_offsets()
                batch_start = time.monotonic()
            state = self.keys.get(line.key)
            if state is None:
                continue
            if state.path is not None and (
                line.path != state.path or line.start_offset != state.end_offset
            ):
                # a record never spans two files (or a gap): close the pending one first
                for record in state.assembler.flush():
                    self._on_record(line.key, state, state.path, record, now, observations)
            state.recent.append((line.path, line.start_offset, _clip_line(line.text)))
            for record in state.assembler.feed(line.text, line.start_offset, line.end_offset):
                self._on_record(line.key, state, line.path, record, now, observations)
            state.path = line.path
            state.end_offset = line.end_offset
            state.last_line_at = now
        if observations:
            act(observations)

    def flush_idle(self, now: float, act: Act) -> None:
        """Close the records nothing followed for RECORD_IDLE_S."""
        observations: list[Observation] = []
        for key, state in self.keys.items():
            if state.assembler.pending_start_offset is None or state.path is None:
                continue
            if now - state.last_line_at >= RECORD_IDLE_S:
                for record in state.assembler.flush():
                    self._on_record(key, state, state.path, record, now, observations)
        if observations:
            act(observations)

    def _on_record(
        self,
        key: str,
        state: _LogKeyState,
        path: str,
        record: Record,
        now: float,
        out: list[Observation],
    ) -> None:
        event = classify_record(record.text)
        if event is None:
            return
        rid = _record_id(key, record)
        if rid in self._handled or self._counted_by(rid) is not None:
            return  # an incident already counted it (re-read after a crash)
        self.remember(rid)
        if not event.recovered:
            self._hold_seq += 1
            self._holds[rid] = _Held(key, path, record.start_offset, self._hold_seq)
        out.append(
            Observation(
                instance=state.instance,
                source="log",
                event=event,
                at_s=_record_time(record, now),
                evidence={
                    "record_id": rid,
                    "log_path": path,
                    "start_offset": record.start_offset,
                    "end_offset": record.end_offset,
                    "line_no": record.line_no,
                },
            )
        )
        before = [text for p, off, text in state.recent if p == path and off < record.start_offset]
        self._contexts[rid] = tuple(before[-self.context_lines :])

    def release(self, records: Iterable[FoldedRecord]) -> None:
        """The records are counted durably: their log positions may move past them."""
        for record in records:
            self._holds.pop(record.record_id, None)
            self._contexts.pop(record.record_id, None)

    def log_text(self, incident: Incident) -> str:
        """``log.txt``: the first log record's neighbourhood (it tells the story)."""
        chunks: list[str] = []
        for obs in incident.observations:
            ev = obs.evidence
            if obs.source != "log" or "record_id" not in ev:
                continue
            key = str(ev["record_id"]).split("|", 1)[0]
            state = self.keys.get(key)
            before = list(self._contexts.get(str(ev["record_id"]), ()))
            after: list[str] = []
            if state is not None:
                after = [
                    text
                    for p, off, text in state.recent
                    if p == ev.get("log_path") and off >= int(ev.get("start_offset", 0))
                ][:AFTER_LINES]
            chunks.append(_bounded_context(f"==> {ev.get('log_path')} <==", before, after))
            break
        return "\n".join(chunks) + ("\n" if chunks else "")

    def commit_offsets(self) -> None:
        """Save each log's position: before its oldest record not yet counted durably (held,
        possibly in a file rotated since -- ``.prev.log``), else before the record still being
        assembled, else after the last line read."""
        oldest: dict[str, _Held] = {}
        for held in self._holds.values():
            if held.key not in oldest or held.seq < oldest[held.key].seq:
                oldest[held.key] = held
        for key, state in self.keys.items():
            if state.path is None:
                continue
            path, offset = state.path, state.end_offset
            pending = state.assembler.pending_start_offset
            if pending is not None:
                offset = min(offset, pending)
            first_held = oldest.get(key)
            if first_held is not None:
                path, offset = first_held.path, first_held.start_offset
            try:
                self.tails.commit(key, path, offset)
            except SentinelError as exc:
                log.warning("could not save the read position of %s: %s", key, exc)
            except ValueError as exc:  # a position the follower no longer knows: keep the old
                log.debug("%s", exc)
