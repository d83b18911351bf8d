"""The git commands the bisect runs, and the only place that runs them.

Two kinds of repository meet here and must never be confused: the user's repos (ComfyUI and
its custom nodes), which we only *read* with commands that write nothing (``rev-parse``,
``rev-list``, ``log``, ``config --get``, ``ls-files``, plus reading ``logs/HEAD`` as a file),
and the workspace's own clones, which we check out freely. Every call gets a scrubbed
environment: ``GIT_DIR`` and friends from a calling hook would otherwise redirect us at the
wrong repository, ``GIT_OPTIONAL_LOCKS=0`` stops reads from refreshing the user's index, and
``GIT_TERMINAL_PROMPT=0`` stops a credential prompt from hanging a bisect.

Git failures become ``BisectError``/``BadRef`` lines naming the repository; callers never see
``CalledProcessError``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from oom_sentinel.daemon.errors import BadRef, BisectError
from oom_sentinel.daemon.gitread import git_env

__all__ = [
    "CommitInfo",
    "ReflogEntry",
    "commit_info",
    "first_parent_range",
    "git",
    "git_env",
    "is_ancestor",
    "is_commit_id",
    "normalize_remote_url",
    "null_sha",
    "parse_reflog",
    "read_reflog",
    "remote_urls",
    "resolve_commit",
    "tracked_top_level",
]

_HEX_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_ZERO = "0" * 40


def is_commit_id(value: str) -> bool:
    """A full object id (SHA-1 or SHA-256), lower case."""
    return bool(_HEX_RE.match(value))


def git(
    repo: Path,
    *args: str,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    what: str | None = None,
    pass_fds: Sequence[int] = (),
    config: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``git -C repo [-c k=v ...] args``; on failure raise BisectError naming ``what``."""
    cfg = [w for k, v in (config or {}).items() for w in ("-c", f"{k}={v}")]
    cmd = ["git", "-C", str(repo), *cfg, *args]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=git_env(env),
            stdin=subprocess.DEVNULL,
            check=False,
            pass_fds=tuple(pass_fds),
        )
    except FileNotFoundError as exc:
        raise BisectError("git is not installed (no 'git' on PATH)") from exc
    if check and proc.returncode != 0:
        reason = _first_line(proc.stderr) or f"exit status {proc.returncode}"
        raise BisectError(f"{what or repo}: git {args[0]} failed: {reason}")
    return proc


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("fatal: ").removeprefix("error: ")
    return ""


def resolve_commit(repo: Path, ref: str, what: str) -> str:
    """The full id of the commit ``ref`` names in ``repo``, or BadRef("what: 'ref' is not a commit")."""
    if not ref or ref.startswith("-") or any(c.isspace() for c in ref) or "\0" in ref:
        raise BadRef(f"{what}: {ref!r} is not a commit")
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    sha = proc.stdout.strip()
    if proc.returncode != 0 or not is_commit_id(sha):
        raise BadRef(f"{what}: {ref!r} is not a commit")
    return sha


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    proc = git(repo, "merge-base", "--is-ancestor", older, newer, check=False)
    return proc.returncode == 0


def first_parent_range(repo: Path, good: str, bad: str, what: str) -> tuple[str, ...]:
    """Candidates for the first bad commit, oldest first: ``rev-list --first-parent bad ^good``.

    The last element is ``bad``. Empty when ``bad`` is reachable from ``good`` (a downgrade
    or the same commit): the caller then treats the change as one step.
    """
    proc = git(repo, "rev-list", "--first-parent", "--reverse", bad, f"^{good}", what=what)
    return tuple(line for line in proc.stdout.split() if line)


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    date: str  # ISO 8601 author date
    files: tuple[str, ...]


def commit_info(repo: Path, sha: str, what: str) -> CommitInfo:
    """Subject, author, date and changed files of one commit (first-parent diff) for reports."""
    proc = git(
        repo,
        "show",
        "--no-renames",
        "--first-parent",
        "--name-only",
        "--format=%H%x00%s%x00%an <%ae>%x00%aI%x00",
        sha,
        what=what,
    )
    parts = proc.stdout.split("\x00", 4)
    if len(parts) < 5:
        raise BisectError(f"{what}: cannot read commit {sha}")
    files = tuple(line for line in parts[4].splitlines() if line.strip())
    return CommitInfo(sha=parts[0], subject=parts[1], author=parts[2], date=parts[3], files=files)


def remote_urls(repo: Path) -> tuple[str, ...]:
    """Every ``remote.*.url`` in the repo's config, in config order."""
    proc = git(repo, "config", "--get-regexp", r"^remote\..*\.url$", check=False)
    urls = []
    for line in proc.stdout.splitlines():
        _, _, url = line.partition(" ")
        if url:
            urls.append(url.strip())
    return tuple(urls)


def normalize_remote_url(url: str) -> str:
    """Compare remote URLs the way ComfyUI-Manager's restore does: GitHub SSH and HTTPS forms,
    with or without ``.git`` or a trailing slash, and owner/repo case all compare equal."""
    u = url.strip()
    m = re.match(r"^(?:ssh://)?git@github\.com[:/](.+)$", u)
    if m:
        u = "https://github.com/" + m.group(1)
    u = re.sub(r"^(?:git|http)://github\.com/", "https://github.com/", u)
    u = re.sub(r"^https://[^@/]+@github\.com/", "https://github.com/", u)  # drop credentials
    u = u.rstrip("/")
    u = u.removesuffix(".git")
    return u.lower()


def tracked_top_level(repo: Path, subdir: str) -> frozenset[str]:
    """Names directly under ``subdir`` that the repo tracks (read from the index, not written)."""
    proc = git(repo, "ls-files", "-z", "--", subdir, check=False)
    names = set()
    prefix = subdir.rstrip("/") + "/"
    for path in proc.stdout.split("\0"):
        if path.startswith(prefix):
            names.add(path[len(prefix) :].split("/", 1)[0])
    return frozenset(names)


@dataclass(frozen=True)
class ReflogEntry:
    """One line of ``logs/HEAD``: HEAD moved from ``old`` to ``new`` at ``time_s``."""

    old: str
    new: str
    time_s: int
    message: str

    @property
    def action(self) -> str:
        """The command that moved HEAD: the message up to its first colon (``pull``, ``reset``)."""
        return self.message.split(":", 1)[0].strip()


_REFLOG_RE = re.compile(r"^([0-9a-f]{40,64}) ([0-9a-f]{40,64}) .*> (\d+) [+-]\d{4}\t?(.*)$")


def parse_reflog(text: str) -> list[ReflogEntry]:
    """Parse a reflog file (oldest first). Lines that don't parse are skipped, never fatal."""
    entries = []
    for line in text.splitlines():
        m = _REFLOG_RE.match(line)
        if m:
            entries.append(ReflogEntry(m.group(1), m.group(2), int(m.group(3)), m.group(4)))
    return entries


def read_reflog(repo: Path) -> list[ReflogEntry]:
    """HEAD's reflog of ``repo``, oldest first; empty when the repo keeps none."""
    proc = git(repo, "rev-parse", "--git-dir", check=False)
    if proc.returncode != 0:
        return []
    gitdir = Path(proc.stdout.strip())
    if not gitdir.is_absolute():
        gitdir = repo / gitdir
    try:
        text = (gitdir / "logs" / "HEAD").read_text("utf-8", errors="replace")
    except OSError:
        return []
    return parse_reflog(text)


def null_sha(value: str) -> bool:
    return value == _ZERO or set(value) == {"0"}
