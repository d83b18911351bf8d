"""Stand-in ComfyUI checkouts for process and discovery tests: a directory with the files that
identify ComfyUI and a ``main.py`` that just waits, started as a real process.

Nothing of ComfyUI's code is here; the files only carry the names ComfyUI's tree has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

MAIN = """\
import sys, time
print("ready", flush=True)
time.sleep(120)
"""


def make_install(
    path: Path, *, markers: Sequence[str] = ("folder_paths.py", "comfy/", "nodes.py")
) -> Path:
    """Create a ComfyUI-looking checkout at ``path`` (``markers`` ending in / are directories)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "main.py").write_text(MAIN)
    for marker in markers:
        if marker.endswith("/"):
            (path / marker.rstrip("/")).mkdir(exist_ok=True)
        else:
            (path / marker).write_text("# stand-in\n")
    return path


def start_comfy(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    interpreter_args: Sequence[str] = (),
) -> subprocess.Popen[str]:
    """Run ``python [interpreter_args] script args`` and wait until it says it is ready."""
    full_env = dict(os.environ)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES"):
        full_env.pop(key, None)
    full_env.update(env or {})
    proc = subprocess.Popen(
        [python, *interpreter_args, os.fspath(script), *args],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", line
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
