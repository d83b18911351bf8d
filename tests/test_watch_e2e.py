"""``oom-sentinel run`` as a real process watching the stand-in ComfyUI as a real process.

What a user gets from the API and process watchers: a GPU OOM whose ``prompt.json`` posts back
as is, a RAM ``MemoryError`` under an address-space limit, a SIGKILL while RSS climbs that
becomes a ``killed-by-os`` snapshot with the climb in its timeline, twenty ComfyUI restarts
under one daemon with every prompt recorded once, a second instance flagged, the log and the
API merged into one snapshot -- and secrets from ``extra_data`` in no snapshot file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import (
    Daemon,
    kernel_kill_lines,
    load_snapshot_json,
    runs,
    snapshot_dirs,
    wait_for,
    wait_run,
    wait_snapshots,
)
from standin_proc import STANDIN_DIR, StandinProcess, start_standin

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
SECRET_KEY = "comfyui-SECRETKEY-4c1d9e"
SECRET_TOKEN = "hf_SECRETTOKEN9f8e7d6c5b4a3"
STATUSES = {"saw-kill", "no-kill", "unreadable", "unavailable"}


# ---- helpers -----------------------------------------------------------------------------------


def make_install(path: Path) -> Path:
    """A ComfyUI-looking install of the stand-in (``comfyui_version.py`` beside ``main.py``),
    so the daemon's process discovery recognises it."""
    path.mkdir(parents=True)
    for source in STANDIN_DIR.glob("*.py"):
        shutil.copy(source, path / source.name)
    (path / "comfyui_version.py").write_text('__version__ = "0.8.0"\n')
    return path


def config(*, storm_window_s: float = 300, extra: str = "") -> str:
    return (
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
        f"[incidents]\nstorm_window_s = {storm_window_s}\n{extra}"
    )


def one_node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {
        "1": {"class_type": class_type, "inputs": inputs},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def post(srv: StandinProcess, prompt: dict[str, Any], **body: Any) -> str:
    return srv.post_prompt(prompt, **body)


def wait_api_up(daemon: Daemon, url: str) -> None:
    wait_for(
        lambda: f"API at {url} is up" in daemon.stderr(),
        30,
        f"the daemon to reach {url}; it said:\n{daemon.stderr()}",
    )


def watch(
    daemons: list[Daemon],
    tmp_path: Path,
    target: str | Path,
    api_url: str | None,
    *,
    config_text: str | None = None,
    env: dict[str, str] | None = None,
) -> Daemon:
    """``oom-sentinel run`` watching ``target`` (a server's URL or an install folder), stopped
    by the ``daemons`` fixture; with ``api_url``, returned once it reached that server's API."""
    daemon = Daemon(
        tmp_path,
        comfyui=[str(target)],
        config=config() if config_text is None else config_text,
        env=env,
    ).start()
    daemons.append(daemon)
    if api_url is not None:
        wait_api_up(daemon, api_url)
    return daemon


def kernel_log(tmp_path: Path) -> Path:
    """The kernel's log as the daemon reads it (``OOM_SENTINEL_KMSG``: a capture file)."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1,-;booted\n")
    return kmsg


def wait_pid_found(daemon: Daemon, srv: StandinProcess) -> None:
    """The daemon has found the stand-in's process (the process watcher follows it)."""
    wait_for(lambda: f"running as pid {srv.pid}" in daemon.stderr(), 30, "the pid")


def files_text(snapshot: Path) -> str:
    return "".join(p.read_text("utf-8", errors="replace") for p in sorted(snapshot.iterdir()))


def secret_extra_data() -> tuple[dict[str, Any], dict[str, Any]]:
    """A workflow whose widget holds a token in a URL, and extra_data with an API key."""
    url = f"https://huggingface.co/org/model/resolve/main/lora.safetensors?token={SECRET_TOKEN}"
    workflow = {
        "id": "wf-e2e",
        "nodes": [{"id": 1, "type": "AllocateVRAM", "widgets_values": [9000, 1, 0, url]}],
        "links": [],
    }
    extra = {"extra_pnginfo": {"workflow": workflow}, "api_key_comfy_org": SECRET_KEY}
    return workflow, extra


@pytest.fixture
def install(tmp_path: Path) -> Path:
    return make_install(tmp_path / "ComfyUI")


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    root = tmp_path / "gpu"
    FakeGpuDir(root).create([FakeDevice(0, "NVIDIA GeForce RTX 4060", 8192 * MIB)])
    return root


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., StandinProcess]]:
    procs: list[StandinProcess] = []

    def start(name: str, install: Path, **kw: Any) -> StandinProcess:
        proc = start_standin(tmp_path / name, code_dir=install, base_directory=False, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    running: list[Daemon] = []
    yield running
    for d in running:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


# ---- the tests ---------------------------------------------------------------------------------


def test_a_gpu_oom_reported_by_the_api_is_a_replayable_snapshot_without_secrets(
    tmp_path: Path,
    install: Path,
    gpu: Path,
    started: Callable[..., StandinProcess],
    daemons: list[Daemon],
) -> None:
    srv = started("base", install, fake_gpu=gpu)
    daemon = watch(daemons, tmp_path, srv.url, srv.url, env={"OOM_SENTINEL_FAKE_GPU": str(gpu)})
    _, extra = secret_extra_data()
    link = f"https://example.com/dl?id=7&token={SECRET_TOKEN}"
    prompt = one_node("AllocateVRAM", mib=9000, value=link)
    pid = post(srv, prompt, extra_data=extra)

    (snap,) = wait_snapshots(daemon, 1)
    data = load_snapshot_json(snap)
    assert data["event"]["pool"] == "gpu"
    assert data["event"]["node_type"] == "AllocateVRAM" and data["event"]["node_id"] == "1"
    assert data["event"]["exception_type"] == "torch.OutOfMemoryError"
    (api,) = [o for o in data["observations"] if o["source"] == "api"]
    assert api["evidence"]["prompt_id"] == pid and api["evidence"]["node_type"] == "AllocateVRAM"
    assert data["files"] == {
        "log": "log.txt",
        "timeline": "timeline.csv",
        "prompt": "prompt.json",
        "workflow": "workflow.json",
    }
    # the prompt as ComfyUI ran it (the token in a URL redacted), and it posts back as is
    saved_prompt = json.loads((snap / "prompt.json").read_text())
    assert saved_prompt["1"]["class_type"] == "AllocateVRAM"
    assert saved_prompt["1"]["inputs"]["mib"] == 9000 and saved_prompt["2"] == prompt["2"]
    status, answer = srv.post_json("/prompt", {"prompt": saved_prompt})
    assert status == 200 and answer["node_errors"] == {}, answer
    saved_workflow = json.loads((snap / "workflow.json").read_text())
    assert saved_workflow["id"] == "wf-e2e" and saved_workflow["nodes"][0]["type"] == "AllocateVRAM"
    # the process, ComfyUI's view of memory and its console
    process = data["process"]
    assert process["pid"] == srv.pid and process["alive"] is True
    assert process["flags"]["port"] == srv.port
    # (other ComfyUI-looking processes on a shared test machine may be listed as well)
    assert process["interpreter"] and process["cwd"]
    stats = data["system_stats"]
    assert stats["devices"][0]["type"] == "cuda" and stats["system"]["comfyui_version"]
    assert "Got an OOM, unloading all loaded models." in data["internal_logs"]["tail"]
    assert "kernel" not in data
    # no secret in any file of the snapshot, nor in what the daemon logged
    everything = files_text(snap)
    assert SECRET_KEY not in everything and SECRET_TOKEN not in everything
    assert SECRET_KEY not in daemon.stderr() and SECRET_TOKEN not in daemon.stderr()
    # and the run is recorded, linked to the incident
    run = wait_run(daemon, pid)
    assert run.outcome == "oom" and run.pool == "gpu" and run.node_type == "AllocateVRAM"
    assert run.incident_id == data["incident"]["id"] and run.fingerprint
    assert run.pid == srv.pid
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.stderr()


@pytest.mark.parametrize(
    ("prompt", "exception_type"),
    [
        (one_node("AllocateRAM", mib=2048), "MemoryError"),
        (one_node("EmptyImage", width=8192, height=8192, batch_size=4, color=0), "RuntimeError"),
    ],
    ids=["python-memoryerror", "torch-cpu-allocator"],
)
def test_a_ram_failure_under_an_address_space_limit_is_a_ram_snapshot(
    tmp_path: Path,
    install: Path,
    started: Callable[..., StandinProcess],
    daemons: list[Daemon],
    prompt: dict[str, Any],
    exception_type: str,
) -> None:
    srv = started("base", install, rlimit_as_headroom_mib=300)
    daemon = watch(daemons, tmp_path, srv.url, srv.url)
    pid = post(srv, prompt)
    (snap,) = wait_snapshots(daemon, 1)
    data = load_snapshot_json(snap)
    assert data["event"]["pool"] == "ram" and data["event"]["backend"] == "cpu"
    assert data["event"]["exception_type"] == exception_type
    assert data["event"]["node_type"] == prompt["1"]["class_type"]
    assert json.loads((snap / "prompt.json").read_text()) == prompt
    assert data["files"]["workflow"] is None  # posted without a UI workflow
    assert srv.alive(), "ComfyUI survives a Python-level OOM"
    assert wait_run(daemon, pid).outcome == "oom"


def vmstat_oom_kills() -> str | None:
    """The kernel's machine-wide OOM kill counter (None where /proc/vmstat has none)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return line
    return None


def test_a_kernel_oom_kill_while_rss_climbs_is_a_killed_by_os_snapshot_with_the_climb(
    tmp_path: Path, install: Path, started: Callable[..., StandinProcess], daemons: list[Daemon]
) -> None:
    srv = started("base", install)
    kmsg = kernel_log(tmp_path)
    daemon = watch(daemons, tmp_path, install, srv.url, env={"OOM_SENTINEL_KMSG": str(kmsg)})
    wait_pid_found(daemon, srv)
    prompt = one_node("AllocateRAM", mib=1200, steps=40, step_delay_ms=100)
    pid = post(srv, prompt)
    victim = psutil.Process(srv.pid)
    wait_for(lambda: victim.memory_info().rss > 500 * MIB, 30, "RSS to climb")
    with kmsg.open("a") as f:
        f.write(kernel_kill_lines(srv.pid))
    os.kill(srv.pid, signal.SIGKILL)  # not reaped until the end: the daemon reads the status

    (snap,) = wait_snapshots(daemon, 1)
    data = load_snapshot_json(snap)
    assert data["event"]["pool"] == "killed-by-os"
    assert data["event"]["killed_pid"] == srv.pid
    (proc_obs,) = [o for o in data["observations"] if o["source"] == "process"]
    assert proc_obs["evidence"]["signal"] == signal.SIGKILL
    assert proc_obs["evidence"]["prompt_id"] == pid
    kernel = data["kernel"]
    assert kernel["pid"] == srv.pid and kernel["signal"] == signal.SIGKILL
    assert {s["source"] for s in kernel["sources"]} >= {"vmstat", "cgroup", "kmsg", "journal"}
    for source in kernel["sources"]:
        assert source["status"] in STATUSES
        if source["status"] in ("unreadable", "unavailable"):
            assert source["reason"], source
    assert kernel["summary"].startswith(f"process {srv.pid} ")
    assert kernel["killer"] == "kernel" and kernel["verdict"] == "evidence"
    wait_for(lambda: "ALERT [critical]" in daemon.stderr(), 30, "the critical alert")
    process = data["process"]
    assert process["pid"] == srv.pid and process["alive"] is False
    assert process["exit"]["signal"] == signal.SIGKILL and process["exit"]["os_kill"] is True
    # the prompt that was running, captured from the queue before the process died
    assert json.loads((snap / "prompt.json").read_text()) == prompt
    # the climb, sampled every 250 ms while the prompt ran, up to the death
    rows = list(csv.DictReader(io.StringIO((snap / "timeline.csv").read_text())))
    column = f"pid{srv.pid}_rss_bytes"
    rss = [int(r[column]) for r in rows if r.get(column)]
    assert len(rss) >= 3 and max(rss) >= 400 * MIB and rss[0] < max(rss) - 200 * MIB
    assert rss.index(max(rss)) >= len(rss) - 2, "the last samples before the death are the peak"
    run = wait_run(daemon, pid)
    assert run.outcome == "killed" and run.incident_id == data["incident"]["id"]
    assert run.peak_rss_bytes is not None and run.peak_rss_bytes >= 400 * MIB
    srv.proc.wait()
    assert daemon.stop() == 0


def test_a_plain_kill_9_is_a_sigkill_run_not_an_oom_incident(
    tmp_path: Path, install: Path, started: Callable[..., StandinProcess], daemons: list[Daemon]
) -> None:
    """A user's (or a launcher's, or a teardown's) ``kill -9`` while a prompt runs: the kernel
    log was read and names no kill, so no snapshot and no alert -- the run says it was killed."""
    srv = started("base", install)
    kmsg = kernel_log(tmp_path)
    daemon = watch(daemons, tmp_path, install, srv.url, env={"OOM_SENTINEL_KMSG": str(kmsg)})
    wait_pid_found(daemon, srv)
    pid = post(srv, one_node("AllocateRAM", mib=400, steps=40, step_delay_ms=100))
    victim = psutil.Process(srv.pid)
    wait_for(lambda: victim.memory_info().rss > 200 * MIB, 30, "RSS to climb")
    kills_before = vmstat_oom_kills()
    os.kill(srv.pid, signal.SIGKILL)
    run = wait_run(daemon, pid)
    srv.proc.wait()
    if vmstat_oom_kills() != kills_before:
        pytest.skip("another process on this machine was OOM-killed meanwhile")
    assert run.outcome == "sigkill" and run.incident_id is None
    log = daemon.stderr()
    assert f"(pid {srv.pid}) ended" in log and "killed (SIGKILL)" in log and "not an OOM" in log
    time.sleep(1.0)  # a snapshot would be written within the storm tick
    assert snapshot_dirs(daemon.data_dir) == []
    assert "ALERT [" not in daemon.stderr()  # the log channel shows every alert: none
    assert daemon.stop() == 0


def test_a_sigkill_after_discovery_rounds_is_still_a_killed_by_os_snapshot(
    tmp_path: Path, install: Path, started: Callable[..., StandinProcess], daemons: list[Daemon]
) -> None:
    """Discovery re-finds the running ComfyUI every round; the process watcher keeps it."""
    srv = started("base", install)
    one_second_discovery = config().replace(
        "enabled = false\n", "enabled = false\ninterval_s = 1\n"
    )
    kmsg = kernel_log(tmp_path)
    daemon = watch(
        daemons,
        tmp_path,
        install,
        srv.url,
        config_text=one_second_discovery,
        env={"OOM_SENTINEL_KMSG": str(kmsg)},
    )
    wait_pid_found(daemon, srv)
    time.sleep(3)  # not a timing assertion: let a few one-second discovery rounds pass
    with kmsg.open("a") as f:
        f.write(kernel_kill_lines(srv.pid))
    os.kill(srv.pid, signal.SIGKILL)
    (snap,) = wait_snapshots(daemon, 1)
    data = load_snapshot_json(snap)
    assert data["event"]["pool"] == "killed-by-os" and data["event"]["killed_pid"] == srv.pid
    srv.proc.wait()
    assert daemon.stop() == 0


def test_twenty_comfyui_restarts_under_one_daemon_lose_and_duplicate_nothing(
    tmp_path: Path, install: Path, gpu: Path, daemons: list[Daemon]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    daemon = watch(
        daemons,
        tmp_path,
        url,
        None,
        config_text=config(storm_window_s=0),  # every OOM its own incident, to count them
        env={"OOM_SENTINEL_FAKE_GPU": str(gpu)},
    )
    daemon_pid = daemon.proc.pid if daemon.proc is not None else None
    expected: dict[str, str] = {}
    pids: set[int] = set()
    for i in range(20):
        srv = start_standin(
            tmp_path / f"run{i}", code_dir=install, base_directory=False, port=port, fake_gpu=gpu
        )
        try:
            pids.add(srv.pid)
            if i % 2:
                prompt_id = post(srv, one_node("AllocateVRAM", mib=9000 + i))
                expected[prompt_id] = "oom"
            else:
                prompt_id = post(
                    srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=i)
                )
                expected[prompt_id] = "success"
            wait_run(daemon, prompt_id)
        finally:
            # a clean stop, reaped only once the daemon has seen the end (so it reads the
            # exit status instead of guessing)
            srv.proc.send_signal(signal.SIGINT)
            wait_for(lambda srv=srv: f"(pid {srv.pid}) ended" in daemon.stderr(), 30, "the end")  # type: ignore[misc]
            srv.proc.wait(10)
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert daemon.proc.pid == daemon_pid
    recorded = runs(daemon.data_dir)
    assert sorted(r.prompt_id for r in recorded) == sorted(expected)
    assert {r.prompt_id: r.outcome for r in recorded} == expected
    assert {r.pid for r in recorded} == pids, "each run names the process that ran it"
    snaps = wait_snapshots(daemon, 10)
    assert len(snaps) == 10
    snapped = sorted(
        o["evidence"]["prompt_id"]
        for s in snaps
        for o in load_snapshot_json(s)["observations"]
        if o["source"] == "api"
    )
    assert snapped == sorted(p for p, outcome in expected.items() if outcome == "oom")
    assert all(load_snapshot_json(s)["event"]["pool"] == "gpu" for s in snaps)
    assert "Traceback" not in daemon.stderr()
    assert daemon.stop() == 0


def test_a_second_instance_is_flagged_in_the_snapshot(
    tmp_path: Path,
    install: Path,
    gpu: Path,
    started: Callable[..., StandinProcess],
    daemons: list[Daemon],
) -> None:
    watched = started("main", install, fake_gpu=gpu)
    second = started("second", install, fake_gpu=gpu)
    daemon = watch(
        daemons, tmp_path, watched.url, watched.url, env={"OOM_SENTINEL_FAKE_GPU": str(gpu)}
    )
    post(watched, one_node("AllocateVRAM", mib=9000))
    (snap,) = wait_snapshots(daemon, 1)
    data = load_snapshot_json(snap)
    process = data["process"]
    assert process["pid"] == watched.pid and process["second_instance"] is True
    # only ours: a shared test machine may run other ComfyUI-looking processes too
    (other,) = [o for o in process["other_instances"] if o["pid"] == second.pid]
    assert other["port"] == second.port
    assert other["gpu_used_bytes"] is not None  # the fake GPU lists its CUDA context
    kinds = {c["kind"] for c in process["conflicts"]}
    assert {"same-gpu", "same-install"} <= kinds
    gpu_users = {p["pid"]: p for p in process["other_gpu_processes"]}
    assert gpu_users[second.pid]["comfyui"] is True
    assert any(a["key"] == "stop-second-instance" for a in data["advice"])
    assert daemon.stop() == 0


def test_the_log_and_the_api_make_one_snapshot(
    tmp_path: Path,
    install: Path,
    gpu: Path,
    started: Callable[..., StandinProcess],
    daemons: list[Daemon],
) -> None:
    srv = started("base", install, fake_gpu=gpu, manager_log=True)
    daemon = watch(daemons, tmp_path, install, srv.url, env={"OOM_SENTINEL_FAKE_GPU": str(gpu)})
    wait_for(lambda: f"comfyui_{srv.port}.log" in daemon.stderr(), 30, "the Manager log")
    # a log already there is followed from where it ends at the follower's first poll
    time.sleep(1.5)
    pid = post(srv, one_node("AllocateVRAM", mib=9000))
    (snap,) = wait_snapshots(daemon, 1)
    time.sleep(1.0)  # nothing else arrives
    assert len(snapshot_dirs(daemon.data_dir)) == 1
    data = load_snapshot_json(snap)
    assert data["sources"] == ["api", "log"]
    assert data["event"]["node_type"] == "AllocateVRAM"  # from the API
    assert data["event"]["requested_bytes"] is not None  # from the message
    assert "!!! Exception during processing !!!" in (snap / "log.txt").read_text()
    assert {o["source"] for o in data["observations"]} == {"api", "log"}
    assert wait_run(daemon, pid).outcome == "oom"
    assert daemon.stop() == 0


def test_a_daemon_killed_and_restarted_catches_up_from_history_exactly_once(
    tmp_path: Path,
    install: Path,
    gpu: Path,
    started: Callable[..., StandinProcess],
    daemons: list[Daemon],
) -> None:
    srv = started("base", install, fake_gpu=gpu)
    env = {"OOM_SENTINEL_FAKE_GPU": str(gpu)}
    # an OOM from before any daemon ran: a run, but no alarm on old news
    ancient = post(srv, one_node("AllocateVRAM", mib=9000))
    wait_for(lambda: srv.get_json(f"/history/{ancient}"), 30, "the old prompt")
    first = watch(
        daemons, tmp_path, srv.url, srv.url, config_text=config(storm_window_s=0), env=env
    )
    assert wait_run(first, ancient).outcome == "oom"
    assert snapshot_dirs(first.data_dir) == []
    before_oom = post(srv, one_node("AllocateVRAM", mib=9001))
    before_ok = post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=1))
    wait_snapshots(first, 1)
    wait_run(first, before_oom)
    wait_run(first, before_ok)
    first.kill9()
    # while no daemon runs, ComfyUI goes on
    down_oom = post(srv, one_node("AllocateVRAM", mib=9002))
    down_ok = post(srv, one_node("EmptyImage", width=8, height=8, batch_size=1, color=2))
    wait_for(lambda: srv.get_json(f"/history/{down_ok}"), 30, "the prompts to finish")
    first.stderr_path.rename(tmp_path / "first.stderr")  # the ready line is the new one's
    second = watch(daemons, tmp_path, srv.url, None, config_text=config(storm_window_s=0), env=env)
    assert wait_run(second, down_oom).outcome == "oom"
    assert wait_run(second, down_ok).outcome == "success"
    snaps = wait_snapshots(second, 2)
    time.sleep(1.0)  # nothing more arrives
    assert len(snapshot_dirs(second.data_dir)) == 2
    snapped = sorted(
        o["evidence"]["prompt_id"]
        for s in snaps
        for o in load_snapshot_json(s)["observations"]
        if o["source"] == "api"
    )
    assert snapped == sorted([before_oom, down_oom])
    assert sorted(r.prompt_id for r in runs(second.data_dir)) == sorted(
        [ancient, before_oom, before_ok, down_oom, down_ok]
    )
    assert second.stop() == 0
