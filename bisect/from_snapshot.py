"""What ``oom-bisect SNAPSHOT_ID`` takes from a crash snapshot: the good and bad install
states, the prompt, the launch flags, the interpreter and the memory budget.

The daemon's snapshot holds install states as ``daemon/install_state.InstallState``
records (commits, node kinds, versions, disabled flags); the bisect works on
``bisect.states.State`` values. The mapping is ``states.state_from_install_state`` (the same
one ``before-last-update`` uses); what the core tracks under ``custom_nodes/`` is dropped when
the state is resolved against the install (``states.resolve_state``).

Where a snapshot keeps things (the daemon writes them; ``daemon/snapshot.schema.json`` and
``daemon/regression.py`` define the shapes):

* ``regression.last_good_state``: the state under which the workflow last fitted;
  ``regression.bad_state``, else ``install_state`` (the state at the crash): the bad endpoint.
* ``prompt.json`` next to ``snapshot.json``: the API prompt.
* ``process.argv`` (the flags after ``main.py``) or ``process.flags``: the launch flags.
* ``instance.path``: the install; ``install_state.interpreter.executable`` (or
  ``process.interpreter``): ComfyUI's Python.
* ``regression.budget`` {``vram_bytes``, ``ram_bytes``}: an explicit threshold; the GPU's
  total memory (``event.total_bytes``, else the snapshot's ``memory.gpus``) becomes the VRAM
  cap, so a bisect on a bigger card still runs out where the user's card did.
* ``event.pool``: which peaks the verdict watches (a VRAM OOM: VRAM; RAM, page file or an
  OOM kill: RAM).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_sentinel.bisect.states import State, state_from_install_state
from oom_sentinel.bisect.verdict import Threshold
from oom_sentinel.daemon.errors import InputError
from oom_sentinel.daemon.install_state import InstallState
from oom_sentinel.daemon.snapshot import Snapshot

__all__ = [
    "SnapshotStart",
    "flags_from_argv",
    "read_snapshot_start",
    "snapshot_state",
    "state_from_install_state",
]


@dataclass(frozen=True)
class SnapshotStart:
    """Everything a snapshot says about how to bisect it (None: the snapshot doesn't say)."""

    snapshot: Snapshot
    good: State | None
    bad: State | None
    prompt: dict[str, Any] | None
    flags: tuple[str, ...] | None
    comfyui: Path | None
    python: str | None
    budget: Threshold | None
    vram_cap_bytes: int | None
    #: the pool that ran out: "vram" or "ram" (None: unknown, watch both)
    pool: str | None = None


def _install_state(raw: Any, where: str) -> InstallState | None:
    if not isinstance(raw, Mapping):
        return None
    if "comfyui" not in raw and isinstance(raw.get("state"), Mapping):
        raw = raw["state"]
    return InstallState.from_dict(raw, where)


def snapshot_state(snapshot: Snapshot, which: str) -> State:
    """The snapshot's ``good`` or ``bad`` state, or ``crash`` (the state at the crash)."""
    data = snapshot.data
    regression = (
        regression_raw if isinstance(regression_raw := data.get("regression"), Mapping) else {}
    )
    where = f"snapshot {snapshot.id}"
    if which == "good":
        for key in ("last_good_state",):
            ist = _install_state(regression.get(key), f"{where}: regression.{key}")
            if ist is not None:
                return state_from_install_state(ist, f"{where}: regression.{key}")
        raise InputError(
            f"{where}: records no earlier good state (it is not a suspected regression); "
            "give --good yourself with oom-bisect run"
        )
    keys = (("regression", "bad_state"),) if which == "bad" else ()
    for section, key in (*keys, ("", "install_state")):
        raw = regression.get(key) if section else data.get(key)
        label = f"{section}.{key}" if section else key
        ist = _install_state(raw, f"{where}: {label}")
        if ist is not None:
            return state_from_install_state(ist, f"{where}: {label}")
    raise InputError(f"{where}: records no install state")


def flags_from_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """The words after ``main.py`` in a recorded command line (all of them if none is)."""
    words = [str(w) for w in argv]
    for i, w in enumerate(words):
        if w.replace("\\", "/").rsplit("/", 1)[-1] == "main.py":
            return tuple(words[i + 1 :])
    return ()


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def read_snapshot_start(snapshot: Snapshot) -> SnapshotStart:
    data = snapshot.data
    where = f"snapshot {snapshot.id}"
    regression = (
        regression_raw if isinstance(regression_raw := data.get("regression"), Mapping) else {}
    )
    try:
        good: State | None = snapshot_state(snapshot, "good")
    except InputError:
        if regression.get("last_good_state"):
            raise
        good = None
    try:
        bad: State | None = snapshot_state(snapshot, "bad")
    except InputError:
        bad = None
    prompt = None
    p = snapshot.path / "prompt.json"
    if p.is_file():
        try:
            loaded = json.loads(p.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{p}: cannot read the prompt: {exc}") from None
        if isinstance(loaded, dict):
            prompt = loaded
    process = process_raw if isinstance(process_raw := data.get("process"), Mapping) else {}
    flags: tuple[str, ...] | None = None
    if isinstance(process.get("argv"), list):
        flags = flags_from_argv(process["argv"])
    elif isinstance(process.get("flags"), list):
        flags = tuple(str(w) for w in process["flags"])
    instance = instance_raw if isinstance(instance_raw := data.get("instance"), Mapping) else {}
    comfyui = Path(instance["path"]) if isinstance(instance.get("path"), str) else None
    python = None
    ist = (
        install_state_raw
        if isinstance(install_state_raw := data.get("install_state"), Mapping)
        else {}
    )
    interp = (
        interpreter_raw if isinstance(interpreter_raw := ist.get("interpreter"), Mapping) else None
    )
    if interp is None and isinstance(ist.get("state"), Mapping):
        inner = ist["state"].get("interpreter")
        interp = inner if isinstance(inner, Mapping) else None
    if interp and isinstance(interp.get("executable"), str) and interp["executable"]:
        python = interp["executable"]
    elif isinstance(process.get("interpreter"), str):
        python = process["interpreter"]
    budget = None
    raw_budget = regression.get("budget")
    if isinstance(raw_budget, Mapping):
        budget = Threshold(_int(raw_budget.get("vram_bytes")), _int(raw_budget.get("ram_bytes")))
        if budget.vram_bytes is None and budget.ram_bytes is None:
            budget = None
    event = event_raw if isinstance(event_raw := data.get("event"), Mapping) else {}
    cap = (
        _int(event.get("total_bytes"))
        if event.get("pool") in ("gpu", "gpu-fragmentation")
        else None
    )
    if cap is None and event.get("pool") in ("gpu", "gpu-fragmentation"):
        memory = memory_raw if isinstance(memory_raw := data.get("memory"), Mapping) else {}
        gpus = gpus_raw if isinstance(gpus_raw := memory.get("gpus"), list) else []
        index = event.get("gpu_index") or 0
        for g in gpus:
            if isinstance(g, Mapping) and g.get("index", 0) == index:
                cap = _int(g.get("total_bytes"))
    if prompt is None and good is None and bad is None:
        raise InputError(f"{where}: holds neither a prompt nor install states to bisect")
    pool = _POOLS.get(str(event.get("pool")))
    return SnapshotStart(snapshot, good, bad, prompt, flags, comfyui, python, budget, cap, pool)


#: the snapshot's pool → the peaks a bisect of it watches
_POOLS = {
    "gpu": "vram",
    "gpu-fragmentation": "vram",
    "ram": "ram",
    "swap-pagefile": "ram",
    "killed-by-os": "ram",
}
