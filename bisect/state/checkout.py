"""``oom-bisect checkout STATE --into DIR``: any state as a separate, runnable install.

Why: the way back for a user whose update broke a workflow is "run the old state", and
ComfyUI-Manager and Desktop restore *in place*, over the only working install. This builds the
state next to it instead, from the same parts the bisect measures in:

* the tree is a bisect ``Workspace`` rooted at DIR (workspace.py): ComfyUI and every git node
  are ``git clone --shared`` clones of the user's repos detached at the state's commits (no
  object copied, the user's repos only read), plain-folder nodes are copied, models are read
  in place through the generated ``extra_model_paths.yaml``, and ``user/``, ``run/input``,
  ``run/output``, ``run/temp`` are DIR's own;
* the state's package set gets a venv of its own at ``DIR/venv`` (envs.py: uv, hard-linked
  from the bisect's uv cache where DIR is on the same filesystem); a state whose set is the
  interpreter's own (or that names none) runs with the user's interpreter, which is only read;
* ``run.sh`` / ``run.bat`` start it with the state's flags on a port of its own, listening on
  127.0.0.1, with its own database file under ``user/``.

The plan (``plan_checkout``) is computed before anything is written, and ``--print`` shows it
without writing. DIR must be new (or empty) and outside the user's install. The shared clones'
one caveat is git's: if the user deletes history *and* runs ``git gc``, commits only this copy
needs can go; ``checkout.json`` records what was checked out.
"""

from __future__ import annotations

import json
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from oom_sentinel.bisect.session.fsutil import remove_tree
from oom_sentinel.bisect.state.envs import EnvCache, Lock, lock_for
from oom_sentinel.bisect.state.states import (
    ABSENT,
    DISABLED,
    INSTALLED,
    Install,
    State,
    node_key,
    repo_label,
)
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.errors import BisectError

__all__ = ["CheckoutPlan", "do_checkout", "plan_checkout"]

_MEMORY_DB = "sqlite:///:memory:"


@dataclass(frozen=True)
class CheckoutPlan:
    into: Path
    state: State
    install: Install
    #: the user's interpreter (the venv's base, or the one the launcher runs)
    python: str
    #: the state's lock when it needs a venv of its own, else None
    lock: Lock | None
    flags: tuple[str, ...]
    port: int
    models_dir: Path | None = None

    def lines(self) -> list[str]:
        """The plan in words (``--print``)."""
        s = self.state
        out = [f"a separate install of this state at {self.into}:"]
        out.append(
            f"  ComfyUI                 shared clone of {self.install.comfyui} at {s.comfyui}"
        )
        names = sorted({n.name for n in self.install.nodes} | {n for n, _ in s.nodes})
        for name in names:
            value = s.node(name)
            src = self.install.node(name)
            label = repo_label(node_key(name))
            if value == ABSENT:
                out.append(f"  {label:<22}  left out (absent in this state)")
            elif value == DISABLED:
                out.append(f"  {label:<22}  disabled (kept aside, not loaded)")
            elif src is not None and src.kind == "git":
                out.append(f"  {label:<22}  shared clone of {src.path} at {value}")
            else:
                where = src.path if src is not None else "?"
                out.append(f"  {label:<22}  copied from {where} ({value})")
        if self.lock is not None:
            pins = sum(not line.startswith("-") for line in self.lock.lines)
            out.append(
                f"  packages                {self.into / 'venv'}: {pins} package(s) of the state, "
                f"built by uv on {self.python}"
            )
        else:
            out.append(
                f"  packages                the interpreter's own ({self.python}), only read"
            )
        out.append(
            f"  models                  {self.models_dir or self.install.comfyui / 'models'}, read in place (extra_model_paths.yaml)"
        )
        out.append(f"  user, input, output     {self.into}/user, {self.into}/run/…: its own")
        flags = " ".join(map(shlex.quote, self.flags)) or "(none)"
        out.append(
            f"  launcher                {self.into / 'run.sh'} (and run.bat): port {self.port}, flags {flags}"
        )
        out.append(f"  the live install at {self.install.comfyui} is only read")
        return out


def plan_checkout(
    into: Path,
    state: State,
    install: Install,
    python: str,
    *,
    flags: tuple[str, ...] = (),
    port: int,
    models_dir: Path | None = None,
) -> CheckoutPlan:
    """Check what can be checked before writing: DIR new and outside the install, every node
    of the state available."""
    into = into.expanduser().resolve()
    live = install.comfyui.resolve()
    if into == live or live in into.parents or into in live.parents:
        raise BisectError(f"--into {into}: must be outside the install at {live} (and not hold it)")
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise BisectError(f"--into {into}: exists and is not an empty folder")
    for name, value in state.nodes:
        src = install.node(name)
        if src is None:
            raise BisectError(f"custom_nodes/{name}: not in {install.custom_nodes}, cannot copy it")
        if src.kind != "git" and value not in (INSTALLED, DISABLED) and value != src.value():
            raise BisectError(
                f"custom_nodes/{name}: {value} is not available, only the installed copy "
                f"({src.value()})"
            )
    lock = None
    if state.packages:
        own = lock_for(install.packages) if install.packages else None
        candidate = lock_for(state.packages)
        if own is None or candidate.digest() != own.digest():
            lock = candidate
    return CheckoutPlan(into, state, install, python, lock, tuple(flags), port, models_dir)


def do_checkout(plan: CheckoutPlan, envs: EnvCache) -> Path:
    """Build the install the plan describes; returns the launcher (``run.sh``/``run.bat``).
    Raises EnvUnavailable when the state's packages cannot be installed (nothing runnable
    is claimed then) and BisectError for a clone or checkout that fails."""
    from oom_sentinel.bisect.measure.workspace import Workspace

    into = plan.into
    into.mkdir(parents=True, exist_ok=True)
    try:
        ws = Workspace.create(into, plan.install, models_dir=plan.models_dir)
        ws.switch(plan.state)
        python = plan.python
        if plan.lock is not None:
            python = str(envs.build_at(plan.lock, into / "venv"))
    except BaseException:
        remove_tree(into)  # new or empty before: a half-built install is no install
        raise
    spec = ws.launch(plan.flags, port=plan.port)
    args = list(spec.args)
    if _MEMORY_DB in args:  # the bisect's throwaway database; an install keeps its own
        args[args.index(_MEMORY_DB)] = "sqlite:///" + str(ws.user_dir / "comfyui.db")
    argv = [python, str(spec.main_py), *args]
    sh = into / "run.sh"
    write_text_atomic(
        sh,
        "#!/bin/sh\n# written by oom-bisect checkout: this state, separate from the live install\n"
        f'cd {shlex.quote(str(spec.cwd))} || exit 1\nexec {shlex.join(argv)} "$@"\n',
    )
    sh.chmod(sh.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    write_text_atomic(
        into / "run.bat",
        "@echo off\r\nrem written by oom-bisect checkout\r\n"
        f'cd /d "{spec.cwd}"\r\n' + " ".join(_bat_quote(a) for a in argv) + " %*\r\n",
    )
    meta = {
        "state": plan.state.to_json(),
        "install": str(plan.install.comfyui),
        "python": python,
        "port": plan.port,
        "flags": list(plan.flags),
        "dropped_flags": [list(d) for d in spec.dropped],
    }
    write_text_atomic(into / "checkout.json", json.dumps(meta, indent=2) + "\n")
    return into / ("run.bat" if sys.platform == "win32" else "run.sh")


def _bat_quote(word: str) -> str:
    return f'"{word}"' if any(c in word for c in ' \t&|<>^"') or not word else word
