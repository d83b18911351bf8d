"""``oom-sentinel run`` (the service in the foreground) and ``oom-sentinel status``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import click

from oom_sentinel.config.settings import load_settings
from oom_sentinel.daemon.core.clikit import echo_json, handle_errors
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.core.units import format_bytes

PROG = "oom-sentinel"
#: written by the running service (service.STATUS_FILE), read by ``status``
STATUS_FILE = "status.json"

__all__ = ["run_command", "status_command"]


@click.command("run")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Store and snapshots here.")
@click.option(
    "--watch-log", "watch_logs", multiple=True, metavar="PATH", help="Also follow this log file."
)
@click.option(
    "--comfyui",
    "comfyui",
    multiple=True,
    metavar="URL|PATH",
    help="Watch this ComfyUI (its http URL or install folder) instead of discovering them.",
)
@handle_errors(PROG)
def run_command(
    config_path: str | None,
    data_dir: str | None,
    watch_logs: tuple[str, ...],
    comfyui: tuple[str, ...],
) -> None:
    """Run the watchdog in the foreground until SIGTERM or Ctrl-C."""
    # imported here: the other commands should not pay for the scheduler and probes
    from oom_sentinel.daemon.service.instances import RunOptions
    from oom_sentinel.daemon.service.logsetup import configure_logging
    from oom_sentinel.daemon.service.wiring import run_service

    loaded = load_settings(config_path)
    configure_logging(loaded.settings.log_level)
    stop = threading.Event()
    options = RunOptions(data_dir=data_dir, watch_logs=watch_logs, comfyui=comfyui)
    raise SystemExit(run_service(loaded, stop=stop, options=options, install_signals=True))


def _pid_alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid)


@click.command("status")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="The daemon's data dir.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@handle_errors(PROG)
def status_command(config_path: str | None, data_dir: str | None, as_json: bool) -> None:
    """What the running daemon watches, its last memory sample and last incident."""
    root = Path(data_dir) if data_dir else load_settings(config_path).settings.resolved_data_dir()
    path = root / STATUS_FILE
    status: dict[str, Any] | None = None
    try:
        status = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        status = None
    except (OSError, ValueError) as exc:
        raise SentinelError(f"{path}: unreadable status file: {exc}") from None
    if isinstance(status, dict):  # written redacted; a file from an older daemon may not be
        from oom_sentinel.daemon.core.redact import redact

        status = redact(status)
    running = bool(status) and _pid_alive(int(status.get("pid", 0)))  # type: ignore[union-attr]
    if as_json:
        echo_json({"running": running, "data_dir": str(root), "status": status})
        return
    if not status or not running:
        click.echo(f"oom-sentinel is not running (no live daemon recorded in {root})")
        raise SystemExit(3)
    age = time.time() - float(status.get("updated_s", 0))
    click.echo(
        f"running as pid {status['pid']}, data in {status['data_dir']} (updated {age:.0f} s ago)"
    )
    click.echo(f"  {status.get('gpu')}")
    dead = [name for name, ok in (status.get("workers") or {}).items() if not ok]
    if dead:
        health = status.get("worker_health") or {}
        named = [
            f"{name} ({health[name]['error']})" if (health.get(name) or {}).get("error") else name
            for name in dead
        ]
        click.echo(f"  DEAD worker(s): {', '.join(named)} -- the service needs a restart")
    insts = status.get("instances") or []
    click.echo(
        f"  {len(insts)} ComfyUI instance(s)" + (":" if insts else " (waiting for one to appear)")
    )
    for inst in insts:
        where = f"pid {inst['pid']}" if inst.get("pid") else "not running"
        click.echo(f"    {inst['name']}: {inst.get('path') or inst.get('url')} ({where})")
    for entry in status.get("logs") or []:
        state = entry.get("error") or (
            f"at byte {entry['offset']}"
            if entry.get("offset") is not None
            else "waiting for the file"
        )
        click.echo(f"  log {entry['path']}: {state}")
    sample = status.get("last_sample")
    if sample:
        ram = sample.get("ram_available_bytes")
        click.echo(f"  last sample: RAM available {format_bytes(ram)}")
        for gpu in sample.get("gpus") or []:
            click.echo(
                f"    GPU {gpu['index']} {gpu['name']}: {format_bytes(gpu.get('used_bytes'))}"
                f" / {format_bytes(gpu.get('total_bytes'))} used"
            )
    last = status.get("last_incident")
    click.echo(
        f"  incidents written this run: {status.get('incidents_written', 0)}"
        + (f", last {last}" if last else "")
    )
