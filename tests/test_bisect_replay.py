"""The replay harness (replay.py + bootstrap.py): what one measurement of one state says.

The pure mapping from a server's behaviour to an outcome is a table; everything else runs the
real stand-in ComfyUI from a real workspace (a shared clone of a stand-in git history), on
the file-scripted fake GPU, through the bootstrap, and checks the peaks, the verdict words
and that no ComfyUI process outlives a measurement. The bootstrap's torch side runs against
a fake ``torch`` package (CUDA cannot exist here) that records what was asked of it.
"""

from __future__ import annotations

import json
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
from fake_torch import write_fake_torch
from standin_repos import build_core_repo, repo_fingerprint

from oom_sentinel.bisect.measure.replay import (
    Peaks,
    Replayer,
    ReplaySettings,
    input_files,
    outcome_from_run,
    reject_reason,
)
from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.verdict import Ok, Oom, Skip, Threshold, Timeout
from oom_sentinel.bisect.state.states import scan_install
from oom_sentinel.daemon.comfy.api import PostResult, RunOutcome
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
from oom_sentinel.daemon.probes.host import PsutilHostProbe

MIB = 1024 * 1024
GIB = 1024 * MIB
CONTEXT = 312 * MIB  # the stand-in's CUDA context (standin_memory.CUDA_CONTEXT_BYTES)
BOOTSTRAP = Path(__file__).resolve().parent.parent / "bisect" / "measure" / "bootstrap.py"

# ---------------------------------------------------------------------------- pure mapping

PEAKS = Peaks(nvml_vram_bytes=3 * GIB, tree_rss_bytes=500 * MIB, hwm_bytes=600 * MIB)
ACCEPTED = PostResult(200, "p1", 1.0, {}, None)


def _run(
    kind: str, *, error: dict[str, Any] | None = None, post: PostResult = ACCEPTED
) -> RunOutcome:
    return RunOutcome(kind, "p1", post, None, error, (), (), (), None, 2.5)  # type: ignore[arg-type]


CUDA_OOM = {
    "node_id": "3",
    "node_type": "KSampler",
    "exception_type": "torch.OutOfMemoryError",
    "exception_message": "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 23.99 GiB of which 512.00 MiB is free.\nThis error means you ran out of memory on your GPU.",
}
RAM_OOM = {
    "node_id": "5",
    "node_type": "VAEDecode",
    "exception_type": "RuntimeError",
    "exception_message": "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
    "can't allocate memory: you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)",
}
UNRELATED = {
    "node_id": "7",
    "node_type": "LoadImage",
    "exception_type": "ValueError",
    "exception_message": "image mode not supported",
}
UNKNOWN_NODE = PostResult(
    400,
    None,
    None,
    {},
    {
        "type": "invalid_prompt",
        "message": "Cannot execute because node FancySampler does not exist.",
        "details": "Node ID '#4'",
        "extra_info": {},
    },
)
MISSING_MODEL = PostResult(
    400,
    None,
    None,
    {
        "4": {
            "errors": [
                {
                    "type": "value_not_in_list",
                    "message": "Value not in list",
                    "details": "ckpt_name: 'sdxl.safetensors' not in []",
                    "extra_info": {},
                }
            ],
            "dependent_outputs": ["9"],
            "class_type": "CheckpointLoaderSimple",
        }
    },
    {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation"},
)
PARTIAL = PostResult(200, "p1", 1.0, MISSING_MODEL.node_errors, None)


@pytest.mark.parametrize(
    ("run", "kw", "want", "text"),
    [
        (_run("success"), {}, Ok(3 * GIB, 600 * MIB, 2.5), None),
        (_run("success", post=PARTIAL), {}, Skip, "partial replay: missing model"),
        (_run("error", error=CUDA_OOM), {}, Oom, "torch.OutOfMemoryError: CUDA out of memory"),
        (_run("error", error=RAM_OOM), {}, Oom, "DefaultCPUAllocator"),
        (_run("error", error=UNRELATED), {}, Skip, "unrelated exception in LoadImage (node 7)"),
        (_run("rejected", post=UNKNOWN_NODE), {}, Skip, "unknown node: Cannot execute"),
        (_run("rejected", post=MISSING_MODEL), {}, Skip, "missing model or input file"),
        (_run("interrupted"), {}, Skip, "interrupted"),
        (_run("timeout"), {}, Timeout(2.5, 3 * GIB, 600 * MIB), None),
        (_run("crashed"), {"exit_code": -9}, Oom, "killed by SIGKILL"),
        (_run("crashed"), {"exit_code": 137}, Oom, "killed by SIGKILL"),
        (_run("crashed"), {"exit_code": -9, "killed_by_harness": True}, Skip, "crashed"),
        (
            _run("crashed"),
            {"exit_code": 1, "console_tail": ("MemoryError",)},
            Oom,
            "MemoryError",
        ),
        (
            _run("crashed"),
            {"exit_code": 3, "console_tail": ("boom",)},
            Skip,
            "crashed (exit status 3): boom",
        ),
        (
            None,
            {
                "exit_code": 1,
                "start_failure": "exited with status 1",
                "console_tail": ("SyntaxError: x",),
            },
            Skip,
            "won't start: exited with status 1: SyntaxError: x",
        ),
        (None, {"exit_code": -9, "start_failure": "exited with status -9"}, Oom, "SIGKILL"),
    ],
    ids=[
        "success",
        "partial-replay",
        "cuda-oom",
        "ram-oom",
        "unrelated-exception",
        "unknown-node",
        "missing-model",
        "interrupted",
        "timeout",
        "oom-killer-signal",
        "oom-killer-shell-status",
        "our-own-kill",
        "crash-with-memoryerror",
        "crash",
        "wont-start",
        "killed-while-starting",
    ],
)
def test_run_outcomes_map_to_verdict_words(run, kw, want, text) -> None:
    args = {"peaks": PEAKS, "exit_code": None, "killed_by_harness": False, **kw}
    outcome, event = outcome_from_run(run, **args)
    if isinstance(want, type):
        assert isinstance(outcome, want)
        shown = getattr(outcome, "reason", None) or getattr(outcome, "evidence", "")
        assert text in shown
    else:
        assert outcome == want
    if isinstance(outcome, Oom) and kw.get("exit_code") not in (-9, 137):
        assert event is not None and event["pool"] == outcome.pool


def test_an_oom_keeps_the_peaks_seen_before_it() -> None:
    outcome, event = outcome_from_run(
        _run("error", error=CUDA_OOM), peaks=PEAKS, exit_code=None, killed_by_harness=False
    )
    assert isinstance(outcome, Oom)
    assert (outcome.pool, outcome.peak_vram_bytes, outcome.peak_ram_bytes) == (
        "gpu",
        3 * GIB,
        600 * MIB,
    )
    assert event is not None and event["requested_bytes"] == 2 * GIB


def test_torch_counters_win_over_sampled_nvml_for_the_vram_peak() -> None:
    assert Peaks(nvml_vram_bytes=5 * GIB).vram_bytes == 5 * GIB
    assert Peaks(nvml_vram_bytes=5 * GIB, torch_reserved_bytes=4 * GIB).vram_bytes == 4 * GIB
    assert Peaks().vram_bytes is None and Peaks().ram_bytes is None
    assert Peaks(tree_rss_bytes=2, hwm_bytes=3).ram_bytes == 3


def test_reject_reason_names_each_validation_error() -> None:
    assert reject_reason(UNKNOWN_NODE).startswith("unknown node:")
    text = reject_reason(MISSING_MODEL)
    assert "CheckpointLoaderSimple #4" in text and "sdxl.safetensors" in text


def test_input_files_lists_the_files_a_prompt_loads() -> None:
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png [input]"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "dog.png"}},
        "3": {"class_type": "LoadImage", "inputs": {"image": ["1", 0]}},
        "4": "junk",
    }
    assert input_files(prompt) == ["cat.png", "dog.png"]


# ---------------------------------------------------------------------------- real stand-in


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fakegpu")
    FakeGpuDir(root).create([FakeDevice(0, "Fake RTX 3060", 4 * GIB)])
    return root


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, gpu_dir: Path) -> dict[str, Any]:
    """A 6-commit stand-in history (commit 3 does not start; 5 uses 1.6x memory), the user's
    install at HEAD, and a workspace built from it."""
    base = tmp_path_factory.mktemp("replay")
    core = build_core_repo(base / "ComfyUI", 6, bad_commit_index=5, untestable_range=(3, 4))
    fingerprint = repo_fingerprint(core.path)
    install = scan_install(core.path)
    ws = Workspace.create(base / "ws", install)
    yield {"core": core, "install": install, "ws": ws, "base": base}
    assert repo_fingerprint(core.path) == fingerprint, "a measurement changed the user's repo"


def _replayer(bench: dict[str, Any], gpu_dir: Path | None, **kw: Any) -> Replayer:
    env = {"OOM_SENTINEL_FAKE_GPU": str(gpu_dir)} if gpu_dir is not None else {}
    settings = ReplaySettings(python=sys.executable, env=env, **kw)
    probe = FakeGpuProbe(gpu_dir) if gpu_dir is not None else None
    return Replayer(bench["ws"], settings, gpu=probe, host=PsutilHostProbe())


def _at(bench: dict[str, Any], index: int) -> None:
    state = bench["install"].current_state().with_values({"comfyui": bench["core"].commits[index]})
    bench["ws"].switch(state)


def _vram_prompt(mib: int, hold_s: float = 0.35) -> dict[str, Any]:
    return {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": mib}},
        "2": {"class_type": "Sleep", "inputs": {"seconds": hold_s, "value": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


def _assert_no_server_left(bench: dict[str, Any]) -> None:
    main_py = str(bench["ws"].comfyui / "main.py")
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        assert main_py not in cmd, f"ComfyUI still running: pid {proc.pid}"


def test_a_run_reports_the_fake_gpu_peak_of_the_process_exactly(bench, gpu_dir) -> None:
    _at(bench, 1)
    m = _replayer(bench, gpu_dir).measure(_vram_prompt(1000))
    assert isinstance(m.outcome, Ok) and not m.outcome.stopped_early
    # what NVML would show: the CUDA context plus the 1000 MiB the node holds
    assert m.peaks.nvml_vram_bytes == CONTEXT + 1000 * MIB
    assert m.outcome.peak_vram_bytes == CONTEXT + 1000 * MIB
    assert m.peaks.torch_reserved_bytes is None  # no torch in the stand-in: NVML only
    assert m.peaks.hwm_bytes is not None and m.peaks.hwm_bytes >= m.peaks.tree_rss_bytes > 0
    assert m.torch is not None and m.torch["imported"] is False
    assert {"prepare_s", "ready_s", "prompt_s", "teardown_s"} <= set(m.timings)
    assert m.stopped_by_harness and m.exit_code is not None
    _assert_no_server_left(bench)


def test_the_bad_commit_uses_more_memory(bench, gpu_dir) -> None:
    _at(bench, 5)
    m = _replayer(bench, gpu_dir).measure(_vram_prompt(1000))
    assert isinstance(m.outcome, Ok)
    assert m.peaks.nvml_vram_bytes == CONTEXT + 1600 * MIB


def test_ram_peak_comes_from_the_high_water_mark_with_cpu(bench) -> None:
    _at(bench, 1)
    prompt = {
        "1": {"class_type": "AllocateRAM", "inputs": {"mib": 150}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    m = _replayer(bench, None, user_flags=("--cpu",)).measure(prompt)
    assert isinstance(m.outcome, Ok)
    assert m.peaks.nvml_vram_bytes is None and m.outcome.peak_vram_bytes is None
    assert m.peaks.hwm_bytes is not None and m.peaks.hwm_bytes > 150 * MIB
    assert m.outcome.peak_ram_bytes == m.peaks.ram_bytes


def test_a_cuda_oom_is_an_oom_with_its_evidence(bench, gpu_dir) -> None:
    _at(bench, 1)
    m = _replayer(bench, gpu_dir).measure(_vram_prompt(5000))
    assert isinstance(m.outcome, Oom)
    assert m.outcome.pool == "gpu" and "CUDA out of memory" in m.outcome.evidence
    assert m.oom_event is not None and m.oom_event["exception_type"] == "torch.OutOfMemoryError"
    _assert_no_server_left(bench)


def test_a_run_stops_once_its_peak_crosses_the_threshold(bench, gpu_dir) -> None:
    _at(bench, 1)
    prompt = _vram_prompt(1000, hold_s=60.0)  # would hold for a minute
    m = _replayer(bench, gpu_dir).measure(prompt, Threshold(vram_bytes=CONTEXT + 500 * MIB))
    assert m.stopped_early and isinstance(m.outcome, Ok) and m.outcome.stopped_early
    assert m.outcome.peak_vram_bytes == CONTEXT + 1000 * MIB
    assert m.stopped_by_harness
    _assert_no_server_left(bench)


@pytest.mark.parametrize(
    ("index", "prompt", "reason"),
    [
        (3, _vram_prompt(10), "won't start: exited with status 1"),
        (1, {"1": {"class_type": "NoSuchNode", "inputs": {}}}, "unknown node"),
        (
            1,
            {
                "1": {
                    "class_type": "CheckpointLoaderSimple",
                    "inputs": {"ckpt_name": "x.safetensors"},
                },
                "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
            },
            "missing model or input file",
        ),
        (
            1,
            {
                "1": {
                    "class_type": "Fail",
                    "inputs": {"message": "nope", "exception": "ValueError"},
                },
                "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
            },
            "unrelated exception in Fail (node 1): ValueError: nope",
        ),
    ],
    ids=["wont-start", "unknown-node", "missing-model", "unrelated-exception"],
)
def test_untestable_states_are_skips_that_say_why(bench, gpu_dir, index, prompt, reason) -> None:
    _at(bench, index)
    m = _replayer(bench, gpu_dir).measure(prompt)
    assert isinstance(m.outcome, Skip)
    assert reason in m.outcome.reason
    if index == 3:
        assert any("SyntaxError" in line for line in m.console_tail)
    _assert_no_server_left(bench)


def test_a_prompt_past_the_hard_timeout_is_a_timeout(bench, gpu_dir) -> None:
    _at(bench, 1)
    prompt = {"1": {"class_type": "Sleep", "inputs": {"seconds": 60}}}
    prompt["2"] = {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    m = _replayer(bench, gpu_dir, timeout_s=1.0).measure(prompt)
    assert isinstance(m.outcome, Timeout)
    _assert_no_server_left(bench)


def test_a_sigkill_from_outside_reads_as_the_os_oom_killer(bench, gpu_dir) -> None:
    _at(bench, 1)
    rep = _replayer(bench, gpu_dir)
    prompt = _vram_prompt(800, hold_s=30.0)
    import threading

    def killer() -> None:  # what the kernel's OOM killer does while the node holds memory
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for usage in FakeGpuDir(gpu_dir).processes():
                if usage.used_bytes >= CONTEXT + 800 * MIB:
                    os.kill(usage.pid, signal.SIGKILL)
                    return
            time.sleep(0.05)

    t = threading.Thread(target=killer)
    t.start()
    m = rep.measure(prompt)
    t.join()
    assert isinstance(m.outcome, Oom) and m.outcome.pool == "killed-by-os"
    # the peaks measured before the kill are kept (how much of the allocation the 100 ms
    # sampler saw before the kill depends on timing, so only "something" is asserted)
    assert m.outcome.peak_vram_bytes is not None and m.outcome.peak_vram_bytes >= CONTEXT
    assert m.exit_code == -9 and not m.stopped_by_harness


def test_ctrl_c_during_a_measurement_kills_the_server(bench, gpu_dir, tmp_path) -> None:
    """The measuring process gets SIGINT while ComfyUI holds memory: nothing may survive."""
    _at(bench, 1)
    script = tmp_path / "measure.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from pathlib import Path
            from oom_sentinel.bisect.measure.replay import Replayer, ReplaySettings
            from oom_sentinel.bisect.measure.workspace import Workspace
            from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
            from oom_sentinel.daemon.probes.host import PsutilHostProbe
            ws = Workspace.open(Path({str(bench["ws"].root)!r}))
            rep = Replayer(ws, ReplaySettings(python=sys.executable,
                           env={{"OOM_SENTINEL_FAKE_GPU": {str(gpu_dir)!r}}}),
                           gpu=FakeGpuProbe({str(gpu_dir)!r}), host=PsutilHostProbe())
            try:
                rep.measure({_vram_prompt(700, hold_s=60.0)!r})
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(130)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server is None:
        for usage in FakeGpuDir(gpu_dir).processes():
            if usage.used_bytes >= CONTEXT + 700 * MIB:
                server = usage.pid
        time.sleep(0.05)
    assert server is not None, "the replay never reached the allocation"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in out
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    _assert_no_server_left(bench)


# ---------------------------------------------------------------------------- the bootstrap and torch

FAKE_TORCH = '''
"""A fake of torch's CUDA surface for the bootstrap tests (no GPU can exist here)."""
import sys
__version__ = "2.9.1+fake"
from . import cuda, _C  # noqa
'''
FAKE_CUDA = """
import pickle
TOTAL = 8 * 1024 ** 3
_queued = []
_initialized = False
fraction = {}
reserved = 0
peak_reserved = 0
peak_allocated = 0
observers = []
history = {"enabled": False}
class OutOfMemoryError(RuntimeError):
    pass
class _Props:
    name = "Fake RTX 4090"
    total_memory = TOTAL
def _lazy_call(fn, **kw):
    if _initialized:
        fn()
    else:
        _queued.append(fn)
def init():
    global _initialized
    _initialized = True
    for fn in _queued:
        fn()
def is_initialized():
    return _initialized
def device_count():
    return 1
def get_device_properties(i):
    return _Props()
def get_allocator_backend():
    return "native"
def set_per_process_memory_fraction(f, device=None):
    fraction[device] = f
def alloc(n):
    global reserved, peak_reserved, peak_allocated
    cap = fraction.get(0, 1.0) * TOTAL
    if reserved + n > cap:
        for cb in observers:
            cb(0, n, reserved, int(cap - reserved))
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate %d bytes" % n)
    reserved += n
    peak_reserved = max(peak_reserved, reserved)
    peak_allocated = max(peak_allocated, reserved)
def max_memory_allocated(i):
    return peak_allocated
def max_memory_reserved(i):
    return peak_reserved
def memory_reserved(i):
    return reserved
from . import memory  # noqa
"""
FAKE_MEMORY = """
import pickle
from . import history
def _record_memory_history(max_entries=0):
    history["enabled"] = True
    history["max_entries"] = max_entries
def _dump_snapshot(path):
    with open(path, "wb") as fh:
        pickle.dump({"segments": [], "device_traces": [["alloc"]]}, fh)
"""
FAKE_C = """
from . import cuda
def _cuda_attach_out_of_memory_observer(cb):
    cuda.observers.append(cb)
"""
MAIN = """
import json, os, sys
seen = {"torch_before_main": "torch" in sys.modules, "path0": sys.path[0],
        "argv": sys.argv[1:], "file": __file__}
import helper_next_to_main  # found because main.py's folder is sys.path[0]
import importlib.util
assert importlib.util.find_spec("torch") is not None  # an availability check comes first
import torch
torch.cuda.init()
torch.cuda.alloc(3 * 1024 ** 3)
seen["history"] = dict(torch.cuda.history)
try:
    torch.cuda.alloc(2 * 1024 ** 3)  # past the 4 GiB budget
except torch.cuda.OutOfMemoryError as exc:
    seen["oom"] = str(exc)
json.dump(seen, open(os.environ["SEEN"], "w"))
"""


def _fake_torch(root: Path) -> Path:
    return write_fake_torch(
        root, cuda=FAKE_CUDA, memory=FAKE_MEMORY, torch_init=FAKE_TORCH, c_module=FAKE_C
    )


def test_bootstrap_caps_vram_records_peaks_and_keeps_the_history_on_oom(tmp_path) -> None:
    site = _fake_torch(tmp_path)
    app = tmp_path / "ComfyUI"
    app.mkdir()
    (app / "main.py").write_text(MAIN)
    (app / "helper_next_to_main.py").write_text("")
    harness = tmp_path / "harness"
    harness.mkdir()
    boot = harness / "oom_bisect_bootstrap.py"
    boot.write_text(BOOTSTRAP.read_text())
    (harness / "helper_next_to_main.py").write_text(
        "raise SystemExit('the wrong folder is on sys.path')"
    )
    result = harness / "report.json"
    seen = tmp_path / "seen.json"
    env = dict(os.environ, PYTHONPATH=str(site), SEEN=str(seen))
    proc = subprocess.run(
        [
            sys.executable,
            str(boot),
            "--result",
            str(result),
            "--vram-budget-bytes",
            str(4 * GIB),
            "--",
            str(app / "main.py"),
            "--lowvram",
            "--port",
            "1",
        ],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(seen.read_text())
    assert s["torch_before_main"] is False  # ComfyUI imports torch itself, after its env set-up
    assert s["path0"] == str(app) and s["argv"] == ["--lowvram", "--port", "1"]
    assert s["file"] == str(app / "main.py")
    assert s["history"]["enabled"] is True
    assert "Tried to allocate" in s["oom"]
    r = json.loads(result.read_text())
    t = r["torch"]
    assert r["phase"] == "exited" and r["exit_code"] == 0
    assert t["imported"] and t["cuda"] and t["version"] == "2.9.1+fake" and t["history"]
    assert t["fractions"] == {"0": 0.5} and t["budget_bytes"] == 4 * GIB
    assert t["devices"][0]["max_reserved_bytes"] == 3 * GIB
    assert t["devices"][0]["total_bytes"] == 8 * GIB
    assert r["oom"]["requested_bytes"] == 2 * GIB and r["oom"]["device"] == 0
    assert Path(r["oom"]["history_file"]).is_file()
    assert t["errors"] == []


def test_bootstrap_without_torch_still_runs_comfyui_and_reports_no_torch(tmp_path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "main.py").write_text("import sys\nsys.exit(7)\n")
    result = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(BOOTSTRAP), "--result", str(result), "--", str(app / "main.py")],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 7
    r = json.loads(result.read_text())
    assert r["exit_code"] == 7 and r["torch"]["imported"] is False and r["oom"] is None


def test_bootstrap_usage_errors_exit_2(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BOOTSTRAP), "--bogus"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_replay_passes_the_vram_budget_to_the_bootstrap(bench, gpu_dir) -> None:
    _at(bench, 1)
    rep = _replayer(bench, gpu_dir, vram_budget_bytes=2 * GIB)
    m = rep.measure(_vram_prompt(100, hold_s=0.1))
    assert isinstance(m.outcome, Ok)
    i = m.argv.index("--vram-budget-bytes")
    assert m.argv[i + 1] == str(2 * GIB)
    # torch's per-process fraction needs the native allocator (ComfyUI defaults to
    # cudaMallocAsync); this stand-in commit knows the flag, so it is passed
    assert "--disable-cuda-malloc" in m.argv
    assert m.torch is not None and m.torch["budget_bytes"] == 2 * GIB


def _spawn_group(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.3)  # let it install its handlers
    return proc


def test_stop_says_whether_its_own_sigkill_ended_the_server() -> None:
    """Only an escalation to SIGKILL makes a -9 exit the harness's own doing."""
    from oom_sentinel.bisect.measure.replay import _stop

    polite = _spawn_group("import time; time.sleep(60)")
    assert _stop(polite, grace_s=5) is False
    assert polite.returncode == -signal.SIGTERM

    stubborn = _spawn_group(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    )
    assert _stop(stubborn, grace_s=0.3) is True
    assert stubborn.returncode == -signal.SIGKILL

    # killed from outside and not reaped yet: our SIGTERM lands on a dying process
    victim = _spawn_group("import time; time.sleep(60)")
    os.kill(victim.pid, signal.SIGKILL)
    assert _stop(victim, grace_s=5) is False
    assert victim.returncode == -signal.SIGKILL
