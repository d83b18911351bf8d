"""Memory sizes: the binary unit constants, the one reader of a size (``parse_size``) and the
one human-readable formatter (``format_bytes``), shared by the classifier, summaries, the
CLIs' stories and flags, doctor, advice, alerts and the bisect's reports.

**Every K/M/G/T/P is a power of 1024, with or without the ``i``: ``GB`` means the same as
``GiB``.** That is what every producer we read prints: torch's allocator messages (CUDA, HIP,
XPU ``format_size``), MPS (``GB``/``MB`` computed with 1024), numpy (``MiB``), the kernel
(``kB``), earlyoom (``MiB``). It is also what ComfyUI means by the sizes its users type
(``--reserve-vram 1.5`` is 1.5 × 1024³ bytes, its ``400 MB`` reserve 400 × 1024²) and what an
"8 GB card" holds. So a flag such as ``oom-bisect --vram-budget 8GB`` is 8 GiB too: a user
copying a size from a log, from ComfyUI or from a card's box gets what they read, never a
decimal 7.45 GiB.

Sizes print in binary units with two decimals, the way torch prints them in its OOM messages
("Tried to allocate 2.00 GiB"), so our numbers and the log's numbers read alike side by side.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["GIB", "KIB", "MIB", "format_bytes", "parse_size", "size_bytes"]

KIB = 1024
MIB = 1024**2
GIB = 1024**3

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")

#: unit (lower case) -> bytes; binary whichever way it is spelled (see the module docstring)
_FACTORS: dict[str, int] = {"": 1, "b": 1, "byte": 1, "bytes": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    for _spelling in (_letter, f"{_letter}b", f"{_letter}i", f"{_letter}ib"):  # (Gi: Kubernetes)
        _FACTORS[_spelling] = KIB**_power
#: beyond any memory a machine has: a "size" this big is a misread, not a size
_MAX_SIZE = 1e21
_RX_SIZE = re.compile(r"\s*(\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def size_bytes(number: str, unit: str) -> int | None:
    """``("2.00", "GiB")`` -> 2147483648, ``("1,234", "kB")`` -> 1263616; None when it is not
    a size (not a number, an unknown unit, negative or absurdly large). Binary either way."""
    try:
        # exact decimal arithmetic: a float is off by kilobytes at exabyte figures (a ROCm
        # APU's bogus '17179869183.96 GiB is free')
        value = Decimal(number.replace(",", ""))
    except InvalidOperation:
        return None
    factor = _FACTORS.get(unit.lower())
    if factor is None or not value.is_finite() or not 0 <= value <= _MAX_SIZE:
        return None
    return round(value * factor)


def parse_size(text: str) -> int | None:
    """``"8GiB"``, ``"8 GB"``, ``"8G"``, ``"8192MiB"``, ``"1.5 GiB"``, ``"1048576"`` -> bytes
    (binary, see the module docstring); None when ``text`` is not one size."""
    m = _RX_SIZE.fullmatch(text) if isinstance(text, str) else None
    return size_bytes(m.group(1), m.group(2)) if m else None


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
