"""Find ComfyUI installs, their log files and their API, when the user configured none.

"Install it and forget it" means the daemon must find ComfyUI on its own: running processes
first (they say exactly which port, user directory and interpreter are in use), then the places
installs usually live:

==============================  ====================================================================
where                           what
==============================  ====================================================================
running processes               ``python … main.py`` in a ComfyUI checkout (``processes.py``)
``~/ComfyUI``                   the README's ``git clone``
comfy-cli                       ``~/comfy/ComfyUI`` (Linux), ``~/Documents/comfy/ComfyUI`` (macOS,
                                Windows), older ``~/Documents/ComfyUI``; and the ``default_workspace``
                                / ``recent_workspace`` of comfy-cli's ``config.ini``
Windows portable                ``ComfyUI_windows_portable*/ComfyUI`` (with ``python_embeded``) in
                                the home, Desktop, Downloads, Documents folders and drive roots
ComfyUI Desktop                 ``basePath`` in ``config.json`` under ``%APPDATA%\\ComfyUI``,
                                ``~/Library/Application Support/ComfyUI`` or ``~/.config/ComfyUI``
==============================  ====================================================================

Log files per install: ComfyUI-Manager's ``<user dir>/comfyui.log``, or ``comfyui_<port>.log``
when the process got ``--port N`` as two argv tokens (Manager 3.x/4.x; the user dir comes from
``--user-directory``, else ``<base>/user``); the ``comfyui.log`` in the working directory of
Manager 2.x and older (only when that file exists); ComfyUI Desktop's ``logs/comfyui.log``.
Current-Manager paths are listed even before they exist: the follower waits for them.

Everything here is a pure function of an injected home directory, environment, platform and
process list (plus reads of the files it looks at), so tests run it on temporary trees.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from oom_sentinel.daemon.comfy.processes import (
    DEFAULT_PORT,
    ComfyProcess,
    LaunchFlags,
    looks_like_comfyui,
)

__all__ = [
    "DESKTOP_DEFAULT_PORT",
    "DiscoveredInstance",
    "candidate_locations",
    "describe_install",
    "desktop_dirs",
    "discover_instances",
    "manager_log_paths",
]

#: ComfyUI Desktop's default server port (reports say 8000; UNCONFIRMED in its source, and
#: only used when no running process tells the real one)
DESKTOP_DEFAULT_PORT = 8000

_MANAGER_PORT_LOG = re.compile(r"^comfyui_\d+\.log$")


@dataclass(frozen=True, slots=True)
class DiscoveredInstance:
    """One ComfyUI install the daemon can watch."""

    #: unique among the instances returned together ("ComfyUI", "ComfyUI:8189", …)
    name: str
    #: the install: the code directory, or ``--base-directory`` / Desktop's basePath
    path: str
    #: its HTTP API
    url: str
    #: log files to follow (some may not exist yet)
    log_paths: tuple[str, ...]
    #: the running server process, if any
    pid: int | None
    #: the interpreter that runs (or would run) it
    python: str | None
    #: its parsed launch flags (``None`` when not running)
    flags: LaunchFlags | None
    #: where ``main.py`` is (differs from ``path`` for Desktop and ``--base-directory``)
    code_dir: str | None = None
    #: how it was found: "process", "location", "comfy-cli", "portable" or "desktop"
    source: str = "location"
    #: the running server process (``pid`` and ``flags`` are its), if any
    process: ComfyProcess | None = None


# -- where to look ------------------------------------------------------------------------------


def _platform_key(platform: str) -> str:
    if platform.startswith("win"):
        return "windows"
    if platform == "darwin":
        return "macos"
    return "linux"


def desktop_dirs(
    home: Path, environ: Mapping[str, str], platform: str = sys.platform
) -> tuple[Path, Path]:
    """ComfyUI Desktop's ``(config dir, logs dir)`` on this platform (electron's userData)."""
    key = _platform_key(platform)
    if key == "windows":
        appdata = Path(environ.get("APPDATA") or home / "AppData" / "Roaming")
        return appdata / "ComfyUI", appdata / "ComfyUI" / "logs"
    if key == "macos":
        return (
            home / "Library" / "Application Support" / "ComfyUI",
            home / "Library" / "Logs" / "ComfyUI",
        )
    config = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    return config / "ComfyUI", config / "ComfyUI" / "logs"


def _comfy_cli_config(home: Path, environ: Mapping[str, str], platform: str) -> Path:
    key = _platform_key(platform)
    if key == "windows":
        local = Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
        return local / "comfy-cli" / "config.ini"
    if key == "macos":
        return home / "Library" / "Application Support" / "comfy-cli" / "config.ini"
    return home / ".config" / "comfy-cli" / "config.ini"


def _comfy_cli_workspaces(path: Path) -> list[Path]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text("utf-8", "replace"))
    except (OSError, configparser.Error):
        return []
    out: list[Path] = []
    for key in ("default_workspace", "recent_workspace"):
        value = parser.defaults().get(key)
        if value:
            out.append(Path(os.path.expanduser(value)))
    return out


def _drive_roots(environ: Mapping[str, str]) -> list[Path]:  # pragma: no cover - Windows only
    drive = environ.get("SystemDrive", "C:")
    roots = [Path(drive + "\\")]
    for letter in "DEF":
        candidate = Path(f"{letter}:\\")
        if candidate.exists():
            roots.append(candidate)
    return roots


def candidate_locations(
    home: Path,
    environ: Mapping[str, str],
    platform: str = sys.platform,
    extra_roots: Sequence[Path] | None = None,
) -> list[tuple[Path, str]]:
    """``(directory, source)`` pairs that may hold a ComfyUI checkout, most likely first."""
    key = _platform_key(platform)
    out: list[tuple[Path, str]] = [(home / "ComfyUI", "location")]
    if key == "linux":
        out.append((home / "comfy" / "ComfyUI", "comfy-cli"))
    else:
        out.append((home / "Documents" / "comfy" / "ComfyUI", "comfy-cli"))
        out.append((home / "Documents" / "ComfyUI", "comfy-cli"))
    for ws in _comfy_cli_workspaces(_comfy_cli_config(home, environ, platform)):
        out += [(ws, "comfy-cli"), (ws / "ComfyUI", "comfy-cli")]
    roots = list(extra_roots) if extra_roots is not None else []
    if extra_roots is None and key == "windows":
        roots = _drive_roots(environ)
    for base in [home, home / "Desktop", home / "Downloads", home / "Documents", *roots]:
        try:
            entries = sorted(base.glob("ComfyUI_windows_portable*"))
        except OSError:
            continue
        out += [(entry / "ComfyUI", "portable") for entry in entries if entry.is_dir()]
    return out


# -- one install -----------------------------------------------------------------------------------


def manager_log_paths(user_dir: Path, flags: LaunchFlags | None) -> list[Path]:
    """ComfyUI-Manager's current log file(s) in a user directory.

    A running process tells exactly: ``comfyui_<N>.log`` for ``--port N`` given as two tokens,
    else ``comfyui.log``. Without a process, ``comfyui.log`` plus any ``comfyui_<N>.log``
    already there (never the ``.prev`` rotations: the follower finds those itself).
    """
    if flags is not None:
        if flags.port is not None and flags.port_form == "separate":
            return [user_dir / f"comfyui_{flags.port}.log"]
        return [user_dir / "comfyui.log"]
    out = [user_dir / "comfyui.log"]
    try:
        names = sorted(os.listdir(user_dir))
    except OSError:
        names = []
    out += [user_dir / n for n in names if _MANAGER_PORT_LOG.match(n)]
    return out


def _venv_python(directory: Path) -> str | None:
    for rel in (
        ".venv/bin/python",
        "venv/bin/python",
        ".venv/Scripts/python.exe",
        "venv/Scripts/python.exe",
    ):
        candidate = directory / rel
        if candidate.exists():
            return str(candidate)
    return None


def describe_install(
    path: str | os.PathLike[str],
    process: ComfyProcess | None = None,
    *,
    source: str = "location",
    desktop_logs: Path | None = None,
    name: str = "",
) -> DiscoveredInstance:
    """A ``DiscoveredInstance`` for one install, with its logs, URL and interpreter.

    ``path`` is the install (code dir or base dir); ``process`` the server running from it.
    Also used for instances the user configured by path only.
    """
    install = Path(path)
    flags = process.flags if process is not None else None
    code_dir = Path(process.code_dir) if process is not None else install
    user_dir = Path(process.user_dir) if process is not None else install / "user"
    logs: list[Path] = manager_log_paths(user_dir, flags)
    # Manager 2.x and older wrote comfyui.log into the working directory
    legacy_dirs: list[Path] = []
    if process is not None and process.cwd:
        legacy_dirs.append(Path(process.cwd))
    legacy_dirs += [code_dir, code_dir.parent] if source == "portable" else [code_dir]
    for d in legacy_dirs:
        legacy = d / "comfyui.log"
        if legacy not in logs and legacy.is_file():
            logs.append(legacy)
    if desktop_logs is not None:
        logs.append(desktop_logs / "comfyui.log")
    python: str | None = process.interpreter if process is not None else None
    if python is None:
        portable_python = code_dir.parent / "python_embeded" / "python.exe"
        if portable_python.exists():
            python = str(portable_python)
        else:
            python = _venv_python(install) or _venv_python(code_dir)
    if process is not None:
        url = process.url
    elif desktop_logs is not None:
        url = f"http://127.0.0.1:{DESKTOP_DEFAULT_PORT}"
    else:
        url = f"http://127.0.0.1:{DEFAULT_PORT}"
    return DiscoveredInstance(
        name=name or install.name or str(install),
        path=str(install),
        url=url,
        log_paths=tuple(dict.fromkeys(str(p) for p in logs)),
        pid=process.pid if process is not None else None,
        python=python,
        flags=flags,
        code_dir=str(code_dir),
        source=source,
        process=process,
    )


def _read_desktop_base(config_dir: Path) -> Path | None:
    try:
        data = json.loads((config_dir / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    base = data.get("basePath") if isinstance(data, dict) else None
    return Path(base) if isinstance(base, str) and base else None


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.normcase(os.path.normpath(os.path.abspath(os.fspath(path))))


# -- everything ----------------------------------------------------------------------------------


def discover_instances(
    *,
    home: str | os.PathLike[str],
    environ: Mapping[str, str],
    processes: Sequence[ComfyProcess] = (),
    platform: str = sys.platform,
    extra_roots: Sequence[Path] | None = None,
) -> tuple[DiscoveredInstance, ...]:
    """Every ComfyUI install found, running ones first; names are unique.

    ``processes`` comes from ``processes.find_comfy_processes()`` (or a test's list).
    """
    home_path = Path(home)
    desktop_config, desktop_logs = desktop_dirs(home_path, environ, platform)
    desktop_base = _read_desktop_base(desktop_config)

    found: list[DiscoveredInstance] = []
    claimed: set[str] = set()
    for proc in processes:
        is_desktop = proc.desktop or (
            desktop_base is not None and _key(proc.install_dir) == _key(desktop_base)
        )
        inst = describe_install(
            proc.install_dir,
            proc,
            source="desktop" if is_desktop else "process",
            desktop_logs=desktop_logs if is_desktop else None,
            name="ComfyUI Desktop" if is_desktop else "",
        )
        found.append(inst)
        claimed.add(_key(proc.install_dir))
        claimed.add(_key(proc.code_dir))

    if desktop_base is not None and _key(desktop_base) not in claimed:
        claimed.add(_key(desktop_base))
        found.append(
            describe_install(
                desktop_base,
                source="desktop",
                desktop_logs=desktop_logs,
                name="ComfyUI Desktop",
            )
        )

    for directory, source in candidate_locations(home_path, environ, platform, extra_roots):
        key = _key(directory)
        if key in claimed or not looks_like_comfyui(directory):
            continue
        claimed.add(key)
        found.append(describe_install(directory, source=source))

    return tuple(_unique_names(found))


def _unique_names(instances: list[DiscoveredInstance]) -> list[DiscoveredInstance]:
    counts: dict[str, int] = {}
    for inst in instances:
        counts[inst.name] = counts.get(inst.name, 0) + 1
    out: list[DiscoveredInstance] = []
    used: set[str] = set()
    for inst in instances:
        name = inst.name
        if counts[name] > 1:
            port = inst.flags.effective_port if inst.flags is not None else None
            name = f"{name}:{port}" if port is not None else f"{name} ({inst.path})"
        base, n = name, 2
        while name in used:
            name, n = f"{base}-{n}", n + 1
        used.add(name)
        out.append(inst if inst.name == name else dataclasses.replace(inst, name=name))
    return out
