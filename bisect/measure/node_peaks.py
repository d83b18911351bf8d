"""Which node's peak rose: per-node peaks per state, and the nodes a culprit made heavier.

The replay bootstrap records every executed node's peak VRAM and RSS (``node_peaks`` of each
finished run in ``measurements.jsonl``, bisect/measure/bootstrap.py ``NodePeaks``). A culprit is a
state next to a measured parent, so comparing the two states node by node names where the
memory went: ``ImageScaleBy #2: 2.29 GiB → 3.81 GiB RAM``. Pure functions over the runs'
JSON; report.py puts the results in the steps, the culprits and the HTML chart.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from oom_sentinel.bisect.state.states import State
from oom_sentinel.daemon.core.units import format_bytes

__all__ = ["TOP_NODES", "culprit_nodes", "merge_runs", "nodes_svg", "nodes_text"]

#: how many risen nodes a culprit names
TOP_NODES = 3
_KEYS = {"vram": "peak_vram_bytes", "ram": "peak_ram_bytes"}
_LABEL = {"vram": "VRAM", "ram": "RAM"}


def merge_runs(
    runs: Iterable[tuple[State, Sequence[Mapping[str, Any]]]],
) -> dict[State, list[dict[str, Any]]]:
    """Per state, each node's highest peak over that state's runs, in first-execution order."""
    out: dict[State, dict[str, dict[str, Any]]] = {}
    for state, nodes in runs:
        merged = out.setdefault(state, {})
        for n in nodes:
            if not isinstance(n, Mapping) or "node_id" not in n:
                continue
            nid = str(n["node_id"])
            entry = merged.setdefault(
                nid,
                {
                    "node_id": nid,
                    "class_type": str(n.get("class_type") or "?"),
                    "peak_vram_bytes": None,
                    "peak_ram_bytes": None,
                    "partial": bool(n.get("partial", False)),
                },
            )
            if not n.get("partial", False):
                entry["partial"] = False
            for key in _KEYS.values():
                value = n.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    entry[key] = value if entry[key] is None else max(entry[key], value)
    return {s: list(m.values()) for s, m in out.items()}


def culprit_nodes(
    parent: Sequence[Mapping[str, Any]],
    mine: Sequence[Mapping[str, Any]],
    pool: str,
    top: int = TOP_NODES,
) -> list[dict[str, Any]]:
    """The nodes where the ``pool`` peak rose from the parent's state to the culprit's.

    A node's peak includes what earlier nodes still hold (cached outputs, loaded models), so
    every node after the one that allocates more shows the same rise. What a node adds is its
    rise beyond the largest rise of the nodes run before it: the first node to show a rise
    is where the memory came from, the later ones only carry it. Nodes are ranked by what
    they add (ties in execution order); one that adds under 5 % of the largest addition is
    not named. Nodes are matched by id (the same workflow runs in both states); a node the
    parent never reached has no ``before`` and is not compared.
    """
    key = _KEYS[pool]
    before = {str(n["node_id"]): n.get(key) for n in parent}
    rows = []
    carried = 0
    for order, n in enumerate(mine):
        nid = str(n["node_id"])
        b, a = before.get(nid), n.get(key)
        if b is None or a is None:
            continue
        rise = a - b
        added = rise - carried
        carried = max(carried, rise)
        if rise > 0 and added > 0:
            rows.append((added, order, nid, str(n.get("class_type") or "?"), b, a))
    if not rows:
        return []
    largest = max(r[0] for r in rows)
    rows = [r for r in rows if r[0] >= 0.05 * largest]
    rows.sort(key=lambda r: (-r[0], r[1]))
    return [
        {"node_id": nid, "class_type": ct, "before_bytes": b, "after_bytes": a, "pool": pool}
        for _added, _o, nid, ct, b, a in rows[:top]
    ]


def nodes_text(nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """``ImageScaleBy #2: 2.29 GiB → 3.81 GiB RAM; …`` (None: no node rose)."""
    if not nodes:
        return None
    return "; ".join(
        f"{n['class_type']} #{n['node_id']}: {format_bytes(n['before_bytes'])} → "
        f"{format_bytes(n['after_bytes'])} {_LABEL.get(str(n.get('pool')), '')}".rstrip()
        for n in nodes
    )


def nodes_svg(
    label: str,
    parent: Sequence[Mapping[str, Any]],
    mine: Sequence[Mapping[str, Any]],
    pool: str,
) -> str:
    """A per-node bar chart: each node's peak in the parent's state and in the culprit's."""
    key = _KEYS[pool]
    before = {str(n["node_id"]): n.get(key) for n in parent}
    rows = [(n, before.get(str(n["node_id"])), n.get(key)) for n in mine]
    rows = [r for r in rows if r[2] is not None]
    if not rows:
        return ""
    top = max(max(b or 0, a or 0) for _n, b, a in rows) or 1
    e = html.escape
    name_w, bar_w, row_h = 220, 420, 30
    height = 24 + row_h * len(rows)
    parts = [
        f"<svg class='nodes' width='{name_w + bar_w + 190}' height='{height}' role='img' "
        f"aria-label='{e(label)}: per-node {_LABEL[pool]} peaks'>",
        f"<text x='0' y='14' font-size='12'>{e(label)}: per-node {_LABEL[pool]} peak, "
        "parent (grey) and culprit (red)</text>",
    ]
    for i, (n, b, a) in enumerate(rows):
        a = int(a or 0)
        y = 24 + i * row_h
        name = f"{n.get('class_type') or '?'} #{n['node_id']}"
        parts.append(f"<text x='0' y='{y + 16}' font-size='12'>{e(name)}</text>")
        if b is not None:
            parts.append(
                f"<rect x='{name_w}' y='{y + 2}' width='{bar_w * b / top:.1f}' height='10' "
                "fill='#999'/>"
            )
        parts.append(
            f"<rect x='{name_w}' y='{y + 13}' width='{bar_w * a / top:.1f}' height='10' "
            "fill='#c33'/>"
        )
        text = (f"{format_bytes(b)} → " if b is not None else "") + format_bytes(a)
        parts.append(f"<text x='{name_w + bar_w + 6}' y='{y + 16}' font-size='12'>{e(text)}</text>")
    parts.append("</svg>")
    return "".join(parts)
