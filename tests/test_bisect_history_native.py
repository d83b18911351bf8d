"""Allocator history under cudaMallocAsync (ComfyUI's default), issue 15 item 4.

torch's cudaMallocAsync allocator refuses ``_record_memory_history``; the bootstrap detects the
backend and says so instead of failing, the harness notes it, and
``--history-with-native-allocator`` replays each such culprit's OOM once with
``--disable-cuda-malloc`` for the history only (phase "history", marked in the report). There
is no GPU here: torch is a fake of its CUDA surface whose backend follows
``PYTORCH_CUDA_ALLOC_CONF`` as torch's does, and whose history call raises under
cudaMallocAsync; ``main.py`` sets the variable as ComfyUI's ``cuda_malloc.py`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from bisect_git import make_install
from bisect_oracle import Oracle
from fake_torch import CUDA_DEVICE, write_fake_torch

from oom_sentinel.bisect.measure.replay import Measurement, Replayer, ReplaySettings
from oom_sentinel.bisect.session.files import BisectPaths, begin
from oom_sentinel.bisect.session.report import build_report
from oom_sentinel.bisect.session.runner import HISTORY_PHASE, Runner, read_measurements
from oom_sentinel.bisect.state.states import scan_install

BOOTSTRAP = Path(__file__).resolve().parent.parent / "bisect" / "measure" / "bootstrap.py"
MAIN = """
import os, sys
# ComfyUI's cuda_malloc.py: cudaMallocAsync unless --disable-cuda-malloc
if "--disable-cuda-malloc" not in sys.argv:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
import torch
torch.cuda.init()
"""
CUDA = (
    CUDA_DEVICE
    + """
import os
def get_allocator_backend():
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return "cudaMallocAsync" if "backend:cudaMallocAsync" in conf else "native"
def max_memory_allocated(i):
    return 0
max_memory_reserved = memory_reserved = max_memory_allocated
from . import memory
"""
)
MEMORY = """
from . import get_allocator_backend
recorded = []
def _record_memory_history(max_entries=0):
    if get_allocator_backend() == "cudaMallocAsync":
        raise RuntimeError("cudaMallocAsync does not yet support recordHistory")
    recorded.append(max_entries)
"""


def _boot(tmp_path: Path, *flags: str) -> dict:
    site = write_fake_torch(tmp_path, cuda=CUDA, memory=MEMORY)
    app = tmp_path / "ComfyUI"
    app.mkdir(exist_ok=True)
    (app / "main.py").write_text(MAIN)
    result = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [
            sys.executable,
            str(BOOTSTRAP),
            "--result",
            str(result),
            "--",
            str(app / "main.py"),
            *list(flags),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(result.read_text())["torch"]


def test_the_bootstrap_says_cudamallocasync_refuses_the_history(tmp_path) -> None:
    t = _boot(tmp_path)
    assert t["backend"] == "cudaMallocAsync" and t["history"] is False
    assert t["history_refused"] == "cudaMallocAsync" and t["errors"] == []
    native = _boot(tmp_path, "--disable-cuda-malloc")
    assert native["backend"] == "native" and native["history"] is True
    assert native["history_refused"] is None


def test_the_native_replay_disables_cuda_malloc_and_drops_the_users_cuda_malloc(tmp_path) -> None:
    def flags(**kw) -> list[str]:
        settings = ReplaySettings(python=sys.executable, user_flags=("--cuda-malloc",), **kw)
        return Replayer(None, settings, gpu=None, host=None)._flags()  # type: ignore[arg-type]

    assert flags() == ["--cuda-malloc"]
    # ComfyUI's argparse has them in one mutually exclusive group: both would exit 2
    assert flags(native_allocator=True) == ["--disable-cuda-malloc"]


REFUSED = {"backend": "cudaMallocAsync", "history": False, "history_refused": "cudaMallocAsync"}


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory):
    return make_install(tmp_path_factory.mktemp("history"))


def _session(tmp_path: Path, inst):
    paths = BisectPaths.for_install(inst.root, home=tmp_path / "cache" / "bisect")
    prompt = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}}}
    sess = begin(paths, scan_install(inst.root), "comfyui=v-first", "comfyui=HEAD", prompt=prompt)
    return sess, prompt


def test_each_culprits_oom_is_replayed_once_natively_for_its_history(tmp_path, inst) -> None:
    sess, prompt = _session(tmp_path, inst)
    oracle = Oracle(bad=lambda s: inst.core.index(s.comfyui) >= 17, oom=True)

    def measure(state, threshold) -> Measurement:
        return replace(oracle(state, threshold), torch=REFUSED)

    native_calls = []

    def measure_history(state) -> Measurement:
        native_calls.append(state)
        m = oracle(state, None)
        torch = {"backend": "native", "history": True, "history_refused": None}
        return replace(m, torch=torch, allocator_history="/tmp/h/allocator-history-1.pickle")

    runner = Runner(sess, measure, prompt, measure_history=measure_history)
    step = runner.run()
    (c,) = step.culprits
    assert native_calls == [c.state]  # once, for the culprit only
    done = [m for m in read_measurements(sess.paths.session) if m.event == "done"]
    assert [m.phase for m in done].count(HISTORY_PHASE) == 1 and done[-1].phase == HISTORY_PHASE
    assert Runner(sess, measure, prompt, measure_history=measure_history).run() == step
    assert native_calls == [c.state]  # a resumed run does not replay it again
    report = build_report(sess, step)
    (rc,) = report["culprits"]
    assert rc["allocator_history"] == {
        "path": "/tmp/h/allocator-history-1.pickle",
        "native_allocator_replay": True,
    }
    assert "from a replay with --disable-cuda-malloc, for the history only" in rc["history_text"]
    assert report["search"]["history_runs"] == 1 and report["search"]["within_bound"]


def test_without_the_flag_the_report_says_why_there_is_no_history(tmp_path, inst) -> None:
    sess, prompt = _session(tmp_path, inst)
    oracle = Oracle(bad=lambda s: inst.core.index(s.comfyui) >= 17, oom=True)
    runner = Runner(sess, lambda s, t: replace(oracle(s, t), torch=REFUSED), prompt)
    step = runner.run()
    done = [m for m in read_measurements(sess.paths.session) if m.event == "done"]
    assert HISTORY_PHASE not in {m.phase for m in done}
    (rc,) = build_report(sess, step)["culprits"]
    assert rc["allocator_history"] == {"path": None, "refused": "cudaMallocAsync"}
    assert "--history-with-native-allocator" in rc["history_text"]
