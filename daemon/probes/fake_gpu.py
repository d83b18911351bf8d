"""A scripted stand-in for an NVIDIA GPU, driven by files, for machines without one.

The real thing (NVML) cannot exist on CI, so tests and the stand-in ComfyUI share this small
file protocol instead; the probe that reads it sits behind the same ``GpuProbe`` interface as
the NVML adapter.

Layout of a fake-GPU directory (``$OOM_SENTINEL_FAKE_GPU`` names it):

    devices.json        {"devices": [{"index": 0, "name": "Fake RTX 4090", "total_bytes": N,
                                      "base_used_bytes": M}]}
                        base_used_bytes: memory used by "the display / other apps" that no
                        process file accounts for (optional, default 0).
    proc-<pid>.json     {"pid": P, "name": "python", "device_index": 0, "used_bytes": N,
                         "peak_bytes": N}   -- one file per process, written only by that process

Each process writes only its own file, with write-to-temp + ``os.replace``, so no locking is
needed and a reader never sees half a file. Files of processes that no longer exist are
ignored by readers (and removed by ``FakeGpuDir.cleanup_dead``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from oom_sentinel.daemon.core.atomic import write_json_atomic

__all__ = ["ENV_FAKE_GPU", "FakeDevice", "FakeGpuDir", "FakeProcessUsage"]

ENV_FAKE_GPU = "OOM_SENTINEL_FAKE_GPU"


@dataclass(frozen=True, slots=True)
class FakeDevice:
    index: int
    name: str
    total_bytes: int
    base_used_bytes: int = 0


@dataclass(frozen=True, slots=True)
class FakeProcessUsage:
    pid: int
    name: str
    device_index: int
    used_bytes: int
    peak_bytes: int


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    # A zombie still answers signal 0; treat it as gone (its memory is released).
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class FakeGpuDir:
    """Reads and writes one fake-GPU directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # -- set-up (tests) -------------------------------------------------------------------
    def create(self, devices: list[FakeDevice]) -> FakeGpuDir:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            self.root / "devices.json",
            {
                "devices": [
                    {
                        "index": d.index,
                        "name": d.name,
                        "total_bytes": d.total_bytes,
                        "base_used_bytes": d.base_used_bytes,
                    }
                    for d in devices
                ]
            },
        )
        return self

    # -- reading (the probe) --------------------------------------------------------------
    def devices(self) -> list[FakeDevice]:
        """The scripted devices; an unreadable or malformed file reads as no devices."""
        try:
            data = json.loads((self.root / "devices.json").read_text("utf-8"))
            return [
                FakeDevice(
                    index=int(d["index"]),
                    name=str(d.get("name", f"Fake GPU {d['index']}")),
                    total_bytes=int(d["total_bytes"]),
                    base_used_bytes=int(d.get("base_used_bytes", 0)),
                )
                for d in data.get("devices", [])
            ]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []

    def processes(self) -> list[FakeProcessUsage]:
        """Usage of every live process that has written a file."""
        out: list[FakeProcessUsage] = []
        for path in self._proc_files():
            try:
                data = json.loads(path.read_text("utf-8"))
                usage = FakeProcessUsage(
                    pid=int(data["pid"]),
                    name=str(data.get("name", "")),
                    device_index=int(data.get("device_index", 0)),
                    used_bytes=int(data.get("used_bytes", 0)),
                    peak_bytes=int(data.get("peak_bytes", data.get("used_bytes", 0))),
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if _pid_alive(usage.pid):
                out.append(usage)
        return out

    def used_bytes(self, device_index: int) -> int:
        base = next((d.base_used_bytes for d in self.devices() if d.index == device_index), 0)
        return base + sum(p.used_bytes for p in self.processes() if p.device_index == device_index)

    def cleanup_dead(self) -> None:
        for path in self._proc_files():
            with contextlib.suppress(ValueError, OSError):
                if not _pid_alive(int(path.stem.split("-", 1)[1])):
                    path.unlink()

    def _proc_files(self) -> Iterator[Path]:
        try:
            yield from sorted(self.root.glob("proc-*.json"))
        except OSError:
            return

    # -- writing (the process that "uses" the GPU) ----------------------------------------
    def report(self, usage: FakeProcessUsage) -> None:
        """Publish this process's usage (only ever for ``os.getpid()`` in real use)."""
        write_json_atomic(
            self.root / f"proc-{usage.pid}.json",
            {
                "pid": usage.pid,
                "name": usage.name,
                "device_index": usage.device_index,
                "used_bytes": usage.used_bytes,
                "peak_bytes": usage.peak_bytes,
            },
        )

    def free_bytes(self, device_index: int) -> int | None:
        dev = next((d for d in self.devices() if d.index == device_index), None)
        if dev is None:
            return None
        return max(0, dev.total_bytes - self.used_bytes(device_index))
