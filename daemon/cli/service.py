"""``oom-sentinel service install|uninstall``: run the watchdog as a real service, in one step.

On Linux it renders the shipped systemd unit (``systemd/oom-sentinel.service`` for
``--system``, ``systemd/oom-sentinel-user.service`` for ``--user``) with:

* ``ExecStart=`` the ``oom-sentinel`` entry point of *this* interpreter (the venv it was
  installed in), so the service runs the same code the user just tested;
* ``Environment=OOM_SENTINEL_CONFIG=`` when a config file was named (``--config``);
* ``ReadOnlyPaths=`` the ComfyUI installs and log directories it watches: the configured ones
  and, unless ``--no-discover``, the ones discovery finds now;

writes it atomically, then runs ``systemctl daemon-reload`` and ``enable --now``.
``--dry-run`` prints the unit and the commands and changes nothing. On Windows it installs the
pywin32 service instead (``windows_service/service.py``).

The rendering is pure (``render_unit``) so tests and packagers can check it; only ``apply_plan``
writes and runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import click

from oom_sentinel.config.settings import SYSTEM_CONFIG, Settings, load_settings
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.clikit import handle_errors
from oom_sentinel.daemon.core.errors import ConfigError, SentinelError

__all__ = [
    "UNIT_NAME",
    "ServiceError",
    "UnitPlan",
    "apply_plan",
    "entry_point",
    "plan_install",
    "plan_uninstall",
    "render_unit",
    "service_group",
    "systemd_quote",
    "templates_dir",
    "watched_paths",
]

PROG = "oom-sentinel"
UNIT_NAME = "oom-sentinel.service"
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
_TEMPLATES = {"system": "oom-sentinel.service", "user": "oom-sentinel-user.service"}
Mode = Literal["system", "user"]


class ServiceError(SentinelError):
    """Installing or removing the service failed (permissions, systemctl, SCM)."""


def templates_dir() -> Path:
    """The shipped unit files: ``systemd/`` in a checkout, ``oom_sentinel/systemd`` installed."""
    return Path(__file__).resolve().parents[2] / "systemd"


# --- pure: what to write ------------------------------------------------------------------------


def systemd_quote(arg: str, *, exec_line: bool = False) -> str:
    """One word of a unit setting: ``%`` escaped (specifiers), ``$`` too on ExecStart= lines
    (variable expansion), double-quoted when it holds blanks, quotes or backslashes."""
    escaped = arg.replace("%", "%%")
    if exec_line:
        escaped = escaped.replace("$", "$$")
    if escaped and not any(c.isspace() or c in "\"'\\" for c in escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def entry_point(
    executable: str = sys.executable, which: Callable[[str], str | None] = shutil.which
) -> list[str]:
    """The command that runs ``oom-sentinel`` with this interpreter: the console script next
    to it (a venv's ``bin/``), else ``python -m oom_sentinel.daemon``."""
    bin_dir = Path(executable).parent
    for name in ("oom-sentinel", "oom-sentinel.exe"):
        candidate = bin_dir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return [str(candidate.absolute())]
    return [str(Path(executable).absolute()), "-m", "oom_sentinel.daemon"]


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def watched_paths(
    settings: Settings,
    *,
    discover: bool = True,
    homes: Sequence[Path] = (),
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Absolute paths of the ComfyUI installs and log directories to make read-only: the
    configured instances and ``logs.extra``, plus what discovery finds (running processes and
    the usual install locations under ``homes``). Outermost paths only, sorted."""
    env = os.environ if environ is None else environ
    found: list[str] = []

    def add(path: str | os.PathLike[str] | None, *, parent: bool = False) -> None:
        if not path:
            return
        p = Path(os.path.expanduser(os.fspath(path)))
        if parent:
            p = p.parent
        found.append(os.path.normpath(str(p.absolute())))

    for inst in settings.instances:
        add(inst.path)
        for log_path in inst.logs:
            add(log_path, parent=True)
    for log_path in settings.logs.extra:
        add(log_path, parent=True)
    if discover:
        from oom_sentinel.daemon.comfy.discovery import discover_instances
        from oom_sentinel.daemon.comfy.processes import find_comfy_processes

        processes = find_comfy_processes()
        seen_homes: set[Path] = set()
        for home in homes:
            if home in seen_homes:
                continue
            seen_homes.add(home)
            for found_inst in discover_instances(home=home, environ=env, processes=processes):
                add(found_inst.path)
                if found_inst.code_dir:
                    add(found_inst.code_dir)
                for log_path in found_inst.log_paths:
                    add(log_path, parent=True)
            processes = []  # running processes are listed once, with the first home
    outer: list[str] = []
    for path in sorted(set(found), key=lambda p: (len(p), p)):
        if not _under(path, outer):
            outer.append(path)
    return sorted(outer)


def render_unit(
    template: str,
    *,
    exec_start: Sequence[str],
    read_only_paths: Sequence[str] = (),
    config_path: str | None = None,
    read_write_paths: Sequence[str] = (),
    enforce_paths: bool = True,
) -> str:
    """The template with ``ExecStart=`` replaced and the install's lines added after it.

    ``enforce_paths=False`` writes the path lines as comments: a user manager needs
    unprivileged user namespaces for them, and where those are off the unit would not start.
    """
    prefix = "" if enforce_paths else "# "
    out: list[str] = []
    done = False
    for line in template.splitlines():
        if line.startswith("ExecStart=") and not done:
            done = True
            command = " ".join(systemd_quote(a, exec_line=True) for a in exec_start)
            out.append(f"ExecStart={command} run")
            if config_path:
                out.append(f"Environment={systemd_quote('OOM_SENTINEL_CONFIG=' + config_path)}")
            continue
        if line.strip() == "# ReadOnlyPaths=":
            out.append(line)
            out += [f"{prefix}ReadOnlyPaths=-{systemd_quote(p)}" for p in read_only_paths]
            out += [f"{prefix}ReadWritePaths={systemd_quote(p)}" for p in read_write_paths]
            continue
        out.append(line)
    if not done:
        raise ValueError("the unit template has no ExecStart= line")
    return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """Everything ``service install``/``uninstall`` will do, for ``--dry-run`` to print."""

    mode: Mode
    unit_path: Path
    #: the unit file's new text; None for an uninstall
    text: str | None
    #: commands run after writing (or, uninstalling, before removing) the unit
    commands: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()


def _user_unit_dir(environ: Mapping[str, str], home: Path) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    return Path(config) / "systemd" / "user"


def _systemctl(mode: Mode, *args: str) -> tuple[str, ...]:
    return ("systemctl", *(("--user",) if mode == "user" else ()), *args)


def plan_install(
    mode: Mode,
    settings: Settings,
    *,
    config_path: Path | None,
    unit_dir: Path | None = None,
    discover: bool = True,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    executable: str = sys.executable,
) -> UnitPlan:
    env = os.environ if environ is None else environ
    home = home or Path.home()
    template = (templates_dir() / _TEMPLATES[mode]).read_text("utf-8")
    homes = [home]
    sudo_user = env.get("SUDO_USER")
    if mode == "system" and sudo_user:
        with contextlib.suppress(KeyError, ImportError):
            import pwd

            homes.append(Path(pwd.getpwnam(sudo_user).pw_dir))
    read_only = watched_paths(settings, discover=discover, homes=homes, environ=env)
    notes: list[str] = []
    read_write: list[str] = []
    if mode == "system" and settings.data_dir:
        data_dir = str(settings.resolved_data_dir().absolute())
        read_write.append(data_dir)
        notes.append(
            f"data_dir is set to {data_dir} in the config: the service's user (DynamicUser) "
            "must be able to write there; leave data_dir empty to use /var/lib/oom-sentinel"
        )
    if not read_only:
        notes.append("no ComfyUI install found to list in ReadOnlyPaths= (discovery still runs)")
    config = None
    if config_path is not None and not (mode == "system" and config_path == SYSTEM_CONFIG):
        config = str(config_path.absolute())
    text = render_unit(
        template,
        exec_start=entry_point(executable),
        read_only_paths=read_only,
        config_path=config,
        read_write_paths=read_write,
        enforce_paths=mode == "system",
    )
    directory = unit_dir or (SYSTEM_UNIT_DIR if mode == "system" else _user_unit_dir(env, home))
    if mode == "user":
        notes.append(
            "to keep it running while you are logged out: loginctl enable-linger "
            + (env.get("USER") or "$USER")
        )
    return UnitPlan(
        mode=mode,
        unit_path=directory / UNIT_NAME,
        text=text,
        commands=(
            _systemctl(mode, "daemon-reload"),
            _systemctl(mode, "enable", "--now", UNIT_NAME),
        ),
        notes=tuple(notes),
    )


def plan_uninstall(
    mode: Mode,
    *,
    unit_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> UnitPlan:
    env = os.environ if environ is None else environ
    home = home or Path.home()
    directory = unit_dir or (SYSTEM_UNIT_DIR if mode == "system" else _user_unit_dir(env, home))
    return UnitPlan(
        mode=mode,
        unit_path=directory / UNIT_NAME,
        text=None,
        commands=(_systemctl(mode, "disable", "--now", UNIT_NAME),),
        notes=("the data dir (store and snapshots) is kept",),
    )


# --- doing it -------------------------------------------------------------------------------


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _run(command: Sequence[str], run: Runner) -> None:
    try:
        proc = run(list(command), capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise ServiceError(
            f"{command[0]}: not found; is this a systemd system? (--dry-run prints the unit)"
        ) from None
    except subprocess.TimeoutExpired:
        raise ServiceError(f"{' '.join(command)}: no answer within 120 s") from None
    if proc.returncode != 0:
        detail = " ".join((proc.stderr or proc.stdout or "").split())[:300]
        raise ServiceError(
            f"{' '.join(command)} failed (exit {proc.returncode}): {detail or 'no message'}"
        )


def apply_plan(plan: UnitPlan, run: Runner = subprocess.run) -> None:
    """Write (or remove) the unit and run the plan's commands; ``ServiceError`` on failure."""
    directory = plan.unit_path.parent
    if plan.text is not None:
        target = directory if directory.exists() else directory.parent
        if not os.access(target, os.W_OK) and not (
            plan.unit_path.exists() and os.access(plan.unit_path, os.W_OK)
        ):
            hint = "run it with sudo, or use --user" if plan.mode == "system" else "check it"
            raise ServiceError(
                f"{directory}: cannot write the unit there ({hint}; --dry-run prints it)"
            )
        try:
            write_text_atomic(plan.unit_path, plan.text, mode=0o644)
        except OSError as exc:
            raise ServiceError(
                f"{exc.filename or plan.unit_path}: cannot write the unit: {exc.strerror or exc}"
            ) from None
        for command in plan.commands:
            _run(command, run)
        return
    if plan.unit_path.exists():
        for command in plan.commands:
            _run(command, run)
        try:
            plan.unit_path.unlink()
        except OSError as exc:
            raise ServiceError(
                f"{plan.unit_path}: cannot remove the unit: {exc.strerror or exc}"
            ) from None
    _run(_systemctl(plan.mode, "daemon-reload"), run)


# --- the commands -------------------------------------------------------------------------------


def _mode(user: bool, system: bool) -> Mode:
    if user and system:
        raise ConfigError("choose one of --user and --system")
    if user:
        return "user"
    if system:
        return "system"
    return "system" if hasattr(os, "geteuid") and os.geteuid() == 0 else "user"


def _print_plan(plan: UnitPlan) -> None:
    if plan.text is not None:
        click.echo(f"# {plan.unit_path}")
        click.echo(plan.text, nl=False)
        click.echo()
    else:
        click.echo(f"# would remove {plan.unit_path}")
    click.echo("# then run:")
    for command in plan.commands:
        click.echo(" ".join(command))
    if plan.text is None:
        click.echo(" ".join(_systemctl(plan.mode, "daemon-reload")))


@click.group("service")
def service_group() -> None:
    """Install or remove the watchdog as a system service (systemd, or Windows)."""


_unit_dir_option = click.option(
    "--unit-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the unit here instead of systemd's directory (packaging, tests).",
)


@service_group.command("install")
@click.option("--user", "user", is_flag=True, help="A user service (systemctl --user).")
@click.option("--system", "system", is_flag=True, help="A system service (needs root).")
@click.option("--dry-run", is_flag=True, help="Print the unit and the commands; change nothing.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--no-discover", is_flag=True, help="List only configured paths in ReadOnlyPaths=.")
@_unit_dir_option
@handle_errors(PROG)
def install_command(
    user: bool,
    system: bool,
    dry_run: bool,
    config_path: str | None,
    no_discover: bool,
    unit_dir: Path | None,
) -> None:
    """Write the service unit, then enable and start it (default: --system as root)."""
    loaded = load_settings(config_path)
    if sys.platform == "win32":  # pragma: no cover - exercised through windows_service tests
        from oom_sentinel.windows_service.service import install_service

        for line in install_service(config_path=loaded.source, dry_run=dry_run):
            click.echo(line)
        return
    mode = _mode(user, system)
    plan = plan_install(
        mode,
        loaded.settings,
        config_path=Path(config_path) if config_path else None,
        unit_dir=unit_dir,
        discover=not no_discover,
    )
    if dry_run:
        _print_plan(plan)
        for note in plan.notes:
            click.echo(f"# note: {note}")
        return
    apply_plan(plan)
    click.echo(f"installed {plan.unit_path} and started it ({mode} service)")
    click.echo(f"  status: {' '.join(_systemctl(mode, 'status', UNIT_NAME))}")
    click.echo(f"  alerts: {PROG} alert test")
    for note in plan.notes:
        click.echo(f"  note: {note}")


@service_group.command("uninstall")
@click.option("--user", "user", is_flag=True, help="The user service.")
@click.option("--system", "system", is_flag=True, help="The system service (needs root).")
@click.option("--dry-run", is_flag=True, help="Print the commands; change nothing.")
@_unit_dir_option
@handle_errors(PROG)
def uninstall_command(user: bool, system: bool, dry_run: bool, unit_dir: Path | None) -> None:
    """Stop and disable the service and remove its unit (the data dir is kept)."""
    if sys.platform == "win32":  # pragma: no cover - exercised through windows_service tests
        from oom_sentinel.windows_service.service import uninstall_service

        for line in uninstall_service(dry_run=dry_run):
            click.echo(line)
        return
    mode = _mode(user, system)
    plan = plan_uninstall(mode, unit_dir=unit_dir)
    if dry_run:
        _print_plan(plan)
        return
    apply_plan(plan)
    click.echo(f"removed {plan.unit_path} ({mode} service); the data dir is kept")
