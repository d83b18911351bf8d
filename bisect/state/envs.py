"""Per-state Python environments: a venv with exactly a state's package set, built by uv.

Why: an update changes packages as well as commits (a core bump moves
``comfyui-frontend-package``, a node's install script swaps torch), and replaying every state
in the user's one interpreter can never blame a package. A state whose package set differs
from the interpreter's runs in a venv of its own:

* ``uv venv --relocatable`` on the user's base interpreter, then ``uv pip sync`` of the
  state's lock: exactly those distributions, nothing resolved or substituted. ``uv pip check``
  then records the set's broken requirements (``problems.txt``). A recorded state runs as it
  was, conflicts and all; a set the search mixed from two recorded ones is refused when it
  breaks a requirement neither of them broke (``tolerated``), which is how a package and the
  packages pinned to it end up moving together (plan.py's ddmin keeps them in one set).
* ``--link-mode hardlink`` from a uv cache that lives next to the envs (same filesystem), so
  a second env with the same torch costs seconds and no extra gigabytes.
* Cached by the lock's hash (``envs/<sha16>/``); built in a temporary folder and renamed into
  place when complete, so an interrupted build is never taken for an env. ``last-used`` is
  touched on each use; after a build the least recently used envs are removed until the
  cache (envs + uv cache, each inode counted once) fits ``max_bytes`` (``--env-cache-max``).
* A lock uv cannot install (a local wheel that is gone, a yanked or unknown version, an
  editable checkout) raises ``EnvUnavailable`` with uv's own reason: that state is a skip, never
  run on a substitute.

Torch builds keep what was recorded: the lock line is ``torch==2.8.0+cu128`` (the local
version is part of the pin). pip freeze does not record the index a build came from; for a
PyTorch local version (``+cu128``, ``+cpu``, ``+rocm6.3``, ``+xpu``) the lock adds PyTorch's
own index for it (``https://download.pytorch.org/whl/<tag>``) as an extra index, which is where
those builds are published. Any other index comes from uv's own settings (``UV_INDEX_URL``,
``UV_FIND_LINKS``, ``uv.toml``), as the user has them.

A commit between two recorded states has no recorded package set. When the search measures
one (a repo's bisect, or a mix of the endpoints), what the ``requirements.txt`` of the repos
it moved asks for beyond what that file asked for at both endpoints alike
(``new_requirement_lines``: a line both recorded states had was lived with in their sets) is
installed on top of the state's set (``python_with_requirements``), as ComfyUI-Manager does
after it checks out a node: ``uv pip install --dry-run`` first, and only when that would
change something, an env of its own (the lock plus those requirements, cached by both
hashes). The recorded endpoints run exactly as recorded. Every env is built with its
bytecode compiled, as pip installs: without it each start compiles torch and ComfyUI's
packages again, seconds slower and, on a real v0.8.0, ~145 MB larger, which a state would
show as a regression of its own.

uv is the ``uv`` distribution from PyPI (a dependency of oom-sentinel), run through its CLI:
``uv.find_uv_bin()`` locates the binary the wheel ships.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from oom_sentinel.daemon.core.errors import SentinelError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EnvCache",
    "EnvUnavailable",
    "Lock",
    "lock_for",
    "new_requirement_lines",
    "uv_binary",
]

#: ``--env-cache-max``'s default
DEFAULT_MAX_BYTES = 50 * 1024**3
_LAST_USED = "last-used"
_LOCK_FILE = "lock.txt"
_PROBLEMS = "problems.txt"
_TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio", "triton", "xformers"})
_TORCH_LOCAL_RE = re.compile(r"\+((?:cu|rocm)\d[\d.]*|cpu|xpu)$")


def new_requirement_lines(now: str, recorded: Sequence[str | None]) -> str:
    """The lines of requirements.txt text ``now`` that are not in every one of the
    ``recorded`` texts (the same file at the endpoints' commits; None where a commit had
    none), compared without comments and surrounding blanks, in ``now``'s order; '' when
    there are none. A line the file held at both endpoints did not change with the update:
    both recorded package sets lived with it as they were, so it is no reason for another env
    (v0.8.0 lists torchaudio, which its own torch build cannot have beside it). A line the
    update added or changed is (a bump to ``pkg==2.0`` at a commit between)."""

    def norm(line: str) -> str:
        return "" if line.lstrip().startswith("#") else line.split(" #", 1)[0].strip()

    texts = [{norm(ln) for ln in (text or "").splitlines()} for text in recorded]
    kept = set.intersection(*texts) if texts else set()
    new = [norm(ln) for ln in now.splitlines() if norm(ln) and norm(ln) not in kept]
    return "".join(ln + "\n" for ln in new)


class EnvUnavailable(SentinelError):
    """The state's package set cannot be installed; the message is uv's reason."""


@dataclass(frozen=True)
class Lock:
    """A requirements file for ``uv pip sync``: option lines first, then one pin a line."""

    lines: tuple[str, ...]

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()[:16]


def lock_for(packages: Mapping[str, str] | Sequence[tuple[str, str]]) -> Lock:
    """The lock of a package set ({normalised name: version or ``@ URL``})."""
    items = sorted(dict(packages).items())
    pins = [_pin(n, v) for n, v in items]
    tags = sorted(
        {m.group(1) for n, v in items if n in _TORCH_FAMILY and (m := _TORCH_LOCAL_RE.search(v))}
    )
    options = [f"--extra-index-url https://download.pytorch.org/whl/{t}" for t in tags]
    return Lock(tuple(options + pins))


def _pin(name: str, value: str) -> str:
    """One lock line: ``name==V``, ``name @ URL``, or an editable's ``-e …`` line as recorded
    (uv installs it from there if it still exists, or says why not)."""
    if value.startswith("@ -e "):
        return value[2:]
    return f"{name} {value}" if value.startswith("@ ") else f"{name}=={value}"


def uv_binary() -> str:
    """The uv executable: the one the ``uv`` wheel installed (``OOM_SENTINEL_UV`` overrides)."""
    explicit = os.environ.get("OOM_SENTINEL_UV")
    if explicit:
        return explicit
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise SentinelError("uv is not installed: `pip install uv` (oom-sentinel depends on it)")


def _venv_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _tail(text: str, n: int = 3) -> str:
    """uv's reason in one line: its last few meaningful lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("Using ", "Resolved ", "Prepared "))]
    return " / ".join((keep or lines)[-n:]) or "uv failed without a message"


def disk_usage(paths: Sequence[Path]) -> int:
    """Bytes under ``paths``, each inode counted once (hard links share their bytes)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in paths:
        if not root.exists():
            continue
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


class EnvCache:
    """Venvs keyed by lock hash under ``root`` (the bisect cache's ``envs/``)."""

    def __init__(
        self,
        root: Path,
        base_python: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        uv: str | None = None,
        timeout_s: float = 3600.0,
    ) -> None:
        self.root = root
        self.base_python = base_python
        self.max_bytes = max_bytes
        self.uv = uv
        self.timeout_s = timeout_s
        #: how the last ``python_for`` was served: "cached" or "built" (for progress lines)
        self.last: str | None = None

    @property
    def uv_cache(self) -> Path:
        return self.root / "uv-cache"

    def env_dir(self, lock: Lock) -> Path:
        return self.root / lock.digest()

    def python_for(self, lock: Lock, tolerated: frozenset[str] | None = None) -> Path:
        """The interpreter of ``lock``'s env, built now unless cached. Raises EnvUnavailable
        when uv cannot install the set, or when ``tolerated`` is given and the set breaks a
        requirement not in it (a mixed set that would run packages against their pins)."""
        env = self.env_dir(lock)
        if (env / _LAST_USED).is_file() and _venv_python(env).exists():
            self._mark_used(env)
            self.last = "cached"
        else:
            self._build(lock, env)
            self.last = "built"
            self.prune(keep=env)
        if tolerated is not None:
            new = [p for p in self.problems(lock) if p not in tolerated]
            if new:
                raise EnvUnavailable("this mix of packages breaks a requirement: " + new[0])
        return _venv_python(env)

    def python_with_requirements(
        self,
        lock: Lock,
        requirements: str,
        tolerated: frozenset[str] | None = None,
        *,
        base_python: str | None = None,
    ) -> Path:
        """``lock``'s env with ``requirements`` (requirements.txt text) installed on top:
        ``lock``'s own env when it satisfies them already, else a derived env. Raises
        EnvUnavailable when uv cannot install them (the reason is uv's). ``base_python``: an
        interpreter that already has ``lock``'s set (the user's own), checked instead of
        building a copy of it; it is only read (a dry run), never installed into."""
        base = Path(base_python) if base_python else self.python_for(lock, tolerated)
        if not requirements.strip():
            return base
        key = hashlib.sha256((lock.text() + "\0" + requirements).encode()).hexdigest()[:16]
        env = self.root / key
        same = env / "same-as"
        if same.is_file():
            return base
        if (env / _LAST_USED).is_file() and _venv_python(env).exists():
            self._mark_used(env)
            self.last = "cached"
            return _venv_python(env)
        self.root.mkdir(parents=True, exist_ok=True)
        reqs = self.root / f".{key}.requirements-{os.getpid()}.txt"
        reqs.write_text(requirements)
        try:
            dry = self._uv("pip", "install", "--dry-run", "--python", str(base), "-r", str(reqs))
            if dry.returncode != 0:
                raise EnvUnavailable(
                    f"the requirements of this state's repos cannot be installed: {_tail(dry.stderr)}"
                )
            if "Would make no changes" in dry.stderr + dry.stdout:
                env.mkdir(exist_ok=True)
                same.write_text(lock.digest() + "\n")
                return base
            self._build(lock, env, requirements=reqs)
        finally:
            reqs.unlink(missing_ok=True)
        self.last = "built"
        self.prune(keep=env)
        return _venv_python(env)

    def build_at(self, lock: Lock, dest: Path) -> Path:
        """A venv of ``lock`` at ``dest``, outside the cache and never pruned (a checkout's),
        still hard-linked from the cache's uv cache where ``dest`` shares its filesystem
        (uv copies otherwise). Returns its interpreter; raises EnvUnavailable."""
        if dest.exists():
            raise SentinelError(f"{dest}: already exists")
        self._build(lock, dest)
        (dest / _LAST_USED).unlink(missing_ok=True)  # not a cache entry
        return _venv_python(dest)

    def problems(self, lock: Lock) -> list[str]:
        """What ``uv pip check`` found wrong with the built env of ``lock`` (empty: none)."""
        try:
            text = (self.env_dir(lock) / _PROBLEMS).read_text("utf-8")
        except FileNotFoundError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()]

    def _uv(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env["UV_CACHE_DIR"] = str(self.uv_cache)
        env.pop("VIRTUAL_ENV", None)  # the user's activated venv is not the target
        env.setdefault("UV_NO_PROGRESS", "1")
        try:
            return subprocess.run(
                [self.uv or uv_binary(), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=self.timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise EnvUnavailable(f"uv {args[0]} took over {self.timeout_s:.0f} s") from None
        except OSError as exc:
            raise SentinelError(f"cannot run uv: {exc.strerror or exc}") from None

    def _build(self, lock: Lock, env: Path, requirements: Path | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        env.parent.mkdir(parents=True, exist_ok=True)
        tmp = env.parent / f".{env.name}.build-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            made = self._uv(
                "venv", "--relocatable", "--no-project", "--quiet", "--python", self.base_python,
                str(tmp),
            )  # fmt: skip
            if made.returncode != 0:
                raise SentinelError(f"uv venv with {self.base_python}: {_tail(made.stderr)}")
            (tmp / _LOCK_FILE).write_text(lock.text())
            # (--compile-bytecode: pip compiles what it installs and uv does not by default; an
            # env without bytecode compiles torch and ComfyUI's packages on every start, which
            # adds seconds and, measured on a real v0.8.0, ~145 MB to the server's resident
            # size: a state in such an env would read as a regression of its own)
            synced = self._uv(
                "pip", "sync", "--strict", "--link-mode", "hardlink", "--compile-bytecode",
                "--python", str(_venv_python(tmp)), str(tmp / _LOCK_FILE),
            )  # fmt: skip
            if synced.returncode != 0:
                raise EnvUnavailable(
                    f"the state's packages cannot be installed: {_tail(synced.stderr)}"
                )
            if requirements is not None:
                added = self._uv(
                    "pip", "install", "--link-mode", "hardlink", "--compile-bytecode",
                    "--python", str(_venv_python(tmp)), "-r", str(requirements),
                )  # fmt: skip
                if added.returncode != 0:
                    raise EnvUnavailable(
                        "the requirements of this state's repos cannot be installed: "
                        + _tail(added.stderr)
                    )
            checked = self._uv("pip", "check", "--python", str(_venv_python(tmp)))
            found = [
                ln.strip()
                for ln in (checked.stdout + "\n" + checked.stderr).splitlines()
                if ln.strip().startswith("The package ")
            ]
            (tmp / _PROBLEMS).write_text("".join(ln + "\n" for ln in sorted(found)))
            self._mark_used(tmp)
            shutil.rmtree(env, ignore_errors=True)  # a half-removed leftover of an old prune
            os.replace(tmp, env)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _stamps(self) -> list[tuple[float, Path]]:
        out = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    if not p.name.startswith(".") and (p / _LAST_USED).is_file():
                        out.append((float((p / _LAST_USED).read_text().strip()), p))
        return sorted(out)

    def _mark_used(self, env: Path) -> None:
        """Stamp ``env`` as the most recently used. The stamp is above every other env's, not
        just the clock's: two uses within one clock tick (a cached env asked for right after a
        build) or a clock stepped back by NTP must still order as they happened, or the prune
        removes the env just used."""
        newest = max((t for t, p in self._stamps() if p != env), default=0.0)
        stamp = max(time.time(), newest + 0.001)
        (env / _LAST_USED).write_text(f"{stamp:.6f}\n")

    def envs(self) -> list[Path]:
        """The complete envs, least recently used first."""
        return [p for _, p in self._stamps()]

    def size(self) -> int:
        return disk_usage([self.root])

    def prune(self, keep: Path | None = None) -> list[Path]:
        """Remove least recently used envs until the cache fits ``max_bytes``; returns them.
        ``keep`` (the env about to run) is never removed; when the envs alone cannot bring the
        cache under budget, uv's cache is pruned of what no env links to any more."""
        removed: list[Path] = []
        for env in self.envs():
            if self.size() <= self.max_bytes:
                return removed
            if env == keep:
                continue
            (env / _LAST_USED).unlink(missing_ok=True)  # no longer an env, even if cut off
            shutil.rmtree(env, ignore_errors=True)
            removed.append(env)
        if self.size() > self.max_bytes and self.uv_cache.exists():
            self._uv("cache", "prune")
        return removed
