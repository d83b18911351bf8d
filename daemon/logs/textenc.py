"""Which text encoding a log file is in: UTF-8 (ComfyUI's own), or UTF-16 -- what Windows
PowerShell 5 writes for ``python main.py > comfyui.log`` (UTF-16LE with a BOM). Read as UTF-8,
such a file has a NUL after every ASCII character and no OOM rule matches anything in it.

Pure: looks only at the file's first bytes. Used by the follower (logtail.py) and ``diagnose``.
"""

from __future__ import annotations

__all__ = ["UTF8", "UTF16_BE", "UTF16_LE", "detect_encoding", "newline_bytes"]

UTF8 = "utf-8"
UTF16_LE = "utf-16-le"
UTF16_BE = "utf-16-be"
#: without a BOM, this many leading bytes are needed to call a file UTF-16
_MIN_SAMPLE = 16


def detect_encoding(head: bytes) -> str:
    """The encoding of a file that begins with ``head`` (its first bytes, from offset 0).

    A UTF-16 BOM decides; without one, text whose every other byte is NUL (ASCII in UTF-16)
    is UTF-16 of that byte order; anything else is UTF-8.
    """
    if head.startswith(b"\xff\xfe"):
        return UTF16_LE
    if head.startswith(b"\xfe\xff"):
        return UTF16_BE
    sample = head[:4096]
    pairs = len(sample) // 2
    if pairs * 2 < _MIN_SAMPLE:
        return UTF8
    even_nul = sample[0 : pairs * 2 : 2].count(0)
    odd_nul = sample[1 : pairs * 2 : 2].count(0)
    if odd_nul >= 0.6 * pairs and even_nul <= 0.05 * pairs:
        return UTF16_LE
    if even_nul >= 0.6 * pairs and odd_nul <= 0.05 * pairs:
        return UTF16_BE
    return UTF8


def newline_bytes(encoding: str) -> bytes:
    """The bytes of ``\\n`` in ``encoding`` (one of this module's three)."""
    return "\n".encode(encoding)
