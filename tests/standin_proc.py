"""Start the stand-in ComfyUI (``tests/standin/main.py``) as a real process for tests.

``start_standin(base_dir)`` runs ``python main.py --listen 127.0.0.1 --port <free> --base-directory
<base_dir> --database-url sqlite:///:memory: --disable-auto-launch`` (plus ``--cpu`` unless a fake
GPU is given), waits until ``GET /system_stats`` answers, and returns a handle. With
``base_directory=False`` the install keeps its own ``custom_nodes/`` and ``models/`` (as ComfyUI
re-roots both under ``--base-directory``) and only output, input, temp and user move to
``base_dir``. Console output goes
to files in ``base_dir`` (a pipe could fill and block the server). Any install can be started the
same way with ``code_dir=`` (e.g. a checkout of a repo built by ``standin_repos``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_sentinel.bisect.measure.workspace import free_port

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
ENV_FAKE_GPU = "OOM_SENTINEL_FAKE_GPU"


def _maybe_json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


@dataclass
class StandinProcess:
    proc: subprocess.Popen[bytes]
    port: int
    base_dir: Path
    code_dir: Path
    stdout_path: Path
    stderr_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr_text(self) -> str:
        return self.stderr_path.read_text("utf-8", errors="replace")

    def stdout_text(self) -> str:
        return self.stdout_path.read_text("utf-8", errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_stderr(self, text: str, timeout_s: float = 30.0) -> str:
        """Block until ``text`` appears in the console log (or fail naming what was seen)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.stderr_text()
            if text in got:
                return got
            time.sleep(0.02)
        raise AssertionError(
            f"{text!r} not in stand-in stderr after {timeout_s} s:\n{self.stderr_text()[-3000:]}"
        )

    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def post_json(self, path: str, body: Any, timeout_s: float = 10.0) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, _maybe_json(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _maybe_json(err.read())

    def post_prompt(
        self, prompt: dict[str, Any], client_id: str | None = "tab", **body: Any
    ) -> str:
        """Queue ``prompt`` as a browser tab does (``POST /prompt``); fails unless it was
        queued (200, with the server's answer as the message); returns its prompt_id. A
        ``client_id`` of None sends none (a script's post)."""
        doc = {"prompt": prompt, **body}
        if client_id is not None:
            doc["client_id"] = client_id
        status, answer = self.post_json("/prompt", doc)
        assert status == 200, answer
        return str(answer["prompt_id"])

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGINT (ComfyUI's Ctrl-C path), then SIGKILL; returns the exit status."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        return int(self.proc.returncode)

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        return int(self.proc.wait(timeout=10))


def start_standin(
    base_dir: Path,
    *extra_args: str,
    code_dir: Path = STANDIN_DIR,
    python: str = sys.executable,
    fake_gpu: Path | None = None,
    cpu: bool | None = None,
    env: dict[str, str] | None = None,
    manager_log: bool = False,
    rlimit_as_mib: int | None = None,
    rlimit_as_headroom_mib: int | None = None,
    port: int | None = None,
    default_args: bool = True,
    base_directory: bool = True,
    wait_ready: bool = True,
    ready_timeout_s: float = 30.0,
) -> StandinProcess:
    """Start the stand-in; with ``wait_ready`` return once ``/system_stats`` answers."""
    base_dir.mkdir(parents=True, exist_ok=True)
    chosen = port if port is not None else free_port()
    argv = [python, str(code_dir / "main.py")]
    if default_args:
        argv += ["--listen", "127.0.0.1", "--port", str(chosen)]
        if base_directory:
            argv += ["--base-directory", str(base_dir)]
        else:
            # Keep the install's own custom_nodes/ and models/, move everything that is written.
            (base_dir / "user").mkdir(exist_ok=True)
            argv += [
                "--output-directory",
                str(base_dir / "output"),
                "--input-directory",
                str(base_dir / "input"),
            ]
            argv += ["--temp-directory", str(base_dir), "--user-directory", str(base_dir / "user")]
        argv += ["--database-url", "sqlite:///:memory:", "--disable-auto-launch"]
        if cpu if cpu is not None else fake_gpu is None:
            argv.append("--cpu")
    argv += list(extra_args)
    child_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OOM_STANDIN_", ENV_FAKE_GPU, "CUDA_VISIBLE"))
    }
    child_env["PYTHONUNBUFFERED"] = "1"
    if fake_gpu is not None:
        child_env[ENV_FAKE_GPU] = str(fake_gpu)
    if manager_log:
        child_env["OOM_STANDIN_MANAGER_LOG"] = "1"
    if rlimit_as_mib is not None:
        child_env["OOM_STANDIN_RLIMIT_AS_MIB"] = str(rlimit_as_mib)
    if rlimit_as_headroom_mib is not None:
        child_env["OOM_STANDIN_RLIMIT_AS_HEADROOM_MIB"] = str(rlimit_as_headroom_mib)
    child_env.update(env or {})
    n = 0
    while (base_dir / f"console{n}.err").exists():
        n += 1
    out_path, err_path = base_dir / f"console{n}.out", base_dir / f"console{n}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=child_env,
            cwd=base_dir,
            preexec_fn=_default_sigint if os.name == "posix" else None,
        )
    handle = StandinProcess(proc, chosen, base_dir, code_dir, out_path, err_path, argv)
    if wait_ready:
        wait_until_ready(handle, ready_timeout_s)
    return handle


def _default_sigint() -> None:
    """Ctrl-C must reach the stand-in the way it reaches a ComfyUI started from a terminal: a
    pytest started in the background (``pytest &``, a CI runner) inherits SIGINT *ignored*, and
    Python then never raises KeyboardInterrupt, so ``stop()`` would end every server with its
    SIGKILL fallback -- which the daemon rightly treats as a kill, not a stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until_ready(handle: StandinProcess, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if handle.proc.poll() is not None:
            raise RuntimeError(
                f"stand-in exited with {handle.proc.returncode} before it was ready:\n{handle.stderr_text()[-3000:]}"
            )
        try:
            handle.get_json("/system_stats", timeout_s=2.0)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            handle.kill()
            raise RuntimeError(
                f"stand-in not ready within {timeout_s} s:\n{handle.stderr_text()[-3000:]}"
            )
        time.sleep(0.05)
