"""What a bisect found, and the evidence, for a terminal, for scripts and for a bug report.

One record, three renderings: ``build_report`` gathers the answer (from the plan's final
step), every verdict of the log, every measurement of ``measurements.jsonl`` and the culprit
commits' details (subject, author, date, files, a GitHub link when the remote is GitHub);
``render_terminal`` draws it with rich, ``report.json`` is the record itself, and
``render_html`` is one self-contained page with a chart of the peak memory of every tested
state (matplotlib with the Agg backend, embedded as inline SVG, so the page needs no network
and no second file).

When the bisect started from a crash snapshot the reports are attached to it: a ``bisect/``
folder inside the snapshot directory, assembled under a temporary name and renamed into
place, so it is whole or absent. The snapshot's own files are never touched; a second
attachment goes to ``bisect-2/`` and so on.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import html
import io
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from oom_sentinel.bisect.measure.leak import variation
from oom_sentinel.bisect.measure.node_peaks import culprit_nodes, merge_runs, nodes_svg, nodes_text
from oom_sentinel.bisect.search.plan import (
    Culprit,
    Error,
    Found,
    OnlySkippedLeft,
    Step,
    Test,
    rounds_bound,
)
from oom_sentinel.bisect.search.verdict import Oom, Skip, Timeout, Verdict
from oom_sentinel.bisect.session.files import LogRecord, Session, outcome_from_json
from oom_sentinel.bisect.session.fsutil import remove_tree
from oom_sentinel.bisect.session.runner import (
    DELTA_PHASE,
    HISTORY_PHASE,
    ROUND_EVENT,
    SANDWICH_PHASE,
    effective_threshold,
    read_measurements,
)
from oom_sentinel.bisect.state import gitrepo
from oom_sentinel.bisect.state.states import (
    ABSENT,
    CORE,
    DISABLED,
    INSTALLED,
    State,
    is_package,
    repo_label,
)
from oom_sentinel.daemon.core.atomic import fsync_dir, write_bytes_atomic
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.core.gitread import worktree_remote_urls
from oom_sentinel.daemon.core.units import MIB, format_bytes
from oom_sentinel.daemon.incidents.bisect_report_model import REPORT_FORMAT, BisectReport
from oom_sentinel.daemon.incidents.snapshot_model import validation_problem

__all__ = [
    "REPORT_FORMAT",
    "RESULT_AMBIGUOUS",
    "RESULT_ERROR",
    "RESULT_FOUND",
    "RESULT_IN_PROGRESS",
    "RESULT_NOT_REPRODUCED",
    "attach_to_snapshot",
    "build_report",
    "chart_panels",
    "culprit_delta",
    "culprit_details",
    "delta_text",
    "github_commit_url",
    "peak_text",
    "render_html",
    "render_terminal",
    "result_of",
    "search_line",
    "write_reports",
]

RESULT_FOUND = "found"
RESULT_AMBIGUOUS = "ambiguous"
RESULT_NOT_REPRODUCED = "not-reproduced"
RESULT_ERROR = "error"
RESULT_IN_PROGRESS = "in-progress"


def result_of(step: Step) -> str:
    """The ``result`` word of a final step (see the README's exit statuses)."""
    if isinstance(step, Found):
        return RESULT_FOUND
    if isinstance(step, OnlySkippedLeft):
        return RESULT_AMBIGUOUS
    if isinstance(step, Error):
        return RESULT_NOT_REPRODUCED if step.result == "not-reproduced" else RESULT_ERROR
    return RESULT_IN_PROGRESS


def github_commit_url(remote_urls: Sequence[str], sha: str) -> str | None:
    """``https://github.com/OWNER/REPO/commit/SHA`` for the first GitHub remote, else None:
    any spelling the project's one normaliser (``install_state.normalize_remote_url``) reads
    as GitHub's -- HTTPS, SSH, ``ssh://``, ``git://``, ``.git``, credentials (dropped)."""
    from oom_sentinel.daemon.install.state import normalize_remote_url

    for url in remote_urls:
        normalized = normalize_remote_url(url) or ""
        owner_repo = normalized.removeprefix("https://github.com/")
        if owner_repo != normalized and owner_repo.count("/") == 1:
            return f"https://github.com/{owner_repo}/commit/{sha}"
    return None


def _value_phrase(repo: str, value: str, previous: str) -> str:
    label = repo_label(repo)
    if is_package(repo) and ABSENT not in (value, previous):
        return f"{label} {previous} → {value}"
    if value == ABSENT:
        return f"{label} was removed"
    if value == DISABLED:
        return f"{label} was disabled"
    if previous in (ABSENT, DISABLED):
        how = "installed" if previous == ABSENT else "enabled"
        return f"{label} was {how} ({value})"
    if value == INSTALLED:
        return f"{label} changed (installed copy)"
    return f"{label} changed to {value}"


def culprit_details(c: Culprit, repo_paths: Mapping[str, str]) -> dict[str, Any]:
    """A culprit with what git knows about it (nothing when the value is not a commit)."""
    out: dict[str, Any] = {
        "repo": c.repo,
        "label": repo_label(c.repo),
        "commit": c.value,
        "previous": c.previous,
        "subject": None,
        "author": None,
        "date": None,
        "files": [],
        "url": None,
    }
    path = repo_paths.get(c.repo)
    if path and gitrepo.is_commit_id(c.value):
        with contextlib.suppress(SentinelError):
            info = gitrepo.commit_info(Path(path), c.value, repo_label(c.repo))
            out.update(
                subject=info.subject, author=info.author, date=info.date, files=list(info.files)
            )
        with contextlib.suppress(SentinelError):
            out["url"] = github_commit_url(worktree_remote_urls(Path(path)), c.value)
    if out["subject"] is None:
        out["subject"] = _value_phrase(c.repo, c.value, c.previous)
    return out


def _step_json(
    n: int,
    rec: LogRecord,
    session: Session,
    node_peaks: Mapping[State, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    s = session.setup
    return {
        "n": n,
        "verdict": s.terms.word(rec.verdict),
        "kind": rec.verdict.value,
        "state": {r: rec.state.value(r) for r in s.repos()},
        "outcome": rec.outcome,
        "peak_vram_bytes": rec.peak_vram_bytes,
        "peak_ram_bytes": rec.peak_ram_bytes,
        "runs": rec.runs,
        "reason": rec.reason,
        "comment": rec.comment,
        "peak_is_lower_bound": rec.peak_lower_bound,
        # each node's peak in this state's runs (bisect/measure/node_peaks.py)
        "node_peaks": [dict(x) for x in (node_peaks or {}).get(rec.state, [])],
    }


def parallel_figures(session: Session, groups: Sequence[Sequence[str]]) -> dict[str, Any] | None:
    """``--parallel``: the rounds the culprit ranges took against ⌈log_{N+1} M⌉ per culprit
    repo (and ⌈log2 M⌉, one at a time); None when no round ran."""
    rounds = [m for m in read_measurements(session.paths.session) if m.event == ROUND_EVENT]
    if not rounds:
        return None
    width = max(int(m.data.get("width") or 1) for m in rounds)
    spans = {sp.repo: sp for sp in session.setup.spans}
    sizes = [len(spans[r].commits) for g in groups for r in g]
    round_bound = sum(rounds_bound(n, width) for n in sizes)
    return {
        "width": width,
        "rounds": len(rounds),
        "measurements": sum(len(m.data.get("states") or ()) for m in rounds),
        "round_bound": round_bound,
        "serial_bound": sum(rounds_bound(n, 1) for n in sizes),
        # each round measures up to width states; the repo-level steps and the +2 as before
        "measurement_bound": session.progress().repo_level
        + sum(width * rounds_bound(n, width) + 2 for n in sizes),
    }


def _confidence(d: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "word": d.get("confidence"),
        "repeats": d.get("repeats"),
        "spread_bytes": d.get("spread_bytes") or {},
        "margin_bytes": d.get("margin_bytes") or {},
    }


def _attach_confidence(
    steps: list[dict[str, Any]], records: Sequence[LogRecord], session: Session
) -> list[dict[str, Any]]:
    """Each step's ``confidence`` (``--repeat auto``: SAME/DIFFERENT/UNKNOWN, the repeats and
    the spread behind it; None for a manual mark or a fixed ``--repeat``), and the sandwich
    re-checks as a list. A verdict line of ``measurements.jsonl`` belongs to the first
    record of its state and verdict not yet matched, in order."""
    lines = [m for m in read_measurements(session.paths.session) if m.event == "verdict"]
    used: set[int] = set()
    for st, rec in zip(steps, records, strict=True):
        st["confidence"] = None
        for i, m in enumerate(lines):
            if i in used or m.state != rec.state or m.data.get("verdict") != rec.verdict.value:
                continue
            used.add(i)
            st["confidence"] = _confidence(m.data)
            break
    repos = session.setup.repos()
    return [
        {
            "state": {r: m.state.value(r) for r in repos},
            "repo": m.data.get("repo"),
            "verdict": m.data.get("verdict"),
            **_confidence(m.data),
        }
        for m in lines
        if m.phase == SANDWICH_PHASE
    ]


def confidence_text(c: Mapping[str, Any] | None) -> str:
    """ "same ×3 ±6.0 MiB": the word, the runs and the widest spread behind a verdict."""
    if not c or not c.get("word"):
        return ""
    spreads = [v for v in (c.get("spread_bytes") or {}).values()]
    if "inf" in spreads:
        spread = " (an OOM among them)"
    else:
        widest = max((int(v) for v in spreads), default=0)
        spread = f" ±{format_bytes(widest)}" if widest else ""
    return f"{c['word']} ×{c['repeats']}{spread}"


def peak_text(value: int | None, lower_bound: bool, unknown: str = "—") -> str:
    """A peak as the table and the chart print it: ``≥ 3.94 GiB`` when the run stopped before
    the prompt finished (an OOM, an early stop at the threshold), so it is what the run had
    reached, not what the state needs."""
    text = format_bytes(value, unknown)
    return f"≥ {text}" if lower_bound and value is not None else text


_POOLS = (("vram", "peak_vram_bytes", "VRAM"), ("ram", "peak_ram_bytes", "RAM"))


def culprit_delta(
    c: Culprit,
    records: Sequence[LogRecord],
    threshold: Mapping[str, Any] | None,
    complete: Mapping[State, LogRecord] | None = None,
) -> dict[str, Any] | None:
    """The culprit's own Δ peak: its parent state's peak and its own, per pool.

    Both states were measured (the plan bisects to a measured bad state next to a measured
    good one). The culprit's own peak comes from its run to the end (``complete``: the
    runner's "delta" phase) when there is one, else from its verdict, which may be a lower
    bound. ``pool`` names the headline: the pool whose threshold the culprit's state
    crossed, else VRAM when measured, else RAM.
    """
    if c.state is None or c.parent is None:
        return None
    latest = {r.state: r for r in records}  # the latest verdict on a state wins
    mine, parent = latest.get(c.state), latest.get(c.parent)
    if mine is None or parent is None:
        return None
    if complete and c.state in complete:
        mine = complete[c.state]
    pools: dict[str, Any] = {}
    for pool, key, _label in _POOLS:
        before, after = getattr(parent, key), getattr(mine, key)
        if before is None or after is None:
            continue
        pools[pool] = {
            "parent_bytes": before,
            "bytes": after,
            "delta_bytes": after - before,
            "lower_bound": mine.peak_lower_bound,
        }
    if not pools:
        return None
    thr = threshold or {}
    crossed = [
        p
        for p, _key, _label in _POOLS
        if p in pools
        and thr.get(f"{p}_bytes") is not None
        and pools[p]["bytes"] > thr[f"{p}_bytes"]
    ]
    headline = crossed[0] if crossed else ("vram" if "vram" in pools else "ram")
    return {"pool": headline, **pools[headline], "pools": pools}


def delta_text(c: Mapping[str, Any]) -> str | None:
    """``+1.52 GiB VRAM in custom_nodes/X's state (2.18 GiB → 3.70 GiB)``; ``≥ +…`` when the
    culprit's run stopped early, and no invented number when it stopped below its parent
    (an OOM that died before its peak: the state needs more than the parent, by how much is
    unknown)."""
    d = c.get("delta")
    if not d:
        return None
    label = {p: lab for p, _k, lab in _POOLS}[d["pool"]]
    where = f"{label} in {c['label']}'s state"
    parent = format_bytes(d["parent_bytes"])
    mine = peak_text(d["bytes"], d["lower_bound"])
    if d["lower_bound"] and d["delta_bytes"] <= 0:
        return f"more than the parent's {parent} {where} (its run stopped at {mine})"
    sign = "+" if d["delta_bytes"] >= 0 else "-"
    amount = format_bytes(abs(d["delta_bytes"]))
    at_least = "≥ " if d["lower_bound"] else ""
    return f"{at_least}{sign}{amount} {where} ({parent} → {mine})"


def _complete_runs(session: Session) -> dict[State, LogRecord]:
    """Each culprit's run to the end (the runner's "delta" phase), as a record of its peaks."""
    out: dict[State, LogRecord] = {}
    for m in read_measurements(session.paths.session):
        if m.event != "done" or m.phase not in (DELTA_PHASE, SANDWICH_PHASE):
            continue
        if m.phase == SANDWICH_PHASE and not m.data.get("to_end"):
            continue  # a parent's re-check, which may stop at the threshold
        try:
            outcome = outcome_from_json(m.data.get("outcome") or {})
        except ValueError:
            continue
        if isinstance(outcome, Skip):
            continue
        partial = isinstance(outcome, Oom | Timeout) or bool(m.data.get("stopped_early"))
        out[m.state] = LogRecord(
            Verdict.NEW,
            m.state,
            peak_vram_bytes=outcome.peak_vram_bytes,
            peak_ram_bytes=outcome.peak_ram_bytes,
            peak_lower_bound=partial,
        )
    return out


def build_report(session: Session, step: Step, *, message: str | None = None) -> dict[str, Any]:
    """The whole report as JSON-ready data (what ``report.json`` holds)."""
    s = session.setup
    status = session.status()
    records = list(status.records)
    measured = read_measurements(session.paths.session)
    node_peaks = merge_runs(
        (m.state, m.data.get("node_peaks") or []) for m in measured if m.event == "done"
    )
    # a culprit's run to the end has every node; its early-stopped run may lack the last ones
    node_peaks_complete = merge_runs(
        (m.state, m.data.get("node_peaks") or [])
        for m in measured
        if m.event == "done" and m.phase == DELTA_PHASE
    )
    steps = [_step_json(i, r, session, node_peaks) for i, r in enumerate(records, 1)]
    rechecks = _attach_confidence(steps, records, session)
    culprits: list[dict[str, Any]] = []
    candidates: list[dict[str, Any]] = []
    thr = effective_threshold(session)
    thr_json = None if thr is None else {"vram_bytes": thr.vram_bytes, "ram_bytes": thr.ram_bytes}

    complete = _complete_runs(session)

    def detail(c: Culprit) -> dict[str, Any]:
        out = culprit_details(c, s.repo_paths)
        out["together"] = list(c.together)
        out["delta"] = culprit_delta(c, records, thr_json, complete)
        # the human line too: the daemon shows it in `snapshots show` and the follow-up
        # alert without importing the bisect (daemon/incidents/bisect_results.py)
        out["delta_text"] = delta_text(out)
        pool = (out["delta"] or {}).get("pool") or "vram"
        parent = node_peaks.get(c.parent, []) if c.parent is not None else []
        mine = (node_peaks_complete.get(c.state) or node_peaks.get(c.state, [])) if c.state else []
        out["nodes"] = culprit_nodes(parent, mine, pool)
        if not out["nodes"] and pool == "vram":  # no node's VRAM rose: say where RAM did
            out["nodes"] = culprit_nodes(parent, mine, "ram")
        out["nodes_text"] = nodes_text(out["nodes"])
        out["allocator_history"] = _culprit_history(c.state, measured)
        out["history_text"] = history_text(out["allocator_history"])
        out["nodes_chart"] = {
            "pool": (out["nodes"][0]["pool"] if out["nodes"] else pool),
            "parent": [dict(x) for x in parent],
            "culprit": [dict(x) for x in mine],
        }
        return out

    if isinstance(step, Found):
        culprits = [detail(c) for c in step.culprits]
    elif isinstance(step, OnlySkippedLeft):
        culprits = [detail(c) for c in step.culprits]
        candidates = [culprit_details(c, s.repo_paths) for c in step.candidates]
    if isinstance(step, Error):
        message = message or step.message
    runs = []
    launches = 0
    for m in read_measurements(session.paths.session):
        if m.event == "launch":
            launches += 1
            continue
        if m.event != "done":
            continue
        d = m.data
        outcome = d.get("outcome") or {}
        runs.append(
            {
                "state": {r: m.state.value(r) for r in s.repos()},
                "phase": m.phase,
                "outcome": outcome.get("kind"),
                "reason": outcome.get("reason") or outcome.get("evidence"),
                "peaks": d.get("peaks") or {},
                "timings": d.get("timings") or {},
                "stopped_early": d.get("stopped_early", False),
                "exit_code": d.get("exit_code"),
                "console_tail": d.get("console_tail") or [],
                "allocator_history": d.get("allocator_history"),
                "dropped_flags": d.get("dropped_flags") or [],
                "notes": d.get("notes") or [],
                # leak mode: the running peaks after each queued run
                "run_peaks": d.get("run_peaks") or [],
            }
        )
    prog = status.progress
    reruns = sum(1 for r in runs if r["phase"] == DELTA_PHASE)
    parallel = parallel_figures(session, prog.groups)
    ceiling = prog.bound if parallel is None else parallel["measurement_bound"]
    search = {
        "measured_states": prog.tested,
        "culprit_reruns": reruns,
        "repo_level_steps": prog.repo_level,
        "bound": prog.bound,
        "groups": [list(g) for g in prog.groups],
        "within_bound": prog.tested + reruns <= ceiling,
        "parallel": parallel,
        # native-allocator replays for a culprit's allocator history (outside the bound)
        "history_runs": sum(1 for r in runs if r["phase"] == HISTORY_PHASE),
    }
    return {
        "format": REPORT_FORMAT,
        "tool": "oom-bisect",
        "generated": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
        "install": s.install,
        "source": s.source,
        "result": result_of(step),
        "message": message,
        "terms": {"old": s.terms.old, "new": s.terms.new},
        "threshold": thr_json,
        "explicit_budget": s.budget is not None,
        "pool": s.extra.get("pool") or "any",
        "repeat": "auto" if s.adaptive else s.repeat,
        "max_repeat": s.max_repeat if s.adaptive else None,
        "rechecks": rechecks,
        "runs_per_state": int(s.extra.get("runs_per_state") or 1),
        "leak_variation": _leak_variation(session),
        "workflow_sha256": s.workflow_sha256,
        "flags": list(s.flags),
        "repos": [
            {
                "repo": sp.repo,
                "label": repo_label(sp.repo),
                "good": sp.good,
                "bad": sp.bad,
                "candidates": len(sp.commits),
            }
            for sp in s.spans
        ],
        "culprits": culprits,
        "candidates": candidates,
        "search": search,
        "chart": chart_panels(session, step, steps, thr_json, complete),
        "measurements": len(runs),
        "launches": launches,
        "steps": steps,
        "skipped": [st for st in steps if st["kind"] == Verdict.SKIP.value],
        "runs": runs,
        "next": None if not isinstance(step, Test) else {r: step.state.value(r) for r in s.repos()},
    }


def _culprit_history(state: State | None, measured: Sequence[Any]) -> dict[str, Any] | None:
    """Where the culprit's allocator history is: its own OOM run's, else the native-allocator
    replay's (``--history-with-native-allocator``, marked), else why there is none."""
    if state is None:
        return None
    runs = [m for m in measured if m.event == "done" and m.state == state]
    for m in runs:
        if m.phase != HISTORY_PHASE and m.data.get("allocator_history"):
            return {"path": m.data["allocator_history"], "native_allocator_replay": False}
    for m in runs:
        if m.phase == HISTORY_PHASE and m.data.get("allocator_history"):
            return {"path": m.data["allocator_history"], "native_allocator_replay": True}
    for m in runs:
        refused = (m.data.get("torch") or {}).get("history_refused")
        if refused and (m.data.get("outcome") or {}).get("kind") == "oom":
            return {"path": None, "refused": refused}
    return None


def history_text(h: Mapping[str, Any] | None) -> str | None:
    """The culprit's allocator-history line, saying when it comes from another allocator."""
    if not h:
        return None
    if h.get("path") and h.get("native_allocator_replay"):
        return (
            f"allocator history: {h['path']} (from a replay with --disable-cuda-malloc, for "
            "the history only: torch's native allocator, not the measured cudaMallocAsync)"
        )
    if h.get("path"):
        return f"allocator history: {h['path']} (open it at pytorch.org/memory_viz)"
    return (
        f"allocator history: none, torch's {h.get('refused')} backend (ComfyUI's default) "
        "cannot record it; --history-with-native-allocator replays the OOM with "
        "--disable-cuda-malloc for it"
    )


def _leak_variation(session: Session) -> str | None:
    """Leak mode: what changes between the queued runs (bisect/measure/leak.py), else None."""
    if int(session.setup.extra.get("runs_per_state") or 1) <= 1:
        return None
    prompt = session.prompt()
    return None if prompt is None else variation(prompt)


def leak_line(report: Mapping[str, Any]) -> str | None:
    """``leak mode: each state queued 3 times in one server (…); the peak is after all 3``."""
    k = int(report.get("runs_per_state") or 1)
    if k <= 1:
        return None
    why = report.get("leak_variation") or "a varied input"
    return (
        f"leak mode: each state queued {k} times in one server ({why}, so ComfyUI's cache "
        f"cannot skip a run); its peak is the highest over all {k} runs"
    )


# --------------------------------------------------------------------------- terminal


def _short(value: str) -> str:
    return value[:10] if gitrepo.is_commit_id(value) else value


def _state_text(state: Mapping[str, str]) -> str:
    return " ".join(
        f"{'core' if r == CORE else r.split(':', 1)[1]}={_short(v)}" for r, v in state.items()
    )


_STYLE = {"old": "green", "new": "red", "skip": "yellow"}


def _runs_cell(st: Mapping[str, Any]) -> str:
    return confidence_text(st.get("confidence")) or ("" if st["runs"] is None else str(st["runs"]))


def recheck_lines(report: Mapping[str, Any]) -> list[str]:
    """The sandwich: each culprit and its parent measured once more before it was named."""
    out = []
    for r in report.get("rechecks") or []:
        state = _state_text(r["state"])
        out.append(f"re-checked before naming the culprit: {state}: {confidence_text(r)}")
    return out


def render_terminal(report: Mapping[str, Any], console: Console) -> None:
    """The steps table and the answer, drawn with rich."""
    table = Table(title="Tested states", show_lines=False, expand=False)
    columns: tuple[tuple[str, dict[str, Any]], ...] = (
        ("#", {"justify": "right"}),
        ("verdict", {}),
        ("state", {}),
        ("peak VRAM", {"justify": "right"}),
        ("peak RAM", {"justify": "right"}),
        ("runs", {"justify": "right"}),
        ("note", {"overflow": "fold"}),
    )
    for col, kw in columns:
        table.add_column(col, **kw)
    for st in report["steps"]:
        note = st["reason"] or st["comment"] or ""
        table.add_row(
            str(st["n"]),
            Text(st["verdict"], style=_STYLE.get(st["kind"], "")),
            _state_text(st["state"]),
            peak_text(st["peak_vram_bytes"], st["peak_is_lower_bound"]),
            peak_text(st["peak_ram_bytes"], st["peak_is_lower_bound"]),
            _runs_cell(st),
            note[:90],
        )
    console.print(table)
    for line in recheck_lines(report):
        console.print(line, highlight=False)
    thr = report.get("threshold")
    if thr:
        parts = [
            f"{pool} > {format_bytes(thr[key])}"
            for pool, key in (("VRAM", "vram_bytes"), ("RAM", "ram_bytes"))
            if thr.get(key) is not None
        ]
        if parts:
            console.print(f"{report['terms']['new']} = out of memory or " + " or ".join(parts))
    result = report["result"]
    lines: list[str] = []
    if result == RESULT_FOUND:
        n = len(report["culprits"])
        title = "first bad commit" if n == 1 else f"{n} culprits"
        for c in report["culprits"]:
            if lines:
                lines.append("")
            lines += _culprit_lines(c)
        console.print(Panel("\n".join(lines), title=title, border_style="red"))
    elif result == RESULT_AMBIGUOUS:
        lines.append("only skipped commits are left; the first bad commit could be any of:")
        for c in report["candidates"]:
            lines.append(f"  {c['label']} {_short(c['commit'])}  {c['subject']}")
        for c in report["culprits"]:
            lines.append("resolved: " + f"{c['label']} {_short(c['commit'])}  {c['subject']}")
        console.print(Panel("\n".join(lines), title="ambiguous", border_style="yellow"))
    elif result in (RESULT_NOT_REPRODUCED, RESULT_ERROR):
        console.print(Panel(report.get("message") or result, title=result, border_style="yellow"))
    console.print(
        f"{report['measurements']} measurement(s), {len(report['steps'])} state(s) tested, "
        f"{len(report['skipped'])} skipped"
    )
    searched = search_line(report)
    if searched:
        console.print(searched)
    leak = leak_line(report)
    if leak:
        console.print(leak)


def search_line(report: Mapping[str, Any]) -> str | None:
    """The measurement count against the ceiling the search promises, in one line."""
    sr = report.get("search")
    if not sr or report.get("result") not in (RESULT_FOUND, RESULT_AMBIGUOUS):
        return None
    repos = {r["repo"]: r["candidates"] for r in report["repos"]}
    terms = [f"⌈log2 {repos[r]}⌉+2" for g in sr["groups"] for r in g]
    over = "" if sr["within_bound"] else " (over it: skipped states cost extra)"
    reruns = sr.get("culprit_reruns") or 0
    counted = f"{sr['measured_states']} state(s) measured"
    if reruns:
        counted += f" + {reruns} culprit run(s) to the end"
    par = sr.get("parallel")
    if par:
        k = par["width"] + 1
        return (
            f"{counted}; --parallel {par['width']}: {par['rounds']} round(s) of up to "
            f"{par['width']} in the culprit range(s), {par['measurements']} measurement(s) "
            f"(bound Σ⌈log{k} M⌉ = {par['round_bound']} round(s); one at a time "
            f"Σ⌈log2 M⌉ = {par['serial_bound']}){over}"
        )
    return (
        f"{counted}; bound {sr['repo_level_steps']} repo-level step(s) + "
        f"{' + '.join(terms) or '0'} = {sr['bound']}{over}"
    )


def _culprit_lines(c: Mapping[str, Any]) -> list[str]:
    lines = [f"{c['label']} {c['commit']}", f"  {c['subject']}"]
    delta = delta_text(c)
    if delta:
        lines.append(f"  {delta}")
    if c.get("nodes_text"):
        lines.append(f"  nodes: {c['nodes_text']}")
    if c.get("history_text"):
        lines.append(f"  {c['history_text']}")
    if c.get("together"):
        lines.append(
            "  crosses the threshold only together with "
            + ", ".join(repo_label(r) for r in c["together"])
        )
    if c.get("author"):
        lines.append(f"  {c['author']}, {c['date']}")
    if c.get("files"):
        shown = ", ".join(c["files"][:8]) + (" …" if len(c["files"]) > 8 else "")
        lines.append(f"  files: {shown}")
    if c.get("url"):
        lines.append(f"  {c['url']}")
    return lines


# --------------------------------------------------------------------------- HTML


def _state_key(state: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(state.items()))


_GPU_OOM_RE = re.compile(r"CUDA|HIP|GPU|VRAM|MPS|XPU")


def _known_above(
    st: Mapping[str, Any], pool: str, value: int | None, thr: Mapping[str, Any]
) -> bool:
    """Whether a bad lower-bound run is known to have needed more than the threshold in
    ``pool``: the pool it ran out of (an OOM names it), or the one whose threshold its
    running peak crossed when it was stopped. Only there is it drawn at least that high."""
    if not st["peak_is_lower_bound"] or st["kind"] != Verdict.NEW.value:
        return False
    if st["outcome"] == "oom":
        gpu = bool(_GPU_OOM_RE.search(st.get("reason") or ""))
        return pool == ("vram" if gpu else "ram")
    limit = thr.get(f"{pool}_bytes")
    return value is not None and limit is not None and value > limit


def chart_panels(
    session: Session,
    step: Step,
    steps: Sequence[Mapping[str, Any]],
    threshold: Mapping[str, Any] | None,
    complete: Mapping[State, LogRecord] | None = None,
) -> list[dict[str, Any]]:
    """What the chart draws, as data: one panel per bisected repo with its tested states in
    the range's commit order (x = position from G's value, 0, to B's value), and a first
    panel for the repo-level steps (endpoints, minimisation) that no repo panel shows.

    Each point carries the measured peaks and the *drawn* ones: a bad run whose peak is a
    lower bound (an OOM, an early stop) is drawn at least as high as the threshold and as
    every completed good run of that pool, so a stopped bad run never looks smaller than a
    good one (its real peak is higher than it got to). A culprit's run to the end
    (``complete``) adds its full peak to the culprit's point (``*_complete_bytes``).
    """
    s = session.setup
    spans = {sp.repo: sp for sp in s.spans}
    by_state: dict[tuple[tuple[str, str], ...], Mapping[str, Any]] = {}
    for st in steps:
        by_state[_state_key(st["state"])] = st  # the latest verdict on a state wins
    thr = threshold or {}
    floor: dict[str, int] = {}
    for pool, key, _label in _POOLS:
        known = [
            st[key]
            for st in steps
            if st["kind"] == Verdict.OLD.value and not st["peak_is_lower_bound"] and st[key]
        ]
        if thr.get(f"{pool}_bytes") is not None:
            known.append(thr[f"{pool}_bytes"])
        floor[pool] = max(known, default=0)

    def point(x: int, label: str, st: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "x": x,
            "label": label,
            "n": st["n"],
            "kind": st["kind"],
            "outcome": st["outcome"],
            "lower_bound": st["peak_is_lower_bound"],
        }
        for pool, key, _label in _POOLS:
            value = st[key]
            drawn = value
            if _known_above(st, pool, value, thr) and floor[pool]:
                drawn = max(value or 0, floor[pool])
            out[f"{pool}_bytes"] = value
            out[f"{pool}_drawn_bytes"] = drawn
            out[f"{pool}_complete_bytes"] = None
        return out

    full = {
        _state_key({r: st.value(r) for r in s.repos()}): rec for st, rec in (complete or {}).items()
    }

    contexts: dict[str, Any] = {}
    if isinstance(step, Found | OnlySkippedLeft):
        listed = list(step.culprits)
        if isinstance(step, OnlySkippedLeft):
            listed += list(step.candidates)
        for c in listed:
            if c.state is not None:
                contexts.setdefault(c.repo, c.state)
    elif isinstance(step, Test) and step.phase == "bisect" and step.repo is not None:
        contexts[step.repo] = step.state
    panels: list[dict[str, Any]] = []
    shown: set[int] = set()
    for repo, base in contexts.items():
        span = spans[repo]
        values = [span.good, *span.commits]
        points = []
        for x, v in enumerate(values):
            state = base.with_values({repo: v})
            found = by_state.get(_state_key({r: state.value(r) for r in s.repos()}))
            if found is not None:
                pt = point(x, _short(v), found)
                rec = full.get(_state_key(found["state"]))
                if rec is not None:
                    pt["vram_complete_bytes"] = rec.peak_vram_bytes
                    pt["ram_complete_bytes"] = rec.peak_ram_bytes
                points.append(pt)
                shown.add(found["n"])
        together = [r for r in s.repos() if r != repo and base.value(r) != s.good.value(r)]
        title = f"{repo_label(repo)}: {len(values) - 1} commit(s), in commit order"
        if together:
            title += " (with " + ", ".join(map(repo_label, together)) + f" at {s.terms.new})"
        panels.append({"title": title, "repo": repo, "x_max": len(values) - 1, "points": points})
    rest = [st for st in steps if st["n"] not in shown]
    if rest:
        points = []
        for i, st in enumerate(rest):
            switched = [r for r in s.repos() if st["state"][r] != s.good.value(r)]
            if not switched:
                label = s.terms.old
            elif len(switched) == len(s.repos()):
                label = s.terms.new
            else:
                label = "+" + "+".join(r.split(":", 1)[-1] for r in switched)
            points.append(point(i, label, st))
        panels.insert(
            0,
            {
                "title": "endpoints and repo-level steps, in the order measured",
                "repo": None,
                "x_max": len(rest) - 1,
                "points": points,
            },
        )
    return panels


def svg_element(fig: Any) -> str:
    """A matplotlib figure as an inline ``<svg>`` element for a self-contained HTML page: no
    XML prologue, and no date, so the same report renders to the same bytes."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _chart_svg(report: Mapping[str, Any]) -> str:
    """The chart of ``report["chart"]``: a row per panel, bars coloured by verdict, the
    threshold lines, "≥" over lower-bound peaks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = report["chart"]
    colors = {"old": "#2e7d32", "new": "#c62828", "skip": "#9e9e9e"}
    thr = report.get("threshold") or {}
    has = {
        pool: any(p[f"{pool}_drawn_bytes"] for panel in panels for p in panel["points"])
        for pool, _k, _l in _POOLS
    }
    width = 0.4 if has["vram"] and has["ram"] else 0.7
    widest = max((len(p["points"]) for p in panels), default=1)
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(max(6.0, 0.55 * widest + 2), 2.6 * len(panels) + 0.6),
        dpi=100,
        squeeze=False,
    )
    try:
        for ax, panel in zip(axes[:, 0], panels, strict=True):
            pts = panel["points"]
            xs = [p["x"] for p in pts]
            for pool, offs, alpha, hatch, name in (
                ("vram", -width / 2 if has["ram"] else 0, 1.0, None, "peak VRAM"),
                ("ram", width / 2 if has["vram"] else 0, 0.45, "//", "peak RAM"),
            ):
                if not has[pool]:
                    continue
                ax.bar(
                    [x + offs for x in xs],
                    [(p[f"{pool}_drawn_bytes"] or 0) / MIB for p in pts],
                    width,
                    color=[colors.get(p["kind"], "#555") for p in pts],
                    alpha=alpha,
                    hatch=hatch if has["vram"] and pool == "ram" else None,
                    label=name,
                )
                full = [p for p in pts if p[f"{pool}_complete_bytes"]]
                if full:
                    ax.bar(
                        [p["x"] + offs for p in full],
                        [p[f"{pool}_complete_bytes"] / MIB for p in full],
                        width,
                        fill=False,
                        edgecolor="#c62828",
                        linestyle="--",
                        label="culprit run to the end",
                    )
            for p in pts:
                top = max(
                    (p[f"{pool}_{kind}_bytes"] or 0) / MIB
                    for pool, _k, _l in _POOLS
                    for kind in ("drawn", "complete")
                )
                marks = []
                if p["outcome"] == "oom":
                    marks.append("OOM")
                if p["lower_bound"]:  # what it reached before it stopped, as the table says
                    main = "vram" if has["vram"] else "ram"
                    marks.append(peak_text(p[f"{main}_bytes"], True, "≥ ?"))
                if marks:
                    ax.annotate(
                        "\n".join(marks), (p["x"], top), ha="center", va="bottom", fontsize=6
                    )
            for pool, style, name in (
                ("vram", "--", "VRAM threshold"),
                ("ram", ":", "RAM threshold"),
            ):
                if thr.get(f"{pool}_bytes") is not None and has[pool]:
                    ax.axhline(
                        thr[f"{pool}_bytes"] / MIB,
                        linestyle=style,
                        color="#444",
                        linewidth=1,
                        label=name,
                    )
            ax.set_xlim(-0.6, max(panel["x_max"], 5) + 0.6)  # a lone bar stays a bar
            ax.set_xticks(xs)
            ax.set_xticklabels([p["label"] for p in pts], fontsize=6, rotation=30, ha="right")
            ax.set_ylabel("MiB")
            ax.set_title(panel["title"], fontsize=9)
        fig.suptitle("Peak memory per tested state", fontsize=10)
        if has["vram"] or has["ram"]:
            seen: dict[str, Any] = {}
            for ax in axes[:, 0]:
                for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                    seen.setdefault(label, handle)
            axes[0, 0].legend(
                list(seen.values()),
                list(seen),
                fontsize=7,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
            )
        fig.tight_layout()
        return svg_element(fig)
    finally:
        plt.close(fig)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 6px}
th{background:#f3f3f3}.old{color:#2e7d32}.new{color:#c62828;font-weight:bold}.skip{color:#8d6e00}
code{font-size:0.9em}.box{border:2px solid #c62828;padding:0.6em 1em;margin:1em 0}
.amb{border-color:#f9a825}.err{border-color:#888}pre{background:#f6f6f6;padding:0.5em;overflow:auto}
"""


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained page: the answer, the chart, every state and every run."""
    e = html.escape
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>oom-bisect report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>oom-bisect report</h1>",
        f"<p>Install <code>{e(report['install'])}</code>"
        + (f" — from {e(report['source'])}" if report.get("source") else "")
        + f". Generated {e(report['generated'])}.</p>",
    ]
    result = report["result"]
    if result == RESULT_FOUND:
        n = len(report["culprits"])
        out.append(f"<div class='box'><h2>{'Culprit' if n == 1 else f'{n} culprits'}</h2>")
        for c in report["culprits"]:
            out.append(_culprit_html(c))
        out.append("</div>")
    elif result == RESULT_AMBIGUOUS:
        out.append(
            "<div class='box amb'><h2>Ambiguous</h2><p>Only skipped commits are left; "
            "the first bad commit could be any of:</p><ul>"
        )
        for c in report["candidates"]:
            out.append(
                f"<li>{e(c['label'])} <code>{e(c['commit'])}</code> {e(c['subject'] or '')}</li>"
            )
        out.append("</ul>")
        for c in report["culprits"]:
            out.append(_culprit_html(c))
        out.append("</div>")
    else:
        out.append(
            f"<div class='box err'><h2>{e(result)}</h2><p>{e(report.get('message') or '')}</p></div>"
        )
    thr = report.get("threshold") or {}
    parts = [
        f"{pool} above {e(format_bytes(thr[key]))}"
        for pool, key in (("VRAM", "vram_bytes"), ("RAM", "ram_bytes"))
        if thr.get(key) is not None
    ]
    out.append(
        f"<p><b>{e(report['terms']['new'])}</b> = ran out of memory"
        + (" or " + " or ".join(parts) if parts else "")
        + f". {report['measurements']} measurement(s); "
        + (
            "each state run until its median is clear of the threshold by the noise band "
            f"(SAME / DIFFERENT; at most {report['max_repeat']} runs, then UNKNOWN, "
            "treated as a skip), each culprit and its parent re-checked once more.</p>"
            if report["repeat"] == "auto"
            else f"each state run {report['repeat']} time(s), median taken.</p>"
        )
    )
    for line in recheck_lines(report):
        out.append(f"<p>{e(line)}</p>")
    searched = search_line(report)
    if searched:
        out.append(f"<p>{e(searched)}</p>")
    leak = leak_line(report)
    if leak:
        out.append(f"<p>{e(leak)}</p>")
    if report["steps"]:
        out.append(_chart_svg(report))
        out.append(
            f"<p><small>Green: {e(report['terms']['old'])}, red: {e(report['terms']['new'])}, "
            "grey: skipped; hatched bars are RAM. Numbers match the table below.</small></p>"
        )
    out.append(
        "<h2>Tested states</h2><table><tr><th>#</th><th>verdict</th><th>state</th>"
        "<th>peak VRAM</th><th>peak RAM</th><th>runs</th><th>outcome</th><th>note</th></tr>"
    )
    for st in report["steps"]:
        out.append(
            f"<tr><td>{st['n']}</td><td class='{e(st['kind'])}'>{e(st['verdict'])}</td>"
            f"<td><code>{e(_state_text(st['state']))}</code></td>"
            f"<td>{e(peak_text(st['peak_vram_bytes'], st['peak_is_lower_bound']))}</td>"
            f"<td>{e(peak_text(st['peak_ram_bytes'], st['peak_is_lower_bound']))}</td>"
            f"<td>{e(_runs_cell(st))}</td><td>{e(st['outcome'])}</td>"
            f"<td>{e(st['reason'] or st['comment'] or '')}</td></tr>"
        )
    out.append("</table>")
    if report["skipped"]:
        out.append("<h2>Skipped</h2><ul>")
        for st in report["skipped"]:
            out.append(
                f"<li><code>{e(_state_text(st['state']))}</code>: {e(st['reason'] or '')}</li>"
            )
        out.append("</ul>")
    if report["runs"]:
        out.append(
            "<h2>Measurements</h2><table><tr><th>#</th><th>phase</th><th>state</th>"
            "<th>outcome</th><th>VRAM (NVML)</th><th>VRAM (torch reserved)</th><th>RAM</th>"
            "<th>start s</th><th>prompt s</th></tr>"
        )
        for i, run in enumerate(report["runs"], 1):
            pk, tm = run["peaks"], run["timings"]
            out.append(
                f"<tr><td>{i}</td><td>{e(run['phase'])}</td>"
                f"<td><code>{e(_state_text(run['state']))}</code></td>"
                f"<td>{e(str(run['outcome']))}{' (stopped early)' if run['stopped_early'] else ''}</td>"
                f"<td>{e(format_bytes(pk.get('nvml_vram_bytes'), '—'))}</td>"
                f"<td>{e(format_bytes(pk.get('torch_reserved_bytes'), '—'))}</td>"
                f"<td>{e(format_bytes(pk.get('ram_bytes'), '—'))}</td>"
                f"<td>{_secs(tm.get('ready_s'))}</td><td>{_secs(tm.get('prompt_s'))}</td></tr>"
            )
        out.append("</table>")
    out.append("</body></html>\n")
    return "\n".join(out)


def _secs(v: Any) -> str:
    return "" if v is None else f"{float(v):.2f}"


def _culprit_html(c: Mapping[str, Any]) -> str:
    e = html.escape
    commit = e(c["commit"])
    if c.get("url"):
        commit = f"<a href='{e(c['url'])}'>{commit}</a>"
    parts = [f"<p><b>{e(c['label'])}</b> <code>{commit}</code><br>{e(c['subject'] or '')}"]
    delta = delta_text(c)
    if delta:
        parts.append(f"<br><b>{e(delta)}</b>")
    if c.get("nodes_text"):
        parts.append(f"<br>nodes whose peak rose: {e(c['nodes_text'])}")
    if c.get("history_text"):
        parts.append(f"<br>{e(c['history_text'])}")
    if c.get("together"):
        parts.append(
            "<br>crosses the threshold only together with "
            + e(", ".join(map(repo_label, c["together"])))
        )
    if c.get("author"):
        parts.append(f"<br>{e(c['author'])}, {e(c['date'] or '')}")
    parts.append("</p>")
    chart = c.get("nodes_chart") or {}
    if chart.get("culprit"):
        parts.append(
            nodes_svg(c["label"], chart.get("parent") or [], chart["culprit"], chart["pool"])
        )
    if c.get("files"):
        parts.append(
            "<p>Files changed:</p><ul>"
            + "".join(f"<li><code>{e(f)}</code></li>" for f in c["files"])
            + "</ul>"
        )
    return "".join(parts)


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class WrittenReports:
    json_path: Path
    html_path: Path
    attached_to: Path | None = None


def _files(report: Mapping[str, Any]) -> dict[str, bytes]:
    """report.json as its model (``daemon/incidents/bisect_report_model.py``, what the daemon reads
    back) and the page drawn from it."""
    try:
        doc = BisectReport.model_validate(report)
    except ValidationError as exc:  # a bug in build_report: say which field, in one line
        raise ValueError(f"report.json: {validation_problem(exc)}") from None
    return {
        "report.json": doc.model_dump_json(indent=2, exclude_unset=True).encode("utf-8") + b"\n",
        "report.html": render_html(report).encode("utf-8"),
    }


def write_reports(
    report: Mapping[str, Any], directory: Path, *, snapshot_dir: Path | None = None
) -> WrittenReports:
    """``report.json`` and ``report.html`` in ``directory`` (each written atomically), and a
    copy attached to the snapshot when given."""
    files = _files(report)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_bytes_atomic(directory / name, data, mode=0o600)
    attached = attach_to_snapshot(snapshot_dir, files) if snapshot_dir is not None else None
    return WrittenReports(directory / "report.json", directory / "report.html", attached)


def attach_to_snapshot(
    snapshot_dir: Path, files: Mapping[str, bytes], *, folder: str = "bisect"
) -> Path:
    """Write ``files`` into a new ``bisect/`` (``bisect-2/`` …) folder of the snapshot
    (``folder`` names it otherwise: ``oom-bisect fit`` attaches to ``fit/``, ``fit-2/`` …).

    The folder is built under a temporary name and renamed into place: the name is claimed
    first with ``mkdir`` (which fails if it exists), then the full folder replaces that empty
    one in a single rename, so no reader ever sees a half-written folder and no existing
    file of the snapshot is rewritten.
    """
    tmp = snapshot_dir / f".{folder}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)
    try:
        for name, data in files.items():
            write_bytes_atomic(tmp / name, data, mode=0o600)
        for n in range(1, 1000):
            target = snapshot_dir / (folder if n == 1 else f"{folder}-{n}")
            try:
                target.mkdir(mode=0o700)
            except FileExistsError:
                continue
            try:
                os.rename(tmp, target)  # replaces the empty folder that claimed the name
            except OSError:
                with contextlib.suppress(OSError):
                    target.rmdir()
                raise
            fsync_dir(snapshot_dir)
            return target
        raise OSError(f"{snapshot_dir}: too many {folder} reports attached")
    except BaseException:
        remove_tree(tmp)
        raise
