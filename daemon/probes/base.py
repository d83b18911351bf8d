"""The memory probes' interfaces and the sample records they produce.

Every adapter (NVML, the file-scripted fake GPU, psutil) implements one of these protocols, so
the service and the bisect never know which one they hold. Unknown values are ``None``: NVML
really does answer "not supported" for per-process memory under Windows WDDM and on some
boards, and 0 would be a lie.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "GpuDeviceSample",
    "GpuProbe",
    "GpuProcessSample",
    "HostProbe",
    "HostSample",
    "MemorySample",
    "ProcessTreeSample",
]


@dataclass(frozen=True, slots=True)
class GpuDeviceSample:
    index: int
    name: str
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    #: NVML v2 "reserved" (driver/firmware) memory where known
    reserved_bytes: int | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuProcessSample:
    pid: int
    device_index: int
    #: None when the driver cannot say (WDDM, MIG without privileges, "not supported")
    used_bytes: int | None
    name: str | None = None
    cmdline: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class HostSample:
    ram_total_bytes: int
    ram_available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    #: Windows commit charge (paging file) where the platform exposes it
    commit_limit_bytes: int | None = None
    committed_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessTreeSample:
    """RSS of one watched process and its children (ComfyUI may spawn helpers)."""

    root_pid: int
    rss_bytes: int
    #: peak RSS of the root process where the OS records it (Linux VmHWM)
    peak_rss_bytes: int | None = None
    #: processes counted in ``rss_bytes`` (the root and the children still alive)
    process_count: int | None = None


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One point of the memory timeline."""

    #: wall-clock seconds since the epoch (UTC) -- what humans and CSV read
    time_s: float
    gpus: tuple[GpuDeviceSample, ...]
    gpu_processes: tuple[GpuProcessSample, ...]
    host: HostSample | None
    process_trees: tuple[ProcessTreeSample, ...] = ()


class GpuProbe(Protocol):
    """Per-device and per-process GPU memory. Never raises: failures read as no data."""

    #: "nvml", "fake" or "none" -- logged once at start-up
    backend: str

    def devices(self) -> tuple[GpuDeviceSample, ...]: ...

    def processes(self) -> tuple[GpuProcessSample, ...]: ...

    def close(self) -> None: ...


class HostProbe(Protocol):
    def host(self) -> HostSample | None: ...

    def process_tree(self, root_pid: int) -> ProcessTreeSample | None: ...
