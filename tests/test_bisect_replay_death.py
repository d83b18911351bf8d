"""The replay ComfyUI dies with ``oom-bisect``, however ``oom-bisect`` dies.

The real command runs a real bisect on real git histories of the stand-in (the e2e install of
tests/test_bisect_e2e.py) and is killed mid-replay with SIGKILL and with SIGHUP (an SSH drop);
its server must be gone. The parent-death signal is tied to the thread that forked, so a server
started for a thread that then ends must live on. A server left by a dead ``oom-bisect`` is
killed by the next one, and a recycled pid never is. Windows' Job object is checked against a
recording kernel32 (no Windows here).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from proc_waits import reap, wait_gone, wait_while_running

from oom_sentinel.bisect.measure.replay import (
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    REPLAY_RECORD,
    JobExtendedLimits,
    KillOnCloseJob,
    kill_leftover_replay,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")


# ---- the real oom-bisect, killed mid-replay --------------------------------------------------


def replay_servers(cache: Path) -> list[psutil.Process]:
    """The replay ComfyUIs of this test's oom-bisect (their argv names its cache dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if any("oom_bisect_bootstrap" in part for part in cmd) and any(
            str(cache) in part for part in cmd
        ):
            found.append(proc)
    return found


@linux_only
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["sigkill", "sighup"])
def test_the_replay_comfyui_dies_with_oom_bisect(tmp_path: Path, sig: int) -> None:
    from test_bisect_e2e import make_install, vram_workflow

    inst = make_install(tmp_path)
    wf = inst.workflow(vram_workflow(hold_s=120.0))  # the replay holds memory for 2 minutes
    proc = inst.spawn(*inst.core_span(wf))
    try:
        servers = wait_while_running(
            proc, lambda: replay_servers(tmp_path / "cache"), 120, "no replay server started"
        )
        (server,) = servers
        # the harness writes the record once Popen has returned: the server's process can be
        # seen a moment before it (CI caught the gap on a loaded box)
        (record,) = wait_while_running(
            proc,
            lambda: list((tmp_path / "cache").rglob(REPLAY_RECORD)),
            30,
            "no replay record written",
        )
        assert json.loads(record.read_text())["pid"] == server.pid
        time.sleep(0.5)  # the server is up and replaying
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert proc.returncode == -sig
        assert wait_gone(server.pid), f"the replay ComfyUI (pid {server.pid}) outlived oom-bisect"
    finally:
        reap(proc)
        for left in replay_servers(tmp_path / "cache"):
            left.kill()
    inst.assert_untouched()


@linux_only
@pytest.mark.slow
def test_every_replay_of_a_parallel_round_dies_with_oom_bisect(tmp_path: Path) -> None:
    # --parallel: three replays at once, asked for by three lane threads; SIGKILL of
    # oom-bisect mid-round must take all three down (they are forked by the spawner thread)
    from test_bisect_e2e import GIB, make_install, vram_workflow

    from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

    inst = make_install(tmp_path)
    FakeGpuDir(tmp_path / "gpu").create([FakeDevice(i, f"GPU {i}", 4 * GIB) for i in range(3)])
    wf = inst.workflow(vram_workflow(hold_s=120.0))
    where = ("--comfyui", str(inst.root))
    start = inst.run(*inst.run_args(*inst.core_span(wf), "--max-steps", "0"))
    assert start.returncode == 130, start.stderr[-2000:]  # stopped before the answer
    for word in ("good", "bad"):  # the endpoints by hand: the next replays are the round's
        marked = inst.run("mark", word, *where)
        assert marked.returncode == 0, marked.stderr[-2000:]
    proc = inst.spawn("--parallel", "3")
    try:
        servers: list[psutil.Process] = []

        def all_three() -> list[psutil.Process] | None:
            servers[:] = replay_servers(tmp_path / "cache")
            return servers if len(servers) >= 3 else None

        wait_while_running(
            proc, all_three, 180, lambda: f"{len(servers)} of 3 replay servers started"
        )
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for server in servers:
            assert wait_gone(server.pid), f"a replay (pid {server.pid}) outlived oom-bisect"
    finally:
        reap(proc)
        for left in replay_servers(tmp_path / "cache"):
            left.kill()
    inst.assert_untouched()


# ---- the parent-death signal follows the forking thread: one spawner thread forks ------------

SPAWN_FROM_A_THREAD = textwrap.dedent(
    """
    import sys, threading, time
    from oom_sentinel.bisect.measure import procutil
    from oom_sentinel.bisect.measure import replay
    out = {}
    def ask():
        out["proc"] = replay._spawner.popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            start_new_session=True,
            preexec_fn=procutil.pdeathsig_preexec(),
        )
    t = threading.Thread(target=ask)
    t.start()
    t.join()  # the thread that asked for the server has ended
    print(out["proc"].pid, flush=True)
    time.sleep(120)
    """
)


@linux_only
def test_a_server_outlives_the_thread_that_asked_for_it_but_not_the_process() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SPAWN_FROM_A_THREAD], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.5)
        assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE, "killed with its thread"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_gone(child, 10), "the server outlived the process that started it"
    finally:
        reap(parent)


# ---- a server left by a dead oom-bisect ------------------------------------------------------


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )


def write_record(ws: Path, **record: Any) -> Path:
    path = ws / "harness" / REPLAY_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_a_server_left_by_a_dead_oom_bisect_is_killed(tmp_path: Path) -> None:
    left = sleeper()
    try:
        start = psutil.Process(left.pid).create_time()
        path = write_record(
            tmp_path, pid=left.pid, start_time_s=start, owner_pid=dead_pid(), owner_start_time_s=1.0
        )
        assert kill_leftover_replay(tmp_path) == left.pid
        assert wait_gone(left.pid, 10)
        assert not path.exists()
        assert kill_leftover_replay(tmp_path) is None  # nothing left to do
    finally:
        reap(left)


def test_a_recycled_pid_or_a_live_owner_is_never_killed(tmp_path: Path) -> None:
    other = sleeper()  # has the recorded pid, but started at another time: a recycled pid
    try:
        start = psutil.Process(other.pid).create_time()
        write_record(
            tmp_path,
            pid=other.pid,
            start_time_s=start - 100.0,
            owner_pid=dead_pid(),
            owner_start_time_s=1.0,
        )
        assert kill_leftover_replay(tmp_path) is None
        assert other.poll() is None
        # the right server, but the oom-bisect that runs it is alive: it is in use
        me = psutil.Process(os.getpid())
        write_record(
            tmp_path,
            pid=other.pid,
            start_time_s=start,
            owner_pid=me.pid,
            owner_start_time_s=me.create_time(),
        )
        assert kill_leftover_replay(tmp_path) is None
        assert other.poll() is None
    finally:
        reap(other)


def test_a_resume_kills_the_server_an_earlier_run_left(tmp_path: Path) -> None:
    """``Session.open`` (what a resume and ``status`` do) cleans up after a dead oom-bisect."""
    from oom_sentinel.bisect.session.files import BisectPaths, Session

    paths = BisectPaths(tmp_path / "bisect", tmp_path / "outcomes")
    (paths.session).mkdir(parents=True)
    (paths.session / "started").write_text("now\n")
    (paths.session / "session.json").write_text("{}")  # unreadable setup: open fails after
    left = sleeper()
    try:
        write_record(
            paths.workspace,
            pid=left.pid,
            start_time_s=psutil.Process(left.pid).create_time(),
            owner_pid=dead_pid(),
            owner_start_time_s=1.0,
        )
        with pytest.raises(Exception):  # noqa: B017 - the empty setup is not the point
            Session.open(paths)
        assert wait_gone(left.pid, 10), "the resume left the earlier server running"
    finally:
        reap(left)


# ---- Windows: a Job object that kills on close ----------------------------------------------


class RecordingKernel32:
    """kernel32 as KillOnCloseJob calls it, recording the calls (no Windows here)."""

    def __init__(self, *, fail: str | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail
        self.limits: JobExtendedLimits | None = None

    def _call(self, name: str, *args: Any) -> int:
        self.calls.append((name, args))
        return 0 if name == self.fail else 1

    def CreateJobObjectW(self, *args: Any) -> int:
        return 0 if self.fail == "CreateJobObjectW" else (self._call("CreateJobObjectW") and 4242)

    def SetInformationJobObject(self, handle: int, cls: int, ref: Any, size: int) -> int:
        self.limits = JobExtendedLimits.from_buffer_copy(
            ctypes.string_at(ctypes.addressof(ref._obj), size)
        )
        return self._call("SetInformationJobObject", handle, cls, size)

    def AssignProcessToJobObject(self, job: int, process: int) -> int:
        return self._call("AssignProcessToJobObject", job, process)

    def CloseHandle(self, handle: int) -> int:
        return self._call("CloseHandle", handle)


def test_the_windows_job_kills_its_processes_when_oom_bisect_ends() -> None:
    k = RecordingKernel32()
    job = KillOnCloseJob(k)
    job.assign(100)
    job.assign(200)  # one job for every server
    assert [c[0] for c in k.calls] == [
        "CreateJobObjectW",
        "SetInformationJobObject",
        "AssignProcessToJobObject",
        "AssignProcessToJobObject",
    ]
    assert k.calls[1][1][:2] == (4242, 9)  # JobObjectExtendedLimitInformation
    assert k.calls[1][1][2] == ctypes.sizeof(JobExtendedLimits)
    assert k.limits is not None
    flags = k.limits.BasicLimitInformation.LimitFlags
    assert flags & JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    assert k.calls[2][1] == (4242, 100) and k.calls[3][1] == (4242, 200)


@pytest.mark.parametrize(
    "fail", ["CreateJobObjectW", "SetInformationJobObject", "AssignProcessToJobObject"]
)
def test_a_job_that_cannot_be_set_up_says_so(fail: str) -> None:
    with pytest.raises(OSError, match=fail):
        KillOnCloseJob(RecordingKernel32(fail=fail)).assign(100)
