"""The ``oom-sentinel`` command: run the watchdog, and inspect what it recorded.

Each subcommand group lives in its own module (``cli_*.py``) and is named here, so this
file stays a table of contents. The modules load only when their command runs: the daemon
(``run``) lives for months beside a GPU workload and should not carry the importers, tables
and clients of ``doctor``, ``states`` or ``service``.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from oom_sentinel.config.settings import default_toml_text, load_settings
from oom_sentinel.daemon.core.clikit import echo_json, handle_errors

PROG = "oom-sentinel"

#: command name -> "module:attribute" of its click command, imported on first use
LAZY_COMMANDS: dict[str, str] = {
    "alert": "oom_sentinel.daemon.cli.alert:alert_group",
    "diagnose": "oom_sentinel.daemon.cli.diagnose:diagnose",
    "doctor": "oom_sentinel.daemon.cli.doctor:doctor_command",
    "fleet": "oom_sentinel.daemon.cli.fleet:fleet_group",
    "notify-agent": "oom_sentinel.daemon.cli.notify_agent:notify_agent_command",
    "run": "oom_sentinel.daemon.cli.run:run_command",
    "runs": "oom_sentinel.daemon.cli.runs:runs_command",
    "service": "oom_sentinel.daemon.cli.service:service_group",
    "snapshots": "oom_sentinel.daemon.cli.snapshots:snapshots_group",
    "states": "oom_sentinel.daemon.cli.states:states_group",
    "status": "oom_sentinel.daemon.cli.run:status_command",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when asked for (``--help`` imports them all)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, _, attr = LAZY_COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            if command.name != cmd_name:  # a renamed command must be renamed here too
                raise RuntimeError(f"{module}:{attr} is named {command.name!r}, not {cmd_name!r}")
            self.add_command(command)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors (for bug reports).")
@click.version_option(package_name="oom-sentinel", prog_name=PROG)
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Watch ComfyUI for out-of-memory failures and record what caused them."""
    ctx.obj = {"verbose": verbose}


@main.group("config")
def config_group() -> None:
    """Check or print the configuration."""


@config_group.command("check")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@handle_errors(PROG)
def config_check(config_path: str | None) -> None:
    """Validate the configuration that `run` would use; exit 2 if it is invalid."""
    loaded = load_settings(config_path)
    where = str(loaded.source) if loaded.source else "built-in defaults (no config file found)"
    click.echo(f"{where}: ok")


@config_group.command("show")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--json", "as_json", is_flag=True, help="Print the effective settings as JSON.")
@click.option("--defaults", is_flag=True, help="Print the documented default config file.")
@handle_errors(PROG)
def config_show(config_path: str | None, as_json: bool, defaults: bool) -> None:
    """Print the effective settings (or, with --defaults, the documented default file)."""
    if defaults:
        click.echo(default_toml_text(), nl=False)
        return
    loaded = load_settings(config_path)
    data: dict[str, Any] = loaded.settings.model_dump(mode="json")
    data["data_dir"] = str(loaded.settings.resolved_data_dir())
    # apprise URLs hold passwords and tokens in every part (discord://ID/TOKEN): shown as
    # `alert test` names them; anything else secret-shaped (a ComfyUI URL's ?token=) masked
    from oom_sentinel.daemon.alerts.notifiers import describe_url
    from oom_sentinel.daemon.core.redact import redact

    alerts = data.get("alerts")
    if isinstance(alerts, dict) and alerts.get("urls"):
        alerts["urls"] = [describe_url(str(u)) for u in alerts["urls"]]
    data = redact(data)
    if as_json:
        echo_json({"source": str(loaded.source) if loaded.source else None, "settings": data})
        return
    click.echo(f"# source: {loaded.source or 'built-in defaults'}")
    _print_toml(data)


def _print_toml(data: dict[str, Any], prefix: str = "") -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for key, value in scalars.items():
        click.echo(f"{key} = {_toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            click.echo(f"\n[{prefix}{key}]")
            _print_toml(value, f"{prefix}{key}.")


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)
