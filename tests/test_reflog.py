"""Earlier install states from git reflogs and the Windows updater's backup branches."""

from __future__ import annotations

import itertools
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from install_builder import Install, build_install, commit_files, git

from oom_sentinel.daemon.install.reflog import (
    HeadMove,
    ReflogEntry,
    RepoHistory,
    history_from_entries,
    import_install_history,
    last_update,
    parse_backup_branch_time,
    parse_reflog,
    read_repo_history,
    state_before_last,
    states_over_time,
)
from oom_sentinel.daemon.install.state import (
    CORE_REPO,
    CoreState,
    CustomNode,
    InstallState,
    capture_install,
)

A, B, C, D = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)
ZERO = "0" * 40

# ---------------------------------------------------------------------------------------------
# Parsing reflog text


REFLOG_LINES = [
    (
        f"{A} {B} Test User <t@example.com> 1700000000 +0100\tpull: Fast-forward",
        ReflogEntry(A, B, "Test User", "t@example.com", 1700000000, "+0100", "pull: Fast-forward"),
    ),
    (
        f"{ZERO} {A} Ana María de la Peña <ana@example.com> 1690000000 -0700\tclone: from https://github.com/o/r.git",
        ReflogEntry(None, A, "Ana María de la Peña", "ana@example.com", 1690000000, "-0700", "clone: from https://github.com/o/r.git"),
    ),
    (
        f"{B} {C} CI <ci@example.com> 1700000100 +0000",
        ReflogEntry(B, C, "CI", "ci@example.com", 1700000100, "+0000", ""),
    ),
    (
        f"{C} {A}  <> 1700000200 +0000\treset: moving to HEAD~1\r",
        ReflogEntry(C, A, "", "", 1700000200, "+0000", "reset: moving to HEAD~1"),
    ),
    (
        f"{'e' * 64} {'f' * 64} U <u@x> 1700000300 +0530\tcheckout: moving from main to v1",
        ReflogEntry("e" * 64, "f" * 64, "U", "u@x", 1700000300, "+0530", "checkout: moving from main to v1"),
    ),
    (
        f"{ZERO} {A} U <u@x> 1 +0000\tclone: from https://user:ghp_tok@github.com/o/private",
        ReflogEntry(None, A, "U", "u@x", 1, "+0000", "clone: from https://github.com/o/private"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "entry"),
    REFLOG_LINES,
    ids=[
        "pull",
        "clone-unicode-name",
        "no-message",
        "empty-identity-crlf",
        "sha256",
        "credentials",
    ],
)
def test_reflog_line_is_parsed(line: str, entry: ReflogEntry) -> None:
    assert parse_reflog(line + "\n") == [entry]


@pytest.mark.parametrize(
    "line",
    [
        f"{A} {B} Test User <t@e> 17000",  # truncated while git was writing
        "garbage",
        f"{A[:39]} {B} U <u@x> 1700000000 +0000\tx",
        "",
    ],
    ids=["truncated", "garbage", "short-hash", "blank"],
)
def test_malformed_reflog_lines_are_skipped_not_fatal(line: str) -> None:
    good = f"{A} {B} U <u@x> 1700000000 +0000\tcommit: x"
    assert [e.new for e in parse_reflog(f"{good}\n{line}\n{good}\n")] == [B, B]


def test_entry_action_is_the_git_command() -> None:
    [pull, reset] = parse_reflog(
        f"{A} {B} U <u@x> 1 +0000\tpull --ff-only: Fast-forward\n"
        f"{B} {A} U <u@x> 2 +0000\treset: moving to HEAD~1\n"
    )
    assert (pull.action, reset.action) == ("pull", "reset")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("backup_branch_2024-05-01_10_20_30", datetime(2024, 5, 1, 10, 20, 30)),
        ("backup_branch_2024-13-01_10_20_30", None),
        ("backup_branch_2024-05-01", None),
        ("master", None),
    ],
    ids=["valid", "bad-month", "no-time", "other-branch"],
)
def test_backup_branch_names_carry_local_time(name: str, expected: datetime | None) -> None:
    assert parse_backup_branch_time(name) == expected


# ---------------------------------------------------------------------------------------------
# One repo's history


def _hist(*moves: tuple[int, str | None, str | None, str]) -> RepoHistory:
    return RepoHistory("r", tuple(HeadMove(float(t), o, n, m) for t, o, n, m in moves))


@pytest.mark.parametrize(
    ("at", "expected"),
    [(5, (False, None)), (10, (True, A)), (15, (True, A)), (20, (True, B)), (99, (True, B))],
    ids=["before-clone", "at-clone", "between", "at-pull", "after"],
)
def test_commit_at_takes_the_last_move_at_or_before(
    at: int, expected: tuple[bool, str | None]
) -> None:
    h = _hist((10, None, A, "clone: from x"), (20, A, B, "pull: Fast-forward"))
    assert h.commit_at(at) == expected


def test_before_a_truncated_reflog_the_repo_was_at_the_first_old_commit() -> None:
    h = _hist((20, A, B, "pull: Fast-forward"))
    assert h.commit_at(5) == (True, A)


def test_backup_branch_fills_a_gap_the_reflog_does_not_cover() -> None:
    entries = parse_reflog(f"{C} {D} U <u@x> 300 +0000\tpull: Fast-forward\n")
    h = history_from_entries("r", entries, backups=[(100.0, A), (300.0, C), (300.0, B)])
    # (300, C) agrees with the reflog (HEAD was C before the pull): not added.
    # (100, A) is older than the reflog; (300, B) disagrees: both kept, B before the pull.
    assert [(m.at_epoch_s, m.new, m.origin) for m in h.moves] == [
        (100.0, A, "backup-branch"),
        (300.0, B, "backup-branch"),
        (300.0, D, "reflog"),
    ]


# ---------------------------------------------------------------------------------------------
# Combining repos into states (pure)


def _current() -> InstallState:
    return InstallState(
        comfyui=CoreState(commit=D, branch="master", dirty=(), version="0.3.2"),
        nodes=(
            CustomNode("foo", "git", commit=C, entry="foo"),
            CustomNode("bar", "git", commit=B, entry="bar"),
            CustomNode("kj", "cnr", version="1.0.5", entry="kj"),
        ),
        root="/nowhere",
    )


def test_states_over_time_follow_every_repo() -> None:
    histories = {
        CORE_REPO: _hist((10, None, A, "clone: from u"), (50, A, D, "pull: Fast-forward")),
        "foo": _hist((20, None, B, "clone: from u"), (40, B, C, "pull: Fast-forward")),
        "bar": _hist((30, None, B, "clone: from u")),
    }
    history = states_over_time(_current(), histories)
    summary = [
        (
            h.at_epoch_s,
            h.state.comfyui.commit,
            {k: n.commit for k, n in h.state.node_table().items() if n.kind == "git"},
            h.description,
        )
        for h in history
    ]
    assert summary == [
        (10.0, A, {}, "ComfyUI: clone: from u"),
        (20.0, A, {"foo": B}, "custom_nodes/foo: clone: from u"),
        (30.0, A, {"foo": B, "bar": B}, "custom_nodes/bar: clone: from u"),
        (40.0, A, {"foo": C, "bar": B}, "custom_nodes/foo: pull: Fast-forward"),
        (50.0, D, {"foo": C, "bar": B}, "ComfyUI: pull: Fast-forward"),
    ]
    # Nodes without history stay as they are now; reconstructed states know no pip/dirty.
    assert all(h.state.node_table()["kj"].version == "1.0.5" for h in history)
    assert all(h.state.pip is None and h.state.comfyui.dirty is None for h in history)
    assert all(h.state.source == "reflog" for h in history)
    before, after = state_before_last(history, "pull", repo="foo")  # type: ignore[misc]
    assert before.state.node_table()["foo"].commit == B
    assert after.state.node_table()["foo"].commit == C
    assert state_before_last(history, "rebase") is None


def test_no_op_moves_and_same_second_moves_make_one_state() -> None:
    histories = {
        CORE_REPO: _hist(
            (10, None, A, "clone: from u"),
            (20, A, A, "checkout: moving from master to master"),
            (30, A, B, "checkout: moving from master to b"),
        ),
        "foo": _hist((30, C, D, "pull: Fast-forward")),
    }
    history = states_over_time(_current(), histories)
    # the earliest state exists because foo existed before its first recorded move
    assert [h.at_epoch_s for h in history] == [None, 10.0, 30.0]
    assert history[0].description == "before the earliest recorded change"
    assert history[0].state.node_table()["foo"].commit == C
    assert history[2].state.comfyui.commit == B
    assert history[2].state.node_table()["foo"].commit == D


def test_the_last_update_right_after_the_install_rolls_back_to_the_clone_not_past_it() -> None:
    # cloned, the pack installed, and a same-day pull of the core 20 minutes later: the
    # clone (the install itself) is never part of an update, whatever the gap
    histories = {
        CORE_REPO: _hist((1000, None, A, "clone: from u"), (2200, A, D, "pull: Fast-forward")),
        "foo": _hist((1060, None, C, "clone: from u")),
    }
    history = states_over_time(_current(), histories)
    before, after = last_update(history)  # type: ignore[misc]
    assert (before.state.comfyui.commit, after.state.comfyui.commit) == (A, D)
    assert before.state.node_table()["foo"].commit == C  # installed before: still there
    # even a pull seconds after the clone rolls back only to the clone
    quick = {CORE_REPO: _hist((1000, None, A, "clone: from u"), (1003, A, D, "pull: x"))}
    before, _after = last_update(states_over_time(_current(), quick))  # type: ignore[misc]
    assert before.state.comfyui.commit == A


def test_the_last_update_is_one_batch_of_pulls_and_keeps_later_local_commits_out() -> None:
    histories = {
        CORE_REPO: _hist(
            (10, None, A, "clone: from u"),
            (5000, A, B, "pull: Fast-forward"),  # an older update, hours before
            (20000, B, D, "pull: Fast-forward"),  # "Update All" starts
        ),
        "foo": _hist((20, None, B, "clone: from u"), (20300, B, C, "pull: Fast-forward")),
        "bar": _hist((30, A, B, "reset: moving to origin/main"), (20500, B, C, "commit: mine")),
    }
    history = states_over_time(_current(), histories)
    before, after = last_update(history)  # type: ignore[misc]
    # both pulls of the batch are undone; the older update and the clone stay
    assert before.state.comfyui.commit == B and before.state.node_table()["foo"].commit == B
    assert after.state.comfyui.commit == D and after.state.node_table()["foo"].commit == C
    # the user's own commit after the update is neither the update nor rolled back over
    assert after.description.startswith("custom_nodes/foo: pull")
    # a gap longer than UPDATE_GAP_S splits batches
    before, _ = last_update(history, gap_s=100)  # type: ignore[misc]
    assert before.state.comfyui.commit == D and before.state.node_table()["foo"].commit == B


def test_an_install_without_updates_has_no_last_update() -> None:
    histories = {
        CORE_REPO: _hist((10, None, A, "clone: from u"), (20, A, B, "commit: my fix")),
    }
    assert last_update(states_over_time(_current(), histories)) is None
    assert last_update([]) is None


def test_no_history_gives_no_states() -> None:
    assert states_over_time(_current(), {CORE_REPO: RepoHistory(CORE_REPO, ())}) == []


# ---------------------------------------------------------------------------------------------
# Real repos: pull, checkout, reset


@pytest.fixture(scope="module")
def updated(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """An install whose ComfyUI-Foo pack is updated with `git pull`, then whose core is moved
    with `git checkout` (detached) and `git reset --hard`. Shared: its tests only read."""
    inst = build_install(tmp_path_factory.mktemp("updated"))
    clock = inst.clock
    up = inst.upstreams["ComfyUI-Foo"]
    for i in (4, 5):
        inst.shas["ComfyUI-Foo"].append(
            commit_files(up, {"nodes.py": f"VERSION = {i}\n"}, f"ComfyUI-Foo {i}", clock.tick())
        )
    git(inst.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only", at=clock.tick())
    git(inst.root, "checkout", "-q", inst.shas["ComfyUI"][0], at=clock.tick())
    git(inst.root, "checkout", "-q", "master", at=clock.tick())
    git(inst.root, "reset", "-q", "--hard", "HEAD~1", at=clock.tick())
    return inst


def test_state_before_the_last_pull_is_reconstructed(updated: Install) -> None:
    history = import_install_history(updated.root)
    pair = state_before_last(history, "pull")
    assert pair is not None
    before, after = pair
    foo_shas = updated.shas["ComfyUI-Foo"]
    assert before.state.node_table()["ComfyUI-Foo"].commit == foo_shas[2]
    assert after.state.node_table()["ComfyUI-Foo"].commit == foo_shas[4]
    assert after.description.startswith("custom_nodes/ComfyUI-Foo: pull")
    # Everything else was as it was then: the core still at its clone commit.
    assert before.state.comfyui.commit == after.state.comfyui.commit == updated.shas["ComfyUI"][1]


def test_core_checkout_and_reset_appear_in_order(updated: Install) -> None:
    history = import_install_history(updated.root)
    core = [
        (h.move.action if h.move else None, h.state.comfyui.commit)
        for h in history
        if h.repo == CORE_REPO
    ]
    first, second = updated.shas["ComfyUI"]
    assert core == [("clone", second), ("checkout", first), ("checkout", second), ("reset", first)]


def test_latest_reconstructed_state_matches_the_install_now(updated: Install) -> None:
    now = capture_install(updated.root)
    last = import_install_history(updated.root, now)[-1].state
    assert last.comfyui.commit == now.comfyui.commit
    assert {k: n.commit for k, n in last.node_table().items()} == {
        k: n.commit for k, n in now.node_table().items()
    }


def test_nodes_are_absent_before_they_were_cloned(updated: Install) -> None:
    history = import_install_history(updated.root)
    first = history[0].state  # right after the core clone
    assert "ComfyUI-Foo" not in first.node_table()
    assert first.node_table()["comfyui-kjnodes"].version == "1.0.5"  # no history: as now


def test_importing_twice_gives_the_same_state_ids(updated: Install) -> None:
    ids = [h.state.state_id for h in import_install_history(updated.root)]
    assert ids == [h.state.state_id for h in import_install_history(updated.root)]
    # A state may come back (checkout and back), but never twice in a row.
    assert all(x != y for x, y in itertools.pairwise(ids))


def test_disabled_and_detached_node_histories_are_read(updated: Install) -> None:
    history = import_install_history(updated.root)
    bar = [h for h in history if h.repo == "bar-nodes"]
    assert [h.move.action for h in bar if h.move] == ["clone", "checkout"]
    assert bar[-1].state.node_table()["bar-nodes"].commit == updated.shas["bar-nodes"][0]
    assert any(h.repo == "Legacy-Pack" for h in history)


# ---------------------------------------------------------------------------------------------
# Windows portable updater: backup_branch_YYYY-MM-DD_HH_MM_SS


def _windows_update(inst: Install) -> tuple[str, str, int]:
    """What update.py does: branch at the old HEAD, then move to the new upstream head."""
    clock = inst.clock
    old = git(inst.root, "rev-parse", "HEAD")
    new = commit_files(
        inst.upstreams["ComfyUI"], {"nodes.py": "N = 1\n"}, "Upstream change", clock.tick()
    )
    at = clock.tick()
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d_%H_%M_%S")
    git(inst.root, "branch", f"backup_branch_{stamp}", at=at)
    git(inst.root, "pull", "-q", "--ff-only", at=at + 5)
    return old, new, at


def test_backup_branch_recovers_the_old_core_when_the_reflog_is_gone(tmp_path: Path) -> None:
    inst = build_install(tmp_path)
    old, _new, at = _windows_update(inst)
    (inst.root / ".git" / "logs" / "HEAD").unlink()  # expired or never kept
    history = read_repo_history(inst.root, CORE_REPO)
    assert [(m.at_epoch_s, m.new, m.origin) for m in history.moves] == [
        (float(at), old, "backup-branch")
    ]


def test_backup_branch_time_comes_from_its_name_without_a_reflog(tmp_path: Path) -> None:
    inst = build_install(tmp_path)
    old, _new, at = _windows_update(inst)
    shutil.rmtree(inst.root / ".git" / "logs")
    git(inst.root, "pack-refs", "--all", "--prune")  # the branch now lives in packed-refs
    history = read_repo_history(inst.root, CORE_REPO)
    assert [(m.at_epoch_s, m.new) for m in history.moves] == [(float(at), old)]


def test_backup_branch_agreeing_with_the_reflog_adds_nothing(tmp_path: Path) -> None:
    inst = build_install(tmp_path)
    old, new, _at = _windows_update(inst)
    history = read_repo_history(inst.root, CORE_REPO)
    assert all(m.origin == "reflog" for m in history.moves)
    assert [m.new for m in history.moves][-1] == new
    assert history.moves[-2].new == old
