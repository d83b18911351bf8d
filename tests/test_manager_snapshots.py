"""ComfyUI-Manager snapshot files: every format, location and quirk read as states; our states
written back in Manager's layout; malformed files refused with one line naming the field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from install_builder import Install, build_install

from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.install.manager_snapshots import (
    find_manager_snapshots,
    manager_states,
    parse_manager_snapshot,
    parse_manager_snapshot_filename_time,
    read_manager_snapshot,
    read_state_file,
    resolve_unknown_commits,
    to_manager_snapshot,
    write_manager_snapshot,
)
from oom_sentinel.daemon.install.state import InstallState, capture_install

CORE = "0123456789abcdef0123456789abcdef01234567"
FOO = "89abcdef0123456789abcdef0123456789abcdef"

# Shape and quirks of a real 4.x snapshot (research/anchors-manager-cli.md §1.2): a detached
# pack's hash carries the newline of .git/HEAD, packed refs give "unknown", URLs are verbatim
# from .git/config (HTTPS with .git, SCP-style SSH, ssh://), pips mix pins, a direct reference,
# an editable line and pip's comment line.
MANAGER_SNAPSHOT: dict[str, Any] = {
    "comfyui": CORE,
    "git_custom_nodes": {
        "https://github.com/someone/ComfyUI-Foo.git": {"hash": FOO + "\n", "disabled": False},
        "git@github.com:other/bar-nodes": {"hash": "unknown", "disabled": True},
        "ssh://git@github.com/third/packed-pack.git": {"hash": "unknown", "disabled": False},
    },
    "cnr_custom_nodes": {"comfyui-impact-pack": "8.8.1", "comfyui-kjnodes": "1.0.5"},
    "file_custom_nodes": [{"filename": "my_node.py", "disabled": False}],
    "pips": {
        "torch==2.5.1+cu124": "",
        "numpy==1.26.4": "",
        "mypkg": "file:///wheels/mypkg-0.1-py3-none-any.whl",
        "-e git+https://github.com/o/x@abc123#egg=x": "",
        "# Editable install with no version control (y==0.1)": "",
    },
}

EXPECTED_NODES = {
    "ComfyUI-Foo": ("git", FOO, None, False, "https://github.com/someone/ComfyUI-Foo"),
    "bar-nodes": ("git", None, None, True, "https://github.com/other/bar-nodes"),
    "packed-pack": ("git", None, None, False, "https://github.com/third/packed-pack"),
    "comfyui-impact-pack": ("cnr", None, "8.8.1", False, None),
    "comfyui-kjnodes": ("cnr", None, "1.0.5", False, None),
    "my_node.py": ("file", None, None, False, None),
}

EXPECTED_PIP = (
    "-e git+https://github.com/o/x@abc123#egg=x",
    "mypkg @ file:///wheels/mypkg-0.1-py3-none-any.whl",
    "numpy==1.26.4",
    "torch==2.5.1+cu124",
)


def project(state: InstallState) -> dict[str, tuple[Any, ...]]:
    return {
        key: (n.kind, n.commit, n.version, n.disabled, n.url)
        for key, n in state.node_table().items()
    }


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4))
    return path


def write_yaml(path: Path, data: Any) -> Path:
    # What Manager does for a .yaml --output: wrap in custom_nodes and yaml.dump (keys sorted).
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.dump({"custom_nodes": data}, allow_unicode=True))
    return path


# ---------------------------------------------------------------------------------------------
# Reading: every format in every location


LOCATIONS = [
    ("v4", "user/__manager/snapshots/2025-01-02_10-11-12_snapshot.json"),
    ("v3", "user/default/ComfyUI-Manager/snapshots/2025-01-03_08-00-00_autosave.json"),
    ("legacy", "custom_nodes/ComfyUI-Manager/snapshots/2024-06-01_12-30-45_cli-autosave.json"),
    ("v4", "user/__manager/snapshots/2025-01-04_09-15-00_snapshot.yaml"),
]


@pytest.mark.parametrize(
    ("layout", "relative"), LOCATIONS, ids=["v4-json", "v3-json", "legacy-json", "v4-yaml"]
)
def test_manager_snapshot_is_read_with_its_quirks(
    tmp_path: Path, layout: str, relative: str
) -> None:
    path = tmp_path / relative
    (write_yaml if path.suffix == ".yaml" else write_json)(path, MANAGER_SNAPSHOT)
    [found] = find_manager_snapshots(tmp_path)
    assert (found.path, found.layout) == (path, layout)
    state = read_manager_snapshot(path)
    assert state.comfyui.commit == CORE
    assert project(state) == EXPECTED_NODES
    assert state.pip == EXPECTED_PIP
    assert state.source == f"manager:{path.name}"
    assert state.captured_at_epoch_s == parse_manager_snapshot_filename_time(path.name)


def test_json_and_yaml_of_one_snapshot_are_one_state(tmp_path: Path) -> None:
    a = read_manager_snapshot(write_json(tmp_path / "a.json", MANAGER_SNAPSHOT))
    b = read_manager_snapshot(write_yaml(tmp_path / "b.yaml", MANAGER_SNAPSHOT))
    assert a.state_id == b.state_id


def test_snapshots_from_all_locations_are_listed_oldest_first(tmp_path: Path) -> None:
    for _layout, relative in LOCATIONS:
        write_json(tmp_path / relative, MANAGER_SNAPSHOT)
    (tmp_path / "user" / "__manager" / "snapshots" / "notes.txt").write_text("not a snapshot")
    found = find_manager_snapshots(tmp_path)
    assert [f.path.name for f in found] == [
        "2024-06-01_12-30-45_cli-autosave.json",
        "2025-01-02_10-11-12_snapshot.json",
        "2025-01-03_08-00-00_autosave.json",
        "2025-01-04_09-15-00_snapshot.yaml",
    ]
    assert [f.layout for f in found] == ["legacy", "v4", "v3", "v4"]


def test_user_directory_flag_moves_the_snapshot_folders(tmp_path: Path) -> None:
    elsewhere = tmp_path / "shared-user"
    write_json(elsewhere / "__manager" / "snapshots" / "2025-02-02_00-00-00_snapshot.json", {})
    write_json(tmp_path / "root" / "user" / "__manager" / "snapshots" / "x.json", {})
    found = find_manager_snapshots(tmp_path / "root", user_dir=elsewhere)
    assert [f.path.parent.parent.parent for f in found] == [elsewhere]


def test_renamed_snapshot_takes_its_time_from_the_file(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "user" / "__manager" / "snapshots" / "before-update.json", {"comfyui": None}
    )
    os.utime(path, (1_700_000_000, 1_700_000_000))
    [(found, state)] = manager_states(tmp_path)
    assert found.at_epoch_s == 1_700_000_000
    assert isinstance(state, InstallState) and state.captured_at_epoch_s == 1_700_000_000


def test_one_bad_file_does_not_hide_the_others(tmp_path: Path) -> None:
    folder = tmp_path / "user" / "__manager" / "snapshots"
    write_json(folder / "2025-01-01_00-00-00_snapshot.json", MANAGER_SNAPSHOT)
    (folder / "2025-01-02_00-00-00_snapshot.json").write_text("{truncated")
    results = manager_states(tmp_path)
    assert isinstance(results[0][1], InstallState)
    assert isinstance(results[1][1], InputError)


def test_null_comfyui_and_pips_mean_unknown(tmp_path: Path) -> None:
    """Portable installs (no .git) and --no-full-snapshot files."""
    state = parse_manager_snapshot(
        {"comfyui": None, "pips": None, "git_custom_nodes": {}}, "x.json"
    )
    assert state.comfyui.commit is None
    assert state.pip is None
    assert state.nodes == ()


def test_disabled_file_node_suffix_is_understood() -> None:
    state = parse_manager_snapshot(
        {"file_custom_nodes": [{"filename": "old.py.disabled", "disabled": False}]}, "x.json"
    )
    [node] = state.nodes
    assert (node.name, node.kind, node.disabled) == ("old.py", "file", True)


def test_pip_urls_lose_their_credentials() -> None:
    state = parse_manager_snapshot(
        {"pips": {"priv": "git+https://user:ghp_x@github.com/o/priv@abc"}}, "x.json"
    )
    assert state.pip == ("priv @ git+https://github.com/o/priv@abc",)


# ---------------------------------------------------------------------------------------------
# Malformed files: one line naming the file and the field


def _with(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(MANAGER_SNAPSHOT))
    data.update(changes)
    return data


MALFORMED = [
    ("invalid-json", "{\"comfyui\": ", r"not valid JSON"),
    ("top-level-list", [], r"top level: expected an object"),
    ("no-known-keys", {"hello": 1}, r"top level: not a ComfyUI-Manager snapshot"),
    ("comfyui-int", _with(comfyui=5), r"comfyui: expected a commit hash string, got int"),
    ("comfyui-not-hex", _with(comfyui="master"), r"comfyui: not a commit hash: 'master'"),
    ("git-list", _with(git_custom_nodes=[]), r"git_custom_nodes: expected an object"),
    ("git-entry-str", _with(git_custom_nodes={"https://github.com/o/r": "abc"}), r"git_custom_nodes\['https://github.com/o/r'\]: expected an object"),
    ("git-hash-missing", _with(git_custom_nodes={"https://github.com/o/r": {"disabled": False}}), r"git_custom_nodes\['https://github.com/o/r'\]\.hash: missing"),
    ("git-hash-int", _with(git_custom_nodes={"https://github.com/o/r": {"hash": 12, "disabled": False}}), r"git_custom_nodes\['https://github.com/o/r'\]\.hash: expected a commit hash string, got int"),
    ("git-disabled-str", _with(git_custom_nodes={"https://github.com/o/r": {"hash": FOO, "disabled": "no"}}), r"git_custom_nodes\['https://github.com/o/r'\]\.disabled: expected true or false, got 'no'"),
    ("git-url-escapes", _with(git_custom_nodes={"https://github.com/o/..": {"hash": FOO, "disabled": False}}), r"git_custom_nodes\['https://github.com/o/\.\.'\]: node name '\.\.' would escape custom_nodes/"),
    ("cnr-object", _with(cnr_custom_nodes=["a"]), r"cnr_custom_nodes: expected an object"),
    ("cnr-version-list", _with(cnr_custom_nodes={"pack": ["1.0"]}), r"cnr_custom_nodes\['pack'\]: expected a version string"),
    ("cnr-id-escapes", _with(cnr_custom_nodes={"../x": "1.0.0"}), r"cnr_custom_nodes\['\.\./x'\]: node name '\.\./x' would escape"),
    ("files-object", _with(file_custom_nodes={}), r"file_custom_nodes: expected a list"),
    ("file-missing-name", _with(file_custom_nodes=[{"disabled": False}]), r"file_custom_nodes\[0\]\.filename: missing"),
    ("file-absolute", _with(file_custom_nodes=[{"filename": "/etc/x.py", "disabled": False}]), r"file_custom_nodes\[0\]\.filename: node name '/etc/x.py' would escape"),
    ("file-subdir", _with(file_custom_nodes=[{"filename": "a/b.py", "disabled": False}]), r"file_custom_nodes\[0\]\.filename: node name 'a/b.py' would escape"),
    ("pips-list", _with(pips=["numpy==1"]), r"pips: expected an object of freeze lines"),
    ("pips-value-int", _with(pips={"numpy==1": 3}), r"pips\['numpy==1'\]: expected a string"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "content", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_json_names_the_file_and_field(
    tmp_path: Path, case: str, content: Any, message: str
) -> None:
    path = tmp_path / f"{case}.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(InputError, match=r"^" + re.escape(str(path)) + r": " + message) as err:
        read_manager_snapshot(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("comfyui: abc\n", r"custom_nodes: missing"),
        ("custom_nodes: [unclosed\n", r"not valid YAML \(line 2, column 1\)"),
        ("custom_nodes: 5\n", r"custom_nodes: expected a mapping"),
    ],
    ids=["unwrapped", "invalid-yaml", "wrapper-not-mapping"],
)
def test_malformed_yaml_names_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "snap.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=r"^" + re.escape(str(path)) + r": " + message):
        read_manager_snapshot(path)


# ---------------------------------------------------------------------------------------------
# Writing our states as Manager snapshots


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Install:
    return build_install(tmp_path_factory.mktemp("install"))


def test_state_becomes_manager_layout(built: Install) -> None:
    state = capture_install(built.root)
    data = to_manager_snapshot(state)
    assert list(data) == [
        "comfyui",
        "git_custom_nodes",
        "cnr_custom_nodes",
        "file_custom_nodes",
        "pips",
    ]
    assert data["comfyui"] == built.shas["ComfyUI"][-1]
    assert data["git_custom_nodes"]["https://github.com/other/bar-nodes"] == {
        "hash": built.shas["bar-nodes"][0],
        "disabled": False,
    }
    assert data["git_custom_nodes"]["https://github.com/me/Legacy-Pack"]["disabled"] is True
    assert len(data["git_custom_nodes"]) == 5
    # Manager leaves disabled registry packs out (it deliberately does not restore them).
    assert data["cnr_custom_nodes"] == {"comfyui-kjnodes": "1.0.5"}
    assert data["file_custom_nodes"] == [
        {"filename": "my_node.py", "disabled": False},
        {"filename": "old_node.py", "disabled": True},
    ]
    assert data["pips"] is None  # no interpreter asked


def test_pip_lines_become_manager_pips() -> None:
    state = parse_manager_snapshot({"pips": MANAGER_SNAPSHOT["pips"]}, "x.json")
    pips = to_manager_snapshot(state)["pips"]
    assert pips == {
        "-e git+https://github.com/o/x@abc123#egg=x": "",
        "mypkg": "file:///wheels/mypkg-0.1-py3-none-any.whl",
        "numpy==1.26.4": "",
        "torch==2.5.1+cu124": "",
    }


def test_written_snapshot_has_managers_name_indent_and_reads_back(
    built: Install, tmp_path: Path
) -> None:
    state = capture_install(built.root)
    folder = tmp_path / "user" / "__manager" / "snapshots"
    path = write_manager_snapshot(state, folder, at_epoch_s=1_736_000_000)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_oom-sentinel\.json", path.name)
    assert parse_manager_snapshot_filename_time(path.name) == 1_736_000_000
    assert os.listdir(folder) == [path.name]  # no temp file left behind
    text = path.read_text()
    assert text.startswith('{\n    "comfyui": "')
    back = read_manager_snapshot(path)
    assert back.comfyui.commit == state.comfyui.commit
    representable = {
        k: v
        for k, v in project(state).items()
        if v[0] == "git" or (v[0] == "cnr" and not v[3]) or v[0] == "file"
    }
    assert project(back) == representable
    [listed] = find_manager_snapshots(tmp_path)
    assert listed.path == path and listed.layout == "v4"


def test_unknown_hashes_are_resolved_from_the_packs_on_disk(built: Install) -> None:
    disk = capture_install(built.root)
    manager = parse_manager_snapshot(
        {
            "comfyui": None,
            "git_custom_nodes": {
                # Manager's spelling differs from ours: SCP-style, .git, other case.
                "git@github.com:Third/Packed-Pack.git": {"hash": "unknown", "disabled": False},
                "https://github.com/nobody/not-installed": {"hash": "unknown", "disabled": False},
            },
        },
        "x.json",
    )
    resolved = resolve_unknown_commits(manager, disk)
    table = resolved.node_table()
    assert table["Packed-Pack"].commit == built.shas["packed-pack"][-1]
    assert table["not-installed"].commit is None


def test_read_state_file_accepts_our_own_format(built: Install, tmp_path: Path) -> None:
    state = capture_install(built.root)
    path = tmp_path / "state.json"
    path.write_text(state.to_json())
    assert read_state_file(path) == state
    assert read_state_file(write_json(tmp_path / "m.json", MANAGER_SNAPSHOT)).comfyui.commit == CORE
