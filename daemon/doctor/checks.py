"""The seed guide's quick diagnosis of an OOM-prone ComfyUI, as pure checks over collected facts.

When ComfyUI runs out of memory, the first questions are always the same and always asked in
the same order: what else is on the GPU, is a second ComfyUI running, does torch in *ComfyUI's*
interpreter see CUDA at all, which GPU will ComfyUI use and how much of it is free, how much RAM
and swap / page file is left, which launch flags are in effect, and what the last incidents
were. ``oom-sentinel doctor`` answers them in that order. The facts are gathered elsewhere
(``doctor_collect.py``: processes, the GPU probe, psutil, a torch probe run in ComfyUI's
interpreter, ``/system_stats``, the snapshots); here every check is a function from those facts
to one ``Finding`` with a verdict and what to do, so each rule is tested as a table.

A fact that could not be read is ``None`` with its reason in ``DoctorFacts.unknown``; a check
that depends on it says "unknown" and why, never "ok".
"""

from __future__ import annotations

import ntpath
import os
import posixpath
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from oom_sentinel.daemon.comfy.discovery import DiscoveredInstance
from oom_sentinel.daemon.comfy.processes import (
    ComfyProcess,
    LaunchFlags,
    find_conflicts,
    holds_no_gpu_memory,
    other_gpu_processes,
    parse_launch_flags,
    shares_gpu,
)
from oom_sentinel.daemon.core.units import GIB, MIB, format_bytes
from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProcessSample, HostSample

__all__ = [
    "CHECKS",
    "EXIT_ALL_OK",
    "EXIT_PROBLEM",
    "REPORT_SCHEMA",
    "VERDICTS",
    "ComfyDevice",
    "DoctorFacts",
    "Finding",
    "GpuState",
    "IncidentFacts",
    "SystemStats",
    "TorchDevice",
    "TorchProbe",
    "Verdict",
    "comfy_device",
    "comfy_visible_devices",
    "diagnose",
    "exit_status",
    "facts_json",
    "flags_in_effect",
    "overall_verdict",
    "report_json",
    "torch_wheel_index",
]

Verdict = Literal["ok", "warning", "problem", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("ok", "warning", "problem", "unknown")

#: exit statuses of ``oom-sentinel doctor`` (README, "oom-sentinel doctor")
EXIT_ALL_OK = 0  # no finding is a problem (warnings and unknowns do not fail)
EXIT_PROBLEM = 1  # at least one finding is a problem

#: version of the ``--json`` document
REPORT_SCHEMA = 1


# -- thresholds, and why ---------------------------------------------------------------------

#: Other processes below this much on ComfyUI's GPU are a desktop's normal share (Xorg,
#: gnome-shell, dwm.exe and a browser's compositor hold 100-500 MiB between them).
OTHERS_NOTE_BYTES = 512 * MIB
#: From this much (or 10 % of the card, whichever is more) others take room a model needs:
#: an SD 1.5 fp16 UNet is ~1.7 GiB, an SDXL one ~4.8 GiB.
OTHERS_PROBLEM_BYTES = 1 * GIB
OTHERS_PROBLEM_FRACTION = 0.10
#: Less than this available to ComfyUI (free plus what it holds) and nothing real fits.
GPU_PROBLEM_BYTES = 2 * GIB
GPU_PROBLEM_FRACTION = 0.20
GPU_WARNING_FRACTION = 0.50
#: Cards under this size need --lowvram for SDXL-class models (ComfyUI's own guidance since it
#: stopped switching to low-VRAM mode by itself on <= 4 GB cards in 2024-05).
SMALL_CARD_BYTES = 6 * GIB
#: --highvram / --gpu-only keep every model (and, for --gpu-only, every intermediate) in VRAM;
#: below this size that runs out as soon as a second model loads.
HIGHVRAM_MIN_BYTES = 16 * GIB
#: RAM: models are read into RAM before they move to the GPU and offloaded back into it.
RAM_PROBLEM_BYTES = 2 * GIB
RAM_PROBLEM_FRACTION = 0.10
RAM_WARNING_BYTES = 4 * GIB
RAM_WARNING_FRACTION = 0.20
SWAP_WARNING_FRACTION = 0.80
SWAP_PROBLEM_FRACTION = 0.95
COMMIT_WARNING_FRACTION = 0.80
COMMIT_PROBLEM_FRACTION = 0.95
#: a page file smaller than this (commit limit minus RAM) is "off or tiny"
PAGEFILE_SMALL_BYTES = 4 * GIB
#: incidents newer than this make the finding a warning
RECENT_INCIDENT_S = 7 * 24 * 3600
#: incidents shown
INCIDENTS_SHOWN = 5

#: Oldest NVIDIA driver each CUDA major version runs on, through CUDA's minor-version
#: compatibility (NVIDIA's CUDA Toolkit release notes, "CUDA Driver" table: 11.x >= 450.80.02,
#: 12.x >= 525.60.13, 13.x >= 580.65.06 on Linux; Windows drivers are numbered alike).
CUDA_MAJOR_MIN_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 65)}
#: The newest CUDA each driver branch supports (what nvidia-smi prints as "CUDA Version"), and
#: the PyTorch wheel index to take for it, newest first. The official wheels live on
#: https://download.pytorch.org/whl/<tag>; which tags a torch release has is listed on
#: https://pytorch.org/get-started/locally/.
DRIVER_TO_WHEEL = (
    (570, "12.8", "cu128"),
    (560, "12.6", "cu126"),
    (550, "12.4", "cu124"),
    (530, "12.1", "cu121"),
    (520, "11.8", "cu118"),
)


# -- facts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TorchDevice:
    """One CUDA device as torch in ComfyUI's interpreter sees it (index among the visible ones)."""

    index: int
    name: str | None
    total_bytes: int | None
    uuid: str | None = None
    capability: str | None = None


@dataclass(frozen=True, slots=True)
class TorchProbe:
    """What the doctor's torch probe learned inside ComfyUI's interpreter (``None``: could not
    tell). It ran with the device selection ComfyUI runs with (``cuda_visible_devices``)."""

    executable: str
    python_version: str | None = None
    torch_version: str | None = None
    #: ``torch.version.cuda``: ``None`` in CPU-only and ROCm builds
    cuda_version: str | None = None
    #: ``torch.version.hip``: set in ROCm builds
    hip_version: str | None = None
    #: ``torch.backends.cuda.is_built()``
    cuda_built: bool | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    current_device: int | None = None
    devices: tuple[TorchDevice, ...] = ()
    #: ``torch.cuda.mem_get_info()`` of the current device (driver-wide free / total)
    mem_free_bytes: int | None = None
    mem_total_bytes: int | None = None
    #: ``torch.cuda.memory_allocated()`` / ``memory_reserved()`` in the probe's own process
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    #: the first lines of ``torch.cuda.memory_summary()``
    summary_header: tuple[str, ...] = ()
    mps_built: bool | None = None
    mps_available: bool | None = None
    xpu_available: bool | None = None
    #: the ``CUDA_VISIBLE_DEVICES`` the probe ran with (``None``: unset)
    cuda_visible_devices: str | None = None
    #: warnings torch printed while looking for CUDA ("The NVIDIA driver on your system is too
    #: old", "Found no NVIDIA driver")
    warnings: tuple[str, ...] = ()
    #: ``import torch`` failed: the last line of the error
    import_error: str | None = None
    #: other probe steps that failed: ``(step, error)``
    errors: tuple[tuple[str, str], ...] = ()

    @property
    def cpu_only_build(self) -> bool:
        """A torch without CUDA or ROCm support (``+cpu`` wheels, PyPI's default on Windows and
        macOS): ComfyUI on it says "Torch not compiled with CUDA enabled"."""
        if self.torch_version is None:
            return False
        if self.cuda_version is not None or self.hip_version is not None:
            return False
        if self.cuda_built is True:
            return False
        return self.cuda_built is False or self.torch_version.endswith("+cpu")

    def error(self, step: str) -> str | None:
        return next((text for name, text in self.errors if name == step), None)


@dataclass(frozen=True, slots=True)
class GpuState:
    """What the GPU probe (NVML, the fake GPU, or none) showed."""

    backend: str
    detail: str
    devices: tuple[GpuDeviceSample, ...] = ()
    processes: tuple[GpuProcessSample, ...] = ()
    driver_version: str | None = None


@dataclass(frozen=True, slots=True)
class SystemStats:
    """ComfyUI's own ``/system_stats`` (comfyui-facts §1.6): only the one torch device it uses."""

    url: str
    comfyui_version: str | None = None
    pytorch_version: str | None = None
    argv: tuple[str, ...] | None = None
    #: e.g. ``"cuda:0 NVIDIA GeForce RTX 4090 : cudaMallocAsync"``
    device_name: str | None = None
    device_type: str | None = None
    device_index: int | None = None
    vram_total_bytes: int | None = None
    #: driver-free plus torch's cached-but-unused memory
    vram_free_bytes: int | None = None
    embedded_python: bool | None = None


@dataclass(frozen=True, slots=True)
class IncidentFacts:
    """One recorded snapshot, as the doctor lists it."""

    id: str
    created_s: float | None
    instance: str
    pool: str | None
    node_type: str | None
    count: int
    summary: str
    regression_suspected: bool = False


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the checks look at. ``None`` means "could not be read"; ``unknown`` maps
    the source (``processes``, ``gpu``, ``host``, ``torch``, ``system_stats``, ``incidents``)
    to why."""

    now_s: float
    platform: str
    #: the ComfyUI being diagnosed (``None``: none found or named)
    target: DiscoveredInstance | None = None
    #: its running server process
    process: ComfyProcess | None = None
    #: every ComfyUI process on the machine (``None``: the process table was not readable)
    comfy_processes: tuple[ComfyProcess, ...] | None = None
    #: the target process and its children
    own_pids: frozenset[int] = frozenset()
    gpu: GpuState | None = None
    host: HostSample | None = None
    #: RSS of the target's process tree
    comfy_rss_bytes: int | None = None
    #: the interpreter probed, and how it was chosen ("--python", "process", "install")
    python: str | None = None
    python_source: str | None = None
    torch: TorchProbe | None = None
    system_stats: SystemStats | None = None
    #: newest first, at most ``INCIDENTS_SHOWN`` of the target (all instances when no target)
    incidents: tuple[IncidentFacts, ...] | None = None
    #: all incidents of the target counted (``incidents`` holds only the newest)
    incident_total: int | None = None
    data_dir: str | None = None
    #: this shell's ``CUDA_VISIBLE_DEVICES``: what a ComfyUI started from here inherits
    doctor_cuda_visible_devices: str | None = None
    unknown: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Finding:
    """One answer of the diagnosis: what was looked at, the verdict, and what to do."""

    key: str
    title: str
    verdict: Verdict
    detail: str = ""
    action: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "key": self.key,
            "title": self.title,
            "verdict": self.verdict,
            "detail": self.detail,
            "action": self.action,
        }


# -- derived facts ------------------------------------------------------------------------------


def flags_in_effect(facts: DoctorFacts) -> tuple[LaunchFlags | None, str | None]:
    """ComfyUI's launch flags and where they were read: its process, else its ``/system_stats``
    ``argv`` (which also works for a process of another user)."""
    if facts.process is not None:
        return facts.process.flags, f"pid {facts.process.pid}"
    stats = facts.system_stats
    if stats is not None and stats.argv is not None:
        return parse_launch_flags(stats.argv[1:]), f"{stats.url}/system_stats"
    return None, None


def comfy_visible_devices(flags: LaunchFlags | None, inherited: str | None) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` ComfyUI runs with: its ``main.py`` sets it from
    ``--default-device N`` (N first, then 0..31) and then from ``--cuda-device``, before torch
    is imported; otherwise the inherited value (``None``: unset, every GPU visible)."""
    visible = inherited
    if flags is not None:
        if flags.default_device is not None and 0 <= flags.default_device < 32:
            order = [flags.default_device, *(i for i in range(32) if i != flags.default_device)]
            visible = ",".join(str(i) for i in order)
        if flags.cuda_device is not None and flags.cuda_device != "all":
            visible = flags.cuda_device
    return visible


@dataclass(frozen=True, slots=True)
class ComfyDevice:
    """The GPU ComfyUI uses (torch's ``cuda:0``), as an index of the GPU probe's devices."""

    #: index in ``GpuState.devices`` (NVML order); ``None``: unknown, or no GPU at all
    index: int | None
    #: the ``CUDA_VISIBLE_DEVICES`` it runs with (``None``: unset)
    visible: str | None
    #: how it was decided, for humans
    how: str
    #: the selection hides every GPU: CUDA will find none
    none_visible: bool = False
    #: ``--cpu``
    cpu: bool = False
    #: ``--directml``
    directml: bool = False


def _inherited_visible(facts: DoctorFacts) -> tuple[str | None, str]:
    proc = facts.process
    if proc is not None:
        if proc.environ_readable:
            return proc.cuda_visible_devices, "its environment"
        return None, "its environment (not readable: assumed unset)"
    return facts.doctor_cuda_visible_devices, "this shell's environment"


def _physical_index(
    visible: str | None, devices: Sequence[GpuDeviceSample]
) -> tuple[int | None, bool]:
    """``(device index, hides every GPU)`` for torch's ``cuda:0`` under ``visible``.

    CUDA reads the list up to its first invalid entry; entries are indices in PCI bus order
    (which NVML uses) when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or ``GPU-<uuid>`` prefixes."""
    known = {d.index for d in devices}
    if not devices:
        return None, visible is not None and visible.strip() in ("", "-1")
    if visible is None:
        return min(known), False
    first = visible.split(",")[0].strip()
    if first.lstrip("-").isdigit():
        idx = int(first)
        if idx < 0:
            return None, True
        if idx not in known:
            return None, True
        return idx, False
    if first.upper().startswith(("GPU-", "MIG-")):
        for dev in devices:
            if dev.uuid and dev.uuid.upper().startswith(first.upper()):
                return dev.index, False
        return None, first.upper().startswith("GPU-")
    if first == "":
        return None, True
    return None, False


def comfy_device(facts: DoctorFacts) -> ComfyDevice:
    """Which GPU ComfyUI will use (pure; see ``comfy_visible_devices`` for the rules)."""
    flags, _ = flags_in_effect(facts)
    inherited, where = _inherited_visible(facts)
    visible = comfy_visible_devices(flags, inherited)
    if flags is not None and flags.vram_mode == "cpu":
        return ComfyDevice(None, visible, "--cpu: ComfyUI uses no GPU", cpu=True)
    if flags is not None and flags.directml is not None:
        return ComfyDevice(None, visible, "--directml: ComfyUI uses DirectML", directml=True)
    if flags is not None and flags.cuda_device not in (None, "all"):
        how = f"--cuda-device {flags.cuda_device}"
    elif flags is not None and flags.default_device is not None:
        how = f"--default-device {flags.default_device}"
    elif visible is not None:
        how = f"CUDA_VISIBLE_DEVICES={visible} in {where}"
    else:
        how = "the default (the first GPU)"
    devices = facts.gpu.devices if facts.gpu is not None else ()
    # torch's own answer wins: it ran with the same selection, and its device UUID names the
    # physical GPU even where CUDA's order (fastest first) differs from NVML's (PCI bus).
    torch = facts.torch
    if torch is not None and torch.devices and devices:
        current = torch.current_device or 0
        tdev = next((d for d in torch.devices if d.index == current), None)
        if tdev is not None and tdev.uuid:
            want = tdev.uuid.upper().removeprefix("GPU-")
            for dev in devices:
                if dev.uuid and dev.uuid.upper().removeprefix("GPU-") == want:
                    return ComfyDevice(dev.index, visible, f"{how}; torch's cuda:0 is this GPU")
    index, none_visible = _physical_index(visible, devices)
    return ComfyDevice(index, visible, how, none_visible=none_visible)


def _device(facts: DoctorFacts, index: int | None) -> GpuDeviceSample | None:
    if facts.gpu is None or index is None:
        return None
    return next((d for d in facts.gpu.devices if d.index == index), None)


def _first_visible(visible: str | None) -> str:
    return "0" if visible is None else visible.split(",")[0].strip()


def _proc_device(facts: DoctorFacts, proc: ComfyProcess) -> tuple[int | None, str | None]:
    """``(GPU index, comparable key)`` of another ComfyUI process: NVML's answer, else its
    device selection. The key compares selections where no GPU data exists (``None``: CPU)."""
    if proc.flags.vram_mode == "cpu":
        return None, None
    if facts.gpu is not None:
        seen = [p.device_index for p in facts.gpu.processes if p.pid == proc.pid]
        if seen:
            return seen[0], f"#{seen[0]}"
    inherited = proc.cuda_visible_devices if proc.environ_readable else None
    visible = comfy_visible_devices(proc.flags, inherited)
    devices = facts.gpu.devices if facts.gpu is not None else ()
    index, none_visible = _physical_index(visible, devices)
    if index is not None:
        return index, f"#{index}"
    if none_visible:
        return None, None
    return None, f"cuda:{_first_visible(visible)}"


def _target_device_key(dev: ComfyDevice) -> str | None:
    if dev.cpu or dev.directml or dev.none_visible:
        return None
    if dev.index is not None:
        return f"#{dev.index}"
    return f"cuda:{_first_visible(dev.visible)}"


def _gpu_label(dev: GpuDeviceSample | None, index: int | None) -> str:
    if dev is None:
        return f"GPU {index}" if index is not None else "the GPU"
    total = f", {format_bytes(dev.total_bytes)}" if dev.total_bytes is not None else ""
    return f"GPU {dev.index} ({dev.name}{total})"


def _proc_label(p: GpuProcessSample) -> str:
    name = p.name or (posixpath.basename(p.cmdline[0]) if p.cmdline else None) or "?"
    return f"{name} (pid {p.pid})"


def _comfy_label(p: ComfyProcess) -> str:
    return f"pid {p.pid} ({p.install_dir}, port {p.flags.effective_port})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _sentence(text: str) -> str:
    """``text`` as a sentence: capitalised, ending in a full stop."""
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _quote(path: str, platform: str) -> str:
    if platform.startswith("win"):
        return f'"{path}"' if " " in path else path
    return shlex.quote(path)


def _python_cmd(facts: DoctorFacts) -> str:
    python = facts.python or (facts.torch.executable if facts.torch else None) or "python"
    quoted = _quote(python, facts.platform)
    # The portable build's python_embeded ignores PYTHONPATH/site only with -s, as its own
    # scripts run it.
    if ntpath.basename(ntpath.dirname(python)).lower() == "python_embeded":
        return f"{quoted} -s"
    return quoted


def _driver_major_minor(version: str | None) -> tuple[int, int] | None:
    if not version:
        return None
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def torch_wheel_index(driver_version: str | None) -> tuple[str, str] | None:
    """``(newest CUDA the driver supports, PyTorch wheel tag)`` for an NVIDIA driver version,
    or ``None`` when the driver is unknown or too old for any current wheel."""
    mm = _driver_major_minor(driver_version)
    if mm is None:
        return None
    for branch, cuda, tag in DRIVER_TO_WHEEL:
        if mm[0] >= branch:
            return cuda, tag
    return None


def _min_driver_for(cuda_version: str | None) -> tuple[int, int] | None:
    try:
        major = int((cuda_version or "").split(".")[0])
    except ValueError:
        return None
    return CUDA_MAJOR_MIN_DRIVER.get(major)


# -- the checks, in the seed guide's order ---------------------------------------------------------


def check_other_gpu_processes(facts: DoctorFacts) -> Finding:
    key = "other-gpu-processes"
    gpu = facts.gpu
    if gpu is None or gpu.backend == "none" or not gpu.devices:
        why = facts.unknown.get("gpu") or (gpu.detail if gpu is not None else "no GPU probe")
        return Finding(
            key,
            "Other GPU processes: unknown (no NVIDIA GPU data)",
            "unknown",
            f"The GPU probe gave no data: {why}.",
            "On an NVIDIA machine, `nvidia-smi` lists the processes on each GPU; on AMD, "
            "`rocm-smi --showpids`.",
        )
    dev = comfy_device(facts)
    comfy_pids = {p.pid for p in facts.comfy_processes or ()}
    others = other_gpu_processes(gpu.processes, facts.own_pids | comfy_pids)
    ours = [p for p in others if dev.index is None or p.device_index == dev.index]
    elsewhere = [p for p in others if p not in ours]
    device = _device(facts, dev.index)
    where = _gpu_label(device, dev.index) if dev.index is not None else "the GPUs"
    known = sum(p.used_bytes for p in ours if p.used_bytes is not None)
    unsure = [p for p in ours if p.used_bytes is None]
    total = device.total_bytes if device is not None else None
    threshold = max(OTHERS_PROBLEM_BYTES, int(OTHERS_PROBLEM_FRACTION * (total or 0)))
    lines = [
        f"{_proc_label(p)}: {format_bytes(p.used_bytes, 'unknown amount')} on GPU {p.device_index}"
        for p in sorted(ours, key=lambda p: -(p.used_bytes or 0))
    ]
    lines += [
        f"{_proc_label(p)}: {format_bytes(p.used_bytes, 'unknown amount')} on GPU "
        f"{p.device_index} (not ComfyUI's GPU)"
        for p in elsewhere
    ]
    if not ours:
        title = f"No other process uses {where}"
        return Finding(key, title, "ok", "\n".join(lines))
    if known >= threshold:
        verdict: Verdict = "problem"
    elif unsure or known >= OTHERS_NOTE_BYTES:
        verdict = "warning"
    else:
        verdict = "ok"
    amount = format_bytes(known) + (" and an unknown amount" if unsure else "")
    holds = "processes hold" if len(ours) > 1 else "process holds"
    title = f"{len(ours)} other {holds} {amount} on {where}, the one ComfyUI uses"
    if unsure:
        lines.append(
            "The driver does not report per-process memory here (Windows WDDM, WSL2): "
            "Task Manager's GPU columns show it."
        )
    action = ""
    if verdict != "ok":
        biggest = max(ours, key=lambda p: p.used_bytes or 0)
        action = (
            f"Close what you do not need while ComfyUI works, biggest first: "
            f"{_proc_label(biggest)}. ComfyUI plans model loading with the memory free when it "
            "starts a prompt, so memory taken by others is memory it cannot have."
        )
        roomier = _roomier_device(facts, dev.index)
        if roomier is not None:
            action += (
                f" Or run ComfyUI on GPU {roomier.index} ({format_bytes(roomier.free_bytes)} "
                f"free): --cuda-device {roomier.index}."
            )
    return Finding(key, title, verdict, "\n".join(lines), action)


def _roomier_device(facts: DoctorFacts, index: int | None) -> GpuDeviceSample | None:
    if facts.gpu is None or index is None:
        return None
    current = _device(facts, index)
    best = None
    for dev in facts.gpu.devices:
        if dev.index == index or dev.free_bytes is None:
            continue
        if (
            current is not None
            and current.free_bytes is not None
            and dev.free_bytes <= current.free_bytes
        ):
            continue
        if best is None or dev.free_bytes > (best.free_bytes or 0):
            best = dev
    return best


def check_second_instance(facts: DoctorFacts) -> Finding:
    key = "second-instance"
    if facts.comfy_processes is None:
        why = facts.unknown.get("processes", "the process table could not be read")
        return Finding(key, "Second ComfyUI instance: unknown", "unknown", _sentence(why))
    target = facts.process
    others = [p for p in facts.comfy_processes if target is None or p.pid != target.pid]
    if not others:
        return Finding(key, "No second ComfyUI instance is running", "ok")
    dev = comfy_device(facts)
    gpu_procs = facts.gpu.processes if facts.gpu is not None else ()
    conflicts = find_conflicts(facts.comfy_processes, gpu_procs) if target is not None else ()
    target_path = os.path.normcase(facts.target.path) if facts.target is not None else None
    lines: list[str] = []
    shared_gpu: list[ComfyProcess] = []
    clashes: list[str] = []
    target_key = _target_device_key(dev)
    for other in others:
        index, other_key = _proc_device(facts, other)
        used = sum(p.used_bytes or 0 for p in gpu_procs if p.pid == other.pid)
        if other.flags.vram_mode != "cpu" and holds_no_gpu_memory(other, gpu_procs):
            on = "no GPU memory (NVML lists none for it)"
        elif index is not None:
            on = f"GPU {index}"
        elif other_key is not None:
            on = f"CUDA device {other_key.removeprefix('cuda:')} (GPU data unavailable)"
        else:
            on = "no GPU"
        holds = f", holds {format_bytes(used)}" if used else ""
        lines.append(f"{_comfy_label(other)} on {on}{holds}")
        # one rule with the snapshots and alerts (processes.shares_gpu) for a running ComfyUI;
        # for one not running, the device its config selects
        if target is not None:
            if shares_gpu(target, other, gpu_procs):
                shared_gpu.append(other)
        elif (
            other_key is not None
            and other_key == target_key
            and not holds_no_gpu_memory(other, gpu_procs)
        ):
            shared_gpu.append(other)
        for conflict in conflicts:
            if other.pid in conflict.pids and target is not None and target.pid in conflict.pids:
                if conflict.kind == "same-gpu" and other not in shared_gpu:
                    shared_gpu.append(other)
                elif conflict.kind in ("same-install", "same-port"):
                    clashes.append(f"pid {other.pid}: {conflict.detail}")
        if (
            target is None
            and target_path is not None
            and os.path.normcase(other.install_dir) == target_path
        ):
            clashes.append(f"pid {other.pid} already runs from {other.install_dir}")
    clashes = list(dict.fromkeys(clashes))
    if not shared_gpu and not clashes:
        title = f"{_count(len(others), 'other ComfyUI instance')} running, on other GPUs"
        return Finding(key, title, "ok", "\n".join(lines))
    verdict: Verdict = "problem" if target is not None or clashes else "warning"
    parts = []
    if shared_gpu:
        parts.append(f"on ComfyUI's {_gpu_label(_device(facts, dev.index), dev.index)}")
    if clashes:
        parts.append("sharing its install or port")
    involved = [p.pid for p in shared_gpu] + [
        p.pid for p in others if any(c.startswith(f"pid {p.pid}") for c in clashes)
    ]
    pids = ", ".join(str(pid) for pid in dict.fromkeys(involved))
    title = f"A second ComfyUI instance (pid {pids}) is running " + " and ".join(parts)
    lines += clashes
    action_parts = []
    if shared_gpu:
        action_parts.append(
            "Stop the other instance, or start it on another GPU with --cuda-device N: two "
            "instances on one GPU each count the other's models as used memory and load into "
            "what is left."
        )
    if clashes:
        action_parts.append(
            "Give a second instance of one install its own --port, --base-directory (or "
            "--temp-directory and --user-directory) and --database-url: ComfyUI deletes its temp "
            "folder at every start."
        )
    return Finding(key, title, verdict, "\n".join(lines), " ".join(action_parts))


def _cpu_only_action(facts: DoctorFacts, lead: str = "Install") -> str:
    python = _python_cmd(facts)
    driver = facts.gpu.driver_version if facts.gpu is not None else None
    wheel = torch_wheel_index(driver)
    if wheel is not None:
        cuda, tag = wheel
        pick = f"driver {driver} supports CUDA up to {cuda}, so take the {tag} build"
    else:
        tag = "cuXXX"
        pick = (
            "run `nvidia-smi`: its 'CUDA Version' is the newest CUDA your driver supports; take "
            "the cuXXX build at or below it (cu128 for CUDA 12.8 and newer drivers)"
        )
    return (
        f"{lead} the CUDA build of torch into ComfyUI's interpreter, from PyTorch's CUDA wheel "
        "index (a plain `pip install torch` gives the CPU-only build again on Windows). "
        "Which build: "
        f"{pick}, then `{python} -m pip install --upgrade torch torchvision torchaudio "
        f"--index-url https://download.pytorch.org/whl/{tag}` (versions per "
        "https://pytorch.org/get-started/locally/). Check it with "
        f'`{python} -c "import torch; print(torch.__version__, torch.version.cuda, '
        'torch.cuda.is_available())"`: it must print a +cu version, a CUDA version and True.'
    )


def check_cuda(facts: DoctorFacts) -> Finding:
    key = "cuda"
    torch = facts.torch
    flags, _ = flags_in_effect(facts)
    cpu_mode = flags is not None and flags.vram_mode == "cpu"
    if torch is None:
        why = facts.unknown.get("torch", "ComfyUI's interpreter was not found")
        return Finding(
            key,
            "CUDA in ComfyUI's interpreter: unknown",
            "unknown",
            _sentence(why),
            "Name ComfyUI's Python with --python PATH (its venv's bin/python, or "
            "python_embeded\\python.exe of the portable build).",
        )
    where = f"in {torch.executable}"
    if torch.import_error is not None:
        missing = "No module named 'torch'" in torch.import_error
        action = (
            "This interpreter has no torch. If it is ComfyUI's, install ComfyUI's requirements "
            f"into it (`{_python_cmd(facts)} -m pip install -r requirements.txt` in the ComfyUI "
            "folder, with the CUDA torch build for your GPU); otherwise name the right one "
            "with --python."
            if missing
            else "ComfyUI fails the same way at start-up. A missing DLL or shared library "
            "usually means torch's CUDA libraries do not match the installed packages: compare "
            "`pip list` in that interpreter with the torch install command on "
            "https://pytorch.org/get-started/locally/."
        )
        return Finding(
            key,
            "torch cannot be imported in ComfyUI's interpreter",
            "problem",
            f"`import torch` {where} failed: {torch.import_error}",
            action,
        )
    version = torch.torch_version or "unknown"
    builds = []
    if torch.cuda_version:
        builds.append(f"CUDA {torch.cuda_version}")
    if torch.hip_version:
        builds.append(f"ROCm/HIP {torch.hip_version}")
    build = f"torch {version}" + (f" ({', '.join(builds)})" if builds else "")
    if torch.cuda_available:
        names = ", ".join(f"cuda:{d.index} {d.name}" for d in torch.devices) or "no names"
        detail = (
            f"{build} {where} sees {_count(torch.device_count or len(torch.devices), 'device')}: "
            f"{names}."
        )
        if cpu_mode:
            return Finding(
                key,
                "CUDA works in ComfyUI's interpreter, but ComfyUI runs with --cpu",
                "warning",
                detail,
                "Remove --cpu from ComfyUI's command line to use the GPU.",
            )
        kind = "ROCm" if torch.hip_version else "CUDA"
        return Finding(key, f"{kind} is available in ComfyUI's interpreter", "ok", detail)
    if cpu_mode:
        return Finding(
            key,
            "ComfyUI runs with --cpu: CUDA is not used",
            "ok",
            f"{build} {where}; CUDA available: {torch.cuda_available}.",
        )
    if flags is not None and flags.directml is not None:
        return Finding(
            key,
            "ComfyUI runs with --directml: CUDA is not used",
            "ok",
            f"{build} {where}.",
        )
    if torch.mps_available:
        return Finding(
            key,
            "Apple MPS is available in ComfyUI's interpreter (Macs have no CUDA)",
            "ok",
            f"{build} {where}; ComfyUI runs on MPS, in unified memory shared with the system.",
        )
    if torch.xpu_available:
        return Finding(
            key, "Intel XPU is available in ComfyUI's interpreter", "ok", f"{build} {where}."
        )
    notes = [*torch.warnings]
    if torch.error("cuda"):
        notes.append(f"torch.cuda: {torch.error('cuda')}")
    if torch.cpu_only_build:
        nvidia = bool(facts.gpu and facts.gpu.backend != "none" and facts.gpu.devices)
        detail = (
            f"torch {version} {where} is built without CUDA (torch.version.cuda is None), so "
            "ComfyUI stops with 'Torch not compiled with CUDA enabled' unless it runs with --cpu."
        )
        if not nvidia:
            detail += " No NVIDIA GPU was seen on this machine either."
        action = _cpu_only_action(facts)
        if not nvidia:
            action = (
                "If this machine has no NVIDIA GPU, start ComfyUI with --cpu. If it has one, "
                "install the NVIDIA driver (`nvidia-smi` must list the GPU), then "
                + _cpu_only_action(facts, lead="install")
            )
        return Finding(
            key,
            "CUDA not available in ComfyUI's interpreter: this torch is a CPU-only build",
            "problem",
            detail,
            action,
        )
    # A CUDA (or ROCm) build that finds no device.
    detail = f"{build} {where}: torch.cuda.is_available() is {torch.cuda_available}."
    if notes:
        detail += " " + " ".join(notes)
    visible = torch.cuda_visible_devices
    if visible is not None:
        detail += f" It ran with CUDA_VISIBLE_DEVICES={visible!r}, as ComfyUI does."
    dev = comfy_device(facts)
    driver = facts.gpu.driver_version if facts.gpu is not None else None
    need = _min_driver_for(torch.cuda_version)
    have = _driver_major_minor(driver)
    if dev.none_visible:
        action = (
            f"ComfyUI's device selection ({dev.how}) hides every GPU; pick one that exists "
            "(the GPU finding lists them)."
        )
    elif facts.gpu is not None and facts.gpu.backend == "none":
        action = (
            "No NVIDIA driver answered (`nvidia-smi` fails): install or repair the NVIDIA "
            "driver, and reboot after a driver upgrade."
        )
    elif need is not None and have is not None and have < need:
        action = (
            f"torch's CUDA {torch.cuda_version} needs an NVIDIA driver {need[0]}.{need[1]} or "
            f"newer; this one is {driver}. Update the driver (or install a torch built for the "
            "CUDA your driver supports, as `nvidia-smi` shows)."
        )
    else:
        action = (
            "Run `nvidia-smi`: if it fails, the driver is not loaded (reboot after a driver "
            "upgrade); if it works, compare its 'CUDA Version' with torch's "
            f"({torch.cuda_version or torch.hip_version or 'unknown'}) — the driver must be at "
            "least as new."
        )
    return Finding(
        key,
        "CUDA not available in ComfyUI's interpreter, although its torch is a GPU build",
        "problem",
        detail,
        action,
    )


def _memory_summary_note(torch: TorchProbe) -> str:
    if not torch.summary_header and torch.allocated_bytes is None:
        return ""
    allocated = format_bytes(torch.allocated_bytes)
    reserved = format_bytes(torch.reserved_bytes)
    return (
        f"torch.cuda.memory_summary() in the probe: {allocated} allocated, {reserved} reserved. "
        "That is expected: the probe is a fresh process, and torch's counters only see their "
        "own process. ComfyUI's own use is the process list above (NVML); ComfyUI 0.8.0 and "
        "newer print its summary into the log when it runs out of memory."
    )


def check_gpu(facts: DoctorFacts) -> Finding:
    key = "gpu"
    dev = comfy_device(facts)
    flags, _ = flags_in_effect(facts)
    if dev.cpu:
        return Finding(key, "ComfyUI uses no GPU (--cpu)", "ok", dev.how)
    if dev.directml:
        return Finding(key, "ComfyUI's GPU: DirectML (not visible to NVML)", "unknown", dev.how)
    devices = facts.gpu.devices if facts.gpu is not None else ()
    listing = ", ".join(f"{d.index}: {d.name}" for d in devices)
    if dev.none_visible:
        return Finding(
            key,
            f"ComfyUI's device selection ({dev.how}) matches no GPU",
            "problem",
            f"This machine's GPUs: {listing or 'none found'}. CUDA will find no device and "
            "ComfyUI stops at start-up.",
            "Use --cuda-device with one of the indices above (or fix CUDA_VISIBLE_DEVICES).",
        )
    device = _device(facts, dev.index)
    torch = facts.torch
    lines: list[str] = []
    if torch is not None and torch.mem_free_bytes is not None:
        lines.append(
            f"torch.cuda.mem_get_info() in ComfyUI's interpreter: "
            f"{format_bytes(torch.mem_free_bytes)} free of {format_bytes(torch.mem_total_bytes)}."
        )
    stats = facts.system_stats
    if stats is not None and stats.device_name:
        lines.append(
            f"ComfyUI's /system_stats: {stats.device_name}, "
            f"{format_bytes(stats.vram_free_bytes)} free (torch's unused cache counts as free)."
        )
    if torch is not None:
        note = _memory_summary_note(torch)
        if note:
            lines.append(note)
    if len({d.name for d in devices}) > 1 and "torch's cuda:0" not in dev.how:
        lines.append(
            "These GPUs differ: CUDA numbers them fastest first unless CUDA_DEVICE_ORDER="
            "PCI_BUS_ID, so CUDA's device N may not be NVML's (and nvidia-smi's) GPU N. The "
            "torch probe settles it on a machine where CUDA works."
        )
    if device is None:
        free = torch.mem_free_bytes if torch is not None else None
        total = torch.mem_total_bytes if torch is not None else None
        if free is None or total is None:
            why = facts.unknown.get("gpu") or (
                facts.gpu.detail if facts.gpu is not None else "no GPU data"
            )
            return Finding(
                key,
                "ComfyUI's GPU and its free memory: unknown",
                "unknown",
                "\n".join([f"Chosen by {dev.how}; GPU data: {why}.", *lines]),
                "`nvidia-smi` shows each GPU's memory.",
            )
        comfy_used = 0
        others_used = 0
        name = "cuda:0"
        index_label = "ComfyUI's GPU"
    else:
        free = device.free_bytes
        total = device.total_bytes
        procs = facts.gpu.processes if facts.gpu is not None else ()
        on = [p for p in procs if p.device_index == device.index]
        comfy_used = sum(p.used_bytes or 0 for p in on if p.pid in facts.own_pids)
        others_used = sum(p.used_bytes or 0 for p in on if p.pid not in facts.own_pids)
        name = device.name
        index_label = _gpu_label(device, device.index)
    if free is None or total is None:
        return Finding(
            key,
            f"{index_label}: free memory unknown",
            "unknown",
            "\n".join([f"Chosen by {dev.how}.", *lines]),
        )
    available = free + comfy_used
    head = f"{index_label}, chosen by {dev.how}: {format_bytes(free)} free"
    if comfy_used:
        head += f"; ComfyUI holds {format_bytes(comfy_used)}"
    if others_used:
        head += f"; other processes {format_bytes(others_used)}"
    lines.insert(0, head + ".")
    low_mode = flags is not None and flags.vram_mode in ("lowvram", "novram")
    if available < GPU_PROBLEM_BYTES or available < GPU_PROBLEM_FRACTION * total:
        return Finding(
            key,
            f"Only {format_bytes(available)} of {name}'s {format_bytes(total)} is left for ComfyUI",
            "problem",
            "\n".join(lines),
            "Free the GPU first (see the other processes and instances above); then use "
            "smaller or quantized models, batch size 1 and lower resolution"
            + ("" if low_mode else ", or start ComfyUI with --lowvram")
            + ".",
        )
    if total < SMALL_CARD_BYTES and not low_mode:
        return Finding(
            key,
            f"{name} is a small card ({format_bytes(total)})",
            "warning",
            "\n".join(lines),
            "Start ComfyUI with --lowvram, and prefer fp8 / GGUF-quantized models.",
        )
    if available < GPU_WARNING_FRACTION * total:
        return Finding(
            key,
            f"Half of {name} is taken before ComfyUI loads anything: "
            f"{format_bytes(available)} of {format_bytes(total)} left",
            "warning",
            "\n".join(lines),
            "Close other GPU users while ComfyUI works (see above).",
        )
    return Finding(
        key,
        f"{name}: {format_bytes(available)} of {format_bytes(total)} available to ComfyUI",
        "ok",
        "\n".join(lines),
    )


def check_ram(facts: DoctorFacts) -> Finding:
    key = "ram"
    host = facts.host
    if host is None:
        why = facts.unknown.get("host", "system memory could not be read")
        return Finding(key, "RAM: unknown", "unknown", _sentence(why))
    avail, total = host.ram_available_bytes, host.ram_total_bytes
    detail = f"{format_bytes(avail)} available of {format_bytes(total)}."
    if facts.comfy_rss_bytes is not None:
        detail += f" ComfyUI's processes use {format_bytes(facts.comfy_rss_bytes)} (RSS)."
    title = f"RAM: {format_bytes(avail)} of {format_bytes(total)} available"
    action = (
        "Close other programs (browsers, games, other AI tools) while ComfyUI works; for long "
        "videos use fewer frames per run. ComfyUI reads every model into RAM before the GPU "
        "and offloads back into it."
    )
    if avail < RAM_PROBLEM_BYTES or avail < RAM_PROBLEM_FRACTION * total:
        return Finding(key, title, "problem", detail, action)
    if avail < RAM_WARNING_BYTES or avail < RAM_WARNING_FRACTION * total:
        return Finding(key, title, "warning", detail, action)
    return Finding(key, title, "ok", detail)


def check_swap(facts: DoctorFacts) -> Finding:
    host = facts.host
    windows = facts.platform.startswith("win")
    key = "pagefile" if windows else "swap"
    if host is None:
        why = facts.unknown.get("host", "system memory could not be read")
        label = "Page file" if windows else "Swap"
        return Finding(key, f"{label}: unknown", "unknown", _sentence(why))
    if windows:
        limit, committed = host.commit_limit_bytes, host.committed_bytes
        if limit is None or committed is None:
            return Finding(
                key, "Page file: unknown", "unknown", "The commit limit was not readable."
            )
        page_file = max(0, limit - host.ram_total_bytes)
        used = committed / limit if limit else 1.0
        detail = (
            f"Commit charge {format_bytes(committed)} of a {format_bytes(limit)} limit "
            f"(RAM plus a page file of about {format_bytes(page_file)})."
        )
        title = f"Page file: {used:.0%} of the commit limit in use"
        fix = (
            "Let Windows manage the page file size (System > Advanced system settings > "
            "Performance > Advanced > Virtual memory), on a fast drive with room; 'The paging "
            "file is too small' (os error 1455) while loading a model is this limit."
        )
        if used >= COMMIT_PROBLEM_FRACTION:
            return Finding(key, title, "problem", detail, fix)
        if used >= COMMIT_WARNING_FRACTION or page_file < PAGEFILE_SMALL_BYTES:
            if page_file < PAGEFILE_SMALL_BYTES:
                title = f"Page file is off or small (about {format_bytes(page_file)})"
            return Finding(key, title, "warning", detail, fix)
        return Finding(key, title, "ok", detail)
    total, used_b = host.swap_total_bytes, host.swap_used_bytes
    if total <= 0:
        return Finding(
            key,
            "No swap",
            "warning",
            "With no swap, the moment RAM runs out the kernel's OOM killer ends ComfyUI "
            "without a Python error.",
            "Add a swap file (8-16 GiB, e.g. `fallocate -l 16G /swapfile && chmod 600 /swapfile "
            "&& mkswap /swapfile && swapon /swapfile`), or keep more RAM free.",
        )
    frac = used_b / total
    title = f"Swap: {format_bytes(used_b)} of {format_bytes(total)} in use"
    detail = f"{frac:.0%} of swap in use."
    action = "RAM is overcommitted: close other programs, or add swap."
    if frac >= SWAP_PROBLEM_FRACTION:
        return Finding(key, title, "problem", detail, action)
    if frac >= SWAP_WARNING_FRACTION:
        return Finding(key, title, "warning", detail, action)
    return Finding(key, title, "ok", detail)


def check_launch_flags(facts: DoctorFacts) -> Finding:
    key = "launch-flags"
    flags, source = flags_in_effect(facts)
    if flags is None:
        why = facts.unknown.get(
            "flags",
            "ComfyUI is not running (or its process is not visible), so its flags are not known",
        )
        return Finding(
            key,
            "Launch flags: unknown",
            "unknown",
            _sentence(why),
            "Start ComfyUI and run the doctor again, or name its URL with --comfyui.",
        )
    dev = comfy_device(facts)
    device = _device(facts, dev.index)
    total = device.total_bytes if device is not None else None
    if total is None and facts.torch is not None:
        total = facts.torch.mem_total_bytes
    lines = [f"Read from {source}: {' '.join(flags.memory_args) or '(no memory flags)'}."]
    verdict: Verdict = "ok"
    actions: list[str] = []
    mode = flags.vram_mode
    if mode in ("highvram", "gpu-only"):
        what = (
            "keeps every model and all intermediate results in VRAM"
            if mode == "gpu-only"
            else "keeps every loaded model in VRAM instead of offloading"
        )
        if total is not None and total < HIGHVRAM_MIN_BYTES:
            verdict = "problem"
            lines.append(f"--{mode} {what}; this card has {format_bytes(total)}.")
            actions.append(
                f"Remove --{mode}: on a card under {format_bytes(HIGHVRAM_MIN_BYTES)} it runs "
                "out as soon as a second model loads."
            )
        elif total is None:
            verdict = "warning"
            lines.append(f"--{mode} {what}; the card's size is unknown.")
            actions.append(f"Remove --{mode} unless the card has 16 GiB or more.")
        else:
            lines.append(f"--{mode} {what}; fine on a {format_bytes(total)} card.")
    elif mode in ("lowvram", "novram"):
        lines.append(
            f"--{mode}: ComfyUI offloads model weights to RAM (slower, less VRAM); RAM matters "
            "more."
        )
    elif mode == "cpu":
        lines.append("--cpu: everything runs on the CPU, in RAM.")
    if flags.reserve_vram_gb is not None:
        note = f"--reserve-vram {flags.reserve_vram_gb:g}: ComfyUI leaves that many GB unused."
        if total is not None and flags.reserve_vram_gb * GIB > total / 2:
            note += " That is more than half of the card."
            if verdict == "ok":
                verdict = "warning"
            actions.append("Lower --reserve-vram: it takes more than half of the card.")
        lines.append(note)
    if flags.disable_smart_memory:
        lines.append("--disable-smart-memory: models are unloaded after every prompt.")
    if flags.cache_mode:
        lines.append(f"Cache mode: {flags.cache_mode}.")
    if flags.cuda_malloc is not None:
        lines.append(f"cudaMallocAsync {'forced on' if flags.cuda_malloc else 'turned off'}.")
    proc = facts.process
    if proc is not None and proc.environ_readable:
        conf = proc.pytorch_cuda_alloc_conf
        lines.append(
            f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "PYTORCH_CUDA_ALLOC_CONF is not set."
        )
        lines.append(
            f"CUDA_VISIBLE_DEVICES={proc.cuda_visible_devices}"
            if proc.cuda_visible_devices is not None
            else "CUDA_VISIBLE_DEVICES is not set in its environment."
        )
    else:
        lines.append(
            "PYTORCH_CUDA_ALLOC_CONF: unknown (ComfyUI's environment is not readable by this user)."
        )
    if flags.unknown:
        lines.append(
            f"Options this version of the doctor does not know: {' '.join(flags.unknown)}."
        )
    title = {
        "ok": "Launch flags: nothing that wastes memory",
        "warning": "Launch flags: worth a look",
        "problem": "Launch flags make out-of-memory errors likely",
        "unknown": "Launch flags",
    }[verdict]
    return Finding(key, title, verdict, "\n".join(lines), " ".join(actions))


_POOL_HINT = {
    "gpu": "GPU memory: lower the resolution, batch 1, fewer frames, or a smaller or "
    "quantized model; then --lowvram or --reserve-vram",
    "gpu-fragmentation": "fragmentation: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "in ComfyUI's environment",
    "ram": "RAM: close other programs, use shorter clips, make the swap / page file larger",
    "swap-pagefile": "the page file: let Windows manage its size",
    "unified-mps": "unified memory: smaller models and resolutions, close other apps",
    "killed-by-os": "killed by the OS for RAM: close other programs, add swap",
}


def _incident_time(seconds: float | None) -> str:
    if seconds is None:
        return "unknown time"
    import time as _time

    return _time.strftime("%Y-%m-%d %H:%M", _time.localtime(seconds))


def check_incidents(facts: DoctorFacts) -> Finding:
    key = "incidents"
    who = f" for {facts.target.name}" if facts.target is not None else ""
    if facts.incidents is None:
        why = facts.unknown.get("incidents", "the snapshots could not be read")
        return Finding(
            key,
            "Last incidents: unknown",
            "unknown",
            _sentence(why),
            "Run the watchdog (`oom-sentinel run`, or its service) so out-of-memory failures "
            "are recorded.",
        )
    if not facts.incidents:
        return Finding(
            key,
            f"No out-of-memory incident recorded{who}",
            "ok",
            f"Snapshots are read from {facts.data_dir}." if facts.data_dir else "",
        )
    total = facts.incident_total or len(facts.incidents)
    recent = [
        i
        for i in facts.incidents
        if i.created_s is not None and facts.now_s - i.created_s <= RECENT_INCIDENT_S
    ]
    pools: dict[str, int] = {}
    for inc in facts.incidents:
        pools[inc.pool or "unknown"] = pools.get(inc.pool or "unknown", 0) + max(1, inc.count)
    pool_text = ", ".join(f"{p} ×{n}" for p, n in pools.items())
    lines = []
    for inc in facts.incidents:
        repeat = f" ×{inc.count}" if inc.count > 1 else ""
        node = f" in {inc.node_type}" if inc.node_type else ""
        flag = " [regression suspected]" if inc.regression_suspected else ""
        lines.append(
            f"{_incident_time(inc.created_s)}  {inc.id}  {inc.pool or '?'}{node}{repeat}{flag}: "
            f"{inc.summary}"
        )
    newest = facts.incidents[0]
    actions = [f"Read the newest: `oom-sentinel snapshots show {newest.id}`."]
    suspected = next((i for i in facts.incidents if i.regression_suspected), None)
    if suspected is not None:
        actions.append(f"It started after an update: `oom-bisect {suspected.id}` finds the commit.")
    hints = [_POOL_HINT[p] for p in pools if p in _POOL_HINT]
    if hints:
        actions.append("By pool — " + "; ".join(hints) + ".")
    shown = f" (newest {len(facts.incidents)} shown)" if total > len(facts.incidents) else ""
    if recent:
        title = (
            f"{_count(len(recent), 'out-of-memory incident')}{who} in the last 7 days: {pool_text}"
        )
        return Finding(key, title, "warning", "\n".join(lines) + shown, " ".join(actions))
    title = f"{_count(total, 'older out-of-memory incident')}{who}, none in the last 7 days"
    return Finding(key, title, "ok", "\n".join(lines) + shown, " ".join(actions))


#: the checks, in the order the seed guide asks its questions
CHECKS: tuple[Callable[[DoctorFacts], Finding], ...] = (
    check_other_gpu_processes,
    check_second_instance,
    check_cuda,
    check_gpu,
    check_ram,
    check_swap,
    check_launch_flags,
    check_incidents,
)


def diagnose(facts: DoctorFacts) -> tuple[Finding, ...]:
    """Every check's finding, in order. A check that fails on odd facts reports "unknown"
    with the error instead of hiding the others."""
    out: list[Finding] = []
    for check in CHECKS:
        try:
            out.append(check(facts))
        except Exception as exc:  # a bug in one rule must not cost the whole diagnosis
            name = check.__name__.removeprefix("check_").replace("_", "-")
            out.append(
                Finding(
                    name, f"{name}: the check failed", "unknown", f"{type(exc).__name__}: {exc}"
                )
            )
    return tuple(out)


def overall_verdict(findings: Sequence[Finding]) -> Verdict:
    """``problem`` if any, else ``warning`` if any, else ``unknown`` if any, else ``ok``."""
    verdicts = {f.verdict for f in findings}
    order: tuple[Verdict, ...] = ("problem", "warning", "unknown")
    return next((v for v in order if v in verdicts), "ok")


def exit_status(findings: Sequence[Finding]) -> int:
    return EXIT_PROBLEM if any(f.verdict == "problem" for f in findings) else EXIT_ALL_OK


# -- JSON ----------------------------------------------------------------------------------------


def _gpu_json(gpu: GpuState | None) -> dict[str, Any] | None:
    if gpu is None:
        return None
    return {
        "backend": gpu.backend,
        "detail": gpu.detail,
        "driver_version": gpu.driver_version,
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "uuid": d.uuid,
                "total_bytes": d.total_bytes,
                "used_bytes": d.used_bytes,
                "free_bytes": d.free_bytes,
            }
            for d in gpu.devices
        ],
        "processes": [
            {
                "pid": p.pid,
                "device_index": p.device_index,
                "used_bytes": p.used_bytes,
                "name": p.name,
                "cmdline": list(p.cmdline) if p.cmdline is not None else None,
            }
            for p in gpu.processes
        ],
    }


def _torch_json(torch: TorchProbe | None) -> dict[str, Any] | None:
    if torch is None:
        return None
    return {
        "executable": torch.executable,
        "python_version": torch.python_version,
        "torch_version": torch.torch_version,
        "cuda_version": torch.cuda_version,
        "hip_version": torch.hip_version,
        "cuda_built": torch.cuda_built,
        "cpu_only_build": torch.cpu_only_build,
        "cuda_available": torch.cuda_available,
        "device_count": torch.device_count,
        "current_device": torch.current_device,
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "total_bytes": d.total_bytes,
                "uuid": d.uuid,
                "capability": d.capability,
            }
            for d in torch.devices
        ],
        "mem_free_bytes": torch.mem_free_bytes,
        "mem_total_bytes": torch.mem_total_bytes,
        "allocated_bytes": torch.allocated_bytes,
        "reserved_bytes": torch.reserved_bytes,
        "memory_summary_header": list(torch.summary_header),
        "mps_built": torch.mps_built,
        "mps_available": torch.mps_available,
        "xpu_available": torch.xpu_available,
        "cuda_visible_devices": torch.cuda_visible_devices,
        "warnings": list(torch.warnings),
        "import_error": torch.import_error,
        "errors": dict(torch.errors),
    }


def _process_json(proc: ComfyProcess) -> dict[str, Any]:
    return {
        "pid": proc.pid,
        "argv": list(proc.argv),
        "interpreter": proc.interpreter,
        "install_dir": proc.install_dir,
        "code_dir": proc.code_dir,
        "port": proc.flags.effective_port,
        "memory_args": list(proc.flags.memory_args),
        "pytorch_cuda_alloc_conf": proc.pytorch_cuda_alloc_conf,
        "cuda_visible_devices": proc.cuda_visible_devices,
        "environ_readable": proc.environ_readable,
    }


def facts_json(facts: DoctorFacts) -> dict[str, Any]:
    """The facts behind the findings, for scripts and bug reports (not yet redacted)."""
    dev = comfy_device(facts)
    host = facts.host
    stats = facts.system_stats
    target = facts.target
    return {
        "platform": facts.platform,
        "python": facts.python,
        "python_source": facts.python_source,
        "process": _process_json(facts.process) if facts.process is not None else None,
        "comfy_processes": (
            [_process_json(p) for p in facts.comfy_processes]
            if facts.comfy_processes is not None
            else None
        ),
        "comfy_device": {
            "index": dev.index,
            "cuda_visible_devices": dev.visible,
            "how": dev.how,
            "none_visible": dev.none_visible,
            "cpu": dev.cpu,
        },
        "gpu": _gpu_json(facts.gpu),
        "host": (
            {
                "ram_total_bytes": host.ram_total_bytes,
                "ram_available_bytes": host.ram_available_bytes,
                "swap_total_bytes": host.swap_total_bytes,
                "swap_used_bytes": host.swap_used_bytes,
                "commit_limit_bytes": host.commit_limit_bytes,
                "committed_bytes": host.committed_bytes,
                "comfy_rss_bytes": facts.comfy_rss_bytes,
            }
            if host is not None
            else None
        ),
        "torch": _torch_json(facts.torch),
        "system_stats": (
            {
                "url": stats.url,
                "comfyui_version": stats.comfyui_version,
                "pytorch_version": stats.pytorch_version,
                "argv": list(stats.argv) if stats.argv is not None else None,
                "device_name": stats.device_name,
                "device_type": stats.device_type,
                "vram_total_bytes": stats.vram_total_bytes,
                "vram_free_bytes": stats.vram_free_bytes,
            }
            if stats is not None
            else None
        ),
        "incidents": (
            [
                {
                    "id": i.id,
                    "created_s": i.created_s,
                    "instance": i.instance,
                    "pool": i.pool,
                    "node_type": i.node_type,
                    "count": i.count,
                    "summary": i.summary,
                    "regression_suspected": i.regression_suspected,
                }
                for i in facts.incidents
            ]
            if facts.incidents is not None
            else None
        ),
        "data_dir": facts.data_dir,
        "unknown": dict(facts.unknown),
        "instance_source": target.source if target is not None else None,
    }


def report_json(facts: DoctorFacts, findings: Sequence[Finding]) -> dict[str, Any]:
    """The ``doctor --json`` document (shape documented in README.md)."""
    target = facts.target
    return {
        "schema": REPORT_SCHEMA,
        "instance": (
            {
                "name": target.name,
                "path": target.path,
                "url": target.url,
                "pid": facts.process.pid if facts.process is not None else None,
                "python": facts.python,
            }
            if target is not None
            else None
        ),
        "verdict": overall_verdict(findings),
        "exit_status": exit_status(findings),
        "findings": [f.to_json() for f in findings],
        "facts": facts_json(facts),
    }
