"""Where a followed log file was read up to, and the interface that persists it.

The follower (logtail.py) and the store (store.py) meet here, so neither imports the other.
A cursor names the file by identity (device + inode) and by a fingerprint of its first bytes,
because inodes are reused after delete/re-create and a copy-truncate keeps the inode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["FileCursor", "MemoryOffsetStore", "OffsetStore"]


@dataclass(frozen=True, slots=True)
class FileCursor:
    #: stable name of the followed path (the configured path, absolute)
    key: str
    dev: int
    ino: int
    #: byte offset up to which every record has been fully handled
    offset: int
    #: hex digest of the file's first bytes when the cursor was taken ("" for an empty file)
    fingerprint: str


class OffsetStore(Protocol):
    def load_cursor(self, key: str) -> FileCursor | None: ...

    def save_cursor(self, cursor: FileCursor) -> None: ...


class MemoryOffsetStore:
    """In-process OffsetStore for tests and one-shot reads."""

    def __init__(self) -> None:
        self._cursors: dict[str, FileCursor] = {}

    def load_cursor(self, key: str) -> FileCursor | None:
        return self._cursors.get(key)

    def save_cursor(self, cursor: FileCursor) -> None:
        self._cursors[cursor.key] = cursor
