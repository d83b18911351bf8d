"""The ``oom-bisect fit`` experiment: the failing prompt unchanged, then one change at a time.

The loop is the guide's advice done by a machine: "change one flag at a time, restart
ComfyUI, and re-test with the same workflow". Every run is a fresh ComfyUI (the replay
harness: ``measure(change)`` starts one, replays, stops it), so no cache or loaded model of
an earlier run helps a later one.

1. The **baseline** (no change) must fail: an OOM, or a peak over the emulated budget
   (``--vram-budget``/``--ram-budget``: a smaller card or less RAM than this machine has). A
   baseline that fits means there is nothing to fix here; one that cannot run (won't start,
   invalid prompt) means nothing else can be measured either.
2. The **singles**, from ``candidates(pool)`` (fit_candidates.py: cheapest first), one per
   run, until one fits (or all were tried with ``keep_going``).
3. Only when no single change fits: **combinations** of the singles that failed, and the
   answer says it took a combination.

``max_runs`` counts every ComfyUI start, the baseline included. Judging a run is a pure
function (``judge``); the loop does no I/O of its own, so the tests can drive it with a
scripted ``measure`` as well as with the real harness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from oom_sentinel.bisect.fit.candidates import Change, combinations
from oom_sentinel.bisect.measure.replay import Measurement
from oom_sentinel.bisect.search.verdict import Ok, Oom, Skip, Threshold, Timeout

__all__ = [
    "DEFAULT_MAX_RUNS",
    "RESULT_FITS",
    "RESULT_NOTHING_FITS",
    "RESULT_NOT_REPRODUCED",
    "RESULT_UNTESTABLE",
    "Experiment",
    "FitEvents",
    "FitResult",
    "Trial",
    "judge",
    "pool_of",
]

DEFAULT_MAX_RUNS = 12
RESULT_FITS = "fits"
RESULT_NOTHING_FITS = "nothing-fits"
RESULT_NOT_REPRODUCED = "not-reproduced"
RESULT_UNTESTABLE = "untestable"

#: daemon/classify pools → the pool a fit works on
_POOL = {
    "gpu": "vram",
    "gpu-fragmentation": "vram",
    "unified-mps": "vram",
    "ram": "ram",
    "swap-pagefile": "ram",
    "killed-by-os": "ram",
}


def pool_of(word: str | None) -> str | None:
    """ "vram" or "ram" for a classifier pool ("gpu", "killed-by-os" …), or a fit pool."""
    if word in ("vram", "ram"):
        return word
    return _POOL.get(str(word)) if word else None


@dataclass(frozen=True)
class Trial:
    """One run: the change (None: the baseline), what happened, and whether it fits."""

    change: Change | None
    measurement: Measurement
    fits: bool
    #: "fits", "oom", "over-budget", "timeout" or "skip"
    verdict: str
    #: one line: the OOM's evidence, the budget crossed, the skip's reason
    reason: str
    #: "vram"/"ram": the pool that failed (None when it fits or is unknown)
    pool: str | None = None

    @property
    def prompt_s(self) -> float | None:
        v = self.measurement.timings.get("prompt_s")
        return float(v) if v is not None else None


def judge(m: Measurement, budget: Threshold) -> tuple[bool, str, str, str | None]:
    """(fits, verdict, reason, failing pool) of one measurement under ``budget``."""
    o = m.outcome
    vram, ram = m.peaks.vram_bytes, m.peaks.ram_bytes
    over = []
    if budget.vram_bytes is not None and vram is not None and vram > budget.vram_bytes:
        over.append("vram")
    if budget.ram_bytes is not None and ram is not None and ram > budget.ram_bytes:
        over.append("ram")
    if isinstance(o, Ok):
        if over or o.stopped_early:
            pool = over[0] if over else None
            what = {"vram": "VRAM", "ram": "RAM"}.get(pool or "", "a")
            return False, "over-budget", f"{what} peak over the budget", pool
        return True, "fits", "ran to the end within the budget", None
    if isinstance(o, Oom):
        return False, "oom", o.evidence, pool_of(o.pool) or (over[0] if over else None)
    if isinstance(o, Timeout):
        return False, "timeout", f"no answer within {o.after_s or 0:g} s", None
    assert isinstance(o, Skip)
    return False, "skip", o.reason, None


@dataclass
class FitResult:
    result: str
    baseline: Trial
    pool: str | None
    trials: list[Trial] = field(default_factory=list)
    #: no single change fitted, so combinations were tried
    combined: bool = False
    #: the changes not tried because --max-runs ran out
    untried: list[Change] = field(default_factory=list)
    recommendation: Trial | None = None
    message: str = ""


class FitEvents(Protocol):
    def run_start(self, number: int, change: Change | None) -> None: ...

    def run_done(self, number: int, trial: Trial) -> None: ...


class _Quiet:
    def run_start(self, number: int, change: Change | None) -> None:
        pass

    def run_done(self, number: int, trial: Trial) -> None:
        pass


class Experiment:
    """Runs the baseline, the singles and, if needed, the combinations."""

    def __init__(
        self,
        measure: Callable[[Change | None], Measurement],
        candidates: Callable[[str | None], Sequence[Change]],
        *,
        budget: Threshold,
        pool: str | None = None,
        max_runs: int = DEFAULT_MAX_RUNS,
        keep_going: bool = False,
        events: FitEvents | None = None,
    ) -> None:
        if max_runs < 2:
            raise ValueError("max_runs must be at least 2 (the baseline and one change)")
        self.measure = measure
        self.candidates = candidates
        self.budget = budget
        self.pool = pool_of(pool)
        self.max_runs = max_runs
        self.keep_going = keep_going
        self.events: FitEvents = events or _Quiet()
        self.runs = 0

    def _try(self, change: Change | None) -> Trial:
        self.runs += 1
        self.events.run_start(self.runs, change)
        m = self.measure(change)
        fits, verdict, reason, pool = judge(m, self.budget)
        trial = Trial(change, m, fits, verdict, reason, pool)
        self.events.run_done(self.runs, trial)
        return trial

    def run(self) -> FitResult:
        baseline = self._try(None)
        pool = self.pool or baseline.pool
        if baseline.fits:
            return FitResult(
                RESULT_NOT_REPRODUCED,
                baseline,
                pool,
                message="the workflow fits unchanged on this install: there is nothing to "
                "fix (give --vram-budget or --ram-budget to emulate a smaller card)",
            )
        if baseline.verdict in ("skip", "timeout"):
            return FitResult(
                RESULT_UNTESTABLE,
                baseline,
                pool,
                message=f"the unchanged workflow could not be measured ({baseline.verdict}: "
                f"{baseline.reason}), so no change can be judged",
            )
        singles = list(self.candidates(pool))
        result = FitResult(RESULT_NOTHING_FITS, baseline, pool)
        failed: list[Change] = []
        queue = list(singles)
        while queue and self.runs < self.max_runs:
            change = queue.pop(0)
            trial = self._try(change)
            result.trials.append(trial)
            if trial.fits:
                if not self.keep_going:
                    break
            elif trial.verdict in ("oom", "over-budget", "timeout"):
                failed.append(change)
        fitting = [t for t in result.trials if t.fits]
        if not fitting and not queue:
            result.combined = True
            combos = combinations(failed)
            while combos and self.runs < self.max_runs:
                trial = self._try(combos.pop(0))
                result.trials.append(trial)
                if trial.fits:
                    break
            queue = combos
            fitting = [t for t in result.trials if t.fits]
        result.untried = queue
        if fitting:
            best = min(fitting, key=lambda t: t.change.cost if t.change else 0.0)
            result.result = RESULT_FITS
            result.recommendation = best
            result.message = ""
        else:
            tried = len(result.trials)
            left = f"; {len(queue)} left untried (raise --max-runs)" if queue else ""
            result.message = (
                f"nothing fits: the baseline and {tried} change(s) all failed"
                + (" (combinations included)" if result.combined else "")
                + left
            )
            if not singles:
                result.message = (
                    f"nothing fits: no flag or knob applies to this {pool or 'memory'} "
                    "failure (a smaller or quantized model is the remaining option)"
                )
        return result
