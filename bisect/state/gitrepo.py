"""The bisect's git seam: every git operation of ``oom-bisect`` goes through GitPython here.

Two kinds of repository meet here and must never be confused: the user's repos (ComfyUI and
its custom nodes), which we only *read* (ref resolution, first-parent ranges, commit info,
trees), and the workspace's own shared clones, which we check out freely (``clone_shared``,
``checkout``). What git's own files answer -- the reflog, remote URLs and how two of them
compare -- is read by the daemon's readers (``daemon/install/reflog.py``, ``daemon/core/gitread.py``,
``daemon/install_state.url_key``), which both sides share.

**Every ``Repo`` is closed.** GitPython keeps ``git cat-file --batch`` processes and mapped
pack files per ``Repo`` until ``close()``; a bisect opens repos for hours, so each function
opens one with ``with _open(path)`` and closes it before returning.

**One environment.** GitPython starts git with a copy of ``os.environ`` and can add to it but
not take away, so the variables that would point git at another repository (``GIT_DIR`` and
friends from a calling hook, ``daemon.gitread.SCRUBBED``) are removed from this process's
environment the first time a repo is opened; ``GIT_OPTIONAL_LOCKS=0`` (reads never refresh
the user's index), ``GIT_TERMINAL_PROMPT=0`` (no credential prompt can hang a bisect) and the
C locale are added to every call.

**Success is git's exit status.** A real ComfyUI clone may lack a blob (a sparse checkout of a
mirror that lost one): ``git checkout`` then prints ``error: invalid object …`` or ``error:
unable to read sha1 file …`` and still exits 0 with every other file written. That is a
success here; only a non-zero exit is a failure.

**Writing git commands die with oom-bisect.** ``clone``, ``checkout`` and ``clean`` in the
workspace are started with the parent-death signal (``procutil.pdeathsig_preexec``; Linux
only): a killed ``oom-bisect`` once left a ``git checkout`` spinning at 100% CPU for an hour.

Git failures become ``BisectError``/``BadRef`` lines naming the repository; callers never see
GitPython's exceptions.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_sentinel.bisect.measure.procutil import pdeathsig_preexec, signals_deferred
from oom_sentinel.daemon.core.errors import BadRef, BisectError
from oom_sentinel.daemon.core.gitread import GIT_SETTINGS, SCRUBBED

__all__ = [
    "CommitInfo",
    "checkout",
    "clone_shared",
    "commit_info",
    "core_node_entries",
    "first_parent_range",
    "is_ancestor",
    "is_commit_id",
    "resolve_commit",
]

_HEX_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")


def is_commit_id(value: str) -> bool:
    """A full object id (SHA-1 or SHA-256), lower case."""
    return bool(_HEX_RE.match(value))


def _scrub_environment() -> None:
    for name in SCRUBBED:
        os.environ.pop(name, None)


@contextlib.contextmanager
def _open(path: Path, what: str) -> Iterator[Any]:
    """``git.Repo`` at ``path`` (a working tree; a ``.git`` file of a submodule is followed),
    closed on the way out."""
    _scrub_environment()
    try:
        import git
    except ImportError as exc:  # a declared dependency; say so instead of a traceback
        raise BisectError(f"GitPython is not installed ({exc})") from None
    try:
        repo = git.Repo(os.fspath(path))
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise BisectError(f"{what}: {path} is not a git repository") from None
    except git.GitError as exc:
        raise BisectError(f"{what}: cannot open {path}: {_reason(exc)}") from None
    try:
        repo.git.update_environment(**GIT_SETTINGS)
        yield repo
    finally:
        repo.close()


def _reason(exc: BaseException) -> str:
    """The first line git (or GitPython) said, without ``fatal:``/``error:``."""
    text = getattr(exc, "stderr", None) or str(exc)
    for line in str(text).splitlines():
        line = line.strip().removeprefix("stderr:").strip().strip("'").strip()
        if line:
            return line.removeprefix("fatal: ").removeprefix("error: ")
    status = getattr(exc, "status", None)
    return f"exit status {status}" if status is not None else type(exc).__name__


def _git_error() -> tuple[type[BaseException], ...]:
    import git

    return (git.GitError, ValueError)


# --------------------------------------------------------------------------- reading


def resolve_commit(repo: Path, ref: str, what: str) -> str:
    """The full id of the commit ``ref`` names in ``repo``, or BadRef("what: 'ref' is not a commit")."""
    if not ref or ref.startswith("-") or any(c.isspace() for c in ref) or "\0" in ref:
        raise BadRef(f"{what}: {ref!r} is not a commit")
    with _open(repo, what) as r:
        try:
            sha = str(r.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")).strip()
        except _git_error():
            raise BadRef(f"{what}: {ref!r} is not a commit") from None
    if not is_commit_id(sha):
        raise BadRef(f"{what}: {ref!r} is not a commit")
    return sha


def is_ancestor(repo: Path, older: str, newer: str, what: str | None = None) -> bool:
    with _open(repo, what or str(repo)) as r:
        try:
            return bool(r.is_ancestor(older, newer))
        except _git_error():
            return False


def first_parent_range(repo: Path, good: str, bad: str, what: str) -> tuple[str, ...]:
    """Candidates for the first bad commit, oldest first: ``rev-list --first-parent bad ^good``.

    The last element is ``bad``. Empty when ``bad`` is reachable from ``good`` (a downgrade
    or the same commit): the caller then treats the change as one step.
    """
    with _open(repo, what) as r:
        try:
            commits = r.iter_commits(f"{good}..{bad}", first_parent=True, reverse=True)
            return tuple(c.hexsha for c in commits)
        except _git_error() as exc:
            raise BisectError(f"{what}: git rev-list failed: {_reason(exc)}") from None


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    date: str  # ISO 8601 author date
    files: tuple[str, ...]


def commit_info(repo: Path, sha: str, what: str) -> CommitInfo:
    """Subject, author, date and changed files of one commit (first-parent diff) for reports."""
    import git

    with _open(repo, what) as r:
        try:
            c = r.commit(sha)
            base = c.parents[0] if c.parents else git.NULL_TREE
            diff = c.diff(base, no_renames=True) if c.parents else c.diff(base)
            files = sorted({p for d in diff for p in (d.a_path, d.b_path) if p})
            subject = str(c.summary)
            author = f"{c.author.name} <{c.author.email}>"
            date = c.authored_datetime.isoformat()
            hexsha = c.hexsha
        except _git_error() as exc:
            raise BisectError(f"{what}: cannot read commit {sha}: {_reason(exc)}") from None
    return CommitInfo(sha=hexsha, subject=subject, author=author, date=date, files=tuple(files))


def file_at(repo: Path, sha: str, path: str, what: str) -> str | None:
    """The text of ``path`` in commit ``sha`` of ``repo`` (None: the commit has no such file,
    or it is not UTF-8 text)."""
    with _open(repo, what) as r:
        try:
            blob = r.commit(sha).tree / path
            data: bytes = blob.data_stream.read()
        except KeyError:
            return None
        except _git_error() as exc:
            raise BisectError(f"{what}: cannot read {path} at {sha}: {_reason(exc)}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def core_node_entries(repo: Path, commits: Sequence[str], what: str) -> frozenset[str]:
    """Names directly under ``custom_nodes/`` that the core's tree tracks as files or folders
    at any of ``commits`` (ComfyUI ships ``websocket_image_save.py`` and
    ``example_node.py.example`` there): they are the core's, not nodes. A gitlink (a pack
    added as a submodule) is a repository of its own, so it is not listed."""
    names: set[str] = set()
    with _open(repo, what) as r:
        for sha in commits:
            try:
                tree = r.commit(sha).tree
                sub = tree / "custom_nodes"
            except KeyError:
                continue  # this commit has no custom_nodes/ folder
            except _git_error() as exc:
                raise BisectError(
                    f"{what}: cannot read the tree of {sha}: {_reason(exc)}"
                ) from None
            for item in sub:
                if item.type in ("blob", "tree"):
                    names.add(str(item.name))
    return frozenset(names)


# --------------------------------------------------------------------------- the workspace


def _run(
    cwd: Path,
    args: Sequence[str],
    *,
    what: str,
    config: Mapping[str, str],
    env: Mapping[str, str] | None,
    pass_fds: Sequence[int],
) -> None:
    """One writing git command through GitPython's command runner, with ``-c`` options,
    inherited fds (the workspace lock) and the parent-death signal (``Git.execute`` hands
    these to ``Popen``): GitPython's per-method calls cannot pass them. The command runs to
    its end on this thread, so the signal (which follows the forking thread) fires only when
    oom-bisect dies. ``Git.execute`` forks and waits in one call, so a Ctrl-C or SIGTERM sent
    to oom-bisect alone takes effect when git ends (a terminal's Ctrl-C reaches git too)."""
    import git

    cfg = [w for k, v in config.items() for w in ("-c", f"{k}={v}")]
    runner = git.Git(os.fspath(cwd))
    runner.update_environment(**GIT_SETTINGS, **(env or {}))
    try:
        with signals_deferred():  # a Ctrl-C during the fork must not vanish (procutil)
            runner.execute(
                [git.Git.GIT_PYTHON_GIT_EXECUTABLE or "git", *cfg, *args],
                with_extended_output=True,
                pass_fds=tuple(pass_fds),
                preexec_fn=pdeathsig_preexec(),
            )
    except git.GitCommandNotFound:
        raise BisectError("git is not installed (no 'git' on PATH)") from None
    except git.GitCommandError as exc:
        raise BisectError(f"{what}: git {args[0]} failed: {_reason(exc)}") from None


def clone_shared(
    source: Path,
    dest: Path,
    *,
    template: Path,
    config: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> None:
    """``git clone --shared --no-checkout`` of ``source`` at ``dest``: the clone borrows the
    source's objects through ``objects/info/alternates`` and writes nothing into it."""
    _scrub_environment()
    _run(
        dest.parent,
        [
            "clone",
            "--shared",
            "--no-checkout",
            "--quiet",
            f"--template={template}",
            "--",
            os.fspath(source),
            os.fspath(dest),
        ],
        what=f"cloning {source}",
        config=config,
        env=env,
        pass_fds=pass_fds,
    )
    with _open(dest, f"cloning {source}") as r:  # the clone must open as a repo
        if r.bare:
            raise BisectError(f"cloning {source}: {dest} came out bare")
    _copy_sparse_checkout(source, dest)


def _sparse_settings(repo: Any) -> tuple[str, str | None, bytes] | None:
    """(sparseCheckout, sparseCheckoutCone, patterns) of a repo with a sparse checkout (git
    reads them from config.worktree too), else None."""
    try:
        enabled = str(repo.git.config("--get", "--type=bool", "core.sparseCheckout")).strip()
    except _git_error():
        return None
    if enabled != "true":
        return None
    try:
        cone: str | None = str(
            repo.git.config("--get", "--type=bool", "core.sparseCheckoutCone")
        ).strip()
    except _git_error():
        cone = None
    try:
        patterns = (Path(repo.git_dir) / "info" / "sparse-checkout").read_bytes()
    except OSError:
        return None
    return enabled, cone, patterns


def _copy_sparse_checkout(source: Path, dest: Path) -> None:
    """Give the clone the user's sparse checkout: the replay must see the files the user's
    checkout has, and a real clone may leave out a blob its mirror lacks (checking that file
    out would fail; with the same patterns git says ``error: invalid object`` and goes on)."""
    what = f"cloning {source}"
    with _open(source, what) as user:
        settings = _sparse_settings(user)
    if settings is None:
        return
    enabled, cone, patterns = settings
    with _open(dest, what) as r:
        info = Path(r.git_dir) / "info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "sparse-checkout").write_bytes(patterns)
        with r.config_writer("repository") as cfg:
            cfg.set_value("core", "sparseCheckout", enabled)
            if cone is not None:
                cfg.set_value("core", "sparseCheckoutCone", cone)


def checkout(
    repo: Path,
    sha: str,
    what: str,
    *,
    config: Mapping[str, str],
    keep: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> None:
    """Detach the workspace clone ``repo`` at ``sha`` and remove what that commit does not
    have (``git clean -fd``), except the paths in ``keep`` (``/custom_nodes/``)."""
    _scrub_environment()
    if not (repo / ".git").exists():
        # git would walk up and check out the enclosing repository (the workspace's core)
        raise BisectError(f"{what}: {repo} is not a clone of its own")
    args = ["checkout", "--force", "--detach", "--quiet", sha]
    _run(repo, args, what=what, config=config, env=env, pass_fds=pass_fds)
    clean = ["clean", "-fdq"]
    for path in keep:
        clean += ["-e", path]
    _run(repo, clean, what=what, config=config, env=env, pass_fds=pass_fds)
