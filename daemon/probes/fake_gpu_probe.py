"""The ``GpuProbe`` over a scripted fake-GPU directory (see ``fake_gpu.py``).

CI machines have no NVIDIA GPU, so tests and the stand-in ComfyUI publish "GPU usage" as files
and this probe reads them back. It answers exactly like the NVML probe — the same records, the
same ``None`` rules, never raising — and passes the same contract tests, so the service and the
bisect cannot tell which one they hold.
"""

from __future__ import annotations

import os
import threading

from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProcessSample
from oom_sentinel.daemon.probes.fake_gpu import FakeGpuDir
from oom_sentinel.daemon.probes.host import ProcessNameCache

__all__ = ["FakeGpuProbe"]


class FakeGpuProbe:
    """Reads a fake-GPU directory on every call (the files are tiny and change often)."""

    backend = "fake"

    def __init__(
        self,
        root: str | os.PathLike[str] | FakeGpuDir,
        *,
        names: ProcessNameCache | None = None,
    ) -> None:
        self.dir = root if isinstance(root, FakeGpuDir) else FakeGpuDir(root)
        self._names = names if names is not None else ProcessNameCache()
        self._closed = False
        self._lock = threading.Lock()

    def devices(self) -> tuple[GpuDeviceSample, ...]:
        with self._lock:
            if self._closed:
                return ()
        devices = self.dir.devices()
        if not devices:
            return ()
        used_by: dict[int, int] = {}
        for usage in self.dir.processes():
            used_by[usage.device_index] = used_by.get(usage.device_index, 0) + usage.used_bytes
        out: list[GpuDeviceSample] = []
        for dev in sorted(devices, key=lambda d: d.index):
            used = dev.base_used_bytes + used_by.get(dev.index, 0)
            out.append(
                GpuDeviceSample(
                    index=dev.index,
                    name=dev.name,
                    total_bytes=dev.total_bytes,
                    used_bytes=used,
                    free_bytes=max(0, dev.total_bytes - used),
                    reserved_bytes=None,
                    uuid=f"GPU-fake-{dev.index:08d}",
                )
            )
        return tuple(out)

    def processes(self) -> tuple[GpuProcessSample, ...]:
        with self._lock:
            if self._closed:
                return ()
        known = {d.index for d in self.dir.devices()}
        usages = [u for u in self.dir.processes() if u.device_index in known]
        names = self._names.lookup(u.pid for u in usages)
        out: list[GpuProcessSample] = []
        for usage in sorted(usages, key=lambda u: (u.device_index, u.pid)):
            ident = names.get(usage.pid)
            out.append(
                GpuProcessSample(
                    pid=usage.pid,
                    device_index=usage.device_index,
                    used_bytes=usage.used_bytes,
                    # the OS's view wins; the scripted name covers a process we may not read
                    name=(ident.name if ident else None) or usage.name or None,
                    cmdline=ident.cmdline if ident else None,
                )
            )
        return tuple(out)

    def close(self) -> None:
        with self._lock:
            self._closed = True
