"""Shared fixtures. GPU tests run only where NVML sees a device; real-ComfyUI tests only when
$OOM_SENTINEL_REAL_COMFYUI points at a checkout."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _nvml_device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    need_gpu = [item for item in items if "gpu" in item.keywords]
    if need_gpu and _nvml_device_count() == 0:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML found none)")
        for item in need_gpu:
            item.add_marker(skip)
    if not os.environ.get("OOM_SENTINEL_REAL_COMFYUI"):
        skip = pytest.mark.skip(reason="set OOM_SENTINEL_REAL_COMFYUI to a ComfyUI checkout")
        for item in items:
            if "real_comfyui" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start stand-in ComfyUI processes (``tests/standin_proc.py``); all are stopped afterwards.

    ``proc = standin("--lowvram", fake_gpu=gpu_dir)`` returns a ready ``StandinProcess`` with a
    free port on 127.0.0.1 and its own base directory under ``tmp_path``.
    """
    from standin_proc import StandinProcess, start_standin

    started: list[StandinProcess] = []

    def start(*args: str, base_dir: Path | None = None, **kw: Any) -> StandinProcess:
        proc = start_standin(base_dir or tmp_path / f"standin-{len(started)}", *args, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """A venv with the CPU build of torch, cached between sessions (see ``torch_venv.py``)."""
    from torch_venv import torch_venv_python

    return torch_venv_python()
