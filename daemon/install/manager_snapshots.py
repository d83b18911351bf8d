"""Read and write ComfyUI-Manager snapshot files, so users can hand us the states Manager
saved before an "Update All" and get ours back in a form Manager can restore.

Manager's format has quirks every reader must tolerate (see
research/anchors-manager-cli.md §1.2): commit hashes with a trailing newline (read raw from a
detached ``.git/HEAD``), ``"unknown"`` hashes (a branch ref that was packed), repository URLs
verbatim from ``.git/config`` (SSH or HTTPS, with or without ``.git``), disabled CNR packs left
out, ``pips`` mixing ``name==ver: ""`` keys with ``name: url`` direct references and ``-e``
lines, ``comfyui: null`` for portable installs and custom-nodes-only manager snapshots, and a YAML
variant that wraps everything under ``custom_nodes:``. Manager snapshots live in one of three places
depending on the Manager version.

Parsing (``parse_manager_snapshot``, ``to_manager_snapshot``) is pure; reading, listing and the
atomic write are thin I/O around it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from oom_sentinel.daemon.comfy.interpreter import redact_url_credentials
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.install.state import (
    STATE_FORMAT,
    CoreState,
    CustomNode,
    InstallState,
    normalize_remote_url,
    url_key,
    validate_node_name,
)

__all__ = [
    "MANAGER_SNAPSHOT_DIRS",
    "OUR_POSTFIX",
    "ManagerSnapshotFile",
    "find_manager_snapshots",
    "git_pack_matcher",
    "manager_snapshot_dirs",
    "manager_snapshot_filename",
    "node_name_from_url",
    "parse_manager_snapshot",
    "parse_manager_snapshot_filename_time",
    "read_manager_snapshot",
    "read_state_file",
    "resolve_unknown_commits",
    "to_manager_snapshot",
    "write_manager_snapshot",
]

#: Manager snapshot folders relative to (user dir, ComfyUI root), newest Manager layout first:
#: v4 ``<user>/__manager/snapshots``, v3 ``<user>/default/ComfyUI-Manager/snapshots``,
#: v2 and older ``custom_nodes/ComfyUI-Manager/snapshots``.
MANAGER_SNAPSHOT_DIRS: tuple[tuple[str, str], ...] = (
    ("user", "__manager/snapshots"),
    ("user", "default/ComfyUI-Manager/snapshots"),
    ("root", "custom_nodes/ComfyUI-Manager/snapshots"),
)

#: Postfix of the manager snapshot files we write (Manager uses snapshot / autosave / cli-autosave).
OUR_POSTFIX = "oom-sentinel"

_MANAGER_KEYS = ("comfyui", "git_custom_nodes", "cnr_custom_nodes", "file_custom_nodes", "pips")
_HEX = re.compile(r"^[0-9a-fA-F]{7,64}$")
_NAME_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})")
_MANAGER_SNAPSHOT_SUFFIXES = (".json", ".yaml", ".yml")

K = TypeVar("K")


# ---------------------------------------------------------------------------------------------
# Pure: Manager dict → InstallState


def node_name_from_url(url: str, where: str) -> str:
    """The folder Manager clones ``url`` into: the URL's last path part without ``.git``."""
    normalized = normalize_remote_url(url) or ""
    base = re.split(r"[/:]", normalized.rstrip("/"))[-1] if normalized else ""
    if base.endswith(".git"):
        base = base[: -len(".git")]
    return validate_node_name(base, where)


def _clean_commit(value: Any, where: str) -> str | None:
    """Manager's hash: strip the newline a detached HEAD leaves; ``"unknown"`` and ``""``
    mean the commit was not pinned (resolve from disk with ``resolve_unknown_commits``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: expected a commit hash string, got {type(value).__name__}")
    text = value.strip()
    if text.lower() in ("", "unknown"):
        return None
    if not _HEX.match(text):
        raise InputError(f"{where}: not a commit hash: {text!r}")
    return text.lower()


def _pip_lines(pips: Any, where: str) -> tuple[str, ...] | None:
    if pips is None:
        return None
    if not isinstance(pips, Mapping):
        raise InputError(
            f"{where}: pips: expected an object of freeze lines, got {type(pips).__name__}"
        )
    lines: set[str] = set()
    for key, value in pips.items():
        if not isinstance(key, str):
            raise InputError(f"{where}: pips: key {key!r} is not a string")
        if value is not None and not isinstance(value, str):
            raise InputError(
                f"{where}: pips[{key!r}]: expected a string, got {type(value).__name__}"
            )
        name = key.strip()
        if not name or name.startswith("#"):
            continue  # pip's "# Editable install with no version control" comments
        url = (value or "").strip()
        line = f"{name} @ {url}" if url else name
        lines.add(redact_url_credentials(line))
    return tuple(sorted(lines, key=lambda s: (s.lower(), s)))


def parse_manager_snapshot(
    data: Any,
    where: str,
    *,
    captured_at_epoch_s: float | None = None,
    source: str | None = None,
) -> InstallState:
    """A Manager snapshot (the JSON object, or the YAML document with its ``custom_nodes:``
    wrapper) as an ``InstallState``. ``where`` names the file in error messages.

    Git packs are named after their URL's basename (the folder Manager would clone into),
    CNR packs after their id, file nodes after their file name; every name is checked not to
    escape ``custom_nodes/``."""
    if isinstance(data, Mapping) and "custom_nodes" in data and "comfyui" not in data:
        data = data["custom_nodes"]
        if not isinstance(data, Mapping):
            raise InputError(f"{where}: custom_nodes: expected a mapping")
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: top level: expected an object with {', '.join(_MANAGER_KEYS)}")
    if not any(key in data for key in _MANAGER_KEYS):
        raise InputError(
            f"{where}: top level: not a ComfyUI-Manager snapshot (none of {', '.join(_MANAGER_KEYS)})"
        )
    comfyui = _clean_commit(data.get("comfyui"), f"{where}: comfyui")

    nodes: list[CustomNode] = []
    git_nodes = data.get("git_custom_nodes")
    if git_nodes is None:
        git_nodes = {}
    if not isinstance(git_nodes, Mapping):
        raise InputError(f"{where}: git_custom_nodes: expected an object keyed by repository URL")
    for url, info in git_nodes.items():
        field = f"git_custom_nodes[{url!r}]"
        if not isinstance(url, str) or not url.strip():
            raise InputError(f"{where}: git_custom_nodes: key {url!r} is not a repository URL")
        if not isinstance(info, Mapping):
            raise InputError(f"{where}: {field}: expected an object with hash and disabled")
        if "hash" not in info:
            raise InputError(f"{where}: {field}.hash: missing")
        disabled = info.get("disabled", False)
        if not isinstance(disabled, bool):
            raise InputError(f"{where}: {field}.disabled: expected true or false, got {disabled!r}")
        nodes.append(
            CustomNode(
                name=node_name_from_url(url, f"{where}: {field}"),
                kind="git",
                disabled=disabled,
                commit=_clean_commit(info.get("hash"), f"{where}: {field}.hash"),
                url=normalize_remote_url(url),
            )
        )

    cnr_nodes = data.get("cnr_custom_nodes")
    if cnr_nodes is None:
        cnr_nodes = {}
    if not isinstance(cnr_nodes, Mapping):
        raise InputError(f"{where}: cnr_custom_nodes: expected an object of id → version")
    for cnr_id, version in cnr_nodes.items():
        field = f"cnr_custom_nodes[{cnr_id!r}]"
        name = validate_node_name(cnr_id, f"{where}: {field}")
        if isinstance(version, bool) or not isinstance(version, str | int | float):
            raise InputError(f"{where}: {field}: expected a version string, got {version!r}")
        nodes.append(
            CustomNode(
                name=name, kind="cnr", disabled=False, version=str(version).strip(), cnr_id=name
            )
        )

    file_nodes = data.get("file_custom_nodes")
    if file_nodes is None:
        file_nodes = []
    if not isinstance(file_nodes, list):
        raise InputError(f"{where}: file_custom_nodes: expected a list")
    for i, item in enumerate(file_nodes):
        field = f"file_custom_nodes[{i}]"
        if not isinstance(item, Mapping):
            raise InputError(f"{where}: {field}: expected an object with filename and disabled")
        if "filename" not in item:
            raise InputError(f"{where}: {field}.filename: missing")
        name = validate_node_name(item.get("filename"), f"{where}: {field}.filename")
        disabled = item.get("disabled", False)
        if not isinstance(disabled, bool):
            raise InputError(f"{where}: {field}.disabled: expected true or false, got {disabled!r}")
        if name.endswith(".disabled"):
            name, disabled = name[: -len(".disabled")], True
        nodes.append(CustomNode(name=name, kind="file", disabled=disabled))

    return InstallState(
        comfyui=CoreState(commit=comfyui),
        nodes=tuple(nodes),
        pip=_pip_lines(data.get("pips"), where),
        interpreter=None,
        root=None,
        captured_at_epoch_s=captured_at_epoch_s,
        source=source or f"manager:{where}",
    )


# ---------------------------------------------------------------------------------------------
# Pure: InstallState → Manager dict


def to_manager_snapshot(state: InstallState) -> dict[str, Any]:
    """Our state in Manager's JSON layout and key order.

    What Manager's format cannot hold is left out the way Manager itself leaves it out:
    git packs without a remote URL, plain folders, and disabled CNR packs (Manager's restore
    deliberately does not restore those). An unknown git commit is written as ``"unknown"``,
    as Manager writes it."""
    git_nodes: dict[str, dict[str, Any]] = {}
    cnr_nodes: dict[str, str] = {}
    file_nodes: list[dict[str, Any]] = []
    for node in state.nodes:
        if node.kind == "git" and node.url:
            git_nodes[node.url] = {"hash": node.commit or "unknown", "disabled": node.disabled}
        elif node.kind == "cnr" and not node.disabled and node.version:
            cnr_nodes[node.cnr_id or node.name] = node.version
        elif node.kind == "file":
            file_nodes.append({"filename": node.name, "disabled": node.disabled})
    pips: dict[str, str] | None = None
    if state.pip is not None:
        pips = {}
        for line in state.pip:
            m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?)\s+@\s+(\S.*)$", line)
            if m and not line.startswith("-"):
                pips[m.group(1)] = m.group(2).strip()
            else:
                pips[line] = ""
    return {
        "comfyui": state.comfyui.commit,
        "git_custom_nodes": git_nodes,
        "cnr_custom_nodes": cnr_nodes,
        "file_custom_nodes": file_nodes,
        "pips": pips,
    }


def manager_snapshot_filename(at_epoch_s: float, postfix: str = OUR_POSTFIX) -> str:
    """``<YYYY-MM-DD_HH-MM-SS>_<postfix>.json`` in local time, as Manager names its files."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(at_epoch_s))
    return f"{stamp}_{postfix}.json"


def parse_manager_snapshot_filename_time(name: str) -> float | None:
    """The local time encoded in a Manager snapshot file name, as epoch seconds."""
    m = _NAME_TIME.match(name)
    if not m:
        return None
    try:
        return datetime.strptime(m.group(1), "%Y-%m-%d_%H-%M-%S").timestamp()
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# Pure: combine a Manager state with what is on disk


def git_pack_matcher(
    installed: Iterable[tuple[K, str, Iterable[str | None]]],
) -> Callable[[CustomNode], K | None]:
    """How a Manager snapshot's git entry finds the installed pack it means, given the
    installed git packs as (key, folder name, remote URLs): by remote URL first (``url_key``,
    so SSH, HTTPS, ``ssh://``, ``.git``, a trailing slash and case all match; any of a pack's
    remotes; the first pack listed wins), else by folder name (Manager clones a URL into its
    basename, which is the entry's ``name``). ``None``: the pack is not installed.

    The one matching rule: ``resolve_unknown_commits`` here and the bisect's Manager
    snapshot states (``bisect/state/states.py``) both use it."""
    by_url: dict[str, K] = {}
    by_name: dict[str, K] = {}
    for key, name, urls in installed:
        for url in urls:
            ukey = url_key(url)
            if ukey is not None:
                by_url.setdefault(ukey, key)
        by_name.setdefault(name, key)

    def match(node: CustomNode) -> K | None:
        ukey = url_key(node.url)
        if ukey is not None and ukey in by_url:
            return by_url[ukey]
        return by_name.get(node.name)

    return match


def resolve_unknown_commits(manager: InstallState, disk: InstallState) -> InstallState:
    """Fill the commits a Manager file left ``"unknown"`` from a capture of the install, for
    packs present on disk (``git_pack_matcher``: by normalized URL, then by name). Packs not
    on disk keep ``None``: nothing can tell what they were."""
    on_disk = [n for n in disk.nodes if n.kind == "git"]
    match = git_pack_matcher((i, n.name, (n.url,)) for i, n in enumerate(on_disk))
    resolved: list[CustomNode] = []
    for node in manager.nodes:
        if node.kind == "git" and node.commit is None:
            found = match(node)
            commit = None if found is None else on_disk[found].commit
            if commit is not None:
                node = replace(node, commit=commit)
        resolved.append(node)
    return replace(manager, nodes=tuple(resolved))


# ---------------------------------------------------------------------------------------------
# I/O


@dataclass(frozen=True, slots=True)
class ManagerSnapshotFile:
    path: Path
    #: local time from the file name (``None`` when the user renamed it), else the mtime
    at_epoch_s: float
    #: which Manager layout's folder it was found in: "v4", "v3", "legacy"
    layout: str


def manager_snapshot_dirs(root: str | Path, user_dir: str | Path | None = None) -> list[Path]:
    """Every folder a Manager version keeps manager snapshots in, newest layout first. ``user_dir``
    is ComfyUI's ``--user-directory`` (default ``<root>/user``)."""
    base = Path(root)
    user = Path(user_dir) if user_dir is not None else base / "user"
    return [(user if anchor == "user" else base) / rel for anchor, rel in MANAGER_SNAPSHOT_DIRS]


def find_manager_snapshots(
    root: str | Path, user_dir: str | Path | None = None
) -> list[ManagerSnapshotFile]:
    """All Manager snapshot files (``.json``, ``.yaml``, ``.yml``) of an install, oldest
    first (by the time in the name, falling back to the file's mtime)."""
    layouts = ("v4", "v3", "legacy")
    found: list[ManagerSnapshotFile] = []
    for layout, folder in zip(layouts, manager_snapshot_dirs(root, user_dir), strict=True):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = folder / name
            if not name.lower().endswith(_MANAGER_SNAPSHOT_SUFFIXES) or not path.is_file():
                continue
            at = parse_manager_snapshot_filename_time(name)
            if at is None:
                try:
                    at = path.stat().st_mtime
                except OSError:
                    continue
            found.append(ManagerSnapshotFile(path=path, at_epoch_s=at, layout=layout))
    found.sort(key=lambda f: (f.at_epoch_s, f.path.name))
    return found


#: deeper documents are refused: no manager snapshot or state file nests more than a few levels, and
#: walking a deeper one (parsers, our own recursive readers) would exhaust the stack
MAX_DOCUMENT_DEPTH = 64


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests containers deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _load_document(path: Path) -> Any:
    try:
        text = path.read_text("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    too_deep = InputError(f"{path}: nested more than {MAX_DOCUMENT_DEPTH} levels deep")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # only Manager's YAML snapshots need it; the daemon stays lighter without

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise InputError(f"{path}: not valid YAML{where}") from exc
        except RecursionError:
            raise too_deep from None
    else:
        try:
            data = json.loads(text)
        except RecursionError:
            raise too_deep from None
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from exc
    if _depth_exceeds(data, MAX_DOCUMENT_DEPTH):
        raise too_deep
    return data


def _manager_from_document(p: Path, data: Any) -> InstallState:
    if p.suffix.lower() in (".yaml", ".yml") and not (
        isinstance(data, Mapping) and "custom_nodes" in data
    ):
        raise InputError(
            f"{p}: custom_nodes: missing (Manager's YAML snapshots wrap everything in it)"
        )
    return parse_manager_snapshot(
        data,
        str(p),
        captured_at_epoch_s=parse_manager_snapshot_filename_time(p.name),
        source=f"manager:{p.name}",
    )


def read_manager_snapshot(path: str | Path) -> InstallState:
    """One Manager snapshot file (JSON or YAML) as a state; ``InputError`` names the file and
    the field when it is malformed."""
    p = Path(path)
    return _manager_from_document(p, _load_document(p))


def read_state_file(path: str | Path) -> InstallState:
    """A state from any file we understand: our own state JSON (``format`` field), a Manager
    JSON snapshot, or a Manager YAML snapshot (manager snapshots both)."""
    p = Path(path)
    data = _load_document(p)
    if isinstance(data, Mapping) and data.get("format") == STATE_FORMAT:
        return InstallState.from_dict(data, str(p))
    return _manager_from_document(p, data)


def write_manager_snapshot(
    state: InstallState,
    directory: str | Path | None = None,
    *,
    path: str | Path | None = None,
    at_epoch_s: float | None = None,
) -> Path:
    """Write ``state`` as a Manager-compatible snapshot (4-space indent, Manager's key order)
    atomically; into ``directory`` under Manager's file-name scheme, or to ``path``."""
    if path is None:
        if directory is None:
            raise ValueError("write_manager_snapshot needs a directory or a path")
        when = at_epoch_s if at_epoch_s is not None else state.captured_at_epoch_s
        name = manager_snapshot_filename(time.time() if when is None else when)
        target = Path(directory) / name
    else:
        target = Path(path)
    text = json.dumps(to_manager_snapshot(state), indent=4) + "\n"
    return write_text_atomic(target, text, mode=0o644)


def manager_states(
    root: str | Path, user_dir: str | Path | None = None
) -> Sequence[tuple[ManagerSnapshotFile, InstallState | InputError]]:
    """Every Manager snapshot of an install read as a state, or the error that file gave
    (one bad file must not hide the others)."""
    out: list[tuple[ManagerSnapshotFile, InstallState | InputError]] = []
    for found in find_manager_snapshots(root, user_dir):
        try:
            state = read_manager_snapshot(found.path)
        except InputError as exc:
            out.append((found, exc))
            continue
        if state.captured_at_epoch_s is None:
            state = replace(state, captured_at_epoch_s=found.at_epoch_s)
        out.append((found, state))
    return out
