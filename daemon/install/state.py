"""What a ComfyUI install consists of right now: the core commit, every custom node and the
Python environment, as one frozen record with a stable id.

"It ran yesterday; after updating, it runs out of memory" can only be bisected if we know the
exact before and after states. An ``InstallState`` is that record; ``state_id`` is a hash of
its canonical form so the daemon stores an identical state once however often it captures it.

Capture reads, never writes: refs and ``.git/config`` are read by GitPython without running
git, and the one git command (``status``, for dirty files) runs with optional locks off so it
does not refresh the index. Every ``Repo`` is closed (GitPython keeps ``git cat-file``
processes and memory maps alive until ``close()``; a long-running daemon would leak them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from oom_sentinel.daemon.comfy.interpreter import (
    DEFAULT_TIMEOUT_S,
    InterpreterFacts,
    probe_interpreter,
    redact_url_credentials,
)
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.core.gitread import git_dirs, read_head, remote_urls, run_git

__all__ = [
    "CONTENT_HASH_FULL_LIMIT_BYTES",
    "CORE_REPO",
    "STATE_FORMAT",
    "CoreState",
    "CustomNode",
    "InstallState",
    "NodeKind",
    "capture_install",
    "content_hash",
    "custom_nodes_dir",
    "git_head",
    "iter_git_repos",
    "iter_node_entries",
    "node_name_problem",
    "node_path",
    "normalize_remote_url",
    "read_comfyui_version",
    "resolve_comfyui_root",
    "scan_custom_nodes",
    "url_key",
    "validate_node_name",
    "watch_paths",
]

NodeKind = Literal["git", "cnr", "file", "folder"]
NODE_KINDS: tuple[str, ...] = ("git", "cnr", "file", "folder")

#: The repo name the core goes by in histories and diffs (node names are folder names, and
#: no folder in custom_nodes/ can be called this because it holds a slash).
CORE_REPO = "ComfyUI/"

#: ``format`` field of our own state JSON files.
STATE_FORMAT = "oom-sentinel/install-state"
STATE_FORMAT_VERSION = 1

#: Files up to this size are hashed by content; bigger ones (model weights that some packs
#: download into their own folder) by path and size only, so a capture never reads gigabytes.
CONTENT_HASH_FULL_LIMIT_BYTES = 1 << 20

_DISABLED_SUFFIX = ".disabled"
_DISABLED_DIR = ".disabled"
_HEX = re.compile(r"^[0-9a-f]{7,64}$")


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True, slots=True)
class CoreState:
    """ComfyUI itself. ``commit`` is ``None`` for a checkout without git (portable/desktop
    zips) or an unreadable one; ``dirty`` is ``None`` when it could not be determined."""

    commit: str | None = None
    branch: str | None = None
    url: str | None = None
    dirty: tuple[str, ...] | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class CustomNode:
    """One entry of ``custom_nodes/``.

    ``name`` is the folder or file name without the ``.disabled`` suffix and, for the
    ``.disabled/<id>@<version>`` convention, without the ``@version`` part. ``entry`` is the
    path relative to the custom-nodes folder (informational, not part of the state id)."""

    name: str
    kind: NodeKind
    disabled: bool = False
    commit: str | None = None
    branch: str | None = None
    url: str | None = None
    version: str | None = None
    cnr_id: str | None = None
    content_hash: str | None = None
    entry: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "disabled": self.disabled,
            "commit": self.commit,
            "branch": self.branch,
            "url": self.url,
            "version": self.version,
            "cnr_id": self.cnr_id,
            "content_hash": self.content_hash,
            "entry": self.entry,
        }


@dataclass(frozen=True)
class InstallState:
    """A whole install at one moment. ``pip``/``interpreter`` are ``None`` when the
    interpreter was not asked (or could not answer)."""

    comfyui: CoreState
    nodes: tuple[CustomNode, ...] = ()
    pip: tuple[str, ...] | None = None
    interpreter: InterpreterFacts | None = None
    #: the ComfyUI directory this was captured from (``None`` for foreign files)
    root: str | None = None
    captured_at_epoch_s: float | None = None
    #: where the state came from: "capture", "reflog", "manager:<file>", "file:<path>"
    source: str = "capture"
    _id: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.nodes, key=_node_sort_key))
        object.__setattr__(self, "nodes", ordered)
        object.__setattr__(self, "_id", _hash_canonical(self.canonical()))

    @property
    def state_id(self) -> str:
        """16 hex digits of SHA-256 over ``canonical()``: equal for equal code states."""
        return self._id

    def canonical(self) -> dict[str, Any]:
        """What makes two states the same: commits, the node set with kinds, versions, content
        hashes and disabled flags, dirty paths, pip lines and the torch/CUDA/driver versions.
        Not part of it: capture time, source, root, branch names, remote URLs, GPU list."""
        env = self.interpreter
        return {
            "v": STATE_FORMAT_VERSION,
            "comfyui": {
                "commit": self.comfyui.commit,
                "version": self.comfyui.version,
                "dirty": None if self.comfyui.dirty is None else sorted(self.comfyui.dirty),
            },
            "nodes": [
                [n.name, n.kind, n.disabled, n.commit, n.version, n.content_hash]
                for n in self.nodes
            ],
            "pip": None if self.pip is None else sorted(self.pip),
            "env": None
            if env is None or env.error is not None
            else {
                "python": env.python_version,
                "torch": env.torch_version,
                "cuda": env.cuda_version,
                "hip": env.hip_version,
                "cudnn": env.cudnn_version,
                "driver": env.driver_version,
            },
        }

    def node(self, name: str) -> CustomNode | None:
        """The node called ``name`` (an enabled copy before a disabled one)."""
        for node in sorted(self.nodes, key=lambda n: n.disabled):
            if node.name == name:
                return node
        return None

    def node_table(self) -> dict[str, CustomNode]:
        """Nodes keyed by name; when a name occurs twice (an enabled pack and a disabled
        copy in ``.disabled/``), the extra copies are keyed by their ``entry``."""
        table: dict[str, CustomNode] = {}
        for node in sorted(self.nodes, key=lambda n: (n.name, n.disabled, n.entry or "")):
            key = node.name
            if key in table:
                key = node.entry or f"{node.name}#{len(table)}"
            table[key] = node
        return table

    def with_environment(
        self, pip: tuple[str, ...] | None, interpreter: InterpreterFacts | None
    ) -> InstallState:
        """The same git/node state with other environment facts (the daemon re-probes the
        interpreter less often than it reads git, and carries the last facts over)."""
        return replace(self, pip=pip, interpreter=interpreter)

    # -- JSON ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "state_id": self.state_id,
            "source": self.source,
            "root": self.root,
            "captured_at_epoch_s": self.captured_at_epoch_s,
            "comfyui": {
                "commit": self.comfyui.commit,
                "branch": self.comfyui.branch,
                "url": self.comfyui.url,
                "dirty": None if self.comfyui.dirty is None else list(self.comfyui.dirty),
                "version": self.comfyui.version,
            },
            "nodes": [n.to_dict() for n in self.nodes],
            "pip": None if self.pip is None else list(self.pip),
            "interpreter": None if self.interpreter is None else self.interpreter.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = "state") -> InstallState:
        """Validate and rebuild; a bad field raises ``InputError`` naming ``where`` and it."""
        return _state_from_dict(data, where)

    @classmethod
    def from_json(cls, text: str, where: str = "state") -> InstallState:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, where)


def _node_sort_key(node: CustomNode) -> tuple[str, bool, str, str]:
    return (node.name.lower(), node.disabled, node.name, node.entry or "")


def _hash_canonical(canonical: Mapping[str, Any]) -> str:
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Validation helpers shared with the Manager reader


def node_name_problem(name: str) -> str | None:
    """Why ``name`` is not one plain entry of ``custom_nodes/``, or None if it is.

    A node is a folder or file directly under ``custom_nodes/``: no path separator, not
    ``.``/``..``, not absolute, no drive letter, no NUL or line break. Anything else could make
    a later restore or bisect write outside ``custom_nodes/``. The one test of a node name: the
    Manager reader, the install state and the bisect's states all ask it."""
    bad = (
        name in (".", "..")
        or any(c in name for c in "/\\\0\n\r")
        or os.path.isabs(name)
        or re.match(r"^[A-Za-z]:", name) is not None
    )
    return "would escape custom_nodes/ (one file or folder name)" if bad else None


def validate_node_name(name: Any, where: str) -> str:
    """``name`` if it is a node name (``node_name_problem``), else a one-line InputError."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{where}: node name must be a non-empty string")
    problem = node_name_problem(name)
    if problem is not None:
        raise InputError(f"{where}: node name {name!r} {problem}")
    return name


class _Fields:
    """Typed access to a JSON object with error messages that name the field path."""

    def __init__(self, data: Any, where: str, path: str) -> None:
        if not isinstance(data, Mapping):
            raise InputError(f"{where}: {path or 'top level'}: expected an object")
        self.data = data
        self.where = where
        self.path = path

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _fail(self, key: str, what: str) -> InputError:
        return InputError(f"{self.where}: {self._name(key)}: {what}")

    def opt_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._fail(key, f"expected a string, got {type(value).__name__}")
        return value

    def opt_commit(self, key: str) -> str | None:
        value = self.opt_str(key)
        if value is not None and not _HEX.match(value):
            raise self._fail(key, f"not a commit hash: {value!r}")
        return value

    def bool_(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, f"expected true or false, got {value!r}")
        return value

    def opt_float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, f"expected a number, got {value!r}")
        return float(value)

    def opt_str_list(self, key: str) -> tuple[str, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "expected a list of strings")
        return tuple(value)

    def sub(self, key: str) -> _Fields:
        return _Fields(self.data.get(key), self.where, self._name(key))


def _state_from_dict(data: Any, where: str) -> InstallState:
    top = _Fields(data, where, "")
    fmt = top.opt_str("format")
    if fmt != STATE_FORMAT:
        raise InputError(f"{where}: format: expected {STATE_FORMAT!r}, got {fmt!r}")
    core = top.sub("comfyui")
    nodes_raw = data.get("nodes")
    if not isinstance(nodes_raw, list):
        raise InputError(f"{where}: nodes: expected a list")
    nodes: list[CustomNode] = []
    for i, raw in enumerate(nodes_raw):
        f = _Fields(raw, where, f"nodes[{i}]")
        kind = f.opt_str("kind")
        if kind not in NODE_KINDS:
            raise InputError(
                f"{where}: nodes[{i}].kind: expected one of {NODE_KINDS}, got {kind!r}"
            )
        nodes.append(
            CustomNode(
                name=validate_node_name(raw.get("name"), f"{where}: nodes[{i}].name"),
                kind=kind,  # type: ignore[arg-type]
                disabled=f.bool_("disabled"),
                commit=f.opt_commit("commit"),
                branch=f.opt_str("branch"),
                url=f.opt_str("url"),
                version=f.opt_str("version"),
                cnr_id=f.opt_str("cnr_id"),
                content_hash=f.opt_str("content_hash"),
                entry=f.opt_str("entry"),
            )
        )
    interp_raw = data.get("interpreter")
    interpreter = None
    if interp_raw is not None:
        _Fields(interp_raw, where, "interpreter")
        interpreter = InterpreterFacts.from_dict(interp_raw)
    state = InstallState(
        comfyui=CoreState(
            commit=core.opt_commit("commit"),
            branch=core.opt_str("branch"),
            url=core.opt_str("url"),
            dirty=core.opt_str_list("dirty"),
            version=core.opt_str("version"),
        ),
        nodes=tuple(nodes),
        pip=top.opt_str_list("pip"),
        interpreter=interpreter,
        root=top.opt_str("root"),
        captured_at_epoch_s=top.opt_float("captured_at_epoch_s"),
        source=top.opt_str("source") or "file",
    )
    return state


# ---------------------------------------------------------------------------------------------
# Pure helpers: URLs, versions


def normalize_remote_url(url: str | None) -> str | None:
    """One spelling per repository, without credentials.

    ``git@github.com:o/r.git``, ``ssh://git@github.com/o/r``, ``https://user:tok@github.com/o/r/``
    → ``https://github.com/o/r``. SSH and git:// forms of any host become ``https://host/path``
    (ComfyUI-Manager's restore matches on the same form); http(s) keep their scheme and port;
    local paths are returned as they are. Query strings and fragments are dropped."""
    if url is None:
        return None
    text = url.strip()
    if not text:
        return None
    if "://" in text:
        try:
            parts = urlsplit(text)
            host = (parts.hostname or "").lower()
            port = parts.port
        except ValueError:
            return redact_url_credentials(text)
        scheme = parts.scheme.lower()
        path = parts.path
        if scheme in ("http", "https"):
            netloc = host if port is None else f"{host}:{port}"
            result = f"{scheme}://{netloc}{path}"
        elif scheme in ("ssh", "git", "git+ssh", "ssh+git"):
            result = f"https://{host}{path}"
        elif scheme == "file":
            result = f"file://{path}"
        else:
            return redact_url_credentials(text).rstrip("/")
        if host == "github.com" and result.startswith("http://"):
            result = "https://" + result[len("http://") :]
    else:
        scp = re.match(r"^(?:[^@/\s]+@)?([^:/\s]+):(?!/)(.+)$", text)
        if scp and len(scp.group(1)) > 1:  # "C:\\path" is a Windows path, not host "C"
            result = f"https://{scp.group(1).lower()}/{scp.group(2).lstrip('/')}"
        else:
            return text
    result = result.rstrip("/")
    if result.endswith(".git"):
        result = result[: -len(".git")]
    return result.rstrip("/")


def url_key(url: str | None) -> str | None:
    """Comparison key for two remote URLs: the normalized spelling, case-insensitive (GitHub
    and GitLab treat owner/repo so) and ``http`` read as ``https`` (one repository either way).

    The one comparison of remote URLs in the project: the daemon's state diff and Manager
    reader and the bisect's manager snapshot matching all use it, so
    ``git@gitlab.com:O/R.git``, ``ssh://git@gitlab.com/o/r`` and ``https://gitlab.com/O/R/``
    are one repository everywhere."""
    normalized = normalize_remote_url(url)
    if normalized is None:
        return None
    key = normalized.lower()
    return "https://" + key[len("http://") :] if key.startswith("http://") else key


_VERSION_ASSIGN = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*(['"])([^'"]+)\1""", re.M)


def read_comfyui_version(root: str | Path) -> str | None:
    """``__version__`` from ``comfyui_version.py`` (read, never imported), else
    ``pyproject.toml`` ``[project].version``."""
    base = Path(root)
    try:
        text = (base / "comfyui_version.py").read_text("utf-8", errors="replace")
        m = _VERSION_ASSIGN.search(text)
        if m:
            return m.group(2)
    except OSError:
        pass
    return _pyproject_field(base / "pyproject.toml", "version")


def _pyproject_field(path: Path, key: str) -> str | None:
    try:
        data = tomllib.loads(path.read_text("utf-8", errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    project = data.get("project")
    if isinstance(project, dict) and isinstance(project.get(key), str):
        return str(project[key]).strip() or None
    return None


# ---------------------------------------------------------------------------------------------
# Locating things


def resolve_comfyui_root(path: str | Path) -> Path:
    """The ComfyUI code directory for ``path``: the path itself when it holds ``main.py``, or
    its ``ComfyUI/`` sub-folder (the Windows portable layout)."""
    base = Path(path).expanduser()
    if not base.is_dir():
        raise InputError(f"{base}: not a directory")
    for candidate in (base, base / "ComfyUI"):
        if (candidate / "main.py").is_file():
            return candidate.resolve()
    raise InputError(f"{base}: not a ComfyUI install (no main.py here or in ComfyUI/)")


def custom_nodes_dir(root: str | Path) -> Path:
    return Path(root) / "custom_nodes"


def node_path(root: str | Path, node: CustomNode) -> Path | None:
    """Where ``node`` lives under the install at ``root`` (``None`` without an entry)."""
    if node.entry is None:
        return None
    return custom_nodes_dir(root) / node.entry


def watch_paths(root: str | Path) -> list[Path]:
    """Paths whose change means the install changed: the core's HEAD, refs and packed refs,
    ``custom_nodes/`` and ``custom_nodes/.disabled/``, and every git node's HEAD. The daemon
    hands these to watchdog and captures again (debounced) when one changes."""
    base = Path(root)
    paths: list[Path] = []
    dirs = git_dirs(base)
    if dirs is not None:
        gitdir, common = dirs
        paths += [gitdir / "HEAD", common / "refs" / "heads", common / "packed-refs"]
    cn = custom_nodes_dir(base)
    paths += [cn, cn / _DISABLED_DIR]
    for entry, _name, _disabled in iter_node_entries(cn):
        node_dirs = git_dirs(cn / entry)
        if node_dirs is not None:
            paths.append(node_dirs[0] / "HEAD")
    return paths


# ---------------------------------------------------------------------------------------------
# Git reading: ref and config files directly (``gitread``), ``git status`` as a subprocess


@dataclass(frozen=True, slots=True)
class GitHead:
    commit: str | None
    branch: str | None
    url: str | None


def git_head(path: str | Path) -> GitHead:
    """Commit, branch and normalized remote URL of the repo at ``path`` -- read from the ref
    files and ``.git/config`` (packed refs and ``.git`` files included); runs no git. The URL
    is ``origin``'s if it has one, else the first remote's (ComfyUI-Manager takes the first
    ``url`` of any remote section). Unreadable parts come back ``None``."""
    dirs = git_dirs(Path(path))
    if dirs is None:
        return GitHead(None, None, None)
    commit, branch = read_head(*dirs)
    urls = remote_urls(dirs[1])
    url = next((u for name, u in urls if name == "origin"), urls[0][1] if urls else None)
    return GitHead(
        commit if commit and _HEX.match(commit) else None,
        branch,
        normalize_remote_url(url) if url else None,
    )


#: ``git status`` on a big checkout on a slow disk; past this, dirty files are unknown
STATUS_TIMEOUT_S = 60.0


def _dirty_files(path: Path) -> tuple[str, ...] | None:
    """Paths that differ from HEAD (modified, staged, untracked-not-ignored), or ``None``
    (no git binary, not a repo, a repo git refuses to trust, too slow).

    ``GIT_OPTIONAL_LOCKS=0`` keeps ``git status`` from refreshing and rewriting the index: a
    capture must leave the install byte-for-byte as it was."""
    try:
        out = run_git(
            path,
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=normal",
            "--ignore-submodules=dirty",
            timeout_s=STATUS_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_porcelain_z(out.decode("utf-8", errors="surrogateescape"))


def parse_porcelain_z(out: str) -> tuple[str, ...]:
    """``git status --porcelain=v1 -z`` → sorted paths (a rename lists its new path)."""
    paths: set[str] = set()
    fields = out.split("\0")
    i = 0
    while i < len(fields):
        item = fields[i]
        i += 1
        if len(item) < 4:
            continue
        status, path = item[:2], item[3:]
        paths.add(path)
        if "R" in status or "C" in status:
            i += 1  # the source path of a rename/copy follows
    return tuple(sorted(paths))


# ---------------------------------------------------------------------------------------------
# Content hashes for non-git nodes


def content_hash(path: str | Path) -> str | None:
    """``sha256:`` over a file, or over a folder's files (relative path + content), skipping
    ``.git``, ``__pycache__`` and ``*.pyc``. Files over ``CONTENT_HASH_FULL_LIMIT_BYTES``
    contribute path and size only. Symlinks contribute their target, never followed."""
    base = Path(path)
    digest = hashlib.sha256()
    try:
        if base.is_file():
            _hash_file(digest, base)
            return "sha256:" + digest.hexdigest()
        if not base.is_dir():
            return None
        for rel, full in _walk_files(base):
            digest.update(rel.encode("utf-8", "surrogateescape") + b"\0")
            if full.is_symlink():
                digest.update(b"L" + os.readlink(full).encode("utf-8", "surrogateescape"))
            else:
                _hash_file(digest, full)
            digest.update(b"\0")
    except OSError:
        return None
    return "sha256:" + digest.hexdigest()


def _walk_files(base: Path) -> Iterator[tuple[str, Path]]:
    items: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
        here = Path(dirpath)
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            full = here / name
            items.append((full.relative_to(base).as_posix(), full))
        for name in dirnames:  # symlinked folders: hash the link, do not descend
            full = here / name
            if full.is_symlink():
                items.append((full.relative_to(base).as_posix(), full))
    items.sort()
    yield from items


def _hash_file(digest: Any, path: Path) -> None:
    size = path.stat().st_size
    if size > CONTENT_HASH_FULL_LIMIT_BYTES:
        digest.update(b"S%d" % size)
        return
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            digest.update(chunk)


# ---------------------------------------------------------------------------------------------
# Custom nodes


def iter_node_entries(cn_dir: str | Path) -> Iterator[tuple[str, str, bool]]:
    """(entry relative to ``cn_dir``, node name, disabled) of every entry of a
    ``custom_nodes`` folder that ComfyUI would try to load, in both disabled conventions
    (``Foo.disabled``, ``.disabled/Foo``, Manager's ``.disabled/<id>@<version>``); hidden
    entries and ``__pycache__`` are left out. The one reading of that folder's layout: the
    daemon's capture and the bisect's ``scan_install`` both walk it with this."""
    for entry, disabled, in_folder in _raw_node_entries(Path(cn_dir)):
        name = _node_name(entry, in_folder)
        if name:
            yield entry, name, disabled


def _raw_node_entries(cn_dir: Path) -> Iterator[tuple[str, bool, bool]]:
    """(entry relative to cn_dir, disabled, inside .disabled/) for every candidate entry."""
    try:
        names = sorted(os.listdir(cn_dir))
    except OSError:
        return
    for name in names:
        if name == "__pycache__":
            continue
        full = cn_dir / name
        if name == _DISABLED_DIR and full.is_dir():
            try:
                inner = sorted(os.listdir(full))
            except OSError:
                continue
            for sub in inner:
                if sub == "__pycache__" or sub.startswith("."):
                    continue
                if _is_candidate(full / sub):
                    yield f"{_DISABLED_DIR}/{sub}", True, True
            continue
        if name.startswith("."):
            continue
        if _is_candidate(full):
            yield name, name.endswith(_DISABLED_SUFFIX), False


def _is_candidate(path: Path) -> bool:
    """What ComfyUI would try to load: folders and ``*.py`` files (with or without the
    ``.disabled`` suffix)."""
    name = path.name
    if name.endswith(_DISABLED_SUFFIX):
        name = name[: -len(_DISABLED_SUFFIX)]
    if path.is_dir():
        return True
    return path.is_file() and name.endswith(".py")


def _node_name(entry: str, in_disabled_folder: bool) -> str:
    name = entry.rsplit("/", 1)[-1]
    if name.endswith(_DISABLED_SUFFIX):
        name = name[: -len(_DISABLED_SUFFIX)]
    if in_disabled_folder and "@" in name and not name.endswith(".py"):
        # ComfyUI-Manager v3+: custom_nodes/.disabled/<id>@<version_with_underscores>
        name = name.split("@", 1)[0]
    return name


def scan_custom_nodes(cn_dir: str | Path) -> tuple[CustomNode, ...]:
    """Every node pack in ``cn_dir`` (a ComfyUI ``custom_nodes`` folder), disabled ones too."""
    base = Path(cn_dir)
    nodes: list[CustomNode] = []
    for entry, name, disabled in iter_node_entries(base):
        nodes.append(_describe_node(base / entry, name, entry, disabled))
    return tuple(nodes)


def _describe_node(full: Path, name: str, entry: str, disabled: bool) -> CustomNode:
    if full.is_file():
        return CustomNode(
            name=name,
            kind="file",
            disabled=disabled,
            content_hash=content_hash(full),
            entry=entry,
        )
    if (full / ".git").exists():
        head = git_head(full)
        cnr_id = _read_small(full / ".git" / ".cnr-id")
        return CustomNode(
            name=name,
            kind="git",
            disabled=disabled,
            commit=head.commit,
            branch=head.branch,
            url=head.url,
            cnr_id=cnr_id,
            entry=entry,
        )
    if (full / ".tracking").is_file():
        return CustomNode(
            name=name,
            kind="cnr",
            disabled=disabled,
            version=_pyproject_field(full / "pyproject.toml", "version"),
            cnr_id=_pyproject_field(full / "pyproject.toml", "name") or name,
            entry=entry,
        )
    return CustomNode(
        name=name,
        kind="folder",
        disabled=disabled,
        content_hash=content_hash(full),
        entry=entry,
    )


def _read_small(path: Path) -> str | None:
    try:
        text = path.read_text("utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


# ---------------------------------------------------------------------------------------------
# Capture


def capture_install(
    path: str | Path,
    *,
    interpreter: str | Path | None = None,
    pip: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extra_custom_nodes_dirs: Sequence[str | Path] = (),
    now_epoch_s: float | None = None,
    run_as: tuple[int, int] | None = None,
) -> InstallState:
    """The install at ``path`` as it is now. Reads only.

    ``interpreter``: ComfyUI's Python (see ``interpreter.find_interpreter``); when given,
    its torch/CUDA facts and (with ``pip``) ``pip freeze`` are recorded. ``None`` skips it
    (git and node state only: cheap enough to run on every file-system change).
    ``extra_custom_nodes_dirs``: further custom-node folders (``extra_model_paths.yaml``).
    ``run_as``: (uid, gid) to run the interpreter as (see ``interpreter.run_interpreter``)."""
    root = resolve_comfyui_root(path)
    head = git_head(root) if (root / ".git").exists() else GitHead(None, None, None)
    dirty = _dirty_files(root) if head.commit is not None else None
    core = CoreState(
        commit=head.commit,
        branch=head.branch,
        url=head.url,
        dirty=dirty,
        version=read_comfyui_version(root),
    )
    nodes: list[CustomNode] = list(scan_custom_nodes(custom_nodes_dir(root)))
    for extra in extra_custom_nodes_dirs:
        nodes.extend(scan_custom_nodes(extra))
    facts: InterpreterFacts | None = None
    pip_lines: tuple[str, ...] | None = None
    if interpreter is not None:
        facts, pip_lines = probe_interpreter(
            interpreter, pip=pip, timeout_s=timeout_s, run_as=run_as
        )
    return InstallState(
        comfyui=core,
        nodes=tuple(nodes),
        pip=pip_lines,
        interpreter=facts,
        root=str(root),
        captured_at_epoch_s=time.time() if now_epoch_s is None else now_epoch_s,
        source="capture",
    )


def iter_git_repos(state: InstallState) -> list[tuple[str, Path]]:
    """(repo key, path) of the core (``CORE_REPO``) and every git node (keyed as in
    ``node_table()``) of a captured state: what commit-range resolution needs."""
    if state.root is None:
        return []
    out: list[tuple[str, Path]] = []
    root = Path(state.root)
    if state.comfyui.commit is not None or (root / ".git").exists():
        out.append((CORE_REPO, root))
    for key, node in state.node_table().items():
        where = node_path(root, node)
        if node.kind == "git" and where is not None:
            out.append((key, where))
    return out
