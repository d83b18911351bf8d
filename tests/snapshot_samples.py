"""Realistic snapshot contents for the snapshot, retention and CLI tests (not a test module).

Built through the real tracker from the records ComfyUI emits for one CUDA OOM, so the
snapshot under test is what the daemon would write.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from oom_sentinel.daemon.classify.events import Backend, OomEvent, OtherProcess, Pool
from oom_sentinel.daemon.incidents.snapshot import (
    AdviceItem,
    HostFacts,
    InstanceInfo,
    SnapshotContent,
)
from oom_sentinel.daemon.incidents.tracker import (
    Incident,
    IncidentTracker,
    Observation,
    WriteSnapshot,
)
from oom_sentinel.daemon.probes.base import (
    GpuDeviceSample,
    GpuProcessSample,
    HostSample,
    MemorySample,
    ProcessTreeSample,
)

if TYPE_CHECKING:
    from oom_sentinel.daemon.install.state import InstallState

GIB = 1024**3
MIB = 1024**2
T0 = 1767348672.25  # 2026-01-02T10:11:12.250Z

LOG_EVENT = OomEvent(
    pool=Pool.GPU,
    backend=Backend.CUDA,
    recovered=False,
    message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which 512.00 MiB is free.",
    exception_type="torch.OutOfMemoryError",
    gpu_index=0,
    requested_bytes=2 * GIB,
    total_bytes=24 * GIB,
    free_bytes=512 * MIB,
    allocated_bytes=20 * GIB,
    reserved_unallocated_bytes=1 * GIB,
    other_processes=(OtherProcess(pid=999, bytes=3 * GIB),),
    other_process_named=True,
    rule="cuda-oom",
)
API_EVENT = OomEvent(
    pool=Pool.GPU,
    backend=Backend.CUDA,
    recovered=False,
    message="Allocation on device",
    exception_type="torch.OutOfMemoryError",
    node_type="KSampler",
    node_id="3",
    rule="execution-error",
)

LOG_TEXT = """\
[2026-01-02 10:11:05.001] got prompt
[2026-01-02 10:11:06.120] Requested to load SDXL
[2026-01-02 10:11:07.300] loaded completely; 21000.00 MB usable, 4897.05 MB loaded, full load: True
[2026-01-02 10:11:12.240] !!! Exception during processing !!! CUDA out of memory. Tried to allocate 2.00 GiB.
[2026-01-02 10:11:12.241] Traceback (most recent call last):
  File "/opt/ComfyUI/execution.py", line 496, in execute
    output_data, output_ui, has_subgraph = get_output_data(obj, input_data_all)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which 512.00 MiB is free.
[2026-01-02 10:11:12.260] Got an OOM, unloading all loaded models.
"""

TIMELINE_CSV = (
    "time,gpu0_used_bytes,gpu0_total_bytes,ram_available_bytes,swap_used_bytes\n"
    f"2026-01-02T10:11:10Z,{18 * GIB},{24 * GIB},{40 * GIB},0\n"
    f"2026-01-02T10:11:11Z,{22 * GIB},{24 * GIB},{39 * GIB},0\n"
    f"2026-01-02T10:11:12Z,{23 * GIB + 512 * MIB},{24 * GIB},{39 * GIB},0\n"
)

PROMPT: dict[str, Any] = {
    "3": {
        "class_type": "KSampler",
        "inputs": {
            "seed": 42,
            "steps": 30,
            "cfg": 7.0,
            "sampler_name": "euler",
            "scheduler": "normal",
            "denoise": 1.0,
            "model": ["4", 0],
            "positive": ["6", 0],
            "negative": ["7", 0],
            "latent_image": ["5", 0],
        },
    },
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}},
    "5": {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": 2048, "height": 2048, "batch_size": 4},
    },
}
WORKFLOW: dict[str, Any] = {
    "last_node_id": 5,
    "last_link_id": 3,
    "nodes": [{"id": 3, "type": "KSampler", "widgets_values": [42, "fixed", 30, 7.0]}],
    "links": [],
    "version": 0.4,
}


def incident(
    *,
    at: float = T0,
    node_type: str | None = "KSampler",
    pool: Pool = Pool.GPU,
    instance: str = "main",
    log_evidence: dict[str, Any] | None = None,
) -> Incident:
    """The incident the tracker writes for one OOM seen by the log and the API (for a kill:
    by the process watcher and the kernel)."""
    tracker = IncidentTracker(new_id=lambda: f"inc-{int(at)}")
    if pool is Pool.KILLED_BY_OS:
        tracker.set_available_sources(instance, ["log", "api", "process", "kernel"])
        process = OomEvent(
            pool, Backend.UNKNOWN, False, "ComfyUI exited with SIGKILL", killed_pid=4242, rule="p"
        )
        kernel = replace(process, message="Out of memory: Killed process 4242", killer="kernel")
        assert (
            tracker.observe(Observation(instance, "process", process, at, {"pid": 4242}), at) == []
        )
        (write,) = tracker.observe(Observation(instance, "kernel", kernel, at + 0.5), now=at + 0.5)
        assert isinstance(write, WriteSnapshot)
        return write.incident
    tracker.set_available_sources(instance, ["log", "api"])
    log_obs = Observation(
        instance,
        "log",
        replace(LOG_EVENT, pool=pool),
        at,
        log_evidence or {"path": "/opt/ComfyUI/user/comfyui.log", "line_no": 5},
    )
    assert tracker.observe(log_obs, now=at) == []
    api_event = replace(
        API_EVENT, pool=pool, node_type=node_type, node_id="3" if node_type else None
    )
    actions = tracker.observe(
        Observation(instance, "api", api_event, at + 0.02, {"prompt_id": "p-1"}), now=at + 0.03
    )
    (write,) = actions
    assert isinstance(write, WriteSnapshot)
    return write.incident


def memory(at: float = T0) -> MemorySample:
    return MemorySample(
        time_s=at - 0.1,
        gpus=(
            GpuDeviceSample(
                index=0,
                name="NVIDIA GeForce RTX 4090",
                total_bytes=24 * GIB,
                used_bytes=23 * GIB + 512 * MIB,
                free_bytes=512 * MIB,
                uuid="GPU-1234",
            ),
        ),
        gpu_processes=(
            GpuProcessSample(
                pid=4242,
                device_index=0,
                used_bytes=20 * GIB,
                name="python",
                cmdline=("python", "main.py", "--listen", "127.0.0.1"),
            ),
            GpuProcessSample(
                pid=999,
                device_index=0,
                used_bytes=3 * GIB,
                name="blender",
                cmdline=("blender", "-b", "scene.blend"),
            ),
            GpuProcessSample(pid=31337, device_index=0, used_bytes=None, name=None, cmdline=None),
        ),
        host=HostSample(
            ram_total_bytes=64 * GIB,
            ram_available_bytes=39 * GIB,
            swap_total_bytes=8 * GIB,
            swap_used_bytes=0,
        ),
        process_trees=(
            ProcessTreeSample(root_pid=4242, rss_bytes=9 * GIB, peak_rss_bytes=10 * GIB),
        ),
    )


HOST = HostFacts(
    hostname="render-box",
    os="Linux",
    os_release="Ubuntu 24.04 LTS",
    kernel="6.8.0-49-generic",
    python="3.11.9",
    cpu_count=16,
    version="0.1.0",
)

ADVICE = (
    AdviceItem("other-gpu-processes", "Close blender (pid 999): it holds 3.00 GiB on GPU 0."),
    AdviceItem("smaller-batch", "Lower batch_size from 4 to 1, or the resolution from 2048."),
    AdviceItem("lowvram", "Start ComfyUI with --lowvram."),
)


def content(
    *,
    at: float = T0,
    node_type: str | None = "KSampler",
    pool: Pool = Pool.GPU,
    instance: str = "main",
    with_prompt: bool = True,
    **changes: Any,
) -> SnapshotContent:
    base = SnapshotContent(
        incident=incident(at=at, node_type=node_type, pool=pool, instance=instance),
        instance=InstanceInfo(instance, "/opt/ComfyUI", "http://127.0.0.1:8188"),
        host=HOST,
        created_s=at + 1.0,
        advice=ADVICE,
        memory=memory(at),
        log_text=LOG_TEXT,
        timeline_csv=TIMELINE_CSV,
        prompt=PROMPT if with_prompt else None,
        workflow=WORKFLOW if with_prompt else None,
        sections={"process": {"pid": 4242, "argv": ["python", "main.py"], "exit_code": None}},
    )
    return replace(base, **changes)


def full_content() -> SnapshotContent:
    """Every optional section filled as its writer fills it: a suspected regression with both
    endpoint states and their diff, the install state with its attribution, the process, the
    kernel's word, ComfyUI's system stats and log tail, and the incident's records.
    ``tests/snapshots_v1/`` holds what the writer made of it before the typed models."""
    from oom_sentinel.daemon.incidents.regression import GoodRun, RegressionVerdict
    from oom_sentinel.daemon.incidents.tracker import FoldedRecord
    from oom_sentinel.daemon.install.diff import diff_states
    from oom_sentinel.daemon.install.state import (
        CoreState,
        CustomNode,
        InstallState,
        InterpreterFacts,
    )

    good = InstallState(
        CoreState(commit="a" * 40),
        nodes=(
            CustomNode("pack", "git", commit="1" * 40),
            CustomNode("reg", "cnr", version="1.0.0"),
        ),
        pip=("torch==2.5.1",),
    )
    bad = InstallState(
        CoreState(commit="b" * 40),
        nodes=(
            CustomNode("pack", "git", commit="2" * 40),
            CustomNode("reg", "cnr", version="1.1.0"),
        ),
        pip=("torch==2.5.1",),
        interpreter=InterpreterFacts(executable="/opt/ComfyUI/.venv/bin/python"),
    )
    run = GoodRun("p-0", "main", "fp", good.state_id, T0 - 86400, 20 * GIB, 9 * GIB, 21 * GIB)
    verdict = RegressionVerdict(
        True,
        "the workflow last fitted under another install state",
        "workflow",
        "fp",
        bad,
        good,
        run,
        diff_states(good, bad),
    )
    sections: dict[str, Any] = {
        "process": {
            "pid": 4242,
            "argv": ["/opt/ComfyUI/.venv/bin/python", "main.py", "--lowvram"],
            "interpreter": "/opt/ComfyUI/.venv/bin/python",
            "flags": {"lowvram": True, "memory_args": ["--lowvram"]},
            "alive": False,
            "exit": {"died_at_s": T0, "signal": None, "exit_code": 1, "os_kill": False},
        },
        "kernel": {
            "verdict": "evidence",
            "pid": 4242,
            "killer": None,
            "sources": [{"source": "kmsg", "status": "no-kill", "reason": None, "detail": None}],
        },
        "install_state": {
            **bad.to_dict(),
            "observed_at": "2026-01-02T09:00:00.000Z",
            "observed_source": "capture",
            "attribution": {
                "by": "process-start",
                "ambiguous": False,
                "other_state_id": None,
                "other_observed_at": None,
                "reason": "the state in effect when this ComfyUI process started",
            },
        },
        "regression": verdict.to_section(),
        "system_stats": {
            "captured": "2026-01-02T10:11:11.000Z",
            "system": {"os": "posix"},
            "devices": [{"name": "cuda:0", "vram_total": 24 * GIB}],
        },
        "internal_logs": {
            "captured": "2026-01-02T10:11:12.000Z",
            "lines": 2,
            "tail": "got prompt\n",
        },
    }
    return replace(
        content(),
        sections=sections,
        records=(FoldedRecord("log:1", 1, "log", "cuda-oom", T0, "p-1"),),
    )


def suspected_regression(good: InstallState, bad: InstallState) -> dict[str, Any]:
    """The ``regression`` section the daemon writes when the workflow last fitted under
    ``good`` and now ran out of memory under ``bad`` (what oom-bisect starts from)."""
    from oom_sentinel.daemon.incidents.regression import RegressionVerdict
    from oom_sentinel.daemon.install.diff import diff_states

    return RegressionVerdict(
        suspected=True,
        reason="the workflow last fitted under another install state",
        match="workflow",
        bad_state=bad,
        last_good_state=good,
        diff=diff_states(good, bad),
    ).to_section()
