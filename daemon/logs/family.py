"""Which files are rotated copies of a followed log, and in which order they were rotated.

The follower (logtail.py) tracks a file by identity, but when that file leaves its configured
path it must find it again, read it to the end, and then know which files hold the lines that
were written *after* it. Those answers depend only on file names, so they live here, apart
from the reading:

- ComfyUI-Manager (comfyui-facts §3.4, anchors-manager-cli §1.7) rotates at every ComfyUI start:
  delete ``X.prev2.log``, ``X.prev.log`` → ``X.prev2.log``, ``X.log`` → ``X.prev.log``, open a
  new ``X.log`` truncated. ``X`` is ``comfyui`` or ``comfyui_<port>`` when ComfyUI's argv holds
  ``--port N`` as two tokens (``--port=N`` is not recognised and gives ``comfyui.log``).
- ComfyUI Desktop's electron-log archives ``comfyui.log`` under a timestamped name; reports show
  ``comfyui.log_2026-04-03T16-34-11-099Z.log``, its README says ``comfyui_<date>.log``
  (UNCONFIRMED), and electron-log's own default is ``X.old.log``. All three are accepted.
- logrotate's rename mode gives ``X.log.1``, ``X.log.2``… (compressed ones cannot be read and
  are never members).

Each naming *scheme* orders its own members by age (its rank). Schemes are never compared with one
another: the follower only walks forward inside the scheme where it found its file, then to
the live file. That keeps an unrelated file that merely matches a pattern (another port's
``comfyui_8188.log``, a copy left by copy-truncate) from ever being read as "newer lines".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ManagerLogFamily",
    "RotatedName",
    "RotationFamily",
    "manager_log_families",
    "manager_log_name",
    "manager_log_port",
]

_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4")
_MANAGER_LOG = re.compile(r"^comfyui(?:_(\d{1,5}))?(?:\.(prev2?))?\.log$")


@dataclass(frozen=True, slots=True)
class RotatedName:
    """How one file name belongs to a family: its scheme and its rank within that scheme."""

    #: "manager" (X.prev.log, X.prev2.log), "numbered" (X.log.N), "old" (X.old.log),
    #: "stamped" (X.log_<stamp>, X_<date>….log)
    scheme: str
    #: larger is newer (rotated later); only comparable within one scheme. Ages count down
    #: (``.prev2`` is -2, ``.log.3`` is -3); stamps sort lexically in time order (ISO-like).
    rank: tuple[int, str]


@dataclass(frozen=True, slots=True)
class RotationFamily:
    """The live file at ``live`` and the names its rotated copies take in the same directory."""

    live: Path

    @property
    def directory(self) -> Path:
        return self.live.parent

    def classify(self, name: str) -> RotatedName | None:
        """The scheme and rank of ``name`` if it is a rotated copy of the live file, else None."""
        live = self.live.name
        if name == live or name.endswith(_COMPRESSED):
            return None
        stem, suffix = os.path.splitext(live)
        if suffix == ".log":
            if name == f"{stem}.prev.log":
                return RotatedName("manager", (-1, ""))
            if name == f"{stem}.prev2.log":
                return RotatedName("manager", (-2, ""))
        if suffix and name == f"{stem}.old{suffix}":
            return RotatedName("old", (-1, ""))
        if name.startswith(live + "."):
            rest = name[len(live) + 1 :]
            if rest.isdigit():
                return RotatedName("numbered", (-int(rest), ""))
            return None
        if name.startswith(live + "_") and len(name) > len(live) + 1:
            return RotatedName("stamped", (0, name[len(live) + 1 :]))
        # X_<YYYY-MM-DD…>.log: a date, so another port's X_8188.log never matches.
        if suffix and re.fullmatch(
            re.escape(stem) + r"_(\d{4}-\d{2}-\d{2}.*)" + re.escape(suffix), name
        ):
            return RotatedName("stamped", (0, name[len(stem) + 1 :]))
        return None

    def is_member(self, name: str) -> bool:
        """True for the live name and every rotated name (the watcher's event filter)."""
        return name == self.live.name or self.classify(name) is not None

    def rotated(self) -> list[Path]:
        """Existing rotated copies in the directory (any scheme, unordered across schemes)."""
        try:
            with os.scandir(self.directory) as entries:
                names = [entry.name for entry in entries]
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        return sorted(self.directory / name for name in names if self.classify(name) is not None)

    def younger_than(self, path: Path) -> list[Path]:
        """Existing files holding lines written after ``path``'s, oldest first, live file last.

        ``path`` is a rotated member; the walk stays inside its scheme (see module docstring).
        The live file is included only if it exists.
        """
        here = self.classify(path.name)
        out: list[Path] = []
        if here is not None:
            same = [
                (rotated.rank, candidate)
                for candidate in self.rotated()
                if (rotated := self.classify(candidate.name)) is not None
                and rotated.scheme == here.scheme
                and rotated.rank > here.rank
            ]
            out = [candidate for _, candidate in sorted(same)]
        if self.live.exists():
            out.append(self.live)
        return out


def manager_log_name(port: int | None) -> str:
    """ComfyUI-Manager's log file name for a ComfyUI started with ``--port N`` (or without)."""
    return "comfyui.log" if port is None else f"comfyui_{port}.log"


def manager_log_port(argv: Sequence[str]) -> int | None:
    """The port in Manager's log file name for this ComfyUI argv.

    Manager only recognises ``--port N`` as two separate tokens; ``--port=N`` keeps the plain
    ``comfyui.log`` (anchors-manager-cli §1.7).
    """
    for i, token in enumerate(argv[:-1]):
        if token == "--port" and argv[i + 1].isdigit():
            return int(argv[i + 1])
    return None


@dataclass(frozen=True, slots=True)
class ManagerLogFamily:
    """One port's Manager log in a user dir: the live file and its existing rotated copies."""

    port: int | None
    live: Path
    #: existing rotated copies, newest first (``.prev.log`` then ``.prev2.log``)
    rotated: tuple[Path, ...]

    @property
    def family(self) -> RotationFamily:
        return RotationFamily(self.live)


def manager_log_families(user_dir: str | os.PathLike[str]) -> list[ManagerLogFamily]:
    """Every Manager log family present in ``user_dir``, whether or not its live file exists.

    A port whose only files are ``.prev.log`` / ``.prev2.log`` is listed too: that is how the
    directory looks after the instance on that port stopped. Sorted with the port-less
    ``comfyui.log`` first, then by port.
    """
    root = Path(user_dir)
    try:
        with os.scandir(root) as entries:
            names = [entry.name for entry in entries if entry.is_file()]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    ports: dict[int | None, dict[str, Path]] = {}
    for name in names:
        match = _MANAGER_LOG.match(name)
        if match is None:
            continue
        port = int(match.group(1)) if match.group(1) else None
        ports.setdefault(port, {})[match.group(2) or "live"] = root / name
    families: list[ManagerLogFamily] = []
    for port in sorted(ports, key=lambda p: -1 if p is None else p):
        found = ports[port]
        rotated = tuple(found[kind] for kind in ("prev", "prev2") if kind in found)
        families.append(ManagerLogFamily(port, root / manager_log_name(port), rotated))
    return families
