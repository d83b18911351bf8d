"""The step loop (runner.py) over a real session on disk and a real install, with
measurements answered by an oracle: resuming after Ctrl-C costs at most one measurement,
repeats stop once the median is certain, and the outcome cache outlives a reset."""

from __future__ import annotations

import pytest
from bisect_git import session_paths, untouched_install
from bisect_oracle import Oracle

from oom_sentinel.bisect.search.plan import Culprit, Error, Found, OnlySkippedLeft
from oom_sentinel.bisect.search.verdict import Verdict
from oom_sentinel.bisect.session.files import BisectPaths, Session, begin, reset_paths
from oom_sentinel.bisect.session.runner import Runner, read_measurements
from oom_sentinel.bisect.state.states import scan_install

PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}}}
FIRST_BAD = 17


inst = untouched_install("runner", "the step loop")


paths = session_paths()


def start(paths: BisectPaths, inst, **kw) -> Session:
    return begin(
        paths, scan_install(inst.root), "comfyui=v-first", "comfyui=HEAD", prompt=PROMPT, **kw
    )


def core_oracle(inst, **kw) -> Oracle:
    return Oracle(bad=lambda s: inst.core.index(s.comfyui) >= FIRST_BAD, **kw)


def test_the_loop_finds_the_culprit_and_logs_every_run(paths, inst) -> None:
    sess = start(paths, inst)
    oracle = core_oracle(inst)
    runner = Runner(sess, oracle, PROMPT)
    step = runner.run()
    assert step == Found((Culprit("comfyui", inst.core[FIRST_BAD], inst.core[FIRST_BAD - 1]),))
    assert runner.launched == runner.finished == len(oracle.calls)
    done = [m for m in read_measurements(paths.session) if m.event == "done"]
    assert [m.state for m in done] == oracle.calls
    assert done[0].phase == "verify-good" and done[1].phase == "verify-bad"
    assert done[0].data["peaks"]["vram_bytes"] == 1000 * 1024 * 1024
    recs = sess.records()
    assert recs[2].comment.startswith("ComfyUI: core change")  # the commit's subject
    assert sess.expected() is None


def test_ctrl_c_mid_measurement_costs_at_most_that_measurement(paths, inst) -> None:
    baseline = core_oracle(inst)
    Runner(start(paths, inst), baseline, PROMPT).run()
    n = len(baseline.calls)
    reset_paths(paths)
    paths.outcomes.rename(paths.outcomes.with_name("outcomes-old"))  # no help from the cache

    oracle = core_oracle(inst, interrupt_at={4})
    sess = start(paths, inst)
    with pytest.raises(KeyboardInterrupt):
        Runner(sess, oracle, PROMPT).run()
    interrupted = oracle.calls[3]
    assert Session.open(paths).expected() == interrupted  # `status` shows what was cut off
    resumed = Runner(Session.open(paths), oracle, PROMPT)
    step = resumed.run()
    assert isinstance(step, Found)
    assert len(oracle.calls) == n + 1  # the cut-off measurement, once more
    assert oracle.calls[4] == interrupted
    launches = [m for m in read_measurements(paths.session) if m.event == "launch"]
    assert len(launches) == n + 1


def test_repeat_stops_once_the_median_is_certain_and_resumes_from_the_cache(paths, inst) -> None:
    # with --repeat 3, two agreeing runs decide a state; Ctrl-C in a state's second run
    # keeps its first run in the cache
    oracle = core_oracle(inst, interrupt_at={2})
    sess = start(paths, inst, repeat=3)
    with pytest.raises(KeyboardInterrupt):
        Runner(sess, oracle, PROMPT).run()
    assert len(sess.cached_runs(sess.setup.good)) == 1
    step = Runner(Session.open(paths), oracle, PROMPT).run()
    assert isinstance(step, Found)
    recs = Session.open(paths).records()
    assert all(r.runs == 2 for r in recs)
    # every state measured twice, plus the one cut-off run
    assert len(oracle.calls) == 2 * len(recs) + 1


def test_the_outcome_cache_outlives_a_reset(paths, inst) -> None:
    first = core_oracle(inst)
    Runner(start(paths, inst), first, PROMPT).run()
    reset_paths(paths)
    second = core_oracle(inst)
    runner = Runner(start(paths, inst), second, PROMPT)
    assert isinstance(runner.run(), Found)
    assert second.calls == [] and runner.launched == 0


def test_skips_lead_to_an_honest_list_of_candidates(paths, inst) -> None:
    broken = set(inst.core[FIRST_BAD - 3 : FIRST_BAD + 1])  # the culprit itself won't start
    oracle = Oracle(
        bad=lambda s: inst.core.index(s.comfyui) >= FIRST_BAD,
        skip=lambda s: s.comfyui in broken,
    )
    step = Runner(start(paths, inst), oracle, PROMPT).run()
    assert isinstance(step, OnlySkippedLeft)
    values = [c.value for c in step.candidates]
    assert values == inst.core[FIRST_BAD - 3 : FIRST_BAD + 2]
    skipped = [r for r in Session.open(paths).records() if r.verdict is Verdict.SKIP]
    assert skipped and all("won't start" in (r.reason or "") for r in skipped)


def test_runs_that_prove_nothing_end_as_a_skip_not_a_loop(paths, inst) -> None:
    from oom_sentinel.bisect.measure.replay import Measurement, Peaks
    from oom_sentinel.bisect.search.verdict import Ok

    sess = start(paths, inst)
    calls = []

    def void(state, threshold):  # stopped early, yet under the threshold: proves nothing
        calls.append(state)
        return Measurement(Ok(1, 1, stopped_early=True), Peaks())

    step = Runner(sess, void, PROMPT).run()
    assert isinstance(step, Error) and "good state cannot be tested" in step.message
    assert sess.records()[0].verdict is Verdict.SKIP and len(calls) == 4  # 2 x repeat + 2


def test_a_pool_limits_the_threshold_but_an_oom_stays_bad(paths, inst) -> None:
    from oom_sentinel.bisect.session.runner import effective_threshold

    sess = start(paths, inst, extra={"pool": "vram"})
    Runner(sess, core_oracle(inst), PROMPT).run(max_steps=1)  # the good endpoint
    assert sess.threshold() is not None and sess.threshold().ram_bytes is not None
    thr = effective_threshold(sess)
    assert thr is not None and thr.ram_bytes is None
    assert thr.vram_bytes == int(1000 * 1024 * 1024 * 1.1)
