"""``oom-sentinel notify-agent``: the per-user desktop companion (see ``notify_agent.py``)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import click

from oom_sentinel.daemon.alerts.notify_agent import (
    DesktopNotifierSender,
    FeedWatcher,
    feeds_for,
    make_watcher,
    run_agent,
)
from oom_sentinel.daemon.core.clikit import handle_errors

__all__ = ["notify_agent_command"]

PROG = "oom-sentinel"


@click.command("notify-agent")
@click.option(
    "--feed",
    "feeds",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="The daemon's feed file (repeatable; default: where the daemon writes it).",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(0.2, 3600),
    default=5.0,
    show_default=True,
    help="Seconds between polls.",
)
@click.option("--once", is_flag=True, help="Show what is new once and exit.")
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to remember shown alerts (default: the user state dir).",
)
@handle_errors(PROG)
def notify_agent_command(
    feeds: tuple[str, ...], interval_s: float, once: bool, state_path: Path | None
) -> None:
    """Show oom-sentinel's alerts as desktop notifications (run it in your desktop session)."""
    sender = DesktopNotifierSender()
    paths = feeds_for(feeds)
    now = time.time()
    watcher = (
        FeedWatcher(paths, state_path=state_path, now_s=now)
        if state_path is not None
        else make_watcher(paths, now)
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if not once:
        click.echo(f"{PROG} notify-agent: watching {', '.join(str(p) for p in paths)}")
    try:
        shown = run_agent(watcher, sender, stop, interval_s=interval_s, once=once)
    except KeyboardInterrupt:
        return
    if once:
        click.echo(f"{shown} notification(s) shown")
