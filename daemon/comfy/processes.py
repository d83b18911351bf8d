"""Find running ComfyUI processes, read how they were launched, and spot what competes with them.

The seed guide's first questions after an OOM are "what else is on the GPU?" and "is a second
ComfyUI running?", and the launch flags (``--lowvram``, ``--reserve-vram``, ``--cuda-device``…)
and ``PYTORCH_CUDA_ALLOC_CONF`` decide what the advice can say. None of that is in any log, so
it is read from the processes themselves.

A ComfyUI process is a Python interpreter whose script is a ``main.py`` in a directory that looks
like ComfyUI (``folder_paths.py`` or ``comfyui_version.py`` beside it, or both ``comfy/`` and
``nodes.py``). That covers ``python main.py``, the Windows portable build
(``python_embeded\\python.exe -s ComfyUI\\main.py``), comfy-cli and uv launches (their Python
child) and ComfyUI Desktop's server (``<resources>/ComfyUI/main.py`` started from the
``basePath`` venv).

``parse_launch_flags`` is pure and table-driven. ComfyUI's argparse has no positional
arguments, so a bare token always belongs to the option before it; that lets unknown flags (from
newer or forked ComfyUIs) be kept with their values instead of being misread.
"""

from __future__ import annotations

import contextlib
import logging
import ntpath
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import psutil

from oom_sentinel.daemon.probes.base import GpuProcessSample

__all__ = [
    "DEFAULT_PORT",
    "PROCESS_SCOPE_ENV",
    "VRAM_MODES",
    "ComfyProcess",
    "InstanceConflict",
    "LaunchFlags",
    "comfy_process_from",
    "device_selection",
    "find_comfy_processes",
    "find_conflicts",
    "holds_no_gpu_memory",
    "in_scope",
    "looks_like_comfyui",
    "other_gpu_processes",
    "parse_launch_flags",
    "process_exists",
    "process_for",
    "process_scope",
    "shares_gpu",
    "split_python_command",
    "still_running",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8188
DEFAULT_LISTEN = ("127.0.0.1",)
#: ``--listen`` given without a value means every IPv4 and IPv6 address (comfy/cli_args.py)
LISTEN_ALL = ("0.0.0.0", "::")

#: the mutually exclusive VRAM-mode flags, as ComfyUI spells them (without ``--``)
VRAM_MODES = ("gpu-only", "highvram", "normalvram", "lowvram", "novram", "cpu")

_ONE = "one"  # exactly one value
_OPT = "opt"  # zero or one (nargs="?")
_MANY = "many"  # zero or more / one or more (nargs="*" / "+")
_FLAG = "flag"  # store_true

# How each ComfyUI option consumes argv (comfy/cli_args.py, up to 2026; older releases used
# nargs="?" for --cache-ram and --verbose, which reads the same here because a bare token
# always belongs to the option before it).
_ARITY: dict[str, str] = {
    **dict.fromkeys(
        [
            "port",
            "tls-keyfile",
            "tls-certfile",
            "max-upload-size",
            "base-directory",
            "output-directory",
            "date-output-format",
            "temp-directory",
            "input-directory",
            "cuda-device",
            "default-device",
            "oneapi-device-selector",
            "preview-method",
            "preview-size",
            "cache-lru",
            "reserve-vram",
            "vram-headroom",
            "default-hashing-function",
            "front-end-version",
            "front-end-root",
            "user-directory",
            "models-directory",
            "comfy-api-base",
            "database-url",
            "disabled-nodes-config",
            "feature-flag",
        ],
        _ONE,
    ),
    **dict.fromkeys(["listen", "enable-cors-header", "directml", "async-offload"], _OPT),
    **dict.fromkeys(
        ["extra-model-paths-config", "whitelist-custom-nodes", "fast", "cache-ram", "verbose"],
        _MANY,
    ),
    **dict.fromkeys(
        [
            *VRAM_MODES,
            "auto-launch",
            "disable-auto-launch",
            "cuda-malloc",
            "disable-cuda-malloc",
            "force-fp32",
            "force-fp16",
            "fp32-unet",
            "fp64-unet",
            "bf16-unet",
            "fp16-unet",
            "fp8_e4m3fn-unet",
            "fp8_e5m2-unet",
            "fp8_e8m0fnu-unet",
            "fp16-vae",
            "fp32-vae",
            "bf16-vae",
            "cpu-vae",
            "fp8_e4m3fn-text-enc",
            "fp8_e5m2-text-enc",
            "fp16-text-enc",
            "fp32-text-enc",
            "bf16-text-enc",
            "fp16-intermediates",
            "force-channels-last",
            "supports-fp8-compute",
            "cache-classic",
            "cache-none",
            "high-ram",
            "use-split-cross-attention",
            "use-quad-cross-attention",
            "use-pytorch-cross-attention",
            "use-sage-attention",
            "use-flash-attention",
            "use-ck-attention",
            "disable-xformers",
            "force-upcast-attention",
            "dont-upcast-attention",
            "enable-manager",
            "disable-manager-ui",
            "enable-manager-legacy-ui",
            "disable-nvml-pressure",
            "disable-async-offload",
            "disable-dynamic-vram",
            "enable-dynamic-vram",
            "fast-disk",
            "disable-fast-disk",
            "disable-cuda-graphs",
            "disable-comfy-compiler",
            "force-non-blocking",
            "disable-smart-memory",
            "deterministic",
            "disable-pinned-memory",
            "mmap-torch-files",
            "disable-mmap",
            "dont-print-server",
            "quick-test-for-ci",
            "windows-standalone-build",
            "disable-metadata",
            "disable-all-custom-nodes",
            "disable-api-nodes",
            "disable-partner-nodes",
            "offline",
            "multi-user",
            "log-stdout",
            "enable-compress-response-body",
            "disable-assets",
            "enable-assets",
            "enable-asset-hashing",
            "list-feature-flags",
            "debug-hang",
            "date-based-output",
            "enable-triton-backend",
            "disable-triton-backend",
        ],
        _FLAG,
    ),
}

# Flags that change how much memory ComfyUI uses (comfyui-facts §4.4 and later additions);
# a replay of the user's workflow must carry these and nothing else of the launch line.
MEMORY_FLAGS = frozenset(
    [
        *VRAM_MODES,
        "reserve-vram",
        "vram-headroom",
        "disable-smart-memory",
        "cache-classic",
        "cache-lru",
        "cache-none",
        "cache-ram",
        "high-ram",
        "async-offload",
        "disable-async-offload",
        "disable-pinned-memory",
        "disable-mmap",
        "mmap-torch-files",
        "cuda-device",
        "default-device",
        "cpu-vae",
        "cuda-malloc",
        "disable-cuda-malloc",
        "disable-dynamic-vram",
        "enable-dynamic-vram",
        "fast-disk",
        "disable-fast-disk",
        "disable-nvml-pressure",
        "force-fp32",
        "force-fp16",
        "fp32-unet",
        "fp64-unet",
        "bf16-unet",
        "fp16-unet",
        "fp8_e4m3fn-unet",
        "fp8_e5m2-unet",
        "fp8_e8m0fnu-unet",
        "fp16-vae",
        "fp32-vae",
        "bf16-vae",
        "fp8_e4m3fn-text-enc",
        "fp8_e5m2-text-enc",
        "fp16-text-enc",
        "fp32-text-enc",
        "bf16-text-enc",
        "fp16-intermediates",
        "use-split-cross-attention",
        "use-quad-cross-attention",
        "use-pytorch-cross-attention",
        "use-sage-attention",
        "use-flash-attention",
        "use-ck-attention",
        "disable-xformers",
        "force-upcast-attention",
        "dont-upcast-attention",
        "fast",
        "deterministic",
        "directml",
        "oneapi-device-selector",
        "force-channels-last",
        "supports-fp8-compute",
        "force-non-blocking",
        "disable-cuda-graphs",
        "disable-comfy-compiler",
    ]
)

_PRECISION = tuple(
    n
    for n in _ARITY
    if n.startswith(("force-fp", "fp", "bf16-")) and n not in ("fp16-intermediates",)
)
_ATTENTION = {
    "use-split-cross-attention": "split",
    "use-quad-cross-attention": "quad",
    "use-pytorch-cross-attention": "pytorch",
    "use-sage-attention": "sage",
    "use-flash-attention": "flash",
    "use-ck-attention": "ck",
}
_NEGATIVE_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


@dataclass(frozen=True, slots=True)
class LaunchFlags:
    """ComfyUI's command-line options as one process was started (``None``: not given)."""

    port: int | None = None
    #: "separate" for ``--port N``, "joined" for ``--port=N``. ComfyUI-Manager names its log
    #: ``comfyui_<N>.log`` only for the separate form.
    port_form: Literal["separate", "joined"] | None = None
    #: addresses from ``--listen`` (``("0.0.0.0", "::")`` when given bare)
    listen: tuple[str, ...] | None = None
    tls: bool = False
    user_directory: str | None = None
    base_directory: str | None = None
    output_directory: str | None = None
    input_directory: str | None = None
    temp_directory: str | None = None
    database_url: str | None = None
    front_end_root: str | None = None
    extra_model_paths_config: tuple[str, ...] = ()
    #: one of ``VRAM_MODES`` (the last one given wins, as in argparse)
    vram_mode: str | None = None
    reserve_vram_gb: float | None = None
    vram_headroom_gb: float | None = None
    #: ``--cuda-device``: an index, a comma-separated list, or "all" (newer ComfyUI)
    cuda_device: str | None = None
    default_device: int | None = None
    #: "classic", "lru", "none", "ram" or "high-ram"
    cache_mode: str | None = None
    cache_lru_size: int | None = None
    #: ``--cache-ram`` thresholds in GB (empty: the defaults)
    cache_ram_gb: tuple[float, ...] | None = None
    disable_smart_memory: bool = False
    #: ``--async-offload [N]``: the stream count (2 when given bare)
    async_offload_streams: int | None = None
    disable_async_offload: bool = False
    disable_pinned_memory: bool = False
    disable_mmap: bool = False
    mmap_torch_files: bool = False
    cpu_vae: bool = False
    #: True for ``--cuda-malloc``, False for ``--disable-cuda-malloc``
    cuda_malloc: bool | None = None
    #: True for ``--enable-dynamic-vram``, False for ``--disable-dynamic-vram``
    dynamic_vram: bool | None = None
    #: precision flags as given, e.g. ``("force-fp16", "bf16-unet")``
    precision: tuple[str, ...] = ()
    #: "split", "quad", "pytorch", "sage", "flash" or "ck"
    attention: str | None = None
    disable_xformers: bool = False
    #: ``--fast`` features; ``()`` when given bare (all of them)
    fast: tuple[str, ...] | None = None
    deterministic: bool = False
    #: ``--directml [N]``; -1 when given bare
    directml: int | None = None
    enable_manager: bool = False
    multi_user: bool = False
    #: the memory-relevant options, normalised to ``--name [values]`` tokens, in argv order:
    #: what a replay of the user's workflow must pass to reproduce the memory behaviour
    memory_args: tuple[str, ...] = ()
    #: options this table does not know, with their values, as given
    unknown: tuple[str, ...] = ()

    @property
    def effective_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORT

    @property
    def effective_listen(self) -> tuple[str, ...]:
        return self.listen if self.listen is not None else DEFAULT_LISTEN

    def api_url(self) -> str:
        """Where this instance's HTTP API answers from this machine."""
        host = _connect_host(self.effective_listen)
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.effective_port}"


def _connect_host(listen: Sequence[str]) -> str:
    """The address to connect to for a set of listen addresses (wildcards → loopback)."""
    for addr in listen:
        if addr in ("0.0.0.0", "", "localhost", "127.0.0.1"):
            return "127.0.0.1"
    for addr in listen:
        if addr == "::" or addr == "::1":
            return "[::1]"
    first = listen[0] if listen else "127.0.0.1"
    return f"[{first}]" if ":" in first else first


def _is_value(token: str) -> bool:
    return not token.startswith("-") or bool(_NEGATIVE_NUMBER.match(token)) or token == "-"


def _resolve_name(name: str) -> str | None:
    """The table name for ``name``, allowing argparse's unique-prefix abbreviations."""
    if name in _ARITY:
        return name
    candidates = [known for known in _ARITY if known.startswith(name)]
    return candidates[0] if len(candidates) == 1 else None


def _float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def parse_launch_flags(argv: Sequence[str]) -> LaunchFlags:
    """Parse the arguments ComfyUI's argparse sees (``sys.argv[1:]``: after ``main.py``).

    Pure and total: never raises; anything unrecognised lands in ``unknown``.
    """
    values: dict[str, Any] = {}
    precision: list[str] = []
    memory: list[str] = []
    unknown: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            unknown.append(token)
            continue
        raw, eq, inline = token[2:].partition("=")
        name = _resolve_name(raw)
        if name is None:
            unknown.append(token)
            while i < len(tokens) and _is_value(tokens[i]):
                unknown.append(tokens[i])
                i += 1
            continue
        arity = _ARITY[name]
        args: list[str] = []
        if eq:
            args.append(inline)
        elif arity == _ONE:
            if i < len(tokens) and not tokens[i].startswith("--"):
                args.append(tokens[i])
                i += 1
        elif arity in (_OPT, _MANY):
            while i < len(tokens) and _is_value(tokens[i]):
                args.append(tokens[i])
                i += 1
                if arity == _OPT:
                    break
        elif arity == _FLAG:
            pass
        if name in MEMORY_FLAGS:
            memory.append(f"--{name}")
            memory.extend(args)
        _apply(values, precision, name, args, joined=bool(eq))
    return LaunchFlags(
        **values,
        precision=tuple(precision),
        memory_args=tuple(memory),
        unknown=tuple(unknown),
    )


def _apply(
    values: dict[str, Any], precision: list[str], name: str, args: list[str], *, joined: bool
) -> None:
    first = args[0] if args else None
    if name == "port":
        port = _int(first)
        if port is not None:
            values["port"] = port
            values["port_form"] = "joined" if joined else "separate"
    elif name == "listen":
        if first is None:
            values["listen"] = LISTEN_ALL
        else:
            values["listen"] = tuple(a.strip() for a in first.split(",") if a.strip()) or LISTEN_ALL
    elif name in ("tls-keyfile", "tls-certfile"):
        values["tls"] = True
    elif name in (
        "user-directory",
        "base-directory",
        "output-directory",
        "input-directory",
        "temp-directory",
        "database-url",
        "front-end-root",
    ):
        if first is not None:
            values[name.replace("-", "_")] = first
    elif name == "extra-model-paths-config":
        values["extra_model_paths_config"] = (*values.get("extra_model_paths_config", ()), *args)
    elif name in VRAM_MODES:
        values["vram_mode"] = name
    elif name == "reserve-vram":
        values["reserve_vram_gb"] = _float(first)
    elif name == "vram-headroom":
        values["vram_headroom_gb"] = _float(first)
    elif name == "cuda-device":
        values["cuda_device"] = first
    elif name == "default-device":
        values["default_device"] = _int(first)
    elif name == "cache-classic":
        values["cache_mode"] = "classic"
    elif name == "cache-none":
        values["cache_mode"] = "none"
    elif name == "high-ram":
        values["cache_mode"] = "high-ram"
    elif name == "cache-lru":
        values["cache_mode"] = "lru"
        values["cache_lru_size"] = _int(first)
    elif name == "cache-ram":
        values["cache_mode"] = "ram"
        values["cache_ram_gb"] = tuple(v for v in (_float(a) for a in args) if v is not None)
    elif name == "async-offload":
        values["async_offload_streams"] = _int(first) if first is not None else 2
    elif name == "directml":
        values["directml"] = _int(first) if first is not None else -1
    elif name == "cuda-malloc":
        values["cuda_malloc"] = True
    elif name == "disable-cuda-malloc":
        values["cuda_malloc"] = False
    elif name == "enable-dynamic-vram":
        values["dynamic_vram"] = True
    elif name == "disable-dynamic-vram":
        values["dynamic_vram"] = False
    elif name in _ATTENTION:
        values["attention"] = _ATTENTION[name]
    elif name == "fast":
        values["fast"] = tuple(args)
    elif name in _PRECISION:
        precision.append(name)
    elif name in (
        "disable-smart-memory",
        "disable-async-offload",
        "disable-pinned-memory",
        "disable-mmap",
        "mmap-torch-files",
        "cpu-vae",
        "disable-xformers",
        "deterministic",
        "enable-manager",
        "multi-user",
    ):
        values[name.replace("-", "_")] = True
    elif name == "enable-manager-legacy-ui":
        values["enable_manager"] = True


# -- recognising a ComfyUI process -------------------------------------------------------------

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?w?(\.exe)?$", re.IGNORECASE)
# interpreter options that take the next token as their argument
_PY_OPTS_WITH_ARG = ("-X", "-W", "--check-hash-based-pycs")


def _basename(path: str) -> str:
    return ntpath.basename(path) if "\\" in path else posixpath.basename(path)


def split_python_command(cmdline: Sequence[str]) -> tuple[str, str, tuple[str, ...]] | None:
    """``(interpreter, script, script_args)`` when ``cmdline`` runs a Python script file."""
    if not cmdline or not _PYTHON_NAME.match(_basename(cmdline[0])):
        return None
    i = 1
    while i < len(cmdline):
        token = cmdline[i]
        if token in ("-c", "-m", "-"):
            return None  # a command string, a module or stdin: not a script file
        if token in _PY_OPTS_WITH_ARG:
            i += 2
            continue
        if token.startswith("-"):
            if token.startswith(("-c", "-m")) and len(token) > 2 and not token.startswith("--"):
                return None  # "-cCODE" / "-mmodule"
            i += 1
            continue
        return cmdline[0], token, tuple(cmdline[i + 1 :])
    return None


def looks_like_comfyui(
    directory: str | os.PathLike[str], exists: Callable[[str], bool] = os.path.exists
) -> bool:
    """Whether ``directory`` holds a ComfyUI checkout: ``main.py`` plus ``folder_paths.py`` or
    ``comfyui_version.py``, or plus both ``comfy/`` and ``nodes.py``."""
    d = os.fspath(directory)
    if not exists(os.path.join(d, "main.py")):
        return False
    if exists(os.path.join(d, "folder_paths.py")) or exists(os.path.join(d, "comfyui_version.py")):
        return True
    return exists(os.path.join(d, "comfy")) and exists(os.path.join(d, "nodes.py"))


@dataclass(frozen=True, slots=True)
class ComfyProcess:
    """One running ComfyUI server process."""

    pid: int
    argv: tuple[str, ...]
    #: the interpreter as launched (argv[0] made absolute, or the active venv's python), which
    #: keeps a virtual environment's path -- the resolved binary would lose it
    interpreter: str
    #: absolute path of its ``main.py``
    script: str
    #: the ComfyUI code directory (where ``main.py`` is)
    code_dir: str
    #: where models, custom nodes and user data live: ``--base-directory``, Desktop's basePath,
    #: else the code directory
    install_dir: str
    cwd: str | None
    create_time_s: float | None
    flags: LaunchFlags
    #: ``PYTORCH_CUDA_ALLOC_CONF`` / ``CUDA_VISIBLE_DEVICES`` from its environment (``None``:
    #: not set, or the environment was not readable -- see ``environ_readable``)
    pytorch_cuda_alloc_conf: str | None = None
    cuda_visible_devices: str | None = None
    environ_readable: bool = False
    #: started by ComfyUI Desktop
    desktop: bool = False
    ppid: int | None = None
    #: the resolved executable (``/proc/<pid>/exe``) where readable
    executable: str | None = None

    @property
    def user_dir(self) -> str:
        """The user directory (``--user-directory``, else ``<base>/user``)."""
        if self.flags.user_directory:
            return _absolute(self.flags.user_directory, self.cwd)
        return os.path.join(self.install_dir, "user")

    @property
    def url(self) -> str:
        return self.flags.api_url()


def _absolute(path: str, cwd: str | None) -> str:
    if os.path.isabs(path) or cwd is None:
        return os.path.normpath(path)
    return os.path.normpath(os.path.join(cwd, path))


def _interpreter(
    argv0: str, exe: str | None, cwd: str | None, environ: Mapping[str, str] | None
) -> str:
    """The interpreter path as launched. A venv's ``bin/python`` is a symlink to the base
    interpreter, so ``exe`` alone would lose which environment (and packages) ComfyUI runs in."""
    if "/" in argv0 or "\\" in argv0:
        if os.path.isabs(argv0) or ntpath.isabs(argv0) or cwd is None:
            return argv0
        return os.path.normpath(os.path.join(cwd, argv0))
    venv = environ.get("VIRTUAL_ENV") if environ is not None else None
    if venv:
        windows = "\\" in venv or (exe or "").lower().endswith(".exe")
        return (
            ntpath.join(venv, "Scripts", "python.exe")
            if windows
            else posixpath.join(venv, "bin", "python")
        )
    return exe or argv0


def _is_desktop(script: str, flags: LaunchFlags) -> bool:
    root = (flags.front_end_root or "").replace("\\", "/")
    if "web_custom_versions/desktop_app" in root:
        return True
    parts = [p.lower() for p in script.replace("\\", "/").split("/")]
    # <app>/resources/ComfyUI/main.py (Windows, Linux) or ComfyUI.app/Contents/Resources/...
    return len(parts) >= 3 and parts[-3] == "resources" and parts[-2] == "comfyui"


def comfy_process_from(
    pid: int,
    cmdline: Sequence[str],
    *,
    cwd: str | None,
    exe: str | None = None,
    create_time_s: float | None = None,
    environ: Mapping[str, str] | None = None,
    ppid: int | None = None,
    exists: Callable[[str], bool] = os.path.exists,
) -> ComfyProcess | None:
    """Build a ``ComfyProcess`` from what psutil tells about a process, or ``None`` when it is
    not a ComfyUI server. Pure apart from ``exists`` (injected for tests)."""
    split = split_python_command(cmdline)
    if split is None:
        return None
    interpreter, script, args = split
    if _basename(script).lower() != "main.py":
        return None
    script_abs = _absolute(script, cwd)
    code_dir = os.path.dirname(script_abs)
    if not looks_like_comfyui(code_dir, exists):
        return None
    flags = parse_launch_flags(args)
    desktop = _is_desktop(script_abs, flags)
    if flags.base_directory:
        install_dir = _absolute(flags.base_directory, cwd)
    elif desktop and flags.user_directory:
        install_dir = os.path.dirname(_absolute(flags.user_directory, cwd).rstrip("/\\"))
    else:
        install_dir = code_dir
    env = environ if environ is not None else None
    return ComfyProcess(
        pid=pid,
        argv=tuple(cmdline),
        interpreter=_interpreter(interpreter, exe, cwd, environ),
        script=script_abs,
        code_dir=code_dir,
        install_dir=install_dir,
        cwd=cwd,
        create_time_s=create_time_s,
        flags=flags,
        pytorch_cuda_alloc_conf=env.get("PYTORCH_CUDA_ALLOC_CONF") if env is not None else None,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES") if env is not None else None,
        environ_readable=env is not None,
        desktop=desktop,
        ppid=ppid,
        executable=exe,
    )


def _safe(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (psutil.Error, OSError, ValueError):
        return None


#: ``os.pathsep``-separated directories: when set, only ComfyUI processes whose install, code
#: or working directory lies under one of them exist for discovery, snapshots and ``doctor``
#: (the test suite sets it to its temp root, so it never attaches to a ComfyUI it did not
#: start -- a user's, or a second copy of the suite's)
PROCESS_SCOPE_ENV = "OOM_SENTINEL_PROCESS_SCOPE"


def process_scope(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The directories of ``$OOM_SENTINEL_PROCESS_SCOPE`` (normalised), or None when unset."""
    raw = (os.environ if environ is None else environ).get(PROCESS_SCOPE_ENV)
    if not raw:
        return None
    return tuple(os.path.normcase(os.path.realpath(part)) for part in raw.split(os.pathsep) if part)


def in_scope(proc: ComfyProcess, scope: Sequence[str] | None) -> bool:
    """Whether ``proc`` runs from under one of ``scope`` (None: no scope, everything is)."""
    if scope is None:
        return True
    for where in (proc.install_dir, proc.code_dir, proc.cwd):
        if not where:
            continue
        path = os.path.normcase(os.path.realpath(where))
        if any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in scope):
            return True
    return False


def find_comfy_processes(
    *,
    process_iter: Callable[..., Iterable[Any]] = psutil.process_iter,
    exists: Callable[[str], bool] = os.path.exists,
    environ: Mapping[str, str] | None = None,
) -> list[ComfyProcess]:
    """Every ComfyUI server process this user can see (within ``$OOM_SENTINEL_PROCESS_SCOPE``
    when set), oldest first. Never raises.

    This walks the whole process table, so it belongs in the slow discovery job (every
    ``discovery.interval_s``), not the per-second sampler.
    """
    scope = process_scope(environ)
    found: list[ComfyProcess] = []
    try:
        procs = list(process_iter(["pid", "name", "cmdline"]))
    except (psutil.Error, OSError):
        return []
    for proc in procs:
        info = getattr(proc, "info", None) or {}
        cmdline = info.get("cmdline") or []
        split = split_python_command(cmdline)
        if split is None or _basename(split[1]).lower() != "main.py":
            continue
        cwd = _safe(proc.cwd)
        environ = _safe(proc.environ)
        comfy = comfy_process_from(
            int(info.get("pid", proc.pid)),
            cmdline,
            cwd=cwd,
            exe=_safe(proc.exe) or None,
            create_time_s=_safe(proc.create_time),
            environ=environ,
            ppid=_safe(proc.ppid),
            exists=exists,
        )
        if comfy is not None and in_scope(comfy, scope):
            found.append(comfy)
    found.sort(key=lambda p: (p.create_time_s or 0.0, p.pid))
    return found


# -- what competes with an instance ----------------------------------------------------------


def other_gpu_processes(
    gpu_processes: Sequence[GpuProcessSample], own_pids: Iterable[int]
) -> tuple[GpuProcessSample, ...]:
    """GPU processes that are not the instance itself (``own_pids``: it and its children)."""
    own = set(own_pids)
    return tuple(p for p in gpu_processes if p.pid not in own)


def device_selection(proc: ComfyProcess) -> str | None:
    """Which CUDA devices a process can see, as a comparable key; ``None`` for ``--cpu``.

    ``--cuda-device`` wins (ComfyUI sets ``CUDA_VISIBLE_DEVICES`` from it); otherwise the
    inherited ``CUDA_VISIBLE_DEVICES``; otherwise "default" (all devices, GPU 0 first).
    """
    if proc.flags.vram_mode == "cpu":
        return None
    if proc.flags.cuda_device is not None and proc.flags.cuda_device != "all":
        return proc.flags.cuda_device.replace(" ", "")
    if proc.cuda_visible_devices is not None:
        return proc.cuda_visible_devices.replace(" ", "")
    return "default"


def _first_cuda_device(proc: ComfyProcess) -> str | None:
    """The CUDA device a process computes on first (``--cuda-device`` / ``CUDA_VISIBLE_DEVICES``:
    the first listed; by default device 0); None for ``--cpu`` or an empty selection."""
    selection = device_selection(proc)
    if selection is None:
        return None
    if selection == "default":
        return "0"
    first = selection.split(",")[0].strip()
    return first or None


def holds_no_gpu_memory(proc: ComfyProcess, gpu_processes: Sequence[GpuProcessSample]) -> bool:
    """NVML reports per-process GPU memory on this machine and none for ``proc`` (pure).
    Where NVML cannot say (no NVML, WDDM's ``None``), this is False: nothing is known."""
    if not any(gp.used_bytes is not None for gp in gpu_processes):
        return False
    mine = [gp for gp in gpu_processes if gp.pid == proc.pid]
    return not any(gp.used_bytes is None or gp.used_bytes > 0 for gp in mine)


def shares_gpu(
    target: ComfyProcess | None, other: ComfyProcess, gpu_processes: Sequence[GpuProcessSample]
) -> bool:
    """Whether ``other`` competes with ``target`` for GPU memory -- the one rule behind a
    snapshot's ``other_instances[].shares_gpu``, the alert's "stop the other instance" advice
    and ``doctor``'s second-instance check (pure).

    Not when either runs on ``--cpu``; not when NVML reports per-process memory and none for
    ``other``; when NVML lists both, exactly when they are on one device; otherwise when their
    device selections (``--cuda-device``, ``CUDA_VISIBLE_DEVICES``) start on the same device.
    ``target`` None (ComfyUI not running): any other instance that uses a GPU.
    """
    if other.flags.vram_mode == "cpu" or holds_no_gpu_memory(other, gpu_processes):
        return False
    if target is None:
        return _first_cuda_device(other) is not None
    if target.flags.vram_mode == "cpu":
        return False
    on_a = {gp.device_index for gp in gpu_processes if gp.pid == target.pid}
    on_b = {gp.device_index for gp in gpu_processes if gp.pid == other.pid}
    if on_a and on_b:
        return bool(on_a & on_b)
    first = _first_cuda_device(target)
    return first is not None and first == _first_cuda_device(other)


@dataclass(frozen=True, slots=True)
class InstanceConflict:
    """Two or more ComfyUI processes that compete for one resource."""

    #: "same-gpu": NVML lists them on one device; "same-cuda-device": their device selection
    #: (``--cuda-device`` / ``CUDA_VISIBLE_DEVICES``) is the same, so they share a GPU even
    #: where NVML cannot say (WDDM); "same-install": one code directory or base directory;
    #: "same-port": they claim one port
    kind: Literal["same-gpu", "same-cuda-device", "same-install", "same-port"]
    pids: tuple[int, ...]
    #: what they share (device index, selection, directory or port)
    shared: str
    detail: str = field(default="", compare=False)


def find_conflicts(
    comfy: Sequence[ComfyProcess], gpu_processes: Sequence[GpuProcessSample] = ()
) -> tuple[InstanceConflict, ...]:
    """Every group of ComfyUI processes that share a GPU, an install or a port (pure)."""
    out: list[InstanceConflict] = []
    pids = {p.pid for p in comfy}

    def groups(key: Callable[[ComfyProcess], str | None]) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for proc in comfy:
            k = key(proc)
            if k is not None:
                found.setdefault(k, []).append(proc.pid)
        return {k: v for k, v in found.items() if len(v) > 1}

    on_device: dict[int, list[int]] = {}
    for gp in gpu_processes:
        if gp.pid in pids and gp.pid not in on_device.get(gp.device_index, []):
            on_device.setdefault(gp.device_index, []).append(gp.pid)
    for dev, members in sorted(on_device.items()):
        if len(members) > 1:
            out.append(
                InstanceConflict(
                    "same-gpu",
                    tuple(sorted(members)),
                    str(dev),
                    f"{len(members)} ComfyUI processes use GPU {dev}",
                )
            )
    on_gpu = [p for p in comfy if not holds_no_gpu_memory(p, gpu_processes)]
    by_selection: dict[str, list[int]] = {}
    for proc in on_gpu:
        selected = device_selection(proc)
        if selected is not None:
            by_selection.setdefault(selected, []).append(proc.pid)
    for sel, members in sorted(by_selection.items()):
        if len(members) < 2:
            continue
        what = "the default GPU" if sel == "default" else f"CUDA device(s) {sel}"
        out.append(
            InstanceConflict(
                "same-cuda-device",
                tuple(sorted(members)),
                sel,
                f"{len(members)} ComfyUI processes run on {what}",
            )
        )
    for key_name, key in (
        ("code directory", lambda p: os.path.normcase(p.code_dir)),
        ("base directory", lambda p: os.path.normcase(p.install_dir)),
    ):
        for shared, members in sorted(groups(key).items()):
            conflict = InstanceConflict(
                "same-install",
                tuple(sorted(members)),
                shared,
                f"{len(members)} ComfyUI processes share the {key_name} {shared}",
            )
            if conflict not in out:
                out.append(conflict)
    for port, members in sorted(groups(lambda p: str(p.flags.effective_port)).items()):
        out.append(
            InstanceConflict(
                "same-port",
                tuple(sorted(members)),
                port,
                f"{len(members)} ComfyUI processes claim port {port}",
            )
        )
    return tuple(out)


#: every spelling of "this machine" a ComfyUI URL or ``--listen`` may use
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""})


def _server_address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` a URL reaches; loopback and bind-all spellings are one host."""
    try:
        parts = urlsplit(url.rstrip("/"))
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    return ("127.0.0.1" if host in _LOOPBACK else host), port


def _same_dir(a: str, b: str) -> bool:
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def process_for(
    processes: Iterable[ComfyProcess], *, path: str | None = None, url: str | None = None
) -> ComfyProcess | None:
    """The process that serves an install (pure over ``processes``).

    With ``path``: a process whose install or code directory it is, preferring one that also
    answers at ``url``; without: the process answering at ``url``. None when none does.
    """
    procs = list(processes)
    address = _server_address(url) if url else None
    by_url = [p for p in procs if address is not None and _server_address(p.url) == address]
    if path is None:
        return by_url[0] if by_url else None
    by_path = [p for p in procs if _same_dir(path, p.install_dir) or _same_dir(path, p.code_dir)]
    best = [p for p in by_path if p in by_url] or by_path
    return best[0] if best else None


def process_exists(pid: int, create_time_s: float | None = None) -> bool:
    """Whether ``pid`` is a living (non-zombie) process -- the same one, when its start time
    is given (pids are reused, and a restarted ComfyUI may even get its old pid back)."""
    with contextlib.suppress(psutil.Error, OSError, ValueError):
        proc = psutil.Process(pid)
        if create_time_s is not None and proc.create_time() != create_time_s:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def still_running(proc: ComfyProcess) -> bool:
    """Whether this ComfyUI process (not merely its pid) is still alive."""
    return process_exists(proc.pid, proc.create_time_s)
