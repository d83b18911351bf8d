"""The isolated workspace (workspace.py) and the per-commit flag filter (cli_args_filter.py).

The user's install is a real core repo with custom-node repos, a stash entry, a dirty
tracked file, untracked files and local config (bisect_git.make_install). Every test that
touches it compares a full snapshot — every file under the install including each ``.git``,
plus HEAD, refs, index, status, stash, config and worktree list as git reports them —
before and after: creation, many switches, errors, Ctrl-C at random points, kill -9, reset.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from bisect_git import git, install_snapshot, make_install, untouched_install

import oom_sentinel.bisect.measure.flags as flags_module
from oom_sentinel.bisect.measure.flags import (
    ISOLATION_FLAGS,
    ArgSpec,
    filter_flags,
    parse_cli_args,
    split_flags,
)
from oom_sentinel.bisect.measure.workspace import Workspace, free_port, remove_workspace
from oom_sentinel.bisect.session.fsutil import FileLock
from oom_sentinel.bisect.state.states import ABSENT, DISABLED, INSTALLED, State, scan_install
from oom_sentinel.daemon.core.errors import BisectError

N_CORE = 30


inst = untouched_install("ws-user", "the workspace", core_commits=N_CORE)


def old_pack_head(inst) -> str:
    return git(inst.custom_nodes / "old_pack.disabled", "rev-parse", "HEAD").strip()


def states(inst) -> list[State]:
    a, b, c = inst.nodes["node_a"], inst.nodes["node_b"], inst.core
    mid = N_CORE // 2
    return [
        scan_install(inst.root).current_state(),
        State.of(c[0], {"node_a": a[0], "old_pack": old_pack_head(inst), "single.py": DISABLED}),
        State.of(
            c[mid],
            {
                "node_a": a[5],
                "node_b": b[3],
                "old_pack": DISABLED,
                "loose_pack": INSTALLED,
                "single.py": INSTALLED,
            },
        ),
        State.of(c[mid + 2], {"node_b": b[7], "loose_pack": INSTALLED}),
        State.of(c[mid + 1], {"node_a": a[11], "node_b": b[0], "single.py": INSTALLED}),
    ]


def assert_shows(ws: Workspace, inst, state: State) -> None:
    """The workspace's files are exactly those of ``state``."""
    assert ws.current_state() == state
    i = inst.core.index(state.comfyui)
    assert (ws.comfyui / "memory.txt").read_text() == f"{100 + i}\n"
    assert (ws.comfyui / "comfy" / "new_module.py").exists() == (N_CORE // 2 <= i < N_CORE // 2 + 2)
    assert (ws.comfyui / "main.py").read_text() == "print('stand-in main')\n"  # not the user's edit
    assert git(ws.comfyui, "status", "--porcelain", "--untracked-files=no") == ""
    for name in ("node_a", "node_b"):
        value = state.node(name)
        active = ws.custom_nodes / name
        if value in (ABSENT, DISABLED):
            assert not active.exists()
        else:
            k = inst.nodes[name].index(value)
            assert (active / "version.txt").read_text() == f"{k}\n"
            assert git(active, "status", "--porcelain", "--untracked-files=all") == ""
    assert (ws.custom_nodes / "old_pack").exists() == (
        state.node("old_pack") not in (ABSENT, DISABLED)
    )
    assert (ws.custom_nodes / "loose_pack" / "__init__.py").exists() == (
        state.node("loose_pack") == INSTALLED
    )
    assert (ws.custom_nodes / "single.py").is_file() == (state.node("single.py") == INSTALLED)
    assert (ws.custom_nodes / "websocket_image_save.py").is_file()  # tracked by the core


# ---------------------------------------------------------------------- isolation


def test_the_workspace_shares_objects_and_registers_nothing_in_the_user_repo(
    inst, tmp_path
) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    alternates = (ws.comfyui / ".git" / "objects" / "info" / "alternates").read_text().split()
    assert alternates == [str(inst.root / ".git" / "objects")]
    assert not list((ws.comfyui / ".git" / "objects").glob("pack/*.pack"))  # nothing copied
    assert not (inst.root / ".git" / "worktrees").exists()
    assert git(inst.root, "worktree", "list", "--porcelain").count("worktree ") == 1
    ws.remove()
    assert not (tmp_path / "ws").exists()


def test_many_switches_build_each_state_exactly(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    all_states = states(inst)
    rng = random.Random(6)
    walk = [*all_states, *(rng.choice(all_states) for _ in range(10)), all_states[0]]
    for state in walk:
        ws.switch(state)
        assert_shows(ws, inst, state)
    # a node clone is reused, not made again
    ino = (ws.custom_nodes / "node_a" / ".git").stat().st_ino
    ws.switch(all_states[2])
    assert (ws.custom_nodes / "node_a" / ".git").stat().st_ino == ino
    ws.remove()


def test_commits_only_the_reflog_knows_can_be_checked_out(tmp_path) -> None:
    user = make_install(tmp_path / "u", core_commits=6, dirty=False)
    git(user.root, "commit", "-q", "--allow-empty", "-m", "a local commit that will be dropped")
    dropped = git(user.root, "rev-parse", "HEAD").strip()
    git(user.root, "reset", "-q", "--hard", user.core[-1])
    before = install_snapshot(user)
    ws = Workspace.create(tmp_path / "ws", scan_install(user.root))
    state = scan_install(user.root).current_state().with_values({"comfyui": dropped})
    ws.switch(state)
    assert ws.current_state().comfyui == dropped
    ws.remove()
    assert install_snapshot(user) == before


def test_create_is_idempotent_and_refuses_another_install(inst, tmp_path) -> None:
    install = scan_install(inst.root)
    ws = Workspace.create(tmp_path / "ws", install)
    ino = (ws.comfyui / ".git").stat().st_ino
    again = Workspace.create(tmp_path / "ws", install)
    assert (again.comfyui / ".git").stat().st_ino == ino
    other = make_install(tmp_path / "other", core_commits=3, dirty=False)
    with pytest.raises(BisectError, match="belongs to"):
        Workspace.create(tmp_path / "ws", scan_install(other.root))


def test_an_interrupted_creation_is_started_over(inst, tmp_path) -> None:
    root = tmp_path / "ws"
    (root / "ComfyUI").mkdir(parents=True)  # a clone renamed into place, then a crash
    (root / ".ComfyUI.cloning").mkdir()
    ws = Workspace.create(root, scan_install(inst.root))
    ws.switch(states(inst)[1])
    assert_shows(ws, inst, states(inst)[1])


# ---------------------------------------------------------------------- failures and recovery


def test_a_switch_that_failed_half_way_is_fixed_by_the_next(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    good = states(inst)[2]
    ws.switch(states(inst)[0])
    missing = "0123456789abcdef0123456789abcdef01234567"
    broken = good.with_values({"node:node_b": missing})
    with pytest.raises(BisectError) as err:
        ws.switch(broken)  # core and node_a are switched, node_b fails
    assert str(err.value).startswith("custom_nodes/node_b workspace (")
    assert "git checkout failed" in str(err.value)
    ws.switch(good)
    assert_shows(ws, inst, good)


def test_stale_git_locks_from_a_killed_switch_are_cleared(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    ws.switch(states(inst)[2])
    (ws.comfyui / ".git" / "index.lock").write_text("")
    (ws.custom_nodes / "node_a" / ".git" / "HEAD.lock").write_text("")
    (ws.root / ".markers" / "@core").unlink()  # the marker goes before a checkout starts
    (ws.root / ".markers" / "node-node_a").unlink()
    ws.switch(states(inst)[4])
    assert_shows(ws, inst, states(inst)[4])


def test_tampered_files_are_restored_by_a_forced_switch(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    state = states(inst)[2]
    ws.switch(state)
    (ws.comfyui / "memory.txt").write_text("changed by a run\n")
    (ws.comfyui / "comfy" / "stray.py").write_text("left behind\n")
    (ws.custom_nodes / "node_a" / "version.txt").unlink()
    ws.switch(state, force=True)
    assert_shows(ws, inst, state)
    assert not (ws.comfyui / "comfy" / "stray.py").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"node:loose_pack": "version:9.9.9"},
            "custom_nodes/loose_pack: version:9.9.9 cannot be built",
        ),
        ({"node:loose_pack": "a" * 40}, "is a commit but this node is not a git repo"),
        ({"node:node_a": INSTALLED}, "custom_nodes/node_a: 'installed' is not a commit"),
        ({"node:ghost": "a" * 40}, "custom_nodes/ghost: not in the install"),
    ],
    ids=["registry-version", "commit-for-copy", "copy-for-git", "unknown-node"],
)
def test_states_the_workspace_cannot_build_fail_with_one_line(
    inst, tmp_path, change, message
) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    with pytest.raises(BisectError, match=message):
        ws.switch(states(inst)[0].with_values(change))
    ws.switch(states(inst)[0])
    assert_shows(ws, inst, states(inst)[0])


# ---------------------------------------------------------------------- Ctrl-C and kill -9

SWITCHER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from oom_sentinel.bisect.state.states import State, scan_install
    from oom_sentinel.bisect.measure.workspace import Workspace

    root, user, states_file = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    states = [State.from_json(s) for s in json.loads(Path(states_file).read_text())]
    ws = Workspace.create(root, scan_install(user))
    print("ready", flush=True)
    for i in range(500):
        ws.switch(states[i % len(states)])
        print(i, flush=True)
    """
)


def _wait_for_git_child(proc: subprocess.Popen[str]) -> None:
    """Until the switcher runs a git command that writes (bounded; the switch loops)."""
    for _ in range(20_000):
        if proc.poll() is not None:
            return
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
            for child in children:
                cmd = child.cmdline()
                if cmd and "git" in cmd[0] and {"checkout", "clone", "clean"} & set(cmd):
                    return
        except psutil.Error:
            pass  # a child came and went between listing and reading it
        time.sleep(0.0005)


def _wait_for_lock(root: Path) -> None:
    """After kill -9 an orphaned git may still hold the inherited workspace lock."""
    for _ in range(1200):
        try:
            with FileLock(root / ".lock", "ws"):
                return
        except BisectError:
            time.sleep(0.05)
    raise AssertionError("the workspace lock was never released")


def test_ctrl_c_and_kill_at_random_points_never_touch_the_user_and_always_recover(
    inst, tmp_path
) -> None:
    script = tmp_path / "switcher.py"
    script.write_text(SWITCHER)
    all_states = states(inst)
    states_file = tmp_path / "states.json"
    states_file.write_text(json.dumps([s.to_json() for s in all_states]))
    root = tmp_path / "ws"
    rng = random.Random(int(os.environ.get("OOM_SENTINEL_TEST_SEED", "1234")))
    # "int": Ctrl-C at a random moment; "int-git": Ctrl-C while a git checkout/clone/clean of
    # the switch runs; "kill-git": kill -9 of our process alone while git runs (git finishes
    # as an orphan); "crash-git": kill -9 of the whole group while git runs (an OOM kill or a
    # power cut: git's own index.lock is left behind)
    kinds = ["int", "int-git"] * 4 + ["kill-git", "crash-git", "crash-git", "crash-git"]
    for round_no, kind in enumerate(kinds):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(root), str(inst.root), str(states_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        lines = 0 if round_no == 0 else rng.randint(1, 4)  # round 0 may stop the creation
        for _ in range(lines):
            if not proc.stdout.readline():
                break
        if kind.endswith("-git"):
            _wait_for_git_child(proc)
            time.sleep(rng.uniform(0.0, 0.004))
        else:
            time.sleep(rng.uniform(0.0, 0.12))
        if kind.startswith("int"):  # Ctrl-C reaches the foreground group, git children included
            os.killpg(proc.pid, signal.SIGINT)
        elif kind.startswith("kill"):  # only the parent dies; its git child runs on
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=120)
        if kind.startswith("kill"):
            _wait_for_lock(root)
    ws = Workspace.create(root, scan_install(inst.root))
    for state in [*all_states, all_states[1]]:
        ws.switch(state)
        assert_shows(ws, inst, state)
    remove_workspace(root)
    assert not root.exists()


# ---------------------------------------------------------------------- models, inputs, launch


def test_models_are_reached_in_place_through_extra_model_paths(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    ws.switch(states(inst)[1])
    data = yaml.safe_load(ws.model_paths_yaml.read_text())
    section = data["oom_bisect_user_models"]
    assert section == {
        "base_path": str(inst.root / "models"),
        "checkpoints": "checkpoints/",
        "loras": "loras/",
    }
    assert not (ws.comfyui / "models" / "checkpoints" / "a.safetensors").exists()
    ws.switch(states(inst)[2])  # survives checkouts and cleans
    assert yaml.safe_load(ws.model_paths_yaml.read_text()) == data


def test_inputs_the_prompt_names_are_copied_in(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    missing = ws.stage_inputs(["cat.png", "nope.png", "../../etc/passwd", "/etc/passwd"])
    assert missing == ["nope.png", "../../etc/passwd", "/etc/passwd"]
    assert (ws.input_dir_ws / "cat.png").read_bytes() == b"png"


def test_launch_keeps_the_flags_each_commit_knows_and_isolates_the_instance(inst, tmp_path) -> None:
    ws = Workspace.create(tmp_path / "ws", scan_install(inst.root))
    user_flags = [
        "--listen",
        "0.0.0.0",
        "--port=8188",
        "--lowvram",
        "--reserve-vram",
        "2.5",
        "--user-directory",
        "/home/u",
    ]
    ws.switch(states(inst)[1])  # commit 0: no --reserve-vram, no --database-url yet
    old = ws.launch(user_flags, port=4242)
    assert old.argv("py")[:2] == ["py", str(ws.comfyui / "main.py")]
    assert old.cwd == ws.comfyui and old.port == 4242
    assert old.args[:4] == ("--listen", "127.0.0.1", "--port", "4242")
    assert "--lowvram" in old.args
    assert "--reserve-vram" not in old.args and "--database-url" not in old.args
    assert ("--reserve-vram 2.5", "unknown to this commit") in old.dropped
    assert ("--listen 0.0.0.0", "set by the workspace") in old.dropped
    assert ("--user-directory /home/u", "set by the workspace") in old.dropped
    assert old.args[old.args.index("--user-directory") + 1] == str(ws.user_dir)
    assert old.args[old.args.index("--temp-directory") + 1] == str(ws.run_dir)

    ws.switch(states(inst)[0])  # the tip knows both
    new = ws.launch(user_flags)
    assert new.args[new.args.index("--reserve-vram") + 1] == "2.5"
    assert new.args[new.args.index("--database-url") + 1] == "sqlite:///:memory:"
    assert "0.0.0.0" not in new.args and "8188" not in new.args
    assert 1024 < new.port < 65536


def test_a_user_extra_model_paths_file_is_passed_by_absolute_path(tmp_path) -> None:
    user = make_install(tmp_path / "u", core_commits=4, dirty=False)
    (user.root / "extra_model_paths.yaml").write_text("a111:\n  base_path: ../sd\n")
    before = install_snapshot(user)
    ws = Workspace.create(tmp_path / "ws", scan_install(user.root))
    ws.switch(scan_install(user.root).current_state())
    spec = ws.launch(["--extra-model-paths-config", "mine.yaml"], user_cwd=Path("/srv"))
    args = list(spec.args)
    configs = [args[i + 1] for i, a in enumerate(args) if a == "--extra-model-paths-config"]
    assert configs == [str(user.root / "extra_model_paths.yaml"), "/srv/mine.yaml"]
    ws.remove()
    assert install_snapshot(user) == before


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ---------------------------------------------------------------------- the cli_args parser

CLI_ARGS = """
import argparse, enum
parser = argparse.ArgumentParser()
parser.add_argument("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::")
parser.add_argument('--port', type=int, default=8188)
parser.add_argument("-q", "--quiet", action="store_true")
parser.add_argument("--extra-model-paths-config", type=str, nargs='+', action='append')
parser.add_argument("--fast", nargs="*", type=PerformanceFeature)
parser.add_argument("--cache-lru", type=int, default=0, help="Use LRU caching (keep up to N).")
parser.add_argument("--preview-method", type=LatentPreviewMethod, action=EnumAction)
parser.add_argument("--pair", nargs=2)
parser.add_argument("--smart", action=argparse.BooleanOptionalAction)
cm_group = parser.add_mutually_exclusive_group()
cm_group.add_argument("--cache-classic", action="store_true", help="(default)")
cm_group.add_argument("--cache-ram", nargs='?', const=4.0, type=float)
vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--lowvram", action="store_true", help="Split the unet (a 'quoted' word).")
vram_group.add_argument('--reserve-vram', type=float, default=None)
"""

EXPECTED = {
    "--listen": (0, 1),
    "--port": (1, 1),
    "-q": (0, 0),
    "--quiet": (0, 0),
    "--extra-model-paths-config": (1, None),
    "--fast": (0, None),
    "--cache-lru": (1, 1),
    "--preview-method": (1, 1),
    "--pair": (2, 2),
    "--smart": (0, 0),
    "--no-smart": (0, 0),
    "--cache-classic": (0, 0),
    "--cache-ram": (0, 1),
    "--lowvram": (0, 0),
    "--reserve-vram": (1, 1),
}


@pytest.mark.parametrize(
    "text",
    [CLI_ARGS, CLI_ARGS + "\nthis is not python (\n"],
    ids=["ast", "tolerant-scanner"],
)
def test_cli_args_parser_reads_every_add_argument_call(text: str) -> None:
    spec = parse_cli_args(text)
    assert {k: (v.min_args, v.max_args) for k, v in spec.items()} == EXPECTED
    assert spec["-q"] == spec["--quiet"] and spec["-q"].options == ("-q", "--quiet")


def test_parallel_lanes_never_build_two_syntax_trees_at_once(monkeypatch) -> None:
    """CPython 3.11-3.12's AST constructor keeps its recursion depth in interpreter-wide state:
    two threads in ast.parse at once can end one with 'SystemError: AST constructor recursion
    depth mismatch' (seen in a three-lane bisect under load). Each lane's parse of its commit's
    cli_args.py waits for the others: the stand-in parse below holds the GIL-free window open
    and counts who is inside."""
    real_parse = flags_module.ast.parse
    inside, most = 0, 0
    guard = threading.Lock()

    def slow_parse(*args: object, **kwargs: object) -> object:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)  # (a switch to another thread here is what the race needs)
        try:
            return real_parse(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with guard:
                inside -= 1

    monkeypatch.setattr(flags_module.ast, "parse", slow_parse)
    results: list[dict[str, tuple[int, int | None]]] = []

    def lane() -> None:
        for _ in range(5):
            spec = parse_cli_args(CLI_ARGS)
            results.append({k: (v.min_args, v.max_args) for k, v in spec.items()})

    threads = [threading.Thread(target=lane) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1
    assert results == [EXPECTED] * 20


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--lowvram", "--reserve-vram", "2"],
            [("--lowvram", "--lowvram"), ("--reserve-vram", "--reserve-vram 2")],
        ),
        (["--listen", "--port", "1"], [("--listen", "--listen"), ("--port", "--port 1")]),
        (
            ["--listen", "0.0.0.0", "--lowvram"],
            [("--listen", "--listen 0.0.0.0"), ("--lowvram", "--lowvram")],
        ),
        (
            ["--fast", "fp16_accumulation", "autotune"],
            [("--fast", "--fast fp16_accumulation autotune")],
        ),
        (["--reserve-vram=1.5"], [("--reserve-vram", "--reserve-vram=1.5")]),
        (["--reserve-vram", "-1"], [("--reserve-vram", "--reserve-vram -1")]),
        (["--lowv"], [("--lowvram", "--lowv")]),
        (["--cache"], [("--cache", "--cache")]),  # ambiguous prefix: an unknown flag
        (
            ["--mystery", "x", "--lowvram"],
            [("--mystery", "--mystery x"), ("--lowvram", "--lowvram")],
        ),
        (["stray"], [("", "stray")]),
    ],
    ids=[
        "flags",
        "optional-none",
        "optional-one",
        "many",
        "equals",
        "negative",
        "abbrev",
        "ambiguous",
        "unknown",
        "positional",
    ],
)
def test_user_flags_split_into_whole_units(
    argv: list[str], expected: list[tuple[str, str]]
) -> None:
    uses = split_flags(argv, parse_cli_args(CLI_ARGS))
    assert [(u.option, " ".join(u.words)) for u in uses] == expected


def test_filter_keeps_known_flags_and_drops_the_rest_as_units() -> None:
    user = parse_cli_args(CLI_ARGS)
    target = {k: v for k, v in user.items() if k not in ("--reserve-vram", "--cache-ram")}
    target["--pair"] = ArgSpec(("--pair",), 1, 1)  # changed arity at that commit
    argv = [
        "--listen",
        "0.0.0.0",
        "--lowv",
        "--reserve-vram",
        "3",
        "--cache-ram",
        "--pair",
        "a",
        "b",
        "--preview-method",
        "auto",
        "--quiet",
    ]
    result = filter_flags(argv, user, target)
    assert result.kept == ("--lowvram", "--preview-method", "auto", "--quiet")
    assert result.dropped == (
        ("--listen 0.0.0.0", "set by the workspace"),
        ("--reserve-vram 3", "unknown to this commit"),
        ("--cache-ram", "unknown to this commit"),
        ("--pair a b", "takes other values at this commit"),
    )


def test_short_aliases_follow_their_long_option() -> None:
    user = parse_cli_args(CLI_ARGS)
    target = {"--quiet": ArgSpec(("--quiet",), 0, 0)}
    assert filter_flags(["-q"], user, target).kept == ("--quiet",)


def test_every_isolation_flag_is_dropped_even_when_the_commit_knows_it() -> None:
    spec = {f: ArgSpec((f,), 0, 1) for f in ISOLATION_FLAGS}
    result = filter_flags(sorted(ISOLATION_FLAGS), spec, spec)
    assert result.kept == ()
    assert len(result.dropped) == len(ISOLATION_FLAGS)
