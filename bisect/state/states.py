"""What an install state is, and how the user's words for one become a concrete state.

A bisect compares two *states* of one ComfyUI install: the ComfyUI commit plus, for every
custom node, one value. The values are plain strings so that the search (plan.py) can treat
them as opaque and the log can write them as they are:

    ============== ==============================================================
    40/64 hex      a git commit (ComfyUI core or a git-cloned node)
    ``absent``     the node is not installed
    ``disabled``   installed but not loaded (``Foo.disabled`` / ``.disabled/Foo``)
    ``installed``  a non-git node (a copied folder or a single ``.py`` file), as it is on disk
    ``version:X``  a Comfy Registry release of a non-git node pack
    ============== ==============================================================

A node missing from a state is ``absent``; the two spellings compare equal. Repos are named
``comfyui`` (the core) and ``node:NAME`` where NAME is the folder (or file) name under
``custom_nodes/`` without a ``.disabled`` suffix.

A state may also carry its **Python package set** (issue 14): ``packages`` maps each
distribution (PEP 503-normalised name) to what ``pip freeze`` recorded for it — a version
(``2.8.0+cu128``, local part kept) or ``@ URL`` for a direct reference. The set is the whole
lock, not a diff: empty means "the interpreter's own packages" (every state before issue 14).
Each package is an element ``pkg:NAME`` next to the repos, so ``differing_repos`` and the
search treat a changed package like a changed node; its value ``absent`` means not installed.

STATE arguments (``--good``/``--bad``) are resolved here, in this order:

``before-last-update``
    The install as it was before its last update: the state ``oom-sentinel states history``
    names "the state before the last update", from the same code (``daemon/install/reflog.py``:
    ``import_install_history`` and ``last_update``). An update is a reflog move by ``pull``,
    ``merge``, ``reset``, ``rebase`` or ``checkout``; update steps at most ten minutes apart
    are one update ("Update All"); the clone that installed ComfyUI is never rolled back.
``HEAD@{N}``
    The install as it was when ComfyUI's HEAD was at reflog position N: ComfyUI at
    ``HEAD@{N}``, and each git node at the HEAD its own reflog had at that moment (``absent``
    when it was cloned later). Non-git nodes keep their current value.
``comfyui=REF node:NAME=REF …``
    Explicit values; REF is any commit-ish of that repo (``v0.3.60``, ``HEAD~3``,
    ``HEAD@{2}``) or one of the words above. Repos not named keep their current value.
a ComfyUI-Manager snapshot file (``.json`` / ``.yaml``), a *manager snapshot*
    read by the daemon's reader (``daemon/install/manager_snapshots.py``); its ``comfyui`` and
    ``git_custom_nodes`` {url: {hash, disabled}} entries are matched to the installed nodes
    by the daemon's rule (``git_pack_matcher``: the remote URL as ``url_key`` compares it —
    SSH, HTTPS, ``ssh://``, any host — then the folder name); git nodes the manager snapshot
    doesn't list are ``absent``.
anything else
    handed to the caller's crash-snapshot-id resolver (oom-sentinel's crash snapshots carry
    states).

Files and folders under ``custom_nodes/`` that ComfyUI's own repository tracks
(``websocket_image_save.py``, ``example_node.py.example``) belong to the core's commit, never
to a node: ``scan_install`` leaves them out and every resolved state drops them.

Nothing here writes to the user's repos: refs resolve through ``gitrepo`` (GitPython), the
reflogs are read as files by the daemon's reader.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from oom_sentinel.bisect.state import gitrepo
from oom_sentinel.bisect.state.gitrepo import is_commit_id
from oom_sentinel.daemon.core.errors import BadRef, InputError
from oom_sentinel.daemon.install.freeze import canonical_name as normalize_package
from oom_sentinel.daemon.install.freeze import parse_freeze_lines
from oom_sentinel.daemon.install.state import node_name_problem

if TYPE_CHECKING:
    from oom_sentinel.daemon.install.reflog import HistoricalState, RepoHistory
    from oom_sentinel.daemon.install.reflog import ReflogEntry as DaemonReflogEntry
    from oom_sentinel.daemon.install.state import InstallState

__all__ = [
    "ABSENT",
    "CORE",
    "DISABLED",
    "INSTALLED",
    "PKG_PREFIX",
    "VERSION_PREFIX",
    "Install",
    "NodeInstall",
    "SnapshotResolver",
    "State",
    "before_last_update",
    "check_node_name",
    "check_value",
    "differing_repos",
    "is_package",
    "node_key",
    "node_name",
    "normalize_package",
    "package_key",
    "packages_from_freeze",
    "parse_state_tokens",
    "repo_label",
    "resolve_state",
    "scan_install",
    "split_state_arg",
    "state_at_reflog",
    "state_from_install_state",
    "state_from_manager_snapshot",
]

CORE = "comfyui"
NODE_PREFIX = "node:"
PKG_PREFIX = "pkg:"
ABSENT = "absent"
DISABLED = "disabled"
INSTALLED = "installed"
VERSION_PREFIX = "version:"

_HEAD_AT_RE = re.compile(r"^HEAD@\{(\d+)\}$")
_VERSION_RE = re.compile(r"^version:[^\s=#'\"]+$")


def node_key(name: str) -> str:
    return NODE_PREFIX + name


def package_key(name: str) -> str:
    return PKG_PREFIX + normalize_package(name)


def is_package(repo: str) -> bool:
    return repo.startswith(PKG_PREFIX)


def packages_from_freeze(lines: Iterable[str]) -> dict[str, str]:
    """``pip freeze`` lines → {normalised name: value}. ``name==V`` gives ``V``; ``name @ URL``
    gives ``@ URL``; an editable (``-e …``) gives ``@ -e …``, which the env's lock installs from
    where it was, or uv says why it cannot (a state is never built from a guess). A line in no
    form pip freeze writes names no package and is left out."""
    out: dict[str, str] = {}
    for key, req in parse_freeze_lines(lines).items():
        if req.kind == "pin" or req.kind == "direct":
            out[key] = req.spec
        elif req.kind == "editable":
            out[key] = "@ " + req.line
    return out


def node_name(repo: str) -> str:
    if not repo.startswith(NODE_PREFIX):
        raise ValueError(f"{repo!r} is not a custom-node repo key")
    return repo[len(NODE_PREFIX) :]


def repo_label(repo: str) -> str:
    """How error lines name a repo: ``ComfyUI``, ``custom_nodes/NAME`` or ``package NAME``."""
    if repo == CORE:
        return "ComfyUI"
    if is_package(repo):
        return "package " + repo[len(PKG_PREFIX) :]
    return "custom_nodes/" + node_name(repo)


def check_node_name(name: str) -> str:
    """``name`` if it is a node name (``node_name_problem``), else ValueError."""
    problem = node_name_problem(name) if name else "is empty"
    if problem is not None:
        raise ValueError(f"{name!r} is not a custom node name: it {problem}")
    return name


def check_value(value: str, repo: str) -> str:
    """Return ``value`` if it is a valid state value for ``repo``, else raise ValueError."""
    if is_package(repo):
        if value and value == value.strip() and not any(c in value for c in "\n\r\0"):
            return value
        raise ValueError(f"{repo_label(repo)}: {value!r} is not a package version")
    if is_commit_id(value):
        return value
    if repo != CORE and (value in (ABSENT, DISABLED, INSTALLED) or _VERSION_RE.match(value)):
        return value
    raise ValueError(f"{repo_label(repo)}: {value!r} is not a state value")


@dataclass(frozen=True, order=True)
class State:
    """One install state: the ComfyUI commit and a value per custom node (absent ones omitted).

    Hashable and ordered so it can key caches and dicts; build it with ``State.of``.
    """

    comfyui: str
    nodes: tuple[tuple[str, str], ...] = ()
    #: the package set (normalised name, version or ``@ URL``); empty: the interpreter's own
    packages: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls,
        comfyui: str,
        nodes: Mapping[str, str] | None = None,
        packages: Mapping[str, str] | None = None,
    ) -> State:
        check_value(comfyui, CORE)
        items = []
        for name, value in (nodes or {}).items():
            check_node_name(name)
            check_value(value, node_key(name))
            if value != ABSENT:
                items.append((name, value))
        pkgs = {}
        for name, value in (packages or {}).items():
            key = package_key(name)
            check_value(value, key)
            if value != ABSENT:
                pkgs[key[len(PKG_PREFIX) :]] = value
        return cls(comfyui, tuple(sorted(items)), tuple(sorted(pkgs.items())))

    def package(self, name: str) -> str:
        norm = normalize_package(name)
        for n, v in self.packages:
            if n == norm:
                return v
        return ABSENT

    def node(self, name: str) -> str:
        for n, v in self.nodes:
            if n == name:
                return v
        return ABSENT

    def value(self, repo: str) -> str:
        if repo == CORE:
            return self.comfyui
        if is_package(repo):
            return self.package(repo[len(PKG_PREFIX) :])
        return self.node(node_name(repo))

    def repos(self) -> list[str]:
        """Repo keys this state mentions (absent nodes are not mentioned)."""
        return [CORE, *(node_key(n) for n, _ in self.nodes)]

    def with_values(self, changes: Mapping[str, str]) -> State:
        core = self.comfyui
        nodes = dict(self.nodes)
        packages = dict(self.packages)
        for repo, value in changes.items():
            if repo == CORE:
                core = value
            elif is_package(repo):
                packages[repo[len(PKG_PREFIX) :]] = value
            else:
                nodes[node_name(repo)] = value
        return State.of(core, nodes, packages)

    def with_packages(self, packages: Mapping[str, str]) -> State:
        """This state with ``packages`` as its whole package set."""
        return State.of(self.comfyui, dict(self.nodes), packages)

    def tokens(self, repos: Iterable[str] | None = None) -> list[str]:
        """``repo=value`` tokens (shell-quoted where needed) for ``repos`` (default: all)."""
        keys = self.repos() if repos is None else list(repos)
        return [shlex.quote(f"{repo}={self.value(repo)}") for repo in keys]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"comfyui": self.comfyui, "custom_nodes": dict(self.nodes)}
        if self.packages:  # absent before issue 14: old sessions and caches read the same
            out["packages"] = dict(self.packages)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        return cls.of(
            str(data["comfyui"]),
            {str(k): str(v) for k, v in data["custom_nodes"].items()},
            {str(k): str(v) for k, v in (data.get("packages") or {}).items()},
        )


def differing_repos(good: State, bad: State) -> list[str]:
    """Repos whose value differs between the states: the core first, then nodes by name."""
    names = sorted({n for n, _ in good.nodes} | {n for n, _ in bad.nodes})
    pkgs = sorted({n for n, _ in good.packages} | {n for n, _ in bad.packages})
    keys = [CORE, *(node_key(n) for n in names), *(PKG_PREFIX + n for n in pkgs)]
    return [k for k in keys if good.value(k) != bad.value(k)]


# --------------------------------------------------------------------------- the install


@dataclass(frozen=True)
class NodeInstall:
    """One custom node as it sits in the user's ``custom_nodes/``."""

    name: str
    path: Path
    kind: Literal["git", "dir", "file"]
    disabled: bool
    head: str | None = None  # git nodes: HEAD's commit
    version: str | None = None  # Comfy Registry packs: the installed release

    def value(self) -> str:
        if self.disabled:
            return DISABLED
        if self.kind == "git" and self.head:
            return self.head
        if self.version:
            return VERSION_PREFIX + self.version
        return INSTALLED


@dataclass(frozen=True)
class Install:
    """The user's ComfyUI install, read once (nothing in it is ever written)."""

    comfyui: Path
    head: str
    nodes: tuple[NodeInstall, ...] = field(default_factory=tuple)
    #: names under custom_nodes/ that the core's HEAD tracks (the core's files, not nodes)
    core_entries: frozenset[str] = frozenset()
    #: the interpreter's package set, when a front end read it (``pip freeze``); empty: unread
    packages: tuple[tuple[str, str], ...] = ()

    @property
    def custom_nodes(self) -> Path:
        return self.comfyui / "custom_nodes"

    def node(self, name: str) -> NodeInstall | None:
        for n in self.nodes:
            if n.name == name:
                return n
        return None

    def repo_path(self, repo: str) -> Path:
        if repo == CORE:
            return self.comfyui
        node = self.node(node_name(repo))
        if node is None:
            raise BadRef(f"{repo_label(repo)}: no such custom node in {self.custom_nodes}")
        return node.path

    def current_state(self) -> State:
        return State.of(self.head, {n.name: n.value() for n in self.nodes}, dict(self.packages))

    def own(self, state: State) -> State:
        """``state`` without the entries under custom_nodes/ that the core tracks, at the
        install's HEAD or at the state's own core commit: the core's checkout brings those."""
        owned = set(self.core_entries)
        if state.comfyui != self.head:
            owned |= gitrepo.core_node_entries(
                self.comfyui, [state.comfyui], f"ComfyUI ({self.comfyui})"
            )
        if not any(n in owned for n, _ in state.nodes):
            return state
        return State(
            state.comfyui, tuple((n, v) for n, v in state.nodes if n not in owned), state.packages
        )


def scan_install(comfyui: Path) -> Install:
    """Read the install's core commit and custom nodes (git, folders, single files).

    Left out: what the core's repo tracks under custom_nodes/ (the core's), ``__pycache__``,
    hidden entries and files that are not ``.py`` (``*.py.example``). Disabled packs are read
    in both conventions (``Foo.disabled``, ``.disabled/Foo`` or ``.disabled/foo@1_2_0``) by the
    daemon's walk of the folder (``install_state.iter_node_entries``); a pack that is a
    submodule (a ``.git`` file) or a symlink is read like any other."""
    from oom_sentinel.daemon.install.state import iter_node_entries

    comfyui = comfyui.resolve()
    if not (comfyui / "main.py").is_file():
        raise InputError(f"{comfyui}: not a ComfyUI install (no main.py)")
    what = f"ComfyUI ({comfyui})"
    head = gitrepo.resolve_commit(comfyui, "HEAD", what)
    tracked = gitrepo.core_node_entries(comfyui, [head], what)
    found: dict[str, NodeInstall] = {}
    cn = comfyui / "custom_nodes"
    for entry, name, disabled in iter_node_entries(cn):
        if entry in tracked:
            continue  # a top-level entry the core's tree holds (never one under .disabled/)
        node = _scan_node(name, cn / entry, disabled)
        if node is None:
            continue
        prev = found.get(name)
        if prev is None or (prev.disabled and not node.disabled):
            found[name] = node  # an enabled copy wins over a disabled one
    return Install(comfyui, head, tuple(found[k] for k in sorted(found)), tracked)


def _scan_node(name: str, path: Path, disabled: bool) -> NodeInstall | None:
    if path.is_dir():
        if (path / ".git").exists():
            head = gitrepo.resolve_commit(path, "HEAD", f"custom_nodes/{name}")
            return NodeInstall(name, path, "git", disabled, head=head)
        return NodeInstall(name, path, "dir", disabled, version=_registry_version(path))
    if path.is_file() and name.endswith(".py"):
        return NodeInstall(name, path, "file", disabled)
    return None


def _registry_version(path: Path) -> str | None:
    """The release of a Comfy Registry pack (marked by Manager's ``.tracking`` file)."""
    if not (path / ".tracking").exists():
        return None
    try:
        import tomllib

        data = tomllib.loads((path / "pyproject.toml").read_text("utf-8"))
        version = data.get("project", {}).get("version")
    except (OSError, ValueError):
        return None
    return str(version) if version and re.match(r"^[^\s=#'\"]+$", str(version)) else None


# --------------------------------------------------------------------------- STATE parsing


SnapshotResolver = Callable[[str], State]


def split_state_arg(arg: str | Sequence[str]) -> list[str]:
    """A STATE given as one string (``"comfyui=v1 node:foo=abc"``) or as several argv words."""
    if isinstance(arg, str):
        try:
            return shlex.split(arg)
        except ValueError as exc:
            raise BadRef(f"cannot parse state {arg!r}: {exc}") from None
    return [w for a in arg for w in shlex.split(a)] if arg else []


def parse_state_tokens(tokens: Sequence[str]) -> dict[str, str]:
    """``comfyui=REF node:NAME=REF …`` → {repo key: REF}. Pure; REFs are not resolved."""
    out: dict[str, str] = {}
    for tok in tokens:
        key, eq, ref = tok.partition("=")
        if not eq or not ref:
            raise BadRef(f"{tok!r} is not REPO=REF (e.g. comfyui=v0.3.60 or node:NAME=abc123)")
        if key in ("comfyui", "core", "ComfyUI"):
            key = CORE
        elif key.startswith(PKG_PREFIX) and len(key) > len(PKG_PREFIX):
            key = package_key(key[len(PKG_PREFIX) :])
        elif key.startswith(NODE_PREFIX) and len(key) > len(NODE_PREFIX):
            try:
                check_node_name(key[len(NODE_PREFIX) :])
            except ValueError as exc:
                raise BadRef(f"{tok!r}: {exc}") from None
        else:
            raise BadRef(f"{tok!r}: the repo must be 'comfyui', 'node:NAME' or 'pkg:NAME'")
        if key in out:
            raise BadRef(f"{repo_label(key)} is given twice in one state")
        out[key] = ref
    return out


def resolve_state(
    arg: str | Sequence[str],
    install: Install,
    *,
    snapshot_resolver: SnapshotResolver | None = None,
) -> State:
    """Turn a STATE argument into a State of ``install`` (see the module docstring).

    ``snapshot_resolver`` turns a word that is nothing else into a State (oom-sentinel crash
    snapshot ids). Raises BadRef (one line naming the repo and the ref) for anything that does
    not resolve, InputError for an unreadable manager snapshot file.
    """
    return install.own(_resolve_state(arg, install, snapshot_resolver))


def _resolve_state(
    arg: str | Sequence[str],
    install: Install,
    snapshot_resolver: SnapshotResolver | None,
) -> State:
    tokens = split_state_arg(arg)
    if not tokens:
        raise BadRef(
            "empty state: give REPO=REF pairs, a manager snapshot file, a crash snapshot id, "
            "HEAD@{N} or before-last-update"
        )
    if len(tokens) == 1:
        word = tokens[0]
        if word == "before-last-update":
            from oom_sentinel.daemon.install.reflog import import_install_history

            return before_last_update(install, import_install_history(install.comfyui))
        m = _HEAD_AT_RE.match(word)
        if m:
            return state_at_reflog(install, *_reflogs(install), int(m.group(1)))
        if "=" not in word:
            path = Path(word).expanduser()
            if path.suffix.lower() in (".json", ".yaml", ".yml"):
                if not path.is_file():
                    raise InputError(f"{path}: no such manager snapshot file")
                from oom_sentinel.daemon.install.manager_snapshots import read_manager_snapshot

                manager = read_manager_snapshot(path)  # the daemon's reader: one way to read it
                return state_from_manager_snapshot(
                    manager, install, _installed_git_packs(install), str(path)
                )
            if snapshot_resolver is not None:
                return snapshot_resolver(word)
            raise BadRef(
                f"{word!r} is not a state: expected REPO=REF pairs, a ComfyUI-Manager snapshot "
                "file, HEAD@{N}, before-last-update or a crash snapshot id"
            )
    refs = parse_state_tokens(tokens)
    changes = {repo: _resolve_value(install, repo, ref) for repo, ref in refs.items()}
    return install.current_state().with_values(changes)


def _resolve_value(install: Install, repo: str, ref: str) -> str:
    what = repo_label(repo)
    if is_package(repo):
        try:
            return check_value(ref[2:] if ref.startswith("==") else ref, repo)
        except ValueError as exc:
            raise BadRef(str(exc)) from None
    if repo != CORE:
        node = install.node(node_name(repo))
        if ref == ABSENT:
            return ABSENT
        if node is None:
            raise BadRef(f"{what}: no such custom node in {install.custom_nodes}")
        if ref == DISABLED:
            return DISABLED
        if node.kind != "git":
            copy = VERSION_PREFIX + node.version if node.version else INSTALLED
            if ref in (INSTALLED, copy):
                return copy
            raise BadRef(
                f"{what}: {ref!r} is not available: not a git repo, only the installed copy "
                f"({copy}) can be tested"
            )
        return gitrepo.resolve_commit(node.path, ref, what)
    return gitrepo.resolve_commit(install.comfyui, ref, f"{what} ({install.comfyui})")


# --------------------------------------------------------------------------- reflog states


def _reflogs(install: Install) -> tuple[list[DaemonReflogEntry], dict[str, RepoHistory]]:
    """ComfyUI's HEAD reflog and every git node's history, read by the daemon's reader."""
    from oom_sentinel.daemon.install.reflog import read_head_reflog, read_repo_history

    core = read_head_reflog(install.comfyui)
    nodes = {
        node_key(n.name): read_repo_history(n.path, n.name)
        for n in install.nodes
        if n.kind == "git"
    }
    return core, nodes


def before_last_update(install: Install, history: Sequence[HistoricalState]) -> State:
    """The install before its last update (see the module docstring), from its reflog history
    (``daemon.reflog.import_install_history``); pure given the history."""
    from oom_sentinel.daemon.install.reflog import last_update

    found = last_update(history)
    if found is None:
        raise BadRef(
            "before-last-update: no pull, merge, reset, rebase or checkout in the reflogs of "
            f"ComfyUI ({install.comfyui}) or its git custom nodes"
        )
    before, _after = found
    return state_from_install_state(before.state, f"before-last-update ({before.description})")


def state_at_reflog(
    install: Install,
    core_log: Sequence[DaemonReflogEntry],
    nodes: Mapping[str, RepoHistory],
    n: int,
) -> State:
    """The install when ComfyUI's HEAD was at ``HEAD@{n}``: the core at that entry, each git
    node at what its own history says for that moment (pure given the reflogs)."""
    if n >= len(core_log):
        raise BadRef(
            f"ComfyUI ({install.comfyui}): HEAD@{{{n}}}: the reflog has only {len(core_log)} entries"
        )
    at = core_log[len(core_log) - 1 - n]
    if at.new is None:
        raise BadRef(f"ComfyUI ({install.comfyui}): HEAD@{{{n}}} deleted HEAD")
    changes = {CORE: at.new}
    for repo, history in nodes.items():
        if not history.moves:
            continue
        present, commit = history.commit_at(at.at_epoch_s)
        if not present:
            changes[repo] = ABSENT
        elif commit is not None:
            changes[repo] = commit
    return install.current_state().with_values(changes)


def state_from_install_state(state: InstallState, where: str) -> State:
    """The bisect's view of a recorded install state (the daemon's ``InstallState``):

    =================================  =============================================
    InstallState node                  State value
    =================================  =============================================
    any kind, ``disabled``             ``disabled``
    ``git`` with a commit              the commit
    ``cnr`` with a version             ``version:<version>``
    ``file`` / ``folder`` / ``cnr``    ``installed`` (only the copy on disk exists)
    not listed                         ``absent``
    =================================  =============================================

    Its recorded ``pip freeze`` lines (when there are any) become the package set.
    """
    commit = state.comfyui.commit
    if not commit:
        raise InputError(f"{where}: the recorded state has no ComfyUI commit (not a git install)")
    nodes: dict[str, str] = {}
    for n in state.nodes:
        if n.disabled:
            value = DISABLED
        elif n.kind == "git" and n.commit:
            value = n.commit
        elif n.kind == "cnr" and n.version:
            value = VERSION_PREFIX + n.version
        else:
            value = INSTALLED
        if n.name in nodes and value == DISABLED:
            continue  # an enabled copy wins over a disabled one (as scan_install does)
        nodes[n.name] = value
    try:
        return State.of(commit, nodes, packages_from_freeze(state.pip or ()))
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None


# --------------------------------------------------------------------------- manager snapshots


def _installed_git_packs(install: Install) -> list[tuple[str, str, list[str]]]:
    """(name, name, remote URLs) of every git node, remotes read from the repo's config by the
    daemon's reader (``daemon/core/gitread.py``): what ``git_pack_matcher`` matches against."""
    from oom_sentinel.daemon.core.gitread import worktree_remote_urls

    return [
        (n.name, n.name, worktree_remote_urls(n.path)) for n in install.nodes if n.kind == "git"
    ]


def state_from_manager_snapshot(
    manager: InstallState,
    install: Install,
    packs: Sequence[tuple[str, str, Sequence[str]]],
    origin: str,
) -> State:
    """The state a manager snapshot (as the daemon reads it) describes, in terms of this
    install; ``packs`` are the installed git nodes as ``_installed_git_packs`` lists them.
    Recorded commits are resolved (read only) in the user's repos.

    Each git entry is matched to an installed node by the daemon's rule
    (``git_pack_matcher``: remote URL, then folder name); its commit (abbreviated or full) is
    resolved in that node's repo, ``"unknown"`` keeps what is installed, ``disabled`` is
    ``disabled``; git nodes the manager snapshot doesn't list are ``absent``; single-file
    nodes take its ``disabled`` flag; other non-git nodes keep their installed copy (it is the
    only one a bisect can test); its ``pips`` become the package set."""
    from oom_sentinel.daemon.install.manager_snapshots import git_pack_matcher

    current = install.current_state()
    changes: dict[str, str] = {}
    if manager.comfyui.commit:
        changes[CORE] = gitrepo.resolve_commit(
            install.comfyui, manager.comfyui.commit, f"{origin}: ComfyUI ({install.comfyui})"
        )
    match = git_pack_matcher(packs)
    listed: set[str] = set()
    files: dict[str, bool] = {}
    for entry in manager.nodes:
        if entry.kind == "file":
            files[entry.name] = entry.disabled
        if entry.kind != "git":
            continue
        name = match(entry)
        if name is None:
            raise BadRef(
                f"{origin}: custom node {entry.url or entry.name} is not installed, "
                "so it cannot be tested"
            )
        listed.add(name)
        if entry.disabled:
            changes[node_key(name)] = DISABLED
        elif entry.commit is None:
            changes[node_key(name)] = current.node(name)  # "unknown": keep what is installed
        else:
            node = install.node(name)
            assert node is not None
            changes[node_key(name)] = gitrepo.resolve_commit(
                node.path, entry.commit, f"{origin}: custom_nodes/{name}"
            )
    for node in install.nodes:
        if node.kind == "git" and node.name not in listed:
            changes[node_key(node.name)] = ABSENT
        elif node.kind == "file" and node.name in files:
            changes[node_key(node.name)] = DISABLED if files[node.name] else INSTALLED
    state = current.with_values(changes)
    if manager.pip:  # Manager's "pips": the package set as it recorded it
        try:
            state = state.with_packages(packages_from_freeze(manager.pip))
        except ValueError as exc:
            raise InputError(f"{origin}: pips: {exc}") from None
    return state
