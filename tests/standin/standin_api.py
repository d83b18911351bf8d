"""The stand-in's runtime state and the small API its nodes and custom node packs use.

Real custom nodes import ``comfy.model_management``, ``folder_paths`` and ``nodes``; ours import
this one module instead. It holds what those modules hold in ComfyUI (the device, the VRAM state,
the loaded models, the folder paths, the interrupt flag, the progress hook) and lets a pack change
the memory behaviour of core nodes (``scale_memory``) or test for a core feature (``has_feature``),
which is how the bisect tests build "a node commit that is bad only with the new core".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import standin_memory as mem

MODEL_EXTENSIONS = (".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")

FOLDER_NAMES = (
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "gligen",
    "upscale_models",
    "latent_upscale_models",
    "hypernetworks",
    "photomaker",
    "classifiers",
    "model_patches",
    "audio_encoders",
)
LEGACY_FOLDER_NAMES = {"clip": "text_encoders", "unet": "diffusion_models"}

SOFT_OOM_WARNINGS = {
    "vae_decode": "Warning: Ran out of memory when regular VAE decoding, retrying with tiled VAE decoding.",
    "vae_encode": "Warning: Ran out of memory when regular VAE encoding, retrying with tiled VAE encoding.",
    "attention_empty_cache": "out of memory error, emptying cache and trying again",
    "attention_steps": "out of memory error, increasing steps and trying again 4",
    "sdpa_slice": "scaled_dot_product_attention OOMed: switched to slice attention",
    "softmax": "ran out of memory while running softmax in  _get_attention_scores_no_kv_chunking, trying slower in place softmax instead",
}


@dataclass
class LoadedModel:
    name: str
    size_bytes: int
    loaded_bytes: int = 0
    #: device memory while loaded; dropped by unload_all_models
    blocks: list[Any] = field(default_factory=list)
    #: the weights in host RAM, kept while the model object lives (a cached loader output)
    host_blocks: list[Any] = field(default_factory=list)


@dataclass
class Runtime:
    code_dir: Path = Path(".")
    base_dir: Path = Path(".")
    output_dir: Path = Path("output")
    input_dir: Path = Path("input")
    temp_dir: Path = Path("temp")
    user_dir: Path = Path("user")
    folder_paths: dict[str, list[Path]] = field(default_factory=dict)
    custom_node_dirs: list[Path] = field(default_factory=list)
    device: mem.Device = field(default_factory=lambda: mem.Device(None))
    vram_state: str = "DISABLED"
    gpu_only: bool = False
    reserve_vram_bytes: int = 400 * 1024 * 1024
    disable_smart_memory: bool = False
    disable_metadata: bool = False
    preview: bool = False
    loaded_models: list[LoadedModel] = field(default_factory=list)
    interrupted: threading.Event = field(default_factory=threading.Event)
    #: set by the executor while a node runs: progress(value, total) -> None
    progress_hook: Callable[[float, float], None] | None = None


RUNTIME = Runtime()


# ---- for custom node packs ------------------------------------------------------------------
def has_feature(name: str) -> bool:
    """Whether this core commit has ``name`` (``features`` in ``standin_tuning.json``)."""
    return name in mem.TUNING.features


def scale_memory(class_type: str, factor: float) -> None:
    """Multiply the memory a node class allocates (a pack patching a core node)."""
    mem.TUNING.node_scale[class_type] = mem.TUNING.node_scale.get(class_type, 1.0) * factor


# ---- for nodes ------------------------------------------------------------------------------
def check_interrupt() -> None:
    if RUNTIME.interrupted.is_set():
        RUNTIME.interrupted.clear()
        raise mem.InterruptProcessingException()


def progress(value: float, total: float) -> None:
    check_interrupt()
    hook = RUNTIME.progress_hook
    if hook is not None:
        hook(value, total)


def soft_oom_warning(kind: str) -> None:
    logging.warning(SOFT_OOM_WARNINGS[kind])


def intermediate_alloc(nbytes: int) -> Any:
    """Latents and other intermediates: the GPU with ``--gpu-only``, else host RAM."""
    if RUNTIME.gpu_only and RUNTIME.device.is_gpu:
        return RUNTIME.device.alloc(nbytes)
    return mem.torch_cpu_alloc(nbytes)


def minimum_inference_bytes() -> int:
    return int(0.8 * 1024**3) + RUNTIME.reserve_vram_bytes


def load_model_gpu(model: LoadedModel) -> None:
    """Move a model's weights to the device as ComfyUI's model management would."""
    cuda = RUNTIME.device.cuda
    if cuda is None or model in RUNTIME.loaded_models:
        return
    logging.info(f"Requested to load {model.name}")
    size = model.size_bytes
    free = cuda.device_free_bytes() + cuda.cached_bytes
    usable = max(0, free - minimum_inference_bytes())
    if RUNTIME.vram_state == "NO_VRAM":
        target = 0
    elif RUNTIME.vram_state == "HIGH_VRAM":
        target = size
    elif RUNTIME.vram_state == "LOW_VRAM":
        target = min(size, int(usable / 1.3))
    else:
        target = min(size, usable)
    if target:
        model.blocks.append(mem.GpuBlock(cuda, target))
    model.loaded_bytes = target
    mb = 1024 * 1024
    if target >= size:
        logging.info(
            f"loaded completely; {usable / mb:.2f} MB usable, {target / mb:.2f} MB loaded, "
            f"full load: True"
        )
    else:
        logging.info(
            f"loaded partially; {usable / mb:.2f} MB usable, {target / mb:.2f} MB loaded, "
            f"{(size - target) / mb:.2f} MB offloaded, 0.00 MB buffer reserved, lowvram patches: 0"
        )
    RUNTIME.loaded_models.append(model)


def unload_all_models() -> None:
    count = len(RUNTIME.loaded_models)
    for model in RUNTIME.loaded_models:
        model.blocks.clear()
        model.loaded_bytes = 0
    RUNTIME.loaded_models.clear()
    RUNTIME.device.empty_cache()
    if count:
        logging.info(f"{count} models unloaded.")


# ---- folder paths ---------------------------------------------------------------------------
def get_folder_paths(folder: str) -> list[Path]:
    folder = LEGACY_FOLDER_NAMES.get(folder, folder)
    return list(RUNTIME.folder_paths.get(folder, []))


def get_filename_list(folder: str, extensions: tuple[str, ...] = MODEL_EXTENSIONS) -> list[str]:
    """Relative paths with OS separators, as ComfyUI lists model files."""
    names: set[str] = set()
    for root in get_folder_paths(folder):
        if not root.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(root, followlinks=True):
            for fname in files:
                if fname.lower().endswith(extensions):
                    rel = os.path.relpath(os.path.join(dirpath, fname), root)
                    names.add(rel)
    return sorted(names)


def get_full_path(folder: str, filename: str) -> Path | None:
    for root in get_folder_paths(folder):
        candidate = root / filename
        if candidate.is_file():
            return candidate
    return None


def input_files() -> list[str]:
    root = RUNTIME.input_dir
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if p.is_file() and p.name.lower().endswith(IMAGE_EXTENSIONS)
    )
