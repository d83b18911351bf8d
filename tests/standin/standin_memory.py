"""Real host memory and a scripted GPU for the stand-in's nodes, failing the way torch fails.

Host RAM is real: every block is a ``bytearray`` whose pages are written, so RSS, ``VmHWM`` and
the kernel's OOM killer see it. Under an address-space limit (``RLIMIT_AS``) an allocation raises
a real ``MemoryError``; it is re-raised with the type and text the real library would use there
(torch's ``DefaultCPUAllocator`` ``RuntimeError``, numpy's ``_ArrayMemoryError``), as observed on
a real ComfyUI (comfyui-facts.md 11).

VRAM is accounting on the fake GPU (``daemon/probes/fake_gpu.py`` protocol, ``$OOM_SENTINEL_FAKE_GPU``):
this process publishes its usage in ``proc-<pid>.json`` and raises a CUDA-style OOM, with the
numbers torch prints, when an allocation does not fit beside the other processes' usage.

Allocation sizes are multiplied by the install's *tuning* (``standin_tuning.json`` next to
``main.py``): the bisect tests raise ``memory_factor`` at a "bad" commit, and custom node packs
can scale single node classes through ``standin_api``.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import random
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MIB = 1024 * 1024
GIB = 1024 * MIB
ENV_FAKE_GPU = "OOM_SENTINEL_FAKE_GPU"

#: What NVML shows for a process once it holds a CUDA context, before any tensor exists.
CUDA_CONTEXT_BYTES = 312 * MIB


# --------------------------------------------------------------------------------------------
# Tuning: the knobs commits of a stand-in history change.


@dataclass
class Tuning:
    memory_factor: float = 1.0
    ram_factor: float = 1.0
    vram_factor: float = 1.0
    #: each allocation is multiplied by 1 + uniform(-noise_fraction, +noise_fraction)
    noise_fraction: float = 0.0
    #: core "features" custom node packs may test (a node may misbehave only with a newer core)
    features: list[str] = field(default_factory=list)
    torch_version: str = "2.9.1"
    startup_delay_s: float = 0.0
    #: per node class multipliers (custom node packs add to these through standin_api)
    node_scale: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, code_dir: Path) -> Tuning:
        path = code_dir / "standin_tuning.json"
        try:
            data = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


TUNING = Tuning()
_rng = random.Random(os.environ.get("OOM_STANDIN_SEED"))


def scaled_bytes(nbytes: int, class_type: str | None, *, vram: bool) -> int:
    """The size an allocation really gets at this install's tuning."""
    factor = TUNING.memory_factor * (TUNING.vram_factor if vram else TUNING.ram_factor)
    if class_type is not None:
        factor *= TUNING.node_scale.get(class_type, 1.0)
    if TUNING.noise_fraction:
        factor *= 1.0 + _rng.uniform(-TUNING.noise_fraction, TUNING.noise_fraction)
    return max(0, int(nbytes * factor))


# --------------------------------------------------------------------------------------------
# Exceptions named like the libraries' own, so exception_type reads as on a real install.


class OutOfMemoryError(RuntimeError):
    """torch's CUDA OOM; ``exception_type`` becomes ``torch.OutOfMemoryError``."""


OutOfMemoryError.__module__ = "torch"


class CudaOutOfMemoryError(RuntimeError):
    """The same error as torch < 2.4 names it: ``torch.cuda.OutOfMemoryError``."""


CudaOutOfMemoryError.__module__ = "torch.cuda"
CudaOutOfMemoryError.__qualname__ = "OutOfMemoryError"
CudaOutOfMemoryError.__name__ = "OutOfMemoryError"


class _ArrayMemoryError(MemoryError):
    """numpy's allocation failure (``numpy._core._exceptions._ArrayMemoryError``)."""


_ArrayMemoryError.__module__ = "numpy._core._exceptions"


class InterruptProcessingException(Exception):
    """Raised at the next check after ``POST /interrupt``."""


InterruptProcessingException.__module__ = "comfy.model_management"


def _torch_version_tuple() -> tuple[int, int]:
    try:
        major, minor = TUNING.torch_version.split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (2, 9)


def oom_exception_class() -> type[RuntimeError]:
    return CudaOutOfMemoryError if _torch_version_tuple() < (2, 4) else OutOfMemoryError


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, OutOfMemoryError | CudaOutOfMemoryError)


def format_size(nbytes: int) -> str:
    """torch's ``format_size`` (c10/cuda/CUDACachingAllocator.cpp)."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1048576:
        return f"{nbytes / 1024.0:.2f} KiB"
    if nbytes <= 1073741824:
        return f"{nbytes / 1048576.0:.2f} MiB"
    return f"{nbytes / 1073741824.0:.2f} GiB"


def numpy_size(nbytes: int) -> str:
    """numpy's ``_size_to_string``: ``192. MiB``."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    unit_i = max(nbytes.bit_length() - 1, 1) // 10
    n_units = nbytes / (1 << (unit_i * 10))
    if round(n_units) == 1024 and unit_i < len(units) - 1:
        unit_i += 1
        n_units /= 1024
    if unit_i == 0:
        return f"{nbytes:d} bytes"
    return f"{n_units:#.3g} {units[unit_i]}"


# --------------------------------------------------------------------------------------------
# Host memory.


#: pages touched per slice assignment (16 MiB): a switch point for the GIL between slices
_TOUCH_CHUNK_BYTES = 16 * 1024 * 1024


class HostBlock:
    """``nbytes`` of real, touched host memory.

    An anonymous mapping, its pages written a slice at a time. ``bytearray(n)`` zeroes all
    ``n`` bytes in one C call that holds the GIL: a GiB took seconds on a loaded machine, and
    all that while the server's event loop (aiohttp, in the main thread) answered no HTTP.
    torch releases the GIL while it allocates, so the stand-in must not hold it through a
    whole allocation either: between two slices the event loop gets its turn.
    """

    __slots__ = ("__weakref__", "buf", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.buf: mmap.mmap | bytearray
        if not nbytes:
            self.buf = bytearray()
            return
        try:
            self.buf = mmap.mmap(-1, nbytes)
        except OSError as exc:  # ENOMEM: RLIMIT_AS, or no address space left
            raise MemoryError() from exc
        # anonymous pages are not resident until written; write one byte per page
        for start in range(0, nbytes, _TOUCH_CHUNK_BYTES):
            stop = min(nbytes, start + _TOUCH_CHUNK_BYTES)
            self.buf[start:stop:PAGE_BYTES] = b"\x01" * math.ceil((stop - start) / PAGE_BYTES)


def host_alloc_raw(nbytes: int) -> HostBlock:
    """Plain Python allocation: a failure is the builtin ``MemoryError``."""
    return HostBlock(nbytes)


def torch_cpu_alloc(nbytes: int) -> HostBlock:
    """A CPU tensor: a failure reads like torch's DefaultCPUAllocator error."""
    try:
        return HostBlock(nbytes)
    except MemoryError:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            f"memory: you tried to allocate {nbytes} bytes. Error code 12 (Cannot allocate memory)"
        ) from None


def numpy_alloc(shape: tuple[int, ...], itemsize: int = 4, dtype: str = "float32") -> HostBlock:
    nbytes = itemsize
    for dim in shape:
        nbytes *= dim
    nbytes = scaled_bytes(nbytes, None, vram=False)
    try:
        return HostBlock(nbytes)
    except MemoryError:
        raise _ArrayMemoryError(
            f"Unable to allocate {numpy_size(nbytes)} for an array with shape {shape!s} "
            f"and data type {dtype}"
        ) from None


def _set_rlimit_as(limit: int) -> int:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def apply_rlimit_as_from_env() -> int | None:
    """``$OOM_STANDIN_RLIMIT_AS_MIB``: an address-space cap from the start, like ``ulimit -v``."""
    raw = os.environ.get("OOM_STANDIN_RLIMIT_AS_MIB", "")
    return _set_rlimit_as(int(float(raw) * MIB)) if raw else None


def apply_rlimit_as_headroom_from_env() -> int | None:
    """``$OOM_STANDIN_RLIMIT_AS_HEADROOM_MIB``: once started, cap the address space at what is
    mapped now plus this much, so a test's limit does not depend on the interpreter's size."""
    raw = os.environ.get("OOM_STANDIN_RLIMIT_AS_HEADROOM_MIB", "")
    if not raw:
        return None
    vm_size_kib = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            vm_size_kib = int(line.split()[1])
    return _set_rlimit_as(vm_size_kib * 1024 + int(float(raw) * MIB))


# --------------------------------------------------------------------------------------------
# The fake GPU.


def _atomic_write_json(path: Path, data: object) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class FakeDeviceSpec:
    index: int
    name: str
    total_bytes: int
    base_used_bytes: int


def read_fake_devices(root: Path) -> list[FakeDeviceSpec]:
    try:
        data = json.loads((root / "devices.json").read_text("utf-8"))
        return [
            FakeDeviceSpec(
                index=int(d["index"]),
                name=str(d.get("name", f"Fake GPU {d['index']}")),
                total_bytes=int(d["total_bytes"]),
                base_used_bytes=int(d.get("base_used_bytes", 0)),
            )
            for d in data.get("devices", [])
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class FakeCuda:
    """One process's view of one fake CUDA device, with torch's caching-allocator bookkeeping."""

    def __init__(self, root: Path, device: FakeDeviceSpec, async_backend: bool) -> None:
        self.root = root
        self.device = device
        self.async_backend = async_backend
        self.pid = os.getpid()
        self.name = Path(sys.executable).name
        self._lock = threading.RLock()
        self.allocated_bytes = 0
        #: freed by tensors, still held by the caching allocator
        self.cached_bytes = 0
        self.peak_used_bytes = 0
        self.peak_allocated_bytes = 0
        self.num_ooms = 0
        self._publish()

    # ---- what other processes use (read from their files) ----------------------------------
    def others_used(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for path in sorted(self.root.glob("proc-*.json")):
            try:
                data = json.loads(path.read_text("utf-8"))
                pid = int(data["pid"])
                if pid == self.pid or int(data.get("device_index", 0)) != self.device.index:
                    continue
                if _pid_alive(pid):
                    out.append((pid, int(data.get("used_bytes", 0))))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    @property
    def reserved_bytes(self) -> int:
        return self.allocated_bytes + self.cached_bytes

    @property
    def used_bytes(self) -> int:
        """What NVML would show for this process."""
        return CUDA_CONTEXT_BYTES + self.reserved_bytes

    def device_free_bytes(self) -> int:
        others = sum(used for _, used in self.others_used())
        return max(
            0, self.device.total_bytes - self.device.base_used_bytes - others - self.used_bytes
        )

    # ---- allocation -------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> None:
        with self._lock:
            if nbytes <= self.cached_bytes:
                self.cached_bytes -= nbytes
            else:
                free = self.device_free_bytes()
                if nbytes > free:
                    if nbytes <= free + self.cached_bytes:
                        # torch frees its cached blocks and retries cudaMalloc once.
                        self.cached_bytes = 0
                    else:
                        self.num_ooms += 1
                        raise self._oom(nbytes, free)
            self.allocated_bytes += nbytes
            self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
            self._publish()

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.allocated_bytes = max(0, self.allocated_bytes - nbytes)
            self.cached_bytes += nbytes
            self._publish()

    def empty_cache(self) -> None:
        with self._lock:
            self.cached_bytes = 0
            self._publish()

    def _oom(self, nbytes: int, free: int) -> RuntimeError:
        cls = oom_exception_class()
        if self.async_backend:
            return cls("Allocation on device ")
        if _torch_version_tuple() < (2, 1):
            return cls(
                f"CUDA out of memory. Tried to allocate {format_size(nbytes)} (GPU 0; "
                f"{format_size(self.device.total_bytes)} total capacity; "
                f"{format_size(self.allocated_bytes)} already allocated; "
                f"{format_size(free)} free; {format_size(self.reserved_bytes)} reserved in total "
                "by PyTorch) If reserved memory is >> allocated memory try setting "
                "max_split_size_mb to avoid fragmentation.  See documentation for Memory "
                "Management and PYTORCH_CUDA_ALLOC_CONF"
            )
        procs = "".join(
            f"Process {pid} has {format_size(used)} memory in use. "
            for pid, used in self.others_used()
        )
        return cls(
            f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU 0 has a total "
            f"capacity of {format_size(self.device.total_bytes)} of which {format_size(free)} "
            f"is free. {procs}Including non-PyTorch memory, this process has "
            f"{format_size(self.used_bytes)} memory in use. Of the allocated memory "
            f"{format_size(self.allocated_bytes)} is allocated by PyTorch, and "
            f"{format_size(self.cached_bytes)} is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )

    def _publish(self) -> None:
        self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
        with contextlib.suppress(OSError):
            _atomic_write_json(
                self.root / f"proc-{self.pid}.json",
                {
                    "pid": self.pid,
                    "name": self.name,
                    "device_index": self.device.index,
                    "used_bytes": self.used_bytes,
                    "peak_bytes": self.peak_used_bytes,
                },
            )

    def remove_file(self) -> None:
        with contextlib.suppress(OSError):
            (self.root / f"proc-{self.pid}.json").unlink()

    def memory_summary(self) -> str:
        """A short facsimile of ``torch.cuda.memory_summary()``."""

        def mib(n: int) -> str:
            return f"{n // MIB:>7d} MiB"

        rule = "|" + "=" * 75 + "|"
        return "\n".join(
            [
                rule,
                "|                  PyTorch CUDA memory summary, device ID 0                 |",
                "|" + "-" * 75 + "|",
                f"|            CUDA OOMs: {self.num_ooms:<13d}|        cudaMalloc retries: 0         |",
                rule,
                "|        Metric         | Cur Usage  | Peak Usage |",
                "|" + "-" * 75 + "|",
                f"| Allocated memory      | {mib(self.allocated_bytes)} | {mib(self.peak_allocated_bytes)} |",
                f"| Reserved memory       | {mib(self.reserved_bytes)} | {mib(self.peak_used_bytes - CUDA_CONTEXT_BYTES)} |",
                rule,
            ]
        )


class GpuBlock:
    """``nbytes`` held on the fake GPU until the object is dropped (like a CUDA tensor)."""

    __slots__ = ("__weakref__", "nbytes")

    def __init__(self, cuda: FakeCuda, nbytes: int) -> None:
        cuda.alloc(nbytes)
        self.nbytes = nbytes
        weakref.finalize(self, cuda.free, nbytes)


class Device:
    """Where "tensors" go: the fake GPU, or host RAM with ``--cpu``."""

    def __init__(self, cuda: FakeCuda | None) -> None:
        self.cuda = cuda

    @property
    def is_gpu(self) -> bool:
        return self.cuda is not None

    def alloc(self, nbytes: int) -> Any:
        if self.cuda is not None:
            return GpuBlock(self.cuda, nbytes)
        return torch_cpu_alloc(nbytes)

    def empty_cache(self) -> None:
        if self.cuda is not None:
            self.cuda.empty_cache()


def choose_fake_device(root: Path) -> FakeDeviceSpec | None:
    """The device CUDA would call ``cuda:0``: the first of ``$CUDA_VISIBLE_DEVICES``."""
    devices = read_fake_devices(root)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        for item in wanted:
            for dev in devices:
                if str(dev.index) == item:
                    return dev
        return None
    return devices[0] if devices else None
