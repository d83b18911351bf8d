"""``oom-sentinel fleet rules|dashboard``: the Prometheus alerting rules and the Grafana
dashboard that ship with the package, printed so a farm's config management can install them
(``oom-sentinel fleet rules > /etc/prometheus/rules/oom-sentinel.yml``).

They are package data next to this module (``prometheus-rules.yml``,
``grafana-dashboard.json``) and are tested against the series the exporter really serves:
``promtool test rules`` for the rules, every query's metric names for the dashboard.
"""

from __future__ import annotations

from pathlib import Path

import click

from oom_sentinel.daemon.core.clikit import handle_errors

__all__ = ["DASHBOARD_FILE", "RULES_FILE", "fleet_group"]

PROG = "oom-sentinel"
# Not importlib.resources: a namespace package under an editable install (see settings.py).
RULES_FILE = Path(__file__).parents[1] / "fleet" / "prometheus-rules.yml"
DASHBOARD_FILE = Path(__file__).parents[1] / "fleet" / "grafana-dashboard.json"


@click.group("fleet")
def fleet_group() -> None:
    """Print what a farm's Prometheus and Grafana need (see README, "For a farm")."""


@fleet_group.command("rules")
@handle_errors(PROG)
def rules_command() -> None:
    """Print the Prometheus alerting rules (YAML, for rule_files)."""
    click.echo(RULES_FILE.read_text("utf-8"), nl=False)


@fleet_group.command("dashboard")
@handle_errors(PROG)
def dashboard_command() -> None:
    """Print the Grafana dashboard (JSON, for Dashboards > Import or provisioning)."""
    click.echo(DASHBOARD_FILE.read_text("utf-8"), nl=False)
