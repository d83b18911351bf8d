"""``oom-sentinel runs``: the prompts the watchdog saw ComfyUI run, newest first.

Run history is what makes "it worked yesterday" checkable: each row has the outcome, the peak
memory while it ran and the workflow fingerprint that matches the same workflow across runs
(seeds and file names ignored). The command reads the store the daemon writes and works while
the daemon runs.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from oom_sentinel.daemon.core.clikit import echo_json, echo_table, handle_errors
from oom_sentinel.daemon.core.units import format_bytes
from oom_sentinel.daemon.store.db import Store
from oom_sentinel.daemon.store.runs import OUTCOME_LABELS, OUTCOMES, RunRecord, list_runs

__all__ = ["runs_command"]

PROG = "oom-sentinel"


def _data_dir(data_dir: str | None, config_path: str | None) -> Path:
    if data_dir:
        return Path(data_dir).expanduser()
    from oom_sentinel.config.settings import load_settings

    return load_settings(config_path).settings.resolved_data_dir()


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _duration(run: RunRecord) -> str:
    d = run.duration_s
    if d is None:
        return "-"
    return f"{d:.2f}s" if d < 60 else f"{d / 60:.1f}m"


def _what(run: RunRecord) -> str:
    if run.node_type:
        node = f"{run.node_type} (node {run.node_id})" if run.node_id else run.node_type
        return f"{node}: {run.exception_type}" if run.exception_type else node
    return ""


@click.command("runs")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per run).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Data directory (default: from the config, else the platform's data dir).",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--instance", help="Only runs of this ComfyUI instance.")
@click.option("--outcome", type=click.Choice(OUTCOMES), help="Only runs that ended this way.")
@click.option("--fingerprint", help="Only runs of this workflow (its fingerprint).")
@click.option(
    "-n", "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N."
)
@handle_errors(PROG)
def runs_command(
    as_json: bool,
    data_dir: str | None,
    config_path: str | None,
    instance: str | None,
    outcome: str | None,
    fingerprint: str | None,
    limit: int,
) -> None:
    """List the prompts ComfyUI ran: outcome, peak memory, workflow fingerprint."""
    directory = _data_dir(data_dir, config_path)
    store = Store.open_existing(directory)
    if store is None:
        runs: list[RunRecord] = []
    else:
        with store:
            runs = list_runs(
                store, instance=instance, outcome=outcome, fingerprint=fingerprint, limit=limit
            )
    if as_json:
        echo_json([r.to_json() for r in runs])
        return
    if not runs:
        click.echo(f"no runs recorded in {directory}")
        return
    header = ("started", "instance", "outcome", "took", "peak RAM", "peak VRAM", "workflow", "")
    rows = [
        (
            _when(r.started_s if r.started_s is not None else r.ended_s),
            r.instance,
            OUTCOME_LABELS.get(r.outcome, r.outcome),
            _duration(r),
            format_bytes(r.peak_rss_bytes, "-"),
            format_bytes(r.peak_vram_bytes, "-"),
            (r.fingerprint or "-")[:12],
            _what(r),
        )
        for r in runs
    ]
    echo_table(header, rows)
