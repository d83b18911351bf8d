"""What to try after an out-of-memory failure, in the order most likely to help, from the evidence.

The order follows the seed guide (DESIGN.md §3): first whatever else holds the memory (other
GPU programs, a second ComfyUI instance), then the workload (resolution, batch size 1, fewer
frames, a smaller or quantized model, splitting the workflow), then one launch flag at a time
(``--lowvram``, ``--reserve-vram N`` with N computed from what other programs were seen to
hold). For fragmentation the allocator setting that fixes it
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) comes right after the other programs,
because the evidence says the memory is there, only in pieces. RAM, the Windows page file,
Apple's unified memory and OS kills get their own lists.

Some things are never suggested, whatever the event: reinstalling torch (it does not change
how much memory a workflow needs), ``torch.cuda.empty_cache()`` (ComfyUI already frees its
cache before retrying; it does not make a bigger allocation fit), and ``--highvram`` on a
small card (it keeps models resident and makes OOMs likelier). A test checks every text.

Pure: the caller (diagnose, the snapshot writer) passes what it knows in ``AdviceContext``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oom_sentinel.daemon.classify.events import Backend, OomEvent, Pool
from oom_sentinel.daemon.core.units import GIB, MIB, format_bytes

__all__ = [
    "Advice",
    "AdviceContext",
    "ComfyInstance",
    "GpuProcess",
    "advise",
    "human_bytes",
    "reserve_vram_gb",
]

#: "small card": --highvram/--gpu-only are called out below this much VRAM
SMALL_CARD_BYTES = 16 * GIB
#: other programs holding less than this are not worth a --reserve-vram
_RESERVE_MIN_BYTES = 256 * MIB
_VAE_WORDS = ("VAEDecode", "VAEEncode", "VAE Decode", "VAE Encode", "Decode")
_VIDEO_WORDS = ("Video", "Wan", "Hunyuan", "HyVideo", "LTX", "Cog", "AnimateDiff", "Mochi", "Frame")


@dataclass(frozen=True, slots=True)
class Advice:
    """One suggestion: a stable ``key`` for machines, a sentence for people."""

    key: str
    text: str


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """Another process seen on the GPU (NVML, or the OOM message)."""

    pid: int
    name: str | None = None
    bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ComfyInstance:
    """Another ComfyUI instance on the same machine."""

    pid: int
    port: int | None = None
    bytes: int | None = None


@dataclass(frozen=True, slots=True)
class AdviceContext:
    """What the daemon knows beyond the message. Every field is optional; unknown is None/()."""

    other_gpu_processes: tuple[GpuProcess, ...] = ()
    other_instances: tuple[ComfyInstance, ...] = ()
    #: ComfyUI's command-line flags in effect (``("--lowvram", "--reserve-vram", "1.0")``)
    launch_flags: tuple[str, ...] = ()
    total_vram_bytes: int | None = None
    total_ram_bytes: int | None = None
    #: ``sys.platform`` of the machine ComfyUI runs on: "linux", "win32", "darwin"
    platform: str | None = None
    #: ``PYTORCH_CUDA_ALLOC_CONF`` in ComfyUI's environment
    alloc_conf: str | None = None


def human_bytes(n: int | None) -> str:
    """Advice's spelling of ``units.format_bytes``: ``"2.00 GiB"``, ``"12 bytes"``, None → ``"?"``."""
    return format_bytes(n, "?", byte_unit="bytes")


def reserve_vram_gb(others_bytes: int, current_gb: float | None = None) -> float:
    """ComfyUI's ``--reserve-vram`` value (GB, 0.5 steps) that leaves room for ``others_bytes``.

    ComfyUI sizes its model loads from the VRAM free when it loads; what other programs take
    afterwards is what ``--reserve-vram`` keeps back. A quarter GiB of headroom is added, and
    the value never goes below what is already set plus one step.
    """
    gb = math.ceil((others_bytes + 256 * MIB) / (512 * MIB)) * 0.5
    if current_gb is not None:
        gb = max(gb, math.floor(current_gb * 2) / 2 + 0.5)
    return gb


def _flag_value(flags: tuple[str, ...], name: str) -> str | None:
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            return flags[i + 1]
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return None


def _has_flag(flags: tuple[str, ...], *names: str) -> bool:
    return any(f == n or f.startswith(n + "=") for f in flags for n in names)


def _platform(event: OomEvent, ctx: AdviceContext) -> str | None:
    if ctx.platform:
        return ctx.platform
    if (
        event.pool is Pool.SWAP_PAGEFILE
        or "not enough memory" in event.message
        or "WinError" in event.message
    ):
        return "win32"  # DefaultCPUAllocator says "not enough memory" on Windows only
    if event.pool is Pool.UNIFIED_MPS:
        return "darwin"
    if event.pool is Pool.KILLED_BY_OS or "can't allocate memory" in event.message:
        return "linux"
    return None


def advise(event: OomEvent, context: AdviceContext | None = None) -> list[Advice]:
    """Ordered advice for ``event`` (most promising first), specific to its pool and evidence."""
    ctx = context or AdviceContext()
    if event.recovered:
        return _recovered(event)
    if event.rule in _BUILD_RULES:  # killed or out of RAM, a build's lever is the same
        return _build_advice()
    if event.rule == "v8-heap-oom":  # Node's own heap cap, not the machine's RAM
        return [
            Advice(
                "node-heap-limit",
                "Node.js stopped at its own heap limit, not the machine's: raise it with NODE_OPTIONS=--max-old-space-size=4096 (MiB) in the environment that runs the build, or build with fewer pages or workers at once.",
            )
        ]
    if event.rule == "java-heap-oom":  # the VM's own heap cap, not the machine's RAM
        return [
            Advice(
                "java-heap-limit",
                "The Java VM stopped at its own heap limit, not the machine's: raise it with -Xmx (e.g. -Xmx8g) where the program is started (on Android the per-app heap: android:largeHeap, or decode smaller bitmaps).",
            )
        ]
    if event.pool is Pool.KILLED_BY_OS:
        return _killed(event, ctx)
    if event.pool is Pool.RAM:
        return _ram(event, ctx)
    if event.pool is Pool.SWAP_PAGEFILE:
        return _pagefile(event, ctx)
    if event.pool is Pool.UNIFIED_MPS:
        return _mps(event, ctx)
    return _gpu(event, ctx)


# -- GPU ---------------------------------------------------------------------------------------


def _others(event: OomEvent, ctx: AdviceContext) -> tuple[list[str], int | None]:
    """Descriptions of other GPU users and the bytes they hold (None when unknown)."""
    names: list[str] = []
    total = 0
    known = False
    if ctx.other_gpu_processes:
        for p in ctx.other_gpu_processes:
            label = f"{p.name or 'pid'} (pid {p.pid}" + (
                f", {human_bytes(p.bytes)})" if p.bytes is not None else ")"
            )
            names.append(label)
            if p.bytes is not None:
                total += p.bytes
                known = True
    elif event.other_processes:
        for o in event.other_processes:
            names.append(
                f"pid {o.pid}" + (f" ({human_bytes(o.bytes)})" if o.bytes is not None else "")
            )
            if o.bytes is not None:
                total += o.bytes
                known = True
    else:
        outside = dict(event.extra).get("outside_process_bytes")
        if isinstance(outside, int) and outside > 0:
            total, known = outside, True
    return names, (total if known else None)


def _gpu(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    out: list[Advice] = []
    names, others_bytes = _others(event, ctx)
    if names:
        text = f"Close other programs that use the GPU: {', '.join(names)}."
        if (
            not ctx.other_gpu_processes
            and len(event.other_processes) == 1
            and event.process_used_bytes is None
            and event.allocated_bytes is not None
            and (event.other_processes[0].bytes or 0) >= event.allocated_bytes
        ):
            text += (
                " (If ComfyUI runs in a container, that PID may be ComfyUI itself seen from the host;"
                " then nothing else holds the card.)"
            )
        elif event.total_bytes and others_bytes:
            text += f" They held {human_bytes(others_bytes)} of the {human_bytes(event.total_bytes)} card."
        out.append(Advice("close-other-gpu-processes", text))
    elif event.other_process_named:
        held = (
            f"{human_bytes(others_bytes)} of the {human_bytes(event.total_bytes)} card was held outside ComfyUI when it ran out"
            if others_bytes is not None and event.total_bytes
            else "the message shows another process holding GPU memory"
        )
        out.append(
            Advice(
                "close-other-gpu-processes",
                f"Close other programs that use the GPU (browsers with hardware acceleration, games, other AI tools): {held}.",
            )
        )
    for inst in ctx.other_instances:
        where = f" on port {inst.port}" if inst.port else ""
        held = f", holding {human_bytes(inst.bytes)}" if inst.bytes is not None else ""
        out.append(
            Advice(
                "stop-second-instance",
                f"Another ComfyUI instance (pid {inst.pid}{where}{held}) shares the GPU: stop it, or put it on another GPU with --cuda-device.",
            )
        )
    fragmented = event.pool is Pool.GPU_FRAGMENTATION
    if fragmented:
        out.extend(_expandable_segments(event, ctx))
    out.extend(_node_pack_advice(event))
    out.extend(_runtime_advice(event))
    out.extend(_gpu_workload(event))
    out.extend(_gpu_flags(event, ctx, others_bytes))
    return out


def _expandable_segments(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    if event.backend not in (Backend.CUDA, Backend.ROCM, Backend.UNKNOWN):
        return []
    conf = ctx.alloc_conf or ""
    if "expandable_segments:True" in conf or "cudaMallocAsync" in conf:
        return []
    var = "PYTORCH_HIP_ALLOC_CONF" if event.backend is Backend.ROCM else "PYTORCH_CUDA_ALLOC_CONF"
    why = ""
    if event.reserved_unallocated_bytes is not None and event.requested_bytes is not None:
        why = (
            f"{human_bytes(event.reserved_unallocated_bytes)} sat reserved by PyTorch but unallocated,"
            f" more than the {human_bytes(event.requested_bytes)} it asked for: the memory was there, in pieces. "
        )
    if event.reserved_bytes is not None:
        # only torch up to 2.0 prints '... reserved in total by PyTorch' (reserved_bytes); its
        # allocator has no expandable segments, only a cap on the blocks it splits
        if "max_split_size_mb" in conf:
            return []
        return [
            Advice(
                "max-split-size",
                f"{why}This message's format is torch 2.0's or older, which has no expandable segments: set {var}=max_split_size_mb:128 in the environment that starts ComfyUI (or update torch and use expandable_segments:True).",
            )
        ]
    return [
        Advice(
            "expandable-segments",
            f"{why}Set {var}=expandable_segments:True in the environment that starts ComfyUI, so the allocator can grow segments instead of needing one free block.",
        )
    ]


def _gpu_workload(event: OomEvent) -> list[Advice]:
    node = event.node_type or ""
    out: list[Advice] = []
    if event.requested_bytes and event.total_bytes and event.requested_bytes > event.total_bytes:
        out.append(
            Advice(
                "allocation-larger-than-card",
                f"One allocation of {human_bytes(event.requested_bytes)} is larger than the whole card ({human_bytes(event.total_bytes)}): no setting makes it fit; check the image size, resolution and batch widgets feeding {node or 'the failing node'}.",
            )
        )
    if any(word in node for word in _VAE_WORDS):
        out.append(
            Advice(
                "tiled-vae",
                f"Replace {node} with its tiled version (VAE Decode (Tiled) / VAE Encode (Tiled)) and lower the tile size if it still fails.",
            )
        )
    at = f" in {node}" if node else ""
    loader = "Loader" in node or "Load" in node
    resolution = Advice(
        "lower-resolution",
        f"Lower the resolution{at}: memory grows with the pixel count (width × height), so 1024² needs about four times what 512² needs.",
    )
    batch = Advice(
        "batch-size-1",
        "Use batch size 1 (check batch_size in Empty Latent Image and any batch or repeat nodes).",
    )
    frames = Advice(
        "fewer-frames",
        "For video, generate fewer frames (length) per run, or render in shorter segments and join them.",
    )
    model = Advice(
        "smaller-model",
        "Use a smaller or quantized model (fp8, GGUF Q8/Q5), or load the text encoder in fp8 / on the CPU.",
    )
    split = Advice(
        "split-workflow",
        "Split the workflow: save intermediates (latents, images) and run the heavy stages as separate prompts, so their models are never loaded together.",
    )
    if loader:
        out += [model, split, resolution, batch]
    else:
        out += [resolution, batch]
        if any(word in node for word in _VIDEO_WORDS) or not node:
            out.append(frames)
        out += [model, split]
    return out


def _gpu_flags(event: OomEvent, ctx: AdviceContext, others_bytes: int | None) -> list[Advice]:
    flags = ctx.launch_flags
    out: list[Advice] = []
    small = ctx.total_vram_bytes is None or ctx.total_vram_bytes < SMALL_CARD_BYTES
    if _has_flag(flags, "--highvram", "--gpu-only") and small:
        card = f" on this {human_bytes(ctx.total_vram_bytes)} card" if ctx.total_vram_bytes else ""
        out.append(
            Advice(
                "drop-highvram",
                f"Remove --highvram / --gpu-only{card}: they keep every model (and with --gpu-only every intermediate) in VRAM.",
            )
        )
    if _has_flag(flags, "--novram", "--cpu"):
        return out  # already as lean as ComfyUI goes; the workload advice above is what is left
    if _has_flag(flags, "--lowvram"):
        out.append(
            Advice(
                "novram",
                "ComfyUI already runs with --lowvram; as the next step try --novram (slower: weights stay in RAM and stream in).",
            )
        )
    else:
        out.append(
            Advice(
                "lowvram",
                "Try one launch flag at a time, first --lowvram: ComfyUI then loads models in parts and offloads the rest to RAM.",
            )
        )
    if (
        others_bytes is not None
        and others_bytes >= _RESERVE_MIN_BYTES
        and event.backend is not Backend.DIRECTML
    ):
        current = _flag_value(flags, "--reserve-vram")
        try:
            current_gb = float(current) if current is not None else None
        except ValueError:
            current_gb = None
        gb = reserve_vram_gb(others_bytes, current_gb)
        out.append(
            Advice(
                "reserve-vram",
                f"If other programs must stay open, start ComfyUI with --reserve-vram {gb:g} so it leaves about {gb:g} GB for the {human_bytes(others_bytes)} they use; ComfyUI sizes its loads from the VRAM free at load time.",
            )
        )
    return out


# -- host memory -------------------------------------------------------------------------------


def _ram_common(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    out = [
        Advice(
            "close-other-apps",
            "Close other programs that use a lot of RAM (browsers, other AI tools, games) before running the workflow.",
        )
    ]
    if (
        event.requested_bytes
        and ctx.total_ram_bytes
        and event.requested_bytes > ctx.total_ram_bytes
    ):
        out.append(
            Advice(
                "allocation-larger-than-ram",
                f"One allocation of {human_bytes(event.requested_bytes)} is larger than this machine's RAM ({human_bytes(ctx.total_ram_bytes)}): check the image/video size and batch feeding {event.node_type or 'the failing node'}.",
            )
        )
    elif event.requested_bytes and event.requested_bytes >= 1024 * GIB:
        out.append(
            Advice(
                "absurd-allocation",
                f"An allocation of {human_bytes(event.requested_bytes)} usually means an input far larger than intended (an un-resized image, a wrong size or count widget).",
            )
        )
    return out


def _ram_workload() -> list[Advice]:
    return [
        Advice(
            "fewer-models",
            "Use fewer models per workflow (every checkpoint, LoRA stack, text encoder and upscaler stays in RAM while cached), or split the workflow into separate prompts.",
        ),
        Advice(
            "shorter-clips",
            "For video, load and process shorter clips (fewer frames, or frame skipping in the video loader).",
        ),
        Advice(
            "smaller-model",
            "Use smaller or quantized models (fp8, GGUF) so less has to sit in RAM.",
        ),
        Advice(
            "cache-none",
            "If it happens late in long workflows, start ComfyUI with --cache-none (or --cache-lru with a small number) so cached outputs of earlier nodes do not stay in RAM.",
        ),
    ]


def _page_file_advice() -> Advice:
    return Advice(
        "increase-page-file",
        "Let Windows manage the page file size (System > About > Advanced system settings > Performance > Virtual memory), or set it to at least 1.5× your RAM, on a drive with that much free space; models are mapped into memory while they load.",
    )


def _wsl_cap_advice() -> Advice:
    return Advice(
        "wsl-memory-cap",
        "Under WSL2 the Linux VM gets only part of Windows' RAM (half by default): raise memory= under [wsl2] in %UserProfile%\\.wslconfig, then run `wsl --shutdown` and start again.",
    )


def _pinned(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    """CUDA's ``out of memory`` while ComfyUI pinned host RAM: the RAM, not the card, ran out."""
    out = [
        Advice(
            "disable-pinned-memory",
            "This CUDA 'out of memory' came from pinning host RAM (page-locked memory for fast offloading), not from the card: start ComfyUI with --disable-pinned-memory (ComfyUI pins up to 95 % of RAM on Linux, 45 % on Windows).",
        ),
        *_ram_common(event, ctx),
    ]
    if _platform(event, ctx) != "win32":
        out.append(_wsl_cap_advice())
    return out + _ram_workload()


def _runtime_advice(event: OomEvent) -> list[Advice]:
    """The levers of the inference runtimes nodes call that refuse GPU memory in their own
    words: vLLM's KV cache, ggml's (llama.cpp's) offloaded layers and context, and the two
    frameworks that take most of the card when they start (JAX's XLA client, TensorFlow)."""
    if event.rule == "sglang-no-kv-memory":
        return [
            Advice(
                "sglang-mem-fraction",
                "SGLang's weights left no room for its KV cache within --mem-fraction-static: raise it (if nothing else needs the card), lower --context-length or --max-running-requests, or use a smaller or quantized model.",
            )
        ]
    if event.rule == "vllm-startup-free-memory":
        return [
            Advice(
                "vllm-startup-free-memory",
                "vLLM found less free memory on the card at start-up than gpu_memory_utilization asks for: another process holds part of it (ComfyUI, a second vLLM), so stop it or lower gpu_memory_utilization to what is free.",
            )
        ]
    if event.rule == "xla-resource-exhausted":
        return [
            Advice(
                "xla-preallocation",
                "JAX (XLA) takes 75 % of the card when it starts and asked for more: beside another GPU user such as ComfyUI's torch, set XLA_PYTHON_CLIENT_PREALLOCATE=false or a smaller XLA_PYTHON_CLIENT_MEM_FRACTION (e.g. 0.3); alone, lower the batch or the input size.",
            )
        ]
    if event.rule == "tf-resource-exhausted":
        return [
            Advice(
                "tf-allow-growth",
                "TensorFlow maps nearly all of the card when it starts: beside another GPU user such as ComfyUI's torch, set TF_FORCE_GPU_ALLOW_GROWTH=true (or tf.config.experimental.set_memory_growth); alone, lower the batch size or the input shape it named.",
            )
        ]
    if event.rule == "vllm-no-cache-memory":
        return [
            Advice(
                "vllm-cache-memory",
                "vLLM had no GPU memory left for its KV cache after loading the model: raise gpu_memory_utilization (if nothing else needs the card), lower max_model_len or max_num_seqs, or use a smaller or quantized model.",
            )
        ]
    if event.rule == "ggml-buffer-alloc" or (
        event.rule == "cuda-error-oom" and "cudaMalloc" in event.message
    ):
        return [
            Advice(
                "ggml-fewer-layers",
                "The GGUF runtime (llama.cpp / ggml) could not get a device buffer: offload fewer layers to the GPU (-ngl / n_gpu_layers), lower the context size (-c / n_ctx) or the batch size, or use a smaller quantization.",
            )
        ]
    return []


def _node_pack_advice(event: OomEvent) -> list[Advice]:
    """What the custom-node pack that printed its own OOM stop or hint itself recommends."""
    pack = dict(event.extra).get("node_pack")
    if pack == "ComfyUI-VideoHelperSuite":
        return [
            Advice(
                "vhs-fewer-frames",
                "VideoHelperSuite stopped loading because the frames would not fit in RAM: lower frame_load_cap, raise select_every_nth, set a smaller custom_width/custom_height, or feed the video through a Meta Batch Manager.",
            )
        ]
    if pack == "ComfyUI-SUPIR":
        return [
            Advice(
                "supir-tiled",
                "SUPIR ran out of memory: enable use_tiled_vae (smaller encoder/decoder tile sizes), use the tiled sampler, fp8 for the UNet, or a smaller image or scale_by; restart ComfyUI afterwards, as SUPIR says its reserved memory may stay taken.",
            )
        ]
    if pack == "ACE-Step":
        free = event.free_bytes
        nearly_none = free is not None and free < 256 * MIB
        return [
            Advice(
                "acestep-preflight",
                "ACE-Step checked free VRAM before generating and refused: lower its batch size or audio duration, as it says"
                + (
                    "; almost nothing was free when it checked, so models loaded before it (its language model, another workflow's checkpoint) still hold the card: unload them first (ComfyUI's Unload Models, or --lowvram / --novram so ComfyUI offloads them)."
                    if nearly_none
                    else ", or free VRAM by unloading the models loaded before it."
                ),
            )
        ]
    if pack == "SwarmUI":
        return [
            Advice(
                "swarmui-memory-overload",
                "SwarmUI saw the system's memory nearly full when its ComfyUI backend died: close background programs, enlarge the paging file (or swap), or run a smaller or quantized model (GGUF Q4), as it suggests.",
            )
        ]
    if isinstance(pack, str) and pack:
        # a pack this module has no words for (classify names the pack whose frame raised a
        # worded OOM): what such packs expose, and where the pack itself documents it
        return [
            Advice(
                "node-pack-own-oom",
                f"The custom node pack {pack} raised this out-of-memory error itself, not torch: lower its node's tile size, batch or frame count, or switch it to lower precision or CPU offload if it offers them; its README and issue tracker say which of its settings use memory.",
            )
        ]
    return []


#: a compiler that ran out of RAM while building an extension (a custom node's CUDA kernels,
#: flash-attn or sageattention from source): the build's parallelism is the lever, not ComfyUI
_BUILD_RULES = frozenset({"compiler-killed", "gcc-memory-exhausted", "buildkit-resource-exhausted"})


def _build_advice() -> list[Advice]:
    return [
        Advice(
            "build-fewer-jobs",
            "The compiler ran out of RAM while building an extension, not while ComfyUI ran a workflow: build with fewer parallel jobs (MAX_JOBS=2 for a pip build of CUDA kernels, make -j2, a smaller Docker build), add swap for the build, or install a prebuilt wheel instead.",
        )
    ]


def _ram(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    if dict(event.extra).get("host_memory") == "pinned":
        return _pinned(event, ctx)
    if event.rule == "renderer-oom":
        return [_renderer_advice(), *_ram_common(event, ctx)]
    pack = _node_pack_advice(event)
    if pack:
        return [*pack, *_ram_common(event, ctx), *_ram_workload()]
    out = _ram_common(event, ctx)
    if _platform(event, ctx) == "win32":
        out.append(_page_file_advice())
    elif _platform(event, ctx) == "linux":
        out.append(
            Advice(
                "add-swap",
                "Add or enlarge swap so a peak can spill to disk instead of failing (slower, but the prompt finishes).",
            )
        )
    return out + _ram_workload()


def _renderer_advice() -> Advice:
    """ComfyUI Desktop's window (Electron's renderer) died, not the server: the prompt may have
    run on; what filled it is the page (a huge workflow, many image or video previews)."""
    return Advice(
        "desktop-renderer-oom",
        "It was the ComfyUI Desktop window (its renderer) that ran out of memory, not the server running the workflow: reload the window, keep fewer large image or video previews on the canvas (clear the queue's history, collapse preview nodes), and split very large workflows.",
    )


def _pagefile(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    return [_page_file_advice(), *_ram_common(event, ctx), *_ram_workload()]


def _mps(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    if event.rule == "mps-invalid-buffer":
        return _mps_buffer(event)
    out = [
        Advice(
            "close-other-apps",
            "On Apple silicon the GPU shares memory with everything else: close other apps (browsers, other AI tools) before running the workflow.",
        )
    ]
    out += [a for a in _gpu_workload(event) if a.key != "allocation-larger-than-card"]
    out.append(
        Advice(
            "mps-watermark-caution",
            "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0, which the message suggests, only removes the safety limit: the system may swap hard or freeze. Use it last, if at all.",
        )
    )
    return out


def _mps_buffer(event: OomEvent) -> list[Advice]:
    """Metal refused one buffer over the device's size limit: no amount of free memory helps."""
    size = human_bytes(event.requested_bytes) if event.requested_bytes else "one tensor"
    return [
        Advice(
            "mps-buffer-limit",
            f"Metal refused a single buffer of {size}: one tensor is larger than the GPU may allocate at once, however much memory is free. Make that tensor smaller: lower the resolution, frame count or batch size of {event.node_type or 'the failing node'}, or use its tiled variant (VAE Decode (Tiled), a tiled upscaler).",
        ),
        Advice(
            "mps-fp16",
            "Use fp16 (or a quantized model) instead of fp32 where the node allows it: the same tensor then needs half the bytes.",
        ),
        Advice(
            "mps-watermark-no-help",
            "PYTORCH_MPS_HIGH_WATERMARK_RATIO does not lift this limit (it caps the total, not one buffer); leave it alone for this error.",
        ),
    ]


# -- killed by the OS ----------------------------------------------------------------------------


#: kills by a hosted runtime's own memory monitor (Colab, Hugging Face Spaces): the machine's
#: swap, other programs and WSL are not the user's to change there
_HOSTED_KILLS = frozenset({"colab-ram-crash", "container-memory-limit", "hosted-memory-limit"})


def _killed(event: OomEvent, ctx: AdviceContext) -> list[Advice]:
    extra = dict(event.extra)
    rss = extra.get("anon_rss_bytes") or extra.get("vm_rss_bytes")
    held = f" (it held {human_bytes(rss)} when killed)" if isinstance(rss, int) else ""
    if event.rule in _HOSTED_KILLS:
        return [
            Advice(
                "hosted-runtime-ram",
                "The hosted runtime restarted the session because it used all the RAM the plan gives it (Colab's dialog, a Space's memory limit): pick a high-RAM runtime or a larger hardware tier, or load less at once.",
            ),
            *_ram_workload(),
        ]
    out: list[Advice] = []
    if extra.get("scope") == "cgroup":
        out.append(
            Advice(
                "raise-memory-limit",
                f"The kill came from a memory limit on ComfyUI's cgroup{held} (a container's --memory, a unit's MemoryMax=), not from the whole machine running out: raise that limit or lower what the workflow loads.",
            )
        )
    if event.killer == "earlyoom":
        out.append(
            Advice(
                "earlyoom",
                f"earlyoom ended ComfyUI at its threshold{held}; it did its job. Free RAM, or loosen earlyoom's -m/-s limits if they are stricter than you want.",
            )
        )
    elif event.killer == "nohang":
        out.append(
            Advice(
                "nohang",
                f"nohang ended ComfyUI at its memory threshold{held}; it did its job. Free RAM, or loosen the thresholds in nohang.conf (soft_threshold_min_mem, hard_threshold_min_mem) if they are stricter than you want.",
            )
        )
    elif event.killer == "systemd-oomd":
        out.append(
            Advice(
                "systemd-oomd",
                "systemd-oomd killed the unit under memory pressure; free RAM, or relax ManagedOOMMemoryPressureLimit= for ComfyUI's unit if the kill was too eager.",
            )
        )
    out.append(
        Advice(
            "close-other-apps",
            f"The operating system killed ComfyUI because RAM ran out{held if not out else ''}: close other programs that use a lot of RAM before running the workflow.",
        )
    )
    if _platform(event, ctx) != "win32":
        out.append(
            Advice(
                "add-swap",
                "Add or enlarge swap so a peak can spill to disk instead of killing the process (slower, but the prompt finishes).",
            )
        )
        if extra.get("scope") != "cgroup":
            out.append(_wsl_cap_advice())
    return out + _ram_workload()


def _recovered(event: OomEvent) -> list[Advice]:
    times = f" ({event.count} times)" if event.count > 1 else ""
    return [
        Advice(
            "recovered",
            f"ComfyUI recovered from this out-of-memory{times} by retrying with tiling or smaller slices; nothing failed. If it starts happening on every run after an update, memory use has grown: compare the install states with oom-bisect.",
        )
    ]
