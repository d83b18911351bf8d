"""`oom-sentinel doctor` end to end, as a user runs it: real ComfyUI processes (stand-in
installs whose ``main.py`` waits) started with ``--lowvram --cuda-device 1``, a second instance
on the same GPU, a real process holding 20 GiB of the scripted fake GPU, a real interpreter with
the CPU build of torch as ComfyUI's own, and snapshots the writer made.

Other test runs on the same machine may have their own stand-in ComfyUIs running, so these tests
assert what must be there, never that nothing else is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from fake_comfy_install import make_install, start_comfy, stop

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.daemon.incidents.snapshot import InstanceInfo, snapshots_dir, write_snapshot
from oom_sentinel.daemon.probes.fake_gpu import (
    ENV_FAKE_GPU,
    FakeDevice,
    FakeGpuDir,
    FakeProcessUsage,
)

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX processes and paths")

GIB = 1024**3
CPU_ONLY_TITLE = "CUDA not available in ComfyUI's interpreter: this torch is a CPU-only build"


def doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COLUMNS", "OOM_SENTINEL_CONFIG", ENV_FAKE_GPU, "CUDA_VISIBLE_DEVICES")
    }
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", "doctor", *args],
        capture_output=True,
        text=True,
        check=False,
        env=full,
        timeout=300,
    )


@dataclass
class Scene:
    root: Path
    target: Path
    second: Path
    data: Path
    gpu_dir: Path
    target_proc: subprocess.Popen[str]
    second_proc: subprocess.Popen[str]
    hog: subprocess.Popen[bytes]
    python: Path
    mine: str
    theirs: str

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.root), ENV_FAKE_GPU: str(self.gpu_dir)}


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, torch_python: Path) -> Iterator[Scene]:
    root = tmp_path_factory.mktemp("doctor")
    target = make_install(root / "doctor-target-a")
    second = make_install(root / "ComfyUI-B")
    gpu_dir = root / "gpu"
    fake = FakeGpuDir(gpu_dir).create(
        [FakeDevice(0, "Fake RTX 3070", 8 * GIB), FakeDevice(1, "Fake RTX 4090", 24 * GIB)]
    )
    hog = subprocess.Popen(["sleep", "300"])
    target_proc = start_comfy(
        target / "main.py",
        ["--lowvram", "--cuda-device", "1", "--port", str(free_port())],
        cwd=target,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        python=str(torch_python),
    )
    second_proc = start_comfy(
        second / "main.py", ["--cuda-device", "1", "--port", str(free_port())], cwd=second
    )
    try:
        for pid, name, used in (
            (hog.pid, "sleep", 20 * GIB),
            (target_proc.pid, "python", 1 * GIB),
            (second_proc.pid, "python", 2 * GIB),
        ):
            fake.report(FakeProcessUsage(pid, name, 1, used, used))
        data = root / "data"
        now = time.time()
        mine = write_snapshot(
            snapshots_dir(data),
            replace(
                samples.content(at=now - 3600, instance="doctor-target-a"),
                instance=InstanceInfo("doctor-target-a", str(target), "http://127.0.0.1:8188"),
            ),
        ).id
        theirs = write_snapshot(
            snapshots_dir(data),
            replace(
                samples.content(at=now - 60, instance="ComfyUI-B"),
                instance=InstanceInfo("ComfyUI-B", str(second), "http://127.0.0.1:8189"),
            ),
        ).id
        yield Scene(
            root,
            target,
            second,
            data,
            gpu_dir,
            target_proc,
            second_proc,
            hog,
            torch_python,
            mine,
            theirs,
        )
    finally:
        stop(target_proc)
        stop(second_proc)
        hog.kill()
        hog.wait()


@pytest.fixture(scope="module")
def report(scene: Scene) -> dict[str, Any]:
    proc = doctor(
        "--comfyui", str(scene.target), "--json", "--data-dir", str(scene.data), env=scene.env
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    doc["_stderr"] = proc.stderr
    return doc


def finding(report: dict[str, Any], key: str) -> dict[str, str]:
    return next(f for f in report["findings"] if f["key"] == key)


@pytest.mark.slow
def test_json_report_names_the_instance_and_its_interpreter(
    scene: Scene, report: dict[str, Any]
) -> None:
    assert report["schema"] == 1
    assert report["instance"]["pid"] == scene.target_proc.pid
    assert report["instance"]["path"] == str(scene.target)
    assert report["instance"]["python"] == str(scene.python)
    assert (report["verdict"], report["exit_status"]) == ("problem", 1)
    assert [f["key"] for f in report["findings"]] == [
        "other-gpu-processes",
        "second-instance",
        "cuda",
        "gpu",
        "ram",
        "swap",
        "launch-flags",
        "incidents",
    ]


@pytest.mark.slow
def test_the_process_holding_20_gib_of_comfyuis_gpu_is_named(
    scene: Scene, report: dict[str, Any]
) -> None:
    other = finding(report, "other-gpu-processes")
    assert other["verdict"] == "problem"
    assert "GPU 1 (Fake RTX 4090, 24.00 GiB), the one ComfyUI uses" in other["title"]
    assert f"sleep (pid {scene.hog.pid}): 20.00 GiB on GPU 1" in other["detail"]
    assert "--cuda-device 0" in other["action"]  # GPU 0 has all its 8 GiB free
    assert f"pid {scene.second_proc.pid}" not in other["detail"]  # that one is the next finding


@pytest.mark.slow
def test_the_second_instance_on_the_same_gpu_is_a_problem(
    scene: Scene, report: dict[str, Any]
) -> None:
    second = finding(report, "second-instance")
    assert second["verdict"] == "problem"
    assert f"pid {scene.second_proc.pid}" in second["title"]
    assert f"pid {scene.second_proc.pid} ({scene.second}, port" in second["detail"]
    assert "on GPU 1, holds 2.00 GiB" in second["detail"]


@pytest.mark.slow
def test_cpu_only_torch_in_comfyuis_interpreter_is_the_problem_with_its_fix(
    scene: Scene, report: dict[str, Any]
) -> None:
    cuda = finding(report, "cuda")
    assert cuda["verdict"] == "problem"
    assert cuda["title"] == CPU_ONLY_TITLE
    assert "+cpu" in cuda["detail"] and "Torch not compiled with CUDA enabled" in cuda["detail"]
    action = cuda["action"]
    assert (
        f"{scene.python} -m pip install --upgrade torch torchvision torchaudio --index-url https://download.pytorch.org/whl/"
        in action
    )
    assert "torch.cuda.is_available()" in action and "nvidia-smi" in action
    assert "reinstall" not in action
    torch = report["facts"]["torch"]
    assert torch["cpu_only_build"] is True and torch["cuda_available"] is False
    # the probe ran with the device selection ComfyUI's --cuda-device 1 gives it
    assert torch["cuda_visible_devices"] == "1"


@pytest.mark.slow
def test_comfyuis_gpu_and_what_is_left_of_it(report: dict[str, Any]) -> None:
    gpu = finding(report, "gpu")
    assert gpu["verdict"] == "problem"
    assert (
        "chosen by --cuda-device 1: 1.00 GiB free; ComfyUI holds 1.00 GiB; other processes 22.00 GiB"
        in gpu["detail"]
    )
    assert report["facts"]["comfy_device"]["index"] == 1


@pytest.mark.slow
def test_launch_flags_and_allocator_setting_are_read_from_the_process(
    report: dict[str, Any],
) -> None:
    flags = finding(report, "launch-flags")
    assert flags["verdict"] == "ok"
    assert "--lowvram --cuda-device 1" in flags["detail"]
    assert "--lowvram: ComfyUI offloads" in flags["detail"]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in flags["detail"]


@pytest.mark.slow
def test_only_this_instances_incidents_are_listed(scene: Scene, report: dict[str, Any]) -> None:
    incidents = finding(report, "incidents")
    assert incidents["verdict"] == "warning"
    assert scene.mine in incidents["detail"] and scene.theirs not in incidents["detail"]
    assert f"oom-sentinel snapshots show {scene.mine}" in incidents["action"]
    assert [i["id"] for i in report["facts"]["incidents"]] == [scene.mine]


@pytest.mark.slow
def test_human_report_by_instance_name(scene: Scene) -> None:
    proc = doctor("doctor-target-a", "--data-dir", str(scene.data), env=scene.env)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert out.startswith(f"ComfyUI 'doctor-target-a': {scene.target}, pid {scene.target_proc.pid}")
    assert f"Interpreter: {scene.python} (the running ComfyUI's interpreter)" in out
    assert f"PROBLEM   {CPU_ONLY_TITLE}" in out
    assert "→ Install the CUDA build of torch" in out
    assert f"PROBLEM   A second ComfyUI instance (pid {scene.second_proc.pid}) is running" in out
    # the findings keep the seed guide's order
    order = [
        out.index(k)
        for k in (
            "other process holds",
            "second ComfyUI",
            CPU_ONLY_TITLE,
            "Launch flags",
            "incident",
        )
    ]
    assert order == sorted(order)
    assert out.rstrip().splitlines()[-1].startswith("Verdict: PROBLEM (")
    assert out.rstrip().endswith("exit status 1.")
    assert "\x1b[" not in out  # no colour codes when piped


# -- ComfyUI's API, usage errors ---------------------------------------------------------------------

SERVING_MAIN = """\
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"system": {"comfyui_version": "0.8.0", "pytorch_version": "2.7.1+cu128",
                                      "argv": ["main.py"] + sys.argv[1:]},
                           "devices": [{"name": "cuda:0 Fake RTX 4090 : cudaMallocAsync",
                                        "type": "cuda", "index": 0, "vram_total": 24 * 2**30,
                                        "vram_free": 23 * 2**30}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
server = HTTPServer(("127.0.0.1", port), H)
print("ready", flush=True)
server.serve_forever()
"""


def test_comfyuis_own_view_comes_from_its_api(tmp_path: Path) -> None:
    install = make_install(tmp_path / "served")
    (install / "main.py").write_text(SERVING_MAIN)
    gpu_dir = tmp_path / "gpu"
    FakeGpuDir(gpu_dir).create([FakeDevice(0, "Fake RTX 4090", 24 * GIB)])
    port = free_port()
    comfy = start_comfy(
        install / "main.py",
        ["--port", str(port), "--highvram", "--database-url", "postgresql://me:hunter2@db/comfy"],
        cwd=install,
    )
    try:
        proc = doctor(
            "--comfyui",
            f"http://127.0.0.1:{port}",
            "--json",
            "--no-torch",
            "--data-dir",
            str(tmp_path / "d"),
            env={"HOME": str(tmp_path), ENV_FAKE_GPU: str(gpu_dir)},
        )
    finally:
        stop(comfy)
    doc = json.loads(proc.stdout)
    assert doc["instance"]["pid"] == comfy.pid
    stats = doc["facts"]["system_stats"]
    assert stats["device_name"] == "cuda:0 Fake RTX 4090 : cudaMallocAsync"
    assert stats["argv"][:4] == ["main.py", "--port", str(port), "--highvram"]
    assert "hunter2" not in proc.stdout  # credentials in argv never leave redacted
    assert (
        "ComfyUI's /system_stats: cuda:0 Fake RTX 4090 : cudaMallocAsync, 23.00 GiB free"
        in finding(doc, "gpu")["detail"]
    )
    assert finding(doc, "launch-flags")["detail"].count("fine on a 24.00 GiB card") == 1
    assert finding(doc, "cuda")["verdict"] == "unknown"
    assert doc["facts"]["unknown"]["torch"] == "skipped (--no-torch)"
    assert proc.returncode == doc["exit_status"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("no-such-instance",),
            "oom-sentinel: error: no ComfyUI instance named 'no-such-instance'",
        ),
        (
            ("--python", "/no/such/python"),
            "oom-sentinel: error: --python /no/such/python: no such file",
        ),
        (
            ("--comfyui", "/no/such/dir"),
            "oom-sentinel: error: --comfyui /no/such/dir: not a directory or an http URL",
        ),
    ],
    ids=["unknown-instance", "missing-python", "missing-dir"],
)
def test_usage_errors_are_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    proc = doctor(*args, env={"HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.startswith(message)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


# -- a real NVIDIA GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_cuda_interpreter_sees_the_gpu_nvml_reports(tmp_path: Path) -> None:
    """Needs an NVIDIA GPU and ``$OOM_SENTINEL_CUDA_PYTHON``: an interpreter with a CUDA build
    of torch (ComfyUI's venv will do)."""
    python = os.environ.get("OOM_SENTINEL_CUDA_PYTHON")
    if not python:
        pytest.skip("set OOM_SENTINEL_CUDA_PYTHON to an interpreter with a CUDA build of torch")
    proc = doctor(
        "--python", python, "--json", "--data-dir", str(tmp_path), env={"HOME": str(tmp_path)}
    )
    doc = json.loads(proc.stdout)
    cuda = finding(doc, "cuda")
    assert cuda["verdict"] == "ok", cuda
    torch = doc["facts"]["torch"]
    assert torch["cuda_available"] is True and torch["device_count"] >= 1
    assert torch["mem_total_bytes"] > 0 and 0 < torch["mem_free_bytes"] <= torch["mem_total_bytes"]
    assert torch["memory_summary_header"] and torch["allocated_bytes"] == 0
    assert doc["facts"]["gpu"]["backend"] == "nvml"
    # torch's cuda:0 is matched to an NVML device by UUID
    assert doc["facts"]["comfy_device"]["index"] is not None
    assert "torch's cuda:0 is this GPU" in doc["facts"]["comfy_device"]["how"]
    assert finding(doc, "gpu")["verdict"] in ("ok", "warning", "problem")
