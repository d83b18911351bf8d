"""Install-state history: the store tables, reflog and Manager imports, which state a run ran
under, and the tracker that captures at start, on file events, on restarts and periodically."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from install_builder import Install, build_install, commit_files, git
from standin_repos import build_node_repo

from oom_sentinel.config.settings import InstallStateSettings
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.install.history import (
    InstallStateTracker,
    attribute_run,
    choose_run_as,
    current_state,
    import_manager_snapshots,
    import_reflog_history,
    list_states,
    load_state,
    observations,
    record_capture,
    record_observation,
    resolve_state_ref,
    restart_key,
    state_at,
    state_for_run,
)
from oom_sentinel.daemon.install.manager_snapshots import manager_states
from oom_sentinel.daemon.install.reflog import import_install_history
from oom_sentinel.daemon.install.state import (
    CoreState,
    CustomNode,
    InstallState,
    capture_install,
)
from oom_sentinel.daemon.store.db import Store

C1, C2, C3 = ("1" * 40, "2" * 40, "3" * 40)
N1, N2 = ("a" * 40, "b" * 40)


def state(core: str, node: str | None = N1, *, pip: tuple[str, ...] | None = None) -> InstallState:
    nodes = () if node is None else (CustomNode("pack", "git", commit=node, entry="pack"),)
    return InstallState(CoreState(commit=core), nodes, pip=pip)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "data") as s:
        yield s


# ---------------------------------------------------------------------------------------------
# The store


def test_an_identical_state_is_stored_once_and_a_capture_only_when_it_changes(
    store: Store,
) -> None:
    a, b = state(C1), state(C2)
    assert record_capture(store, "main", a, at_s=10.0)
    assert not record_capture(store, "main", state(C1), at_s=20.0)  # same id: nothing
    assert record_capture(store, "main", b, at_s=30.0)
    assert record_capture(store, "main", a, at_s=40.0)  # back to A: a new observation
    assert record_capture(store, "other", a, at_s=50.0)  # per instance
    assert [(o.state_id, o.at_s) for o in observations(store, instance="main")] == [
        (a.state_id, 10.0),
        (b.state_id, 30.0),
        (a.state_id, 40.0),
    ]
    rows = store.query("count", "SELECT count(*) FROM install_states")
    assert rows[0][0] == 2
    assert load_state(store, a.state_id) == a


@pytest.mark.parametrize(
    ("moment", "expected"),
    [(5.0, None), (10.0, "A"), (15.0, "A"), (20.0, "B"), (99.0, "B")],
    ids=["before-any", "at-first", "between", "at-second", "after"],
)
def test_state_at_is_the_last_observation_at_or_before_the_moment(
    store: Store, moment: float, expected: str | None
) -> None:
    states = {"A": state(C1), "B": state(C2)}
    record_capture(store, "main", states["A"], at_s=10.0)
    record_capture(store, "main", states["B"], at_s=20.0)
    found = state_at(store, "main", moment)
    assert (found[1].state_id if found else None) == (
        states[expected].state_id if expected else None
    )


def test_a_run_ran_under_the_state_its_process_started_with(store: Store) -> None:
    # ComfyUI started at 15 under A; the pack was pulled at 20 while it ran; it restarted at 30.
    a, b = state(C1, N1), state(C1, N2)
    record_capture(store, "main", a, at_s=10.0)
    record_capture(store, "main", b, at_s=20.0)
    during = state_for_run(store, "main", started_s=25.0, process_start_s=15.0)
    after = state_for_run(store, "main", started_s=35.0, process_start_s=30.0)
    unknown_process = state_for_run(store, "main", started_s=25.0, process_start_s=None)
    assert during is not None and during.state_id == a.state_id  # the old code still runs
    assert after is not None and after.state_id == b.state_id
    assert unknown_process is not None and unknown_process.state_id == b.state_id
    # a process older than anything recorded: the prompt's own start decides
    early = state_for_run(store, "main", started_s=12.0, process_start_s=1.0)
    assert early is not None and early.state_id == a.state_id
    assert state_for_run(store, "main", started_s=1.0, process_start_s=None) is None


def test_a_start_right_after_a_pull_is_attributed_to_the_pull_and_marked_ambiguous(
    store: Store,
) -> None:
    # A launcher pulls at 20.3 and starts ComfyUI at 20.6; psutil's start time is built from
    # a whole-second boot time and reads 0.9 s early: 19.7, before the pull.
    a, b = state(C1, N1), state(C1, N2)
    record_capture(store, "main", a, at_s=10.0)
    record_capture(store, "main", b, at_s=20.3)
    found = attribute_run(store, "main", started_s=21.0, process_start_s=19.7)
    assert found is not None and found.observation.state_id == b.state_id
    assert found.by == "process-start"
    assert found.ambiguous_with is not None and found.ambiguous_with.state_id == a.state_id
    info = found.to_json()
    assert info["ambiguous"] is True and info["other_state_id"] == a.state_id
    assert "ambiguous" in info["reason"]
    # a change well before the start, or well after it, is no ambiguity
    clear = attribute_run(store, "main", started_s=40.0, process_start_s=30.0)
    assert clear is not None and clear.observation.state_id == b.state_id
    assert clear.ambiguous_with is None
    running = attribute_run(store, "main", started_s=25.0, process_start_s=15.0)
    assert running is not None and running.observation.state_id == a.state_id
    assert running.ambiguous_with is None


def test_the_capture_a_restart_triggered_wins_over_any_clock(store: Store) -> None:
    a, b = state(C1, N1), state(C1, N2)
    record_capture(store, "main", a, at_s=10.0)
    record_capture(store, "main", b, at_s=20.3)
    # the daemon captured the install for the process that started at (psutil) 19.7
    record_observation(store, "main", b, at_s=21.5, source="capture", dedup_key=restart_key(19.7))
    found = attribute_run(store, "main", started_s=22.0, process_start_s=19.7)
    assert found is not None and found.by == "restart-capture"
    assert found.observation.state_id == b.state_id and found.ambiguous_with is None
    assert state_for_run(store, "main", started_s=22.0, process_start_s=19.7) == (found.observation)


def test_a_reconstructed_state_gives_way_to_the_capture_of_the_same_code(store: Store) -> None:
    rebuilt = state(C1)  # from the reflog: no pip
    captured = state(C1, pip=("torch==2.5.1",))
    assert rebuilt.state_id != captured.state_id
    record_observation(store, "main", rebuilt, at_s=10.0, source="reflog")
    record_capture(store, "main", captured, at_s=50.0)
    found = state_for_run(store, "main", started_s=60.0, process_start_s=20.0)
    assert found is not None and found.state_id == captured.state_id
    # ... but not across a change of code in between
    store2_state = state(C2)
    record_observation(store, "x", rebuilt, at_s=10.0, source="reflog")
    record_observation(store, "x", store2_state, at_s=30.0, source="reflog")
    record_capture(store, "x", captured, at_s=50.0)
    found = state_for_run(store, "x", started_s=60.0, process_start_s=20.0)
    assert found is not None and found.state_id == rebuilt.state_id


def test_manager_files_are_listed_but_never_decide_what_a_run_ran(store: Store) -> None:
    a, manager = state(C1), state(C2)
    record_capture(store, "main", a, at_s=10.0)
    record_observation(store, "main", manager, at_s=20.0, source="manager", dedup_key="m:1")
    assert current_state(store, "main")[1].state_id == a.state_id  # type: ignore[index]
    assert state_at(store, "main", 25.0)[1].state_id == a.state_id  # type: ignore[index]
    listed = {s.state_id: s for s in list_states(store)}
    assert listed[manager.state_id].sources == ("manager",)
    assert listed[a.state_id].current_for == ("main",)
    assert listed[manager.state_id].current_for == ()


def test_list_states_newest_first_with_instances_and_sources(store: Store) -> None:
    a, b = state(C1), state(C2, pip=("x==1",))
    record_observation(store, "main", a, at_s=5.0, source="reflog")
    record_capture(store, "main", a, at_s=10.0)
    record_capture(store, "main", b, at_s=20.0)
    record_capture(store, "side", a, at_s=30.0)
    listing = list_states(store)
    assert [s.state_id for s in listing] == [a.state_id, b.state_id]  # a seen last at 30
    first = listing[0]
    assert first.instances == ("main", "side") and first.sources == ("capture", "reflog")
    assert (first.first_at_s, first.last_at_s) == (5.0, 30.0)
    assert first.current_for == ("side",) and listing[1].current_for == ("main",)
    assert listing[1].has_pip and not first.has_pip
    only_main = list_states(store, instance="main")
    assert {s.state_id for s in only_main} == {a.state_id, b.state_id}
    assert json.loads(json.dumps([s.to_json() for s in listing]))[0]["observed_by"] == [
        "capture",
        "reflog",
    ]


@pytest.mark.parametrize(
    ("ref", "error"),
    [
        ("zz", "not a state id"),
        ("ab", "not a state id"),
        ("ffff", "no install state 'ffff'"),
        ("SHARED", "matches several"),
    ],
    ids=["not-hex", "too-short", "unknown", "ambiguous"],
)
def test_bad_state_references_are_one_line_errors(store: Store, ref: str, error: str) -> None:
    # two states whose ids share their first 4 digits (found by trying), and one more
    seen: dict[str, InstallState] = {}
    i = 0
    while True:
        s = state(f"{i:040x}")
        if s.state_id[:4] in seen:
            break
        seen[s.state_id[:4]] = s
        i += 1
    shared = s.state_id[:4]
    ids = [s.state_id, seen[shared].state_id]
    for n, member in enumerate((s, seen[shared], state(C3))):
        record_capture(store, f"i{n}", member, at_s=1.0)
    with pytest.raises(InputError, match=error):
        resolve_state_ref(store, shared if ref == "SHARED" else ref)
    assert resolve_state_ref(store, ids[0][:12].upper()) == ids[0]


# ---------------------------------------------------------------------------------------------
# Importing the past


@pytest.fixture
def pulled(tmp_path: Path) -> Install:
    """An install whose ComfyUI-Foo pack was updated with `git pull` before the daemon came."""
    inst = build_install(tmp_path / "pulled")
    up = inst.upstreams["ComfyUI-Foo"]
    for i in (4, 5):
        inst.shas["ComfyUI-Foo"].append(
            commit_files(up, {"nodes.py": f"V = {i}\n"}, f"ComfyUI-Foo {i}", inst.clock.tick())
        )
    git(inst.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only", at=inst.clock.tick())
    return inst


def test_reflog_history_becomes_earlier_observations_and_reimporting_adds_nothing(
    store: Store, pulled: Install
) -> None:
    now = capture_install(pulled.root)
    history = import_install_history(pulled.root, now)
    added = import_reflog_history(store, "main", history)
    assert added == len(history) >= 3
    assert import_reflog_history(store, "main", import_install_history(pulled.root, now)) == 0
    # the state before the last pull is there, at the moment the pull happened
    foo = pulled.shas["ComfyUI-Foo"]
    pull_at = next(h.at_epoch_s for h in history if h.move and h.move.action == "pull")
    assert pull_at is not None
    before = state_at(store, "main", pull_at - 1)
    after = state_at(store, "main", pull_at)
    assert before is not None and before[1].node_table()["ComfyUI-Foo"].commit == foo[2]
    assert after is not None and after[1].node_table()["ComfyUI-Foo"].commit == foo[4]
    assert after[0].source == "reflog" and after[0].detail.startswith(  # type: ignore[union-attr]
        "custom_nodes/ComfyUI-Foo: pull"
    )
    # a later pull adds exactly its own moment
    up = pulled.upstreams["ComfyUI-Foo"]
    commit_files(up, {"nodes.py": "V = 6\n"}, "ComfyUI-Foo 6", pulled.clock.tick())
    git(pulled.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only", at=pulled.clock.tick())
    again = import_install_history(pulled.root, capture_install(pulled.root))
    assert import_reflog_history(store, "main", again) == 1


def test_manager_snapshot_files_are_imported_once_each(store: Store, pulled: Install) -> None:
    folder = pulled.root / "user" / "__manager" / "snapshots"
    folder.mkdir(parents=True)
    foo = pulled.shas["ComfyUI-Foo"]
    doc = {
        "comfyui": pulled.shas["ComfyUI"][1],
        "git_custom_nodes": {
            "https://github.com/someone/ComfyUI-Foo.git": {"hash": foo[2] + "\n", "disabled": False}
        },
        "cnr_custom_nodes": {},
        "file_custom_nodes": [],
        "pips": {},
    }
    (folder / "2024-01-02_10-11-12_autosave.json").write_text(json.dumps(doc))
    (folder / "2024-01-03_10-11-12_snapshot.json").write_text("{broken")
    assert import_manager_snapshots(store, "main", manager_states(pulled.root)) == 1
    assert import_manager_snapshots(store, "main", manager_states(pulled.root)) == 0
    (obs,) = observations(store, instance="main", sources=("manager",))
    assert obs.detail is not None and obs.detail.endswith("2024-01-02_10-11-12_autosave.json")
    loaded = load_state(store, obs.state_id)
    assert loaded is not None and loaded.node_table()["ComfyUI-Foo"].commit == foo[2]


def test_run_as_is_the_install_owner_only_when_root() -> None:
    assert choose_run_as(0, 1000, 1000) == (1000, 1000)
    assert choose_run_as(0, 0, 0) is None  # root's own install
    assert choose_run_as(1000, 1000, 1000) is None
    assert choose_run_as(1000, 2000, 2000) is None  # not root: cannot, and need not
    assert choose_run_as(None, 1000, 1000) is None  # Windows


# ---------------------------------------------------------------------------------------------
# The tracker


@dataclass
class Inst:
    name: str
    path: str | None
    python: str | None = None
    pid: int | None = None
    process: Any = None


def counting_python(tmp_path: Path) -> tuple[Path, Path]:
    """A real interpreter behind a wrapper that appends one line per run (uid and first argument)."""
    log = tmp_path / "python-runs.log"
    log.touch()
    log.chmod(0o666)
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f'#!/bin/sh\necho "$(id -u) $1" >> {log}\nexec {sys.executable} "$@"\n', encoding="utf-8"
    )
    wrapper.chmod(0o755)
    return wrapper, log


def runs_of(log: Path) -> list[str]:
    return log.read_text().splitlines()


def settings(**kw: object) -> InstallStateSettings:
    return InstallStateSettings(**{"debounce_ms": 100, **kw})  # type: ignore[arg-type]


def wait(predicate: object, timeout_s: float = 30.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def tracker_factory(store: Store) -> Iterator[object]:
    made: list[InstallStateTracker] = []

    def make(**kw: object) -> InstallStateTracker:
        use_observer = bool(kw.pop("use_observer", True))
        euid = kw.pop("euid", None)
        t = InstallStateTracker(
            store,
            settings(**kw),
            use_observer=use_observer,
            euid=euid,  # type: ignore[arg-type]
        )
        t.start()
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def test_start_capture_asks_the_interpreter_and_imports_the_reflog(
    tmp_path: Path, store: Store, pulled: Install, tracker_factory: object
) -> None:
    python, log = counting_python(tmp_path)
    tracker: InstallStateTracker = tracker_factory()  # type: ignore[operator]
    tracker.update([Inst("main", str(pulled.root), str(python), pid=None)])
    assert tracker.settle("main", 60, everything=True)
    obs, current = current_state(store, "main")  # type: ignore[misc]
    assert obs.source == "capture" and obs.detail == "start"
    assert current.pip is not None and current.interpreter is not None
    assert current.interpreter.executable == str(python)
    assert len(runs_of(log)) == 2  # the facts script and pip freeze
    assert {o.source for o in observations(store, instance="main")} == {"capture", "reflog"}
    # an URL-only instance has no install to read and is not tracked
    tracker.update([Inst("remote", None)])
    assert not tracker.tracks("remote")


def test_a_git_pull_in_a_node_is_captured_from_its_file_events_without_the_interpreter(
    tmp_path: Path, store: Store, pulled: Install, tracker_factory: object
) -> None:
    python, log = counting_python(tmp_path)
    tracker: InstallStateTracker = tracker_factory()  # type: ignore[operator]
    tracker.update([Inst("main", str(pulled.root), str(python))])
    assert tracker.settle("main", 60, everything=True)
    _, before = current_state(store, "main")  # type: ignore[misc]
    up = pulled.upstreams["ComfyUI-Foo"]
    new = commit_files(up, {"nodes.py": "V = 9\n"}, "ComfyUI-Foo 9", pulled.clock.tick())
    changed_from = time.time()
    git(pulled.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only")  # real time
    changed_to = time.time()

    def moved() -> tuple[object, InstallState] | None:
        found = current_state(store, "main")
        return found if found and found[1].state_id != before.state_id else None

    obs, after = wait(moved)  # type: ignore[misc]
    assert after.node_table()["ComfyUI-Foo"].commit == new
    assert obs.detail == "file change"
    assert changed_from <= obs.at_s <= changed_to + 1.0  # dated from the first event
    assert after.pip == before.pip and after.interpreter == before.interpreter  # carried over
    assert len(runs_of(log)) == 2  # the interpreter was not run again
    # a file that does not matter (a node's README) changes nothing
    captures = tracker.captures
    (pulled.custom_nodes / "ComfyUI-Foo" / "README.md").write_text("edited\n")
    time.sleep(0.5)
    assert tracker.captures == captures


def test_settle_records_an_announced_change_without_waiting_out_the_debounce(
    store: Store, pulled: Install, tracker_factory: object
) -> None:
    # A snapshot written seconds after a pull must see the new state: settle() cuts the
    # (here: one minute) debounce short.
    tracker: InstallStateTracker = tracker_factory(  # type: ignore[operator]
        probe_interpreter=False, debounce_ms=60_000
    )
    tracker.update([Inst("main", str(pulled.root))])
    assert tracker.settle("main", 60, everything=True)
    old = pulled.shas["ComfyUI-Foo"][0]
    git(pulled.custom_nodes / "ComfyUI-Foo", "checkout", "-q", old)
    wait(lambda: tracker.change_pending("main"))
    assert tracker.settle("main", 20)
    assert not tracker.change_pending("main")
    _, now = current_state(store, "main")  # type: ignore[misc]
    assert now.node_table()["ComfyUI-Foo"].commit == old


def test_events_arriving_during_settle_do_not_restart_the_debounce(
    store: Store, pulled: Install, tracker_factory: object
) -> None:
    # A checkout's events trail in over a moment (logs/HEAD, then the HEAD rename); one that
    # lands after settle() cut the debounce short must not push the capture a minute out.
    tracker: InstallStateTracker = tracker_factory(  # type: ignore[operator]
        probe_interpreter=False, debounce_ms=60_000
    )
    tracker.update([Inst("main", str(pulled.root))])
    assert tracker.settle("main", 60, everything=True)
    node = pulled.custom_nodes / "ComfyUI-Foo"
    old = pulled.shas["ComfyUI-Foo"][0]
    git(node, "checkout", "-q", old)
    head = str(node / ".git" / "HEAD")
    wait(lambda: tracker.change_pending("main"))

    def trailing_events() -> None:
        for _ in range(30):
            tracker.on_path_event([head])
            time.sleep(0.01)

    burst = threading.Thread(target=trailing_events)
    burst.start()
    t0 = time.monotonic()
    try:
        settled = tracker.settle("main", 15)
    finally:
        burst.join()
    assert settled, "settle() gave up: a trailing event re-armed the one-minute debounce"
    assert time.monotonic() - t0 < 15
    assert tracker.settle("main", 15)  # whatever the burst's last event announced
    _, now = current_state(store, "main")  # type: ignore[misc]
    assert now.node_table()["ComfyUI-Foo"].commit == old


def test_a_new_node_folder_and_a_disabled_one_are_noticed(
    store: Store, pulled: Install, tracker_factory: object
) -> None:
    tracker: InstallStateTracker = tracker_factory(probe_interpreter=False)  # type: ignore[operator]
    tracker.update([Inst("main", str(pulled.root))])
    assert tracker.settle("main", 60, everything=True)
    cn = pulled.custom_nodes
    node = build_node_repo(cn.parent.parent / "new-pack-upstream", 3, pack_name="new-pack")
    shutil.copytree(node.path, cn / "new-pack")
    wait(lambda: "new-pack" in current_state(store, "main")[1].node_table())  # type: ignore[index]
    os.rename(cn / "ComfyUI-Foo", cn / "ComfyUI-Foo.disabled")
    wait(lambda: current_state(store, "main")[1].node("ComfyUI-Foo").disabled)  # type: ignore[index,union-attr]


def test_a_restarted_daemon_adds_nothing_for_an_unchanged_install(
    store: Store, pulled: Install, tracker_factory: object
) -> None:
    seen: list[list[tuple[str, float, str]]] = []
    for _start in range(2):
        tracker: InstallStateTracker = tracker_factory(probe_interpreter=False)  # type: ignore[operator]
        tracker.update([Inst("main", str(pulled.root))])
        assert tracker.settle("main", 60, everything=True)
        tracker.close()
        seen.append([(o.source, o.at_s, o.state_id) for o in observations(store, instance="main")])
    assert seen[0] == seen[1]
    assert [source for source, _at, _id in seen[1]].count("capture") == 1


def test_a_comfyui_restart_asks_the_interpreter_again(
    tmp_path: Path, store: Store, pulled: Install, tracker_factory: object
) -> None:
    python, log = counting_python(tmp_path)
    tracker: InstallStateTracker = tracker_factory()  # type: ignore[operator]
    tracker.update([Inst("main", str(pulled.root), str(python), pid=100)])
    assert tracker.settle("main", 60, everything=True)
    tracker.update([Inst("main", str(pulled.root), str(python), pid=100)])  # same process
    assert tracker.settle("main", 60, everything=True) and len(runs_of(log)) == 2
    tracker.update([Inst("main", str(pulled.root), str(python), pid=None)])  # it stopped
    tracker.update([Inst("main", str(pulled.root), str(python), pid=200)])  # and restarted
    wait(lambda: len(runs_of(log)) == 4)
    assert tracker.settle("main", 60, everything=True)


def test_a_restart_capture_is_recorded_for_its_process_even_when_nothing_changed(
    store: Store, pulled: Install, tracker_factory: object
) -> None:
    tracker: InstallStateTracker = tracker_factory()  # type: ignore[operator]
    started = Process(pid=100, create_time_s=1000.0)
    tracker.update([Inst("main", str(pulled.root), pid=100, process=started)])
    assert tracker.settle("main", 60, everything=True)
    before = observations(store, instance="main", sources=("capture",))
    restarted = Process(pid=200, create_time_s=2000.25)
    tracker.update([Inst("main", str(pulled.root), pid=200, process=restarted)])
    # settle() waits for the capture that says what the new process loaded
    assert tracker.settle("main", 60)
    after = observations(store, instance="main", sources=("capture",))
    assert len(after) == len(before) + 1 and after[-1].state_id == before[-1].state_id
    assert after[-1].detail == "ComfyUI started (pid 200)"
    found = attribute_run(store, "main", started_s=2001.0, process_start_s=2000.25)
    assert found is not None and found.by == "restart-capture"
    # the first process was running before the daemon: its capture is no restart capture
    rows = store.query(
        "count",
        "SELECT count(*) FROM state_observations WHERE dedup_key = ?",
        (restart_key(1000.0),),
    )
    assert rows[0][0] == 0


@dataclass
class Process:
    pid: int
    create_time_s: float


def test_periodic_capture_finds_what_file_events_missed(
    store: Store, pulled: Install, tracker_factory: object
) -> None:
    tracker: InstallStateTracker = tracker_factory(  # type: ignore[operator]
        use_observer=False, probe_interpreter=False
    )
    tracker.update([Inst("main", str(pulled.root))])
    assert tracker.settle("main", 60, everything=True)
    first = tracker.captures
    git(pulled.custom_nodes / "ComfyUI-Foo", "checkout", "-q", pulled.shas["ComfyUI-Foo"][0])
    time.sleep(0.5)
    assert tracker.captures == first  # no observer: nothing noticed yet
    tracker.request_all()
    wait(lambda: tracker.captures > first)
    assert tracker.settle("main", 60, everything=True)
    _, now = current_state(store, "main")  # type: ignore[misc]
    assert now.node_table()["ComfyUI-Foo"].commit == pulled.shas["ComfyUI-Foo"][0]


def test_a_path_that_is_not_an_install_is_reported_once_and_does_not_block(
    tmp_path: Path, store: Store, tracker_factory: object, caplog: pytest.LogCaptureFixture
) -> None:
    tracker: InstallStateTracker = tracker_factory(probe_interpreter=False)  # type: ignore[operator]
    (tmp_path / "empty").mkdir()
    tracker.update([Inst("ghost", str(tmp_path / "empty"))])
    assert tracker.settle("ghost", 30, everything=True)
    tracker.request_all()
    assert tracker.settle("ghost", 30, everything=True)
    assert current_state(store, "ghost") is None
    assert sum("not a ComfyUI install" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_as_root_the_interpreter_runs_as_the_owner_of_the_install(
    tmp_path: Path, store: Store, pulled: Install, tracker_factory: object
) -> None:
    python, log = counting_python(tmp_path)
    nobody = 65534
    os.chown(pulled.root, nobody, nobody)
    for parent in (tmp_path, *tmp_path.parents):  # let nobody reach the wrapper
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
    tracker: InstallStateTracker = tracker_factory(euid=0)  # type: ignore[operator]
    tracker.update([Inst("main", str(pulled.root), str(python))])
    assert tracker.settle("main", 60, everything=True)
    uids = {line.split()[0] for line in runs_of(log)}
    assert uids == {str(nobody)}
