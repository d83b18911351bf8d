"""Where things are for a Windows service: its own data dir, and ComfyUI's portable build and
Desktop app in every user's profile.

A service runs as LocalSystem, whose "home" is ``C:\\Windows\\System32\\config\\systemprofile``:
neither the user's ``%APPDATA%\\ComfyUI`` (ComfyUI Desktop's config and logs) nor the
``ComfyUI_windows_portable`` folder on their Desktop or in Downloads is under it. So the service
looks in each profile under ``C:\\Users`` with that profile's own ``APPDATA``/``LOCALAPPDATA``,
through the same ``discovery`` code the Linux daemon uses. Pure functions of the paths given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from oom_sentinel.daemon.comfy.discovery import DiscoveredInstance, desktop_dirs, discover_instances
from oom_sentinel.daemon.comfy.processes import ComfyProcess

__all__ = [
    "SKIPPED_PROFILES",
    "desktop_locations",
    "discover_all_profiles",
    "profile_environ",
    "service_data_dir",
    "user_profiles",
]

#: profiles that are never a person's
SKIPPED_PROFILES = frozenset({"all users", "default", "default user", "public", "defaultapppool"})


def service_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``%ProgramData%\\oom-sentinel`` (``C:\\ProgramData\\oom-sentinel``): the store, the
    snapshots and the desktop feed of the service (readable by Users, like ProgramData)."""
    env = os.environ if environ is None else environ
    return Path(env.get("ProgramData") or env.get("PROGRAMDATA") or r"C:\ProgramData") / (
        "oom-sentinel"
    )


def user_profiles(
    users_root: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[Path]:
    """The people's profile folders under ``C:\\Users`` (or ``users_root``), sorted."""
    env = os.environ if environ is None else environ
    if users_root is None:
        users_root = Path(env.get("SystemDrive", "C:") + "\\") / "Users"
    try:
        entries = sorted(users_root.iterdir())
    except OSError:
        return []
    return [
        e
        for e in entries
        if e.is_dir() and e.name.lower() not in SKIPPED_PROFILES and not e.name.startswith(".")
    ]


def profile_environ(profile: Path) -> dict[str, str]:
    """The environment discovery needs for one profile (what that user's session would have)."""
    return {
        "USERPROFILE": str(profile),
        "APPDATA": str(profile / "AppData" / "Roaming"),
        "LOCALAPPDATA": str(profile / "AppData" / "Local"),
    }


def discover_all_profiles(
    profiles: Sequence[Path],
    processes: Sequence[ComfyProcess] = (),
    *,
    extra_roots: Sequence[Path] = (),
) -> tuple[DiscoveredInstance, ...]:
    """ComfyUI installs in every profile: running ones, Desktop (``%APPDATA%\\ComfyUI``) and
    portable builds (home, Desktop, Downloads, Documents, ``extra_roots``). Names stay unique
    by prefixing the profile when two profiles have an install of the same name."""
    found: list[DiscoveredInstance] = []
    seen: set[str] = set()
    remaining = list(processes)
    for profile in profiles:
        instances = discover_instances(
            home=profile,
            environ=profile_environ(profile),
            processes=remaining,
            platform="win32",
            extra_roots=list(extra_roots),
        )
        remaining = []  # running processes are claimed once
        for inst in instances:
            key = os.path.normcase(inst.path)
            if key in seen:
                continue
            seen.add(key)
            found.append(inst)
    names: dict[str, int] = {}
    for inst in found:
        names[inst.name] = names.get(inst.name, 0) + 1
    out: list[DiscoveredInstance] = []
    for inst in found:
        if names[inst.name] > 1:
            owner = _owner(inst.path, profiles)
            if owner:
                from dataclasses import replace

                inst = replace(inst, name=f"{owner}: {inst.name}")
        out.append(inst)
    return tuple(out)


def desktop_locations(profile: Path) -> tuple[Path, Path]:
    """ComfyUI Desktop's (config dir, logs dir) in one profile: ``%APPDATA%\\ComfyUI``."""
    return desktop_dirs(profile, profile_environ(profile), "win32")


def _owner(path: str, profiles: Sequence[Path]) -> str | None:
    for profile in profiles:
        try:
            Path(path).relative_to(profile)
        except ValueError:
            continue
        return profile.name
    return None
