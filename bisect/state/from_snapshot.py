"""What ``oom-bisect SNAPSHOT_ID`` takes from a crash snapshot: the good and bad install
states, the prompt, the launch flags, the interpreter and the memory budget.

The daemon's snapshot holds install states as ``daemon/install_state.InstallState``
records (commits, node kinds, versions, disabled flags); the bisect works on
``bisect.states.State`` values. The mapping is ``states.state_from_install_state`` (the same
one ``before-last-update`` uses); what the core tracks under ``custom_nodes/`` is dropped when
the state is resolved against the install (``states.resolve_state``).

Where a snapshot keeps things (the daemon writes them; ``daemon/incidents/snapshot.schema.json`` and
``daemon/incidents/regression.py`` define the shapes):

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_sentinel.bisect.search.verdict import Threshold
from oom_sentinel.bisect.state.states import State, state_from_install_state
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.incidents.snapshot import Snapshot
from oom_sentinel.daemon.incidents.snapshot_model import InstallStateSection, flags_from_argv

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


def _state(section: InstallStateSection, where: str) -> State:
    return state_from_install_state(section.to_install_state(where), where)


def snapshot_state(snapshot: Snapshot, which: str) -> State:
    """The snapshot's ``good`` or ``bad`` state, or ``crash`` (the state at the crash)."""
    doc = snapshot.doc
    regression = doc.regression
    where = f"snapshot {snapshot.id}"
    if which == "good":
        if regression is not None and regression.last_good_state is not None:
            return _state(regression.last_good_state, f"{where}: regression.last_good_state")
        raise InputError(
            f"{where}: records no earlier good state (it is not a suspected regression); "
            "give --good yourself with oom-bisect run"
        )
    if which == "bad" and regression is not None and regression.bad_state is not None:
        return _state(regression.bad_state, f"{where}: regression.bad_state")
    if doc.install_state is not None:
        return _state(doc.install_state, f"{where}: install_state")
    raise InputError(f"{where}: records no install state")


def _read_prompt(snapshot: Snapshot) -> dict[str, Any] | None:
    """``prompt.json`` next to the snapshot (None: not captured, or not an API prompt)."""
    p = snapshot.path / "prompt.json"
    if not p.is_file():
        return None
    try:
        loaded = json.loads(p.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: cannot read the prompt: {exc}") from None
    return loaded if isinstance(loaded, dict) else None


def read_snapshot_start(snapshot: Snapshot) -> SnapshotStart:
    doc = snapshot.doc
    where = f"snapshot {snapshot.id}"
    regression = doc.regression
    good = snapshot_state(snapshot, "good") if regression and regression.last_good_state else None
    try:
        bad: State | None = snapshot_state(snapshot, "bad")
    except InputError:
        bad = None
    prompt = _read_prompt(snapshot)
    process = doc.process
    flags = process.flag_words() if process is not None else None
    comfyui = Path(doc.instance.path) if doc.instance.path else None
    ist = doc.install_state
    python = (ist.interpreter.executable if ist and ist.interpreter else None) or (
        process.interpreter if process is not None else None
    )
    budget = None
    if regression is not None and regression.budget is not None:
        budget = Threshold(
            regression.budget.vram_bytes or None, regression.budget.ram_bytes or None
        )
        if budget.vram_bytes is None and budget.ram_bytes is None:
            budget = None
    event = doc.event
    cap = None
    if event.pool in ("gpu", "gpu-fragmentation"):
        # the card that ran out: the event's figure, else the snapshot's sample of that GPU
        cap = event.total_bytes or None
        index = event.gpu_index or 0
        for g in doc.memory.gpus if cap is None and doc.memory is not None else ():
            if g.index == index:
                cap = g.total_bytes or None
    if prompt is None and good is None and bad is None:
        raise InputError(f"{where}: holds neither a prompt nor install states to bisect")
    pool = _POOLS.get(event.pool)
    return SnapshotStart(snapshot, good, bad, prompt, flags, comfyui, python, budget, cap, pool)


#: the snapshot's pool → the peaks a bisect of it watches
_POOLS = {
    "gpu": "vram",
    "gpu-fragmentation": "vram",
    "ram": "ram",
    "swap-pagefile": "ram",
    "killed-by-os": "ram",
}
