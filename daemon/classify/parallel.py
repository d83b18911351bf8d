"""A big regular file scanned by this process and forked workers at once, with exactly the
sequential scan's findings (see below). Loaded only by ``scan_stream`` when it splits a file.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import tempfile
import threading
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from typing import Any, BinaryIO

from oom_sentinel.daemon.classify.fold import Finding
from oom_sentinel.daemon.classify.prefilter import PREFILTERS, Prefilter
from oom_sentinel.daemon.classify.scan import (
    _CONTIGUOUS_LINES,
    _MAX_LINE,
    _StreamScanner,
)
from oom_sentinel.daemon.logformat import split_prefix

# -- parallel scan of a big regular file ------------------------------------------------------
#
# A big regular file is cut into byte ranges that this process and forked workers scan at
# once (past the prefilter the scan is Python, so only processes spread it over cores); this
# process takes ranges from the front and yields as it goes, the workers from the back
# (``_scan_ranges``). The findings are exactly the sequential scan's, in file order, because
# a range only starts at a *seam*: a line that
#
# * starts a record unconditionally (a wrapper prefix, records.py), so whatever record was
#   pending before it ends right before it, in the sequential scan as in the range before; and
# * is followed by ``_SEAM_LINES`` needle-free lines, none over ``_MAX_LINE``: the sequential
#   scan's next needle is then too far from its last fed line to be contiguous, so it closes
#   the window there (a gap: nothing folds across it), and that needle's lookbehind
#   (≤ ``LOOKBEHIND_LINES``) cannot reach back to the seam, so the range's scanner, which
#   starts fresh at the seam, opens the same window with the same records.
#
# Each range's reads end where the sequential scan's reads end (``_RangeReader``: an
# over-long line is cut at the same place), and a refill keeps whatever a lookbehind may need
# (``_StreamScanner._keep_from``), so where a buffer starts changes nothing. Worker findings go
# to an unlinked temp file, not to memory, until their turn comes: memory stays flat whatever
# the file holds.

#: a range handed to another process is at least this big (its start-up must pay)
PARALLEL_RANGE_BYTES = 32 * 1024 * 1024
#: needle-free lines a seam needs after it (see above: more than the contiguity distance)
_SEAM_LINES = 2 * _CONTIGUOUS_LINES
#: how far past a nominal split point a seam is looked for before giving that split up
_SEAM_SEARCH_BYTES = 1024 * 1024
#: at most this many ranges per process: enough for the work to even out between them
_RANGES_PER_PROCESS = 4


class _RangeReader(io.RawIOBase):
    """Bytes ``[start, end)`` of a file descriptor by positional reads (no shared file
    position), in reads that end where a sequential scan from ``base`` ends its reads:
    at ``base + k * chunk``."""

    def __init__(self, fd: int, start: int, end: int, base: int, chunk: int) -> None:
        super().__init__()
        self.fd = fd
        self.pos = start
        self.end = end
        self.base = base
        self.chunk = max(4096, chunk)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(
            len(buffer), self.end - self.pos, self.chunk - (self.pos - self.base) % self.chunk
        )
        got = 0
        with memoryview(buffer) as view:
            while got < want:
                with view[got:want] as part:  # straight into the buffer (Linux only, as forking)
                    n = os.preadv(self.fd, [part], self.pos + got)
                if not n:
                    break  # the file shrank: end of data
                got += n
        self.pos += got
        if got < want:
            self.end = self.pos
        return got


def _is_seam_line(line: bytes) -> bool:
    """Does this line (no newline) start a record whatever came before it (records.py)?"""
    text = line.decode("utf-8", "replace")
    if text.endswith("\r"):
        text = text.rstrip("\r")
    return text[:1] not in (" ", "\t") and split_prefix(text).starts_record


def _seam_after(fd: int, pos: int, end: int, hits_of: Prefilter) -> int | None:
    """The first seam (see above) at a line start in ``(pos, end)``, looked for within
    ``_SEAM_SEARCH_BYTES``; None when there is none there."""
    data = os.pread(fd, max(0, min(end, pos + _SEAM_SEARCH_BYTES) - pos), pos)
    hits = hits_of(data, len(data))
    cand = data.find(b"\n") + 1
    while 0 < cand < len(data):
        zone_end = cand
        for _ in range(_SEAM_LINES):
            nl = data.find(b"\n", zone_end)
            if nl < 0:
                return None  # ran out of data: no room for a seam here
            if nl - zone_end >= _MAX_LINE:
                break
            zone_end = nl + 1
        else:
            i = bisect_left(hits, zone_end) - 1
            if i < 0 or hits[i] < cand:
                if _is_seam_line(data[cand : data.find(b"\n", cand)]):
                    return pos + cand
                cand = data.find(b"\n", cand) + 1
                continue
            cand = data.find(b"\n", hits[i]) + 1  # restart after the last needle in the zone
            continue
        cand = data.find(b"\n", zone_end) + 1  # restart after the over-long line
    return None


def _plan_ranges(
    fd: int, start: int, size: int, parts: int, hits_of: Prefilter
) -> list[tuple[int, int]]:
    """Up to ``parts`` ranges covering ``[start, size)``, each but the first beginning at a
    seam near an even split (fewer when no seam is found near a split point)."""
    bounds = [start]
    for k in range(1, parts):
        nominal = start + (size - start) * k // parts
        if nominal <= bounds[-1]:
            continue
        seam = _seam_after(fd, nominal, size, hits_of)
        if seam is not None and bounds[-1] < seam < size:
            bounds.append(seam)
    bounds.append(size)
    return list(pairwise(bounds))


def _scan_range_to_file(
    fd: int, lo: int, hi: int, base: int, chunk_size: int, prefilter: str, out_fd: int
) -> None:
    """Worker process: scan ``[lo, hi)`` and pickle its findings (line numbers counted from the
    range start) and then ``("end", newlines in the range)`` to ``out_fd``."""
    scanner = _StreamScanner(
        _RangeReader(fd, lo, hi, base, chunk_size),  # type: ignore[arg-type]
        chunk_size,
        PREFILTERS[prefilter],
        start_offset=lo,
    )
    import pickle

    with open(out_fd, "wb", closefd=False) as out:
        for finding in scanner.run():
            pickle.dump(finding, out, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.dump(("end", scanner.lines_read()), out, protocol=pickle.HIGHEST_PROTOCOL)


def _shifted(finding: Finding, lines: int) -> Finding:
    record = replace(finding.record, line_no=finding.record.line_no + lines)
    return Finding(record, finding.event, finding.line_no + lines, finding.end_line_no + lines)


def _range_worker(
    fd: int,
    ranges: list[tuple[int, int]],
    chunk_size: int,
    prefilter: str,
    spill_fds: list[int],
    claim: Any,
    done: list[Any],
) -> None:
    """Worker process: take ranges from the back until the taken ones meet the scanning
    parent's (``claim`` = [next range the parent takes, first range a worker took]), scan each
    into its own file, and say so."""
    while True:
        with claim.get_lock():
            k = claim[1] - 1
            if k < claim[0]:
                return
            claim[1] = k
        lo, hi = ranges[k]
        _scan_range_to_file(fd, lo, hi, ranges[0][0], chunk_size, prefilter, spill_fds[k])
        done[k].set()


def _replay(spill: BinaryIO, lines: int, counted: list[int]) -> Iterator[Finding]:
    """A worker's findings from its file, line numbers moved on by ``lines``; the range's
    newline count is appended to ``counted`` once the file proves complete."""
    import pickle

    spill.seek(0)
    try:
        while True:
            item = pickle.load(spill)
            if not isinstance(item, Finding):
                if isinstance(item, tuple) and item[:1] == ("end",):
                    counted.append(int(item[1]))
                return
            yield _shifted(item, lines)
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError):
        return


def _scan_ranges(
    fd: int, ranges: list[tuple[int, int]], chunk_size: int, prefilter: str, workers: int = 1
) -> Iterator[Finding]:
    """Scan ``ranges`` (contiguous, the first one starting where a sequential scan would) here
    and in up to ``workers`` forked processes, yielding the findings in file order.

    This process takes ranges from the front and yields as it scans; the workers take them
    from the back. Where the two meet depends on who got the CPU: on a busy machine this
    process simply scans more of the file itself instead of waiting. A worker's findings are
    replayed from its file one at a time (memory stays flat). A range whose worker could not
    start, died, or left a file cut short is scanned here, skipping what was already replayed:
    a scan of a range always finds the same.
    """
    import multiprocessing  # the daemon never forks workers: only diagnose's big scans load it

    hits_of = PREFILTERS[prefilter]
    n = len(ranges)
    ctx = multiprocessing.get_context("fork")
    spills: list[BinaryIO] = []
    procs: list[Any] = []
    claim: Any = None
    done: list[Any] = []
    try:
        try:
            spills = [tempfile.TemporaryFile() for _ in range(n)]  # noqa: SIM115 - closed below
            claim = ctx.Array("i", [0, n])
            done = [ctx.Event() for _ in range(n)]
            for _ in range(max(0, min(workers, n - 1))):
                proc = ctx.Process(
                    target=_range_worker,
                    args=(
                        fd,
                        ranges,
                        chunk_size,
                        prefilter,
                        [s.fileno() for s in spills],
                        claim,
                        done,
                    ),
                    daemon=True,
                )
                proc.start()
                procs.append(proc)
        except OSError:
            pass  # no temp files or no fork: what no worker took is scanned here
        lines = 0
        for k, (lo, hi) in enumerate(ranges):
            sent = 0
            counted: list[int] = []
            if claim is not None:
                with claim.get_lock():
                    mine = claim[0] <= k < claim[1]
                    if mine:
                        claim[0] = k + 1
                if not mine:
                    while not done[k].wait(0.05) and any(p.is_alive() for p in procs):
                        pass
                    if done[k].is_set():
                        for finding in _replay(spills[k], lines, counted):
                            yield finding
                            sent += 1
            if not counted:
                scanner = _StreamScanner(
                    _RangeReader(fd, lo, hi, ranges[0][0], chunk_size),  # type: ignore[arg-type]
                    chunk_size,
                    hits_of,
                    start_offset=lo,
                    first_line_no=lines + 1,
                )
                for i, finding in enumerate(scanner.run()):
                    if i >= sent:
                        yield finding
                counted.append(scanner.lines_read())
            lines += counted[0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for spill in spills:
            spill.close()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _parallel_source(stream: BinaryIO) -> tuple[int, int, int] | None:
    """(fd, position, size) when ``stream`` is a regular file this process may fork to scan."""
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return None  # fork is only safe (and cheap) on Linux, from a single-threaded process
    try:
        fd = stream.fileno()
        st = os.fstat(fd)
        pos = stream.tell()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size <= pos:
        return None
    return fd, pos, st.st_size
