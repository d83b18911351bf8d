"""``--parallel N``: the runner measures a k-ary round's states at once, one lane (workspace +
GPU) each, over a real session on disk and a real install, with measurements answered by an
oracle; Ctrl-C in a round costs at most the runs in flight; and the lanes' GPUs come from the
GPU probe (the scripted fake GPU's devices) or the user's CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from bisect_git import session_paths, untouched_install
from bisect_oracle import Oracle

from oom_sentinel.bisect.cli.main import parallel_devices
from oom_sentinel.bisect.search.plan import Culprit, Found, rounds_bound
from oom_sentinel.bisect.session.files import BisectPaths, Session, begin, reset_paths
from oom_sentinel.bisect.session.report import build_report, search_line
from oom_sentinel.bisect.session.runner import ROUND_EVENT, Runner, read_measurements
from oom_sentinel.bisect.state.states import State, scan_install
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}}}
FIRST_BAD = 17
GIB = 1024**3


inst = untouched_install("parallel", "the step loop")


paths = session_paths()


def start(paths: BisectPaths, inst, **kw) -> Session:
    return begin(
        paths, scan_install(inst.root), "comfyui=v-first", "comfyui=HEAD", prompt=PROMPT, **kw
    )


class Lanes:
    """N lane functions over one oracle. In a round, each lane waits until every state of
    the round has started, so a round that did not run its states at once fails (a timeout)
    instead of passing slowly."""

    def __init__(self, oracle: Oracle, n: int, paths: BisectPaths, gate: bool = True) -> None:
        self.oracle = oracle
        self.paths = paths
        self.gate = gate
        self.lock = threading.Condition()
        self.started: dict[int, int] = {}  # round number -> runs started in it
        self.seen: list[tuple[int, str, State]] = []  # (lane, thread name, state)
        self.fns = [self._lane(i) for i in range(n)]

    def _round(self) -> tuple[int, int]:
        rounds = [m for m in read_measurements(self.paths.session) if m.event == ROUND_EVENT]
        return len(rounds), len(rounds[-1].data["states"]) if rounds else 1

    def _lane(self, i: int):
        def measure(state: State, threshold):
            number, size = self._round()
            with self.lock:
                self.seen.append((i, threading.current_thread().name, state))
                self.started[number] = self.started.get(number, 0) + 1
                self.lock.notify_all()
                if self.gate and threading.current_thread() is not threading.main_thread():
                    ok = self.lock.wait_for(lambda: self.started[number] >= size, timeout=20)
                    assert ok, f"round {number}: {self.started[number]} of {size} started"
                return self.oracle(state, threshold)

        return measure


def core_oracle(inst, **kw) -> Oracle:
    return Oracle(bad=lambda s: inst.core.index(s.comfyui) >= FIRST_BAD, **kw)


def test_a_round_measures_its_states_at_once_and_finds_the_same_culprit(paths, inst) -> None:
    serial = core_oracle(inst)
    alone = Runner(start(paths, inst), serial, PROMPT)
    expected = alone.run()
    serial_bisect = sum(
        1 for r in Session.open(paths).records() if r.comment.startswith("ComfyUI:")
    )
    reset_paths(paths)
    paths.outcomes.rename(paths.outcomes.with_name("outcomes-serial"))

    oracle = core_oracle(inst)
    lanes = Lanes(oracle, 3, paths)
    runner = Runner(start(paths, inst), lanes.fns[0], PROMPT, lanes=lanes.fns)
    step = runner.run()
    assert (
        step
        == expected
        == Found((Culprit("comfyui", inst.core[FIRST_BAD], inst.core[FIRST_BAD - 1]),))
    )
    events = read_measurements(paths.session)
    rounds = [m for m in events if m.event == ROUND_EVENT]
    m = len(inst.core) - 1  # candidates between v-first and HEAD
    assert 1 <= len(rounds) <= rounds_bound(m, 3) < rounds_bound(m, 1)
    assert all(1 <= len(r.data["states"]) <= 3 and r.data["width"] == 3 for r in rounds)
    # every bisect run was on a lane thread, the lanes of one round distinct
    bisect_done = [e for e in events if e.event == "done" and e.phase == "bisect"]
    assert {e.data["lane"] for e in bisect_done} == {0, 1, 2}
    assert all(
        name.startswith("oom-bisect-lane-")
        for _, name, s in lanes.seen
        if s in {e.state for e in bisect_done}
    )
    assert runner.launched == runner.finished == len(oracle.calls)
    # one measurement per state, each state once: k-ary costs measurements, not repeats
    recs = Session.open(paths).records()
    assert len({r.state for r in recs}) == len(recs) == len(oracle.calls)
    report = build_report(Session.open(paths), step)
    par = report["search"]["parallel"]
    assert par == {
        "width": 3,
        "rounds": len(rounds),
        "measurements": len(bisect_done),
        "round_bound": rounds_bound(m, 3),
        "serial_bound": rounds_bound(m, 1),
        "measurement_bound": par["measurement_bound"],
    }
    assert report["search"]["within_bound"]
    line = search_line(report)
    assert line is not None and f"--parallel 3: {len(rounds)} round(s)" in line, line
    print(
        f"\n[parallel] M={m} candidates, 3 lanes: {len(rounds)} round(s) "
        f"(bound ⌈log4 {m}⌉ = {rounds_bound(m, 3)}; one at a time ⌈log2 {m}⌉ = "
        f"{rounds_bound(m, 1)}, took {serial_bisect}), {len(bisect_done)} bisect measurement(s)"
    )


def test_ctrl_c_in_a_round_costs_at_most_the_runs_in_flight(paths, inst) -> None:
    baseline = core_oracle(inst)
    Runner(start(paths, inst), baseline, PROMPT, lanes=Lanes(baseline, 3, paths, False).fns).run()
    total = len(baseline.calls)
    reset_paths(paths)
    paths.outcomes.rename(paths.outcomes.with_name("outcomes-old"))

    oracle = core_oracle(inst, interrupt_at={4})  # in the first round (after 2 endpoints)
    lanes = Lanes(oracle, 3, paths, gate=False)
    with pytest.raises(KeyboardInterrupt):
        Runner(start(paths, inst), lanes.fns[0], PROMPT, lanes=lanes.fns).run()
    step = Runner(Session.open(paths), lanes.fns[0], PROMPT, lanes=lanes.fns).run()
    assert isinstance(step, Found)
    assert total < len(oracle.calls) <= total + 3
    # nothing of the interrupted round was logged as a verdict twice
    recs = Session.open(paths).records()
    assert len({r.state for r in recs}) == len(recs)


def test_the_lanes_gpus(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    FakeGpuDir(gpu).create([FakeDevice(i, f"Fake GPU {i}", 8 * GIB) for i in range(3)])
    env = {"OOM_SENTINEL_FAKE_GPU": str(gpu)}
    assert parallel_devices(None, (), env) == ["0", "1", "2"]  # default: every GPU seen
    assert parallel_devices(2, (), env) == ["0", "1"]
    assert parallel_devices(1, (), env) == [None]  # one lane: the environment as it is
    assert parallel_devices(None, (), {**env, "CUDA_VISIBLE_DEVICES": "2,0"}) == ["2", "0"]
    assert parallel_devices(None, ("--cpu",), env) == [None]
    assert parallel_devices(None, (), {}) == [None]  # no GPU seen: 1
    with pytest.raises(ConfigError, match="--parallel 4: only 3 GPU"):
        parallel_devices(4, (), env)
    with pytest.raises(ConfigError, match="at least 1"):
        parallel_devices(0, (), env)
    with pytest.raises(ConfigError, match="on the CPU"):
        parallel_devices(2, ("--cpu",), env)


def test_parallel_rounds_with_confidence_and_the_sandwich(paths, inst) -> None:
    # --parallel with --repeat auto: each state of a round judged with the band, every
    # verdict line written, then the culprit and its parent re-checked one at a time
    oracle = core_oracle(inst)
    lanes = Lanes(oracle, 3, paths)
    step = Runner(start(paths, inst, adaptive=True), lanes.fns[0], PROMPT, lanes=lanes.fns).run()
    assert step == Found((Culprit("comfyui", inst.core[FIRST_BAD], inst.core[FIRST_BAD - 1]),))
    events = read_measurements(paths.session)
    bisect = [e for e in events if e.event == "verdict" and e.phase == "bisect"]
    in_rounds = {
        State.from_json(s) for r in events if r.event == ROUND_EVENT for s in r.data["states"]
    }
    assert {e.state for e in bisect} == in_rounds
    assert all(
        e.data["repeats"] == 1 and e.data["confidence"] in ("same", "different") for e in bisect
    )
    assert [e.phase for e in events if e.event == "verdict"][-2:] == ["sandwich", "sandwich"]
    assert all(
        e.data.get("lane") is None for e in events if e.event == "done" and e.phase == "sandwich"
    )
