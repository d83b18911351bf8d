"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Temp file in the same directory (so ``os.replace`` is a rename on one file system), fsync of
the file, rename, fsync of the directory (so the rename itself survives a power cut). The one
implementation for the whole package: the daemon, the CLIs and the bisect (whose runs are
interrupted on purpose and by accident) all write through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or create in ``path`` durable (a no-op where directories can't be opened:
    on Windows NTFS journals the rename itself)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> Path:
    """Replace ``path`` with ``data`` (creating its folder); returns the path written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int = 0o600) -> Path:
    """``write_bytes_atomic`` of ``text`` in UTF-8 (newlines written as given)."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_json_atomic(path: str | os.PathLike[str], value: Any, *, mode: int = 0o600) -> Path:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n"
    return write_text_atomic(path, text, mode=mode)
