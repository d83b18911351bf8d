"""``oom-sentinel alert test``: prove that alerts reach people before an OOM has to.

It sends one sample alert through every channel the configuration names -- each apprise URL,
the log, the Windows Event Log, the desktop feed -- right now, bypassing the outbox and the
rate limits, and prints one line per channel. Channels are shown by their secret-free names;
the exit status is 1 when any channel failed, so a provisioning script can check it.
"""

from __future__ import annotations

import logging
import socket
import time

import click

from oom_sentinel.config.settings import load_settings
from oom_sentinel.daemon.alerts.format import sample_alert
from oom_sentinel.daemon.alerts.notifiers import build_channels, scrub, send_all
from oom_sentinel.daemon.core.clikit import echo_json, handle_errors
from oom_sentinel.daemon.core.errors import EXIT_ERROR

__all__ = ["alert_group"]

PROG = "oom-sentinel"


@click.group("alert")
def alert_group() -> None:
    """Check the alert channels."""


@alert_group.command("test")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@handle_errors(PROG)
def test_command(config_path: str | None, as_json: bool) -> None:
    """Send a sample alert through every configured channel; exit 1 if any failed."""
    loaded = load_settings(config_path)
    # The libraries' own lines would repeat each channel's reason on stderr; the table says it.
    logging.getLogger("oom_sentinel.notify").setLevel(logging.CRITICAL)
    channels = build_channels(loaded.settings)
    alert = sample_alert(time.time(), host=socket.gethostname())
    results = send_all(channels, alert)
    failed = [r for r in results if not r.ok]
    if as_json:
        echo_json(
            [
                {"channel": r.channel_name, "id": r.channel_id, "ok": r.ok, "detail": r.detail}
                for r in results
            ]
        )
    else:
        if not loaded.settings.alerts.urls:
            click.echo(
                "No apprise URLs configured ([alerts] urls in the config); "
                "testing the local channels only."
            )
        width = max((len(r.channel_name) for r in results), default=0)
        for r in results:
            mark = "ok    " if r.ok else "FAILED"
            click.echo(scrub(f"{mark}  {r.channel_name:<{width}}  {r.detail}"))
        if not results:
            click.echo("No alert channel is enabled.")
    if failed:
        raise SystemExit(EXIT_ERROR)
