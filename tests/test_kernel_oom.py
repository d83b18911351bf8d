"""Evidence of OOM kills: parsers over real log formats, readers over fixture trees, the killer
decision, and (where the machine allows a memory cgroup) a real kernel OOM kill."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import oom_sentinel.daemon.kernel.lines as kernel_lines_module
import oom_sentinel.daemon.kernel.oom as kernel_oom_module
from oom_sentinel.daemon.kernel.lines import KernelOomLine, parse_kernel_line
from oom_sentinel.daemon.kernel.nohang import parse_nohang_line
from oom_sentinel.daemon.kernel.oom import (
    CgroupPaths,
    LiveReadings,
    LogEntry,
    LogSource,
    OomCounters,
    ProcessDeath,
    SystemRoots,
    assess_kill,
    capture_readings,
    collect_kill_evidence,
    parse_earlyoom_line,
    parse_journal_json,
    parse_kmsg,
    parse_memory_events,
    parse_oom_control,
    parse_oomd_line,
    parse_proc_cgroup,
    parse_vmstat_oom_kill,
    read_after,
    read_journal,
    read_kmsg,
    unit_of,
)

MiB = 1024**2
PID = 9144
UNIT_CG = "/system.slice/comfyui.service"
UNIT_PATHS = CgroupPaths(v2=UNIT_CG)

# Lines as the kernel prints them (comfyui-facts §11 and a memcg kill recorded on this machine).
INVOKED = "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
SUMMARY_MEMCG = (
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    f"oom_memcg={UNIT_CG},task_memcg={UNIT_CG},task=python3,pid={PID},uid=1000"
)
KILLED_MEMCG = (
    f"Memory cgroup out of memory: Killed process {PID} (python3) total-vm:82132kB, "
    "anon-rss:65152kB, file-rss:6648kB, shmem-rss:0kB, UID:1000 pgtables:188kB oom_score_adj:0"
)
SUMMARY_GLOBAL = (
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
    f"task_memcg=/user.slice/user-1000.slice/session-2.scope,task=python,pid={PID},uid=1000"
)
KILLED_GLOBAL = (
    f"Out of memory: Killed process {PID} (python) total-vm:30000000kB, anon-rss:20480000kB, "
    "file-rss:1024kB, shmem-rss:0kB, UID:1000 pgtables:40000kB oom_score_adj:0"
)


# -- kernel lines ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "pid", "scope"),
    [
        (INVOKED, "invoked", None, None),
        ("[ 8274.081234] " + INVOKED, "invoked", None, None),
        (SUMMARY_MEMCG, "summary", PID, "memcg"),
        (SUMMARY_GLOBAL, "summary", PID, "global"),
        (KILLED_MEMCG, "killed", PID, "memcg"),
        (KILLED_GLOBAL, "killed", PID, "global"),
        ("[12345.678901] " + KILLED_GLOBAL, "killed", PID, "global"),
        (
            # kernels before 4.19 end the line after shmem-rss
            "Out of memory: Killed process 77 (python) total-vm:100kB, anon-rss:50kB, "
            "file-rss:10kB, shmem-rss:0kB",
            "killed",
            77,
            "global",
        ),
        (
            # older kernels: "Kill process ... or sacrifice child", then a bare "Killed process"
            "Killed process 78 (python) total-vm:100kB, anon-rss:50kB, file-rss:10kB",
            "killed",
            78,
            None,
        ),
        (
            "oom_reaper: reaped process 9144 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
            "reaped",
            PID,
            None,
        ),
        ("Web Content invoked oom-killer: gfp_mask=0x140dca, order=0", "invoked", None, None),
    ],
    ids=[
        "invoked",
        "invoked-dmesg-prefix",
        "summary-memcg",
        "summary-global",
        "killed-memcg",
        "killed-global",
        "killed-dmesg-prefix",
        "killed-pre-4.19",
        "killed-bare-old",
        "reaped",
        "invoked-comm-with-space",
    ],
)
def test_kernel_oom_lines(text: str, kind: str, pid: int | None, scope: str | None) -> None:
    line = parse_kernel_line(text)
    assert line is not None
    assert (line.kind, line.pid, line.scope) == (kind, pid, scope)


def test_kernel_kill_line_fields() -> None:
    line = parse_kernel_line(KILLED_MEMCG)
    assert line is not None and line.comm == "python3"
    assert dict(line.kib)["total-vm"] == 82132
    assert line.rss_bytes == (65152 + 6648 + 0) * 1024
    summary = parse_kernel_line(SUMMARY_MEMCG)
    assert summary is not None
    assert summary.constraint == "CONSTRAINT_MEMCG"
    assert summary.oom_memcg == UNIT_CG and summary.task_memcg == UNIT_CG
    assert summary.comm == "python3"
    assert parse_kernel_line("Web Content invoked oom-killer: x") == KernelOomLine(
        "invoked", "Web Content invoked oom-killer: x", comm="Web Content"
    )


@pytest.mark.parametrize(
    "text",
    [
        "usb 1-1: new high-speed USB device number 5",
        "Out of memory: Kill process 1234 (python) score 900 or sacrifice child",
        "",
        "oom-kill",
    ],
    ids=["unrelated", "old-choose-line", "empty", "truncated"],
)
def test_lines_that_are_not_kill_records(text: str) -> None:
    line = parse_kernel_line(text)
    assert line is None or line.kind not in ("killed", "invoked")


# -- systemd-oomd and earlyoom -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "cgroup", "unit", "count"),
    [
        (
            "Killed /user.slice/user-1000.slice/user@1000.service/app.slice/comfy.scope due to "
            "memory pressure for /user.slice/user-1000.slice/user@1000.service being 57.97% > "
            "50.00% for > 20s with reclaim activity",
            "killed-cgroup",
            "/user.slice/user-1000.slice/user@1000.service/app.slice/comfy.scope",
            None,
            None,
        ),
        (
            "Killed /system.slice/comfyui.service due to swap used (7516192768) / total "
            "(8589934592) being more than 90.00%",
            "killed-cgroup",
            "/system.slice/comfyui.service",
            None,
            None,
        ),
        (
            "comfyui.service: systemd-oomd killed 3 process(es) in this unit.",
            "unit-killed",
            None,
            "comfyui.service",
            3,
        ),
        (
            "comfyui.service: A process of this unit has been killed by the OOM killer.",
            "unit-oom",
            None,
            "comfyui.service",
            None,
        ),
        (
            "comfyui.service: Failed with result 'oom-kill'.",
            "unit-oom",
            None,
            "comfyui.service",
            None,
        ),
    ],
    ids=["pressure", "swap", "unit-count", "unit-kernel-kill", "unit-result"],
)
def test_oomd_lines(
    text: str, kind: str, cgroup: str | None, unit: str | None, count: int | None
) -> None:
    line = parse_oomd_line(text)
    assert line is not None
    assert (line.kind, line.cgroup, line.unit, line.count) == (kind, cgroup, unit, count)


@pytest.mark.parametrize(
    ("text", "pid", "signal", "uid", "rss_mib"),
    [
        (
            'sending SIGTERM to process 1234 uid 1000 "python": oom_score 900, oom_score_adj 0, '
            'VmRSS 20000 MiB, cmdline "python main.py --listen"',
            1234,
            "SIGTERM",
            1000,
            20000,
        ),
        (
            'sending SIGKILL to process 1234 uid 1000 "python": oom_score 900, VmRSS 20000 MiB, '
            'cmdline "python main.py"',
            1234,
            "SIGKILL",
            1000,
            20000,
        ),
        (
            'sending SIGTERM to process 1234 uid 1000 "python": badness 900, VmRSS 20000 MiB, '
            'cmdline "python main.py"',
            1234,
            "SIGTERM",
            1000,
            20000,
        ),
        (
            'sending SIGTERM to process 1234 uid 1000 "python": badness 900, VmRSS 20000 MiB',
            1234,
            "SIGTERM",
            1000,
            20000,
        ),
        (
            'sending SIGTERM to process 1234 "python": badness 900, VmRSS 20000 MiB',
            1234,
            "SIGTERM",
            None,
            20000,
        ),
        (
            'killing process 1234 "python" with signal 15: badness 900, VmRSS 20000 MiB',
            1234,
            "SIGTERM",
            None,
            20000,
        ),
        (
            "Killing process 'python' with signal 15, pid: 1234, badness: 538, VmRSS: 20000 MiB",
            1234,
            "SIGTERM",
            None,
            20000,
        ),
    ],
    ids=["v1.9", "v1.8-oom-score", "2024-badness-cmdline", "2020-uid", "2019", "pre-2019", "v1.0"],
)
def test_earlyoom_kill_lines(
    text: str, pid: int, signal: str, uid: int | None, rss_mib: int
) -> None:
    kill = parse_earlyoom_line(text)
    assert kill is not None
    assert (kill.pid, kill.signal, kill.uid, kill.name) == (pid, signal, uid, "python")
    assert kill.vm_rss_bytes == rss_mib * MiB


def test_earlyoom_kill_line_cut_inside_its_rss_is_still_a_kill() -> None:
    """A paste cut inside the VmRSS figure still names the victim; its size is not shown."""
    kill = parse_earlyoom_line(
        'earlyoom[26328]: sending SIGTERM to process 63745 uid 1000 "python3": badness 748, VmRSS 538'
    )
    assert kill is not None
    assert (kill.pid, kill.name, kill.vm_rss_bytes) == (63745, "python3", None)
    # a figure followed by anything but its unit is no kill line of earlyoom's
    assert (
        parse_earlyoom_line(
            'sending SIGTERM to process 63745 uid 1000 "python3": badness 748, VmRSS 538 pages'
        )
        is None
    )


def test_earlyoom_self_test_and_reports_are_not_kills() -> None:
    selftest = (
        'sending 0 (no-op signal) to process 1 uid 0 "systemd": oom_score 0, oom_score_adj 0, '
        'VmRSS 10 MiB, cmdline "/sbin/init"'
    )
    assert parse_earlyoom_line(selftest) is None
    assert (
        parse_earlyoom_line("mem avail: 20000 of 31000 MiB (64.00%), swap free: 0 of 0 MiB") is None
    )


def test_nohang_victim_block_lines() -> None:
    """nohang 0.2's and 0.1's wordings (its source, src/nohang; the corpus's journals)."""
    new = parse_nohang_line(
        "  PID:       12297, name: python3, state: S, EUID: 1000, SID: 57 (bash)"
    )
    assert new is not None and (new.kind, new.pid, new.name) == ("victim", 12297, "python3")
    old = parse_nohang_line("  PID: 12297, Name: tail, badness: 727")
    assert old is not None and (old.kind, old.pid, old.name) == ("victim", 12297, "tail")
    rss = parse_nohang_line("  Vm, MiB:   Size: 9349, RSS: 8939, Swap: 384")
    assert rss is not None and rss.rss_bytes == 8939 * MiB
    rss_old = parse_nohang_line(
        "  VmRSS:     8939 MiB  (Anon: 8934 MiB, File: 6 MiB, Shmem: 0 MiB)"
    )
    assert rss_old is not None and rss_old.rss_bytes == 8939 * MiB
    for action in (
        "  Sending SIGTERM to the victim",
        "  Send SIGKILL to the victim; total response time: 609 ms",
    ):
        n = parse_nohang_line(action)
        assert n is not None and n.kind == "action" and n.signal in ("SIGTERM", "SIGKILL")
    for other in (
        "The victim doesn't respond on corrective action in 10.034 sec",
        "  Run the command: kill -TERM 12297",
        "MemAvailable: 113.6 MiB, SwapFree: 182.7 MiB",
    ):
        assert parse_nohang_line(other) is None


# -- counters and cgroup files ----------------------------------------------------------------------


def test_vmstat_counter() -> None:
    assert parse_vmstat_oom_kill("pgfault 1\noom_kill 7\npgmajfault 2\n") == 7
    assert parse_vmstat_oom_kill("pgfault 1\n") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0::/system.slice/comfyui.service\n", CgroupPaths(v2="/system.slice/comfyui.service")),
        (
            "12:memory:/user.slice\n1:name=systemd:/user.slice/s.scope\n0::/user.slice/s.scope\n",
            CgroupPaths(v2="/user.slice/s.scope", v1_memory="/user.slice"),
        ),
        ("4:memory:/process_api/abc\n3:cpuset:/\n", CgroupPaths(v1_memory="/process_api/abc")),
        ("5:cpu,memory:/x\n", CgroupPaths(v1_memory="/x")),
        ("garbage", CgroupPaths()),
    ],
    ids=["v2", "hybrid", "v1", "v1-joined-controllers", "garbage"],
)
def test_proc_cgroup(text: str, expected: CgroupPaths) -> None:
    assert parse_proc_cgroup(text) == expected


def test_memory_events_and_oom_control() -> None:
    v2 = parse_memory_events("low 0\nhigh 12\nmax 40\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert (v2.version, v2.oom, v2.oom_kill, v2.oom_group_kill) == ("v2", 3, 2, 0)
    old_v2 = parse_memory_events("low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n")
    assert old_v2.oom_group_kill is None
    v1 = parse_oom_control("oom_kill_disable 0\nunder_oom 1\noom_kill 4\n")
    assert (v1.version, v1.oom_kill, v1.under_oom) == ("v1", 4, True)


def test_unit_of_cgroup_path() -> None:
    assert unit_of("/system.slice/comfyui.service") == "comfyui.service"
    assert (
        unit_of("/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope")
        == "run-r1.scope"
    )
    assert unit_of("/process_api/abc") is None
    assert unit_of(None) is None


# -- kmsg and journal formats ----------------------------------------------------------------------


def test_kmsg_records_and_continuation_lines() -> None:
    text = (
        "6,339,5140900,-;NET: Registered protocol family 10\n"
        " SUBSYSTEM=net\n"
        " DEVICE=n1\n"
        f"3,422,827408379,-;{KILLED_MEMCG}\n"
        "not a record\n"
    )
    records = parse_kmsg(text)
    assert [(r.seq, r.level) for r in records] == [(339, 6), (422, 3)]
    assert records[1].text == KILLED_MEMCG
    assert records[1].monotonic_us == 827408379


def test_journal_json_entries() -> None:
    lines = [
        {
            "MESSAGE": KILLED_GLOBAL,
            "_TRANSPORT": "kernel",
            "__REALTIME_TIMESTAMP": "1767225600000000",
        },
        {
            "MESSAGE": "systemd-oomd killed 3 process(es) in this unit.",
            "SYSLOG_IDENTIFIER": "systemd",
            "UNIT": "comfyui.service",
            "__REALTIME_TIMESTAMP": "1767225601000000",
        },
        {"MESSAGE": list(b"caf\xe9 bytes"), "SYSLOG_IDENTIFIER": "earlyoom"},
        {"NO_MESSAGE": 1},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n"
    entries = parse_journal_json(text)
    assert entries[0] == LogEntry(KILLED_GLOBAL, 1767225600.0, "kernel")
    assert entries[1].text == "comfyui.service: systemd-oomd killed 3 process(es) in this unit."
    assert entries[2].text == "caf\ufffd bytes" and entries[2].time_s is None
    assert len(entries) == 3


# -- readers on fixture trees ------------------------------------------------------------------------


def fixture_tree(
    root: Path,
    *,
    pid: int = PID,
    vmstat: int | None = 5,
    proc_cgroup: str | None = f"0::{UNIT_CG}\n",
    v2_events: str | None = "oom 0\noom_kill 0\noom_group_kill 0\n",
    v1_control: str | None = None,
    v1_path: str = "/process_api/abc",
) -> SystemRoots:
    proc = root / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / "vmstat").write_text(
        "nr_free_pages 1\n" + (f"oom_kill {vmstat}\n" if vmstat is not None else "")
    )
    if proc_cgroup is not None:
        (proc / str(pid) / "cgroup").write_text(proc_cgroup)
    cg = root / "cgroup"
    cg.mkdir(exist_ok=True)
    if v2_events is not None:
        d = cg / UNIT_CG.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.events").write_text(v2_events)
    if v1_control is not None:
        d = cg / "memory" / v1_path.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.oom_control").write_text(v1_control)
    return SystemRoots(proc=proc, cgroup=cg, kmsg=root / "kmsg", journal_dirs=(root / "journal",))


def bump(
    roots: SystemRoots, *, vmstat: int | None = None, v2: str | None = None, v1: str | None = None
) -> None:
    if vmstat is not None:
        (roots.proc / "vmstat").write_text(f"oom_kill {vmstat}\n")
    if v2 is not None:
        (roots.cgroup / UNIT_CG.lstrip("/") / "memory.events").write_text(v2)
    if v1 is not None:
        (roots.cgroup / "memory" / "process_api/abc" / "memory.oom_control").write_text(v1)


def test_capture_reads_v2_counters_of_the_process_cgroup(tmp_path: Path) -> None:
    roots = fixture_tree(tmp_path)
    live = capture_readings(PID, roots, clock=lambda: 100.0)
    assert live.vmstat_oom_kill == 5
    assert live.cgroup == CgroupPaths(v2=UNIT_CG)
    assert (
        live.counters is not None and live.counters.version == "v2" and live.counters.oom_kill == 0
    )


def test_capture_reads_v1_oom_control(tmp_path: Path) -> None:
    roots = fixture_tree(
        tmp_path,
        proc_cgroup="4:memory:/process_api/abc\n0::/\n",
        v2_events=None,
        v1_control="oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    )
    live = capture_readings(PID, roots)
    assert live.counters == OomCounters(
        "v1",
        oom_kill=1,
        under_oom=False,
        path=str(roots.cgroup / "memory/process_api/abc/memory.oom_control"),
    )


def test_counters_after_death_use_the_cgroup_captured_while_alive(tmp_path: Path) -> None:
    roots = fixture_tree(tmp_path)
    before = capture_readings(PID, roots)
    (roots.proc / str(PID) / "cgroup").unlink()  # the process is gone
    bump(roots, vmstat=6, v2="oom 1\noom_kill 1\noom_group_kill 0\n")
    after = read_after(before, roots)
    assert after.vmstat_oom_kill == 6
    assert after.counters is not None and after.counters.oom_kill == 1


def test_missing_files_are_reasons_not_zeros(tmp_path: Path) -> None:
    roots = fixture_tree(tmp_path, vmstat=None, proc_cgroup=None, v2_events=None)
    live = capture_readings(PID, roots)
    assert live.vmstat_oom_kill is None and "4.13" in (live.vmstat_error or "")
    assert live.counters is None and "does not exist" in (live.counters_error or "")


def test_read_kmsg_from_a_fixture_file(tmp_path: Path) -> None:
    roots = fixture_tree(tmp_path)
    roots.kmsg.write_text(f"6,1,1000000,-;{INVOKED}\n3,2,2000000,-;{KILLED_MEMCG}\n SUBSYSTEM=x\n")
    source = read_kmsg(roots, monotonic_epoch_s=1000.0)
    assert source.status == "read"
    assert [(e.text, e.time_s) for e in source.entries] == [
        (INVOKED, 1001.0),
        (KILLED_MEMCG, 1002.0),
    ]
    recent = read_kmsg(roots, since_s=1001.5, monotonic_epoch_s=1000.0)
    assert [e.text for e in recent.entries] == [KILLED_MEMCG]


def test_kmsg_that_does_not_exist_is_unavailable(tmp_path: Path) -> None:
    source = read_kmsg(SystemRoots(kmsg=tmp_path / "nope"))
    assert source.status == "unavailable"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_kmsg_without_permission_is_unreadable_not_no_kill(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"3,2,2000000,-;{KILLED_MEMCG}\n")
    kmsg.chmod(0o600)
    if os.geteuid() != 0:
        kmsg.chmod(0)
        source = read_kmsg(SystemRoots(kmsg=kmsg))
        status, reason = source.status, source.reason or ""
    else:
        # root reads anything: ask an unprivileged user, as a service account would be. The
        # module needs only the standard library, so a copy runs under the system Python
        # (this interpreter may live where that user cannot reach).
        system_python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if system_python is None:
            pytest.skip("no system python3 for an unprivileged run")
        shared = Path(tempfile.mkdtemp(prefix="oom-sentinel-kmsg-"))  # pytest's tmp is 0700
        try:
            shared.chmod(0o755)
            shutil.copy(kmsg, shared / "kmsg")
            (shared / "kmsg").chmod(0o600)
            # the module and the one it imports (kernel/lines.py), in their package
            package = shared / "oom_sentinel" / "daemon" / "kernel"
            package.mkdir(parents=True)
            for folder in (package, package.parent, package.parent.parent):
                folder.chmod(0o755)
                (folder / "__init__.py").write_text("")
                (folder / "__init__.py").chmod(0o644)
            for module in (kernel_oom_module.__file__, kernel_lines_module.__file__):
                shutil.copy(module, package / Path(module).name)
                (package / Path(module).name).chmod(0o644)
            code = (
                f"import sys; sys.path.insert(0, {str(shared)!r}); from pathlib import Path;"
                "from oom_sentinel.daemon.kernel.oom import read_kmsg, SystemRoots;"
                f"s = read_kmsg(SystemRoots(kmsg=Path({str(shared / 'kmsg')!r})));"
                "print(s.status); print(s.reason)"
            )
            try:
                out = subprocess.run(
                    [system_python, "-B", "-c", code],
                    user=65534,
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd="/",
                ).stdout.splitlines()
            except (subprocess.CalledProcessError, PermissionError, OSError) as exc:
                pytest.skip(f"cannot run a process as an unprivileged user here: {exc}")
        finally:
            shutil.rmtree(shared, ignore_errors=True)
        status, reason = out[0], out[1]
    assert status == "unreadable"
    assert "permission denied" in reason and "CAP_SYSLOG" in reason


def fake_journalctl(
    tmp_path: Path, *, stdout: str = "", stderr: str = "", code: int = 0, sleep_s: float = 0
) -> str:
    """A real executable standing in for journalctl, answering as scripted."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "journalctl"
    (tmp_path / "out.json").write_text(stdout)
    (tmp_path / "err.txt").write_text(stderr)
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import sys, time
            time.sleep({sleep_s})
            open({str(tmp_path / "argv.txt")!r}, "w").write("\\n".join(sys.argv[1:]))
            sys.stdout.write(open({str(tmp_path / "out.json")!r}).read())
            sys.stderr.write(open({str(tmp_path / "err.txt")!r}).read())
            sys.exit({code})
            """
        )
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def journal_roots(tmp_path: Path) -> SystemRoots:
    machine = tmp_path / "journal" / "0123456789abcdef"
    machine.mkdir(parents=True)
    (machine / "system.journal").write_bytes(b"LPKSHHRH")
    return SystemRoots(journal_dirs=(tmp_path / "journal",))


def test_journal_lines_are_read_through_journalctl(
    tmp_path: Path, journal_roots: SystemRoots
) -> None:
    out = json.dumps(
        {"MESSAGE": KILLED_GLOBAL, "_TRANSPORT": "kernel", "__REALTIME_TIMESTAMP": "5000000"}
    )
    exe = fake_journalctl(tmp_path, stdout=out + "\n")
    source = read_journal(1000.5, 2000.0, roots=journal_roots, journalctl=exe)
    assert source.status == "read" and [e.text for e in source.entries] == [KILLED_GLOBAL]
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv[argv.index("--since") + 1] == "@1000" and argv[argv.index("--until") + 1] == "@2001"
    assert "-o" in argv and "json" in argv and "SYSLOG_IDENTIFIER=earlyoom" in argv
    assert "SYSLOG_IDENTIFIER=nohang" in argv and "SYSLOG_IDENTIFIER=nohang-desktop" in argv


def test_journal_this_user_may_not_read_is_unreadable(
    tmp_path: Path, journal_roots: SystemRoots
) -> None:
    hint = (
        "Hint: You are currently not seeing messages from other users and the system.\n"
        "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
    )
    exe = fake_journalctl(tmp_path, stderr=hint)
    source = read_journal(0, roots=journal_roots, journalctl=exe)
    assert source.status == "unreadable" and "systemd-journal" in (source.reason or "")


def test_journalctl_failing_or_hanging_is_unreadable(
    tmp_path: Path, journal_roots: SystemRoots
) -> None:
    failing = fake_journalctl(tmp_path / "a", stderr="Failed to open: boom\n", code=1)
    source = read_journal(0, roots=journal_roots, journalctl=failing)
    assert source.status == "unreadable" and "boom" in (source.reason or "")
    slow = fake_journalctl(tmp_path / "b", sleep_s=10)
    source = read_journal(0, roots=journal_roots, journalctl=slow, timeout_s=0.5)
    assert source.status == "unreadable" and "did not answer" in (source.reason or "")


def test_no_journalctl_or_no_journal_is_unavailable(
    tmp_path: Path, journal_roots: SystemRoots
) -> None:
    missing = read_journal(0, roots=journal_roots, journalctl=str(tmp_path / "no-such-journalctl"))
    assert missing.status == "unavailable"
    empty = read_journal(0, roots=SystemRoots(journal_dirs=(tmp_path / "none",)))
    assert empty.status == "unavailable" and "no systemd journal" in (empty.reason or "")


# -- the decision -----------------------------------------------------------------------------------


def readings(
    *,
    vm: int | None = 5,
    kills: int | None = 0,
    group: int | None = 0,
    cgroup: CgroupPaths | None = UNIT_PATHS,
    t: float = 1000.0,
    counters_error: str | None = None,
) -> LiveReadings:
    counters = (
        None
        if kills is None and group is None
        else OomCounters(
            "v2", oom=kills, oom_kill=kills, oom_group_kill=group, path="/cg/memory.events"
        )
    )
    return LiveReadings(
        pid=PID,
        time_s=t,
        vmstat_oom_kill=vm,
        vmstat_error=None if vm is not None else "permission denied reading /proc/vmstat",
        cgroup=cgroup,
        counters=counters,
        counters_error=counters_error if counters is None else None,
    )


def log(name: str, *texts: str, t: float = 1005.0) -> LogSource:
    return LogSource(name, "read", entries=tuple(LogEntry(x, t, None) for x in texts))


KILLED = ProcessDeath(PID, died_at_s=1006.0, signal=9)


def labels(ev: object) -> dict[str, str]:
    return {r.source: r.label for r in ev.sources}  # type: ignore[attr-defined]


def test_kernel_line_naming_the_pid_is_certain() -> None:
    ev = assess_kill(
        KILLED,
        readings(vm=5, kills=0),
        readings(vm=6, kills=1, t=1007),
        [
            log(
                "kmsg",
                INVOKED,
                SUMMARY_MEMCG,
                KILLED_MEMCG,
                "oom_reaper: reaped process 9144 (python3)",
            )
        ],
    )
    assert (ev.killer, ev.confidence) == ("kernel", "certain")
    assert ev.lines == (INVOKED, SUMMARY_MEMCG, KILLED_MEMCG)
    assert ev.constraint == "CONSTRAINT_MEMCG" and ev.cgroup == UNIT_CG
    assert ev.victim_rss_bytes == (65152 + 6648) * 1024
    assert labels(ev) == {"vmstat": "saw-kill", "cgroup": "saw-kill", "kmsg": "saw-kill"}
    assert "kernel OOM killer" in ev.summary and UNIT_CG in ev.summary


def test_global_kernel_kill_from_the_journal() -> None:
    ev = assess_kill(
        ProcessDeath(PID, 1006.0),  # not our child: no exit status
        readings(
            vm=5,
            kills=None,
            group=None,
            cgroup=None,
            counters_error="the process has no memory cgroup",
        ),
        readings(
            vm=6,
            kills=None,
            group=None,
            cgroup=None,
            counters_error="the process has no memory cgroup",
        ),
        [
            LogSource("kmsg", "unreadable", "permission denied"),
            log("journal", SUMMARY_GLOBAL, KILLED_GLOBAL),
        ],
    )
    assert (ev.killer, ev.confidence, ev.constraint) == ("kernel", "certain", "CONSTRAINT_NONE")
    assert labels(ev) == {
        "vmstat": "saw-kill",
        "cgroup": "unavailable(the process has no memory cgroup)",
        "kmsg": "unreadable(permission denied)",
        "journal": "saw-kill",
    }


def test_own_cgroup_counter_without_logs_is_probable() -> None:
    ev = assess_kill(
        KILLED,
        readings(vm=5, kills=2),
        readings(vm=6, kills=3),
        [
            LogSource("kmsg", "unreadable", "permission denied"),
            LogSource("journal", "unavailable", "no journal"),
        ],
    )
    assert (ev.killer, ev.confidence, ev.cgroup) == ("kernel", "probable", UNIT_CG)
    assert ev.lines == ()


def test_group_kill_counts_as_a_cgroup_kill() -> None:
    ev = assess_kill(KILLED, readings(group=0), readings(group=1), [])
    assert (ev.killer, ev.confidence) == ("kernel", "probable")


def test_only_the_global_counter_is_possible() -> None:
    ev = assess_kill(KILLED, readings(vm=5), readings(vm=7), [])
    assert (ev.killer, ev.confidence) == ("kernel", "possible")
    assert labels(ev)["cgroup"] == "no-kill"


def test_normal_exit_is_not_blamed_on_someone_elses_oom_kill() -> None:
    death = ProcessDeath(PID, 1006.0, exit_code=0)
    ev = assess_kill(death, readings(vm=5), readings(vm=6), [log("kmsg", "unrelated line")])
    assert ev.killer is None
    assert labels(ev)["vmstat"] == "saw-kill"
    assert "nothing ties it to this process" in ev.summary


def test_kill_of_another_pid_is_no_kill_for_this_one() -> None:
    other = KILLED_GLOBAL.replace(str(PID), "31337")
    ev = assess_kill(KILLED, readings(vm=5), readings(vm=5), [log("journal", other)])
    assert ev.killer is None and labels(ev)["journal"] == "no-kill"


def test_lines_outside_the_death_window_are_ignored() -> None:
    stale = LogSource(
        "journal", "read", entries=(LogEntry(KILLED_GLOBAL, 1006.0 - 3600, "kernel"),)
    )
    ev = assess_kill(KILLED, readings(), readings(), [stale])
    assert ev.killer is None and labels(ev)["journal"] == "no-kill"


def test_systemd_oomd_killing_the_unit_cgroup() -> None:
    lines = (
        f"Killed {UNIT_CG} due to memory pressure for /system.slice being 61.20% > 50.00% for > 20s "
        "with reclaim activity",
        "comfyui.service: systemd-oomd killed 2 process(es) in this unit.",
    )
    ev = assess_kill(KILLED, readings(), readings(), [log("journal", *lines)])
    assert (ev.killer, ev.confidence, ev.cgroup) == ("systemd-oomd", "certain", UNIT_CG)
    assert ev.lines == lines
    assert labels(ev)["journal"] == "saw-kill"


def test_systemd_oomd_killing_a_parent_slice_covers_the_process() -> None:
    line = "Killed /system.slice due to swap used (9) / total (10) being more than 90.00%"
    ev = assess_kill(KILLED, readings(), readings(), [log("journal", line)])
    assert ev.killer == "systemd-oomd"


def test_systemd_oomd_killing_a_sibling_is_not_ours() -> None:
    line = "Killed /system.slice/other.service due to swap used (9) / total (10) being more than 90.00%"
    ev = assess_kill(KILLED, readings(), readings(), [log("journal", line)])
    assert ev.killer is None


def test_unit_kernel_kill_line_without_pid_is_probable() -> None:
    line = "comfyui.service: A process of this unit has been killed by the OOM killer."
    ev = assess_kill(KILLED, readings(), readings(), [log("journal", line)])
    assert (ev.killer, ev.confidence) == ("kernel", "probable")


def test_earlyoom_naming_the_pid() -> None:
    line = (
        f'sending SIGTERM to process {PID} uid 1000 "python": oom_score 900, oom_score_adj 0, '
        'VmRSS 20000 MiB, cmdline "python main.py"'
    )
    death = ProcessDeath(PID, 1006.0, signal=15)
    ev = assess_kill(death, readings(), readings(), [log("journal", line)])
    assert (ev.killer, ev.confidence) == ("earlyoom", "certain")
    assert ev.victim_rss_bytes == 20000 * MiB and ev.lines == (line,)


def _nohang_block(pid: int) -> tuple[str, ...]:
    return (
        "Victim status (found in 3ms):",
        f"  PID:       {pid}, name: python, state: R, EUID: 1000, SID: 57 (bash), lifetime: 1h",
        "  badness:   900, oom_score:  900, oom_score_adj:  0",
        "  Vm, MiB:   Size: 21000, RSS: 20000, Swap: 0",
        "Implementing a corrective action:",
        "  Sending SIGTERM to the victim",
        "OK; total response time: 12ms",
    )


def test_nohang_naming_the_pid() -> None:
    """nohang names its victim in a block, then acts: the kill is ours when the block names
    our pid; a block about another process, then ours dying, is no nohang kill of ours."""
    death = ProcessDeath(PID, 1006.0, signal=15)
    block = _nohang_block(PID)
    entries = tuple(LogEntry(x, 1005.0, "nohang") for x in block)
    ev = assess_kill(death, readings(), readings(), [LogSource("journal", "read", entries=entries)])
    assert (ev.killer, ev.confidence) == ("nohang", "certain")
    assert ev.victim_rss_bytes == 20000 * MiB
    assert ev.lines == (block[1], block[3], block[5])
    assert "by nohang (certain)" in ev.summary and labels(ev)["journal"] == "saw-kill"
    other = tuple(LogEntry(x, 1005.0, "nohang-desktop") for x in _nohang_block(PID + 1))
    ev = assess_kill(death, readings(), readings(), [LogSource("journal", "read", entries=other)])
    assert ev.killer is None
    # the block logged as one message (syslog) names the victim and the action at once
    whole = LogSource("journal", "read", entries=(LogEntry("\n".join(block), 1005.0, "nohang"),))
    ev = assess_kill(death, readings(), readings(), [whole])
    assert (ev.killer, ev.victim_rss_bytes) == ("nohang", 20000 * MiB)
    # a victim block printed by another program is not nohang's
    foreign = tuple(LogEntry(x, 1005.0, "someapp") for x in block)
    ev = assess_kill(death, readings(), readings(), [LogSource("journal", "read", entries=foreign)])
    assert ev.killer is None


def test_nothing_readable_is_never_reported_as_no_kill() -> None:
    before = readings(vm=None, kills=None, group=None, counters_error="permission denied reading x")
    ev = assess_kill(
        KILLED,
        before,
        before,
        [
            LogSource("kmsg", "unreadable", "permission denied"),
            LogSource("journal", "unavailable", "none"),
        ],
    )
    assert ev.killer is None
    assert all(r.status in ("unreadable", "unavailable") for r in ev.sources)
    assert labels(ev)["vmstat"].startswith("unreadable(")
    assert "could not check" in ev.summary


def test_returncode_conversion() -> None:
    assert ProcessDeath.from_returncode(1, -9, 0.0).signal == 9
    assert ProcessDeath.from_returncode(1, 137, 0.0).signal == 9
    assert ProcessDeath.from_returncode(1, 0, 0.0).signal is None
    assert ProcessDeath.from_returncode(1, None, 0.0).exit_code is None


# -- a real kernel OOM kill (needs a memory cgroup we may create) -------------------------------------

HOG = textwrap.dedent(
    """
    import sys
    print("ready", flush=True)
    sys.stdin.readline()
    hog = []
    while True:
        hog.append(bytearray(8 * 1024 * 1024))
        for i in range(0, len(hog[-1]), 4096):
            hog[-1][i] = 1
    """
)


def _own_memory_cgroup() -> tuple[str, Path] | None:
    try:
        paths = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    if paths.v1_memory is not None and Path("/sys/fs/cgroup/memory").is_dir():
        return "v1", Path("/sys/fs/cgroup/memory") / paths.v1_memory.lstrip("/")
    if paths.v2 is not None and Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "v2", Path("/sys/fs/cgroup") / paths.v2.lstrip("/")
    return None


@pytest.fixture
def memory_cgroup(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux cgroups")
    own = _own_memory_cgroup()
    if own is None:
        pytest.skip("no memory cgroup hierarchy visible")
    version, parent = own
    cg = parent / f"oom-sentinel-test-{os.getpid()}"
    try:
        cg.mkdir()
        if version == "v1":
            (cg / "memory.limit_in_bytes").write_text(str(96 * MiB))
            memsw = cg / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(96 * MiB))
        else:
            (cg / "memory.max").write_text(str(96 * MiB))
            (cg / "memory.swap.max").write_text("0")
    except OSError as exc:
        with_cleanup = cg.exists()
        if with_cleanup:
            cg.rmdir()
        pytest.skip(f"cannot create a memory cgroup here: {exc}")
    try:
        yield version, cg
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_real_memory_cgroup_oom_kill_is_named_kernel(memory_cgroup: tuple[str, Path]) -> None:
    _version, cg = memory_cgroup
    hog = subprocess.Popen(
        ["/bin/sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "{sys.executable}" -c "$0"', HOG],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert hog.stdout is not None and hog.stdin is not None
    try:
        assert hog.stdout.readline().strip() == "ready"
        before = capture_readings(hog.pid)
        assert before.counters is not None, before
        hog.stdin.write("go\n")
        hog.stdin.flush()
        returncode = hog.wait(timeout=120)
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        hog.stdout.close()
        hog.stdin.close()
    died_at = time.time()
    death = ProcessDeath.from_returncode(hog.pid, returncode, died_at)
    assert death.signal == 9
    ev = collect_kill_evidence(death, before)
    print(ev.summary)
    assert ev.killer == "kernel", ev.summary
    assert labels(ev)["cgroup"] == "saw-kill"
    assert labels(ev)["vmstat"] == "saw-kill"
    kmsg = ev.report("kmsg")
    assert kmsg is not None
    if kmsg.status == "saw-kill":
        assert ev.confidence == "certain"
        assert any(f"Killed process {hog.pid} " in line for line in ev.lines)
        assert ev.victim_rss_bytes is not None and ev.victim_rss_bytes > 32 * MiB
    else:
        assert kmsg.status in ("unreadable", "unavailable")
        assert ev.confidence == "probable"
