"""The isolated copy of ComfyUI and its custom nodes in which every bisect state is built.

**Why shared clones and not ``git worktree add``.** A worktree would share objects, but it
registers itself in the user's repository (``.git/worktrees/<name>/``, and it takes the
per-worktree ``HEAD``/index locks there), and ``reset`` would then have to run ``git worktree
prune`` in the user's repo — a command that also prunes the user's *own* stale worktrees.
``git clone --shared --no-checkout <user repo>`` instead writes only into the new clone: its
``objects/info/alternates`` points at the user's object store, so nothing is copied and the
user's repository is only read. Every commit the user's repo holds — including those only the
reflog still references, which a clone's refs don't cover — can be checked out, because the
objects are reached through the alternates, not through refs. ``reset`` just deletes the
workspace; there is nothing to prune. (The one caveat of ``--shared``: if the user deletes
history *and* runs ``git gc`` while a bisect is open, a checkout can fail with a missing
object; the switch then reports it and nothing of the user's changes.) A user's sparse
checkout is copied into the clone (``gitrepo.clone_shared``): the replay sees the files the
user's checkout has, and a clone whose mirror lost a blob checks out as the user's did. The
tests snapshot the user's whole ``.git`` directory, working tree, index, refs and stash before
and after, through creation, many switches, errors, Ctrl-C at random points and reset.

Layout of ``<root>`` (``BisectPaths.workspace``)::

    ComfyUI/                  shared clone of the user's core repo, detached at the state's commit
      custom_nodes/<name>/    active nodes: shared clones (git) or copies (non-git)
      extra_model_paths.yaml  generated: the user's models dir, read-only, never copied
    parked/<name>             nodes that are absent or disabled in the current state (kept for reuse)
    user/ run/{input,output,temp}   ComfyUI's own dirs for the replay instance
    .markers/<name>           the value a repo was last switched to *completely*
    workspace.json            what the workspace was built from (written last at creation)
    .lock                     held for every change; inherited by our git children

**Switching** checks out inside the workspace only: ``git checkout --force --detach <sha>``
then ``git clean -fd`` (the core's ``custom_nodes/`` and our yaml excluded), and moves node
folders between ``custom_nodes/`` and ``parked/`` by atomic renames. A repo's marker is
removed before it is touched and written after it is complete, so a switch interrupted at any
point (Ctrl-C, a kill, a failing git) is redone by the next switch: stale ``*.lock`` files of
the workspace's own repos are removed first, which is safe because our lock (inherited by the
git children, so it outlives a killed parent until its git exits) proves that no other
process works in the workspace. Unchanged repos are skipped, which keeps a step fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from oom_sentinel.bisect.measure.flags import ArgSpec, filter_flags, parse_cli_args
from oom_sentinel.bisect.session.fsutil import FileLock, remove_tree
from oom_sentinel.bisect.state import gitrepo
from oom_sentinel.bisect.state.states import (
    ABSENT,
    DISABLED,
    INSTALLED,
    VERSION_PREFIX,
    Install,
    State,
)
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.errors import BisectError, InputError

__all__ = [
    "LaunchSpec",
    "NodeSource",
    "Workspace",
    "free_port",
    "remove_workspace",
]

WORKSPACE_FORMAT = 1
CORE_DIR = "ComfyUI"
_LOCK_FILES = ("index.lock", "HEAD.lock", "config.lock", "packed-refs.lock", "shallow.lock")


@dataclass(frozen=True)
class NodeSource:
    """Where a custom node comes from in the user's install."""

    name: str
    path: Path
    kind: str  # "git", "dir" or "file"
    version: str | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """How to start ComfyUI in the workspace at its current state."""

    main_py: Path
    cwd: Path
    #: the arguments after main.py: isolation flags plus the user's filtered flags
    args: tuple[str, ...]
    port: int
    #: the user's flag words left out, with why ("unknown to this commit", …)
    dropped: tuple[tuple[str, str], ...]

    def argv(self, python: str) -> list[str]:
        return [python, str(self.main_py), *self.args]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now (the OS picks it; the caller retries on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Workspace:
    """An isolated, reusable copy of one install; build it with ``create``."""

    def __init__(self, root: Path, meta: Mapping[str, Any]) -> None:
        self.root = root
        self.install_path = Path(meta["install"])
        self.models_dir = Path(meta["models_dir"])
        self.input_dir = Path(meta["input_dir"])
        self.sources = {
            n["name"]: NodeSource(n["name"], Path(n["path"]), n["kind"], n.get("version"))
            for n in meta["nodes"]
        }
        self._lock: FileLock | None = None

    # -- paths

    @property
    def comfyui(self) -> Path:
        return self.root / CORE_DIR

    @property
    def custom_nodes(self) -> Path:
        return self.comfyui / "custom_nodes"

    @property
    def parked(self) -> Path:
        return self.root / "parked"

    @property
    def user_dir(self) -> Path:
        return self.root / "user"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def input_dir_ws(self) -> Path:
        return self.run_dir / "input"

    @property
    def output_dir(self) -> Path:
        return self.run_dir / "output"

    @property
    def model_paths_yaml(self) -> Path:
        return self.comfyui / "extra_model_paths.yaml"

    @property
    def _markers(self) -> Path:
        return self.root / ".markers"

    # -- lifecycle

    @classmethod
    def create(
        cls,
        root: Path,
        install: Install,
        *,
        models_dir: Path | None = None,
        input_dir: Path | None = None,
    ) -> Workspace:
        """Open the workspace at ``root``, building it first if needed (clones the core)."""
        root.mkdir(parents=True, exist_ok=True)
        meta_path = root / "workspace.json"
        with FileLock(root / ".lock", "the bisect workspace") as lock:
            if meta_path.is_file():
                ws = cls.open(root)
                if ws.install_path != install.comfyui:
                    raise BisectError(
                        f"{root}: this workspace belongs to {ws.install_path}, not {install.comfyui}"
                    )
                return ws
            for child in root.iterdir():  # an interrupted creation: start over
                if child.name != ".lock":
                    _remove(child)
            meta = {
                "format": WORKSPACE_FORMAT,
                "install": str(install.comfyui),
                "models_dir": str(models_dir or install.comfyui / "models"),
                "input_dir": str(input_dir or install.comfyui / "input"),
                "nodes": [
                    {"name": n.name, "path": str(n.path), "kind": n.kind, "version": n.version}
                    for n in install.nodes
                ],
            }
            ws = cls(root, meta)
            ws._lock = lock
            try:
                (root / ".nohooks").mkdir()
                (root / ".template").mkdir()
                ws._clone(install.comfyui, ws.comfyui)
                for d in (ws.parked, ws.user_dir, ws.input_dir_ws, ws.output_dir, ws._markers):
                    d.mkdir(parents=True, exist_ok=True)
                write_text_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
            finally:
                ws._lock = None
        return ws

    @classmethod
    def open(cls, root: Path) -> Workspace:
        p = root / "workspace.json"
        try:
            meta = json.loads(p.read_text("utf-8"))
        except FileNotFoundError:
            raise BisectError(f"{root}: no workspace here") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{p}: cannot read the workspace ({exc})") from None
        if meta.get("format") != WORKSPACE_FORMAT:
            raise InputError(f"{p}: unknown workspace format {meta.get('format')!r}")
        return cls(root, meta)

    def remove(self) -> None:
        remove_workspace(self.root)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock is not None:
            yield
            return
        with FileLock(self.root / ".lock", "the bisect workspace") as lock:
            self._lock = lock
            try:
                yield
            finally:
                self._lock = None

    # -- git inside the workspace

    def _git_options(self) -> dict[str, Any]:
        """What every git command in the workspace gets: no hooks (a user's global hook must
        not run in our clones), no automatic gc or maintenance, no fsmonitor daemon, no LFS
        downloads, and our lock fd, so the lock outlives a killed parent until git exits."""
        return {
            "config": {
                "core.hooksPath": str(self.root / ".nohooks"),
                "gc.auto": "0",
                "maintenance.auto": "false",
                "core.fsmonitor": "false",
                "advice.detachedHead": "false",
            },
            "env": {"GIT_LFS_SKIP_SMUDGE": "1"},
            "pass_fds": (self._lock.fileno(),) if self._lock is not None else (),
        }

    def _clone(self, source: Path, dest: Path) -> None:
        """A shared clone of ``source`` at ``dest``, created under a temp name and renamed."""
        tmp = dest.parent / f".{dest.name}.cloning"
        _remove(tmp)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        gitrepo.clone_shared(source, tmp, template=self.root / ".template", **self._git_options())
        os.rename(tmp, dest)

    def _clear_locks(self, repo: Path) -> None:
        gitdir = repo / ".git"
        for name in _LOCK_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(gitdir / name)

    def _checkout(self, repo: Path, sha: str, what: str, *, core: bool) -> None:
        self._clear_locks(repo)
        keep = ("/custom_nodes/", "/extra_model_paths.yaml") if core else ()
        gitrepo.checkout(repo, sha, what, keep=keep, **self._git_options())

    # -- markers

    def _marker(self, key: str) -> str | None:
        try:
            return (self._markers / key).read_text("utf-8").strip() or None
        except FileNotFoundError:
            return None

    def _set_marker(self, key: str, value: str | None) -> None:
        p = self._markers / key
        if value is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        else:
            write_text_atomic(p, value + "\n")

    # -- switching

    def switch(self, state: State, *, force: bool = False) -> None:
        """Make the workspace show ``state``; ``force`` redoes repos that look done already."""
        with self._locked():
            self._switch_core(state.comfyui, force)
            names = sorted(set(self.sources) | {n for n, _ in state.nodes})
            for name in names:
                self._switch_node(name, state.node(name), force)
            self._write_model_paths()

    def _switch_core(self, sha: str, force: bool) -> None:
        if not gitrepo.is_commit_id(sha):
            raise BisectError(f"ComfyUI: {sha!r} is not a commit id")
        key = "@core"
        if not force and self._marker(key) == sha:
            return
        self._set_marker(key, None)
        self._checkout(self.comfyui, sha, f"ComfyUI workspace ({self.comfyui})", core=True)
        self._set_marker(key, sha)

    def _node_path(self, name: str) -> Path | None:
        """Where the node's copy is. An empty folder in custom_nodes/ is no copy: checking out
        a core commit that tracks a pack as a submodule (a gitlink) leaves one there."""
        for p in (self.custom_nodes / name, self.parked / name):
            if p.is_symlink() or (p.exists() and not _empty_dir(p)):
                return p
        return None

    def _park(self, name: str) -> None:
        path = self._node_path(name)
        if path is not None and path.parent == self.custom_nodes:
            self.parked.mkdir(exist_ok=True)
            os.rename(path, self.parked / name)

    def _activate(self, name: str) -> None:
        path = self._node_path(name)
        if path is not None and path.parent == self.parked:
            self.custom_nodes.mkdir(parents=True, exist_ok=True)
            os.rename(path, self.custom_nodes / name)  # replaces a gitlink's empty folder

    def _switch_node(self, name: str, value: str, force: bool) -> None:
        what = f"custom_nodes/{name}"
        key = "node-" + name
        if value in (ABSENT, DISABLED):
            self._park(name)
            self._set_marker(key + ".place", value)
            return
        src = self.sources.get(name)
        if src is None:
            raise BisectError(f"{what}: not in the install at {self.install_path}; cannot build it")
        if gitrepo.is_commit_id(value):
            if src.kind != "git":
                raise BisectError(f"{what}: {value} is a commit but this node is not a git repo")
            if self._node_path(name) is None:
                self._set_marker(key, None)
                self._clone(src.path, self.parked / name)
            if force or self._marker(key) != value:
                self._set_marker(key, None)
                path = self._node_path(name)
                assert path is not None
                self._checkout(path, value, f"{what} workspace ({path})", core=False)
                self._set_marker(key, value)
        elif value == INSTALLED or value.startswith(VERSION_PREFIX):
            if src.kind == "git":
                raise BisectError(f"{what}: {value!r} is not a commit of this git node")
            want = VERSION_PREFIX + src.version if src.version else INSTALLED
            if value != want and value != INSTALLED:
                raise BisectError(
                    f"{what}: {value} cannot be built: only the installed copy ({want}) is "
                    "available (registry downloads are not supported)"
                )
            if self._node_path(name) is None or self._marker(key) != "copied":
                self._set_marker(key, None)
                existing = self._node_path(name)
                if existing is not None:
                    _remove(existing)
                self._copy(src, self.parked / name)
                self._set_marker(key, "copied")
        else:
            raise BisectError(f"{what}: {value!r} is not a state value")
        self._activate(name)
        self._set_marker(key + ".place", value)

    def _copy(self, src: NodeSource, dest: Path) -> None:
        tmp = dest.parent / f".{dest.name}.copying"
        _remove(tmp)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            if src.kind == "file":
                shutil.copy2(src.path, tmp)
            else:
                shutil.copytree(
                    src.path, tmp, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
                )
        except OSError as exc:
            raise BisectError(f"custom_nodes/{src.name}: cannot copy {src.path}: {exc}") from exc
        os.rename(tmp, dest)

    def current_state(self) -> State:
        """The state the workspace shows (read from the checkouts and markers)."""
        core = gitrepo.resolve_commit(self.comfyui, "HEAD", f"ComfyUI workspace ({self.comfyui})")
        nodes: dict[str, str] = {}
        for name in sorted(self.sources):
            place = self._marker(f"node-{name}.place")
            path = self._node_path(name)
            if path is None or path.parent == self.parked:
                nodes[name] = place if place in (ABSENT, DISABLED) else ABSENT
            elif self.sources[name].kind == "git":
                nodes[name] = gitrepo.resolve_commit(path, "HEAD", f"custom_nodes/{name}")
            else:
                nodes[name] = place or INSTALLED
        return State.of(core, nodes)

    # -- models, inputs and launching

    def _write_model_paths(self) -> None:
        """Point ComfyUI at the user's model folders (read in place, never copied)."""
        section: dict[str, str] = {"base_path": str(self.models_dir)}
        if self.models_dir.is_dir():
            for child in sorted(self.models_dir.iterdir()):
                if child.is_dir() and not child.name.startswith("."):
                    section[child.name] = child.name + "/"
        text = "# written by oom-bisect: the user's models, used in place (never copied)\n"
        text += yaml.safe_dump({"oom_bisect_user_models": section}, sort_keys=False)
        current = None
        with contextlib.suppress(OSError):
            current = self.model_paths_yaml.read_text("utf-8")
        if current != text:
            write_text_atomic(self.model_paths_yaml, text, mode=0o644)

    def cli_args_text(self) -> str | None:
        """``comfy/cli_args.py`` of the checked-out commit (None if that commit has none)."""
        try:
            return (self.comfyui / "comfy" / "cli_args.py").read_text("utf-8", errors="replace")
        except OSError:
            return None

    def stage_inputs(self, names: Iterable[str]) -> list[str]:
        """Copy the input files a prompt names from the user's input dir; returns those missing."""
        missing = []
        for name in names:
            rel = Path(name.replace("\\", "/"))
            if rel.is_absolute() or ".." in rel.parts:
                missing.append(name)
                continue
            src = self.input_dir / rel
            dest = self.input_dir_ws / rel
            if dest.is_file():
                continue
            if not src.is_file():
                missing.append(name)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        return missing

    def launch(
        self,
        user_flags: Sequence[str] = (),
        *,
        port: int | None = None,
        user_cli_args_text: str | None = None,
        user_cwd: Path | None = None,
    ) -> LaunchSpec:
        """The command line for ComfyUI at the current checkout.

        The user's flags are filtered to those this commit's ``cli_args.py`` declares (with
        the arities the user's own ``cli_args.py`` gives them); the isolation flags are added
        only where this commit knows them (older commits fall back to their defaults, which
        for the database and user dir stay inside the workspace checkout anyway).
        """
        target_text = self.cli_args_text()
        target: Mapping[str, ArgSpec] = parse_cli_args(target_text) if target_text else {}
        if user_cli_args_text is None:
            with contextlib.suppress(OSError):
                user_cli_args_text = (self.install_path / "comfy" / "cli_args.py").read_text(
                    "utf-8", errors="replace"
                )
        user_spec = parse_cli_args(user_cli_args_text) if user_cli_args_text else target
        flags = _absolutize_paths(list(user_flags), user_cwd or self.install_path)
        result = filter_flags(flags, user_spec, target)
        port = free_port() if port is None else port
        self.user_dir.mkdir(parents=True, exist_ok=True)
        self.input_dir_ws.mkdir(parents=True, exist_ok=True)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        args: list[str] = []

        def add(opt: str, *values: str) -> None:
            if opt in target:
                args.extend((opt, *values))

        add("--listen", "127.0.0.1")
        if "--port" in target:
            args.extend(("--port", str(port)))
        add("--user-directory", str(self.user_dir))
        add("--input-directory", str(self.input_dir_ws))
        add("--output-directory", str(self.output_dir))
        add("--temp-directory", str(self.run_dir))  # ComfyUI appends "temp"
        add("--database-url", "sqlite:///:memory:")
        add("--disable-auto-launch")
        user_yaml = self.install_path / "extra_model_paths.yaml"
        if user_yaml.is_file() and "--extra-model-paths-config" in target:
            args.extend(("--extra-model-paths-config", str(user_yaml)))
        args.extend(result.kept)
        return LaunchSpec(
            main_py=self.comfyui / "main.py",
            cwd=self.comfyui,
            args=tuple(args),
            port=port,
            dropped=result.dropped,
        )


def _absolutize_paths(flags: list[str], cwd: Path) -> list[str]:
    """Relative paths after ``--extra-model-paths-config`` were relative to the user's cwd."""
    out = []
    after = False
    for word in flags:
        if word.startswith("--extra-model-paths-config="):
            opt, _, value = word.partition("=")
            word = f"{opt}={cwd / value}" if not os.path.isabs(value) else word
            after = False
        elif word == "--extra-model-paths-config":
            after = True
        elif after and not word.startswith("-"):
            word = str(cwd / word) if not os.path.isabs(word) else word
        else:
            after = False
        out.append(word)
    return out


def _remove(path: Path) -> None:
    remove_tree(path)


def _empty_dir(path: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return False
    with os.scandir(path) as entries:
        return next(entries, None) is None


def remove_workspace(root: Path) -> None:
    """Delete the workspace (it registered nothing in the user's repos, so nothing to prune)."""
    if not root.exists():
        return
    with FileLock(root / ".lock", "the bisect workspace"):
        for child in sorted(root.iterdir()):
            if child.name != ".lock":
                _remove(child)
    _remove(root)
