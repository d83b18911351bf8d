"""The ``oom-bisect`` command: find the update that made a workflow run out of memory."""

from __future__ import annotations

import click

PROG = "oom-bisect"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors (for bug reports).")
@click.version_option(package_name="oom-sentinel", prog_name=PROG)
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Replay a workflow across ComfyUI and custom-node commits and name the culprit."""
    ctx.obj = {"verbose": verbose}
