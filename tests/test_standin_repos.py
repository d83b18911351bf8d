"""The stand-in's git histories are what the bisect tests rely on: real repos of the promised
shape whose commits really start (or really don't) and really use the memory they claim.

Core history used below (indices of first-parent commits):

    0 ── … ── 30 ── … ── 50(M) ── … ── 120 ┄┄ 125 ── 126 ── … ── 200 ── … ── 250 ── … ── 319
              │          │             └ won't start ┘          │           │
     --reserve-vram   merge of a                          memory factor  feature
        appears       2-commit branch                     1.0 -> 1.6     "fused_blur"
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standin_proc import StandinProcess, start_standin
from standin_repos import (
    BuiltRepo,
    build_core_repo,
    build_node_repo,
    checkout,
    clone_node_into,
    export_commit,
    repo_fingerprint,
)

from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

MIB = 1024 * 1024
CONTEXT_MIB = 312  # what the fake GPU shows for a process's CUDA context


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> BuiltRepo:
    return build_core_repo(
        tmp_path_factory.mktemp("repos") / "ComfyUI",
        320,
        bad_commit_index=200,
        untestable_range=(120, 126),
        merges_at=(50,),
        flag_introductions={"--reserve-vram": 30},
        feature_from={"fused_blur": 250},
    )


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu")
    FakeGpuDir(root).create([FakeDevice(0, "NVIDIA GeForce RTX 4090", 24 * 1024 * MIB)])
    return root


def vram_prompt(mib: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": mib}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def used_vram_mib_after(proc: StandinProcess, gpu_dir: Path, mib: int) -> int:
    pid = proc.post_prompt(vram_prompt(mib), client_id=None)
    for _ in range(1000):
        entry = proc.get_json(f"/history/{pid}")
        if entry:
            assert entry[pid]["status"]["status_str"] == "success"
            break
        time.sleep(0.01)
    usage = {p.pid: p for p in FakeGpuDir(gpu_dir).processes()}[proc.pid]
    return usage.used_bytes // MIB - CONTEXT_MIB


# ---- shape -------------------------------------------------------------------------------------
def test_core_history_has_the_promised_shape(core: BuiltRepo) -> None:
    first_parent = git(core.path, "rev-list", "--first-parent", "--reverse", "HEAD").split()
    assert tuple(first_parent) == core.commits and len(core.commits) == 320
    assert int(git(core.path, "rev-list", "--count", "HEAD")) == 322
    assert git(core.path, "rev-list", "--merges", "HEAD").split() == [core.commits[50]]
    assert git(core.path, "rev-parse", f"{core.commits[50]}^2").strip() == core.side_commits[-1]
    assert git(core.path, "branch", "--format=%(refname:short)").split() == ["master"]
    assert git(core.path, "status", "--porcelain") == ""
    assert git(core.path, "log", "-1", "--format=%s", core.bad_commit).strip() == core.subjects[200]
    assert git(core.path, "diff", "--name-only", core.commits[199], core.bad_commit).split() == [
        "standin_tuning.json"
    ]
    assert core.version_bumps[20] == "0.7.1" and core.subjects[20] == "ComfyUI v0.7.1"
    assert all(
        s.endswith(")")
        for i, s in enumerate(core.subjects)
        if i not in core.version_bumps and i and i != 50
    )
    authors = set(git(core.path, "log", "--format=%an").split("\n")) - {""}
    assert len(authors) == 5


def test_building_the_same_history_twice_gives_the_same_commit_ids(tmp_path: Path) -> None:
    a = build_core_repo(tmp_path / "a", 40, bad_commit_index=30)
    b = build_core_repo(tmp_path / "b", 40, bad_commit_index=30)
    assert a.commits == b.commits
    other = build_core_repo(tmp_path / "c", 40, bad_commit_index=31)
    assert other.commits[:30] == a.commits[:30] and other.commits[30] != a.commits[30]


def test_tuning_flags_and_features_change_where_promised(core: BuiltRepo) -> None:
    def tuning(i: int) -> dict[str, Any]:
        return json.loads(git(core.path, "show", f"{core.commits[i]}:standin_tuning.json"))

    assert tuning(199)["memory_factor"] == 1.0 and tuning(200)["memory_factor"] == 1.6
    assert tuning(249)["features"] == [] and tuning(250)["features"] == ["fused_blur"]
    assert '"--reserve-vram"' not in git(core.path, "show", f"{core.commits[29]}:comfy/cli_args.py")
    assert '"--reserve-vram"' in git(core.path, "show", f"{core.commits[30]}:comfy/cli_args.py")
    assert "def broken_startup(:" in git(core.path, "show", f"{core.commits[120]}:main.py")
    assert "def broken_startup(:" not in git(core.path, "show", f"{core.commits[126]}:main.py")
    assert core.untestable == tuple(range(120, 126))


@pytest.mark.parametrize("n", [2, 2000], ids=["minimal", "benchmark-size"])
def test_histories_of_any_length_build(tmp_path: Path, n: int) -> None:
    repo = build_core_repo(tmp_path / "r", n, bad_commit_index=n - 1)
    assert int(git(repo.path, "rev-list", "--count", "HEAD")) == n
    assert repo.bad_commit == repo.head


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad_commit_index"):
        build_core_repo(tmp_path / "x", 10, bad_commit_index=10)
    with pytest.raises(ValueError, match="bad_commit_index"):
        build_node_repo(tmp_path / "y", 10, bad_commit_index=0)


# ---- commits really run ------------------------------------------------------------------------
def start_at(
    repo: BuiltRepo, index: int, tmp: Path, gpu_dir: Path, *args: str, wait: bool = True
) -> StandinProcess:
    install = export_commit(repo.path, repo.commits[index], tmp / f"install-{index}")
    return start_standin(
        tmp / f"run-{index}",
        *args,
        code_dir=install,
        fake_gpu=gpu_dir,
        wait_ready=wait,
        base_directory=False,
    )


def test_the_bad_commit_really_uses_more_memory(
    core: BuiltRepo, tmp_path: Path, gpu_dir: Path
) -> None:
    used = {}
    for index in (199, 200):
        proc = start_at(core, index, tmp_path, gpu_dir)
        try:
            used[index] = used_vram_mib_after(proc, gpu_dir, 100)
            released = max(i for i in core.version_bumps if i <= index)
            assert (
                proc.get_json("/system_stats")["system"]["comfyui_version"]
                == core.version_bumps[released]
            )
        finally:
            proc.stop()
    assert used == {199: 100, 200: 160}


def test_untestable_commits_do_not_start(core: BuiltRepo, tmp_path: Path, gpu_dir: Path) -> None:
    proc = start_at(core, 123, tmp_path, gpu_dir, wait=False)
    assert proc.proc.wait(timeout=30) == 1
    assert "SyntaxError" in proc.stderr_text()


def test_old_commits_reject_flags_they_do_not_know(
    core: BuiltRepo, tmp_path: Path, gpu_dir: Path
) -> None:
    old = start_at(core, 29, tmp_path, gpu_dir, "--reserve-vram", "1.5", wait=False)
    assert old.proc.wait(timeout=30) == 2
    assert "error: unrecognized arguments: --reserve-vram 1.5" in old.stderr_text()
    new = start_at(core, 30, tmp_path, gpu_dir, "--reserve-vram", "1.5")
    new.stop()


# ---- custom node repos -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BuiltRepo, BuiltRepo]]:
    root = tmp_path_factory.mktemp("pair")
    small_core = build_core_repo(
        root / "ComfyUI", 20, bad_commit_index=None, feature_from={"fused_blur": 10}
    )
    node = build_node_repo(
        root / "ComfyUI-FastBlur",
        12,
        bad_commit_index=6,
        bad_scale=("AllocateVRAM", 2.0),
        requires_core_feature="fused_blur",
        untestable_range=(8, 9),
    )
    yield small_core, node


def test_node_commit_is_bad_only_with_the_new_core(
    pair: tuple[BuiltRepo, BuiltRepo], tmp_path: Path, gpu_dir: Path
) -> None:
    core, node = pair
    used = {}
    for core_i, node_i in [(9, 5), (9, 6), (10, 5), (10, 6)]:
        install = export_commit(core.path, core.commits[core_i], tmp_path / f"c{core_i}-n{node_i}")
        export_commit(
            node.path, node.commits[node_i], install / "custom_nodes" / "ComfyUI-FastBlur"
        )
        proc = start_standin(
            tmp_path / f"run-{core_i}-{node_i}",
            code_dir=install,
            fake_gpu=gpu_dir,
            base_directory=False,
        )
        try:
            assert "PackPassthrough" in proc.get_json("/object_info")
            used[(core_i, node_i)] = used_vram_mib_after(proc, gpu_dir, 100)
        finally:
            proc.stop()
    assert used == {(9, 5): 100, (9, 6): 100, (10, 5): 100, (10, 6): 200}


def test_untestable_node_commit_fails_to_import(
    pair: tuple[BuiltRepo, BuiltRepo], tmp_path: Path
) -> None:
    core, node = pair
    install = export_commit(core.path, core.head, tmp_path / "install")
    export_commit(node.path, node.commits[8], install / "custom_nodes" / "ComfyUI-FastBlur")
    proc = start_standin(tmp_path / "run", code_dir=install, base_directory=False)
    try:
        assert (
            f"(IMPORT FAILED): {install / 'custom_nodes' / 'ComfyUI-FastBlur'}"
            in proc.stderr_text()
        )
        status, body = proc.post_json(
            "/prompt",
            {
                "prompt": {
                    "1": {"class_type": "PackPassthrough", "inputs": {"value": 1}},
                    "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
                }
            },
        )
        assert (
            status == 400
            and body["error"]["message"]
            == "Cannot execute because node PackPassthrough does not exist."
        )
    finally:
        proc.stop()


def test_a_user_install_of_clones_and_its_fingerprint(
    pair: tuple[BuiltRepo, BuiltRepo], tmp_path: Path
) -> None:
    core, node = pair
    user_core = tmp_path / "user-ComfyUI"
    subprocess.run(["git", "clone", "-q", str(core.path), str(user_core)], check=True)
    clone = clone_node_into(user_core, node, index=6)
    assert git(clone, "rev-parse", "HEAD").strip() == node.commits[6]
    assert git(user_core, "status", "--porcelain") == ""  # custom_nodes/ is ignored
    before = repo_fingerprint(user_core)
    assert repo_fingerprint(user_core) == before
    clone_repo = BuiltRepo(user_core, core.commits, core.subjects, None)
    checkout(clone_repo, 3)
    after = repo_fingerprint(user_core)
    assert after["HEAD"] == core.commits[3] and after != before
