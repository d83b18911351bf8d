"""The stand-in's node classes: ComfyUI's names and inputs, model-free, real memory.

Core nodes keep the class names, inputs and ``python_module`` of ComfyUI v0.8.0 where they exist
(comfyui-facts.md 7), so workflows written for the real thing validate here; their memory use
follows the real shapes (IMAGE is float32 [B, H, W, 3], 12 bytes a pixel; EmptyImage peaks at
about twice its output; ImageBlur works on the GPU). Test nodes (``AllocateRAM``, ``AllocateVRAM``,
``SoftOOM``, ``Sleep``, ``Fail``) let a test ask for exact amounts and exact failures.

Nodes written in ComfyUI's V3 style are marked ``STANDIN_V3``: ``/object_info`` then renders
their combos as ``["COMBO", {"options": [...]}]`` as V3 nodes do.
"""

from __future__ import annotations

import json
import logging
import os
import random
import string
import struct
import time
import zlib
from pathlib import Path
from typing import Any, ClassVar

import standin_api as api
import standin_memory as mem

MAX_RESOLUTION = 16384
UPSCALE_METHODS = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
SEED_MAX = 0xFFFFFFFFFFFFFFFF


class Tensor:
    """A shape plus the memory that backs it (host RAM or the fake GPU)."""

    __slots__ = ("block", "device", "shape")

    def __init__(self, shape: tuple[int, ...], block: Any, device: str = "cpu") -> None:
        self.shape = shape
        self.block = block
        self.device = device

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"tensor(<{dims}> float32, device='{self.device}')"


class MemoryBlob:
    """Held memory; its repr is what ``PreviewAny`` shows."""

    def __init__(self, blocks: list[Any], nbytes: int, where: str) -> None:
        self.blocks = blocks
        self.nbytes = nbytes
        self.where = where

    def __repr__(self) -> str:
        return f"{self.nbytes // mem.MIB} MiB of {self.where}"


def _image_bytes(batch: int, height: int, width: int) -> int:
    return batch * height * width * 3 * 4


def _new_image(batch: int, height: int, width: int, class_type: str) -> Tensor:
    nbytes = mem.scaled_bytes(_image_bytes(batch, height, width), class_type, vram=False)
    return Tensor((batch, height, width, 3), mem.torch_cpu_alloc(nbytes))


# ---- PNG output (with ComfyUI's metadata chunks) ----------------------------------------------
def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_png(path: Path, side: int, text: dict[str, str], level: int) -> None:
    """A small grey PNG carrying ``prompt``/``workflow`` text chunks like ComfyUI's outputs."""
    raw = b"".join(b"\x00" + b"\x80" * (side * 3) for _ in range(side))
    body = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
    for key, value in text.items():
        body += _png_chunk(
            b"tEXt", key.encode("latin-1") + b"\x00" + value.encode("latin-1", "replace")
        )
    body += _png_chunk(b"IDAT", zlib.compress(raw, level)) + _png_chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG header; 512x512 for anything else."""
    try:
        with path.open("rb") as fh:
            head = fh.read(24)
        if head[:8] == b"\x89PNG\r\n\x1a\n":
            width, height = struct.unpack(">II", head[16:24])
            return int(width), int(height)
    except OSError:
        pass
    return 512, 512


def _next_counter(folder: Path, prefix: str) -> int:
    best = 0
    if folder.is_dir():
        for name in os.listdir(folder):
            if name.startswith(prefix + "_") and name.endswith("_.png"):
                middle = name[len(prefix) + 1 : -len("_.png")]
                if middle.isdigit():
                    best = max(best, int(middle))
    return best + 1


# ---- core nodes (nodes.py) -------------------------------------------------------------------
class Node:
    FUNCTION: ClassVar[str] = "run"
    CATEGORY: ClassVar[str] = "_for_testing"
    OUTPUT_NODE: ClassVar[bool] = False
    RETURN_TYPES: ClassVar[tuple[str, ...]] = ()
    DESCRIPTION: ClassVar[str] = ""
    RELATIVE_PYTHON_MODULE: ClassVar[str] = "nodes"
    STANDIN_V3: ClassVar[bool] = False


class EmptyImage(Node):
    CATEGORY = "image"
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "width": ("INT", {"default": 512, "min": 1, "max": MAX_RESOLUTION, "step": 1}),
                "height": ("INT", {"default": 512, "min": 1, "max": MAX_RESOLUTION, "step": 1}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
                "color": (
                    "INT",
                    {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1, "display": "color"},
                ),
            }
        }

    def run(self, width: int, height: int, batch_size: int = 1, color: int = 0) -> tuple[Tensor]:
        # Three single-channel tensors (r, g, b), then their concatenation: the peak is about
        # twice the output, and a failure names the size of one channel, as ComfyUI's does
        # ("you tried to allocate 68719476736 bytes" for 16384x16384x64).
        channel = batch_size * height * width * 4
        channels = [
            mem.torch_cpu_alloc(mem.scaled_bytes(channel, "EmptyImage", vram=False))
            for _ in range(3)
        ]
        out = _new_image(batch_size, height, width, "EmptyImage")
        del channels
        return (out,)


class EmptyLatentImage(Node):
    CATEGORY = "latent"
    RETURN_TYPES = ("LATENT",)
    DESCRIPTION = "Create a new batch of empty latent images to be denoised via sampling."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "width": ("INT", {"default": 512, "min": 16, "max": MAX_RESOLUTION, "step": 8}),
                "height": ("INT", {"default": 512, "min": 16, "max": MAX_RESOLUTION, "step": 8}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    def run(self, width: int, height: int, batch_size: int = 1) -> tuple[dict[str, Tensor]]:
        shape = (batch_size, 4, height // 8, width // 8)
        nbytes = mem.scaled_bytes(
            4 * shape[0] * shape[1] * shape[2] * shape[3], "EmptyLatentImage", vram=False
        )
        return ({"samples": Tensor(shape, api.intermediate_alloc(nbytes))},)


class ImageScaleBy(Node):
    CATEGORY = "image/upscaling"
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "upscale_method": (UPSCALE_METHODS,),
                "scale_by": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 8.0, "step": 0.01}),
            }
        }

    def run(self, image: Tensor, upscale_method: str, scale_by: float) -> tuple[Tensor]:
        batch, height, width, _ = image.shape
        return (
            _new_image(batch, round(height * scale_by), round(width * scale_by), "ImageScaleBy"),
        )


class CheckpointLoaderSimple(Node):
    CATEGORY = "loaders"
    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    DESCRIPTION = "Loads a diffusion model checkpoint."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "ckpt_name": (
                    api.get_filename_list("checkpoints"),
                    {"tooltip": "The name of the checkpoint (model) to load."},
                )
            }
        }

    def run(self, ckpt_name: str) -> tuple[Any, ...]:
        path = api.get_full_path("checkpoints", ckpt_name)
        if path is None:
            raise FileNotFoundError(
                f"Model in folder 'checkpoints' with filename '{ckpt_name}' not found."
            )
        file_bytes = path.stat().st_size
        size = mem.scaled_bytes(file_bytes, "CheckpointLoaderSimple", vram=True)
        model = api.LoadedModel("BaseModel", size)
        # the weights in RAM before they move to the device
        model.host_blocks.append(
            mem.torch_cpu_alloc(mem.scaled_bytes(file_bytes, "CheckpointLoaderSimple", vram=False))
        )
        clip = api.LoadedModel("SDXLClipModel", max(1, size // 8))
        vae = api.LoadedModel("AutoencoderKL", max(1, size // 16))
        return (model, clip, vae)


class StandinSampler(Node):
    """KSampler's inputs and memory pattern: load the model, hold working memory, tick steps."""

    CATEGORY = "sampling"
    RETURN_TYPES = ("LATENT",)
    #: working memory per latent element (activations, attention), a rough SD-like ratio
    WORK_BYTES_PER_LATENT_BYTE = 64

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": ("MODEL",),
                "seed": (
                    "INT",
                    {
                        "default": 0,
                        "min": 0,
                        "max": SEED_MAX,
                        "control_after_generate": True,
                        "tooltip": "The random seed used for creating the noise.",
                    },
                ),
                "steps": ("INT", {"default": 20, "min": 1, "max": 10000}),
                "cfg": (
                    "FLOAT",
                    {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01},
                ),
                "latent_image": ("LATENT",),
                "denoise": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}),
            }
        }

    def run(
        self,
        model: api.LoadedModel,
        seed: int,
        steps: int,
        cfg: float,
        latent_image: dict[str, Tensor],
        denoise: float = 1.0,
    ) -> tuple[dict[str, Tensor]]:
        samples = latent_image["samples"]
        latent_bytes = 4
        for dim in samples.shape:
            latent_bytes *= dim
        api.load_model_gpu(model)
        work_bytes = mem.scaled_bytes(
            latent_bytes * self.WORK_BYTES_PER_LATENT_BYTE, "StandinSampler", vram=True
        )
        work = api.RUNTIME.device.alloc(work_bytes)
        for step in range(1, steps + 1):
            api.progress(step, steps)
        del work
        out = api.intermediate_alloc(mem.scaled_bytes(latent_bytes, "StandinSampler", vram=False))
        return ({"samples": Tensor(samples.shape, out)},)


class VAEDecode(Node):
    CATEGORY = "latent"
    RETURN_TYPES = ("IMAGE",)
    WORK_BYTES_PER_IMAGE_BYTE = 4

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"samples": ("LATENT",), "vae": ("VAE",)}}

    def run(self, samples: dict[str, Tensor], vae: api.LoadedModel) -> tuple[Tensor]:
        batch, _, h8, w8 = samples["samples"].shape
        image_bytes = _image_bytes(batch, h8 * 8, w8 * 8)
        api.load_model_gpu(vae)
        device = api.RUNTIME.device
        try:
            work = device.alloc(
                mem.scaled_bytes(
                    image_bytes * self.WORK_BYTES_PER_IMAGE_BYTE, "VAEDecode", vram=True
                )
            )
        except RuntimeError as exc:
            if not mem.is_oom(exc):
                raise
            api.soft_oom_warning("vae_decode")
            work = device.alloc(mem.scaled_bytes(image_bytes // 2, "VAEDecode", vram=True))
        del work
        return (_new_image(batch, h8 * 8, w8 * 8, "VAEDecode"),)


class LoadImage(Node):
    CATEGORY = "image"
    RETURN_TYPES = ("IMAGE", "MASK")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"image": (api.input_files(), {"image_upload": True})}}

    @classmethod
    def VALIDATE_INPUTS(cls, image: str) -> bool | str:
        if not (api.RUNTIME.input_dir / image).is_file():
            return f"Invalid image file: {image}"
        return True

    def run(self, image: str) -> tuple[Tensor, Tensor]:
        width, height = png_size(api.RUNTIME.input_dir / image)
        mask = Tensor(
            (1, height, width),
            mem.torch_cpu_alloc(mem.scaled_bytes(height * width * 4, "LoadImage", vram=False)),
        )
        return (_new_image(1, height, width, "LoadImage"), mask)


class SaveImage(Node):
    CATEGORY = "image"
    OUTPUT_NODE = True
    DESCRIPTION = "Saves the input images to your ComfyUI output directory."
    FOLDER_TYPE = "output"
    COMPRESS_LEVEL = 4

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "images": ("IMAGE", {"tooltip": "The images to save."}),
                "filename_prefix": ("STRING", {"default": "ComfyUI"}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def _folder(self) -> Path:
        return api.RUNTIME.output_dir

    def run(
        self,
        images: Tensor,
        filename_prefix: str = "ComfyUI",
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> dict[str, Any]:
        folder = self._folder()
        subfolder, _, prefix = filename_prefix.replace("\\", "/").rpartition("/")
        target = folder / subfolder if subfolder else folder
        target.mkdir(parents=True, exist_ok=True)
        counter = _next_counter(target, prefix)
        text: dict[str, str] = {}
        if not api.RUNTIME.disable_metadata:
            if prompt is not None:
                text["prompt"] = json.dumps(prompt)
            for key, value in (extra_pnginfo or {}).items():
                text[key] = json.dumps(value)
        results = []
        batch, height, width, _ = images.shape
        for _ in range(batch):
            # 255. * image.cpu().numpy(): a float32 array per image, where real installs fail
            # under an address-space cap (comfyui-facts.md 11).
            array = mem.numpy_alloc((height, width, 3))
            fname = f"{prefix}_{counter:05}_.png"
            write_png(target / fname, 8, text, self.COMPRESS_LEVEL)
            del array
            results.append({"filename": fname, "subfolder": subfolder, "type": self.FOLDER_TYPE})
            counter += 1
        return {"ui": {"images": results}}


class PreviewImage(SaveImage):
    DESCRIPTION = "Saves the input images to your ComfyUI temp directory."
    FOLDER_TYPE = "temp"
    COMPRESS_LEVEL = 1

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"images": ("IMAGE",)},
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def _folder(self) -> Path:
        return api.RUNTIME.temp_dir

    def run(
        self,
        images: Tensor,
        filename_prefix: str = "ComfyUI",
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> dict[str, Any]:
        suffix = "".join(random.choice(string.ascii_lowercase) for _ in range(5))
        return super().run(images, f"ComfyUI_temp_{suffix}", prompt, extra_pnginfo)


# ---- comfy_extras nodes ----------------------------------------------------------------------
class ImageBlur(Node):
    STANDIN_V3 = True
    CATEGORY = "image/postprocessing"
    RETURN_TYPES = ("IMAGE",)
    RELATIVE_PYTHON_MODULE = "comfy_extras.nodes_post_processing"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "blur_radius": ("INT", {"default": 1, "min": 1, "max": 31, "step": 1}),
                "sigma": ("FLOAT", {"default": 1.0, "min": 0.1, "max": 10.0, "step": 0.1}),
            }
        }

    def run(self, image: Tensor, blur_radius: int, sigma: float) -> tuple[Tensor]:
        batch, height, width, _ = image.shape
        device = api.RUNTIME.device
        # image.to(device), reflect-pad, conv output: about 3x the image on the device.
        copy = device.alloc(
            mem.scaled_bytes(_image_bytes(batch, height, width), "ImageBlur", vram=True)
        )
        pad = device.alloc(
            mem.scaled_bytes(
                _image_bytes(batch, height + 2 * blur_radius, width + 2 * blur_radius),
                "ImageBlur",
                vram=True,
            )
        )
        conv = device.alloc(
            mem.scaled_bytes(_image_bytes(batch, height, width), "ImageBlur", vram=True)
        )
        out = _new_image(batch, height, width, "ImageBlur")
        del copy, pad, conv
        return (out,)


class RepeatImageBatch(Node):
    STANDIN_V3 = True
    CATEGORY = "image/batch"
    RETURN_TYPES = ("IMAGE",)
    RELATIVE_PYTHON_MODULE = "comfy_extras.nodes_images"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "amount": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    def run(self, image: Tensor, amount: int) -> tuple[Tensor]:
        batch, height, width, _ = image.shape
        return (_new_image(batch * amount, height, width, "RepeatImageBatch"),)


class ImageScaleToTotalPixels(Node):
    STANDIN_V3 = True
    CATEGORY = "image/upscaling"
    RETURN_TYPES = ("IMAGE",)
    RELATIVE_PYTHON_MODULE = "comfy_extras.nodes_post_processing"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE",),
                "upscale_method": (UPSCALE_METHODS,),
                "megapixels": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 16.0, "step": 0.01}),
                "resolution_steps": ("INT", {"default": 1, "min": 1, "max": 256}),
            }
        }

    def run(
        self, image: Tensor, upscale_method: str, megapixels: float, resolution_steps: int = 1
    ) -> tuple[Tensor]:
        batch, height, width, _ = image.shape
        scale = (megapixels * 1024 * 1024 / max(1, height * width)) ** 0.5
        new_h = max(resolution_steps, round(height * scale / resolution_steps) * resolution_steps)
        new_w = max(resolution_steps, round(width * scale / resolution_steps) * resolution_steps)
        return (_new_image(batch, new_h, new_w, "ImageScaleToTotalPixels"),)


class PreviewAny(Node):
    CATEGORY = "utils"
    OUTPUT_NODE = True
    RELATIVE_PYTHON_MODULE = "comfy_extras.nodes_preview_any"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"source": ("*", {})}}

    def run(self, source: Any = None) -> dict[str, Any]:
        if isinstance(source, str | int | float | bool) or source is None:
            text = json.dumps(source) if not isinstance(source, str) else source
        else:
            text = repr(source)
        return {"ui": {"text": (text,)}}


# ---- test nodes ------------------------------------------------------------------------------
class _TestNode(Node):
    CATEGORY = "_for_testing/standin"
    RELATIVE_PYTHON_MODULE = "comfy_extras.nodes_standin"


def _optional_value() -> dict[str, Any]:
    return {"value": ("*", {"tooltip": "Passed through; links this node after another."})}


def _step_inputs() -> dict[str, Any]:
    """Allocate in ``steps`` chunks, ``step_delay_ms`` apart: memory climbs visibly."""
    return {
        "steps": ("INT", {"default": 1, "min": 1, "max": 100000}),
        "step_delay_ms": ("INT", {"default": 0, "min": 0, "max": 600000}),
        **_optional_value(),
    }


class AllocateRAM(_TestNode):
    """Real host RAM, allocated in ``steps`` chunks (RSS climbs), held while cached."""

    RETURN_TYPES = ("MEMORY",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"mib": ("INT", {"default": 64, "min": 0, "max": 1 << 24})},
            "optional": _step_inputs(),
        }

    def run(
        self, mib: int, steps: int = 1, step_delay_ms: int = 0, value: Any = None
    ) -> tuple[MemoryBlob]:
        total = mem.scaled_bytes(mib * mem.MIB, "AllocateRAM", vram=False)
        blocks: list[Any] = []
        for step in range(steps):
            chunk = total // steps + (total % steps if step == steps - 1 else 0)
            blocks.append(mem.host_alloc_raw(chunk))
            api.progress(step + 1, steps)
            if step_delay_ms:
                _sleep_checked(step_delay_ms / 1000.0)
        return (MemoryBlob(blocks, total, "host RAM"),)


class AllocateVRAM(_TestNode):
    """``mib`` on the fake GPU (host RAM with ``--cpu``); a CUDA-style OOM past the device."""

    RETURN_TYPES = ("MEMORY",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"mib": ("INT", {"default": 1024, "min": 0, "max": 1 << 24})},
            "optional": _step_inputs(),
        }

    def run(
        self, mib: int, steps: int = 1, step_delay_ms: int = 0, value: Any = None
    ) -> tuple[MemoryBlob]:
        total = mem.scaled_bytes(mib * mem.MIB, "AllocateVRAM", vram=True)
        device = api.RUNTIME.device
        blocks: list[Any] = []
        for step in range(steps):
            chunk = total // steps + (total % steps if step == steps - 1 else 0)
            blocks.append(device.alloc(chunk))
            api.progress(step + 1, steps)
            if step_delay_ms:
                _sleep_checked(step_delay_ms / 1000.0)
        return (MemoryBlob(blocks, total, "VRAM" if device.is_gpu else "host RAM"),)


class SoftOOM(_TestNode):
    """Logs ComfyUI's recoverable OOM warnings; the prompt still succeeds."""

    RETURN_TYPES = ("*",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "kind": (sorted(api.SOFT_OOM_WARNINGS),),
                "count": ("INT", {"default": 1, "min": 0, "max": 1000}),
            },
            "optional": _optional_value(),
        }

    def run(self, kind: str, count: int = 1, value: Any = None) -> tuple[Any]:
        for _ in range(count):
            api.soft_oom_warning(kind)
        return (value,)


def _sleep_checked(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        api.check_interrupt()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.02, left))


class Sleep(_TestNode):
    """Waits, checking for an interrupt every 20 ms and reporting progress ten times."""

    RETURN_TYPES = ("*",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "seconds": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 86400.0, "step": 0.01})
            },
            "optional": _optional_value(),
        }

    def run(self, seconds: float, value: Any = None) -> tuple[Any]:
        ticks = 10
        for tick in range(1, ticks + 1):
            _sleep_checked(seconds / ticks)
            api.progress(tick, ticks)
        return (value,)


FAIL_EXCEPTIONS = [
    "RuntimeError",
    "ValueError",
    "MemoryError",
    "torch.OutOfMemoryError",
    "KeyError",
]


class Fail(_TestNode):
    """Raises the chosen exception with ``message`` (an unrelated error, or a fake OOM)."""

    RETURN_TYPES = ("*",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "message": ("STRING", {"default": "standin failure", "multiline": False}),
                "exception": (FAIL_EXCEPTIONS,),
            },
            "optional": _optional_value(),
        }

    def run(self, message: str, exception: str, value: Any = None) -> tuple[Any]:
        if exception == "torch.OutOfMemoryError":
            raise mem.oom_exception_class()(message)
        raise {
            "RuntimeError": RuntimeError,
            "ValueError": ValueError,
            "MemoryError": MemoryError,
            "KeyError": KeyError,
        }[exception](message)


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "EmptyImage": EmptyImage,
    "EmptyLatentImage": EmptyLatentImage,
    "ImageScaleBy": ImageScaleBy,
    "CheckpointLoaderSimple": CheckpointLoaderSimple,
    "StandinSampler": StandinSampler,
    "VAEDecode": VAEDecode,
    "LoadImage": LoadImage,
    "SaveImage": SaveImage,
    "PreviewImage": PreviewImage,
    "ImageBlur": ImageBlur,
    "RepeatImageBatch": RepeatImageBatch,
    "ImageScaleToTotalPixels": ImageScaleToTotalPixels,
    "PreviewAny": PreviewAny,
    "AllocateRAM": AllocateRAM,
    "AllocateVRAM": AllocateVRAM,
    "SoftOOM": SoftOOM,
    "Sleep": Sleep,
    "Fail": Fail,
}

NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {
    "CheckpointLoaderSimple": "Load Checkpoint",
    "StandinSampler": "KSampler (stand-in)",
    "VAEDecode": "VAE Decode",
    "LoadImage": "Load Image",
    "SaveImage": "Save Image",
    "PreviewImage": "Preview Image",
    "EmptyLatentImage": "Empty Latent Image",
    "ImageScaleBy": "Upscale Image By",
    "ImageBlur": "Image Blur",
    "RepeatImageBatch": "Repeat Image Batch",
    "ImageScaleToTotalPixels": "Scale Image to Total Pixels",
    "PreviewAny": "Preview Any",
}


def object_info_entry(name: str, cls: type, display_names: dict[str, str]) -> dict[str, Any]:
    """One ``/object_info`` entry (comfyui-facts.md 1.7)."""
    inputs = cls.INPUT_TYPES()
    v3 = getattr(cls, "STANDIN_V3", False)
    if v3:
        inputs = {
            section: {
                key: ["COMBO", {**(spec[1] if len(spec) > 1 else {}), "options": list(spec[0])}]
                if isinstance(spec[0], list)
                else list(spec)
                for key, spec in entries.items()
            }
            if isinstance(entries, dict)
            else entries
            for section, entries in inputs.items()
        }
    returns = tuple(cls.RETURN_TYPES)
    info: dict[str, Any] = {
        "input": inputs,
        "input_order": {section: list(entries) for section, entries in inputs.items()},
        "output": list(returns),
        "output_is_list": list(getattr(cls, "OUTPUT_IS_LIST", [False] * len(returns))),
        "output_name": list(getattr(cls, "RETURN_NAMES", returns)),
        "name": name,
        "display_name": display_names.get(name, name),
        "description": getattr(cls, "DESCRIPTION", ""),
        "python_module": getattr(cls, "RELATIVE_PYTHON_MODULE", "nodes"),
        "category": getattr(cls, "CATEGORY", "sd"),
        "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
    }
    if v3:
        info["output_tooltips"] = [None] * len(returns)
        info["deprecated"] = False
        info["experimental"] = False
        info["api_node"] = False
    elif hasattr(cls, "OUTPUT_TOOLTIPS"):
        info["output_tooltips"] = list(cls.OUTPUT_TOOLTIPS)
    return info


def log_node_import_error(name: str) -> None:
    logging.error(f"[ERROR] An error occurred while retrieving information for the '{name}' node.")
