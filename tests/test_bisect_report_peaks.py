"""Peaks that say what they are (issue 10, items 1 and 4): a culprit's own Δ peak, a run that
stopped early or ran out of memory reported as a lower bound in the table, the JSON and the
chart, the chart in each range's commit order with the threshold line, and the measurement
count against the promised bound. Real git repos and a real session on disk; the measurements
come from a function, as in test_bisect_report.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bisect_git import make_install
from rich.console import Console

from oom_sentinel.bisect.measure.replay import Measurement, Peaks
from oom_sentinel.bisect.search.plan import Found
from oom_sentinel.bisect.search.verdict import Ok, Oom, Threshold
from oom_sentinel.bisect.session.files import BisectPaths, begin
from oom_sentinel.bisect.session.report import build_report, render_html, render_terminal
from oom_sentinel.bisect.session.runner import Runner
from oom_sentinel.bisect.state.states import State, scan_install

MIB = 1024 * 1024
GOOD_MIB = 2232  # 2.18 GiB
PROMPT = {"1": {"class_type": "AllocateVRAM", "inputs": {"mib": 1000}}}
NODE_A_BAD, NODE_B_BAD = 7, 5


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory):
    return make_install(tmp_path_factory.mktemp("peaks"), dirty=False)


Measure = Callable[[State, Threshold | None], Measurement]


def session_run(inst, tmp: Path, measure: Measure) -> tuple[Any, Any]:
    a, b = inst.nodes["node_a"], inst.nodes["node_b"]
    paths = BisectPaths.for_install(inst.root, home=tmp / "bisect")
    sess = begin(
        paths,
        scan_install(inst.root),
        f"node:node_a={a[0]} node:node_b={b[0]}",
        "node:node_a=HEAD node:node_b=HEAD",
        prompt=PROMPT,
    )
    return sess, Runner(sess, measure, PROMPT).run()


def two_culprits(inst, *, bad_a: Callable[[int, Threshold | None], Measurement]) -> Measure:
    """node_a from commit 7 on and node_b from commit 5 on each raise VRAM on their own."""
    a, b = inst.nodes["node_a"], inst.nodes["node_b"]

    def measure(state: State, threshold: Threshold | None) -> Measurement:
        on_a = a.index(state.node("node_a")) >= NODE_A_BAD
        on_b = b.index(state.node("node_b")) >= NODE_B_BAD
        if on_a:
            return bad_a(GOOD_MIB, threshold)
        vram = (GOOD_MIB + (800 if on_b else 0)) * MIB
        return Measurement(Ok(vram, 500 * MIB, 1.0), Peaks(nvml_vram_bytes=vram))

    return measure


def oom_at_context(_good: int, _threshold: Threshold | None) -> Measurement:
    # the OOM run's NVML peak is only the CUDA context: it died before its allocation showed
    vram = 312 * MIB
    return Measurement(
        Oom("torch.OutOfMemoryError: CUDA out of memory", "gpu", vram, 500 * MIB),
        Peaks(nvml_vram_bytes=vram),
    )


FULL_A_MIB = 1200  # what node_a's change really costs, seen only by a run to the end


def stopped_early(good: int, threshold: Threshold | None) -> Measurement:
    """Like the harness: stopped just past the threshold when there is one, else the whole
    prompt (the runner's run to the end for the culprit's Δ)."""
    if threshold is None:
        vram = (good + FULL_A_MIB) * MIB
        return Measurement(Ok(vram, 500 * MIB, 1.0), Peaks(nvml_vram_bytes=vram))
    vram = int(good * 1.1 * MIB) + 40 * MIB
    return Measurement(
        Ok(vram, 500 * MIB, stopped_early=True), Peaks(nvml_vram_bytes=vram), stopped_early=True
    )


def test_both_culprits_each_with_its_own_delta_and_the_bound(inst, tmp_path: Path) -> None:
    sess, step = session_run(inst, tmp_path, two_culprits(inst, bad_a=stopped_early))
    a, b = inst.nodes["node_a"], inst.nodes["node_b"]
    assert isinstance(step, Found)
    assert [(c.repo, c.value) for c in step.culprits] == [
        ("node:node_a", a[NODE_A_BAD]),
        ("node:node_b", b[NODE_B_BAD]),
    ]
    report = build_report(sess, step)
    ca, cb = report["culprits"]
    assert cb["delta"]["pool"] == "vram"
    assert cb["delta"]["parent_bytes"] == GOOD_MIB * MIB
    assert cb["delta"]["delta_bytes"] == 800 * MIB and not cb["delta"]["lower_bound"]
    # node_a's verdict rests on a run stopped at the threshold; its Δ on the run to the end
    (step_a,) = [
        st
        for st in report["steps"]
        if st["state"]["node:node_a"] == a[NODE_A_BAD] and st["state"]["node:node_b"] == b[0]
    ]
    assert step_a["peak_is_lower_bound"]
    assert ca["delta"]["delta_bytes"] == FULL_A_MIB * MIB and not ca["delta"]["lower_bound"]
    delta_runs = [r for r in report["runs"] if r["phase"] == "delta"]
    assert [r["state"]["node:node_a"] for r in delta_runs] == [a[NODE_A_BAD]]  # one, node_a's
    console = Console(record=True, width=160)
    render_terminal(report, console)
    text = console.export_text()
    assert "+800.00 MiB VRAM in custom_nodes/node_b's state (2.18 GiB → 2.96 GiB)" in text
    assert "+1.17 GiB VRAM in custom_nodes/node_a's state (2.18 GiB → 3.35 GiB)" in text
    sr = report["search"]
    assert sr["groups"] == [["node:node_a"], ["node:node_b"]] and sr["within_bound"]
    assert sr["measured_states"] == len(report["steps"]) <= sr["bound"]
    assert report["measurements"] == sr["measured_states"] + 1 <= sr["bound"]
    assert sr["culprit_reruns"] == 1
    assert f"{sr['measured_states']} state(s) measured + 1 culprit run(s) to the end; bound" in text
    assert f"⌈log2 {len(a) - 1}⌉+2 + ⌈log2 {len(b) - 1}⌉+2 = {sr['bound']}" in text


def test_an_oom_peak_is_a_lower_bound_everywhere_it_is_shown(inst, tmp_path: Path) -> None:
    sess, step = session_run(inst, tmp_path, two_culprits(inst, bad_a=oom_at_context))
    report = build_report(sess, step)
    steps = report["steps"]
    bad = [st for st in steps if st["outcome"] == "oom"]
    good = [st for st in steps if st["kind"] == "old"]
    assert bad and all(st["peak_is_lower_bound"] for st in bad)
    assert good and not any(st["peak_is_lower_bound"] for st in good)
    assert json.loads(json.dumps(report))["steps"][1]["peak_is_lower_bound"] is True
    console = Console(record=True, width=160)
    render_terminal(report, console)
    text = console.export_text()
    assert "≥ 312.00 MiB" in text
    # no invented Δ for a run that died before its peak showed
    assert "more than the parent's 2.18 GiB VRAM in custom_nodes/node_a's state" in text
    # the chart never draws a stopped bad run under a completed good one
    points = [p for panel in report["chart"] for p in panel["points"]]
    top_good = max(p["vram_drawn_bytes"] for p in points if p["kind"] == "old")
    for p in points:
        if p["kind"] == "new":
            assert p["vram_drawn_bytes"] >= max(top_good, report["threshold"]["vram_bytes"]), p
        if p["lower_bound"]:
            assert p["vram_bytes"] == 312 * MIB  # measured stays as measured
            # a CUDA OOM says nothing about RAM beyond what was seen: drawn as measured
            assert p["ram_drawn_bytes"] == p["ram_bytes"]
    page = render_html(report)
    assert "≥ 312.00 MiB" in page and "<svg" in page
    svg = page[page.index("<svg") : page.index("</svg>")]
    # the chart's own labels (matplotlib writes each text as a comment over its glyphs)
    assert "OOM" in svg and "≥ 312.00 MiB" in svg


def test_the_chart_shows_each_culprit_range_in_commit_order(inst, tmp_path: Path) -> None:
    sess, step = session_run(inst, tmp_path, two_culprits(inst, bad_a=stopped_early))
    report = build_report(sess, step)
    panels = report["chart"]
    by_repo = {p["repo"]: p for p in panels}
    a, b = inst.nodes["node_a"], inst.nodes["node_b"]
    assert set(by_repo) == {None, "node:node_a", "node:node_b"}
    for repo, ids, first_bad in (("node:node_a", a, NODE_A_BAD), ("node:node_b", b, NODE_B_BAD)):
        panel = by_repo[repo]
        xs = [p["x"] for p in panel["points"]]
        assert xs == sorted(xs) and xs[0] == 0 and panel["x_max"] == len(ids) - 1
        # the step where memory jumps: the last good and the first bad point are neighbours
        kinds = {p["x"]: p["kind"] for p in panel["points"]}
        assert kinds[first_bad] == "new" and kinds[first_bad - 1] == "old"
        assert all(k == "old" for x, k in kinds.items() if x < first_bad)
        assert all(k == "new" for x, k in kinds.items() if x >= first_bad)
    # node_a's culprit carries its run to the end, drawn over its stopped bar
    culprit_a = [p for p in by_repo["node:node_a"]["points"] if p["x"] == NODE_A_BAD]
    assert culprit_a[0]["vram_complete_bytes"] == (GOOD_MIB + FULL_A_MIB) * MIB
    assert culprit_a[0]["lower_bound"] and "culprit run to the end" in render_html(report)
    # the repo-level panel holds what the repo panels do not (the bad endpoint, the alone steps)
    assert by_repo[None]["points"] and panels[0]["repo"] is None
    # every tested state is drawn (the good state in both repo panels: it is both x = 0)
    shown = {p["n"] for panel in panels for p in panel["points"]}
    assert shown == {st["n"] for st in report["steps"]}
    page = render_html(report)
    assert page.count("VRAM threshold") >= 1 and "in commit order" in page
