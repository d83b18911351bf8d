"""The process watcher: a ComfyUI process's end, its exit status, and who killed it.

Pure parts run on built strings and records; the watcher itself runs on real processes (a
ComfyUI-looking ``main.py`` that waits), killed for real, with the kernel evidence read from
this machine -- except ``/dev/kmsg``, which is a fixture file where a test needs the kernel to
"say" it killed the process.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_comfy_install import make_install, start_comfy, stop

from oom_sentinel.daemon.classify.events import Pool
from oom_sentinel.daemon.comfy.process_watch import (
    ProcessExit,
    ProcessWatcher,
    death_from_status,
    is_os_kill,
    kernel_section,
    kill_observation,
    kill_verdict,
    memory_was_high,
    parse_stat_exit,
    process_section,
)
from oom_sentinel.daemon.comfy.processes import (
    ComfyProcess,
    comfy_process_from,
    find_comfy_processes,
)
from oom_sentinel.daemon.kernel.oom import (
    KillEvidence,
    ProcessDeath,
    SourceReport,
    SystemRoots,
    evidence_gaps,
)
from oom_sentinel.daemon.probes.base import GpuProcessSample, HostSample, MemorySample

STATUSES = {"saw-kill", "no-kill", "unreadable", "unavailable"}


# ---- pure ------------------------------------------------------------------------------------


def stat_line(state: str, status: int, comm: str = "python3") -> str:
    # pid (comm) state + 48 numeric fields + exit_code: 52 fields, as Linux >= 3.5 writes
    return f"4242 ({comm}) {state} " + " ".join(["0"] * 48) + f" {status}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (stat_line("S", 0), ("S", None)),
        (stat_line("Z", 9), ("Z", 9)),
        (stat_line("Z", 3 << 8, comm="my (odd) name"), ("Z", 768)),
        ("4242 (python3) Z 1 2 3\n", ("Z", None)),  # an old kernel without exit_code
        ("garbage", (None, None)),
        ("4242 (python3)", (None, None)),
    ],
    ids=["running", "zombie-sigkill", "zombie-exit-3-odd-comm", "old-kernel", "garbage", "cut"],
)
def test_parse_stat_exit(text: str, expected: tuple[str | None, int | None]) -> None:
    assert parse_stat_exit(text) == expected


@pytest.mark.parametrize(
    ("status", "signal_", "exit_code"),
    [(9, 9, None), (15, 15, None), (0, None, 0), (3 << 8, None, 3), (None, None, None)],
    ids=["sigkill", "sigterm", "exit-0", "exit-3", "unknown"],
)
def test_death_from_a_waitpid_status(
    status: int | None, signal_: int | None, exit_code: int | None
) -> None:
    death = death_from_status(7, status, 100.0, comm="python")
    assert (death.signal, death.exit_code, death.pid, death.comm) == (
        signal_,
        exit_code,
        7,
        "python",
    )


def evidence(killer: str | None, confidence: str | None = None) -> KillEvidence:
    return KillEvidence(
        pid=7,
        killer=killer,  # type: ignore[arg-type]
        confidence=confidence,  # type: ignore[arg-type]
        sources=(
            SourceReport("vmstat", "no-kill", detail="oom_kill 1 -> 1"),
            SourceReport("kmsg", "unreadable", "permission denied reading /dev/kmsg"),
            SourceReport("journal", "unavailable", "no systemd journal files on this machine"),
        ),
        summary="process 7 ended",
    )


UNREAD = (
    SourceReport("vmstat", "unreadable", "permission denied"),
    SourceReport("cgroup", "unreadable", "permission denied"),
    SourceReport("kmsg", "unreadable", "permission denied reading /dev/kmsg"),
    SourceReport("journal", "unavailable", "no systemd journal files on this machine"),
)
JOURNAL_UNREAD = (
    SourceReport("vmstat", "no-kill", detail="oom_kill 1 -> 1"),
    SourceReport("kmsg", "unreadable", "permission denied reading /dev/kmsg"),
    SourceReport("journal", "unreadable", "journalctl: permission denied"),
)


def with_sources(ev: KillEvidence, sources: tuple[SourceReport, ...]) -> KillEvidence:
    return dataclasses.replace(ev, sources=sources)


@pytest.mark.parametrize(
    ("death", "ev", "memory_high", "expected"),
    [
        (ProcessDeath(7, 1.0, signal=9), evidence(None), True, (False, "sigkill-no-oom-evidence")),
        (ProcessDeath(7, 1.0, signal=9), evidence(None), None, (False, "sigkill-no-oom-evidence")),
        (
            ProcessDeath(7, 1.0, signal=9),
            with_sources(evidence(None), UNREAD),
            True,
            (True, "unreadable-evidence-high-memory"),
        ),
        (
            ProcessDeath(7, 1.0, signal=9),
            with_sources(evidence(None), JOURNAL_UNREAD),
            True,
            (True, "unreadable-evidence-high-memory"),
        ),
        (
            ProcessDeath(7, 1.0, signal=9),
            with_sources(evidence(None), UNREAD),
            False,
            (False, "sigkill-unreadable-evidence-memory-normal"),
        ),
        (
            ProcessDeath(7, 1.0, signal=9),
            with_sources(evidence(None), UNREAD),
            None,
            (False, "sigkill-unreadable-evidence-memory-normal"),
        ),
        (ProcessDeath(7, 1.0), evidence("kernel", "possible"), None, (True, "evidence")),
        (ProcessDeath(7, 1.0, signal=9), evidence("kernel", "certain"), False, (True, "evidence")),
        (ProcessDeath(7, 1.0), evidence("earlyoom", "certain"), None, (True, "evidence")),
        (
            ProcessDeath(7, 1.0, signal=15),
            evidence("systemd-oomd", "certain"),
            None,
            (True, "evidence"),
        ),
        (ProcessDeath(7, 1.0, exit_code=0), evidence(None), True, (False, "not-killed")),
        (
            ProcessDeath(7, 1.0, signal=15),
            with_sources(evidence(None), UNREAD),
            True,
            (False, "not-killed"),
        ),
        (ProcessDeath(7, 1.0), evidence(None), None, (False, "not-killed")),
    ],
    ids=[
        "sigkill-all-read-memory-high",
        "sigkill-all-read",
        "sigkill-unreadable-memory-high",
        "sigkill-journal-unreadable-memory-high",
        "sigkill-unreadable-memory-normal",
        "sigkill-unreadable-no-samples",
        "unknown-end-vmstat-moved",
        "sigkill-kernel-named-it",
        "earlyoom",
        "oomd-sigterm",
        "clean-exit",
        "sigterm",
        "unknown-no-evidence",
    ],
)
def test_what_counts_as_a_kill_by_the_os(
    death: ProcessDeath, ev: KillEvidence, memory_high: bool | None, expected: tuple[bool, str]
) -> None:
    assert kill_verdict(death, ev, memory_high) == expected
    assert is_os_kill(death, ev) is (ev.killer is not None)


def test_evidence_gaps_name_the_killers_that_could_not_be_ruled_out() -> None:
    assert evidence_gaps(evidence(None)) == ()  # vmstat read; no journal on this machine
    assert evidence_gaps(with_sources(evidence(None), UNREAD)) == ("kernel",)
    assert evidence_gaps(with_sources(evidence(None), JOURNAL_UNREAD)) == (
        "systemd-oomd/earlyoom/nohang",
    )
    only_kmsg = (SourceReport("kmsg", "no-kill"), SourceReport("journal", "no-kill"))
    assert evidence_gaps(with_sources(evidence(None), only_kmsg)) == ()


def host_sample(time_s: float, available_gib: float, total_gib: float = 32.0) -> MemorySample:
    host = HostSample(int(total_gib * 2**30), int(available_gib * 2**30), 0, 0)
    return MemorySample(time_s, (), (), host)


def test_memory_was_high_reads_the_last_samples_before_the_death() -> None:
    assert memory_was_high((), 10.0) is None
    assert memory_was_high((MemorySample(9.0, (), (), None),), 10.0) is None
    calm = [host_sample(t, 20.0) for t in range(10)]
    assert memory_was_high(calm, 9.5) is False
    climb = [*calm, host_sample(10.0, 2.0)]
    assert memory_was_high(climb, 10.2) is True
    # a squeeze long before the death does not count; samples after it are not looked at
    assert memory_was_high([host_sample(0.0, 1.0), *calm[1:]], 9.5) is False
    assert memory_was_high([*calm, host_sample(30.0, 1.0)], 9.5) is False


def comfy(pid: int, argv_tail: list[str], code_dir: str = "/opt/ComfyUI") -> ComfyProcess:
    proc = comfy_process_from(
        pid,
        ["/venv/bin/python", f"{code_dir}/main.py", *argv_tail],
        cwd=code_dir,
        environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "API_TOKEN": "x"},
        create_time_s=1000.0,
        exists=lambda p: p.endswith(("main.py", "folder_paths.py")),
    )
    assert proc is not None
    return proc


def test_kill_observation_carries_the_killer_and_the_running_prompt() -> None:
    proc = comfy(10, ["--port", "8188", "--cpu"])
    ev = KillEvidence(
        pid=10,
        killer="kernel",
        confidence="certain",
        sources=(SourceReport("kmsg", "saw-kill"),),
        victim_rss_bytes=3 << 30,
        summary="process 10 was killed (signal 9) by the kernel OOM killer (certain)",
    )
    exit = ProcessExit("main", proc, ProcessDeath(10, 50.0, signal=9), ev, os_kill=True)
    obs = kill_observation(exit, prompt_id="p-1")
    assert obs.source == "process" and obs.instance == "main" and obs.at_s == 50.0
    assert obs.event.pool is Pool.KILLED_BY_OS and obs.event.killer == "kernel"
    assert obs.event.killed_pid == 10 and obs.event.backend == "cpu"
    assert obs.event.message == ev.summary
    assert obs.evidence == {
        "pid": 10,
        "signal": 9,
        "exit_code": None,
        "killer": "kernel",
        "confidence": "certain",
        "basis": "evidence",
        "prompt_id": "p-1",
    }


def test_process_section_names_other_gpu_users_and_flags_a_second_instance() -> None:
    mine = comfy(10, ["--port", "8188", "--lowvram", "--reserve-vram", "1.5"])
    second = comfy(20, ["--port", "8189"], code_dir="/srv/ComfyUI2")
    gpu = (
        GpuProcessSample(10, 0, 6 << 30, "python"),
        GpuProcessSample(11, 0, 1 << 30, "python"),  # a child of ComfyUI: its own
        GpuProcessSample(20, 0, 2 << 30, "python"),
        GpuProcessSample(30, 0, 512 << 20, "firefox", ("firefox",)),
    )
    section = process_section(
        mine, gpu_processes=gpu, own_pids=[11], comfy_processes=[mine, second]
    )
    assert section["pid"] == 10 and section["alive"] is True and section["exit"] is None
    assert section["argv"][1] == "/opt/ComfyUI/main.py"
    assert section["interpreter"] == "/venv/bin/python" and section["cwd"] == "/opt/ComfyUI"
    assert section["pytorch_cuda_alloc_conf"] == "expandable_segments:True"
    flags = section["flags"]
    assert flags["vram_mode"] == "lowvram" and flags["reserve_vram_gb"] == 1.5
    assert flags["memory_args"] == ["--lowvram", "--reserve-vram", "1.5"]
    others = {p["pid"]: p for p in section["other_gpu_processes"]}
    assert set(others) == {20, 30}
    assert others[30]["name"] == "firefox" and others[30]["used_bytes"] == 512 << 20
    assert others[20]["comfyui"] is True and others[30]["comfyui"] is False
    assert section["second_instance"] is True
    (other,) = section["other_instances"]
    assert other["pid"] == 20 and other["port"] == 8189 and other["gpu_used_bytes"] == 2 << 30
    kinds = {c["kind"] for c in section["conflicts"]}
    assert "same-gpu" in kinds and "same-cuda-device" in kinds
    assert all(10 in c["pids"] for c in section["conflicts"])


def test_process_section_alone_and_unknown() -> None:
    mine = comfy(10, ["--port", "8188"])
    alone = process_section(mine, comfy_processes=[mine])
    assert alone["second_instance"] is False and alone["conflicts"] == []
    assert alone["other_gpu_processes"] == []
    unknown = process_section(None, comfy_processes=[mine])
    assert unknown["pid"] is None and unknown["found"] is False and unknown["alive"] is False
    assert unknown["second_instance"] is True  # another ComfyUI runs on this machine


def test_kernel_section_keeps_every_source_and_its_status() -> None:
    section = kernel_section(ProcessDeath(7, 12.5, signal=9), evidence(None))
    assert section["signal"] == 9 and section["killer"] is None and section["died_at_s"] == 12.5
    assert [(s["source"], s["status"]) for s in section["sources"]] == [
        ("vmstat", "no-kill"),
        ("kmsg", "unreadable"),
        ("journal", "unavailable"),
    ]
    assert section["sources"][1]["reason"] == "permission denied reading /dev/kmsg"


# ---- real processes --------------------------------------------------------------------------


@pytest.fixture
def install(tmp_path: Path) -> Path:
    return make_install(tmp_path / "ComfyUI")


@pytest.fixture
def running(install: Path) -> Iterator[tuple[subprocess.Popen[str], ComfyProcess]]:
    proc = start_comfy(install / "main.py", ["--port", "8190", "--cpu"], cwd=install)
    found = [p for p in find_comfy_processes() if p.pid == proc.pid]
    assert found, "the stand-in install is recognised as ComfyUI"
    yield proc, found[0]
    stop(proc)


def next_exit(q: queue.Queue[ProcessExit], timeout_s: float = 30.0) -> ProcessExit:
    return q.get(timeout=timeout_s)


def roots_with_kmsg(tmp_path: Path, kmsg: Path) -> SystemRoots:
    return SystemRoots(kmsg=kmsg, journal_dirs=(tmp_path / "no-journal",))


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "polling"])
def test_a_sigkill_is_seen_with_its_signal_and_each_source_status(
    running: tuple[subprocess.Popen[str], ComfyProcess], tmp_path: Path, use_pidfd: bool
) -> None:
    popen, proc = running
    if use_pidfd and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this platform")
    exits: queue.Queue[ProcessExit] = queue.Queue()
    watcher = ProcessWatcher(exits.put, use_pidfd=use_pidfd)
    watcher.start()
    try:
        watcher.watch("main", proc)
        assert watcher.watching() == {"main": proc.pid}
        time.sleep(0.3)  # the baseline readings are taken
        popen.kill()  # not reaped until the report is in: the zombie tells the signal
        exit = next_exit(exits)
    finally:
        watcher.stop()
    assert exit.instance == "main" and exit.process.pid == proc.pid
    assert exit.death.signal == signal.SIGKILL and exit.death.exit_code is None
    # a plain kill -9: an OOM kill only if this machine's evidence says so
    assert exit.os_kill is (exit.evidence.killer is not None)
    assert exit.basis in (
        "evidence",
        "sigkill-no-oom-evidence",
        "sigkill-unreadable-evidence-memory-normal",
    )
    reports = {r.source: r for r in exit.evidence.sources}
    assert {"vmstat", "cgroup", "kmsg", "journal"} <= set(reports)
    assert all(r.status in STATUSES for r in reports.values())
    for r in reports.values():
        if r.status in ("unreadable", "unavailable"):
            assert r.reason, r  # a source that could not be read says why
    assert watcher.watching() == {}


def test_the_kernel_is_named_when_its_log_names_the_pid(
    running: tuple[subprocess.Popen[str], ComfyProcess], tmp_path: Path
) -> None:
    popen, proc = running
    kmsg = tmp_path / "kmsg"
    usec = int(time.monotonic() * 1_000_000)
    kmsg.write_text(
        f"4,100,{usec},-;python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)\n"
        f"3,101,{usec + 10},-;Out of memory: Killed process {proc.pid} (python3) "
        "total-vm:4000000kB, anon-rss:3000000kB, file-rss:1024kB, shmem-rss:0kB\n"
    )
    exits: queue.Queue[ProcessExit] = queue.Queue()
    watcher = ProcessWatcher(exits.put, roots=roots_with_kmsg(tmp_path, kmsg))
    watcher.start()
    try:
        watcher.watch("main", proc)
        time.sleep(0.2)
        popen.kill()
        exit = next_exit(exits)
    finally:
        watcher.stop()
    ev = exit.evidence
    assert ev.killer == "kernel" and ev.confidence == "certain"
    assert ev.victim_rss_bytes == (3000000 + 1024) * 1024
    assert ev.report("kmsg") is not None and ev.report("kmsg").status == "saw-kill"  # type: ignore[union-attr]
    assert ev.report("journal").status == "unavailable"  # type: ignore[union-attr]
    assert any("Killed process" in line for line in ev.lines)
    section = kernel_section(exit.death, ev)
    assert section["killer"] == "kernel" and section["lines"]


def test_an_unreadable_source_is_reported_unreadable_not_as_no_kill(
    running: tuple[subprocess.Popen[str], ComfyProcess], tmp_path: Path
) -> None:
    popen, proc = running
    not_a_device = tmp_path / "kmsg-is-a-directory"
    not_a_device.mkdir()
    exits: queue.Queue[ProcessExit] = queue.Queue()
    watcher = ProcessWatcher(exits.put, roots=roots_with_kmsg(tmp_path, not_a_device))
    watcher.start()
    try:
        watcher.watch("main", proc)
        time.sleep(0.2)
        popen.kill()
        exit = next_exit(exits)
    finally:
        watcher.stop()
    kmsg = exit.evidence.report("kmsg")
    assert kmsg is not None and kmsg.status == "unreadable" and kmsg.reason
    assert "could not check" in exit.evidence.summary


def _kill_and_report(
    popen: subprocess.Popen[str],
    proc: ComfyProcess,
    watcher: ProcessWatcher,
    q: queue.Queue[ProcessExit],
) -> ProcessExit:
    watcher.start()
    try:
        watcher.watch("main", proc)
        time.sleep(0.2)  # the baseline readings are taken
        popen.kill()
        return next_exit(q)
    finally:
        watcher.stop()


def test_a_sigkill_with_every_source_read_and_no_kill_shown_is_no_os_kill(
    running: tuple[subprocess.Popen[str], ComfyProcess], tmp_path: Path
) -> None:
    """A user's kill -9 while memory is high: the kernel's log was read and names nobody, so
    it is a ``killed (SIGKILL)`` end, not an OOM."""
    popen, proc = running
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1,-;some unrelated kernel line\n")
    exits: queue.Queue[ProcessExit] = queue.Queue()
    squeezed = [host_sample(time.time() - 0.1, 0.5)]
    watcher = ProcessWatcher(
        exits.put, roots=roots_with_kmsg(tmp_path, kmsg), memory=lambda: squeezed
    )
    exit = _kill_and_report(popen, proc, watcher, exits)
    assert exit.death.signal == signal.SIGKILL
    assert exit.evidence.report("kmsg").status == "no-kill"  # type: ignore[union-attr]
    if exit.evidence.killer is None:  # vmstat is machine-wide: another process's OOM kill
        assert (exit.os_kill, exit.basis, exit.sigkill) == (False, "sigkill-no-oom-evidence", True)
        assert kernel_section(exit.death, exit.evidence, exit.basis)["verdict"] == exit.basis


def unreadable_roots(tmp_path: Path) -> SystemRoots:
    """No /proc/vmstat, no cgroup files, /dev/kmsg a directory: every kernel source unreadable."""
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    not_a_device = tmp_path / "kmsg-dir"
    not_a_device.mkdir()
    return SystemRoots(
        proc=empty_proc,
        cgroup=tmp_path / "no-cgroup",
        kmsg=not_a_device,
        journal_dirs=(tmp_path / "no-journal",),
    )


@pytest.mark.parametrize(
    ("available_gib", "expected"),
    [
        (0.5, (True, "unreadable-evidence-high-memory")),
        (20.0, (False, "sigkill-unreadable-evidence-memory-normal")),
    ],
    ids=["memory-high", "memory-normal"],
)
def test_a_sigkill_with_unreadable_evidence_is_an_os_kill_only_when_memory_was_high(
    running: tuple[subprocess.Popen[str], ComfyProcess],
    tmp_path: Path,
    available_gib: float,
    expected: tuple[bool, str],
) -> None:
    popen, proc = running
    exits: queue.Queue[ProcessExit] = queue.Queue()
    samples = [host_sample(time.time() - 0.2, available_gib)]
    watcher = ProcessWatcher(exits.put, roots=unreadable_roots(tmp_path), memory=lambda: samples)
    exit = _kill_and_report(popen, proc, watcher, exits)
    assert exit.evidence.killer is None
    assert evidence_gaps(exit.evidence) == ("kernel",)
    assert (exit.os_kill, exit.basis) == expected
    section = kernel_section(exit.death, exit.evidence, exit.basis)
    assert section["verdict"] == expected[1] and section["verdict_text"]
    if exit.os_kill:
        obs = kill_observation(exit)
        assert obs.evidence["basis"] == "unreadable-evidence-high-memory"
        assert obs.evidence["confidence"] == "possible"
        assert "nearly exhausted" in obs.event.message


def test_a_terminated_process_is_no_os_kill(
    running: tuple[subprocess.Popen[str], ComfyProcess], tmp_path: Path
) -> None:
    popen, proc = running
    exits: queue.Queue[ProcessExit] = queue.Queue()
    watcher = ProcessWatcher(exits.put, read_logs=False)
    watcher.start()
    try:
        watcher.watch("main", proc)
        time.sleep(0.2)
        popen.send_signal(signal.SIGTERM)
        exit = next_exit(exits)
    finally:
        watcher.stop()
    assert exit.death.signal == signal.SIGTERM
    assert exit.os_kill is False and exit.evidence.killer is None


def test_a_process_already_gone_when_watched_is_reported(
    running: tuple[subprocess.Popen[str], ComfyProcess],
) -> None:
    popen, proc = running
    popen.kill()
    popen.wait()  # reaped: nothing tells its status any more
    exits: queue.Queue[ProcessExit] = queue.Queue()
    watcher = ProcessWatcher(exits.put, read_logs=False)
    watcher.start()
    try:
        watcher.watch("main", proc)
        exit = next_exit(exits)
    finally:
        watcher.stop()
    assert exit.process.pid == proc.pid
    assert exit.death.signal is None and exit.death.exit_code is None


def test_watch_replaces_and_forget_stops(install: Path) -> None:
    a = start_comfy(install / "main.py", ["--port", "8191"], cwd=install)
    b = start_comfy(install / "main.py", ["--port", "8192"], cwd=install)
    try:
        procs = {p.pid: p for p in find_comfy_processes()}
        exits: queue.Queue[ProcessExit] = queue.Queue()
        watcher = ProcessWatcher(exits.put, read_logs=False)
        watcher.start()
        try:
            watcher.watch("main", procs[a.pid])
            watcher.watch("main", procs[b.pid])  # a restart: the new process replaces the old
            assert watcher.watching() == {"main": b.pid}
            a.kill()
            a.wait()
            watcher.forget("main")
            b.kill()
            time.sleep(0.5)
            assert exits.empty(), "neither the replaced nor the forgotten process is reported"
        finally:
            watcher.stop()
    finally:
        stop(a)
        stop(b)


def test_stop_ends_the_thread(running: tuple[subprocess.Popen[str], ComfyProcess]) -> None:
    _, proc = running
    watcher = ProcessWatcher(lambda e: None)
    watcher.start()
    watcher.watch("main", proc)
    worker = watcher.worker
    assert worker.is_alive()
    watcher.stop()
    assert not worker.is_alive() and worker.error is None
