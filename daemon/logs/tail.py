"""Follow ComfyUI log files line by line through rotation, truncation and re-creation, so the
lines written just before a crash are read exactly once even when ComfyUI-Manager has already
renamed the file and even across a restart of the daemon.

Why it is built this way:

- **Identity, not names.** A file is tracked by device + inode plus a fingerprint of its first
  bytes (:data:`FINGERPRINT_BYTES`; inodes are reused after delete/re-create, and a
  copy-truncate keeps the inode). When the tracked file leaves the configured path, it is
  looked up among its rotation family (:mod:`.logfamily`), read to its end, and only then does
  the follower move on to the files rotated after it and finally to the live file. The same
  walk runs after a daemon restart that happened *after* a rotation: the saved cursor's
  identity is searched for among the family, so Manager's ``X.log`` → ``X.prev.log`` at the
  next ComfyUI start never hides the crashed run's last lines.
- **Open, read, close on every poll.** On Windows, Python's ``open`` asks for no
  ``FILE_SHARE_DELETE``, so while we hold a log open Manager's ``os.rename`` fails with
  WinError 32 and Manager abandons file logging for that whole run (Comfy-Org/ComfyUI-Manager
  #1759). We therefore never keep a handle between polls, and on Windows open with
  ``FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE`` (see :func:`open_shared`), so not
  even the few milliseconds of a read can block a rename. An idle poll only ``stat()``s paths.
- **The caller commits, the follower never does on read.** :meth:`LogFollower.poll` returns
  :class:`LogLine` values; offsets are persisted only by :meth:`LogFollower.commit` once the
  caller has fully handled every record up to that offset (the record assembler may hold an
  incomplete multi-line record). A restart resumes from the committed offset, so no line is
  missed and no *handled* line is seen again; lines that were emitted but not committed are
  emitted again, by design.
- **Wake-ups are hints.** ``watchdog`` observers on the parent directories only set an event;
  the poll every ``poll_interval_ms`` is the safety net (inotify misses network drives and
  WSL's Windows mounts). See :class:`LogTailManager`.

Limits that no follower without an open handle can avoid (documented, tested as limits):

- Copy-truncate: lines appended after our last read and *before* the truncate are lost (they
  went only into the copy, which is another file). Lines after the truncate are read from 0.
- Delete: lines appended after our last read and before the delete are lost.
- Rotation: lines appended to a rotated file *after* the follower has moved on to a newer file
  are not read. The follower stays on a rotated file until a newer file exists, and
  ComfyUI-Manager rotates only at start-up, when the writer of the old file is gone.
- A file rotated more times than its family keeps names for (Manager keeps ``.prev`` and
  ``.prev2``, so a third rotation deletes it) before we read it is gone.
- A file that appears (or is re-created after a delete) and is rotated away before the
  follower ever saw it is not read.
- Truncated and re-written to the same size with the same first bytes and mtime within one
  poll: undetectable without content hashing of the whole file.
- While the daemon is down, the live file deleted and re-created *on the same inode* (the
  filesystem reuses it at once) when Manager copies exist: at the restart this cannot be told
  from the cursor's file rotated out of existence (whose inode the new live file took), so the
  Manager copies are read again from their start. A copy-truncate is told apart: its copy has
  the cursor's first bytes, and reading resumes in the copy at the cursor's offset; when no
  copy has them any more (a second copy-truncate overwrote ``X.log.1``), the numbered copy's
  presence still says copy-truncate, and the Manager copies are not read again. Lines written
  after the cursor and before a copy-truncate whose copy was overwritten while the daemon was
  down are lost: nothing holds them.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from oom_sentinel.daemon.core.errors import InputError, SentinelError
from oom_sentinel.daemon.logs.cursors import FileCursor, OffsetStore
from oom_sentinel.daemon.logs.family import RotationFamily
from oom_sentinel.daemon.logs.textenc import UTF8, detect_encoding, newline_bytes

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_READ_BYTES",
    "DEFAULT_POLL_INTERVAL_MS",
    "FINGERPRINT_BYTES",
    "FollowerState",
    "LineSplitter",
    "LogFollower",
    "LogLine",
    "LogTailManager",
    "head_digest",
    "open_shared",
]

log = logging.getLogger(__name__)

#: How many leading bytes identify a file's content. A Manager line starts with a
#: millisecond timestamp, so even the first line tells two runs apart; 1 KiB as in Filebeat's
#: fingerprint file identity.
FINGERPRINT_BYTES = 1024
#: Matches LogSettings.poll_interval_ms's default.
DEFAULT_POLL_INTERVAL_MS = 2000
#: A longer line is emitted in pieces of this size (cut at a UTF-8 boundary) so one runaway
#: write without a newline cannot grow memory without bound. 1 MiB lines pass whole.
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
#: Bytes one follower reads per poll; a larger backlog sets ``more_pending`` and wakes the
#: next :meth:`LogTailManager.wait` at once, so a 1 GB log cannot stall the other followers.
DEFAULT_MAX_READ_BYTES = 16 * 1024 * 1024
_READ_CHUNK_BYTES = 1024 * 1024
#: Starting at the end of an unseen file, look this far back for the last newline so the line
#: in progress is read whole.
_TAIL_SCAN_BYTES = 64 * 1024
#: File switches one poll may make (a double rotation is three files).
_MAX_HOPS = 16
#: watchdog event types that mean "a followed file may have changed"; "opened" and
#: "closed_no_write" are left out because our own reads cause them.
_WAKE_EVENT_TYPES = frozenset({"created", "modified", "moved", "deleted", "closed"})


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a followed log. Offsets are bytes in the file the line was read from."""

    #: the configured path (absolute) this line was followed for
    key: str
    #: where the file was when the line was read: the live path or a rotated name
    path: str
    #: without the line ending (``\\n`` or ``\\r\\n``), decoded in the file's encoding (UTF-8, or
    #: UTF-16 -- ``textenc``) with ``errors="replace"``
    text: str
    #: offset of the line's first byte
    start_offset: int
    #: offset just past the line ending: commit it once the line is handled
    end_offset: int


@dataclass(frozen=True, slots=True)
class FollowerState:
    """What one follower is doing, for ``oom-sentinel status``."""

    key: str
    #: the file being read (live or rotated name); None while waiting for the file to appear
    path: str | None
    #: next byte to read in ``path``; None while waiting
    offset: int | None
    #: bytes of an unterminated last line held back until its newline arrives
    partial_bytes: int
    #: the last I/O problem (one line), None when the last poll succeeded
    error: str | None


def head_digest(head: bytes, offset: int) -> str:
    """Digest of the first ``min(offset, FINGERPRINT_BYTES)`` bytes ("" when that is 0).

    Covering only bytes before the cursor's offset keeps the fingerprint stable while the file
    grows: those bytes were already read and an appended file never changes them.
    """
    n = min(offset, FINGERPRINT_BYTES)
    if n <= 0:
        return ""
    return hashlib.sha256(head[:n]).hexdigest()


def _utf8_cut(buf: bytes | bytearray, limit: int) -> int:
    """A cut <= limit (and > limit - 4) that does not split a UTF-8 sequence; ``len(buf) > limit``."""
    cut = limit
    while cut > limit - 3 and cut > 0 and (buf[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 and (buf[cut] & 0xC0) != 0x80 else limit


class LineSplitter:
    """Cuts a byte stream into lines at ``\\n``; holds the unterminated tail. Pure, no I/O.

    ``feed`` returns ``(payload, start_offset, end_offset)`` for each complete line: the
    payload has its ``\\n`` and one ``\\r`` before it removed; offsets count the raw bytes.
    """

    def __init__(
        self, offset: int, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, encoding: str = UTF8
    ) -> None:
        if max_line_bytes < 4:
            raise ValueError("max_line_bytes must be >= 4")
        #: offset of the first byte of the held-back tail (= end of the last line emitted)
        self.line_start = offset
        self._pending = bytearray()
        self._max = max_line_bytes
        #: textenc's name of the file's encoding; UTF-16 lines end at an aligned ``\n`` unit
        self.encoding = encoding

    @property
    def pos(self) -> int:
        """Offset of the next byte to read."""
        return self.line_start + len(self._pending)

    @property
    def pending(self) -> bytes:
        return bytes(self._pending)

    def feed(self, data: bytes) -> list[tuple[bytes, int, int]]:
        if self.encoding != UTF8:
            return self._feed_wide(data)
        out: list[tuple[bytes, int, int]] = []
        parts = data.split(b"\n")
        last = parts.pop()
        if parts:
            if self._pending:
                parts[0] = bytes(self._pending) + parts[0]
                self._pending.clear()
            start = self.line_start
            for raw in parts:
                end = start + len(raw) + 1
                if len(raw) > self._max:
                    start, raw = self._cut_long(out, raw, start)
                out.append((raw[:-1] if raw.endswith(b"\r") else raw, start, end))
                start = end
            self.line_start = start
        self._pending += last
        if len(self._pending) > self._max:
            rest = bytes(self._pending)
            self.line_start, rest = self._cut_long(out, rest, self.line_start)
            self._pending = bytearray(rest)
        return out

    def _feed_wide(self, data: bytes) -> list[tuple[bytes, int, int]]:
        """UTF-16: a line ends at a ``\n`` code unit that starts at an even file offset."""
        out: list[tuple[bytes, int, int]] = []
        newline = newline_bytes(self.encoding)
        cr = "\r".encode(self.encoding)
        self._pending += data
        buf, base = self._pending, self.line_start
        start = pos = 0
        while (idx := buf.find(newline, pos)) >= 0:
            if (base + idx) % 2:
                pos = idx + 1
                continue
            raw = bytes(buf[start:idx])
            out.append((raw[:-2] if raw.endswith(cr) else raw, base + start, base + idx + 2))
            start = pos = idx + 2
        del self._pending[:start]
        self.line_start = base + start
        while len(self._pending) > self._max:
            cut = self._max - self._max % 2
            out.append((bytes(self._pending[:cut]), self.line_start, self.line_start + cut))
            del self._pending[:cut]
            self.line_start += cut
        return out

    def _cut_long(
        self, out: list[tuple[bytes, int, int]], raw: bytes, start: int
    ) -> tuple[int, bytes]:
        """Emit ``max_line_bytes`` pieces of an over-long line; returns the rest and its start."""
        while len(raw) > self._max:
            cut = _utf8_cut(raw, self._max)
            out.append((raw[:cut], start, start + cut))
            raw = raw[cut:]
            start += cut
        return start, raw

    def flush(self) -> list[tuple[bytes, int, int]]:
        """The held-back tail as a line of its own (no newline counted), if there is one."""
        if not self._pending:
            return []
        raw = bytes(self._pending)
        start = self.line_start
        self._pending.clear()
        self.line_start = start + len(raw)
        cr = "\r".encode(self.encoding)
        return [(raw[: -len(cr)] if raw.endswith(cr) else raw, start, self.line_start)]


# -- opening without blocking the writer's rename -------------------------------------------

_GENERIC_READ = 0x80000000
_FILE_SHARE_ALL = 0x1 | 0x2 | 0x4  # FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE
_OPEN_EXISTING = 3
_FILE_ATTRIBUTE_NORMAL = 0x80
_create_file_w: Any = None


def _windows_create_file() -> Any:
    global _create_file_w
    if _create_file_w is None:
        import ctypes
        from ctypes import wintypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        fn = kernel32.CreateFileW
        fn.argtypes = (
            wintypes.LPCWSTR,
            wintypes.DWORD,
            wintypes.DWORD,
            wintypes.LPVOID,
            wintypes.DWORD,
            wintypes.DWORD,
            wintypes.HANDLE,
        )
        fn.restype = wintypes.HANDLE
        _create_file_w = (fn, kernel32.CloseHandle)
    return _create_file_w


def open_shared(path: str) -> BinaryIO:
    """Open ``path`` for binary reading without stopping the writer from renaming or deleting it.

    POSIX never blocks a rename for a reader. On Windows the handle is opened with
    ``FILE_SHARE_DELETE`` as well (Python's ``open`` omits it; that is what makes Manager's
    rotation fail with WinError 32). Errors are the usual ``OSError`` subclasses
    (``FileNotFoundError`` when the file is gone).
    """
    if os.name != "nt":
        return open(path, "rb")  # the caller closes it (with-block)
    import ctypes
    import msvcrt

    create, close = _windows_create_file()
    handle = create(
        path, _GENERIC_READ, _FILE_SHARE_ALL, None, _OPEN_EXISTING, _FILE_ATTRIBUTE_NORMAL, None
    )
    if handle is None or handle == ctypes.c_void_p(-1).value:
        raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
    try:
        fd = msvcrt.open_osfhandle(handle, os.O_RDONLY | getattr(os, "O_BINARY", 0))  # type: ignore[attr-defined]
    except OSError:
        close(handle)
        raise
    return os.fdopen(fd, "rb")


def _stat(path: str) -> os.stat_result | None:
    """``os.stat`` with "not there" as None; other failures become InputError."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise InputError(f"{path}: cannot stat log file: {exc.strerror or exc}") from exc


# -- the follower -----------------------------------------------------------------------------


class _File:
    """One incarnation of a followed file: identity plus what we know of its first bytes.

    A copy-truncate keeps dev+ino but starts a new incarnation (a new object), so commits
    against lines of the old content never land on the new one.
    """

    __slots__ = ("dev", "end", "head", "ino", "mtime_ns", "next", "start")

    def __init__(self, dev: int, ino: int, head: bytes = b"") -> None:
        self.dev = dev
        self.ino = ino
        self.head = head
        #: mtime at our last read; None forces the next poll to open the file
        self.mtime_ns: int | None = None
        #: where reading began; where it ended once finished (None while current)
        self.start = 0
        self.end: int | None = None
        #: the file followed after this one finished (set when the follower moves on)
        self.next: _File | None = None

    def is_at(self, st: os.stat_result) -> bool:
        return st.st_dev == self.dev and st.st_ino == self.ino

    def head_matches(self, now: bytes) -> bool:
        """The file still begins with the bytes we saw (it may have grown, not shrunk)."""
        return len(now) >= len(self.head) and now[: len(self.head)] == self.head


@dataclass(slots=True)
class _Segment:
    """A run of emitted lines from one incarnation at one path: what :meth:`commit` resolves."""

    file: _File
    path: str
    start: int
    end: int


class _Verify(enum.Enum):
    OK = "ok"
    GONE = "gone"  # not there (any more), or another inode now
    MISMATCH = "mismatch"  # the cursor's inode, other content


class _Read(enum.Enum):
    OK = "ok"
    MOVED = "moved"  # the path no longer holds our file (raced with a rename)


class LogFollower:
    """Follows one configured log path (its ``key``) and the files it is rotated into.

    Use from one thread: ``poll()`` → hand the lines on → ``commit(path, offset)`` when every
    record up to ``offset`` in ``path`` is fully handled. Nothing is persisted on read.

    Start-up: with a saved cursor, resume from it (finding the file by identity among the
    rotation family, then walking forward to the live file). Without one, start at the end of
    an existing file (the line in progress is read whole), or at 0 with ``from_start=True``;
    a file that does not exist yet is read from 0 once it appears. In both no-cursor cases the
    starting position is saved at once, so a restart before the first commit misses nothing.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        store: OffsetStore,
        *,
        from_start: bool = False,
        partial_timeout_s: float | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = os.path.abspath(os.fspath(path))
        self.family = RotationFamily(Path(self.key))
        self._store = store
        self._from_start = from_start
        self._partial_timeout_s = partial_timeout_s
        self._max_line_bytes = max_line_bytes
        self._max_read_bytes = max_read_bytes
        self._clock = clock
        self._started = False
        #: the next adoption of the live file starts at 0 (it appeared or replaced ours)
        self._fresh = from_start
        self._save_on_adopt = False
        self._file: _File | None = None
        #: the file finished last, until the next one begins (links them, see _begin)
        self._finished: _File | None = None
        #: the position last saved to the store (or loaded from it)
        self._persisted: tuple[_File, int] | None = None
        self._path: str | None = None
        self._splitter: LineSplitter | None = None
        self._encoding_known = False
        self._segments: list[_Segment] = []
        self._budget = 0
        self._partial_mark: tuple[int, int] | None = None
        self._partial_since = 0.0
        #: (dev, ino, size) of a live file first seen unreadable: once readable it is read
        #: from there, not from its end, so what was written meanwhile is not skipped
        self._unreadable_at: tuple[int, int, int] | None = None
        #: True when the last poll stopped at ``max_read_bytes`` with more to read
        self.more_pending = False
        self.error: str | None = None

    # -- public -------------------------------------------------------------------------------

    @property
    def state(self) -> FollowerState:
        sp = self._splitter
        return FollowerState(
            key=self.key,
            path=self._path if self._file is not None else None,
            offset=sp.pos if sp is not None and self._file is not None else None,
            partial_bytes=len(sp.pending) if sp is not None and self._file is not None else 0,
            error=self.error,
        )

    def poll(self) -> list[LogLine]:
        """Read what is new; return complete lines in file order (older files first).

        Never raises for I/O trouble: the problem is logged once and kept in ``error``, and the
        lines read before it are returned (their positions are already consumed).
        """
        out: list[LogLine] = []
        self.more_pending = False
        self._budget = self._max_read_bytes
        try:
            if not self._started:
                self._start()
                self._started = True  # only once it worked: a failed start is retried
            for _ in range(_MAX_HOPS):
                if self._file is None and not self._adopt_live():
                    break
                if not self._step(out):
                    break
            self._flush_if_stale(out)
        except InputError as exc:
            if str(exc) != self.error:
                log.warning("%s", exc)
            self.error = str(exc)
        else:
            if self.error is not None:
                log.info("%s: readable again", self.key)
            self.error = None
        return out

    def prepare(self) -> None:
        """Fix where reading starts -- the saved position, else the end of the file now --
        without reading, so every line written after this call is read by the next ``poll``.
        ``LogTailManager.start`` calls it before the daemon says it is ready: a record written
        between the ready line and the first poll must not be taken for old content."""
        try:
            if not self._started:
                self._start()
                self._started = True
            if self._file is None:
                self._adopt_live()
        except InputError as exc:
            if str(exc) != self.error:
                log.warning("%s", exc)
            self.error = str(exc)

    def commit(self, path: str, offset: int) -> None:
        """Persist that every line before ``offset`` in ``path`` is fully handled.

        ``path`` and ``offset`` come from an emitted :class:`LogLine` (``end_offset`` of the
        last handled line, or ``start_offset`` of the first line of a record still pending).
        They are resolved against the runs of lines emitted since the last commit, newest
        first; so a record must not span two files (the service should close a pending record
        when ``line.path`` changes or ``line.start_offset`` is not the previous ``end_offset``).
        Raises ValueError for a position that was not emitted since the last commit.
        """
        for i in range(len(self._segments) - 1, -1, -1):
            seg = self._segments[i]
            if seg.path == path and seg.start <= offset <= seg.end:
                f, at = seg.file, offset
                # The end of a finished file is the start of the next one.
                while f.end is not None and at == f.end and (nxt := f.next) is not None:
                    f, at = nxt, nxt.start
                if (
                    self._persisted is None
                    or self._persisted[0] is not f
                    or self._persisted[1] != at
                ):
                    self._save(f, at)  # (committing the same position again writes nothing)
                seg.start = offset
                del self._segments[:i]
                return
        raise ValueError(
            f"{self.key}: {path} at byte {offset} was not emitted since the last commit"
        )

    def flush_partial(self) -> list[LogLine]:
        """Emit the held-back unterminated last line now, as a line of its own.

        For a caller that treats a stale partial line as complete (e.g. after an idle period);
        bytes appended later to the same line then arrive as a separate line. Also done
        automatically after ``partial_timeout_s`` of no growth, when that is set.
        """
        out: list[LogLine] = []
        if self._splitter is not None and self._path is not None and self._file is not None:
            self._emit(out, self._path, self._splitter.flush())
        return out

    # -- start-up and adoption ----------------------------------------------------------------

    def _start(self) -> None:
        cursor = self._store.load_cursor(self.key)
        if cursor is None:
            self._save_on_adopt = True
            return
        candidates = [self.key, *(str(p) for p in self.family.rotated())]
        for candidate in candidates:
            st = _stat(candidate)
            if st is None or (st.st_dev, st.st_ino) != (cursor.dev, cursor.ino):
                continue
            verdict, head = self._verify_cursor(candidate, cursor)
            if verdict is _Verify.GONE:
                continue
            if verdict is _Verify.MISMATCH:
                # Same inode in the family, other content: truncated and rewritten, or a
                # reused inode. Either way every byte in it was written after our cursor.
                log.warning(
                    "%s: %s was truncated or replaced since it was last read; reading it from "
                    "the start",
                    self.key,
                    candidate,
                )
                if candidate == self.key and self._begin_copy_of(cursor):
                    return  # copy-truncated: the copy holds what the cursor named
                if (
                    candidate == self.key
                    and not self._copy_truncated_here()
                    and self._begin_oldest_rotated()
                ):
                    return  # the cursor's file was deleted and its inode reused by the live one
                restarted = _File(cursor.dev, cursor.ino)
                self._begin(restarted, candidate, 0)
                self._save_quietly(restarted, 0)  # the content the cursor named is gone
                return
            resumed = _File(cursor.dev, cursor.ino, head)
            self._begin(resumed, candidate, cursor.offset)
            self._persisted = (resumed, cursor.offset)
            log.debug("%s: resuming %s at byte %d", self.key, candidate, cursor.offset)
            return
        log.info(
            "%s: the file read last (inode %d, byte %d) is no longer in its rotation family; "
            "reading the files rotated after it and the current one from their start",
            self.key,
            cursor.ino,
            cursor.offset,
        )
        if self._begin_oldest_rotated():
            return
        self._fresh = True
        # That file is gone for good: the start of the live file is the best position now,
        # and saving it at once keeps a second restart from skipping the file we read next.
        self._save_on_adopt = True

    def _begin_copy_of(self, cursor: FileCursor) -> bool:
        """After a copy-truncate of the cursor's file (logrotate's ``copytruncate``), the
        rotated copy -- another inode, the same first bytes, at least as long -- holds exactly
        what the cursor named: resume it at the cursor's offset and walk on from it. Without
        this the truncated live file looked like a deleted file whose inode was reused, and the
        Manager copies rotated *before* it were read again after a restart (lines twice)."""
        for path in self.family.rotated():
            st = _stat(str(path))
            if st is None or (st.st_dev, st.st_ino) == (cursor.dev, cursor.ino):
                continue
            if st.st_size < cursor.offset or not cursor.fingerprint:
                continue
            try:
                with open_shared(str(path)) as fh:
                    head = fh.read(FINGERPRINT_BYTES)
            except OSError:
                continue
            if head_digest(head, cursor.offset) != cursor.fingerprint:
                continue
            copy = _File(st.st_dev, st.st_ino, head)
            self._begin(copy, str(path), cursor.offset)
            self._save_quietly(copy, cursor.offset)
            log.info("%s: resuming the copy %s at byte %d", self.key, path, cursor.offset)
            return True
        return False

    def _copy_truncated_here(self) -> bool:
        """A numbered copy (logrotate's ``copytruncate``: ``X.log.1``) is in the family: the live
        file's truncation was a copy-truncate, even when no copy still holds the cursor's bytes
        (a second copy-truncate overwrote ``X.log.1``). Nothing the cursor named is left to
        read, and the Manager copies rotated before it were read already: reading them again
        would count their lines twice."""
        return any(
            (named := self.family.classify(path.name)) is not None and named.scheme == "numbered"
            for path in self.family.rotated()
        )

    def _begin_oldest_rotated(self) -> bool:
        """After the cursor's file was rotated out of existence (Manager keeps two copies),
        every Manager-rotated copy left was rotated after it: start at the oldest, from 0, and
        walk forward to the live file. False when there is none."""
        members = [
            (named.rank, path)
            for path in self.family.rotated()
            if (named := self.family.classify(path.name)) is not None and named.scheme == "manager"
        ]
        for _, path in sorted(members):
            st = _stat(str(path))
            if st is None:
                continue
            oldest = _File(st.st_dev, st.st_ino)
            self._begin(oldest, str(path), 0)
            self._save_quietly(oldest, 0)
            return True
        return False

    def _verify_cursor(self, path: str, cursor: FileCursor) -> tuple[_Verify, bytes]:
        """Whether ``path`` still holds the content the cursor was taken on, and its head."""
        try:
            with open_shared(path) as fh:
                st = os.fstat(fh.fileno())
                head = fh.read(FINGERPRINT_BYTES)
        except FileNotFoundError:
            return _Verify.GONE, b""
        except OSError as exc:
            raise InputError(f"{path}: cannot read log file: {exc.strerror or exc}") from exc
        if (st.st_dev, st.st_ino) != (cursor.dev, cursor.ino):
            return _Verify.GONE, b""
        if st.st_size < cursor.offset or len(head) < min(cursor.offset, FINGERPRINT_BYTES):
            return _Verify.MISMATCH, head
        if head_digest(head, cursor.offset) != cursor.fingerprint:
            return _Verify.MISMATCH, head
        return _Verify.OK, head

    def _adopt_live(self) -> bool:
        """Start following the file at the configured path; False if there is none yet."""
        st = _stat(self.key)
        if st is None:
            self._fresh = True  # it appears later: everything in it is new
            return False
        head = b""
        offset = 0
        if not self._fresh:
            try:
                with open_shared(self.key) as fh:
                    st = os.fstat(fh.fileno())
                    head = fh.read(FINGERPRINT_BYTES)
                    seen = self._unreadable_at
                    end = st.st_size
                    if seen is not None and seen[:2] == (st.st_dev, st.st_ino):
                        end = min(end, seen[2])
                    offset = _tail_start(fh, end, detect_encoding(head))
            except FileNotFoundError:
                return False
            except OSError as exc:
                if self._unreadable_at is None or self._unreadable_at[:2] != (
                    st.st_dev,
                    st.st_ino,
                ):
                    self._unreadable_at = (st.st_dev, st.st_ino, st.st_size)
                raise InputError(
                    f"{self.key}: cannot read log file: {exc.strerror or exc}"
                ) from exc
            self._unreadable_at = None
        adopted = _File(st.st_dev, st.st_ino, head)
        self._begin(adopted, self.key, offset)
        self._fresh = True  # any later adoption follows a file that replaced this one
        if self._save_on_adopt:
            self._save_on_adopt = False
            self._save_quietly(adopted, offset)
        log.debug("%s: following from byte %d", self.key, offset)
        return True

    # -- one hop of the walk --------------------------------------------------------------------

    def _step(self, out: list[LogLine]) -> bool:
        """Read the tracked file where it is now; True to go on with another hop this poll."""
        f = self._file
        assert f is not None
        live = _stat(self.key)
        if live is not None and f.is_at(live):
            return self._read(self.key, live, out) is _Read.MOVED
        found = self._locate(f)
        if found is None:
            self._lose_file(out, "was deleted or rotated away before it was read to the end")
            return True
        path, st = found
        if self._read(path, st, out) is _Read.MOVED:
            return True
        if self.more_pending:
            return False
        younger = self.family.younger_than(Path(path))
        if not younger:
            return False  # stay: the writer may still append until a newer file exists
        nxt = str(younger[0])
        st_next = _stat(nxt)
        if st_next is None:
            return True  # moved again meanwhile; look again
        self._finish(out)
        log.debug("%s: finished %s, continuing with %s", self.key, path, nxt)
        self._begin(_File(st_next.st_dev, st_next.st_ino), nxt, 0)
        return True

    def _locate(self, f: _File) -> tuple[str, os.stat_result] | None:
        candidates: list[str] = []
        if self._path is not None and self._path != self.key:
            candidates.append(self._path)
        candidates.extend(str(p) for p in self.family.rotated() if str(p) not in candidates)
        for candidate in candidates:
            st = _stat(candidate)
            if st is not None and f.is_at(st):
                return candidate, st
        return None

    def _finish(self, out: list[LogLine]) -> None:
        """The tracked file gets no more reads: its unterminated last line is a line too."""
        f, sp = self._file, self._splitter
        if f is None or sp is None or self._path is None:
            return
        self._emit(out, self._path, sp.flush())
        f.end = sp.pos
        self._finished = f
        self._file = None

    def _begin(self, f: _File, path: str, offset: int) -> None:
        """Track ``f`` from ``offset``, chained after the file finished last.

        If every line of that finished file was already committed, the cursor moves on to
        ``f`` now: otherwise a restart after more rotations could find the committed file
        deleted and skip the files between it and the live one.
        """
        f.start = offset
        prev, self._finished = self._finished, None
        if prev is not None:
            prev.next = f
            if (
                self._persisted is not None
                and self._persisted[0] is prev
                and self._persisted[1] == prev.end
            ):
                self._save_quietly(f, offset)
        self._file = f
        self._path = path
        encoding = detect_encoding(f.head) if f.head else UTF8
        self._splitter = LineSplitter(offset, self._max_line_bytes, encoding)
        #: decided from the file's first bytes (a new file may have none yet)
        self._encoding_known = len(f.head) >= 2

    def _lose_file(self, out: list[LogLine], why: str) -> None:
        log.warning(
            "%s: %s %s; lines written to it after the last read are lost",
            self.key,
            self._path,
            why,
        )
        self._finish(out)
        self._fresh = True

    def _read(self, path: str, st: os.stat_result, out: list[LogLine]) -> _Read:
        """Read new bytes of the tracked file at ``path`` (``st``: its stat from the path).

        Content that no longer starts with the bytes we saw, or a file shorter than our
        position, is read from 0 as a new incarnation: a copy-truncate, or (at a rotated
        name too) a reused inode; in both cases all of it was written after our last read.
        """
        f = self._file
        sp = self._splitter
        assert f is not None and sp is not None
        if st.st_size == sp.pos and st.st_mtime_ns == f.mtime_ns:
            return _Read.OK  # idle: stat only, no open
        try:
            fh = open_shared(path)
        except FileNotFoundError:
            return _Read.MOVED
        except OSError as exc:
            raise InputError(f"{path}: cannot read log file: {exc.strerror or exc}") from exc
        with fh:
            try:
                fst = os.fstat(fh.fileno())
                if not f.is_at(fst):
                    return _Read.MOVED
                head = fh.read(FINGERPRINT_BYTES)
                if not f.head_matches(head) or fst.st_size < sp.pos:
                    self._restart_at_zero(out, path, fst)
                    f, sp = self._file, self._splitter
                    assert f is not None and sp is not None
                if len(head) > len(f.head):
                    f.head = head
                if not self._encoding_known and head:
                    sp.encoding = detect_encoding(head)
                    self._encoding_known = len(head) >= 2
                fh.seek(sp.pos)
                while True:
                    want = min(_READ_CHUNK_BYTES, self._budget)
                    if want <= 0:
                        self.more_pending = os.fstat(fh.fileno()).st_size > sp.pos
                        break
                    data = fh.read(want)
                    if not data:
                        break
                    self._budget -= len(data)
                    self._emit(out, path, sp.feed(data))
                f.mtime_ns = fst.st_mtime_ns
                self._path = path
                if len(f.head) < FINGERPRINT_BYTES and sp.pos > len(f.head):
                    fh.seek(0)
                    more = fh.read(FINGERPRINT_BYTES)
                    if more.startswith(f.head):
                        f.head = more
            except OSError as exc:
                raise InputError(f"{path}: cannot read log file: {exc.strerror or exc}") from exc
        return _Read.OK

    def _restart_at_zero(self, out: list[LogLine], path: str, st: os.stat_result) -> None:
        log.warning(
            "%s: %s was truncated or replaced in place (copy-truncate?); reading it from the "
            "start, lines written just before the truncate may be lost",
            self.key,
            path,
        )
        self._finish(out)
        self._begin(_File(st.st_dev, st.st_ino), path, 0)

    # -- emitting, partial lines, cursors -------------------------------------------------------

    def _emit(self, out: list[LogLine], path: str, pieces: list[tuple[bytes, int, int]]) -> None:
        if not pieces:
            return
        key = self.key
        encoding = self._splitter.encoding if self._splitter is not None else UTF8
        out.extend(
            LogLine(key, path, _decode(raw, start, encoding), start, end)
            for raw, start, end in pieces
        )
        f = self._file
        assert f is not None
        first, last = pieces[0][1], pieces[-1][2]
        if self._segments:
            seg = self._segments[-1]
            if seg.file is f and seg.path == path and seg.end == first:
                seg.end = last
                return
        self._segments.append(_Segment(f, path, first, last))

    def _flush_if_stale(self, out: list[LogLine]) -> None:
        sp = self._splitter
        if self._partial_timeout_s is None or sp is None or self._file is None:
            return
        if not sp.pending:
            self._partial_mark = None
            return
        mark = (id(self._file), sp.pos)
        now = self._clock()
        if mark != self._partial_mark:
            self._partial_mark = mark
            self._partial_since = now
        elif now - self._partial_since >= self._partial_timeout_s:
            out.extend(self.flush_partial())
            self._partial_mark = None

    def _save(self, f: _File, offset: int) -> None:
        self._store.save_cursor(
            FileCursor(self.key, f.dev, f.ino, offset, head_digest(f.head, offset))
        )
        self._persisted = (f, offset)

    def _save_quietly(self, f: _File, offset: int) -> None:
        """A save the follower makes on its own during a poll (start position, moving on).

        It only ever moves the cursor to a position where nothing unhandled lies behind it,
        so failing to save is no worse than not trying: warn and go on, so the lines of this
        poll are still delivered. ``commit`` lets store errors reach its caller.
        """
        try:
            self._save(f, offset)
        except SentinelError as exc:
            log.warning("%s: could not save the log position: %s", self.key, exc)


def _decode(raw: bytes, start: int, encoding: str) -> str:
    text = raw.decode(encoding, "replace")
    return text[1:] if start == 0 and text.startswith("\ufeff") else text


def _tail_start(fh: BinaryIO, size: int, encoding: str = UTF8) -> int:
    """Where to start reading an unseen file at its end: after its last newline."""
    start = max(0, size - _TAIL_SCAN_BYTES)
    start -= start % 2  # UTF-16 code units start at even offsets
    fh.seek(start)
    buf = fh.read(size - start)
    newline = newline_bytes(encoding)
    at = buf.rfind(newline)
    while at >= 0 and encoding != UTF8 and (start + at) % 2:
        at = buf.rfind(newline, 0, at + len(newline) - 1)
    if at >= 0:
        return start + at + len(newline)
    return 0 if start == 0 else start + len(buf) - len(buf) % len(newline)


# -- wake-ups ---------------------------------------------------------------------------------


class _WakeHandler(FileSystemEventHandler):
    """Turns a watchdog event about a followed file into a wake-up; never reads anything."""

    def __init__(self, waker: _Waker) -> None:
        super().__init__()
        self._waker = waker

    def dispatch(self, event: FileSystemEvent) -> None:
        self._waker.on_event(event)


class _Waker:
    """The event ``wait()`` blocks on, plus the optional watchdog observer that sets it.

    The observer is restartable: ``refresh()`` (run on every poll) starts a new one when the
    old thread died, re-schedules directories whose watch ended (inotify ends a watch when its
    directory is deleted) and schedules directories that did not exist before.
    """

    def __init__(self, *, use_observer: bool) -> None:
        self._event = threading.Event()
        self._use_observer = use_observer
        self._families: tuple[RotationFamily, ...] = ()
        self._observer: Any = None
        self._watches: dict[str, Any] = {}
        self._refused: dict[str, str] = {}
        self._disabled: str | None = None if use_observer else "disabled by configuration"
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        """ "watchdog <ObserverClass>" while an observer runs, else "poll"."""
        if self._observer is not None and self._observer.is_alive():
            return f"watchdog {type(self._observer).__name__}"
        return "poll"

    @property
    def watched_dirs(self) -> list[str]:
        return sorted(self._watches)

    @property
    def why_no_observer(self) -> str | None:
        return self._disabled

    def set_families(self, families: Iterable[RotationFamily]) -> None:
        self._families = tuple(families)

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout_s: float | None) -> bool:
        fired = self._event.wait(timeout_s)
        # Cleared before the caller polls: a change after this point sets it again, and a
        # change before it is read by that poll.
        self._event.clear()
        return fired

    def on_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in _WAKE_EVENT_TYPES or event.is_directory:
            return
        families = self._families
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if not raw:
                continue
            name = os.path.basename(os.fsdecode(raw))
            if any(family.is_member(name) for family in families):
                self._event.set()
                return

    def refresh(self) -> None:
        if self._disabled is not None:
            return
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        if self._observer is None or not self._observer.is_alive():
            if self._observer is not None:
                log.warning("log wake-ups: the watchdog observer stopped; starting a new one")
            if not self._start_observer():
                return
        observer = self._observer
        wanted = {str(family.directory) for family in self._families}
        alive = {emitter.watch for emitter in list(observer.emitters) if emitter.is_alive()}
        for directory, watch in list(self._watches.items()):
            if directory not in wanted or watch not in alive:
                del self._watches[directory]
                with contextlib.suppress(KeyError, OSError):
                    observer.unschedule(watch)
        for directory in sorted(wanted - set(self._watches)):
            if not os.path.isdir(directory):
                continue
            try:
                self._watches[directory] = observer.schedule(
                    _WakeHandler(self), directory, recursive=False, event_filter=_event_filter()
                )
            except OSError as exc:
                reason = exc.strerror or str(exc)
                if self._refused.get(directory) != reason:
                    log.warning(
                        "log wake-ups: cannot watch %s (%s); the safety poll still covers it",
                        directory,
                        reason,
                    )
                self._refused[directory] = reason
            else:
                self._refused.pop(directory, None)

    def _start_observer(self) -> bool:
        try:
            from watchdog.observers import Observer
            from watchdog.observers.polling import PollingObserver
        except ImportError as exc:
            self._disabled = f"watchdog cannot be imported: {exc}"
            return False
        if Observer is PollingObserver:
            # watchdog's own fallback polls whole directories; our poll already does less.
            self._disabled = "watchdog has no native backend on this platform"
            return False
        try:
            observer = Observer()
            observer.daemon = True
            observer.start()
        except OSError as exc:  # e.g. inotify instance limit reached
            self._disabled = f"watchdog observer failed to start: {exc.strerror or exc}"
            return False
        self._observer = observer
        self._watches = {}
        return True

    def stop(self) -> None:
        with self._lock:
            observer, self._observer = self._observer, None
            self._watches = {}
        if observer is not None:
            observer.stop()
            if observer.is_alive():
                observer.join()


def _event_filter() -> list[type[FileSystemEvent]]:
    """Ask inotify only for what can change a followed file (not our own opens and reads)."""
    return [
        FileCreatedEvent,
        FileModifiedEvent,
        FileMovedEvent,
        FileDeletedEvent,
        FileClosedEvent,
    ]


# -- many followers ---------------------------------------------------------------------------


class LogTailManager:
    """Followers for many paths, one wake-up primitive, one commit entry point.

    The service loop::

        with LogTailManager(store, poll_interval_ms=settings.logs.poll_interval_ms) as tails:
            tails.add(path)                         # any time, also while running
            while running:
                for line in tails.poll():
                    ...                             # feed the record assembler of line.key
                tails.commit(key, path, offset)     # per key, once its records are handled
                tails.wait()                        # until a hint or the poll interval

    ``wait()`` returns True when something woke it (a file event, ``wake()``, or a follower
    that has more to read), False when the poll interval passed. ``start()`` (or ``with``)
    starts the observer and logs once which wake-up backend is active; without it, the
    manager polls only. All methods except ``wake()`` belong to one thread.
    """

    def __init__(
        self,
        store: OffsetStore,
        *,
        poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
        from_start: bool = False,
        use_observer: bool = True,
        partial_timeout_s: float | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
    ) -> None:
        if poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be > 0")
        self._store = store
        self.poll_interval_ms = poll_interval_ms
        self._from_start = from_start
        self._options: dict[str, Any] = {
            "partial_timeout_s": partial_timeout_s,
            "max_line_bytes": max_line_bytes,
            "max_read_bytes": max_read_bytes,
        }
        self._followers: dict[str, LogFollower] = {}
        self._waker = _Waker(use_observer=use_observer)
        self._started = False

    # -- configuration --------------------------------------------------------------------------

    def add(self, path: str | os.PathLike[str], *, from_start: bool | None = None) -> LogFollower:
        """Follow ``path`` (its absolute form is the key); the existing follower if already."""
        key = os.path.abspath(os.fspath(path))
        follower = self._followers.get(key)
        if follower is None:
            follower = LogFollower(
                key,
                self._store,
                from_start=self._from_start if from_start is None else from_start,
                **self._options,
            )
            self._followers[key] = follower
            self._waker.set_families(f.family for f in self._followers.values())
            self._waker.set()  # read the new file at once
        return follower

    def remove(self, key: str) -> None:
        """Stop following ``key``; its saved cursor stays in the store."""
        if self._followers.pop(key, None) is not None:
            self._waker.set_families(f.family for f in self._followers.values())

    @property
    def followers(self) -> Mapping[str, LogFollower]:
        return dict(self._followers)

    @property
    def wake_backend(self) -> str:
        return self._waker.backend

    @property
    def watched_dirs(self) -> list[str]:
        return self._waker.watched_dirs

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog observer (if enabled) and log which wake-up backend is active."""
        if self._started:
            return
        self._started = True
        for follower in self._followers.values():
            follower.prepare()
        self._waker.refresh()
        if self._waker.backend == "poll":
            log.info(
                "log follower: %d file(s), polled every %d ms only (%s)",
                len(self._followers),
                self.poll_interval_ms,
                self._waker.why_no_observer or "no watchable directory yet",
            )
        else:
            log.info(
                "log follower: %d file(s), woken by %s on %d dir(s), safety poll every %d ms",
                len(self._followers),
                self._waker.backend,
                len(self._waker.watched_dirs),
                self.poll_interval_ms,
            )

    def close(self) -> None:
        self._waker.stop()
        self._started = False

    def __enter__(self) -> LogTailManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop -------------------------------------------------------------------------------

    def poll(self) -> list[LogLine]:
        """Poll every follower; lines of one key are in order, keys one after another."""
        if self._started:
            self._waker.refresh()
        out: list[LogLine] = []
        for follower in list(self._followers.values()):
            out.extend(follower.poll())
            if follower.more_pending:
                self._waker.set()
        return out

    def commit(self, key: str, path: str, offset: int) -> None:
        """See :meth:`LogFollower.commit`; ``key`` is ``LogLine.key``."""
        self._followers[key].commit(path, offset)

    def flush_partial(self, key: str) -> list[LogLine]:
        """See :meth:`LogFollower.flush_partial`."""
        return self._followers[key].flush_partial()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until a wake-up hint or ``timeout_s`` (default: the poll interval)."""
        return self._waker.wait(self.poll_interval_ms / 1000 if timeout_s is None else timeout_s)

    def wake(self) -> None:
        """Make the current or next ``wait()`` return at once (any thread; e.g. on shutdown)."""
        self._waker.set()
