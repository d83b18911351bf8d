"""One rule for "another instance shares the GPU" (``processes.shares_gpu``), and the snapshot,
the alert's advice and ``doctor`` all say what it says: an instance on ``--cpu``, on another
device (``--cuda-device``, ``CUDA_VISIBLE_DEVICES``) or with no GPU memory in NVML does not
share it; one that NVML shows on the same device, or that selects the same device, does."""

from __future__ import annotations

import pytest

from oom_sentinel.daemon.classify.advice import advise
from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.comfy.process_watch import process_section
from oom_sentinel.daemon.comfy.processes import ComfyProcess, comfy_process_from, shares_gpu
from oom_sentinel.daemon.doctor.checks import DoctorFacts, GpuState, check_second_instance
from oom_sentinel.daemon.probes.base import GpuDeviceSample, GpuProcessSample
from oom_sentinel.daemon.service.assembly import advice_context

GIB = 1024**3
PY = "/venv/bin/python"


def comfy(pid: int, *args: str, env: dict[str, str] | None = None, port: int = 0) -> ComfyProcess:
    install = f"/srv/ComfyUI-{pid}"
    made = comfy_process_from(
        pid,
        [PY, f"{install}/main.py", "--port", str(port or 8100 + pid % 100), *args],
        cwd=install,
        environ=dict(env or {}),
        exists=lambda _path: True,
    )
    assert made is not None
    return made


def on_gpu(pid: int, device: int, gib: float | None) -> GpuProcessSample:
    return GpuProcessSample(pid, device, int(gib * GIB) if gib is not None else None, "python")


ME = comfy(10)
CASES = {
    # other, NVML per-process samples, shares
    "--cpu, no NVML": (comfy(20, "--cpu"), (), False),
    "--cpu, NVML shows only me": (comfy(20, "--cpu"), (on_gpu(10, 0, 6),), False),
    "--cuda-device 1, no NVML": (comfy(20, "--cuda-device", "1"), (), False),
    "CUDA_VISIBLE_DEVICES=1, no NVML": (comfy(20, env={"CUDA_VISIBLE_DEVICES": "1"}), (), False),
    "no GPU memory in NVML": (comfy(20), (on_gpu(10, 0, 6),), False),
    "NVML: other on another device": (comfy(20), (on_gpu(10, 0, 6), on_gpu(20, 1, 3)), False),
    "NVML: both on device 0": (comfy(20), (on_gpu(10, 0, 6), on_gpu(20, 0, 3)), True),
    "no NVML, both on the default GPU": (comfy(20), (), True),
    "no NVML, --cuda-device 0 is the default": (comfy(20, "--cuda-device", "0"), (), True),
    "WDDM: NVML cannot say per process": (
        comfy(20),
        (on_gpu(10, 0, None), on_gpu(20, 0, None)),
        True,
    ),
}


@pytest.mark.parametrize(("other", "samples", "shares"), CASES.values(), ids=CASES.keys())
def test_snapshot_alert_and_doctor_agree_on_whether_another_instance_shares_the_gpu(
    other: ComfyProcess, samples: tuple[GpuProcessSample, ...], shares: bool
) -> None:
    assert shares_gpu(ME, other, samples) is shares
    # the snapshot's process section
    section = process_section(ME, gpu_processes=samples, comfy_processes=[ME, other])
    (listed,) = section["other_instances"]
    assert listed["pid"] == other.pid and listed["shares_gpu"] is shares
    # the advice that goes into the snapshot and the alert
    event = OomEvent(pool=Pool.GPU, backend=Backend.CUDA, recovered=False, message="CUDA OOM")
    advice = advise(event, advice_context(ME, gpu_processes=samples, comfy_processes=[ME, other]))
    said = [a.text for a in advice if a.key == "stop-second-instance"]
    assert bool(said) is shares, said
    if said:
        assert f"pid {other.pid}" in said[0]
    # doctor, in the same minute
    devices = (
        GpuDeviceSample(0, "NVIDIA A", 24 * GIB, 6 * GIB, 18 * GIB),
        GpuDeviceSample(1, "NVIDIA B", 24 * GIB, 3 * GIB, 21 * GIB),
    )
    facts = DoctorFacts(
        now_s=0.0,
        platform="linux",
        process=ME,
        comfy_processes=(ME, other),
        own_pids=frozenset({ME.pid}),
        gpu=GpuState("nvml", "2 device(s)", devices, samples, "550.54.14")
        if samples
        else GpuState("none", "NVML library not found"),
    )
    finding = check_second_instance(facts)
    assert (finding.verdict == "problem") is shares, (finding.title, finding.detail)
    if not shares:
        assert "shares" not in finding.title and finding.verdict == "ok", finding.title
