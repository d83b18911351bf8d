"""Outcome → verdict rules (verdict.py), repeats, early stop and terms — pure tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oom_sentinel.bisect.search.verdict import (
    Ok,
    Oom,
    Outcome,
    Skip,
    Terms,
    Threshold,
    Timeout,
    Verdict,
    check_term_format,
    classify_run,
    decide,
    median_peaks,
    threshold_from_good,
)
from oom_sentinel.daemon.core.errors import ConfigError

GIB = 1024**3
THR = Threshold(vram_bytes=10 * GIB, ram_bytes=20 * GIB)
OLD, NEW, SKIP = Verdict.OLD, Verdict.NEW, Verdict.SKIP


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Oom("torch.OutOfMemoryError: CUDA out of memory"), "above"),
        (Ok(peak_vram_bytes=11 * GIB, peak_ram_bytes=1 * GIB), "above"),
        (Ok(peak_vram_bytes=1 * GIB, peak_ram_bytes=21 * GIB), "above"),
        (Ok(peak_vram_bytes=10 * GIB, peak_ram_bytes=20 * GIB), "below"),  # equal is not above
        (Ok(peak_vram_bytes=None, peak_ram_bytes=None), "below"),
        (Ok(peak_vram_bytes=11 * GIB, stopped_early=True), "above"),
        (Ok(peak_vram_bytes=9 * GIB, stopped_early=True), "void"),
        (Skip("server did not start"), "skip"),
        (Timeout(600.0), "skip"),
        (Timeout(600.0, peak_vram_bytes=12 * GIB), "above"),
    ],
    ids=[
        "oom",
        "vram-over",
        "ram-over",
        "at-threshold",
        "unmeasured",
        "stopped-early-over",
        "stopped-early-under",
        "skip",
        "timeout",
        "timeout-after-crossing",
    ],
)
def test_a_single_run_is_classified(outcome: Outcome, expected: str) -> None:
    assert classify_run(outcome, THR) == expected


def test_timeouts_can_count_as_bad() -> None:
    assert classify_run(Timeout(1.0), THR, timeout_is_bad=True) == "above"
    assert decide([Timeout(1.0)], THR, timeout_is_bad=True) is NEW
    assert decide([Timeout(1.0)], THR) is SKIP


def test_an_oom_is_bad_even_without_any_threshold() -> None:
    only = Threshold.oom_only()
    assert decide([Oom("x")], only) is NEW
    assert decide([Ok(peak_vram_bytes=10**15)], only) is OLD


A = Oom("CUDA out of memory")
B = Ok(peak_vram_bytes=GIB, peak_ram_bytes=GIB)
S = Skip("invalid prompt")
V = Ok(peak_vram_bytes=GIB, stopped_early=True)  # proves nothing


@pytest.mark.parametrize(
    ("runs", "repeat", "expected"),
    [
        ([], 1, None),
        ([A], 1, NEW),
        ([B], 1, OLD),
        ([S], 1, SKIP),
        ([V], 1, None),  # must be run again
        ([V, B], 1, OLD),
        ([A, A], 3, NEW),  # decided early: 2 of 3 already bad
        ([B, B], 3, OLD),
        ([A, B], 3, None),
        ([A, B, A], 3, NEW),
        ([A, B, B], 3, OLD),
        ([A, S, S], 3, SKIP),  # no majority of runs measured anything
        ([S, S], 3, SKIP),  # decided early
        ([A, B], 2, OLD),  # a tie is good: a regression needs a majority
        ([A, A, B, B, B], 3, NEW),  # more runs than asked (a cache): the first three count
    ],
    ids=lambda v: repr(v) if not isinstance(v, list) else "/".join(type(o).__name__ for o in v),
)
def test_repeats_take_the_median_run_and_stop_once_certain(
    runs: list[Outcome], repeat: int, expected: Verdict | None
) -> None:
    assert decide(runs, THR, repeat) is expected


_KIND = st.sampled_from(["above", "below", "skip", "void"])


def _outcome(kind: str) -> Outcome:
    return {"above": A, "below": B, "skip": S, "void": V}[kind]


@settings(max_examples=300, deadline=None)
@given(repeat=st.integers(1, 6), kinds=st.lists(_KIND, max_size=12))
def test_property_an_early_verdict_is_never_contradicted_by_later_runs(
    repeat: int, kinds: list[str]
) -> None:
    runs = [_outcome(k) for k in kinds]
    for i in range(len(runs) + 1):
        early = decide(runs[:i], THR, repeat)
        if early is not None:
            final = decide(runs, THR, repeat)
            assert final is early


@settings(max_examples=200, deadline=None)
@given(
    repeat=st.integers(1, 7),
    peaks=st.lists(st.integers(0, 20 * GIB), min_size=7, max_size=7),
)
def test_property_with_one_pool_the_verdict_is_the_median_against_the_threshold(
    repeat: int, peaks: list[int]
) -> None:
    thr = Threshold(vram_bytes=10 * GIB)
    runs = [Ok(peak_vram_bytes=p) for p in peaks[:repeat]]
    median_low = sorted(peaks[:repeat])[(repeat - 1) // 2]
    assert decide(runs, thr, repeat) is (NEW if median_low > thr.vram_bytes else OLD)


def test_running_peak_crossing_is_the_early_stop_signal() -> None:
    assert not THR.crossed(None, None)
    assert not THR.crossed(10 * GIB, 20 * GIB)
    assert THR.crossed(10 * GIB + 1, None)
    assert THR.crossed(None, 20 * GIB + 1)
    assert not Threshold(vram_bytes=None, ram_bytes=GIB).crossed(10**15, None)


def test_threshold_defaults_to_good_median_plus_ten_percent() -> None:
    runs = [Ok(10 * GIB, 4 * GIB), Ok(12 * GIB, 5 * GIB), Ok(11 * GIB, None)]
    t = threshold_from_good(runs)
    assert t.vram_bytes == int(11 * GIB * 1.1)
    assert t.ram_bytes == int(4 * GIB * 1.1)  # median_low of [4, 5]
    assert threshold_from_good(runs, margin=0.5).vram_bytes == int(11 * GIB * 1.5)


def test_an_explicit_budget_replaces_the_derived_threshold() -> None:
    budget = Threshold(vram_bytes=8 * GIB)
    assert threshold_from_good([Ok(10 * GIB, 4 * GIB)], budget=budget) == budget
    # an empty budget is no budget
    assert threshold_from_good([Ok(10 * GIB)], budget=Threshold()).vram_bytes == 11 * GIB


def test_unmeasured_pools_stay_unknown() -> None:
    assert median_peaks([Skip("x"), Ok(None, None)]) == (None, None)
    assert threshold_from_good([Ok(None, None)]) == Threshold(None, None)


@pytest.mark.parametrize(
    ("term", "which"),
    [("fits", "old"), ("ooms", "new"), ("fast", "old"), ("slow-now", "new"), ("v1.2", "old")],
    ids=lambda v: v,
)
def test_valid_terms(term: str, which: str) -> None:
    check_term_format(term, which)


@pytest.mark.parametrize(
    ("term", "which", "message"),
    [
        ("skip", "new", "command name"),
        ("reset", "old", "command name"),
        ("Log", "old", "command name"),
        ("bad", "old", "can't change the meaning"),
        ("new", "old", "can't change the meaning"),
        ("good", "new", "can't change the meaning"),
        ("old", "new", "can't change the meaning"),
        ("has space", "old", "not a valid term"),
        ("", "old", "not a valid term"),
        ("-x", "new", "not a valid term"),
        ("a..b", "new", "not a valid term"),
        ("x.lock", "new", "not a valid term"),
        ("a=b", "new", "not a valid term"),
        ("a#b", "new", "not a valid term"),
    ],
    ids=lambda v: repr(v),
)
def test_invalid_terms_are_refused_like_git(term: str, which: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        check_term_format(term, which)
    assert str(err.value).startswith(f"--term-{which}: ")


def test_terms_rename_the_verdict_words() -> None:
    t = Terms.checked("fits", "ooms")
    assert (t.word(OLD), t.word(NEW), t.word(SKIP)) == ("fits", "ooms", "skip")
    assert t.parse("fits") is OLD and t.parse("old") is OLD
    assert t.parse("ooms") is NEW and t.parse("new") is NEW
    assert t.parse("skip") is SKIP
    assert t.parse("good") is None and t.parse("bad") is None
    d = Terms.checked(None, None)
    assert d == Terms("good", "bad") and d.parse("bad") is NEW


def test_the_two_terms_must_differ() -> None:
    with pytest.raises(ConfigError, match="must differ"):
        Terms.checked("same", "same")
