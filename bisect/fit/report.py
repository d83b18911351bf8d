"""What ``oom-bisect fit`` found, for a terminal, for scripts and for the crash snapshot.

One record (``build_fit_report``), three renderings like the bisect's report: a rich table,
``fit.json`` (the record itself) and ``fit.html`` (one self-contained page with a chart of
each run's peak against the budget). ``headline`` is the one line ``oom-sentinel snapshots
show`` leads with, e.g. "fits with --reserve-vram 1.0 (peak 7.1 of 8 GiB, 1.3× slower)";
it is stored in ``fit.json`` so the daemon's ``show`` reads it without importing the bisect.

Every changed prompt is written beside the report as ``fit-<change>.json`` (an API prompt,
ready to queue or load in ComfyUI); the user's own workflow file is never written.

Time cost: each run's prompt time against the baseline's. Under an emulated budget the baseline
runs to the end (the machine has the memory; only the budget says no), so its time is a full
run's and the ratio is the speed cost of the fix. A baseline that really ran out of memory
stopped at its failure: no ratio is claimed then, only each run's prompt time.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from oom_sentinel.bisect.fit.candidates import apply_prompt
from oom_sentinel.bisect.fit.experiment import RESULT_FITS, FitResult, Trial
from oom_sentinel.bisect.search.verdict import Ok, Threshold
from oom_sentinel.bisect.session.files import outcome_to_json
from oom_sentinel.bisect.session.report import svg_element
from oom_sentinel.daemon.core.atomic import write_bytes_atomic
from oom_sentinel.daemon.core.units import MIB, format_bytes

__all__ = [
    "FIT_FORMAT",
    "build_fit_report",
    "fit_files",
    "headline",
    "prompt_file_name",
    "render_fit_html",
    "render_fit_terminal",
    "write_fit_report",
]

FIT_FORMAT = 1
GIB = 1024**3


def prompt_file_name(key: str) -> str:
    return f"fit-{key}.json"


def _peak(trial: Trial, pool: str | None) -> int | None:
    p = trial.measurement.peaks
    if pool == "vram":
        return p.vram_bytes
    if pool == "ram":
        return p.ram_bytes
    return None


def baseline_complete(baseline: Trial) -> bool:
    """Whether the baseline ran its prompt to the end (over an emulated budget, not OOM):
    only then is its prompt time a fair reference for a speed cost."""
    o = baseline.measurement.outcome
    return isinstance(o, Ok) and not o.stopped_early


def _ratio(trial: Trial, baseline: Trial) -> float | None:
    """Prompt time against the baseline's, for the baseline's output: a batch of 8 split
    into 8 runs costs 8 runs' time."""
    a, b = trial.prompt_s, baseline.prompt_s
    if a is None or b is None or b <= 0 or not baseline_complete(baseline):
        return None
    repeat = trial.change.repeat if trial.change is not None else 1
    return round(a * repeat / b, 3)


def _row(trial: Trial, baseline: Trial, pool: str | None, capacity: Mapping[str, Any]) -> dict:
    c = trial.change
    peak = _peak(trial, pool)
    cap = capacity.get(pool) if pool else None
    m = trial.measurement
    return {
        "change": None if c is None else c.to_json(),
        "label": "unchanged (baseline)" if c is None else c.label,
        "fits": trial.fits,
        "verdict": trial.verdict,
        "reason": trial.reason,
        "outcome": outcome_to_json(m.outcome),
        "failed_pool": trial.pool,
        "peak_vram_bytes": m.peaks.vram_bytes,
        "peak_ram_bytes": m.peaks.ram_bytes,
        "peak_bytes": peak,
        "capacity_bytes": cap,
        "margin_bytes": None if peak is None or cap is None else cap - peak,
        "prompt_s": trial.prompt_s,
        "time_vs_baseline": None if c is None else _ratio(trial, baseline),
        "start_s": m.timings.get("ready_s"),
        "prompt_file": prompt_file_name(c.key) if c is not None and c.edits else None,
        "dropped_flags": [list(d) for d in m.dropped_flags],
        "argv_flags": list(m.argv[m.argv.index("--") + 2 :]) if "--" in m.argv else [],
    }


def _speed(ratio: float | None) -> str:
    if ratio is None:
        return "time unknown"
    if ratio >= 1.05:
        return f"{ratio:.1f}× slower"
    if ratio <= 0.95:
        return f"{1 / ratio:.1f}× faster" if ratio > 0 else "faster"
    return "about as fast"


def _secs(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def _note(row: Mapping[str, Any]) -> str:
    """The first sentence of why a run failed (an OOM message goes on for lines)."""
    if row["fits"]:
        return ""
    text = str(row["reason"]).strip()
    cut = text.find(". ")
    return (text[: cut + 1] if 0 < cut < 90 else text[:90]).strip()


def _of(peak: int | None, cap: int | None) -> str:
    if peak is None:
        return "peak unknown"
    if cap is None:
        return f"peak {format_bytes(peak)}"
    if cap >= GIB:
        return f"peak {peak / GIB:.1f} of {cap / GIB:.3g} GiB"
    return f"peak {peak / MIB:.0f} of {cap / MIB:.0f} MiB"


def headline(doc: Mapping[str, Any]) -> str:
    """ "fits with --reserve-vram 1.0 (peak 7.1 of 8 GiB, 1.3× slower)", or why not."""
    rec = doc.get("recommendation")
    if doc.get("result") == RESULT_FITS and rec:
        words = "fits only with a combination:" if doc.get("combined") else "fits with"
        note = ", changes the output" if (rec.get("change") or {}).get("changes_output") else ""
        ratio = rec["time_vs_baseline"]
        repeat = (rec.get("change") or {}).get("repeat") or 1
        if ratio is not None:
            speed = _speed(ratio) + (f" over {repeat} runs" if repeat > 1 else "")
        elif rec.get("prompt_s") is not None:
            speed = f"prompt {_secs(rec['prompt_s'])} s"
        else:
            speed = "time unknown"
        return f"{words} {rec['label']} ({_of(rec['peak_bytes'], rec['capacity_bytes'])}, {speed}{note})"
    return str(doc.get("message") or doc.get("result"))


def build_fit_report(
    result: FitResult,
    *,
    install: str,
    source: str,
    budget: Threshold,
    capacity: Mapping[str, int | None],
    user_flags: Sequence[str],
    elapsed_s: float,
    runs: int,
    max_runs: int,
) -> dict[str, Any]:
    base = result.baseline
    rows = [_row(t, base, result.pool, capacity) for t in result.trials]
    rec = None
    if result.recommendation is not None:
        rec = _row(result.recommendation, base, result.pool, capacity)
    doc: dict[str, Any] = {
        "format": FIT_FORMAT,
        "kind": "oom-bisect fit",
        "generated": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "install": install,
        "source": source,
        "result": result.result,
        "pool": result.pool,
        "budget": {"vram_bytes": budget.vram_bytes, "ram_bytes": budget.ram_bytes},
        "capacity": dict(capacity),
        "user_flags": list(user_flags),
        "baseline": _row(base, base, result.pool, capacity),
        "trials": rows,
        "combined": result.combined,
        "untried": [c.to_json() for c in result.untried],
        "recommendation": rec,
        "message": result.message,
        "runs": runs,
        "max_runs": max_runs,
        "elapsed_s": round(elapsed_s, 2),
        "baseline_complete": baseline_complete(base),
        "time_note": (
            "prompt time against the baseline's, which ran to the end over the budget"
            if baseline_complete(base)
            else "no time ratio: the baseline stopped at its failure, so its prompt time is "
            "not a full run's"
        ),
    }
    doc["headline"] = headline(doc)
    return doc


def changed_prompts(result: FitResult, prompt: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``fit-<key>.json`` → the changed prompt, for every tried change that edits the prompt."""
    return {
        prompt_file_name(t.change.key): apply_prompt(prompt, t.change)
        for t in result.trials
        if t.change is not None and t.change.edits
    }


# --------------------------------------------------------------------------- terminal


def render_fit_terminal(doc: Mapping[str, Any], console: Console) -> None:
    table = Table(title="One change at a time", expand=False)
    columns: tuple[tuple[str, dict[str, Any]], ...] = (
        ("#", {"justify": "right"}),
        ("change", {"overflow": "fold"}),
        ("result", {}),
        ("peak VRAM", {"justify": "right"}),
        ("peak RAM", {"justify": "right"}),
        ("prompt s", {"justify": "right"}),
        ("vs baseline", {"justify": "right"}),
        ("note", {"overflow": "fold"}),
    )
    for col, kw in columns:
        table.add_column(col, **kw)
    for n, row in enumerate([doc["baseline"], *doc["trials"]]):
        word = "fits" if row["fits"] else f"still fails ({row['verdict']})"
        if row["verdict"] == "skip":
            word = "not measured (skip)"
        if n == 0:
            word = "fits" if row["fits"] else f"fails ({row['verdict']})"
        ratio = row["time_vs_baseline"]
        table.add_row(
            str(n),
            row["label"],
            Text(word, style="green" if row["fits"] else "red"),
            format_bytes(row["peak_vram_bytes"], "—"),
            format_bytes(row["peak_ram_bytes"], "—"),
            "—" if row["prompt_s"] is None else f"{row['prompt_s']:.2f}",
            "—" if ratio is None else f"{ratio:.2f}×",
            _note(row),
        )
    console.print(table)
    cap = (doc.get("capacity") or {}).get(doc.get("pool") or "")
    if cap:
        console.print(f"budget: {doc['pool'].upper()} {format_bytes(cap)}", highlight=False)
    if doc["result"] == RESULT_FITS:
        rec = doc["recommendation"]
        lines = [doc["headline"]]
        if rec["margin_bytes"] is not None:
            lines.append(f"margin: {format_bytes(rec['margin_bytes'])} below the budget")
        if rec.get("prompt_file"):
            lines.append(f"changed prompt: {rec['prompt_file']} (beside the report)")
        if doc.get("combined"):
            lines.append("no single change fitted; this combination is the cheapest that did")
        panel = Panel("\n".join(lines), title="recommendation", border_style="green")
    else:
        panel = Panel(doc["headline"], title=doc["result"], border_style="yellow")
    console.print(panel, soft_wrap=False)  # wrapped inside the box, never cut at its edge
    console.print(
        f"{doc['runs']} run(s) of ComfyUI (at most {doc['max_runs']}) in {doc['elapsed_s']:.1f} s",
        highlight=False,
    )


# --------------------------------------------------------------------------- HTML


def _chart_svg(doc: Mapping[str, Any]) -> str:
    """Each run's peak in the failing pool (or both pools), green when it fits, with the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [doc["baseline"], *doc["trials"]]
    pool = doc.get("pool")
    keys = ["peak_vram_bytes"] if pool == "vram" else ["peak_ram_bytes"]
    if pool is None:
        keys = ["peak_vram_bytes", "peak_ram_bytes"]
    labels = [str(r["label"])[:48] for r in rows]
    fig, ax = plt.subplots(figsize=(8.0, 0.42 * len(rows) + 1.6), dpi=100)
    try:
        ys = list(range(len(rows)))
        height = 0.8 / len(keys)
        for k, key in enumerate(keys):
            values = [(r[key] or 0) / MIB for r in rows]
            ax.barh(
                [y + k * height - (len(keys) - 1) * height / 2 for y in ys],
                values,
                height,
                color=["#2e7d32" if r["fits"] else "#c62828" for r in rows],
                alpha=1.0 if k == 0 else 0.5,
                label="peak VRAM" if key == "peak_vram_bytes" else "peak RAM",
            )
        for y, r in zip(ys, rows, strict=True):
            if not r["fits"]:  # an OOM's peak is what it held before the allocation that failed
                top = max((r[key] or 0) / MIB for key in keys)
                ax.annotate(f" {r['verdict']}", (top, y), va="center", fontsize=7)
        cap = (doc.get("capacity") or {}).get(pool or "")
        if cap:
            ax.axvline(cap / MIB, linestyle="--", color="#444", linewidth=1, label="budget")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("MiB")
        ax.set_title("Peak memory per change (green: fits)")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        return svg_element(fig)
    finally:
        plt.close(fig)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 6px}
th{background:#f3f3f3}.fits{color:#2e7d32;font-weight:bold}.fails{color:#c62828}
.box{border:2px solid #2e7d32;padding:0.6em 1em;margin:1em 0}.none{border-color:#c62828}
code{font-size:0.9em}
"""


def render_fit_html(doc: Mapping[str, Any]) -> str:
    e = html.escape
    ok = doc["result"] == RESULT_FITS
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>oom-bisect fit</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>oom-bisect fit</h1>",
        f"<p>Install <code>{e(doc['install'])}</code> — from {e(doc['source'])}. "
        f"Generated {e(doc['generated'])}; {doc['runs']} run(s) in {doc['elapsed_s']:.1f} s.</p>",
        f"<div class='box{'' if ok else ' none'}'><h2>{e(doc['headline'])}</h2>",
    ]
    rec = doc.get("recommendation")
    if ok and rec:
        if rec.get("margin_bytes") is not None:
            out.append(f"<p>Margin: {e(format_bytes(rec['margin_bytes']))} below the budget.</p>")
        if rec.get("prompt_file"):
            out.append(f"<p>Changed prompt: <code>{e(rec['prompt_file'])}</code>.</p>")
        if (rec.get("change") or {}).get("why"):
            out.append(f"<p>{e(rec['change']['why'])}</p>")
        if doc.get("combined"):
            out.append("<p>No single change fitted: this is a combination.</p>")
    out.append("</div>")
    out.append(_chart_svg(doc))
    out.append(
        "<h2>Runs</h2><table><tr><th>#</th><th>change</th><th>result</th><th>peak VRAM</th>"
        "<th>peak RAM</th><th>prompt s</th><th>vs baseline</th><th>note</th></tr>"
    )
    for n, row in enumerate([doc["baseline"], *doc["trials"]]):
        ratio = row["time_vs_baseline"]
        cls = "fits" if row["fits"] else "fails"
        secs = "—" if row["prompt_s"] is None else f"{row['prompt_s']:.2f}"
        out.append(
            f"<tr><td>{n}</td><td>{e(row['label'])}</td>"
            f"<td class='{cls}'>{'fits' if row['fits'] else e(row['verdict'])}</td>"
            f"<td>{e(format_bytes(row['peak_vram_bytes'], '—'))}</td>"
            f"<td>{e(format_bytes(row['peak_ram_bytes'], '—'))}</td>"
            f"<td>{secs}</td>"
            f"<td>{'—' if ratio is None else f'{ratio:.2f}×'}</td>"
            f"<td>{'' if row['fits'] else e(str(row['reason'])[:200])}</td></tr>"
        )
    out.append("</table>")
    out.append(f"<p>{e(doc['time_note'])}.</p>")
    if doc.get("untried"):
        names = ", ".join(e(c["label"]) for c in doc["untried"])
        out.append(f"<p>Not tried (--max-runs): {names}.</p>")
    out.append("</body></html>")
    return "\n".join(out)


def fit_files(doc: Mapping[str, Any], prompts: Mapping[str, Mapping[str, Any]]) -> dict[str, bytes]:
    files = {
        "fit.json": (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
        "fit.html": render_fit_html(doc).encode("utf-8"),
    }
    for name, prompt in prompts.items():
        files[name] = (json.dumps(prompt, indent=2) + "\n").encode("utf-8")
    return files


def write_fit_report(files: Mapping[str, bytes], directory: Path) -> Path:
    """The files in ``directory`` (each atomically); returns the html path."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_bytes_atomic(directory / name, data, mode=0o600)
    return directory / "fit.html"
