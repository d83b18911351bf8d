"""Give the C heap's free pages back to the OS.

The daemon lives for months beside a GPU workload. Start-up (config validation, the first
captures, a websocket handshake) and every incident leave freed blocks inside glibc's heap
that ``free()`` keeps for reuse; RSS stays at the high-water mark. ``malloc_trim(0)`` returns
the whole free pages to the kernel. It is glibc-only; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable

__all__ = ["release_free_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # absent from musl
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """True when the C library released memory, False when it had none to give back or
    cannot (not glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
