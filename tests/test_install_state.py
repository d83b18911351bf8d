"""Capturing an install: core and every kind of custom node, read without changing anything."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from install_builder import (
    Install,
    build_install,
    git,
    repo_fingerprint,
    tree_fingerprint,
)

from oom_sentinel.daemon.comfy.interpreter import InterpreterFacts
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.install.state import (
    CoreState,
    CustomNode,
    InstallState,
    capture_install,
    content_hash,
    normalize_remote_url,
    parse_porcelain_z,
    read_comfyui_version,
    resolve_comfyui_root,
    validate_node_name,
    watch_paths,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """One install shared by the read-only tests of this module (building it runs ~60 git
    commands)."""
    return build_install(tmp_path_factory.mktemp("install"))


@pytest.fixture
def fresh(tmp_path: Path) -> Install:
    """An install a test may change."""
    return build_install(tmp_path)


# ---------------------------------------------------------------------------------------------
# Core


def test_core_commit_branch_url_and_version_are_read(built: Install) -> None:
    state = capture_install(built.root)
    assert state.comfyui == CoreState(
        commit=built.shas["ComfyUI"][-1],
        branch="master",
        url="https://github.com/comfyanonymous/ComfyUI",
        dirty=(),
        version="0.3.2",
    )
    assert state.root == str(built.root.resolve())
    assert state.pip is None and state.interpreter is None


def test_dirty_files_list_modified_and_untracked_paths(fresh: Install) -> None:
    (fresh.root / "main.py").write_text("print('patched locally')\n")
    (fresh.root / "my_patch.py").write_text("x = 1\n")
    (fresh.root / "custom_nodes" / "ignored.py").write_text("")  # gitignored: not dirty
    state = capture_install(fresh.root)
    assert state.comfyui.dirty == ("main.py", "my_patch.py")


def test_detached_core_has_no_branch(fresh: Install) -> None:
    first = fresh.shas["ComfyUI"][0]
    git(fresh.root, "checkout", "-q", first)
    state = capture_install(fresh.root)
    assert state.comfyui.commit == first
    assert state.comfyui.branch is None
    assert state.comfyui.version == "0.3.1"


def test_install_without_git_has_unknown_commit_but_a_version(tmp_path: Path) -> None:
    root = tmp_path / "ComfyUI"
    (root / "custom_nodes").mkdir(parents=True)
    (root / "main.py").write_text("")
    (root / "comfyui_version.py").write_text('__version__ = "0.8.0"\n')
    state = capture_install(root)
    assert state.comfyui == CoreState(
        commit=None, branch=None, url=None, dirty=None, version="0.8.0"
    )
    assert state.nodes == ()


def test_portable_layout_is_found_from_its_parent(built: Install) -> None:
    # ComfyUI_windows_portable/ holds ComfyUI/ (and python_embeded/)
    assert resolve_comfyui_root(built.root.parent) == built.root.resolve()


def test_a_folder_without_main_py_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"not a ComfyUI install \(no main.py"):
        capture_install(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('__version__ = "0.3.10"\n', "0.3.10"),
        ("__version__ = '0.8.0'  # generated\n", "0.8.0"),
        ('# x\n__version__: str = "1.2.3"\n', "1.2.3"),
        ("VERSION = 3\n", None),
    ],
    ids=["double-quotes", "single-quotes-comment", "annotated", "no-version"],
)
def test_comfyui_version_is_read_without_importing(
    tmp_path: Path, text: str, expected: str | None
) -> None:
    (tmp_path / "comfyui_version.py").write_text(text)
    assert read_comfyui_version(tmp_path) == expected


def test_version_falls_back_to_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "ComfyUI"\nversion = "0.3.9"\n')
    assert read_comfyui_version(tmp_path) == "0.3.9"


# ---------------------------------------------------------------------------------------------
# Custom nodes: one row per convention


NODE_TABLE = [
    # name, kind, disabled, url, version, cnr_id, entry
    ("ComfyUI-Foo", "git", False, "https://github.com/someone/ComfyUI-Foo", None, None, "ComfyUI-Foo"),
    ("bar-nodes", "git", False, "https://github.com/other/bar-nodes", None, None, "bar-nodes"),
    ("packed-pack", "git", False, "https://github.com/third/packed-pack", None, None, "packed-pack"),
    ("nightly-pack", "git", False, "https://github.com/reg/nightly-pack", None, "nightly-pack", "nightly-pack"),
    ("Legacy-Pack", "git", True, "https://github.com/me/Legacy-Pack", None, None, "Legacy-Pack.disabled"),
    ("comfyui-kjnodes", "cnr", False, None, "1.0.5", "comfyui-kjnodes", "comfyui-kjnodes"),
    ("comfyui-impact-pack", "cnr", True, None, "8.8.1", "comfyui-impact-pack", ".disabled/comfyui-impact-pack@8_8_1"),
    ("ComfyUI-Old", "folder", True, None, None, None, ".disabled/ComfyUI-Old"),
    ("plain-folder", "folder", False, None, None, None, "plain-folder"),
    ("my_node.py", "file", False, None, None, None, "my_node.py"),
    ("old_node.py", "file", True, None, None, None, "old_node.py.disabled"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "kind", "disabled", "url", "version", "cnr_id", "entry"),
    NODE_TABLE,
    ids=[row[0] for row in NODE_TABLE],
)
def test_each_node_convention_is_captured(
    built: Install,
    name: str,
    kind: str,
    disabled: bool,
    url: str | None,
    version: str | None,
    cnr_id: str | None,
    entry: str,
) -> None:
    node = capture_install(built.root).node_table()[name]
    assert (node.kind, node.disabled, node.url, node.version, node.cnr_id, node.entry) == (
        kind,
        disabled,
        url,
        version,
        cnr_id,
        entry,
    )
    if kind == "git":
        assert node.commit is not None and len(node.commit) == 40
        assert node.content_hash is None
    elif kind in ("folder", "file"):
        assert node.content_hash is not None and node.content_hash.startswith("sha256:")
        assert node.commit is None
    else:
        assert node.commit is None and node.content_hash is None


def test_only_node_entries_are_captured(built: Install) -> None:
    names = {n.name for n in capture_install(built.root).nodes}
    assert names == {row[0] for row in NODE_TABLE}  # no __pycache__, .hidden, README.txt, *.example


def test_git_commits_follow_detached_and_packed_heads(built: Install) -> None:
    table = capture_install(built.root).node_table()
    assert table["bar-nodes"].commit == built.shas["bar-nodes"][0]
    assert table["bar-nodes"].branch is None
    # After `git pack-refs --all --prune` refs/heads/master exists only in packed-refs.
    packed = built.custom_nodes / "packed-pack" / ".git"
    assert not (packed / "refs" / "heads" / "master").exists()
    assert table["packed-pack"].commit == built.shas["packed-pack"][-1]
    assert table["packed-pack"].branch == "master"
    assert table["ComfyUI-Foo"].commit == built.shas["ComfyUI-Foo"][-1]


def test_credentials_in_a_remote_url_never_reach_the_state(built: Install) -> None:
    state = capture_install(built.root)
    assert "ghp_s3cretTOKEN" not in state.to_json()
    assert "someone:" not in state.to_json()


def test_a_broken_git_dir_gives_unknown_commit_not_an_error(fresh: Install) -> None:
    broken = fresh.custom_nodes / "broken-pack"
    broken.mkdir()
    (broken / ".git").write_text("gitdir: ../nowhere\n")
    node = capture_install(fresh.root).node_table()["broken-pack"]
    assert (node.kind, node.commit, node.url) == ("git", None, None)


def test_a_worktree_style_git_file_is_followed(fresh: Install) -> None:
    src = fresh.upstreams["ComfyUI-Foo"]
    git(src, "worktree", "add", "-q", "--detach", str(fresh.custom_nodes / "wt-pack"), "HEAD~1")
    node = capture_install(fresh.root).node_table()["wt-pack"]
    assert node.kind == "git"
    assert node.commit == fresh.shas["ComfyUI-Foo"][1]


def test_extra_custom_node_dirs_are_scanned(built: Install, tmp_path: Path) -> None:
    extra = tmp_path / "more_nodes"
    extra.mkdir()
    (extra / "extra_node.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    state = capture_install(built.root, extra_custom_nodes_dirs=[extra])
    assert state.node_table()["extra_node.py"].kind == "file"


# ---------------------------------------------------------------------------------------------
# Content hashes


def test_content_hash_ignores_bytecode_and_changes_with_source(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    (pack / "__pycache__").mkdir(parents=True)
    (pack / "__init__.py").write_text("A = 1\n")
    before = content_hash(pack)
    (pack / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"bytecode")
    (pack / "stale.pyc").write_bytes(b"bytecode")
    assert content_hash(pack) == before
    (pack / "__init__.py").write_text("A = 2\n")
    assert content_hash(pack) != before


def test_content_hash_of_big_files_uses_size_only(tmp_path: Path) -> None:
    from oom_sentinel.daemon.install.state import CONTENT_HASH_FULL_LIMIT_BYTES

    pack = tmp_path / "pack"
    pack.mkdir()
    big = pack / "model.safetensors"
    big.write_bytes(b"a" * (CONTENT_HASH_FULL_LIMIT_BYTES + 1))
    first = content_hash(pack)
    big.write_bytes(b"b" * (CONTENT_HASH_FULL_LIMIT_BYTES + 1))  # same size, new bytes
    assert content_hash(pack) == first
    big.write_bytes(b"b" * (CONTENT_HASH_FULL_LIMIT_BYTES + 2))
    assert content_hash(pack) != first


def test_content_hash_does_not_follow_symlinked_folders(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "__init__.py").write_text("")
    (pack / "loop").symlink_to(pack, target_is_directory=True)
    assert content_hash(pack) is not None  # terminates; the link is hashed as a link


# ---------------------------------------------------------------------------------------------
# The install is never modified


def test_capture_never_modifies_the_install(fresh: Install) -> None:
    # Give git something to refresh: a dirty tracked file, a stash, a stat-only change.
    (fresh.root / "main.py").write_text("print('local edit')\n")
    git(fresh.root, "stash", "-q")
    (fresh.root / "main.py").write_text("print('another local edit')\n")
    repos = [fresh.root] + [
        p.parent for p in fresh.custom_nodes.rglob(".git") if p.parent != fresh.custom_nodes
    ]
    for repo in repos:  # settle every index, then make each one stale again
        git(repo, "status", "-s")
    for stale in [fresh.root / "comfyui_version.py", *(r / "__init__.py" for r in repos[1:])]:
        if stale.exists():
            os.utime(stale, ns=(stale.stat().st_atime_ns, stale.stat().st_mtime_ns + 10**9))
    before = {str(r): repo_fingerprint(r) for r in repos}
    tree_before = tree_fingerprint(fresh.root)
    capture_install(fresh.root, interpreter=sys.executable, pip=False)
    capture_install(fresh.root)
    assert {str(r): repo_fingerprint(r) for r in repos} == before
    assert tree_fingerprint(fresh.root) == tree_before


def test_capture_with_the_interpreter_never_imports_torch_here(built: Install) -> None:
    state = capture_install(built.root, interpreter=sys.executable, pip=False)
    assert state.interpreter is not None
    assert state.interpreter.python_version == ".".join(map(str, sys.version_info[:3]))
    assert "torch" not in sys.modules


# ---------------------------------------------------------------------------------------------
# State identity


def test_identical_states_share_an_id_across_captures(built: Install) -> None:
    a = capture_install(built.root, now_epoch_s=1.0)
    b = capture_install(built.root, now_epoch_s=2.0)
    assert a.captured_at_epoch_s != b.captured_at_epoch_s
    assert a.state_id == b.state_id
    assert len(a.state_id) == 16


def test_state_id_changes_with_a_node_commit(fresh: Install) -> None:
    before = capture_install(fresh.root)
    git(fresh.custom_nodes / "ComfyUI-Foo", "checkout", "-q", "HEAD~1")
    after = capture_install(fresh.root)
    assert before.state_id != after.state_id


def test_state_id_changes_when_a_node_is_disabled(fresh: Install) -> None:
    before = capture_install(fresh.root)
    src = fresh.custom_nodes / "plain-folder"
    shutil.move(src, fresh.custom_nodes / "plain-folder.disabled")
    after = capture_install(fresh.root)
    assert after.node_table()["plain-folder"].disabled
    assert before.state_id != after.state_id


def test_state_id_changes_with_pip_lines_but_not_their_order() -> None:
    core = CoreState(commit="a" * 40)
    a = InstallState(core, pip=("numpy==1.26.4", "torch==2.5.1"))
    b = InstallState(core, pip=("torch==2.5.1", "numpy==1.26.4"))
    c = InstallState(core, pip=("torch==2.6.0", "numpy==1.26.4"))
    assert a.state_id == b.state_id != c.state_id


def test_state_id_ignores_source_root_url_branch_and_gpu_list() -> None:
    node = CustomNode("foo", "git", commit="b" * 40, url="https://github.com/o/foo")
    facts = InterpreterFacts(executable="/a/python", python_version="3.11.7", torch_version="2.5.1")
    a = InstallState(CoreState(commit="a" * 40, branch="master"), (node,), interpreter=facts)
    b = InstallState(
        CoreState(commit="a" * 40, branch=None, url="https://x/y"),
        (CustomNode("foo", "git", commit="b" * 40, url=None, entry="foo"),),
        interpreter=InterpreterFacts(
            executable="/b/python", python_version="3.11.7", torch_version="2.5.1"
        ),
        root="/elsewhere",
        source="reflog",
        captured_at_epoch_s=5.0,
    )
    assert a.state_id == b.state_id


def test_state_json_round_trips(built: Install) -> None:
    state = capture_install(built.root, interpreter=sys.executable, pip=True)
    assert state.pip and any(line.lower().startswith("gitpython==") for line in state.pip)
    again = InstallState.from_json(state.to_json())
    assert again == state
    assert again.state_id == state.state_id
    assert json.loads(state.to_json())["state_id"] == state.state_id


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="other"), r"format: expected"),
        (lambda d: d.update(nodes={}), r"nodes: expected a list"),
        (lambda d: d["nodes"][0].update(kind="zip"), r"nodes\[0\]\.kind: expected one of"),
        (lambda d: d["nodes"][0].update(name="../evil"), r"nodes\[0\]\.name: node name '\.\./evil' would escape"),
        (lambda d: d["nodes"][0].update(disabled="yes"), r"nodes\[0\]\.disabled: expected true or false"),
        (lambda d: d["comfyui"].update(commit="HEAD"), r"comfyui\.commit: not a commit hash"),
        (lambda d: d.update(pip="numpy"), r"pip: expected a list of strings"),
        (lambda d: d.update(comfyui=None), r"comfyui: expected an object"),
    ],
    ids=["format", "nodes-type", "kind", "escape", "disabled-type", "commit", "pip", "comfyui"],
)  # fmt: skip
def test_a_malformed_state_file_names_the_field(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    node = CustomNode("foo", "git", commit="b" * 40)
    data = InstallState(CoreState(commit="a" * 40), (node,)).to_dict()
    mutate(data)
    with pytest.raises(InputError, match=r"^mystate\.json: " + message):
        InstallState.from_dict(data, "mystate.json")


# ---------------------------------------------------------------------------------------------
# URLs, names, porcelain


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("git@github.com:o/r.git", "https://github.com/o/r"),
        ("https://github.com/o/r", "https://github.com/o/r"),
        ("https://github.com/o/r.git/", "https://github.com/o/r"),
        ("ssh://git@github.com/o/r.git", "https://github.com/o/r"),
        ("ssh://git@github.com:22/o/r", "https://github.com/o/r"),
        ("git://github.com/o/r.git", "https://github.com/o/r"),
        ("http://github.com/o/r", "https://github.com/o/r"),
        ("https://user:ghp_token@github.com/o/r.git", "https://github.com/o/r"),
        ("https://GitHub.com/O/R?x=1#frag", "https://github.com/O/R"),
        ("git@gitlab.example.org:group/sub/r.git", "https://gitlab.example.org/group/sub/r"),
        ("http://gitea.local:3000/o/r.git", "http://gitea.local:3000/o/r"),
        ("/srv/git/r.git", "/srv/git/r.git"),
        ("C:\\repos\\r", "C:\\repos\\r"),
        ("  ", None),
    ],
    ids=[
        "scp-ssh", "https", "trailing-slash", "ssh-scheme", "ssh-port", "git-scheme",
        "http-github", "credentials", "query-fragment-case", "other-host-scp", "other-host-port",
        "local-path", "windows-path", "blank",
    ],
)  # fmt: skip
def test_remote_urls_normalize_to_one_spelling(url: str, expected: str | None) -> None:
    assert normalize_remote_url(url) == expected


@pytest.mark.parametrize(
    "name",
    ["../x", "..", ".", "a/b", "a\\b", "/etc/passwd", "C:evil", "", "nul\x00byte"],
    ids=[
        "dotdot-prefix",
        "dotdot",
        "dot",
        "slash",
        "backslash",
        "absolute",
        "drive",
        "empty",
        "nul",
    ],
)
def test_node_names_that_would_escape_custom_nodes_are_rejected(name: str) -> None:
    with pytest.raises(InputError):
        validate_node_name(name, "file.json: node")


def test_porcelain_parser_keeps_new_path_of_renames() -> None:
    out = " M main.py\0R  new.py\0old.py\0?? untracked dir/x.py\0"
    assert parse_porcelain_z(out) == ("main.py", "new.py", "untracked dir/x.py")


def test_watch_paths_cover_core_refs_custom_nodes_and_node_heads(built: Install) -> None:
    paths = {str(p.relative_to(built.root)) for p in watch_paths(built.root)}
    assert {".git/HEAD", ".git/refs/heads", ".git/packed-refs", "custom_nodes"} <= paths
    assert "custom_nodes/bar-nodes/.git/HEAD" in paths
    assert "custom_nodes/Legacy-Pack.disabled/.git/HEAD" in paths
