"""The "OOM after update" scenario end to end, with real processes and real git.

A user's install -- the stand-in ComfyUI cloned from its repo, with a custom node pack cloned
into ``custom_nodes/`` and a few commits behind its upstream -- runs as a real process on the
fake GPU; ``oom-sentinel run`` watches it as a real process:

    W (5000 MiB) fits ──> stop, git pull in the pack, start at once ──> W runs out of memory
         state A          (commit 5 doubles AllocateVRAM)     state B      snapshot: A -> B, oom-bisect

The pull and the start are as close as a launcher that updates and then starts makes them,
closer than psutil's start time can tell apart (it reads up to a second early).

Before the update, a bigger workflow runs out of memory under A too: the install did not
change since W last fitted, so that snapshot does not suspect an update. Last, the user runs
the ``oom-bisect <id>`` the alert gave: it names the pack's commit, attaches its report to the
snapshot, and the daemon sends the follow-up "Culprit found" alert.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import (
    Daemon,
    load_snapshot_json,
    wait_for,
    wait_run,
    wait_snapshots,
)
from standin_proc import StandinProcess, start_standin
from standin_repos import BuiltRepo, build_core_repo, build_node_repo
from webhook_receiver import Receiver

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.daemon.incidents.regression import BISECT_ADVICE_KEY
from oom_sentinel.daemon.incidents.snapshot import load_snapshot
from oom_sentinel.daemon.install.history import list_states, observations
from oom_sentinel.daemon.install.state import InstallState
from oom_sentinel.daemon.store.db import Store

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
PACK = "ComfyUI-FastAlloc"
#: the user's clone is at commit 3; upstream's commit 5 doubles AllocateVRAM's memory
USER_AT, BAD_AT, N_COMMITS = 3, 5, 8
W = {
    "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 5000}},
    "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
}
TOO_BIG = {
    "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 9000}},
    "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def post(srv: StandinProcess, prompt: dict[str, Any]) -> str:
    return srv.post_prompt(prompt, client_id="user")


def current_state_id(data_dir: Path) -> str | None:
    """The current state once the daemon has captured one: the reflog import at start makes a
    reconstructed state current first, and a slow machine can read that one."""
    store = Store.open_existing(data_dir)
    if store is None:
        return None
    with store:
        if not observations(store, sources=("capture",)):
            return None
        return next((s.state_id for s in list_states(store) if s.current_for), None)


def wait_snapshot(daemon: Daemon, n: int) -> Path:
    return wait_snapshots(daemon, n, 60)[n - 1]


@pytest.fixture
def user_install(tmp_path: Path) -> Iterator[tuple[Path, BuiltRepo]]:
    repos = tmp_path / "upstream"
    core = build_core_repo(repos / "ComfyUI", 6, bad_commit_index=None)
    pack = build_node_repo(
        repos / PACK,
        N_COMMITS,
        bad_commit_index=BAD_AT,
        bad_scale=("AllocateVRAM", 2.0),
        branch="main",
    )
    install = tmp_path / "ComfyUI"
    git(tmp_path, "clone", "-q", str(core.path), str(install))
    clone = install / "custom_nodes" / PACK
    git(install, "clone", "-q", str(pack.path), str(clone))
    git(clone, "reset", "-q", "--hard", pack.commits[USER_AT])  # installed a while ago
    yield install, pack


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

    root = tmp_path / "gpu"
    FakeGpuDir(root).create([FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)])
    return root


def test_workflow_that_fit_before_a_git_pull_and_ooms_after_names_both_states_and_oom_bisect(
    tmp_path: Path, user_install: tuple[Path, BuiltRepo], gpu: Path
) -> None:
    install, pack = user_install
    port = free_port()
    servers: list[StandinProcess] = []

    def start_comfyui() -> StandinProcess:
        srv = start_standin(
            tmp_path / "run", code_dir=install, fake_gpu=gpu, base_directory=False, port=port
        )
        servers.append(srv)
        return srv

    srv = start_comfyui()
    receiver = Receiver()
    config = (
        "[discovery]\nenabled = false\ninterval_s = 1\n[logs]\npoll_interval_ms = 500\n"
        "[incidents]\nstorm_window_s = 0\n[install_state]\ndebounce_ms = 300\n"
        f'[alerts]\nurls = ["{receiver.url()}"]\nretry_initial_s = 1\n'
    )
    daemon = Daemon(
        tmp_path, comfyui=[str(install)], config=config, env={"OOM_SENTINEL_FAKE_GPU": str(gpu)}
    )
    try:
        daemon.start()
        wait_for(lambda: f"API at {srv.url} is up" in daemon.stderr(), 60, "the API watcher")
        state_a = wait_for(lambda: current_state_id(daemon.data_dir), 60, "the first capture")

        # 1. W fits under state A.
        w_ok = wait_run(daemon, post(srv, W), 60)
        assert w_ok.outcome == "success" and w_ok.install_state_id == state_a
        assert w_ok.peak_vram_bytes is not None and w_ok.peak_vram_bytes >= 5000 * MIB

        # 2. A workflow that never fit runs out of memory under the same state: no suspicion.
        post(srv, TOO_BIG)
        same = load_snapshot_json(wait_snapshot(daemon, 1))
        assert same["regression"]["suspected"] is False
        assert "has not changed" in same["regression"]["reason"]
        assert same["regression"]["bisect_command"] is None
        assert same["install_state"]["state_id"] == state_a
        assert all(a["key"] != BISECT_ADVICE_KEY for a in same["advice"])
        assert "oom-bisect" not in same["summary"]

        # 3. A launcher updates and starts at once: ComfyUI stopped, a real git pull in the
        #    pack, ComfyUI started right after -- within a second of the pull, which is finer
        #    than psutil's process start time (built from a whole-second boot time).
        srv.stop()
        clone = install / "custom_nodes" / PACK
        git(clone, "pull", "-q", "--ff-only")
        srv = start_comfyui()
        assert git(clone, "rev-parse", "HEAD") == pack.head
        state_b = wait_for(
            lambda: (lambda s: s if s not in (None, state_a) else None)(
                current_state_id(daemon.data_dir)
            ),
            60,
            f"the update to be captured; daemon said:\n{daemon.stderr()}",
        )

        # 4. The new code is loaded; W runs out of memory.
        wait_for(lambda: f"running as pid {srv.pid}" in daemon.stderr(), 60, "the new process")
        post(srv, W)
        snap = wait_snapshot(daemon, 2)
        data = load_snapshot(snap).data  # validated against snapshot.schema.json
        # the alert for it is not folded into the earlier OOM's group: it names the bisect
        wait_for(
            lambda: any(f"oom-bisect {snap.name}" in t for t in receiver.texts()),
            60,
            f"the regression alert; got {receiver.texts()}",
        )

        # 5. The user runs the command the alert gave; the answer comes back as an alert.
        srv.stop()  # the bisect replays on the same (fake) card
        bisect = subprocess.run(
            [
                sys.executable,
                "-m",
                "oom_sentinel.bisect",
                snap.name,
                "--json",
                "--data-dir",
                str(daemon.data_dir),
                "--python",
                sys.executable,
            ],
            env={**daemon.env, "OOM_SENTINEL_CACHE_DIR": str(tmp_path / "cache")},
            capture_output=True,
            text=True,
            timeout=180,
        )
        answer = json.loads(bisect.stdout)
        assert (bisect.returncode, answer["result"]) == (0, "found"), bisect.stderr[-3000:]
        assert pack.commits[BAD_AT] in [c["commit"] for c in answer["culprits"]]
        assert answer["attached_to"] == str(snap / "bisect")
        wait_for(
            lambda: any(f"Culprit found for {snap.name}" in t for t in receiver.texts()),
            90,
            f"the follow-up alert; daemon said:\n{daemon.stderr()}",
        )
    finally:
        receiver.close()
        for s in servers:
            s.stop()
        rc = daemon.stop()
    assert rc == 0 and "Traceback" not in daemon.all_stderr()

    assert data["event"]["pool"] == "gpu" and data["event"]["node_type"] == "AllocateVRAM"
    regression = data["regression"]
    assert regression["suspected"] is True and regression["match"] == "workflow"
    assert regression["bisect_command"] == f"oom-bisect {snap.name}"
    assert f"oom-bisect {snap.name}" in data["summary"]
    assert data["advice"][0]["key"] == BISECT_ADVICE_KEY
    assert f"`oom-bisect {snap.name}`" in data["advice"][0]["text"]
    # both states, whole, as oom-bisect reads them
    good = InstallState.from_dict(regression["last_good_state"], "last_good_state")
    bad = InstallState.from_dict(regression["bad_state"], "bad_state")
    assert (good.state_id, bad.state_id) == (state_a, state_b)
    assert (regression["last_good_state_id"], regression["bad_state_id"]) == (state_a, state_b)
    assert good.node(PACK).commit == pack.commits[USER_AT]  # type: ignore[union-attr]
    assert bad.node(PACK).commit == pack.head  # type: ignore[union-attr]
    assert good.comfyui.commit == bad.comfyui.commit
    assert good.pip is not None and good.pip == bad.pip  # the interpreter was asked, once
    assert data["install_state"]["state_id"] == state_b
    # attributed by the capture the restart triggered, or by the start time within tolerance
    attribution = data["install_state"]["attribution"]
    assert attribution["by"] in ("restart-capture", "process-start"), attribution
    # the last good run and its memory
    last = regression["last_good_run"]
    assert last["prompt_id"] == w_ok.prompt_id and last["state_id"] == state_a
    assert last["peak_vram_bytes"] == w_ok.peak_vram_bytes
    # the diff: the pack moved 4 commits, its first and last subjects; nothing else changed
    diff = regression["diff"]
    (repo,) = diff["repos"]
    assert repo["repo"] == PACK and repo["core"] is False
    assert (repo["old_commit"], repo["new_commit"]) == (pack.commits[USER_AT], pack.head)
    rng = repo["range"]
    assert (rng["ahead"], rng["behind"]) == (N_COMMITS - 1 - USER_AT, 0)
    assert rng["first_subject"] == pack.subjects[USER_AT + 1]
    assert rng["last_subject"] == pack.subjects[-1]
    assert diff["nodes"] == [] and diff["pip"] == []
    assert any(PACK in line and "4 new commits" in line for line in regression["diff_summary"])

    # the same diff from the command line, by state id
    cli = subprocess.run(
        [
            *daemon.args[:3],
            "states",
            "diff",
            state_a,
            state_b,
            "--data-dir",
            str(daemon.data_dir),
            "--json",
        ],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["repos"] == diff["repos"]
