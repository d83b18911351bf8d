"""The records every source produces and every consumer reads: what ran out, where, by how much.

They are frozen so they can be dict keys, set members and safely shared between threads
(the same reason watchdog's events are immutable). Unknown numbers are ``None``, never 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

__all__ = ["MERGED_FIELDS", "Backend", "OomEvent", "OtherProcess", "Pool", "unknown"]


class Pool(StrEnum):
    """Which memory pool ran out; the fix depends on it."""

    GPU = "gpu"  # device memory really was exhausted
    GPU_FRAGMENTATION = (
        "gpu-fragmentation"  # enough was free inside PyTorch's cache, but not contiguous
    )
    RAM = "ram"  # host RAM (DefaultCPUAllocator, MemoryError, numpy)
    SWAP_PAGEFILE = "swap-pagefile"  # Windows commit limit / paging file, os error 1455
    UNIFIED_MPS = "unified-mps"  # Apple unified memory through the MPS backend
    KILLED_BY_OS = (
        "killed-by-os"  # the kernel OOM killer, systemd-oomd, earlyoom or nohang killed ComfyUI
    )


class Backend(StrEnum):
    CUDA = "cuda"
    ROCM = "rocm"
    MPS = "mps"
    XPU = "xpu"
    DIRECTML = "directml"
    CPU = "cpu"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class OtherProcess:
    """A process the OOM message (or NVML) says was holding GPU memory."""

    pid: int
    bytes: int | None


@dataclass(frozen=True, slots=True)
class OomEvent:
    """One out-of-memory observation, from a log record, an API error or a process death.

    ``recovered`` is True for ComfyUI's soft OOMs (tiled-VAE retry, split-attention retries):
    they are counted as an early warning, never alarmed on their own.
    """

    pool: Pool
    backend: Backend
    recovered: bool
    #: the line or exception message the event was read from (first line, trimmed)
    message: str
    exception_type: str | None = None
    node_type: str | None = None
    node_id: str | None = None
    gpu_index: int | None = None
    requested_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    #: everything PyTorch had reserved (older torch prints this instead of the unallocated part)
    reserved_bytes: int | None = None
    #: this process's whole GPU use, non-PyTorch memory included (torch ≥ 2.1 messages)
    process_used_bytes: int | None = None
    other_processes: tuple[OtherProcess, ...] = ()
    #: the message shows another process holding GPU memory: named by PID ("Process 1234 has
    #: …"), or implied (total − free − this process's use is large)
    other_process_named: bool = False
    mps_allocated_bytes: int | None = None
    mps_other_bytes: int | None = None
    mps_max_allowed_bytes: int | None = None
    #: for killed-by-os: who killed it ("kernel", "systemd-oomd", "earlyoom", "nohang") and the victim
    killer: str | None = None
    killed_pid: int | None = None
    #: short machine name of the rule that matched, for tests and debugging
    rule: str = ""
    #: how many identical consecutive observations this event stands for (soft-OOM storms)
    count: int = 1
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the documented field names (see README, `diagnose --json`)."""
        data = asdict(self)
        data["pool"] = str(self.pool)
        data["backend"] = str(self.backend)
        data["other_processes"] = [{"pid": p.pid, "bytes": p.bytes} for p in self.other_processes]
        data["extra"] = dict(self.extra)
        return data


#: What merging two observations of one failure decides itself rather than filling in: the
#: verdict (pool, recovered), whether another process is implied (or-ed), and bookkeeping.
_NOT_MERGED = frozenset({"pool", "recovered", "other_process_named", "rule", "count", "extra"})
#: The fields of ``OomEvent`` that are facts a text showed or did not (``unknown``). Where two
#: observations of one failure are merged (classify's folding of one log's records, the
#: incident tracker's sources) each of these comes from whichever observation knows it.
#: Derived from the dataclass, so a field added to ``OomEvent`` is merged without anyone
#: listing it (two hand-kept lists once drifted apart and dropped ``reserved_bytes`` and
#: ``process_used_bytes``).
MERGED_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(OomEvent) if f.name not in _NOT_MERGED
)


def unknown(value: object) -> bool:
    """True for a fact the observation did not show: ``None``, an empty message or tuple, or
    ``Backend.UNKNOWN``."""
    return value is None or value == "" or value == () or value is Backend.UNKNOWN
