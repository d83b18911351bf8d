"""Leak mode (``--runs-per-state K``): the same workflow queued K times in one server.

Some regressions show only run over run (a reported case grew 31 → 46 GB over 5 queued runs):
a cache that is never emptied, a model copy per run. An identical re-post executes nothing
(ComfyUI's output cache), so each later run changes one input that defeats the cache without
changing the work: the seed when the workflow has one (``seed``/``noise_seed``: a new seed is
what a user re-queueing does; the sampler and everything after it run again), else a no-op
input ``oom_bisect_run`` on every source node (a node without linked inputs). ComfyUI keeps
an undeclared input in the node's cache signature but never passes it to the node (v0.3.x to
v0.8 ``get_input_data`` drops inputs its ``INPUT_TYPES`` lacks), so the whole graph runs
again with the same values. Pure functions; the replay harness posts the prompts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["NOOP_INPUT", "SEED_INPUTS", "variation", "varied_prompt"]

SEED_INPUTS = ("seed", "noise_seed")
NOOP_INPUT = "oom_bisect_run"


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def _seeds(prompt: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for nid, node in prompt.items():
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        for name in SEED_INPUTS:
            value = (inputs or {}).get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                out.append((str(nid), name))
    return out


def _sources(prompt: Mapping[str, Any]) -> list[str]:
    out = []
    for nid, node in prompt.items():
        if not isinstance(node, Mapping):
            continue
        inputs = node.get("inputs") or {}
        if not any(_is_link(v) for v in inputs.values()):
            out.append(str(nid))
    return out


def variation(prompt: Mapping[str, Any]) -> str:
    """What changes between the runs, for the report."""
    seeds = _seeds(prompt)
    if seeds:
        named = ", ".join(f"{prompt[n].get('class_type', '?')} #{n}.{name}" for n, name in seeds)
        return f"the seed ({named}) goes up by 1 per run"
    nodes = ", ".join(f"#{n}" for n in _sources(prompt))
    return f"a no-op input '{NOOP_INPUT}' (the run's number) on the source nodes ({nodes})"


def varied_prompt(prompt: Mapping[str, Any], run: int) -> dict[str, Any]:
    """The prompt of run ``run`` (0: the workflow as it is)."""
    out = copy.deepcopy(dict(prompt))
    if run == 0:
        return out
    seeds = _seeds(out)
    if seeds:
        for nid, name in seeds:
            out[nid]["inputs"][name] = (out[nid]["inputs"][name] + run) % (2**64)
        return out
    for nid in _sources(out):
        out[nid].setdefault("inputs", {})[NOOP_INPUT] = run
    return out
