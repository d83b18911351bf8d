"""Snapshot → bisect on what real installs contain (real git, real files).

A real ComfyUI's repository tracks ``custom_nodes/websocket_image_save.py`` and
``example_node.py.example``; the daemon's capture lists the first as a file node, so every
snapshot of a real install names it. It belongs to the core's commit. Around it, real
``custom_nodes/`` folders hold ``__pycache__`` (also inside ``.disabled/``), ``.example`` files,
packs disabled both ways, a pack added as a git submodule, a symlinked pack and single-file
nodes: each must come out of ``scan_install`` as the right value and be built by the workspace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bisect_git import (
    build_history,
    clone_real_comfyui,
    git,
    install_snapshot,
    make_install,
    node_history,
)
from daemon_harness import snapshots_show
from snapshot_samples import HOST, incident, suspected_regression

from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.state.states import (
    ABSENT,
    DISABLED,
    INSTALLED,
    State,
    resolve_state,
    scan_install,
    state_from_install_state,
)
from oom_sentinel.daemon.incidents.snapshot import (
    InstanceInfo,
    SnapshotContent,
    snapshots_dir,
    write_snapshot,
)
from oom_sentinel.daemon.install.state import capture_install

REAL_ENV = "OOM_SENTINEL_REAL_COMFYUI"


def test_a_snapshot_of_an_install_builds_although_it_lists_the_cores_own_node_file(
    tmp_path: Path,
) -> None:
    inst = make_install(tmp_path / "u", core_commits=8, dirty=False)
    before = install_snapshot(inst)
    # what the daemon records for this install: the tracked file is listed as a node
    recorded = capture_install(inst.root)
    assert "websocket_image_save.py" in recorded.node_table()
    snap_state = state_from_install_state(recorded, "snapshot")
    assert snap_state.node("websocket_image_save.py") == INSTALLED
    older = snap_state.with_values({"comfyui": inst.core[2]})

    install = scan_install(inst.root)
    assert "websocket_image_save.py" in install.core_entries
    words = {"@bad": snap_state, "@good": older}
    bad = resolve_state("@bad", install, snapshot_resolver=words.__getitem__)
    good = resolve_state("@good", install, snapshot_resolver=words.__getitem__)
    assert bad.node("websocket_image_save.py") == ABSENT  # the core's, not a node
    assert bad == install.current_state()

    ws = Workspace.create(tmp_path / "ws", install)
    for state in (good, bad, good):
        ws.switch(state)  # was: "custom_nodes/websocket_image_save.py: not in the install"
        assert ws.current_state() == state
        assert (ws.custom_nodes / "websocket_image_save.py").read_text() == (
            "# tracked single-file node\n"
        )
        assert (ws.custom_nodes / "example_node.py.example").is_file()
    ws.remove()
    assert install_snapshot(inst) == before


@pytest.fixture
def crowded(tmp_path: Path):
    """An install whose custom_nodes/ holds what real ones do, besides make_install's nodes."""
    inst = make_install(tmp_path / "u", core_commits=6, dirty=False)
    cn = inst.custom_nodes
    # a pack added as a submodule of the core (a gitlink in the core, a .git file in the pack)
    sub_src = tmp_path / "upstream" / "sub_pack"
    sub = build_history(sub_src, node_history("sub_pack", 4))
    git(
        inst.root,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "add",
        "-q",
        "-f",
        str(sub_src),
        "custom_nodes/sub_pack",
    )
    git(inst.root, "commit", "-q", "-m", "add sub_pack as a submodule")
    assert (cn / "sub_pack" / ".git").is_file()
    # a git pack and a plain folder that live elsewhere, symlinked in
    elsewhere = tmp_path / "elsewhere"
    sym = build_history(elsewhere / "sym_pack", node_history("sym_pack", 3))
    os.symlink(elsewhere / "sym_pack", cn / "sym_pack")
    (elsewhere / "sym_dir").mkdir()
    (elsewhere / "sym_dir" / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    os.symlink(elsewhere / "sym_dir", cn / "sym_dir")
    # disabled both ways, bytecode caches everywhere, files that are not nodes
    (cn / "off_file.py.disabled").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / ".disabled" / "reg-pack@1_0_2").mkdir(parents=True)
    (cn / ".disabled" / "reg-pack@1_0_2" / "__init__.py").write_text("")
    (cn / ".disabled" / "__pycache__").mkdir()
    (cn / "__pycache__").mkdir()
    (cn / "__pycache__" / "single.cpython-311.pyc").write_bytes(b"\0")
    (cn / "loose_pack" / "__pycache__").mkdir()
    (cn / "loose_pack" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (cn / "my_node.py.example").write_text("# an example of the user's own\n")
    (cn / ".DS_Store").write_bytes(b"\0")
    return inst, sub, sym


def test_scan_reads_every_kind_of_entry_a_real_custom_nodes_folder_holds(crowded) -> None:
    inst, sub, sym = crowded
    install = scan_install(inst.root)
    values = {n.name: (n.kind, n.value()) for n in install.nodes}
    assert values == {
        "node_a": ("git", inst.nodes["node_a"][-1]),
        "node_b": ("git", inst.nodes["node_b"][-1]),
        "old_pack": ("git", DISABLED),  # old_pack.disabled/
        "reg-pack": ("dir", DISABLED),  # .disabled/reg-pack@1_0_2
        "off_file.py": ("file", DISABLED),
        "loose_pack": ("dir", INSTALLED),
        "single.py": ("file", INSTALLED),
        "sub_pack": ("git", sub[-1]),  # the core tracks it as a gitlink: still a node
        "sym_pack": ("git", sym[-1]),
        "sym_dir": ("dir", INSTALLED),
    }
    # the core's own entries; never __pycache__, .example files or hidden files
    assert install.core_entries == {"websocket_image_save.py", "example_node.py.example"}


def test_the_workspace_builds_submodule_symlinked_and_single_file_nodes(
    crowded, tmp_path: Path
) -> None:
    inst, sub, sym = crowded
    before = install_snapshot(inst)
    install = scan_install(inst.root)
    now = install.current_state()
    older = now.with_values(
        {
            "node:sub_pack": sub[1],
            "node:sym_pack": sym[0],
            "node:single.py": DISABLED,
            "node:sym_dir": ABSENT,
            "node:off_file.py": INSTALLED,
        }
    )
    ws = Workspace.create(tmp_path / "ws", install)
    for state in (older, now, older):
        ws.switch(state)
        assert ws.current_state() == state
        for name, commits in (("sub_pack", sub), ("sym_pack", sym)):
            k = commits.index(state.node(name))
            assert (ws.custom_nodes / name / "version.txt").read_text() == f"{k}\n"
            assert not (ws.custom_nodes / name).is_symlink()  # a clone, not the user's folder
        assert (ws.custom_nodes / "single.py").is_file() == (state.node("single.py") == INSTALLED)
        assert (ws.custom_nodes / "sym_dir").is_dir() == (state.node("sym_dir") == INSTALLED)
        assert (ws.custom_nodes / "off_file.py").is_file() == (
            state.node("off_file.py") == INSTALLED
        )
        assert not (ws.custom_nodes / "loose_pack" / "__pycache__").exists()
    ws.remove()
    assert install_snapshot(inst) == before


def test_a_sparse_clone_missing_a_blob_is_checked_out_as_the_user_has_it(tmp_path: Path) -> None:
    """As the real ComfyUI clone here: its mirror lost one blob, the user's checkout leaves
    that file out with a non-cone sparse checkout, and git prints ``error: invalid object``
    on checkout yet exits 0. The workspace takes the user's patterns and builds both commits."""
    root = tmp_path / "ComfyUI"
    root.mkdir()
    git(root, "init", "-q", "-b", "master")
    (root / "main.py").write_text("print('stand-in main')\n")
    (root / "tokenizer.json").write_text("a blob the mirror lost\n")
    (root / "custom_nodes").mkdir()
    (root / "custom_nodes" / "websocket_image_save.py").write_text("# tracked\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    (root / "main.py").write_text("print('stand-in main v2')\n")
    git(root, "commit", "-q", "-am", "second")
    blob = git(root, "rev-parse", "HEAD:tokenizer.json").strip()
    git(root, "sparse-checkout", "set", "--no-cone", "/*", "!/tokenizer.json")
    (root / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # the lost blob
    commits = git(root, "rev-list", "--reverse", "HEAD").split()
    install = scan_install(root)
    ws = Workspace.create(tmp_path / "ws", install)
    for sha in (commits[0], commits[1], commits[0]):
        ws.switch(State.of(sha))
        assert ws.current_state() == State.of(sha)
        assert (ws.comfyui / "main.py").is_file() and not (ws.comfyui / "tokenizer.json").exists()
    ws.remove()


@pytest.mark.real_comfyui
def test_a_real_comfyui_install_scans_and_builds_in_a_workspace(tmp_path: Path) -> None:
    """The real ComfyUI checkout, cloned into tmp (never touched): its tracked node files are
    the core's, a sparse clone's missing blob does not fail a checkout, and a snapshot state
    of it (as the daemon records it) builds at two real commits."""
    real = Path(os.environ[REAL_ENV])
    user = clone_real_comfyui(real, tmp_path / "ComfyUI")
    pack_src = tmp_path / "upstream" / "RealPack"
    pack = build_history(pack_src, node_history("RealPack", 3))
    git(user / "custom_nodes", "clone", "-q", str(pack_src), "RealPack")
    (user / "custom_nodes" / "__pycache__").mkdir()
    before = install_snapshot_of(user)

    install = scan_install(user)
    assert {"websocket_image_save.py", "example_node.py.example"} <= install.core_entries
    assert [n.name for n in install.nodes] == ["RealPack"]
    recorded = state_from_install_state(capture_install(user), "snapshot")
    assert recorded.node("websocket_image_save.py") == INSTALLED  # what a snapshot holds
    words = {"@bad": recorded, "@good": recorded.with_values({"comfyui": f"{install.head}"})}
    bad = resolve_state("@bad", install, snapshot_resolver=words.__getitem__)
    parent = git(user, "rev-parse", "HEAD~1").strip()
    good = State.of(parent, {"RealPack": pack[0]})
    ws = Workspace.create(tmp_path / "ws", install)
    for state in (good, bad):
        ws.switch(state)
        assert ws.current_state() == state
        assert (ws.custom_nodes / "websocket_image_save.py").is_file()
        assert (ws.comfyui / "main.py").is_file()
    ws.remove()
    assert install_snapshot_of(user) == before


@pytest.mark.real_comfyui
def test_oom_bisect_of_a_real_installs_snapshot_replays_both_endpoints(tmp_path: Path) -> None:
    """The command the alert gives, on a real install: the daemon's own capture of it (which
    lists websocket_image_save.py) as the snapshot's states, the real ComfyUI replayed with
    ``--cpu`` at two real commits. The same memory at both: not reproduced (exit 4), and the
    answer is attached to the snapshot and told first by ``snapshots show``."""
    real = Path(os.environ[REAL_ENV])
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON", sys.executable)
    user = clone_real_comfyui(real, tmp_path / "ComfyUI")
    bad = capture_install(user)
    assert "websocket_image_save.py" in bad.node_table()
    parent = git(user, "rev-parse", "HEAD~1").strip()
    good = dataclasses.replace(bad, comfyui=dataclasses.replace(bad.comfyui, commit=parent))
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 256, "height": 256, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    data_dir = tmp_path / "data"
    ref = write_snapshot(
        snapshots_dir(data_dir),
        SnapshotContent(
            incident=incident(),
            instance=InstanceInfo("main", str(user)),
            host=HOST,
            created_s=1767348672.25,
            prompt=prompt,
            sections={
                "regression": suspected_regression(good, bad),
                "install_state": bad.to_dict(),
                "process": {"argv": [python, "main.py", "--cpu"]},
            },
        ),
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("XDG_")},
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_DATA_HOME": str(tmp_path / "share"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "oom_sentinel.bisect",
            ref.id,
            "--data-dir",
            str(data_dir),
            "--python",
            python,
            "--json",
            "--budget",
            "ram=64GiB",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["result"]) == (4, "not-reproduced"), proc.stderr[-3000:]
    assert doc["measurements"] == 2
    assert doc["attached_to"] == str(ref.path / "bisect")
    story = snapshots_show(ref.id, data_dir, env)
    assert story.index("oom-bisect could not reproduce it") < story.index("What failed")


def install_snapshot_of(root: Path) -> tuple[str, str, str]:
    return (
        git(root, "rev-parse", "HEAD"),
        git(root, "status", "--porcelain", "--untracked-files=all"),
        (root / ".git" / "logs" / "HEAD").read_text(),
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
