"""One install-state model: the same ComfyUI-Manager snapshot, read by the daemon (its
``InstallState``, "unknown" commits filled from a capture of the install) and resolved by the
bisect (a ``State`` of the install), says the same thing -- with HTTPS and SSH URLs, GitHub
and GitLab, on either side -- and the bisect's values are commits of the user's real repos.

Before the bisect used the daemon's reader and URL comparison, ``git@gitlab.com:O/R.git``
and ``https://gitlab.com/O/R`` were two repositories in the bisect: the snapshot failed with
"is not installed" (a bad ref) where the daemon matched it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from bisect_git import build_history, core_history, git, node_history, tree_snapshot

from oom_sentinel.bisect.state.states import (
    ABSENT,
    DISABLED,
    INSTALLED,
    resolve_state,
    scan_install,
)
from oom_sentinel.daemon.install.manager_snapshots import (
    read_manager_snapshot,
    resolve_unknown_commits,
)
from oom_sentinel.daemon.install.state import capture_install, url_key

# folder -> (remote as the user cloned it in HTTPS form, the same repo in SSH form)
PACKS = {
    "ComfyUI-Impact": ("https://github.com/Owner/ComfyUI-Impact.git", "git@github.com:owner/comfyui-impact"),
    "gitlab-pack": ("https://gitlab.com/Group/Sub/GitLab-Pack/", "git@gitlab.com:Group/Sub/GitLab-Pack.git"),
    "ssh-url-pack": ("https://gitlab.com/group/ssh-url-pack", "ssh://git@gitlab.com/Group/SSH-URL-Pack.git"),
    # the folder is not named after the URL: only the URL can match it
    "my-local-name": ("https://github.com/O/Upstream-Name.git", "git@github.com:O/Upstream-Name"),
}  # fmt: skip
UNLISTED = "unlisted-pack"  # a git node the snapshot does not list: absent


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("model") / "ComfyUI"
    commits = {"ComfyUI": build_history(root, core_history(6))}
    cn = root / "custom_nodes"
    for name in [*PACKS, UNLISTED]:
        commits[name] = build_history(cn / name, node_history(name, 4))
    (cn / "single.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "loose_pack").mkdir()
    (cn / "loose_pack" / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    git(cn / UNLISTED, "remote", "add", "origin", "https://github.com/someone/unlisted-pack")
    return root, commits


def _set_remotes(root: Path, form: int) -> None:
    for name, urls in PACKS.items():
        repo = root / "custom_nodes" / name
        git(repo, "remote", "remove", "origin", check=False)
        git(repo, "remote", "add", "origin", urls[form])


def _manager_snapshot(commits: dict[str, list[str]], form: int) -> dict:
    urls = {name: urls[form] for name, urls in PACKS.items()}
    return {
        "comfyui": commits["ComfyUI"][2] + "\n",  # Manager's newline quirk
        "git_custom_nodes": {
            urls["ComfyUI-Impact"]: {"hash": commits["ComfyUI-Impact"][1], "disabled": False},
            urls["gitlab-pack"]: {"hash": commits["gitlab-pack"][0][:10], "disabled": False},
            urls["ssh-url-pack"]: {"hash": "unknown", "disabled": False},
            urls["my-local-name"]: {"hash": commits["my-local-name"][2], "disabled": True},
        },
        "cnr_custom_nodes": {},
        "file_custom_nodes": [{"filename": "single.py", "disabled": True}],
        "pips": {"torch==2.5.1": "", "comfy-kitchen": "https://example.org/ck-0.2.whl"},
    }


@pytest.mark.parametrize(
    ("installed_form", "snapshot_form", "suffix"),
    [(0, 1, ".json"), (1, 0, ".json"), (1, 0, ".yaml"), (0, 0, ".json")],
    ids=["https-installed-ssh-snapshot", "ssh-installed-https-snapshot", "yaml", "same-form"],
)
def test_the_daemon_and_the_bisect_read_one_manager_snapshot_alike(
    install, tmp_path: Path, installed_form: int, snapshot_form: int, suffix: str
) -> None:
    root, commits = install
    _set_remotes(root, installed_form)
    data = _manager_snapshot(commits, snapshot_form)
    path = tmp_path / f"2026-01-02_10-11-12_snapshot{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(data, indent=4))
    else:
        path.write_text(yaml.safe_dump({"custom_nodes": data}))
    tree_before = tree_snapshot(root)

    # the daemon's path: the file as an InstallState, unknown commits from a capture
    disk = capture_install(root)
    daemon = resolve_unknown_commits(read_manager_snapshot(path), disk)
    # the bisect's path: the same file as a State of the install
    bisect = resolve_state(str(path), scan_install(root))

    installed_by_url = {url_key(n.url): n.name for n in disk.nodes if n.kind == "git"}
    matched: set[str] = set()
    git_entries = [n for n in daemon.nodes if n.kind == "git"]
    assert len(git_entries) == len(PACKS)
    for entry in git_entries:
        folder = installed_by_url[url_key(entry.url)]  # the daemon knows which pack it is
        matched.add(folder)
        value = bisect.node(folder)
        if entry.disabled:
            assert value == DISABLED, folder
            continue
        assert entry.commit is not None, f"{folder}: the daemon left the commit unknown"
        # one commit: the daemon's (maybe abbreviated) hash is the bisect's resolved one,
        # and that is a real commit of the user's repo
        assert value.startswith(entry.commit), folder
        assert value in commits[folder], folder
        assert git(root / "custom_nodes" / folder, "cat-file", "-t", value).strip() == "commit"
    assert matched == set(PACKS)
    assert bisect.node("ssh-url-pack") == commits["ssh-url-pack"][-1]  # "unknown": installed
    assert bisect.node("gitlab-pack") == commits["gitlab-pack"][0]  # abbreviated, resolved
    assert bisect.node(UNLISTED) == ABSENT
    assert daemon.comfyui.commit == bisect.comfyui == commits["ComfyUI"][2]
    daemon_files = {n.name: n.disabled for n in daemon.nodes if n.kind == "file"}
    assert daemon_files == {"single.py": True} and bisect.node("single.py") == DISABLED
    assert bisect.node("loose_pack") == INSTALLED  # not in Manager's file: the copy on disk
    assert dict(bisect.packages) == {
        "torch": "2.5.1",
        "comfy-kitchen": "@ https://example.org/ck-0.2.whl",
    }
    assert daemon.pip == ("comfy-kitchen @ https://example.org/ck-0.2.whl", "torch==2.5.1")
    assert tree_snapshot(root) == tree_before, "reading a manager snapshot changed the install"


def test_the_daemon_and_the_bisect_see_the_same_custom_nodes(tmp_path: Path) -> None:
    """Both walk ``custom_nodes/`` with ``iter_node_entries``: every disabled convention, a
    name both enabled and disabled (the enabled copy wins), what is left out."""
    root = tmp_path / "ComfyUI"
    build_history(root, core_history(2))  # tracks custom_nodes/websocket_image_save.py
    cn = root / "custom_nodes"
    build_history(cn / "git_pack", node_history("git_pack", 2))
    build_history(cn / "Old.disabled", node_history("old", 1))
    for folder in ("loose", ".disabled/registry_pack@1_2_0", ".disabled/loose", ".hidden"):
        (cn / folder).mkdir(parents=True)
        (cn / folder / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "__pycache__").mkdir()
    (cn / "single.py.disabled").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (cn / "README.md").write_text("not a node\n")

    bisect = {n.name: n.disabled for n in scan_install(root).nodes}
    disk = capture_install(root)
    tracked = {"websocket_image_save.py", "example_node.py.example"}  # the core's own files
    names = {n.name for n in disk.nodes} - tracked
    daemon = {name: node.disabled for name in names if (node := disk.node(name)) is not None}
    assert (
        bisect
        == daemon
        == {
            "git_pack": False,
            "Old": True,
            "loose": False,  # enabled here and in .disabled/: the enabled copy
            "registry_pack": True,
            "single.py": True,
        }
    )
