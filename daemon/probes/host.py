"""System RAM, swap and ComfyUI's process-tree RSS through psutil, cheaply enough to run every
second for days.

Why it is shaped this way:

- The sampler calls ``process_tree`` once a second (four times while a prompt runs). psutil's
  ``Process.children()`` builds a parent map by reading ``/proc/*/stat`` for *every* process on
  the machine, so on Linux the tree is walked through ``/proc/<pid>/task/<tid>/children``
  instead (a few small reads), with psutil as the fallback elsewhere.
- Processes vanish mid-walk (a helper exits, ComfyUI dies): a child that is gone is skipped; a
  root that is gone is ``None``.
- The peak RSS is the kernel's own high-water mark (``VmHWM`` in ``/proc/<pid>/status``), which
  catches spikes shorter than the sampling interval.
- Windows has no swap in the Linux sense but a commit limit (RAM + page files); when it is
  reached allocations fail. psutil does not expose it, so it is read with
  ``GlobalMemoryStatusEx`` (``ullTotalPageFile`` is the commit limit, ``ullAvailPageFile`` what is
  left of it). Elsewhere those fields stay ``None``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from oom_sentinel.daemon.probes.base import HostSample, ProcessTreeSample

__all__ = [
    "ProcessIdentity",
    "ProcessNameCache",
    "PsutilHostProbe",
    "commit_from_memory_status",
    "describe_process",
    "parse_children_file",
    "parse_status_kib",
]

log = logging.getLogger(__name__)

#: tree walks stop here: a cycle or a fork bomb must not hang the sampler
MAX_TREE_PROCESSES = 4096


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """What a pid is, for humans: ``name`` and ``cmdline`` are ``None`` when not readable."""

    pid: int
    name: str | None
    cmdline: tuple[str, ...] | None
    create_time_s: float | None = None


def describe_process(pid: int) -> ProcessIdentity:
    """Name and command line of ``pid``; never raises (gone or access denied read as ``None``)."""
    try:
        proc = psutil.Process(pid)
    except (psutil.Error, ValueError, OSError):
        return ProcessIdentity(pid, None, None)
    name: str | None = None
    cmdline: tuple[str, ...] | None = None
    create: float | None = None
    with contextlib.suppress(psutil.Error, OSError):
        create = proc.create_time()
    with contextlib.suppress(psutil.Error, OSError):
        name = proc.name() or None
    with contextlib.suppress(psutil.Error, OSError):
        cmdline = tuple(proc.cmdline()) or None
    return ProcessIdentity(pid, name, cmdline, create)


class ProcessNameCache:
    """Remembers :func:`describe_process` answers for the pids seen in the last lookup.

    GPU probes name the processes they list on every sample; the command line of a process
    does not change, so it is read once per (pid, start time). Pids not in the latest lookup
    are forgotten, so the cache never outgrows the process list.
    """

    def __init__(self, describe: Callable[[int], ProcessIdentity] = describe_process) -> None:
        self._describe = describe
        self._known: dict[int, ProcessIdentity] = {}
        self._lock = threading.Lock()

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        wanted = set(pids)
        with self._lock:
            out: dict[int, ProcessIdentity] = {}
            for pid in wanted:
                known = self._known.get(pid)
                if known is not None and known.name is not None and _same_start(pid, known):
                    out[pid] = known
                else:
                    out[pid] = self._describe(pid)
            self._known = out
            return dict(out)


def _same_start(pid: int, known: ProcessIdentity) -> bool:
    """Whether ``pid`` is still the process ``known`` describes (pids are reused)."""
    if known.create_time_s is None:
        return False
    try:
        return psutil.Process(pid).create_time() == known.create_time_s
    except (psutil.Error, OSError, ValueError):
        return False


# -- pure parsers -------------------------------------------------------------------------


def parse_status_kib(text: str, key: str) -> int | None:
    """The value of ``key`` (e.g. ``VmHWM``) in a ``/proc/<pid>/status`` text, in KiB."""
    prefix = key + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            parts = line[len(prefix) :].split()
            if parts and parts[0].isdigit():
                return int(parts[0])
            return None
    return None


def parse_children_file(text: str) -> list[int]:
    """Pids in a ``/proc/<pid>/task/<tid>/children`` file (space separated)."""
    return [int(tok) for tok in text.split() if tok.isdigit()]


def commit_from_memory_status(
    total_page_file_bytes: int, avail_page_file_bytes: int
) -> tuple[int | None, int | None]:
    """``(commit_limit_bytes, committed_bytes)`` from GlobalMemoryStatusEx's page-file fields."""
    if total_page_file_bytes <= 0:
        return None, None
    committed = max(0, total_page_file_bytes - avail_page_file_bytes)
    return total_page_file_bytes, committed


# -- the probe --------------------------------------------------------------------------


class PsutilHostProbe:
    """``HostProbe`` over psutil (and ``/proc`` on Linux). Never raises."""

    def __init__(self, *, procfs: str | os.PathLike[str] | None = None) -> None:
        self._procfs = Path(procfs) if procfs is not None else Path("/proc")
        # /proc/<pid>/task/<tid>/children exists only with CONFIG_PROC_CHILDREN; checked lazily
        self._use_children_files = sys.platform.startswith("linux") and self._procfs.is_dir()
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # -- HostProbe ----------------------------------------------------------------------
    def host(self) -> HostSample | None:
        try:
            vm = psutil.virtual_memory()
            sw = psutil.swap_memory()
        except (psutil.Error, OSError, RuntimeError) as exc:
            self._warn_once("host", f"cannot read system memory: {exc}")
            return None
        limit, committed = _windows_commit() if sys.platform == "win32" else (None, None)
        return HostSample(
            ram_total_bytes=int(vm.total),
            ram_available_bytes=int(vm.available),
            swap_total_bytes=int(sw.total),
            swap_used_bytes=int(sw.used),
            commit_limit_bytes=limit,
            committed_bytes=committed,
        )

    def process_tree(self, root_pid: int) -> ProcessTreeSample | None:
        try:
            root = psutil.Process(root_pid)
            if root.status() == psutil.STATUS_ZOMBIE:
                return None  # dead, its memory released; only the exit status is left
            root_rss = int(root.memory_info().rss)
        except (psutil.Error, OSError, ValueError):
            return None  # gone, or not ours to read
        total = root_rss
        count = 1
        for pid in self.descendants(root_pid, root):
            try:
                total += int(psutil.Process(pid).memory_info().rss)
                count += 1
            except (psutil.Error, OSError, ValueError):
                continue  # exited between the walk and the read
        return ProcessTreeSample(
            root_pid=root_pid,
            rss_bytes=total,
            peak_rss_bytes=self.peak_rss_bytes(root_pid),
            process_count=count,
        )

    # -- pieces the service may use on their own --------------------------------------------
    def peak_rss_bytes(self, pid: int) -> int | None:
        """The process's RSS high-water mark (Linux ``VmHWM``), or ``None`` elsewhere."""
        if not self._use_children_files:
            return None
        try:
            text = (self._procfs / str(pid) / "status").read_text("utf-8", "replace")
        except OSError:
            return None
        kib = parse_status_kib(text, "VmHWM")
        return None if kib is None else kib * 1024

    def descendants(self, root_pid: int, root: psutil.Process | None = None) -> list[int]:
        """Pids of every living descendant of ``root_pid`` (not including it)."""
        if self._use_children_files:
            found = self._descendants_procfs(root_pid)
            if found is not None:
                return found
        try:
            proc = root if root is not None else psutil.Process(root_pid)
            return [c.pid for c in proc.children(recursive=True)]
        except (psutil.Error, OSError, ValueError):
            return []

    def _descendants_procfs(self, root_pid: int) -> list[int] | None:
        out: list[int] = []
        seen = {root_pid}
        queue = [root_pid]
        while queue and len(out) < MAX_TREE_PROCESSES:
            pid = queue.pop()
            task_dir = self._procfs / str(pid) / "task"
            try:
                tids = os.listdir(task_dir)
            except FileNotFoundError:
                continue  # exited mid-walk
            except OSError:
                return None if pid == root_pid else out
            for tid in tids:
                try:
                    text = (task_dir / tid / "children").read_text("ascii", "replace")
                except FileNotFoundError:
                    if pid == root_pid and tid == str(root_pid):
                        # the kernel lacks CONFIG_PROC_CHILDREN (or the task just exited)
                        if not (task_dir / tid).exists():
                            continue
                        self._use_children_files = False
                        return None
                    continue
                except OSError:
                    continue
                for child in parse_children_file(text):
                    if child not in seen:
                        seen.add(child)
                        out.append(child)
                        queue.append(child)
        return out

    def _warn_once(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("%s", message)


def _windows_commit() -> tuple[int | None, int | None]:  # pragma: no cover - Windows only
    import ctypes
    from ctypes import wintypes

    class MEMORYSTATUSEX(ctypes.Structure):
        _fields_ = [
            ("dwLength", wintypes.DWORD),
            ("dwMemoryLoad", wintypes.DWORD),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    status = MEMORYSTATUSEX()
    status.dwLength = ctypes.sizeof(MEMORYSTATUSEX)
    try:
        ok = ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        return None, None
    if not ok:
        return None, None
    return commit_from_memory_status(int(status.ullTotalPageFile), int(status.ullAvailPageFile))
