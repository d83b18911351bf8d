"""``oom-sentinel states``: show, capture, diff, history and export from the command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from install_builder import Install, build_install, commit_files, git

from oom_sentinel.daemon.cli.main import main
from oom_sentinel.daemon.core.errors import EXIT_INPUT
from oom_sentinel.daemon.install.manager_snapshots import read_manager_snapshot, read_state_file

CORE = "0123456789abcdef0123456789abcdef01234567"
FOO = "89abcdef0123456789abcdef0123456789abcdef"
MANAGER_FILE: dict[str, Any] = {
    "comfyui": CORE,
    "git_custom_nodes": {
        "https://github.com/someone/ComfyUI-Foo.git": {"hash": FOO + "\n", "disabled": False},
        "git@github.com:other/bar-nodes": {"hash": "unknown", "disabled": True},
    },
    "cnr_custom_nodes": {"comfyui-kjnodes": "1.0.5"},
    "file_custom_nodes": [{"filename": "my_node.py", "disabled": False}],
    "pips": {"torch==2.5.1+cu124": ""},
}


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_error_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Install:
    return build_install(tmp_path_factory.mktemp("install"))


@pytest.fixture
def manager_file(tmp_path: Path) -> Path:
    path = tmp_path / "2025-01-02_10-11-12_snapshot.json"
    path.write_text(json.dumps(MANAGER_FILE, indent=4))
    return path


# ---------------------------------------------------------------------------------------------
# show


def test_show_json_of_a_manager_file(manager_file: Path) -> None:
    result = run("states", "show", str(manager_file), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["comfyui"] == CORE
    assert data["nodes"] == {
        "ComfyUI-Foo": {"commit": FOO, "version": None, "disabled": False, "url": "https://github.com/someone/ComfyUI-Foo", "kind": "git", "content_hash": None},
        "bar-nodes": {"commit": None, "version": None, "disabled": True, "url": "https://github.com/other/bar-nodes", "kind": "git", "content_hash": None},
        "comfyui-kjnodes": {"commit": None, "version": "1.0.5", "disabled": False, "url": None, "kind": "cnr", "content_hash": None},
        "my_node.py": {"commit": None, "version": None, "disabled": False, "url": None, "kind": "file", "content_hash": None},
    }  # fmt: skip
    assert data["source"] == f"manager:{manager_file.name}"
    assert data["state"]["pip"] == ["torch==2.5.1+cu124"]


def test_show_yaml_with_null_comfyui(tmp_path: Path) -> None:
    path = tmp_path / "snap.yaml"
    path.write_text("custom_nodes:\n  comfyui: null\n  git_custom_nodes: {}\n  pips: null\n")
    data = json.loads(run("states", "show", str(path), "--json").stdout)
    assert data["comfyui"] is None and data["nodes"] == {}


def test_show_human_output(manager_file: Path) -> None:
    result = run("states", "show", str(manager_file))
    assert result.exit_code == 0
    out = result.stdout
    assert f"ComfyUI {CORE[:12]}" in out
    assert re.search(
        r"bar-nodes\s+git\s+unknown\s+https://github.com/other/bar-nodes\s+\[disabled\]", out
    )
    assert re.search(r"comfyui-kjnodes\s+cnr\s+1\.0\.5", out)
    assert "pip: 1 packages (torch==2.5.1+cu124)" in out


def test_show_resolves_unknown_commits_from_an_install(built: Install, tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"git_custom_nodes": {"git@github.com:other/bar-nodes": {"hash": "unknown", "disabled": False}}}))  # fmt: skip
    data = json.loads(
        run("states", "show", str(path), "--json", "--resolve", str(built.root)).stdout
    )
    assert data["nodes"]["bar-nodes"]["commit"] == built.shas["bar-nodes"][0]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"not valid JSON"),
        (json.dumps({"cnr_custom_nodes": {"../../etc": "1.0"}}), r"cnr_custom_nodes\['\.\./\.\./etc'\]: node name '\.\./\.\./etc' would escape custom_nodes/"),
        (json.dumps({"git_custom_nodes": {"https://github.com/o/r": {"hash": 1}}}), r"git_custom_nodes\['https://github.com/o/r'\]\.hash: expected a commit hash string"),
    ],
    ids=["invalid-json", "escaping-name", "bad-hash"],
)  # fmt: skip
def test_show_a_malformed_file_is_one_line_and_exit_3(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = run("states", "show", str(path), "--json")
    assert result.exit_code == EXIT_INPUT
    assert re.match(
        r"^oom-sentinel: error: " + re.escape(str(path)) + ": " + message, one_error_line(result)
    )
    assert result.stdout == ""


def test_show_a_missing_file_is_exit_3(tmp_path: Path) -> None:
    result = run("states", "show", str(tmp_path / "nope.json"))
    assert result.exit_code == EXIT_INPUT
    assert one_error_line(result).endswith("nope.json: no such file")


# ---------------------------------------------------------------------------------------------
# capture, export


def test_capture_json_and_output_file_round_trip(built: Install, tmp_path: Path) -> None:
    out = tmp_path / "state.json"
    result = run("states", "capture", str(built.root), "--json", "--no-python", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["comfyui"] == built.shas["ComfyUI"][-1]
    assert data["nodes"]["bar-nodes"]["commit"] == built.shas["bar-nodes"][0]
    assert data["nodes"]["Legacy-Pack"]["disabled"] is True
    assert read_state_file(out).state_id == data["state_id"]
    shown = json.loads(run("states", "show", str(out), "--json").stdout)
    assert shown["state_id"] == data["state_id"]


def test_capture_with_the_interpreter_records_pip(built: Install) -> None:
    result = run("states", "capture", str(built.root), "--json", "--python", sys.executable)
    data = json.loads(result.stdout)
    assert data["state"]["interpreter"]["python_version"] == ".".join(
        map(str, sys.version_info[:3])
    )
    assert any(line.lower().startswith("click==") for line in data["state"]["pip"])


def test_capture_of_a_non_install_is_exit_3(tmp_path: Path) -> None:
    result = run("states", "capture", str(tmp_path))
    assert result.exit_code == EXIT_INPUT
    assert "not a ComfyUI install (no main.py" in one_error_line(result)


def test_export_manager_snapshot(built: Install, tmp_path: Path) -> None:
    folder = tmp_path / "snapshots"
    result = run("states", "export", str(built.root), "--manager", "--no-python", "-d", str(folder))
    assert result.exit_code == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.parent == folder
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_oom-sentinel\.json", path.name)
    data = json.loads(path.read_text())
    assert list(data) == [
        "comfyui",
        "git_custom_nodes",
        "cnr_custom_nodes",
        "file_custom_nodes",
        "pips",
    ]
    assert read_manager_snapshot(path).comfyui.commit == built.shas["ComfyUI"][-1]


def test_export_our_format_into_the_current_folder(
    built: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("states", "export", str(built.root), "--no-python")
    assert result.exit_code == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.parent == tmp_path and path.name.endswith("_oom-sentinel.state.json")
    assert read_state_file(path).comfyui.commit == built.shas["ComfyUI"][-1]


# ---------------------------------------------------------------------------------------------
# diff, history


@pytest.fixture
def pulled(tmp_path: Path) -> tuple[Install, Path]:
    """An install captured to a file, then updated with `git pull` in one pack."""
    inst = build_install(tmp_path / "i")
    before = tmp_path / "before.json"
    assert run("states", "capture", str(inst.root), "--no-python", "-o", str(before)).exit_code == 0
    up = inst.upstreams["ComfyUI-Foo"]
    commit_files(up, {"nodes.py": "V = 4\n"}, "Keep the VAE on the GPU", inst.clock.tick())
    git(inst.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only", at=inst.clock.tick())
    return inst, before


def test_diff_file_against_install(pulled: tuple[Install, Path]) -> None:
    inst, before = pulled
    result = run("states", "diff", str(before), str(inst.root), "--no-python")
    assert result.exit_code == 0, result.stderr
    assert re.search(
        r'custom_nodes/ComfyUI-Foo: [0-9a-f]{12}\.\.[0-9a-f]{12} \(1 new commit: "Keep the VAE on the GPU"\)',
        result.stdout,
    )


def test_diff_json_of_two_files_with_repos(pulled: tuple[Install, Path], tmp_path: Path) -> None:
    inst, before = pulled
    after = tmp_path / "after.json"
    run("states", "capture", str(inst.root), "--no-python", "-o", str(after))
    result = run("states", "diff", str(before), str(after), "--json")
    data = json.loads(result.stdout)
    [foo] = data["repos"]
    assert foo["repo"] == "ComfyUI-Foo" and foo["range"]["ahead"] == 1
    assert foo["range"]["last_subject"] == "Keep the VAE on the GPU"


def test_diff_of_identical_states_says_so(built: Install, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    run("states", "capture", str(built.root), "--no-python", "-o", str(out))
    result = run("states", "diff", str(out), str(out))
    assert "no changes" in result.stdout


def test_history_names_the_state_before_the_last_update(pulled: tuple[Install, Path]) -> None:
    inst, _before = pulled
    data = json.loads(run("states", "history", str(inst.root), "--json").stdout)
    states = data["states"]
    assert states[-1]["event"].startswith("custom_nodes/ComfyUI-Foo: pull")
    assert data["before_last_update"] == states[-2]["state_id"]
    assert states[-2]["nodes"]["ComfyUI-Foo"]["commit"] == inst.shas["ComfyUI-Foo"][-1]
    human = run("states", "history", str(inst.root)).stdout
    assert f"state before the last update: {states[-2]['state_id']}" in human


def test_states_group_is_reachable_through_the_installed_command(manager_file: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "oom_sentinel.daemon",
            "states",
            "show",
            str(manager_file),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["comfyui"] == CORE
