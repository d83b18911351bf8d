"""A scripted ``pynvml`` module for tests: the real binding's error classes and constants, with
functions that answer the way a given driver generation would (memory v2 or only v1, running
processes through _v3, _v2 or only v1, WDDM's "not available", errors per device or for the
whole library). Hand it to ``NvmlGpuProbe(module)``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

GiB = 1024**3
MiB = 1024**2


@dataclass
class FakeDevice:
    name: str | bytes = "NVIDIA GeForce RTX 4090"
    uuid: str = "GPU-4090"
    total: int = 24 * GiB
    used: int = 10 * GiB
    reserved: int = 400 * MiB
    #: NVML error code the v2 memory call raises (None: v2 works)
    v2_error: int | None = None
    #: NVML error code the v1 memory call raises
    v1_error: int | None = None
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    #: newest running-process API the "driver" exports: "v3", "v2" or "v1"
    process_api: str = "v3"
    process_error: int | None = None
    handle_error: int | None = None
    name_error: int | None = None

    @property
    def free(self) -> int:
        return self.total - self.used - self.reserved


class FakeNvml(types.SimpleNamespace):
    """A scripted stand-in for the ``pynvml`` module (real error classes and constants)."""

    def __init__(self, devices: list[FakeDevice] | None = None, init_error: int | None = None):
        super().__init__()
        for name in dir(real):
            if name.startswith(("NVML_ERROR_", "NVMLError")) or name in (
                "NVMLLibraryMismatchError",
                "nvmlMemory_v2",
            ):
                setattr(self, name, getattr(real, name))
        self.devices = devices if devices is not None else [FakeDevice()]
        self.init_error = init_error
        self.calls: list[str] = []
        self.query_error: int | None = None  # raised by every device query (driver gone)
        self.driver = b"550.54.14"
        self.initialised = 0

    # session
    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._check()
        dev = self.devices[index]
        if dev.handle_error is not None:
            raise real.NVMLError(dev.handle_error)
        return dev

    def _check(self) -> None:
        if self.query_error is not None:
            raise real.NVMLError(self.query_error)

    # device fields
    def nvmlDeviceGetName(self, dev: FakeDevice) -> str | bytes:
        self._check()
        if dev.name_error is not None:
            raise real.NVMLError(dev.name_error)
        return dev.name

    def nvmlDeviceGetUUID(self, dev: FakeDevice) -> str:
        self._check()
        return dev.uuid

    def nvmlDeviceGetMemoryInfo(self, dev: FakeDevice, version: int | None = None) -> Any:
        self._check()
        if version:
            self.calls.append("memory_v2")
            assert version == real.nvmlMemory_v2
            if dev.v2_error is not None:
                raise real.NVMLError(dev.v2_error)
            return types.SimpleNamespace(
                version=version,
                total=dev.total,
                reserved=dev.reserved,
                free=dev.free,
                used=dev.used,
            )
        self.calls.append("memory_v1")
        if dev.v1_error is not None:
            raise real.NVMLError(dev.v1_error)
        # v1 folds driver-reserved memory into "used"
        return types.SimpleNamespace(total=dev.total, free=dev.free, used=dev.used + dev.reserved)

    # running processes, the way the binding's functions behave per driver generation
    def _procs(self, dev: FakeDevice, kind: str, api: str) -> list[Any]:
        self._check()
        self.calls.append(f"{kind}_{api}")
        order = {"v1": 1, "v2": 2, "v3": 3}
        if order[api] > order[dev.process_api]:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if dev.process_error is not None:
            raise real.NVMLError(dev.process_error)
        rows = dev.compute if kind == "compute" else dev.graphics
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in rows]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, dev: FakeDevice) -> list[Any]:
        return self._procs(dev, "compute", "v3")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, dev: FakeDevice) -> list[Any]:
        return self._procs(dev, "compute", "v2")

    def nvmlDeviceGetComputeRunningProcesses(self, dev: FakeDevice) -> list[Any]:
        # current bindings map this to _v3 and raise NVMLLibraryMismatchError when the driver
        # lacks it; bindings older than the v2 API called the v1 symbol
        if dev.process_api == "v1":
            return self._procs(dev, "compute", "v1")
        try:
            return self._procs(dev, "compute", "v3")
        except real.NVMLError_FunctionNotFound:
            raise real.NVMLLibraryMismatchError("unversioned call") from None

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, dev: FakeDevice) -> list[Any]:
        return self._procs(dev, "graphics", "v3")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, dev: FakeDevice) -> list[Any]:
        return self._procs(dev, "graphics", "v2")

    def nvmlDeviceGetGraphicsRunningProcesses(self, dev: FakeDevice) -> list[Any]:
        if dev.process_api == "v1":
            return self._procs(dev, "graphics", "v1")
        try:
            return self._procs(dev, "graphics", "v3")
        except real.NVMLError_FunctionNotFound:
            raise real.NVMLLibraryMismatchError("unversioned call") from None
