"""A verdict with confidence (``--repeat auto``): the pure decision rule (confidence.py), and
the step loop over a real session and a real install with a noisy measurement: the noise band
is measured on the good endpoint, a state near the threshold is repeated until it is clear,
UNKNOWN after ``max_repeat`` is a skip the answer reports, and the sandwich re-checks each
culprit and its parent (overturning a fluke)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pytest
from bisect_git import session_paths, untouched_install
from hypothesis import given, settings
from hypothesis import strategies as st

from oom_sentinel.bisect.cli.main import parse_repeat
from oom_sentinel.bisect.measure.replay import Measurement, Peaks
from oom_sentinel.bisect.search.confidence import (
    BAND_RUNS,
    Band,
    Confidence,
    describe,
    judge,
    measure_band,
    stop_limit,
)
from oom_sentinel.bisect.search.plan import Culprit, Found, OnlySkippedLeft
from oom_sentinel.bisect.search.verdict import Ok, Oom, Skip, Threshold, Timeout, Verdict
from oom_sentinel.bisect.session.files import BisectPaths, Session, begin
from oom_sentinel.bisect.session.report import build_report
from oom_sentinel.bisect.session.runner import SANDWICH_PHASE, Runner, read_measurements
from oom_sentinel.bisect.state.states import State, scan_install
from oom_sentinel.daemon.core.errors import ConfigError

MIB = 1024 * 1024
THR = Threshold(vram_bytes=1100 * MIB)
BAND = Band(vram_bytes=10 * MIB)


def ok(mib: float) -> Ok:
    return Ok(int(mib * MIB), 500 * MIB, 1.0)


# --------------------------------------------------------------------------- pure rule


def test_a_clear_first_run_decides_alone() -> None:
    j = judge([ok(1000)], THR, BAND)
    assert (j.verdict, j.confidence, j.repeats) == (Verdict.OLD, Confidence.SAME, 1)
    j = judge([ok(1200)], THR, BAND)
    assert (j.verdict, j.confidence, j.repeats) == (Verdict.NEW, Confidence.DIFFERENT, 1)


def test_a_run_within_the_band_asks_for_more_then_the_median_decides() -> None:
    assert judge([ok(1095)], THR, BAND).verdict is None  # 5 MiB under, band 10
    # three runs: median 1092, margin 10/√3 ≈ 5.8 MiB → 1092 ≤ 1100 − 5.8: SAME
    j = judge([ok(1095), ok(1092), ok(1080)], THR, BAND)
    assert j.confidence is Confidence.SAME
    assert j.spread["vram"] == 15 * MIB and j.median["vram"] == 1092 * MIB


def test_unknown_after_max_repeat_is_a_skip() -> None:
    runs = [ok(1099), ok(1101), ok(1100), ok(1102), ok(1098)]
    assert judge(runs[:4], THR, BAND, 5).verdict is None
    j = judge(runs, THR, BAND, 5)
    assert (j.verdict, j.confidence, j.repeats) == (Verdict.SKIP, Confidence.UNKNOWN, 5)
    assert "UNKNOWN from 5 run(s)" in describe(j) and "spread 4.00 MiB" in describe(j)


def test_an_oom_decides_alone_but_does_not_outvote_runs_that_fit() -> None:
    assert judge([Oom("CUDA out of memory")], THR, BAND).confidence is Confidence.DIFFERENT
    j = judge([ok(1000), Oom("CUDA out of memory"), ok(1001)], THR, BAND)
    assert j.confidence is Confidence.SAME


def test_skips_timeouts_and_early_stops() -> None:
    assert judge([Skip("won't start")], THR, BAND).verdict is Verdict.SKIP
    assert judge([Skip("won't start")], THR, BAND).confidence is None  # untestable, not noise
    assert judge([Timeout(60.0)], THR, BAND).verdict is Verdict.SKIP
    assert judge([Timeout(60.0)], THR, BAND, timeout_is_bad=True).verdict is Verdict.NEW
    # stopped at the stop limit: a DIFFERENT sample on its own
    limit = stop_limit(THR, BAND)
    assert limit.vram_bytes == 1110 * MIB
    stopped = Ok(limit.vram_bytes + 1, None, stopped_early=True)
    assert judge([stopped], THR, BAND).confidence is Confidence.DIFFERENT
    # stopped under it (an older, lower threshold): proves nothing, run again
    assert judge([Ok(1050 * MIB, None, stopped_early=True)], THR, BAND).verdict is None


def test_the_good_endpoint_waits_for_its_band_runs() -> None:
    runs = [ok(1000)] * BAND_RUNS
    only_oom = Threshold.oom_only()
    assert judge(runs[:2], only_oom, Band(), min_runs=BAND_RUNS).verdict is None
    assert judge(runs, only_oom, Band(), min_runs=BAND_RUNS).verdict is Verdict.OLD
    assert judge([Oom("x")], only_oom, Band(), min_runs=BAND_RUNS).verdict is Verdict.NEW
    # a band measured earlier is about peaks: it never blurs "no OOM"
    wide = Band(vram_bytes=50 * MIB, ram_bytes=50 * MIB)
    assert judge(runs[:1], only_oom, wide).confidence is Confidence.SAME


def test_the_band_is_the_good_spread_with_a_floor() -> None:
    assert measure_band([ok(1000), ok(1012), ok(995)]).vram_bytes == 17 * MIB
    # identical runs: the floor (0.5 % of the median), never zero
    assert measure_band([ok(1000)] * 3).vram_bytes == 5 * MIB
    assert measure_band([Skip("x")]) == Band()


samples = st.lists(st.integers(800, 1400), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(samples, st.integers(1, 6))
def test_never_more_than_max_repeat_runs(values: list[int], max_repeat: int) -> None:
    runs = [ok(v) for v in values]
    decided_at = next(
        (n for n in range(1, len(runs) + 1) if judge(runs[:n], THR, BAND, max_repeat).verdict),
        None,
    )
    if len(runs) >= max_repeat:
        assert decided_at is not None and decided_at <= max_repeat
    j = judge(runs[: decided_at or len(runs)], THR, BAND, max_repeat)
    if j.confidence is Confidence.UNKNOWN:
        assert j.repeats >= max_repeat


@settings(max_examples=300, deadline=None)
@given(samples, st.integers(1, 300))
def test_more_memory_never_turns_different_into_same(values: list[int], shift: int) -> None:
    before = judge([ok(v) for v in values], THR, BAND, 8)
    after = judge([ok(v + shift) for v in values], THR, BAND, 8)
    if before.confidence is Confidence.DIFFERENT:
        assert after.confidence is Confidence.DIFFERENT
    if after.confidence is Confidence.SAME:
        assert before.confidence is Confidence.SAME


@settings(max_examples=200, deadline=None)
@given(st.integers(800, 1400))
def test_one_run_outside_the_band_is_decided_by_its_side(v: int) -> None:
    j = judge([ok(v)], THR, BAND)
    if v > 1110:
        assert j.confidence is Confidence.DIFFERENT
    elif v <= 1090:
        assert j.confidence is Confidence.SAME
    else:
        assert j.verdict is None


def test_repeat_options() -> None:
    assert parse_repeat(None, None) == (1, False, 5)
    assert parse_repeat("3", None) == (3, False, 5)
    assert parse_repeat("auto", 7) == (1, True, 7)
    with pytest.raises(ConfigError, match="--max-repeat needs --repeat auto"):
        parse_repeat("3", 4)
    with pytest.raises(ConfigError, match="not a number or 'auto'"):
        parse_repeat("often", None)
    with pytest.raises(ConfigError, match="at least 1"):
        parse_repeat("auto", 0)


# --------------------------------------------------------------------------- the step loop

PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}}}
FIRST_BAD = 17


inst = untouched_install("confidence", "the step loop")


paths = session_paths()


def start(paths: BisectPaths, inst, **kw) -> Session:
    return begin(
        paths,
        scan_install(inst.root),
        "comfyui=v-first",
        "comfyui=HEAD",
        prompt=PROMPT,
        adaptive=True,
        **kw,
    )


class Noisy:
    """A measurement whose peak is ``peaks(index, k)`` MiB on the k-th run (0-based) of the
    core commit at ``index``; it honours the stop limit as the harness does."""

    def __init__(self, inst, peaks: Callable[[int, int], float]) -> None:
        self.inst = inst
        self.peaks = peaks
        self.runs: dict[int, int] = defaultdict(int)
        self.calls: list[tuple[int, bool]] = []

    def __call__(self, state: State, stop: Threshold | None) -> Measurement:
        i = self.inst.core.index(state.comfyui)
        k = self.runs[i]
        self.runs[i] += 1
        peak = int(self.peaks(i, k) * MIB)
        self.calls.append((i, stop is None))
        early = stop is not None and stop.crossed(peak, None)
        if early:
            assert stop is not None and stop.vram_bytes is not None
            peak = stop.vram_bytes + MIB  # what it reached when the harness stopped it
        return Measurement(
            Ok(peak, 500 * MIB, 1.0, stopped_early=early),
            Peaks(nvml_vram_bytes=peak, hwm_bytes=500 * MIB),
            stopped_early=early,
        )


def steady(i: int, k: int) -> float:
    # the good endpoint wobbles by a few MiB; from the culprit on, +600 MiB
    if i >= FIRST_BAD:
        return 1600.0
    return 1000.0 + (0, 4, -2)[k % 3]


def verdict_lines(paths: BisectPaths):
    return [m for m in read_measurements(paths.session) if m.event == "verdict"]


def test_the_band_is_measured_and_clear_states_cost_one_run(paths, inst) -> None:
    noisy = Noisy(inst, steady)
    runner = Runner(start(paths, inst), noisy, PROMPT)
    step = runner.run()
    assert step == Found((Culprit("comfyui", inst.core[FIRST_BAD], inst.core[FIRST_BAD - 1]),))
    lines = verdict_lines(paths)
    first = lines[0]
    assert first.phase == "verify-good" and first.data["repeats"] == BAND_RUNS
    # judged on OOMs only (no threshold yet), its spread in each pool is reported
    assert first.data["spread_bytes"] == {"vram": 6 * MIB, "ram": 0}
    assert first.data["margin_bytes"] == {"oom": 0}
    # the band every later verdict used: the good runs' range (6 MiB, 1000/1004/998)
    assert lines[1].data["band_bytes"]["vram_bytes"] == 6 * MIB
    search = [m for m in lines[1:] if m.phase != SANDWICH_PHASE]
    assert all(m.data["repeats"] == 1 for m in search)  # every state clear at once
    sandwich = [m for m in lines if m.phase == SANDWICH_PHASE]
    assert [m.state.comfyui for m in sandwich] == [
        inst.core[FIRST_BAD - 1],
        inst.core[FIRST_BAD],
    ]
    assert [m.data["repeats"] for m in sandwich] == [2, 2]  # its earlier run + the re-check
    assert [m.data["confidence"] for m in sandwich] == ["same", "different"]
    # launches: 3 for the band, one per other state, two for the sandwich; the culprit's
    # re-check ran to the end, so no separate "delta" run was needed for its Δ
    states = len(Session.open(paths).records())
    assert len(noisy.calls) == BAND_RUNS + (states - 1) + 2
    assert noisy.calls[-1] == (FIRST_BAD, True)
    phases = {m.phase for m in read_measurements(paths.session)}
    assert "delta" not in phases
    report = build_report(Session.open(paths), step)
    (c,) = report["culprits"]
    assert c["delta"]["lower_bound"] is False
    steps = report["steps"]
    assert steps[0]["confidence"] == {
        "word": "same",
        "repeats": 3,
        "spread_bytes": {"vram": 6 * MIB, "ram": 0},
        "margin_bytes": {"oom": 0},
    }
    assert all(s["confidence"]["repeats"] >= 1 for s in steps)


def test_a_state_near_the_threshold_is_repeated_until_clear(paths, inst) -> None:
    near = FIRST_BAD - 2  # its first run lands 2 MiB under the threshold (1100 MiB)

    def peaks(i: int, k: int) -> float:
        if i == near:
            return (1098.0, 1090.0, 1085.0, 1086.0)[min(k, 3)]
        return steady(i, k)

    noisy = Noisy(inst, peaks)
    step = Runner(start(paths, inst), noisy, PROMPT).run()
    assert isinstance(step, Found)
    (line,) = [
        m
        for m in verdict_lines(paths)
        if m.state.comfyui == inst.core[near] and m.phase == "bisect"
    ]
    # band 6 MiB: 1098 is within it; median of 1098/1090 (low) = 1090 ≤ 1100 − 4.2: SAME
    assert line.data["confidence"] == "same"
    assert line.data["repeats"] == 2
    assert line.data["spread_bytes"]["vram"] == 8 * MIB


def test_unknown_is_reported_as_a_skip_and_the_answer_stays_honest(paths, inst) -> None:
    def peaks(i: int, k: int) -> float:
        if i == FIRST_BAD:
            return 1100.0 + (1, -1)[k % 2]  # sits on the threshold: no run count can tell
        return steady(i, k)

    noisy = Noisy(inst, peaks)
    step = Runner(start(paths, inst, max_repeat=4), noisy, PROMPT).run()
    assert isinstance(step, OnlySkippedLeft)
    assert [c.value for c in step.candidates] == [inst.core[FIRST_BAD], inst.core[FIRST_BAD + 1]]
    assert noisy.runs[FIRST_BAD] == 4  # max_repeat, not one more
    (line,) = [m for m in verdict_lines(paths) if m.state.comfyui == inst.core[FIRST_BAD]]
    assert line.data["confidence"] == "unknown" and line.data["verdict"] == "skip"
    rec = [r for r in Session.open(paths).records() if r.state.comfyui == inst.core[FIRST_BAD]]
    assert rec[-1].verdict is Verdict.SKIP and rec[-1].runs == 4
    assert rec[-1].comment.endswith("(unknown after 4 runs: median within the noise band)")


def test_the_sandwich_overturns_a_fluke_and_the_search_moves_on(paths, inst) -> None:
    fluke = FIRST_BAD - 1  # its first run spikes (another process on the GPU), then fits

    def peaks(i: int, k: int) -> float:
        if i == fluke and k == 0:
            return 1650.0
        return steady(i, k)

    noisy = Noisy(inst, peaks)
    step = Runner(start(paths, inst), noisy, PROMPT).run()
    # without the sandwich the answer would be the fluke; the re-check clears it
    assert step == Found((Culprit("comfyui", inst.core[FIRST_BAD], inst.core[FIRST_BAD - 1]),))
    recs = [r for r in Session.open(paths).records() if r.state.comfyui == inst.core[fluke]]
    assert [r.verdict for r in recs] == [Verdict.NEW, Verdict.OLD]
    assert recs[-1].comment.startswith("re-checked before naming the culprit")
    sandwiched = [m.state.comfyui for m in verdict_lines(paths) if m.phase == SANDWICH_PHASE]
    # the fluke's parent and the fluke, then the real culprit (its parent is the fluke,
    # already re-checked)
    assert sandwiched == [inst.core[fluke - 1], inst.core[fluke], inst.core[FIRST_BAD]]


def test_an_interrupted_sandwich_resumes_without_losing_runs(paths, inst) -> None:
    class Cut(Noisy):
        cut_at = -1

        def __call__(self, state: State, stop: Threshold | None) -> Measurement:
            if len(self.calls) == self.cut_at:
                self.cut_at = -1
                raise KeyboardInterrupt
            return super().__call__(state, stop)

    baseline = Noisy(inst, steady)
    Runner(start(paths, inst), baseline, PROMPT).run()
    total = len(baseline.calls)
    from oom_sentinel.bisect.session.files import reset_paths

    reset_paths(paths)
    paths.outcomes.rename(paths.outcomes.with_name("outcomes-old"))
    cut = Cut(inst, steady)
    cut.cut_at = total - 1  # the culprit's re-check, the very last run
    with pytest.raises(KeyboardInterrupt):
        Runner(start(paths, inst), cut, PROMPT).run()
    step = Runner(Session.open(paths), cut, PROMPT).run()
    assert isinstance(step, Found)
    assert len(cut.calls) == total  # the cut-off run, once; nothing else repeated
