"""What the long-running daemon process loads. Each module kept out here is one it does not
carry for months (benchmarks/daemon_idle.py measures what that buys); each is loaded by the
code path that needs it, which the other tests exercise."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from oom_sentinel.daemon.cli.main import LAZY_COMMANDS, main

#: the daemon's own code path: the CLI group, the ``run`` command, the service it starts
PROBE = """
import json, sys
import click
from oom_sentinel.daemon.cli.main import main
ctx = click.Context(main)
main.get_command(ctx, "run")
import oom_sentinel.daemon.service.wiring
print(json.dumps(sorted(sys.modules)))
"""

#: loaded only on demand: the API client, git, metrics, Manager YAML, the scan automaton,
#: and the other subcommands
NOT_AT_START = (
    "aiohttp",
    "git",
    "prometheus_client",
    "yaml",
    "ahocorasick_rs",
    "oom_sentinel.daemon.cli.doctor",
    "oom_sentinel.daemon.cli.states",
    "oom_sentinel.daemon.cli.service",
    "oom_sentinel.daemon.cli.snapshots",
    "oom_sentinel.daemon.doctor.checks",
    "oom_sentinel.daemon.fleet.metrics",
    # [fleet]: the farm listener, the bucket (boto3 loads on the first upload, only when
    # bucket_url is set) and the rules/dashboard printer
    "boto3",
    "botocore",
    "oom_sentinel.daemon.fleet.metrics_server",
    "oom_sentinel.daemon.fleet.bucket",
    "oom_sentinel.daemon.cli.fleet",
    "oom_sentinel.bisect",
)


def test_the_daemon_starts_without_its_on_demand_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    assert "oom_sentinel.daemon.service.wiring" in loaded
    assert "apscheduler" in loaded  # the probe did load the daemon
    heavy = sorted(m for m in NOT_AT_START if m in loaded)
    assert heavy == []


def test_every_lazy_command_resolves_to_a_command_of_that_name() -> None:
    ctx = click.Context(main)
    for name in LAZY_COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name
    assert set(LAZY_COMMANDS) | {"config"} == set(main.list_commands(ctx))


def test_an_unknown_command_is_a_usage_error_not_an_import() -> None:
    code = "from oom_sentinel.daemon.cli.main import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "no-such-command"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "No such command 'no-such-command'" in done.stderr
