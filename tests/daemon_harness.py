"""Start ``oom-sentinel run`` as a real process on temporary dirs, and write ComfyUI log
records the way ComfyUI-Manager's log file holds them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from oom_sentinel.daemon.store.db import Store
from oom_sentinel.daemon.store.runs import RunRecord, list_runs

MANAGER_TIME = "%Y-%m-%d %H:%M:%S.%f"


def manager_prefix(at: datetime) -> str:
    return f"[{at.strftime(MANAGER_TIME)[:-3]}] "


def cuda_oom_record(at: datetime, *, requested_gib: float = 2.0, node: str = "KSampler") -> str:
    """The lines one CUDA OOM leaves in a Manager log (v0.8.0 wording and order)."""
    p = manager_prefix
    msg = (
        f"CUDA out of memory. Tried to allocate {requested_gib:.2f} GiB. GPU 0 has a total "
        "capacity of 23.64 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this "
        "process has 22.56 GiB memory in use. Of the allocated memory 21.80 GiB is allocated by "
        "PyTorch, and 310.52 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation."
    )
    lines = [
        f"{p(at)}got prompt",
        f"{p(at + timedelta(milliseconds=900))}!!! Exception during processing !!! {msg}",
        f"{p(at + timedelta(milliseconds=901))}Traceback (most recent call last):",
        '  File "/opt/ComfyUI/execution.py", line 518, in execute',
        "    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all)",
        '  File "/opt/ComfyUI/nodes.py", line 1525, in sample',
        f"    return common_ksampler(model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise=denoise)  # {node}",
        f"torch.OutOfMemoryError: {msg}",
        "",
        f"{p(at + timedelta(milliseconds=950))}Got an OOM, unloading all loaded models.",
        f"{p(at + timedelta(milliseconds=990))}Prompt executed in 3.21 seconds",
    ]
    return "\n".join(lines) + "\n"


def noise_lines(at: datetime, n: int) -> str:
    p = manager_prefix
    return "".join(
        f"{p(at + timedelta(milliseconds=i))}loaded completely; 9000.00 MB usable, 4897.05 MB loaded, full load: True\n"
        for i in range(n)
    )


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()


def wait_for(predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def snapshot_dirs(data_dir: Path) -> list[Path]:
    root = data_dir / "snapshots"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def wait_snapshots(daemon: Daemon, n: int, timeout_s: float = 30.0) -> list[Path]:
    """At least ``n`` snapshot folders of ``daemon``; a timeout says what the daemon said by
    then (why none came)."""

    def enough() -> list[Path] | None:
        found = snapshot_dirs(daemon.data_dir)
        return found if len(found) >= n else None

    try:
        found: list[Path] = wait_for(enough, timeout_s, f"{n} snapshot(s)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; daemon said:\n{daemon.stderr()}") from None
    return found


def runs(data_dir: Path, **filters: Any) -> list[RunRecord]:
    """The run rows in the daemon's store (none before it made one); ``filters`` go to
    ``list_runs`` (``limit``, ``instance``, ...)."""
    store = Store.open_existing(data_dir)
    if store is None:
        return []
    with store:
        return list_runs(store, **filters)


def wait_run(daemon: Daemon, prompt_id: str, timeout_s: float = 30.0) -> RunRecord:
    """The run row of ``prompt_id`` once the daemon stored it; a timeout says what the daemon
    said by then."""

    def found() -> RunRecord | None:
        return next((r for r in runs(daemon.data_dir) if r.prompt_id == prompt_id), None)

    try:
        run: RunRecord = wait_for(found, timeout_s, f"run {prompt_id}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; daemon said:\n{daemon.stderr()}") from None
    return run


def snapshots_show(snapshot_id: str, data_dir: Path, env: dict[str, str] | None) -> str:
    """``oom-sentinel snapshots show ID --data-dir DIR`` as a user runs it; fails unless it
    exits 0 (its stderr is the message); returns what it printed."""
    argv = ["snapshots", "show", snapshot_id, "--data-dir", str(data_dir)]
    show = subprocess.run(
        [sys.executable, "-m", "oom_sentinel.daemon", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert show.returncode == 0, show.stderr
    return show.stdout


def load_snapshot_json(path: Path) -> dict[str, Any]:
    """A snapshot the daemon wrote; none of its sections may have been left out for not
    matching its model (``dropped_sections``: a bug in the module that made the section)."""
    data: dict[str, Any] = json.loads((path / "snapshot.json").read_text("utf-8"))
    assert "dropped_sections" not in data, data["dropped_sections"]
    return data


class Daemon:
    """``oom-sentinel run`` in a child process with its own HOME and data dir."""

    def __init__(
        self,
        tmp: Path,
        *,
        logs: Sequence[Path] = (),
        comfyui: Sequence[str] = (),
        config: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.home = tmp / "home"
        self.home.mkdir(exist_ok=True)
        self.config = tmp / "config.toml"
        self.config.write_text(
            config or "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
        )
        self.args = [
            sys.executable,
            "-m",
            "oom_sentinel.daemon",
            "run",
            "--config",
            str(self.config),
        ]
        self.args += ["--data-dir", str(self.data_dir)]
        for log in logs:
            self.args += ["--watch-log", str(log)]
        for target in comfyui:
            self.args += ["--comfyui", target]
        self.env = {
            **os.environ,
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
        }
        self.env.pop("NOTIFY_SOCKET", None)
        if env:
            self.env.update(env)
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_path = tmp / "daemon.stderr"

    def spawn(self) -> Daemon:
        """Start the process without waiting for its ready line."""
        # several runs share one stderr file; only this run's output counts from here on
        self._err_from = self.stderr_path.stat().st_size if self.stderr_path.exists() else 0
        self._err = open(self.stderr_path, "a", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args, env=self.env, stdout=subprocess.DEVNULL, stderr=self._err, text=True
        )
        return self

    def start(self, timeout_s: float = 20.0) -> Daemon:
        self.spawn()
        wait_for(
            lambda: "watching " in self.stderr() or self.proc.poll() is not None,  # type: ignore[union-attr]
            timeout_s,
            "the daemon's ready line",
        )
        assert self.proc.poll() is None, self.stderr()
        return self

    def stderr(self) -> str:
        """This run's stderr (``all_stderr`` has every run's)."""
        return self._read(getattr(self, "_err_from", 0))

    def all_stderr(self) -> str:
        return self._read(0)

    def _read(self, offset: int) -> str:
        try:
            return self.stderr_path.read_bytes()[offset:].decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
        return rc

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)


def kernel_kill_lines(pid: int) -> str:
    """What the kernel writes to /dev/kmsg when its OOM killer kills ``pid`` (kmsg format)."""
    usec = int(time.monotonic() * 1_000_000)
    return (
        f"4,100,{usec},-;python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)\n"
        f"3,101,{usec + 10},-;Out of memory: Killed process {pid} (python3) "
        "total-vm:4000000kB, anon-rss:1200000kB, file-rss:1024kB, shmem-rss:0kB\n"
    )
