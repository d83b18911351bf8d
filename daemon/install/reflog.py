"""Earlier install states from git's own records, so "the state before the last pull" is
known even for updates made before the daemon was installed.

Every ``git pull``, ``checkout``, ``reset`` or commit appends a line to ``.git/logs/HEAD``
(``<old> <new> <name> <<email>> <epoch> <tz>\\t<message>``); the Windows portable updater also
leaves a ``backup_branch_YYYY-MM-DD_HH_MM_SS`` branch at the old HEAD before every update.
Reading those for ComfyUI and each node repo gives, per repo, what HEAD was at any time; laying
the repos side by side gives the install's states over time.

Parsing and combining are pure (``parse_reflog``, ``RepoHistory``, ``states_over_time``); the
readers only open files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from oom_sentinel.daemon.comfy.interpreter import redact_url_credentials
from oom_sentinel.daemon.core.gitread import git_dirs, packed_refs
from oom_sentinel.daemon.install.state import (
    CORE_REPO,
    CoreState,
    CustomNode,
    InstallState,
    capture_install,
    iter_git_repos,
)

__all__ = [
    "BACKUP_BRANCH_PREFIX",
    "UPDATE_ACTIONS",
    "UPDATE_GAP_S",
    "HeadMove",
    "HistoricalState",
    "ReflogEntry",
    "RepoHistory",
    "history_from_entries",
    "import_install_history",
    "last_update",
    "parse_backup_branch_time",
    "parse_reflog",
    "read_head_reflog",
    "read_repo_history",
    "state_before_last",
    "states_over_time",
]

BACKUP_BRANCH_PREFIX = "backup_branch_"
#: reflog actions that move HEAD to another published commit: what "an update" is. A commit of
#: the user's own is not one, nor the clone that installed a repo (that is the install).
UPDATE_ACTIONS = frozenset({"pull", "merge", "reset", "rebase", "checkout"})
#: update steps at most this far apart are one update ("Update All" pulls repo after repo,
#: with pip runs in between)
UPDATE_GAP_S = 600.0
_ZERO = re.compile(r"^0+$")
_LINE = re.compile(
    r"^(?P<old>[0-9a-f]{40}|[0-9a-f]{64}) (?P<new>[0-9a-f]{40}|[0-9a-f]{64}) "
    r"(?P<name>.*?) ?<(?P<email>[^>]*)> (?P<epoch>\d+) (?P<tz>[+-]\d{4})(?:\t(?P<msg>.*))?$"
)
_BACKUP = re.compile(r"^backup_branch_(\d{4})-(\d{2})-(\d{2})_(\d{2})_(\d{2})_(\d{2})$")


@dataclass(frozen=True, slots=True)
class ReflogEntry:
    """One reflog line. ``old`` is ``None`` where git wrote zeros (the ref was created: a
    clone or ``git init``'s first commit); ``new`` is ``None`` for a deletion."""

    old: str | None
    new: str | None
    name: str
    email: str
    at_epoch_s: int
    tz: str
    message: str

    @property
    def action(self) -> str:
        """The git command that wrote the entry: "pull", "checkout", "reset", "clone"…"""
        head = self.message.split(":", 1)[0].strip()
        return head.split(" ", 1)[0] if head else ""


def parse_reflog(text: str) -> list[ReflogEntry]:
    """Reflog text → entries in file order (oldest first). Lines that do not parse are
    skipped: a truncated last line (git was writing) must not lose the rest."""
    entries: list[ReflogEntry] = []
    for raw in text.splitlines():
        m = _LINE.match(raw.rstrip("\r"))
        if not m:
            continue
        old, new = m.group("old"), m.group("new")
        entries.append(
            ReflogEntry(
                old=None if _ZERO.match(old) else old,
                new=None if _ZERO.match(new) else new,
                name=m.group("name").strip(),
                email=m.group("email"),
                at_epoch_s=int(m.group("epoch")),
                tz=m.group("tz"),
                # "clone: from https://user:token@host/..." must not carry the token on.
                message=redact_url_credentials((m.group("msg") or "").strip()),
            )
        )
    return entries


def parse_backup_branch_time(name: str) -> datetime | None:
    """The naive local time in a Windows-updater branch name ``backup_branch_2024-05-01_10_20_30``."""
    m = _BACKUP.match(name)
    if not m:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in m.groups())
        return datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class HeadMove:
    """HEAD became ``new`` at ``at_epoch_s`` (``old`` is what it was, ``None`` if nothing)."""

    at_epoch_s: float
    old: str | None
    new: str | None
    message: str
    #: "reflog" or "backup-branch"
    origin: str = "reflog"

    @property
    def action(self) -> str:
        head = self.message.split(":", 1)[0].strip()
        return head.split(" ", 1)[0] if head else ""


@dataclass(frozen=True)
class RepoHistory:
    """What HEAD of one repo was over time. ``repo`` is ``CORE_REPO`` or a node name."""

    repo: str
    moves: tuple[HeadMove, ...]

    def commit_at(self, at_epoch_s: float) -> tuple[bool, str | None]:
        """(present, commit) at ``at_epoch_s``: the ``new`` of the last move at or before it;
        before the first move, that move's ``old`` — and absent if the first move created the
        repo (a clone). With no moves: present, commit unknown."""
        last: HeadMove | None = None
        for move in self.moves:
            if move.at_epoch_s <= at_epoch_s:
                last = move
            else:
                break
        if last is not None:
            return True, last.new
        if not self.moves:
            return True, None
        first = self.moves[0]
        return (first.old is not None), first.old


def history_from_entries(
    repo: str,
    entries: Iterable[ReflogEntry],
    backups: Iterable[tuple[float, str]] = (),
) -> RepoHistory:
    """Moves from reflog entries plus Windows-updater backup branches ``(time, commit)``.

    A backup branch says "HEAD was this commit at this time"; it becomes a move only where
    the reflog does not already say so (it matters when the reflog was expired or lost).
    Entries that do not move HEAD (``checkout: moving from master to master``) are kept:
    they are harmless and mark when something happened."""
    moves = [
        HeadMove(float(e.at_epoch_s), e.old, e.new, e.message, "reflog")
        for e in entries
        if e.new is not None
    ]
    moves.sort(key=lambda m: m.at_epoch_s)  # stable: file order within one second
    known = RepoHistory(repo, tuple(moves))
    extra: list[HeadMove] = []
    for at, commit in backups:
        # HEAD's values around that second: before it, after it, and any it left then.
        seen = {known.commit_at(at - 1)[1], known.commit_at(at)[1]}
        seen.update(m.old for m in moves if m.at_epoch_s == at)
        if commit in seen:
            continue
        extra.append(HeadMove(at, None, commit, "backup branch (Windows updater)", "backup-branch"))
    if extra:
        # A backup is taken just before the update at the same second: sort it first.
        merged = sorted([*moves, *extra], key=lambda m: (m.at_epoch_s, m.origin != "backup-branch"))
        return RepoHistory(repo, tuple(merged))
    return known


# ---------------------------------------------------------------------------------------------
# Readers


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8", errors="replace")
    except OSError:
        return ""


def _backup_branches(common: Path) -> list[tuple[float, str]]:
    """(time, commit) of every ``backup_branch_*`` (loose or packed). The time is the
    branch's own reflog entry when it has one (exact, with time zone), else the local time in
    its name."""
    prefix = f"refs/heads/{BACKUP_BRANCH_PREFIX}"
    refs = {
        name[len("refs/heads/") :]: sha
        for name, sha in packed_refs(common).items()
        if name.startswith(prefix)
    }
    heads = common / "refs" / "heads"
    try:
        names = os.listdir(heads)
    except OSError:
        names = []
    for name in names:
        if name.startswith(BACKUP_BRANCH_PREFIX):
            sha = _read_text(heads / name).strip()
            if re.match(r"^[0-9a-f]{40,64}$", sha):
                refs[name] = sha
    out: list[tuple[float, str]] = []
    for name, sha in refs.items():
        entries = parse_reflog(_read_text(common / "logs" / "refs" / "heads" / name))
        if entries:
            out.append((float(entries[0].at_epoch_s), sha))
            continue
        local = parse_backup_branch_time(name)
        if local is not None:
            out.append((local.timestamp(), sha))
    return sorted(out)


def _head_reflog(gitdir: Path) -> list[ReflogEntry]:
    return parse_reflog(_read_text(gitdir / "logs" / "HEAD"))


def read_head_reflog(worktree: str | Path) -> list[ReflogEntry]:
    """HEAD's reflog of the repo at ``worktree`` (a ``.git`` file followed), oldest first, as
    git wrote it: the entries ``HEAD@{N}`` counts back through (the bisect's ``HEAD@{N}``
    states). Empty without a repo or a reflog."""
    dirs = git_dirs(Path(worktree))
    return [] if dirs is None else _head_reflog(dirs[0])


def read_repo_history(worktree: str | Path, repo: str) -> RepoHistory:
    """The history of HEAD in the repo at ``worktree``: ``logs/HEAD`` plus backup branches.
    A repo without a reflog (``core.logAllRefUpdates=false``, a bare copy) has no moves."""
    dirs = git_dirs(Path(worktree))
    if dirs is None:
        return RepoHistory(repo, ())
    gitdir, common = dirs
    return history_from_entries(repo, _head_reflog(gitdir), _backup_branches(common))


# ---------------------------------------------------------------------------------------------
# Combining repos into install states


@dataclass(frozen=True)
class HistoricalState:
    """An install state reconstructed for a moment, and the event that produced it
    (``repo``/``move`` are ``None`` for the state before the earliest recorded event)."""

    state: InstallState
    at_epoch_s: float | None
    repo: str | None
    move: HeadMove | None

    @property
    def description(self) -> str:
        if self.move is None or self.repo is None:
            return "before the earliest recorded change"
        label = "ComfyUI" if self.repo == CORE_REPO else f"custom_nodes/{self.repo}"
        return f"{label}: {self.move.message or self.move.action}"


def _state_at(
    current: InstallState, histories: Mapping[str, RepoHistory], at: float
) -> InstallState:
    core = current.comfyui
    core_hist = histories.get(CORE_REPO)
    if core_hist is not None and core_hist.moves:
        _present, commit = core_hist.commit_at(at)
        # Branch, dirty files and version describe the present checkout only.
        core = CoreState(commit=commit, branch=None, url=core.url, dirty=None, version=None)
    nodes: list[CustomNode] = []
    for key, node in current.node_table().items():
        hist = histories.get(key)
        if hist is None or not hist.moves:
            nodes.append(node)  # no history: no evidence it changed
            continue
        present, commit = hist.commit_at(at)
        if present:
            nodes.append(replace(node, commit=commit, branch=None))
    return InstallState(
        comfyui=core,
        nodes=tuple(nodes),
        pip=None,  # the interpreter's past is not in any reflog
        interpreter=None,
        root=current.root,
        captured_at_epoch_s=at,
        source="reflog",
    )


def states_over_time(
    current: InstallState, histories: Mapping[str, RepoHistory]
) -> list[HistoricalState]:
    """The install's states, oldest first: one before the earliest recorded move, then one
    after each moment some repo's HEAD moved (moves in the same second are one step), with
    consecutive identical states merged (the earliest moment is kept).

    ``histories`` is keyed by ``CORE_REPO`` and node keys of ``current.node_table()``.
    Nodes and the core take ``current``'s other attributes (kind, disabled, URL); a repo with
    no history keeps its current commit. Reconstructed states carry no pip lines, dirty
    files or interpreter facts (``None``: unknown)."""
    events: list[tuple[float, str, HeadMove]] = sorted(
        ((m.at_epoch_s, repo, m) for repo, h in histories.items() for m in h.moves),
        key=lambda e: e[0],
    )
    if not events:
        return []
    out: list[HistoricalState] = []
    first_at = events[0][0]
    # The state before the first recorded move is only worth listing when some repo existed
    # then (its first entry is not a clone), e.g. when older reflog entries were expired.
    if any(h.moves and h.moves[0].old is not None for h in histories.values()):
        out.append(HistoricalState(_state_at(current, histories, first_at - 1), None, None, None))
    i = 0
    while i < len(events):
        at = events[i][0]
        j = i
        while j + 1 < len(events) and events[j + 1][0] == at:
            j += 1
        # Name the step after the last move of that second that is not a no-op.
        _at, repo, move = events[j]
        state = _state_at(current, histories, at)
        if not out or state.state_id != out[-1].state.state_id:
            out.append(HistoricalState(state, at, repo, move))
        i = j + 1
    return out


def state_before_last(
    history: Sequence[HistoricalState],
    action: str | None = None,
    repo: str | None = None,
) -> tuple[HistoricalState, HistoricalState] | None:
    """(before, after) around the last change made by ``action`` ("pull", "checkout",
    "reset"…; any when ``None``) in ``repo`` (any when ``None``); ``None`` if there was none.
    "The state before the last pull" is ``state_before_last(h, "pull")[0]``."""
    for i in range(len(history) - 1, 0, -1):
        item = history[i]
        if item.move is None:
            continue
        if action is not None and item.move.action != action:
            continue
        if repo is not None and item.repo != repo:
            continue
        return history[i - 1], item
    return None


def _is_update(item: HistoricalState) -> bool:
    """A step made by an update action that moved HEAD (``checkout: moving from master to
    master`` moves nothing)."""
    move = item.move
    return move is not None and move.action in UPDATE_ACTIONS and move.old != move.new


def last_update(
    history: Sequence[HistoricalState], gap_s: float = UPDATE_GAP_S
) -> tuple[HistoricalState, HistoricalState] | None:
    """(before, after) around the install's last update; ``None`` if it had none.

    The last update is the newest step of ``history`` made by an update action
    (``UPDATE_ACTIONS``), together with the update steps right before it that are each at most
    ``gap_s`` from the next (one "Update All" is many pulls over minutes). The install's
    first state is never part of it: an install cloned and pulled the same hour rolls back to
    the clone, not past it. Later steps that are not updates (a commit of the user's own) are
    not rolled back over: ``after`` is the state the update made.

    This is "the state before the last update" of ``oom-sentinel states history`` and of
    ``oom-bisect --good before-last-update``: one definition for both."""
    end = len(history) - 1
    while end >= 1 and not _is_update(history[end]):
        end -= 1
    if end < 1:
        return None
    start = end
    while (
        start - 1 >= 1
        and _is_update(history[start - 1])
        and (history[start].at_epoch_s or 0.0) - (history[start - 1].at_epoch_s or 0.0) <= gap_s
    ):
        start -= 1
    return history[start - 1], history[end]


def import_install_history(
    path: str | Path, current: InstallState | None = None
) -> list[HistoricalState]:
    """Reconstruct an install's past from the reflogs of ComfyUI and every git node.

    ``current`` is a fresh capture (taken here, without the interpreter, when not given).
    The daemon stores each ``HistoricalState.state`` at start; identical states share an id,
    so importing again adds nothing."""
    state = current if current is not None else capture_install(path)
    histories = {key: read_repo_history(where, key) for key, where in iter_git_repos(state)}
    return states_over_time(state, histories)
