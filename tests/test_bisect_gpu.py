"""oom-bisect's harness on a real NVIDIA GPU (``-m gpu``; skipped without one, and without a
CUDA build of torch in this interpreter, which also runs the stand-in ComfyUI).

``benchmarks/gpu_check.sh`` installs what these need and runs them with the GPU check.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_standin import build_gpu_install, torch_cuda_available, torch_workflow

from oom_sentinel.bisect.measure.replay import Replayer, ReplaySettings
from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.verdict import Ok, Oom
from oom_sentinel.bisect.state.states import scan_install
from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe
from oom_sentinel.daemon.probes.host import PsutilHostProbe

pytestmark = pytest.mark.gpu

GIB = 1024**3


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ok, said = torch_cuda_available()
    if not ok:
        pytest.skip(f"needs torch with CUDA in {sys.executable} ({said})")
    choice = select_gpu_probe()
    if choice.backend != "nvml":
        pytest.skip(f"needs NVML ({choice.detail})")
    base = tmp_path_factory.mktemp("gpu")
    core = build_gpu_install(base)
    install = scan_install(core.path)
    ws = Workspace.create(base / "ws", install)
    ws.switch(install.current_state().with_values({"comfyui": core.commits[1]}))
    return {"ws": ws, "probe": choice.probe}


def _replayer(rig: dict[str, Any], budget: int | None = None) -> Replayer:
    settings = ReplaySettings(
        python=sys.executable,
        user_flags=("--cpu",),
        vram_budget_bytes=budget,
        start_timeout_s=300,
        timeout_s=300,
    )
    return Replayer(rig["ws"], settings, gpu=rig["probe"], host=PsutilHostProbe())


def test_nvml_per_process_peak_is_within_5_percent_of_torch_reserved(rig) -> None:
    context = _replayer(rig).measure(torch_workflow(0, hold_s=1.5))
    big = _replayer(rig).measure(torch_workflow(8192, hold_s=2.0))
    assert isinstance(big.outcome, Ok), big.outcome
    reserved = big.peaks.torch_reserved_bytes
    nvml, ctx = big.peaks.nvml_vram_bytes, context.peaks.nvml_vram_bytes
    assert reserved is not None and reserved >= 8 * GIB
    assert nvml is not None and ctx is not None, "NVML has no per-process data for our pid"
    assert abs((nvml - ctx) - reserved) <= 0.05 * reserved
    assert big.outcome.peak_vram_bytes == reserved  # the verdict uses torch's exact counter


def test_a_vram_budget_forces_a_real_cuda_oom_and_keeps_the_history(rig) -> None:
    m = _replayer(rig, budget=4 * GIB).measure(torch_workflow(6144, hold_s=0.5))
    assert isinstance(m.outcome, Oom) and m.outcome.pool == "gpu", m.outcome
    assert "out of memory" in m.outcome.evidence.lower()
    assert m.torch is not None and m.torch["fractions"], m.torch
    assert m.allocator_history is not None and Path(m.allocator_history).stat().st_size > 0
