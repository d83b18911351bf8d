"""Crash-safe appends and an exclusive lock for the bisect's own files.

A bisect is interrupted on purpose (Ctrl-C) and by accident (OOM kills, reboots); every file
it keeps must be whole or absent afterwards, never half-written. Whole files are replaced
through ``oom_sentinel.daemon.core.atomic``; this module adds what only the bisect needs: an
append-only log whose torn last line is cut off, a lock, and removing git's read-only trees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from oom_sentinel.daemon.core.errors import BisectError

__all__ = [
    "FileLock",
    "append_line",
    "remove_tree",
]


def append_line(path: Path, line: str) -> None:
    """Append one whole line and fsync it.

    A crash mid-append can leave a torn last line; readers ignore a last line without its
    newline, and this function cuts such a tail off before appending, so a torn line never
    glues itself to the next record.
    """
    if "\n" in line or "\r" in line:
        raise ValueError("a log line must not contain a line break")
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size:
            # Find the end of the last complete line; drop anything after it.
            keep = _complete_prefix_len(fd, size)
            if keep != size:
                os.ftruncate(fd, keep)
                size = keep
        os.lseek(fd, size, os.SEEK_SET)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete_prefix_len(fd: int, size: int) -> int:
    block = 4096
    end = size
    while end > 0:
        start = max(0, end - block)
        os.lseek(fd, start, os.SEEK_SET)
        chunk = os.read(fd, end - start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            return start + idx + 1
        end = start
    return 0


class FileLock:
    """An exclusive, non-blocking lock on a file (flock on POSIX, msvcrt on Windows).

    The kernel drops the lock when the holder dies, so a crashed bisect never leaves a stale
    lock behind; that is also what makes it safe to remove a stale ``index.lock`` inside the
    workspace once this lock is held.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _lock_fd(fd)
        except OSError:
            os.close(fd)
            raise BisectError(
                f"{self.path}: {self.what} is in use by another oom-bisect process"
            ) from None
        self._fd = fd

    def fileno(self) -> int:
        """The locked descriptor; pass it to children so the lock lives as long as they do."""
        if self._fd is None:
            raise RuntimeError("lock not held")
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                _unlock_fd(fd)
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock_fd(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock_fd(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def remove_tree(path: Path) -> None:
    """Delete a directory tree, including git's read-only object files (Windows)."""

    def retry(func: Any, p: str, _exc: Any) -> None:
        try:
            os.chmod(p, 0o700)
            func(p)
        except FileNotFoundError:
            pass

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=retry)
        else:
            shutil.rmtree(path, onerror=retry)
