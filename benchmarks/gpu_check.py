"""oom-bisect on a real NVIDIA GPU: the checks CI cannot make (issue 6, item 9).

Run by ``benchmarks/gpu_check.sh`` (which installs torch first); needs an interpreter with a
CUDA build of torch — this one, since it also runs the stand-in ComfyUI. Four checks, each
through the real harness (workspace, bootstrap, NVML probe), printing its figures:

1. **Context baseline**: a run that only initialises CUDA; NVML's per-process peak is the
   CUDA context, which torch does not count.
2. **NVML vs torch**: a run holding 8 GiB. NVML's per-process peak minus the context must be
   within 5 % of torch's ``max_memory_reserved`` (the raw figures are printed too).
3. **A real CUDA OOM under ``--vram-budget``**: 4 GiB budget, 6 GiB asked: the outcome is an
   OOM with torch's own message, and the allocator history was saved.
4. **A real bisect**: ``oom-bisect run`` over a 40-commit stand-in history whose commit 23
   uses 1.6x the memory, on the GPU, with ``--vram-budget 6GiB``: 4 GiB fits, 6.4 GiB does not.

Exit status 0 when every check passes, 1 otherwise. About a minute after torch is installed.

    python benchmarks/gpu_check.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gpu_standin import build_gpu_install, torch_cuda_available, torch_workflow

from oom_sentinel.bisect.measure.replay import Measurement, Replayer, ReplaySettings
from oom_sentinel.bisect.measure.workspace import Workspace
from oom_sentinel.bisect.search.verdict import Ok, Oom
from oom_sentinel.bisect.state.states import scan_install
from oom_sentinel.daemon.core.units import format_bytes
from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe
from oom_sentinel.daemon.probes.host import PsutilHostProbe

GIB = 1024**3
MIB = 1024**2
TOLERANCE = 0.05

results: list[tuple[str, bool, str]] = []


class DeviceWatch:
    """Device-level NVML use, sampled every 50 ms: a second opinion where per-process data is
    missing (inside a container NVML reports host pids, which match none of ours)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _used(self) -> int:
        return sum(d.used_bytes or 0 for d in self.probe.devices())

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> DeviceWatch:
        self.idle = self._used()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def rise(self) -> int:
        return max(0, self.peak - self.idle)


def check(name: str, ok: bool, detail: str) -> None:
    results.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def show(label: str, m: Measurement) -> None:
    p = m.peaks
    print(
        f"  {label}: {type(m.outcome).__name__} | NVML per-process peak "
        f"{format_bytes(p.nvml_vram_bytes)} | torch max_memory_reserved "
        f"{format_bytes(p.torch_reserved_bytes)} | max_memory_allocated "
        f"{format_bytes(p.torch_allocated_bytes)} | RAM {format_bytes(p.ram_bytes)} | "
        f"start {m.timings.get('ready_s', 0):.1f} s, prompt {m.timings.get('prompt_s', 0):.1f} s",
        flush=True,
    )
    for note in m.notes:
        print(f"    note: {note}")


def main() -> int:
    started = time.monotonic()
    ok, said = torch_cuda_available()
    print(f"torch in {sys.executable}: {said}")
    if not ok:
        print("FAIL: this interpreter has no torch with a usable CUDA device")
        return 1
    choice = select_gpu_probe()
    print(choice.line)
    for dev in choice.probe.devices():
        print(f"  GPU {dev.index}: {dev.name}, {format_bytes(dev.total_bytes)} total")
    if choice.backend != "nvml":
        print("FAIL: NVML is not available, so there is nothing to compare with")
        return 1

    base = Path(tempfile.mkdtemp(prefix="oom-bisect-gpu-"))
    try:
        core = build_gpu_install(base)
        install = scan_install(core.path)
        ws = Workspace.create(base / "ws", install)
        ws.switch(install.current_state().with_values({"comfyui": core.commits[1]}))

        def replayer(budget: int | None = None) -> Replayer:
            settings = ReplaySettings(
                python=sys.executable,
                user_flags=("--cpu",),  # the stand-in's own nodes on the CPU; TorchAlloc on CUDA
                vram_budget_bytes=budget,
                start_timeout_s=300,
                timeout_s=300,
            )
            return Replayer(ws, settings, gpu=choice.probe, host=PsutilHostProbe())

        # 1. the CUDA context
        with DeviceWatch(choice.probe) as ctx_watch:
            base_m = replayer().measure(torch_workflow(0, hold_s=1.5))
        show("context only", base_m)
        print(f"  device-level rise: {format_bytes(ctx_watch.rise)}")
        context = base_m.peaks.nvml_vram_bytes
        check(
            "NVML sees the process",
            context is not None,
            "per-process NVML data names the replayed ComfyUI"
            if context is not None
            else "no per-process NVML data for our pid (a container's pid namespace?)",
        )

        # 2. NVML vs torch
        with DeviceWatch(choice.probe) as big_watch:
            big = replayer().measure(torch_workflow(8192, hold_s=2.0))
        show("8 GiB held", big)
        print(f"  device-level rise: {format_bytes(big_watch.rise)}")
        reserved = big.peaks.torch_reserved_bytes
        nvml = big.peaks.nvml_vram_bytes
        if nvml is None and context is None and reserved:
            # no per-process data: compare the device-level rises instead (printed as such)
            nvml, context = big_watch.rise, ctx_watch.rise
            print("  (per-process NVML unavailable: comparing device-level rises)")
        if isinstance(big.outcome, Ok) and reserved and nvml is not None and context is not None:
            delta = nvml - context
            rel = abs(delta - reserved) / reserved
            raw = abs(nvml - reserved) / reserved
            check(
                "NVML per-process peak vs torch max_memory_reserved",
                rel <= TOLERANCE,
                f"NVML {format_bytes(nvml)} - context {format_bytes(context)} = "
                f"{format_bytes(delta)} vs reserved {format_bytes(reserved)}: "
                f"{rel * 100:.2f} % apart (raw, context included: {raw * 100:.2f} %)",
            )
        else:
            check("NVML per-process peak vs torch max_memory_reserved", False, f"{big.outcome}")

        # 3. a real CUDA OOM under a VRAM budget
        oom = replayer(budget=4 * GIB).measure(torch_workflow(6144, hold_s=0.5))
        show("6 GiB under a 4 GiB budget", oom)
        history = oom.allocator_history
        check(
            "--vram-budget forces a real CUDA OOM",
            isinstance(oom.outcome, Oom) and oom.outcome.pool == "gpu",
            (oom.outcome.evidence[:160] if isinstance(oom.outcome, Oom) else str(oom.outcome)),
        )
        check(
            "the allocator history is kept on an OOM",
            bool(history) and Path(history).is_file(),
            f"{history} ({Path(history).stat().st_size} bytes)"
            if history and Path(history).is_file()
            else "none saved",
        )
        if oom.torch:
            print(
                f"  bootstrap: torch {oom.torch.get('version')}, backend {oom.torch.get('backend')}, "
                f"fractions {oom.torch.get('fractions')}, errors {oom.torch.get('errors')}"
            )

        # 4. a whole bisect on the GPU
        wf = base / "wf.json"
        wf.write_text(json.dumps(torch_workflow(4096, hold_s=0.5)))
        env = dict(os.environ, OOM_SENTINEL_CACHE_DIR=str(base / "cache"))
        env.pop("OOM_SENTINEL_FAKE_GPU", None)
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable, "-m", "oom_sentinel.bisect", "run",
                "--comfyui", str(core.path), "--python", sys.executable,
                "--workflow", str(wf), "--good", f"comfyui={core.commits[0]}", "--bad", "comfyui=HEAD",
                "--vram-budget", "6GiB", "--flags", "--cpu", "--json",
            ],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        took = time.monotonic() - t0
        try:
            doc: dict[str, Any] = json.loads(proc.stdout)
        except ValueError:
            doc = {"result": f"no JSON (exit {proc.returncode}): {proc.stderr[-800:]}"}
        found = [c["commit"] for c in doc.get("culprits", [])]
        check(
            "oom-bisect names the bad commit on the GPU",
            proc.returncode == 0 and found == [core.commits[23]],
            f"result {doc.get('result')}, {doc.get('measurements')} measurements in {took:.0f} s, "
            f"culprit {found[:1]} (expected {core.commits[23][:12]})",
        )
        for st in doc.get("steps", []):
            print(
                f"    {st['verdict']:>5} {st['state']['comfyui'][:10]} {st['outcome']:>4} "
                f"VRAM {format_bytes(st['peak_vram_bytes'])}"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    failed = [n for n, ok, _ in results if not ok]
    print(
        f"\n{len(results) - len(failed)}/{len(results)} checks passed in "
        f"{time.monotonic() - started:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
