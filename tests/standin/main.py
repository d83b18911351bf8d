"""Entry point of the stand-in ComfyUI: ``python main.py --listen 127.0.0.1 --port N [flags]``.

It starts the way ComfyUI v0.8.0's ``main.py`` starts (comfyui-facts.md 3.2): flags parsed by
argparse (unknown ones exit 2), console interceptors, extra model paths, prestartup scripts, the
device lines (``Total VRAM``, ``Set vram state to``, ``Device:``), core and custom nodes with the
``Import times for custom nodes:`` block, the temp directory wiped, then ``Starting server`` and
``To see the GUI go to: http://127.0.0.1:N`` once the port is bound. It is our own code for tests;
none of ComfyUI's code is here.

Environment knobs (the command line stays ComfyUI's):
  OOM_SENTINEL_FAKE_GPU      fake-GPU directory (daemon/probes/fake_gpu.py); required unless --cpu
  OOM_STANDIN_MANAGER_LOG=1  tee the console to a ComfyUI-Manager-style <user>/comfyui[_PORT].log
  OOM_STANDIN_RLIMIT_AS_MIB  address-space limit applied at start (like ``ulimit -v``)
  OOM_STANDIN_RLIMIT_AS_HEADROOM_MIB  address-space limit: what is mapped once started, plus this
  OOM_STANDIN_SEED           seed for the tuning's memory noise
  OOM_STANDIN_WS_DROP        websocket events never sent (fault injection for client tests)
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import shutil
import sqlite3
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

CODE_DIR = Path(__file__).resolve().parent
if str(CODE_DIR) not in sys.path:
    sys.path.insert(0, str(CODE_DIR))

import standin_api as api  # noqa: E402
import standin_execution as ex  # noqa: E402
import standin_logging  # noqa: E402
import standin_memory as mem  # noqa: E402
import standin_nodes  # noqa: E402


def load_cli_args() -> ModuleType:
    """``comfy/cli_args.py`` of this install (what the bisect reads), else the template."""
    path = CODE_DIR / "comfy" / "cli_args.py"
    if not path.is_file():
        path = CODE_DIR / "cli_args_template.py"
    spec = importlib.util.spec_from_file_location("comfy_cli_args", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arg(args: Any, name: str, default: Any = None) -> Any:
    """Flags missing from an old commit's cli_args.py read as their default."""
    return getattr(args, name, default)


def comfyui_version() -> str:
    try:
        text = (CODE_DIR / "comfyui_version.py").read_text("utf-8")
    except OSError:
        return "0.8.0"
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    return match.group(1) if match else "0.8.0"


# ---- paths -----------------------------------------------------------------------------------
def setup_paths(args: Any) -> None:
    rt = api.RUNTIME
    rt.code_dir = CODE_DIR
    base = Path(arg(args, "base_directory") or CODE_DIR).resolve()
    rt.base_dir = base
    rt.folder_paths = {name: [base / "models" / name] for name in api.FOLDER_NAMES}
    rt.custom_node_dirs = [base / "custom_nodes"]
    rt.output_dir = base / "output"
    rt.input_dir = base / "input"
    rt.temp_dir = base / "temp"
    rt.user_dir = base / "user"

    yamls = []
    auto = CODE_DIR / "extra_model_paths.yaml"
    if auto.is_file():
        yamls.append(auto)
    for group in arg(args, "extra_model_paths_config") or []:
        yamls.extend(Path(p) for p in group)
    for path in yamls:
        load_extra_path_config(path)

    if arg(args, "output_directory"):
        rt.output_dir = Path(args.output_directory).resolve()
        logging.info(f"Setting output directory to: {rt.output_dir}")
    for name in ("checkpoints", "clip", "vae", "diffusion_models", "loras"):
        add_folder_path(name, rt.output_dir / name, False)
    if arg(args, "input_directory"):
        rt.input_dir = Path(args.input_directory).resolve()
        logging.info(f"Setting input directory to: {rt.input_dir}")
    if arg(args, "user_directory"):
        rt.user_dir = Path(args.user_directory).resolve()
        logging.info(f"Setting user directory to: {rt.user_dir}")
    rt.input_dir.mkdir(parents=True, exist_ok=True)


def add_folder_path(folder: str, path: Path, is_default: bool) -> None:
    folder = api.LEGACY_FOLDER_NAMES.get(folder, folder)
    if folder == "custom_nodes":
        target = api.RUNTIME.custom_node_dirs
    else:
        target = api.RUNTIME.folder_paths.setdefault(folder, [])
    if path in target:
        target.remove(path)
    if is_default:
        target.insert(0, path)
    else:
        target.append(path)


def load_extra_path_config(yaml_path: Path) -> None:
    import yaml

    with yaml_path.open("r", encoding="utf-8") as stream:
        config = yaml.safe_load(stream) or {}
    yaml_dir = yaml_path.resolve().parent
    for section in config.values():
        if not isinstance(section, dict):
            continue
        section = dict(section)
        base_path = section.pop("base_path", None)
        if base_path:
            base_path = os.path.expandvars(os.path.expanduser(str(base_path)))
            if not os.path.isabs(base_path):
                base_path = str((yaml_dir / base_path).resolve())
        is_default = bool(section.pop("is_default", False))
        for folder, value in section.items():
            for line in str(value).split("\n"):
                if not line:
                    continue
                if base_path:
                    full = os.path.join(base_path, line)
                elif not os.path.isabs(line):
                    full = os.path.abspath(os.path.join(yaml_dir, line))
                else:
                    full = line
                normalized = os.path.normpath(full)
                logging.info(f"Adding extra search path {folder} {normalized}")
                add_folder_path(folder, Path(normalized), is_default)


# ---- custom nodes ----------------------------------------------------------------------------
def custom_node_candidates(args: Any) -> list[Path]:
    found = []
    for root in api.RUNTIME.custom_node_dirs:
        if not root.is_dir():
            continue
        for name in sorted(os.listdir(root.resolve())):
            if name == "__pycache__":
                continue
            path = root / name
            if path.is_file() and not name.endswith(".py"):
                continue
            if name.endswith(".disabled"):
                continue
            if arg(args, "disable_all_custom_nodes", False) and name not in (
                arg(args, "whitelist_custom_nodes") or []
            ):
                logging.info(
                    f"Skipping {name} due to disable_all_custom_nodes and whitelist_custom_nodes"
                )
                continue
            found.append(path)
    return found


def execute_prestartup_scripts(args: Any) -> None:
    if arg(args, "disable_all_custom_nodes", False) and not arg(args, "whitelist_custom_nodes"):
        return
    times = []
    for path in custom_node_candidates(args):
        script = path / "prestartup_script.py"
        if not script.is_file():
            continue
        started = time.perf_counter()
        ok = True
        try:
            spec = importlib.util.spec_from_file_location("prestartup_script", script)
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as err:
            logging.error(f"Failed to execute startup-script: {script} / {err}")
            ok = False
        times.append((time.perf_counter() - started, str(path), ok))
    if times:
        logging.info("\nPrestartup times for custom nodes:")
        for elapsed, path, ok in sorted(times):
            logging.info(
                "{:6.1f} seconds{}: {}".format(elapsed, "" if ok else " (PRESTARTUP FAILED)", path)
            )
        logging.info("")


def load_custom_node(path: Path, ignore: set[str]) -> bool:
    module_name = path.stem if path.is_file() else path.name
    sys_module_name = str(path.with_suffix("")) if path.is_file() else str(path).replace(".", "_x_")
    try:
        logging.debug(f"Trying to load custom node {path}")
        init = path if path.is_file() else path / "__init__.py"
        spec = importlib.util.spec_from_file_location(sys_module_name, init)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[sys_module_name] = module
        spec.loader.exec_module(module)
        mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
        if mappings is not None:
            for name, cls in mappings.items():
                if name not in ignore:
                    ex.NODE_CLASS_MAPPINGS[name] = cls
                    cls.RELATIVE_PYTHON_MODULE = f"custom_nodes.{module_name}"
            ex.NODE_DISPLAY_NAME_MAPPINGS.update(
                getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", None) or {}
            )
            return True
        logging.warning(
            f"Skip {path} module for custom nodes due to the lack of NODE_CLASS_MAPPINGS or NODES_LIST (need one)."
        )
        return False
    except Exception as err:
        logging.warning(traceback.format_exc())
        logging.warning(f"Cannot import {path} module for custom nodes: {err}")
        return False


def init_nodes(args: Any) -> None:
    ex.NODE_CLASS_MAPPINGS.update(standin_nodes.NODE_CLASS_MAPPINGS)
    ex.NODE_DISPLAY_NAME_MAPPINGS.update(standin_nodes.NODE_DISPLAY_NAME_MAPPINGS)
    if arg(args, "disable_all_custom_nodes", False) and not arg(args, "whitelist_custom_nodes"):
        logging.info("Skipping loading of custom nodes")
        return
    base_names = set(ex.NODE_CLASS_MAPPINGS)
    times = []
    for path in custom_node_candidates(args):
        started = time.perf_counter()
        ok = load_custom_node(path, base_names)
        times.append((time.perf_counter() - started, str(path), ok))
    if times:
        logging.info("\nImport times for custom nodes:")
        for elapsed, path, ok in sorted(times):
            logging.info(
                "{:6.1f} seconds{}: {}".format(elapsed, "" if ok else " (IMPORT FAILED)", path)
            )
        logging.info("")


# ---- device ----------------------------------------------------------------------------------
def init_device(args: Any, torch_version: str) -> str:
    """The "import comfy.model_management" lines; returns the device name for /system_stats."""
    ram_total = _ram_total_bytes()
    logging.info("Checkpoint files will always be loaded safely.")
    rt = api.RUNTIME
    if arg(args, "cpu", False):
        rt.device = mem.Device(None)
        rt.vram_state = "DISABLED"
        logging.info(
            f"Total VRAM {ram_total / 1048576:0.0f} MB, total RAM {ram_total / 1048576:0.0f} MB"
        )
        logging.info(f"pytorch version: {torch_version}")
        logging.info(f"Set vram state to: {rt.vram_state}")
        if arg(args, "disable_smart_memory", False):
            logging.info("Disabling smart memory management")
        logging.info("Device: cpu")
        logging.info("Using pytorch attention")
        return "cpu"

    root = os.environ.get(mem.ENV_FAKE_GPU)
    spec = mem.choose_fake_device(Path(root)) if root else None
    if spec is None:
        raise RuntimeError(
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
            "installed a driver from http://www.nvidia.com/Download/index.aspx"
        )
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    async_backend = "backend:cudaMallocAsync" in alloc_conf
    if arg(args, "cuda_malloc", False) and not async_backend:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = (
            alloc_conf + "," if alloc_conf else ""
        ) + "backend:cudaMallocAsync"
        async_backend = True
    cuda = mem.FakeCuda(Path(root or "."), spec, async_backend)  # type: ignore[arg-type]
    rt.device = mem.Device(cuda)
    if arg(args, "lowvram", False):
        rt.vram_state = "LOW_VRAM"
    elif arg(args, "novram", False):
        rt.vram_state = "NO_VRAM"
    elif arg(args, "highvram", False) or arg(args, "gpu_only", False):
        rt.vram_state = "HIGH_VRAM"
    else:
        rt.vram_state = "NORMAL_VRAM"
    rt.gpu_only = bool(arg(args, "gpu_only", False))
    if arg(args, "reserve_vram") is not None:
        rt.reserve_vram_bytes = int(args.reserve_vram * 1024**3)
        logging.debug(
            f"Reserving {rt.reserve_vram_bytes / 1048576:.2f}MB vram for other applications."
        )
    logging.info(
        f"Total VRAM {spec.total_bytes / 1048576:0.0f} MB, total RAM {ram_total / 1048576:0.0f} MB"
    )
    logging.info(f"pytorch version: {torch_version}")
    logging.info(f"Set vram state to: {rt.vram_state}")
    if arg(args, "disable_smart_memory", False):
        logging.info("Disabling smart memory management")
    backend = "cudaMallocAsync" if async_backend else "native"
    name = f"cuda:0 {spec.name} : {backend}"
    logging.info(f"Device: {name}")
    if not arg(args, "disable_async_offload", False):
        logging.info(
            f"Using async weight offloading with {arg(args, 'async_offload') or 2} streams"
        )
    if not arg(args, "disable_pinned_memory", False):
        logging.info(f"Enabled pinned memory {int(ram_total * 0.95) // (1024 * 1024)}")
    logging.info("Using pytorch attention")
    logging.info("Using pytorch attention in VAE")
    return name


def _ram_total_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def cleanup_temp() -> None:
    temp = api.RUNTIME.temp_dir
    if temp.exists():
        shutil.rmtree(temp, ignore_errors=True)


def init_database(args: Any) -> None:
    url = arg(args, "database_url")
    if url is None:
        return
    logging.debug(f"Database URL: {url}")
    if not url.startswith("sqlite:///"):
        raise ValueError(f"Unsupported database URL '{url}'")
    path = url[len("sqlite:///") :]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        sqlite3.connect(path).close()


# ---- main ------------------------------------------------------------------------------------
def main() -> None:
    cli = load_cli_args()
    args = cli.parse()  # exits 2 on an unknown flag, like ComfyUI
    mem.apply_rlimit_as_from_env()

    user_dir = Path(
        arg(args, "user_directory") or Path(arg(args, "base_directory") or CODE_DIR) / "user"
    ).resolve()
    manager_log = (
        standin_logging.manager_log_path(user_dir, sys.argv)
        if standin_logging.manager_log_requested()
        else None
    )
    standin_logging.setup(
        arg(args, "verbose", "INFO") or "INFO", bool(arg(args, "log_stdout", False)), manager_log
    )
    if manager_log is not None:
        base = Path(arg(args, "base_directory") or CODE_DIR).resolve()
        standin_logging.manager_banner(CODE_DIR, base, user_dir, manager_log)

    setup_paths(args)
    execute_prestartup_scripts(args)
    if arg(args, "cuda_device") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.cuda_device)
        os.environ["HIP_VISIBLE_DEVICES"] = str(args.cuda_device)
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = str(args.cuda_device)
        logging.info(f"Set cuda device to: {args.cuda_device}")

    mem.TUNING = mem.Tuning.load(CODE_DIR)
    if mem.TUNING.startup_delay_s:
        time.sleep(mem.TUNING.startup_delay_s)
    device_name = init_device(args, mem.TUNING.torch_version)
    rt = api.RUNTIME
    rt.disable_smart_memory = bool(arg(args, "disable_smart_memory", False))
    rt.disable_metadata = bool(arg(args, "disable_metadata", False))
    rt.preview = str(arg(args, "preview_method", "none")) not in (
        "none",
        "LatentPreviewMethod.NoPreviews",
    )

    version = comfyui_version()
    logging.info(f"Python version: {sys.version}")
    logging.info(f"ComfyUI version: {version}")
    if arg(args, "temp_directory"):
        rt.temp_dir = Path(args.temp_directory).resolve() / "temp"
        logging.info(f"Setting temp directory to: {rt.temp_dir}")
    cleanup_temp()
    logging.info("ComfyUI frontend version: 1.35.9")
    logging.info(f"[Prompt Server] web root: {CODE_DIR / 'web'}")

    init_nodes(args)
    init_database(args)

    cache_mode, lru = "classic", 0
    if (arg(args, "cache_lru", 0) or 0) > 0:
        cache_mode, lru = "lru", int(args.cache_lru)
    elif arg(args, "cache_none", False):
        cache_mode = "none"

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    import standin_server

    server = standin_server.PromptServer(
        loop,
        comfyui_version=version,
        torch_version=mem.TUNING.torch_version,
        device_name=device_name,
        max_upload_mb=float(arg(args, "max_upload_size", 100) or 100),
    )
    executor = ex.PromptExecutor(server, cache_mode, lru)
    worker = threading.Thread(
        target=ex.prompt_worker,
        args=(server.prompt_queue, server, executor),
        daemon=True,
        name="prompt_worker",
    )
    worker.start()

    if arg(args, "quick_test_for_ci", False):
        if rt.device.cuda is not None:
            rt.device.cuda.remove_file()
        sys.exit(0)
    mem.apply_rlimit_as_headroom_from_env()

    addresses = []
    for host in str(arg(args, "listen", "127.0.0.1")).split(","):
        addresses.append((host.strip(), int(arg(args, "port", 8188))))
    verbose = not arg(args, "dont_print_server", False)
    try:
        loop.run_until_complete(standin_server.start_multi_address(server, addresses, verbose))
        loop.run_until_complete(server.publish_loop())
    except KeyboardInterrupt:
        logging.info("\nStopped server")
    finally:
        cleanup_temp()
        if rt.device.cuda is not None:
            rt.device.cuda.remove_file()


if __name__ == "__main__":
    main()
