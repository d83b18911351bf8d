"""The scanner's prefilter: where in raw bytes one of the rules' ``NEEDLES`` occurs.

Both prefilters (``PREFILTERS``: one Aho-Corasick pass when ``ahocorasick-rs`` is installed,
else one stdlib pass per needle, a literal regex or ``bytes.find``) report every line that
holds one of these needles, and nothing else, so the scanner's windows are the same whichever
runs.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable

from oom_sentinel.daemon.classify import rules
from oom_sentinel.daemon.classify.rules import NEEDLES

_NEEDLES_B: tuple[bytes, ...] = tuple(n.encode() for n in NEEDLES)

# -- the prefilter -----------------------------------------------------------------------------
#
# A prefilter maps (buffer, end) to the ascending positions in ``buffer[:end]`` where a needle
# starts, with at least one position on every line that holds a needle. The scanner only works
# per line (a hit opens or extends the window around its line), so a position per needle-holding
# line is all it needs, and it never sees a position that is not a needle: the set of lines it
# opens windows for is exactly the set of lines ``has_needle`` accepts, whichever prefilter runs.

#: Type of a prefilter: (buffer, end) -> needle positions (see above).
Prefilter = Callable[[bytes | bytearray, int], list[int]]


#: Needles shorter than this are searched with a compiled literal pattern: the regex engine's
#: literal-prefix scan ran 10-30 % faster than ``bytes.find``'s on them here (CPython 3.11,
#: every needle but the two longest), ``bytes.find``'s skip table wins on longer ones.
_REGEX_BELOW = 16
_FIND_SEARCHES: tuple[tuple[bytes, re.Pattern[bytes] | None], ...] = tuple(
    (n, re.compile(re.escape(n)) if len(n) < _REGEX_BELOW else None) for n in _NEEDLES_B
)


def _hits_by_find(buf: bytes | bytearray, end: int) -> list[int]:
    """Needle occurrences, one stdlib pass per needle (the fallback without the extra): every
    occurrence, or for a regex-searched needle every one that does not overlap the one before
    (on the same line, so every needle-holding line still gets a position)."""
    out: list[int] = []
    find = buf.find
    for needle, rx in _FIND_SEARCHES:
        if rx is not None:
            out.extend(m.start() for m in rx.finditer(buf, 0, end))
            continue
        pos = find(needle, 0, end)
        while pos >= 0:
            out.append(pos)
            pos = find(needle, pos + 1, end)
    out.sort()
    return out


def _any_match(
    find_all: Callable[[bytes], list[tuple[int, int, int]]],
) -> Callable[[bytes], bool]:
    def any_match(data: bytes) -> bool:
        return bool(find_all(data))

    return any_match


def _automaton_prefilter() -> Prefilter | None:
    """All needles in one pass of a SIMD-accelerated Aho-Corasick automaton (``ahocorasick-rs``,
    the optional ``fast`` extra), or None when it is not installed.

    Leftmost-first matching reports non-overlapping matches only, but a needle occurrence it
    skips overlaps a reported one (it started inside it), and needles hold no newline, so both
    sit on the same line: every needle-holding line still gets a position.

    The module and the automaton load on the first scan: the daemon classifies records one
    at a time and never scans, so it does not carry them.
    """
    if importlib.util.find_spec("ahocorasick_rs") is None:
        return None
    find_all: Callable[[memoryview | bytes], list[tuple[int, int, int]]] | None = None

    def hits(buf: bytes | bytearray, end: int) -> list[int]:
        nonlocal find_all
        if find_all is None:
            import ahocorasick_rs

            automaton = ahocorasick_rs.BytesAhoCorasick(
                list(_NEEDLES_B), matchkind=ahocorasick_rs.MatchKind.LeftmostFirst
            )
            find_all = automaton.find_matches_as_indexes
            # the classifier's needle test on long records (a traceback's frames) runs on
            # the same automaton from now on: one pass instead of one per needle
            rules._bytes_has_needle = _any_match(find_all)
        with memoryview(buf) as view, view[:end] as part:
            return [match[1] for match in find_all(part)]

    return hits


#: The prefilters this install has, by name; ``scan_stream(prefilter=...)`` picks one.
PREFILTERS: dict[str, Prefilter] = {"find": _hits_by_find}
_ac_hits = _automaton_prefilter()
if _ac_hits is not None:
    PREFILTERS["ahocorasick"] = _ac_hits
#: What ``scan_stream`` uses unless told otherwise: the automaton when installed.
DEFAULT_PREFILTER = "ahocorasick" if _ac_hits is not None else "find"
