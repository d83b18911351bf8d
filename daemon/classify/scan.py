"""Scanning a whole log file in constant memory: what ``diagnose`` runs.

The prefilter (classify/prefilter.py) finds the needle-holding lines at memory speed; only the
lines around them are decoded, assembled into records and folded into events
(classify/fold.py). One process: splitting a big file over forked workers measured no
faster than this on the development machine (issue 13), so the scan no longer does.
"""

from __future__ import annotations

import io
import re
from bisect import bisect_left
from collections.abc import Iterator
from typing import BinaryIO

from oom_sentinel.daemon.classify.fold import MERGE_GAP_LINES, Finding, _Folder
from oom_sentinel.daemon.classify.prefilter import DEFAULT_PREFILTER, PREFILTERS, Prefilter
from oom_sentinel.daemon.logs.records import RecordAssembler

_CHUNK = 4 * 1024 * 1024
#: a line longer than this is cut (memory stays bounded on a file without newlines)
_MAX_LINE = 256 * 1024
#: how far before a needle the scanner starts assembling records (lines)
LOOKBEHIND_LINES = 48
_LOOKBEHIND_BYTES = 64 * 1024
#: a needle this close after the last fed line continues the same window (no gap)
_CONTIGUOUS_LINES = MERGE_GAP_LINES + LOOKBEHIND_LINES
_CONTIGUOUS_BYTES = 1024 * 1024
_INDENTED_RUN = re.compile(rb"(?:[ \t][^\n]*\n)+")
#: a run of "plain" lines: each starts a record whatever precedes it (ComfyUI-Manager's prefix,
#: which split_prefix always takes, ASCII digits only), is short, and has no CR or ANSI code
_PLAIN_RUN = re.compile(
    rb"(?:\[\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d(?:\.\d+)?)?\][^\n\r\x1b]{0,4000}\n)+"
)
_BOUNDARY_BYTES = (b"got prompt", b"Prompt executed", b"nterrupt", b"Set vram state")
#: lines that probably start a record: the lookbehind stops a little before them
_RECORD_START = re.compile(
    rb"\[\d{4}-\d\d-\d\d \d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[.,]\d+ - |(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):"
    rb"|\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] |Traceback \(most|!!! Exception|# ComfyUI Error|Error occurred when"
)


class _StreamScanner:
    """Needle-driven scan of a byte stream; see ``scan_stream``.

    Invariants: ``buf`` starts at a line start; ``limit`` ends the complete lines in it; the
    window (when open) has fed every line before ``fed_pos``; needles before ``scan_pos`` are
    handled; ``floor`` is the first position a new window may feed (earlier lines belong to
    records already classified); ``hits`` are the prefilter's needle positions in
    ``buf[:limit]``.

    What it finds does not depend on where its reads end (on lines up to ``_MAX_LINE``): a
    refill keeps every line a later window's lookbehind may reach (``_keep_from``). Only the
    cut of a longer line falls where a read ends.
    """

    def __init__(
        self,
        stream: BinaryIO,
        chunk_size: int,
        hits_of: Prefilter,
        *,
        start_offset: int = 0,
        first_line_no: int = 1,
    ) -> None:
        self.stream = stream
        self.chunk_size = max(4096, chunk_size)
        self.hits_of = hits_of
        self.buf = bytearray()
        self.spare = bytearray(self.chunk_size)
        self.spare_view = memoryview(self.spare)
        self.buf_off = start_offset
        self.limit = 0
        self.cnt_pos = 0  # a line start in buf ...
        self.cnt_line = first_line_no  # ... and its line number
        self.scan_pos = 0
        self.floor = 0
        self.hits: list[int] = []
        self.asm: RecordAssembler | None = None
        self.fed_pos = 0
        self.fed_line = first_line_no
        self.first_line_no = first_line_no
        self.last_hit_line = 0
        self.folder = _Folder()
        self.eof = False

    def line_at(self, pos: int) -> int:
        """Line number of the line that starts at ``pos``."""
        if pos >= self.cnt_pos:
            self.cnt_line += self.buf.count(b"\n", self.cnt_pos, pos)
        else:
            self.cnt_line -= self.buf.count(b"\n", pos, self.cnt_pos)
        self.cnt_pos = pos
        return self.cnt_line

    def _readinto(self, target: bytearray) -> int:
        readinto = getattr(self.stream, "readinto", None)
        if readinto is not None:
            try:
                got = readinto(target)
            except (AttributeError, NotImplementedError, io.UnsupportedOperation):
                got = None
            if got is not None:
                return int(got)
        data = self.stream.read(len(target))
        target[: len(data)] = data
        return len(data)

    def needle_at_or_after(self, start: int) -> int:
        hits = self.hits
        i = bisect_left(hits, start)
        return hits[i] if i < len(hits) else -1

    def _keep_from(self, start: int) -> int:
        """Where a refill may cut the buffer when no window is open and ``start`` (a line start)
        is the next position to scan: no earlier than any line that ``open_window`` could
        reach from a needle at or after ``start``.

        The walk is ``open_window``'s without its stop at record starts. A walk from a later
        line has gone at least as many lines and bytes when it passes any line here, so it
        stops no earlier. Memory stays bounded: a line that does not fit in
        ``_LOOKBEHIND_BYTES + _MAX_LINE`` is not kept, and neither is anything before a cut
        (``start`` inside an over-long line).
        """
        if start > 0 and self.buf[start - 1] != 10:  # b"\n"
            return start
        floor = max(self.floor, 0)
        lowest = max(floor, start - _LOOKBEHIND_BYTES - _MAX_LINE)
        pos, back = start, 0
        while back < LOOKBEHIND_LINES and pos > floor and start - pos < _LOOKBEHIND_BYTES:
            nl = self.buf.rfind(b"\n", lowest, pos - 1)
            if nl >= 0:
                pos = nl + 1
            elif lowest == floor:
                pos = floor
            else:
                break  # the line before is too long to keep
            back += 1
        return pos

    def fill(self) -> None:
        keep = self.scan_pos if self.asm is None else min(self.scan_pos, self.fed_pos)
        keep = max(0, min(keep, self.limit))
        if self.asm is None:
            keep = self._keep_from(keep)
        self.line_at(keep)
        # One bytearray, trimmed at the front and refilled with readinto from one reused
        # buffer: no fresh multi-megabyte allocation (and its page faults) per chunk.
        del self.buf[:keep]
        got = self._readinto(self.spare)
        if got:
            self.buf += self.spare_view[:got]
        else:
            self.eof = True
        self.buf_off += keep
        for name in ("limit", "cnt_pos", "scan_pos", "floor", "fed_pos"):
            setattr(self, name, max(0, getattr(self, name) - keep))
        if self.eof:
            self.limit = len(self.buf)
        else:
            end = self.buf.rfind(b"\n") + 1
            if end <= self.limit and len(self.buf) - self.limit > _MAX_LINE:
                end = len(self.buf)  # an over-long line: cut it here
            self.limit = max(end, self.limit)
        self.hits = self.hits_of(self.buf, self.limit)

    def close_window(self) -> list[Finding]:
        if self.asm is not None:
            pending = self.asm.pending_start_offset
            self.floor = max(0, pending - self.buf_off) if pending is not None else self.fed_pos
            self.asm = None
        return self.folder.gap()

    def open_window(self, line_start: int, hit_line: int) -> None:
        pos, back = line_start, 0
        found_start = False
        extra = 0
        while back < LOOKBEHIND_LINES and pos > self.floor and line_start - pos < _LOOKBEHIND_BYTES:
            pos = max(self.buf.rfind(b"\n", self.floor, pos - 1) + 1, self.floor)
            back += 1
            if found_start:
                extra += 1
                if extra >= 2:
                    break
            elif _RECORD_START.match(self.buf, pos):
                found_start = True
        self.asm = RecordAssembler(first_line_no=hit_line - back)
        self.fed_pos, self.fed_line = pos, hit_line - back

    def feed(self) -> Iterator[Finding]:
        """Feed lines until the record holding the last needle is complete or data runs out."""
        asm = self.asm
        assert asm is not None
        buf, limit = self.buf, self.limit
        nxt = self.needle_at_or_after(self.fed_pos)
        while self.fed_pos < limit:
            if buf[self.fed_pos] in (32, 9) and asm.pending_line_no is not None:  # " ", "\t"
                # a run of indented lines (a traceback body) joins the pending record in bulk
                m = _INDENTED_RUN.match(buf, self.fed_pos, limit)
                if m and m.end() > self.fed_pos:
                    run_end = m.end()
                    block = buf[self.fed_pos : run_end - 1].decode("utf-8", "replace")
                    if asm.extend_indented(block, self.buf_off + run_end):
                        count = buf.count(b"\n", self.fed_pos, run_end)
                        if 0 <= nxt < run_end:
                            last = nxt
                            while 0 <= nxt < run_end:
                                last = nxt
                                nxt = self.needle_at_or_after(nxt + 1)
                            self.last_hit_line = self.fed_line + buf.count(
                                b"\n", self.fed_pos, last
                            )
                        self.fed_pos = run_end
                        self.fed_line += count
                        continue
            skip = self._plain_run(nxt) if buf[self.fed_pos] == 91 else None  # "["
            nl = buf.find(b"\n", self.fed_pos, limit)
            end = nl + 1 if nl >= 0 else limit
            line_end = nl if nl >= 0 else limit
            if line_end - self.fed_pos > _MAX_LINE:
                line_end = self.fed_pos + _MAX_LINE
            if 0 <= nxt < end:
                self.last_hit_line = self.fed_line
                nxt = self.needle_at_or_after(end)
            text = buf[self.fed_pos : line_end].decode("utf-8", "replace")
            for record in asm.feed_line(text, self.buf_off + self.fed_pos, self.buf_off + end):
                yield from self.folder.push(record)
            self.fed_pos = end
            line = self.fed_line
            self.fed_line += 1
            if line > self.last_hit_line and asm.pending_line_no == line:
                break  # the record with the last needle is complete
            if skip is not None:
                self._skip_plain(*skip)
        self.scan_pos = max(self.scan_pos, self.fed_pos)

    def _plain_run(self, nxt: int) -> tuple[int, int] | None:
        """(end, lines) of what ``_skip_plain`` may skip after the line at ``fed_pos``, when
        it starts a run of at least four plain lines (``_PLAIN_RUN``) that ends before the line
        of the next needle ``nxt`` and before ``last_hit_line``; else None.

        Such a run is the filler between two needles of one window (up to
        ``_CONTIGUOUS_LINES`` of progress bars and model loads). Each of its lines is a
        single-line record without a needle, ended by the next line: the window must count
        them and see the prompt boundaries among them, but nothing else about the records in
        the middle can change what is found. The first line and the last two are fed as
        usual: the record a needle's record follows (its node-type hint) is the last one, or
        the one before it when the needle's line continues the last.
        """
        if nxt < 0 or self.last_hit_line - self.fed_line < 4:
            return None
        buf, pos = self.buf, self.fed_pos
        stop = buf.rfind(b"\n", pos, nxt) + 1  # the needle's line start
        m = _PLAIN_RUN.match(buf, pos, stop)
        if m is None:
            return None
        lines = buf.count(b"\n", pos, m.end())
        if lines < 4 or self.fed_line + lines > self.last_hit_line:
            return None
        # the last two lines of the run are fed as usual (see above)
        end = buf.rfind(b"\n", pos, buf.rfind(b"\n", pos, m.end() - 1)) + 1
        return end, lines - 3

    def _skip_plain(self, end: int, lines: int) -> None:
        """Skip ``lines`` plain lines from ``fed_pos`` to ``end`` (see ``_plain_run``), the line
        before them being the pending record: as feeding them would, note their prompt
        boundaries and number the lines after them; the pending record is ended (and pushed)
        by the next line fed, with the same effect as the last skipped line's record."""
        asm = self.asm
        assert asm is not None
        buf, pos = self.buf, self.fed_pos
        for marker in _BOUNDARY_BYTES:
            at = buf.find(marker, pos, end)
            while at >= 0:
                start = max(pos, buf.rfind(b"\n", pos, at) + 1)
                stop = buf.find(b"\n", at, end)
                self.folder.note_boundary(buf[start:stop].decode("utf-8", "replace"))
                at = buf.find(marker, stop, end)
        asm.skip_lines(lines)
        self.fed_pos = end
        self.fed_line += lines

    def settled(self) -> bool:
        asm = self.asm
        return asm is None or (
            self.fed_line - 1 > self.last_hit_line and asm.pending_line_no == self.fed_line - 1
        )

    def run(self) -> Iterator[Finding]:
        while True:
            if self.asm is not None and not self.settled():
                if self.fed_pos < self.limit:
                    yield from self.feed()
                    continue
                if self.eof:
                    break
                self.fill()
                continue
            hit = self.needle_at_or_after(self.scan_pos)
            if hit < 0:
                self.scan_pos = self.limit
                if self.asm is not None:
                    start = self.buf.rfind(b"\n", 0, self.limit - 1) + 1 if self.limit else 0
                    if (
                        self.limit - self.fed_pos > _CONTIGUOUS_BYTES
                        or self.line_at(max(start, self.fed_pos)) - self.fed_line
                        > _CONTIGUOUS_LINES
                    ):
                        yield from self.close_window()
                if self.eof:
                    break
                self.fill()
                continue
            line_start = self.buf.rfind(b"\n", 0, hit) + 1
            hit_line = self.line_at(line_start)
            if (
                self.asm is not None
                and line_start >= self.fed_pos
                and hit_line - self.fed_line <= _CONTIGUOUS_LINES
            ):
                self.last_hit_line = hit_line
            else:
                if self.asm is not None:
                    yield from self.close_window()
                self.open_window(line_start, hit_line)
                self.last_hit_line = hit_line
            yield from self.feed()
        if self.asm is not None:
            for record in self.asm.flush():
                yield from self.folder.push(record)
            self.asm = None
        yield from self.folder.finish()

    def lines_read(self) -> int:
        """After ``run``: the number of newlines in everything read."""
        return self.line_at(len(self.buf)) - self.first_line_no


def scan_stream(
    stream: BinaryIO,
    *,
    chunk_size: int = _CHUNK,
    prefilter: str | None = None,
) -> Iterator[Finding]:
    """Scan a binary stream for OOM events in constant memory; what ``diagnose`` runs.

    Only the lines around a needle (``NEEDLES``) are decoded and assembled into records
    (from up to ``LOOKBEHIND_LINES`` before it until its record is complete); everything else
    is skipped at prefilter speed (``prefilter``: a name in ``PREFILTERS``, by default
    ``DEFAULT_PREFILTER``). On ordinary logs the findings equal those of ``iter_findings``
    over the same lines; they can differ only when one record is longer than the lookbehind
    and its needle sits past it (the event is the same, its record starts later).
    """
    name = prefilter or DEFAULT_PREFILTER
    if name not in PREFILTERS:
        raise ValueError(f"unknown prefilter {name!r}; this install has {sorted(PREFILTERS)}")
    # Offsets are the stream's own: a scan that starts in the middle of a file says where in
    # the file each record is.
    try:
        start = stream.tell()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        start = 0
    yield from _StreamScanner(stream, chunk_size, PREFILTERS[name], start_offset=start).run()
