"""The harness's side of the fork server (``forkserver.py``): start one per environment,
ask it for a ComfyUI per measurement, and follow that child as if it were our own.

The child is the server's child, not ours, so ``subprocess`` cannot wait for it: the server
reports its pid as soon as it forked and its exit status when it reaped it, and a
``ForkedChild`` turns that into the part of ``Popen`` the replay uses (``pid``, ``poll``,
``wait``, ``returncode``). Everything else works on the pid as before: psutil reads a
non-child's RSS and ``VmHWM`` the same way, the child leads its own process group (so
``killpg`` reaches its helpers), and its pid and start time go to ``replay.json`` for a
later ``oom-bisect`` to kill.

Where fork is absent or unsafe -- Windows (no fork), macOS (no parent-death signal, and
forking a process that loaded Apple's frameworks, as torch's MPS backend does, is unsafe) --
measurements start cold, and that is said once. Also when the server cannot start, or a
preloaded package initialised CUDA (a context does not survive a fork).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from oom_sentinel.daemon.core.atomic import write_text_atomic

__all__ = [
    "FORKSERVER_NAME",
    "PRELOAD",
    "ForkServer",
    "ForkedChild",
    "ProcessHandle",
    "fork_server_for",
    "fork_unavailable",
    "learn_imports",
    "learned_imports",
    "shutdown_fork_servers",
]

log = logging.getLogger(__name__)

FORKSERVER_NAME = "oom_bisect_forkserver.py"
FORKSERVER_SOURCE = Path(__file__).parent / "forkserver.py"

#: Third-party packages ComfyUI's start-up imports (its requirements.txt; what v0.8.0's
#: ``main.py --cpu`` had in ``sys.modules`` from site-packages), heaviest first. Never
#: ComfyUI's own modules nor its ``comfy*`` pip packages (they move with its commits and
#: may touch the GPU when imported). One that fails to import is skipped.
PRELOAD: tuple[str, ...] = (
    "torch",
    "torchvision",
    "torchaudio",
    "torchsde",
    "numpy",
    "scipy",
    "scipy.signal",
    "scipy.ndimage",
    "PIL",
    "PIL.Image",
    "safetensors",
    "safetensors.torch",
    "einops",
    "transformers",
    "tokenizers",
    "huggingface_hub",
    "kornia",
    "spandrel",
    "sympy",
    "av",
    "aiohttp",
    "aiohttp.web",
    "yarl",
    "yaml",
    "tqdm",
    "psutil",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "pydantic_settings",
    "requests",
    "jinja2",
)

#: read when CUDA initialises, not when torch is imported: may differ per child
PER_CHILD_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"})


class ProcessHandle(Protocol):
    """What the replay needs of a ComfyUI process: a ``Popen`` or a ``ForkedChild``."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def fork_unavailable(platform: str | None = None) -> str | None:
    """Why measurements cannot be forked here (None: they can)."""
    platform = sys.platform if platform is None else platform
    if platform.startswith("win"):
        return "Windows has no fork()"
    if platform == "darwin":
        return "macOS has no parent-death signal and forking after MPS/Apple frameworks is unsafe"
    if not platform.startswith("linux"):
        return f"fork server not supported on {platform}"
    return None


class ForkedChild:
    """A ComfyUI forked by the server, followed through the server's reports."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self._pid = pid
        self.args = list(args)
        self._returncode: int | None = None
        self._done = threading.Event()
        #: the server went away before reporting this child's exit
        self.lost = False
        #: ComfyUI chose other allocator settings than torch was preloaded with: the child
        #: replaced itself by a cold start (same pid)
        self.restarted_cold = False

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def _exited(self, code: int, *, lost: bool = False) -> None:
        if not self._done.is_set():
            self._returncode = code
            self.lost = lost
            self._done.set()

    def poll(self) -> int | None:
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self._returncode is not None
        return self._returncode

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self._pid, 9)


def _pid_gone(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


class ForkServer:
    """One preloaded interpreter; ``spawn`` is safe from any thread."""

    def __init__(self, proc: subprocess.Popen[bytes], hello: Mapping[str, Any]) -> None:
        self.proc = proc
        self.hello = dict(hello)
        self._children: dict[int, ForkedChild] = {}
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        #: called with the allocator settings a child restarted cold for
        self.on_restart: Callable[[dict[str, str | None]], None] | None = None
        self._reader = threading.Thread(target=self._read, name="fork-server-reader", daemon=True)
        self._reader.start()

    @property
    def preloaded(self) -> list[str]:
        return [str(m) for m in self.hello.get("preloaded") or []]

    @classmethod
    def start(
        cls,
        popen: Callable[..., subprocess.Popen[bytes]],
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        timeout_s: float,
        **kwargs: Any,
    ) -> ForkServer | str:
        """Start a server and wait for its hello; a string says why there is none."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log_file:
            try:
                proc = popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log_file,
                    env=dict(env),
                    **kwargs,
                )
            except OSError as exc:
                return f"cannot start {argv[0]}: {exc.strerror or exc}"
        assert proc.stdout is not None
        hello = _read_hello(proc, timeout_s)
        if isinstance(hello, str) or not hello.get("ready"):
            why = hello if isinstance(hello, str) else "a preloaded package initialised CUDA"
            _kill(proc)
            return why
        return cls(proc, hello)

    # -- children
    def spawn(
        self, argv: Sequence[str], *, cwd: Path | str, env: Mapping[str, str], console: Path
    ) -> ForkedChild:
        """Fork a child that runs ``argv`` (a cold start's command line) in ``cwd``."""
        rid = next(self._ids)
        event = threading.Event()
        box: list[Any] = []
        request = {
            "id": rid,
            "argv": list(argv),
            "cwd": str(cwd),
            "env": dict(env),
            "console": str(console),
        }
        with self._lock:
            if self._closed or self.proc.poll() is not None:
                raise OSError("the fork server is gone")
            self._waiting[rid] = (event, box)
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except OSError:
                self._waiting.pop(rid, None)
                raise
        if not event.wait(60) or not box:
            with self._lock:
                self._waiting.pop(rid, None)
            raise OSError("the fork server did not answer")
        answer = box[0]
        if not isinstance(answer, ForkedChild):
            raise OSError(str(answer))
        return answer

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            with self._lock:
                if "exit" in message:
                    child = self._children.pop(int(message["exit"]), None)
                    if child is not None:
                        child._exited(int(message["code"]))
                    continue
                if "restart" in message:
                    child = self._children.get(int(message["restart"]))
                    if child is not None:
                        child.restarted_cold = True
                    conf = message.get("alloc_conf")
                    if self.on_restart is not None and isinstance(conf, dict):
                        self.on_restart({str(k): v for k, v in conf.items()})
                    continue
                rid = message.get("id")
                waiting = self._waiting.pop(rid, None) if isinstance(rid, int) else None
                if waiting is None:
                    continue
                event, box = waiting
                if "pid" in message:
                    child = ForkedChild(int(message["pid"]), [])
                    self._children[child.pid] = child
                    box.append(child)
                else:
                    box.append(message.get("error") or "fork failed")
                event.set()
        self._lost()

    def _lost(self) -> None:
        """The server is gone: its children die of their parent-death signal."""
        with self._lock:
            self._closed = True
            children = list(self._children.values())
            self._children.clear()
            for event, box in self._waiting.values():
                box.append("the fork server exited")
                event.set()
            self._waiting.clear()
        if children:
            log.warning("the fork server exited; its ComfyUI exit statuses are unknown")
        for child in children:
            deadline = time.monotonic() + 10
            while not _pid_gone(child.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            child.kill()
            child._exited(-9, lost=True)

    def close(self) -> None:
        """Closing the request pipe makes the server kill its children and exit."""
        with self._lock:
            self._closed = True
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
        self._reader.join(timeout=15)


def _read_hello(proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any] | str:
    box: list[bytes] = []
    stdout: IO[bytes] | None = proc.stdout
    assert stdout is not None

    def read() -> None:
        box.append(stdout.readline())

    reader = threading.Thread(target=read, name="fork-server-hello", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box:
        return f"it did not finish preloading within {timeout_s:g} s"
    if not box[0]:
        return f"it exited while preloading (status {proc.wait()})"
    try:
        hello = json.loads(box[0])
    except ValueError:
        return "it answered something else than its hello"
    return hello if isinstance(hello, dict) else "it answered something else than its hello"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


# -- one server per environment ----------------------------------------------------------------

_servers: dict[tuple[Any, ...], ForkServer | str] = {}
_servers_lock = threading.Lock()
#: per environment: the allocator settings ComfyUI last chose (learnt from a cold restart);
#: the next server preloads torch with them, so its children match
_learned_alloc: dict[tuple[Any, ...], dict[str, str | None]] = {}
#: per environment: the PRELOAD modules a cold start imported (``learn_imports``)
_learned_imports: dict[tuple[Any, ...], tuple[str, ...]] = {}
_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("%s", message)


def env_key(python: str, env: Mapping[str, str]) -> tuple[Any, ...]:
    """Servers are shared by measurements whose interpreter and import-time environment
    are the same (what differs per child, such as the visible GPUs, is left out)."""
    return (python, tuple(sorted((k, v) for k, v in env.items() if k not in PER_CHILD_ENV)))


def learn_imports(python: str, env: Mapping[str, str], modules: Sequence[str]) -> None:
    """What a cold start of ComfyUI in this environment imported (its bootstrap's report):
    the server preloads only those of ``PRELOAD``, so a forked child holds no package a
    cold start would not have (each would add its memory to the child's RSS)."""
    imported = set(modules)
    chosen = tuple(name for name in PRELOAD if name in imported)
    with _servers_lock:
        _learned_imports.setdefault(env_key(python, env), chosen)


def learned_imports(python: str, env: Mapping[str, str]) -> tuple[str, ...] | None:
    with _servers_lock:
        return _learned_imports.get(env_key(python, env))


def fork_server_for(
    python: str,
    env: Mapping[str, str],
    harness_dir: Path,
    popen: Callable[..., subprocess.Popen[bytes]],
    timeout_s: float,
    preload: Sequence[str] | None = PRELOAD,
    **popen_kwargs: Any,
) -> ForkServer | None:
    """The server for this interpreter, environment and preload list, started on first
    use; None (said once) where measurements must start cold, and None while ``preload``
    is (nothing learnt yet)."""
    why = fork_unavailable()
    if why is not None:
        _say_once(f"--fork-server: {why}; every measurement starts cold")
        return None
    if preload is None:
        return None
    base = env_key(python, env)
    with _servers_lock:
        learned = _learned_alloc.get(base)
        server_env = dict(env)
        for var, value in (learned or {}).items():
            if value is None:
                server_env.pop(var, None)
            else:
                server_env[var] = value
        key = (
            base,
            tuple(sorted((learned or {}).items(), key=lambda kv: kv[0])),
            tuple(preload),
        )
        server = _servers.get(key)
        if isinstance(server, ForkServer) and server.proc.poll() is not None:
            server = None  # it died: start another
        if server is None:
            script = harness_dir / FORKSERVER_NAME
            source = FORKSERVER_SOURCE.read_text("utf-8")
            with contextlib.suppress(OSError):
                if script.read_text("utf-8") == source:
                    source = ""
            if source:
                write_text_atomic(script, source, mode=0o644)
            server = ForkServer.start(
                popen,
                [python, str(script), *preload],
                server_env,
                harness_dir / "forkserver.log",
                timeout_s,
                **popen_kwargs,
            )
            _servers[key] = server
            if isinstance(server, ForkServer):
                server.on_restart = lambda conf: _learn(base, conf)
                failed = server.hello.get("failed") or {}
                log.info(
                    "fork server %d preloaded %d modules in %.1f s (not importable: %s)",
                    server.proc.pid,
                    len(server.preloaded),
                    float(server.hello.get("preload_s") or 0),
                    ", ".join(sorted(failed)) or "none",
                )
    if isinstance(server, str):
        _say_once(f"--fork-server: the fork server did not start ({server}); starting cold")
        return None
    return server


def _learn(base: tuple[Any, ...], conf: dict[str, str | None]) -> None:
    with _servers_lock:
        if _learned_alloc.get(base) != conf:
            _learned_alloc[base] = conf
            log.info("ComfyUI chose allocator settings %s: the next fork server preloads so", conf)


def shutdown_fork_servers() -> None:
    """Stop every server (their children with them)."""
    with _servers_lock:
        servers = [s for s in _servers.values() if isinstance(s, ForkServer)]
        _servers.clear()
        _learned_alloc.clear()
        _learned_imports.clear()
    for server in servers:
        server.close()
