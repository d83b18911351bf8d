"""The k-ary search of ``--parallel N`` (plan.next_batch) as a specification: a batch of up to
N states per round inside a culprit repo's range, ⌈log_{N+1} M⌉ rounds instead of ⌈log2 M⌉,
the same answer as the one-at-a-time search, and width 1 is exactly ``next_step``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oom_sentinel.bisect.search.plan import (
    Culprit,
    Found,
    OnlySkippedLeft,
    Plan,
    Test,
    next_batch,
    next_step,
    rounds_bound,
)
from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.state.states import State

OLD, NEW, SKIP = Verdict.OLD, Verdict.NEW, Verdict.SKIP


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:039x}"[:40] for i in range(n + 1)]


def core_plan(m: int) -> tuple[Plan, list[str]]:
    c = ids("a", m)
    return Plan.build(State.of(c[0]), State.of(c[m]), {"comfyui": c[1:]}), c


def search(plan: Plan, verdict, width: int) -> tuple[object, list[tuple[Test, ...]]]:
    """Run the batched search to its answer; the rounds, each the batch measured at once."""
    rounds: list[tuple[Test, ...]] = []
    for _ in range(10_000):
        batch = next_batch(plan, width)
        if not batch:
            return next_step(plan), rounds
        rounds.append(batch)
        for t in batch:
            plan = plan.observe(t.state, verdict(t.state))
    raise AssertionError("the search did not end")


def test_rounds_bound_is_log_base_n_plus_one() -> None:
    assert [rounds_bound(m, 1) for m in (1, 2, 3, 4, 5, 1000)] == [0, 1, 2, 2, 3, 10]
    assert [rounds_bound(m, 3) for m in (1, 4, 5, 16, 17, 1000)] == [0, 1, 2, 2, 3, 5]
    for m in range(1, 300):
        for n in (1, 2, 3, 7):
            assert rounds_bound(m, n) == (0 if m == 1 else math.ceil(math.log(m, n + 1) - 1e-9))


def test_a_round_splits_the_range_into_n_plus_one_parts() -> None:
    plan, c = core_plan(100)
    plan = plan.observe(plan.good, OLD).observe(plan.bad, NEW)
    batch = next_batch(plan, 3)
    # M = 100 possible first bad commits, k = 4: candidates 25, 50, 75 (indexes 24, 49, 74)
    assert [t.state.comfyui for t in batch] == [c[25], c[50], c[75]]
    assert all(t.phase == "bisect" and t.repo == "comfyui" for t in batch)


def test_the_endpoints_are_still_measured_one_at_a_time() -> None:
    plan, _ = core_plan(100)
    assert [t.phase for t in next_batch(plan, 4)] == ["verify-good"]
    plan = plan.observe(plan.good, OLD)
    assert [t.phase for t in next_batch(plan, 4)] == ["verify-bad"]
    assert next_batch(plan.observe(plan.bad, NEW).observe(plan.bad, OLD), 4) == ()  # an Error
    with pytest.raises(ValueError):
        next_batch(plan, 0)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400), st.integers(1, 6), st.data())
def test_k_ary_search_finds_the_same_culprit_within_the_round_bound(m, width, data) -> None:
    first_bad = data.draw(st.integers(1, m))
    plan, c = core_plan(m)

    def verdict(s: State) -> Verdict:
        return NEW if c.index(s.comfyui) >= first_bad else OLD

    step, rounds = search(plan, verdict, width)
    assert step == Found((Culprit("comfyui", c[first_bad], c[first_bad - 1]),))
    bisect_rounds = [r for r in rounds if r[0].phase == "bisect"]
    assert len(bisect_rounds) <= rounds_bound(m, width)
    assert all(len(r) <= width for r in rounds)
    # one at a time gives the same answer
    assert search(plan, verdict, 1)[0] == step


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 200), st.data())
def test_width_one_is_next_step(m, data) -> None:
    plan, c = core_plan(m)
    first_bad = data.draw(st.integers(1, m))
    for _ in range(50):
        step = next_step(plan)
        batch = next_batch(plan, 1)
        if not isinstance(step, Test):
            assert batch == ()
            return
        assert batch == (step,)
        plan = plan.observe(step.state, NEW if c.index(step.state.comfyui) >= first_bad else OLD)


def test_skipped_points_move_to_testable_neighbours_and_the_answer_stays_honest() -> None:
    plan, c = core_plan(64)
    broken = {c[i] for i in range(30, 36)}

    def verdict(s: State) -> Verdict:
        if s.comfyui in broken:
            return SKIP
        return NEW if c.index(s.comfyui) >= 33 else OLD

    step, rounds = search(plan, verdict, 3)
    assert isinstance(step, OnlySkippedLeft)
    assert [x.value for x in step.candidates] == [c[i] for i in range(30, 37)]
    for r in rounds:
        assert len({t.state for t in r}) == len(r)  # never the same state twice in a round
