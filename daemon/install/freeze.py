"""One reading of ``pip freeze`` lines, shared by the install diff and the bisect's package
states.

Two parsers of these lines once lived apart (the diff's and the bisect's). They disagreed on
``===``, on whitespace before ``@``, and on an editable install without ``#egg=``: the diff
showed it, the bisect dropped it, so a bisect step was built without a package the user had.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Requirement", "canonical_name", "parse_freeze_line", "parse_freeze_lines"]

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*===?\s*(\S+)")
_DIRECT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*@\s*(\S.*)$")
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical_name(name: str) -> str:
    """PEP 503's normal form: ``Comfy_Kitchen`` and ``comfy-kitchen`` are one distribution."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


@dataclass(frozen=True, slots=True)
class Requirement:
    """One freeze line: the name as written, its normal form, and what pins it.

    ``spec`` is the version (``pin``), ``@ URL`` (``direct``), or the whole line (``editable``
    and ``other``, a line in no form pip freeze writes)."""

    name: str
    key: str
    spec: str
    kind: Literal["pin", "direct", "editable", "other"]
    line: str


def parse_freeze_line(raw: str) -> Requirement | None:
    """The requirement on one freeze line; None for a blank or a comment."""
    line = raw.strip()
    if not line or line.startswith("#"):
        return None
    if line.startswith(("-e ", "--editable")):
        egg = _EGG.search(line)
        name = egg.group(1) if egg else line.split()[-1].rstrip("/").rsplit("/", 1)[-1]
        return Requirement(name, canonical_name(name), line, "editable", line)
    if m := _PIN.match(line):
        return Requirement(m.group(1), canonical_name(m.group(1)), m.group(2), "pin", line)
    if m := _DIRECT.match(line):
        spec = "@ " + m.group(2).strip()
        return Requirement(m.group(1), canonical_name(m.group(1)), spec, "direct", line)
    return Requirement(line, canonical_name(line), line, "other", line)


def parse_freeze_lines(lines: Iterable[str]) -> dict[str, Requirement]:
    """Freeze lines → {normal name: requirement}; a later line of the same name wins."""
    out: dict[str, Requirement] = {}
    for raw in lines:
        req = parse_freeze_line(raw)
        if req is not None:
            out[req.key] = req
    return out
