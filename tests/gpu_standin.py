"""A stand-in ComfyUI that uses a real NVIDIA GPU, for the GPU check and the ``gpu`` tests.

The stand-in itself only pretends (host RAM, or the file-scripted fake GPU). On a machine
with CUDA this adds one custom node pack, ``TorchAlloc``, whose ``TorchAllocate`` node holds
``mib`` MiB of real CUDA memory (a uint8 tensor, written so the pages are really committed)
for ``hold_s`` seconds. The size is scaled by the core commit's memory factor like every
stand-in node, so a stand-in history with a "bad" commit becomes a real GPU regression. The
pack imports torch when ComfyUI loads it, which is what oom-bisect's bootstrap waits for.

Not a test module; used by ``tests/test_bisect_gpu.py`` and ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from standin_repos import BuiltRepo, build_core_repo

TORCH_PACK = '''"""TorchAlloc: real CUDA memory for oom-bisect's GPU check (generated)."""

import time

import standin_api
import standin_memory
import torch


class TorchAllocate:
    CATEGORY = "_for_testing"
    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "mib": ("INT", {"default": 1024, "min": 0, "max": 1 << 24}),
                "hold_s": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 600.0}),
            }
        }

    def run(self, mib, hold_s):
        nbytes = standin_memory.scaled_bytes(mib * 1024 * 1024, "TorchAllocate", vram=True)
        block = torch.empty(max(1, nbytes), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            standin_api.check_interrupt()
            time.sleep(0.02)
        del block
        return (nbytes,)


NODE_CLASS_MAPPINGS = {"TorchAllocate": TorchAllocate}
NODE_DISPLAY_NAME_MAPPINGS = {"TorchAllocate": "Torch Allocate (CUDA)"}
'''


def torch_cuda_available(python: str = sys.executable) -> tuple[bool, str]:
    """(whether ``python`` has torch with a usable CUDA device, what it said)."""
    code = (
        "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), "
        "torch.cuda.device_count())"
    )
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    out = (proc.stdout or proc.stderr).strip().splitlines()
    said = out[-1] if out else f"exit {proc.returncode}"
    return proc.returncode == 0 and " True " in f" {said} ", said


def build_gpu_install(base: Path, n_commits: int = 40, bad_commit_index: int = 23) -> BuiltRepo:
    """A stand-in core history whose commit ``bad_commit_index`` uses 1.6x the memory, with
    the TorchAlloc pack installed as a plain folder in its ``custom_nodes/``."""
    core = build_core_repo(base / "ComfyUI", n_commits, bad_commit_index=bad_commit_index)
    pack = core.path / "custom_nodes" / "TorchAlloc"
    pack.mkdir(parents=True, exist_ok=True)
    (pack / "__init__.py").write_text(TORCH_PACK)
    return core


def torch_workflow(mib: int, hold_s: float = 1.5) -> dict[str, Any]:
    return {
        "1": {"class_type": "TorchAllocate", "inputs": {"mib": mib, "hold_s": hold_s}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
