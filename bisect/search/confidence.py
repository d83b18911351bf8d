"""A verdict with confidence (``--repeat auto``): SAME, DIFFERENT or UNKNOWN against the
threshold, from as few runs as the measured noise allows. Pure, like verdict.py.

Chromium's Pinpoint repeats a measurement until a statistical test says *same* or
*different*, and says *unknown* when it cannot tell. Peak memory is far less noisy than
time, so the test here is small and readable instead of a Mann-Whitney U:

* **The noise band** (``measure_band``) is the spread of the good endpoint, measured at the
  start by running it ``BAND_RUNS`` times: per pool, the range (max − min) of its peaks, and
  at least ``MIN_BAND_FRACTION`` of its median. The range of three runs is on average
  1.7 σ of normal noise, so one run farther than the band from the threshold is ~1.7 σ
  clear of it (wrong less than ~5 % of the time, one-sided, for normal noise); the floor keeps three identical runs from claiming there is no noise at all (allocator
  state, cudaMallocAsync and other processes move a peak by a fraction of a percent).
* **The decision rule** (``judge``), on the n runs of a state that measured something: take
  the median peak of each pool the threshold checks, and the margin band/√n (the spread of a
  median of n shrinks like 1/√n; on an even n the low median, so a tie leans good as with
  ``--repeat N``). DIFFERENT when a pool's median is above threshold +
  margin; SAME when every pool's median is at or below threshold − margin; otherwise run
  again, up to ``max_repeat`` runs, then UNKNOWN. With n = 1 this is "the first run decides
  unless it lies within the band of the threshold", so a clear state costs one run.
* An **OOM** is a sample above every threshold (+∞): one OOM decides on its own, but a single
  OOM among runs that fit does not outvote them — the median does. A timeout counted as bad
  is the same. A run stopped early at the stop limit (threshold + band) is a sample of its
  partial peak: that lower bound is already past the limit, and raising a value that lies
  above the median never moves the median, so the rule stays sound.
* A run that measured nothing (won't start, unknown node) is a **skip**: when no run of a
  state measured anything the state is untestable (git's skip) — that is not noise, so the
  first such run decides. Skips count against ``max_repeat``.

**UNKNOWN is a skip for the search** (``Verdict.SKIP``), as ``git bisect skip``: the plan
then steps around the state, and if the first bad commit is next to it the answer is the
honest range of candidates (``OnlySkippedLeft``). Calling it bad or good would name a
culprit the measurements cannot support; a skip never does.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from oom_sentinel.bisect.search.verdict import Ok, Oom, Outcome, Skip, Threshold, Timeout, Verdict

__all__ = [
    "BAND_RUNS",
    "DEFAULT_MAX_REPEAT",
    "MIN_BAND_FRACTION",
    "Band",
    "Confidence",
    "Judgement",
    "judge",
    "measure_band",
    "stop_limit",
]

#: runs of the good endpoint that measure the noise band
BAND_RUNS = 3
#: the most runs of one state before it is UNKNOWN (``--max-repeat``)
DEFAULT_MAX_REPEAT = 5
#: the band is never narrower than this fraction of the good endpoint's median peak
MIN_BAND_FRACTION = 0.005

_POOLS = ("vram", "ram")


class Confidence(enum.Enum):
    SAME = "same"  # the state is on the good side of the threshold
    DIFFERENT = "different"  # on the bad side
    UNKNOWN = "unknown"  # max_repeat runs could not tell


@dataclass(frozen=True)
class Band:
    """The noise of one measurement, per pool, in bytes (None: not measured)."""

    vram_bytes: int | None = None
    ram_bytes: int | None = None

    def get(self, pool: str) -> int:
        """The band of "vram" or "ram"; 0 for anything else (an OOM is no peak: no noise)."""
        v = {"vram": self.vram_bytes, "ram": self.ram_bytes}.get(pool)
        return v or 0

    def to_json(self) -> dict[str, int | None]:
        return {"vram_bytes": self.vram_bytes, "ram_bytes": self.ram_bytes}


@dataclass(frozen=True)
class Judgement:
    """What the runs of one state say. ``verdict`` is None while more runs are needed."""

    verdict: Verdict | None
    #: None for an untestable state (every run a skip) and while undecided
    confidence: Confidence | None
    #: runs counted (skips included; void early stops not)
    repeats: int
    #: per pool: median and spread (max − min) of the runs that measured it; +∞ is an OOM
    median: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    #: the margin the medians had to clear (band/√n), per pool
    margin: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        def num(d: dict[str, float]) -> dict[str, float | str]:
            return {k: ("inf" if math.isinf(v) else int(v)) for k, v in d.items()}

        return {
            "confidence": None if self.confidence is None else self.confidence.value,
            "repeats": self.repeats,
            "median_bytes": num(self.median),
            "spread_bytes": num(self.spread),
            "margin_bytes": num(self.margin),
        }


def _pool_peak(o: Outcome, pool: str) -> int | None:
    if isinstance(o, Skip):
        return None
    return o.peak_vram_bytes if pool == "vram" else o.peak_ram_bytes


def measure_band(good_runs: Sequence[Outcome]) -> Band:
    """The noise band from the good endpoint's runs (see the module docstring)."""
    out: dict[str, int | None] = {}
    for pool in _POOLS:
        values = [
            v
            for o in good_runs
            if isinstance(o, Ok) and not o.stopped_early
            for v in [_pool_peak(o, pool)]
            if v is not None
        ]
        if not values:
            out[pool] = None
            continue
        floor = math.ceil(statistics.median(values) * MIN_BAND_FRACTION)
        out[pool] = max(max(values) - min(values), floor)
    return Band(out["vram"], out["ram"])


def stop_limit(threshold: Threshold, band: Band) -> Threshold:
    """Where a run may stop early: past the threshold by the whole band, so a stopped run is
    a DIFFERENT sample on its own."""
    return Threshold(
        None if threshold.vram_bytes is None else threshold.vram_bytes + band.get("vram"),
        None if threshold.ram_bytes is None else threshold.ram_bytes + band.get("ram"),
    )


def _limit(threshold: Threshold, pool: str) -> int | None:
    return threshold.vram_bytes if pool == "vram" else threshold.ram_bytes


def _sample(o: Outcome, limit: Threshold, timeout_is_bad: bool) -> str | float | dict[str, float]:
    """One run as "skip", "void", +∞ (an OOM) or its peaks per pool (the "oom" pseudo-pool,
    used when the threshold checks no peak, is 0 for a run that fit)."""
    if isinstance(o, Skip):
        return "skip"
    if isinstance(o, Oom) or (isinstance(o, Timeout) and timeout_is_bad):
        return math.inf
    crossed = limit.crossed(o.peak_vram_bytes, o.peak_ram_bytes)
    if isinstance(o, Timeout) and not crossed:
        return "skip"
    if isinstance(o, Ok) and o.stopped_early and not crossed:
        return "void"  # stopped under the limit (an older, lower threshold): proves nothing
    peaks = {"oom": 0.0}
    for pool in _POOLS:
        v = _pool_peak(o, pool)
        if v is not None:
            peaks[pool] = float(v)
    return peaks


def judge(
    runs: Sequence[Outcome],
    threshold: Threshold,
    band: Band,
    max_repeat: int = DEFAULT_MAX_REPEAT,
    *,
    timeout_is_bad: bool = False,
    min_runs: int = 1,
) -> Judgement:
    """The decision rule of the module docstring over the runs of one state so far.

    ``min_runs``: decide SAME no earlier than this many measured runs (the good endpoint
    runs ``BAND_RUNS`` times to measure the band); a DIFFERENT is never held back.
    """
    if max_repeat < 1:
        raise ValueError("max_repeat must be >= 1")
    limit = stop_limit(threshold, band)
    pools = [p for p in _POOLS if _limit(threshold, p) is not None] or ["oom"]
    repeats = measured = 0
    # every pool is kept for the report; only the checked ones (or the OOM pseudo-pool) decide
    samples: dict[str, list[float]] = {p: [] for p in (*_POOLS, "oom")}
    for o in runs:
        sample = _sample(o, limit, timeout_is_bad)
        if sample == "void":
            continue
        repeats += 1
        if isinstance(sample, str):  # "skip"
            continue
        measured += 1
        for p, values in samples.items():
            v = sample if isinstance(sample, float) else sample.get(p)
            if v is not None:
                values.append(v)
    if measured == 0:
        return Judgement(Verdict.SKIP if repeats else None, None, repeats)
    median: dict[str, float] = {}
    spread: dict[str, float] = {}
    margin: dict[str, float] = {}
    above = False
    below = True
    for p, values in samples.items():
        if not values or (p == "oom" and p not in pools):
            continue
        # the low median: on an even count a tie leans good, as with --repeat N (claim a
        # regression only on a majority)
        m = statistics.median_low(values)
        if p != "oom":
            median[p] = m
            spread[p] = max(values) - min(values) if not math.isinf(max(values)) else math.inf
        if p not in pools:
            continue
        lim = float(_limit(threshold, p) or 0)
        margin[p] = band.get(p) / math.sqrt(len(values))
        if m > lim + margin[p]:
            above = True
        if not m <= lim - margin[p]:
            below = False

    def out(v: Verdict | None, c: Confidence | None) -> Judgement:
        return Judgement(v, c, repeats, median, spread, margin)

    if above:
        return out(Verdict.NEW, Confidence.DIFFERENT)
    if below and measured >= min_runs:
        return out(Verdict.OLD, Confidence.SAME)
    if repeats >= max(max_repeat, min_runs):
        return out(Verdict.SKIP, Confidence.UNKNOWN)
    return out(None, None)


def counted_runs(
    runs: Sequence[Outcome], threshold: Threshold, band: Band, *, timeout_is_bad: bool = False
) -> list[Outcome]:
    """The runs a judgement rests on (early stops under the stop limit prove nothing)."""
    limit = stop_limit(threshold, band)
    kept = [r for r in runs if _sample(r, limit, timeout_is_bad) != "void"]
    return kept or list(runs)


def describe(j: Judgement) -> str:
    """One line for the terminal: the word, the repeats and the spread behind it."""
    from oom_sentinel.daemon.core.units import format_bytes

    if j.verdict is Verdict.SKIP and j.confidence is None:
        return f"untestable after {j.repeats} run(s)"
    word = "undecided" if j.confidence is None else j.confidence.value.upper()
    parts = []
    for p, m in j.median.items():
        med = "OOM" if math.isinf(m) else format_bytes(int(m))
        sp = j.spread.get(p, 0.0)
        spread = "an OOM among them" if math.isinf(sp) else f"spread {format_bytes(int(sp))}"
        clear = f", margin ±{format_bytes(int(j.margin[p]))}" if p in j.margin else ""
        parts.append(f"{p.upper()} median {med}, {spread}{clear}")
    detail = "; ".join(parts)
    return f"{word} from {j.repeats} run(s)" + (f" ({detail})" if detail else "")
