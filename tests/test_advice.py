"""Advice: ordered by what most likely helps, specific to the pool and the evidence, never harmful."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest

from oom_sentinel.daemon.classify import classify_record, scan_stream
from oom_sentinel.daemon.classify.advice import (
    Advice,
    AdviceContext,
    ComfyInstance,
    GpuProcess,
    advise,
    human_bytes,
    reserve_vram_gb,
)
from oom_sentinel.daemon.classify.events import Backend, OomEvent, OtherProcess, Pool

GiB, MiB = 1024**3, 1024**2
CORPUS = Path(__file__).parent / "corpus"


def _gpu_event(**fields: object) -> OomEvent:
    base = OomEvent(
        pool=Pool.GPU, backend=Backend.CUDA, recovered=False, message="CUDA out of memory."
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def _keys(advice: list[Advice]) -> list[str]:
    return [a.key for a in advice]


def test_other_gpu_processes_come_first_and_set_the_reserve_vram_value() -> None:
    event = _gpu_event(
        requested_bytes=20 * MiB,
        total_bytes=24 * GiB,
        other_processes=(OtherProcess(1234, 2 * GiB),),
        other_process_named=True,
    )
    advice = advise(event)
    keys = _keys(advice)
    assert keys[0] == "close-other-gpu-processes" and "pid 1234 (2.00 GiB)" in advice[0].text
    assert keys.index("lower-resolution") < keys.index("lowvram") < keys.index("reserve-vram")
    assert "--reserve-vram 2.5 " in advice[keys.index("reserve-vram")].text


def test_context_names_the_other_programs_and_the_second_instance() -> None:
    ctx = AdviceContext(
        other_gpu_processes=(
            GpuProcess(4321, "chrome.exe", 1536 * MiB),
            GpuProcess(77, "obs64.exe", 512 * MiB),
        ),
        other_instances=(ComfyInstance(999, 8189, 6 * GiB),),
    )
    advice = advise(_gpu_event(total_bytes=12 * GiB), ctx)
    assert _keys(advice)[:2] == ["close-other-gpu-processes", "stop-second-instance"]
    assert "chrome.exe (pid 4321, 1.50 GiB)" in advice[0].text and "obs64.exe" in advice[0].text
    assert "port 8189" in advice[1].text and "--cuda-device" in advice[1].text
    reserve = next(a for a in advice if a.key == "reserve-vram")
    assert "--reserve-vram 2.5 " in reserve.text  # 2 GiB + headroom, rounded up to 0.5 GB


def test_no_evidence_of_other_programs_means_no_reserve_vram_guess() -> None:
    keys = _keys(advise(_gpu_event(message="Allocation on device", rule="cuda-alloc-on-device")))
    assert "reserve-vram" not in keys and "close-other-gpu-processes" not in keys
    assert keys[-1] == "lowvram"


def test_memory_outside_comfyui_counts_as_other_programs() -> None:
    event = _gpu_event(
        total_bytes=24 * GiB,
        other_process_named=True,
        extra=(("outside_process_bytes", round(1.18 * GiB)),),
    )
    advice = advise(event)
    assert (
        advice[0].key == "close-other-gpu-processes"
        and "1.18 GiB of the 24.00 GiB card was held outside ComfyUI" in advice[0].text
    )
    assert "--reserve-vram 1.5 " in next(a.text for a in advice if a.key == "reserve-vram")


def test_a_container_pid_that_is_comfyui_itself_is_called_out() -> None:
    event = _gpu_event(
        other_processes=(OtherProcess(20398, round(14.52 * GiB)),),
        allocated_bytes=round(14.06 * GiB),
    )
    assert "container" in advise(event)[0].text


def test_fragmentation_gets_expandable_segments_right_after_other_programs() -> None:
    event = _gpu_event(
        pool=Pool.GPU_FRAGMENTATION,
        requested_bytes=3 * GiB,
        reserved_unallocated_bytes=round(4.84 * GiB),
        other_processes=(OtherProcess(1, GiB),),
    )
    advice = advise(event)
    assert _keys(advice)[:2] == ["close-other-gpu-processes", "expandable-segments"]
    assert (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in advice[1].text
        and "4.84 GiB" in advice[1].text
    )


def test_fragmentation_in_torch_2_0s_message_format_gets_max_split_size_instead() -> None:
    """'... 3.46 GiB reserved in total by PyTorch' (reserved_bytes) is torch <= 2.0, which has
    no expandable segments; the hint such a message carries names max_split_size_mb."""
    event = _gpu_event(
        pool=Pool.GPU_FRAGMENTATION,
        requested_bytes=20 * MiB,
        allocated_bytes=round(3.40 * GiB),
        reserved_unallocated_bytes=round(3.46 * GiB) - round(3.40 * GiB),
        reserved_bytes=round(3.46 * GiB),
    )
    keys = _keys(advise(event))
    assert "max-split-size" in keys and "expandable-segments" not in keys
    text = next(a.text for a in advise(event) if a.key == "max-split-size")
    assert "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:" in text
    already = AdviceContext(alloc_conf="max_split_size_mb:64")
    assert "max-split-size" not in _keys(advise(event, already))


def test_rocm_fragmentation_names_the_hip_variable() -> None:
    event = _gpu_event(
        pool=Pool.GPU_FRAGMENTATION,
        backend=Backend.ROCM,
        requested_bytes=2 * MiB,
        reserved_unallocated_bytes=15 * GiB,
    )
    assert "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True" in advise(event)[0].text


@pytest.mark.parametrize(
    ("pool", "conf"),
    [
        (Pool.GPU, None),
        (Pool.GPU_FRAGMENTATION, "expandable_segments:True"),
        (Pool.GPU_FRAGMENTATION, "backend:cudaMallocAsync"),
    ],
    ids=["not-fragmented", "already-set", "cudamallocasync"],
)
def test_expandable_segments_only_for_fragmentation_it_can_fix(
    pool: Pool, conf: str | None
) -> None:
    event = _gpu_event(
        pool=pool,
        requested_bytes=GiB,
        reserved_unallocated_bytes=2 * GiB if pool is Pool.GPU_FRAGMENTATION else 0,
    )
    assert "expandable-segments" not in _keys(advise(event, AdviceContext(alloc_conf=conf)))


def test_highvram_on_a_small_card_is_dropped_first_among_flags() -> None:
    ctx = AdviceContext(launch_flags=("--highvram",), total_vram_bytes=8 * GiB)
    keys = _keys(advise(_gpu_event(), ctx))
    assert keys.index("drop-highvram") < keys.index("lowvram")
    big = AdviceContext(launch_flags=("--highvram",), total_vram_bytes=48 * GiB)
    assert "drop-highvram" not in _keys(advise(_gpu_event(), big))


def test_flags_already_in_effect_move_to_the_next_step() -> None:
    assert "novram" in _keys(advise(_gpu_event(), AdviceContext(launch_flags=("--lowvram",))))
    keys = _keys(advise(_gpu_event(), AdviceContext(launch_flags=("--novram",))))
    assert "lowvram" not in keys and "novram" not in keys
    event = _gpu_event(other_processes=(OtherProcess(5, 512 * MiB),))
    text = next(
        a.text
        for a in advise(event, AdviceContext(launch_flags=("--reserve-vram", "2")))
        if a.key == "reserve-vram"
    )
    assert "--reserve-vram 2.5 " in text


@pytest.mark.parametrize(
    ("others", "current", "expected"),
    [
        (256 * MiB, None, 0.5),
        (2 * GiB, None, 2.5),
        (round(1.18 * GiB), None, 1.5),
        (GiB, 3.0, 3.5),
        (GiB, 0.05, 1.5),
    ],
)
def test_reserve_vram_is_rounded_up_to_half_gigabytes(
    others: int, current: float | None, expected: float
) -> None:
    assert reserve_vram_gb(others, current) == expected


def test_node_specific_workload_advice() -> None:
    assert _keys(advise(_gpu_event(node_type="VAEDecode")))[0] == "tiled-vae"
    loader = _keys(advise(_gpu_event(node_type="CheckpointLoaderSimple")))
    assert loader[0] == "smaller-model"
    assert "fewer-frames" in _keys(advise(_gpu_event(node_type="WanVideoSampler")))
    assert "fewer-frames" not in _keys(advise(_gpu_event(node_type="KSampler")))


def test_an_allocation_larger_than_the_card_says_no_setting_makes_it_fit() -> None:
    advice = advise(
        _gpu_event(requested_bytes=128 * GiB, total_bytes=round(15.56 * GiB), node_type="KSampler")
    )
    assert advice[0].key == "allocation-larger-than-card" and "128.00 GiB" in advice[0].text


def test_ram_on_windows_suggests_the_page_file_and_on_linux_swap() -> None:
    windows = classify_record(
        "DefaultCPUAllocator: not enough memory: you tried to allocate 2359296 bytes."
    )
    linux = classify_record(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes. Error code 12"
    )
    assert windows is not None and linux is not None
    assert _keys(advise(windows))[:2] == ["close-other-apps", "increase-page-file"]
    keys = _keys(advise(linux, AdviceContext(total_ram_bytes=24 * GiB)))
    assert keys[:3] == ["close-other-apps", "allocation-larger-than-ram", "add-swap"]
    assert {"fewer-models", "shorter-clips"} <= set(keys)


def test_page_file_comes_first_for_os_error_1455() -> None:
    event = classify_record(
        "OSError: The paging file is too small for this operation to complete. (os error 1455)"
    )
    assert event is not None and _keys(advise(event))[0] == "increase-page-file"


def test_apple_unified_memory_advice_closes_apps_and_warns_about_the_watermark() -> None:
    event = OomEvent(
        pool=Pool.UNIFIED_MPS,
        backend=Backend.MPS,
        recovered=False,
        message="MPS backend out of memory",
    )
    keys = _keys(advise(event))
    assert keys[0] == "close-other-apps" and keys[-1] == "mps-watermark-caution"
    assert "lowvram" not in keys


def test_os_kills_name_the_killer_and_the_cgroup_limit() -> None:
    cgroup = OomEvent(
        pool=Pool.KILLED_BY_OS,
        backend=Backend.CPU,
        recovered=False,
        message="",
        killer="kernel",
        killed_pid=1,
        extra=(("scope", "cgroup"), ("anon_rss_bytes", 3 * GiB)),
    )
    advice = advise(cgroup)
    assert advice[0].key == "raise-memory-limit" and "3.00 GiB" in advice[0].text
    early = replace(cgroup, killer="earlyoom", extra=(("vm_rss_bytes", 29 * GiB),))
    assert _keys(advise(early))[:2] == ["earlyoom", "close-other-apps"]
    nohang = replace(cgroup, killer="nohang", extra=())
    nohang_advice = advise(nohang)
    assert _keys(nohang_advice)[:2] == ["nohang", "close-other-apps"]
    assert "nohang.conf" in nohang_advice[0].text
    bare = OomEvent(pool=Pool.KILLED_BY_OS, backend=Backend.CPU, recovered=False, message="Killed")
    assert _keys(advise(bare))[:2] == ["close-other-apps", "add-swap"]


def test_recovered_events_need_no_action() -> None:
    event = OomEvent(
        pool=Pool.GPU,
        backend=Backend.UNKNOWN,
        recovered=True,
        message="out of memory error, emptying cache and trying again",
        count=18,
    )
    (only,) = advise(event)
    assert only.key == "recovered" and "18 times" in only.text and "oom-bisect" in only.text


FORBIDDEN = [
    re.compile(r"reinstall", re.IGNORECASE),
    re.compile(r"empty_cache", re.IGNORECASE),
    re.compile(r"pip install", re.IGNORECASE),
]


def _corpus_events() -> list[OomEvent]:
    return [
        f.event
        for path in sorted(CORPUS.glob("*.txt"))
        for f in scan_stream(io.BytesIO(path.read_bytes()))
    ]


CONTEXTS = [
    None,
    AdviceContext(launch_flags=("--highvram",), total_vram_bytes=6 * GiB, platform="win32"),
    AdviceContext(
        launch_flags=("--lowvram", "--reserve-vram", "1"),
        platform="linux",
        total_ram_bytes=16 * GiB,
    ),
    AdviceContext(
        other_gpu_processes=(GpuProcess(1, "x", GiB),),
        other_instances=(ComfyInstance(2),),
        alloc_conf="backend:cudaMallocAsync",
    ),
]


@pytest.mark.parametrize("ctx", CONTEXTS, ids=["none", "highvram-small", "lowvram", "others"])
def test_advice_for_every_corpus_event_is_present_unique_and_never_harmful(
    ctx: AdviceContext | None,
) -> None:
    events = _corpus_events()
    assert len(events) >= 60
    for event in events:
        advice = advise(event, ctx)
        assert advice, event
        keys = _keys(advice)
        assert len(keys) == len(set(keys)), keys
        for item in advice:
            assert item.key and item.text.strip()
            for pattern in FORBIDDEN:
                assert not pattern.search(item.text), (item.key, item.text)
            if "--highvram" in item.text:
                assert item.key == "drop-highvram"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "?"),
        (0, "0 bytes"),
        (1023, "1023 bytes"),
        (2 * GiB, "2.00 GiB"),
        (184 * MiB, "184.00 MiB"),
    ],
)
def test_human_bytes(n: int | None, text: str) -> None:
    assert human_bytes(n) == text


def _corpus_event(name: str) -> OomEvent:
    findings = list(scan_stream(io.BytesIO((CORPUS / name).read_bytes())))
    assert len(findings) == 1
    return findings[0].event


def test_pinned_host_ram_oom_leads_with_disable_pinned_memory_not_vram_advice() -> None:
    event = _corpus_event("pinned_mmap_release_qwen.txt")
    keys = [a.key for a in advise(event)]
    assert keys[0] == "disable-pinned-memory"
    assert "--disable-pinned-memory" in advise(event)[0].text
    assert "wsl-memory-cap" in keys
    assert "lowvram" not in " ".join(keys) and "expandable-segments" not in keys


def test_pinned_on_windows_skips_the_wsl_cap() -> None:
    event = _corpus_event("pinned_mmap_release_ltxv.txt")
    keys = [a.key for a in advise(event, AdviceContext(platform="win32"))]
    assert keys[0] == "disable-pinned-memory" and "wsl-memory-cap" not in keys


def test_mps_buffer_limit_names_the_size_and_says_the_watermark_does_not_help() -> None:
    event = _corpus_event("mps_invalid_buffer_supir_title.txt")
    advice = advise(event)
    assert advice[0].key == "mps-buffer-limit" and "8.21 GiB" in advice[0].text
    assert advice[-1].key == "mps-watermark-no-help"
    assert all(a.key != "mps-watermark-caution" for a in advice)


def test_mps_allocator_oom_still_gets_the_watermark_caution() -> None:
    event = _corpus_event("mps_report_vae_decode.txt")
    assert any(a.key == "mps-watermark-caution" for a in advise(event))


def test_videohelpersuite_memory_stop_leads_with_its_frame_settings() -> None:
    event = _corpus_event("node_hint_vhs_memory_limit_title.txt")
    advice = advise(event)
    assert advice[0].key == "vhs-fewer-frames" and "frame_load_cap" in advice[0].text


def test_supir_hint_without_torch_message_is_a_gpu_oom_with_supir_advice() -> None:
    text = "It's likely that too large of an image or batch_size for SUPIR was used, and it has devoured all of the memory it had reserved, you may need to restart ComfyUI. Make sure you are using tiled_vae,  you can also try using fp8 for reduced memory usage if your system supports it.\n"
    event = classify_record(text)
    assert event is not None and event.pool is Pool.GPU
    assert dict(event.extra)["node_pack"] == "ComfyUI-SUPIR"
    assert "supir-tiled" in [a.key for a in advise(event)]


def test_acestep_preflight_refusal_leads_with_its_own_settings_and_what_holds_the_card() -> None:
    event = _corpus_event("node_hint_kaola_ace_step_vram_preflight_insufficient_free_vram.txt")
    first = advise(event)[0]
    assert first.key == "acestep-preflight"
    assert "batch size or audio duration" in first.text and "unload" in first.text.lower()
    # with some VRAM free, the advice does not claim the card was full
    roomy = replace(event, free_bytes=4 * 1024**3)
    assert "almost nothing was free" not in advise(roomy)[0].text


@pytest.mark.parametrize(
    "text",
    [
        "c++: internal compiler error: Killed (program cc1plus)\n",
        "virtual memory exhausted: Cannot allocate memory\n",
    ],
)
def test_a_compiler_out_of_memory_is_advised_as_a_build_not_a_workflow(text: str) -> None:
    event = classify_record(text)
    assert event is not None
    assert [a.key for a in advise(event)] == ["build-fewer-jobs"]


def test_a_hosted_runtime_kill_names_the_runtime_not_the_machines_swap() -> None:
    event = classify_record("Your session crashed after using all available RAM.\n")
    assert event is not None and event.pool is Pool.KILLED_BY_OS
    keys = [a.key for a in advise(event)]
    assert keys[0] == "hosted-runtime-ram"
    assert (
        "add-swap" not in keys and "wsl-memory-cap" not in keys and "close-other-apps" not in keys
    )


def test_a_kernel_kill_on_linux_mentions_the_wsl_memory_cap_but_a_cgroup_kill_does_not() -> None:
    system = _corpus_event("killed_bare_and_kernel.txt")
    assert "wsl-memory-cap" in [a.key for a in advise(system)]
    findings = list(
        scan_stream(io.BytesIO((CORPUS / "kernel_memcg_kills_journal.txt").read_bytes()))
    )
    cgroup = findings[0].event
    assert dict(cgroup.extra)["scope"] == "cgroup"
    assert "wsl-memory-cap" not in [a.key for a in advise(cgroup)]


def test_a_pack_that_raised_its_own_worded_oom_is_named_in_the_advice() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/ComfyUI/custom_nodes/ComfyUI-SomeUpscaler/nodes.py", line 88, in upscale\n'
        '    raise RuntimeError("Out of memory: lower the tile size")\n'
        "RuntimeError: Out of memory: lower the tile size\n"
    )
    event = classify_record(text)
    assert event is not None and event.pool is Pool.GPU
    keys = [a.key for a in advise(event)]
    own = next(a for a in advise(event) if a.key == "node-pack-own-oom")
    assert "ComfyUI-SomeUpscaler" in own.text
    # the pack's own knobs come before the generic workload advice
    assert keys.index("node-pack-own-oom") < keys.index("lower-resolution")
    # a pack with words of its own keeps them, not the generic ones
    vhs = _corpus_event("node_hint_vhs_memory_limit_title.txt")
    assert "node-pack-own-oom" not in [a.key for a in advise(vhs)]


def test_a_desktop_renderer_oom_says_it_was_the_window_not_the_server() -> None:
    event = _corpus_event("desktop_render_process_gone_reason_oom_twice_electron_log.txt")
    keys = [a.key for a in advise(event)]
    assert keys[0] == "desktop-renderer-oom"
    assert "add-swap" not in keys and "cache-none" not in " ".join(keys)


@pytest.mark.parametrize(
    ("corpus_file", "key", "words"),
    [
        (
            "vllm_v0_docker_compose_no_available_memory_for_cache_blocks_qwen05b.txt",
            "vllm-cache-memory",
            "gpu_memory_utilization",
        ),
        (
            "rocm_title_ollama_error_loading_model_unable_to_allocate_rocm0_buffer.txt",
            "ggml-fewer-layers",
            "n_gpu_layers",
        ),
        (
            "ggml_docker_compose_prefix_cudamalloc_storm_device_1_kv_cache_update.txt",
            "ggml-fewer-layers",
            "n_ctx",
        ),
        (
            "vllm_v091_free_memory_on_device_31_44_of_47_38_gib_engine_core_failed.txt",
            "vllm-startup-free-memory",
            "gpu_memory_utilization",
        ),
        (
            "sglang_pr_ci_valueerror_loaded_weights_leave_no_gpu_memory_kv_cache.txt",
            "sglang-mem-fraction",
            "--mem-fraction-static",
        ),
        (
            "jax_xla_resource_exhausted_7406166528_bytes_alphafold.txt",
            "xla-preallocation",
            "XLA_PYTHON_CLIENT_PREALLOCATE=false",
        ),
        (
            "gpu_tf_blog_cnn3d_resource_exhausted_bfc_count3.txt",
            "tf-allow-growth",
            "TF_FORCE_GPU_ALLOW_GROWTH=true",
        ),
    ],
)
def test_a_runtime_that_refused_gpu_memory_in_its_own_words_leads_with_its_own_levers(
    corpus_file: str, key: str, words: str
) -> None:
    advice = advise(_corpus_event(corpus_file))
    assert advice[0].key == key and words in advice[0].text


def test_a_torch_oom_gets_no_runtime_levers() -> None:
    event = classify_record(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which 1.20 GiB is free.\n"
    )
    assert event is not None
    assert not {
        "vllm-cache-memory",
        "ggml-fewer-layers",
        "xla-preallocation",
        "tf-allow-growth",
    } & set(_keys(advise(event)))


def test_swarmuis_overload_warning_leads_with_its_own_words_not_a_packs_tile_size() -> None:
    event = classify_record(
        "15:56:37.001 [Warning] Your system memory usage exceeded 98.2% just before the backend process failed. This might indicate a memory overload.\n"
    )
    assert event is not None
    first = advise(event)[0]
    assert first.key == "swarmui-memory-overload" and "paging file" in first.text
    assert "node-pack-own-oom" not in _keys(advise(event))
