"""``release_free_heap`` really hands freed heap pages back to the kernel (glibc)."""

from __future__ import annotations

import platform
import sys

import pytest

from oom_sentinel.daemon.core.heap import release_free_heap


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_freed_holes_in_the_heap_go_back_to_the_kernel() -> None:
    # 64 KiB blocks come from the heap (below the mmap threshold); keeping every 8th alive
    # leaves holes that free() alone cannot return, only malloc_trim can
    blocks = [bytearray(64 * 1024) for _ in range(3000)]
    keep = blocks[::8]
    del blocks
    before = _rss_kib()
    assert release_free_heap() is True
    after = _rss_kib()
    assert before - after > 50 * 1024, (before, after)  # most of ~165 MiB of holes
    assert len(keep) == 375
