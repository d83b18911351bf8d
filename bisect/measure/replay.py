"""One measurement: start a fresh ComfyUI from the workspace, replay the prompt, record the
peaks, and say what happened — ok, oom, skip or timeout.

Why a fresh process every time: ComfyUI caches node outputs and loaded models between prompts,
so a second run of the same prompt in one process measures almost nothing. A start costs
seconds on a real install, which is why the search is logarithmic and why a measurement stops
as soon as its verdict is certain.

The steps (comfyui-facts.md 1.11, DESIGN §4):

1. ``Workspace.launch`` gives the command line for the checked-out commit (the user's memory
   flags filtered to those the commit knows, a free port on 127.0.0.1, the workspace's own
   directories). It is started through ``bootstrap.py`` in ComfyUI's interpreter, in its own
   process group, with its console going to a file (a pipe could fill and block it).
2. Wait for ``GET /system_stats``; a process that exits first "won't start" (a skip, with its
   exit status and last console lines).
3. ``ComfyClient.run_prompt``: the websocket opens with our ``clientId`` before the POST, and
   the run ends at ``executing`` with ``node: null``, or a hard timeout.
4. Meanwhile a sampler thread reads, every ``sample_interval_s`` (100 ms by default), the GPU
   probe's per-process memory for the whole process tree (NVML, or the fake GPU in tests), the
   tree's RSS and the root's ``VmHWM`` (the kernel's own high-water mark, which no sampling
   interval can miss), and the bootstrap's report of torch's exact peak counters. Once a
   running peak crosses the threshold the verdict is certain: the run stops there.
5. The process group is always killed: SIGTERM (the bootstrap writes its final report), then
   SIGKILL after a grace period — also on Ctrl-C, on errors, and at interpreter exit.
6. It also dies when ``oom-bisect`` dies without running any of that (SIGKILL, SIGHUP from an
   SSH drop): on Linux the server is started with ``PR_SET_PDEATHSIG`` = SIGKILL. That signal
   follows the *thread* that forked, not the process, so every server is forked by the main
   thread or by one spawner thread that lives as long as ``oom-bisect`` (a measurement on a
   short-lived worker thread would otherwise kill its server when that thread ends). On Windows the server is put
   in a Job object with ``KILL_ON_JOB_CLOSE``, whose handle only this process holds. And the
   server's pid and start time (with ours) are written to ``harness/replay.json``: a later
   ``oom-bisect`` kills a server left by a dead one (``kill_leftover_replay``) -- the start
   time makes sure a recycled pid is never killed.

What counts as the VRAM peak: torch's ``max_memory_reserved`` (summed over devices) when the
bootstrap could read it — exact, and what the allocator really held — else the sampled NVML
per-process peak. Both are kept in ``Peaks``; the report shows both. RAM: the larger of the
sampled tree RSS and the root's ``VmHWM``.

The mapping from what the server did to an ``Outcome`` is a pure function
(``outcome_from_run``), tested with tables.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import ctypes
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from oom_sentinel.bisect.measure.forkclient import (
    ForkedChild,
    ProcessHandle,
    fork_server_for,
    learn_imports,
    learned_imports,
)
from oom_sentinel.bisect.measure.leak import variation, varied_prompt
from oom_sentinel.bisect.measure.procutil import pdeathsig_preexec, signals_deferred
from oom_sentinel.bisect.measure.workspace import LaunchSpec, Workspace
from oom_sentinel.bisect.search.verdict import Ok, Oom, Outcome, Skip, Threshold, Timeout
from oom_sentinel.daemon.classify import classify_execution_error, classify_record
from oom_sentinel.daemon.comfy.api import ComfyClient, PostResult, RunOutcome
from oom_sentinel.daemon.core.atomic import write_json_atomic, write_text_atomic
from oom_sentinel.daemon.core.errors import ComfyError
from oom_sentinel.daemon.probes.base import GpuProbe, HostProbe

__all__ = [
    "BOOTSTRAP_NAME",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "Measurement",
    "Peaks",
    "ReplaySettings",
    "Replayer",
    "input_files",
    "kill_all_children",
    "kill_leftover_replay",
    "outcome_from_run",
    "reject_reason",
]

#: a prompt that runs longer than this is a timeout (a real video workflow can take many minutes)
DEFAULT_TIMEOUT_S = 1800.0
#: a real ComfyUI with many custom nodes can take minutes to import them all
DEFAULT_START_TIMEOUT_S = 600.0
#: between SIGTERM and SIGKILL; the bootstrap answers SIGTERM at once
STOP_GRACE_S = 5.0
#: how often /system_stats is asked while ComfyUI starts (its latency is pure overhead)
READY_POLL_S = 0.05
BOOTSTRAP_NAME = "oom_bisect_bootstrap.py"
BOOTSTRAP_SOURCE = Path(__file__).parent / "bootstrap.py"
#: console lines kept for a skip reason / the report
TAIL_LINES = 15
#: Popen.returncode of a SIGKILL we did not send (the kernel OOM killer, systemd-oomd …)
_KILLED = (-9, 137)
_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)
#: the running server's pid and start time, and ours, in the workspace's harness folder
REPLAY_RECORD = "replay.json"
#: psutil start times of one process agree to this (they are computed from clock ticks)
_START_TIME_TOLERANCE_S = 0.05

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Peaks:
    """The high-water marks of one run; None: not measured (never 0 for unknown)."""

    #: NVML (or the fake GPU) per-process use of the whole tree, sampled
    nvml_vram_bytes: int | None = None
    #: torch's exact counters, summed over devices (only with torch and CUDA in ComfyUI)
    torch_reserved_bytes: int | None = None
    torch_allocated_bytes: int | None = None
    #: process-tree RSS, sampled
    tree_rss_bytes: int | None = None
    #: the root process's VmHWM (Linux): its exact RSS high-water mark
    hwm_bytes: int | None = None

    @property
    def vram_bytes(self) -> int | None:
        """The VRAM peak a verdict uses: torch's reserved peak when known, else NVML's."""
        return self.torch_reserved_bytes if self.torch_reserved_bytes else self.nvml_vram_bytes

    @property
    def ram_bytes(self) -> int | None:
        known = [v for v in (self.tree_rss_bytes, self.hwm_bytes) if v is not None]
        return max(known) if known else None

    def to_json(self) -> dict[str, Any]:
        return {
            "vram_bytes": self.vram_bytes,
            "ram_bytes": self.ram_bytes,
            "nvml_vram_bytes": self.nvml_vram_bytes,
            "torch_reserved_bytes": self.torch_reserved_bytes,
            "torch_allocated_bytes": self.torch_allocated_bytes,
            "tree_rss_bytes": self.tree_rss_bytes,
            "hwm_bytes": self.hwm_bytes,
        }


@dataclass(frozen=True)
class Measurement:
    """One ComfyUI run: the outcome the verdict uses and everything a report shows."""

    outcome: Outcome
    peaks: Peaks
    #: the classified OOM (``OomEvent.to_json()``) when there was one
    oom_event: Mapping[str, Any] | None = None
    #: the server's exit status (None: still running when we stopped it, or never started)
    exit_code: int | None = None
    stopped_by_harness: bool = False
    #: the run was stopped because a running peak crossed the threshold
    stopped_early: bool = False
    console_tail: tuple[str, ...] = ()
    #: the user's flags this commit did not get, with why
    dropped_flags: tuple[tuple[str, str], ...] = ()
    argv: tuple[str, ...] = ()
    #: prepare_s (spec, bootstrap, spawn), ready_s (spawn to /system_stats), prompt_s,
    #: teardown_s (stop signal to reaped)
    timings: Mapping[str, float] = field(default_factory=dict)
    #: torch's allocator history saved at the OOM (a pickle for pytorch.org/memory_viz)
    allocator_history: str | None = None
    #: what the bootstrap said about torch (version, backend, the VRAM cap, errors)
    torch: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    #: each executed node's peaks, from the bootstrap's wrapped ``execution.execute``:
    #: ``{node_id, class_type, peak_vram_bytes, peak_ram_bytes}`` in execution order
    node_peaks: tuple[Mapping[str, Any], ...] = ()
    #: leak mode: the running peaks after each queued run (``Peaks.to_json()`` each)
    run_peaks: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        from oom_sentinel.bisect.session.files import outcome_to_json

        return {
            "outcome": outcome_to_json(self.outcome),
            "peaks": self.peaks.to_json(),
            "oom_event": None if self.oom_event is None else dict(self.oom_event),
            "exit_code": self.exit_code,
            "stopped_by_harness": self.stopped_by_harness,
            "stopped_early": self.stopped_early,
            "console_tail": list(self.console_tail),
            "dropped_flags": [list(d) for d in self.dropped_flags],
            "timings": dict(self.timings),
            "allocator_history": self.allocator_history,
            "torch": None if self.torch is None else dict(self.torch),
            "notes": list(self.notes),
            "node_peaks": [dict(n) for n in self.node_peaks],
            "run_peaks": [dict(r) for r in self.run_peaks],
        }


def node_peaks_of(report: Mapping[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """The bootstrap report's per-node peaks, well-formed entries only."""
    nodes = ((report or {}).get("nodes") or {}).get("peaks") or []
    out = []
    for n in nodes if isinstance(nodes, list) else []:
        if not isinstance(n, Mapping) or "node_id" not in n:
            continue
        out.append(
            {
                "node_id": str(n["node_id"]),
                "class_type": str(n.get("class_type") or "?"),
                "peak_vram_bytes": _int_or_none(n.get("peak_vram_bytes")),
                "peak_ram_bytes": _int_or_none(n.get("peak_ram_bytes")),
                # still running when the run was stopped: its peak so far
                "partial": bool(n.get("partial", False)),
            }
        )
    return tuple(out)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ReplaySettings:
    """How every measurement of a session runs (fixed for the session)."""

    #: ComfyUI's interpreter
    python: str
    #: the user's launch flags (filtered per commit by ``Workspace.launch``)
    user_flags: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    sample_interval_s: float = 0.1
    #: cap torch's allocator at this many bytes per device (``--vram-budget``)
    vram_budget_bytes: int | None = None
    #: keep torch's allocator history for an OOM (costs a little speed while recording)
    record_history: bool = True
    #: extra environment for ComfyUI (on top of ours)
    env: Mapping[str, str] = field(default_factory=dict)
    #: leak mode (``--runs-per-state``): queue the workflow this many times in one server
    runs_per_state: int = 1
    #: ``--history-with-native-allocator``'s replay: torch's native allocator
    #: (``--disable-cuda-malloc``) so its allocator history can be recorded, for the history
    #: only (cudaMallocAsync, ComfyUI's default, has none)
    native_allocator: bool = False
    stop_grace_s: float = STOP_GRACE_S
    #: fork each ComfyUI from a preloaded interpreter (``forkclient``); cold where unsafe
    fork_server: bool = False


# --------------------------------------------------------------------------- pure mapping


def reject_reason(post: PostResult) -> str:
    """Why ComfyUI refused the prompt, in words a skip line can carry."""
    err = post.error or {}
    etype = err.get("type")
    message = str(err.get("message") or "").strip()
    if etype == "invalid_prompt" or etype == "missing_node_type":
        if "does not exist" in message or etype == "missing_node_type":
            return f"unknown node: {message}"
        return f"invalid prompt: {message}"
    node_lines = []
    missing = []
    for node_id, entry in sorted(post.node_errors.items()):
        if not isinstance(entry, Mapping):
            continue
        cls = entry.get("class_type") or "?"
        for e in entry.get("errors") or []:
            if not isinstance(e, Mapping):
                continue
            text = f"{cls} #{node_id}: {e.get('message')}"
            if e.get("details"):
                text += f" ({str(e.get('details')).splitlines()[0][:160]})"
            if e.get("type") == "value_not_in_list":
                missing.append(text)
            else:
                node_lines.append(text)
    if missing:
        return "missing model or input file: " + "; ".join(missing[:3])
    if node_lines:
        return "invalid prompt: " + "; ".join(node_lines[:3])
    return f"invalid prompt: {post.describe()}"


def _first_line(text: Any) -> str:
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _oom_from_console(tail: Sequence[str]) -> Any:
    """An unrecovered OOM in the last console lines (a crash on the way out), or None."""
    text = "\n".join(tail)
    event = classify_record(text)
    return event if event is not None and not event.recovered else None


def outcome_from_run(
    run: RunOutcome | None,
    *,
    peaks: Peaks,
    exit_code: int | None,
    killed_by_harness: bool,
    console_tail: Sequence[str] = (),
    start_failure: str | None = None,
) -> tuple[Outcome, Mapping[str, Any] | None]:
    """What a run means for the bisect, and the OOM event that shows it (if any).

    ``run`` is None when the server never became ready (``start_failure`` says how).
    A partial replay (HTTP 200 with ``node_errors``: ComfyUI dropped the failing outputs) is
    a skip: measuring part of the workflow would compare unlike things.
    ``killed_by_harness`` is True only when our own SIGKILL ended the server.
    """
    vram, ram = peaks.vram_bytes, peaks.ram_bytes
    killed_outside = exit_code in _KILLED and not killed_by_harness

    def killed_oom() -> tuple[Outcome, Mapping[str, Any] | None]:
        evidence = (
            "ComfyUI was killed by SIGKILL it did not send itself "
            "(the kernel OOM killer, systemd-oomd or earlyoom)"
        )
        return Oom(evidence, "killed-by-os", vram, ram), None

    if run is None:
        if killed_outside:
            return killed_oom()
        event = _oom_from_console(console_tail) if exit_code is not None else None
        if event is not None:
            return Oom(event.message, str(event.pool), vram, ram), event.to_json()
        last = _first_line(console_tail[-1]) if console_tail else ""
        why = start_failure or "it did not become ready"
        return Skip(f"won't start: {why}" + (f": {last}" if last else "")), None

    if run.kind == "success":
        if run.post is not None and run.post.node_errors:
            return Skip("partial replay: " + reject_reason(run.post)), None
        return Ok(vram, ram, duration_s=round(run.elapsed_s, 3)), None
    if run.kind == "rejected":
        return Skip(reject_reason(run.post) if run.post else "prompt refused"), None
    if run.kind == "error":
        payload = run.error or {}
        event = classify_execution_error(payload)
        if event is not None and not event.recovered:
            etype = payload.get("exception_type") or event.exception_type or ""
            evidence = f"{etype}: {event.message}" if etype else event.message
            return Oom(evidence, str(event.pool), vram, ram), event.to_json()
        node = payload.get("node_type") or "?"
        where = f"{node} (node {payload.get('node_id')})" if payload.get("node_id") else node
        etype = payload.get("exception_type") or "error"
        return Skip(
            f"unrelated exception in {where}: {etype}: {_first_line(payload.get('exception_message'))}"
        ), None
    if run.kind == "interrupted":
        return Skip("the prompt was interrupted by someone else"), None
    if run.kind == "timeout":
        return Timeout(round(run.elapsed_s, 3), vram, ram), None
    # crashed: the server went away with no terminal event
    if killed_outside:
        return killed_oom()
    event = _oom_from_console(console_tail)
    if event is not None:
        return Oom(event.message, str(event.pool), vram, ram), event.to_json()
    last = _first_line(console_tail[-1]) if console_tail else ""
    status = "unknown" if exit_code is None else str(exit_code)
    return Skip(f"ComfyUI crashed (exit status {status})" + (f": {last}" if last else "")), None


# --------------------------------------------------------------------------- processes


_live: dict[int, ProcessHandle] = {}
_live_lock = threading.Lock()


class _Spawner:
    """Forks every replay server from a thread that lives as long as this process, so that
    the parent-death signal fires when ``oom-bisect`` dies and not when the thread that
    happened to ask for the server ends: the main thread itself (it ends only when the
    process does), else one spawner thread started on first use -- so a process that never
    measures off its main thread stays single-threaded (``classify`` forks scan workers only
    then). The ``Popen`` is registered in ``_live`` where it is made."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[
            tuple[concurrent.futures.Future[subprocess.Popen[bytes]], list[str], dict[str, Any]]
        ] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if threading.current_thread() is threading.main_thread():
            return self._start(argv, kwargs)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="replay-spawner", daemon=True
                )
                self._thread.start()
        future: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        self._jobs.put((future, argv, kwargs))
        return future.result()

    @staticmethod
    def _start(argv: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
        with signals_deferred():  # a Ctrl-C during the fork must not vanish (procutil)
            proc = subprocess.Popen(argv, **kwargs)
            with _live_lock:
                _live[proc.pid] = proc
        return proc

    def _main(self) -> None:
        while True:
            future, argv, kwargs = self._jobs.get()
            try:
                proc = self._start(argv, kwargs)
            except BaseException as exc:  # handed to the asking thread
                future.set_exception(exc)
                continue
            future.set_result(proc)


_spawner = _Spawner()


class _BasicLimits(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", ctypes.c_uint32),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", ctypes.c_uint32),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", ctypes.c_uint32),
        ("SchedulingClass", ctypes.c_uint32),
    ]


class _IoCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("r", "w", "o", "rb", "wb", "ob")]


class JobExtendedLimits(ctypes.Structure):
    """``JOBOBJECT_EXTENDED_LIMIT_INFORMATION``."""

    _fields_ = [
        ("BasicLimitInformation", _BasicLimits),
        ("IoInfo", _IoCounters),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000


def _last_error() -> int:
    get = getattr(ctypes, "get_last_error", None)  # Windows only
    return int(get()) if get is not None else 0


JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9


class KillOnCloseJob:
    """A Windows Job object that kills its processes when its last handle closes -- which is
    when this process ends, however it ends, since only we hold the handle. ``kernel32`` is
    ``ctypes.WinDLL("kernel32")`` on Windows (a recording fake in the tests)."""

    def __init__(self, kernel32: Any) -> None:
        self.kernel32 = kernel32
        self.handle: Any = None

    def _create(self) -> Any:
        k = self.kernel32
        handle = k.CreateJobObjectW(None, None)
        if not handle:
            raise OSError(f"CreateJobObjectW failed ({_last_error()})")
        info = JobExtendedLimits()
        info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
        if not k.SetInformationJobObject(
            handle,
            JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
            ctypes.byref(info),
            ctypes.sizeof(info),
        ):
            k.CloseHandle(handle)
            raise OSError(f"SetInformationJobObject failed ({_last_error()})")
        return handle

    def assign(self, process_handle: int) -> None:
        """Put a started process in the job (created on first use, kept for our lifetime)."""
        if self.handle is None:
            self.handle = self._create()
        if not self.kernel32.AssignProcessToJobObject(self.handle, process_handle):
            raise OSError(f"AssignProcessToJobObject failed ({_last_error()})")


_job: KillOnCloseJob | None = None


def _windows_job() -> KillOnCloseJob:  # pragma: no cover - Windows only
    global _job
    if _job is None:
        _job = KillOnCloseJob(ctypes.WinDLL("kernel32", use_last_error=True))  # type: ignore[attr-defined]
    return _job


# -- the record of the running server, for a later oom-bisect ------------------------------------


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def _same_process(pid: Any, start: Any) -> bool:
    """``pid`` runs now and started at ``start`` (so it is not a recycled pid)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, int | float):
        return False
    now = _start_time(pid)
    return now is not None and abs(now - float(start)) <= _START_TIME_TOLERANCE_S


def _record_path(workspace_root: Path) -> Path:
    return workspace_root / "harness" / REPLAY_RECORD


def _write_record(workspace_root: Path, proc: ProcessHandle) -> None:
    record = {
        "pid": proc.pid,
        "start_time_s": _start_time(proc.pid),
        "owner_pid": os.getpid(),
        "owner_start_time_s": _start_time(os.getpid()),
    }
    try:
        write_json_atomic(_record_path(workspace_root), record)
    except OSError as exc:
        log.warning("could not record the replay server's pid: %s", exc)


def _clear_record(workspace_root: Path, pid: int) -> None:
    path = _record_path(workspace_root)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text("utf-8")).get("pid") == pid:
            path.unlink()


def kill_leftover_replay(workspace_root: Path) -> int | None:
    """Kill the replay server an earlier ``oom-bisect`` left running in this workspace, if
    it still runs (same pid *and* start time) and the ``oom-bisect`` that started it does
    not; returns its pid, or None when there was nothing to kill."""
    path = _record_path(workspace_root)
    try:
        record = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    pid = record.get("pid")
    if _same_process(record.get("owner_pid"), record.get("owner_start_time_s")):
        return None  # its oom-bisect is alive: the server is in use
    killed = None
    if _same_process(pid, record.get("start_time_s")):
        assert isinstance(pid, int)
        import psutil

        with contextlib.suppress(psutil.Error, OSError):
            victim = psutil.Process(pid)
            if os.name != "nt" and os.getpgid(pid) == pid:
                os.killpg(pid, _SIGKILL)  # its process group: helpers too
            else:
                victim.kill()
            victim.wait(timeout=10)
            killed = pid
            log.info("killed ComfyUI pid %d left running by an earlier oom-bisect", pid)
    with contextlib.suppress(OSError):
        path.unlink()
    return killed


def _signal_group(proc: ProcessHandle, sig: int) -> None:
    if os.name == "nt":  # pragma: no cover - no process groups; the tree goes with the root
        with contextlib.suppress(OSError):
            proc.kill()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop(proc: ProcessHandle, grace_s: float) -> bool:
    """SIGTERM the group, SIGKILL what is left after ``grace_s``, reap; always kills the group.

    True when the root needed our SIGKILL. Only then is a -9 exit ours: a server that the
    kernel OOM killer is still tearing down (its socket already closed, not yet a zombie)
    also looks alive to ``poll()``, takes our SIGTERM, and still exits -9.
    """
    escalated = False
    try:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        escalated = proc.poll() is None
        _signal_group(proc, _SIGKILL)  # helpers the root left behind, too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    finally:
        with _live_lock:
            _live.pop(proc.pid, None)
    return escalated


def _stop_recorded(workspace_root: Path, proc: ProcessHandle, grace_s: float) -> bool:
    """``_stop``, then forget the record of the server (it is gone)."""
    try:
        return _stop(proc, grace_s)
    finally:
        _clear_record(workspace_root, proc.pid)


def kill_all_children() -> None:
    """SIGKILL every ComfyUI process group this process started and has not reaped."""
    with _live_lock:
        procs = list(_live.values())
    for proc in procs:
        _signal_group(proc, _SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
        with _live_lock:
            _live.pop(proc.pid, None)


atexit.register(kill_all_children)


def _tail(path: Path, lines: int = TAIL_LINES) -> tuple[str, ...]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ()
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return tuple(kept[-lines:])


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _torch_peaks(report: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    if not report:
        return None, None
    devices = (report.get("torch") or {}).get("devices") or []
    if not devices:
        return None, None
    reserved = sum(int(d.get("max_reserved_bytes") or 0) for d in devices)
    allocated = sum(int(d.get("max_allocated_bytes") or 0) for d in devices)
    return (reserved or None), (allocated or None)


class _Sampler(threading.Thread):
    """Running peaks of one process tree; sets ``crossed`` once a peak passes the threshold."""

    def __init__(
        self,
        pid: int,
        gpu: GpuProbe | None,
        host: HostProbe,
        report_path: Path,
        interval_s: float,
        threshold: Threshold | None,
    ) -> None:
        super().__init__(name=f"oom-bisect-sampler-{pid}", daemon=True)
        self.pid = pid
        self.gpu = gpu
        self.host = host
        self.report_path = report_path
        self.interval_s = interval_s
        self.threshold = threshold
        self.stop_event = threading.Event()
        self.crossed = threading.Event()
        self.lock = threading.Lock()
        self.nvml: int | None = None
        self.rss: int | None = None
        self.hwm: int | None = None
        self.torch_reserved: int | None = None
        self.torch_allocated: int | None = None
        self.samples = 0
        #: leak mode: the running peaks after each queued run
        self.run_peaks: list[Peaks] = []

    def run(self) -> None:
        while True:
            self.sample()
            if self.stop_event.wait(self.interval_s):
                return

    def sample(self) -> None:
        tree = self.host.process_tree(self.pid)
        pids = {self.pid}
        if tree is not None:
            descendants = getattr(self.host, "descendants", None)
            if callable(descendants) and (tree.process_count or 1) > 1:
                pids.update(descendants(self.pid))
        vram: int | None = None
        if self.gpu is not None:
            used = [p.used_bytes for p in self.gpu.processes() if p.pid in pids]
            known = [u for u in used if u is not None]
            vram = sum(known) if known else None
        reserved, allocated = _torch_peaks(_read_report(self.report_path))
        with self.lock:
            self.samples += 1
            if tree is not None:
                self.rss = _max(self.rss, tree.rss_bytes)
                self.hwm = _max(self.hwm, tree.peak_rss_bytes)
            self.nvml = _max(self.nvml, vram)
            self.torch_reserved = _max(self.torch_reserved, reserved)
            self.torch_allocated = _max(self.torch_allocated, allocated)
            peaks = self._peaks()
        if self.threshold is not None and self.threshold.crossed(peaks.vram_bytes, peaks.ram_bytes):
            self.crossed.set()

    def _peaks(self) -> Peaks:
        return Peaks(self.nvml, self.torch_reserved, self.torch_allocated, self.rss, self.hwm)

    def peaks(self) -> Peaks:
        with self.lock:
            return self._peaks()

    def finish(self) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout=5)


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


# --------------------------------------------------------------------------- the replayer


def input_files(prompt: Mapping[str, Any]) -> list[str]:
    """Input-folder file names a prompt names (``LoadImage``-style ``image`` inputs)."""
    names = []
    for node in prompt.values():
        if not isinstance(node, Mapping):
            continue
        inputs = node.get("inputs")
        if not isinstance(inputs, Mapping):
            continue
        for key in ("image", "video", "audio", "file"):
            value = inputs.get(key)
            if isinstance(value, str) and value and not value.startswith(("http:", "https:")):
                names.append(value.split(" [")[0])  # "name.png [input]" annotations
    return sorted(set(names))


class Replayer:
    """Runs measurements in one workspace (already switched to the state to measure)."""

    def __init__(
        self,
        workspace: Workspace,
        settings: ReplaySettings,
        *,
        gpu: GpuProbe | None,
        host: HostProbe,
    ) -> None:
        self.workspace = workspace
        self.settings = settings
        self.gpu = gpu
        self.host = host

    # -- paths
    @property
    def harness_dir(self) -> Path:
        """Outside the checked-out ComfyUI, so nothing of ours can shadow its modules."""
        return self.workspace.root / "harness"

    @property
    def console_path(self) -> Path:
        return self.workspace.run_dir / "console.log"

    @property
    def report_path(self) -> Path:
        return self.harness_dir / "bootstrap-report.json"

    def _bootstrap(self) -> Path:
        path = self.harness_dir / BOOTSTRAP_NAME
        source = BOOTSTRAP_SOURCE.read_text("utf-8")
        current = None
        with contextlib.suppress(OSError):
            current = path.read_text("utf-8")
        if current != source:
            write_text_atomic(path, source, mode=0o644)
        return path

    def _flags(self) -> list[str]:
        flags = list(self.settings.user_flags)
        native = self.settings.vram_budget_bytes is not None or self.settings.native_allocator
        if native and "--disable-cuda-malloc" not in flags:
            # set_per_process_memory_fraction and the allocator history are features of
            # torch's native caching allocator; ComfyUI picks cudaMallocAsync by default
            # (comfyui-facts 4.5). --cuda-malloc and --disable-cuda-malloc are one mutually
            # exclusive argparse group in ComfyUI: the user's --cuda-malloc must go.
            flags = [f for f in flags if f != "--cuda-malloc"]
            flags.append("--disable-cuda-malloc")
        return flags

    def _argv(self, spec: LaunchSpec) -> list[str]:
        argv = [self.settings.python, str(self._bootstrap()), "--result", str(self.report_path)]
        if self.settings.vram_budget_bytes is not None:
            argv += ["--vram-budget-bytes", str(self.settings.vram_budget_bytes)]
        if not self.settings.record_history:
            argv.append("--no-history")
        return [*argv, "--", str(spec.main_py), *spec.args]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.settings.env)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PYTHONSTARTUP", None)
        return env

    def _spawn(self, spec: LaunchSpec) -> ProcessHandle:
        self.harness_dir.mkdir(parents=True, exist_ok=True)
        self.workspace.run_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.report_path.unlink()
        argv = self._argv(spec)
        kill_leftover_replay(self.workspace.root)  # its port and memory would skew this run
        if self.settings.fork_server:
            forked = self._fork(argv, spec)
            if forked is not None:
                return forked
        kwargs: dict[str, Any] = {}
        if os.name == "nt":  # pragma: no cover
            kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
        else:
            kwargs["start_new_session"] = True
            kwargs["preexec_fn"] = pdeathsig_preexec()
        with self.console_path.open("wb") as console:
            try:
                proc = _spawner.popen(
                    argv,
                    cwd=spec.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    env=self._env(),
                    **kwargs,
                )
            except OSError as exc:
                raise ComfyError(
                    f"cannot start ComfyUI with {self.settings.python}: {exc.strerror or exc}"
                ) from exc
        if os.name == "nt":  # pragma: no cover - Windows only
            try:
                _windows_job().assign(int(proc._handle))  # type: ignore[attr-defined]
            except OSError as exc:
                log.warning("the replay ComfyUI may outlive oom-bisect: %s", exc)
        _write_record(self.workspace.root, proc)
        return proc

    def _fork(self, argv: list[str], spec: LaunchSpec) -> ProcessHandle | None:
        """The same command, forked by the preloaded server; None: start it cold (also the
        first time in an environment: that cold start says what ComfyUI imports)."""
        env = self._env()
        preload = learned_imports(self.settings.python, env)
        server = fork_server_for(
            self.settings.python,
            env,
            self.harness_dir,
            _spawner.popen,
            self.settings.start_timeout_s,
            preload,
            start_new_session=True,
            preexec_fn=pdeathsig_preexec(),
        )
        if server is None:
            return None
        self.console_path.write_bytes(b"")  # the child appends, as a cold start's console
        try:
            child = server.spawn(argv, cwd=spec.cwd, env=env, console=self.console_path)
        except OSError as exc:
            log.warning("the fork server could not start ComfyUI (%s); starting cold", exc)
            return None
        child.args = list(argv)
        with _live_lock:
            _live[child.pid] = child
        _write_record(self.workspace.root, child)
        return child

    # -- one measurement
    def measure(self, prompt: Mapping[str, Any], threshold: Threshold | None = None) -> Measurement:
        """Start ComfyUI at the workspace's current state, replay ``prompt``, stop it.

        ``threshold``: stop early once a running peak crosses it (None: run to the end).
        """
        return asyncio.run(self._measure(prompt, threshold))

    def object_info(self) -> dict[str, Any]:
        """``/object_info`` of the workspace's current state (to convert a UI workflow)."""
        return asyncio.run(self._object_info())

    async def _object_info(self) -> dict[str, Any]:
        spec = self.workspace.launch(self._flags())
        proc = self._spawn(spec)
        client = ComfyClient(f"http://127.0.0.1:{spec.port}", timeout_s=120)
        try:
            try:
                await client.wait_ready(
                    self.settings.start_timeout_s, alive=lambda: proc.poll() is None
                )
            except ComfyError:
                tail = _tail(self.console_path)
                raise ComfyError(
                    f"ComfyUI at {self.workspace.comfyui} did not start to read /object_info"
                    + (f": {tail[-1]}" if tail else "")
                ) from None
            return await client.object_info()
        finally:
            await client.close()
            await asyncio.to_thread(
                _stop_recorded, self.workspace.root, proc, self.settings.stop_grace_s
            )

    async def _measure(self, prompt: Mapping[str, Any], threshold: Threshold | None) -> Measurement:
        t0 = time.monotonic()
        missing = self.workspace.stage_inputs(input_files(prompt))
        spec = self.workspace.launch(self._flags())
        proc = self._spawn(spec)
        t_spawned = time.monotonic()
        sampler = _Sampler(
            proc.pid,
            self.gpu,
            self.host,
            self.report_path,
            self.settings.sample_interval_s,
            threshold,
        )
        sampler.start()
        client = ComfyClient(f"http://127.0.0.1:{spec.port}", timeout_s=60)
        timings: dict[str, float] = {"prepare_s": t_spawned - t0}
        run: RunOutcome | None = None
        start_failure: str | None = None
        stopped_early = False
        killed_by_harness = False
        sigkilled_by_harness = False
        exit_code: int | None = None
        notes = [f"input file not found in the user's input folder: {m}" for m in missing]
        if isinstance(proc, ForkedChild):
            notes.append(f"forked by the fork server (preloaded interpreter), pid {proc.pid}")
        if self.settings.native_allocator:
            notes.append(
                "a replay with torch's native allocator (--disable-cuda-malloc) for the "
                "allocator history only: its peaks are not the measured ones"
            )
        if self.settings.runs_per_state > 1:
            notes.append(
                f"leak mode: the workflow queued {self.settings.runs_per_state} times in one "
                f"server; between runs {variation(prompt)}"
            )
        try:
            alive = lambda: proc.poll() is None  # noqa: E731
            try:
                await client.wait_ready(
                    self.settings.start_timeout_s, alive=alive, poll_interval_s=READY_POLL_S
                )
            except ComfyError:
                if proc.poll() is not None:
                    start_failure = f"exited with status {proc.returncode}"
                else:
                    start_failure = (
                        f"no answer on /system_stats within {self.settings.start_timeout_s:g} s"
                    )
            t_ready = time.monotonic()
            timings["ready_s"] = t_ready - t_spawned
            if start_failure is None:
                run, stopped_early, start_failure = await self._run(client, prompt, sampler, alive)
                timings["prompt_s"] = time.monotonic() - t_ready
        finally:
            t_stop = time.monotonic()
            sampler.sample()  # the last high-water marks, before the process goes
            killed_by_harness = proc.poll() is None
            await client.close()
            sigkilled_by_harness = await asyncio.to_thread(
                _stop_recorded, self.workspace.root, proc, self.settings.stop_grace_s
            )
            sampler.finish()
            timings["teardown_s"] = time.monotonic() - t_stop
        exit_code = proc.returncode
        if isinstance(proc, ForkedChild) and proc.lost:
            # its parent-death signal, not the OOM killer: say unknown, never a false OOM
            exit_code = None
            notes.append("the fork server died during the run: ComfyUI's exit status is unknown")
        if exit_code in _KILLED and not sigkilled_by_harness:
            killed_by_harness = False  # it was dying of someone else's SIGKILL at teardown
        report = _read_report(self.report_path)
        modules = (report or {}).get("modules")
        if self.settings.fork_server and not isinstance(proc, ForkedChild) and modules:
            learn_imports(self.settings.python, self._env(), [str(m) for m in modules])
        reserved, allocated = _torch_peaks(report)
        peaks = sampler.peaks()
        peaks = replace(
            peaks,
            torch_reserved_bytes=_max(peaks.torch_reserved_bytes, reserved),
            torch_allocated_bytes=_max(peaks.torch_allocated_bytes, allocated),
            # the per-node peaks reset the kernel's VmHWM: the bootstrap kept the marks
            hwm_bytes=_max(
                peaks.hwm_bytes, _int_or_none(((report or {}).get("ram") or {}).get("hwm_bytes"))
            ),
        )
        tail = _tail(self.console_path)
        if stopped_early:
            outcome: Outcome = Ok(peaks.vram_bytes, peaks.ram_bytes, stopped_early=True)
            event = None
        else:
            outcome, event = outcome_from_run(
                run,
                peaks=peaks,
                exit_code=exit_code,
                killed_by_harness=sigkilled_by_harness,
                console_tail=tail,
                start_failure=start_failure,
            )
        torch_info = (report or {}).get("torch") if report else None
        history = ((report or {}).get("oom") or {}).get("history_file") if report else None
        if torch_info and torch_info.get("history_refused"):
            notes.append(
                f"allocator history: not recorded, torch's {torch_info['history_refused']} "
                "backend (ComfyUI's default) cannot; --history-with-native-allocator replays "
                "an OOM once with --disable-cuda-malloc for it"
            )
        if torch_info and torch_info.get("errors"):
            notes.extend(f"bootstrap: {e}" for e in torch_info["errors"])
        if isinstance(proc, ForkedChild) and proc.restarted_cold:
            notes.append("ComfyUI chose other allocator settings than the fork server had: cold")
        notes.extend(
            f"bootstrap: {e}" for e in ((report or {}).get("nodes") or {}).get("notes") or []
        )
        return Measurement(
            outcome=outcome,
            peaks=peaks,
            oom_event=event,
            exit_code=exit_code,
            stopped_by_harness=killed_by_harness,
            stopped_early=stopped_early,
            console_tail=tail,
            dropped_flags=spec.dropped,
            argv=tuple(self._argv(spec)),
            timings={k: round(v, 4) for k, v in timings.items()},
            allocator_history=history,
            torch=torch_info,
            notes=tuple(notes),
            node_peaks=node_peaks_of(report),
            run_peaks=tuple(p.to_json() for p in sampler.run_peaks),
        )

    async def _run_all(
        self,
        client: ComfyClient,
        prompt: Mapping[str, Any],
        sampler: _Sampler,
        alive: Callable[[], bool],
    ) -> RunOutcome:
        """The prompt once, or ``runs_per_state`` times in this server (leak mode: each later
        run varied so ComfyUI's cache cannot skip it, bisect/measure/leak.py); the first run that does
        not succeed ends it. ``sampler.run_peaks`` gets the running peaks after each run."""
        runs = max(1, self.settings.runs_per_state)
        deadline = time.monotonic() + self.settings.timeout_s * runs  # --timeout is per run
        outcome: RunOutcome | None = None
        for i in range(runs):
            left = max(1.0, deadline - time.monotonic())
            outcome = await client.run_prompt(
                varied_prompt(prompt, i), left, alive=alive, poll_interval_s=0.5
            )
            if runs > 1:
                sampler.sample()
                sampler.run_peaks.append(sampler.peaks())
            if outcome.kind != "success":
                break
        assert outcome is not None
        return outcome

    async def _run(
        self,
        client: ComfyClient,
        prompt: Mapping[str, Any],
        sampler: _Sampler,
        alive: Callable[[], bool],
    ) -> tuple[RunOutcome | None, bool, str | None]:
        """The prompt's run; (None, True, None) when the threshold was crossed first;
        (None, False, why) when the prompt could not even be posted."""
        run_task = asyncio.create_task(self._run_all(client, prompt, sampler, alive))

        async def crossed() -> None:
            while not sampler.crossed.is_set():
                await asyncio.sleep(0.02)

        watch = asyncio.create_task(crossed())
        try:
            done, _ = await asyncio.wait({run_task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if run_task in done:
                try:
                    return run_task.result(), False, None
                except ComfyError as exc:
                    # the POST itself failed: the server died between ready and the POST
                    return None, False, f"the prompt could not be posted ({exc})"
            return None, True, None
        finally:
            pending = [task for task in (run_task, watch) if not task.done()]
            for task in pending:
                task.cancel()
            # gather, not suppress(CancelledError): a Ctrl-C that cancels this coroutine while
            # it waits here must still reach asyncio.run (and become KeyboardInterrupt)
            await asyncio.gather(*pending, return_exceptions=True)
