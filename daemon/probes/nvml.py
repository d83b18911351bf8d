"""NVIDIA GPU memory, per device and per process, through NVML (the ``pynvml`` module of the
``nvidia-ml-py`` distribution), degrading to "no GPU data" instead of failing.

A watchdog runs for weeks, so the failures NVML has in the field are states here, not crashes
(the list follows nvitop's ``libnvml.py`` and gpustat's ``nvml.py``):

- **library not found / driver not loaded**: no NVIDIA driver; every query answers empty tuples.
- **RM version mismatch**: the driver was upgraded and the kernel module not reloaded — very
  common on unattended machines until the next reboot.
- **function not found**: the binding is newer than the driver; the call falls back to an
  older API version where one exists.
- **GPU is lost** (Xid 79, "fell off the bus"): that device reads as unknown and is reported.

Each reason is logged once (again only when it changes, or when NVML recovers), and NVML is
initialised again every ``retry_interval_s`` while it is down. Initialisation is lazy: nothing
touches the driver until the first query.

Values NVML cannot give are ``None``, never 0: "not supported", "no permission" and
``NVML_VALUE_NOT_AVAILABLE`` (per-process memory under Windows WDDM and WSL2, or MIG without
privileges) all read as ``None``.

Device memory uses the v2 API first (``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)``)
because on R510+ drivers the v1 ``used`` includes driver-reserved memory (the phantom
300–500 MiB of gpustat #141 / nvitop #13); drivers older than 515 lack it, so v1 is the
fallback, remembered per device. Per-process memory merges the compute and graphics lists,
each from the newest API version the driver exports (``_v3``, ``_v2``, then the unversioned v1).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProcessSample
from oom_sentinel.daemon.probes.host import ProcessNameCache

__all__ = [
    "DEFAULT_RETRY_INTERVAL_S",
    "NOT_AVAILABLE",
    "NvmlGpuProbe",
    "NvmlStatus",
    "describe_nvml_failure",
    "nvml_error_code",
]

log = logging.getLogger(__name__)

DEFAULT_RETRY_INTERVAL_S = 60.0

#: NVML_VALUE_NOT_AVAILABLE for unsigned long long fields (nvml.h: ``(unsigned long long)-1``)
NOT_AVAILABLE = 2**64 - 1

# nvml.h return codes. Part of the C ABI, so they never change; the module's own constants are
# read first and these are only the fallback for a binding that lacks one.
_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "LIB_RM_VERSION_MISMATCH": 18,
    "NO_DATA": 21,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "UNKNOWN": 999,
}

# These end the whole NVML session: no query can succeed until NVML is initialised again.
_FATAL = ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND", "LIB_RM_VERSION_MISMATCH")
# A field the device or driver does not offer: None, quietly.
_QUIET = ("NOT_SUPPORTED", "NO_PERMISSION", "NO_DATA", "NOT_FOUND")
# Why a v2 memory query may fail on a driver that only has v1.
_V2_MISSING = (
    "FUNCTION_NOT_FOUND",
    "ARGUMENT_VERSION_MISMATCH",
    "NOT_SUPPORTED",
    "INVALID_ARGUMENT",
)

_PROCESS_APIS: dict[str, tuple[str, ...]] = {
    "compute": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    "graphics": (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
}


def _code(nvml: Any, name: str) -> int:
    value = getattr(nvml, f"NVML_ERROR_{name}", None)
    return value if isinstance(value, int) else _CODES[name]


def nvml_error_code(exc: BaseException) -> int | None:
    """The NVML return code an ``NVMLError`` carries (``.value``), or ``None``."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _is(nvml: Any, exc: BaseException, *names: str) -> bool:
    code = nvml_error_code(exc)
    return code is not None and any(code == _code(nvml, n) for n in names)


def describe_nvml_failure(exc: BaseException | None, nvml: Any = None) -> str:
    """One line saying why NVML gives no data, and what usually fixes it."""
    if exc is None or isinstance(exc, ImportError):
        return "the pynvml module (distribution nvidia-ml-py) is not installed"
    if type(exc).__name__ == "NVMLLibraryMismatchError":
        return f"nvidia-ml-py does not match the NVIDIA driver ({exc})"
    if _is(nvml, exc, "LIBRARY_NOT_FOUND"):
        return "NVML library not found (no NVIDIA driver installed)"
    if _is(nvml, exc, "DRIVER_NOT_LOADED"):
        return "NVIDIA driver not loaded"
    if _is(nvml, exc, "LIB_RM_VERSION_MISMATCH"):
        return (
            "NVIDIA driver/library version mismatch (driver upgraded without a reboot?): "
            "reboot or reload the nvidia kernel module"
        )
    if _is(nvml, exc, "FUNCTION_NOT_FOUND"):
        return "an NVML function is missing: nvidia-ml-py is newer than the NVIDIA driver"
    if _is(nvml, exc, "NO_PERMISSION"):
        return "no permission to use NVML (can this user open /dev/nvidiactl?)"
    if _is(nvml, exc, "UNINITIALIZED"):
        return "NVML is not initialised"
    code = nvml_error_code(exc)
    suffix = f" (code {code})" if code is not None else ""
    return f"NVML error: {exc}{suffix}"


def _number(value: Any) -> int | None:
    """A byte count as NVML gives it; not-available markers read as ``None``."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    if number < 0 or number >= NOT_AVAILABLE:
        return None
    return number


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    """What the probe can say about NVML itself (for ``oom-sentinel status`` and start-up)."""

    #: "idle": not started yet; "ready"; "failed": no data, retrying; "closed"
    state: Literal["idle", "ready", "failed", "closed"]
    reason: str | None
    driver_version: str | None
    device_count: int | None
    #: indices of devices NVML reported as lost (Xid 79) since the last initialisation
    lost_devices: tuple[int, ...] = ()
    #: no NVML on this machine at all (module or library missing), as opposed to a driver
    #: that may still load or recover
    absent: bool = False


class _SessionGone(Exception):
    """NVML as a whole stopped answering during a query (carries the NVML error)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class NvmlGpuProbe:
    """``GpuProbe`` over NVML. Thread-safe; never raises; ``close()`` shuts NVML down."""

    backend = "nvml"

    def __init__(
        self,
        nvml: Any = None,
        *,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        names: ProcessNameCache | None = None,
    ) -> None:
        self._import_error: ImportError | None = None
        if nvml is None:
            try:
                import pynvml

                nvml = pynvml
            except ImportError as exc:
                self._import_error = exc
        self._nvml: Any = nvml
        self._retry_interval_s = retry_interval_s
        self._clock = clock
        self._names = names if names is not None else ProcessNameCache()
        self._lock = threading.RLock()
        self._state: Literal["idle", "ready", "failed", "closed"] = "idle"
        self._reason: str | None = None
        self._absent = False
        self._quiet = False
        self._logged_reason: str | None = None
        self._next_try = 0.0
        self._handles: list[tuple[int, Any]] = []
        self._driver_version: str | None = None
        self._use_v2: dict[int, bool] = {}
        self._process_api: dict[str, int] = {}
        self._lost: set[int] = set()
        self._noted: set[tuple[object, ...]] = set()

    # -- GpuProbe -----------------------------------------------------------------------
    def devices(self) -> tuple[GpuDeviceSample, ...]:
        with self._lock:
            if not self._ensure_ready():
                return ()
            try:
                return tuple(self._device_sample(i, h) for i, h in self._handles)
            except _SessionGone as gone:
                self._drop(gone.cause)
                return ()
            except Exception as exc:  # never let a binding surprise reach the sampler
                self._note_once(("unexpected", "devices"), logging.ERROR, exc, exc_info=True)
                return ()

    def processes(self) -> tuple[GpuProcessSample, ...]:
        with self._lock:
            if not self._ensure_ready():
                return ()
            try:
                usage = self._process_usage()
            except _SessionGone as gone:
                self._drop(gone.cause)
                return ()
            except Exception as exc:
                self._note_once(("unexpected", "processes"), logging.ERROR, exc, exc_info=True)
                return ()
        names = self._names.lookup(pid for _dev, pid in usage)
        return tuple(
            GpuProcessSample(
                pid=pid,
                device_index=dev,
                used_bytes=used,
                name=names[pid].name if pid in names else None,
                cmdline=names[pid].cmdline if pid in names else None,
            )
            for (dev, pid), used in sorted(usage.items())
        )

    def close(self) -> None:
        with self._lock:
            if self._state == "ready":
                self._shutdown()
            self._state = "closed"
            self._handles = []

    # -- extras -------------------------------------------------------------------------
    def start(self, *, report: bool = True) -> bool:
        """Initialise now rather than at the first query; ``True`` when NVML answers.

        With ``report=False`` a failure is not logged here (the caller reports
        ``status().reason`` in its own line); later failures with the same reason stay quiet.
        """
        with self._lock:
            self._quiet = not report
            try:
                return self._ensure_ready()
            finally:
                self._quiet = False

    def status(self) -> NvmlStatus:
        with self._lock:
            return NvmlStatus(
                state=self._state,
                reason=self._reason,
                driver_version=self._driver_version,
                device_count=len(self._handles) if self._state == "ready" else None,
                lost_devices=tuple(sorted(self._lost)),
                absent=self._absent,
            )

    # -- session ------------------------------------------------------------------------
    def _ensure_ready(self) -> bool:
        if self._state == "ready":
            return True
        if self._state == "closed":
            return False
        if self._nvml is None:
            self._fail(self._import_error)
            self._next_try = float("inf")  # installing a package needs a restart anyway
            return False
        if self._state == "failed" and self._clock() < self._next_try:
            return False
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self._fail(exc)
            return False
        self._lost = set()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles: list[tuple[int, Any]] = []
            for index in range(count):
                try:
                    handles.append((index, nvml.nvmlDeviceGetHandleByIndex(index)))
                except Exception as exc:
                    if _is(nvml, exc, *_FATAL):
                        raise
                    # one unreachable device (lost, or hidden by the device cgroup) must not
                    # hide the others: it is listed with unknown values
                    if _is(nvml, exc, "GPU_IS_LOST"):
                        self._lost.add(index)
                    self._note_once(("handle", index), logging.WARNING, exc)
                    handles.append((index, None))
        except Exception as exc:
            self._shutdown()
            self._fail(exc)
            return False
        self._handles = handles
        self._use_v2 = {}
        self._process_api = {}
        self._driver_version = None
        try:
            self._driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            self._driver_version = None
        recovered = self._state == "failed"
        self._state = "ready"
        self._reason = None
        self._absent = False
        self._logged_reason = None
        log.info(
            "NVML %s: %d device(s), driver %s",
            "available again" if recovered else "ready",
            len(handles),
            self._driver_version or "unknown",
        )
        return True

    def _fail(self, exc: BaseException | None) -> None:
        reason = describe_nvml_failure(exc, self._nvml)
        self._absent = (
            exc is None or isinstance(exc, ImportError) or _is(self._nvml, exc, "LIBRARY_NOT_FOUND")
        )
        self._state = "failed"
        self._reason = reason
        self._next_try = self._clock() + self._retry_interval_s
        if reason != self._logged_reason:
            self._logged_reason = reason
            if self._quiet:
                return
            log.warning(
                "no GPU data: %s; trying NVML again every %g s", reason, self._retry_interval_s
            )
        else:
            log.debug("NVML still unavailable: %s", reason)

    def _drop(self, exc: BaseException) -> None:
        """NVML stopped answering mid-session (driver unloaded or upgraded)."""
        self._shutdown()
        self._handles = []
        self._fail(exc)

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    # -- queries ------------------------------------------------------------------------
    def _guard(self, exc: BaseException, key: tuple[object, ...], device: int | None) -> None:
        """Decide what a failed query means: session gone (raise), device lost, or just None."""
        nvml = self._nvml
        if _is(nvml, exc, *_FATAL):
            raise _SessionGone(exc) from exc
        if _is(nvml, exc, "GPU_IS_LOST"):
            if device is not None and device not in self._lost:
                self._lost.add(device)
                log.error("GPU %s is lost (fell off the bus, Xid 79?): %s", device, exc)
            return
        level = logging.DEBUG if _is(nvml, exc, *_QUIET) else logging.WARNING
        self._note_once(key, level, exc)

    def _note_once(
        self, key: tuple[object, ...], level: int, exc: BaseException, exc_info: bool = False
    ) -> None:
        full = (*key, nvml_error_code(exc), type(exc).__name__)
        if full in self._noted:
            return
        self._noted.add(full)
        log.log(level, "NVML %s: %s", " ".join(str(k) for k in key), exc, exc_info=exc_info)

    def _device_sample(self, index: int, handle: Any) -> GpuDeviceSample:
        nvml = self._nvml
        if handle is None:
            return GpuDeviceSample(index, f"GPU {index}", None, None, None)
        name: str | None = None
        uuid: str | None = None
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
        except Exception as exc:
            self._guard(exc, ("name", index), index)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except Exception as exc:
            self._guard(exc, ("uuid", index), index)
        total = used = free = reserved = None
        try:
            total, used, free, reserved = self._memory(index, handle)
        except Exception as exc:
            self._guard(exc, ("memory", index), index)
        return GpuDeviceSample(
            index=index,
            name=name or f"GPU {index}",
            total_bytes=total,
            used_bytes=used,
            free_bytes=free,
            reserved_bytes=reserved,
            uuid=uuid,
        )

    def _memory(
        self, index: int, handle: Any
    ) -> tuple[int | None, int | None, int | None, int | None]:
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and self._use_v2.get(index, True):
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except TypeError:  # a binding whose function takes no version argument
                self._use_v2[index] = False
            except Exception as exc:
                if not _is(nvml, exc, *_V2_MISSING):
                    raise
                self._use_v2[index] = False
                log.debug("GPU %d: v2 memory info unavailable (%s); using v1", index, exc)
            else:
                self._use_v2[index] = True
                return (
                    _number(mem.total),
                    _number(mem.used),
                    _number(mem.free),
                    _number(getattr(mem, "reserved", None)),
                )
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        return _number(mem.total), _number(mem.used), _number(mem.free), None

    def _running(self, kind: str, handle: Any) -> Sequence[Any] | None:
        """One process list from the newest API version the driver exports; None: unknown."""
        nvml = self._nvml
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        chain = _PROCESS_APIS[kind]
        for position in range(self._process_api.get(kind, 0), len(chain)):
            func = getattr(nvml, chain[position], None)
            if func is None:
                continue
            try:
                procs = func(handle)
            except Exception as exc:
                if (mismatch is not None and isinstance(exc, mismatch)) or _is(
                    nvml, exc, "FUNCTION_NOT_FOUND"
                ):
                    continue
                raise
            self._process_api[kind] = position
            return list(procs or ())
        return None

    def _process_usage(self) -> dict[tuple[int, int], int | None]:
        usage: dict[tuple[int, int], int | None] = {}
        for index, handle in self._handles:
            if handle is None or index in self._lost:
                continue
            for kind in ("compute", "graphics"):
                try:
                    procs = self._running(kind, handle)
                except _SessionGone:
                    raise
                except Exception as exc:
                    self._guard(exc, (f"{kind} processes", index), index)
                    continue
                if procs is None:
                    self._note_once(
                        (f"{kind} processes", index),
                        logging.WARNING,
                        RuntimeError("no running-process API in this binding/driver"),
                    )
                    continue
                for proc in procs:
                    pid = _number(getattr(proc, "pid", None))
                    if pid is None or pid <= 0:
                        continue
                    used = _number(getattr(proc, "usedGpuMemory", None))
                    key = (index, pid)
                    if key in usage:
                        # listed as both compute and graphics: the same memory, not twice
                        before = usage[key]
                        used = before if used is None else max(used, before or 0)
                    usage[key] = used
        return usage
