"""The search: which state to measure next, and when the answer is known. Pure — no git, no
processes, no files — so every rule is tested with tables and properties.

``next_step(plan)`` is recomputed from the recorded verdicts every time (as git's
``bisect_next_all`` rereads its refs), so a session resumes from its log after Ctrl-C or a
crash and the same log always leads to the same next state. It returns one of:

``Test(state)``
    measure this state next;
``Found(culprits)``
    the first bad value of every repo whose change is needed;
``OnlySkippedLeft(candidates)``
    the first bad commit is one of these, but each was skipped (git's exit status 2);
``Error(message, result)``
    an endpoint does not behave: the good state is bad, the bad state is good
    (``result="not-reproduced"``), or an endpoint cannot be tested.

The search has three phases.

1. **Verify the endpoints** (git's ``verify_good``): the good state must be good and the bad
   state bad before anything else is measured.
2. **Find every culprit set across repos**, over the repos whose values differ between good
   (G) and bad (B). A test of a subset c measures G with the repos in c switched to their B
   value. One update often carries several independent regressions ("Update all" moves the
   core and a dozen node packs), and delta debugging alone stops at the first *sufficient*
   set, so the search repeats it (as Pinpoint tests every differing element, not just the
   first that suffices):

   a. *Minimise* (Zeller & Hildebrandt's *ddmin*, TSE 2002) the repos still in play to a
      1-minimal set: switching all of it breaks the workflow and leaving any one repo at G
      does not. That is how "node X breaks only with the new core" comes out as
      {comfyui, node:X}. ``absent``/``disabled`` are values like any other, so adding,
      removing or disabling a node is a change ddmin can blame. A skip counts as "did not
      fail", as in ddmin's treatment of unresolved tests.
   b. *Remainder*: measure B with every culprit set found so far reverted (= G with the
      remaining repos switched). Still bad: another culprit set hides among the remaining
      repos; minimise them again (a). Good (or untestable): go on.
   c. *Alone*: every repo not in a culprit set is measured alone on G (G with just that repo
      switched). One that breaks the workflow on its own is a culprit set by itself; this
      catches a regression that another change in the remainder happened to offset.

   With one differing repo this phase costs nothing; each state is measured once however
   many steps consult it.
3. **Bisect inside each culprit repo**, over the candidates the caller lists (first-parent
   commits between G's and B's value, oldest first, ending with B's value), with the other
   repos of *its* culprit set at their B value and everything else at G. The first bad
   candidate lies in (lo, hi] where lo is the newest known-good index (−1: G's value) and
   hi the oldest known-bad one (B's value at the start). The next test is the untested,
   unskipped candidate nearest the exact middle of (lo, hi), the older one on a tie, so N
   candidates need at most ⌈log2 N⌉ tests. Both neighbours of the answer are measured states
   (the first bad one and its parent), so each culprit carries the two states whose peaks
   make its Δ.

The cost, as ``progress`` reports it: the repo-level steps (phases 1 and 2), plus at most
⌈log2 Nᵢ⌉ + 2 per culprit repo i (``Progress.bound``) when nothing is skipped.

Skips, deterministically. git's ``skip_away`` picks a pseudo-random commit near the middle
(a PRNG seeded from the count) so a run of broken commits is not probed commit by commit. We
take the nearest testable commit to the middle instead: a broken range is usually contiguous,
and probing its edge is what bounds it, and a documented rule makes the same log give the same
steps everywhere. What can be concluded is the same as git's: when only skipped candidates
remain between the last good and the first bad, the answer is all of (lo, hi] — the skipped
ones and the first bad — and nothing smaller can be claimed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.state.states import State, differing_repos

__all__ = [
    "Culprit",
    "Error",
    "Found",
    "Observation",
    "OnlySkippedLeft",
    "Plan",
    "Progress",
    "RepoSpan",
    "Step",
    "Test",
    "next_batch",
    "next_step",
    "progress",
    "rounds_bound",
]


@dataclass(frozen=True)
class RepoSpan:
    """One differing repo: its value in G and in B, and the candidates between them.

    ``commits`` is oldest first and ends with ``bad``; empty or omitted means the change is
    one step (a node added or removed, a downgrade, a registry release).
    """

    repo: str
    good: str
    bad: str
    commits: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.commits:
            object.__setattr__(self, "commits", (self.bad,))
        if self.commits[-1] != self.bad:
            raise ValueError(f"{self.repo}: the candidate list must end with the bad value")
        if self.good in self.commits:
            raise ValueError(f"{self.repo}: the good value cannot be a candidate")
        if len(set(self.commits)) != len(self.commits):
            raise ValueError(f"{self.repo}: the candidate list repeats a value")


@dataclass(frozen=True)
class Observation:
    state: State
    verdict: Verdict


@dataclass(frozen=True)
class Plan:
    good: State
    bad: State
    spans: tuple[RepoSpan, ...]
    observations: tuple[Observation, ...] = ()
    #: measure G and B before searching (False: take them as good and bad, e.g. manual use)
    verify_endpoints: bool = True

    def __post_init__(self) -> None:
        repos = [s.repo for s in self.spans]
        if sorted(repos) != sorted(differing_repos(self.good, self.bad)):
            raise ValueError("the spans must be exactly the repos that differ between G and B")
        for s in self.spans:
            if s.good != self.good.value(s.repo) or s.bad != self.bad.value(s.repo):
                raise ValueError(f"{s.repo}: span endpoints don't match the states")

    @classmethod
    def build(
        cls,
        good: State,
        bad: State,
        commits: Mapping[str, Sequence[str]] | None = None,
        observations: Sequence[Observation] = (),
        verify_endpoints: bool = True,
    ) -> Plan:
        """Spans for every differing repo (in ``differing_repos`` order) from candidate lists."""
        lists = commits or {}
        spans = tuple(
            RepoSpan(r, good.value(r), bad.value(r), tuple(lists.get(r, ())))
            for r in differing_repos(good, bad)
        )
        return cls(good, bad, spans, tuple(observations), verify_endpoints)

    def observe(self, state: State, verdict: Verdict) -> Plan:
        return Plan(
            self.good,
            self.bad,
            self.spans,
            (*self.observations, Observation(state, verdict)),
            self.verify_endpoints,
        )

    def span(self, repo: str) -> RepoSpan:
        for s in self.spans:
            if s.repo == repo:
                return s
        raise KeyError(repo)


@dataclass(frozen=True)
class Test:
    __test__ = False  # not a pytest test class

    state: State
    #: "verify-good", "verify-bad", "minimize", "remainder", "alone" or "bisect"
    phase: str
    #: the repo being bisected (phase "bisect"), else None
    repo: str | None = None
    #: the repos switched to B's value (phases "minimize", "remainder", "alone")
    switched: tuple[str, ...] = ()
    #: the culprit repos found so far, held at G's value (phase "remainder")
    reverted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Culprit:
    """The first bad ``value`` of ``repo``; ``previous`` is the value just before it.

    ``together``: the other repos of its culprit set, at their B value in ``state`` and
    ``parent`` (empty: this change breaks the workflow on its own). ``state`` is the measured
    state with ``value``, ``parent`` the measured one with ``previous`` (their peaks are the
    culprit's Δ); None where the plan was not asked for them (kept out of equality so a
    culprit compares by what it names).
    """

    repo: str
    value: str
    previous: str
    together: tuple[str, ...] = field(default=(), compare=False)
    state: State | None = field(default=None, compare=False, repr=False)
    parent: State | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Found:
    culprits: tuple[Culprit, ...]


@dataclass(frozen=True)
class OnlySkippedLeft:
    """``candidates``: every possible first bad value of an ambiguous repo (skipped ones and
    the first known bad); ``culprits``: repos that were resolved."""

    candidates: tuple[Culprit, ...]
    culprits: tuple[Culprit, ...] = ()


@dataclass(frozen=True)
class Error:
    message: str
    #: "not-reproduced" (the bad state is good) or "error"
    result: str = "error"


Step = Test | Found | OnlySkippedLeft | Error


@dataclass(frozen=True)
class Progress:
    #: "verify", "minimize", "bisect" or "done"
    phase: str
    #: distinct states with a verdict
    tested: int
    #: every culprit repo, once known (the union of ``groups``)
    needed: tuple[str, ...] | None = None
    #: the repo being bisected and its candidates left (hi - lo)
    repo: str | None = None
    candidates_left: int | None = None
    #: rough number of measurements still to make (git's estimate_bisect_steps in spirit)
    steps_left: int = 0
    #: repos the minimisation still considers
    considering: tuple[str, ...] = field(default_factory=tuple)
    #: the culprit sets found so far (each 1-minimal; repos of one set are needed together)
    groups: tuple[tuple[str, ...], ...] = ()
    #: distinct states the repo-level steps (phases 1 and 2) measured
    repo_level: int = 0
    #: the promised ceiling: ``repo_level`` + Σ (⌈log2 Nᵢ⌉ + 2) over the culprit repos
    bound: int = 0


def next_step(plan: Plan) -> Step:
    """What to do next, from the plan's observations alone."""
    return _walk(plan)[0]


def next_batch(plan: Plan, width: int) -> tuple[Test, ...]:
    """Up to ``width`` states to measure at once (``--parallel``); () once there is an answer.

    Inside a culprit repo's range the search is k-ary: with M possible first bad commits
    (lo, hi] and k = width + 1, the candidates lo + ⌊j·M/k⌋ (j = 1 … width) split the range
    into k parts of at most ⌈M/k⌉ (⌊jM/k⌋ − ⌊(j−1)M/k⌋ ≤ ⌈M/k⌉), so after every round of
    measurements the range is ⌈M/k⌉ and ⌈log_k M⌉ rounds (``rounds_bound``) find the answer
    instead of ⌈log2 M⌉; with width 1 it is ``next_step``'s middle. A point that is skipped
    moves to the nearest testable candidate, as in ``next_step``. Every other phase measures
    one state at a time: each of its tests depends on the verdict before it (the bad
    endpoint on the good one's threshold, ddmin on the last split).
    """
    if width < 1:
        raise ValueError("width must be >= 1")
    batch: list[Test] = []
    step = _walk(plan, width, batch)[0]
    if not isinstance(step, Test):
        return ()
    if step.phase != "bisect" or width == 1 or not batch:
        return (step,)
    return tuple(batch)


def rounds_bound(candidates: int, width: int) -> int:
    """⌈log_{width+1} M⌉: the rounds a k-ary search of M possible answers needs (no skips)."""
    rounds, left = 0, candidates
    while left > 1:
        left = -(-left // (width + 1))  # ⌈left / k⌉ without floating point
        rounds += 1
    return rounds


def progress(plan: Plan) -> Progress:
    return _walk(plan)[1]


# --------------------------------------------------------------------------- implementation


class _Need(Exception):
    def __init__(self, test: Test) -> None:
        self.test = test


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def _walk(plan: Plan, width: int = 1, batch: list[Test] | None = None) -> tuple[Step, Progress]:
    """The next step and the progress; in a culprit repo's range, ``batch`` (when given)
    receives the ``width`` states of a k-ary round (``next_batch``)."""
    known: dict[State, Verdict] = {}
    for obs in plan.observations:
        known[obs.state] = obs.verdict  # the latest verdict on a state wins (a re-mark)
    tested = len(known)
    max_bisect = max(_log2(len(s.commits)) for s in plan.spans) if plan.spans else 0

    # -- phase 1: endpoints
    if plan.verify_endpoints:
        for which, state, want in (
            ("good", plan.good, Verdict.OLD),
            ("bad", plan.bad, Verdict.NEW),
        ):
            v = known.get(state)
            if v is None:
                left = (2 if which == "good" else 1) + _minimize_estimate(len(plan.spans))
                return Test(state, f"verify-{which}"), Progress(
                    "verify", tested, steps_left=left + max_bisect
                )
            if v is Verdict.SKIP:
                return Error(f"the {which} state cannot be tested (its run was skipped)"), Progress(
                    "done", tested
                )
            if v is not want:
                if which == "bad":
                    return Error(
                        "the bad state does not reproduce: it neither runs out of memory nor "
                        "crosses the threshold",
                        "not-reproduced",
                    ), Progress("done", tested)
                return Error(
                    "the good state is bad too: it already runs out of memory or crosses the "
                    "threshold, so the change came earlier"
                ), Progress("done", tested)
    known.setdefault(plan.good, Verdict.OLD)
    known.setdefault(plan.bad, Verdict.NEW)

    # -- phase 2: every culprit set across repos
    spans = {s.repo: s for s in plan.spans}
    order = [s.repo for s in plan.spans]

    def switched(subset: Sequence[str]) -> State:
        return plan.good.with_values({r: spans[r].bad for r in subset})

    repo_level: set[State] = {plan.good, plan.bad} if plan.verify_endpoints else set()
    groups: list[list[str]] = []
    remaining: list[str] = list(order)
    considering: list[str] = list(order)

    def look(state: State, test: Test) -> Verdict:
        v = known.get(state)
        if v is None:
            raise _Need(test)
        repo_level.add(state)
        return v

    def oracle(subset: Sequence[str]) -> Verdict:
        state = switched(subset)
        return look(state, Test(state, "minimize", switched=tuple(subset)))

    def found_so_far() -> tuple[str, ...]:
        return tuple(r for g in groups for r in g)

    try:
        while remaining:
            considering[:] = remaining
            rest = switched(remaining)
            test = Test(rest, "remainder", switched=tuple(remaining), reverted=found_so_far())
            if look(rest, test) is not Verdict.NEW:
                break
            group = _ddmin(remaining, oracle, considering)
            groups.append(group)
            remaining = [r for r in remaining if r not in group]
        considering[:] = remaining
        for repo in list(remaining):
            alone = switched([repo])
            if look(alone, Test(alone, "alone", switched=(repo,))) is Verdict.NEW:
                groups.append([repo])
                remaining.remove(repo)
    except _Need as need:
        left = _minimize_estimate(len(considering)) + max(
            (_log2(len(spans[r].commits)) for r in considering), default=0
        )
        return need.test, Progress(
            "minimize",
            tested,
            steps_left=max(1, left + len(remaining)),
            considering=tuple(considering),
            groups=tuple(map(tuple, groups)),
            repo_level=len(repo_level),
            bound=_bound(len(repo_level), groups, spans),
        )

    # -- phase 3: bisect inside each culprit repo, in the context of its own set
    needed = tuple(r for g in groups for r in g)
    culprits: list[Culprit] = []
    ambiguous: list[Culprit] = []
    tuples = tuple(map(tuple, groups))
    bound = _bound(len(repo_level), groups, spans)
    for gi, group in enumerate(groups):
        for i, repo in enumerate(group):
            span = spans[repo]
            together = tuple(r for r in group if r != repo)
            base = switched(together)
            result = _bisect_repo(span, base, known, together, width)
            if isinstance(result, _Probe):
                if batch is not None:
                    batch.extend(result.batch)
                later = sum(_log2(len(spans[r].commits)) for r in group[i + 1 :]) + sum(
                    _log2(len(spans[r].commits)) for g in groups[gi + 1 :] for r in g
                )
                return result.test, Progress(
                    "bisect",
                    tested,
                    needed=needed,
                    repo=repo,
                    candidates_left=result.left,
                    steps_left=_log2(result.left) + later,
                    groups=tuples,
                    repo_level=len(repo_level),
                    bound=bound,
                )
            if len(result) == 1:
                culprits.append(result[0])
            else:
                ambiguous.extend(result)
    done = Progress(
        "done", tested, needed=needed, groups=tuples, repo_level=len(repo_level), bound=bound
    )
    if ambiguous:
        return OnlySkippedLeft(tuple(ambiguous), tuple(culprits)), done
    return Found(tuple(culprits)), done


def _bound(repo_level: int, groups: Sequence[Sequence[str]], spans: Mapping[str, RepoSpan]) -> int:
    """The measurement ceiling the search promises (no skips): the repo-level steps taken,
    plus ⌈log2 Nᵢ⌉ + 2 for every culprit repo i."""
    return repo_level + sum(_log2(len(spans[r].commits)) + 2 for g in groups for r in g)


def _minimize_estimate(n: int) -> int:
    # ddmin needs about 2·log2(n) tests to isolate one repo among n (none for n = 1).
    return 2 * _log2(n)


def _split(items: Sequence[str], n: int) -> list[list[str]]:
    """``items`` in ``n`` contiguous chunks whose sizes differ by at most one."""
    out = []
    start = 0
    for i in range(n):
        size = len(items) // n + (1 if i < len(items) % n else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def _ddmin(
    repos: Sequence[str], test: Callable[[Sequence[str]], Verdict], current: list[str]
) -> list[str]:
    """Zeller's ddmin; ``current`` is kept equal to the configuration under reduction."""
    c = list(repos)
    n = 2
    while len(c) >= 2:
        current[:] = c
        n = min(n, len(c))
        chunks = _split(c, n)
        reduced = False
        for chunk in chunks:  # reduce to a subset
            if test(chunk) is Verdict.NEW:
                c, n, reduced = chunk, 2, True
                break
        if not reduced and n > 2:  # reduce to a complement (with n = 2 these are the chunks)
            for chunk in chunks:
                comp = [r for r in c if r not in chunk]
                if test(comp) is Verdict.NEW:
                    c, n, reduced = comp, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(c):
                break
            n = min(len(c), 2 * n)
    current[:] = c
    return c


@dataclass(frozen=True)
class _Probe:
    test: Test
    left: int
    #: the states of a k-ary round (width > 1), oldest first; ``test`` is one of them
    batch: tuple[Test, ...] = ()


def _bisect_repo(
    span: RepoSpan,
    base: State,
    known: Mapping[State, Verdict],
    together: tuple[str, ...] = (),
    width: int = 1,
) -> _Probe | list[Culprit]:
    values = span.commits
    states = [base.with_values({span.repo: v}) for v in values]
    verdicts = [known.get(s) for s in states]
    hi = next((i for i, v in enumerate(verdicts) if v is Verdict.NEW), len(values) - 1)
    lo = max((i for i in range(hi) if verdicts[i] is Verdict.OLD), default=-1)

    def previous(i: int) -> str:
        return values[i - 1] if i > 0 else span.good

    def culprit(i: int) -> Culprit:
        parent = base.with_values({span.repo: previous(i)})
        return Culprit(span.repo, values[i], previous(i), together, states[i], parent)

    testable = [i for i in range(lo + 1, hi) if verdicts[i] is None]
    if not testable:
        return [culprit(i) for i in range(lo + 1, hi + 1)]
    middle2 = lo + hi  # twice the exact middle, to compare without fractions
    m = min(testable, key=lambda i: (abs(2 * i - middle2), i))
    probe = Test(states[m], "bisect", repo=span.repo)
    if width == 1:
        return _Probe(probe, hi - lo)
    chosen: list[int] = []
    k, size = width + 1, hi - lo
    for j in range(1, k):
        target = lo + (j * size) // k  # the k-ary split points (next_batch)
        free = [i for i in testable if i not in chosen]
        if not free:
            break
        chosen.append(min(free, key=lambda i: (abs(i - target), i)))
    batch = tuple(Test(states[i], "bisect", repo=span.repo) for i in sorted(chosen))
    return _Probe(probe, size, batch)
