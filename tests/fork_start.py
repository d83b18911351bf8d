"""Start a ComfyUI (the stand-in or a real one) cold and through the fork server, the way a
replay does (the bootstrap, its own process group, its console in a file), and time each
start to its first ``/system_stats`` answer. Shared by benchmarks/fork_start.py and the
fork-server tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from oom_sentinel.bisect.measure import forkclient
from oom_sentinel.bisect.measure.forkclient import ForkedChild, ForkServer, ProcessHandle
from oom_sentinel.bisect.measure.procutil import pdeathsig_preexec
from oom_sentinel.bisect.measure.replay import BOOTSTRAP_NAME, BOOTSTRAP_SOURCE
from oom_sentinel.bisect.measure.workspace import free_port


@dataclass
class Started:
    proc: ProcessHandle
    port: int
    console: Path
    ready_s: float
    #: /proc RSS and VmHWM of the ComfyUI process once it answered
    rss_bytes: int
    hwm_bytes: int
    #: of which file-backed (libraries' pages)
    rss_file_bytes: int = 0


def real_comfy_args(tmp: Path, port: int) -> list[str]:
    for name in ("user", "output", "temp"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
    return [
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-auto-launch",
        "--user-directory",
        str(tmp / "user"),
        "--output-directory",
        str(tmp / "output"),
        "--temp-directory",
        str(tmp / "temp"),
        "--database-url",
        "sqlite:///:memory:",
        "--disable-api-nodes",
    ]


def bootstrap_argv(python: str, harness: Path, main_py: Path, args: Sequence[str]) -> list[str]:
    harness.mkdir(parents=True, exist_ok=True)
    bootstrap = harness / BOOTSTRAP_NAME
    shutil.copyfile(BOOTSTRAP_SOURCE, bootstrap)
    report = harness / "bootstrap-report.json"
    return [python, str(bootstrap), "--result", str(report), "--", str(main_py), *args]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OOM_", "PYTORCH_", "CUDA_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def start_fork_server(
    python: str,
    harness: Path,
    env: dict[str, str],
    preload: Sequence[str] = forkclient.PRELOAD,
) -> ForkServer:
    harness.mkdir(parents=True, exist_ok=True)
    script = harness / forkclient.FORKSERVER_NAME
    shutil.copyfile(forkclient.FORKSERVER_SOURCE, script)
    server = ForkServer.start(
        subprocess.Popen,
        [python, str(script), *preload],
        env,
        harness / "forkserver.log",
        600.0,
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
    )
    if isinstance(server, str):
        raise RuntimeError(f"the fork server did not start: {server}")
    return server


def proc_memory(pid: int) -> tuple[int, int, int]:
    """(VmRSS, VmHWM, RssFile) in bytes from /proc."""
    values = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values.get("VmRSS", 0), values.get("VmHWM", 0), values.get("RssFile", 0)


def wait_ready(proc: ProcessHandle, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{port}/system_stats"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ComfyUI exited with status {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"ComfyUI did not answer on {url} within {timeout_s:g} s")


def ready_or_stopped(
    proc: ProcessHandle,
    port: int,
    timeout_s: float,
    console: Path,
    stop_server: Callable[[], object],
) -> None:
    """``wait_ready``; when it fails, ``stop_server()`` first (no ComfyUI outlives the failed
    start) and raise with the tail of its console, which says why it did not come up."""
    try:
        wait_ready(proc, port, timeout_s)
    except RuntimeError as exc:
        stop_server()
        tail = console.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{exc}\n{tail}") from None


def start(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    console: Path,
    port: int,
    server: ForkServer | None,
    timeout_s: float = 300.0,
) -> Started:
    """Start ``argv`` cold (``server`` None) or forked, and wait until it answers."""
    console.write_bytes(b"")
    t0 = time.monotonic()
    proc: ProcessHandle
    if server is None:
        with console.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=pdeathsig_preexec(),
            )
    else:
        proc = server.spawn(argv, cwd=cwd, env=env, console=console)
    ready_or_stopped(proc, port, timeout_s, console, lambda: stop(proc))
    ready_s = time.monotonic() - t0
    rss, hwm, rss_file = proc_memory(proc.pid)
    return Started(proc, port, console, ready_s, rss, hwm, rss_file)


def stop(proc: ProcessHandle) -> int | None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return int(proc.wait(timeout=15))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        return int(proc.wait(timeout=15))


PRELOAD = forkclient.PRELOAD

__all__ = [
    "PRELOAD",
    "ForkedChild",
    "Started",
    "bootstrap_argv",
    "clean_env",
    "free_port",
    "proc_memory",
    "ready_or_stopped",
    "real_comfy_args",
    "start",
    "start_fork_server",
    "stop",
]
