"""What changed between two install states: per repo the commit range, the nodes added,
removed, enabled, disabled or switched, and the pip packages that moved.

This is what a suspected-regression snapshot shows and what ``oom-bisect`` starts from, so it
says which dimensions moved (core, which packs, which packages) and how far. The comparison
is pure; only ``commit_range`` runs git (read-only ``log``/``rev-list``) to count the commits
between two states and name the first and last, when the repos are on disk.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from oom_sentinel.daemon.core.gitread import run_git
from oom_sentinel.daemon.install.freeze import canonical_name, parse_freeze_lines
from oom_sentinel.daemon.install.state import (
    CORE_REPO,
    CustomNode,
    InstallState,
    iter_git_repos,
    url_key,
)

__all__ = [
    "GPU_STACK_EXACT",
    "GPU_STACK_PREFIXES",
    "CommitRange",
    "NodeChange",
    "PipChange",
    "RepoChange",
    "StateDiff",
    "commit_range",
    "diff_states",
    "is_gpu_stack",
    "parse_pip_lines",
    "repos_for_state",
]

#: Packages whose version changes are the likeliest to move memory use; flagged in diffs and
#: the ones ComfyUI-Manager refuses to restore (torch, torchvision, torchaudio, nvidia-*).
GPU_STACK_EXACT = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "xformers",
        "triton",
        "triton-windows",
        "pytorch-triton",
        "pytorch-triton-rocm",
        "bitsandbytes",
        "flash-attn",
        "sageattention",
        "onnxruntime-gpu",
        "accelerate",
    }
)
GPU_STACK_PREFIXES = ("nvidia-", "torch-directml", "intel-extension-for-pytorch")

NodeChangeKind = Literal["added", "removed", "enabled", "disabled", "kind", "version", "content"]


@dataclass(frozen=True, slots=True)
class CommitRange:
    """First-parent commits between two commits of one repo. ``ahead``: commits in new not
    in old (the update); ``behind``: in old not in new (a downgrade, or the other side of a
    divergence). ``None`` counts: a commit is not in the local repo."""

    ahead: int | None
    behind: int | None
    #: subjects of the oldest and newest commit of old..new (None when ahead is 0 or unknown)
    first_subject: str | None = None
    last_subject: str | None = None
    error: str | None = None

    @property
    def direction(self) -> str:
        if self.ahead is None or self.behind is None:
            return "unknown"
        if self.behind == 0:
            return "forward"
        if self.ahead == 0:
            return "backward"
        return "diverged"


@dataclass(frozen=True, slots=True)
class RepoChange:
    """The core (``repo == CORE_REPO``) or one git node moved between two commits."""

    repo: str
    old_commit: str | None
    new_commit: str | None
    range: CommitRange | None = None


@dataclass(frozen=True, slots=True)
class NodeChange:
    name: str
    change: NodeChangeKind
    old: CustomNode | None
    new: CustomNode | None
    detail: str


@dataclass(frozen=True, slots=True)
class PipChange:
    """``old``/``new``: the version (or ``@ url`` / ``-e`` spec); ``None`` = absent."""

    name: str
    old: str | None
    new: str | None
    gpu_stack: bool


@dataclass(frozen=True)
class StateDiff:
    old_state_id: str
    new_state_id: str
    core_version: tuple[str | None, str | None] | None
    repos: tuple[RepoChange, ...] = ()
    nodes: tuple[NodeChange, ...] = ()
    #: ``None`` when either side's pip list is unknown
    pip: tuple[PipChange, ...] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def is_empty(self) -> bool:
        return not self.repos and not self.nodes and not self.pip and self.core_version is None

    def to_dict(self) -> dict[str, Any]:
        def rng(r: CommitRange | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {
                "ahead": r.ahead,
                "behind": r.behind,
                "direction": r.direction,
                "first_subject": r.first_subject,
                "last_subject": r.last_subject,
                "error": r.error,
            }

        return {
            "old_state_id": self.old_state_id,
            "new_state_id": self.new_state_id,
            "core_version": None
            if self.core_version is None
            else {"old": self.core_version[0], "new": self.core_version[1]},
            "repos": [
                {
                    "repo": "ComfyUI" if c.repo == CORE_REPO else c.repo,
                    "core": c.repo == CORE_REPO,
                    "old_commit": c.old_commit,
                    "new_commit": c.new_commit,
                    "range": rng(c.range),
                }
                for c in self.repos
            ],
            "nodes": [
                {
                    "name": c.name,
                    "change": c.change,
                    "detail": c.detail,
                    "old": None if c.old is None else c.old.to_dict(),
                    "new": None if c.new is None else c.new.to_dict(),
                }
                for c in self.nodes
            ],
            "pip": None
            if self.pip is None
            else [
                {"name": p.name, "old": p.old, "new": p.new, "gpu_stack": p.gpu_stack}
                for p in self.pip
            ],
            "notes": list(self.notes),
        }

    def summary_lines(self) -> list[str]:
        """Human lines, most memory-relevant first (core, packs, GPU-stack packages)."""
        lines: list[str] = []
        if self.core_version is not None:
            lines.append(f"ComfyUI version {self.core_version[0]} -> {self.core_version[1]}")
        for c in self.repos:
            label = "ComfyUI" if c.repo == CORE_REPO else f"custom_nodes/{c.repo}"
            lines.append(
                f"{label}: {_short(c.old_commit)}..{_short(c.new_commit)}{_range_text(c.range)}"
            )
        for n in self.nodes:
            lines.append(f"custom_nodes/{n.name}: {n.change} ({n.detail})")
        if self.pip is None:
            lines.append("pip: unknown on one side (no interpreter facts)")
        else:
            for p in sorted(self.pip, key=lambda p: (not p.gpu_stack, p.name)):
                flag = "  [GPU stack]" if p.gpu_stack else ""
                lines.append(f"pip {p.name}: {p.old or '(absent)'} -> {p.new or '(absent)'}{flag}")
        lines.extend(self.notes)
        return lines


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "unknown"


def _range_text(r: CommitRange | None) -> str:
    if r is None:
        return ""
    if r.ahead is None or r.behind is None:
        return f" (range unknown: {r.error})" if r.error else " (range unknown)"
    parts = []
    if r.ahead:
        subj = (
            f': "{r.first_subject}"'
            if r.ahead == 1
            else f': "{r.first_subject}" ... "{r.last_subject}"'
        )
        parts.append(f"{r.ahead} new commit{'s' if r.ahead != 1 else ''}{subj}")
    if r.behind:
        parts.append(f"{r.behind} commit{'s' if r.behind != 1 else ''} rolled back")
    return " (" + "; ".join(parts) + ")" if parts else " (same history)"


# ---------------------------------------------------------------------------------------------
# pip


def parse_pip_lines(lines: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Freeze lines → {canonical name: (display name, spec)} where spec is the version, or
    ``@ url`` for direct references, or the ``-e`` line for editable installs."""
    return {key: (req.name, req.spec) for key, req in parse_freeze_lines(lines).items()}


def is_gpu_stack(name: str) -> bool:
    canon = canonical_name(name)
    return canon in GPU_STACK_EXACT or canon.startswith(GPU_STACK_PREFIXES)


def _diff_pip(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[PipChange, ...]:
    a, b = parse_pip_lines(old), parse_pip_lines(new)
    changes: list[PipChange] = []
    for key in sorted(set(a) | set(b)):
        old_spec = a[key][1] if key in a else None
        new_spec = b[key][1] if key in b else None
        if old_spec == new_spec:
            continue
        display = (b.get(key) or a[key])[0]
        changes.append(PipChange(display, old_spec, new_spec, is_gpu_stack(display)))
    return tuple(changes)


# ---------------------------------------------------------------------------------------------
# Nodes


def _pair_nodes(
    a: InstallState, b: InstallState
) -> tuple[list[tuple[str, CustomNode, CustomNode]], list[CustomNode], list[CustomNode]]:
    """Match nodes across states: by name (same disabled flag first, so an enabled pack and
    its disabled copy pair with their counterparts), then leftover git packs by URL (a
    Manager file names packs after the URL, the folder may be named otherwise)."""
    left = list(a.nodes)
    right = list(b.nodes)
    pairs: list[tuple[str, CustomNode, CustomNode]] = []

    def take(match: Callable[[CustomNode, CustomNode], bool]) -> None:
        for old in list(left):
            for new in right:
                if match(old, new):
                    pairs.append((new.name, old, new))
                    left.remove(old)
                    right.remove(new)
                    break

    take(lambda o, n: o.name == n.name and o.disabled == n.disabled and o.entry == n.entry)
    take(lambda o, n: o.name == n.name and o.disabled == n.disabled)
    take(lambda o, n: o.name == n.name)
    take(
        lambda o, n: (
            o.kind == n.kind == "git"
            and url_key(o.url) is not None
            and url_key(o.url) == url_key(n.url)
        )
    )
    return pairs, left, right


def _describe(node: CustomNode) -> str:
    if node.kind == "git":
        return f"git {_short(node.commit)}"
    if node.kind == "cnr":
        return f"registry {node.version or 'version unknown'}"
    return f"{node.kind} {node.content_hash[:19] if node.content_hash else 'unknown content'}"


# ---------------------------------------------------------------------------------------------
# The diff


RangeResolver = Callable[[str, str, str], CommitRange]


def diff_states(
    a: InstallState,
    b: InstallState,
    repos: Mapping[str, str | Path] | None = None,
    *,
    resolve: RangeResolver | None = None,
) -> StateDiff:
    """What changed from ``a`` (old) to ``b`` (new).

    ``repos`` maps ``CORE_REPO`` and node names to repo paths on disk; where one is given and
    a commit moved, the commit range is resolved with git (see ``repos_for_state``).
    ``resolve`` replaces ``commit_range`` (for callers with another way to reach the repos)."""
    resolver = resolve or commit_range
    repo_paths = dict(repos or {})
    repo_changes: list[RepoChange] = []

    def moved(repo: str, old: str | None, new: str | None) -> None:
        if old == new:
            return
        rng: CommitRange | None = None
        path = repo_paths.get(repo)
        if path is not None and old is not None and new is not None:
            rng = resolver(os.fspath(path), old, new)
        repo_changes.append(RepoChange(repo, old, new, rng))

    notes: list[str] = []
    moved(CORE_REPO, a.comfyui.commit, b.comfyui.commit)
    core_version = None
    if (
        a.comfyui.version is not None
        and b.comfyui.version is not None
        and a.comfyui.version != b.comfyui.version
    ):
        core_version = (a.comfyui.version, b.comfyui.version)
    if a.comfyui.commit is None or b.comfyui.commit is None:
        notes.append("ComfyUI's commit is unknown on one side (no git, or not recorded)")

    node_changes: list[NodeChange] = []
    pairs, removed, added = _pair_nodes(a, b)
    for name, old, new in pairs:
        if old.disabled != new.disabled:
            change: NodeChangeKind = "disabled" if new.disabled else "enabled"
            node_changes.append(NodeChange(name, change, old, new, _describe(new)))
        if old.kind != new.kind:
            node_changes.append(
                NodeChange(name, "kind", old, new, f"{_describe(old)} -> {_describe(new)}")
            )
            continue
        if new.kind == "git":
            moved(name, old.commit, new.commit)
        elif new.kind == "cnr":
            if old.version != new.version:
                node_changes.append(
                    NodeChange(name, "version", old, new, f"{old.version} -> {new.version}")
                )
        elif (
            old.content_hash is not None
            and new.content_hash is not None
            and old.content_hash != new.content_hash
        ):
            node_changes.append(
                NodeChange(name, "content", old, new, f"{_describe(old)} -> {_describe(new)}")
            )
    for node in added:
        node_changes.append(NodeChange(node.name, "added", None, node, _describe(node)))
    for node in removed:
        node_changes.append(NodeChange(node.name, "removed", node, None, _describe(node)))
    order = {"removed": 0, "added": 1, "disabled": 2, "enabled": 3, "kind": 4, "version": 5}
    node_changes.sort(key=lambda c: (c.name.lower(), order.get(c.change, 9)))

    pip = None if a.pip is None or b.pip is None else _diff_pip(a.pip, b.pip)
    core_first = sorted(repo_changes, key=lambda c: (c.repo != CORE_REPO, c.repo.lower()))
    return StateDiff(
        old_state_id=a.state_id,
        new_state_id=b.state_id,
        core_version=core_version,
        repos=tuple(core_first),
        nodes=tuple(node_changes),
        pip=pip,
        notes=tuple(notes),
    )


def repos_for_state(*states: InstallState) -> dict[str, Path]:
    """Repo paths on disk for the states that were captured from an install (later states
    win), keyed as ``diff_states`` expects."""
    paths: dict[str, Path] = {}
    for state in states:
        for key, path in iter_git_repos(state):
            paths[key] = path
            node = state.node_table().get(key)
            if node is not None:
                paths.setdefault(node.name, path)
    return paths


# ---------------------------------------------------------------------------------------------
# git (I/O)

#: one read-only git command on a big repository
GIT_TIMEOUT_S = 60.0


def commit_range(path: str | Path, old: str, new: str) -> CommitRange:
    """Count the first-parent commits of ``old..new`` and ``new..old`` in the repo at
    ``path`` and name the oldest and newest of ``old..new``. Read-only git (a subprocess, no
    optional locks). A commit that is not in the repo gives ``None`` counts and an ``error``."""

    def git(*args: str) -> str:
        return run_git(path, *args, timeout_s=GIT_TIMEOUT_S).decode("utf-8", errors="replace")

    try:
        for sha in (old, new):
            try:
                git("cat-file", "-e", f"{sha}^{{commit}}")
            except subprocess.CalledProcessError:
                return CommitRange(None, None, error=f"{sha[:12]} is not in {path}")
        log = git("log", "--first-parent", "--format=%H%x09%s", f"{old}..{new}", "--")
        behind = int(git("rev-list", "--first-parent", "--count", f"{new}..{old}").strip())
    except FileNotFoundError:
        return CommitRange(None, None, error=f"{path}: no git program to count commits with")
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return CommitRange(None, None, error=f"{path}: {type(exc).__name__}")
    subjects = [line.split("\t", 1)[1] if "\t" in line else "" for line in log.splitlines()]
    return CommitRange(
        ahead=len(subjects),
        behind=behind,
        first_subject=subjects[-1] if subjects else None,
        last_subject=subjects[0] if subjects else None,
    )
