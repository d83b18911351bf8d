"""Device flags that start (issue 10, item 3): the replays' device is decided before the first
measurement, a replay that still dies for a device reason stops the bisect with the one-line
fix, and such a failure never reaches the outcome cache or the log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bisect_git import make_install

from oom_sentinel.bisect.measure.device import (
    DeviceFailure,
    choose_device,
    device_failure,
    is_harness_failure,
)
from oom_sentinel.bisect.measure.replay import Measurement, Peaks
from oom_sentinel.bisect.search.verdict import Ok, Skip, Threshold
from oom_sentinel.bisect.session.files import BisectPaths, OutcomeCache, begin
from oom_sentinel.bisect.session.runner import Runner
from oom_sentinel.bisect.state.states import State, scan_install
from oom_sentinel.daemon.comfy.interpreter import InterpreterFacts, probe_interpreter

MIB = 1024 * 1024
PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 100}}}
NO_GPU = InterpreterFacts("/venv/bin/python", torch_version="2.14.1+cpu", cuda_available=False)
NO_DRIVER = (
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
    "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx"
)


@pytest.mark.parametrize(
    ("flags", "given", "facts", "want", "noted"),
    [
        ((), False, NO_GPU, ("--cpu",), True),
        (("--lowvram",), True, NO_GPU, ("--lowvram",), False),  # the user's, snapshot's, ...
        ((), True, NO_GPU, (), False),  # a running ComfyUI with no flags: as it runs
        ((), False, InterpreterFacts("/p", torch_version="2.7", cuda_available=True), (), False),
        (
            (),
            False,
            InterpreterFacts("/p", torch_version="2.7", cuda_available=False, mps_available=True),
            (),
            False,
        ),
        (
            (),
            False,
            InterpreterFacts("/p", torch_version="2.7", cuda_available=False, xpu_available=True),
            (),
            False,
        ),
        (
            (),
            False,
            InterpreterFacts(
                "/p", torch_version="2.4", cuda_available=False, other_backends=("torch_directml",)
            ),
            (),
            False,
        ),
        ((), False, InterpreterFacts("/p", torch_error="import torch: No module"), (), False),
        ((), False, InterpreterFacts("/p", error="timed out"), (), False),
        ((), False, None, (), False),
    ],
    ids=[
        "no-gpu-adds-cpu",
        "given-flags-stay",
        "given-empty-stays",
        "cuda",
        "mps",
        "xpu",
        "directml",
        "no-torch",
        "probe-failed",
        "not-probed",
    ],
)
def test_the_device_is_decided_from_flags_then_from_comfyuis_torch(
    flags: tuple[str, ...],
    given: bool,
    facts: InterpreterFacts | None,
    want: tuple[str, ...],
    noted: bool,
) -> None:
    choice = choose_device(flags, given, facts)
    assert choice.flags == want
    assert (choice.note is not None) == noted
    if noted:
        assert choice.note is not None and "\n" not in choice.note
        assert "replaying with --cpu" in choice.note and "2.14.1+cpu" in choice.note


@pytest.mark.real_comfyui
def test_a_real_cpu_torch_is_asked_and_gets_cpu() -> None:
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON")
    if not python:
        pytest.skip("set OOM_SENTINEL_REAL_COMFYUI_PYTHON to ComfyUI's interpreter")
    facts, _ = probe_interpreter(python, pip=False)
    assert facts.torch_version and facts.has_accelerator() is False, facts
    assert choose_device((), False, facts).flags == ("--cpu",)


def test_a_device_death_says_which_flag_fixes_it() -> None:
    skip = Skip("won't start: exited with status 1: raise AssertionError")
    fix = device_failure(skip, ("Traceback (most recent call last):", NO_DRIVER, "exit"), ())
    assert fix is not None and "\n" not in fix
    assert "Found no NVIDIA driver on your system" in fix and "--flags '--cpu'" in fix
    assert "even with --cpu" in (device_failure(Skip(NO_DRIVER), (), ("--cpu",)) or "")
    assert device_failure(Skip("unknown node: Foo does not exist"), ("fine",), ()) is None
    assert device_failure(Ok(1, 2), (NO_DRIVER,), ()) is None  # a run that worked is not one
    assert is_harness_failure(Skip(f"won't start: exited with status 1: {NO_DRIVER}"))
    assert is_harness_failure(Skip("won't start: no answer on /system_stats within 600 s"))
    assert is_harness_failure(Skip("the prompt was interrupted by someone else"))
    # the state's own failures are outcomes of the workflow: cached like any other
    assert not is_harness_failure(Skip("unrelated exception in Foo: ValueError: x"))
    assert not is_harness_failure(Skip("won't start: exited with status 1: SyntaxError: x"))
    assert not is_harness_failure(Skip("unknown node: Foo does not exist"))


def test_the_device_flags_key_the_outcome_cache() -> None:
    state = State.of("a" * 40)
    assert OutcomeCache.key(state, "wf", ("--cpu",), None) != OutcomeCache.key(
        state, "wf", (), None
    )


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory):
    return make_install(tmp_path_factory.mktemp("device"), dirty=False)


def test_a_device_death_is_never_cached_nor_logged(inst, tmp_path: Path) -> None:
    a = inst.nodes["node_a"]
    paths = BisectPaths.for_install(inst.root, home=tmp_path / "bisect")
    sess = begin(
        paths, scan_install(inst.root), f"node:node_a={a[0]}", "node:node_a=HEAD", prompt=PROMPT
    )
    calls: list[State] = []

    def no_driver(state: State, threshold: Threshold | None) -> Measurement:
        calls.append(state)
        return Measurement(
            Skip(f"won't start: exited with status 1: {NO_DRIVER}"),
            Peaks(),
            console_tail=("Traceback (most recent call last):", NO_DRIVER),
        )

    with pytest.raises(DeviceFailure, match=r"--flags '--cpu'"):
        Runner(sess, no_driver, PROMPT).run()
    assert calls == [sess.setup.good]
    assert sess.records() == []  # no "good state cannot be tested" verdict
    assert sess.cached_runs(sess.setup.good) == []
    assert not list(paths.outcomes.rglob("*.json"))
    # an old cache holding such a skip (stored before this rule) is measured again
    sess.store_runs(sess.setup.good, [Skip(f"won't start: exited with status 1: {NO_DRIVER}")])

    def fits(state: State, threshold: Threshold | None) -> Measurement:
        calls.append(state)
        bad = a.index(state.node("node_a")) >= 5
        vram = (1600 if bad else 1000) * MIB
        return Measurement(Ok(vram, 100 * MIB, 1.0), Peaks(nvml_vram_bytes=vram))

    calls.clear()
    step = Runner(sess, fits, PROMPT).run()
    assert calls[0] == sess.setup.good  # measured, not taken from the cache
    assert [c.value for c in step.culprits] == [a[5]]
    assert all(not is_harness_failure(o) for o in sess.cached_runs(sess.setup.good))
