"""Command-line flags of the stand-in ComfyUI, named and typed as ComfyUI v0.8.0 declares them.

Why a template: oom-bisect reads ``comfy/cli_args.py`` at every commit to drop flags that commit
does not know (an old ComfyUI exits 2 with ``error: unrecognized arguments``). The repo builder in
``tests/standin_repos.py`` writes this file into a temporary repo as ``comfy/cli_args.py``, removing
the lines of flags that "did not exist yet" at early commits. Keep one ``add_argument`` per line so
that line filter stays trivial. ``main.py`` loads ``comfy/cli_args.py`` when present, else this file.

The flag names, types, defaults and mutually exclusive groups follow comfyui-facts.md section 4;
the help texts are our own.
"""

from __future__ import annotations

import argparse
import enum
import os
from pathlib import Path


class LatentPreviewMethod(enum.Enum):
    NoPreviews = "none"
    Auto = "auto"
    Latent2RGB = "latent2rgb"
    TAESD = "taesd"

    def __str__(self) -> str:
        return self.value


class PerformanceFeature(enum.Enum):
    Fp16Accumulation = "fp16_accumulation"
    Fp8MatrixMultiplication = "fp8_matrix_mult"
    CublasOps = "cublas_ops"
    AutoTune = "autotune"

    def __str__(self) -> str:
        return self.value


def is_valid_directory(path: str) -> str:
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is not a valid directory.")
    return path


CODE_DIR = Path(__file__).resolve().parent
if CODE_DIR.name == "comfy":
    CODE_DIR = CODE_DIR.parent
DATABASE_DEFAULT_PATH = CODE_DIR / "user" / "comfyui.db"

# fmt: off
parser = argparse.ArgumentParser()

parser.add_argument("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::", help="Addresses to listen on, comma separated; without a value: all IPv4 and IPv6.")
parser.add_argument("--port", type=int, default=8188, help="Listen port.")
parser.add_argument("--tls-keyfile", type=str, help="TLS key file (enables https with --tls-certfile).")
parser.add_argument("--tls-certfile", type=str, help="TLS certificate file.")
parser.add_argument("--enable-cors-header", type=str, default=None, metavar="ORIGIN", nargs="?", const="*", help="Allow cross-origin requests.")
parser.add_argument("--max-upload-size", type=float, default=100, help="Maximum upload size in MB.")

parser.add_argument("--base-directory", type=str, default=None, help="Root for models, custom_nodes, input, output, temp and user.")
parser.add_argument("--extra-model-paths-config", type=str, default=None, metavar="PATH", nargs="+", action="append", help="Extra model paths yaml files.")
parser.add_argument("--output-directory", type=str, default=None, help="Output directory.")
parser.add_argument("--temp-directory", type=str, default=None, help="Parent of the temp directory.")
parser.add_argument("--input-directory", type=str, default=None, help="Input directory.")
parser.add_argument("--auto-launch", action="store_true", help="Open the UI in a browser.")
parser.add_argument("--disable-auto-launch", action="store_true", help="Never open a browser.")
parser.add_argument("--cuda-device", type=int, default=None, metavar="DEVICE_ID", help="The CUDA device to use (sets CUDA_VISIBLE_DEVICES).")
parser.add_argument("--default-device", type=int, default=None, metavar="DEFAULT_DEVICE_ID", help="The default device; the others stay visible.")
cm_group = parser.add_mutually_exclusive_group()
cm_group.add_argument("--cuda-malloc", action="store_true", help="Use the cudaMallocAsync allocator.")
cm_group.add_argument("--disable-cuda-malloc", action="store_true", help="Never use cudaMallocAsync.")

fp_group = parser.add_mutually_exclusive_group()
fp_group.add_argument("--force-fp32", action="store_true", help="Force fp32.")
fp_group.add_argument("--force-fp16", action="store_true", help="Force fp16.")

fpunet_group = parser.add_mutually_exclusive_group()
fpunet_group.add_argument("--fp32-unet", action="store_true", help="Diffusion model in fp32.")
fpunet_group.add_argument("--fp64-unet", action="store_true", help="Diffusion model in fp64.")
fpunet_group.add_argument("--bf16-unet", action="store_true", help="Diffusion model in bf16.")
fpunet_group.add_argument("--fp16-unet", action="store_true", help="Diffusion model in fp16.")
fpunet_group.add_argument("--fp8_e4m3fn-unet", action="store_true", help="Diffusion model weights in fp8_e4m3fn.")
fpunet_group.add_argument("--fp8_e5m2-unet", action="store_true", help="Diffusion model weights in fp8_e5m2.")
fpunet_group.add_argument("--fp8_e8m0fnu-unet", action="store_true", help="Diffusion model weights in fp8_e8m0fnu.")

fpvae_group = parser.add_mutually_exclusive_group()
fpvae_group.add_argument("--fp16-vae", action="store_true", help="VAE in fp16.")
fpvae_group.add_argument("--fp32-vae", action="store_true", help="VAE in fp32.")
fpvae_group.add_argument("--bf16-vae", action="store_true", help="VAE in bf16.")
parser.add_argument("--cpu-vae", action="store_true", help="Run the VAE on the CPU.")

fpte_group = parser.add_mutually_exclusive_group()
fpte_group.add_argument("--fp8_e4m3fn-text-enc", action="store_true", help="Text encoder weights in fp8_e4m3fn.")
fpte_group.add_argument("--fp8_e5m2-text-enc", action="store_true", help="Text encoder weights in fp8_e5m2.")
fpte_group.add_argument("--fp16-text-enc", action="store_true", help="Text encoder in fp16.")
fpte_group.add_argument("--fp32-text-enc", action="store_true", help="Text encoder in fp32.")
fpte_group.add_argument("--bf16-text-enc", action="store_true", help="Text encoder in bf16.")

parser.add_argument("--force-channels-last", action="store_true", help="Channels-last memory format.")
parser.add_argument("--directml", type=int, nargs="?", metavar="DIRECTML_DEVICE", const=-1, help="Use DirectML.")
parser.add_argument("--oneapi-device-selector", type=str, default=None, metavar="SELECTOR_STRING", help="oneAPI device selector.")
parser.add_argument("--disable-ipex-optimize", action="store_true", help="No ipex.optimize.")
parser.add_argument("--supports-fp8-compute", action="store_true", help="Assume fp8 compute support.")

parser.add_argument("--preview-method", type=LatentPreviewMethod, default=LatentPreviewMethod.NoPreviews, choices=list(LatentPreviewMethod), help="Latent preview method.")
parser.add_argument("--preview-size", type=int, default=512, help="Maximum preview size.")

cache_group = parser.add_mutually_exclusive_group()
cache_group.add_argument("--cache-classic", action="store_true", help="The classic cache (the default).")
cache_group.add_argument("--cache-lru", type=int, default=0, help="An LRU cache of N node results.")
cache_group.add_argument("--cache-none", action="store_true", help="No cache: every node runs every time.")
cache_group.add_argument("--cache-ram", nargs="?", const=4.0, type=float, default=0, help="Evict cached results while available RAM is below N GB.")

attn_group = parser.add_mutually_exclusive_group()
attn_group.add_argument("--use-split-cross-attention", action="store_true", help="Split cross attention.")
attn_group.add_argument("--use-quad-cross-attention", action="store_true", help="Sub-quadratic cross attention.")
attn_group.add_argument("--use-pytorch-cross-attention", action="store_true", help="PyTorch cross attention.")
attn_group.add_argument("--use-sage-attention", action="store_true", help="Sage attention.")
attn_group.add_argument("--use-flash-attention", action="store_true", help="Flash attention.")
parser.add_argument("--disable-xformers", action="store_true", help="No xformers.")

upcast = parser.add_mutually_exclusive_group()
upcast.add_argument("--force-upcast-attention", action="store_true", help="Always upcast attention.")
upcast.add_argument("--dont-upcast-attention", action="store_true", help="Never upcast attention.")

parser.add_argument("--enable-manager", action="store_true", help="Enable the pip comfyui_manager.")
manager_group = parser.add_mutually_exclusive_group()
manager_group.add_argument("--disable-manager-ui", action="store_true", help="Manager without its UI.")
manager_group.add_argument("--enable-manager-legacy-ui", action="store_true", help="The Manager's legacy UI.")

vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--gpu-only", action="store_true", help="Keep everything, intermediates too, on the GPU.")
vram_group.add_argument("--highvram", action="store_true", help="Keep models in VRAM.")
vram_group.add_argument("--normalvram", action="store_true", help="The default VRAM mode.")
vram_group.add_argument("--lowvram", action="store_true", help="Split the model to use less VRAM.")
vram_group.add_argument("--novram", action="store_true", help="For when lowvram is not enough.")
vram_group.add_argument("--cpu", action="store_true", help="Run everything on the CPU.")

parser.add_argument("--reserve-vram", type=float, default=None, help="GB of VRAM to leave for other software.")
parser.add_argument("--async-offload", nargs="?", const=2, type=int, default=None, metavar="NUM_STREAMS", help="Async weight offloading with N streams.")
parser.add_argument("--disable-async-offload", action="store_true", help="No async weight offloading.")
parser.add_argument("--force-non-blocking", action="store_true", help="Non-blocking tensor copies.")
parser.add_argument("--default-hashing-function", type=str, choices=["md5", "sha1", "sha256", "sha512"], default="sha256", help="Hash for duplicate file checks.")
parser.add_argument("--disable-smart-memory", action="store_true", help="Unload models after every prompt.")
parser.add_argument("--deterministic", action="store_true", help="Deterministic algorithms where possible.")
parser.add_argument("--fast", nargs="*", type=PerformanceFeature, help="Untested speed-ups; no list enables all.")
parser.add_argument("--disable-pinned-memory", action="store_true", help="No pinned host memory.")
parser.add_argument("--mmap-torch-files", action="store_true", help="mmap .ckpt/.pt files.")
parser.add_argument("--disable-mmap", action="store_true", help="No mmap for safetensors.")

parser.add_argument("--dont-print-server", action="store_true", help="Do not print the server lines.")
parser.add_argument("--quick-test-for-ci", action="store_true", help="Import everything, then exit 0.")
parser.add_argument("--windows-standalone-build", action="store_true", help="Portable build conveniences.")
parser.add_argument("--disable-metadata", action="store_true", help="No prompt metadata in saved files.")
parser.add_argument("--disable-all-custom-nodes", action="store_true", help="Load no custom nodes.")
parser.add_argument("--whitelist-custom-nodes", type=str, nargs="+", default=[], help="Custom node folders that load despite --disable-all-custom-nodes.")
parser.add_argument("--disable-api-nodes", action="store_true", help="Skip the API nodes.")
parser.add_argument("--multi-user", action="store_true", help="Per-user storage.")
parser.add_argument("--verbose", default="INFO", const="DEBUG", nargs="?", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], help="Log level.")
parser.add_argument("--log-stdout", action="store_true", help="Records below ERROR to stdout.")
parser.add_argument("--front-end-version", type=str, default="comfyanonymous/ComfyUI@latest", help="Frontend version.")
parser.add_argument("--front-end-root", type=is_valid_directory, default=None, help="A local frontend directory.")
parser.add_argument("--user-directory", type=is_valid_directory, default=None, help="The user directory (must exist).")
parser.add_argument("--enable-compress-response-body", action="store_true", help="Compress response bodies.")
parser.add_argument("--comfy-api-base", type=str, default="https://api.comfy.org", help="API base URL.")
parser.add_argument("--database-url", type=str, default=f"sqlite:///{DATABASE_DEFAULT_PATH}", help="Database URL (sqlite:/// only).")
# fmt: on


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse like ComfyUI's module import does: errors exit 2 with argparse's message."""
    args = parser.parse_args(argv)
    if getattr(args, "windows_standalone_build", False):
        args.auto_launch = True
    if getattr(args, "disable_auto_launch", False):
        args.auto_launch = False
    return args
