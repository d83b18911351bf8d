"""Every culprit, not just the first sufficient one (issue 10, item 1), as a specification of
the pure search: a memory model plays the measurements (peak = the good peak times the factor
of every change that is in, bad above the good peak + 10 %), and each test checks the named
culprits, the context each was bisected in, the states that make its Δ and the measurement
ceiling ``Progress.bound`` promises."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oom_sentinel.bisect.search.plan import (
    Culprit,
    Error,
    Found,
    Plan,
    Step,
    Test,
    next_step,
    progress,
)
from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.state.states import State

OLD, NEW, SKIP = Verdict.OLD, Verdict.NEW, Verdict.SKIP
GOOD_PEAK = 2000.0
THRESHOLD = GOOD_PEAK * 1.10


def sha(prefix: str, i: int) -> str:
    return f"{prefix}{i:039x}"[:40]


def history(prefix: str, n: int) -> list[str]:
    """n+1 ids: index 0 is the good value, 1..n the candidates."""
    return [sha(prefix, i) for i in range(n + 1)]


REPOS = {"comfyui": "a", "node:A": "b", "node:B": "c", "node:C": "d", "node:D": "e"}


def install(sizes: Mapping[str, int]) -> tuple[Plan, dict[str, list[str]]]:
    """A plan over the repos in ``sizes`` (repo → candidates), every one of them changed."""
    ids = {repo: history(REPOS[repo], n) for repo, n in sizes.items()}
    core = ids.get("comfyui", history("a", 0))
    nodes = {r.split(":", 1)[1]: v for r, v in ids.items() if r != "comfyui"}
    good = State.of(core[0], {n: v[0] for n, v in nodes.items()})
    bad = State.of(core[-1], {n: v[-1] for n, v in nodes.items()})
    return Plan.build(good, bad, {r: v[1:] for r, v in ids.items()}), ids


Model = Callable[[State], float]


def model(
    ids: Mapping[str, list[str]],
    first_bad: Mapping[str, int],
    factor: Mapping[str, float],
    extra: Callable[[Mapping[str, bool]], float] | None = None,
) -> Model:
    """Peak of a state: each repo at or past its first bad commit multiplies the good peak."""

    def peak(s: State) -> float:
        on = {r: r in first_bad and ids[r].index(s.value(r)) >= first_bad[r] for r in ids}
        p = GOOD_PEAK
        for r, is_on in on.items():
            if is_on:
                p *= factor.get(r, 1.0)
        return p * (extra(on) if extra else 1.0)

    return peak


def run(plan: Plan, peak: Model, limit: int = 2000) -> tuple[Step, list[Test], Plan]:
    tests: list[Test] = []
    for _ in range(limit):
        step = next_step(plan)
        if not isinstance(step, Test):
            return step, tests, plan
        tests.append(step)
        plan = plan.observe(step.state, NEW if peak(step.state) > THRESHOLD else OLD)
    raise AssertionError("the search did not end")


def log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def assert_deltas_are_measured(step: Found, plan: Plan, peak: Model) -> None:
    """Each culprit's two states were measured, and its own change is the jump between them."""
    seen = {o.state: o.verdict for o in plan.observations}
    for c in step.culprits:
        assert c.state is not None and c.parent is not None
        assert seen.get(c.state) is NEW and seen.get(c.parent) is OLD, c
        assert c.state.value(c.repo) == c.value and c.parent.value(c.repo) == c.previous
        others = [r for r in plan.good.repos() + plan.bad.repos() if r != c.repo]
        assert all(c.state.value(r) == c.parent.value(r) for r in others)
        assert peak(c.state) > THRESHOLD >= peak(c.parent)


def test_two_independent_culprits_in_core_and_a_node_are_both_named() -> None:
    plan, ids = install({"comfyui": 300, "node:A": 40})
    peak = model(ids, {"comfyui": 200, "node:A": 23}, {"comfyui": 1.6, "node:A": 1.6})
    step, tests, done = run(plan, peak)
    assert step == Found(
        (
            Culprit("comfyui", ids["comfyui"][200], ids["comfyui"][199]),
            Culprit("node:A", ids["node:A"][23], ids["node:A"][22]),
        )
    )
    assert all(c.together == () for c in step.culprits)
    # each repo is bisected with the other one at its good value: its own regression alone
    core_tests = [t for t in tests if t.repo == "comfyui"]
    node_tests = [t for t in tests if t.repo == "node:A"]
    assert all(t.state.node("A") == ids["node:A"][0] for t in core_tests)
    assert all(t.state.comfyui == ids["comfyui"][0] for t in node_tests)
    assert len(core_tests) <= log2(300) and len(node_tests) <= log2(40)
    assert_deltas_are_measured(step, done, peak)
    p = progress(done)
    assert p.groups == (("comfyui",), ("node:A",))
    assert len(tests) <= p.bound == p.repo_level + (log2(300) + 2) + (log2(40) + 2)
    # G, B, G+core (ddmin), G+node (the remainder: bad with the core reverted)
    assert p.repo_level == 4


def test_two_culprits_in_two_node_packs_among_harmless_changes() -> None:
    plan, ids = install({"comfyui": 64, "node:A": 30, "node:B": 12, "node:C": 20, "node:D": 9})
    peak = model(ids, {"node:B": 5, "node:D": 9}, {"node:B": 1.3, "node:D": 1.5})
    step, tests, done = run(plan, peak)
    assert isinstance(step, Found)
    assert [(c.repo, c.value) for c in step.culprits] == [
        ("node:B", ids["node:B"][5]),
        ("node:D", ids["node:D"][9]),
    ]
    assert_deltas_are_measured(step, done, peak)
    p = progress(done)
    assert len(tests) <= p.bound
    # the harmless repos were each measured alone on the good state, never bisected
    alone = {t.switched for t in tests if t.phase == "alone"}
    assert alone <= {("comfyui",), ("node:A",), ("node:C",)}
    assert not [t for t in tests if t.repo in ("comfyui", "node:A", "node:C")]


def test_an_interaction_is_named_as_a_set_and_an_independent_culprit_besides() -> None:
    # node A costs memory only with the new core (neither alone crosses the threshold);
    # node B raises it on its own
    plan, ids = install({"comfyui": 100, "node:A": 16, "node:B": 16})

    def both(on: Mapping[str, bool]) -> float:
        return 1.5 if on["comfyui"] and on["node:A"] else 1.0

    peak = model(ids, {"comfyui": 70, "node:A": 4, "node:B": 11}, {"node:B": 1.4}, both)
    step, tests, done = run(plan, peak)
    assert isinstance(step, Found)
    by_repo = {c.repo: c for c in step.culprits}
    assert sorted(by_repo) == ["comfyui", "node:A", "node:B"]
    assert by_repo["comfyui"].value == ids["comfyui"][70]
    assert by_repo["node:A"].value == ids["node:A"][4]
    assert by_repo["node:B"].value == ids["node:B"][11]
    assert by_repo["comfyui"].together == ("node:A",)
    assert by_repo["node:A"].together == ("comfyui",)
    assert by_repo["node:B"].together == ()
    # the core was bisected with A at its bad value and B at its good value
    core_tests = [t for t in tests if t.repo == "comfyui"]
    assert core_tests and all(
        t.state.node("A") == ids["node:A"][-1] and t.state.node("B") == ids["node:B"][0]
        for t in core_tests
    )
    assert_deltas_are_measured(step, done, peak)
    assert len(tests) <= progress(done).bound


def test_same_memory_in_good_and_bad_is_not_reproduced() -> None:
    plan, ids = install({"comfyui": 50, "node:A": 10})
    step, tests, _ = run(plan, model(ids, {}, {}))
    assert isinstance(step, Error) and step.result == "not-reproduced"
    assert [t.phase for t in tests] == ["verify-good", "verify-bad"]


def test_a_regression_offset_by_another_change_is_found_when_measured_alone() -> None:
    # A is found first; with A reverted the rest (B and a memory fix in C) fits, but B alone
    # on the good state does not: the alone step finds it
    plan, ids = install({"node:A": 4, "node:B": 4, "node:C": 4})
    peak = model(
        ids,
        {"node:A": 2, "node:B": 3, "node:C": 1},
        {"node:A": 1.5, "node:B": 1.5, "node:C": 0.6},
    )
    step, tests, done = run(plan, peak)
    assert isinstance(step, Found)
    assert [c.repo for c in step.culprits] == ["node:A", "node:B"]
    assert "alone" in {t.phase for t in tests}
    assert_deltas_are_measured(step, done, peak)


def test_a_state_is_never_measured_twice() -> None:
    plan, ids = install({"comfyui": 20, "node:A": 8, "node:B": 8})
    peak = model(ids, {"comfyui": 3, "node:B": 8}, {"comfyui": 1.3, "node:B": 1.3})
    _step, tests, _ = run(plan, peak)
    assert len({t.state for t in tests}) == len(tests)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_every_independent_culprit_is_found_within_the_bound(
    data: st.DataObject,
) -> None:
    repos = data.draw(
        st.lists(st.sampled_from(sorted(REPOS)), min_size=1, max_size=5, unique=True), label="r"
    )
    sizes = {r: data.draw(st.integers(1, 200), label=f"n {r}") for r in repos}
    culprits = data.draw(st.sets(st.sampled_from(repos), min_size=1), label="culprits")
    first_bad = {r: data.draw(st.integers(1, sizes[r]), label=f"first {r}") for r in culprits}
    plan, ids = install(sizes)
    peak = model(ids, first_bad, dict.fromkeys(culprits, 1.25))
    step, tests, done = run(plan, peak)
    assert isinstance(step, Found)
    assert {(c.repo, c.value) for c in step.culprits} == {
        (r, ids[r][i]) for r, i in first_bad.items()
    }
    assert_deltas_are_measured(step, done, peak)
    p = progress(done)
    assert len(tests) <= p.bound
    assert p.bound == p.repo_level + sum(log2(sizes[r]) + 2 for r in culprits)
    assert len({t.state for t in tests}) == len(tests)
