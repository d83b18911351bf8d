"""Watch each ComfyUI process until it ends, and tell a kill by the OS from a normal exit.

When the kernel OOM killer (or systemd-oomd, or earlyoom) kills ComfyUI, ComfyUI prints
nothing, its websocket just drops and its history dies with it (comfyui-facts.md 11). The only
evidence is outside: the process's end, and the kernel's counters and logs (``kernel_oom``).
This module notices the end at once and gathers that evidence while it is fresh.

Noticing the end of a process we did not start: ``psutil.Process.wait`` polls, and ``waitpid``
only works for children. On Linux >= 5.3 a *pidfd* (``os.pidfd_open``) becomes readable the
moment the process exits -- while it is still a zombie, before its parent reaps it -- so one
``poll()`` over every watched pidfd plus a wake-up pipe sleeps until something ends, for free.
In that window ``/proc/<pid>/stat`` still holds the exit status (its last field, in
``waitpid`` form), so SIGKILL is told from a normal exit even for a process that is not ours.
Where a parent reaps faster than we read (a shell does at once), the status is unknown and the
kernel evidence decides. Elsewhere (old kernels, macOS, Windows) the watcher polls every
250 ms: one ``kill(pid, 0)``-class check per process.

While a process lives its kill-evidence baseline (``capture_readings``: ``/proc/vmstat``, its
memory cgroup's counters) is refreshed every few seconds, because its cgroup can only be read
while it exists. After it ends, ``collect_kill_evidence`` reads the counters again plus
``/dev/kmsg`` and the journal; each source says ``saw-kill``, ``no-kill``, ``unreadable`` or
``unavailable``. Evidence naming a killer makes the end a ``killed-by-os`` observation. A
SIGKILL alone does not: users, launchers and test teardowns send it too. It is read as an OOM
kill only when a killer's source could not be read (``evidence_gaps``) *and* host memory was
high at the last samples before the death (``kill_verdict``); every other SIGKILL is a
``killed (SIGKILL)`` run, logged, with no incident and no alert.

Like the API watcher it owns one thread and hands immutable ``ProcessExit`` records to a
callback (the service's inbox). The snapshot's ``process`` and ``kernel`` sections are built by
the pure ``process_section`` / ``kernel_section`` below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.comfy.processes import (
    ComfyProcess,
    find_conflicts,
    other_gpu_processes,
    shares_gpu,
)
from oom_sentinel.daemon.incidents.tracker import Observation
from oom_sentinel.daemon.kernel.oom import (
    SIGKILL,
    KillEvidence,
    LiveReadings,
    ProcessDeath,
    SystemRoots,
    capture_readings,
    collect_kill_evidence,
    evidence_gaps,
)
from oom_sentinel.daemon.probes.base import GpuProcessSample, MemorySample
from oom_sentinel.daemon.service.workers import Worker

__all__ = [
    "ProcessExit",
    "ProcessWatcher",
    "WatchTarget",
    "death_from_status",
    "is_os_kill",
    "kernel_section",
    "kill_observation",
    "kill_verdict",
    "memory_was_high",
    "parse_stat_exit",
    "process_section",
]

log = logging.getLogger(__name__)

#: how often the kill-evidence baseline of a living process is read again (three small reads)
READINGS_INTERVAL_S = 5.0
#: liveness poll where pidfds are not available
POLL_INTERVAL_S = 0.25
#: host memory counts as "high" when at most this fraction of RAM (or of the commit limit) was
#: left at one of the last samples before a death
HIGH_MEMORY_FREE_FRACTION = 0.10
#: how many samples before the death are looked at
HIGH_MEMORY_SAMPLES = 3

#: why a process end is, or is not, an OOM kill (the snapshot's ``kernel.verdict``)
KillBasis = Literal[
    # a source named the killer (kernel, cgroup, systemd-oomd, earlyoom)
    "evidence",
    # a SIGKILL, a killer's source could not be read, and memory was high at the last samples
    "unreadable-evidence-high-memory",
    # a SIGKILL, every source was read and none shows an OOM kill
    "sigkill-no-oom-evidence",
    # a SIGKILL, a source could not be read, but memory was not high
    "sigkill-unreadable-evidence-memory-normal",
    # no SIGKILL and no killer: an exit, a crash or another signal
    "not-killed",
]


# ---- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """A watched ComfyUI process ended; ``os_kill`` when it reads as a kill by the OS."""

    instance: str
    process: ComfyProcess
    death: ProcessDeath
    evidence: KillEvidence
    os_kill: bool
    #: why ``os_kill`` is what it is (``kill_verdict``)
    basis: KillBasis = "evidence"

    @property
    def sigkill(self) -> bool:
        """Ended by a SIGKILL that no evidence ties to memory: a ``killed (SIGKILL)`` run."""
        return not self.os_kill and self.death.signal == SIGKILL


@dataclass(frozen=True, slots=True)
class WatchTarget:
    """What the service asks to watch: one instance's process."""

    instance: str
    process: ComfyProcess


# ---- pure helpers ------------------------------------------------------------------------------


def parse_stat_exit(text: str) -> tuple[str | None, int | None]:
    """``(state, exit status)`` from ``/proc/<pid>/stat``; the status (``waitpid`` form, the
    last field since Linux 3.5) only for a zombie, whose exit it records."""
    close = text.rfind(")")
    if close < 0:
        return None, None
    fields = text[close + 2 :].split()
    if not fields:
        return None, None
    state = fields[0]
    if state != "Z" or len(fields) < 50:
        return state, None
    try:
        return state, int(fields[-1])
    except ValueError:
        return state, None


def death_from_status(
    pid: int, status: int | None, died_at_s: float, comm: str | None = None
) -> ProcessDeath:
    """A ``ProcessDeath`` from a ``waitpid`` status word (None: unknown)."""
    if status is None:
        return ProcessDeath(pid, died_at_s, comm=comm)
    signal = status & 0x7F
    if signal:
        return ProcessDeath(pid, died_at_s, exit_code=None, signal=signal, comm=comm)
    return ProcessDeath(pid, died_at_s, exit_code=(status >> 8) & 0xFF, comm=comm)


def is_os_kill(death: ProcessDeath, evidence: KillEvidence) -> bool:
    """Evidence names a killer (even only "possible": an unexplained end while the kernel's
    OOM counter moved is worth a snapshot). A bare SIGKILL is not enough: see ``kill_verdict``."""
    return evidence.killer is not None


def memory_was_high(samples: Sequence[MemorySample], died_at_s: float) -> bool | None:
    """Whether host memory was nearly exhausted at one of the last ``HIGH_MEMORY_SAMPLES``
    samples up to ``died_at_s`` (pure). None: no host sample to tell."""
    before = [s for s in samples if s.host is not None and s.time_s <= died_at_s + 1.0]
    if not before:
        return None
    for sample in before[-HIGH_MEMORY_SAMPLES:]:
        host = sample.host
        assert host is not None
        if host.ram_total_bytes > 0 and (
            host.ram_available_bytes <= host.ram_total_bytes * HIGH_MEMORY_FREE_FRACTION
        ):
            return True
        limit, used = host.commit_limit_bytes, host.committed_bytes
        if limit and used is not None and limit - used <= limit * HIGH_MEMORY_FREE_FRACTION:
            return True
    return False


def kill_verdict(
    death: ProcessDeath, evidence: KillEvidence, memory_high: bool | None
) -> tuple[bool, KillBasis]:
    """``(os_kill, basis)``: was this end a kill by the OS for memory, and on what grounds
    (pure). One rule for the daemon's incidents, alerts and run outcomes."""
    if evidence.killer is not None:
        return True, "evidence"
    if death.signal != SIGKILL:
        return False, "not-killed"
    if not evidence_gaps(evidence):
        return False, "sigkill-no-oom-evidence"
    if memory_high:
        return True, "unreadable-evidence-high-memory"
    return False, "sigkill-unreadable-evidence-memory-normal"


#: the verdict in words, for the log and the snapshot
BASIS_TEXT: dict[str, str] = {
    "evidence": "the evidence names the killer",
    "unreadable-evidence-high-memory": (
        "a SIGKILL while host memory was nearly exhausted, and a killer's log or counter "
        "could not be read: taken for an OOM kill"
    ),
    "sigkill-no-oom-evidence": (
        "killed (SIGKILL); every source was read and none shows an OOM kill: not an OOM"
    ),
    "sigkill-unreadable-evidence-memory-normal": (
        "killed (SIGKILL); a source could not be read, but memory was not high: not an OOM"
    ),
    "not-killed": "not killed",
}


def kill_observation(
    exit: ProcessExit, *, at_s: float | None = None, prompt_id: str | None = None
) -> Observation:
    """The ``killed-by-os`` observation of a process that the OS killed."""
    death, ev = exit.death, exit.evidence
    backend = Backend.CPU if exit.process.flags.vram_mode == "cpu" else Backend.UNKNOWN
    extra: list[tuple[str, Any]] = []
    if death.signal is not None:
        extra.append(("signal", death.signal))
    if ev.confidence is not None:
        extra.append(("confidence", ev.confidence))
    if exit.basis != "evidence":
        extra.append(("basis", exit.basis))
    event = OomEvent(
        pool=Pool.KILLED_BY_OS,
        backend=backend,
        recovered=False,
        message=(
            ev.summary if exit.basis == "evidence" else f"{ev.summary}; {BASIS_TEXT[exit.basis]}"
        )
        or f"process {death.pid} was killed",
        killer=ev.killer,
        killed_pid=death.pid,
        rule=f"process-exit/{ev.killer or 'sigkill'}",
        extra=tuple(extra),
    )
    evidence: dict[str, Any] = {
        "pid": death.pid,
        "signal": death.signal,
        "exit_code": death.exit_code,
        "killer": ev.killer,
        "confidence": ev.confidence if ev.killer is not None else "possible",
        "basis": exit.basis,
    }
    if prompt_id:
        evidence["prompt_id"] = prompt_id
    return Observation(
        instance=exit.instance,
        source="process",
        event=event,
        at_s=at_s if at_s is not None else death.died_at_s,
        evidence=evidence,
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def kernel_section(
    death: ProcessDeath, evidence: KillEvidence, basis: KillBasis = "evidence"
) -> dict[str, Any]:
    """The snapshot's ``kernel`` section: how the process ended, what each source said and
    why it was taken for an OOM kill (``verdict``: named by the evidence, or a SIGKILL with a
    source unreadable while memory was high)."""
    return {
        "verdict": basis,
        "verdict_text": BASIS_TEXT[basis],
        "pid": death.pid,
        "died_at_s": death.died_at_s,
        "signal": death.signal,
        "exit_code": death.exit_code,
        "killer": evidence.killer,
        "confidence": evidence.confidence,
        "summary": evidence.summary,
        "constraint": evidence.constraint,
        "cgroup": evidence.cgroup,
        "victim_rss_bytes": evidence.victim_rss_bytes,
        "lines": list(evidence.lines),
        "sources": [
            {"source": r.source, "status": r.status, "reason": r.reason, "detail": r.detail}
            for r in evidence.sources
        ],
    }


def _process_json(proc: ComfyProcess) -> dict[str, Any]:
    return {
        "pid": proc.pid,
        "argv": list(proc.argv),
        "interpreter": proc.interpreter,
        "executable": proc.executable,
        "script": proc.script,
        "code_dir": proc.code_dir,
        "install_dir": proc.install_dir,
        "cwd": proc.cwd,
        "create_time_s": proc.create_time_s,
        "desktop": proc.desktop,
        "url": proc.url,
        "pytorch_cuda_alloc_conf": proc.pytorch_cuda_alloc_conf,
        "cuda_visible_devices": proc.cuda_visible_devices,
        "environ_readable": proc.environ_readable,
        "flags": _jsonable(dataclasses.asdict(proc.flags)),
    }


def process_section(
    proc: ComfyProcess | None,
    *,
    gpu_processes: Sequence[GpuProcessSample] = (),
    own_pids: Iterable[int] = (),
    comfy_processes: Sequence[ComfyProcess] = (),
    exit: ProcessExit | None = None,
) -> dict[str, Any]:
    """The snapshot's ``process`` section: the instance's process as launched, what else holds
    the GPU and whether a second ComfyUI runs -- the seed guide's first checks (pure)."""
    own = set(own_pids)
    if proc is not None:
        own.add(proc.pid)
    others = other_gpu_processes(gpu_processes, own)
    other_comfy = [p for p in comfy_processes if proc is None or p.pid != proc.pid]
    everyone = ([proc] if proc is not None else []) + other_comfy
    conflicts = [
        c for c in find_conflicts(everyone, gpu_processes) if proc is None or proc.pid in c.pids
    ]
    gpu_by_pid: dict[int, int] = {}
    for gp in gpu_processes:
        if gp.used_bytes is not None:
            gpu_by_pid[gp.pid] = gpu_by_pid.get(gp.pid, 0) + gp.used_bytes
    section: dict[str, Any] = (
        _process_json(proc) if proc is not None else {"pid": None, "found": False}
    )
    section["alive"] = exit is None and proc is not None
    section["exit"] = (
        None
        if exit is None
        else {
            "died_at_s": exit.death.died_at_s,
            "signal": exit.death.signal,
            "exit_code": exit.death.exit_code,
            "os_kill": exit.os_kill,
        }
    )
    section["other_gpu_processes"] = [
        {
            "pid": gp.pid,
            "name": gp.name,
            "device_index": gp.device_index,
            "used_bytes": gp.used_bytes,
            "cmdline": list(gp.cmdline) if gp.cmdline is not None else None,
            "comfyui": any(p.pid == gp.pid for p in other_comfy),
        }
        for gp in others
    ]
    section["other_instances"] = [
        {
            "pid": p.pid,
            "url": p.url,
            "port": p.flags.effective_port,
            "install_dir": p.install_dir,
            "argv": list(p.argv),
            "gpu_used_bytes": gpu_by_pid.get(p.pid),
            # processes.shares_gpu: --cpu, another device, or no GPU memory in NVML: False
            "shares_gpu": shares_gpu(proc, p, gpu_processes),
        }
        for p in other_comfy
    ]
    section["second_instance"] = bool(other_comfy)
    section["conflicts"] = [
        {"kind": c.kind, "pids": list(c.pids), "shared": c.shared, "detail": c.detail}
        for c in conflicts
    ]
    return section


# ---- reading a process's end -------------------------------------------------------------------


def _read_exit_status(pid: int) -> tuple[bool, int | None]:
    """``(ended, waitpid status)`` from /proc: a zombie has ended and still tells its status;
    a missing entry has ended and been reaped."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    state, status = parse_stat_exit(text)
    return state in ("Z", "X"), status


def _ended(target: _Target) -> tuple[bool, int | None]:
    """Whether the target's process ended (and its status where readable)."""
    if sys.platform.startswith("linux"):
        ended, status = _read_exit_status(target.pid)
        if ended:
            return True, status
        if target.create_time_s is not None:
            # the pid may already belong to a new process
            with contextlib.suppress(psutil.Error, OSError):
                if psutil.Process(target.pid).create_time() != target.create_time_s:
                    return True, None
        return False, None
    try:
        p = psutil.Process(target.pid)
        if target.create_time_s is not None and p.create_time() != target.create_time_s:
            return True, None
        return p.status() == psutil.STATUS_ZOMBIE, None
    except psutil.NoSuchProcess:
        return True, None
    except (psutil.Error, OSError):
        return False, None


@dataclass
class _Target:
    instance: str
    process: ComfyProcess
    readings: LiveReadings | None = None
    readings_at: float = 0.0
    pidfd: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def create_time_s(self) -> float | None:
        return self.process.create_time_s


class ProcessWatcher:
    """One thread that watches every instance's process and reports its end.

    ``watch(instance, process)`` (any thread) starts watching, replacing the instance's
    previous process; ``forget(instance)`` stops. ``emit`` receives a ``ProcessExit`` on the
    watcher's thread and must only hand it over.
    """

    def __init__(
        self,
        emit: Callable[[ProcessExit], None],
        *,
        roots: SystemRoots | None = None,
        journalctl: str = "journalctl",
        read_logs: bool = True,
        readings_interval_s: float = READINGS_INTERVAL_S,
        poll_interval_s: float = POLL_INTERVAL_S,
        use_pidfd: bool | None = None,
        clock: Callable[[], float] = time.time,
        memory: Callable[[], Sequence[MemorySample]] | None = None,
    ) -> None:
        self.emit = emit
        #: the memory timeline (``kill_verdict`` asks whether memory was high at a SIGKILL)
        self.memory = memory
        self.roots = roots
        self.journalctl = journalctl
        self.read_logs = read_logs
        self.readings_interval_s = readings_interval_s
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        can_pidfd = hasattr(os, "pidfd_open") and hasattr(select, "poll")
        self.use_pidfd = can_pidfd if use_pidfd is None else (use_pidfd and can_pidfd)
        self._lock = threading.Lock()
        self._wanted: dict[str, ComfyProcess] = {}
        self._targets: dict[str, _Target] = {}
        #: the watcher's thread (service.workers); ``_stop`` is its stop request
        self.worker = Worker("process", self._main, thread_name="process-watch")
        self._stop = self.worker.stopping
        #: wakes the polling fallback (no pipe to select on there: Windows has none)
        self._woken = threading.Event()
        self._wake_r = self._wake_w = -1
        if self.use_pidfd:
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)

    @property
    def backend(self) -> str:
        return "pidfd" if self.use_pidfd else f"poll every {self.poll_interval_s * 1000:.0f} ms"

    # -- control (any thread) ---------------------------------------------------------------
    def watch(self, instance: str, process: ComfyProcess) -> None:
        with self._lock:
            self._wanted[instance] = process
        self._wake()

    def forget(self, instance: str) -> None:
        with self._lock:
            self._wanted.pop(instance, None)
        self._wake()

    def watching(self) -> dict[str, int]:
        """Instance → pid being watched now."""
        with self._lock:
            return {name: p.pid for name, p in self._wanted.items()}

    def is_alive(self) -> bool:
        """Whether the watcher's thread runs (a worker the watchdog checks)."""
        return self.worker.is_alive()

    def start(self) -> None:
        if not self.worker.started:
            self.worker.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.worker.stop(timeout_s, wake=self._wake)
        for target in self._targets.values():
            self._close(target)
        self._targets.clear()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        self._woken.set()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    # -- the thread -------------------------------------------------------------------------
    def _main(self) -> None:
        while not self._stop.is_set():
            self.worker.beat()
            try:
                self._sync()
                ready = self._wait(self._timeout())
                if self._stop.is_set():
                    break
                # what was forgotten or replaced while we slept is not reported (a reused fd
                # number in ``ready`` is harmless: ``_ended`` checks the process itself)
                self._sync()
                self._check(ready)
                self._refresh_readings()
            except Exception:
                log.exception("the process watcher failed; it goes on")
                self._stop.wait(1.0)

    def _sync(self) -> None:
        with self._lock:
            wanted = dict(self._wanted)
        for name in list(self._targets):
            target = self._targets[name]
            proc = wanted.get(name)
            if proc is None or proc.pid != target.pid or proc.create_time_s != target.create_time_s:
                self._close(target)
                del self._targets[name]
        for name, proc in wanted.items():
            if name in self._targets:
                continue
            target = _Target(name, proc)
            self._targets[name] = target
            self._open(target)

    def _open(self, target: _Target) -> None:
        target.readings = capture_readings(
            target.pid, self.roots, clock=self.clock, create_time_s=target.create_time_s
        )
        target.readings_at = time.monotonic()
        if not self.use_pidfd:
            return
        try:
            target.pidfd = os.pidfd_open(target.pid)
        except ProcessLookupError:
            target.pidfd = None  # already gone: the next check reports it
        except OSError as exc:
            log.debug("pidfd_open(%d) failed (%s); polling it", target.pid, exc)
            target.pidfd = None

    @staticmethod
    def _close(target: _Target) -> None:
        if target.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(target.pidfd)
            target.pidfd = None

    def _timeout(self) -> float:
        timeout = self.readings_interval_s
        if any(t.pidfd is None for t in self._targets.values()):
            timeout = min(timeout, self.poll_interval_s)
        return timeout

    def _wait(self, timeout_s: float) -> set[int]:
        """Sleep until a pidfd is readable, a wake-up or the timeout; returns ready pidfds."""
        if not self.use_pidfd:
            self._woken.wait(min(timeout_s, self.poll_interval_s))
            self._woken.clear()
            return set()
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        for target in self._targets.values():
            if target.pidfd is not None:
                poller.register(target.pidfd, select.POLLIN)
        events = poller.poll(timeout_s * 1000)
        self._drain_wake()
        return {fd for fd, _ in events if fd != self._wake_r}

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass

    def _check(self, ready: set[int]) -> None:
        for name, target in list(self._targets.items()):
            if target.pidfd is not None and target.pidfd not in ready:
                continue
            ended, status = _ended(target)
            if not ended:
                continue
            del self._targets[name]
            self._close(target)
            with self._lock:
                if self._wanted.get(name) is target.process:
                    del self._wanted[name]
            self._report(target, status)

    def _report(self, target: _Target, status: int | None) -> None:
        died_at = self.clock()
        proc = target.process
        death = death_from_status(proc.pid, status, died_at, comm=_comm(proc))
        readings = target.readings or capture_readings(proc.pid, self.roots, clock=self.clock)
        evidence = collect_kill_evidence(
            death,
            readings,
            roots=self.roots,
            journalctl=self.journalctl,
            read_logs=self.read_logs,
            clock=self.clock,
        )
        high = None
        if evidence.killer is None and death.signal == SIGKILL and evidence_gaps(evidence):
            high = memory_was_high(self.memory() if self.memory else (), died_at)
        os_kill, basis = kill_verdict(death, evidence, high)
        verdict = "" if basis in ("evidence", "not-killed") else f" -- {BASIS_TEXT[basis]}"
        log.log(
            logging.WARNING if os_kill else logging.INFO,
            "ComfyUI %r (pid %d) ended: %s%s",
            target.instance,
            proc.pid,
            evidence.summary,
            verdict,
        )
        self.emit(ProcessExit(target.instance, proc, death, evidence, os_kill, basis))

    def _refresh_readings(self) -> None:
        now = time.monotonic()
        for target in self._targets.values():
            if now - target.readings_at >= self.readings_interval_s:
                target.readings = capture_readings(
                    target.pid, self.roots, clock=self.clock, create_time_s=target.create_time_s
                )
                target.readings_at = now


def _comm(proc: ComfyProcess) -> str | None:
    exe = proc.executable or proc.interpreter
    return os.path.basename(exe) if exe else None
