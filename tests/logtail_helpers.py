"""Writers that behave like the programs whose logs we follow (shared by the logtail tests
and the burst benchmark): append-and-close like Manager's flush-per-write tee, and Manager's
exact start-up rotation."""

from __future__ import annotations

import os
from pathlib import Path


def append(path: Path, data: str | bytes) -> None:
    """Append and close, as ComfyUI-Manager's tee does (it flushes after every write)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with open(path, "ab") as fh:
        fh.write(raw)


def manager_rotate(live: Path) -> None:
    """ComfyUI-Manager's rotation at every ComfyUI start (anchors-manager-cli §1.7): delete
    ``.prev2.log``, ``.prev.log`` → ``.prev2.log``, ``.log`` → ``.prev.log``, then open a new
    ``.log`` truncated."""
    stem = live.name[: -len(".log")]
    prev = live.with_name(f"{stem}.prev.log")
    prev2 = live.with_name(f"{stem}.prev2.log")
    if prev2.exists():
        prev2.unlink()
    if prev.exists():
        os.rename(prev, prev2)
    if live.exists():
        os.rename(live, prev)
    with open(live, "w"):
        pass


def copy_truncate(live: Path) -> None:
    """logrotate's copytruncate: copy to ``X.log.1`` (a new file), then truncate in place."""
    data = live.read_bytes()
    copy = live.with_name(live.name + ".1")
    copy.write_bytes(data)
    with open(live, "r+b") as fh:
        fh.truncate(0)
