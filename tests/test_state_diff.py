"""What changed between two states: commit ranges per repo, node changes, pip changes."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from install_builder import Clock, Install, build_install, commit_files, git, repo_fingerprint

from oom_sentinel.daemon.install.diff import (
    CommitRange,
    PipChange,
    commit_range,
    diff_states,
    is_gpu_stack,
    parse_pip_lines,
    repos_for_state,
)
from oom_sentinel.daemon.install.manager_snapshots import parse_manager_snapshot
from oom_sentinel.daemon.install.state import (
    CORE_REPO,
    CoreState,
    CustomNode,
    InstallState,
    capture_install,
)

A, B, C = ("a" * 40, "b" * 40, "c" * 40)


def state(*nodes: CustomNode, core: str = A, pip: tuple[str, ...] | None = (), version: str | None = "0.3.1") -> InstallState:  # fmt: skip
    return InstallState(CoreState(commit=core, version=version), nodes, pip=pip)


# ---------------------------------------------------------------------------------------------
# Pure comparisons


def test_identical_states_have_an_empty_diff() -> None:
    s = state(CustomNode("foo", "git", commit=B))
    diff = diff_states(s, s)
    assert diff.is_empty
    assert diff.old_state_id == diff.new_state_id


NODE_CASES = [
    ("added", (), (CustomNode("foo", "git", commit=B),), "git bbbbbbbbbbbb"),
    ("removed", (CustomNode("foo", "cnr", version="1.0.0"),), (), "registry 1.0.0"),
    ("disabled", (CustomNode("foo", "cnr", version="1.0.0"),), (CustomNode("foo", "cnr", version="1.0.0", disabled=True),), "registry 1.0.0"),
    ("enabled", (CustomNode("foo", "file", content_hash="sha256:1", disabled=True),), (CustomNode("foo", "file", content_hash="sha256:1"),), "file sha256:1"),
    ("kind", (CustomNode("foo", "cnr", version="1.0.0"),), (CustomNode("foo", "git", commit=B),), "registry 1.0.0 -> git bbbbbbbbbbbb"),
    ("version", (CustomNode("foo", "cnr", version="1.0.0"),), (CustomNode("foo", "cnr", version="1.1.0"),), "1.0.0 -> 1.1.0"),
    ("content", (CustomNode("foo", "folder", content_hash="sha256:1111"),), (CustomNode("foo", "folder", content_hash="sha256:2222"),), "folder sha256:1111 -> folder sha256:2222"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "old", "new", "detail"), NODE_CASES, ids=[c[0] for c in NODE_CASES]
)
def test_node_changes_are_named(
    change: str, old: tuple[CustomNode, ...], new: tuple[CustomNode, ...], detail: str
) -> None:
    diff = diff_states(state(*old), state(*new))
    assert [(c.name, c.change, c.detail) for c in diff.nodes] == [("foo", change, detail)]
    assert diff.repos == ()


def test_git_node_commit_change_is_a_repo_change() -> None:
    diff = diff_states(
        state(CustomNode("foo", "git", commit=B)), state(CustomNode("foo", "git", commit=C))
    )
    assert [(r.repo, r.old_commit, r.new_commit, r.range) for r in diff.repos] == [
        ("foo", B, C, None)
    ]
    assert diff.nodes == ()


def test_core_change_and_version_come_first() -> None:
    diff = diff_states(
        state(CustomNode("zed", "git", commit=B), core=A, version="0.3.1"),
        state(CustomNode("zed", "git", commit=C), core=B, version="0.3.2"),
    )
    assert [r.repo for r in diff.repos] == [CORE_REPO, "zed"]
    assert diff.core_version == ("0.3.1", "0.3.2")
    assert diff.summary_lines()[:2] == [
        "ComfyUI version 0.3.1 -> 0.3.2",
        "ComfyUI: aaaaaaaaaaaa..bbbbbbbbbbbb",
    ]


def test_manager_named_pack_matches_its_folder_by_url() -> None:
    manager = parse_manager_snapshot(
        {"git_custom_nodes": {"git@github.com:o/ComfyUI-Foo.git": {"hash": B, "disabled": False}}},
        "m.json",
    )
    disk = state(CustomNode("foo-renamed", "git", commit=C, url="https://github.com/o/comfyui-foo"))
    diff = diff_states(manager, disk)
    assert [(r.repo, r.old_commit, r.new_commit) for r in diff.repos] == [
        (CORE_REPO, None, A),
        ("foo-renamed", B, C),
    ]
    assert diff.nodes == ()


def test_enabled_pack_and_disabled_copy_pair_with_their_counterparts() -> None:
    old = state(
        CustomNode("foo", "git", commit=B, entry="foo"),
        CustomNode("foo", "cnr", version="1.0.0", disabled=True, entry=".disabled/foo@1_0_0"),
    )
    new = state(
        CustomNode("foo", "git", commit=C, entry="foo"),
        CustomNode("foo", "cnr", version="1.0.0", disabled=True, entry=".disabled/foo@1_0_0"),
    )
    diff = diff_states(old, new)
    assert [(r.repo, r.new_commit) for r in diff.repos] == [("foo", C)]
    assert diff.nodes == ()


# ---------------------------------------------------------------------------------------------
# pip


def test_pip_changes_flag_the_gpu_stack() -> None:
    old = (
        "torch==2.5.1+cu124",
        "nvidia-cudnn-cu12==9.1.0.70",
        "Pillow==10.0.0",
        "numpy==1.26.4",
        "gone==1.0",
    )
    new = (
        "torch==2.6.0+cu126",
        "nvidia-cudnn-cu12==9.5.1.17",
        "pillow==10.0.0",
        "numpy==2.1.0",
        "xformers==0.0.29",
    )
    diff = diff_states(state(pip=old), state(pip=new))
    assert diff.pip == (
        PipChange("gone", "1.0", None, False),
        PipChange("numpy", "1.26.4", "2.1.0", False),
        PipChange("nvidia-cudnn-cu12", "9.1.0.70", "9.5.1.17", True),
        PipChange("torch", "2.5.1+cu124", "2.6.0+cu126", True),
        PipChange("xformers", None, "0.0.29", True),
    )
    lines = diff.summary_lines()
    assert lines[0] == "pip nvidia-cudnn-cu12: 9.1.0.70 -> 9.5.1.17  [GPU stack]"
    assert "pip gone: 1.0 -> (absent)" in lines


def test_unknown_pip_on_one_side_is_not_a_change() -> None:
    diff = diff_states(state(pip=None), state(pip=("torch==2.5.1",)))
    assert diff.pip is None
    assert diff.is_empty
    assert "pip: unknown on one side (no interpreter facts)" in diff.summary_lines()


def test_pip_line_forms_are_parsed() -> None:
    assert parse_pip_lines(
        (
            "Foo_Bar==1.0",
            "mypkg @ file:///wheels/mypkg.whl",
            "-e git+https://github.com/o/x@abc#egg=x_pkg",
            "-e /home/u/src/local-thing",
            "extras[gpu]==2.0",
            "# comment",
        )
    ) == {
        "foo-bar": ("Foo_Bar", "1.0"),
        "mypkg": ("mypkg", "@ file:///wheels/mypkg.whl"),
        "x-pkg": ("x_pkg", "-e git+https://github.com/o/x@abc#egg=x_pkg"),
        "local-thing": ("local-thing", "-e /home/u/src/local-thing"),
        "extras": ("extras", "2.0"),
    }


@pytest.mark.parametrize(
    ("name", "flagged"),
    [("torch", True), ("TorchVision", True), ("nvidia-cublas-cu12", True), ("triton", True),
     ("numpy", False), ("torchsde", False)],
    ids=["torch", "torchvision-case", "nvidia", "triton", "numpy", "torchsde"],
)  # fmt: skip
def test_gpu_stack_packages(name: str, flagged: bool) -> None:
    assert is_gpu_stack(name) is flagged


# ---------------------------------------------------------------------------------------------
# Commit ranges in real repos


@pytest.fixture(scope="module")
def merged_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """
    c1 ── m ── c2 ── c3        (master, first-parent: c1 m c2 c3)
      \\   /
       b1 b2                   (side branch, merged into master by m)
    c1 ── x                    (branch "other": diverged from c1)
    """
    clock = Clock()
    repo = tmp_path_factory.mktemp("merged") / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    c1 = commit_files(repo, {"a": "1"}, "c1: start", clock.tick())
    git(repo, "checkout", "-q", "-b", "side")
    commit_files(repo, {"b": "1"}, "b1: side work", clock.tick())
    commit_files(repo, {"b": "2"}, "b2: more side work", clock.tick())
    git(repo, "checkout", "-q", "master")
    git(repo, "merge", "-q", "--no-ff", "-m", "m: merge side", "side", at=clock.tick())
    m = git(repo, "rev-parse", "HEAD")
    c2 = commit_files(repo, {"a": "2"}, "c2: lower VRAM use", clock.tick())
    c3 = commit_files(repo, {"a": "3"}, "c3: raise VRAM use", clock.tick())
    git(repo, "checkout", "-q", "-b", "other", c1)
    x = commit_files(repo, {"x": "1"}, "x: elsewhere", clock.tick())
    git(repo, "checkout", "-q", "master")
    return repo, {"c1": c1, "m": m, "c2": c2, "c3": c3, "x": x}


RANGES = [
    ("forward-over-merge", "c1", "c3", CommitRange(3, 0, "m: merge side", "c3: raise VRAM use")),
    ("one-commit", "c2", "c3", CommitRange(1, 0, "c3: raise VRAM use", "c3: raise VRAM use")),
    ("backward", "c3", "c1", CommitRange(0, 3, None, None)),
    ("diverged", "c3", "x", CommitRange(1, 3, "x: elsewhere", "x: elsewhere")),
]


@pytest.mark.parametrize(("case", "old", "new", "expected"), RANGES, ids=[r[0] for r in RANGES])
def test_commit_range_counts_first_parent_commits(
    merged_repo: tuple[Path, dict[str, str]], case: str, old: str, new: str, expected: CommitRange
) -> None:
    repo, shas = merged_repo
    assert commit_range(repo, shas[old], shas[new]) == expected


def test_direction_names_the_shape(merged_repo: tuple[Path, dict[str, str]]) -> None:
    repo, shas = merged_repo
    assert commit_range(repo, shas["c1"], shas["c3"]).direction == "forward"
    assert commit_range(repo, shas["c3"], shas["c1"]).direction == "backward"
    assert commit_range(repo, shas["c3"], shas["x"]).direction == "diverged"


def test_commit_missing_from_the_repo_gives_unknown_range(
    merged_repo: tuple[Path, dict[str, str]],
) -> None:
    repo, shas = merged_repo
    rng = commit_range(repo, shas["c1"], "f" * 40)
    assert (rng.ahead, rng.behind, rng.direction) == (None, None, "unknown")
    assert rng.error == f"ffffffffffff is not in {repo}"


def test_commit_range_reads_only_and_leaves_no_git_process(
    merged_repo: tuple[Path, dict[str, str]],
) -> None:
    repo, shas = merged_repo
    before = repo_fingerprint(repo)
    # the processes this test did not start (under --shards the first session is the parent
    # of the others) are not the call's
    others = {p.pid for p in psutil.Process().children()}
    commit_range(repo, shas["c1"], shas["c3"])
    assert repo_fingerprint(repo) == before
    assert [p for p in psutil.Process().children() if p.pid not in others] == []


def test_diff_of_captures_before_and_after_a_pull_resolves_ranges(tmp_path: Path) -> None:
    inst: Install = build_install(tmp_path)
    before = capture_install(inst.root)
    up = inst.upstreams["ComfyUI-Foo"]
    commit_files(up, {"nodes.py": "V = 4\n"}, "Cache fewer latents", inst.clock.tick())
    commit_files(up, {"nodes.py": "V = 5\n"}, "Keep the VAE on the GPU", inst.clock.tick())
    git(inst.custom_nodes / "ComfyUI-Foo", "pull", "-q", "--ff-only", at=inst.clock.tick())
    git(inst.root, "reset", "-q", "--hard", "HEAD~1", at=inst.clock.tick())
    after = capture_install(inst.root)
    diff = diff_states(before, after, repos=repos_for_state(before, after))
    assert [(r.repo, r.range) for r in diff.repos] == [
        (CORE_REPO, CommitRange(0, 1, None, None)),
        ("ComfyUI-Foo", CommitRange(2, 0, "Cache fewer latents", "Keep the VAE on the GPU")),
    ]
    assert diff.core_version == ("0.3.2", "0.3.1")
    lines = diff.summary_lines()
    foo_old = before.node_table()["ComfyUI-Foo"].commit
    foo_new = after.node_table()["ComfyUI-Foo"].commit
    assert foo_old and foo_new
    assert (
        f"custom_nodes/ComfyUI-Foo: {foo_old[:12]}..{foo_new[:12]} "
        '(2 new commits: "Cache fewer latents" ... "Keep the VAE on the GPU")'
    ) in lines
    assert lines[1].endswith("(1 commit rolled back)") and lines[1].startswith("ComfyUI: ")
    as_dict = diff.to_dict()
    assert as_dict["repos"][0]["repo"] == "ComfyUI" and as_dict["repos"][0]["core"] is True
    assert as_dict["repos"][1]["range"]["direction"] == "forward"
