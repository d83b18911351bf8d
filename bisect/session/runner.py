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
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oom_sentinel.bisect.measure.device import DeviceFailure, device_failure, is_harness_failure
from oom_sentinel.bisect.measure.replay import Measurement, kill_all_children
from oom_sentinel.bisect.search.confidence import (
    BAND_RUNS,
    Band,
    Confidence,
    Judgement,
    counted_runs,
    judge,
    measure_band,
    stop_limit,
)
from oom_sentinel.bisect.search.plan import Found, OnlySkippedLeft, Step, Test, next_batch
from oom_sentinel.bisect.search.verdict import (
    Outcome,
    Skip,
    Threshold,
    Verdict,
    classify_run,
    decide,
)
from oom_sentinel.bisect.session.files import LogRecord, Session
from oom_sentinel.bisect.session.fsutil import append_line
from oom_sentinel.bisect.state import gitrepo
from oom_sentinel.bisect.state.states import State, repo_label
from oom_sentinel.daemon.core.errors import SentinelError

__all__ = [
    "DELTA_PHASE",
    "HISTORY_PHASE",
    "MEASUREMENTS_FILE",
    "POOLS",
    "ROUND_EVENT",
    "SANDWICH_PHASE",
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
#: the ``measurements.jsonl`` line that opens a ``--parallel`` round (its states, its width)
ROUND_EVENT = "round"
#: a culprit and its parent measured once more before the culprit is named (``--repeat auto``)
SANDWICH_PHASE = "sandwich"
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

    def judged(self, test: Test, judgement: Judgement) -> None: ...


class _Quiet:
    def step(self, number: int, test: Test, session: Session) -> None:
        return None

    def run_start(self, test: Test, index: int, repeat: int) -> None:
        return None

    def run_done(self, test: Test, measurement: Measurement) -> None:
        return None

    def verdict(self, test: Test, record: LogRecord, cached: bool) -> None:
        return None

    def judged(self, test: Test, judgement: Judgement) -> None:
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
    if test.phase == SANDWICH_PHASE:
        assert test.repo is not None
        return f"{repo_label(test.repo)}'s culprit re-checked: {test.state.value(test.repo)[:12]}"
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
        lanes: Sequence[Callable[[State, Threshold | None], Measurement]] = (),
        measure_history: Callable[[State], Measurement] | None = None,
    ) -> None:
        """``measure(state, stop_threshold)`` switches the workspace and runs one replay.

        ``lanes`` (``--parallel N``): N such functions, each with its own workspace and GPU,
        that may run at the same time on different threads; lane 0 is usually ``measure``.
        ``measure_history(state)`` (``--history-with-native-allocator``) replays a state with
        torch's native allocator for its allocator history only.
        """
        self.session = session
        self.measure = measure
        self.measure_history = measure_history
        self.lanes = list(lanes) or [measure]
        #: rounds of measurements this runner made (a --parallel batch is one round)
        self.rounds = 0
        self.prompt = prompt
        self.environment = dict(environment or {})
        self.events: Events = events or _Quiet()
        self.subject = subject or self.default_subject
        self.launched = 0
        self.finished = 0
        self._completed: set[State] = set()
        self._sandwiched: set[State] = set()
        #: the culprit states of the sandwich now due (run to the end; their parents are not)
        self._culprit_states: set[State] = set()

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
            if len(self.lanes) > 1 and test.phase == "bisect":
                batch = next_batch(self.session.plan(), len(self.lanes))
                for t in batch:
                    number += 1
                    self.events.step(number, t, self.session)
                self._round(batch)
                continue
            number += 1
            self.rounds += 1
            self.events.step(number, test, self.session)
            if test.phase in (DELTA_PHASE, HISTORY_PHASE):
                self._complete(test)
            elif self.session.setup.adaptive:
                self._judge(test)
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
        events = read_measurements(self.session.paths.session)
        if self.session.setup.adaptive:
            sandwich = self._sandwich(step, events)
            if sandwich is not None:
                return sandwich
        latest = {r.state: r for r in self.session.records()}
        done = {
            m.state
            for m in events
            if m.event == "done"
            and (
                m.phase == DELTA_PHASE
                or (
                    m.phase == SANDWICH_PHASE
                    and m.data.get("to_end")
                    and not m.data.get("stopped_early")
                )
            )
        }
        for c in step.culprits:
            if c.state is None:
                continue
            rec = latest.get(c.state)
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

    # -- the sandwich and the verdict with confidence (``--repeat auto``)
    def _sandwich(
        self, step: Found | OnlySkippedLeft, events: Sequence[MeasurementRecord]
    ) -> Test | None:
        """The next culprit or parent to re-check before the culprit is named, or None.

        Pinpoint re-runs a culprit and its parent once more before it reports the culprit: a
        verdict that one lucky or unlucky run made would otherwise stand. Each of the two
        states gets one fresh run, judged with its earlier runs (allowed one run past
        ``max_repeat`` for it). Where the re-check changes a verdict, the new verdict is
        logged (the latest verdict on a state wins) and the search moves on from it. The
        culprit's run goes to the end, so it is also the run its Δ is read from.
        """
        checked = self._sandwiched | {
            m.state for m in events if m.event == "verdict" and m.phase == SANDWICH_PHASE
        }
        for c in step.culprits:
            for st in (c.parent, c.state):
                if st is not None and st not in checked:
                    if st == c.state:
                        self._culprit_states.add(st)
                    return Test(st, SANDWICH_PHASE, repo=c.repo)
        return None

    def band(self) -> Band:
        """The noise band, from every run of the good endpoint (confidence.measure_band)."""
        good = self.session.setup.good
        runs = self.session.cached_runs(good, self.environment)
        return measure_band([r for r in runs if not is_harness_failure(r)])

    def _judge(self, test: Test) -> None:
        s = self.session.setup
        state = test.state
        self.session.set_expected(state)
        threshold = effective_threshold(self.session)
        limits = threshold or Threshold.oom_only()
        sandwich = test.phase == SANDWICH_PHASE
        cap = s.max_repeat + (1 if sandwich else 0)
        # the good endpoint runs BAND_RUNS times, to the end: its spread is the noise band
        measuring_band = test.phase == "verify-good"
        min_runs = BAND_RUNS if measuring_band else 1
        runs: list[Outcome] = [
            r
            for r in self.session.cached_runs(state, self.environment)
            if not is_harness_failure(r)
        ]
        band = Band() if measuring_band else self.band()

        def verdict_of(rs: Sequence[Outcome]) -> Judgement:
            return judge(rs, limits, band, cap, timeout_is_bad=s.timeout_is_bad, min_runs=min_runs)

        j = verdict_of(runs)
        cached = j.verdict is not None and not sandwich
        to_end = measuring_band or (sandwich and state in self._culprit_states)
        stop = None if to_end or threshold is None else stop_limit(threshold, band)
        budget = 2 * cap + 2  # void leftovers from older thresholds must not loop forever
        fresh = 0
        while j.verdict is None or (sandwich and fresh == 0):
            if fresh >= budget:
                j = Judgement(Verdict.SKIP, None, j.repeats)
                break
            fresh += 1
            self.events.run_start(test, fresh, cap)
            self._log("launch", test, {})
            self.launched += 1
            m = self.measure(state, stop)
            self.finished += 1
            self._log("done", test, {**m.to_json(), "to_end": stop is None})
            self.events.run_done(test, m)
            fix = device_failure(m.outcome, m.console_tail, s.flags)
            if fix is not None:
                raise DeviceFailure(fix)
            runs.append(m.outcome)
            self.session.store_runs(
                state, [r for r in runs if not is_harness_failure(r)], self.environment
            )
            j = verdict_of(runs)
        assert j.verdict is not None
        self._log_judgement(test, j, band, threshold)
        kept = counted_runs(runs, limits, band, timeout_is_bad=s.timeout_is_bad)
        if sandwich:
            self._sandwiched.add(state)
            latest = [r for r in self.session.records() if r.state == state]
            if latest and latest[-1].verdict is j.verdict:
                self.session.clear_expected()
                return
            comment = f"re-checked before naming the culprit: {j.verdict.value} now"
            rec = self.session.record(state, j.verdict, kept, comment)
        else:
            rec = self.session.record(state, j.verdict, kept, self._comment(test, j))
        self.events.verdict(test, rec, cached)

    def _comment(self, test: Test, j: Judgement | None) -> str:
        """The log comment: the subject, and for UNKNOWN why the state counts as a skip."""
        subject = self.subject(test)
        if j is None or j.confidence is not Confidence.UNKNOWN:
            return subject
        return f"{subject} (unknown after {j.repeats} runs: median within the noise band)"

    # -- a --parallel round: N states of a culprit repo's range at once, one per lane
    def _round(self, batch: Sequence[Test]) -> None:
        """Measure ``batch`` concurrently, one replay per lane, then log every verdict.

        Only the measuring runs on the lanes' threads; every file of the session (the
        cache, ``measurements.jsonl``, the log) is written here, on the calling thread, so
        the session's one-writer rules hold. A replay's server is forked by replay.py's
        spawner thread (``PR_SET_PDEATHSIG`` follows the forking *thread*), never by a lane
        thread, so it still dies with ``oom-bisect``. Each finished run is cached at once,
        and the verdicts are logged in the batch's order once all are known: Ctrl-C costs at
        most the runs in flight (one per lane), and the same log gives the same next round.
        A state that needs another run (``--repeat``) takes the next free lane.
        """
        s = self.session.setup
        self.rounds += 1
        threshold = effective_threshold(self.session)
        limits = threshold or Threshold.oom_only()
        band = self.band() if s.adaptive else Band()
        cap = s.max_repeat if s.adaptive else s.repeat
        stop = threshold if not s.adaptive or threshold is None else stop_limit(threshold, band)

        def verdict_of(rs: Sequence[Outcome]) -> Verdict | None:
            if s.adaptive:
                return judge(rs, limits, band, cap, timeout_is_bad=s.timeout_is_bad).verdict
            return decide(rs, limits, s.repeat, timeout_is_bad=s.timeout_is_bad)

        self.session.set_expected(batch[0].state)
        self._log(
            ROUND_EVENT,
            batch[0],
            {"width": len(self.lanes), "states": [t.state.to_json() for t in batch]},
        )
        runs: dict[Test, list[Outcome]] = {}
        cached: dict[Test, bool] = {}
        todo: list[Test] = []
        for t in batch:
            runs[t] = [
                r
                for r in self.session.cached_runs(t.state, self.environment)
                if not is_harness_failure(r)
            ]
            cached[t] = verdict_of(runs[t]) is not None
            if not cached[t]:
                todo.append(t)
        fresh: dict[Test, int] = dict.fromkeys(batch, 0)
        done: queue.Queue[tuple[int, Test, Measurement | BaseException]] = queue.Queue()
        free = list(range(len(self.lanes)))
        busy: dict[int, threading.Thread] = {}

        def work(lane: int, t: Test) -> None:
            try:
                done.put((lane, t, self.lanes[lane](t.state, stop)))
            except BaseException as exc:  # handed to the calling thread
                done.put((lane, t, exc))

        try:
            while todo or busy:
                while todo and free:
                    t = todo.pop(0)
                    lane = free.pop(0)
                    fresh[t] += 1
                    self.events.run_start(t, fresh[t], cap)
                    self._log("launch", t, {"lane": lane})
                    self.launched += 1
                    th = threading.Thread(
                        target=work, args=(lane, t), name=f"oom-bisect-lane-{lane}", daemon=True
                    )
                    busy[lane] = th
                    th.start()
                lane, t, result = done.get()
                busy.pop(lane).join()
                free.append(lane)
                if isinstance(result, BaseException):
                    raise result
                m = result
                self.finished += 1
                self._log("done", t, {**m.to_json(), "lane": lane})
                self.events.run_done(t, m)
                fix = device_failure(m.outcome, m.console_tail, s.flags)
                if fix is not None:
                    raise DeviceFailure(fix)
                runs[t].append(m.outcome)
                self.session.store_runs(
                    t.state, [r for r in runs[t] if not is_harness_failure(r)], self.environment
                )
                if verdict_of(runs[t]) is None:
                    if fresh[t] >= 2 * cap + 2:  # void leftovers must not loop forever
                        runs[t].append(Skip("no run of this state proved anything"))
                    else:
                        todo.append(t)
        except BaseException:
            # Ctrl-C, a device failure, a lane's error: stop the other lanes' replays now
            # (their runs are not cached: nothing half-measured is kept)
            kill_all_children()
            for th in busy.values():
                th.join(timeout=30)
            raise
        for t in batch:
            j: Judgement | None = None
            if s.adaptive:
                j = judge(runs[t], limits, band, cap, timeout_is_bad=s.timeout_is_bad)
                self._log_judgement(t, j, band, threshold)
                kept = counted_runs(runs[t], limits, band, timeout_is_bad=s.timeout_is_bad)
                verdict: Verdict | None = j.verdict
            else:
                verdict = decide(runs[t], limits, s.repeat, timeout_is_bad=s.timeout_is_bad)
                kept = _counted(runs[t], limits, s.timeout_is_bad)
            assert verdict is not None
            rec = self.session.record(t.state, verdict, kept, self._comment(t, j))
            self.events.verdict(t, rec, cached[t])
        self.session.clear_expected()

    def _log_judgement(
        self, test: Test, j: Judgement, band: Band, threshold: Threshold | None
    ) -> None:
        assert j.verdict is not None
        self._log(
            "verdict",
            test,
            {
                "verdict": j.verdict.value,
                **j.to_json(),
                "band_bytes": band.to_json(),
                "threshold": None
                if threshold is None
                else {"vram_bytes": threshold.vram_bytes, "ram_bytes": threshold.ram_bytes},
            },
        )
        self.events.judged(test, j)

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
