"""The session on disk (session.py): creation, the append-only log, resume, replay, manual
marks, the outcome cache and reset — against a real install and real files."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from bisect_git import session_paths, untouched_install

from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.plan import Culprit, Found, Test
from oom_sentinel.bisect.search.verdict import (
    Ok,
    Oom,
    Outcome,
    Skip,
    Terms,
    Threshold,
    Timeout,
    Verdict,
)
from oom_sentinel.bisect.session.files import (
    BisectPaths,
    OutcomeCache,
    Session,
    begin,
    bisect_home,
    parse_log,
    reset_paths,
)
from oom_sentinel.bisect.state.states import State, scan_install
from oom_sentinel.daemon.core.errors import (
    BadRef,
    BisectError,
    ConfigError,
    InputError,
    NotBisecting,
)

MIB = 1024 * 1024
PROMPT = {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512}}}


inst = untouched_install("session", "a session command")


paths = session_paths()


def start(paths: BisectPaths, inst, **kw) -> Session:
    kw.setdefault("prompt", PROMPT)
    return begin(paths, scan_install(inst.root), "comfyui=v-first", "comfyui=HEAD", **kw)


def core_oracle(inst, first_bad: int) -> Callable[[State], list[Outcome]]:
    def measure(state: State) -> list[Outcome]:
        i = inst.core.index(state.comfyui)
        if i >= first_bad:
            return [Oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")]
        return [Ok(peak_vram_bytes=(1000 + i) * MIB, peak_ram_bytes=500 * MIB)]

    return measure


def drive(sess: Session, measure: Callable[[State], list[Outcome]], limit: int = 100) -> int:
    """What the front end does per step (minus starting ComfyUI): expected, measure, record."""
    from oom_sentinel.bisect.search.verdict import decide

    for n in range(limit):
        step = sess.next_step()
        if not isinstance(step, Test):
            return n
        sess.set_expected(step.state)
        runs = measure(step.state)
        threshold = sess.threshold() or Threshold.oom_only()
        verdict = decide(runs, threshold, sess.setup.repeat)
        assert verdict is not None
        sess.record(step.state, verdict, runs, comment=f"subject of {step.state.comfyui[:7]}")
    raise AssertionError("did not finish")


# ---------------------------------------------------------------------- creation


def test_the_session_lives_under_the_cache_dir_never_in_the_repo(
    inst, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("OOM_SENTINEL_CACHE_DIR", str(tmp_path / "c"))
    assert bisect_home() == tmp_path / "c" / "bisect"
    p = BisectPaths.for_install(inst.root)
    assert p.root.parent == tmp_path / "c" / "bisect"
    assert p.session.parent == p.workspace.parent == p.root
    assert not str(p.root).startswith(str(inst.root))
    assert BisectPaths.for_install(inst.root) == p  # stable per install


@pytest.mark.parametrize(
    ("good", "bad", "error", "message"),
    [
        ("comfyui=v9", "comfyui=HEAD", BadRef, "'v9' is not a commit"),
        (
            "comfyui=v-first",
            "node:node_a=nope",
            BadRef,
            "custom_nodes/node_a: 'nope' is not a commit",
        ),
        ("node:ghost=HEAD", "comfyui=HEAD", BadRef, "custom_nodes/ghost: no such custom node"),
        ("comfyui=HEAD", "comfyui=HEAD", BisectError, "the good and bad states are the same"),
        ("snapshot-that-does-not-exist", "comfyui=HEAD", BadRef, "is not a state"),
    ],
    ids=["junk-core-ref", "junk-node-ref", "unknown-node", "same-states", "unknown-word"],
)
def test_junk_ref_leaves_no_session_state(paths, inst, good, bad, error, message) -> None:
    with pytest.raises(error, match=message):
        begin(paths, scan_install(inst.root), good, bad, prompt=PROMPT)
    assert not paths.root.exists()
    with pytest.raises(NotBisecting):
        Session.open(paths)


def test_a_bad_repeat_count_is_refused_before_anything_is_written(paths, inst) -> None:
    with pytest.raises(ConfigError, match="--repeat must be at least 1"):
        start(paths, inst, repeat=0)
    assert not paths.root.exists()


def test_a_second_session_on_the_same_install_is_refused(paths, inst) -> None:
    first = start(paths, inst)
    log_before = first.log_text()
    with pytest.raises(BisectError, match="already in progress"):
        start(paths, inst)
    assert Session.open(paths).log_text() == log_before


def test_session_files_and_setup(paths, inst) -> None:
    sess = start(paths, inst, flags=["--lowvram"], terms=Terms("fits", "ooms"), repeat=3)
    names = sorted(p.name for p in paths.session.iterdir())
    assert names == ["log", "prompt.json", "session.json", "started"]
    setup = Session.open(paths).setup
    assert setup.repos() == ["comfyui"]
    assert setup.spans[0].commits == tuple(inst.core[1:])
    assert setup.good == State.of(inst.core[0], dict(sess.setup.good.nodes))
    assert setup.terms == Terms("fits", "ooms") and setup.repeat == 3
    assert setup.flags == ("--lowvram",) and setup.created_at
    assert Session.open(paths).prompt() == PROMPT
    assert (paths.session / "log").read_text().startswith("# oom-bisect log, format 1")
    assert not list(paths.root.glob("session.tmp-*"))


def test_node_changes_become_spans(paths, inst) -> None:
    install = scan_install(inst.root)
    sess = begin(
        paths,
        install,
        "comfyui=v-mid node:node_a=HEAD~5 node:node_b=absent",
        "comfyui=HEAD",
        prompt=PROMPT,
    )
    spans = {s.repo: s for s in sess.setup.spans}
    assert list(spans) == ["comfyui", "node:node_a", "node:node_b"]
    assert spans["node:node_a"].commits == tuple(inst.nodes["node_a"][-5:])
    assert spans["node:node_b"].commits == (inst.nodes["node_b"][-1],)  # added: one step
    assert sess.setup.repo_paths["node:node_a"] == str(inst.custom_nodes / "node_a")


# ---------------------------------------------------------------------- running and resuming


def test_a_whole_run_finds_the_culprit_and_logs_every_verdict(paths, inst) -> None:
    sess = start(paths, inst, terms=Terms("fits", "ooms"))
    n = drive(sess, core_oracle(inst, 17))
    step = sess.next_step()
    assert step == Found((Culprit("comfyui", inst.core[17], inst.core[16]),))
    assert n <= 2 + 5  # endpoints + ⌈log2 29⌉
    recs = sess.records()
    assert len(recs) == n
    assert recs[0].state == sess.setup.good and recs[0].verdict is Verdict.OLD
    assert recs[0].peak_vram_bytes == 1000 * MIB and recs[0].outcome == "ok"
    assert recs[1].state == sess.setup.bad and recs[1].outcome == "oom"
    assert "CUDA out of memory" in (recs[1].reason or "")
    lines = [line for line in sess.log_text().splitlines() if not line.startswith("#")]
    assert lines[0].startswith(f"fits comfyui={inst.core[0]} outcome=ok peak_vram_mib=1000.0")
    assert lines[0].endswith(f"# subject of {inst.core[0][:7]}")
    assert lines[1].startswith(f"ooms comfyui={inst.core[-1]} outcome=oom")
    assert not (paths.session / "expected").exists()


def test_resume_after_a_crash_measures_the_expected_state_again(paths, inst) -> None:
    sess = start(paths, inst)
    measure = core_oracle(inst, 11)
    for _ in range(3):
        step = sess.next_step()
        assert isinstance(step, Test)
        runs = measure(step.state)
        sess.record(step.state, Verdict.NEW if isinstance(runs[0], Oom) else Verdict.OLD, runs)
    step = sess.next_step()
    assert isinstance(step, Test)
    sess.set_expected(step.state)
    # -- the process dies here, mid-measurement --
    resumed = Session.open(paths)
    assert resumed.expected() == step.state
    assert resumed.next_step() == step
    assert resumed.progress().tested == 3
    drive(resumed, measure)
    assert resumed.next_step() == Found((Culprit("comfyui", inst.core[11], inst.core[10]),))


def test_a_torn_last_log_line_is_ignored_and_cut_before_the_next_append(paths, inst) -> None:
    sess = start(paths, inst)
    good = sess.setup.good
    sess.record(good, Verdict.OLD, [Ok(peak_vram_bytes=1000 * MIB)])
    log = paths.session / "log"
    with log.open("ab") as fh:
        fh.write(f"bad comfyui={inst.core[-1]} outc".encode())  # crash mid-append
    assert [r.state for r in sess.records()] == [good]
    assert not sess.log_text().endswith("outc")
    sess.record(sess.setup.bad, Verdict.NEW, [Oom("CUDA out of memory")])
    text = log.read_text()
    assert "outc\n" not in text and "outcbad" not in text
    assert [r.verdict for r in sess.records()] == [Verdict.OLD, Verdict.NEW]


def test_the_threshold_comes_from_the_good_endpoint_in_the_log(paths, inst) -> None:
    sess = start(paths, inst)
    assert sess.threshold() is None
    sess.record(
        sess.setup.good, Verdict.OLD, [Ok(1000 * MIB, 200 * MIB), Ok(1100 * MIB, 300 * MIB)]
    )
    t = sess.threshold()
    assert t is not None
    assert t.vram_bytes == int(1000 * MIB * 1.1) and t.ram_bytes == int(200 * MIB * 1.1)
    assert Session.open(paths).threshold() == t  # the same after a resume


def test_an_explicit_budget_is_the_threshold_from_the_start(tmp_path, inst) -> None:
    p = BisectPaths.for_install(inst.root, home=tmp_path / "h")
    sess = start(p, inst, budget=Threshold(vram_bytes=8 * 1024 * MIB))
    assert sess.threshold() == Threshold(vram_bytes=8 * 1024 * MIB)
    assert Session.open(p).setup.budget == Threshold(vram_bytes=8 * 1024 * MIB)


def test_skips_and_timeouts_are_logged_with_their_reason(paths, inst) -> None:
    sess = start(paths, inst)
    s = State.of(inst.core[3], dict(sess.setup.good.nodes))
    rec = sess.record(s, Verdict.SKIP, [Skip("ComfyUI did not start: ImportError: no module x")])
    assert rec.outcome == "skip" and rec.reason and "ImportError" in rec.reason
    t = State.of(inst.core[4], dict(sess.setup.good.nodes))
    assert sess.record(t, Verdict.SKIP, [Timeout(600.0)]).outcome == "timeout"
    again = sess.records()
    assert [r.outcome for r in again] == ["skip", "timeout"]
    assert again[0].reason == "ComfyUI did not start: ImportError: no module x"


def test_status_says_what_is_known_and_what_is_left(paths, inst) -> None:
    sess = start(paths, inst)
    drive_steps = 3
    measure = core_oracle(inst, 20)
    for _ in range(drive_steps):
        step = sess.next_step()
        assert isinstance(step, Test)
        runs = measure(step.state)
        sess.record(step.state, Verdict.NEW if isinstance(runs[0], Oom) else Verdict.OLD, runs)
    st = sess.status()
    assert st.progress.tested == 3 and st.progress.phase == "bisect"
    assert st.progress.candidates_left is not None and st.progress.candidates_left < 29
    assert isinstance(st.step, Test) and len(st.records) == 3
    text = "\n".join(st.lines())
    assert "tested 3 state(s); phase bisect" in text
    assert "candidate(s) left" in text and "next: comfyui=" in text


# ---------------------------------------------------------------------- manual marks and replay


def test_manual_marks_go_to_the_expected_or_next_state(paths, inst) -> None:
    sess = start(paths, inst, terms=Terms("fits", "ooms"))
    rec = sess.mark("fits")  # no measurement running: the next state (the good endpoint)
    assert rec.state == sess.setup.good and rec.verdict is Verdict.OLD and rec.outcome == "manual"
    nxt = sess.next_step()
    assert isinstance(nxt, Test)
    sess.set_expected(nxt.state)
    assert sess.mark("new").state == nxt.state  # the neutral words always work
    with pytest.raises(ConfigError, match="'bad' is not a verdict here: use fits, ooms or skip"):
        sess.mark("bad")
    with pytest.raises(BisectError, match="custom_nodes/node_a is not one of the repos"):
        sess.mark("skip", sess.setup.good.with_values({"node:node_a": "absent"}))


def test_marking_after_the_end_is_refused(paths, inst) -> None:
    sess = start(paths, inst)
    drive(sess, core_oracle(inst, 5))
    with pytest.raises(BisectError, match="nothing to mark"):
        sess.mark("bad")


def test_replay_of_an_edited_log_rebuilds_the_same_session(paths, inst, tmp_path) -> None:
    sess = start(paths, inst)
    drive(sess, core_oracle(inst, 9))
    lines = sess.log_text().splitlines()
    verdicts = [i for i, line in enumerate(lines) if not line.startswith("#")]
    # undo the last two answers, and abbreviate an id as a person would
    edited = [line for i, line in enumerate(lines) if i not in verdicts[-2:]]
    edited[verdicts[2]] = edited[verdicts[2]].replace(inst.core[-1], inst.core[-1][:10])
    logfile = tmp_path / "edited.log"
    logfile.write_text("\n".join(edited) + "\n")
    assert sess.replay(logfile) == len(verdicts) - 2
    assert len(sess.records()) == len(verdicts) - 2
    drive(sess, core_oracle(inst, 9))
    assert sess.next_step() == Found((Culprit("comfyui", inst.core[9], inst.core[8]),))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("maybe comfyui={c}", "'maybe' is not a verdict"),
        ("bad node:node_a={c}", "custom_nodes/node_a is not one of the repos"),
        ("bad outcome=ok", "no value for ComfyUI"),
        ("bad comfyui=ffff", "'ffff' is not a value this bisect tests"),
        ("bad comfyui={c} stray", "'stray' is not KEY=VALUE"),
        ("bad comfyui={c} peak_vram_mib=lots", "could not convert"),
        ("bad comfyui='{c}", "cannot parse line"),
    ],
    ids=[
        "verdict",
        "foreign-repo",
        "missing-repo",
        "unknown-commit",
        "stray-word",
        "number",
        "quote",
    ],
)
def test_replay_refuses_a_bad_log_and_changes_nothing(paths, inst, tmp_path, line, message) -> None:
    sess = start(paths, inst)
    sess.record(sess.setup.good, Verdict.OLD, [Ok(peak_vram_bytes=MIB)])
    before = (paths.session / "log").read_bytes()
    logfile = tmp_path / "bad.log"
    logfile.write_text(f"# comment\ngood comfyui={inst.core[0]}\n{line.format(c=inst.core[3])}\n")
    with pytest.raises(InputError) as err:
        sess.replay(logfile)
    assert str(err.value).startswith(f"{logfile}:3: ")
    assert message in str(err.value)
    assert (paths.session / "log").read_bytes() == before


def test_log_values_can_be_abbreviated_only_when_unambiguous(paths, inst) -> None:
    sess = start(paths, inst)
    text = f"bad comfyui={inst.core[5][:8]}\n"
    assert parse_log(text, sess.setup, "x")[0].state.comfyui == inst.core[5]


# ---------------------------------------------------------------------- cache


@pytest.mark.parametrize(
    "runs",
    [
        [Ok(1, 2, 3.5, False)],
        [Ok(None, None), Ok(5, None, None, True)],
        [Oom("CUDA out of memory", "gpu", 7, None)],
        [Skip("invalid prompt"), Timeout(600.0, 9, 10)],
    ],
    ids=["ok", "partial", "oom", "skip-timeout"],
)
def test_outcome_cache_round_trips(tmp_path, runs) -> None:
    cache = OutcomeCache(tmp_path / "outcomes")
    key = OutcomeCache.key(State.of("a" * 40), "w" * 64, ["--lowvram"], None)
    assert cache.get(key) == []
    cache.put(key, runs)
    assert cache.get(key) == runs


def test_cache_keys_separate_state_workflow_flags_budget_and_environment() -> None:
    s, t = State.of("a" * 40), State.of("b" * 40)
    base = OutcomeCache.key(s, "w", ["--lowvram"], None)
    assert base == OutcomeCache.key(s, "w", ["--lowvram"], None)
    others = {
        OutcomeCache.key(t, "w", ["--lowvram"], None),
        OutcomeCache.key(s, "v", ["--lowvram"], None),
        OutcomeCache.key(s, "w", [], None),
        OutcomeCache.key(s, "w", ["--lowvram"], Threshold(vram_bytes=1)),
        OutcomeCache.key(s, "w", ["--lowvram"], None, {"gpu": "RTX 4090"}),
    }
    assert base not in others and len(others) == 5


def test_a_damaged_cache_entry_means_measure_again(tmp_path) -> None:
    cache = OutcomeCache(tmp_path)
    key = OutcomeCache.key(State.of("a" * 40), "w", [], None)
    cache.put(key, [Ok(1, 2)])
    (tmp_path / key[:2] / f"{key}.json").write_text("{torn")
    assert cache.get(key) == []


def test_the_cache_survives_a_reset(paths, inst) -> None:
    sess = start(paths, inst)
    sess.store_runs(sess.setup.good, [Ok(123, 456)])
    sess.reset()
    again = start(paths, inst)
    assert again.cached_runs(again.setup.good) == [Ok(123, 456)]
    assert again.cached_runs(again.setup.bad) == []


# ---------------------------------------------------------------------- reset and locking


def test_reset_removes_workspace_and_session_and_leaves_the_user_repos_alone(paths, inst) -> None:
    sess = start(paths, inst)
    ws = Workspace.create(paths.workspace, scan_install(inst.root))
    ws.switch(sess.setup.good)
    sess.record(sess.setup.good, Verdict.OLD, [Ok(1, 1)])
    sess.reset()
    assert not paths.session.exists() and not paths.workspace.exists()
    assert not Session.exists(paths)
    with pytest.raises(NotBisecting):
        reset_paths(paths)
    with pytest.raises(NotBisecting):
        Session.open(paths)


def test_an_interrupted_reset_keeps_started_and_can_be_run_again(paths, inst, monkeypatch) -> None:
    import oom_sentinel.bisect.session.files as session_mod

    start(paths, inst)
    real = session_mod.remove_tree

    def interrupted(p: Path) -> None:
        if p.name == "log":
            raise KeyboardInterrupt
        real(p)

    monkeypatch.setattr(session_mod, "remove_tree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reset_paths(paths)
    assert (paths.session / "started").exists() and Session.exists(paths)
    monkeypatch.setattr(session_mod, "remove_tree", real)
    reset_paths(paths)
    assert not paths.session.exists()


def test_a_session_dir_without_started_is_no_session_and_is_cleaned_by_the_next_start(
    paths, inst
) -> None:
    start(paths, inst)
    (paths.session / "started").unlink()  # what a reset interrupted just after that leaves
    with pytest.raises(NotBisecting):
        Session.open(paths)
    sess = start(paths, inst)
    assert Session.exists(paths) and sess.records() == []


def test_another_process_holding_the_session_blocks_changes(paths, inst) -> None:
    sess = start(paths, inst)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path;"
            "from oom_sentinel.bisect.session.fsutil import FileLock;"
            "l = FileLock(Path(sys.argv[1]), 'x'); l.acquire(); print('held', flush=True);"
            "sys.stdin.read()",
            str(paths.lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(BisectError, match="in use by another oom-bisect process"):
            sess.record(sess.setup.good, Verdict.OLD, [Ok(1, 1)])
        with pytest.raises(BisectError, match="in use"):
            reset_paths(paths)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    sess.record(sess.setup.good, Verdict.OLD, [Ok(1, 1)])  # free again
    assert len(sess.records()) == 1


def test_session_json_is_plain_json_with_a_format(paths, inst) -> None:
    start(paths, inst)
    data = json.loads((paths.session / "session.json").read_text())
    assert data["format"] == 1 and data["terms"] == {"old": "good", "new": "bad"}
    assert len(data["workflow_sha256"]) == 64
