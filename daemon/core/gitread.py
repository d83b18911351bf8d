"""What HEAD, its branch and the remotes of a checkout are, read from git's own files.

The daemon asks this of ComfyUI and of every custom node each time an install changes, for
months. Reading a handful of small files answers it without a ``git`` binary (the portable
and Desktop builds often have none), without a subprocess, and without GitPython's module
tree in the long-running process (GitPython stays the bisect's tool). Nothing here writes.

The formats are git's documented on-disk ones: ``HEAD`` and loose refs hold ``ref: <name>``
or an object name; ``packed-refs`` holds ``<sha> <name>`` lines (``^<sha>`` peel lines
follow annotated tags); a linked worktree or submodule has a ``.git`` *file* with
``gitdir: <path>``, and its git dir a ``commondir`` file naming where branches and the
config live. The config reader understands what remote sections use: sections and
``"subsections"``, ``key = value`` with quotes, escapes, comments and line continuations;
it does not follow ``[include]`` (git's own ``remote.*.url`` are never written there).

What needs git itself (``status``, counting commits) goes through ``run_git``, with the one
environment every git call of the project gets (``git_env``, the bisect's too).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "GIT_SETTINGS",
    "SCRUBBED",
    "git_dirs",
    "git_env",
    "packed_refs",
    "read_head",
    "remote_urls",
    "resolve_ref",
    "run_git",
    "worktree_remote_urls",
]

#: variables a calling hook or shell may set that would point git at another repository
SCRUBBED = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_PREFIX",
    "GIT_QUARANTINE_PATH",
)

#: what every git call adds to the environment (see ``git_env``)
GIT_SETTINGS = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
    "LANGUAGE": "C",
}

_SHA = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
#: what a ref name may look like here (git check-ref-format, restricted to what we follow)
_REF_NAME = re.compile(r"^(?:HEAD|refs/[^\x00-\x20~^:?*\[\\]+)$")
#: symbolic refs pointing at symbolic refs: git itself gives up after 5
_MAX_DEPTH = 5


def git_dirs(worktree: Path) -> tuple[Path, Path] | None:
    """(git dir, common dir) of a working tree: ``.git/`` itself, or the directory a ``.git``
    file points to (worktrees, submodules) and its ``commondir``; None when there is none."""
    dot = worktree / ".git"
    if dot.is_dir():
        gitdir = dot
    elif dot.is_file():
        text = _read(dot)
        if text is None or not text.startswith("gitdir:"):
            return None
        target = Path(text[len("gitdir:") :].strip())
        gitdir = target if target.is_absolute() else (worktree / target).resolve()
        if not gitdir.is_dir():
            return None
    else:
        return None
    common = gitdir
    rel = _read(gitdir / "commondir")
    if rel and rel.strip():
        common = (gitdir / rel.strip()).resolve()
    return gitdir, common


def _read(path: Path) -> str | None:
    try:
        return path.read_text("utf-8", errors="replace")
    except OSError:
        return None


def packed_refs(common: Path) -> dict[str, str]:
    """Ref name -> object name of every line of ``packed-refs`` (tag peel lines skipped)."""
    refs: dict[str, str] = {}
    for line in (_read(common / "packed-refs") or "").splitlines():
        if not line or line[0] in "#^":
            continue
        sha, _, name = line.partition(" ")
        if _SHA.match(sha) and name:
            refs[name.strip()] = sha
    return refs


def resolve_ref(gitdir: Path, common: Path, name: str) -> str | None:
    """The object name ``name`` (``HEAD``, ``refs/heads/master``) ends at, following
    symbolic refs; None for an unborn branch, a broken or looping ref."""
    packed: dict[str, str] | None = None
    for _ in range(_MAX_DEPTH + 1):
        if not _REF_NAME.match(name) or ".." in name:
            return None  # not a ref git could write: never read outside the git dir
        # HEAD and other pseudo refs are per worktree; refs/ live in the common dir
        base = gitdir if not name.startswith("refs/") else common
        text = _read(base / name)
        if text is None and base is not gitdir:
            text = _read(gitdir / name)
        if text is None:
            if packed is None:
                packed = packed_refs(common)
            return packed.get(name)
        value = text.strip()
        if value.startswith("ref:"):
            name = value[len("ref:") :].strip()
            continue
        return value if _SHA.match(value) else None
    return None


def read_head(gitdir: Path, common: Path) -> tuple[str | None, str | None]:
    """(commit, branch) of HEAD. The branch is the short name under ``refs/heads/`` (the full
    ref name for anything else) and None when HEAD is detached; the commit is None for an
    unborn branch or a broken ref."""
    text = _read(gitdir / "HEAD")
    if text is None:
        return None, None
    value = text.strip()
    branch: str | None = None
    if value.startswith("ref:"):
        ref = value[len("ref:") :].strip()
        branch = ref[len("refs/heads/") :] if ref.startswith("refs/heads/") else ref
    return resolve_ref(gitdir, common, "HEAD"), branch


# -- config ------------------------------------------------------------------------------------

_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]')
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?$")


def _value(raw: str) -> str:
    """A config value: quotes removed, escapes decoded, a comment outside quotes dropped."""
    out: list[str] = []
    quoted = False
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw):
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[i + 1], raw[i + 1]))
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch in "#;" and not quoted:
            break
        else:
            out.append(ch)
        i += 1
    return "".join(out).strip()


def _logical_lines(text: str) -> list[str]:
    """Config lines with backslash-newline continuations joined."""
    lines: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def remote_urls(common: Path) -> list[tuple[str, str]]:
    """(remote name, url) of every ``[remote "name"] url = ...`` in the repo's config, in file
    order; empty when there is no readable config."""
    urls: list[tuple[str, str]] = []
    remote: str | None = None
    for line in _logical_lines(_read(common / "config") or ""):
        section = _SECTION.match(line)
        if section:
            name, sub = section.group(1).lower(), section.group(2)
            remote = re.sub(r"\\(.)", r"\1", sub) if name == "remote" and sub is not None else None
            line = line[section.end() :]
            if not line.strip():
                continue
        if remote is None:
            continue
        key = _KEY.match(line)
        if key and key.group(1).lower() == "url" and key.group(2) is not None:
            url = _value(key.group(2))
            if url:
                urls.append((remote, url))
    return urls


def worktree_remote_urls(worktree: Path) -> list[str]:
    """Every remote URL of the checkout at ``worktree`` (a ``.git`` file followed), in config
    order, as written; empty when it is not a repository or has no readable config."""
    dirs = git_dirs(worktree)
    return [] if dirs is None else [url for _name, url in remote_urls(dirs[1])]


# -- running git ---------------------------------------------------------------------------------


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for every git call: no ``GIT_DIR`` and friends from a calling hook,
    ``GIT_OPTIONAL_LOCKS=0`` so reads never refresh the user's index, no credential prompt,
    C locale for parseable output."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(GIT_SETTINGS)
    if extra:
        env.update(extra)
    return env


def run_git(path: str | os.PathLike[str], *args: str, timeout_s: float) -> bytes:
    """stdout of a read-only ``git -C path args``. Raises ``FileNotFoundError`` (no git),
    ``subprocess.CalledProcessError`` (git said no) or ``subprocess.TimeoutExpired``."""
    done = subprocess.run(
        ["git", "-C", os.fspath(path), *args],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=git_env(),
        timeout=timeout_s,
        check=True,
    )
    return done.stdout
