"""Evidence that the operating system killed a process for memory, and which killer did it.

When the kernel kills ComfyUI for RAM, ComfyUI prints nothing: the process is simply gone
(SIGKILL, exit status 137). Whether it was an OOM kill, and by whom, is only visible outside the
process, and the remedies differ by killer:

=============  ===========================================================================
killer         evidence
=============  ===========================================================================
kernel         ``/proc/vmstat`` ``oom_kill`` grew (global, any process); the process's memory
               cgroup counted an ``oom_kill`` (cgroup v2 ``memory.events``, v1
               ``memory.oom_control``); the kernel log names the pid:
               ``Out of memory: Killed process <pid> (...)`` or
               ``Memory cgroup out of memory: Killed process <pid> (...)``, after
               ``<comm> invoked oom-killer`` and ``oom-kill:constraint=...,task_memcg=...,pid=N``
systemd-oomd   the journal: ``Killed <cgroup> due to memory pressure for ...`` / ``due to swap
               used ...`` and ``<unit>: systemd-oomd killed N process(es) in this unit.``
earlyoom       its log: ``sending SIGTERM to process <pid> uid <uid> "<name>": oom_score ...,
               VmRSS <n> MiB`` (older: ``badness``; before 2020 no uid; before 2019
               ``killing process <pid> "<name>" with signal <n>: badness ...``)
=============  ===========================================================================

Counters are read while the process lives (its cgroup path can only be read from
``/proc/<pid>/cgroup`` then) and again after it died; logs are read after. A source that cannot
be read is reported as ``unreadable`` (``/dev/kmsg`` without CAP_SYSLOG, a journal this user may
not read) or ``unavailable`` (no journal on this machine), never as "no kill".

Parsers are pure (text in, records out); the kernel's own lines are read by kernel/lines.py,
the one reader of them (the classifier uses it too). The readers take injectable roots, like
node_exporter's ``--path.procfs``, so tests run them on fixture trees. A kill is tied to the
watched process by its pid, never by name: the kernel names a thread (``pt_main_thread`` for
torch's main thread), not the program.
The module imports only the standard library and kernel/lines.py: a test runs a copy of the two
files, as an unprivileged user, to see a real permission error on ``/dev/kmsg``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from oom_sentinel.daemon.kernel.earlyoom import EarlyoomKill, parse_earlyoom_line
from oom_sentinel.daemon.kernel.lines import KernelOomLine, parse_kernel_line
from oom_sentinel.daemon.kernel.nohang import NohangLine, parse_nohang_line

__all__ = [
    "CgroupPaths",
    "EarlyoomKill",
    "KillEvidence",
    "LiveReadings",
    "LogEntry",
    "LogSource",
    "OomCounters",
    "OomdLine",
    "ProcessDeath",
    "SourceReport",
    "SystemRoots",
    "assess_kill",
    "capture_readings",
    "collect_kill_evidence",
    "evidence_gaps",
    "parse_earlyoom_line",
    "parse_journal_json",
    "parse_kmsg",
    "parse_memory_events",
    "parse_oom_control",
    "parse_oomd_line",
    "parse_proc_cgroup",
    "parse_vmstat_oom_kill",
    "read_after",
    "read_journal",
    "read_kmsg",
    "unit_of",
]

Killer = Literal["kernel", "systemd-oomd", "earlyoom", "nohang"]
Status = Literal["saw-kill", "no-kill", "unreadable", "unavailable"]
Confidence = Literal["certain", "probable", "possible"]

SIGKILL = 9
SIGTERM = 15

#: how far around the death log lines are searched (the kernel logs the kill before the
#: process is reaped; journald may lag a little)
LOG_WINDOW_BEFORE_S = 120.0
LOG_WINDOW_AFTER_S = 30.0
#: /dev/kmsg is read up to this much (its ring buffer is typically 128 KiB – 1 MiB)
KMSG_MAX_BYTES = 8 * 1024 * 1024
JOURNAL_TIMEOUT_S = 5.0


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SystemRoots:
    """Where the kernel's files are (tests point these at fixture trees)."""

    proc: Path = Path("/proc")
    cgroup: Path = Path("/sys/fs/cgroup")
    kmsg: Path = Path("/dev/kmsg")
    journal_dirs: tuple[Path, ...] = (Path("/run/log/journal"), Path("/var/log/journal"))


@dataclass(frozen=True, slots=True)
class CgroupPaths:
    """A process's cgroup, from ``/proc/<pid>/cgroup``."""

    #: the unified (v2) path, from the ``0::`` line
    v2: str | None = None
    #: the v1 memory controller's path
    v1_memory: str | None = None


@dataclass(frozen=True, slots=True)
class OomCounters:
    """OOM counters of one memory cgroup."""

    version: Literal["v1", "v2"]
    #: v2 ``oom``: times the cgroup hit its limit and OOM was invoked
    oom: int | None = None
    #: processes killed by the OOM killer in this cgroup (v2: and below it)
    oom_kill: int | None = None
    #: v2 ``oom_group_kill`` (memory.oom.group): whole-cgroup kills
    oom_group_kill: int | None = None
    #: v1 ``under_oom``: the cgroup is in OOM right now (OOM killer disabled for it)
    under_oom: bool | None = None
    #: the file they were read from
    path: str = ""


@dataclass(frozen=True, slots=True)
class LiveReadings:
    """Counters read at one moment; the first set is taken while the process lives."""

    pid: int
    time_s: float
    vmstat_oom_kill: int | None = None
    vmstat_error: str | None = None
    cgroup: CgroupPaths | None = None
    cgroup_error: str | None = None
    counters: OomCounters | None = None
    counters_error: str | None = None
    create_time_s: float | None = None


@dataclass(frozen=True, slots=True)
class ProcessDeath:
    """How a watched process ended (``exit_code``/``signal`` unknown for non-children)."""

    pid: int
    died_at_s: float
    exit_code: int | None = None
    signal: int | None = None
    comm: str | None = None

    @classmethod
    def from_returncode(cls, pid: int, returncode: int | None, died_at_s: float) -> ProcessDeath:
        """From a ``Popen.returncode``/``psutil.wait()`` value (negative: killed by a signal;
        128+N as a shell reports it also reads as signal N)."""
        if returncode is None:
            return cls(pid, died_at_s)
        if returncode < 0:
            return cls(pid, died_at_s, exit_code=None, signal=-returncode)
        if 128 < returncode <= 128 + 64:
            return cls(pid, died_at_s, exit_code=returncode, signal=returncode - 128)
        return cls(pid, died_at_s, exit_code=returncode)


@dataclass(frozen=True, slots=True)
class SourceReport:
    """What one evidence source said."""

    #: "vmstat", "cgroup", "kmsg" or "journal"
    source: str
    status: Status
    #: why it could not be read (``unreadable`` / ``unavailable``)
    reason: str | None = None
    #: what it saw, for humans ("oom_kill 3 -> 4")
    detail: str | None = None

    @property
    def label(self) -> str:
        """``saw-kill``, ``no-kill``, ``unreadable(<reason>)`` or ``unavailable(<reason>)``."""
        if self.status in ("unreadable", "unavailable") and self.reason:
            return f"{self.status}({self.reason})"
        return self.status


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One log line with its wall-clock time (``None`` when unknown)."""

    text: str
    time_s: float | None = None
    #: syslog identifier or "kernel"
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class LogSource:
    """What a log reader returned: the entries, or why there are none."""

    name: str
    status: Literal["read", "unreadable", "unavailable"]
    reason: str | None = None
    entries: tuple[LogEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class KillEvidence:
    """Whether ``pid`` was killed for memory, by which killer, and what each source said."""

    pid: int
    killer: Killer | None
    #: "certain": a log line names the pid (or the cgroup, for systemd-oomd); "probable": the
    #: process's own cgroup counted an OOM kill as it died by SIGKILL; "possible": only the
    #: global counter moved
    confidence: Confidence | None
    sources: tuple[SourceReport, ...]
    #: the log lines that tell of the kill, oldest first
    lines: tuple[str, ...] = ()
    #: the victim's RSS as the killer logged it (kernel anon+file+shmem, earlyoom VmRSS)
    victim_rss_bytes: int | None = None
    #: kernel constraint (CONSTRAINT_MEMCG, CONSTRAINT_NONE, …) where logged
    constraint: str | None = None
    #: the memory cgroup whose limit was hit, or the cgroup systemd-oomd killed
    cgroup: str | None = None
    summary: str = field(default="", compare=False)

    def report(self, source: str) -> SourceReport | None:
        return next((r for r in self.sources if r.source == source), None)


# -- pure parsers ------------------------------------------------------------------------------


def parse_vmstat_oom_kill(text: str) -> int | None:
    """The ``oom_kill`` counter from ``/proc/vmstat`` (kernel >= 4.13), or ``None``."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            return int(parts[1])
    return None


def parse_proc_cgroup(text: str) -> CgroupPaths:
    """``/proc/<pid>/cgroup``: ``0::/path`` (v2) and ``N:memory[,…]:/path`` (v1)."""
    v2: str | None = None
    v1: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return CgroupPaths(v2=v2, v1_memory=v1)


def _key_values(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_memory_events(text: str, path: str = "") -> OomCounters:
    """cgroup v2 ``memory.events`` (``oom``, ``oom_kill``, ``oom_group_kill`` lines)."""
    kv = _key_values(text)
    return OomCounters(
        version="v2",
        oom=kv.get("oom"),
        oom_kill=kv.get("oom_kill"),
        oom_group_kill=kv.get("oom_group_kill"),
        path=path,
    )


def parse_oom_control(text: str, path: str = "") -> OomCounters:
    """cgroup v1 ``memory.oom_control`` (``under_oom``, ``oom_kill`` since kernel 4.13)."""
    kv = _key_values(text)
    under = kv.get("under_oom")
    return OomCounters(
        version="v1",
        oom_kill=kv.get("oom_kill"),
        under_oom=None if under is None else under != 0,
        path=path,
    )


_OOMD_KILLED = re.compile(r"Killed (?P<cgroup>/\S*) due to (?P<reason>memory pressure|swap used)")
_OOMD_UNIT = re.compile(
    r"^(?:(?P<unit>\S+): )?systemd-oomd killed (?P<count>\d+) process\(es\) in this unit"
)
_UNIT_OOM = re.compile(
    r"^(?P<unit>\S+): (?:A process of this unit has been killed by the OOM killer|"
    r"Failed with result 'oom-kill')"
)


@dataclass(frozen=True, slots=True)
class OomdLine:
    """A systemd-oomd line, or a systemd unit line about an OOM kill."""

    #: "killed-cgroup": oomd's own ``Killed <cgroup> due to …``; "unit-killed": the unit's
    #: ``systemd-oomd killed N process(es) in this unit``; "unit-oom": systemd's
    #: ``A process of this unit has been killed by the OOM killer`` / ``Failed with result
    #: 'oom-kill'`` (either killer)
    kind: Literal["killed-cgroup", "unit-killed", "unit-oom"]
    text: str
    cgroup: str | None = None
    unit: str | None = None
    count: int | None = None
    #: "memory pressure" or "swap used"
    reason: str | None = None
    #: only for "unit-oom": True for the kernel line ("… killed by the OOM killer")
    kernel: bool = False


def parse_oomd_line(text: str) -> OomdLine | None:
    line = text.rstrip("\n")
    m = _OOMD_KILLED.search(line)
    if m:
        return OomdLine("killed-cgroup", line, cgroup=m.group("cgroup"), reason=m.group("reason"))
    m = _OOMD_UNIT.search(line)
    if m:
        return OomdLine("unit-killed", line, unit=m.group("unit"), count=int(m.group("count")))
    m = _UNIT_OOM.search(line)
    if m:
        return OomdLine(
            "unit-oom", line, unit=m.group("unit"), kernel="killed by the OOM killer" in line
        )
    return None


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One ``/dev/kmsg`` record (``prio,seq,usec,flags;text``)."""

    priority: int
    seq: int
    monotonic_us: int
    text: str

    @property
    def level(self) -> int:
        return self.priority & 7


def parse_kmsg(text: str) -> list[KmsgRecord]:
    """Records of ``/dev/kmsg`` text; continuation (``" KEY=value"``) lines are skipped."""
    out: list[KmsgRecord] = []
    for line in text.split("\n"):
        if not line or line.startswith(" "):
            continue
        head, sep, message = line.partition(";")
        if not sep:
            continue
        fields = head.split(",")
        if len(fields) < 3:
            continue
        try:
            prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            continue
        out.append(KmsgRecord(prio, seq, usec, message))
    return out


def parse_journal_json(text: str) -> list[LogEntry]:
    """``journalctl -o json`` output (one object per line) as log entries."""
    out: list[LogEntry] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        message = _journal_field(obj.get("MESSAGE"))
        if message is None:
            continue
        when: float | None = None
        stamp = obj.get("__REALTIME_TIMESTAMP")
        with contextlib.suppress(TypeError, ValueError):
            when = int(stamp) / 1_000_000 if stamp is not None else None
        origin = _journal_field(obj.get("SYSLOG_IDENTIFIER"))
        if origin is None and obj.get("_TRANSPORT") == "kernel":
            origin = "kernel"
        unit = _journal_field(obj.get("UNIT")) or _journal_field(obj.get("USER_UNIT"))
        if unit and not message.startswith(unit + ":"):
            # systemd's unit messages carry the unit in a field, not in MESSAGE
            message = f"{unit}: {message}"
        out.append(LogEntry(message, when, origin))
    return out


def _journal_field(value: Any) -> str | None:
    """A journal field: a string, or a byte array (non-UTF-8 data) as a list of ints."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", "replace")
        first = next((v for v in value if isinstance(v, str)), None)
        return first
    return str(value)


def unit_of(cgroup_path: str | None) -> str | None:
    """The systemd unit a cgroup path belongs to (the innermost ``*.service`` / ``*.scope``)."""
    if not cgroup_path:
        return None
    for part in reversed(cgroup_path.strip("/").split("/")):
        if part.endswith((".service", ".scope")):
            return part
    return None


# -- readers (I/O at the edge) ------------------------------------------------------------------


def _read_text(path: Path) -> tuple[str | None, str | None]:
    try:
        return path.read_text("utf-8", "replace"), None
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except PermissionError:
        return None, f"permission denied reading {path}"
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"


def _read_vmstat(roots: SystemRoots) -> tuple[int | None, str | None]:
    text, err = _read_text(roots.proc / "vmstat")
    if text is None:
        return None, err
    value = parse_vmstat_oom_kill(text)
    if value is None:
        return None, "no oom_kill counter in /proc/vmstat (kernel older than 4.13)"
    return value, None


def _read_counters(paths: CgroupPaths, roots: SystemRoots) -> tuple[OomCounters | None, str | None]:
    tried: list[str] = []
    if paths.v2 is not None:
        for base in (roots.cgroup, roots.cgroup / "unified"):
            events = base / paths.v2.lstrip("/") / "memory.events"
            text, err = _read_text(events)
            if text is not None:
                return parse_memory_events(text, str(events)), None
            tried.append(err or str(events))
    if paths.v1_memory is not None:
        control = roots.cgroup / "memory" / paths.v1_memory.lstrip("/") / "memory.oom_control"
        text, err = _read_text(control)
        if text is not None:
            return parse_oom_control(text, str(control)), None
        tried.append(err or str(control))
    if not tried:
        return None, "the process has no memory cgroup"
    return None, tried[-1] if len(tried) == 1 else "; ".join(tried)


def capture_readings(
    pid: int,
    roots: SystemRoots | None = None,
    *,
    clock: Callable[[], float] = time.time,
    create_time_s: float | None = None,
) -> LiveReadings:
    """Read the counters and the cgroup of a living process.

    Call it while the process lives and refresh it every few seconds (it is three small file
    reads): the cgroup path is only readable while the process exists, and a fresh
    ``/proc/vmstat`` baseline keeps other processes' OOM kills out of the delta.
    """
    r = roots if roots is not None else SystemRoots()
    vmstat, vm_err = _read_vmstat(r)
    text, cg_err = _read_text(r.proc / str(pid) / "cgroup")
    paths = parse_proc_cgroup(text) if text is not None else None
    counters: OomCounters | None = None
    counters_err: str | None = None
    if paths is not None:
        counters, counters_err = _read_counters(paths, r)
    else:
        counters_err = cg_err
    return LiveReadings(
        pid=pid,
        time_s=clock(),
        vmstat_oom_kill=vmstat,
        vmstat_error=vm_err,
        cgroup=paths,
        cgroup_error=cg_err,
        counters=counters,
        counters_error=counters_err,
        create_time_s=create_time_s,
    )


def read_after(
    before: LiveReadings,
    roots: SystemRoots | None = None,
    *,
    clock: Callable[[], float] = time.time,
) -> LiveReadings:
    """The same counters after the death, using the cgroup path captured while it lived."""
    r = roots if roots is not None else SystemRoots()
    vmstat, vm_err = _read_vmstat(r)
    counters: OomCounters | None = None
    counters_err: str | None = before.counters_error or before.cgroup_error
    if before.cgroup is not None:
        counters, counters_err = _read_counters(before.cgroup, r)
    return LiveReadings(
        pid=before.pid,
        time_s=clock(),
        vmstat_oom_kill=vmstat,
        vmstat_error=vm_err,
        cgroup=before.cgroup,
        cgroup_error=before.cgroup_error,
        counters=counters,
        counters_error=counters_err,
        create_time_s=before.create_time_s,
    )


def read_kmsg(
    roots: SystemRoots | None = None,
    *,
    since_s: float | None = None,
    monotonic_epoch_s: float | None = None,
) -> LogSource:
    """What ``/dev/kmsg`` holds now, read without blocking.

    Reading it needs CAP_SYSLOG when ``kernel.dmesg_restrict=1`` (Ubuntu and others ship that),
    so "permission denied" is the usual answer for a service user: ``unreadable``, not "no
    kill". Record times are converted with ``monotonic_epoch_s`` (the wall time at which the
    monotonic clock was 0; default ``time.time() - time.monotonic()``).
    """
    r = roots if roots is not None else SystemRoots()
    try:
        fd = os.open(r.kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return LogSource("kmsg", "unavailable", f"{r.kmsg} does not exist")
    except PermissionError:
        return LogSource(
            "kmsg", "unreadable", f"permission denied opening {r.kmsg} (needs CAP_SYSLOG)"
        )
    except OSError as exc:
        return LogSource("kmsg", "unreadable", f"cannot open {r.kmsg}: {exc.strerror or exc}")
    chunks: list[bytes] = []
    size = 0
    try:
        while size < KMSG_MAX_BYTES:
            try:
                chunk = os.read(fd, 16384)
            except BlockingIOError:
                break  # everything buffered has been read
            except BrokenPipeError:
                continue  # records were overwritten while reading; go on with the next
            except PermissionError:
                return LogSource(
                    "kmsg", "unreadable", f"permission denied reading {r.kmsg} (needs CAP_SYSLOG)"
                )
            except OSError as exc:
                return LogSource(
                    "kmsg", "unreadable", f"cannot read {r.kmsg}: {exc.strerror or exc}"
                )
            if not chunk:
                break  # a regular file (fixtures) ends
            if not chunk.endswith(b"\n"):
                chunk += b"\n"
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    epoch = monotonic_epoch_s if monotonic_epoch_s is not None else time.time() - time.monotonic()
    entries: list[LogEntry] = []
    for rec in parse_kmsg(b"".join(chunks).decode("utf-8", "replace")):
        when = epoch + rec.monotonic_us / 1_000_000
        if since_s is not None and when < since_s:
            continue
        entries.append(LogEntry(rec.text, when, "kernel"))
    return LogSource("kmsg", "read", entries=tuple(entries))


_JOURNAL_DENIED = (
    "not seeing messages from other users and the system",
    "insufficient permissions",
    "Permission denied",
)


def _journal_present(dirs: Iterable[Path]) -> bool:
    """Whether any journal file exists (or might: a directory we may not list)."""
    for d in dirs:
        try:
            machines = list(d.iterdir())
        except FileNotFoundError:
            continue
        except OSError:
            return True
        for m in machines:
            if m.suffix in (".journal", ".journal~"):
                return True
            try:
                if any(f.suffix in (".journal", ".journal~") for f in m.iterdir()):
                    return True
            except NotADirectoryError:
                continue
            except OSError:
                return True
    return False


def read_journal(
    since_s: float,
    until_s: float | None = None,
    *,
    roots: SystemRoots | None = None,
    journalctl: str = "journalctl",
    timeout_s: float = JOURNAL_TIMEOUT_S,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> LogSource:
    """Kernel, systemd-oomd, earlyoom, nohang and systemd unit lines from the journal in a window.

    Runs ``journalctl -o json`` with a timeout. Without membership in ``systemd-journal`` (or
    ``adm``) a user sees only their own journal, and journalctl says so on stderr: that is
    ``unreadable``, because the kernel's lines are not in what it returned.
    """
    r = roots if roots is not None else SystemRoots()
    if not _journal_present(r.journal_dirs):
        return LogSource("journal", "unavailable", "no systemd journal files on this machine")
    argv = [
        journalctl,
        "-o",
        "json",
        "--no-pager",
        "-q",
        "--since",
        f"@{int(since_s)}",
    ]
    if until_s is not None:
        argv += ["--until", f"@{int(until_s) + 1}"]
    argv += [
        "_TRANSPORT=kernel",
        "+",
        "SYSLOG_IDENTIFIER=systemd-oomd",
        "+",
        "SYSLOG_IDENTIFIER=earlyoom",
        "+",
        "SYSLOG_IDENTIFIER=nohang",
        "+",
        "SYSLOG_IDENTIFIER=nohang-desktop",
        "+",
        "SYSLOG_IDENTIFIER=systemd",
    ]
    try:
        proc = run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return LogSource("journal", "unavailable", f"{journalctl} is not installed")
    except subprocess.TimeoutExpired:
        return LogSource(
            "journal", "unreadable", f"journalctl did not answer within {timeout_s:g} s"
        )
    except OSError as exc:
        return LogSource("journal", "unreadable", f"cannot run journalctl: {exc.strerror or exc}")
    stderr = proc.stderr or ""
    if any(marker in stderr for marker in _JOURNAL_DENIED):
        return LogSource(
            "journal",
            "unreadable",
            "this user may not read the system journal (add it to the systemd-journal group)",
        )
    if proc.returncode != 0:
        first = (
            stderr.strip().splitlines()[0] if stderr.strip() else f"exit status {proc.returncode}"
        )
        return LogSource("journal", "unreadable", f"journalctl failed: {first}")
    return LogSource("journal", "read", entries=tuple(parse_journal_json(proc.stdout or "")))


# -- the decision (pure) --------------------------------------------------------------------------


def _delta(before: int | None, after: int | None) -> int | None:
    if before is None or after is None:
        return None
    return max(0, after - before)


def _oomd_matches(line: OomdLine, cgroup: str | None, unit: str | None) -> bool:
    if line.kind == "killed-cgroup" and line.cgroup and cgroup:
        killed = line.cgroup.rstrip("/")
        return cgroup == killed or cgroup.startswith(killed + "/")
    if line.kind in ("unit-killed", "unit-oom") and line.unit and unit:
        return line.unit == unit
    return False


def assess_kill(
    death: ProcessDeath,
    before: LiveReadings,
    after: LiveReadings,
    logs: Sequence[LogSource] = (),
) -> KillEvidence:
    """Name the killer of a dead process from counters and log lines (pure).

    Order of trust: a log line naming the pid (earlyoom, kernel) or the process's cgroup
    (systemd-oomd) is certain; the process's own cgroup counting an OOM kill while it died by
    SIGKILL is probable; only the global ``/proc/vmstat`` counter moving is possible (another
    process may have been the victim). A process that exited normally, or by a signal no OOM
    killer sends, is attributed only on a log line that names it.
    """
    sig = death.signal
    # an OOM killer's SIGKILL, or an unknown end (not our child); never a normal exit
    killable = sig == SIGKILL or (sig is None and death.exit_code is None)
    cgroup_path = None
    if before.cgroup is not None:
        cgroup_path = before.cgroup.v2 or before.cgroup.v1_memory
    unit = unit_of(before.cgroup.v2 if before.cgroup else None) or unit_of(cgroup_path)
    reports: list[SourceReport] = []

    # /proc/vmstat
    vm_delta = _delta(before.vmstat_oom_kill, after.vmstat_oom_kill)
    if vm_delta is None:
        reason = after.vmstat_error or before.vmstat_error or "not read"
        reports.append(SourceReport("vmstat", "unreadable", reason))
    else:
        reports.append(
            SourceReport(
                "vmstat",
                "saw-kill" if vm_delta > 0 else "no-kill",
                detail=f"oom_kill {before.vmstat_oom_kill} -> {after.vmstat_oom_kill} (all processes)",
            )
        )

    # the process's memory cgroup
    cg_kills: int | None = None
    if before.counters is None or after.counters is None:
        reason = after.counters_error or before.counters_error or "not read"
        status: Status = (
            "unavailable" if reason == "the process has no memory cgroup" else "unreadable"
        )
        reports.append(SourceReport("cgroup", status, reason))
    else:
        b, a = before.counters, after.counters
        kills = _delta(b.oom_kill, a.oom_kill)
        group_kills = _delta(b.oom_group_kill, a.oom_group_kill)
        if kills is None and group_kills is None:
            reports.append(SourceReport("cgroup", "unreadable", f"no oom_kill counter in {a.path}"))
        else:
            cg_kills = (kills or 0) + (group_kills or 0)
            reports.append(
                SourceReport(
                    "cgroup",
                    "saw-kill" if cg_kills > 0 else "no-kill",
                    detail=f"{a.path}: oom_kill {b.oom_kill} -> {a.oom_kill}"
                    + (
                        f", oom_group_kill {b.oom_group_kill} -> {a.oom_group_kill}"
                        if a.version == "v2"
                        else ""
                    ),
                )
            )

    # logs
    window_start = death.died_at_s - LOG_WINDOW_BEFORE_S
    window_end = death.died_at_s + LOG_WINDOW_AFTER_S
    killer_lines: dict[str, list[str]] = {
        "kernel": [],
        "systemd-oomd": [],
        "earlyoom": [],
        "nohang": [],
    }
    kernel_kill: KernelOomLine | None = None
    kernel_summary: KernelOomLine | None = None
    kernel_cgroup: KernelOomLine | None = None  # before 4.19: ``Task in <cg> killed as ...``
    earlyoom_kill: EarlyoomKill | None = None
    nohang_kill: NohangLine | None = None
    nohang_rss: int | None = None
    oomd_hit: OomdLine | None = None
    unit_kernel_hit = False
    seen: set[str] = set()
    for source in logs:
        if source.status != "read":
            reports.append(SourceReport(source.name, source.status, source.reason))
            continue
        saw = False
        invoked: str | None = None  # the report's first line names the allocating task
        task_in: KernelOomLine | None = None  # the memcg line of the report under way
        # nohang names its victim a few lines before it acts: the block under way
        victim: list[str] = []
        victim_pid: int | None = None
        victim_rss: int | None = None
        for entry in source.entries:
            if entry.time_s is not None and not (window_start <= entry.time_s <= window_end):
                continue
            text = entry.text
            k = parse_kernel_line(text)
            if k is not None and k.kind == "invoked":
                invoked, task_in = text, None
                continue
            if k is not None and k.kind == "cgroup":
                task_in = k
                continue
            # a "chosen" victim may have had a child killed instead, and only a victim is
            # reaped after a "killed" line already seen: neither adds a kill of its own
            if k is not None and k.pid == death.pid:
                if k.kind == "killed":
                    kernel_kill = kernel_kill or k
                    kernel_cgroup = kernel_cgroup or task_in
                elif k.kind == "summary":
                    kernel_summary = kernel_summary or k
                if k.kind in ("killed", "summary"):
                    saw = True
                    for line in (invoked, task_in.text if task_in else None, text):
                        if line is not None and line not in seen:
                            seen.add(line)
                            killer_lines["kernel"].append(line)
                    invoked = task_in = None
                continue
            e = parse_earlyoom_line(text)
            if e is not None and e.pid == death.pid:
                earlyoom_kill = earlyoom_kill or e
                saw = True
                if text not in seen:
                    seen.add(text)
                    killer_lines["earlyoom"].append(text)
                continue
            if entry.origin is None or entry.origin.startswith("nohang"):
                n = parse_nohang_line(text)
                if n is not None and n.pid is not None:  # a victim line, or a whole block
                    victim, victim_pid, victim_rss = [text], n.pid, n.rss_bytes
                    if n.kind == "victim":
                        continue
                    victim = []
                if n is not None and n.kind == "rss" and victim_pid is not None:
                    victim.append(text)
                    victim_rss = n.rss_bytes
                    continue
                if n is not None and n.kind == "action":
                    if victim_pid == death.pid and nohang_kill is None:
                        nohang_kill, nohang_rss, saw = n, victim_rss, True
                        for line in (*victim, text):
                            if line not in seen:
                                seen.add(line)
                                killer_lines["nohang"].append(line)
                    victim, victim_pid, victim_rss = [], None, None
                    continue
            o = parse_oomd_line(text)
            if o is not None and _oomd_matches(
                o, before.cgroup.v2 if before.cgroup else None, unit
            ):
                if o.kind == "unit-oom":
                    unit_kernel_hit = unit_kernel_hit or o.kernel
                    if text not in seen:
                        seen.add(text)
                        killer_lines["kernel" if o.kernel else "systemd-oomd"].append(text)
                    saw = saw or o.kernel
                    continue
                oomd_hit = oomd_hit or o
                saw = True
                if text not in seen:
                    seen.add(text)
                    killer_lines["systemd-oomd"].append(text)
        reports.append(SourceReport(source.name, "saw-kill" if saw else "no-kill"))

    killer: Killer | None = None
    confidence: Confidence | None = None
    rss: int | None = None
    constraint: str | None = None
    cgroup_named: str | None = None
    if earlyoom_kill is not None:
        killer, confidence, rss = "earlyoom", "certain", earlyoom_kill.vm_rss_bytes
    elif nohang_kill is not None:
        killer, confidence, rss = "nohang", "certain", nohang_rss
    elif oomd_hit is not None and sig in (None, SIGKILL, SIGTERM):
        killer, confidence = "systemd-oomd", "certain"
        cgroup_named = oomd_hit.cgroup or oomd_hit.unit
    elif kernel_kill is not None or kernel_summary is not None:
        killer, confidence = "kernel", "certain"
        rss = kernel_kill.rss_bytes if kernel_kill else None
    elif killable and ((cg_kills or 0) > 0 or unit_kernel_hit):
        killer, confidence = "kernel", "probable"
    elif killable and (vm_delta or 0) > 0:
        killer, confidence = "kernel", "possible"
    if killer == "kernel":
        if kernel_summary is not None:
            constraint = kernel_summary.constraint
            cgroup_named = kernel_summary.oom_memcg or kernel_summary.task_memcg
        if kernel_kill is not None and kernel_kill.scope == "memcg" and constraint is None:
            constraint = "CONSTRAINT_MEMCG"
        if cgroup_named is None and kernel_cgroup is not None:
            cgroup_named = kernel_cgroup.oom_memcg
            constraint = constraint or "CONSTRAINT_MEMCG"
        if cgroup_named is None and (cg_kills or 0) > 0:
            cgroup_named = cgroup_path
    lines = tuple(killer_lines[killer]) if killer else ()
    evidence = KillEvidence(
        pid=death.pid,
        killer=killer,
        confidence=confidence,
        sources=tuple(reports),
        lines=lines,
        victim_rss_bytes=rss,
        constraint=constraint,
        cgroup=cgroup_named,
    )
    return _with_summary(evidence, death)


def evidence_gaps(ev: KillEvidence) -> tuple[str, ...]:
    """The killers that this evidence cannot rule out because their source could not be read
    (pure). Empty: every killer that can exist here was checked, so "no killer" means none.

    The kernel's kills (global or in a memory cgroup) all count in ``/proc/vmstat`` and in the
    process's cgroup, and are logged to ``/dev/kmsg``: one of the three read rules it out.
    systemd-oomd, earlyoom and nohang only tell the journal; a machine without a journal has no
    systemd-oomd and an earlyoom or nohang whose log we could not read anyway, so only a journal
    that is there and unreadable leaves them open.
    """
    status = {r.source: r.status for r in ev.sources}
    read = ("saw-kill", "no-kill")
    gaps: list[str] = []
    if not any(status.get(s) in read for s in ("vmstat", "cgroup", "kmsg")):
        gaps.append("kernel")
    if status.get("journal") not in (*read, "unavailable"):
        gaps.append("systemd-oomd/earlyoom/nohang")
    return tuple(gaps)


def _with_summary(ev: KillEvidence, death: ProcessDeath) -> KillEvidence:
    how = ""
    if death.signal is not None:
        how = f" (signal {death.signal})"
    elif death.exit_code is not None:
        how = f" (exit status {death.exit_code})"
    if ev.killer is None:
        if any(r.status == "saw-kill" for r in ev.sources):
            text = (
                f"process {ev.pid} ended{how}; an OOM kill happened on this machine meanwhile, "
                "but nothing ties it to this process"
            )
        else:
            text = f"process {ev.pid} ended{how}; no source shows an OOM kill"
        unread = [
            f"{r.source} {r.label}" for r in ev.sources if r.status in ("unreadable", "unavailable")
        ]
        if unread:
            text += "; could not check: " + ", ".join(unread)
    else:
        who = {
            "kernel": "the kernel OOM killer",
            "systemd-oomd": "systemd-oomd",
            "earlyoom": "earlyoom",
            "nohang": "nohang",
        }[ev.killer]
        text = f"process {ev.pid} was killed{how} by {who} ({ev.confidence})"
        if ev.constraint == "CONSTRAINT_MEMCG" and ev.cgroup:
            text += f": memory cgroup limit of {ev.cgroup}"
        elif ev.killer == "systemd-oomd" and ev.cgroup:
            text += f": it killed {ev.cgroup}"
        if ev.victim_rss_bytes is not None:
            text += f"; RSS at the kill {ev.victim_rss_bytes / 2**20:.0f} MiB"
    return dataclasses.replace(ev, summary=text)


def collect_kill_evidence(
    death: ProcessDeath,
    before: LiveReadings,
    *,
    roots: SystemRoots | None = None,
    journalctl: str = "journalctl",
    read_logs: bool = True,
    clock: Callable[[], float] = time.time,
    monotonic_epoch_s: float | None = None,
) -> KillEvidence:
    """Read the counters again and the logs around the death, then ``assess_kill``."""
    r = roots if roots is not None else SystemRoots()
    after = read_after(before, r, clock=clock)
    logs: list[LogSource] = []
    if read_logs:
        since = death.died_at_s - LOG_WINDOW_BEFORE_S
        logs.append(read_kmsg(r, since_s=since, monotonic_epoch_s=monotonic_epoch_s))
        logs.append(
            read_journal(
                since, death.died_at_s + LOG_WINDOW_AFTER_S, roots=r, journalctl=journalctl
            )
        )
    return assess_kill(death, before, after, logs)
