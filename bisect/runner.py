"""The step loop of ``oom-bisect run``: ask the plan what to measure, take it from the outcome
cache or measure it, write the verdict — one state at a time, everything read back from disk.

Why it is its own module: the front end (cli.py) only parses arguments and draws progress,
and the search (plan.py) knows no processes; this loop is the one place where the session
files, the workspace and the replay harness meet, like git's ``bisect_next_all`` between
``bisect.c`` and ``builtin/bisect.c``.

Resuming costs at most one measurement. Before a state is measured it is written to
``expected``; every finished run is stored in the outcome cache at once (with ``--repeat N`` a
state needs several), and the verdict is appended to the log last. After Ctrl-C or a crash
the next ``run`` asks the plan again, finds the same state, takes the finished runs from the
cache and repeats only the one that was cut off.

Once the answer is known, each culprit whose verdict rests on a run stopped at the threshold
is run once more to the end (phase "delta" in ``measurements.jsonl``), so the report can give
its real Δ; verdicts and the log are unchanged by it.

A run that dies for a device reason (no GPU for this torch: device.py) stops the loop with
the one-line fix and is neither cached nor logged as a verdict; only outcomes of the workflow
itself are cached.

Every ComfyUI start is also appended to ``<session>/measurements.jsonl`` (one JSON object per
line: ``{"event": "launch"|"done", ...}``), so the report can show each run's peaks, timings
and console tail, and the tests can count launches across an interruption.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oom_sentinel.bisect import gitrepo
from oom_sentinel.bisect.device import DeviceFailure, device_failure, is_harness_failure
from oom_sentinel.bisect.fsutil import append_line
from oom_sentinel.bisect.plan import Found, OnlySkippedLeft, Step, Test
from oom_sentinel.bisect.replay import Measurement
from oom_sentinel.bisect.session import LogRecord, Session
from oom_sentinel.bisect.states import State, repo_label
from oom_sentinel.bisect.verdict import Outcome, Threshold, Verdict, classify_run, decide
from oom_sentinel.daemon.errors import SentinelError

__all__ = [
    "DELTA_PHASE",
    "HISTORY_PHASE",
    "MEASUREMENTS_FILE",
    "POOLS",
    "Events",
    "MeasurementRecord",
    "Runner",
    "describe_test",
    "effective_threshold",
    "read_measurements",
]

MEASUREMENTS_FILE = "measurements.jsonl"
#: the phase of a culprit's run to the end, for its Δ (after the answer is known)
DELTA_PHASE = "delta"
#: the phase of a culprit's OOM replayed with torch's native allocator, for its allocator
#: history only (``--history-with-native-allocator``; cudaMallocAsync records none)
HISTORY_PHASE = "history"
#: which peaks a verdict looks at (``--pool``; kept in ``session.json``'s ``extra.pool``)
POOLS = ("any", "vram", "ram")


def effective_threshold(session: Session) -> Threshold | None:
    """The session's threshold limited to the pool it watches (an OOM is bad in any case).

    A VRAM regression hunt must not call a state bad because ComfyUI's RSS moved 10 % between
    commits months apart (new imports do that), and a RAM hunt must not trip over VRAM.
    """
    thr = session.threshold()
    pool = session.setup.extra.get("pool") or "any"
    if thr is None or pool == "any":
        return thr
    return Threshold(
        thr.vram_bytes if pool == "vram" else None, thr.ram_bytes if pool == "ram" else None
    )


class Events(Protocol):
    """What the front end hears about (all optional to act on)."""

    def step(self, number: int, test: Test, session: Session) -> None: ...

    def run_start(self, test: Test, index: int, repeat: int) -> None: ...

    def run_done(self, test: Test, measurement: Measurement) -> None: ...

    def verdict(self, test: Test, record: LogRecord, cached: bool) -> None: ...


class _Quiet:
    def step(self, number: int, test: Test, session: Session) -> None:
        return None

    def run_start(self, test: Test, index: int, repeat: int) -> None:
        return None

    def run_done(self, test: Test, measurement: Measurement) -> None:
        return None

    def verdict(self, test: Test, record: LogRecord, cached: bool) -> None:
        return None


@dataclass(frozen=True)
class MeasurementRecord:
    """One line of ``measurements.jsonl`` read back (``done`` lines carry a measurement)."""

    event: str
    state: State
    phase: str
    time_s: float
    data: Mapping[str, Any]


def read_measurements(session_dir: Path) -> list[MeasurementRecord]:
    """The launches and finished runs of a session, oldest first (torn lines ignored)."""
    try:
        text = (session_dir / MEASUREMENTS_FILE).read_text("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.split("\n")[:-1]:  # the last piece is "" or a torn append
        try:
            d = json.loads(line)
            out.append(
                MeasurementRecord(
                    str(d["event"]),
                    State.from_json(d["state"]),
                    str(d.get("phase", "")),
                    float(d.get("time_s", 0.0)),
                    d,
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


def describe_test(test: Test, session: Session) -> str:
    """A short phrase for a step: what it measures and why."""
    if test.phase == "verify-good":
        return f"the {session.setup.terms.old} endpoint"
    if test.phase == "verify-bad":
        return f"the {session.setup.terms.new} endpoint"
    if test.phase == "minimize":
        switched = ", ".join(map(repo_label, test.switched)) or "nothing"
        return f"which repos are needed (switched: {switched})"
    if test.phase == "remainder":
        reverted = ", ".join(map(repo_label, test.reverted)) or "nothing"
        return f"is anything else bad ({session.setup.terms.new} with {reverted} reverted)"
    if test.phase == DELTA_PHASE:
        assert test.repo is not None
        return f"{repo_label(test.repo)}'s culprit run to the end, for its own Δ peak"
    if test.phase == HISTORY_PHASE:
        assert test.repo is not None
        return (
            f"{repo_label(test.repo)}'s culprit with torch's native allocator, for the "
            "allocator history only"
        )
    if test.phase == "alone":
        (repo,) = test.switched
        return f"{repo_label(repo)} alone on the {session.setup.terms.old} state"
    assert test.repo is not None
    value = test.state.value(test.repo)
    return f"{repo_label(test.repo)} at {value[:12]}"


class Runner:
    """Drives one session to its end (or to ``max_steps``)."""

    def __init__(
        self,
        session: Session,
        measure: Callable[[State, Threshold | None], Measurement],
        prompt: Mapping[str, Any],
        *,
        environment: Mapping[str, Any] | None = None,
        events: Events | None = None,
        subject: Callable[[Test], str] | None = None,
        measure_history: Callable[[State], Measurement] | None = None,
    ) -> None:
        """``measure(state, stop_threshold)`` switches the workspace and runs one replay;
        ``measure_history(state)`` (``--history-with-native-allocator``) replays a state with
        torch's native allocator for its allocator history only."""
        self.session = session
        self.measure = measure
        self.measure_history = measure_history
        self.prompt = prompt
        self.environment = dict(environment or {})
        self.events: Events = events or _Quiet()
        self.subject = subject or self.default_subject
        self.launched = 0
        self.finished = 0
        self._completed: set[State] = set()

    # -- comments for the log
    def default_subject(self, test: Test) -> str:
        s = self.session.setup
        if test.phase != "bisect":
            return describe_test(test, self.session)
        assert test.repo is not None
        value = test.state.value(test.repo)
        path = s.repo_paths.get(test.repo)
        if path and gitrepo.is_commit_id(value):
            try:
                info = gitrepo.commit_info(Path(path), value, repo_label(test.repo))
                return f"{repo_label(test.repo)}: {info.subject}"
            except SentinelError:
                pass
        return f"{repo_label(test.repo)}: {value}"

    # -- the loop
    def run(self, max_steps: int | None = None) -> Step:
        """Measure until the plan has an answer; returns the final step (or the next Test
        when ``max_steps`` ran out)."""
        number = 0
        while True:
            step = self.session.next_step()
            test = step if isinstance(step, Test) else self._completion(step)
            if test is None:
                self.session.clear_expected()
                return step
            if max_steps is not None and number >= max_steps:
                return step
            number += 1
            self.events.step(number, test, self.session)
            if test.phase in (DELTA_PHASE, HISTORY_PHASE):
                self._complete(test)
            else:
                self._decide(test)

    # -- a culprit's own Δ, from a run to the end
    def _completion(self, step: Step) -> Test | None:
        """The next culprit state to run to the end once more, or None.

        The search stops a bad run as soon as it crosses the threshold, so a culprit's peak
        is only a lower bound ("≥ threshold") and its Δ would say little. Once the answer is
        known, each culprit whose state was stopped early is run once more without the
        early stop, so the report can give its real Δ (one run per culprit: the "+2" of the
        bound covers it). An OOM cannot finish, so it is not repeated. The run goes to
        ``measurements.jsonl`` as phase "delta"; verdicts and the log are unchanged.
        """
        if not isinstance(step, Found | OnlySkippedLeft):
            return None
        latest = {r.state: r for r in self.session.records()}
        done = {
            m.state
            for m in read_measurements(self.session.paths.session)
            if m.event == "done" and m.phase == DELTA_PHASE
        }
        for c in step.culprits:
            rec = latest.get(c.state) if c.state is not None else None
            if rec is None or c.state in done or c.state in self._completed:
                continue
            if rec.peak_lower_bound and rec.outcome != "oom" and rec.verdict is Verdict.NEW:
                return Test(c.state, DELTA_PHASE, repo=c.repo)
        return self._history_test(step) if self.measure_history is not None else None

    def _history_test(self, step: Found | OnlySkippedLeft) -> Test | None:
        """The next culprit whose OOM had no allocator history because torch ran
        cudaMallocAsync: replayed once with the native allocator (phase "history"), which
        neither verdicts nor the Δ use."""
        measured = read_measurements(self.session.paths.session)
        have = {m.state for m in measured if m.event == "done" and m.phase == HISTORY_PHASE}
        refused = {
            m.state
            for m in measured
            if m.event == "done"
            and m.phase != HISTORY_PHASE
            and (m.data.get("outcome") or {}).get("kind") == "oom"
            and not m.data.get("allocator_history")
            and ((m.data.get("torch") or {}).get("history_refused"))
        }
        for c in step.culprits:
            if c.state in refused and c.state not in have and c.state not in self._completed:
                return Test(c.state, HISTORY_PHASE, repo=c.repo)
        return None

    def _complete(self, test: Test) -> None:
        self.session.set_expected(test.state)
        self.events.run_start(test, 1, 1)
        self._log("launch", test, {})
        self.launched += 1
        if test.phase == HISTORY_PHASE and self.measure_history is not None:
            m = self.measure_history(test.state)
        else:
            m = self.measure(test.state, None)  # no early stop: the whole prompt
        self.finished += 1
        self._log("done", test, m.to_json())
        self.events.run_done(test, m)
        self._completed.add(test.state)
        fix = device_failure(m.outcome, m.console_tail, self.session.setup.flags)
        if fix is not None:
            raise DeviceFailure(fix)
        self.session.clear_expected()

    def _decide(self, test: Test) -> None:
        s = self.session.setup
        state = test.state
        self.session.set_expected(state)
        threshold = effective_threshold(self.session)
        judge = threshold or Threshold.oom_only()
        # what the harness failed at says nothing about the state (a cache from before this
        # rule may hold such runs): measure those again
        runs: list[Outcome] = [
            r
            for r in self.session.cached_runs(state, self.environment)
            if not is_harness_failure(r)
        ]
        verdict = decide(runs, judge, s.repeat, timeout_is_bad=s.timeout_is_bad)
        cached = verdict is not None
        # A run stopped early under an older, lower threshold proves nothing now; never loop
        # forever on such leftovers: after this many fresh runs the state is a skip.
        budget = 2 * s.repeat + 2
        fresh = 0
        while verdict is None:
            if fresh >= budget:
                verdict = Verdict.SKIP
                break
            fresh += 1
            self.events.run_start(test, fresh, s.repeat)
            self._log("launch", test, {})
            self.launched += 1
            m = self.measure(state, threshold)
            self.finished += 1
            self._log("done", test, m.to_json())
            self.events.run_done(test, m)
            fix = device_failure(m.outcome, m.console_tail, s.flags)
            if fix is not None:
                raise DeviceFailure(fix)  # the machine's, not the state's: nothing is kept
            runs.append(m.outcome)
            kept = [r for r in runs if not is_harness_failure(r)]
            self.session.store_runs(state, kept, self.environment)
            verdict = decide(runs, judge, s.repeat, timeout_is_bad=s.timeout_is_bad)
        rec = self.session.record(
            state, verdict, _counted(runs, judge, s.timeout_is_bad), self.subject(test)
        )
        self.events.verdict(test, rec, cached)

    def _log(self, event: str, test: Test, data: Mapping[str, Any]) -> None:
        line = {
            "event": event,
            "time_s": round(time.time(), 3),
            "phase": test.phase,
            "repo": test.repo,
            "state": test.state.to_json(),
            **data,
        }
        append_line(
            self.session.paths.session / MEASUREMENTS_FILE,
            json.dumps(line, separators=(",", ":"), default=str),
        )


def _counted(runs: Sequence[Outcome], threshold: Threshold, timeout_is_bad: bool) -> list[Outcome]:
    """The runs a verdict rests on: early-stopped runs under the threshold prove nothing."""
    kept = [r for r in runs if classify_run(r, threshold, timeout_is_bad=timeout_is_bad) != "void"]
    return kept or list(runs)
