"""Human-readable memory sizes, shared by summaries, the CLI's story and alerts.

Binary units with two decimals, the way torch prints them in its OOM messages ("Tried to
allocate 2.00 GiB"), so our numbers and the log's numbers read alike side by side.
"""

from __future__ import annotations

__all__ = ["format_bytes"]

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(value: int | float | None, unknown: str = "unknown") -> str:
    """``2147483648`` -> ``"2.00 GiB"``; ``None`` -> ``unknown`` (never "0 B")."""
    if value is None:
        return unknown
    sign = "-" if value < 0 else ""
    size = float(abs(value))
    if size < 1024:
        return f"{sign}{int(size)} B"
    size /= 1024
    unit = _UNITS[0]
    for unit in _UNITS:  # noqa: B007 -- the unit the loop stops at is the answer
        if size < 1024:
            break
        size /= 1024
    return f"{sign}{size:.2f} {unit}"
