"""Synthetic table tests: the exact texts comfyui-facts.md §2 and §11 list (some observed on a
real ComfyUI v0.8.0), each allocator's units, the wrappers' prefixes, and the negatives."""

from __future__ import annotations

import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oom_sentinel.daemon.classify import (
    NEEDLES,
    classify_execution_error,
    classify_record,
    has_needle,
    iter_findings,
    rules,
    scan_stream,
)
from oom_sentinel.daemon.classify.advice import advise
from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.kernel.earlyoom import parse_earlyoom_line

KiB, MiB, GiB = 1024, 1024**2, 1024**3


def _event(text: str) -> OomEvent:
    event = classify_record(text)
    assert event is not None, text
    return event


# -- comfyui-facts §11: observed on a real ComfyUI v0.8.0 with --cpu --------------------------


def test_real_cpu_allocation_failure_message_is_ram_with_exact_bytes() -> None:
    message = (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)\n"
    )
    event = classify_execution_error(
        {
            "exception_type": "RuntimeError",
            "exception_message": message,
            "node_type": "EmptyImage",
            "node_id": "1",
        }
    )
    assert event is not None
    assert (event.pool, event.backend, event.recovered) == (Pool.RAM, Backend.CPU, False)
    assert event.requested_bytes == 68719476736
    assert (event.exception_type, event.node_type, event.node_id) == (
        "RuntimeError",
        "EmptyImage",
        "1",
    )
    assert event.message.startswith("[enforce fail")


def test_real_console_of_a_cpu_allocation_failure_is_one_event() -> None:
    console = [
        "got prompt",
        "!!! Exception during processing !!! [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)",
        "Traceback (most recent call last):",
        '  File "/x/ComfyUI/execution.py", line 516, in execute',
        "    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id)",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)",
        "",
        "Prompt executed in 0.09 seconds",
    ]
    findings = list(iter_findings(console))
    assert len(findings) == 1
    event = findings[0].event
    assert (findings[0].line_no, event.pool, event.requested_bytes) == (2, Pool.RAM, 68719476736)
    assert event.exception_type == "RuntimeError"


def test_real_numpy_failure_under_an_address_space_cap() -> None:
    event = classify_execution_error(
        {
            "exception_type": "numpy._core._exceptions._ArrayMemoryError",
            "exception_message": "Unable to allocate 192. MiB for an array with shape (4096, 4096, 3) and data type float32",
            "node_type": "SaveImage",
        }
    )
    assert event is not None
    assert (event.pool, event.backend, event.requested_bytes) == (Pool.RAM, Backend.CPU, 192 * MiB)
    assert event.exception_type == "numpy._core._exceptions._ArrayMemoryError"


def test_real_memory_cgroup_kill_line_names_the_victim() -> None:
    event = _event(
        "[ 1234.567890] Memory cgroup out of memory: Killed process 4242 (python) total-vm:4123456kB, "
        "anon-rss:3012345kB, file-rss:1234kB, shmem-rss:0kB, UID:1000 pgtables:6543kB oom_score_adj:0"
    )
    assert (event.pool, event.killer, event.killed_pid) == (Pool.KILLED_BY_OS, "kernel", 4242)
    extra = dict(event.extra)
    assert extra["anon_rss_bytes"] == 3012345 * KiB and extra["scope"] == "cgroup"


# -- comfyui-facts §2.3: soft OOMs are recovered ---------------------------------------------

SOFT = [
    (
        "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.",
        "soft-vae-tiled",
    ),
    (
        "Warning: Ran out of memory when regular VAE encoding, retrying with tiled VAE encoding.",
        "soft-vae-tiled",
    ),
    ("out of memory error, emptying cache and trying again", "soft-split-attention-empty-cache"),
    ("out of memory error, increasing steps and trying again 8", "soft-split-attention-steps"),
    ("scaled_dot_product_attention OOMed: switched to slice attention", "soft-vae-slice-attention"),
    (
        "ran out of memory while running softmax in  _get_attention_scores_no_kv_chunking, trying slower in place softmax instead",
        "soft-subquadratic-softmax",
    ),
    (
        "ran out of memory while running softmax in _get_attention_scores_no_kv_chunking, trying slower in place softmax instead",
        "soft-subquadratic-softmax",
    ),
]


@pytest.mark.parametrize(("text", "rule"), SOFT, ids=[f"{r}-{i}" for i, (_, r) in enumerate(SOFT)])
def test_comfyui_soft_oom_texts_are_recovered(text: str, rule: str) -> None:
    event = _event(text)
    assert (event.recovered, event.pool, event.rule) == (True, Pool.GPU, rule)


def test_split_attention_steps_are_kept() -> None:
    assert (
        dict(_event("out of memory error, increasing steps and trying again 16").extra)["steps"]
        == 16
    )


# -- comfyui-facts §2.1/2.2: the CUDA family ---------------------------------------------------

CUDA_TABLE: list[tuple[str, str, dict[str, Any]]] = [
    (
        "new style",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which 1.20 GiB is free. Of the allocated memory 20.10 GiB is allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but unallocated.",
        dict(
            pool=Pool.GPU,
            requested_bytes=2 * GiB,
            total_bytes=round(23.55 * GiB),
            free_bytes=round(1.2 * GiB),
            allocated_bytes=round(20.1 * GiB),
            reserved_unallocated_bytes=512 * MiB,
            exception_type="torch.OutOfMemoryError",
            gpu_index=0,
        ),
    ),
    (
        "new style, fragmentation",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total capacity of 8.00 GiB of which 100.00 MiB is free. Of the allocated memory 5.00 GiB is allocated by PyTorch, and 2.00 GiB is reserved by PyTorch but unallocated.",
        dict(
            pool=Pool.GPU_FRAGMENTATION,
            requested_bytes=512 * MiB,
            reserved_unallocated_bytes=2 * GiB,
            gpu_index=1,
        ),
    ),
    (
        "two other processes named",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 13.06 MiB is free. Process 1234 has 2.00 GiB memory in use. Process 5678 has 512.00 MiB memory in use. Including non-PyTorch memory, this process has 21.10 GiB memory in use. Of the allocated memory 20.50 GiB is allocated by PyTorch, and 10.00 MiB is reserved by PyTorch but unallocated.",
        dict(
            other_process_named=True,
            process_used_bytes=round(21.1 * GiB),
            other_pids=[(1234, 2 * GiB), (5678, 512 * MiB)],
        ),
    ),
    (
        "old style",
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity; 3.40 GiB already allocated; 0 bytes free; 3.41 GiB reserved in total by PyTorch)",
        dict(
            pool=Pool.GPU,
            requested_bytes=20 * MiB,
            total_bytes=4 * GiB,
            free_bytes=0,
            reserved_bytes=round(3.41 * GiB),
            reserved_unallocated_bytes=round(3.41 * GiB) - round(3.4 * GiB),
        ),
    ),
    (
        "old style with a memory fraction",
        "RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 24.00 GiB total capacity; 10.00 GiB already allocated; 12.00 GiB free; 10.50 GiB allowed; 10.20 GiB reserved in total by PyTorch)",
        dict(requested_bytes=GiB, extra_allowed=round(10.5 * GiB)),
    ),
    (
        "cudaMallocAsync",
        "torch.OutOfMemoryError: Allocation on device ",
        dict(pool=Pool.GPU, backend=Backend.CUDA, requested_bytes=None, total_bytes=None),
    ),
    (
        "cudaMallocAsync with details",
        "torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 21.55 GiB\nRequested               : 952.00 MiB\nDevice limit            : 24.00 GiB\nFree (according to CUDA): 0 bytes\nPyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB",
        dict(
            requested_bytes=952 * MiB,
            total_bytes=24 * GiB,
            free_bytes=0,
            allocated_bytes=round(21.55 * GiB),
        ),
    ),
    (
        "runtime error",
        "RuntimeError: CUDA error: out of memory",
        dict(pool=Pool.GPU, backend=Backend.CUDA),
    ),
    (
        "cuBLAS",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        dict(backend=Backend.CUDA),
    ),
    (
        "cuDNN not allocated",
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ALLOCATED",
        dict(backend=Backend.CUDA),
    ),
    (
        "MIOpen",
        "RuntimeError: miopenStatus: MIOPEN_STATUS_ALLOC_FAILED",
        dict(backend=Backend.ROCM),
    ),
    (
        "HIP",
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 15.98 GiB of which 16.00 MiB is free.",
        dict(backend=Backend.ROCM, requested_bytes=40 * MiB),
    ),
    (
        "XPU",
        "RuntimeError: XPU out of memory. Tried to allocate 1.71 GiB (GPU 0; 15.56 GiB total capacity; 0 bytes already allocated; 0 bytes reserved in total by PyTorch)",
        dict(backend=Backend.XPU, allocated_bytes=0),
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in CUDA_TABLE], ids=[n for n, _, _ in CUDA_TABLE]
)
def test_gpu_allocator_messages_give_pool_backend_and_numbers(
    text: str, expected: dict[str, Any]
) -> None:
    event = _event(text)
    assert event.recovered is False
    for key, value in expected.items():
        if key == "other_pids":
            assert [(p.pid, p.bytes) for p in event.other_processes] == value
        elif key.startswith("extra_"):
            assert dict(event.extra)[key.removeprefix("extra_") + "_bytes"] == value
        else:
            assert getattr(event, key) == value, key
    if "backend" not in expected:
        assert event.backend in (Backend.CUDA, Backend.ROCM, Backend.XPU)


def test_got_an_oom_alone_is_a_gpu_failure_of_unknown_backend() -> None:
    event = _event("Got an OOM, unloading all loaded models.")
    assert (event.pool, event.backend, event.recovered) == (Pool.GPU, Backend.UNKNOWN, False)


def test_tips_text_appended_by_comfyui_changes_no_number() -> None:
    message = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 11.99 GiB of which 1.50 GiB is free. "
        "Of the allocated memory 9.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated."
        "\nThis error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before you might have "
        "accidentally set the batch_size to a large number."
    )
    event = classify_execution_error(
        {
            "exception_type": "torch.OutOfMemoryError",
            "exception_message": message,
            "node_type": "KSampler",
            "node_id": "3",
        }
    )
    assert event is not None
    assert (event.pool, event.backend, event.requested_bytes, event.free_bytes) == (
        Pool.GPU,
        Backend.CUDA,
        2 * GiB,
        round(1.5 * GiB),
    )
    assert event.message.startswith("CUDA out of memory.") and "TIPS" not in event.message
    assert event.node_type == "KSampler" and event.rule.startswith("execution-error/")


def test_cudamallocasync_payload_has_cuda_backend_and_no_numbers() -> None:
    event = classify_execution_error(
        {
            "exception_type": "torch.OutOfMemoryError",
            "exception_message": "Allocation on device \nThis error means you ran out of memory on your GPU.\n\nTIPS: x",
        }
    )
    assert event is not None and event.backend is Backend.CUDA and event.requested_bytes is None


def test_mps_units_are_binary_even_when_printed_as_gb() -> None:
    event = _event(
        "RuntimeError: MPS backend out of memory (MPS allocated: 8.72 GB, other allocations: 110.16 MB, max allowed: 9.07 GB). Tried to allocate 405.00 MB on private pool."
    )
    assert (event.pool, event.backend) == (Pool.UNIFIED_MPS, Backend.MPS)
    assert event.mps_allocated_bytes == round(8.72 * GiB) and event.mps_other_bytes == round(
        110.16 * MiB
    )
    assert event.mps_max_allowed_bytes == round(9.07 * GiB) and event.requested_bytes == 405 * MiB


def test_old_torch_cpu_message_in_gigabytes() -> None:
    event = _event(
        "RuntimeError: [enforce fail at CPUAllocator.cpp:56] data. DefaultCPUAllocator: not enough memory: you tried to allocate 3GB. Buy new RAM!"
    )
    assert (event.pool, event.requested_bytes) == (Pool.RAM, 3 * GiB)


@pytest.mark.parametrize(
    "text",
    [
        "OSError: [WinError 1455] The paging file is too small for this operation to complete",
        "safetensors_rust.SafetensorError: Error while deserializing header: The paging file is too small for this operation to complete. (os error 1455)",
    ],
    ids=["python-oserror", "rust-io-error"],
)
def test_windows_paging_file_is_swap_pagefile(text: str) -> None:
    assert _event(text).pool is Pool.SWAP_PAGEFILE


def test_directml_size_is_read_in_bytes() -> None:
    event = _event(
        "RuntimeError: Could not allocate tensor with 4915840 bytes. There is not enough GPU video memory available!"
    )
    assert (event.backend, event.requested_bytes) == (Backend.DIRECTML, 4915840)


KILLS = [
    ("Killed", None, None),
    ("[1]+  Killed                  python main.py --listen", None, None),
    ("./run.sh: line 3: 31337 Killed                  python main.py", None, 31337),
    (
        "Out of memory: Killed process 1234 (python) total-vm:30000000kB, anon-rss:25000000kB, file-rss:0kB, shmem-rss:0kB",
        "kernel",
        1234,
    ),
    (
        "Memory cgroup out of memory: Killed process 99 (python3) total-vm:11892kB, anon-rss:4292kB, file-rss:3428kB, shmem-rss:0kB",
        "kernel",
        99,
    ),
    ("comfyui.service: A process of this unit has been killed by the OOM killer.", "kernel", None),
    (
        "systemd-oomd[851]: Killed /system.slice/comfyui.service due to memory pressure for /system.slice being 87.37% > 50.00% for > 20s with reclaim activity",
        "systemd-oomd",
        None,
    ),
    (
        'earlyoom[845]: sending SIGKILL to process 4321 uid 1000 "python3": badness 900, VmRSS 20000 MiB',
        "earlyoom",
        4321,
    ),
]


@pytest.mark.parametrize(
    ("text", "killer", "pid"), KILLS, ids=[f"kill-{i}" for i in range(len(KILLS))]
)
def test_os_kills_are_killed_by_os_with_killer_and_victim(
    text: str, killer: str | None, pid: int | None
) -> None:
    event = _event(text)
    assert (event.pool, event.killer, event.killed_pid) == (Pool.KILLED_BY_OS, killer, pid)


# -- prefixes never hide anything --------------------------------------------------------------

LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which 1.00 GiB is free."
PREFIXES = {
    "manager": "[2026-01-02 10:11:12.345] ",
    "manager-old": "[2026-01-02 10:11] ",
    "internal-logs": "2025-04-27T21:57:57.289009 - ",
    "desktop-electron": "[2025-03-28 01:40:15.296] [error]  ",
    "python-logging": "2024-12-16 17:10:56,767 - root - ERROR - ",
    "level-colon": "ERROR:root:",
    "level-tag": "[ERROR] ",
    "ansi-level-tag": "\x1b[31m[ERROR]\x1b[0m ",
    "journal": "Jan 02 10:11:12 host python3[1234]: ",
    "compose": "comfyui-1  | ",
    "markdown-quote": "> ",
}


@pytest.mark.parametrize("prefix", PREFIXES.values(), ids=list(PREFIXES))
def test_wrapper_prefixes_do_not_hide_the_oom(prefix: str) -> None:
    event = _event(prefix + LINE)
    assert (event.pool, event.requested_bytes, event.total_bytes) == (Pool.GPU, 2 * GiB, 8 * GiB)
    assert event.exception_type == "torch.OutOfMemoryError"
    findings = list(scan_stream(io.BytesIO(("got prompt\n" + prefix + LINE + "\n").encode())))
    assert [f.line_no for f in findings] == [2]


# -- negatives -----------------------------------------------------------------------------------

NEGATIVES = {
    "illegal memory access": "RuntimeError: CUDA error: an illegal memory access was encountered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "device-side assert": "torch.AcceleratorError: CUDA error: device-side assert triggered",
    "torch not compiled with cuda": 'raise AssertionError("Torch not compiled with CUDA enabled")\nAssertionError: Torch not compiled with CUDA enabled',
    "tensors on two devices": "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
    "readme sentence": "If you get CUDA out of memory errors, try --lowvram or a smaller batch.",
    "prose": "it gets out of memory quick and i also run on 24GB VRAM",
    "node named like an OOM": "   0.1 seconds: /home/u/ComfyUI/custom_nodes/ComfyUI-OutOfMemoryGuard",
    "node class named like an OOM error": "OutOfMemoryErrorHandler: cleared 3 caches",
    "issue title": "Allocation on device error",
    "memory summary counter": "|            CUDA OOMs: 1            |        cudaMalloc retries: 1         |",
    "memory summary row": "| Allocated memory      |  11515 MiB |  11515 MiB |      0 B   |      0 B   |",
    "killed in prose": "I Killed the process myself with the task manager",
    "xpu 4 GB block limit": "RuntimeError: Current platform can NOT allocate memory block with size larger than 4GB! Tried to allocate 6.85 GiB (GPU  0; 15.56 GiB total capacity; 0 bytes already allocated; 0 bytes reserved in total by PyTorch)",
    "startup memory line": "Enabled pinned memory 7549.0",
    "smart memory": "Disabling smart memory management",
    "model load line": "loaded partially; 2419.36 MB usable, 2340.83 MB loaded, 263.30 MB offloaded, 78.53 MB buffer reserved, lowvram patches: 0",
    "earlyoom status": "earlyoom[845]: low memory! at or below SIGTERM limits: mem  3.00%, swap 10.00%",
}


@pytest.mark.parametrize("text", NEGATIVES.values(), ids=list(NEGATIVES))
def test_texts_that_are_not_an_oom_stay_negative(text: str) -> None:
    assert classify_record(text) is None
    assert list(scan_stream(io.BytesIO(text.encode()))) == []


def test_non_oom_execution_errors_are_none() -> None:
    assert (
        classify_execution_error(
            {"exception_type": "ExecutionBlocked", "exception_message": "Execution Blocked: no"}
        )
        is None
    )
    assert (
        classify_execution_error(
            {
                "exception_type": "RuntimeError",
                "exception_message": "CUDA error: an illegal memory access was encountered",
            }
        )
        is None
    )
    assert classify_execution_error({}) is None


@pytest.mark.parametrize(
    "payload",
    [
        None,
        3,
        "x",
        [],
        {"exception_type": 5, "exception_message": ["a"]},
        {"exception_message": None, "node_type": {}},
    ],
    ids=["none", "int", "str", "list", "wrong-types", "nones"],
)
def test_malformed_execution_error_payloads_give_none(payload: Any) -> None:
    assert classify_execution_error(payload) is None


# -- the prefilter ------------------------------------------------------------------------------


def test_every_rule_text_in_these_tables_contains_a_needle() -> None:
    texts = [t for t, _ in SOFT] + [t for _, t, _ in CUDA_TABLE] + [t for t, _, _ in KILLS] + [LINE]
    for text in texts:
        assert has_needle(text), text
    assert all(isinstance(n, str) and n for n in NEEDLES)


def test_the_str_prefilter_checks_exactly_the_needles() -> None:
    for needle in NEEDLES:
        assert has_needle(f"xx {needle} yy")
    assert not has_needle("Emory OoM killed 1455 ALLOC status")


# -- issue 12: the kinds the classifier missed on logs nobody here wrote ----------------------


def test_kernel_oom_killer_invoked_by_pt_main_thread_is_a_kill_even_without_the_victim_line() -> (
    None
):
    """torch renames the main thread; a paste cut after the first kernel line still counts."""
    event = _event(
        "[240334.464703] pt_main_thread invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0"
    )
    assert (event.pool, event.killer) == (Pool.KILLED_BY_OS, "kernel")
    assert dict(event.extra)["invoked_by"] == "pt_main_thread"


def test_kernel_oom_kill_summary_line_names_pt_main_thread_and_its_pid() -> None:
    event = _event(
        "[240333.375663] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/session-2.scope,task=pt_main_thread,pid=2467259,uid=1000"
    )
    assert event.pool is Pool.KILLED_BY_OS and event.killed_pid == 2467259
    assert dict(event.extra)["process_name"] == "pt_main_thread"


def test_kernel_lines_of_one_kill_fold_into_one_event_naming_the_victim() -> None:
    text = (
        "Dec 01 10:00:00 box kernel: pt_main_thread invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0\n"
        "Dec 01 10:00:00 box kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=pt_main_thread,pid=4242,uid=1000\n"
        "Dec 01 10:00:00 box kernel: Out of memory: Killed process 4242 (pt_main_thread) total-vm:48979828kB, anon-rss:23167252kB, file-rss:83700kB, shmem-rss:20kB, UID:1000 pgtables:46968kB oom_score_adj:0\n"
    )
    events = [f.event for f in scan_stream(io.BytesIO(text.encode()))]
    assert len(events) == 1
    assert (
        events[0].killed_pid == 4242 and dict(events[0].extra)["anon_rss_bytes"] == 23167252 * KiB
    )


def test_a_core_dump_of_pt_main_thread_is_not_an_oom() -> None:
    assert (
        classify_record(
            "systemd-coredump[91686]: Process 87058 (pt_main_thread) of user 0 terminated abnormally with signal 6/ABRT, processing..."
        )
        is None
    )


@pytest.mark.parametrize(
    "text",
    [
        "Invalid buffer size: 64 KB",  # another program's config check: no two-decimal size
        "console.warn(`Invalid buffer size: ${this.config.bufferSize}, using 50`);",
        'raise ValueError(f"Invalid buffer size: {str(buf)} - must be greater than or equal to zero")',
    ],
)
def test_other_programs_invalid_buffer_size_messages_stay_negative(text: str) -> None:
    assert classify_record(text) is None


def test_mps_invalid_buffer_size_is_unified_memory_with_the_size() -> None:
    event = _event("RuntimeError: Invalid buffer size: 8.21 GB")
    assert (event.pool, event.backend, event.exception_type) == (
        Pool.UNIFIED_MPS,
        Backend.MPS,
        "RuntimeError",
    )
    assert event.requested_bytes == round(8.21 * GiB)
    assert event.rule == "mps-invalid-buffer"


def test_error_report_in_any_language_is_read_by_its_structure() -> None:
    """Labels in a language no word list here knows: the Markdown layout and the type suffice."""
    text = (
        "# ComfyUI Hata Raporu\n"
        "## Hata Ayrıntıları\n"
        "- **Düğüm Kimliği:** 12\n"
        "- **Düğüm Türü:** KSampler\n"
        "- **İstisna Türü:** torch.OutOfMemoryError\n"
        "- **İstisna Mesajı:** Cihazda ayırma\n"
        "## Yığın İzi\n"
    )
    events = [f.event for f in scan_stream(io.BytesIO(text.encode()))]
    assert len(events) == 1
    event = events[0]
    assert (event.pool, event.exception_type, event.node_type, event.node_id) == (
        Pool.GPU,
        "torch.OutOfMemoryError",
        "KSampler",
        "12",
    )


def test_a_localized_report_of_another_error_stays_negative() -> None:
    text = (
        "# ComfyUI 错误报告\n## 错误详情\n- **节点类型:** KSampler\n- **异常类型:** RuntimeError\n"
        "- **异常信息:** CUDA error: an illegal memory access was encountered\n"
    )
    assert list(scan_stream(io.BytesIO(text.encode()))) == []


def test_a_lower_cased_paste_keeps_its_numbers() -> None:
    event = _event(
        "torch.outofmemoryerror: cuda out of memory. tried to allocate 20.00 mib. gpu 0 has a total capacity of 8.00 gib of which 0 bytes is free."
    )
    assert (event.pool, event.backend, event.requested_bytes, event.total_bytes) == (
        Pool.GPU,
        Backend.CUDA,
        20 * MiB,
        8 * GiB,
    )


def test_lower_cased_prose_about_memory_stays_negative() -> None:
    assert (
        classify_record("i keep running out of memory with cuda on my 8gb card, any tips?") is None
    )


def test_a_cut_message_whose_reserved_figure_survives_is_fragmentation() -> None:
    event = _event(
        "HIP out of memory. Tried to allocate 90.00 MiB. GPU 0 has a total capacty of 512.00 MiB of which 16.00 MiB is free. Of the allocated memory 204.22 MiB is allocated by PyTorch, and 177.78 MiB is reserved"
    )
    assert event.pool is Pool.GPU_FRAGMENTATION and event.reserved_unallocated_bytes == round(
        177.78 * MiB
    )


def test_bare_cuda_oom_after_an_mmap_release_is_pinned_host_ram() -> None:
    text = (
        "loaded partially; 9178.35 MB usable, 9177.97 MB loaded, 3390.29 MB offloaded, lowvram patches: 0\n"
        "Attempting to release mmap (513)\n"
        "!!! Exception during processing !!! CUDA error: out of memory\n"
    )
    events = [f.event for f in scan_stream(io.BytesIO(text.encode()))]
    assert [(e.pool, dict(e.extra).get("host_memory")) for e in events] == [(Pool.RAM, "pinned")]
    # the same error far from any pinning is the card's
    far = "Attempting to release mmap (513)\n" + "filler line\n" * 20 + text.splitlines()[2] + "\n"
    events = [f.event for f in scan_stream(io.BytesIO(far.encode()))]
    assert [e.pool for e in events] == [Pool.GPU]


def test_the_allocator_message_is_never_pinned_host_ram() -> None:
    """'CUDA out of memory. Tried to allocate' is the caching allocator: always device memory."""
    text = (
        "Attempting to release mmap (513)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes is free.\n"
    )
    events = [f.event for f in scan_stream(io.BytesIO(text.encode()))]
    assert [e.pool for e in events] == [Pool.GPU]


def test_supir_hint_then_torch_message_is_one_failure_naming_the_pack() -> None:
    """SUPIR prints its hint and re-raises: the hint and torch's message fold into one event."""
    text = (
        "It's likely that too large of an image or batch_size for SUPIR was used, and it has devoured all of the memory it had reserved, you may need to restart ComfyUI. Make sure you are using tiled_vae,  you can also try using fp8 for reduced memory usage if your system supports it.\n"
        "!!! Exception during processing !!! Allocation on device 0 would exceed allowed memory. (out of memory)\n"
        "Currently allocated     : 20.69 GiB\n"
        "Requested               : 1.18 GiB\n"
        "Device limit            : 23.99 GiB\n"
        "Free (according to CUDA): 0 bytes\n"
    )
    events = [f.event for f in scan_stream(io.BytesIO(text.encode()))]
    assert len(events) == 1
    event = events[0]
    assert (event.backend, event.requested_bytes) == (Backend.CUDA, round(1.18 * GiB))
    assert dict(event.extra)["node_pack"] == "ComfyUI-SUPIR"


def test_videohelpersuite_meta_batch_refusal_is_host_ram() -> None:
    event = _event("RuntimeError: Meta Batch set to 512 frames but only 300 can fit in memory")
    assert (event.pool, dict(event.extra)["frames_that_fit"]) == (Pool.RAM, 300)


@pytest.mark.parametrize("filler", range(7))
def test_pinned_context_is_the_same_for_the_byte_scanner_and_the_line_path(filler: int) -> None:
    """The context reaches no further back than the scanner's lookbehind always feeds."""
    text = (
        "[2026-01-02 09:00:00.000] got prompt\n" * 60
        + "[2026-01-02 10:00:00.000] Attempting to release mmap (513)\n"
        + "".join(f"[2026-01-02 10:00:0{i}.000] filler {i}\n" for i in range(filler))
        + "[2026-01-02 10:00:09.000] !!! Exception during processing !!! CUDA error: out of memory\n"
    )
    by_bytes = [(f.line_no, f.event.pool) for f in scan_stream(io.BytesIO(text.encode()))]
    by_lines = [(f.line_no, f.event.pool) for f in iter_findings(text.splitlines())]
    assert by_bytes == by_lines
    assert by_bytes[0][1] is (Pool.RAM if filler <= 2 else Pool.GPU)


# -- issue 12, batch 4: forms found in the corpus' tune part ------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (
            "torch/install/share/lua/5.1/nn/THNN.lua:109: $ Torch: not enough memory: you tried to reallocate 11GB. Buy new RAM! at /tmp/luarocks_torch-scm-1-2936/torch7/lib/TH/THGeneral.c:251",
            11 * GiB,
        ),
        ("$ Torch: not enough memory: you tried to allocate 2GB. Buy new RAM!", 2 * GiB),
    ],
    ids=["lua-torch7-reallocate", "th-allocate"],
)
def test_th_host_allocator_before_c10_is_ram(text: str, size: int) -> None:
    event = _event(text)
    assert (event.pool, event.backend, event.requested_bytes) == (Pool.RAM, Backend.CPU, size)


def test_a_wrappers_exception_type_gives_way_to_the_inner_one() -> None:
    event = _event(
        "    com.chaquo.python.PyException: RuntimeError: [enforce fail at CPUAllocator.cpp:72] data. DefaultCPUAllocator: not enough memory: you tried to allocate 38400000 bytes. Buy new RAM!"
    )
    assert (event.exception_type, event.requested_bytes) == ("RuntimeError", 38400000)


def test_an_exception_type_glued_before_the_evidence_is_read() -> None:
    event = _event("Wan2_1_SkyreelsA2,RuntimeError: CUDA error: out of memory")
    assert (event.pool, event.exception_type) == (Pool.GPU, "RuntimeError")
    # glued to the full stop of the output line before it
    glued = _event("number of parameters: 81894144.RuntimeError: CUDA out of memory.")
    assert glued.exception_type == "RuntimeError"
    # a name that merely ends the same way is not cut into a type
    assert _event("see cudaRuntimeError: CUDA error: out of memory").exception_type == (
        "cudaRuntimeError"
    )


def test_an_error_toast_flattened_into_a_title_gives_type_node_and_id() -> None:
    event = _event("torch.OutOfMemoryError 3 KSampler torch.OutOfMemoryError Allocation on device")
    assert (event.pool, event.backend) == (Pool.GPU, Backend.CUDA)
    assert (event.exception_type, event.node_type, event.node_id) == (
        "torch.OutOfMemoryError",
        "KSampler",
        "3",
    )


@pytest.mark.parametrize(
    ("line", "task"),
    [
        (
            "Apr 25 19:05:01 netlogo01 kernel: [ 7097.004932] GC Thread#9 invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            "GC Thread#9",
        ),
        (
            "[Sun Mar 30 08:24:00 2025] pt_main_thread invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=0",
            "pt_main_thread",
        ),
        (
            "2024-04-29T14:55:41,678628+02:00 pool invoked oom-killer: gfp_mask=0x6200ca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            "pool",
        ),
    ],
    ids=["thread-name-with-space", "dmesg-T-pt-main-thread", "iso-timestamp"],
)
def test_the_invoking_task_is_the_whole_thread_name(line: str, task: str) -> None:
    event = _event(line)
    assert (event.pool, event.killer) == (Pool.KILLED_BY_OS, "kernel")
    assert dict(event.extra)["invoked_by"] == task


def test_a_kill_names_its_scope_only_where_the_kernel_lines_say_it() -> None:
    bare = _event(
        "Aug 18 03:19:11 169 kernel: Killed process 7748 (python) total-vm:12907828kB, anon-rss:11500204kB, file-rss:0kB"
    )
    assert bare.killed_pid == 7748 and "scope" not in dict(bare.extra)
    assert dict(_event("Out of memory: Killed process 3502 (main)").extra)["scope"] == "system"
    memcg = _event(
        "Memory cgroup out of memory: Killed process 15617 (python3) total-vm:11892kB, anon-rss:4292kB, file-rss:3428kB, shmem-rss:0kB"
    )
    assert dict(memcg.extra)["scope"] == "cgroup"


@pytest.mark.parametrize(
    "text",
    [
        "THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1513368888240/work/torch/lib/THC/generic/THCStorage.c line=82 error=2 : out of memory",
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCTensorRandom.cu:25",
        "RuntimeError:cuda runtime error(2):out of memory",
        "F1206 10:15:04.766489   447 syncedmem.cpp:56] Check failed: error == cudaSuccess (2 vs. 0)  out of memory",
        'what issues can lead to this error which is "RuntimeError: CUDA error:out of memory"?',
        "GPUassert: out of memory mean.cu 377",
        'I only get the following at start: Cuda error in func "cuda_init_device" at line 33: out of memory.',
        "cuda failed with error 2 out of memory. use CUDA_LAUNCH_BLOCKING=1 to get correct traceback.",
    ],
    ids=[
        "thc-check",
        "runtime-error-2",
        "runtime-error-2-compact",
        "caffe-glog",
        "no-space",
        "samples-gpuassert",
        "miner-cuda-error-in-func",
        "tensorview-error-2",
    ],
)
def test_cudas_error_2_as_old_torch_and_cxx_frameworks_print_it_is_the_gpu(text: str) -> None:
    event = _event(text)
    assert (event.pool, event.backend, event.rule) == (Pool.GPU, Backend.CUDA, "cuda-error-oom")


@pytest.mark.parametrize(
    "text",
    [
        "():[08:45:46]/home/travis/build/dmlc/mxnet-distro / mxnet-build / 3 rdparty / mshadow / mshadow /。/ stream_gpu-inl。h:184:检查失败:e == cudaSuccess: CUDA:没有记忆",
        "Check failed: e == cudaSuccess: CUDA: メモリ不足",
    ],
    ids=["machine-translated-literal", "japanese"],
)
def test_cudas_out_of_memory_string_translated_after_its_colon_is_the_gpu(text: str) -> None:
    assert has_needle(text)
    assert (_event(text).pool, _event(text).backend) == (Pool.GPU, Backend.CUDA)


@pytest.mark.parametrize(
    "text",
    [
        "CUDA: True",
        "PyTorch CUDA: 12.4, cuDNN: 9.1",
        "Check failed: error == cudaSuccess (1 vs. 0)  invalid argument",
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=11 : invalid argument",
    ],
)
def test_cuda_lines_that_are_no_oom_stay_quiet(text: str) -> None:
    assert classify_record(text) is None


@pytest.mark.parametrize(
    ("text", "pool", "reserved"),
    [
        (
            "Tried to allocate 20.00 MiB (GPU 0; 1.96 GiB total capacity; 1.24 GiB already allocated; "
            "2.88 MiB free; 1.25 GiB reserved in total by PyTorch)",
            Pool.GPU,
            int(1.25 * GiB),
        ),
        (
            'the error: "Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity; 5.21 GiB already '
            'allocated; 12.00 MiB free; 6.47 GiB reserved in total by PyTorch)"',
            Pool.GPU_FRAGMENTATION,
            int(6.47 * GiB),
        ),
        (
            "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which 0 bytes is free.",
            Pool.GPU,
            None,
        ),
    ],
    ids=["old-shape", "old-shape-quoted-fragmented", "new-shape"],
)
def test_a_torch_message_pasted_from_its_second_sentence_is_still_read(
    text: str, pool: Pool, reserved: int | None
) -> None:
    """The first sentence (``CUDA out of memory.``) cut off, the figures still say it all;
    which backend printed it is not said."""
    assert has_needle(text) and has_needle(text.lower())
    event = _event(text)
    assert (event.rule, event.pool, event.backend) == ("cuda-oom-cut", pool, Backend.UNKNOWN)
    assert event.gpu_index == 0 and event.reserved_bytes == reserved
    assert event.requested_bytes in (20 * MiB, 2 * GiB)


def test_ipexs_4gb_block_limit_with_torchs_figures_is_no_oom() -> None:
    text = (
        '"Current platform can NOT allocate memory block with size larger than 4GB! Tried to allocate '
        '7.03 GiB (GPU 0; 15.91 GiB total capacity; 2.29 GiB already allocated; 2.50 GiB reserved in total by PyTorch)"'
    )
    assert classify_record(text) is None


def test_an_exception_type_glued_to_cjk_text_is_still_the_type() -> None:
    event = _event("一直出现torch.OutOfMemoryError: Allocation on device")
    assert event.exception_type == "torch.OutOfMemoryError"


def test_thcs_check_line_and_the_exception_it_raised_are_one_failure_at_the_exception() -> None:
    text = (
        "THCudaCheck FAIL file=/pytorch/torch/lib/THC/generic/THCStorage.cu line=58 error=2 : out of memory\n"
        "Traceback (most recent call last):\n"
        '  File "main.py", line 357, in train\n'
        "    loss.backward()\n"
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/torch/lib/THC/generic/THCStorage.cu:58\n"
    )
    found = list(iter_findings(text.splitlines()))
    assert [(f.line_no, f.event.exception_type) for f in found] == [(5, "RuntimeError")]
    # a check line alone stays an event of its own
    assert [f.line_no for f in iter_findings(text.splitlines()[:1])] == [1]


def test_an_exception_message_wrapped_onto_the_oom_line_gives_its_type() -> None:
    text = (
        'it generates "failed to RuntimeError: TensorStorage /io/include/tensorview/tensor.h 168\n'
        'cuda failed with error 2 out of memory. use CUDA_LAUNCH_BLOCKING=1 to get correct traceback."\n'
    )
    (finding,) = iter_findings(text.splitlines())
    assert (finding.line_no, finding.event.exception_type) == (2, "RuntimeError")
    # a sentence that ended on the line before was not wrapped
    ended = "RuntimeError: something else went wrong.\ncuda failed with error 2 out of memory.\n"
    (finding,) = iter_findings(ended.splitlines())
    assert finding.event.exception_type is None


# -- speed: an alternation split into its gated alternatives finds the same match -------------

_ALT_PIECES = [
    "Of the allocated memory ",
    " is allocated by PyTorch",
    " already allocated",
    "and ",
    " is reserved",
    " is reserved by PyTorch but unallocated.",
    " cached)",
    "1.50 GiB",
    "512.00 MiB",
    "1,024 bytes",
    "3 B",
    "7",
    ".",
    ",",
    " ",
    "\n",
    "GiB",
    "x",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_ALT_PIECES), max_size=24).map("".join))
def test_the_split_alternations_match_as_the_whole_regex(body: str) -> None:
    """``_find_first`` searches each alternative of a numbers regex alone (gated by its own
    literal) and matches the whole regex at the leftmost start: the match, its span and its
    groups are the whole regex's ``search``, on any text."""
    for rx, branches in (
        (rules._RX_ALLOCATED, rules._ALLOCATED_BRANCHES),
        (rules._RX_RESERVED_UNALLOC, rules._RESERVED_UNALLOC_BRANCHES),
    ):
        want = rx.search(body)
        got = rules._find_first(rx, body, branches)
        assert (got and (got.span(), got.groups())) == (want and (want.span(), want.groups()))


def test_the_split_alternations_match_as_the_whole_regex_on_the_corpus() -> None:
    for path in sorted((Path(__file__).parent / "corpus").glob("*.txt")):
        body = path.read_text("utf-8", "replace")
        for rx, branches in (
            (rules._RX_ALLOCATED, rules._ALLOCATED_BRANCHES),
            (rules._RX_RESERVED_UNALLOC, rules._RESERVED_UNALLOC_BRANCHES),
        ):
            want = rx.search(body)
            got = rules._find_first(rx, body, branches)
            assert (got and (got.span(), got.groups())) == (
                want and (want.span(), want.groups())
            ), path.name


@pytest.mark.parametrize(
    ("text", "pool", "exc"),
    [
        ("RuntimeError: Out of memory, try a smaller tile size", Pool.GPU, "RuntimeError"),
        ("ValueError: not enough GPU memory to upscale this image", Pool.GPU, "ValueError"),
        ("Exception: Insufficient video memory for this resolution", Pool.GPU, "Exception"),
        ("MyNodeError: OOM while decoding frames", Pool.GPU, "MyNodeError"),
        ("RuntimeError: out of system memory while loading the video", Pool.RAM, "RuntimeError"),
        ("RuntimeError: Not enough host memory to hold 900 frames", Pool.RAM, "RuntimeError"),
    ],
)
def test_an_exception_whose_own_words_say_memory_ran_out_is_an_oom(
    text: str, pool: Pool, exc: str
) -> None:
    """A custom node's own raise, whatever its type (no torch message follows)."""
    event = _event(text)
    assert (event.rule, event.pool, event.exception_type) == ("exception-oom-words", pool, exc)


def test_the_pack_that_raised_the_worded_oom_is_named() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/ComfyUI/execution.py", line 323, in execute\n'
        "    output_data = get_output_data(obj, input_data_all)\n"
        '  File "/home/u/ComfyUI/custom_nodes/ComfyUI-SomeUpscaler/nodes.py", line 88, in upscale\n'
        '    raise RuntimeError("Out of memory: lower the tile size")\n'
        "RuntimeError: Out of memory: lower the tile size\n"
    )
    (finding,) = iter_findings(text.splitlines())
    assert dict(finding.event.extra)["node_pack"] == "ComfyUI-SomeUpscaler"


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "KeyError: 'oom_score_adj'",
        "ValueError: the room is full",
        "I ran out of memory yesterday, the RuntimeError came later",
        "AttributeError: 'NoneType' object has no attribute 'memory_format'",
    ],
)
def test_exceptions_without_words_of_memory_running_out_stay_quiet(text: str) -> None:
    assert classify_record(text) is None


@pytest.mark.parametrize(
    ("text", "rule", "pool", "requested"),
    [
        ("zsh: killed     python main.py --force-fp16", "shell-killed", Pool.KILLED_BY_OS, None),
        ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cuda-error-oom", Pool.GPU, None),
        (
            "onnxruntime.capi.onnxruntime_pybind11_state.RuntimeException: [ONNXRuntimeError] : 6 : "
            "RUNTIME_EXCEPTION : Non-zero status code returned while running Conv node. Status Message: "
            "bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool) Failed to "
            "allocate memory for requested buffer of size 2147483648",
            "onnx-arena-oom",
            Pool.GPU,
            2 * GiB,
        ),
        (
            "[CPUExecutionProvider] bfc_arena.cc:376 Failed to allocate memory for requested buffer of size 1048576",
            "onnx-arena-oom",
            Pool.RAM,
            MiB,
        ),
        ("memoryerror", "memory-error", Pool.RAM, None),
        (
            "runtimeerror: defaultcpuallocator: not enough memory: you tried to allocate 1024 bytes.",
            "cpu-allocator",
            Pool.RAM,
            1024,
        ),
    ],
    ids=[
        "zsh-killed",
        "driver-api-name",
        "onnx-arena",
        "onnx-cpu-arena",
        "lower-memoryerror",
        "lower-cpu",
    ],
)
def test_more_shapes_of_running_out(
    text: str, rule: str, pool: Pool, requested: int | None
) -> None:
    assert has_needle(text)
    event = _event(text)
    assert (event.rule, event.pool, event.requested_bytes) == (rule, pool, requested)


def test_zsh_killing_something_else_by_name_is_still_quiet_without_its_report() -> None:
    assert classify_record("I killed zsh: it hung") is None


# -- issue 12, round 3: shapes its batches showed (each also in the corpus) -------------------


@pytest.mark.parametrize(
    ("text", "rule", "pool", "backend", "requested"),
    [
        (
            "Tried to allocate 292.50 MiB on private pool.",
            "mps-oom",
            Pool.UNIFIED_MPS,
            Backend.MPS,
            int(292.5 * MiB),
        ),
        (
            "MPS backend out of memory (MPS allocated: 16.00 GB, other allocations: 3.31 GB, max allowed: 18.13 GB). "
            "Tried to allocate 256 bytes on shared pool.",
            "mps-oom",
            Pool.UNIFIED_MPS,
            Backend.MPS,
            256,
        ),
        ("爆出了CUDA_ERROR_OUT_OF_MEMORY的错误", "cuda-error-oom", Pool.GPU, Backend.CUDA, None),
        (
            "RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
            "xpu-device-oom",
            Pool.GPU,
            Backend.XPU,
            None,
        ),
        (
            "RuntimeError: Caught RuntimeError in pin memory thread for device 0.",
            "pin-memory-thread",
            Pool.RAM,
            Backend.CUDA,
            None,
        ),
        (
            "!!! Exception during processing !!! Unable to allocate 75.5 GiB for an array with shape (3256, 1920, 1080, 3) and data type float32",
            "numpy-alloc",
            Pool.RAM,
            Backend.CPU,
            round(75.5 * GiB),
        ),
        (
            "CUDA error 2 at ggml-cuda.cu:359: out of memory",
            "cuda-error-oom",
            Pool.GPU,
            Backend.CUDA,
            None,
        ),
        (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 30649.55 MiB on device 0: cudaMalloc failed: out of memory",
            "cuda-error-oom",
            Pool.GPU,
            Backend.CUDA,
            32138382541,
        ),
        (
            "Error: model requires more system memory (164.8 GiB) than is available (13.4 GiB)",
            "library-ram-guard",
            Pool.RAM,
            Backend.CPU,
            176952652595,
        ),
        ("DefaultCPUAllocator: not enough memory", "cpu-allocator", Pool.RAM, Backend.CPU, None),
        (
            "[E:onnxruntime:, sequential_executor.cc:339] Non-zero status code returned while running Conv node. "
            "Name:'347_nchwc' Status Message: bfc_arena.cc:330 Failed to allocate memory for requested buffer of size 285081600",
            "onnx-arena-oom",
            Pool.RAM,
            Backend.CPU,
            285081600,
        ),
    ],
)
def test_round_three_shapes(
    text: str, rule: str, pool: Pool, backend: Backend, requested: int | None
) -> None:
    assert has_needle(text)
    event = _event(text)
    assert (event.rule, event.pool, event.backend, event.requested_bytes) == (
        rule,
        pool,
        backend,
        requested,
    )


def test_a_bogus_exabyte_free_figure_is_read_exactly() -> None:
    """Decimal arithmetic: a float product is off by about a kilobyte at 2^64."""
    event = _event(
        "HIP out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacty of 512.00 MiB of which "
        "17179869183.96 GiB is free."
    )
    assert event.free_bytes == 18446744073666601943


def test_oomds_older_wording_names_the_pid_from_its_pressure_line_on() -> None:
    text = (
        "    [   77.740597] systemd-oomd[659]: Memory pressure for /system.slice is 85.03% > 80.00% for > 2s with reclaim activity\n"
        "    [   77.749597] systemd-oomd[659]: oomd attempting to kill 407 with KILL\n"
    )
    (finding,) = iter_findings(["quoted:", *text.splitlines()])
    e = finding.event
    assert (finding.line_no, e.pool, e.killer, e.killed_pid) == (
        2,
        Pool.KILLED_BY_OS,
        "systemd-oomd",
        407,
    )


def test_slurms_oom_kill_report_names_the_kernel_and_the_cgroup() -> None:
    lines = [
        'StdErr: "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed                  python3 main.py',
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=191.batch cgroup. Some of your processes may have been killed",
    ]
    (finding,) = iter_findings(lines)
    e = finding.event
    assert (finding.line_no, e.killer, e.killed_pid, dict(e.extra)["scope"]) == (
        1,
        "kernel",
        8156,
        "cgroup",
    )


def test_a_killed_glued_to_a_progress_bar_is_a_kill() -> None:
    event = _event("Loading checkpoint shards:  75%|█████ | 3/4 [00:08<00:02,  2.83s/it]Killed")
    assert event.pool is Pool.KILLED_BY_OS


def test_torchs_later_sentences_on_their_own_lines_stay_with_the_message() -> None:
    lines = [
        "torch.OutOfMemoryError: HIP out of memory. ",
        "Tried to allocate 26.00 MiB. GPU 0 has a total capacity of 15.92 GiB of which 13.60 GiB is free. ",
        "Of the allocated memory 1.72 GiB is allocated by PyTorch, and 28.98 MiB is reserved by PyTorch but unallocated.",
    ]
    (finding,) = iter_findings(lines)
    e = finding.event
    assert (finding.line_no, e.pool, e.requested_bytes) == (1, Pool.GPU_FRAGMENTATION, 26 * MiB)
    # ... also with blank lines between them
    (finding,) = iter_findings(["RuntimeError: CUDA out of memory.", "", lines[1]])
    assert finding.event.requested_bytes == 26 * MiB
    # a record that said nothing of memory does not swallow such a line
    assert [f.line_no for f in iter_findings(["Loading model", lines[1]])] == [2]


def test_a_pack_message_over_two_lines_keeps_its_exception_type() -> None:
    lines = [
        "RuntimeError: Failed to load video: E:\\dev\\ComfyUI\\output\\wildfire.mp4",
        "due to: [enforce fail at alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: you tried to allocate 68951347200 bytes.",
    ]
    (finding,) = iter_findings(lines)
    assert (finding.line_no, finding.event.exception_type) == (2, "RuntimeError")


def test_a_ui_label_before_the_exception_line_is_not_the_type() -> None:
    event = _event(
        "Extend: RuntimeError: [enforce fail at alloc_cpu.cpp:81] data. DefaultCPUAllocator: not enough memory: you tried to allocate 151781376 bytes."
    )
    assert (event.exception_type, event.requested_bytes) == ("RuntimeError", 151781376)


# -- issue 12, round 4: issue titles and Markdown around the messages ------------------------


@pytest.mark.parametrize(
    ("text", "rule", "exc", "node"),
    [
        (
            "# FaceDetailerPipe: torch.OutOfMemoryError - Allocation on device",
            "cuda-alloc-on-device",
            "torch.OutOfMemoryError",
            "FaceDetailerPipe",
        ),
        (
            "TangoFluxVAEDecodeAndPlay - torch.OutOfMemoryError: Allocation on device - even in cpu mode",
            "cuda-alloc-on-device",
            "torch.OutOfMemoryError",
            "TangoFluxVAEDecodeAndPlay",
        ),
        ("# Allocation on device", "cuda-alloc-on-device", None, None),
    ],
)
def test_issue_titles_that_name_the_failure(
    text: str, rule: str, exc: str | None, node: str | None
) -> None:
    event = _event(text)
    assert (event.rule, event.pool, event.exception_type, event.node_type) == (
        rule,
        Pool.GPU,
        exc,
        node,
    )


def test_the_oom_killer_said_to_kill_is_a_kill_and_asking_about_it_is_not() -> None:
    event = _event("oom-killer kills the comfyui process.")
    assert (event.pool, event.killer) == (Pool.KILLED_BY_OS, "kernel")
    assert classify_record("I'm not sure why the Linux OOM Killer is not killing ComfyUI") is None


def test_a_node_line_in_markdown_bold_or_a_backticked_dialog_names_the_node() -> None:
    bold = [
        "**CheckpointLoaderSimple",
        "Allocation on device 0 would exceed allowed memory. (out of memory)",
    ]
    (finding,) = iter_findings(bold)
    assert finding.event.node_type == "CheckpointLoaderSimple"
    dialog = [
        "`Error occurred when executing FaceDetailer:`",
        "",
        "`Allocation on device 0 would exceed allowed memory. (out of memory)",
    ]
    (finding,) = iter_findings(dialog)
    assert finding.event.node_type == "FaceDetailer"


def test_a_title_that_glued_got_an_oom_to_the_message_says_models_were_unloaded() -> None:
    event = _event(
        "torch.OutOfMemoryError: Allocation on device Got an OOM, unloading all loaded models."
    )
    assert dict(event.extra)["comfy_unloaded_models"] is True


@pytest.mark.parametrize(
    "text",
    [
        "    Reason:       OOMKilled",
        "comfy-0   0/1     OOMKilled   3          5m",  # kubectl get pods' STATUS column
        '        "OOMKilled": true,',
        "reason=OOMKilled",
        "OOMKilled",
    ],
)
def test_oomkilled_as_a_program_printed_it_is_a_kill(text: str) -> None:
    assert [f.event.pool for f in iter_findings([text])] == [Pool.KILLED_BY_OS]


@pytest.mark.parametrize(
    "text",
    [
        "writing the PNG sequence OOM killed by Ubuntu",
        "Seeing OOMKilled on my pods",
        "When a pod is OOMKilled all I see in the UI is:",
        "the container gets OOM-killed",
        "Signal 9 (SIGKILL) (OOMKilled) during Training",
        "{'OOMKilled': False}",
    ],
)
def test_a_users_oom_killed_in_a_sentence_is_no_failure(text: str) -> None:
    """Rounds 8-17 of the corpus label a user's 'OOM killed' the user's words (round 4's one
    case was relabelled to the same reading); Kubernetes' own 'OOMKilled' stands in a field,
    a column or a quote."""
    assert list(iter_findings([text])) == []


def test_round_four_spent_shapes() -> None:
    fragment = _event("out of memory, Requested : 8.01 GiB Device limit : 15.70 GiB")
    assert (fragment.rule, fragment.requested_bytes) == ("cuda-exceed-allowed", round(8.01 * GiB))
    assert _event("Reason: OOMKilled").pool is Pool.KILLED_BY_OS
    node = _event("# Again - FaceDetailerPipe: torch.OutOfMemoryError - Allocation on device-2")
    assert node.node_type == "FaceDetailerPipe"
    report = _event(
        "LTXVLoader - **Exception Type:** torch.OutOfMemoryError - **Exception Message:** Allocation on device"
    )
    assert report.node_type == "LTXVLoader"


def test_two_shell_kills_are_two_deaths() -> None:
    lines = [
        "Loading shards: 75%| 3/4 [01:34<00:31, 31.54s/it]Killed",
        "Loading text encoder",
        "Loading shards: 75%| 3/4 [01:34<00:31, 31.54s/it]Killed",
    ]
    assert [f.line_no for f in iter_findings(lines)] == [1, 3]


def test_a_message_rebroken_at_its_and_keeps_the_reserved_figure() -> None:
    lines = [
        "HIP out of memory. Tried to allocate 66.54 GiB.",
        "GPU 0 has a total capacity of 96.00 GiB of which 10.75 GiB is free.",
        "Of the allocated memory 84.36 GiB is allocated by PyTorch,",
        "and 360.11 MiB is reserved by PyTorch but unallocated.",
    ]
    (finding,) = iter_findings(lines)
    assert finding.event.reserved_unallocated_bytes == round(Decimal("360.11") * MiB)


def test_an_oom_a_pack_caught_and_went_on_from_is_soft() -> None:
    fell_back = [
        "→ [10S] TiledSampler v2.5: carrier wrapper sampling failed (OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)",
        "Requested : 128.91 MiB",
        ": 17179869184.00 GiB); falling back to plain video for carrier tile",
    ]
    (finding,) = iter_findings(fell_back)
    assert finding.event.recovered
    retried = [
        "[10:03:35.784] ⚠️ [WARNING] OOM during InflatedCausalConv3d.concat_splits: Allocation on device",
        "[10:03:35.784] ℹ️ Clearing memory and retrying",
        "[10:03:39.124] ✅ Retry successful for InflatedCausalConv3d.concat_splits",
    ]
    (finding,) = iter_findings(retried)
    assert finding.event.recovered
    # the same scan of the file agrees (the retry line holds a needle, so it is in the window)
    (found,) = scan_stream(io.BytesIO("\n".join(retried).encode() + b"\n"))
    assert found.event.recovered
    # an OOM that nothing retried stays a failure
    (plain,) = iter_findings(retried[:1])
    assert not plain.event.recovered


@pytest.mark.parametrize(
    ("text", "rule", "pool", "exc", "requested"),
    [
        (
            "[Bug]: RuntimeError: unable to mmap ... Cannot allocate memory",
            "mmap-enomem",
            Pool.RAM,
            "RuntimeError",
            None,
        ),
        (
            "An error occurred in the image: OutOfCacheError: CUDA out of memory Tried to allocate 256.00 MiB. GPU",
            "cuda-oom",
            Pool.GPU,
            "OutOfCacheError",
            256 * MiB,
        ),
        (
            "RuntimeError: CPUAllocator: not enough memory: you tried to allocate 6553600 bytes.",
            "cpu-allocator",
            Pool.RAM,
            "RuntimeError",
            6553600,
        ),
        (
            '[Issue]: "RuntimeError: Could not allocate tensor with XXXXXXXX bytes"',
            "directml-oom",
            Pool.GPU,
            "RuntimeError",
            None,
        ),
        (
            "RuntimeError: Could not allocate tensor with 4718592000 bytes",
            "directml-oom",
            Pool.GPU,
            "RuntimeError",
            4718592000,
        ),
        (
            "[Bug]: RuntimeError: [enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: you tried to allocate 9437184 bytes.",
            "cpu-allocator",
            Pool.RAM,
            "RuntimeError",
            9437184,
        ),
    ],
)
def test_round_five_shapes(
    text: str, rule: str, pool: Pool, exc: str | None, requested: int | None
) -> None:
    assert has_needle(text)
    event = _event(text)
    assert (event.rule, event.pool, event.exception_type, event.requested_bytes) == (
        rule,
        pool,
        exc,
        requested,
    )


def test_macos_bashs_killed_9_is_a_kill_with_its_pid() -> None:
    event = _event(
        "invokeai/invoke.sh: line 24: 10946 Killed: 9               .venv/bin/python .venv/bin/invoke.py --web $*"
    )
    assert (event.pool, event.killed_pid) == (Pool.KILLED_BY_OS, 10946)


def test_a_start_up_tip_naming_cuda_out_of_memory_stays_quiet() -> None:
    assert (
        classify_record("If you get CUDA out of memory errors, try --lowvram or a smaller batch.")
        is None
    )
    assert (
        classify_record("When i use foocus in colab i am getting CUDA out of memory error") is None
    )


def test_round_five_spent_shapes() -> None:
    job = _event("[1]    9301 killed     python3 scripts/dream.py ")
    assert (job.pool, job.killed_pid) == (Pool.KILLED_BY_OS, 9301)
    cased = _event("torch.cuda.OutofMemoryError")
    assert cased.pool is Pool.GPU
    glued = _event("更新后出现 SegmentAnything Ultra V2 Allocation on device")
    assert glued.rule == "cuda-alloc-on-device"
    tail = _event("not enough memory: you tried to allocate 9437184 bytes")
    assert (tail.pool, tail.requested_bytes) == (Pool.RAM, 9437184)
    enforce = _event(
        'suddenly getting the error "RuntimeError: [enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. '
        'DefaultCPUAllocator: not enough memory: you tried to allocate 151781376 bytes."'
    )
    assert (enforce.exception_type, enforce.requested_bytes) == ("RuntimeError", 151781376)
    assert classify_record("the prose says not enough memory, nothing more") is None


def test_round_six_shapes() -> None:
    wrapped = [
        ">  Server execution error: Allocation on device 0",
        "would exceed allowed memory. (out of memory)",
        "Currently allocated: 2.65 GiB",
        "Requested 666.02 MiB",
        "Device limit 13.81 GiB",
    ]
    (finding,) = iter_findings(wrapped)
    e = finding.event
    assert (finding.line_no, e.rule, e.requested_bytes) == (
        1,
        "cuda-exceed-allowed",
        round(Decimal("666.02") * MiB),
    )
    assert (
        _event("BNK Unsampler exceed allowed memory. (out of memory)").rule == "cuda-exceed-allowed"
    )
    # (a quote inside the user's sentence is the user's words: relabelled once round 18 was spent)
    assert not list(
        iter_findings(
            ['An error message "Allocation on device" appears when the SAM model is loaded']
        )
    )
    typed = _event(
        "python app.py --model-type v1 一直报torch.cuda.OutOfMemoryError: CUDA out of memory"
    )
    assert (typed.rule, typed.exception_type) == ("cuda-oom", "torch.cuda.OutOfMemoryError")
    assert (
        _event("Wan 2.1 Pinokkio or ComfyUI | OS Error 1455 | The paging file is too small").pool
        is Pool.SWAP_PAGEFILE
    )
    cycles = _event(
        "Out of memory in cuStreamCreate(&cuda_stream_, CU_STREAM_NON_BLOCKING) (queue.cpp:21)"
    )
    assert (cycles.pool, cycles.backend) == (Pool.GPU, Backend.CUDA)
    dml = _event(
        "[W D:\\a\\_work\\1\\s\\pytorch-directml-plugin\\torch_directml\\csrc\\engine\\dml_heap_allocator.cc:120] DML allocator out of memory!"
    )
    assert dml.backend is Backend.DIRECTML
    worker = _event("RuntimeError: DataLoader worker (pid 3979007) is killed by signal: Killed.")
    assert (worker.pool, worker.killed_pid, worker.exception_type) == (
        Pool.KILLED_BY_OS,
        3979007,
        "RuntimeError",
    )
    form = _event(
        "[Bug]: MemoryError: Unable to allocate 3.00 GiB for an array with shape (1,) and data type float32"
    )
    assert (form.pool, form.exception_type) == (Pool.RAM, "MemoryError")


def test_round_six_spent_shapes() -> None:
    assert (
        classify_record("2024-12-20 16:03:38,836 INFO OutOfMemoryError = torch._C.OutOfMemoryError")
        is None
    )
    assert (
        classify_record("AttributeError: module 'torch._C' has no attribute 'OutOfMemoryError'")
        is None
    )
    assert (
        _event("!!! Exception during processing !!! cannot allocate array memory").pool is Pool.RAM
    )
    # (round 23's spending read MPS's words among the user's as the user's naming them, as
    # torch's device words there are; this case was relabelled)
    assert classify_record("On MAC : MPS Backend out of Memory problem") is None
    assert (
        _event("[Bug]: CUDA: out of memory before even loading any models").backend is Backend.CUDA
    )
    dml = _event(
        "I was working with Direct ML (DML) and got 'Not enough memory resources are available to complete this operation'"
    )
    assert (dml.pool, dml.backend) == (Pool.GPU, Backend.DIRECTML)
    assert (
        _event("Not enough memory resources are available to complete this operation").pool
        is Pool.RAM
    )
    tf = _event(
        "W op_kernel.cc:1651] OP_REQUIRES failed at dml_kernel_context.cc:174 : Resource exhausted: OOM when allocating tensor with shape[16,128,98,98]"
    )
    assert tf.backend is Backend.DIRECTML
    need = _event(
        "RuntimeError: `Not enough memory, use lower resolution (max approx. 1024x1024). Need: 0.9GB free, Have:0.7GB free`"
    )
    assert (need.requested_bytes, need.free_bytes) == (
        round(Decimal("0.9") * GiB),
        round(Decimal("0.7") * GiB),
    )
    assert _event("DirectML Out Of Memory").backend is Backend.DIRECTML
    assert _event("Error 1455").pool is Pool.SWAP_PAGEFILE
    assert (
        _event("4x3090也报torch.OutOfMemoryError: CUDA out of memory").exception_type
        == "torch.OutOfMemoryError"
    )
    (finding,) = iter_findings(
        [
            "**Error occurred when executing ApplyInstantID:**",
            "",
            "Allocation on device 0 would exceed allowed memory. (out of memory)",
        ]
    )
    assert finding.event.node_type == "ApplyInstantID"


def test_round_seven_shapes() -> None:
    worker = _event("RuntimeError: DataLoader worker is killed by signal: Killed.")
    assert (worker.pool, worker.killed_pid) == (Pool.KILLED_BY_OS, None)
    retyped = _event(
        "l got this problem `cuda out of memory, tried to allocate 50MiB(GPU 0; 1.96GiB totalcapacity;1.33GiB already allocated"
    )
    assert (retyped.requested_bytes, retyped.total_bytes) == (
        50 * MiB,
        round(Decimal("1.96") * GiB),
    )
    italic = _event(
        "_RuntimeError: CUDA out of memory. Tried to allocate 572.00 MiB (GPU 0; 23.99 GiB total capacity; 21.62 GiB already allocated; 0 bytes free; 22.67 GiB reserved in total by PyTorch)_"
    )
    assert italic.exception_type == "RuntimeError"
    report = [
        "## Error Details",
        "- **Node ID:** 4",
        "- **Node Type:** FluxTrainLoop",
        "- **Exception Type:** torch.OutOfMemoryError",
        "- **Exception Message:** Allocation on device ",
    ]
    (finding,) = iter_findings(report)
    assert (finding.line_no, finding.event.node_type, finding.event.node_id) == (
        5,
        "FluxTrainLoop",
        "4",
    )


def test_round_seven_spent_shapes() -> None:
    """The shapes round 7's held part showed once it was spent (each also a corpus case)."""
    memalign = _event(
        "RuntimeError: [enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, gAlignment, nbytes) == 0. 12 vs 0"
    )
    assert (memalign.pool, memalign.rule) == (Pool.RAM, "cpu-allocator")
    # errno 22 (EINVAL) is a bad alignment, not memory running out
    assert not list(
        iter_findings(
            [
                "RuntimeError: [enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, gAlignment, nbytes) == 0. 22 vs 0"
            ]
        )
    )
    spaced = _event("DefaultCPUAllocator : not enough memory")
    assert (spaced.pool, spaced.node_type) == (Pool.RAM, None)
    quoted_th = _event('Error : "not enough memory: you tried to allocate 0BG"')
    assert (quoted_th.pool, quoted_th.requested_bytes) == (Pool.RAM, None)
    (wrapped,) = iter_findings(
        [
            "RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you",
            "tried to allocate 268435456 bytes. Error code 12 (Cannot allocate memory)",
        ]
    )
    assert (wrapped.line_no, wrapped.event.requested_bytes) == (1, 268435456)
    need_have = _event(
        "Whenever I try I'm getting `RuntimeError: Not enough memory, use lower resolution (max approx. 1472x1472). Need: 3.7GB free, Have:3.1GB free, A: 9.59 GB`, however"
    )
    assert (need_have.pool, need_have.free_bytes) == (Pool.GPU, round(Decimal("3.1") * GiB))
    glued = _event("loading annotations into memory... Killed")
    assert (glued.pool, glued.rule) == (Pool.KILLED_BY_OS, "shell-killed")
    opencv = _event(
        "`cv2.error: OpenCV(4.6.0) /io/opencv/modules/core/src/alloc.cpp:73: error: (-4:Insufficient memory) Failed to allocate 4672512 bytes in function 'OutOfMemoryError'"
    )
    assert (opencv.pool, opencv.backend, opencv.requested_bytes) == (
        Pool.RAM,
        Backend.CPU,
        4672512,
    )
    (title,) = iter_findings(
        [
            "Error occurred when executing MimicMotionSampler:Allocation on device",
            "",
            "Error occurred when executing MimicMotionSampler:",
            "",
            "Allocation on device",
        ]
    )
    # the same dialog twice (a title and the body): one observation, counted twice
    assert (title.event.node_type, title.event.count) == ("MimicMotionSampler", 2)


def test_a_dialog_line_starts_a_new_record() -> None:
    """A title that glued the dialog onto one line, then the dialog itself: two observations,
    each with its own node (the blank lines between them once merged the two records)."""
    findings = list(
        iter_findings(
            [
                "Error occurred when executing MimicMotionSampler:Allocation on device",
                "",
                "Error occurred when executing KSampler:",
                "",
                "Allocation on device",
            ]
        )
    )
    assert [(f.line_no, f.event.node_type) for f in findings] == [
        (1, "MimicMotionSampler"),
        (5, "KSampler"),
    ]


def test_round_eight_tune_shapes() -> None:
    """What round 8's tune part showed (each also a corpus case)."""
    renderer = _event(
        "[2026-08-14T20:53:05.314Z] [CRITICAL] render-process-gone reason=oom exitCode=-536870904"
    )
    assert (renderer.pool, renderer.rule) == (Pool.RAM, "renderer-oom")
    assert not list(iter_findings(["render-process-gone reason=crashed exitCode=-1073741819"]))
    mkl = _event("RuntimeError: mkl_malloc: failed to allocate memory")
    assert (mkl.pool, mkl.backend, mkl.requested_bytes) == (Pool.RAM, Backend.CPU, None)
    wan2gp = _event(
        "it is likely that you have unsufficient RAM and / or Reserved RAM allocation should be reduced"
    )
    assert wan2gp.pool is Pool.RAM
    srun = _event("`srun: error: gpu001: task 0: Out Of Memory`")
    assert (srun.pool, srun.killer, srun.rule) == (Pool.KILLED_BY_OS, None, "slurm-task-oom")
    ct2 = _event("RuntimeError: CUDA failed with error out of memory")
    assert (ct2.pool, ct2.backend) == (Pool.GPU, Backend.CUDA)
    toast = _event("SONICSampler Allocation on device-Need Help")
    assert (toast.pool, toast.node_type) == (Pool.GPU, "SONICSampler")
    # a pipe after the message is not the toast's dash: the type after it is kept
    piped = _event("# Allocation on device | torch.OutOfMemoryError")
    assert piped.exception_type == "torch.OutOfMemoryError"
    bold = _event(
        '**OSError: [WinError 1455] The paging file is too small. Error loading "cublas64_11.dll" or one of its dependencies.**'
    )
    assert (bold.pool, bold.exception_type) == (Pool.SWAP_PAGEFILE, "OSError")


def test_a_markdown_fence_tag_is_not_a_node() -> None:
    (finding,) = iter_findings(
        [
            "```Shell",
            "[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 21474836480 bytes. Error code 12 (Cannot allocate memory)",
            "```",
        ]
    )
    assert (finding.event.node_type, finding.event.requested_bytes) == (None, 21474836480)


def test_round_eight_spent_shapes() -> None:
    """What round 8's held part showed once it was spent (each also a corpus case)."""
    translated = _event(
        "[错误] !!! 处理过程中发生异常 !!! [在 alloc_cpu.cpp:117 强制失败] 数据。DefaultCPUAllocator：内存不足：您尝试分配 96153108480 字节。"
    )
    assert (translated.pool, translated.requested_bytes) == (Pool.RAM, 96153108480)
    ggml = _event(
        "ggml_cuda_host_malloc: failed to allocate 16607.35 MiB of pinned memory: out of memory"
    )
    assert (ggml.pool, ggml.recovered, dict(ggml.extra).get("host_memory")) == (
        Pool.RAM,
        True,
        "pinned",
    )
    assert ggml.requested_bytes == round(Decimal("16607.35") * MiB)
    tf_rocm = _event(
        "2023-11-01 16:19:17.812101: E tensorflow/compiler/xla/stream_executor/rocm/rocm_driver.cc:606] failed to allocate 127.99TiB (140729850295296 bytes) from device: HIP_ERROR_OutOfMemory"
    )
    assert (tf_rocm.backend, tf_rocm.requested_bytes) == (Backend.ROCM, 140729850295296)
    numpy = _event(
        "Error Occured: unable to allocate 920. MiB for an array with shape (600020, 201) and data type complex64"
    )
    assert (numpy.pool, numpy.requested_bytes) == (Pool.RAM, 920 * MiB)
    (retyped,) = iter_findings(
        [
            "Tried to allocate 418.00 MiB",
            " (GPU 0; 6.00 GiB total capacity; ",
            " 3.01 GiB already allocated;",
            " 363.12 MiB free; ",
            " 3.82 GiB reserved in total by PyTorch) If reserved memory is >>",
        ]
    )
    assert (retyped.line_no, retyped.event.pool, retyped.event.free_bytes) == (
        1,
        Pool.GPU_FRAGMENTATION,
        round(Decimal("363.12") * MiB),
    )
    (dialog,) = iter_findings(
        [
            "Error occurred when executing LayerMask: BiRefNetUltra:",
            "",
            "[enforce fail at alloc_cpu.cpp:80] data. DefaultCPUAllocator: not enough memory: you tried to allocate 103079215104 bytes.",
        ]
    )
    assert dialog.event.node_type == "LayerMask: BiRefNetUltra"
    heading = _event("# VAEDecodeTiled Allocation on device - error message - can someone help ?")
    assert heading.node_type == "VAEDecodeTiled"


def test_round_nine_tune_shapes() -> None:
    """What round 9's tune part showed (each also a corpus case)."""
    masked = _event(
        "could not allocate tensor with 489484499xxxx bytes. there is not enogh gpu video memory avaible, 7900xt 12 gb"
    )
    assert (masked.backend, masked.requested_bytes) == (Backend.DIRECTML, None)
    sycl = _event("Native API failed. Native API returns: -6 (PI_ERROR_OUT_OF_HOST_MEMORY)")
    assert (sycl.pool, sycl.backend) == (Pool.RAM, Backend.CPU)
    (trt,) = iter_findings(
        [
            "[E] 1: [defaultAllocator.cpp::allocate::19] Error Code 1: Cuda Runtime (out of memory)",
            "[W] Requested amount of GPU memory (1180463648 bytes) could not be allocated. There may not be enough free memory for allocation to succeed.",
        ]
    )
    assert (trt.line_no, trt.event.requested_bytes) == (1, 1180463648)
    amdgpu = _event(
        "nov 06 06:01:01 Odin kernel: [drm:amdgpu_cs_ioctl [amdgpu]] *ERROR* Not enough memory for command submission!"
    )
    assert (amdgpu.pool, amdgpu.backend) == (Pool.GPU, Backend.ROCM)
    (hip,) = iter_findings(
        [
            "torch.AcceleratorError: CUDA error: out of memory",
            "Search for `hipErrorOutOfMemory' in https://rocm.docs.amd.com/ for more information.",
        ]
    )
    assert hip.event.backend is Backend.ROCM
    (wrapped,) = iter_findings(
        [
            "key messsage is Tried to allocate 13.20 GiB. GPU 0",
            "                         has a total capacity of 44.68 GiB of which 5.15 GiB is free. Of the allocated memory 38.96 GiB",
            "                         is allocated by PyTorch, and 78.92 MiB is reserved by PyTorch but unallocated.",
        ]
    )
    assert wrapped.event.allocated_bytes == round(Decimal("38.96") * GiB)
    typed = _event(
        "训练不了，进行预处理时报错 OSError: [WinError 1455] 页面文件太小，无法完成操作。"
    )
    assert (typed.pool, typed.exception_type) == (Pool.SWAP_PAGEFILE, "OSError")


@pytest.mark.parametrize(
    "text",
    [
        "当我在运行时，显示cuda out of memory。如何指定batchsize？",  # the user's typing in a CJK sentence
        "I use 8*a100 but I still met the error 'cuda out of memory'. Is it normal?",
        "cuda out of memory fooocus api",
        "OutOfMemoryError                          Traceback (most recent call last)",
    ],
    ids=["cjk-prose", "quoted-lowercase", "lowercase-line-with-words", "ipython-header"],
)
def test_a_users_lower_case_words_and_ipythons_header_are_no_failure(text: str) -> None:
    assert list(iter_findings([text])) == []


@pytest.mark.parametrize(
    "text",
    [
        "您好我这边一直显示CUDA out of memory，请问",
        "训练会出现CUDA out-of-memory的情况呢？",
        "4090显卡CUDA out of memory",
        "Cuda Out of Memory 관련 문의",
        "# ROCM HIP out of memory",
        "# CUDA out of memory",
        '[Bug]: CUDA out of memory on "odd" resolutions in high res fix',
        "[bug]: AMD HIP out of memory when generating more than one image",
        "8-card 4090 24G running open-sora-v2 CUDA out of memory",
        "CUDA out of memory while allocating 440mb despite having 22gb unutilized capacity",
        "HIP out of memory: running Pytorch with ROCm on Windows with over ~16GB of shared memory",
        '[Bug]: img2img throwing exception: "CUDA out of memory" even with batch count 1',
        'Always says "CUDA Out of Memory"',
        "there is a **HIP out of memory**, even if",
        "[Bug]: torch.OutOfMemoryError in KSampler",
        "# torch.OutOfMemoryError in KSampler Node During Sampling",
        "The last days Forge on Runpod always OutOfMemoryError:",
        "torch.cuda.OutOfMemoryError happened in the mirror of opensora 1.1",
        "the new version crashes during the Load FramePackModel step。torch.OutOfMemoryError",
        'it says "CUDA out of memory."',  # (the full stop inside the user's quotes)
        "[Bug]: CUDA out of memory",
        "**CUDA out of memory**",
        # a sentence longer than the lead read back, ending in the type
        "after the update every workflow I run with the big checkpoint fails the same way "
        "and I have tried lowering the resolution, the batch size and the steps, and still "
        "torch.OutOfMemoryError",
    ],
)
def test_the_errors_name_in_the_users_words_is_no_failure(text: str) -> None:
    """A title or a sentence that names the error (torch's device words with no exception type
    before them and no full stop or figures after them, or torch's type with the sentence going
    on around it) summarises a failure; the corpus's rounds 8-17 label it the user's
    words, and rounds 3-7 were relabelled to the same reading."""
    assert has_needle(text)
    assert list(iter_findings([text])) == []


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("# CUDA out of memory.", "cuda-oom"),  # the message's own full stop
        ("(에러) CUDA out of memory. 문의 드립니다.", "cuda-oom"),
        ("# Finish task with error: CUDA out of memory", "cuda-oom"),  # Fooocus-API's line
        ("RuntimeError - CUDA out of memory", "cuda-oom"),  # the type, retyped with a dash
        (
            "CUDA out of memory, See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
            "cuda-oom",
        ),
        ("[ERROR] CUDA out of memory", "cuda-oom"),  # the words alone on a logged line
        ("HIP out of memory", "hip-oom"),
        ("# CUDA out of memory Tried to allocate 20.00 MiB", "cuda-oom"),
        ("一直报torch.cuda.OutOfMemoryError: CUDA out of memory", "cuda-oom"),
        (
            "generating image for xyz plot: OutOfMemoryError",
            "oom-type-named",
        ),  # A1111's errors.display
        ("# torch.OutOfMemoryError", "oom-type-named"),
        # a task's colon after a lead longer than the span read back
        (
            "generating image " + "for a very long prompt " * 9 + "on xyz plot: OutOfMemoryError",
            "oom-type-named",
        ),
        # the words ending a logged line, after its lead: a timestamp, a level, a rank, a field
        ("2024-01-01 12:00:00 [ERROR] CUDA out of memory", "cuda-oom"),
        ("2024-01-01 12:00:00.123 | ERROR    | app:run:42 - CUDA out of memory", "cuda-oom"),
        ("E0102 10:00:00.123 1234 foo.cc:12] CUDA out of memory", "cuda-oom"),
        ("[rank0]: CUDA out of memory", "cuda-oom"),
        ("Error:CUDA out of memory", "cuda-oom"),
        ("- **Exception Message:** CUDA out of memory", "cuda-oom"),
    ],
)
def test_the_errors_printed_words_are_still_read_in_a_title_or_sentence(
    text: str, rule: str
) -> None:
    assert [f.event.rule for f in iter_findings([text])] == [rule]


@pytest.mark.parametrize(
    "text",
    [
        "cuda out of memory. tried to allocate 20.00 mib (gpu 0; 4.00 gib total capacity;",
    ],
    ids=["lowercased-message"],
)
def test_lower_cased_messages_and_copied_names_are_still_read(text: str) -> None:
    assert [f.event.pool for f in iter_findings([text])] == [Pool.GPU]


def test_round_nine_spent_shapes() -> None:
    """What round 9's held part showed once it was spent (each also a corpus case)."""
    metal = _event(
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)"
    )
    assert (metal.pool, metal.backend, metal.exception_type) == (
        Pool.UNIFIED_MPS,
        Backend.MPS,
        "std::runtime_error",
    )
    hip_tf = _event("mnist.py: failed to allocate 8.00G from device: hipError_t(1002)")
    assert (hip_tf.backend, hip_tf.requested_bytes) == (Backend.ROCM, 8 * GiB)
    (split,) = iter_findings(
        [
            "torch.cuda.OutOfMemoryError:",
            "CUDA out of memory. Tried to allocate 12.00 GiB (GPU 1; 39.41 GiB total capacity; 29.30 GiB already allocated; 7.67 GiB free; 29.98 GiB reserved in total by PyTorch)",
        ]
    )
    assert (split.line_no, split.event.exception_type, split.event.gpu_index) == (
        2,
        "torch.cuda.OutOfMemoryError",
        1,
    )
    dml = list(
        iter_findings(
            [
                "2021-06-28 09:24:26.758346: W tensorflow/core/framework/op_kernel.cc:1651] OP_REQUIRES failed at dml_kernel_context.cc:167 : Resource exhausted: OOM when allocating tensor with shape[1,64,150,150] and type float on /job:localhost/replica:0/task:0/device:DML:0 by allocator DmlAllocator",
                "2 root error(s) found.",
                "  (0) Resource exhausted: OOM when allocating tensor with shape[1,64,150,150] and type float on /job:localhost/replica:0/task:0/device:DML:0 by allocator DmlAllocator",
            ]
        )
    )
    assert [(f.event.backend, f.event.count) for f in dml] == [(Backend.DIRECTML, 2)]
    toast = _event("# CLIPTextEncode torch.OutOfMemoryError: Allocation on device")
    assert toast.node_type == "CLIPTextEncode"
    assert _event("Got torch.OutOfMemoryError: Allocation on device").node_type is None
    glued = _event(
        'File "parameter.py", line 68, in __deepcopy__torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.00MiB.'
    )
    assert glued.exception_type == "torch.OutOfMemoryError"


def test_round_ten_tune_shapes() -> None:
    """What round 10's tune part showed (each also a corpus case)."""
    assert _event("`Killed: 9`").pool is Pool.KILLED_BY_OS
    numpy = _event(
        '"numpy.core._exceptions._ArrayMemoryError: Unable to allocate 41.2 GB for array with form (172928, 32001) and data type float64"'
    )
    assert numpy.requested_bytes == round(Decimal("41.2") * GiB)
    paddle = list(
        iter_findings(
            [
                "RuntimeError: ResourceExhaustedError:",
                "",
                "Out of memory error on GPU 0. Cannot allocate 98.000244MB memory on GPU 0, 6.000000GB memory has been allocated and available memory is only 0.000000B.",
            ]
        )
    )
    assert [(f.line_no, f.event.exception_type) for f in paddle] == [(3, "RuntimeError")]
    event = paddle[0].event
    assert (event.gpu_index, event.allocated_bytes, event.free_bytes) == (0, 6 * GiB, 0)
    assert event.requested_bytes == round(Decimal("98.000244") * MiB)
    no_allocated = _event(
        "Out of memory error on GPU 0. Cannot allocate 25.002197MB memory on GPU 0, available memory is only 15.187500MB."
    )
    assert (no_allocated.allocated_bytes, no_allocated.free_bytes) == (
        None,
        round(Decimal("15.1875") * MiB),
    )
    cut = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a total capacity of 39.39 GiB of which 31.94 MiB is free. Of the allocated memory 37.21 GiB is allo"
    )
    assert cut.allocated_bytes == round(Decimal("37.21") * GiB)
    tt = _event(
        "Out of Memory: Not enough space to allocate 23085449216 B DRAM buffer across 12 banks"
    )
    assert (tt.pool, tt.requested_bytes) == (Pool.GPU, 23085449216)
    (fairseq,) = iter_findings(
        [
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 10.76 GiB total capacity; 9.51 GiB already allocated; 5.69 MiB free; 9.84 GiB reserved in total by PyTorch)",
            "2020-11-05 19:30:05 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass",
        ]
    )
    assert (fairseq.line_no, fairseq.event.gpu_index) == (1, 1)
    assert (
        _event(
            "2020-11-05 19:30:05 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass"
        ).pool
        is Pool.GPU
    )


def test_round_ten_spent_shapes() -> None:
    """What round 10's held part showed once it was spent (each also a corpus case)."""
    (wrapped,) = iter_findings(
        [
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB (GPU 0; 39.56",
            "GiB total capacity; 37.88 GiB already allocated; 32.56 MiB free; 38.21 GiB ",
            "reserved in total by PyTorch) If reserved memory is >> allocated memory try ",
            "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory ",
            "Management and PYTORCH_CUDA_ALLOC_CONF",
        ]
    )
    assert (wrapped.event.pool, wrapped.event.total_bytes) == (
        Pool.GPU_FRAGMENTATION,
        round(Decimal("39.56") * GiB),
    )
    # a soft OOM repeated line after line is no hard-wrapped message: each line stays a record
    soft = ["out of memory error, emptying cache and trying again"] * 3
    assert [f.event.count for f in iter_findings(soft)] == [3]
    paddle = _event("Out of memory error on GPU 0. Cannot allocate 7.781267GB memory on GPU 0")
    assert (paddle.pool, paddle.free_bytes) == (Pool.GPU, None)
    mmap = _event("OSError: Memory mapping file failed: Cannot allocate memory")
    assert (mmap.pool, mmap.rule) == (Pool.RAM, "mmap-enomem")
    tail = _event('# 4-bit: "Allocator: not enough memory: you tried to allocate 35389440 bytes."')
    assert (tail.pool, tail.requested_bytes) == (Pool.RAM, 35389440)
    (bold,) = iter_findings(["```", "**Killed**", "```"])
    assert bold.event.pool is Pool.KILLED_BY_OS
    winerror8 = _event(
        "OSError: [WinError 8] Not enough memory resources are available to process this command"
    )
    assert (winerror8.pool, winerror8.backend) == (Pool.RAM, Backend.CPU)
    assert not list(iter_findings(['        "OOMKilled": false,']))
    wasm = _event("Cannot enlarge memory arrays to size 19537920 bytes (OOM). Either (1) compile")
    assert (wasm.pool, wasm.requested_bytes) == (Pool.RAM, 19537920)
    tm = _event("RuntimeError: [TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/x.cu:32")
    assert tm.backend is Backend.CUDA


def test_round_eleven_tune_shapes() -> None:
    """What round 11's tune part showed (each also a corpus case)."""
    space = _event('The error message is "Runtime error Memory limit exceeded (16Gi)".')
    assert (space.pool, space.total_bytes) == (Pool.KILLED_BY_OS, 16 * GiB)
    older = _event("CPU Memory limit exceeded (16GB)")
    assert (older.pool, older.total_bytes) == (Pool.KILLED_BY_OS, 16 * GiB)
    metal = _event(
        "# Bug: ggml_backend_metal_buffer_type_alloc_buffer: error: failed to allocate buffer"
    )
    assert (metal.pool, metal.backend) == (Pool.UNIFIED_MPS, Backend.MPS)
    kills = list(
        iter_findings(
            [
                "[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, anon-rss:12918388kB, file-rss:68668kB, shmem-rss:53352kB, UID:1000 pgtables:49772kB oom_score_adj:0",
                "[441281.626336] oom_reaper: reaped process 698405 (python), now anon-rss:0kB, file-rss:68664kB, shmem-rss:53172kB",
                "[448212.100902] sunloginclient invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            ]
        )
    )
    # a finished kill, then the kernel's next OOM: two failures, not one
    assert [(f.line_no, f.event.killed_pid) for f in kills] == [(1, 698405), (3, None)]


def test_round_eleven_spent_shapes() -> None:
    """What round 11's held part showed once it was spent (each also a corpus case)."""
    zh = list(
        iter_findings(
            [
                "Loading checkpoint shards:   0%|                             |0/2 [00:00<?, ?it/s]",
                "已杀死",
            ]
        )
    )
    assert [(f.line_no, f.event.pool) for f in zh] == [(2, Pool.KILLED_BY_OS)]
    glued = _event("[>>>>>>>>>> ] 1022/5000, 1.5 task/s, elapsed: 673s, ETA: 2621s已杀死")
    assert glued.rule == "shell-killed"
    assert not list(iter_findings(["他说进程已杀死了吗？"]))  # the word inside a sentence
    (wrapped,) = iter_findings(
        [
            "RuntimeError: [enforce fail at",
            r"C:\actions-runner\_work\pytorch\pytorch\builder\windows\pytorch\c10\core\impl\alloc_cpu.cpp:72] data.",
            "DefaultCPUAllocator: not enough memory: you tried to allocate 1069285376 bytes.",
        ]
    )
    assert (wrapped.line_no, wrapped.event.requested_bytes) == (1, 1069285376)
    # a title and a body each with the allocator's message stay two observations
    pair = list(
        iter_findings(
            [
                "DefaultCPUAllocator: not enough memory: you tried to allocate xxxx BYTES",
                "",
                "DefaultCPUAllocator: not enough memory: you tried to allocate 5077901088 bytes.",
            ]
        )
    )
    assert [f.line_no for f in pair] == [1, 3]
    assert not list(
        iter_findings(
            [
                "cog.server.exceptions.FatalWorkerException: Prediction failed for an unknown reason. It might have run out of memory? (exitcode 2)"
            ]
        )
    )
    assert _event('It says "Memory limit exceeded".').pool is Pool.KILLED_BY_OS
    swift = _event(
        '**Fatal error: MetalExecutionError: Error Domain=MTLCommandBufferErrorDomain Code=8 "Insufficient Memory (IOAF code 8)"'
    )
    assert (swift.pool, swift.exception_type) == (Pool.UNIFIED_MPS, "MetalExecutionError")
    masked = _event("# BUG MPS RuntimeError: Invalid buffer size: ### GiB")
    assert (masked.pool, masked.requested_bytes) == (Pool.UNIFIED_MPS, None)
    jetsam = _event(
        "kernel: memorystatus: killing largest compressed process python3.11 [5844] 43350 MB"
    )
    assert (jetsam.pool, jetsam.killer, jetsam.killed_pid) == (Pool.KILLED_BY_OS, "kernel", 5844)
    mlx = _event(
        "RuntimeError: [metal::malloc] Attempting to allocate 48736917632 bytes which is greater than the maximum allowed buffer size of 30150672384 bytes."
    )
    assert (mlx.pool, mlx.requested_bytes) == (Pool.UNIFIED_MPS, 48736917632)


def test_a_whole_message_then_another_is_no_hard_wrap() -> None:
    """The fuzz test's counterexample: a message ending 'PYTORCH_CUDA_ALLOC_CONF', then a line
    that starts another message with a stray lower-case letter. Two failures, and the byte
    scanner and the line assembly see the same two (the wrap join once merged them by lines)."""
    lines = [
        "",
        "\ttorch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        "aRuntimeError: CUDA out of memory. Tried to allocate 190.00 MiB (GPU 0; 15.89 GiB total capacity; 14.43 GiB already allocated; 13.88 MiB free; 14.88 GiB reserved in total by PyTorch) If reserved memory is >> a",
    ]
    by_lines = [(f.line_no, f.event.requested_bytes) for f in iter_findings(lines)]
    by_bytes = [
        (f.line_no, f.event.requested_bytes)
        for f in scan_stream(io.BytesIO("\n".join(lines).encode()))
    ]
    assert by_lines == by_bytes == [(2, round(Decimal("1.63") * GiB)), (3, 190 * MiB)]


def test_round_12_tune_shapes() -> None:
    """Round 12's tune part: a MemoryError glued to the end of a Chinese title, the tail of
    MPS's watermark hint left after the user cut the message, and a toast retyped as
    paragraphs whose node line ends in a colon. Each with the near-miss that must stay as it
    was."""
    glued = _event("# 一直报错MemoryError: bad allocation")
    assert (glued.pool, glued.exception_type) == (Pool.RAM, "MemoryError")
    assert not list(iter_findings(["# MemoryError handling"]))
    tail = _event(
        "[generate_music] Generation failed. Music generation failed: .....disable upper limit for memory allocations (may cause system failure)."
    )
    assert (tail.pool, tail.backend) == (Pool.UNIFIED_MPS, Backend.MPS)
    # the phrase inside someone's sentence, with no cut before it, is no failure
    assert not list(
        iter_findings(
            ["the ratio can disable upper limit for memory allocations (may cause system failure)"]
        )
    )
    toast = list(iter_findings(["How do I fix this?", "", "KSampler:", "", "Allocation on device"]))
    assert [(f.line_no, f.event.node_type) for f in toast] == [(5, "KSampler")]
    # a heading word with a colon names no node
    heading = list(iter_findings(["Output:", "", "Allocation on device"]))
    assert [(f.line_no, f.event.node_type) for f in heading] == [(3, None)]


def test_round_12_held_shapes_once_spent() -> None:
    """Round 12's held misses, fixed once it was spent: Windows' paging-file text with no error
    number, ComfyUI's 'Allocation on device' before Rich's right-hand source column, a figure
    whose unit the paste cut ('20.58 Gi'), the old message wrapped between 'already' and
    'allocated', and ACE-Step's own VRAM pre-flight refusal. Each with its near-miss."""
    page = _event("The paging file is too small for this operation to complete")
    assert (page.pool, page.backend) == (Pool.SWAP_PAGEFILE, Backend.CPU)
    assert not list(iter_findings(["Increase the size of the paging file if ComfyUI crashes."]))
    rich = _event(
        "Epoch 1/134 - steps:   0%|      | 0/1600 [00:00<?, ?it/s]2025-07-08 10:39:40 ERROR    !!! Exception during processing !!! Allocation on device                   execution.py:430"
    )
    assert rich.pool is Pool.GPU
    cut = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 108.00 MiB. GPU 0 has a total capacity of 23.51 GiB of which 98.31 MiB is free. Including non-PyTorch memory, this process has 20.99 GiB memory in use. Of the allocated memory 20.58 Gi"
    )
    assert cut.allocated_bytes == round(Decimal("20.58") * GiB)
    wrapped = list(
        iter_findings(
            [
                "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total capacity; 5.24 GiB already",
                "allocated; 0 bytes free; 5.29 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting",
                "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
            ]
        )
    )
    assert len(wrapped) == 1
    event = wrapped[0].event
    assert (event.pool, event.allocated_bytes) == (
        Pool.GPU_FRAGMENTATION,
        round(Decimal("5.24") * GiB),
    )
    lines = [
        "2026-03-02 18:26:46.698 | WARNING  | acestep.core.generation.handler.generate_music:_vram_preflight_check:78 - [generate_music] VRAM pre-flight failed: Insufficient free VRAM: need ~1.1 GB, only 0.0 GB available. Reduce batch size (currently 1) or audio duration (currently 128s).",
        "!!! Exception during processing !!! Generation failed: Insufficient free VRAM: need ~1.1 GB, only 0.0 GB available. Reduce batch size (currently 1) or audio duration (currently 128s).",
    ]
    found = list(iter_findings(lines))
    assert [f.line_no for f in found] == [2]  # the warning before the raise is no failure
    ace = found[0].event
    assert (ace.pool, ace.requested_bytes, ace.free_bytes) == (
        Pool.GPU,
        round(Decimal("1.1") * GiB),
        0,
    )
    assert dict(ace.extra)["node_pack"] == "ACE-Step"


def test_round_13_tune_shapes() -> None:
    """Round 13's tune part: one failure reported again by the layer that caught it, Colab's
    RAM dialog, Slurm's older step wording, a type glued to the user's words, numpy's message
    lower-cased, and Vulkan's device OOM. Each with the near-miss that must stay as it was."""
    layered = list(
        iter_findings(
            [
                "  0%|          | 0/6 [00:00<?, ?it/s]Error during model prediction: Allocation on device",
                "  0%|          | 0/6 [00:04<?, ?it/s]",
                "Error during sampling: Allocation on device",
                "!!! Exception during processing !!! Allocation on device",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in layered] == [(1, 1)]
    # the same line again, its timestamp changed, is a repeat: counted
    storm = list(
        iter_findings(
            [
                "2019-06-14 11:50:14.027064: E tensorflow/stream_executor/cuda/cuda_blas.cc:510] failed to create cublas handle: CUBLAS_STATUS_ALLOC_FAILED",
                "2019-06-14 11:50:14.028614: E tensorflow/stream_executor/cuda/cuda_blas.cc:510] failed to create cublas handle: CUBLAS_STATUS_ALLOC_FAILED",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in storm] == [(1, 2)]
    colab = list(
        iter_findings(
            [
                "[Colab] Your session crashed after using all available RAM",
                "",
                'It stopped working, saying "Your session crashed after using all available RAM".',
            ]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.count) for f in colab] == [(1, Pool.KILLED_BY_OS, 2)]
    slurm = _event("slurmstepd: error: Detected 2 oom-kill event(s) in step 3756240.batch cgroup.")
    assert (slurm.pool, slurm.killer) == (Pool.KILLED_BY_OS, "kernel")
    glued = _event(
        "A bad error i could not solveMemoryError: Unable to allocate 12.5 GiB for an array with shape (87000, 227, 227, 3) and data type uint8"
    )
    assert (glued.pool, glued.exception_type, glued.requested_bytes) == (
        Pool.RAM,
        "MemoryError",
        round(Decimal("12.5") * GiB),
    )
    assert (
        _event(
            "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 1.00 GiB for an array with shape (1,) and data type uint8"
        ).exception_type
        == "numpy.core._exceptions._ArrayMemoryError"
    )
    lowered = _event(
        "# error occurred when executing vhs_videocombine: unable to allocate 10.0 gib for an array with shape (2433, 720, 512, 3) and data type float32"
    )
    assert (lowered.pool, lowered.requested_bytes) == (Pool.RAM, 10 * GiB)
    vulkan = _event(
        "ggml_vulkan: Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory"
    )
    assert (vulkan.pool, vulkan.backend) == (Pool.GPU, Backend.UNKNOWN)
    assert _event("vkAllocateMemory failed: VK_ERROR_OUT_OF_DEVICE_MEMORY").pool is Pool.GPU
    assert not list(iter_findings(["if (result == vk::Result::eErrorOutOfHostMemory) retry();"]))


def test_round_13_held_shapes_once_spent() -> None:
    """Round 13's held misses, fixed once it was spent: the next record's timestamp glued after
    'Allocation on device', torch 1.x's message wrapped after '(GPU 0;', a C++ abort of a CUDA
    OOM in a training loop (the device's, not pinning), the kubelet's eviction, and Windows'
    zh-CN paging-file text without its number. Each with its near-miss."""
    glued = _event(
        "2025-03-21T16:15:34.544283 - Error during inference: Allocation on device 2025-03-21T16:15:34.544348 - "
    )
    assert glued.pool is Pool.GPU
    assert not list(iter_findings(["Allocation on device memory is lazy in this mode"]))
    wrapped = list(
        iter_findings(
            [
                "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0;",
                "6.00 GiB total capacity; 4.22 GiB already allocated; 4.91 MiB free; 85.24 MiB cached)",
            ]
        )
    )
    assert [(f.line_no, f.event.total_bytes) for f in wrapped] == [(1, 6 * GiB)]
    abort = [
        "ep 1 train, step 98, loss 8.459, mem_usage:cuda:2 8.8GB, 0.834 sec/step",
        "terminate called after throwing an instance of 'c10::Error'",
        "  what():  CUDA error: out of memory",
    ]
    found = list(iter_findings(abort))
    assert [(f.line_no, f.event.pool) for f in found] == [(2, Pool.GPU)]
    # the same abort while ComfyUI moves models is the pinning path's (host RAM)
    moving = ["Requested to load WAN21", "loaded partially; 9000.00 MB usable", *abort[1:]]
    assert next(iter_findings(moving)).event.pool is Pool.RAM
    evicted = _event("`The node was low on resource: memory.`")
    assert evicted.pool is Pool.KILLED_BY_OS
    page = _event(
        "我在运行main.py文件时，显示“页面文件太小，无法完成操作”，请问这是我电脑配置的原因吗？"
    )
    assert page.pool is Pool.SWAP_PAGEFILE


def test_round_14_tune_shapes() -> None:
    """Round 14's tune part: BuildKit's per-line step prefix, a compiler child killed while
    building an extension, gcc's own allocation failure, tinygrad's CUDA error, the paging
    file as an HRESULT, a type glued to CJK text, and TensorFlow's retyped OOM with its
    device. Each with the near-miss that must stay as it was."""
    build = list(iter_findings(["#10 4604.5 nvcc -c layernorm_kernels.cu", "#10 4604.5   Killed"]))
    assert [(f.line_no, f.event.pool) for f in build] == [(2, Pool.KILLED_BY_OS)]
    assert not list(iter_findings(["# 10 things Killed my build speed"]))
    for text in (
        "c++: internal compiler error: Killed (program cc1plus)",
        "g++: fatal error: Killed signal terminated program cc1plus",
    ):
        assert _event(text).pool is Pool.KILLED_BY_OS
    assert _event("virtual memory exhausted: Cannot allocate memory").pool is Pool.RAM
    tiny = _event(
        "Error processing tensor for shard Shard(model_id='m', start_layer=0, end_layer=15, n_layers=32): CUDA Error 2, out of memory"
    )
    assert (tiny.pool, tiny.backend) == (Pool.GPU, Backend.CUDA)
    hresult = _event(
        "System.Runtime.InteropServices.COMException: Файл подкачки слишком мал для завершения операции. (0x800705AF)"
    )
    assert (hresult.pool, hresult.exception_type) == (
        Pool.SWAP_PAGEFILE,
        "System.Runtime.InteropServices.COMException",
    )
    glued = _event(
        '读取unlabel数据时出现OSError: [WinError 1455] 页面文件太小，无法完成操作。 Error loading "caffe2_detectron_ops_gpu.dll"'
    )
    assert glued.exception_type == "OSError"
    tf = _event(
        "`ResourceExhaustedError : OOM when allocating tensor with shape[148, 48, 1024] and type float on/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc`"
    )
    assert (tf.pool, tf.backend, tf.exception_type, tf.gpu_index) == (
        Pool.GPU,
        Backend.UNKNOWN,  # TensorFlow's GPU device: CUDA's or ROCm's, the text names neither
        "ResourceExhaustedError",
        0,
    )
    cudnn = _event(
        "W tensorflow/core/framework/op_kernel.cc:1753] OP_REQUIRES failed at cudnn_pooling_gpu.cc:140 : Resource exhausted: OOM when allocating tensor with shape[1098,16,128,128,3]"
    )
    assert cudnn.backend is Backend.CUDA


def test_round_14_held_shapes_once_spent() -> None:
    """Round 14's held misses, fixed once it was spent: the linker killed in a build, Go's fork
    ENOMEM, BuildKit's memory-limit report, C++'s uncaught std::bad_alloc, torch's first
    sentence then Korean, TensorFlow's OOM line alone and BFC's failing allocation (not its
    'this is not a failure' warning), and a type retyped with a dash."""
    assert _event("collect2: ld terminated with signal 9 [Killed]").pool is Pool.KILLED_BY_OS
    assert _event("fork/exec /usr/bin/gcc: cannot allocate memory").pool is Pool.RAM
    buildkit = _event(
        'ERROR: failed to solve: ResourceExhausted: process "/bin/sh -c python3 setup.py bdist_wheel" did not complete successfully: cannot allocate memory'
    )
    assert buildkit.pool is Pool.KILLED_BY_OS
    assert not list(
        iter_findings(
            [
                'ERROR: failed to solve: process "/bin/sh -c make" did not complete successfully: exit code: 2'
            ]
        )
    )
    bad = _event(
        "[Bug] OOM terminate called after throwing an instance of 'std::bad_alloc' on rtx 5090"
    )
    assert (bad.pool, bad.exception_type) == (Pool.RAM, "std::bad_alloc")
    korean = _event("(에러) CUDA out of memory. 문의 드립니다.")
    assert (korean.pool, korean.backend) == (Pool.GPU, Backend.CUDA)
    tf2 = _event(
        "OOM when allocating tensor with shape[128,16,298,298] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"
    )
    assert (tf2.pool, tf2.gpu_index) == (Pool.GPU, 0)
    bfc = list(
        iter_findings(
            [
                "2021-01-11 15:12:37.015043: W bfc_allocator.cc:219] Allocator (GPU_0_bfc) ran out of memory trying to allocate 299.63MiB. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.",
                "2021-01-11 15:12:47.727518: W bfc_allocator.cc:275] Allocator (GPU_0_bfc) ran out of memory trying to allocate 144.0KiB.  Current allocation summary follows.",
            ]
        )
    )
    assert [(f.line_no, f.event.requested_bytes, f.event.gpu_index) for f in bfc] == [
        (2, 144 * KiB, 0)
    ]
    dash = _event("RuntimeError - CUDA out of memory")
    assert dash.exception_type == "RuntimeError"


def test_round_15_tune_shapes() -> None:
    """Round 15's tune part: OpenVINO's GPU plugin, onnxruntime's
    DirectML provider, ggml_vulkan and C++'s bad_alloc told over two lines, numpy's EiB, and
    an app's log line relaying the exception it caught. Each with its near-miss."""
    ov = _event("[GPU] CL_OUT_OF_RESOURCES exception")
    assert (ov.pool, ov.backend) == (Pool.GPU, Backend.XPU)
    assert not list(iter_findings(["after several turns it fails with CL_OUT_OF_RESOURCES."]))
    dml = _event(
        "onnxruntime\\core\\providers\\dml\\DmlExecutionProvider\\src\\MLOperatorAuthorImpl.cpp(1978)\\onnxruntime_pybind11_state.pyd!00007FFF4B2D3E4D: (caller: 00007FFF4B2D4C4B) Exception(3) tid(1c4c) 8007000E Not enough memory resources are available to complete this operation."
    )
    assert (dml.pool, dml.backend) == (Pool.GPU, Backend.DIRECTML)
    assert (
        _event(
            "8007000E Not enough memory resources are available to complete this operation."
        ).pool
        is Pool.RAM
    )
    vulkan = list(
        iter_findings(
            [
                "ggml_vulkan: Device memory allocation of size 369827840 failed.",
                "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
            ]
        )
    )
    assert [(f.line_no, f.event.requested_bytes) for f in vulkan] == [(1, 369827840)]
    bad = list(
        iter_findings(
            [
                "terminate called after throwing an instance of 'std::bad_alloc'",
                "  what():  std::bad_alloc",
                "Aborted",
            ]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.count) for f in bad] == [(1, Pool.RAM, 1)]
    eib = _event(
        "MemoryError: Unable to allocate 1.17 EiB for an array with shape (480000, 480001, 730434) and data type float64"
    )
    assert eib.requested_bytes == round(Decimal("1.17") * 1024**6)
    mps = "MPS backend out of memory (MPS allocated: 45.18 GiB, other allocations: 719.81 MiB, max allowed: 45.90 GiB). Tried to allocate 23.44 MiB on private pool."
    relay = list(
        iter_findings(
            [
                f"RuntimeError: {mps}",
                f"2026-02-07 19:33:57.629 | INFO     | acestep.training:start_training:642 - [16s] Step 0: ❌ Training failed: {mps}",
            ]
        )
    )
    assert [(f.line_no, f.event.count, f.event.exception_type) for f in relay] == [
        (1, 1, "RuntimeError")
    ]


def test_round_15_held_shapes_once_spent() -> None:
    """Round 15's held part, read when it was spent: ggml's refused buffers (one failure with
    the line before them), vLLM's KV-cache refusal (not its raise line's source), oneMKL on
    the host, OpenVINO's 'out of GPU resources', comfy-aimdo's VBAR OOM, the NVIDIA
    toolchain's fatal allocation, ACE-Step's warning then raise, old earlyoom and the old
    kernel's second victim. Each with its near-miss."""
    chain = list(
        iter_findings(
            [
                "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9866.00 MiB on device 1: cudaMalloc failed: out of memory",
                "ggml_gallocr_reserve_n: failed to allocate CUDA1 buffer of size 10345253120",
                "llama_kv_cache_update_impl: failed to allocate compute buffers",
            ]
        )
    )
    assert [(f.line_no, f.event.count, f.event.requested_bytes) for f in chain] == [
        (1, 1, round(Decimal("9866.00") * 1024**2))
    ]
    glued = list(
        iter_findings(
            [
                "- Populated Kokoro IPA: 65123 entriesggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 6058153760",
                "- ggml_gallocr_reserve_n: failed to allocate CPU buffer of size 6058153760",
            ]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.requested_bytes) for f in glued] == [
        (1, Pool.RAM, 6058153760)
    ]
    rocm = _event("error loading model: unable to allocate ROCm0 buffer")
    assert (rocm.pool, rocm.backend) == (Pool.GPU, Backend.ROCM)
    assert _event("GGML_ASSERT(ctx->mem_buffer != NULL) failed").pool is Pool.RAM
    assert not list(
        iter_findings(["llama_kv_cache_init:      CUDA0 KV buffer size =   379.23 MiB"])
    )
    vllm = list(
        iter_findings(
            [
                '    raise ValueError("No available memory for the cache blocks. "',
                "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
            ]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.exception_type) for f in vllm] == [
        (2, Pool.GPU, "ValueError")
    ]
    mkl = _event("oneapi::mkl::oneapi::mkl::blas::gemm: cannot allocate memory on host")
    assert (mkl.pool, mkl.backend) == (Pool.RAM, Backend.CPU)
    ov = _event("[GPU] out of GPU resources")
    assert (ov.pool, ov.backend) == (Pool.GPU, Backend.XPU)
    vbar = _event("MemoryError: VBAR OOM")
    assert (vbar.pool, vbar.backend) == (Pool.GPU, Backend.CUDA)
    # (its address-space reservation failing is no OOM: round 27's labels, spent)
    assert not list(iter_findings(["MemoryError: VBAR allocation failed"]))
    fatal = list(
        iter_findings(
            ["# fatal : Memory allocation failure", "", "fatal   : Memory allocation failure"]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.count) for f in fatal] == [(1, Pool.RAM, 2)]
    assert not list(iter_findings(["the fatal memory allocation failure happens on decode"]))
    ace = "Insufficient free VRAM: need ~1.1 GB, only 0.0 GB available. Reduce batch size (currently 1)."
    warned = f"2026-03-02 18:26:46.698 | WARNING  | acestep.core.generation.handler.generate_music:_vram_preflight_check:78 - [generate_music] VRAM pre-flight failed: {ace}"
    alone = list(iter_findings([warned]))
    assert [(f.line_no, f.event.pool) for f in alone] == [(1, Pool.GPU)]
    raised = list(
        iter_findings([warned, f"!!! Exception during processing !!! Generation failed: {ace}"])
    )
    assert [(f.line_no, f.event.count) for f in raised] == [(2, 1)]
    early = _event('sending SIGTERM to process 12006 "python3": badness 209, VmRSS 2891 MiB')
    assert (early.killed_pid, early.killer) == (12006, "earlyoom")
    kernel = list(
        iter_findings(
            [
                "[Thu Mar 14 01:57:54 2019] Out of memory: Kill process 89746 (python) score 1031 or sacrifice child",
                "[Thu Mar 14 01:57:54 2019] Killed process 89879 (python) total-vm:146328kB, anon-rss:0kB, file-rss:1824kB, shmem-rss:0kB",
                "[Thu Mar 14 01:57:55 2019] Out of memory: Kill process 89746 (python) score 1031 or sacrifice child",
                "[Thu Mar 14 01:57:55 2019] Killed process 89746 (python) total-vm:118026216kB, anon-rss:109819332kB, file-rss:3324kB, shmem-rss:0kB",
            ]
        )
    )
    assert [(f.line_no, f.event.killed_pid) for f in kernel] == [(1, 89879), (3, 89746)]
    oomd = _event(
        "avril 16 21:08:50 systemd-oomd[93234]: Killed /user.slice/user-1000.slice/app.slice/tmux"
    )
    assert (oomd.pool, oomd.killer) == (Pool.KILLED_BY_OS, "systemd-oomd")
    frag = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 14.74 GiB of which 38.12 MiB is free. Of the allocated memory 14.36 GiB is allocated by PyTorch, and 217.26 MiB is reserve"
    )
    assert frag.pool is Pool.GPU_FRAGMENTATION


def test_round_16_tune_shapes() -> None:
    """Round 16's tune part: the toast glued to the user's words (a full-width colon, a comma),
    ncnn's vkAllocateMemory storm, a title that copies the body's message, Windows' paging-file
    text after a .NET type or a tool's tag, V8's heap limit, onnxruntime's GPU=N, NCCL's own
    CUDA check, and a log level on its own line that is no node. Each with its near-miss."""
    assert _event("# Error message\uff1aAllocation on device").pool is Pool.GPU
    glued = list(
        iter_findings(
            [
                "# Allocation on device, this issue has not occurred in previous versions.",
                "",
                "Allocation on device, this issue has not occurred in previous versions.",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in glued] == [(1, 2)]
    assert not list(iter_findings(["the Allocation on device, as I understand it, is slow"]))
    storm = list(iter_findings(["vkAllocateMemory failed -2"] * 4))
    assert [(f.line_no, f.event.count, f.event.backend) for f in storm] == [(1, 4, Backend.UNKNOWN)]
    assert not list(iter_findings(["vkAllocateMemory failed -3"]))
    titled = list(
        iter_findings(
            [
                "# Allocation on device",
                "",
                "I got this error",
                "",
                "Error occurred when executing ProPainterInpaint:",
                "",
                "Allocation on device",
            ]
        )
    )
    assert [(f.line_no, f.event.count, f.event.node_type) for f in titled] == [
        (1, 2, "ProPainterInpaint")
    ]
    # a title without the body's figures shows other facts: two events
    two = list(
        iter_findings(
            [
                "# RuntimeError: CUDA out of memory",
                "",
                "RuntimeError: CUDA out of memory. Tried to allocate 494.00 MiB (GPU 0; 6.00 GiB total capacity; 3.72 GiB already allocated; 24.75 MiB free; 4.15 GiB reserved in total by PyTorch)",
            ]
        )
    )
    assert [f.line_no for f in two] == [1, 3]
    paging = "The paging file is too small for this operation to complete."
    for line in (
        f"System.ComponentModel.Win32Exception: {paging}",
        f"System.ComponentModel.Win32Exception (0x80004005): {paging}",
        f"[NBug] {paging}",
    ):
        assert _event(line).pool is Pool.SWAP_PAGEFILE, line
    assert not list(
        iter_findings([f"\u3068\u3001\u300cTraceback: {paging}\u300d\u3068\u3044\u3046"])
    )
    v8 = _event("FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory")
    assert (v8.pool, v8.rule) == (Pool.RAM, "v8-heap-oom")
    ort = _event(
        "onnxruntime::CudaCall CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=1 ; hostname=X ; file=cuda_execution_provider.cc ; line=168 ; expr=cublasCreate(&cublas_handle_);"
    )
    assert ort.gpu_index == 1
    nccl = _event(
        "ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'"
    )
    assert (nccl.pool, nccl.backend) == (Pool.GPU, Backend.CUDA)
    assert not list(
        iter_findings(["ng30903:3063028:3066152 [3] NCCL WARN Cuda failure 'unhandled cuda error'"])
    )
    level = list(
        iter_findings(
            [
                "ERROR",
                "",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes is free.",
            ]
        )
    )
    assert [f.event.node_type for f in level] == [None]


def test_round_16_held_shapes_once_spent() -> None:
    """Round 16's held part, read when it was spent: cudaMallocAsync's table with its head cut
    (and then printed whole), NCCL's older CUDA check, onnxruntime's CUDA failure 2, Render's
    memory limit, SwarmUI's overload warning, and a fence's language tag that is no node."""
    table = [
        "```Shell",
        "Requested               : 187.50 MiB",
        "Device limit            : 4.00 GiB",
        "Free (according to CUDA): 0 bytes",
        "PyTorch limit (set by user-supplied memory fraction)",
        "                        : 17179869184.00 GiB",
    ]
    cut = list(iter_findings(table))
    assert [(f.line_no, f.event.requested_bytes, f.event.node_type) for f in cut] == [
        (2, round(Decimal("187.50") * 1024**2), None)
    ]
    whole = [
        "Allocation on device 0 would exceed allowed memory. (out of memory)",
        "Currently allocated     : 3.16 GiB",
        *table[1:],
    ]
    twice = list(iter_findings([*table, *whole]))
    assert [(f.line_no, f.event.count, f.event.gpu_index) for f in twice] == [(2, 2, 0)]
    assert not list(iter_findings(["Requested : 2 GiB of the budget, the device limit is 8 GiB"]))
    nccl = _event("c460c041:101211:106353 [0] init.cu:218 WARN Cuda failure 'out of memory'")
    assert (nccl.pool, nccl.backend) == (Pool.GPU, Backend.CUDA)
    ort = _event(
        "[ONNXRuntimeError] : 1 : FAIL : onnxruntime::CudaCall CUDA failure 2: out of memory ; GPU=0 ; hostname=X ; expr=cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);"
    )
    assert (ort.pool, ort.gpu_index) == (Pool.GPU, 0)
    render = list(
        iter_findings(
            [
                "Instance failed: c2g7h",
                "Ran out of memory (used over 512MB) while running your code.",
            ]
        )
    )
    assert [(f.line_no, f.event.pool) for f in render] == [(1, Pool.KILLED_BY_OS)]
    swarm = _event(
        "15:56:37.001 [Warning] Your system memory usage exceeded 98.2% just before the backend process failed. This might indicate a memory overload."
    )
    assert (swarm.pool, dict(swarm.extra).get("node_pack")) == (Pool.RAM, "SwarmUI")


def test_round_17_tune_shapes() -> None:
    """Round 17's tune part: TensorRT's builder skipping a tactic it had no memory for
    (recovered, with its request), macOS's out-of-application-memory dialog, and the old
    kernel's two lines flattened onto one (each read). Each with its near-miss."""
    trt = _event(
        "[E] [virtualMemoryBuffer.cpp::nvinfer1::StdVirtualMemoryBufferImpl::resizePhysical::154] Error Code 2: OutOfMemory (Requested size was 4194304000 bytes.)"
    )
    assert (trt.pool, trt.recovered, trt.requested_bytes) == (Pool.GPU, True, 4194304000)
    assert not list(
        iter_findings(["[E] IBuilder::buildSerializedNetwork: Error Code 10: Internal Error"])
    )
    mac = _event('"Your system has run out of application memory. FreeShow = 81.89GB')
    assert (mac.pool, mac.backend) == (Pool.RAM, Backend.CPU)
    flat = _event(
        "如下 Out of memory: Kill process 5372 (mongod) score 130 or sacrifice child Killed process 5372 (mongod), UID 0, total-vm:2539052kB, anon-rss:2117096kB, file-rss:0kB"
    )
    assert (flat.killed_pid, flat.killer) == (5372, "kernel")


def test_round_17_held_shapes_once_spent() -> None:
    """Round 17's held part, spent: nohang's kill of its victim, detectron2's and mmdetection's
    retry of a call on the CPU after CUDA's OOM (recovered, the library from its logger), and
    the tiled-VAE retry warning cited in a sentence about the code. Each with its near-miss."""
    nohang = _event(
        "May 26 23:02:22 vm nohang[530]:   Send SIGTERM to the victim; total response time: 13246 ms"
    )
    assert (nohang.pool, nohang.killer) == (Pool.KILLED_BY_OS, "nohang")
    current = _event("May 26 23:02:22 vm nohang[530]:   Sending SIGKILL to the victim")
    assert (current.pool, current.killer) == (Pool.KILLED_BY_OS, "nohang")  # nohang 0.2
    assert not list(iter_findings(["The victim doesn't respond on corrective action in 0.027 sec"]))
    d2 = _event(
        "[04/19 09:58:05 d2.utils.memory]: Attempting to copy inputs of <function paste_masks_in_image at 0x7fcfef44fef0> to CPU due to CUDA OOM"
    )
    assert (d2.pool, d2.backend, d2.recovered) == (Pool.GPU, Backend.CUDA, True)
    assert dict(d2.extra).get("node_pack") == "detectron2"
    mm = _event(
        "06/15 16:52:23 - mmengine - WARNING - Attempting to copy inputs of <function Head.loss at 0x7f4e> to CPU due to CUDA OOM"
    )
    assert dict(mm.extra).get("node_pack") == "mmdetection"
    bare = _event("Attempting to copy inputs of <function pairwise_iou at > to CPU due to CUDA OOM")
    assert "node_pack" not in dict(bare.extra)
    assert not list(iter_findings(["Convert outputs to GPU (device=cuda:0)"]))
    cited = (
        'so the "Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding" '
        "path in comfy/sd.py re-runs the identical decode"
    )
    assert not list(iter_findings([cited]))
    seen = 'it will show "Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding."'
    assert _event(seen).recovered
    # a cited copy first does not hide a printed one later in the record
    both = (
        cited
        + "\nWarning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding."
    )
    assert [f.line_no for f in iter_findings(both.split("\n"))] == [2]


def test_round_18_tune_shapes() -> None:
    """Round 18's tune part: pinning by cudaMallocHost (dlib's CHECK_CUDA, a server's start-up),
    ggml's pinned buffer refused for a driver reason (no OOM), Metal's command buffer without
    its code, OpenJ9's paging-file lines, a title's '[Bug]: ' before the exception, and a
    restart between two identical failures. Each with its near-miss."""
    dlib = _event(
        "Error while calling cudaMallocHost(&data, new_size*sizeof(float)) in file C:\\dlib\\dnn\\gpu_data.cpp:181. code: 2, reason: out of memory"
    )
    assert (dlib.pool, dlib.backend, dict(dlib.extra).get("host_memory")) == (
        Pool.RAM,
        Backend.CUDA,
        "pinned",
    )
    vram = _event(
        "Error while calling cudaMalloc(&data, new_size*sizeof(float)) in file gpu_data.cpp:181. code: 2, reason: out of memory"
    )
    assert vram.pool is Pool.GPU
    assert not list(
        iter_findings(
            [
                "Error while calling cudaMalloc(&data, n) in file gpu_data.cpp:181. code: 700, reason: an illegal memory access was encountered"
            ]
        )
    )
    served = _event(
        "FATAL server failed during startup | cudaMallocHost failed: cudaErrorMemoryAllocation: out of memory"
    )
    assert (served.pool, dict(served.extra).get("host_memory")) == (Pool.RAM, "pinned")
    driver = "ggml_cuda_host_malloc: failed to allocate 2560.00 MiB of pinned memory: system has unsupported display driver / cuda driver combination"
    assert not list(iter_findings([driver]))
    pinned = _event(
        "ggml_cuda_host_malloc: failed to allocate 16607.35 MiB of pinned memory: out of memory"
    )
    assert pinned.pool is Pool.RAM
    metal = _event(
        "[error] libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer execution failed: Insufficient Memory"
    )
    assert (metal.pool, metal.backend) == (Pool.UNIFIED_MPS, Backend.MPS)
    j9 = [
        f"09:41:06  JVMJ9VM011W Unable to load {m}: The paging file is too small for this operation to complete. "
        for m in ("j9jit29", "j9gc29", "j9vrb29")
    ]
    found = list(iter_findings(j9))
    assert [(f.event.pool, f.event.count) for f in found] == [(Pool.SWAP_PAGEFILE, 3)]
    assert not list(
        iter_findings(
            [
                "プロセス数が4を超えると「Traceback: The paging file is too small for this operation to complete」"
            ]
        )
    )
    title = _event(
        "[Bug]: RuntimeError: Not enough memory, use lower resolution (max approx. 448x448). Need: 0.0GB free, Have:0.0GB free"
    )
    assert (title.exception_type, title.requested_bytes, title.free_bytes) == ("RuntimeError", 0, 0)
    assert not list(iter_findings(["[Bug]: the run stops with not enough memory"]))
    runs = [
        "Set vram state to: NORMAL_VRAM",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "  what():  std::bad_alloc",
        "Aborted (core dumped)",
        "Set vram state to: DISABLED",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "  what():  std::bad_alloc",
    ]
    assert [(f.line_no, f.event.count) for f in iter_findings(runs)] == [(2, 1), (6, 1)]
    repeat = [line for line in runs if not line.startswith("Set vram")]
    assert [f.event.count for f in iter_findings(repeat)] == [2]


def test_round_18_spent_shapes() -> None:
    """Round 18's held part, read once its figures were recorded: the Java VM's heap (HotSpot,
    Android's ART), MIOpen's refused buffer, NVIDIA's OpenGL driver dialog, ggml's Metal buffer
    named with its size, torch's 'capacityof' typo, docker's table saying 'OOMKilled  False',
    and 'Allocation on device' quoted inside a sentence. Each with its near-miss."""
    android = _event(
        "Exception java.lang.OutOfMemoryError: Failed to allocate a 85442828 byte allocation with 4193440 free bytes and 68MB until OOM"
    )
    assert (android.pool, android.backend, android.exception_type) == (
        Pool.RAM,
        Backend.CPU,
        "java.lang.OutOfMemoryError",
    )
    assert (android.requested_bytes, android.free_bytes) == (85442828, 4193440)
    art = _event(
        '> 2023-01-30 12:57:11.267 W: Throwing OutOfMemoryError "Failed to allocate a 304 byte allocation with 136 free bytes and 136B until OOM, max allowed footprint 201326592, growth limit 201326592" (VmSize 1158244 kB)'
    )
    assert (art.exception_type, art.requested_bytes, art.free_bytes, art.total_bytes) == (
        "OutOfMemoryError",
        304,
        136,
        201326592,
    )
    heap = _event('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space')
    assert (heap.pool, heap.exception_type) == (Pool.RAM, "java.lang.OutOfMemoryError")
    assert [a.key for a in advise(heap)] == ["java-heap-limit"]
    # the collector's own report of a full heap is no failure
    gc = "> 2023-01-30 12:57:11.267 I: Alloc concurrent copying GC freed 0(0B) AllocSpace objects, 0(0B) LOS objects, 0% free, 191MB/192MB, paused 247us total 1.809s"
    assert not list(iter_findings([gc]))
    miopen = _event(
        "MIOpen Error: /data/repo/MIOpen/src/hip/handlehip.cpp:70: Memory not available to allocate buffer: 655360000"
    )
    assert (miopen.pool, miopen.backend, miopen.requested_bytes) == (
        Pool.GPU,
        Backend.ROCM,
        655360000,
    )
    dialog = ["An application has requested more GPU memory than is", "available in the system."]
    assert [(f.line_no, f.event.pool) for f in iter_findings(dialog)] == [(1, Pool.GPU)]
    assert not list(iter_findings(["the game has requested more GPU memory than it needs"]))
    metal = _event(
        "ggml_metal_add_buffer: error: failed to allocate 'data            ' buffer, size = 19283.21 MiB"
    )
    assert (metal.pool, metal.requested_bytes) == (Pool.UNIFIED_MPS, round(19283.21 * 2**20))
    assert (
        _event("ggml_metal_graph_compute: error: failed to allocate buffer").pool
        is Pool.UNIFIED_MPS
    )
    typo = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacityof 23.64 GiB of which 983.69 MiB is free."
    )
    assert typo.total_bytes == round(23.64 * 2**30)
    inspect = ["Restarting  False", "OOMKilled   False", "Dead        False", "ExitCode    137"]
    assert not [
        f
        for f in iter_findings(inspect)
        if f.event.pool is Pool.KILLED_BY_OS and "OOMKilled" in f.event.message
    ]
    assert _event("OOMKilled   True").pool is Pool.KILLED_BY_OS
    said = 'When I run the default workflow, I experience an "Allocation on device" error.'
    assert not list(iter_findings([said]))
    assert _event("!!! Exception during processing !!! Allocation on device").pool is Pool.GPU


def test_earlyoom_kill_lines_read_by_the_one_parser_the_kill_evidence_uses() -> None:
    """The classifier and kernel/oom.py read earlyoom through kernel/earlyoom.py: every
    wording across its versions, the same facts, and its self-test is no kill."""
    lines = [
        'earlyoom[845]: sending SIGTERM to process 322603 uid 1000 "python3.13": oom_score 1282, VmRSS 29931 MiB, cmdline "python main.py"',
        'sending SIGKILL to process 4242 uid 1000 "python": oom_score 900, oom_score_adj 0, VmRSS 512 MiB',
        'sending SIGTERM to process 12006 "python3": badness 209, VmRSS 2891 MiB',
        'killing process 27541 "bash" with signal 15: badness 550, VmRSS 7609 MiB',
    ]
    for line in lines:
        event = _event(line)
        kill = parse_earlyoom_line(line)
        assert kill is not None
        assert (event.pool, event.killer, event.killed_pid) == (
            Pool.KILLED_BY_OS,
            "earlyoom",
            kill.pid,
        )
        assert dict(event.extra)["signal"] == kill.signal
        assert dict(event.extra)["vm_rss_bytes"] == kill.vm_rss_bytes
    selftest = 'sending 0 (no-op signal) to process 1 uid 0 "systemd": oom_score 0, VmRSS 12 MiB'
    assert parse_earlyoom_line(selftest) is None
    assert not list(iter_findings([selftest]))
    assert not list(
        iter_findings(['killing process 27541 "bash" with signal 0: badness 550, VmRSS 7609 MiB'])
    )


def test_ggml_cuda_check_names_the_device_and_a_rocm_build_by_its_call() -> None:
    """ggml's CUDA check prints the device and the failing call indented under its error;
    a ROCm build keeps CUDA's words, the call is HIP's."""
    rocm = [
        "Error: an unknown error was encountered while running the model CUDA error: out of memory",
        "  current device: 0, in function alloc at /go/src/ollama/llm/llama.cpp/ggml-cuda.cu:233",
        "  hipMalloc((void **) &ptr, look_ahead_size)",
        'GGML_ASSERT: /go/src/ollama/llm/llama.cpp/ggml-cuda.cu:60: !"CUDA error"',
    ]
    (found,) = iter_findings(rocm)
    assert (found.line_no, found.event.backend, found.event.gpu_index) == (1, Backend.ROCM, 1 - 1)
    cuda = [
        "CUDA error: out of memory",
        "  current device: 1, in function ggml_cuda_pool_malloc_vmm at ggml-cuda.cu:8583",
        "  cuMemCreate(&handle, reserve_size, &prop, 0)",
    ]
    (found,) = iter_findings(cuda)
    assert (found.event.backend, found.event.gpu_index) == (Backend.CUDA, 1)
    # a frame that merely mentions hip is not ggml's call line
    plain = ["CUDA error: out of memory", '  File "hip_utils.py", line 3, in hipMalloc']
    (found,) = iter_findings(plain)
    assert (found.event.backend, found.event.gpu_index) == (Backend.CUDA, None)


def test_round_19_tune_shapes() -> None:
    """Round 19's tune part: Paddle's message glued to the user's Chinese, Windows'
    ERROR_NOT_ENOUGH_MEMORY as a localized .NET HRESULT, a HIP check macro's 'out of memory',
    an issue title that is the paging-file text, ggml's 2023 pinned-memory warning, a title
    copying the message without c10's enforce head, and a console's blanks inside a
    process's figure. Each with its near-miss."""
    paddle = _event(
        "提示错误Out of memory error on GPU 0. Cannot allocate 3.658448GB memory on GPU 0, available memory is only 2.428040GB."
    )
    assert (paddle.gpu_index, paddle.requested_bytes) == (0, round(3.658448 * 2**30))
    assert not list(
        iter_findings(["TimeOut of memory error on GPU 0. Cannot allocate 1GB memory on GPU 0"])
    )
    hresult = _event("内存资源不足，无法处理此命令。 (异常来自 HRESULT:0x80070008)")
    assert (hresult.pool, hresult.backend) == (Pool.RAM, Backend.CPU)
    assert not list(iter_findings(["(异常来自 HRESULT:0x80070005)"]))  # access denied
    camp = _event(
        "  what():  campHipErrchk(hipStreamCreate(&s)) out of memory .../camp/resource/hip.hpp:154"
    )
    assert (camp.pool, camp.backend) == (Pool.GPU, Backend.ROCM)
    assert _event("cudaMalloc(&p, n) out of memory").backend is Backend.CUDA
    assert not list(iter_findings(["hipStreamCreate(&s) failed: invalid device ordinal"]))
    title = ["# The paging file is too small for this operation to complete.", ""]
    assert [f.event.pool for f in iter_findings(title)] == [Pool.SWAP_PAGEFILE]
    assert not list(
        iter_findings(
            [
                "# Why does Traceback: The paging file is too small for this operation to complete appear"
            ]
        )
    )
    old = _event("WARNING: failed to allocate 1024.00 MB of pinned memory: out of memory")
    assert (old.pool, old.recovered, old.requested_bytes) == (Pool.RAM, True, 2**30)
    assert not list(
        iter_findings(
            ["the log said failed to allocate 1024.00 MB of pinned memory: out of memory"]
        )
    )
    copied = [
        "# DefaultCPUAllocator: not enough memory: you tried to allocate 268435456 bytes.",
        "",
        "I keep getting the same error:",
        "```",
        "[enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: you tried to allocate 268435456 bytes.",
        "```",
    ]
    assert [(f.line_no, f.event.count) for f in iter_findings(copied)] == [(1, 2)]
    other = [
        copied[0],
        "",
        "[enforce fail at alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: you tried to allocate 1024 bytes.",
    ]
    assert [f.line_no for f in iter_findings(other)] == [1, 3]  # other figures: two failures
    padded = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 506.00 MiB. GPU 0 has a total capacity of 31.74 GiB of which 400.88 MiB is free. Process 14974 has 31.34                              GiB memory in use."
    )
    assert [(p.pid, p.bytes) for p in padded.other_processes] == [(14974, round(31.34 * 2**30))]


def test_round_19_held_shapes() -> None:
    """Round 19's held part, once spent: Paddle's message head alone first on a title, systemd's
    unit lines with the journal's prefix dropped and its 'oom-kill' result alone, GGUF's
    swallowed copy_, Windows' paging-file text hard-wrapped mid-word with its HRESULT after
    it, a title naming the error code among the user's words, a type glued to a CJK title,
    and the old dialog quoted in Markdown. Each with its near-miss."""
    head = [f.event for f in iter_findings(["# Out of memory error on GPU 0 gitee上拉的代码", ""])]
    assert [(e.pool, e.gpu_index, e.requested_bytes) for e in head] == [(Pool.GPU, 0, None)]
    assert not list(iter_findings(["I got Out of memory error on GPU 0 again today"]))

    unit = _event("A process of this unit has been killed by the OOM killer.")
    assert (unit.pool, unit.killer, dict(unit.extra).get("unit")) == (
        Pool.KILLED_BY_OS,
        "kernel",
        None,
    )
    result = _event("nixos systemd[1]: ollama.service: Failed with result 'oom-kill'.")
    assert (result.pool, result.killer, dict(result.extra)["unit"]) == (
        Pool.KILLED_BY_OS,
        None,
        "ollama.service",
    )
    both = [
        "Feb 24 11:16:31 adl systemd[1]: ollama.service: A process of this unit has been killed by the OOM killer.",
        "Feb 24 11:16:32 adl systemd[1]: ollama.service: Failed with result 'oom-kill'.",
    ]
    assert [(f.line_no, f.event.killer) for f in iter_findings(both)] == [(1, "kernel")]
    assert not list(iter_findings(["ollama.service: Failed with result 'exit-code'."]))

    gguf = [
        "ignoring 'copy_' on tensor: Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
        "!!! Exception during processing !!! Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
    ]
    assert [(f.line_no, f.event.recovered) for f in iter_findings(gguf)] == [
        (1, True),
        (2, False),
    ]

    wrapped = [
        "DockerDo : docker.exe: Error response from daemon: CreateComputeSystem 53705a69565f831ed770e598afc1efd63b73fde6f8208edb27e32a7d76424183: The paging fi",
        "le is too small for this operation to complete.",
        "[Event Detail: 无法为 Hyper-V 容器创建虚拟机: 页面文件太小，无法完成操作。 (0x800705AF) Provider: x]",
    ]
    found = list(iter_findings(wrapped))
    assert [(f.line_no, f.event.pool, f.event.node_type) for f in found] == [
        (1, Pool.SWAP_PAGEFILE, None)
    ]
    # the alert quotes the words the wrap cut, mended
    assert found[0].event.message == "The paging file is too small for this operation to complete."
    short = ["The paging fi", "le is too small for this operation to complete."]
    assert not list(iter_findings(short))  # a short line cut mid-word is no console's wrap

    assert not list(iter_findings(["# [WinError 1455] model train has an error", ""]))
    assert [
        f.line_no for f in iter_findings(['# "OSError: [WinError 1455]" when training', ""])
    ] == [1]
    assert [
        f.line_no for f in iter_findings(["# [WinError 1455] The paging file is too small", ""])
    ] == [1]

    assert not list(iter_findings(["# 执行demo报torch.cuda.OutOfMemoryError", ""]))
    assert [f.line_no for f in iter_findings(["# 一直报错MemoryError: bad allocation", ""])] == [1]

    quoted = [
        "> Error occurred when executing CCSR_Upscale:",
        "",
        "Allocation on device 0 would exceed allowed memory. (out of memory)",
        "Currently allocated : 9.28 GiB",
    ]
    assert [f.event.node_type for f in iter_findings(quoted)] == ["CCSR_Upscale"]


def test_round_20_tune_shapes() -> None:
    """Round 20's tune part: Java's 'CreateProcess error=1455, ' before Windows' paging-file
    text in a title, and a driver error's name ending a title after the user's own words."""
    java = [
        "# win2012-x86-1 CreateProcess error=1455, The paging file is too small for this operation to complete",
        "",
    ]
    assert [(f.line_no, f.event.pool) for f in iter_findings(java)] == [(1, Pool.SWAP_PAGEFILE)]
    assert not list(
        iter_findings(["# enable_eager_execution 持续报出 CUDA_ERROR_OUT_OF_MEMORY", ""])
    )
    printed = ["# cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY", ""]
    assert [f.event.pool for f in iter_findings(printed)] == [Pool.GPU]
    assert [f.event.pool for f in iter_findings(["# CUDA_ERROR_OUT_OF_MEMORY", ""])] == [Pool.GPU]
    body = ["cupy.cuda.driver.CUDADriverError: CUDA_ERROR_OUT_OF_MEMORY: out of memory"]
    assert [f.event.pool for f in iter_findings(body)] == [Pool.GPU]
    fell_back = [
        "→ [10S] TiledSampler v2.5: carrier wrapper sampling failed (OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)",
        "Currently allocated     : 29.60 GiB",
        "Requested               : 128.91 MiB",
        "Device limit            : 31.36 GiB",
        "Free (according to CUDA): 28.69 MiB",
        "PyTorch limit (set by user-supplied memory fraction)",
        "                        : 17179869184.00 GiB); falling back to plain video for carrier tile",
    ]
    assert [f.event.recovered for f in iter_findings(fell_back)] == [True]
    assert [f.event.recovered for f in iter_findings(fell_back[:-1])] == [False]


def test_round_20_held_shapes() -> None:
    """Round 20's held part, once spent: numpy 1.16's sizeless wording, torch's message retyped
    with an extra 'the', Haskell accelerate's CUDA exception with the driver's string on the
    next line, ggml_vulkan's line pasted into a title without its tag, Vulkan's result named
    at the end of a title among the user's words, Talos's userspace OOM controller, and
    torch's type in the repr vLLM's engine logs. Each with its near-miss."""
    shaped = _event(
        "me tira este error: Unable to allocate array with shape (93849, 1, 52300) and data type float64."
    )
    assert (shaped.pool, shaped.requested_bytes) == (Pool.RAM, None)
    assert not list(iter_findings(["Unable to allocate array of shapes for the plot"]))

    retyped = _event("RuntimeError: CUDA out of the memory. Tried to allocate 360.00 MiB")
    assert (retyped.pool, retyped.exception_type, retyped.requested_bytes) == (
        Pool.GPU,
        "RuntimeError",
        360 * 2**20,
    )
    assert not list(iter_findings(["I think we run out of the memory on that box"]))

    haskell = [
        "./Data/Array/Accelerate/CUDA/State.hs:86 (unhandled): CUDA Exception:",
        "out of memory",
    ]
    assert [(f.line_no, f.event.backend) for f in iter_findings(haskell)] == [(1, Backend.CUDA)]
    assert not list(iter_findings(["Some Exception:", "out of memorial day plans"]))

    title = ["# Bug: Device memory allocation of size 17368219904 failed.", ""]
    assert [f.event.requested_bytes for f in iter_findings(title)] == [17368219904]
    vulkan = [
        "# Vulkan on linux always gives ErrorOutOfDeviceMemory",
        "",
        "ggml_vulkan: Device memory allocation of size 118497280 failed.",
        "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
    ]
    assert [(f.line_no, f.event.requested_bytes) for f in iter_findings(vulkan)] == [(3, 118497280)]
    assert [f.line_no for f in iter_findings(["# ErrorOutOfDeviceMemory", ""])] == [1]

    talos = _event(
        'user: warning: [2026-01-12T20:27:31.913975631Z]: [talos] Sending SIGKILL to cgroup {"component": "controller-runtime", "controller": "runtime.OOMController", "cgroup": "/sys/fs/cgroup/kubepods/burstable/pod77f06c5c"}'
    )
    assert (talos.pool, talos.killer, dict(talos.extra)["signal"]) == (
        Pool.KILLED_BY_OS,
        None,
        "SIGKILL",
    )
    assert not list(
        iter_findings(
            ['[talos] Sending SIGTERM to cgroup {"controller": "runtime.ServiceController"}']
        )
    )

    repr_line = _event(
        "ERROR 10-11 12:27:29 engine.py:157] OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 2.19 MiB is free.')"
    )
    assert (repr_line.exception_type, repr_line.requested_bytes) == (
        "OutOfMemoryError",
        138 * 2**20,
    )


def test_round_21_tune_shapes() -> None:
    """Round 21's tune part: XLA's RESOURCE_EXHAUSTED in both wordings, TensorFlow 1.x's final
    error and its reports of one tensor folded by its shape, TensorRT's request on a
    timestamped line of its own after a repeated error, ITEX's BFC allocator on an Intel GPU,
    an issue form's tag before an exception type, and a title's question mark. Each with its
    near-miss."""
    xla = _event(
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406166528 bytes."
    )
    assert (xla.pool, xla.backend, xla.requested_bytes, xla.exception_type) == (
        Pool.GPU,
        Backend.UNKNOWN,
        7406166528,
        "jaxlib.xla_extension.XlaRuntimeError",
    )
    bfc = _event(
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB (3206250496B) on device ordinal 0"
    )
    assert (bfc.requested_bytes, bfc.gpu_index) == (3206250496, 0)
    assert not list(iter_findings(["RESOURCE_EXHAUSTED: Quota exceeded for quota metric"]))

    tf = [
        "# ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[123008,500] [[Node: x",
        "",
        "2018-05-10 09:14:16.535628: W tensorflow/core/framework/op_kernel.cc:1192] Resource exhausted: OOM when allocating tensor with shape[123008,500]",
    ]
    found = list(iter_findings(tf))
    assert [(f.line_no, f.event.count, f.event.exception_type) for f in found] == [
        (1, 2, "ResourceExhaustedError")
    ]
    other = [tf[0], "", tf[2].replace("shape[123008,500]", "shape[64,500]")]
    assert [f.line_no for f in iter_findings(other)] == [1, 3]  # two tensors: two failures

    trt = [
        "[12/09/2022-20:25:24] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)",
        "[12/09/2022-20:25:24] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)",
        "[12/09/2022-20:25:24] [TRT] [W] Requested amount of GPU memory (17179869184 bytes) could not be allocated. There may not be enough free memory for allocation to succeed.",
        "[12/09/2022-20:25:25] [TRT] [W] Skipping tactic 8 due to insufficient memory on requested size of 17179869184 detected for tactic 0x000000000000003c.",
    ]
    found = list(iter_findings(trt))
    assert [(f.line_no, f.event.count, f.event.requested_bytes) for f in found] == [
        (1, 2, 17179869184)
    ]
    trtexec = [
        "[11/22/2024-13:40:47] [E] Error[1]: [defaultAllocator.cpp::allocate::31] Error Code 1: Cuda Runtime (out of memory)",
        "[11/22/2024-13:40:47] [W] [TRT] Requested amount of GPU memory (15485030400 bytes) could not be allocated. There may not be enough free memory for allocation to succeed.",
    ]
    assert [f.event.requested_bytes for f in iter_findings(trtexec)] == [15485030400]

    itex = _event(
        "E itex/core/devices/bfc_allocator.cc:101] Allocator ran out of memory trying to allocate 10529419660 Bytes (rounded to 10529419776 Bytes)"
    )
    assert (itex.pool, itex.backend, itex.requested_bytes) == (Pool.GPU, Backend.XPU, 10529419660)

    tagged = [
        "# [Bug] RuntimeError: [TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/turbomind/utils/memory_utils.cu:32",
        "",
        "RuntimeError: [TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/turbomind/utils/memory_utils.cu:32",
    ]
    found = list(iter_findings(tagged))
    assert [(f.line_no, f.event.count, f.event.exception_type) for f in found] == [
        (1, 2, "RuntimeError")
    ]
    asked = [
        "# torch.OutOfMemoryError: CUDA out of memory ？",
        "```",
        "torch.OutOfMemoryError: CUDA out of memory. See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "```",
    ]
    assert [(f.line_no, f.event.count) for f in iter_findings(asked)] == [(1, 2)]


def test_round_21_held_shapes() -> None:
    """Round 21's held part, once spent: XLA's local_client line hard-wrapped after 'Out ',
    TensorFlow's message lower-cased in a title, onnxruntime's arena line with its signature cut
    by a title, a title capitalising C++'s terminate line, FFmpeg's ENOMEM, Windows' low
    virtual memory event, and a model's name on the line before a message. Each with its
    near-miss."""
    wrapped = [
        "[1] 2019-06-13 01:17:08.886805: E external/org_tensorflow/tensorflow/compiler/xla/python/local_client.cc:672] Execution of replica 0 failed: Resource exhausted: Out ",
        "of memory while trying to allocate 5520758552 bytes.",
    ]
    found = list(iter_findings(wrapped))
    assert [(f.line_no, f.event.requested_bytes) for f in found] == [(1, 5520758552)]
    assert found[0].event.message.startswith("Resource exhausted: Out of memory while")
    assert not list(iter_findings(["Resource exhausted: Out of quota for this project"]))

    lowered = [
        "# resource exhausted: oom when allocating tensor with shape[16,112,112,147] and type float on /job:localhost/replica:0/task:0/device:gpu:0 by allocator gpu_0_bfc",
        "",
        "ResourceExhaustedError: 2 root error(s) found.",
        "  (0) Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
    ]
    found = list(iter_findings(lowered))
    assert [(f.line_no, f.event.count, f.event.gpu_index) for f in found] == [(1, 2, 0)]
    assert not list(iter_findings(["# resource exhausted when training, any idea?", ""]))

    arena = _event(
        "# /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to alloc"
    )
    assert (arena.pool, arena.rule) == (Pool.GPU, "onnx-arena-oom")
    assert not list(iter_findings(["AllocateRawInternal(size_t) returned a buffer"]))

    terminate = [
        "# Terminate called after throwing an instance of 'std::bad_alloc'",
        "",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "  what():  std::bad_alloc",
    ]
    assert [(f.line_no, f.event.count) for f in iter_findings(terminate)] == [(1, 2)]

    ffmpeg = _event("failed to decode audio: -48: avcodec_send_packet: Out of memory")
    assert (ffmpeg.pool, ffmpeg.backend) == (Pool.RAM, Backend.CPU)
    assert not list(iter_findings(["my_script: Out of memory ideas, any help?"]))

    low = _event(
        "Windows successfully diagnosed a low virtual memory condition. The following programs consumed the most virtual memory: python.exe (11044) consumed 27399053312 bytes"
    )
    assert low.pool is Pool.SWAP_PAGEFILE

    model_line = [
        "LLama3 ",
        "`torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 628.00 MiB. GPU 0 has a total capacity of 15.60 GiB of which 107.62 MiB is free.",
    ]
    assert [f.event.node_type for f in iter_findings(model_line)] == [None]
    node_line = ["VAEDecodeV2", model_line[1]]
    assert [f.event.node_type for f in iter_findings(node_line)] == ["VAEDecodeV2"]


def test_round_22_tune_shapes() -> None:
    """Round 22's tune part: an error's name in inline code inside the user's sentence, IREE's
    buffer length, ncnn's fallback to device memory, each 'invoked oom-killer' its own OOM, a
    title without the body's victim, a process that lived through earlyoom's SIGTERM, a title
    of TensorFlow's type and 'OOM', Python's ENOMEM, Ray's memory monitor, and FSDP's state_dict
    warning. Each with its near-miss."""
    prose = [
        "# `hipErrorOutOfMemory` after executing a few hundred kernels",
        "",
        "we start getting `hipErrorOutOfMemory` after ~300 different kernels:",
        ">>> ERROR: Error invoking function: c/runtime/src/iree/hal/drivers/hip/hip_allocator.c:859: RESOURCE_EXHAUSTED; HIP driver error 'hipErrorOutOfMemory' (2): out of memory; while invoking native function hal.device.queue.alloca;",
    ]
    assert [(f.line_no, f.event.backend) for f in iter_findings(prose)] == [(4, Backend.ROCM)]
    assert [f.line_no for f in iter_findings(["`hipErrorOutOfMemory`", ""])] == [1]
    iree = _event(
        "# Baseline module failing: RESOURCE_EXHAUSTED; HIP driver error 'hipErrorOutOfMemory' (2): out of memory; failed to allocate buffer of length 34638106880; while invoking"
    )
    assert iree.requested_bytes == 34638106880

    ncnn = [
        "vkAllocateMemory failed -2",
        "weight allocator fallback to device memory",
        "vkAllocateMemory failed -2",
    ]
    assert [(f.line_no, f.event.recovered) for f in iter_findings(ncnn)] == [
        (1, True),
        (3, False),
    ]

    invoked = [
        "[195998.443208] node invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=991",
        "two minutes later",
        "[196120.737205] ZMQbg/IO/0 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=991",
    ]
    assert [dict(f.event.extra)["invoked_by"] for f in iter_findings(invoked)] == [
        "node",
        "ZMQbg/IO/0",
    ]

    worker = [
        "# RuntimeError: DataLoader worker (pid n) is killed by signal: Killed",
        "",
        "RuntimeError: DataLoader worker (pid 629) is killed by signal: Killed.",
        "Memory cgroup out of memory: Killed process 629 (onmt_train) total-vm:14119556kB, anon-rss:6538204kB, file-rss:80652kB, shmem-rss:16kB, UID:0 pgtables:13432kB oom_score_adj:0",
    ]
    found = list(iter_findings(worker))
    assert [(f.line_no, f.event.killed_pid) for f in found] == [(1, None), (3, 629)]

    sigterm = [
        'killing process 28367 "python3" with signal 15: badness 698, VmRSS 11793 MiB',
        "Got signal 15",
        "Killed",
    ]
    found = list(iter_findings(sigterm))
    assert [(f.line_no, f.event.killer) for f in found] == [(1, "earlyoom"), (3, None)]
    sigkill = [sigterm[0].replace("signal 15", "signal 9"), "Killed"]
    assert [f.line_no for f in iter_findings(sigkill)] == [1]  # its own SIGKILL: one kill

    tf = ["# ResourceExhaustedError: OOM", ""]
    assert [(f.event.pool, f.event.exception_type) for f in iter_findings(tf)] == [
        (Pool.GPU, "ResourceExhaustedError")
    ]
    assert not list(iter_findings(["# ResourceExhaustedError: OOM fixed in 2.4?", ""]))

    enomem = _event("OSError: [Errno 12] Cannot allocate memory")
    assert (enomem.pool, enomem.exception_type) == (Pool.RAM, "OSError")
    assert not list(iter_findings(["OSError: [Errno 13] Permission denied"]))

    ray = [
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "Memory on the node (IP: 192.168.0.107, ID: fc2b) where the task (actor ID: f9cc, name=SimEnv.__init__, pid=4331, memory used=2.22GB) was running was 59.49GB / 62.58GB (0.950744), which exceeds the memory usage threshold of 0.95.",
    ]
    (event,) = [f.event for f in iter_findings(ray)]
    assert (event.pool, event.killed_pid) == (Pool.KILLED_BY_OS, 4331)

    fsdp = _event(
        "fully_sharded_data_parallel.py:2224: UserWarning: Failed to clone() tensor with name lm_head.weight. This may mean that this state_dict entry could point to invalid memory regions after returning from state_dict() call if this parameter is managed by FSDP. Please check clone implementation of lm_head.weight. Error: CUDA out of memory. Tried to allocate 502.00 MiB (GPU 1; 39.59 GiB total capacity; 35.54 GiB already allocated; 276.19 MiB free; 37.22 GiB reserved in total by PyTorch)"
    )
    assert fsdp.recovered
    assert not _event(
        "RuntimeError: CUDA out of memory. Tried to allocate 502.00 MiB (GPU 1; 39.59 GiB total capacity; 35.54 GiB already allocated; 276.19 MiB free; 37.22 GiB reserved in total by PyTorch)"
    ).recovered


def test_round_22_held_shapes() -> None:
    """Round 22's held part, once spent: Rust's allocation abort, Vulkan's host-memory result,
    torch's message hard-wrapped at figures (a commit message's 72 columns), a title's '*' for
    XLA's figure, SGLang's and vLLM's start-up refusals, and the raylet's kill summary (Ray's
    words as a title without their full stop are the user's). Each with its near-miss."""
    rust = _event("memory allocation of 176896 bytes failed")
    assert (rust.pool, rust.requested_bytes) == (Pool.RAM, 176896)
    assert not list(iter_findings(["the memory allocation of the buffer failed us"]))

    host = _event('Run out of VRAM: "vkAllocateMemory failed -1"')
    assert host.pool is Pool.RAM
    assert _event("vkAllocateMemory failed -2").pool is Pool.GPU

    wrapped = [
        '"torch.cuda.OutOfMemoryError: HIP out of memory. Tried to allocate',
        "84.00 MiB. GPU 0 has a total capacity of 512.00 MiB of which 0 bytes",
        "is free. Of the allocated memory 103.83 MiB is allocated by PyTorch,",
        'and 22.17 MiB is reserved by PyTorch but unallocated"',
    ]
    (event,) = [f.event for f in iter_findings(wrapped)]
    assert (event.requested_bytes, event.total_bytes, event.free_bytes) == (
        84 * 2**20,
        512 * 2**20,
        0,
    )

    star = _event("# RESOURCE_EXHAUSTED: Out of memory while trying to allocate * bytes.")
    assert (star.pool, star.requested_bytes) == (Pool.GPU, None)

    sglang = _event(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.9."
    )
    assert (sglang.pool, sglang.rule) == (Pool.GPU, "sglang-no-kv-memory")

    vllm = _event(
        "ValueError: Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    assert (vllm.backend, vllm.gpu_index, vllm.requested_bytes, vllm.free_bytes) == (
        Backend.CUDA,
        1,
        round(19.84 * 2**30),
        round(19.77 * 2**30),
    )
    assert not list(
        iter_findings(["# vLLM v0.9.1 Free Memory on device on startup is less than desired", ""])
    )

    raylet = _event(
        "(raylet) node_manager.cc:3084: 4 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: b287, IP: 172.28.0.12)"
    )
    assert raylet.pool is Pool.KILLED_BY_OS
    assert not list(iter_findings(["# Task was killed due to the node running low on memory", ""]))
    printed = ["# OutOfMemoryError: Task was killed due to the node running low on memory.", ""]
    assert [f.event.pool for f in iter_findings(printed)] == [Pool.KILLED_BY_OS]


def test_round_23_tune_shapes() -> None:
    """Round 23's tune part: torch 1.0's '; X cached' cut at the paste's end and a stray blank
    inside 'total', a title capitalising c10's allocator tail, YOLOX's recovered label
    assignment, COLMAP's CUDA_SAFE_CALL, and onnxruntime's 'failed:std::bad_alloc'. Each with
    its near-miss."""
    cut = _event(
        "RuntimeError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 0; 4.00 GiB to tal capacity; 2.34 GiB already allocated; 568.58 MiB free; 29.77 MiB cached"
    )
    assert (cut.total_bytes, cut.reserved_unallocated_bytes) == (4 * 2**30, round(29.77 * 2**20))
    assert _event(
        "RuntimeError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 0; 4.00 GiB total capacity; 2.34 GiB already allocated; 568.58 MiB free; 29.77 MiB cached)"
    ).reserved_unallocated_bytes == round(29.77 * 2**20)

    title = [
        "# Not enough memory: you tried to allocate 20971520 bytes",
        "",
        "`not enough memory: you tried to allocate 20971520 bytes`",
    ]
    found = list(iter_findings(title))
    assert [(f.line_no, f.event.count, f.event.requested_bytes) for f in found] == [
        (1, 2, 20971520)
    ]
    assert not list(iter_findings(["Not enough memory: you tried to reach the moon"]))

    yolox = _event(
        "2022-03-03 14:35:41 | ERROR    | yolox.models.yolo_head:328 - OOM RuntimeError is raised due to the huge memory cost during label assignment. CPU mode is applied in this batch."
    )
    assert (yolox.pool, yolox.backend, yolox.recovered) == (Pool.GPU, Backend.CUDA, True)

    colmap = _event("CUDA error at /home/code/colmap/src/mvs/gpu_mat.h:167 - out of memory")
    assert (colmap.pool, colmap.backend) == (Pool.GPU, Backend.CUDA)
    assert not list(iter_findings(["CUDA error at /src/x.cu:12 - invalid device ordinal"]))

    ort = _event(
        "[ONNXRuntimeError] : 1 : FAIL : Load model from /content/models/inswapper_128.onnx failed:std::bad_alloc"
    )
    assert (ort.pool, ort.exception_type) == (Pool.RAM, "std::bad_alloc")


def test_round_23_held_shapes() -> None:
    """Round 23's held part, once spent: TensorRT 7's 'Cuda Error in allocate: 2 (out of
    memory)', TensorRT's 'FAILED_ALLOCATION: std::bad_alloc', and MPS's words in a title among
    the user's (the user naming the error, as torch's device words there are). Each with its
    near-miss."""
    trt = _event(
        "[09/29/2022-16:59:38] [E] [TRT] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)"
    )
    assert (trt.pool, trt.backend) == (Pool.GPU, Backend.CUDA)
    assert not list(iter_findings(["- Cuda Error in allocate: 1 (invalid argument)"]))

    bad = _event("ERROR: FAILED_ALLOCATION: std::bad_alloc")
    assert (bad.pool, bad.exception_type) == (Pool.RAM, "std::bad_alloc")

    assert not list(iter_findings(["# MPS backend out of memory in Mac", ""]))
    assert not list(iter_findings(["On MAC : MPS Backend out of Memory problem"]))
    printed = "RuntimeError: MPS backend out of memory (MPS allocated: 18.13 GB, other allocations: 2.40 MB, max allowed: 18.13 GB). Tried to allocate 12.00 MB on private pool."
    assert _event(printed).pool is Pool.UNIFIED_MPS
    assert [f.line_no for f in iter_findings(["# MPS backend out of memory", ""])] == [1]

    # a record quoting the message twice (a JSON result's 'error' and 'errors') names each
    # other process once
    twice = (
        '{"error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 58.00 MiB. GPU 0 has a total capacity of 23.54 GiB of which 17.75 MiB is free. Process 333813 has 23.52 GiB memory in use.",\n'
        ' "errors": "CUDA out of memory. Tried to allocate 58.00 MiB. GPU 0 has a total capacity of 23.54 GiB of which 17.75 MiB is free. Process 333813 has 23.52 GiB memory in use."}'
    )
    assert [p.pid for p in _event(twice).other_processes] == [333813]
    # a title's heading mark before the exception line keeps its type
    title = [
        "# MemoryError: bad allocation: cudaErrorMemoryAllocation: out of memory",
        "",
        "MemoryError: bad allocation: cudaErrorMemoryAllocation: out of memory",
    ]
    assert [(f.line_no, f.event.count, f.event.exception_type) for f in iter_findings(title)] == [
        (1, 2, "MemoryError")
    ]


def test_round_24_tune_shapes() -> None:
    """Round 24's tune part: Windows' low-virtual-memory event naming the programs that held
    the commit, CuPy's pool, faiss's cudaMalloc, RMM's device allocator, dask's nanny, a
    library's type before 'std::bad_alloc', Java's heap before the generic OOM type, a retyped
    'to small', MLX's Metal allocator, and a driver error's name opening a title that goes on
    in the user's words. Each with its near-miss."""
    low = _event(
        "Windows successfully diagnosed a low virtual memory condition. The following programs consumed the most virtual memory: nanominer.exe (3824) consumed 37757956096 bytes, PrecisionX_x64.exe (9584) consumed 294039552 bytes"
    )
    assert (low.pool, [(p.pid, p.bytes) for p in low.other_processes]) == (
        Pool.SWAP_PAGEFILE,
        [(3824, 37757956096), (9584, 294039552)],
    )
    cupy = _event(
        "Exception in main training loop: out of memory to allocate 163840000 bytes (total 1673061376 bytes)"
    )
    assert (cupy.backend, cupy.requested_bytes, cupy.reserved_bytes) == (
        Backend.CUDA,
        163840000,
        1673061376,
    )
    faiss = _event("# Failed to cudaMalloc 1610612736 bytes on device 0 (error 2 out of memory)")
    assert (faiss.requested_bytes, faiss.gpu_index) == (1610612736, 0)
    rmm = _event(
        "MemoryError: std::bad_alloc: out_of_memory: CUDA error at: /usr/include/rmm/mr/device/cuda_memory_resource.hpp"
    )
    assert (rmm.pool, rmm.backend) == (Pool.GPU, Backend.CUDA)
    nanny = _event("distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarting")
    assert nanny.pool is Pool.KILLED_BY_OS
    assert not list(iter_findings(["distributed.worker - WARNING - Memory use is high"]))
    xgb = _event("XGBoostError: std::bad_alloc")
    assert (xgb.pool, xgb.exception_type) == (Pool.RAM, "XGBoostError")  # (the line's type)
    java = [
        "24/07/24 04:27:42 ERROR SparkUncaughtExceptionHandler: Uncaught exception in thread Thread[Executor task launch worker]",
        "java.lang.OutOfMemoryError: Java heap space",
        "        at java.base/java.nio.HeapByteBuffer.<init>(Unknown Source)",
    ]
    assert [(f.event.pool, f.event.rule) for f in iter_findings(java)] == [
        (Pool.RAM, "java-heap-oom")
    ]
    retyped = _event(
        "OSError : The paging file is to small for this operation to complete. error loading caffe2_detection_ops_gpu.dll"
    )
    assert (retyped.pool, retyped.exception_type) == (Pool.SWAP_PAGEFILE, "OSError")
    mlx = _event(
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [malloc_or_wait] Unable to allocate 9663676416 bytes."
    )
    assert (mlx.pool, mlx.requested_bytes, mlx.exception_type) == (
        Pool.UNIFIED_MPS,
        9663676416,
        "std::runtime_error",
    )
    assert not list(
        iter_findings(["# CUDA_ERROR_OUT_OF_MEMORY on multiple and single GPU set up (1080Ti)", ""])
    )
    assert [f.line_no for f in iter_findings(["# CUDA_ERROR_OUT_OF_MEMORY", ""])] == [1]


def test_round_24_held_shapes() -> None:
    """Round 24's held part, once spent: CuPy's figures with thousands separators, faiss's
    message cut at a line end, its 1.x assertion and its head alone as a title, dask's nanny
    with two blanks or a wrap inside 'Restarting', loky's SIGKILLed worker (not its SIGSEGV),
    vLLM's start-up check on 'xpu:0', ggml-metal's buffer maximum, the Event Viewer's consumer
    list hard-wrapped, the Java VM's 'GC overhead limit exceeded' as a title, zsh's job line
    retyped with one blank (and a title copying it), .NET's type after a title's tag, Lua
    torch's THCudaCheck then trepl's relay, and a sentence's 'CUDA: Out of memory error'.
    Each with its near-miss."""
    cupy = _event(
        "Exception in main training loop: Out of memory allocating 25,600,000 bytes "
        "(allocated so far: 3,635,267,072 bytes)."
    )
    assert (cupy.requested_bytes, cupy.allocated_bytes) == (25_600_000, 3_635_267_072)

    cut = _event(
        "RuntimeError: Error in ... Failed to cudaMalloc 536870912 bytes on device 1 (error 2 out of memory\n"
        "Outstanding allocations:"
    )
    assert (cut.pool, cut.backend, cut.gpu_index, cut.requested_bytes) == (
        Pool.GPU,
        Backend.CUDA,
        1,
        536870912,
    )
    assertion = _event(
        "Faiss assertion 'cudaMalloc(p, size) == cudaSuccess' failed in void faiss::gpu::allocMemorySpace("
        "faiss::gpu::MemorySpace, void**, size_t) at utils/MemorySpace.cpp:20; details: Failed to "
        "cudaMalloc 4294967296 bytes"
    )
    assert assertion.requested_bytes == 4294967296
    assert [f.line_no for f in iter_findings(["# Failed to cudaMalloc", ""])] == [1]
    assert not list(iter_findings(["# Failed to cudaMalloc on my second GPU", ""]))

    for nanny in (
        "distributed.nanny - WARNING - Worker exceeded 95% memory budget.  Restarting",
        "distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarti\nng",
    ):
        assert _event(nanny).pool is Pool.KILLED_BY_OS
    assert not list(iter_findings(["distributed.worker - WARNING - Memory use is high"]))

    loky = (
        "joblib.externals.loky.process_executor.TerminatedWorkerError: A worker process managed by "
        "the executor was unexpectedly terminated. This could be caused by a segmentation fault "
        "while calling the function or by an excessive memory usage causing the Operating System "
        "to kill the worker. The exit codes of the workers are {SIGKILL(-9)}"
    )
    killed = _event(loky)
    assert (killed.pool, killed.exception_type) == (
        Pool.KILLED_BY_OS,
        "joblib.externals.loky.process_executor.TerminatedWorkerError",
    )
    assert not list(iter_findings([loky.replace("{SIGKILL(-9)}", "{SIGSEGV(-11)}")]))

    xpu = _event(
        "# [Bug]: ValueError: Free memory on device xpu:0 (0.22/30.3 GiB) on startup is less than "
        "desired GPU memory utilization (0.7, 21.21 GiB). Decrease GPU memory utilization"
    )
    assert (xpu.backend, xpu.gpu_index, xpu.exception_type) == (Backend.XPU, 0, "ValueError")

    metal = _event(
        "`ggml_metal_add_buffer: buffer 'data' size 18300780544 is larger than buffer maximum of 17179869184`"
    )
    assert (metal.pool, metal.requested_bytes) == (Pool.UNIFIED_MPS, 18300780544)
    assert not list(
        iter_findings(["ggml_metal_add_buffer: allocated 'data' buffer, size = 1024.00 MB"])
    )

    wrapped = _event(
        "Windows successfully diagnosed a low virtual memory condition. The   following programs "
        "consumed the most virtual memory: qbittorrent.exe (1276)   consumed 6617141248 bytes, "
        "avp.exe (4508) consumed 297693184 bytes"
    )
    assert [p.pid for p in wrapped.other_processes] == [1276, 4508]

    gc = list(iter_findings(["# GC overhead limit exceeded", ""]))
    assert [(f.line_no, f.event.pool) for f in gc] == [(1, Pool.RAM)]
    assert not list(iter_findings(["# how to avoid GC overhead limit exceeded in spark?", ""]))

    assert _event("zsh: killed python export.py").pool is Pool.KILLED_BY_OS
    both = list(
        iter_findings(["# zsh: killed python export.py", "", "zsh: killed     python export.py"])
    )
    assert [(f.line_no, f.event.count) for f in both] == [(1, 2)]
    # two processes the shell reports killed stay two
    two = list(iter_findings(["zsh: killed     python a.py", "zsh: killed     python b.py"]))
    assert len(two) == 2

    dotnet = list(
        iter_findings(
            [
                "# [BUG] System.OutOfMemoryException: Insufficient memory to continue the execution of the program.",
                '"System.OutOfMemoryException: Insufficient memory to continue the execution of the program". Does anyone know?',
            ]
        )
    )
    assert [(f.line_no, f.event.count, f.event.exception_type) for f in dotnet] == [
        (1, 2, "System.OutOfMemoryException")
    ]

    thc = list(
        iter_findings(
            [
                "THCudaCheck FAIL file=/opt/rocks/cutorch/lib/THC/THCTensorRandom.cu line=20 error=2 : out of memory",
                "/home/u/torch/install/share/lua/5.1/trepl/init.lua:384: cuda runtime error (2) : out of memory at /opt/rocks/cutorch/lib/THC/THCTensorRandom.cu:20",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in thc] == [(1, 1)]

    assert not list(
        iter_findings(
            ["# [Usage]: 125m model is also showing CUDA: Out of memory error in a 4060", ""]
        )
    )
    assert _event("RuntimeError: CUDA: out of memory").pool is Pool.GPU


def test_round_25_tune_shapes() -> None:
    """Round 25's tune part: Slurm 21.08's 'oom_kill event in StepId=', kraken2's database
    load, RAPIDS Spark's failed RMM allocation, earlyoom's kill line cut inside its VmRSS and
    its 1.0 wording, the driver API's page-locked allocator as pinned host memory, and torch's
    'bytes' hard-wrapped inside the word. Each with its near-miss."""
    slurm = list(
        iter_findings(
            [
                "slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of the step tasks have been OOM Killed.",
                "srun: error: nid001277: tasks 1-3: Out Of Memory",
            ]
        )
    )
    assert [(f.line_no, f.event.killer, dict(f.event.extra).get("scope")) for f in slurm] == [
        (1, "kernel", "cgroup")
    ]

    kraken = _event("Loading database information...Failed attempt to allocate 32185178696bytes;")
    assert (kraken.pool, kraken.requested_bytes) == (Pool.RAM, 32185178696)

    spark = _event(
        "21/11/04 21:13:46:119 INFO DeviceMemoryEventHandler: Device allocation of 345571976 bytes "
        "failed, device store has 0 bytes. Total RMM allocated is 9319438848 bytes."
    )
    assert (spark.pool, spark.backend, spark.requested_bytes, spark.allocated_bytes) == (
        Pool.GPU,
        Backend.CUDA,
        345571976,
        9319438848,
    )

    cut = _event(
        'earlyoom[26328]: sending SIGTERM to process 63745 uid 1000 "python3": badness 748, VmRSS 538'
    )
    assert (cut.killed_pid, cut.killer) == (63745, "earlyoom")
    assert "vm_rss_bytes" not in dict(cut.extra)
    v1 = _event("Killing process 'bash' with signal 15, pid: 5874, badness: 538, VmRSS: 3160 MiB")
    assert (v1.killed_pid, dict(v1.extra)["vm_rss_bytes"]) == (5874, 3160 * 1024**2)
    assert not list(
        iter_findings(["Killing process 'bash' with signal 0, pid: 1, badness: 0, VmRSS: 1 MiB"])
    )

    pinned = _event("ERROR: failed on cuMemAllocHost: CUDA_ERROR_OUT_OF_MEMORY - out of memory")
    assert (pinned.pool, dict(pinned.extra).get("host_memory")) == (Pool.RAM, "pinned")
    device = _event("ERROR: failed on cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY - out of memory")
    assert device.pool is Pool.GPU

    wrapped = _event(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 83.82 GiB. GPU 0 has a "
        "total capacity of 79.35 GiB of which 78.40 GiB is free. Of the allocated memory 0 bytes "
        "is allocated by PyTorch, and 0 b\nytes is reserved by PyTorch but unallocated."
    )
    assert wrapped.reserved_unallocated_bytes == 0


def test_round_25_held_shapes() -> None:
    """Round 25's held part, once spent: Slurm 21.08's first sentence alone as a title (and
    its copy in the body folded), flux's job shell relaying a cgroup kill, earlyoom's old -k
    mode asking the kernel's killer, Metal's debug layer refusing a buffer over its limit.
    Each with its near-miss."""
    title = list(
        iter_findings(
            [
                "# slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0.",
                "",
                "slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step tasks have been OOM Killed.",
            ]
        )
    )
    assert [(f.line_no, f.event.count, f.event.killer) for f in title] == [(1, 2, "kernel")]
    assert not list(iter_findings(["# why is there an oom_kill event in StepId=1.0 on my job", ""]))

    flux = _event(
        "29.475s: flux-shell[0]: ERROR: oom: Memory cgroup out of memory: killed 1 task on picl7."
    )
    assert (flux.pool, flux.killer, dict(flux.extra)["scope"]) == (
        Pool.KILLED_BY_OS,
        "kernel",
        "cgroup",
    )

    sysrq = list(
        iter_findings(["Invoking oom killer: done", "Low memory!", "Invoking oom killer: done"])
    )
    assert [(f.line_no, f.event.count, f.event.killer) for f in sysrq] == [(1, 2, "kernel")]
    assert not list(iter_findings(["earlyoom will not be invoking oom killer: done with that"]))

    metal = _event("newBufferWith*:length 0x6692c000 must not exceed 1024 MB.")
    assert (metal.pool, metal.requested_bytes) == (Pool.UNIFIED_MPS, 0x6692C000)
    assert not list(iter_findings(["the length must not exceed 1024 MB."]))


def test_round_26_tune_shapes() -> None:
    """Round 26's tune part: the non-ML software beside ComfyUI (Go's runtime, PostgreSQL,
    MySQL's sort buffer, Electron's renderer, V8's fatal handler as a crash frame, macOS's
    malloc, gcc's kill in another locale, Blender Cycles, NVENC) and the accelerators (amdgpu's
    command submission, ggml's 'ROCm error', FlashInfer's workspace), and torch's 'this process
    has 0 bytes memory in use' deriving no outside figure. Each with its near-miss."""
    assert _event("fatal error: runtime: out of memory").pool is Pool.RAM
    pg = _event(
        "{ [Error: out of memory] severity: 'ERROR', code: '53200', detail: 'Failed on request of size 16.' }"
    )
    assert (pg.pool, pg.requested_bytes) == (Pool.RAM, 16)
    typed = _event("org.postgresql.util.PSQLException: FATAL: out of memory")
    assert (typed.pool, typed.exception_type) == (Pool.RAM, "org.postgresql.util.PSQLException")
    sort = _event(
        "SQLSTATE[HY001]: Memory allocation error: 1038 Out of sort memory, consider increasing"
    )
    assert sort.pool is Pool.RAM

    for electron in (
        "Renderer process oom - see https://www.electronjs.org/docs/tutorial/application-debugging",
        "  reason: 'oom',",
    ):
        assert [f.event.pool for f in iter_findings([electron])] == [Pool.RAM], electron
    assert not list(iter_findings(["the reason: oom errors happen when the renderer leaks"]))
    frame = _event(
        "2   libnode.dylib  0x0000000104463d12 v8::internal::V8::FatalProcessOutOfMemory(char const*, bool) + 594"
    )
    assert frame.pool is Pool.RAM

    mac = _event(
        "blender(400,0xa19571a8) malloc: *** mach_vm_map(size=193413120) failed (error code=3)"
    )
    assert (mac.pool, mac.requested_bytes) == (Pool.RAM, 193413120)
    assert [f.line_no for f in iter_findings(["# error: can't allocate region", ""])] == [1]

    morto = _event("c++: fatal error: Morto signal terminated program lto1")
    assert morto.pool is Pool.KILLED_BY_OS
    assert not list(
        iter_findings(["c++: fatal error: Segmentation fault signal terminated program cc1plus"])
    )

    assert _event("System is out of GPU and shared host memory").backend is Backend.CUDA
    assert (
        _event("[h264_nvenc @ 0x1] OpenEncodeSessionEx failed: out of memory (10)").pool is Pool.GPU
    )
    cs = _event("amdgpu 0000:03:00.0: [drm] *ERROR* Not enough memory for command submission!")
    assert (cs.pool, cs.backend) == (Pool.GPU, Backend.ROCM)
    assert _event("ollama[3010374]: ROCm error: out of memory").backend is Backend.ROCM
    fi = _event(
        "RuntimeError: Failed to allocate memory for batch_prefill_tmp_v with size 435814400 and "
        "alignment 16 in AlignedAllocator"
    )
    assert (fi.pool, fi.requested_bytes) == (Pool.GPU, 435814400)

    zero = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.88 GiB. GPU 3 has a total "
        "capacity of 21.96 GiB of which 1.29 GiB is free. Including non-PyTorch memory, this process "
        "has 0 bytes memory in use. Of the allocated memory 19.02 GiB is allocated by PyTorch"
    )
    assert (zero.process_used_bytes, zero.other_process_named) == (0, False)
    assert "outside_process_bytes" not in dict(zero.extra)
    seen = _event(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.88 GiB. GPU 3 has a total "
        "capacity of 21.96 GiB of which 1.29 GiB is free. Including non-PyTorch memory, this process "
        "has 2.00 GiB memory in use. Of the allocated memory 1.50 GiB is allocated by PyTorch"
    )
    assert seen.other_process_named and dict(seen.extra)["outside_process_bytes"] > 0


def test_round_26_held_shapes() -> None:
    """Round 26's held part, once spent: ollama's layout refusal, TGI's prefill refusal as the
    router relays it, RADV's failed buffer with its size on the next line, a ROCm backend's
    own allocator, MLX's buffer limit before its '[metal::malloc]' tag, Go's VirtualAlloc at
    the commit limit, Redis's maxmemory, MySQL's and InnoDB's refusals, Mono's nested
    OutOfMemoryException, the Kotlin daemon's heap, Chrome's crash page, Emscripten's abort,
    gcc's kill in zh_CN, V8's message cut in a title, 'CUDA Error:' capitalised; and source
    code naming CUDA's error codes, ggml_vulkan asking for a memory type the device lacks.
    Each with its near-miss."""
    assert _event("memory layout cannot be allocated with num_gpu = 26").pool is Pool.GPU
    assert _event("Error: 500 Internal Server Error: memory layout cannot be allocated")
    assert not list(iter_findings(["i got this 500 error, memory layout cannot be allocated"]))
    tgi = _event(
        "Server error: Not enough memory to handle 256 prefill tokens. You need to decrease"
    )
    assert (tgi.pool, tgi.backend) == (Pool.GPU, Backend.UNKNOWN)

    radv = list(
        iter_findings(
            [
                "radv/amdgpu: Failed to allocate a buffer:",
                "radv/amdgpu:    size      : 4269813760 bytes",
                "radv/amdgpu:    alignment : 262144 bytes",
            ]
        )
    )
    assert [(f.line_no, f.event.requested_bytes) for f in radv] == [(1, 4269813760)]
    ds4 = _event("ds4: ROCm tensor fill f32 launch failed: out of memory")
    assert (ds4.pool, ds4.backend) == (Pool.GPU, Backend.ROCM)
    mlx = _event(
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: Attempting "
        "to allocate 19081554496 bytes which is greater than the maximum allowed buffer size of "
        "17179869184 bytes."
    )
    assert (mlx.pool, mlx.requested_bytes, mlx.exception_type) == (
        Pool.UNIFIED_MPS,
        19081554496,
        "std::runtime_error",
    )
    assert not list(iter_findings(["std::runtime_error: Attempting to allocate 12 bytes"]))

    go = _event("runtime: VirtualAlloc of 299704320 bytes failed with errno=1455")
    assert (go.pool, go.requested_bytes) == (Pool.SWAP_PAGEFILE, 299704320)
    redis = _event(
        "RedisException: OOM command not allowed when used memory > 'maxmemory'. in /x.php:2212"
    )
    assert (redis.pool, redis.exception_type) == (Pool.RAM, "RedisException")
    mysql = _event("There was an SQL error: Out of memory (Needed 2091016 bytes) - SELECT 1")
    assert (mysql.pool, mysql.requested_bytes) == (Pool.RAM, 2091016)
    innodb = _event("InnoDB: mmap(137363456 bytes) failed; errno 12")
    assert (innodb.pool, innodb.requested_bytes) == (Pool.RAM, 137363456)
    mono = _event(
        "Couldn't extract exception string from exception (another exception of class "
        "'OutOfMemoryException' was thrown while processing the stack trace)"
    )
    assert (mono.pool, mono.exception_type) == (Pool.RAM, "OutOfMemoryException")
    assert _event("   > Not enough memory to run compilation. Try to increase it").pool is Pool.RAM
    assert _event("# Error Code: Out of memory").pool is Pool.RAM
    assert not list(iter_findings(["I saw an Error Code: Out of memory on the page"]))
    wasm = list(iter_findings(["OOM", "exception thrown: abort(OOM). Build with -s ASSERTIONS=1"]))
    assert [(f.line_no, f.event.pool) for f in wasm] == [(1, Pool.RAM)]
    zh = _event("gcc: 致命错误：已杀死 signal terminated program cc1")
    assert zh.pool is Pool.KILLED_BY_OS

    v8 = list(
        iter_findings(
            [
                "# FATAL ERROR: Reached heap limit Allocation failed",
                "",
                "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in v8] == [(1, 2)]
    assert not list(iter_findings(["# Reached heap limit Allocation failed, why?"]))

    vllm = _event(
        "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62"
    )
    assert (vllm.backend, vllm.exception_type) == (Backend.CUDA, "RuntimeError")
    for code in (
        "if (ret == CUDA_ERROR_OUT_OF_MEMORY) {",
        "    return cudaErrorMemoryAllocation;",
        '    std::cerr << "[x.cpp] cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may be fine)" << std::endl;',
    ):
        assert not list(iter_findings([code])), code
    assert _event("cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY").pool is Pool.GPU
    assert not list(
        iter_findings(["ggml_vulkan: No suitable memory type found: ErrorOutOfDeviceMemory"])
    )
    assert _event("ggml_vulkan: Device memory allocation of size 1 failed: ErrorOutOfDeviceMemory")


def test_round_27_tune_shapes() -> None:
    """Round 27's tune part: graphics and game runtimes (Omniverse Kit's Vulkan layer, Unreal's
    dialog and allocator, Source 2's fallback, DXVK's allocator and its flags, Unity's
    allocator, a Vulkan wrapper's 'Out of device memory', Mesa's amdgpu winsys, RPCS3's and
    yuzu's C++ exceptions, a relay naming the code in its own words) and the science stacks
    (tiny-cuda-nn's arena, GLib's g_malloc, a driver code with its number opening a title's
    sentence). Each with its near-miss."""
    kit = _event(
        "[Error] [carb.graphics-vulkan.plugin] Out of GPU memory allocating resource "
        "'MemoryManager-allocate' [size: unknown]"
    )
    assert (kit.pool, kit.backend) == (Pool.GPU, Backend.UNKNOWN)
    tcnn = _event(
        "ERROR    Uncaught exception: Could not allocate memory: C:/tcnn/gpu_memory.h:112 "
        "cudaMalloc(&rawptr, n_bytes+DEBUG_GUARD_SIZE*2) failed with error out of memor"
    )
    assert (tcnn.pool, tcnn.backend) == (Pool.GPU, Backend.CUDA)
    assert not list(iter_findings(["Could not allocate memory for the cache, retrying later"]))
    assert _event("it says Out of video memory trying to allocate a rendering resource").pool is (
        Pool.GPU
    )
    cs2 = _event(
        "[RenderSystem] vmaAllocateMemory failed for DEVICE_LOCAL memory indicating video memory "
        "is full, trying again in system memory as a fallback."
    )
    assert (cs2.pool, cs2.recovered) == (Pool.GPU, True)

    block = [
        "err:   DxvkMemoryAllocator: Memory allocation failed",
        "err:     Size:      25427968",
        "err:     Alignment: 4096",
        "err:     Mem flags: {flags}",
        "err:     Mem types: 0x1",
        "err:   Heap 0: 1216 MB allocated, 931 MB used, 1536 MB budget (driver), 1536 MB total",
        "err:   DxvkMemoryAllocator: Memory allocation failed",
    ]
    vram = list(iter_findings([line.format(flags="0x1") for line in block * 2]))
    assert [(f.line_no, f.event.count) for f in vram] == [(1, 2)]
    assert (vram[0].event.pool, vram[0].event.requested_bytes, vram[0].event.total_bytes) == (
        Pool.GPU,
        25427968,
        1536 * 1024**2,
    )
    host = list(iter_findings([line.format(flags="0x6") for line in block]))
    assert [(f.event.pool, f.event.backend) for f in host] == [(Pool.RAM, Backend.CPU)]

    unity = _event("Could not allocate memory: System out of memory!")
    assert unity.pool is Pool.RAM
    tempest = _event("> ---crashlog(std::system_error(Out of device memory))---")
    assert (tempest.pool, tempest.exception_type) == (Pool.GPU, "std::system_error")
    assert not list(iter_findings(["sometimes I get out of device memory when loading"]))
    mesa = list(
        iter_findings(
            [
                "amdgpu: Failed to allocate a buffer:",
                "amdgpu:    size      : 3490726256 bytes",
                "amdgpu:    alignment : 4096 bytes",
            ]
        )
    )
    assert [(f.line_no, f.event.requested_bytes) for f in mesa] == [(1, 3490726256)]
    rsx = _event(
        "F {RSX [0x03b1f24]} RSX: class std::runtime_error thrown: Assertion Failed! Vulkan API call"
        " failed with unrecoverable error: Out of video memory (VRAM) (VK_ERROR_OUT_OF_DEVICE_MEMORY)"
    )
    assert (rsx.pool, rsx.exception_type) == (Pool.GPU, "std::runtime_error")
    yuzu = list(
        iter_findings(
            [
                "`terminate called after throwing an instance of 'Vulkan::vk::Exception'",
                "  what():  VK_ERROR_OUT_OF_DEVICE_MEMORY",
            ]
        )
    )
    assert [(f.line_no, f.event.exception_type) for f in yuzu] == [(1, "Vulkan::vk::Exception")]
    layers = list(
        iter_findings(
            [
                "[ 34.02] Render.Vulkan <Error> r.cpp:121: Vulkan initialization failed with error: "
                "VK_ERROR_OUT_OF_DEVICE_MEMORY",
                "[ 34.03] HW.GPU <Error> v.cpp:50: Failed to initialize GPU: Vulkan initialization "
                "error VK_ERROR_OUT_OF_DEVICE_MEMORY",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in layers] == [(1, 1)]
    storm = list(iter_findings(["err: VK_ERROR_OUT_OF_DEVICE_MEMORY"] * 2))
    assert [f.event.count for f in storm] == [2]

    glib = _event(
        "(gimp:6970): GLib-ERROR **: 09:50:19.802: gmem.c:105: failed to allocate 1068 bytes"
    )
    assert (glib.pool, glib.requested_bytes) == (Pool.RAM, 1068)
    assert not list(
        iter_findings(["# CUDA_ERROR_OUT_OF_MEMORY (2) when running NPT equilibrium", ""])
    )

    unreal = list(
        iter_findings(
            [
                "LowLevelFatalError [File:G:/UE/RenderingThread.cpp] [Line: 863] ",
                "Rendering thread exception:",
                "LowLevelFatalError [File:G:/UE/GenericPlatformMemory.cpp] [Line: 263] ",
                "Ran out of memory allocating 5894144 (5.6 MiB) bytes with alignment 0. Last error "
                "msg: The paging file is too small for this operation to complete..",
            ]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.requested_bytes) for f in unreal] == [
        (1, Pool.SWAP_PAGEFILE, 5894144)
    ]
    ram = _event("LogWindows: Error: Ran out of memory allocating 4758976 bytes with alignment 16.")
    assert (ram.pool, ram.requested_bytes) == (Pool.RAM, 4758976)


def test_round_27_held_shapes() -> None:
    """Round 27's held part, once spent: PhysX's GPU allocator, LAMMPS' accelerator, CUDA
    programs' own check macros, BFC's rounded refusal (a host BFC's is pinned RAM) folded with
    the runtime's RESOURCE_EXHAUSTED for the same buffer, TensorFlow's unified-memory request,
    Unreal's texture dialog glued to CJK text, DirectDraw's HRESULT, Wine's virtual memory,
    vkd3d's device line and its fallback, Unity's heap probes as one failure, WebGL's
    GL_OUT_OF_MEMORY; aimdo's 'VBAR allocation failed' is no OOM, and a driver code named in a
    title's words stays the user's. Each with its near-miss."""
    physx = _event(
        "PxgCudaDeviceMemoryAllocator fail to allocate memory 100663296 bytes!! Result = 2"
    )
    assert (physx.pool, physx.backend, physx.requested_bytes) == (Pool.GPU, Backend.CUDA, 100663296)
    assert not list(
        iter_findings(["PxgCudaDeviceMemoryAllocator fail to allocate memory 64 bytes"])
    )
    assert _event("ERROR: Insufficient memory on accelerator (src/GPU/gpu_extra.h:38)").pool is (
        Pool.GPU
    )
    for check in (
        "CUDA error !!!!! <out of memory> !!!!! ",
        "Error out of memory at /ws/fftdock/cuda_grid_lig.cu:174 in generating ligand grids",
    ):
        assert _event(check).backend is Backend.CUDA, check

    bfc = list(
        iter_findings(
            [
                "W bfc_allocator.cc:497] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
                "47.20GiB (rounded to 50677266944)requested by op ",
                "W bfc_allocator.cc:508] ************____",
                "E pjrt_stream_executor_client.cc:3084] Execution of replica 0 failed: "
                "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 50677266816 bytes.",
            ]
        )
    )
    assert [(f.line_no, f.event.requested_bytes, f.event.gpu_index) for f in bfc] == [
        (1, 50677266816, 0)
    ]
    host = _event(
        "W bfc_allocator.cc:457] Allocator (xla_gpu_host_bfc) ran out of memory trying to allocate "
        "48.00MiB (rounded to 50331648)requested by op"
    )
    assert (host.pool, host.requested_bytes, dict(host.extra)) == (
        Pool.RAM,
        50331648,
        {"host_memory": "pinned"},
    )
    assert not list(
        iter_findings(
            [
                "W bfc_allocator.cc:275] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
                "2.34GiB with freed_by_count=0. The caller indicates that this is not a failure"
            ]
        )
    )
    unified = _event(
        "E cuda_driver.cc:771] failed to alloc 2147483648 bytes unified memory; result: "
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    )
    assert unified.requested_bytes == 2147483648

    assert (
        _event("頻繁跳Out of video memory trying to allocate a texture! Make sure").pool is Pool.GPU
    )
    assert _event("HRESULT = 0x8876017c (Out of video memory)").pool is Pool.GPU
    wine = _event(
        "err:virtual:allocate_virtual_memory out of memory for allocation, base (nil) size 00670000"
    )
    assert (wine.pool, wine.requested_bytes) == (Pool.RAM, 0x670000)
    vkd3d = list(
        iter_findings(
            [
                "> warn:vkd3d_allocate_device_memory: Failed to allocate device memory, vr -2.",
                "warn:hresult_from_vk_result: Out of device memory.",
            ]
        )
    )
    assert [(f.line_no, f.event.pool) for f in vkd3d] == [(1, Pool.GPU)]
    fallback = _event(
        "vkd3d_allocate_device_memory: Memory allocation failed, falling back to system memory."
    )
    assert (fallback.pool, fallback.recovered) == (Pool.GPU, True)

    probes = [
        f"DynamicHeapAllocator allocation probe {n} failed - Could not get memory for large allocation 6291483."
        for n in (1, 1, 2, 3, 4)
    ]
    unity = list(
        iter_findings(
            [
                *probes,
                "DynamicHeapAllocator out of memory - Could not get memory for large allocation 6291483!",
                "Could not allocate memory: System out of memory!",
            ]
        )
    )
    assert [(f.line_no, f.event.count, f.event.requested_bytes) for f in unity] == [(1, 1, 6291483)]
    gl = list(
        iter_findings(
            [
                "[.WebGL-0E0267C0] GL_OUT_OF_MEMORY: Error allocating Texture2D. HRESULT: 0x8007000E",
                "255[.WebGL-0E0267C0] GL_OUT_OF_MEMORY: Context has been lost.",
            ]
        )
    )
    assert [(f.line_no, f.event.pool, f.event.backend) for f in gl] == [
        (1, Pool.GPU, Backend.UNKNOWN)
    ]

    assert not list(iter_findings(["MemoryError: VBAR allocation failed"]))
    assert _event("MemoryError: VBAR OOM").pool is Pool.GPU
    for title in (
        "# CUDA_ERROR_OUT_OF_MEMORY issue when running test case on 4090 24G GPU machine locally",
        "# Spill over after libcudf++ merge is causing CUDA_ERROR_OUT_OF_MEMORY issues",
        "# [BUG] cudaErrorMemoryAllocation with KOKKOS on Volta GPU",
    ):
        assert not list(iter_findings([title, ""])), title
    assert _event("# CUDA_ERROR_OUT_OF_MEMORY: out of memory").pool is Pool.GPU


def test_round_28_tune_shapes() -> None:
    """Round 28's tune part: edge devices (iOS's per-app memory limit, TensorRT's tactic skips
    on Jetson, torch_npu's Ascend message with its NPU index), cloud platforms (Heroku's R14
    and R15, Lambda's Runtime.OutOfMemory, ECS's container kill, IIS's memory recycle) and
    desktop runtimes (Chromium's renderer OOM code in Electron's dialog, V8's newer banners and
    its OOM handler's frame as the same failure, Gradle's thrashing daemon, UNO's relayed
    bad_alloc, Qt's null image). Each with its near-miss."""
    ios = _event(
        "* thread #53, stop reason = EXC_RESOURCE (RESOURCE_TYPE_MEMORY: high watermark memory "
        "limit exceeded) (limit=1450 MB)"
    )
    assert (ios.pool, dict(ios.extra)["allowed_bytes"]) == (Pool.KILLED_BY_OS, 1450 * 1024**2)
    old = _event("stop reason = EXC_RESOURCE RESOURCE_TYPE_MEMORY (limit=1450 MB, unused=0x0)")
    assert old.pool is Pool.KILLED_BY_OS
    assert not list(iter_findings(["EXC_RESOURCE RESOURCE_TYPE_CPU (limit=50%, observed=100%)"]))
    trt = _event(
        "[W] [TRT] Tactic Device request: 4229MB Available: 2658MB. Device memory is "
        "insufficient to use tactic."
    )
    assert (trt.recovered, trt.requested_bytes, trt.free_bytes) == (
        True,
        4229 * 1024**2,
        2658 * 1024**2,
    )
    npu = _event(
        "RuntimeError: NPU out of memory. Tried to allocate 3.47 GiB (NPU 0; 60.97 GiB total "
        "capacity; 58.92 GiB already allocated; 1.66 GiB free; 58.95 GiB reserved in total)"
    )
    assert (npu.pool, npu.backend, npu.gpu_index, npu.requested_bytes) == (
        Pool.GPU,
        Backend.UNKNOWN,
        0,
        round(3.47 * 1024**3),
    )

    assert _event("heroku[web.1]: Error R14 (Memory quota exceeded)").pool is Pool.RAM
    assert _event("heroku[web.1]: Error R15 (Memory quota vastly exceeded)").pool is (
        Pool.KILLED_BY_OS
    )
    assert not list(iter_findings(["heroku[web.1]: Error R10 (Boot timeout)"]))
    assert _event("failing with the error message `Error Type: Runtime.OutOfMemory`.").pool is (
        Pool.KILLED_BY_OS
    )
    assert _event(
        "Status reason\tOutOfMemoryError: Container killed due to memory usage Exit Code\t137"
    ).pool is (Pool.KILLED_BY_OS)
    iis = _event(
        "Worker Process requested recycle due to 'Percent Memory' limit. Memory Used: 2007666688 "
        "out of 2147012608 available. Exceeded 90 Percent of Memory"
    )
    assert (iis.pool, iis.total_bytes, dict(iis.extra)["usage_bytes"]) == (
        Pool.KILLED_BY_OS,
        2147012608,
        2007666688,
    )

    for dialog in (
        "\"The window terminated unexpecterdly (reason: 'oom', code: '-536870904'\"",
        "{ the window terminated unexpectedly (reason : 'oom' , code:'536870904' )}",
        '# 窗口意外终止，原因:"oom, 代码:-536870904"',
    ):
        assert _event(dialog).pool is Pool.RAM, dialog
    assert not list(
        iter_findings(
            ["The window terminated unexpectedly (reason: 'crashed', code: '-1073741819')"]
        )
    )
    v8 = list(
        iter_findings(
            [
                "# Fatal JavaScript out of memory: Reached heap limit",
                "",
                "# Fatal JavaScript out of memory: Reached heap limit",
                "    3   deno   0x0101b0f440 v8::internal::V8::FatalProcessOutOfMemory(v8::internal::"
                "Isolate*, char const*, v8::OOMDetails const&) + 616",
            ]
        )
    )
    assert [(f.line_no, f.event.count) for f in v8] == [(1, 2)]
    assert _event("# Fatal process out of memory: Oilpan: CagedHeap reservation.").pool is Pool.RAM
    assert _event(
        "The Daemon will expire immediately since the JVM garbage collector is thrashing."
    ).pool is (Pool.RAM)
    assert not list(iter_findings(["The Daemon will expire after the build after running out"]))
    uno = _event("com.sun.star.uno.RuntimeException: C++ code threw St9bad_alloc: std::bad_alloc")
    assert uno.pool is Pool.RAM
    qimage = _event("QImage: out of memory, returning null image")
    assert (qimage.pool, qimage.recovered) == (Pool.RAM, True)


def test_round_28_held_shapes() -> None:
    """Round 28's held part, once spent: the toolchains' heap (MSVC's C1060 and C1002,
    LNK1102, LLVM), Bun, Xcode's and Kaggle's memory kills, Safari's reload, Photopea, Cloud
    Run's limit with its figures, runc's and the ECS agent's OOM kills, ECS's stopped reason
    without an exception type, Android's lmkd and its FATAL EXCEPTION header, ART's growth
    limit as the heap's total, Adreno's KGSL, RKNN's NPU handle, OpenCL's host memory,
    jetson-utils' mapped allocation, and GitHub Actions' per-line stamps. Each with its
    near-miss."""
    for line in (
        "payload.h(16957): fatal error C1060: compiler is out of heap space",
        "x.cpp(365): fatal error C1002: compiler is out of heap space in pass 2",
        "LINK : fatal error LNK1102: out of memory",
        "9>LINK : LLVM error : out of memory",
        "panic(main thread): attempt to unwrap error: OutOfMemory",
        "Bun ran out of memory",
        "This webpage was reloaded because it was using significant memory",
        "Not enough RAM! (Need 3043MB )",
        "jetson.utils -- cudaAllocMapped() failed to allocate memory",
        "Error: CL_OUT_OF_HOST_MEMORY",
    ):
        assert _event(line).pool in (Pool.RAM, Pool.GPU), line
    assert not list(iter_findings(["warning C4756: overflow in constant arithmetic"]))
    assert _event("Not enough RAM! (Need 3043MB )").requested_bytes == 3043 * 1024**2
    for kill in (
        "Message from debugger: Terminated due to memory issue",
        "Your notebook tried to allocate more memory than is available. It has restarted.",
        "starting container process caused: container init was OOM-killed (memory limit too low?)",
        'DockerGoClient: process within container db09 (name: "ecs-x") died due to OOM',
    ):
        assert _event(kill).pool is Pool.KILLED_BY_OS, kill
    run = _event("Memory limit of 512 MiB exceeded with 516 MiB used. Consider increasing")
    assert dict(run.extra) == {"limit_bytes": 512 * 1024**2, "usage_bytes": 516 * 1024**2}
    ecs = _event("OutOfMemoryError: Container killed due to memory usage")
    assert (ecs.pool, ecs.exception_type) == (Pool.KILLED_BY_OS, None)

    lmkd = _event(
        "2024-09-25 10:24:19.378 495-495 lowmemorykiller lmkd I  Kill 'com.google.android.apps."
        "scone' (15964), uid 10137, oom_score_adj 500 to free 92212kB rss, 33036kB swap"
    )
    assert (lmkd.killed_pid, dict(lmkd.extra)) == (
        15964,
        {"process_name": "com.google.android.apps.scone", "vm_rss_bytes": 92212 * 1024},
    )
    art = list(
        iter_findings(
            [
                "E/AndroidRuntime: FATAL EXCEPTION: main",
                "    Process: ai.onnxruntime.example, PID: 21599",
                "    java.lang.OutOfMemoryError: Failed to allocate a 361332168 byte allocation with "
                "8388608 free bytes and 164MB until OOM, target footprint 372920392, growth limit "
                "536870912",
                "        at java.util.Arrays.copyOf(Arrays.java:3670)",
            ]
        )
    )
    assert [(f.line_no, f.event.requested_bytes, f.event.total_bytes) for f in art] == [
        (1, 361332168, 536870912)
    ]
    assert _event(
        "W Adreno-GSL: <gsl_ldd_control:549>: ioctl fd 58 code 0xc0300945 "
        "(IOCTL_KGSL_GPUOBJ_ALLOC) failed: errno 12 Out of memory"
    ).pool is (Pool.GPU)
    assert _event(
        "E RKNN: [10:48:59.683] failed to allocate handle, ret: -1, errno: 12, errstr: Cannot "
        "allocate memory"
    ).pool is (Pool.GPU)
    assert not list(
        iter_findings(["E RKNN: failed to allocate handle, ret: -1, errno: 24, errstr: Too many"])
    )
    actions = list(
        iter_findings(
            [
                "2024-04-14T21:49:58.7397481Z    Compiling x v0.7.1",
                "2024-04-14T22:05:23.8605906Z Killed",
            ]
        )
    )
    assert [(f.line_no, f.event.pool) for f in actions] == [(2, Pool.KILLED_BY_OS)]


def test_round_29_tune_shapes() -> None:
    """Round 29's tune part: accelerators beyond CUDA (XLA on TPU in three wordings, AWS
    Neuron's runtime, Jittor's unified-memory fallback, torch_musa's message), data systems
    (ClickHouse's tracker with its type and figures, Elasticsearch's breakers, Trino's limits,
    DuckDB's buffer manager, YARN's container kills, MongoDB's sort limit, BigQuery, SQL
    Server's 701, Ray's full object store, Arrow's pool, the JVM's Metaspace) and local AI apps
    (exllama's VRAM fit, LM Studio's guardrail). Each with its near-miss."""
    hbm = _event(
        "XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory "
        "in memory space hbm. Used 21.95G of 15.48G hbm."
    )
    assert (hbm.requested_bytes, hbm.total_bytes) == (
        round(21.95 * 1024**3),
        round(15.48 * 1024**3),
    )
    buf = _event(
        "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 196.00M. That "
        "was not possible. There are 134.44M free.; (1x0x0_HBM0)"
    )
    assert (buf.requested_bytes, buf.free_bytes) == (196 * 1024**2, round(134.44 * 1024**2))
    assert _event(
        "Attempting to reserve 6.14G at the bottom of memory. That was not possible."
    ).requested_bytes == round(6.14 * 1024**3)
    assert not list(iter_findings(["That was not possible, said the user"]))
    assert _event("Failed to alloc DEVICE memory: 13743184").requested_bytes == 13743184
    assert _event('RuntimeError: nrt_load_collectives status=4 message="Allocation Failure"')
    jittor = _event(
        "[w 0429] Unable to alloc cuda device memory, use unify memory instead. This may cause low"
    )
    assert (jittor.backend, jittor.recovered) == (Backend.CUDA, True)
    musa = _event("RuntimeError: MUSA out of memory. Tried to allocate 2.00 GiB")
    assert (musa.pool, musa.backend) == (Pool.GPU, Backend.UNKNOWN)

    ch = _event(
        "Code: 241. DB::Exception: Memory limit (total) exceeded: would use 13.94 GiB (attempt to "
        "allocate chunk of 4235716 bytes), maximum: 13.94 GiB"
    )
    assert (ch.pool, ch.exception_type, ch.requested_bytes) == (Pool.RAM, "DB::Exception", 4235716)
    assert dict(ch.extra)["limit_bytes"] == round(13.94 * 1024**3)
    es = _event(
        "[circuit_breaking_exception] [parent] Data too large, data for [<http_request>] would be "
        "[1017560880/970.4mb], which is larger than the limit of [986061209/940.3mb]"
    )
    assert dict(es.extra) == {"usage_bytes": 1017560880, "limit_bytes": 986061209}
    trino = _event(
        "Query exceeded per-node memory limit of 40GB [Allocated: 40.00GB, Delta: 8.71MB, Top"
    )
    assert (trino.requested_bytes, dict(trino.extra)["limit_bytes"]) == (
        round(8.71 * 1024**2),
        40 * 1024**3,
    )
    duck = _event(
        "Out of Memory Error: failed to allocate data of size 128.0 MiB (2.8 GiB/2.9 GiB used)"
    )
    assert duck.requested_bytes == 128 * 1024**2
    assert _event("Error: Out of Memory Error: could not allocate block of 262144 bytes").pool is (
        Pool.RAM
    )
    yarn = _event(
        "Container killed by YARN for exceeding memory limits. 7.2 GB of 4.2 GB virtual memory used."
    )
    assert yarn.pool is Pool.KILLED_BY_OS
    assert dict(_event("Sort exceeded memory limit of 104857600 bytes, but did not").extra) == {
        "limit_bytes": 104857600
    }
    for line in (
        "The query could not be executed in the allotted memory. Peak usage: 123% of limit.",
        "There is insufficient system memory in resource pool 'default' to run this query.",
        "pyarrow.lib.ArrowMemoryError: realloc of size 2172846080 failed",
        "java.lang.OutOfMemoryError: Metaspace",
        "Model loading was stopped due to insufficient system resources",
    ):
        assert _event(line).pool is Pool.RAM, line
    assert _event("RuntimeError: Insufficient VRAM for model and cache").pool is Pool.GPU
    assert not list(iter_findings(["Memory limit (total) of the server is 10 GiB"]))
    assert not list(
        iter_findings(
            [
                'LM Studio told me that "Model loading was stopped due to insufficient system resources"'
            ]
        )
    )


def test_round_29_held_shapes() -> None:
    """Round 29's held part, once spent: XLA on TPU read from its status word (so the type
    before it is read), Tenstorrent's L1 buffers, MindSpore's pinned arena, ClickHouse's
    lower-case wording with its RSS, Elasticsearch's breakers in every shape (a title, ES 5's
    JSON figures, the Java class or the JSON type), Oracle's ORA-04030/04031/27102, the JVM's
    direct buffers, Neo4j's hint and onnxruntime's 'bad allocation'. Each with its near-miss."""
    tpu = _event(
        "UnfilteredStackTrace: RuntimeError: RESOURCE_EXHAUSTED: Ran out of memory in memory "
        "space hbm. Used 9.08G of 7.48G hbm. Exceeded hbm capacity by 1.60G."
    )
    assert (tpu.exception_type, tpu.total_bytes) == ("RuntimeError", round(7.48 * 1024**3))
    assert _event(
        "Out of Memory: Not enough space to allocate 86450176 B L1 buffer across 64 banks"
    ).requested_bytes == (86450176)
    ms = _event(
        "[mindspore/ccsrc/minddata/dataset/util/arena.cc:250] Init] cudaHostAlloc failed, ret[2], out of memory"
    )
    assert (ms.pool, dict(ms.extra)) == (Pool.RAM, {"host_memory": "pinned"})
    ch = _event(
        "Code: 241. DB::Exception: (total) memory limit exceeded: would use 2.07 GiB (attempt to "
        "allocate chunk of 4624776 bytes), current RSS: 63.00 GiB, maximum: 60.00 GiB."
    )
    assert dict(ch.extra)["vm_rss_bytes"] == 63 * 1024**3
    assert _event(
        "# CircuitBreakingException: [in_flight_requests] Data too large"
    ).exception_type == ("CircuitBreakingException")
    es5 = _event(
        '{"error":{"root_cause":[{"type":"circuit_breaking_exception","reason":"[parent] Data too '
        'large, data for [<http_request>] would be larger than limit of [1478832947/1.3gb]",'
        '"bytes_wanted":1478843760,"bytes_limit":1478832947}]'
    )
    assert dict(es5.extra) == {"usage_bytes": 1478843760, "limit_bytes": 1478832947}
    assert not list(iter_findings(["the index is too large to fit, data for [x] is big"]))
    for ora, size in (
        ("ORA-27102: out of memory", None),
        ("ORA-04030: out of process memory when trying to allocate 8392728 bytes", 8392728),
        ('ORA-04031: unable to allocate 41520 bytes of shared memory ("shared pool")', 41520),
    ):
        event = _event(ora)
        assert (event.pool, event.requested_bytes) == (Pool.RAM, size), ora
    direct = _event(
        "java.lang.OutOfMemoryError: Cannot reserve 369295617 bytes of direct buffer memory "
        "(allocated: 1866930914, limit: 2147483648)"
    )
    assert (direct.pool, direct.requested_bytes, dict(direct.extra)) == (
        Pool.RAM,
        369295617,
        {"usage_bytes": 1866930914, "limit_bytes": 2147483648},
    )
    assert _event("There is not enough memory to perform the current task. Please try").pool is (
        Pool.RAM
    )
    assert _event(
        "Non-zero status code returned while running Mul node. Name:'n' Status Message: bad allocation"
    ).pool is (Pool.RAM)


def test_round_30_tune_shapes() -> None:
    """Round 30's tune part: languages' runtimes (PHP's memory_limit and allocator, Julia,
    MATLAB, GHC, OCaml, Erlang's allocators, Ruby, Lua, Zig, Dart), HPC schedulers (PBS,
    Torque, LSF, HTCondor, slurmstepd's kill), and the browser's engines (ArrayBuffer and
    WebAssembly memory, WebLLM's device loss, onnxruntime-web's WebGPU error, Emscripten's
    aborts). Each with its near-miss."""
    php = _event(
        "Fatal error: Allowed memory size of 134217728 bytes exhausted (tried to allocate 81513688 "
        "bytes) in /var/www/x.php on line 46"
    )
    assert (php.requested_bytes, dict(php.extra)) == (81513688, {"limit_bytes": 134217728})
    own = _event("Fatal error: Out of memory (allocated 4194304) (tried to allocate 20480 bytes)")
    assert (own.process_used_bytes, own.requested_bytes) == (4194304, 20480)
    assert _event("OutOfMemoryError()").exception_type == "OutOfMemoryError"
    assert _event("torch.OutOfMemoryError: CUDA out of memory.").pool is Pool.GPU
    matlab = _event("Requested 90816x90816 (61.4GB) array exceeds maximum array size preference.")
    assert matlab.requested_bytes == round(61.4 * 1024**3)
    assert _event("Out of memory. Type HELP MEMORY for your options.").pool is Pool.RAM
    for line in (
        "pursuit: Heap exhausted;",
        "Fatal error: out of memory.",
        "Exception: NoMemoryError: failed to allocate memory",
        "nginx: lua atpanic: Lua VM crashed, reason: not enough memory",
        "error: OutOfMemory",
    ):
        assert _event(line).pool is Pool.RAM, line
    assert not list(iter_findings(["# Fatal error: out of memory when I run it twice"]))
    erl = _event('eheap_alloc: Cannot allocate 4454408120 bytes of memory (of type "old_heap").')
    assert erl.requested_bytes == 4454408120
    assert _event("Exhausted heap space, trying to allocate 240 bytes.").requested_bytes == 240

    pbs = _event("=>> PBS: job killed: mem 38427376kb exceeded limit 33554432kb")
    assert dict(pbs.extra) == {"usage_bytes": 38427376 * 1024, "limit_bytes": 33554432 * 1024}
    for kill in (
        "Job exceeded a memory resource limit (vmem, pvmem, etc.). Job was aborted",
        "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
    ):
        assert _event(kill).pool is Pool.KILLED_BY_OS, kill
    condor = _event("Job has gone over memory limit of 4096 megabytes. Peak usage: 4088 megabytes.")
    assert dict(condor.extra) == {"limit_bytes": 4096 * 1024**2, "usage_bytes": 4088 * 1024**2}
    slurm = _event(
        "slurmstepd: error: Job 42664148 exceeded memory limit (10889240 > 4194304), being killed"
    )
    assert dict(slurm.extra) == {"usage_bytes": 10889240 * 1024, "limit_bytes": 4194304 * 1024}
    assert not list(
        iter_findings(["slurmstepd: error: *** JOB 42664148 CANCELLED DUE TO TIME LIMIT ***"])
    )

    for js in (
        "Uncaught (in promise) RangeError: Array buffer allocation failed",
        "RangeError: WebAssembly.Memory(): could not allocate memory",
        "RangeError: WebAssembly.instantiate(): Out of memory: wasm memory",
        "RuntimeError: Aborted(OOM). Build with -sASSERTIONS for more info.",
        "RuntimeError: abort(out of memory). Build with -s ASSERTIONS=1 for more info.",
    ):
        assert _event(js).pool is Pool.RAM, js
    assert _event(
        "Device was lost during reload. This can happen due to insufficient memory or other GPU"
    ).pool is (Pool.GPU)
    assert _event(
        "[E:onnxruntime:Default, webgpu_context.cc:120] WebGPU device error(2): Out of memory"
    ).pool is (Pool.GPU)
    assert not list(iter_findings(["RuntimeError: memory access out of bounds"]))
