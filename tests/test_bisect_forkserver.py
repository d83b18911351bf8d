"""The fork server (forkserver.py + forkclient.py): a measurement forked from a preloaded
interpreter, through the real stand-in ComfyUI, on the file-scripted fake GPU.

It must measure what a cold start measures (the fake GPU's per-process figure is exact, so
the two are compared exactly), die with ``oom-bisect`` however that dies, and fall back to
cold starts where fork is unavailable. A real ComfyUI started through it answers and runs a
prompt (``real_comfyui``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from proc_waits import reap, wait_gone, wait_while_running
from standin_repos import build_core_repo

from oom_sentinel.bisect.measure import forkclient
from oom_sentinel.bisect.measure.replay import REPLAY_RECORD, Replayer, ReplaySettings
from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.verdict import Ok, Oom
from oom_sentinel.bisect.state.states import scan_install
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
from oom_sentinel.daemon.probes.host import PsutilHostProbe

MIB = 1024 * 1024
GIB = 1024 * MIB
CONTEXT = 312 * MIB  # the stand-in's CUDA context (standin_memory.CUDA_CONTEXT_BYTES)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork server")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("fork")
    gpu = base / "fakegpu"
    FakeGpuDir(gpu).create([FakeDevice(0, "Fake RTX 3060", 4 * GIB)])
    core = build_core_repo(base / "ComfyUI", 3, bad_commit_index=2)
    install = scan_install(core.path)
    ws = Workspace.create(base / "ws", install)
    ws.switch(install.current_state().with_values({"comfyui": core.commits[1]}))
    yield {"ws": ws, "gpu": gpu}
    forkclient.shutdown_fork_servers()


def _replayer(bench: Any, **kw: Any) -> Replayer:
    settings = ReplaySettings(
        python=sys.executable, env={"OOM_SENTINEL_FAKE_GPU": str(bench["gpu"])}, **kw
    )
    return Replayer(bench["ws"], settings, gpu=FakeGpuProbe(bench["gpu"]), host=PsutilHostProbe())


def _vram_prompt(mib: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": mib}},
        "2": {"class_type": "Sleep", "inputs": {"seconds": 0.35, "value": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


@linux_only
def test_a_measurement_through_the_fork_server_measures_what_a_cold_start_does(bench) -> None:
    # the first measurement of an environment starts cold: it says what ComfyUI imports
    cold = _replayer(bench, fork_server=True).measure(_vram_prompt(1000))
    forked = _replayer(bench, fork_server=True).measure(_vram_prompt(1000))
    assert isinstance(forked.outcome, Ok) and isinstance(cold.outcome, Ok)
    assert any(n.startswith("forked by the fork server") for n in forked.notes)
    assert not any(n.startswith("forked") for n in cold.notes)
    # the fake GPU's per-process figure is exact: the forked child's is the cold start's
    assert forked.peaks.nvml_vram_bytes == cold.peaks.nvml_vram_bytes == CONTEXT + 1000 * MIB
    assert forked.peaks.hwm_bytes and forked.peaks.tree_rss_bytes
    assert forked.exit_code is not None and forked.stopped_by_harness
    # the stand-in's own third-party imports were preloaded, its own modules never
    ((server),) = [s for s in forkclient._servers.values() if isinstance(s, forkclient.ForkServer)]
    # what the stand-in's cold start imported of PRELOAD: its aiohttp, never torch (absent)
    assert "aiohttp" in server.preloaded and "aiohttp.web" in server.preloaded
    assert "torch" not in server.preloaded and not server.hello["failed"]
    assert set(server.preloaded) < set(forkclient.PRELOAD)
    assert server.hello["cuda_initialized"] is False
    # the next measurement reuses the same server
    again = _replayer(bench, fork_server=True).measure(_vram_prompt(200))
    assert isinstance(again.outcome, Ok)
    assert again.peaks.nvml_vram_bytes == CONTEXT + 200 * MIB
    assert [s for s in forkclient._servers.values()] == [server]
    assert server.proc.poll() is None


def test_fork_is_unavailable_on_windows_and_macos() -> None:
    assert forkclient.fork_unavailable("linux") is None
    assert "Windows" in (forkclient.fork_unavailable("win32") or "")
    assert "macOS" in (forkclient.fork_unavailable("darwin") or "")


def test_without_fork_measurements_start_cold_and_it_is_said_once(
    bench, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(forkclient.sys, "platform", "win32")
    monkeypatch.setattr(forkclient, "_said", set())
    with caplog.at_level(logging.WARNING, logger="oom_sentinel.bisect.measure.forkclient"):
        first = _replayer(bench, fork_server=True).measure(_vram_prompt(100))
        second = _replayer(bench, fork_server=True).measure(_vram_prompt(100))
    for m in (first, second):
        assert isinstance(m.outcome, Ok)
        assert m.peaks.nvml_vram_bytes == CONTEXT + 100 * MIB
        assert not any(n.startswith("forked") for n in m.notes)
    said = [r.getMessage() for r in caplog.records if "starts cold" in r.getMessage()]
    assert said == ["--fork-server: Windows has no fork(); every measurement starts cold"]


DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from oom_sentinel.bisect.measure import forkclient
    from oom_sentinel.bisect.measure import procutil
    from oom_sentinel.bisect.measure import replay
    harness, sleeper = Path(sys.argv[1]), sys.argv[2]
    server = forkclient.fork_server_for(
        sys.executable, {"PATH": "/usr/bin:/bin"}, harness, replay._spawner.popen, 60,
        start_new_session=True, preexec_fn=procutil.pdeathsig_preexec(),
    )
    child = server.spawn([sys.executable, sleeper], cwd=harness, env={"PATH": "/usr/bin:/bin"},
                         console=harness / "console.log")
    print(server.proc.pid, child.pid, flush=True)
    time.sleep(120)
    """
)


@linux_only
def test_the_forked_comfyui_and_the_server_die_when_oom_bisect_is_sigkilled(
    tmp_path: Path,
) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(
        "import os, sys, time\nprint('up', os.getpid(), flush=True)\ntime.sleep(120)\n"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), str(sleeper)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        server_pid, child_pid = map(int, driver.stdout.readline().split())
        deadline = time.monotonic() + 30
        console = tmp_path / "console.log"
        while not console.exists() or "up" not in console.read_text():
            assert time.monotonic() < deadline, "the forked child never ran"
            time.sleep(0.05)
        child = psutil.Process(child_pid)
        assert child.ppid() == server_pid  # the server's child, not the harness's
        assert os.getpgid(child_pid) == child_pid  # its own process group
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        assert wait_gone(server_pid), "the fork server outlived oom-bisect"
        assert wait_gone(child_pid), "the forked ComfyUI outlived oom-bisect"
    finally:
        reap(driver)


@linux_only
@pytest.mark.slow
def test_the_real_oom_bisect_with_fork_server_leaves_no_comfyui_when_killed(
    tmp_path: Path,
) -> None:
    from test_bisect_e2e import make_install, vram_workflow

    inst = make_install(tmp_path)
    # each replay holds its memory 5 s: the first starts cold (it says what ComfyUI
    # imports), the next ones are forked, and one of those is killed mid-replay
    wf = inst.workflow(vram_workflow(hold_s=5.0))
    proc = inst.spawn(*inst.core_span(wf), "--fork-server")

    def forked() -> tuple[int, int] | None:
        with contextlib.suppress(OSError, ValueError, StopIteration, psutil.Error):
            record = next((tmp_path / "cache").rglob(REPLAY_RECORD))  # rewritten atomically
            pid = json.loads(record.read_text())["pid"]
            parent = psutil.Process(pid).ppid()
            if parent != proc.pid:  # forked by the server, not started by oom-bisect
                return pid, parent
        return None

    try:
        pid, server_pid = wait_while_running(proc, forked, 120, "no forked replay started")
        assert "oom_bisect_forkserver" in " ".join(psutil.Process(server_pid).cmdline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_gone(pid), f"the forked ComfyUI (pid {pid}) outlived oom-bisect"
        assert wait_gone(server_pid), "the fork server outlived oom-bisect"
    finally:
        reap(proc)
    inst.assert_untouched()


@linux_only
@pytest.mark.real_comfyui
def test_a_real_comfyui_forked_from_the_server_answers_and_runs_a_prompt(tmp_path: Path) -> None:
    import urllib.request

    from fork_start import (
        bootstrap_argv,
        clean_env,
        free_port,
        real_comfy_args,
        start,
        start_fork_server,
        stop,
    )

    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON") or sys.executable
    main_py = Path(os.environ["OOM_SENTINEL_REAL_COMFYUI"]) / "main.py"
    env = clean_env()
    server = start_fork_server(python, tmp_path / "harness", env)
    try:
        assert "torch" in server.preloaded and server.hello["cuda_initialized"] is False
        port = free_port()
        argv = bootstrap_argv(
            python, tmp_path / "harness", main_py, real_comfy_args(tmp_path, port)
        )
        s = start(
            argv, cwd=tmp_path, env=env, console=tmp_path / "console.log", port=port, server=server
        )
        assert isinstance(s.proc, forkclient.ForkedChild)
        assert psutil.Process(s.proc.pid).ppid() == server.proc.pid
        prompt = {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 7},
            },
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        }
        body = json.dumps({"prompt": prompt, "client_id": "fork"}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/prompt", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            prompt_id = json.loads(resp.read())["prompt_id"]
        deadline = time.monotonic() + 120
        entry: dict[str, Any] = {}
        while not entry:
            assert time.monotonic() < deadline, "the prompt did not finish"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/history/{prompt_id}") as r:
                entry = json.loads(r.read()).get(prompt_id) or {}
            time.sleep(0.1)
        assert entry["status"]["status_str"] == "success"
        assert entry["outputs"]["2"]["images"]
        report = json.loads((tmp_path / "harness" / "bootstrap-report.json").read_text())
        assert report["torch"]["imported"] is True  # the bootstrap saw the preloaded torch
        assert stop(s.proc) is not None
    finally:
        server.close()
    assert server.proc.returncode is not None


# ---- torch preloaded: the bootstrap still sets CUDA up; another allocator means a cold start ----

GUARDED_MAIN = """
import json, os, sys
with open(os.environ["SEEN"], "a") as fh:
    fh.write(json.dumps({"pid": os.getpid(), "torch_before_main": "torch" in sys.modules}) + "\\n")
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"  # as ComfyUI's cuda_malloc.py
import torch
torch.cuda.init()
torch.cuda.alloc(1024)
"""


def _fake_torch_bench(tmp_path: Path, main_source: str) -> tuple[list[str], dict[str, str], Path]:
    from test_bisect_replay import BOOTSTRAP, _fake_torch

    site = _fake_torch(tmp_path)
    app = tmp_path / "ComfyUI"
    app.mkdir()
    (app / "main.py").write_text(main_source)
    (app / "helper_next_to_main.py").write_text("")
    harness = tmp_path / "harness"
    harness.mkdir()
    boot = harness / "oom_bisect_bootstrap.py"
    boot.write_text(BOOTSTRAP.read_text())
    seen = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_")}
    env.update(PYTHONPATH=str(site), SEEN=str(seen), PYTHONUNBUFFERED="1")
    argv = [sys.executable, str(boot), "--result", str(harness / "report.json")]
    return argv, env, app


@linux_only
def test_with_torch_preloaded_the_bootstrap_still_caps_vram_and_records_the_peaks(
    tmp_path: Path,
) -> None:
    from fork_start import start_fork_server
    from test_bisect_replay import MAIN

    argv, env, app = _fake_torch_bench(tmp_path, MAIN)
    argv += ["--vram-budget-bytes", str(4 * GIB), "--", str(app / "main.py"), "--port", "1"]
    server = start_fork_server(sys.executable, tmp_path / "harness", env)
    try:
        assert "torch" in server.preloaded and server.hello["cuda_initialized"] is False
        child = server.spawn(argv, cwd=app, env=env, console=tmp_path / "console.log")
        assert child.wait(timeout=60) == 0, (tmp_path / "console.log").read_text()
    finally:
        server.close()
    s = json.loads((tmp_path / "seen.json").read_text())
    assert s["torch_before_main"] is True  # preloaded
    assert s["path0"] == str(app) and s["argv"] == ["--port", "1"]
    assert "Tried to allocate" in s["oom"]
    r = json.loads((tmp_path / "harness" / "report.json").read_text())
    t = r["torch"]
    assert t["imported"] and t["cuda"] and t["history"]
    assert t["fractions"] == {"0": 0.5}
    assert t["devices"][0]["max_reserved_bytes"] == 3 * GIB
    assert r["oom"]["requested_bytes"] == 2 * GIB


@linux_only
def test_a_child_whose_allocator_settings_changed_restarts_cold_and_the_next_server_learns(
    tmp_path: Path,
) -> None:
    from oom_sentinel.bisect.measure.procutil import pdeathsig_preexec

    argv, env, app = _fake_torch_bench(tmp_path, GUARDED_MAIN)
    argv += ["--", str(app / "main.py")]
    console = tmp_path / "console.log"

    def server_for() -> forkclient.ForkServer:
        server = forkclient.fork_server_for(
            sys.executable,
            env,
            tmp_path / "harness",
            subprocess.Popen,
            120,
            start_new_session=True,
            preexec_fn=pdeathsig_preexec(),
        )
        assert server is not None
        return server

    try:
        first = server_for()
        assert first.hello["alloc_conf"]["PYTORCH_CUDA_ALLOC_CONF"] is None
        child = first.spawn(argv, cwd=app, env=env, console=console)
        assert child.wait(timeout=60) == 0, console.read_text()
        assert child.restarted_cold
        assert "restarting cold" in console.read_text()
        report = json.loads((tmp_path / "harness" / "report.json").read_text())
        assert report["torch"]["cuda"] is True and report["exit_code"] == 0
        # the next server preloads torch with what ComfyUI chose: its child stays forked
        second = server_for()
        assert second is not first
        assert second.hello["alloc_conf"]["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
        again = second.spawn(argv, cwd=app, env=env, console=console)
        assert again.wait(timeout=60) == 0, console.read_text()
        assert not again.restarted_cold
        assert server_for() is second
    finally:
        forkclient.shutdown_fork_servers()
    runs = [json.loads(line) for line in (tmp_path / "seen.json").read_text().splitlines()]
    # the first forked run got as far as CUDA's start, then the same pid started cold
    assert [r["torch_before_main"] for r in runs] == [True, False, True]
    assert runs[0]["pid"] == runs[1]["pid"] == child.pid
    assert runs[2]["pid"] == again.pid


# ---- a whole bisect, cold and forked --------------------------------------------------------


@linux_only
@pytest.mark.slow
def test_a_ram_bisect_with_the_fork_server_names_the_same_culprit_with_the_same_peaks(
    tmp_path: Path,
) -> None:
    from test_bisect_e2e import culprit, make_install, ram_workflow

    docs = {}
    for kind in ("cold", "forked"):
        inst = make_install(tmp_path / kind, fake_gpu=False)
        core = inst.core
        extra = ["--fork-server"] if kind == "forked" else []
        code, doc, err = inst.bisect(
            *inst.core_span(inst.workflow(ram_workflow()), 150, 250),
            "--flags",
            "--cpu",
            *extra,
        )
        assert (code, doc["result"]) == (0, "found"), err[-3000:]
        assert culprit(doc) == [("comfyui", core.bad_commit)]
        logs = list((tmp_path / kind).rglob("forkserver.log"))
        assert bool(logs) == (kind == "forked")
        docs[kind] = doc
        inst.assert_untouched()

    # the same states, measured to the end (a bad state stopped at the threshold is only a
    # lower bound, its figure depends on when the sampler saw it): the same RAM peaks
    def full(kind: str) -> dict[str, int]:
        return {
            json.dumps(st["state"], sort_keys=True): st["peak_ram_bytes"]
            for st in docs[kind]["steps"]
            if not st.get("peak_is_lower_bound") and st.get("peak_ram_bytes")
        }

    cold, forked = full("cold"), full("forked")
    both = sorted(set(cold) & set(forked))
    assert len(both) >= 3, (cold, forked)
    for state in both:
        c, f = cold[state], forked[state]
        print(f"\n[fork] ram peak cold {c / MIB:.1f} MiB, forked {f / MIB:.1f} MiB")
        assert abs(f - c) <= 0.03 * c


@linux_only
def test_a_server_whose_preload_touched_the_cuda_driver_is_refused_and_replays_start_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A package that calls the CUDA driver while importing (``libcuda`` gets loaded) would
    leave every forked child without CUDA: the server says so and is not used."""
    import _ctypes
    import shutil

    from oom_sentinel.bisect.measure.procutil import pdeathsig_preexec

    shutil.copyfile(_ctypes.__file__, tmp_path / "libcuda.so.1")  # any shared object will do
    (tmp_path / "touches_cuda.py").write_text(
        f"import ctypes\nctypes.CDLL({str(tmp_path / 'libcuda.so.1')!r})\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    monkeypatch.setattr(forkclient, "_said", set())
    try:
        with caplog.at_level(logging.WARNING, logger="oom_sentinel.bisect.measure.forkclient"):
            server = forkclient.fork_server_for(
                sys.executable,
                env,
                tmp_path / "harness",
                subprocess.Popen,
                60,
                ["json", "touches_cuda"],
                start_new_session=True,
                preexec_fn=pdeathsig_preexec(),
            )
        assert server is None
        said = [r.getMessage() for r in caplog.records]
        assert any("initialised CUDA" in m and "starting cold" in m for m in said), said
        # without that package the same environment gets its server
        ok = forkclient.fork_server_for(
            sys.executable,
            env,
            tmp_path / "harness",
            subprocess.Popen,
            60,
            ["json"],
            start_new_session=True,
            preexec_fn=pdeathsig_preexec(),
        )
        assert ok is not None and ok.hello["cuda_initialized"] is False
    finally:
        forkclient.shutdown_fork_servers()


@linux_only
@pytest.mark.real_comfyui
def test_real_comfyui_replays_cold_then_forked_measure_the_same_ram_peak(tmp_path: Path) -> None:
    """Two replays of a real ComfyUI v0.8.0 (``--cpu``) with ``--fork-server``: the first
    starts cold and says what ComfyUI imports, the second is forked; the same RAM peak."""
    from bisect_git import clone_real_comfyui

    real = Path(os.environ["OOM_SENTINEL_REAL_COMFYUI"])
    python = os.environ.get("OOM_SENTINEL_REAL_COMFYUI_PYTHON") or sys.executable
    user = clone_real_comfyui(real, tmp_path / "ComfyUI")
    install = scan_install(user)
    ws = Workspace.create(tmp_path / "ws", install)
    ws.switch(install.current_state())
    settings = ReplaySettings(python=python, user_flags=("--cpu",), fork_server=True)
    replayer = Replayer(ws, settings, gpu=None, host=PsutilHostProbe())
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 1024, "height": 1024, "batch_size": 4, "color": 0},
        },
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    try:
        cold = replayer.measure(prompt)
        forked = replayer.measure(prompt)
    finally:
        forkclient.shutdown_fork_servers()
    assert isinstance(cold.outcome, Ok), cold.outcome
    assert isinstance(forked.outcome, Ok), (forked.outcome, forked.console_tail)
    assert not any(n.startswith("forked") for n in cold.notes)
    assert any(n.startswith("forked by the fork server") for n in forked.notes)
    c, f = cold.peaks.ram_bytes, forked.peaks.ram_bytes
    assert c and f
    print(
        f"\n[fork] real ComfyUI: ready cold {cold.timings['ready_s']:.2f} s, forked "
        f"{forked.timings['ready_s']:.2f} s; RAM peak cold {c / MIB:.1f} MiB, forked {f / MIB:.1f}"
    )
    assert abs(f - c) <= 0.03 * c


@linux_only
def test_a_replay_whose_fork_server_dies_is_not_taken_for_an_oom_kill(bench) -> None:
    """The child dies of its parent-death signal (SIGKILL) when the server goes: that is no
    kernel OOM kill, and its exit status is unknown."""
    import threading

    forkclient.shutdown_fork_servers()
    _replayer(bench, fork_server=True).measure(_vram_prompt(10))  # cold: learns the imports
    prompt = {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 100}},
        "2": {"class_type": "Sleep", "inputs": {"seconds": 60.0, "value": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }
    out: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: out.setdefault("m", _replayer(bench, fork_server=True).measure(prompt))
    )
    worker.start()
    record = bench["ws"].root / "harness" / REPLAY_RECORD
    deadline = time.monotonic() + 60
    server_pid = None
    while server_pid is None:
        assert time.monotonic() < deadline, "no forked replay started"
        time.sleep(0.05)
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            pid = json.loads(record.read_text())["pid"]
            parent = psutil.Process(pid).ppid()
            if parent != os.getpid():
                server_pid = parent
    time.sleep(1.0)  # it is running the prompt
    os.kill(server_pid, signal.SIGKILL)
    worker.join(timeout=90)
    assert not worker.is_alive()
    m = out["m"]
    assert not isinstance(m.outcome, Oom), m.outcome
    assert m.exit_code is None
    assert any("fork server died" in n for n in m.notes)
    assert wait_gone(pid)
