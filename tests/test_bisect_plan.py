"""The search (plan.py) as a specification: no git, no processes — states are built from
fake commit ids and a Python oracle plays the measurements."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oom_sentinel.bisect.search.plan import (
    Culprit,
    Error,
    Found,
    Observation,
    OnlySkippedLeft,
    Plan,
    RepoSpan,
    Step,
    Test,
    next_step,
    progress,
)
from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.state.states import State

OLD, NEW, SKIP = Verdict.OLD, Verdict.NEW, Verdict.SKIP


def sha(prefix: str, i: int) -> str:
    return f"{prefix}{i:039x}"[:40] if len(prefix) == 1 else f"{prefix}{i:038x}"[:40]


def commits(prefix: str, n: int) -> list[str]:
    """n+1 ids: index 0 is the good value, 1..n the candidates."""
    return [sha(prefix, i) for i in range(n + 1)]


Oracle = Callable[[State], Verdict]


def run(plan: Plan, oracle: Oracle, limit: int = 10_000) -> tuple[Step, list[Test]]:
    tests: list[Test] = []
    for _ in range(limit):
        step = next_step(plan)
        if not isinstance(step, Test):
            return step, tests
        tests.append(step)
        plan = plan.observe(step.state, oracle(step.state))
    raise AssertionError("the search did not end")


def one_repo_plan(n: int, verify: bool = True) -> tuple[Plan, list[str]]:
    ids = commits("a", n)
    good, bad = State.of(ids[0]), State.of(ids[n])
    return Plan.build(good, bad, {"comfyui": ids[1:]}, verify_endpoints=verify), ids


def monotone(ids: list[str], first_bad: int) -> Oracle:
    return lambda s: NEW if ids.index(s.comfyui) >= first_bad else OLD


# ---------------------------------------------------------------------- within one repo


@pytest.mark.parametrize(
    ("n", "first_bad"),
    [(1, 1), (2, 1), (2, 2), (3, 2), (7, 1), (7, 7), (8, 5), (300, 137), (2000, 1999)],
    ids=lambda v: str(v),
)
def test_single_repo_finds_first_bad_commit_in_log2_tests(n: int, first_bad: int) -> None:
    plan, ids = one_repo_plan(n)
    step, tests = run(plan, monotone(ids, first_bad))
    assert step == Found((Culprit("comfyui", ids[first_bad], ids[first_bad - 1]),))
    assert [t.phase for t in tests[:2]] == ["verify-good", "verify-bad"]
    bisect_tests = [t for t in tests if t.phase == "bisect"]
    assert len(bisect_tests) <= math.ceil(math.log2(n)) if n > 1 else not bisect_tests
    assert all(t.repo == "comfyui" for t in bisect_tests)


def test_first_test_is_the_middle_and_ties_go_to_the_older_commit() -> None:
    plan, ids = one_repo_plan(8, verify=False)
    step = next_step(plan)
    # candidates 1..8 (indexes 0..7), lo=-1, hi=7: exact middle 3 → candidate ids[4]
    assert isinstance(step, Test) and step.state.comfyui == ids[4]
    plan, ids = one_repo_plan(7, verify=False)
    step = next_step(plan)
    # lo=-1, hi=6: middle 2.5 → tie between index 2 and 3 → the older (index 2 = ids[3])
    assert isinstance(step, Test) and step.state.comfyui == ids[3]


def test_without_verification_the_endpoints_are_assumed() -> None:
    plan, ids = one_repo_plan(16, verify=False)
    step, tests = run(plan, monotone(ids, 9))
    assert isinstance(step, Found) and step.culprits[0].value == ids[9]
    assert all(t.phase == "bisect" for t in tests) and len(tests) == 4


@pytest.mark.parametrize(
    ("good_says", "bad_says", "message", "result"),
    [
        (NEW, NEW, "the good state is bad too", "error"),
        (OLD, OLD, "the bad state does not reproduce", "not-reproduced"),
        (SKIP, NEW, "the good state cannot be tested", "error"),
        (OLD, SKIP, "the bad state cannot be tested", "error"),
    ],
    ids=["good-is-bad", "bad-is-good", "good-skipped", "bad-skipped"],
)
def test_endpoints_are_verified_first(
    good_says: Verdict, bad_says: Verdict, message: str, result: str
) -> None:
    plan, _ids = one_repo_plan(10)
    step = next_step(plan)
    assert isinstance(step, Test) and step.phase == "verify-good" and step.state == plan.good
    plan = plan.observe(plan.good, good_says)
    if good_says is OLD:
        step = next_step(plan)
        assert isinstance(step, Test) and step.phase == "verify-bad" and step.state == plan.bad
        plan = plan.observe(plan.bad, bad_says)
    step = next_step(plan)
    assert isinstance(step, Error)
    assert step.message.startswith(message) and step.result == result


@pytest.mark.parametrize(
    ("n", "skipped", "first_bad", "candidates"),
    [
        # the culprit itself skipped: it and its untestable neighbours up to the first bad
        (10, {4, 5}, 5, [4, 5, 6]),
        (10, {5}, 5, [5, 6]),
        # the commit before the culprit skipped: the culprit can't be told from it
        (10, {4}, 5, [4, 5]),
        # a skipped block away from the culprit costs tests but not precision
        (20, {9, 10, 11, 12}, 3, [3]),
        # everything between good and bad skipped
        (6, {1, 2, 3, 4, 5}, 2, [1, 2, 3, 4, 5, 6]),
    ],
    ids=["culprit-skipped", "culprit-only", "neighbour-skipped", "block-elsewhere", "all-skipped"],
)
def test_skips_end_with_exactly_the_ambiguous_candidates(
    n: int, skipped: set[int], first_bad: int, candidates: list[int]
) -> None:
    plan, ids = one_repo_plan(n)
    base = monotone(ids, first_bad)
    step, tests = run(plan, lambda s: SKIP if ids.index(s.comfyui) in skipped else base(s))
    if len(candidates) == 1:
        assert step == Found((Culprit("comfyui", ids[candidates[0]], ids[candidates[0] - 1]),))
    else:
        assert isinstance(step, OnlySkippedLeft)
        assert [c.value for c in step.candidates] == [ids[i] for i in candidates]
        assert [c.previous for c in step.candidates] == [ids[i - 1] for i in candidates]
    assert len({t.state for t in tests}) == len(tests), "a state was tested twice"


def test_a_skipped_middle_moves_to_the_nearest_testable_commit_deterministically() -> None:
    plan, ids = one_repo_plan(8, verify=False)
    first = next_step(plan)
    assert isinstance(first, Test) and first.state.comfyui == ids[4]
    plan = plan.observe(first.state, SKIP)
    second = next_step(plan)
    # indexes: skipped 3; middle 3 → nearest testable are 2 and 4 (both distance 1) → older
    assert isinstance(second, Test) and second.state.comfyui == ids[3]
    assert next_step(plan) == second  # recomputing gives the same answer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_single_culprit_found_within_log2_n(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 2000), label="n")
    first_bad = data.draw(st.integers(1, n), label="first_bad")
    plan, ids = one_repo_plan(n, verify=False)
    step, tests = run(plan, monotone(ids, first_bad))
    assert step == Found((Culprit("comfyui", ids[first_bad], ids[first_bad - 1]),))
    assert len(tests) <= math.ceil(math.log2(n))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_skips_find_culprit_or_the_minimal_ambiguous_set(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(1, 400), label="n")
    first_bad = data.draw(st.integers(1, n), label="first_bad")
    skipped = data.draw(st.sets(st.integers(1, n - 1)) if n > 1 else st.just(set()), label="skip")
    plan, ids = one_repo_plan(n, verify=False)
    base = monotone(ids, first_bad)
    step, tests = run(plan, lambda s: SKIP if ids.index(s.comfyui) in skipped else base(s))
    # the minimal ambiguous set: (last testable before the culprit, first testable from it]
    last_good = max((i for i in range(1, first_bad) if i not in skipped), default=0)
    first_known_bad = min(i for i in range(first_bad, n + 1) if i not in skipped)
    expected = [ids[i] for i in range(last_good + 1, first_known_bad + 1)]
    if len(expected) == 1:
        assert isinstance(step, Found) and [c.value for c in step.culprits] == expected
    else:
        assert isinstance(step, OnlySkippedLeft)
        assert [c.value for c in step.candidates] == expected
    assert len({t.state for t in tests}) == len(tests)


def test_estimate_never_undershoots_and_reaches_zero() -> None:
    plan, ids = one_repo_plan(300)
    oracle = monotone(ids, 201)
    first = progress(plan)
    assert first.phase == "verify" and first.steps_left == 2 + math.ceil(math.log2(300))
    done = 0
    total = None
    while True:
        step = next_step(plan)
        p = progress(plan)
        if not isinstance(step, Test):
            assert p.phase == "done" and p.steps_left == 0
            break
        if total is None:
            total = p.steps_left
        assert p.tested == done
        if p.phase == "bisect":
            assert p.repo == "comfyui" and p.candidates_left is not None
        plan = plan.observe(step.state, oracle(step.state))
        done += 1
    assert total is not None and done <= total


def test_observations_in_any_order_give_the_same_step() -> None:
    plan, ids = one_repo_plan(64)
    oracle = monotone(ids, 40)
    for _ in range(5):
        step = next_step(plan)
        assert isinstance(step, Test)
        plan = plan.observe(step.state, oracle(step.state))
    shuffled = list(plan.observations)
    random.Random(7).shuffle(shuffled)
    again = Plan(plan.good, plan.bad, plan.spans, tuple(shuffled), plan.verify_endpoints)
    assert next_step(again) == next_step(plan)


def test_a_later_verdict_on_the_same_state_wins() -> None:
    plan, _ids = one_repo_plan(8, verify=False)
    step = next_step(plan)
    assert isinstance(step, Test)
    wrong = plan.observe(step.state, NEW)
    fixed = wrong.observe(step.state, OLD)
    assert next_step(fixed) == next_step(plan.observe(step.state, OLD))
    assert next_step(fixed) != next_step(wrong)


def test_inconsistent_verdicts_still_end() -> None:
    plan, _ids = one_repo_plan(50, verify=False)
    rng = random.Random(3)
    step, tests = run(plan, lambda s: rng.choice([OLD, NEW]))
    assert isinstance(step, Found | OnlySkippedLeft)
    assert len(tests) <= 50


# ---------------------------------------------------------------------- across repos

NODE_NAMES = ["n0", "n1", "n2", "n3", "n4"]


def multi_repo(n_core: int = 40, n_node: int = 10):
    core = commits("a", n_core)
    node = {name: commits(chr(ord("b") + i), n_node) for i, name in enumerate(NODE_NAMES)}
    good = State.of(core[0], {k: v[0] for k, v in node.items()})
    bad = State.of(core[-1], {k: v[-1] for k, v in node.items()})
    lists = {"comfyui": core[1:], **{f"node:{k}": v[1:] for k, v in node.items()}}
    return Plan.build(good, bad, lists), core, node


def test_a_node_that_breaks_only_with_the_new_core_needs_both() -> None:
    plan, core, node = multi_repo()
    core_bad, node_bad = 23, 6

    def oracle(s: State) -> Verdict:
        new_core = core.index(s.comfyui) >= core_bad
        new_node = node["n3"].index(s.node("n3")) >= node_bad
        return NEW if new_core and new_node else OLD

    step, tests = run(plan, oracle)
    assert step == Found(
        (
            Culprit("comfyui", core[core_bad], core[core_bad - 1]),
            Culprit("node:n3", node["n3"][node_bad], node["n3"][node_bad - 1]),
        )
    )
    minimize = [t for t in tests if t.phase == "minimize"]
    assert minimize and all(t.switched for t in minimize)
    # while bisecting the core, the other needed repo (n3) sits at its bad value
    core_tests = [t for t in tests if t.repo == "comfyui"]
    assert core_tests and all(t.state.node("n3") == node["n3"][-1] for t in core_tests)
    assert all(t.state.node("n0") == node["n0"][0] for t in core_tests)
    assert len(core_tests) <= math.ceil(math.log2(40))
    assert len([t for t in tests if t.repo == "node:n3"]) <= math.ceil(math.log2(10))


@settings(max_examples=80, deadline=None)
@given(needed=st.sets(st.sampled_from(["comfyui", *(f"node:{n}" for n in NODE_NAMES)]), min_size=1))
def test_property_ddmin_isolates_exactly_the_needed_repos(needed: set[str]) -> None:
    plan, _core, _node = multi_repo(8, 4)

    def switched(s: State, repo: str) -> bool:
        return s.value(repo) == plan.bad.value(repo)

    # bad only when every needed repo is at its bad value (each repo flips at its last commit)
    step, _tests = run(plan, lambda s: NEW if all(switched(s, r) for r in needed) else OLD)
    assert isinstance(step, Found)
    assert sorted(c.repo for c in step.culprits) == sorted(needed)


def test_either_of_two_culprits_is_enough_and_both_are_named() -> None:
    # ddmin alone stops at the first sufficient set ({n1}); the remainder step (bad with n1
    # reverted) is still bad, so the search goes on and finds n4 too
    plan, _core, node = multi_repo(8, 4)

    def oracle(s: State) -> Verdict:
        return NEW if s.node("n1") == node["n1"][-1] or s.node("n4") == node["n4"][-1] else OLD

    step, tests = run(plan, oracle)
    assert isinstance(step, Found)
    assert [c.repo for c in step.culprits] == ["node:n1", "node:n4"]
    assert all(c.together == () for c in step.culprits)
    remainder = [t for t in tests if t.phase == "remainder"]
    assert remainder and remainder[0].reverted == ("node:n1",)


def test_a_node_added_between_the_states_is_one_step_and_absent_is_a_value() -> None:
    core = commits("a", 16)
    node_sha = sha("c", 5)
    good = State.of(core[0], {"keep": sha("d", 1)})
    bad = State.of(core[-1], {"keep": sha("d", 1), "newnode": node_sha})
    plan = Plan.build(good, bad, {"comfyui": core[1:]})
    assert [s.repo for s in plan.spans] == ["comfyui", "node:newnode"]
    assert plan.span("node:newnode").commits == (node_sha,)

    step, tests = run(plan, lambda s: NEW if s.node("newnode") != "absent" else OLD)
    assert step == Found((Culprit("node:newnode", node_sha, "absent"),))
    assert not [t for t in tests if t.phase == "bisect"]


def test_disabling_a_node_can_be_the_culprit() -> None:
    good = State.of(sha("a", 1), {"x": sha("b", 1)})
    bad = State.of(sha("a", 1), {"x": "disabled"})
    plan = Plan.build(good, bad)
    step, tests = run(plan, lambda s: NEW if s.node("x") == "disabled" else OLD)
    assert step == Found((Culprit("node:x", "disabled", sha("b", 1)),))
    assert len(tests) == 2  # just the endpoints


def test_an_ambiguous_repo_and_a_found_repo_are_reported_together() -> None:
    plan, core, node = multi_repo(16, 6)

    def oracle(s: State) -> Verdict:
        if s.node("n2") in (node["n2"][2], node["n2"][3]):
            return SKIP
        new_core = core.index(s.comfyui) >= 9
        new_node = node["n2"].index(s.node("n2")) >= 3
        return NEW if new_core and new_node else OLD

    step, _ = run(plan, oracle)
    assert isinstance(step, OnlySkippedLeft)
    assert step.culprits == (Culprit("comfyui", core[9], core[8]),)
    assert [c.value for c in step.candidates] == [node["n2"][2], node["n2"][3], node["n2"][4]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(repo="comfyui", good="g" * 40, bad="b" * 40, commits=("c" * 40,)), "end with"),
        (
            dict(repo="comfyui", good="a" * 40, bad="b" * 40, commits=("a" * 40, "b" * 40)),
            "good value",
        ),
        (
            dict(repo="comfyui", good="a" * 40, bad="b" * 40, commits=("b" * 40, "b" * 40)),
            "repeats",
        ),
    ],
    ids=["not-ending-with-bad", "good-in-list", "duplicate"],
)
def test_bad_candidate_lists_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RepoSpan(**kwargs)  # type: ignore[arg-type]


def test_plan_rejects_spans_that_do_not_match_the_states() -> None:
    good, bad = State.of(sha("a", 0)), State.of(sha("a", 1))
    with pytest.raises(ValueError, match="exactly the repos"):
        Plan(good, bad, ())
    with pytest.raises(ValueError, match="don't match"):
        Plan(good, bad, (RepoSpan("comfyui", sha("a", 5), sha("a", 1)),))


def test_observations_of_unrelated_states_are_ignored() -> None:
    plan, _ids = one_repo_plan(8, verify=False)
    stray = Observation(State.of(sha("f", 1)), NEW)
    with_stray = Plan(plan.good, plan.bad, plan.spans, (stray,), False)
    assert next_step(with_stray) == next_step(plan)
