"""From what a replay observed to the word the search needs: old (good), new (bad) or skip.

Pure, so the rules can be read and tested in one place:

* An **OOM** is bad. So is a run whose peak crosses the **threshold** in any pool it sets: by
  default the good endpoint's median peak × 1.10 (``DEFAULT_MARGIN``) per pool; an explicit
  budget replaces that (and then only the pools it names are checked).
* A run that cannot say anything about memory is a **skip**: ComfyUI won't start, a node is
  unknown to this commit, the prompt is invalid, an unrelated exception (git's exit 125). A
  **timeout** is a skip too unless the caller counts hangs as bad (swap thrashing is memory
  trouble, but a deadlock is not).
* With ``--repeat N`` the verdict is the median run's: bad when more than half of the runs
  that measured something are bad (a tie is good: claim a regression only on a majority), and
  a skip when no more than half of the runs measured anything.
* **Early stop.** A run may stop as soon as it is bad (an OOM, or a running peak past the
  threshold: ``Threshold.crossed``); such a run is bad with a partial peak. A stopped run
  whose partial peak is *under* the threshold proves nothing and is ignored (that is how a
  cached early-stopped run is re-checked against a later, higher threshold). ``decide``
  returns a verdict as soon as no outcome of the remaining runs could change it, and None
  while more runs are needed.

Terms: the verdict words default to ``good``/``bad``; ``--term-old``/``--term-new`` rename
them (``fits``/``ooms`` reads better), checked like git's ``check_term_format``.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from oom_sentinel.daemon.core.errors import ConfigError

__all__ = [
    "DEFAULT_MARGIN",
    "RESERVED_TERMS",
    "Ok",
    "Oom",
    "Outcome",
    "Skip",
    "Terms",
    "Threshold",
    "Timeout",
    "Verdict",
    "check_term_format",
    "classify_run",
    "decide",
    "median_peaks",
    "threshold_from_good",
]

#: the default allowance over the good endpoint's peak (issue 6: "peak × 1.10")
DEFAULT_MARGIN = 0.10


class Verdict(enum.Enum):
    OLD = "old"  # the property still holds (good / fits)
    NEW = "new"  # the property changed (bad / ooms)
    SKIP = "skip"  # this state cannot be tested


@dataclass(frozen=True)
class Ok:
    """The prompt finished (or was stopped early) with these peaks (None: not measured)."""

    peak_vram_bytes: int | None = None
    peak_ram_bytes: int | None = None
    duration_s: float | None = None
    #: the run was stopped before the prompt finished because its peak crossed the threshold
    stopped_early: bool = False


@dataclass(frozen=True)
class Oom:
    """The run ran out of memory; ``evidence`` is the line that says so."""

    evidence: str
    pool: str | None = None  # "gpu", "ram", ... as daemon/classify names them
    peak_vram_bytes: int | None = None
    peak_ram_bytes: int | None = None


@dataclass(frozen=True)
class Skip:
    """The run could not test this state (won't start, unknown node, invalid prompt, ...)."""

    reason: str


@dataclass(frozen=True)
class Timeout:
    """The run did not finish within the hard limit."""

    after_s: float | None = None
    peak_vram_bytes: int | None = None
    peak_ram_bytes: int | None = None


Outcome = Ok | Oom | Skip | Timeout


@dataclass(frozen=True)
class Threshold:
    """A run is bad when a peak is *above* a limit; None: that pool is not checked."""

    vram_bytes: int | None = None
    ram_bytes: int | None = None

    def crossed(self, peak_vram_bytes: int | None, peak_ram_bytes: int | None) -> bool:
        """True once a (running) peak is past the limit: the measurement may stop now."""
        return (
            self.vram_bytes is not None
            and peak_vram_bytes is not None
            and peak_vram_bytes > self.vram_bytes
        ) or (
            self.ram_bytes is not None
            and peak_ram_bytes is not None
            and peak_ram_bytes > self.ram_bytes
        )

    @classmethod
    def oom_only(cls) -> Threshold:
        """Only an OOM is bad (used while the good endpoint itself is measured)."""
        return cls()


def threshold_from_good(
    good_runs: Sequence[Outcome],
    *,
    margin: float = DEFAULT_MARGIN,
    budget: Threshold | None = None,
) -> Threshold:
    """The threshold for a session: an explicit budget if given, else good's median × (1+margin)."""
    if budget is not None and (budget.vram_bytes is not None or budget.ram_bytes is not None):
        return budget
    vram, ram = median_peaks(good_runs)
    return Threshold(
        vram_bytes=None if vram is None else math.floor(vram * (1.0 + margin)),
        ram_bytes=None if ram is None else math.floor(ram * (1.0 + margin)),
    )


def _peaks(o: Outcome) -> tuple[int | None, int | None]:
    if isinstance(o, Skip):
        return None, None
    return o.peak_vram_bytes, o.peak_ram_bytes


def _median_low(values: list[int]) -> int | None:
    if not values:
        return None
    values = sorted(values)
    return values[(len(values) - 1) // 2]


def median_peaks(runs: Sequence[Outcome]) -> tuple[int | None, int | None]:
    """Median (low) VRAM and RAM peaks over runs that measured them; None where none did."""
    vram = [v for v, _ in map(_peaks, runs) if v is not None]
    ram = [r for _, r in map(_peaks, runs) if r is not None]
    return _median_low(vram), _median_low(ram)


class _Run(enum.Enum):
    ABOVE = "above"
    BELOW = "below"
    SKIP = "skip"
    VOID = "void"  # proves nothing (an early-stopped run under the threshold)


def classify_run(outcome: Outcome, threshold: Threshold, *, timeout_is_bad: bool = False) -> str:
    """One run alone: "above", "below", "skip" or "void" (see the module docstring)."""
    return _classify(outcome, threshold, timeout_is_bad).value


def _classify(outcome: Outcome, threshold: Threshold, timeout_is_bad: bool) -> _Run:
    if isinstance(outcome, Oom):
        return _Run.ABOVE
    if isinstance(outcome, Skip):
        return _Run.SKIP
    if isinstance(outcome, Timeout):
        if threshold.crossed(outcome.peak_vram_bytes, outcome.peak_ram_bytes):
            return _Run.ABOVE
        return _Run.ABOVE if timeout_is_bad else _Run.SKIP
    if threshold.crossed(outcome.peak_vram_bytes, outcome.peak_ram_bytes):
        return _Run.ABOVE
    return _Run.VOID if outcome.stopped_early else _Run.BELOW


def _final(above: int, below: int, repeat: int) -> Verdict:
    valid = above + below
    if valid * 2 <= repeat:
        return Verdict.SKIP
    return Verdict.NEW if above * 2 > valid else Verdict.OLD


def decide(
    runs: Sequence[Outcome],
    threshold: Threshold,
    repeat: int = 1,
    *,
    timeout_is_bad: bool = False,
) -> Verdict | None:
    """The verdict of ``repeat`` runs, or None while the runs so far leave it open.

    ``runs`` may hold more than ``repeat`` outcomes (a cache filled under another threshold);
    the first ``repeat`` that count are used. Early-stopped runs under the threshold don't
    count and must be run again.
    """
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    counted = [
        c for c in (_classify(r, threshold, timeout_is_bad) for r in runs) if c is not _Run.VOID
    ][:repeat]
    above = sum(c is _Run.ABOVE for c in counted)
    below = sum(c is _Run.BELOW for c in counted)
    left = repeat - len(counted)
    # Each remaining run is above, below or a skip; the final verdict is monotone in the
    # above/below split for a fixed number of skips, so the extremes cover every mix.
    outcomes = {
        _final(above + a, below + (left - s - a), repeat)
        for s in range(left + 1)
        for a in (0, left - s)
    }
    return outcomes.pop() if len(outcomes) == 1 else None


# --------------------------------------------------------------------------- terms

#: words that can't be terms: our session commands, and skip (git: check_term_format)
RESERVED_TERMS = frozenset(
    {
        "help",
        "start",
        "run",
        "skip",
        "next",
        "reset",
        "status",
        "log",
        "replay",
        "terms",
        "view",
        "visualize",
        "mark",
    }
)
_TERM_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")


def check_term_format(term: str, which: str) -> None:
    """Reject a term git would reject, plus anything that can't be one word of our log.

    ``which`` is ``"old"`` or ``"new"``. As in git, ``bad``/``new`` may only name the new
    term and ``good``/``old`` only the old one.
    """
    flag = f"--term-{which}"
    if not _TERM_RE.match(term) or term.endswith((".", ".lock")) or ".." in term:
        raise ConfigError(
            f"{flag}: {term!r} is not a valid term (a word of letters, digits, '-', '_' or '.')"
        )
    if term.lower() in RESERVED_TERMS:
        raise ConfigError(f"{flag}: can't use the command name {term!r} as a term")
    if which == "old" and term in ("bad", "new"):
        raise ConfigError(f"{flag}: can't change the meaning of the term {term!r}")
    if which == "new" and term in ("good", "old"):
        raise ConfigError(f"{flag}: can't change the meaning of the term {term!r}")


@dataclass(frozen=True)
class Terms:
    """The two words for OLD and NEW (``good``/``bad`` unless renamed)."""

    old: str = "good"
    new: str = "bad"

    @classmethod
    def checked(cls, old: str | None, new: str | None) -> Terms:
        o = old if old is not None else "good"
        n = new if new is not None else "bad"
        if old is not None or new is not None:
            check_term_format(o, "old")
            check_term_format(n, "new")
        if o == n:
            raise ConfigError(f"--term-old and --term-new must differ (both are {o!r})")
        return cls(o, n)

    def word(self, verdict: Verdict) -> str:
        if verdict is Verdict.OLD:
            return self.old
        if verdict is Verdict.NEW:
            return self.new
        return "skip"

    def parse(self, word: str) -> Verdict | None:
        """The verdict a word names: the terms, the neutral ``old``/``new``, or ``skip``."""
        if word in (self.old, "old"):
            return Verdict.OLD
        if word in (self.new, "new"):
            return Verdict.NEW
        if word == "skip":
            return Verdict.SKIP
        return None
