"""`oom-sentinel doctor`'s checks as tables: facts in, one finding (verdict, what to do) out.

Every row builds the facts a real machine would give (ComfyUI processes parsed from real argv,
GPU samples as the probes return them, the torch probe's record) and states the verdict and the
words a user must see."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from oom_sentinel.daemon.comfy.discovery import DiscoveredInstance
from oom_sentinel.daemon.comfy.processes import ComfyProcess, comfy_process_from, parse_launch_flags
from oom_sentinel.daemon.doctor import checks as doctor
from oom_sentinel.daemon.doctor.checks import (
    DoctorFacts,
    Finding,
    GpuState,
    IncidentFacts,
    SystemStats,
    TorchDevice,
    TorchProbe,
    check_cuda,
    check_gpu,
    check_incidents,
    check_launch_flags,
    check_other_gpu_processes,
    check_ram,
    check_second_instance,
    check_swap,
    comfy_device,
    comfy_visible_devices,
    diagnose,
    exit_status,
    overall_verdict,
    report_json,
    torch_wheel_index,
)
from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProcessSample, HostSample

GIB = 1024**3
MIB = 1024**2
NOW = 1_767_348_672.0
PY = "/opt/ComfyUI/venv/bin/python"


# -- builders ------------------------------------------------------------------------------------


def proc(
    pid: int,
    *args: str,
    install: str = "/opt/ComfyUI",
    env: Mapping[str, str] | None = None,
    readable: bool = True,
) -> ComfyProcess:
    made = comfy_process_from(
        pid,
        [PY, f"{install}/main.py", *args],
        cwd=install,
        environ=(dict(env or {}) if readable else None),
        exists=lambda _path: True,
    )
    assert made is not None
    return made


def dev(index: int, total_gib: float, used_gib: float = 0.0, name: str = "") -> GpuDeviceSample:
    total, used = int(total_gib * GIB), int(used_gib * GIB)
    return GpuDeviceSample(
        index=index,
        name=name or f"NVIDIA Test {index}",
        total_bytes=total,
        used_bytes=used,
        free_bytes=total - used,
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
    )


def gp(pid: int, device: int, gib: float | None, name: str = "python") -> GpuProcessSample:
    used = int(gib * GIB) if gib is not None else None
    return GpuProcessSample(pid=pid, device_index=device, used_bytes=used, name=name)


def gpu(
    *devices: GpuDeviceSample,
    procs: Sequence[GpuProcessSample] = (),
    driver: str | None = "550.54.14",
) -> GpuState:
    return GpuState("nvml", f"{len(devices)} device(s)", tuple(devices), tuple(procs), driver)


def target(path: str = "/opt/ComfyUI", name: str = "ComfyUI") -> DiscoveredInstance:
    return DiscoveredInstance(
        name=name,
        path=path,
        url="http://127.0.0.1:8188",
        log_paths=(),
        pid=None,
        python=PY,
        flags=None,
    )


def running(p: ComfyProcess, *others: ComfyProcess, **kw: Any) -> DoctorFacts:
    """Facts for a diagnosed ComfyUI ``p`` with ``others`` also running."""
    base: dict[str, Any] = {
        "now_s": NOW,
        "platform": "linux",
        "target": target(p.install_dir),
        "process": p,
        "comfy_processes": (p, *others),
        "own_pids": frozenset({p.pid}),
        "python": PY,
        "python_source": "process",
    }
    base.update(kw)
    return DoctorFacts(**base)


def stopped(**kw: Any) -> DoctorFacts:
    base: dict[str, Any] = {
        "now_s": NOW,
        "platform": "linux",
        "target": target(),
        "comfy_processes": (),
        "python": PY,
        "python_source": "install",
    }
    base.update(kw)
    return DoctorFacts(**base)


CPU_TORCH = TorchProbe(
    executable=PY,
    python_version="3.11.9",
    torch_version="2.13.0+cpu",
    cuda_version=None,
    cuda_built=False,
    cuda_available=False,
    device_count=0,
    mps_built=False,
    mps_available=False,
    xpu_available=False,
)
CUDA_TORCH = TorchProbe(
    executable=PY,
    torch_version="2.7.1+cu128",
    cuda_version="12.8",
    cuda_built=True,
    cuda_available=True,
    device_count=2,
    current_device=0,
    devices=(
        TorchDevice(0, "NVIDIA Test 0", 24 * GIB, "00000000-aaaa-bbbb-cccc-dddddddddddd", "8.9"),
        TorchDevice(1, "NVIDIA Test 1", 12 * GIB, "00000001-aaaa-bbbb-cccc-dddddddddddd", "8.6"),
    ),
    mem_free_bytes=20 * GIB,
    mem_total_bytes=24 * GIB,
    allocated_bytes=0,
    reserved_bytes=0,
    summary_header=("|  PyTorch CUDA memory summary, device ID 0  |",),
)
CUDA_UNAVAILABLE = replace(
    CUDA_TORCH,
    cuda_available=False,
    device_count=0,
    devices=(),
    mem_free_bytes=None,
    mem_total_bytes=None,
    allocated_bytes=None,
    reserved_bytes=None,
    summary_header=(),
)


@dataclass(frozen=True)
class Row:
    facts: DoctorFacts
    verdict: str
    title: tuple[str, ...] = ()  # substrings of the title
    says: tuple[str, ...] = ()  # substrings of detail + action
    never: tuple[str, ...] = ()  # substrings that must not appear anywhere


def check_row(check: Callable[[DoctorFacts], Finding], row: Row) -> Finding:
    finding = check(row.facts)
    text = f"{finding.title}\n{finding.detail}\n{finding.action}"
    assert finding.verdict == row.verdict, text
    for part in row.title:
        assert part in finding.title, finding.title
    for part in row.says:
        assert part in f"{finding.detail}\n{finding.action}", text
    for part in row.never:
        assert part not in text, text
    if finding.verdict in ("problem", "warning"):
        assert finding.action or finding.key == "second-instance", "a bad verdict says what to do"
    return finding


A = proc(100, "--port", "8188")
A1 = proc(100, "--cuda-device", "1")
TWO_GPUS = (dev(0, 24, 4), dev(1, 24, 1))


# -- other GPU processes ------------------------------------------------------------------------

OTHER_GPU_ROWS = {
    "no GPU probe data is unknown, not ok": Row(
        running(A, gpu=GpuState("none", "NVML library not found")),
        "unknown",
        says=("NVML library not found", "nvidia-smi"),
    ),
    "gpu source timed out": Row(
        running(A, gpu=None, unknown={"gpu": "no answer within 10 s"}),
        "unknown",
        says=("no answer within 10 s",),
    ),
    "only ComfyUI itself on its GPU": Row(
        running(A, gpu=gpu(dev(0, 24, 6), procs=[gp(100, 0, 6)])),
        "ok",
        title=("No other process uses GPU 0",),
    ),
    "blender holding 3 GiB of a 24 GiB card is a problem": Row(
        running(A, gpu=gpu(dev(0, 24, 9), procs=[gp(100, 0, 6), gp(999, 0, 3, "blender")])),
        "problem",
        title=("1 other process holds 3.00 GiB on GPU 0",),
        says=("blender (pid 999): 3.00 GiB on GPU 0", "Close", "blender (pid 999)"),
    ),
    "a desktop compositor's share is fine": Row(
        running(A, gpu=gpu(dev(0, 24, 0.3), procs=[gp(2000, 0, 0.25, "Xorg")])),
        "ok",
        says=("Xorg (pid 2000)",),
    ),
    "700 MiB of others is worth a warning": Row(
        running(A, gpu=gpu(dev(0, 24, 0.7), procs=[gp(3000, 0, 0.7, "chrome")])),
        "warning",
        says=("chrome (pid 3000)",),
    ),
    "per-process memory unknown under WDDM is a warning": Row(
        running(A, gpu=gpu(dev(0, 24, 8), procs=[gp(3000, 0, None, "obs64.exe")])),
        "warning",
        title=("an unknown amount",),
        says=("Task Manager",),
    ),
    "others on a GPU ComfyUI does not use do not count": Row(
        running(A1, gpu=gpu(*TWO_GPUS, procs=[gp(999, 0, 20, "trainer")])),
        "ok",
        title=("No other process uses GPU 1",),
        says=("trainer (pid 999): 20.00 GiB on GPU 0 (not ComfyUI's GPU)",),
    ),
    "a roomier GPU is suggested": Row(
        running(A, gpu=gpu(dev(0, 24, 22), dev(1, 24, 0), procs=[gp(999, 0, 20, "trainer")])),
        "problem",
        says=("--cuda-device 1", "GPU 1 (24.00 GiB free)"),
    ),
    "a second ComfyUI is left to the instance check": Row(
        running(A, proc(200, "--port", "8189"), gpu=gpu(dev(0, 24, 10), procs=[gp(200, 0, 10)])),
        "ok",
        never=("pid 200",),
    ),
}


@pytest.mark.parametrize("row", OTHER_GPU_ROWS.values(), ids=OTHER_GPU_ROWS.keys())
def test_other_gpu_processes(row: Row) -> None:
    assert check_row(check_other_gpu_processes, row).key == "other-gpu-processes"


# -- second instance -------------------------------------------------------------------------------

B_DEFAULT = proc(200, "--port", "8189", install="/srv/ComfyUI-B")
B_DEV1 = proc(200, "--port", "8189", "--cuda-device", "1", install="/srv/ComfyUI-B")
B_DEV0 = proc(200, "--port", "8189", "--cuda-device", "0", install="/srv/ComfyUI-B")
B_SAME_INSTALL = proc(200, "--port", "8189")
B_SAME_PORT = proc(200, install="/srv/ComfyUI-B")

SECOND_ROWS = {
    "process table unreadable": Row(
        running(A, comfy_processes=None, unknown={"processes": "psutil: access denied"}),
        "unknown",
        says=("Psutil: access denied",),
    ),
    "alone": Row(running(A), "ok", title=("No second ComfyUI instance",)),
    "another instance on another GPU is fine": Row(
        running(A, B_DEV1, gpu=gpu(*TWO_GPUS)),
        "ok",
        says=("pid 200 (/srv/ComfyUI-B, port 8189) on GPU 1",),
    ),
    "NVML shows both on one GPU": Row(
        running(A, B_DEFAULT, gpu=gpu(*TWO_GPUS, procs=[gp(100, 0, 4), gp(200, 0, 6)])),
        "problem",
        title=("second ComfyUI instance", "GPU 0", "pid 200"),
        says=("holds 6.00 GiB", "--cuda-device"),
    ),
    "same selection without GPU data": Row(
        running(A1, B_DEV1),
        "problem",
        says=("CUDA device 1",),
    ),
    "the default GPU and --cuda-device 0 are the same GPU": Row(
        running(A, B_DEV0),
        "problem",
    ),
    "CUDA_VISIBLE_DEVICES in the other's environment counts": Row(
        running(
            A1,
            proc(200, "--port", "8189", install="/srv/B", env={"CUDA_VISIBLE_DEVICES": "1"}),
            gpu=gpu(*TWO_GPUS),
        ),
        "problem",
    ),
    "same install": Row(
        running(A, B_SAME_INSTALL, gpu=gpu(*TWO_GPUS)),
        "problem",
        says=("share the code directory /opt/ComfyUI", "--base-directory", "temp"),
    ),
    "same port": Row(
        running(A1, B_SAME_PORT, gpu=gpu(dev(0, 24), dev(1, 24), dev(2, 24))),
        "problem",
        says=("claim port 8188", "--port"),
    ),
    "the diagnosed ComfyUI is stopped; another holds the GPU it would use": Row(
        stopped(comfy_processes=(B_DEFAULT,), gpu=gpu(dev(0, 24, 6), procs=[gp(200, 0, 6)])),
        "warning",
        says=("pid 200",),
    ),
    "a --cpu ComfyUI shares no GPU": Row(
        running(proc(100, "--cpu"), B_DEFAULT, gpu=gpu(dev(0, 24, 6), procs=[gp(200, 0, 6)])),
        "ok",
    ),
}


@pytest.mark.parametrize("row", SECOND_ROWS.values(), ids=SECOND_ROWS.keys())
def test_second_instance(row: Row) -> None:
    assert check_row(check_second_instance, row).key == "second-instance"


# -- CUDA in ComfyUI's interpreter ----------------------------------------------------------------

CPU_ONLY_TITLE = "CUDA not available in ComfyUI's interpreter: this torch is a CPU-only build"

CUDA_ROWS = {
    "no interpreter found": Row(
        stopped(python=None, torch=None, unknown={"torch": "no interpreter found for /opt/x"}),
        "unknown",
        says=("No interpreter found for /opt/x", "--python PATH"),
    ),
    "torch not installed there": Row(
        running(
            A,
            torch=replace(
                CPU_TORCH,
                torch_version=None,
                import_error="ModuleNotFoundError: No module named 'torch'",
            ),
        ),
        "problem",
        title=("torch cannot be imported",),
        says=("No module named 'torch'", "-m pip install -r requirements.txt", "--python"),
    ),
    "torch fails to load a DLL": Row(
        running(
            A,
            torch=replace(
                CPU_TORCH, torch_version=None, import_error="OSError: [WinError 126] fbgemm.dll"
            ),
        ),
        "problem",
        says=("fbgemm.dll", "pytorch.org/get-started/locally"),
    ),
    "a CPU-only build on an NVIDIA machine": Row(
        running(A, torch=CPU_TORCH, gpu=gpu(dev(0, 24))),
        "problem",
        title=(CPU_ONLY_TITLE,),
        says=(
            "torch 2.13.0+cpu",
            "Torch not compiled with CUDA enabled",
            "driver 550.54.14 supports CUDA up to 12.4",
            f"{PY} -m pip install --upgrade torch torchvision torchaudio --index-url "
            "https://download.pytorch.org/whl/cu124",
            f'{PY} -c "import torch; print(torch.__version__, torch.version.cuda, '
            'torch.cuda.is_available())"',
            "True",
        ),
        never=("reinstall", "start ComfyUI with --cpu"),
    ),
    "a CPU-only build, driver unknown: read nvidia-smi": Row(
        running(A, torch=CPU_TORCH, gpu=gpu(dev(0, 24), driver=None)),
        "problem",
        title=(CPU_ONLY_TITLE,),
        says=("'CUDA Version'", "whl/cuXXX"),
    ),
    "a CPU-only build on a machine without an NVIDIA GPU": Row(
        running(A, torch=CPU_TORCH, gpu=GpuState("none", "NVML library not found")),
        "problem",
        title=(CPU_ONLY_TITLE,),
        says=("No NVIDIA GPU was seen", "start ComfyUI with --cpu", "install the NVIDIA driver"),
    ),
    "the portable build's python gets -s": Row(
        running(
            A,
            torch=CPU_TORCH,
            gpu=gpu(dev(0, 8)),
            python="C:\\Users\\me\\ComfyUI_windows_portable\\python_embeded\\python.exe",
            platform="win32",
        ),
        "problem",
        says=("python_embeded\\python.exe -s -m pip install",),
    ),
    "a CPU-only build is fine for --cpu": Row(
        running(proc(100, "--cpu"), torch=CPU_TORCH), "ok", title=("--cpu",)
    ),
    "CUDA available": Row(
        running(A, torch=CUDA_TORCH),
        "ok",
        title=("CUDA is available",),
        says=("torch 2.7.1+cu128 (CUDA 12.8)", "cuda:0 NVIDIA Test 0", "cuda:1 NVIDIA Test 1"),
    ),
    "CUDA available but ComfyUI runs with --cpu": Row(
        running(proc(100, "--cpu"), torch=CUDA_TORCH), "warning", says=("Remove --cpu",)
    ),
    "driver too old for torch's CUDA": Row(
        running(
            A,
            torch=replace(
                CUDA_UNAVAILABLE,
                warnings=(
                    "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040).",
                ),
            ),
            gpu=gpu(dev(0, 24), driver="470.82.01"),
        ),
        "problem",
        title=("although its torch is a GPU build",),
        says=("too old", "525.60 or newer", "470.82.01"),
    ),
    "no driver at all for a CUDA build": Row(
        running(A, torch=CUDA_UNAVAILABLE, gpu=GpuState("none", "NVML library not found")),
        "problem",
        says=("install or repair the NVIDIA driver",),
    ),
    "CUDA build hidden by the device selection": Row(
        running(
            proc(100, "--cuda-device", "3"),
            torch=replace(CUDA_UNAVAILABLE, cuda_visible_devices="3"),
            gpu=gpu(*TWO_GPUS),
        ),
        "problem",
        says=("CUDA_VISIBLE_DEVICES='3'", "--cuda-device 3", "hides every GPU"),
    ),
    "Apple MPS": Row(
        running(
            A,
            torch=replace(
                CPU_TORCH,
                torch_version="2.7.1",
                cuda_built=False,
                mps_built=True,
                mps_available=True,
            ),
            platform="darwin",
        ),
        "ok",
        title=("MPS",),
    ),
    "ROCm": Row(
        running(A, torch=replace(CUDA_TORCH, cuda_version=None, hip_version="6.3.42131")),
        "ok",
        title=("ROCm is available",),
        says=("ROCm/HIP 6.3.42131",),
    ),
    "DirectML": Row(running(proc(100, "--directml"), torch=CPU_TORCH), "ok", title=("--directml",)),
}


@pytest.mark.parametrize("row", CUDA_ROWS.values(), ids=CUDA_ROWS.keys())
def test_cuda_in_comfyuis_interpreter(row: Row) -> None:
    assert check_row(check_cuda, row).key == "cuda"


@pytest.mark.parametrize(
    ("probe", "cpu_only"),
    [
        (CPU_TORCH, True),
        (replace(CPU_TORCH, cuda_built=None), True),  # "+cpu" alone says it
        (CUDA_TORCH, False),
        (replace(CUDA_TORCH, cuda_version=None, hip_version="6.3"), False),
        (replace(CPU_TORCH, torch_version=None), False),  # no torch: not a build at all
        (replace(CPU_TORCH, torch_version="2.7.1", cuda_built=None), False),  # cannot tell
    ],
    ids=["cpu-wheel", "plus-cpu-suffix", "cuda", "rocm", "no-torch", "unknown"],
)
def test_cpu_only_build_is_recognised(probe: TorchProbe, cpu_only: bool) -> None:
    assert probe.cpu_only_build is cpu_only


# -- ComfyUI's GPU and its free memory ------------------------------------------------------------

GPU_ROWS = {
    "--cpu uses no GPU": Row(running(proc(100, "--cpu")), "ok", title=("--cpu",)),
    "--cuda-device beyond the GPUs": Row(
        running(A1, gpu=gpu(dev(0, 24))),
        "problem",
        title=("--cuda-device 1", "matches no GPU"),
        says=("0: NVIDIA Test 0",),
    ),
    "others leave 1 GiB of GPU 1": Row(
        running(A1, gpu=gpu(dev(0, 8), dev(1, 24, 23), procs=[gp(999, 1, 20), gp(100, 1, 1)])),
        "problem",
        title=("Only 2.00 GiB of NVIDIA Test 1's 24.00 GiB",),
        says=(
            "GPU 1 (NVIDIA Test 1, 24.00 GiB), chosen by --cuda-device 1: 1.00 GiB free",
            "ComfyUI holds 1.00 GiB",
            "other processes 20.00 GiB",
            "--lowvram",
        ),
    ),
    "memory ComfyUI itself holds counts as its own": Row(
        running(A, gpu=gpu(dev(0, 24, 21), procs=[gp(100, 0, 20)])),
        "ok",
        title=("23.00 GiB of 24.00 GiB available to ComfyUI",),
    ),
    "a small card": Row(
        running(A, gpu=gpu(dev(0, 4, 0.2))), "warning", title=("small card",), says=("--lowvram",)
    ),
    "a small card already on --lowvram": Row(
        running(proc(100, "--lowvram"), gpu=gpu(dev(0, 4, 0.2))), "ok"
    ),
    "more than half taken by others": Row(
        running(A, gpu=gpu(dev(0, 24, 14), procs=[gp(999, 0, 14)])), "warning", title=("Half of",)
    ),
    "torch's numbers when NVML has none": Row(
        running(
            A, torch=replace(CUDA_TORCH, mem_free_bytes=1 * GIB), gpu=GpuState("none", "no NVML")
        ),
        "problem",
        says=("torch.cuda.mem_get_info()", "1.00 GiB free of 24.00 GiB"),
    ),
    "mixed cards: CUDA's order is named": Row(
        running(A1, gpu=gpu(*TWO_GPUS)),
        "ok",
        says=("fastest first", "CUDA_DEVICE_ORDER=PCI_BUS_ID"),
    ),
    "mixed cards matched by torch's UUID need no caveat": Row(
        running(A, gpu=gpu(*TWO_GPUS), torch=CUDA_TORCH),
        "ok",
        says=("torch's cuda:0 is this GPU",),
        never=("fastest first",),
    ),
    "no numbers at all": Row(
        running(A, gpu=GpuState("none", "NVML library not found")),
        "unknown",
        says=("NVML library not found",),
    ),
    "a fresh probe's memory summary is explained": Row(
        running(A, torch=CUDA_TORCH, gpu=gpu(dev(0, 24, 1))),
        "ok",
        says=("0 B allocated, 0 B reserved", "fresh process", "only see their own process"),
    ),
    "ComfyUI's /system_stats device is shown": Row(
        running(
            A,
            gpu=gpu(dev(0, 24, 1)),
            system_stats=SystemStats(
                "http://127.0.0.1:8188",
                device_name="cuda:0 NVIDIA Test 0 : cudaMallocAsync",
                vram_free_bytes=23 * GIB,
            ),
        ),
        "ok",
        says=("cuda:0 NVIDIA Test 0 : cudaMallocAsync, 23.00 GiB free",),
    ),
}


@pytest.mark.parametrize("row", GPU_ROWS.values(), ids=GPU_ROWS.keys())
def test_comfyuis_gpu(row: Row) -> None:
    assert check_row(check_gpu, row).key == "gpu"


@pytest.mark.parametrize(
    ("args", "inherited", "visible"),
    [
        ((), None, None),
        ((), "2,3", "2,3"),
        (("--cuda-device", "1"), "2,3", "1"),
        (("--cuda-device", "0,1"), None, "0,1"),
        (("--cuda-device", "all"), "3", "3"),
        (("--default-device", "2"), None, "2,0,1," + ",".join(str(i) for i in range(3, 32))),
        (("--default-device", "2", "--cuda-device", "1"), None, "1"),
    ],
    ids=[
        "unset",
        "inherited",
        "cuda-device-wins",
        "list",
        "all-keeps-env",
        "default-device",
        "both",
    ],
)
def test_visible_devices_follow_comfyuis_main(
    args: tuple[str, ...], inherited: str | None, visible: str | None
) -> None:
    assert comfy_visible_devices(parse_launch_flags(args), inherited) == visible


@pytest.mark.parametrize(
    ("facts", "index", "none_visible", "how"),
    [
        (running(A, gpu=gpu(*TWO_GPUS)), 0, False, "the default"),
        (running(A1, gpu=gpu(*TWO_GPUS)), 1, False, "--cuda-device 1"),
        (
            running(proc(100, env={"CUDA_VISIBLE_DEVICES": "1"}), gpu=gpu(*TWO_GPUS)),
            1,
            False,
            "CUDA_VISIBLE_DEVICES=1 in its environment",
        ),
        (
            running(
                proc(100, env={"CUDA_VISIBLE_DEVICES": "1"}, readable=False), gpu=gpu(*TWO_GPUS)
            ),
            0,
            False,
            "the default",
        ),
        (
            running(proc(100, env={"CUDA_VISIBLE_DEVICES": "GPU-00000001"}), gpu=gpu(*TWO_GPUS)),
            1,
            False,
            "CUDA_VISIBLE_DEVICES",
        ),
        (
            running(proc(100, env={"CUDA_VISIBLE_DEVICES": ""}), gpu=gpu(*TWO_GPUS)),
            None,
            True,
            "CUDA_VISIBLE_DEVICES",
        ),
        (
            running(proc(100, "--cuda-device", "5"), gpu=gpu(*TWO_GPUS)),
            None,
            True,
            "--cuda-device 5",
        ),
        (
            stopped(gpu=gpu(*TWO_GPUS), doctor_cuda_visible_devices="1"),
            1,
            False,
            "this shell's environment",
        ),
        # CUDA orders fastest first: torch's cuda:0 (by UUID) is NVML's GPU 1 here
        (
            running(
                A,
                gpu=gpu(*TWO_GPUS),
                torch=replace(CUDA_TORCH, devices=(replace(CUDA_TORCH.devices[1], index=0),)),
            ),
            1,
            False,
            "torch's cuda:0 is this GPU",
        ),
        (running(A), None, False, "the default"),
    ],
    ids=[
        "default",
        "cuda-device",
        "env",
        "env-unreadable",
        "uuid",
        "empty-hides-all",
        "beyond",
        "stopped-uses-shell",
        "torch-uuid",
        "no-gpu-data",
    ],
)
def test_comfy_device(facts: DoctorFacts, index: int | None, none_visible: bool, how: str) -> None:
    chosen = comfy_device(facts)
    assert (chosen.index, chosen.none_visible) == (index, none_visible)
    assert how in chosen.how


# -- RAM, swap, page file --------------------------------------------------------------------------


def host(
    avail_gib: float, total_gib: float = 32, swap_total: float = 8, swap_used: float = 0, **kw: Any
) -> HostSample:
    return HostSample(
        ram_total_bytes=int(total_gib * GIB),
        ram_available_bytes=int(avail_gib * GIB),
        swap_total_bytes=int(swap_total * GIB),
        swap_used_bytes=int(swap_used * GIB),
        **kw,
    )


RAM_ROWS = {
    "unreadable": Row(running(A, unknown={"host": "no answer within 10 s"}), "unknown"),
    "plenty": Row(running(A, host=host(20)), "ok", title=("20.00 GiB of 32.00 GiB",)),
    "under 20 %": Row(running(A, host=host(5)), "warning", says=("Close other programs",)),
    "under 10 %": Row(running(A, host=host(1.5)), "problem"),
    "ComfyUI's RSS is shown": Row(
        running(A, host=host(20), comfy_rss_bytes=9 * GIB), "ok", says=("9.00 GiB (RSS)",)
    ),
}


@pytest.mark.parametrize("row", RAM_ROWS.values(), ids=RAM_ROWS.keys())
def test_ram(row: Row) -> None:
    assert check_row(check_ram, row).key == "ram"


WIN = {"platform": "win32"}
SWAP_ROWS = {
    "no swap on Linux": Row(
        running(A, host=host(20, swap_total=0)),
        "warning",
        title=("No swap",),
        says=("OOM killer", "swapon"),
    ),
    "swap nearly full": Row(running(A, host=host(20, swap_used=7.8)), "problem"),
    "swap 85 % used": Row(running(A, host=host(20, swap_used=6.8)), "warning"),
    "swap idle": Row(running(A, host=host(20, swap_used=0.1)), "ok"),
    "Windows commit limit nearly reached": Row(
        running(A, host=host(2, commit_limit_bytes=48 * GIB, committed_bytes=47 * GIB), **WIN),
        "problem",
        says=("os error 1455", "system managed".replace("system managed", "manage the page file")),
    ),
    "Windows page file off": Row(
        running(A, host=host(20, commit_limit_bytes=33 * GIB, committed_bytes=10 * GIB), **WIN),
        "warning",
        title=("Page file is off or small",),
    ),
    "Windows fine": Row(
        running(A, host=host(20, commit_limit_bytes=64 * GIB, committed_bytes=20 * GIB), **WIN),
        "ok",
    ),
    "Windows commit unreadable": Row(running(A, host=host(20), **WIN), "unknown"),
}


@pytest.mark.parametrize("row", SWAP_ROWS.values(), ids=SWAP_ROWS.keys())
def test_swap_and_page_file(row: Row) -> None:
    finding = check_row(check_swap, row)
    assert finding.key == ("pagefile" if row.facts.platform == "win32" else "swap")


# -- launch flags ----------------------------------------------------------------------------------

FLAG_ROWS = {
    "not running": Row(stopped(), "unknown", says=("not running", "--comfyui")),
    "--highvram on an 8 GiB card": Row(
        running(proc(100, "--highvram"), gpu=gpu(dev(0, 8))),
        "problem",
        title=("make out-of-memory errors likely",),
        says=("Remove --highvram",),
    ),
    "--gpu-only on an unknown card": Row(
        running(proc(100, "--gpu-only")), "warning", says=("Remove --gpu-only",)
    ),
    "--highvram on a 48 GiB card": Row(
        running(proc(100, "--highvram"), gpu=gpu(dev(0, 48))),
        "ok",
        says=("fine on a 48.00 GiB card",),
    ),
    "--lowvram and --reserve-vram are noted": Row(
        running(proc(100, "--lowvram", "--reserve-vram", "1.5"), gpu=gpu(dev(0, 8))),
        "ok",
        says=("--lowvram: ComfyUI offloads", "--reserve-vram 1.5"),
    ),
    "--reserve-vram of most of the card": Row(
        running(proc(100, "--reserve-vram", "20"), gpu=gpu(dev(0, 24))),
        "warning",
        says=("Lower --reserve-vram",),
    ),
    "PYTORCH_CUDA_ALLOC_CONF is shown": Row(
        running(proc(100, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})),
        "ok",
        says=(
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "CUDA_VISIBLE_DEVICES is not set",
        ),
    ),
    "an unreadable environment is unknown, not unset": Row(
        running(proc(100, readable=False)), "ok", says=("PYTORCH_CUDA_ALLOC_CONF: unknown",)
    ),
    "flags from /system_stats when the process is not visible": Row(
        stopped(
            system_stats=SystemStats("http://10.0.0.5:8188", argv=("main.py", "--gpu-only")),
            gpu=gpu(dev(0, 8)),
        ),
        "problem",
        says=("Read from http://10.0.0.5:8188/system_stats: --gpu-only",),
    ),
    "unknown options are listed": Row(
        running(proc(100, "--frobnicate", "3")), "ok", says=("--frobnicate 3",)
    ),
}


@pytest.mark.parametrize("row", FLAG_ROWS.values(), ids=FLAG_ROWS.keys())
def test_launch_flags(row: Row) -> None:
    assert check_row(check_launch_flags, row).key == "launch-flags"


# -- incidents -------------------------------------------------------------------------------------


def inc(id_: str, age_s: float, pool: str = "gpu", **kw: Any) -> IncidentFacts:
    base: dict[str, Any] = {
        "id": id_,
        "created_s": NOW - age_s,
        "instance": "ComfyUI",
        "pool": pool,
        "node_type": "KSampler",
        "count": 1,
        "summary": f"{pool} OOM",
    }
    base.update(kw)
    return IncidentFacts(**base)


DAY = 86400
INCIDENT_ROWS = {
    "watchdog never ran": Row(
        running(A, incidents=None, unknown={"incidents": "no data directory at /x"}),
        "unknown",
        says=("No data directory at /x", "oom-sentinel run"),
    ),
    "none recorded": Row(
        running(A, incidents=(), data_dir="/d"),
        "ok",
        title=("No out-of-memory incident recorded for ComfyUI",),
    ),
    "recent ones with their pools": Row(
        running(
            A,
            incidents=(inc("s2", DAY, count=3), inc("s1", 2 * DAY, "ram", node_type=None)),
            incident_total=2,
        ),
        "warning",
        title=("2 out-of-memory incidents for ComfyUI in the last 7 days: gpu ×3, ram ×1",),
        says=(
            "s2  gpu in KSampler ×3: gpu OOM",
            "oom-sentinel snapshots show s2",
            "batch 1",
            "close other programs",
        ),
    ),
    "a suspected regression names the bisect": Row(
        running(A, incidents=(inc("s3", DAY, regression_suspected=True),)),
        "warning",
        says=("[regression suspected]", "oom-bisect s3"),
    ),
    "fragmentation points at the allocator setting": Row(
        running(A, incidents=(inc("s4", DAY, "gpu-fragmentation"),)),
        "warning",
        says=("expandable_segments:True",),
    ),
    "only old ones": Row(
        running(A, incidents=(inc("s0", 30 * DAY),), incident_total=12),
        "ok",
        title=("12 older out-of-memory incidents",),
        says=("newest 1 shown",),
    ),
}


@pytest.mark.parametrize("row", INCIDENT_ROWS.values(), ids=INCIDENT_ROWS.keys())
def test_incidents(row: Row) -> None:
    assert check_row(check_incidents, row).key == "incidents"


# -- the whole diagnosis ----------------------------------------------------------------------------


def test_findings_come_in_the_seed_guides_order() -> None:
    keys = [f.key for f in diagnose(running(A, host=host(20)))]
    assert keys == [
        "other-gpu-processes",
        "second-instance",
        "cuda",
        "gpu",
        "ram",
        "swap",
        "launch-flags",
        "incidents",
    ]


def test_a_failing_check_reads_unknown_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def check_broken(_facts: DoctorFacts) -> Finding:
        raise ZeroDivisionError("bad rule")

    monkeypatch.setattr(doctor, "CHECKS", (check_broken, doctor.check_ram))
    findings = diagnose(running(A, host=host(20)))
    assert [(f.key, f.verdict) for f in findings] == [("broken", "unknown"), ("ram", "ok")]
    assert "ZeroDivisionError: bad rule" in findings[0].detail


def test_facts_no_source_could_read_still_diagnose() -> None:
    facts = DoctorFacts(now_s=NOW, platform="linux")
    findings = diagnose(facts)
    assert len(findings) == len(doctor.CHECKS)
    assert {f.verdict for f in findings} <= {"unknown", "ok"}
    assert exit_status(findings) == 0


@pytest.mark.parametrize(
    ("verdicts", "overall", "status"),
    [
        (["ok", "ok"], "ok", 0),
        (["ok", "unknown"], "unknown", 0),
        (["unknown", "warning"], "warning", 0),
        (["warning", "problem", "ok"], "problem", 1),
    ],
    ids=["all-ok", "unknown", "warning", "problem"],
)
def test_verdict_and_exit_status(verdicts: list[str], overall: str, status: int) -> None:
    findings = [Finding(f"k{i}", "t", v) for i, v in enumerate(verdicts)]  # type: ignore[arg-type]
    assert overall_verdict(findings) == overall
    assert exit_status(findings) == status


def test_json_report_has_the_documented_shape() -> None:
    facts = running(
        A1, gpu=gpu(*TWO_GPUS, procs=[gp(999, 1, 20)]), torch=CPU_TORCH, host=host(20), incidents=()
    )
    findings = diagnose(facts)
    doc = json.loads(json.dumps(report_json(facts, findings)))
    assert list(doc) == ["schema", "instance", "verdict", "exit_status", "findings", "facts"]
    assert doc["schema"] == 1
    assert doc["instance"] == {
        "name": "ComfyUI",
        "path": "/opt/ComfyUI",
        "url": "http://127.0.0.1:8188",
        "pid": 100,
        "python": PY,
    }
    assert (doc["verdict"], doc["exit_status"]) == ("problem", 1)
    assert all(set(f) == {"key", "title", "verdict", "detail", "action"} for f in doc["findings"])
    facts_doc = doc["facts"]
    assert facts_doc["comfy_device"]["index"] == 1
    assert facts_doc["torch"]["cpu_only_build"] is True
    assert facts_doc["gpu"]["processes"][0]["used_bytes"] == 20 * GIB
    assert facts_doc["process"]["memory_args"] == ["--cuda-device", "1"]


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        ("580.65.06", ("12.8", "cu128")),
        ("570.124.04", ("12.8", "cu128")),
        ("560.35.03", ("12.6", "cu126")),
        ("552.22", ("12.4", "cu124")),
        ("535.183.01", ("12.1", "cu121")),
        ("522.06", ("11.8", "cu118")),
        ("470.82.01", None),
        (None, None),
        ("garbage", None),
    ],
)
def test_torch_wheel_for_a_driver(driver: str | None, expected: tuple[str, str] | None) -> None:
    assert torch_wheel_index(driver) == expected
