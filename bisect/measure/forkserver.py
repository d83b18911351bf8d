"""A preloaded interpreter that forks one ComfyUI per measurement (``--fork-server``).

Why: every replay otherwise pays ComfyUI's whole cold start, most of it importing torch and
the other third-party packages it needs -- the same files for every commit of a bisect,
since the environment (ComfyUI's interpreter and its site-packages) does not change between
states. This server imports them once; each measurement is a ``fork()`` of it that runs the
bootstrap (and through it ComfyUI's ``main.py``) as a cold start would.

Rules this file lives by (it runs in ComfyUI's interpreter, like ``bootstrap.py``):

* **Standard library only, Python 3.8+**; copied next to the bootstrap and run by path.
* **Third-party modules only, never ComfyUI's own** (``comfy``, ``nodes``, ``folder_paths``,
  custom nodes): those change from one commit to the next, which is what is measured.
* **Never initialise CUDA before the fork**: CUDA does not survive ``fork()`` (not even a
  driver that was only asked for its device count). Packages are imported with
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (``torch.cuda.is_available()`` then asks NVML), and
  the server refuses to serve when ``torch.cuda.is_initialized()`` or ``libcuda`` is loaded.
* **torch fixed its allocator backend when it loaded** (``PYTORCH_CUDA_ALLOC_CONF``, which
  ComfyUI's ``cuda_malloc.py`` sets per commit and per flag before importing torch). A
  child whose allocator settings differ, by the time CUDA initialises, from those torch
  was loaded with would measure another allocator: it replaces itself (same pid, same
  console, same process group) with a cold start of the same command and says so.
* **Every child dies with the server, and the server with oom-bisect**: the harness starts
  the server with ``PR_SET_PDEATHSIG`` = SIGKILL, each child gets the same towards the
  server (which forks from its only thread), and each child is the leader of its own
  session and process group so the harness's ``killpg`` reaches its helpers. The server
  kills its children's groups when its request pipe closes or it is told to stop.

Protocol, JSON lines: the harness writes requests to the server's stdin, the server answers
on the file descriptor that was its stdout (its fd 1 then points to stderr, so a package
that prints while importing cannot corrupt the answers)::

    -> {"ready": true, "pid": N, "preloaded": [..], "failed": {name: why},
        "cuda_initialized": false, "alloc_conf": {var: value|null}, "preload_s": f}
    <- {"id": K, "argv": [python, bootstrap, ...], "cwd": d, "env": {..}, "console": path}
    -> {"id": K, "pid": N} | {"id": K, "error": why}
    -> {"exit": N, "code": C}          (C as subprocess.Popen.returncode: -signal or status)
    -> {"restart": N, "alloc_conf": {var: value|null}}   (child N went cold for these)

Usage: ``python oom_bisect_forkserver.py [MODULE...]`` (the modules to preload, in order).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __name__ == "__main__":
    del sys.path[0]  # the harness folder: nothing of ours may shadow a package

import contextlib
import ctypes
import errno
import gc
import importlib
import json
import os
import select
import signal
import time
import traceback
from typing import Any

#: the allocator settings torch reads when its library loads
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
#: set before preloading, as ComfyUI's main.py sets them before importing anything
#: (huggingface_hub reads them at import; they only turn telemetry off)
COMFY_ENV = {"HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
#: while preloading only: a package that asks ``torch.cuda.is_available()`` at import gets
#: NVML's answer instead of the CUDA driver's (which would make CUDA unusable after a fork);
#: the children get the harness's environment, without it
PRELOAD_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
PR_SET_PDEATHSIG = 1


def exit_code(status: int) -> int:
    """A ``waitpid`` status as ``Popen.returncode`` has it: -N for signal N, else the code."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


def alloc_conf() -> dict[str, str | None]:
    return {var: os.environ.get(var) for var in ALLOC_VARS}


def preload(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Import ``names`` in order; one that fails is skipped with its reason."""
    done: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        try:
            importlib.import_module(name)
            done.append(name)
        except BaseException as exc:  # an import may even call sys.exit
            failed[name] = f"{type(exc).__name__}: {exc}"[:200]
    return done, failed


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, pages) runs of this process's readable file-backed pages that are mapped.

    Why: ``fork()`` copies the page-table entries of anonymous memory but not of file
    mappings (the child faults those in when it touches them), so a child's RSS would leave
    out the library pages a cold start counts -- code and data that only ran while
    importing, hundreds of MiB for torch. A child that touches these pages once has the
    RSS (and ``VmHWM``) a cold start has after the same imports.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    runs: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[1].startswith("r"):
                    continue
                path = parts[5].strip()
                if not path.startswith("/") or path.endswith("(deleted)"):
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                count = (end - start) // page
                pagemap.seek(start // page * 8)
                data = pagemap.read(count * 8)
                run_start = -1
                for i in range(len(data) // 8):
                    present = data[i * 8 + 7] & 0x80
                    if present and run_start < 0:
                        run_start = i
                    elif not present and run_start >= 0:
                        runs.append((start + run_start * page, i - run_start))
                        run_start = -1
                if run_start >= 0:
                    runs.append((start + run_start * page, len(data) // 8 - run_start))
    except OSError:
        return []
    return runs


def touch_pages(runs: list[tuple[int, int]]) -> None:
    """Read one byte of every page in ``runs`` (see ``resident_file_pages``)."""
    page = os.sysconf("SC_PAGE_SIZE")
    char = ctypes.c_char
    for address, pages in runs:
        for i in range(pages):
            char.from_address(address + i * page).value  # noqa: B018 - the fault is the point


def cuda_initialized() -> bool:
    """torch initialised CUDA, or anything called the CUDA driver (``libcuda`` is loaded
    only then: torch's libraries link the runtime, which opens the driver on first use).
    Either makes CUDA unusable in a forked child."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return True
        except Exception:
            pass
    try:
        with open("/proc/self/maps") as maps:
            return any(
                os.path.basename(line.split()[-1]).startswith("libcuda.so")
                for line in maps
                if "/" in line
            )
    except OSError:
        return False


class Server:
    def __init__(self, answers: int, requests: int) -> None:
        self.answers = answers
        self.requests = requests
        self.children: dict[int, Any] = {}  # pid -> request id
        self.buffer = b""
        self.pid = os.getpid()
        self.loaded_conf = alloc_conf()
        libc = ctypes.CDLL(None, use_errno=True)
        self.prctl = libc.prctl
        self.file_pages: list[tuple[int, int]] = []
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            try:
                n = os.write(self.answers, data)
            except InterruptedError:
                continue
            data = data[n:]

    # -- children
    def fork(self, request: dict[str, Any]) -> None:
        rid = request.get("id")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            self.send({"id": rid, "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            code = 1
            try:
                code = self.child(request)
            except BaseException:
                with contextlib.suppress(Exception):
                    traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        self.children[pid] = rid
        self.send({"id": rid, "pid": pid})

    def child(self, request: dict[str, Any]) -> int:
        """In the forked child: become what a cold start of ``argv`` would be, and run it."""
        os.setsid()
        self.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.pid:
            return 1  # the server died between the fork and the prctl
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):  # ours; the rest is as Python set it
            signal.signal(sig, signal.SIG_DFL)
        for fd in (self.requests, self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        os.set_inheritable(self.answers, False)  # kept to say a restart; gone at any exec
        argv = [str(a) for a in request["argv"]]
        env = {str(k): str(v) for k, v in dict(request["env"]).items()}
        console = os.open(str(request["console"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        touch_pages(self.file_pages)  # before anything else runs: the RSS a cold start has
        os.dup2(null, 0)
        os.dup2(console, 1)
        os.dup2(console, 2)
        os.close(null)
        os.close(console)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(env)
        self.guard_allocator(argv, env)
        bootstrap = argv[1]
        sys.argv = argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(bootstrap)))  # as a cold start
        import runpy

        code = 0
        try:
            runpy.run_path(bootstrap, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        import atexit

        atexit._run_exitfuncs()
        return code

    def guard_allocator(self, argv: list[str], env: dict[str, str]) -> None:
        """When CUDA initialises in the child, check that torch's allocator settings are
        those ComfyUI asked for; else replace the child by a cold start of ``argv``."""
        torch = sys.modules.get("torch")
        lazy = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
        if lazy is None:
            return
        loaded = dict(self.loaded_conf)

        def check() -> None:
            now = alloc_conf()
            if now == loaded:
                return
            sys.stderr.write(
                "oom-bisect fork server: ComfyUI asked for allocator settings "
                f"{now} but torch was preloaded with {loaded}; restarting cold\n"
            )
            sys.stderr.flush()
            with contextlib.suppress(OSError):  # one short write: atomic on a pipe
                os.write(
                    self.answers,
                    (json.dumps({"restart": os.getpid(), "alloc_conf": now}) + "\n").encode(),
                )
            os.execve(argv[0], argv, env)

        try:
            lazy(check)
        except Exception as exc:
            sys.stderr.write(f"oom-bisect fork server: cannot watch CUDA's start: {exc}\n")

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self.children.pop(pid, None)
            self.send({"exit": pid, "code": exit_code(status)})

    def kill_children(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)

    # -- the loop
    def serve(self) -> int:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        try:
            while not stopping:
                try:
                    ready, _, _ = select.select([self.requests, self.wake_r], [], [])
                except InterruptedError:
                    continue
                if self.wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                    self.reap()
                if self.requests in ready:
                    try:
                        data = os.read(self.requests, 65536)
                    except InterruptedError:
                        continue
                    if not data:
                        return 0  # the harness went away
                    self.buffer += data
                    while b"\n" in self.buffer:
                        line, self.buffer = self.buffer.split(b"\n", 1)
                        self.handle(line)
            return 0
        finally:
            self.kill_children()

    def handle(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            return
        if isinstance(request, dict) and request.get("argv"):
            self.fork(request)


def main(names: list[str]) -> int:
    t0 = time.monotonic()
    answers = os.dup(1)
    requests = os.dup(0)
    os.dup2(2, 1)  # print() while importing goes to our log, not into the answers
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for key, value in COMFY_ENV.items():
        os.environ.setdefault(key, value)
    for key, value in PRELOAD_ENV.items():
        os.environ.setdefault(key, value)
    done, failed = preload(names)
    server = Server(answers, requests)
    initialized = cuda_initialized()
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # the children's collections then leave the shared pages alone
    server.file_pages = resident_file_pages()
    try:
        server.send(
            {
                "ready": not initialized,
                "pid": os.getpid(),
                "preloaded": done,
                "failed": failed,
                "cuda_initialized": initialized,
                "alloc_conf": server.loaded_conf,
                "preload_s": round(time.monotonic() - t0, 3),
                "file_pages": sum(n for _, n in server.file_pages),
            }
        )
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return 0
        raise
    if initialized:
        return 3  # a preloaded package initialised CUDA: forking would break it
    return server.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
