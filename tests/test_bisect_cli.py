"""The ``oom-bisect`` front end: sizes and budgets, misuse and its exit statuses, the session
commands a git bisect user expects (status, log, replay, reset, good/bad/skip by hand),
discovery of the install and its interpreter, and reading a crash snapshot.

Runs that start ComfyUI are in test_bisect_e2e.py; here nothing is measured.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from bisect_git import untouched_install
from click.testing import CliRunner
from snapshot_samples import suspected_regression

from oom_sentinel.bisect.cli.main import (
    EXIT_AMBIGUOUS,
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_NOT_REPRODUCED,
    RESULT_EXIT,
    _find_python,
    discover_comfyui,
    main,
    parse_budget,
    parse_size,
)
from oom_sentinel.bisect.search.verdict import Threshold
from oom_sentinel.bisect.session.files import BisectPaths, Session, begin
from oom_sentinel.bisect.state.from_snapshot import (
    flags_from_argv,
    read_snapshot_start,
    snapshot_state,
    state_from_install_state,
)
from oom_sentinel.bisect.state.states import State, scan_install
from oom_sentinel.daemon.comfy.interpreter import InterpreterFacts
from oom_sentinel.daemon.core.errors import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_INPUT,
    ConfigError,
    InputError,
)
from oom_sentinel.daemon.install.state import CoreState, CustomNode, InstallState

README = Path(__file__).resolve().parent.parent / "README.md"
GIB = 1024**3
MIB = 1024**2
SHA_A = "a" * 40
SHA_B = "b" * 40
PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 100}}}


inst = untouched_install("cli", "an oom-bisect command")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OOM_SENTINEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "bisect"


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# ---------------------------------------------------------------------------- sizes and budgets


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("8GiB", 8 * GIB),
        ("8G", 8 * GIB),
        ("8gib", 8 * GIB),
        ("12GB", 12 * GIB),
        ("8192MiB", 8 * GIB),
        ("512M", 512 * MIB),
        ("1.5GiB", int(1.5 * GIB)),
        ("1048576", MIB),
        ("4096 KiB", 4 * MIB),
    ],
    ids=["GiB", "G", "lowercase", "GB-is-binary", "MiB", "M", "fraction", "bytes", "space"],
)
def test_sizes_read_like_the_tools_print_them(text: str, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["lots", "", "-1G", "0", "8 parsecs", "8QiB"])
def test_a_bad_size_is_a_usage_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text, "--vram-budget")


def test_budgets_name_their_pool_and_a_bare_size_is_vram() -> None:
    assert parse_budget(()) is None
    assert parse_budget(["10GiB"]) == Threshold(10 * GIB, None)
    assert parse_budget(["vram=10GiB", "ram=16GiB"]) == Threshold(10 * GIB, 16 * GIB)
    with pytest.raises(ConfigError, match="vram or ram"):
        parse_budget(["gpu=10GiB"])


# ---------------------------------------------------------------------------- misuse


def _wf(tmp_path: Path) -> str:
    p = tmp_path / "wf.json"
    p.write_text(json.dumps(PROMPT))
    return str(p)


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        ([], EXIT_CONFIG, "no bisect in progress: give --workflow, --good, --bad"),
        (
            ["--good", "comfyui=nope", "--bad", "comfyui=HEAD", "--workflow", "{wf}"],
            EXIT_CONFIG,
            "'nope' is not a commit",
        ),
        (
            ["--good", "comfyui=HEAD", "--bad", "comfyui=HEAD", "--workflow", "{wf}"],
            EXIT_ERROR,
            "nothing to bisect",
        ),
        (
            ["--good", "v-first", "--bad", "comfyui=HEAD", "--workflow", "{wf}"],
            EXIT_CONFIG,
            "'v-first' is neither a state",
        ),
        (
            ["--good", "comfyui=v-first", "--bad", "comfyui=HEAD", "--workflow", "{tmp}/no.json"],
            EXIT_INPUT,
            "no.json",
        ),
        (
            [
                "--good",
                "comfyui=v-first",
                "--bad",
                "HEAD",
                "--term-old",
                "bad",
                "--workflow",
                "{wf}",
            ],
            EXIT_CONFIG,
            "can't change the meaning",
        ),
        (
            [
                "--good",
                "comfyui=v-first",
                "--bad",
                "comfyui=HEAD",
                "--vram-budget",
                "lots",
                "--workflow",
                "{wf}",
            ],
            EXIT_CONFIG,
            "not a size",
        ),
        (
            [
                "--good",
                "comfyui=v-first",
                "--bad",
                "comfyui=HEAD",
                "--repeat",
                "0",
                "--workflow",
                "{wf}",
            ],
            EXIT_CONFIG,
            "--repeat must be at least 1",
        ),
        (
            [
                "--good",
                "comfyui=v-first",
                "--bad",
                "comfyui=HEAD",
                "--repeat",
                "often",
                "--workflow",
                "{wf}",
            ],
            EXIT_CONFIG,
            "--repeat: 'often' is not a number or 'auto'",
        ),
        (
            [
                "--good",
                "comfyui=v-first",
                "--bad",
                "comfyui=HEAD",
                "--repeat",
                "3",
                "--max-repeat",
                "4",
                "--workflow",
                "{wf}",
            ],
            EXIT_CONFIG,
            "--max-repeat needs --repeat auto",
        ),
    ],
    ids=[
        "nothing-to-resume",
        "junk-ref",
        "same-states",
        "unknown-snapshot-word",
        "missing-workflow",
        "term-clash",
        "bad-size",
        "bad-repeat",
        "repeat-not-a-number",
        "max-repeat-without-auto",
    ],
)
def test_misuse_exits_with_its_status_and_leaves_no_session(
    inst, cache, tmp_path, extra, code, message
) -> None:
    args = [a.replace("{wf}", _wf(tmp_path)).replace("{tmp}", str(tmp_path)) for a in extra]
    res = CliRunner().invoke(
        main, ["run", "--comfyui", str(inst.root), "--python", sys.executable, *args]
    )
    assert res.exit_code == code, res.output
    assert message in res.output and res.output.count("\n") <= 2  # one line, no traceback
    assert not BisectPaths.for_install(inst.root, home=cache).root.exists()


def test_without_an_interpreter_the_user_is_asked_for_python(inst, cache, tmp_path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "run",
            "--comfyui",
            str(inst.root),
            "--workflow",
            _wf(tmp_path),
            "--good",
            "comfyui=v-first",
            "--bad",
            "comfyui=HEAD",
        ],
    )
    assert res.exit_code == EXIT_CONFIG and "give --python PATH" in res.output


@pytest.mark.parametrize("command", ["status", "log", "reset", "good", "skip"])
def test_session_commands_without_a_session_say_so(inst, cache, command) -> None:
    res = CliRunner().invoke(main, [command, "--comfyui", str(inst.root)])
    assert res.exit_code == EXIT_ERROR and "no bisect session" in res.output


def test_an_unknown_first_word_is_a_snapshot_id(cache, tmp_path) -> None:
    res = CliRunner().invoke(main, ["20990101T000000Z", "--data-dir", str(tmp_path / "data")])
    assert res.exit_code == EXIT_ERROR
    assert "no snapshot '20990101T000000Z'" in res.output


def test_exit_statuses_are_documented_in_the_readme() -> None:
    text = README.read_text("utf-8")
    section = text[text.index("## oom-bisect") :]
    section = section[: section.index("\n## ", 3)]
    statuses = {
        **{code: word for word, code in RESULT_EXIT.items()},
        EXIT_CONFIG: "usage",
        EXIT_INPUT: "input",
        EXIT_INTERRUPTED: "interrupted",
    }
    for code, word in statuses.items():
        assert re.search(rf"^\| {code} \| .*{word}", section, re.M), f"exit {code} ({word})"
    assert (EXIT_FOUND, EXIT_NOT_REPRODUCED, EXIT_AMBIGUOUS) == (0, 4, 5)


# ---------------------------------------------------------------------------- session commands


def _session(inst, cache) -> Session:
    paths = BisectPaths.for_install(inst.root, home=cache)
    return begin(paths, scan_install(inst.root), "comfyui=v-first", "comfyui=HEAD", prompt=PROMPT)


def test_manual_verdicts_drive_a_bisect_to_its_answer(inst, cache) -> None:
    first_bad = 20
    sess = _session(inst, cache)
    root = str(inst.root)
    res = cli("status", "--comfyui", root)
    assert "next: comfyui=" + inst.core[0] in res.output and "not finished" in res.output
    for _ in range(12):
        st = json.loads(cli("status", "--comfyui", root, "--json").output)
        if st["result"] != "in-progress":
            break
        value = st["next"]["comfyui"]
        word = "bad" if inst.core.index(value) >= first_bad else "good"
        res = cli(word, "--comfyui", root)
        assert res.exit_code == 0 and res.output.startswith(f"marked {word}: comfyui={value}")
    st = json.loads(cli("status", "--comfyui", root, "--json").output)
    assert st["result"] == "found"
    assert st["culprits"][0]["commit"] == inst.core[first_bad]
    assert st["culprits"][0]["subject"] == f"core change {first_bad}"
    assert (
        "answer: found: ComfyUI " + inst.core[first_bad] in cli("status", "--comfyui", root).output
    )
    log = cli("log", "--comfyui", root).output
    assert log.startswith("# oom-bisect log, format 1") and "outcome=manual" in log
    assert len(Session.open(sess.paths).records()) == st["tested"]


def test_a_state_can_be_marked_by_ref_and_skipped(inst, cache) -> None:
    _session(inst, cache)
    root = str(inst.root)
    res = cli("skip", "comfyui=HEAD~3", "--comfyui", root)
    assert res.exit_code == 0 and f"marked skip: comfyui={inst.core[-4]}" in res.output
    res = CliRunner().invoke(main, ["bad", "node:nope=HEAD", "--comfyui", root])
    assert res.exit_code == EXIT_ERROR and "not one of the repos this bisect changes" in res.output


def test_an_edited_log_replays_and_a_wrong_line_changes_nothing(inst, cache, tmp_path) -> None:
    sess = _session(inst, cache)
    root = str(inst.root)
    cli("good", "--comfyui", root)
    cli("bad", "--comfyui", root)
    cli("good", "--comfyui", root)
    text = cli("log", "--comfyui", root).output
    lines = text.splitlines()
    edited = tmp_path / "edited.log"
    edited.write_text("\n".join(lines[:-1]) + "\n")  # drop the last verdict
    res = cli("replay", str(edited), "--comfyui", root)
    assert res.output.startswith("replayed 2 verdict(s)")
    assert len(sess.records()) == 2
    broken = tmp_path / "broken.log"
    broken.write_text(text + "maybe comfyui=" + inst.core[3] + "\n")
    res = CliRunner().invoke(main, ["replay", str(broken), "--comfyui", root])
    assert res.exit_code == EXIT_INPUT and "'maybe' is not a verdict" in res.output
    assert len(sess.records()) == 2


def test_reset_removes_session_and_workspace(inst, cache) -> None:
    sess = _session(inst, cache)
    sess.paths.workspace.mkdir()
    res = cli("reset", "--comfyui", str(inst.root))
    assert res.exit_code == 0 and "removed the bisect session" in res.output
    assert not sess.paths.session.exists() and not sess.paths.workspace.exists()


def test_custom_terms_are_accepted_by_mark(inst, cache) -> None:
    paths = BisectPaths.for_install(inst.root, home=cache)
    from oom_sentinel.bisect.search.verdict import Terms

    begin(
        paths,
        scan_install(inst.root),
        "comfyui=v-first",
        "comfyui=HEAD",
        prompt=PROMPT,
        terms=Terms("fits", "ooms"),
    )
    res = cli("mark", "ooms", "--comfyui", str(inst.root))
    assert res.output.startswith("marked ooms:")
    res = CliRunner().invoke(main, ["mark", "bad-ish", "--comfyui", str(inst.root)])
    assert res.exit_code == EXIT_CONFIG and "use fits, ooms or skip" in res.output


# ---------------------------------------------------------------------------- discovery


def test_the_one_install_with_a_session_is_used_when_comfyui_is_omitted(inst, cache) -> None:
    _session(inst, cache)
    assert discover_comfyui(processes=[])[0] == inst.root.resolve()
    res = cli("status")
    assert res.exit_code == 0 and f"bisecting {inst.root}" in res.output


def test_an_install_is_found_in_the_usual_places(tmp_path, cache) -> None:
    home = tmp_path / "home"
    (home / "ComfyUI" / "comfy").mkdir(parents=True)
    (home / "ComfyUI" / "main.py").write_text("")
    (home / "ComfyUI" / "comfyui_version.py").write_text('__version__ = "0.8.0"\n')
    path, found = discover_comfyui(processes=[], home=home)
    assert path == (home / "ComfyUI").resolve() and found is not None
    (home / "comfy" / "ComfyUI").mkdir(parents=True)
    (home / "comfy" / "ComfyUI" / "main.py").write_text("")
    (home / "comfy" / "ComfyUI" / "comfyui_version.py").write_text("")
    with pytest.raises(ConfigError, match="several ComfyUI installs found"):
        discover_comfyui(processes=[], home=home)
    with pytest.raises(ConfigError, match="no ComfyUI install found"):
        discover_comfyui(processes=[], home=tmp_path / "empty")


def test_the_interpreter_is_the_installs_venv(tmp_path) -> None:
    root = tmp_path / "ComfyUI"
    (root / ".venv" / "bin").mkdir(parents=True)
    py = root / ".venv" / "bin" / "python"
    py.symlink_to(sys.executable)
    assert _find_python(None, root, None) == str(py)
    assert _find_python(sys.executable, root, None) == sys.executable
    with pytest.raises(ConfigError, match="--python"):
        _find_python(str(tmp_path / "nope"), root, None)


# ---------------------------------------------------------------------------- snapshots


def _ist(core: str, *nodes: CustomNode) -> InstallState:
    return InstallState(CoreState(commit=core), nodes=nodes)


def test_recorded_install_states_map_to_bisect_states() -> None:
    ist = _ist(
        SHA_A,
        CustomNode("git_pack", "git", commit=SHA_B),
        CustomNode("off_pack", "git", disabled=True, commit=SHA_B),
        CustomNode("reg_pack", "cnr", version="1.2.3"),
        CustomNode("folder_pack", "folder"),
        CustomNode("single.py", "file"),
    )
    state = state_from_install_state(ist, "here")
    assert state == State.of(
        SHA_A,
        {
            "git_pack": SHA_B,
            "off_pack": "disabled",
            "reg_pack": "version:1.2.3",
            "folder_pack": "installed",
            "single.py": "installed",
        },
    )
    with pytest.raises(InputError, match="no ComfyUI commit"):
        state_from_install_state(InstallState(CoreState()), "here")


def test_launch_flags_are_the_words_after_main_py() -> None:
    assert flags_from_argv(["/v/bin/python", "-s", "/x/main.py", "--lowvram", "--port", "1"]) == (
        "--lowvram",
        "--port",
        "1",
    )
    assert flags_from_argv(["python", "C:\\ComfyUI\\main.py", "--cpu"]) == ("--cpu",)
    assert flags_from_argv(["python", "other.py"]) == ()


def _write_snapshot(data_dir: Path, sections: dict[str, Any], prompt: Any = PROMPT) -> Path:
    from snapshot_samples import HOST, incident

    from oom_sentinel.daemon.incidents.snapshot import (
        InstanceInfo,
        SnapshotContent,
        snapshots_dir,
        write_snapshot,
    )

    content = SnapshotContent(
        incident=incident(),
        instance=InstanceInfo("main", "/opt/ComfyUI"),
        host=HOST,
        created_s=1767348672.25,
        prompt=prompt,
        sections=sections,
    )
    return write_snapshot(snapshots_dir(data_dir), content).path


def test_a_snapshot_gives_states_prompt_flags_python_and_the_card_size(tmp_path) -> None:
    from oom_sentinel.daemon.incidents.snapshot import load_snapshot

    path = _write_snapshot(
        tmp_path,
        {
            "regression": suspected_regression(
                _ist(SHA_A, CustomNode("p", "git", commit=SHA_A)),
                _ist(SHA_B, CustomNode("p", "git", commit=SHA_B)),
            ),
            "install_state": dataclasses.replace(
                _ist(SHA_B, CustomNode("p", "git", commit=SHA_B)),
                interpreter=InterpreterFacts(executable="/opt/ComfyUI/.venv/bin/python"),
            ).to_dict(),
            "process": {"argv": ["/opt/ComfyUI/.venv/bin/python", "main.py", "--lowvram"]},
        },
    )
    start = read_snapshot_start(load_snapshot(path))
    assert start.good == State.of(SHA_A, {"p": SHA_A})
    assert start.bad == State.of(SHA_B, {"p": SHA_B})
    assert start.prompt == PROMPT and start.flags == ("--lowvram",)
    assert start.comfyui == Path("/opt/ComfyUI")
    assert start.python == "/opt/ComfyUI/.venv/bin/python"
    assert start.vram_cap_bytes == 24 * GIB  # the event's card: reproduce it on a bigger one
    assert start.budget is None


def test_a_snapshot_without_a_good_state_is_refused_with_a_hint(tmp_path, cache) -> None:
    path = _write_snapshot(tmp_path / "data", {"install_state": _ist(SHA_B).to_dict()})
    res = CliRunner().invoke(main, [path.name, "--data-dir", str(tmp_path / "data")])
    assert res.exit_code == EXIT_INPUT
    assert "records no earlier good state" in res.output and "oom-bisect run" in res.output


def test_snapshot_words_resolve_as_states(inst, tmp_path) -> None:
    from oom_sentinel.bisect.cli.main import _snapshot_resolver
    from oom_sentinel.daemon.incidents.snapshot import load_snapshot

    good = _ist(inst.core[0])
    bad = _ist(inst.core[-1])
    path = _write_snapshot(
        tmp_path,
        {
            "regression": suspected_regression(good, bad),
            "install_state": bad.to_dict(),
        },
    )
    resolve = _snapshot_resolver(str(tmp_path))
    assert resolve(path.name + ":good") == State.of(inst.core[0])
    assert resolve(path.name + ":bad") == State.of(inst.core[-1])
    assert resolve(path.name[:12]) == State.of(inst.core[-1])  # a unique prefix: the crash state
    assert snapshot_state(load_snapshot(path), "crash") == State.of(inst.core[-1])


def test_json_ends_with_an_error_object_when_the_run_fails(inst, cache, tmp_path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "run",
            "--comfyui",
            str(inst.root),
            "--python",
            sys.executable,
            "--json",
            "--workflow",
            _wf(tmp_path),
            "--good",
            "comfyui=nope",
            "--bad",
            "comfyui=HEAD",
        ],
    )
    assert res.exit_code == EXIT_CONFIG
    doc = json.loads(res.stdout)
    assert doc["result"] == "error" and "'nope' is not a commit" in doc["message"]
    assert doc["culprits"] == [] and doc["measurements"] == 0


def test_run_with_other_endpoints_than_the_session_is_refused(inst, cache, tmp_path) -> None:
    sess = _session(inst, cache)
    log = sess.log_text()
    res = CliRunner().invoke(
        main,
        [
            "run",
            "--comfyui",
            str(inst.root),
            "--python",
            sys.executable,
            "--workflow",
            _wf(tmp_path),
            "--good",
            "comfyui=HEAD~2",
            "--bad",
            "comfyui=HEAD",
        ],
    )
    assert res.exit_code == EXIT_ERROR
    assert "a bisect with another good state is in progress" in res.output
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"9": {"class_type": "Sleep", "inputs": {"seconds": 1}}}))
    res = CliRunner().invoke(
        main,
        ["run", "--comfyui", str(inst.root), "--python", sys.executable, "--workflow", str(other)],
    )
    assert res.exit_code == EXIT_ERROR and "another workflow" in res.output
    assert Session.open(sess.paths).log_text() == log


def test_a_snapshot_of_a_vram_oom_watches_vram_only(tmp_path) -> None:
    from oom_sentinel.daemon.incidents.snapshot import load_snapshot

    path = _write_snapshot(
        tmp_path,
        {
            "regression": suspected_regression(_ist(SHA_A), _ist(SHA_B)),
        },
    )
    assert read_snapshot_start(load_snapshot(path)).pool == "vram"
