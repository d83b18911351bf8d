"""Per-node peaks: the replay bootstrap wraps ComfyUI's ``execution.execute`` at import time and
records each node's peak VRAM and RSS (bisect/measure/bootstrap.py ``NodePeaks``).

The stand-in runs its nodes through the same hook point as a real ComfyUI (its own
``execution.execute``, called per node through the module); the real-ComfyUI check is in
tests/test_bisect_real_culprits.py. The sync (v0.3.x) and coroutine (v0.4+) shapes of
``execute`` and a ComfyUI without it are checked on small ``execution`` modules of our own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fake_torch import CUDA_DEVICE, write_fake_torch
from standin_repos import build_core_repo

from oom_sentinel.bisect.measure.node_peaks import culprit_nodes, merge_runs, nodes_text
from oom_sentinel.bisect.measure.replay import Replayer, ReplaySettings
from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.verdict import Ok
from oom_sentinel.bisect.state.states import State, scan_install
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir
from oom_sentinel.daemon.probes.fake_gpu_probe import FakeGpuProbe
from oom_sentinel.daemon.probes.host import PsutilHostProbe

MIB = 1024**2
GIB = 1024**3
CONTEXT = 312 * MIB  # the stand-in's CUDA context (standin_memory.CUDA_CONTEXT_BYTES)
BOOTSTRAP = Path(__file__).resolve().parent.parent / "bisect" / "measure" / "bootstrap.py"


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fakegpu")
    FakeGpuDir(root).create([FakeDevice(0, "Fake RTX 3060", 6 * GIB)])
    return root


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    base = tmp_path_factory.mktemp("nodes")
    core = build_core_repo(base / "ComfyUI", 3, bad_commit_index=2)
    install = scan_install(core.path)
    ws = Workspace.create(base / "ws", install)
    ws.switch(install.current_state().with_values({"comfyui": core.commits[1]}))
    return ws


def _by_id(m: Any) -> dict[str, dict[str, Any]]:
    return {n["node_id"]: n for n in m.node_peaks}


def test_each_stand_in_node_has_its_own_vram_and_ram_peak(ws, gpu_dir) -> None:
    settings = ReplaySettings(python=sys.executable, env={"OOM_SENTINEL_FAKE_GPU": str(gpu_dir)})
    replayer = Replayer(ws, settings, gpu=FakeGpuProbe(gpu_dir), host=PsutilHostProbe())
    prompt = {
        "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}},
        "2": {"class_type": "AllocateRAM", "inputs": {"mib": 300, "value": ["1", 0]}},
        "3": {"class_type": "AllocateVRAM", "inputs": {"mib": 700, "value": ["2", 0]}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }
    m = replayer.measure(prompt)
    assert isinstance(m.outcome, Ok), m.console_tail
    nodes = _by_id(m)
    assert list(nodes) == ["1", "2", "3", "4"]  # execution order, every node
    assert nodes["1"]["class_type"] == "AllocateVRAM" and nodes["4"]["class_type"] == "PreviewAny"
    # VRAM on the fake GPU: what the process held while each node ran (node 1's 1000 MiB
    # stay held by the cache, node 3 adds 700 MiB)
    assert nodes["1"]["peak_vram_bytes"] == CONTEXT + 1000 * MIB
    assert nodes["2"]["peak_vram_bytes"] == CONTEXT + 1000 * MIB
    assert nodes["3"]["peak_vram_bytes"] == CONTEXT + 1700 * MIB
    assert m.peaks.nvml_vram_bytes == CONTEXT + 1700 * MIB
    # RSS: the kernel's VmHWM reset per node; node 2's 300 MiB show in its own peak only
    r1, r2 = nodes["1"]["peak_ram_bytes"], nodes["2"]["peak_ram_bytes"]
    assert r2 - r1 >= 290 * MIB, (r1, r2)
    # the resets lower VmHWM; the whole-run RAM peak still holds node 2's mark
    assert m.peaks.ram_bytes is not None and m.peaks.ram_bytes >= r2
    assert m.to_json()["node_peaks"] == [dict(n) for n in m.node_peaks]


EXECUTION_SYNC = """
def execute(server, dynprompt, caches, current_item, extra_data, executed, prompt_id,
            execution_list, pending_subgraph_results):
    import torch
    torch.cuda.alloc(int(dynprompt.get_node(current_item)["mib"]) * 1024 ** 2)
    torch.cuda.free_all()
    return None
"""
EXECUTION_ASYNC = """
async def execute(server, dynprompt, caches, current_item, extra_data, executed, prompt_id,
                  execution_list, pending_subgraph_results, pending_async_nodes, ui_outputs):
    import torch
    torch.cuda.alloc(int(dynprompt.get_node(current_item)["mib"]) * 1024 ** 2)
    torch.cuda.free_all()
    return None
"""
EXECUTION_OLD = """
def recursive_execute(server, prompt, outputs, current_item, extra_data, executed, prompt_id,
                      outputs_ui, object_storage):
    return None
"""
MAIN = """
import asyncio, inspect, sys
import torch
torch.cuda.init()
import execution  # as ComfyUI's main.py does, after torch

class DynPrompt:
    def __init__(self, nodes):
        self.nodes = nodes
    def get_node(self, node_id):
        return self.nodes[node_id]

prompt = DynPrompt({"5": {"class_type": "KSampler", "mib": 900},
                    "9": {"class_type": "VAEDecode", "mib": 2500},
                    "5b": {"class_type": "KSampler", "mib": 400}})
fn = getattr(execution, "execute", None)
for node_id in ("5", "9", "5b", "5"):
    if fn is None:
        break
    args = (None, prompt, None, node_id, {}, set(), "p1", None, {})
    if inspect.iscoroutinefunction(fn):
        asyncio.run(execution.execute(*args, {}, {}))
    else:
        execution.execute(*args)
"""


def _fake_torch(root: Path) -> Path:
    """torch's CUDA counters as the bootstrap reads them, with ``reset_peak_memory_stats``."""
    cuda = CUDA_DEVICE + textwrap.dedent(
        """
            reserved, peak = 0, 0
            def get_allocator_backend():
                return "native"
            def alloc(n):
                global reserved, peak
                reserved += n
                peak = max(peak, reserved)
            def free_all():
                global reserved
                reserved = 0
            def reset_peak_memory_stats(i):
                global peak
                peak = reserved
            def max_memory_allocated(i):
                return peak
            def max_memory_reserved(i):
                return peak
            def memory_reserved(i):
                return reserved
            from . import memory
            """
    )
    memory = "def _record_memory_history(max_entries=0):\n    pass\n"
    return write_fake_torch(root, cuda=cuda, memory=memory)


def _boot(tmp_path: Path, execution_py: str) -> dict[str, Any]:
    site = _fake_torch(tmp_path)
    app = tmp_path / "ComfyUI"
    app.mkdir()
    (app / "main.py").write_text(MAIN)
    (app / "execution.py").write_text(execution_py)
    result = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(BOOTSTRAP), "--result", str(result), "--", str(app / "main.py")],
        cwd=app,
        env=dict(os.environ, PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(result.read_text())


@pytest.mark.parametrize("source", [EXECUTION_SYNC, EXECUTION_ASYNC], ids=["v0.3-sync", "async"])
def test_torch_peaks_are_reset_per_node_in_both_shapes_of_execute(tmp_path, source) -> None:
    r = _boot(tmp_path, source)
    nodes = r["nodes"]
    assert nodes["hook"] == "execution.execute" and nodes["vram_source"] == "torch"
    by_id = {n["node_id"]: n for n in nodes["peaks"]}
    assert [n["node_id"] for n in nodes["peaks"]] == ["5", "9", "5b"]
    # each node's own peak, not the run's: the counters were reset at its start
    assert by_id["5"]["peak_vram_bytes"] == 900 * MIB and by_id["5"]["runs"] == 2
    assert by_id["9"]["peak_vram_bytes"] == 2500 * MIB
    assert by_id["5b"]["peak_vram_bytes"] == 400 * MIB
    assert by_id["9"]["class_type"] == "VAEDecode"
    # the resets do not lose the whole run's peak
    assert r["torch"]["devices"][0]["max_reserved_bytes"] == 2500 * MIB
    assert by_id["9"]["peak_ram_bytes"] > 0


def test_a_comfyui_without_execute_says_it_has_no_per_node_peaks(tmp_path) -> None:
    r = _boot(tmp_path, EXECUTION_OLD)
    assert r["nodes"]["hook"] is None and r["nodes"]["peaks"] == []
    assert any("no execute() to wrap" in n for n in r["nodes"]["notes"])


# ---------------------------------------------------------------------------- the comparison


def _n(nid: str, ct: str, vram: int | None, ram: int | None = None, partial: bool = False):
    return {
        "node_id": nid,
        "class_type": ct,
        "peak_vram_bytes": vram,
        "peak_ram_bytes": ram,
        "partial": partial,
    }


def test_culprit_nodes_name_where_the_memory_came_from_not_who_carried_it() -> None:
    parent = [
        _n("1", "Load", 2 * GIB),
        _n("2", "ImageScaleBy", 2 * GIB),
        _n("3", "Save", 3 * GIB),
        _n("4", "Upscale", 3 * GIB),
    ]
    mine = [
        _n("1", "Load", 2 * GIB),  # unchanged: not named
        _n("2", "ImageScaleBy", 3 * GIB + 512 * MIB),  # +1.5 GiB: it allocates more
        _n("3", "Save", 4 * GIB + 512 * MIB + MIB),  # +1.5 GiB it only carries (+1 MiB)
        _n("4", "Upscale", 5 * GIB),  # +2 GiB: 512 MiB of its own
        _n("5", "New", 9 * GIB),  # the parent never ran it: nothing to compare
    ]
    nodes = culprit_nodes(parent, mine, "vram")
    assert [(n["class_type"], n["before_bytes"], n["after_bytes"]) for n in nodes] == [
        ("ImageScaleBy", 2 * GIB, 3 * GIB + 512 * MIB),
        ("Upscale", 3 * GIB, 5 * GIB),
    ]
    assert nodes_text(nodes[:1]) == "ImageScaleBy #2: 2.00 GiB → 3.50 GiB VRAM"
    assert culprit_nodes(parent, parent, "vram") == [] and nodes_text([]) is None
    assert culprit_nodes(parent, mine, "ram") == []  # no RAM measured
    # each of three nodes adds its own: all three named, largest first, at most TOP_NODES
    grow = [_n("1", "A", 3 * GIB), _n("2", "B", 5 * GIB), _n("3", "C", 6 * GIB)]
    base = [_n(str(i), "X", 2 * GIB) for i in (1, 2, 3)]
    assert [n["class_type"] for n in culprit_nodes(base, grow, "vram")] == ["B", "A", "C"]
    assert len(culprit_nodes(base, grow, "vram", top=2)) == 2


def test_merged_runs_keep_each_nodes_highest_peak_and_drop_partial_once_a_run_finished() -> None:
    a, b = State.of("a" * 40, {}), State.of("b" * 40, {})
    merged = merge_runs(
        [
            (a, [_n("1", "Load", 100, 7), _n("2", "KSampler", 900, partial=True)]),
            (a, [_n("1", "Load", 120, 5), _n("2", "KSampler", 800)]),
            (b, [_n("1", "Load", None, 3), {"junk": 1}]),
        ]
    )
    assert merged[a] == [_n("1", "Load", 120, 7), _n("2", "KSampler", 900, partial=False)]
    assert merged[b] == [_n("1", "Load", None, 3)]
