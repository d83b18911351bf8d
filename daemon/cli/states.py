"""``oom-sentinel states``: install states -- those the daemon recorded (``list``, ``show ID``,
``diff A B`` by state id, from the store in the data dir) and those on disk (capture an install,
show a state file of ours or ComfyUI-Manager's, diff two of them, reconstruct the past from the
reflogs, export a state as a Manager snapshot).

Wherever a command takes a state, it takes a state id (or a unique prefix), a state file, or
(``diff``) an install directory, which is captured now. The store is opened only when an
argument is neither a file nor a directory, so the file commands work without a daemon.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import click

from oom_sentinel.daemon.comfy.interpreter import DEFAULT_TIMEOUT_S, find_interpreter
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.clikit import echo_json, echo_table, handle_errors
from oom_sentinel.daemon.core.errors import InputError
from oom_sentinel.daemon.core.units import format_bytes
from oom_sentinel.daemon.install.diff import diff_states, repos_for_state
from oom_sentinel.daemon.install.history import (
    StateListing,
    list_states,
    load_state,
    observations,
    resolve_state_ref,
)
from oom_sentinel.daemon.install.manager_snapshots import (
    OUR_POSTFIX,
    manager_snapshot_filename,
    read_state_file,
    resolve_unknown_commits,
    write_manager_snapshot,
)
from oom_sentinel.daemon.install.reflog import import_install_history, last_update
from oom_sentinel.daemon.install.state import (
    InstallState,
    capture_install,
    resolve_comfyui_root,
)
from oom_sentinel.daemon.store.db import Store

__all__ = ["state_summary", "states_group"]

PROG = "oom-sentinel"


# ---------------------------------------------------------------------------------------------
# Output shapes


def state_summary(state: InstallState) -> dict[str, Any]:
    """The documented JSON shape of ``states show``/``capture``: ``comfyui`` is the commit (or
    null) and ``nodes`` is ``{name: {commit, version, disabled, url, ...}}``, null where
    unknown; the full record follows under ``state``."""
    return {
        "state_id": state.state_id,
        "source": state.source,
        "captured_at": _iso(state.captured_at_epoch_s),
        "comfyui": state.comfyui.commit,
        "nodes": {
            key: {
                "commit": node.commit,
                "version": node.version,
                "disabled": node.disabled,
                "url": node.url,
                "kind": node.kind,
                "content_hash": node.content_hash,
            }
            for key, node in state.node_table().items()
        },
        "state": state.to_dict(),
    }


def _iso(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(epoch_s))


def _print_state(state: InstallState) -> None:
    core = state.comfyui
    when = _iso(state.captured_at_epoch_s)
    click.echo(f"state {state.state_id}  ({state.source}{', ' + when if when else ''})")
    parts = [f"ComfyUI {core.commit[:12] if core.commit else 'commit unknown'}"]
    if core.branch:
        parts.append(f"branch {core.branch}")
    if core.version:
        parts.append(f"v{core.version}")
    if core.url:
        parts.append(core.url)
    if core.dirty:
        parts.append(f"{len(core.dirty)} modified file{'s' if len(core.dirty) != 1 else ''}")
    click.echo("  ".join(parts))
    table = state.node_table()
    click.echo(f"custom nodes ({len(table)}):")
    width = max((len(k) for k in table), default=0)
    for key, node in table.items():
        if node.kind == "git":
            what = node.commit[:12] if node.commit else "unknown"
        elif node.kind == "cnr":
            what = node.version or "version unknown"
        else:
            what = (node.content_hash or "content unknown")[:19]
        extra = f"  {node.url}" if node.url else ""
        flag = "  [disabled]" if node.disabled else ""
        click.echo(f"  {key:<{width}}  {node.kind:<6} {what}{extra}{flag}")
    if state.pip is None:
        click.echo("pip: not recorded")
    else:
        torch = [line for line in state.pip if line.lower().startswith("torch==")]
        click.echo(f"pip: {len(state.pip)} packages{' (' + torch[0] + ')' if torch else ''}")
    env = state.interpreter
    if env is not None:
        if env.error:
            click.echo(f"interpreter {env.executable}: {env.error}")
        else:
            bits = [f"python {env.python_version}"]
            bits.append(f"torch {env.torch_version}" if env.torch_version else "torch absent")
            if env.cuda_version:
                bits.append(f"CUDA {env.cuda_version}")
            if env.hip_version:
                bits.append(f"HIP {env.hip_version}")
            if env.cudnn_version:
                bits.append(f"cuDNN {env.cudnn_version}")
            if env.driver_version:
                bits.append(f"driver {env.driver_version}")
            for gpu in env.gpus:
                mem = (
                    f" {format_bytes(gpu.total_memory_bytes)}"
                    if gpu.total_memory_bytes is not None
                    else ""
                )
                bits.append(f"GPU{gpu.index} {gpu.name}{mem}")
            click.echo("  ".join(bits))


# ---------------------------------------------------------------------------------------------
# Loading states from arguments


def _interpreter_for(root: Path, python: str | None, no_python: bool) -> str | Path | None:
    if no_python:
        return None
    if python:
        return python
    return find_interpreter(root)


class _StoreAccess:
    """The daemon's store, opened on first use (file arguments never need it)."""

    def __init__(self, data_dir: str | None, config_path: str | None) -> None:
        self._data_dir = data_dir
        self._config_path = config_path
        self._store: Store | None = None

    @property
    def directory(self) -> Path:
        if self._data_dir:
            return Path(self._data_dir).expanduser()
        from oom_sentinel.config.settings import load_settings

        return load_settings(self._config_path).settings.resolved_data_dir()

    def get(self) -> Store:
        if self._store is None:
            directory = self.directory
            store = Store.open_existing(directory)
            if store is None:
                raise InputError(
                    f"{directory}: no oom-sentinel store here (the daemon has not run with this "
                    "data dir; give --data-dir)"
                )
            self._store = store
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _stored(ref: str, stores: _StoreAccess) -> InstallState:
    """The recorded state ``ref`` names (an id or a unique prefix); anything that cannot be a
    state id is a file that does not exist."""
    if not re.fullmatch(r"[0-9a-fA-F]{4,16}", ref.strip()):
        raise InputError(f"{Path(ref).expanduser()}: no such file")
    store = stores.get()
    state_id = resolve_state_ref(store, ref)
    state = load_state(store, state_id)
    if state is None:  # removed between the two reads
        raise InputError(f"no install state {state_id} in {store.path}")
    return state


def _load(
    arg: str,
    python: str | None,
    no_python: bool,
    timeout_s: float,
    stores: _StoreAccess,
) -> InstallState:
    """A state from a file (ours or Manager's), by capturing the install at a directory, or
    from the store by id."""
    path = Path(arg).expanduser()
    if path.is_dir():
        root = resolve_comfyui_root(path)
        return capture_install(
            root,
            interpreter=_interpreter_for(root, python, no_python),
            timeout_s=timeout_s,
        )
    if path.exists():
        return read_state_file(path)
    return _stored(arg, stores)


_python_options = [
    click.option(
        "--python",
        "python",
        type=click.Path(dir_okay=False),
        help="ComfyUI's interpreter (default: the install's venv or python_embeded).",
    ),
    click.option(
        "--no-python", is_flag=True, help="Do not run ComfyUI's interpreter (no pip/torch facts)."
    ),
    click.option(
        "--timeout-s",
        type=click.FloatRange(min=1),
        default=DEFAULT_TIMEOUT_S,
        show_default=True,
        help="Time limit for each run of ComfyUI's interpreter.",
    ),
]


def _with_python_options(func: Any) -> Any:
    for option in reversed(_python_options):
        func = option(func)
    return func


_store_options = [
    click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        help="Data directory of the daemon's store (default: from the config, else the "
        "platform's data dir).",
    ),
    click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file."),
]


def _with_store_options(func: Any) -> Any:
    for option in reversed(_store_options):
        func = option(func)
    return func


# ---------------------------------------------------------------------------------------------
# Commands


@click.group("states")
def states_group() -> None:
    """Install states: ComfyUI's commit, every custom node, the Python environment."""


@states_group.command("list")
@click.option("--instance", help="Only states this ComfyUI instance was observed in.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_with_store_options
@handle_errors(PROG)
def states_list(
    instance: str | None, as_json: bool, data_dir: str | None, config_path: str | None
) -> None:
    """Install states the daemon recorded, most recently observed first."""
    stores = _StoreAccess(data_dir, config_path)
    store = Store.open_existing(stores.directory)
    if store is None:
        listing: list[StateListing] = []
    else:
        with store:
            listing = list_states(store, instance=instance)
    if as_json:
        echo_json({"states": [item.to_json() for item in listing]})
        return
    if not listing:
        click.echo(f"no install states recorded in {stores.directory}")
        return
    header = ("state", "last observed", "instances", "from", "ComfyUI", "nodes", "pip", "")
    rows = [
        (
            item.state_id,
            _iso(item.last_at_s) or "-",
            ",".join(item.instances) or "-",
            ",".join(item.sources) or item.source,
            item.comfyui_commit[:12] if item.comfyui_commit else "-",
            str(item.node_count),
            "yes" if item.has_pip else "-",
            f"current ({', '.join(item.current_for)})" if item.current_for else "",
        )
        for item in listing
    ]
    echo_table(header, rows)


@states_group.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--resolve",
    "resolve_root",
    type=click.Path(file_okay=False),
    help="Fill 'unknown' commits of a Manager file from the install at this path.",
)
@_with_store_options
@handle_errors(PROG)
def states_show(
    ref: str,
    as_json: bool,
    resolve_root: str | None,
    data_dir: str | None,
    config_path: str | None,
) -> None:
    """Show a state: REF is a state id the daemon recorded (or a unique prefix), a
    ComfyUI-Manager snapshot (.json/.yaml) or a state file."""
    path = Path(ref).expanduser()
    stores = _StoreAccess(data_dir, config_path)
    seen: list[dict[str, Any]] = []
    try:
        if path.is_dir():
            raise InputError(f"{path}: a directory; use `states capture` for an install")
        if path.exists():
            state = read_state_file(path)
        else:
            state = _stored(ref, stores)
            seen = [o.to_json() for o in observations(stores.get(), state_id=state.state_id)]
    finally:
        stores.close()
    if resolve_root:
        state = resolve_unknown_commits(state, capture_install(resolve_root))
    if as_json:
        echo_json({**state_summary(state), "observations": seen})
        return
    _print_state(state)
    for o in seen:
        click.echo(
            f"observed: {o['instance']} from {_iso(o['at_s'])} ({o['source']}"
            f"{': ' + o['detail'] if o['detail'] else ''})"
        )
    if not path.exists():  # a recorded state: oom-bisect can rebuild it beside the install
        click.echo(
            f"run it separately (the live install is left as it is): "
            f"oom-bisect checkout {state.state_id} --into DIR"
        )


@states_group.command("capture")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Also write the state to this file."
)
@_with_python_options
@handle_errors(PROG)
def states_capture(
    path: str,
    as_json: bool,
    output: str | None,
    python: str | None,
    no_python: bool,
    timeout_s: float,
) -> None:
    """Capture the install at PATH now (reads only; never changes the install)."""
    root = resolve_comfyui_root(path)
    state = capture_install(
        root, interpreter=_interpreter_for(root, python, no_python), timeout_s=timeout_s
    )
    if output:
        write_text_atomic(output, state.to_json(), mode=0o644)
    if as_json:
        echo_json(state_summary(state))
    else:
        _print_state(state)
        if output:
            click.echo(f"written to {output}")


@states_group.command("diff")
@click.argument("old")
@click.argument("new")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--repos",
    "repos_root",
    type=click.Path(file_okay=False),
    help="Resolve commit ranges in the repos of the install at this path.",
)
@_with_python_options
@_with_store_options
@handle_errors(PROG)
def states_diff(
    old: str,
    new: str,
    as_json: bool,
    repos_root: str | None,
    python: str | None,
    no_python: bool,
    timeout_s: float,
    data_dir: str | None,
    config_path: str | None,
) -> None:
    """What changed from OLD to NEW: per repo the commit range (count, first and last
    subjects), nodes added, removed, enabled or disabled, and pip changes. Each of OLD and NEW
    is a state id the daemon recorded, a state file, a Manager snapshot or an install directory
    (captured now)."""
    stores = _StoreAccess(data_dir, config_path)
    try:
        a = _load(old, python, no_python, timeout_s, stores)
        b = _load(new, python, no_python, timeout_s, stores)
    finally:
        stores.close()
    repo_states = [s for s in (a, b) if s.root is not None]
    if repos_root:
        repo_states.append(capture_install(resolve_comfyui_root(repos_root)))
    diff = diff_states(a, b, repos=repos_for_state(*repo_states))
    if as_json:
        echo_json(diff.to_dict())
        return
    click.echo(f"{a.state_id} ({a.source}) -> {b.state_id} ({b.source})")
    lines = diff.summary_lines()
    if diff.is_empty:
        click.echo("no changes")
    for line in lines:
        click.echo(f"  {line}")


@states_group.command("history")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors(PROG)
def states_history(path: str, as_json: bool) -> None:
    """Earlier states of the install at PATH, reconstructed from the git reflogs of ComfyUI
    and every node (and the Windows updater's backup branches)."""
    root = resolve_comfyui_root(path)
    history = import_install_history(root)
    update = last_update(history)
    if as_json:
        echo_json(
            {
                "states": [
                    {
                        "state_id": h.state.state_id,
                        "at": _iso(h.at_epoch_s),
                        "at_epoch_s": h.at_epoch_s,
                        "event": h.description,
                        "comfyui": h.state.comfyui.commit,
                        "nodes": {
                            k: {"commit": n.commit, "disabled": n.disabled}
                            for k, n in h.state.node_table().items()
                            if n.kind == "git"
                        },
                    }
                    for h in history
                ],
                "before_last_update": None if update is None else update[0].state.state_id,
            }
        )
        return
    if not history:
        click.echo("no reflog history found")
        return
    previous: InstallState | None = None
    for h in history:
        click.echo(f"{_iso(h.at_epoch_s) or '(earliest)':<25} {h.state.state_id}  {h.description}")
        if previous is not None:
            for line in diff_states(previous, h.state).summary_lines():
                if not line.startswith("pip:") and not line.startswith("ComfyUI's commit"):
                    click.echo(f"{'':<27}{line}")
        previous = h.state
    if update is not None:
        click.echo(
            f"state before the last update: {update[0].state.state_id} "
            f"(oom-bisect --good before-last-update)"
        )


@states_group.command("export")
@click.argument("path", type=click.Path(file_okay=False))
@click.option(
    "--manager",
    is_flag=True,
    help="Write a ComfyUI-Manager snapshot (<time>_oom-sentinel.json) instead of our format.",
)
@click.option(
    "-d",
    "--dir",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Folder to write into (default: the current folder). Use the install's "
    "user/__manager/snapshots to see it in ComfyUI-Manager.",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Exact file to write.")
@_with_python_options
@handle_errors(PROG)
def states_export(
    path: str,
    manager: bool,
    out_dir: str | None,
    output: str | None,
    python: str | None,
    no_python: bool,
    timeout_s: float,
) -> None:
    """Capture the install at PATH and write it to a file; prints the file's path."""
    if out_dir and output:
        raise InputError("--dir and --output: give one or the other")
    root = resolve_comfyui_root(path)
    state = capture_install(
        root, interpreter=_interpreter_for(root, python, no_python), timeout_s=timeout_s
    )
    folder = Path(out_dir) if out_dir else Path.cwd()
    at = state.captured_at_epoch_s or time.time()
    if manager:
        written = write_manager_snapshot(state, folder, path=output, at_epoch_s=at)
    else:
        name = manager_snapshot_filename(at, OUR_POSTFIX).replace(".json", ".state.json")
        written = write_text_atomic(
            Path(output) if output else folder / name, state.to_json(), mode=0o644
        )
    click.echo(str(written))
