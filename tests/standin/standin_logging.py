"""Console capture as ComfyUI v0.8.0 does it, plus an optional ComfyUI-Manager-style log file.

ComfyUI replaces ``sys.stdout``/``sys.stderr`` with interceptors that copy every ``write()`` into a
ring of 300 entries (served at ``/internal/logs``) and logs with the bare format ``%(message)s``
(comfyui-facts.md 3.1). ComfyUI core writes no file; ComfyUI-Manager does, at
``<user dir>/comfyui.log`` (``comfyui_<port>.log`` when ``--port N`` is two argv tokens), rotating
``X.log -> X.prev.log -> X.prev2.log`` at every start and prefixing each new line with
``[YYYY-MM-DD HH:MM:SS.mmm] `` (facts 3.4). The daemon's log follower is tested against that file,
so the stand-in can write it when ``$OOM_STANDIN_MANAGER_LOG`` is set.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import TextIO

RING_SIZE = 300
ENV_MANAGER_LOG = "OOM_STANDIN_MANAGER_LOG"

_logs: deque[dict[str, str]] = deque(maxlen=RING_SIZE)
_logs_lock = threading.Lock()


def get_logs() -> list[dict[str, str]]:
    with _logs_lock:
        return list(_logs)


def _record(data: str) -> None:
    with _logs_lock:
        # A write starting with "\r" replaces the previous entry unless that one ended a line,
        # which keeps tqdm bars from flooding the ring.
        if data.startswith("\r") and _logs and not _logs[-1]["m"].endswith("\n"):
            _logs.pop()
        _logs.append({"t": datetime.now().isoformat(), "m": data})


class ManagerLogFile:
    """The file half of ComfyUI-Manager's console tee."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._last_char = "\n"
        self._fh = path.open("a", encoding="utf-8")

    def write(self, message: str) -> None:
        if not message:
            return
        with self._lock:
            if self._last_char == "\n":
                stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
                self._fh.write(f"[{stamp}] {message}")
            else:
                self._fh.write(message)
            self._fh.flush()
            self._last_char = message[-1]


class _Interceptor(io.TextIOBase):
    def __init__(self, stream: TextIO, tee: ManagerLogFile | None) -> None:
        self._stream = stream
        self._tee = tee

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8") or "utf-8"

    def write(self, data: str) -> int:
        self._stream.write(data)
        self._stream.flush()
        if self._tee is not None:
            self._tee.write(data)
        _record(data)
        return len(data)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return False


def manager_log_path(user_dir: Path, argv: list[str]) -> Path:
    """``comfyui_<port>.log`` only when ``--port`` and its value are separate argv tokens."""
    name = "comfyui.log"
    if "--port" in argv:
        idx = argv.index("--port")
        if idx + 1 < len(argv):
            name = f"comfyui_{argv[idx + 1]}.log"
    return user_dir / name


def rotate_manager_log(path: Path) -> None:
    base = str(path)[: -len(".log")]
    prev, prev2 = Path(base + ".prev.log"), Path(base + ".prev2.log")
    if path.exists():
        if prev.exists():
            if prev2.exists():
                prev2.unlink()
            prev.rename(prev2)
        path.rename(prev)


def setup(level: str, log_stdout: bool, manager_log: Path | None) -> None:
    """Install the interceptors and the root logger exactly once, first thing in main."""
    tee = None
    if manager_log is not None:
        manager_log.parent.mkdir(parents=True, exist_ok=True)
        rotate_manager_log(manager_log)
        tee = ManagerLogFile(manager_log)
    sys.stdout = _Interceptor(sys.__stdout__, tee)  # type: ignore[assignment]
    sys.stderr = _Interceptor(sys.__stderr__, tee)  # type: ignore[assignment]

    root = logging.getLogger()
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    fmt = logging.Formatter("%(message)s")
    if log_stdout:
        out = logging.StreamHandler(sys.stdout)
        out.setFormatter(fmt)
        out.addFilter(lambda record: record.levelno < logging.ERROR)
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(fmt)
        err.setLevel(logging.ERROR)
        root.addHandler(out)
        root.addHandler(err)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(fmt)
        root.addHandler(handler)
    # aiohttp's own loggers stay quiet, as in ComfyUI (no access log).
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


def manager_banner(code_dir: Path, base_dir: Path, user_dir: Path, log_path: Path) -> None:
    """The banner ComfyUI-Manager prints to stdout at startup (facts 3.4)."""
    started = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"** ComfyUI startup time: {started}")
    print(f"** Platform: {'Linux' if sys.platform.startswith('linux') else sys.platform}")
    print(f"** Python version: {sys.version}")
    print(f"** Python executable: {sys.executable}")
    print(f"** ComfyUI Path: {code_dir}")
    print(f"** ComfyUI Base Folder Path: {base_dir}")
    print(f"** User directory: {user_dir}")
    print(
        f"** ComfyUI-Manager config path: {user_dir / 'default' / 'ComfyUI-Manager' / 'config.ini'}"
    )
    print(f"** Log path: {log_path}")


def manager_log_requested() -> bool:
    return os.environ.get(ENV_MANAGER_LOG, "") not in ("", "0", "false", "no")
