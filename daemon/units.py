"""Memory sizes: the binary unit constants and the one human-readable formatter, shared by
summaries, the CLIs' stories, doctor, advice, alerts and the bisect's reports.

Binary units with two decimals, the way torch prints them in its OOM messages ("Tried to
allocate 2.00 GiB"), so our numbers and the log's numbers read alike side by side.
"""

from __future__ import annotations

__all__ = ["GIB", "KIB", "MIB", "format_bytes"]

KIB = 1024
MIB = 1024**2
GIB = 1024**3

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(
    value: int | float | None, unknown: str = "unknown", *, byte_unit: str = "B"
) -> str:
    """``2147483648`` -> ``"2.00 GiB"``; ``1023`` -> ``"1023 B"`` (``byte_unit`` names the
    unit below 1 KiB); ``None`` -> ``unknown`` (never "0 B")."""
    if value is None:
        return unknown
    sign = "-" if value < 0 else ""
    size = float(abs(value))
    if size < 1024:
        return f"{sign}{int(size)} {byte_unit}"
    for unit in _UNITS:
        size /= 1024
        if size < 1024 or unit == _UNITS[-1]:
            break
    return f"{sign}{size:.2f} {unit}"
