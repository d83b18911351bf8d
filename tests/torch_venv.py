"""A real interpreter with torch (CPU build) standing in for ComfyUI's, shared by the tests that
run torch in "ComfyUI's interpreter" (install-state facts, the doctor's torch probe).

Building it takes ~30 s and ~0.9 GB, so it lives in a cache folder outside the tests' temp dirs
(``$OOM_SENTINEL_TEST_CACHE``, else ``~/.cache/oom-sentinel-tests``) and is built once per
machine, under a lock for parallel runs. ``OOM_SENTINEL_TEST_NO_TORCH=1`` skips the tests that
need it. The ``torch_python`` fixture (``conftest.py``) hands it out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

TORCH_VERSION = "2.13.0"


def cache_root() -> Path:
    configured = os.environ.get("OOM_SENTINEL_TEST_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "oom-sentinel-tests"


def torch_venv_python() -> Path:
    """The cached venv's interpreter, built first if needed; skips the calling test when
    torch is disabled or cannot be installed."""
    if os.environ.get("OOM_SENTINEL_TEST_NO_TORCH"):
        pytest.skip("OOM_SENTINEL_TEST_NO_TORCH is set")
    tag = f"torch-{TORCH_VERSION}-py{sys.version_info[0]}{sys.version_info[1]}"
    root = cache_root() / tag
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    ready = root / ".ready"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{tag}.lock", "w") as lock:
        with contextlib.suppress(ImportError):  # no fcntl on Windows: no lock, still works
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(root)
            proc = subprocess.run(
                [python, "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                pytest.skip(f"cannot install torch=={TORCH_VERSION}: {proc.stderr[-300:]}")
            ready.write_text("ok\n")
    return python
