"""``oom-bisect fit``: find the cheapest change that makes the failing workflow fit.

The front end of fit.py, as cli.py is of the bisect: it finds the install, the prompt, the
flags and the budget (from a crash snapshot or ``--workflow``), builds the fit's own
workspace (a shared clone at the install's *current* state, beside but apart from a bisect's,
so a bisect in progress is not disturbed), hands the experiment a measuring function (one
fresh ComfyUI per change, the replay harness), and writes the answer: the table, ``--json``,
``fit.html``/``fit.json`` with the changed prompts beside them, and a ``fit/`` folder in the
snapshot. The user's install, flags and workflow file are only read.

Exit statuses (the bisect's where they mean the same; README.md, "oom-bisect fit"):

====  ===========================================================================
0     a change fits: the recommendation is the cheapest one
1     error, or the unchanged workflow fits or cannot be measured (nothing to judge)
2     usage: a bad option
3     an input file (workflow, snapshot) cannot be used
4     nothing fits: every change tried (and the combinations) still fails
130   interrupted (Ctrl-C / SIGTERM)
====  ===========================================================================
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from oom_sentinel.daemon.core.clikit import echo_json, handle_errors
from oom_sentinel.daemon.core.errors import EXIT_ERROR, ConfigError, InputError, SentinelError
from oom_sentinel.daemon.core.units import format_bytes

__all__ = ["EXIT_NOTHING_FITS", "fit_command"]

PROG = "oom-bisect"
EXIT_FITS = 0
EXIT_NOTHING_FITS = 4
EXIT_INTERRUPTED = 130


@dataclass
class FitArgs:
    snapshot_id: str | None = None
    workflow: str | None = None
    comfyui: str | None = None
    python: str | None = None
    flags: str | None = None
    vram_budget: str | None = None
    ram_budget: str | None = None
    pool: str | None = None
    max_runs: int = 12
    keep_going: bool = False
    timeout: float | None = None
    start_timeout: float | None = None
    models_dir: str | None = None
    data_dir: str | None = None
    config_path: str | None = None
    as_json: bool = False


@dataclass
class _Inputs:
    """What the experiment runs on, gathered before anything is written."""

    prompt: dict[str, Any] | None
    workflow: Any  # a loaded workflow that still needs /object_info, or None
    flags: tuple[str, ...]
    comfyui: Path
    discovered: Any
    python: str
    pool: str | None
    fragmentation: bool
    vram_budget: int | None
    ram_budget: int | None
    snapshot: Any
    source: str


class _Progress:
    def __init__(self, console: Console) -> None:
        self.console = console

    def run_start(self, number: int, change: Any) -> None:
        what = "unchanged (baseline)" if change is None else change.label
        self.console.print(f"[bold]run {number}[/bold]: {what} …")

    def run_done(self, number: int, trial: Any) -> None:
        m = trial.measurement
        word = "fits" if trial.fits else f"still fails ({trial.verdict})"
        if trial.verdict == "skip":
            word = "not measured (skip)"
        if trial.change is None:
            word = "fits" if trial.fits else f"fails ({trial.verdict})"
        secs = m.timings.get("prompt_s")
        self.console.print(
            f"  {word}: VRAM {format_bytes(m.peaks.vram_bytes, '—')}, "
            f"RAM {format_bytes(m.peaks.ram_bytes, '—')}"
            + (f", prompt {secs:.2f} s" if secs is not None else "")
            + ("" if trial.fits else f" — {str(trial.reason)[:100]}"),
            highlight=False,
        )


def _gather(args: FitArgs) -> _Inputs:
    from oom_sentinel.bisect.cli import main as bisect_cli
    from oom_sentinel.bisect.state.states import split_state_arg

    if args.max_runs < 2:
        raise ConfigError(
            f"--max-runs must be at least 2 (the baseline and one change), got {args.max_runs}"
        )
    vram_budget = (
        bisect_cli.parse_size(args.vram_budget, "--vram-budget") if args.vram_budget else None
    )
    ram_budget = bisect_cli.parse_size(args.ram_budget, "--ram-budget") if args.ram_budget else None
    snap = None
    prompt = None
    workflow = None
    flags: tuple[str, ...] | None = None
    comfyui_arg, python_arg = args.comfyui, args.python
    pool = args.pool
    fragmentation = False
    if args.snapshot_id and args.workflow:
        raise ConfigError("give a SNAPSHOT_ID or --workflow FILE, not both")
    if args.snapshot_id:
        from oom_sentinel.bisect.state.from_snapshot import read_snapshot_start
        from oom_sentinel.daemon.incidents.snapshot import find_snapshot, load_snapshot

        where = bisect_cli._snapshots_dir(args.data_dir, args.config_path)
        snap = load_snapshot(find_snapshot(where, args.snapshot_id))
        start = read_snapshot_start(snap)
        if start.prompt is None:
            raise InputError(f"snapshot {snap.id}: has no prompt (prompt.json) to replay")
        prompt = start.prompt
        flags = start.flags
        fragmentation = snap.doc.event.pool == "gpu-fragmentation"
        pool = pool or start.pool
        if vram_budget is None and start.vram_cap_bytes is not None:
            vram_budget = start.vram_cap_bytes  # the user's card, on a bigger one too
        if comfyui_arg is None and start.comfyui is not None:
            comfyui_arg = str(start.comfyui)
        if python_arg is None and start.python and Path(start.python).exists():
            python_arg = start.python
        source = f"snapshot {snap.id}"
    elif args.workflow:
        from oom_sentinel.bisect.workflow.load import load_workflow

        loaded = load_workflow(args.workflow)
        if loaded.needs_conversion:
            workflow = loaded
        else:
            prompt = dict(loaded.to_api({}).prompt)
        source = f"--workflow {args.workflow}"
    else:
        raise ConfigError("give a SNAPSHOT_ID or --workflow FILE (the workflow that fails)")
    comfyui, discovered = bisect_cli._resolve_comfyui(comfyui_arg)
    python = bisect_cli._find_python(python_arg, comfyui, discovered)
    if args.flags is not None:
        flags = tuple(split_state_arg(args.flags)) if args.flags.strip() else ()
    elif flags is None:
        has_pid = discovered is not None and getattr(discovered, "pid", None)
        flags = bisect_cli._running_flags(discovered) if has_pid else ()
    return _Inputs(
        prompt,
        workflow,
        tuple(flags or ()),
        comfyui,
        discovered,
        python,
        pool,
        fragmentation,
        vram_budget,
        ram_budget,
        snap,
        source,
    )


def _tiled_vae(ws: Any, object_info: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """VAEDecodeTiled's extra inputs with their defaults, or None when this core has none."""
    from oom_sentinel.bisect.fit.candidates import TILED_DEFAULTS

    if object_info is not None:
        spec = object_info.get("VAEDecodeTiled")
        if not isinstance(spec, Mapping):
            return None
        required = (spec.get("input") or {}).get("required") or {}
        out = {}
        for name, entry in required.items():
            if name in ("samples", "vae"):
                continue
            default = (
                entry[1].get("default")
                if len(entry) > 1 and isinstance(entry[1], Mapping)
                else None
            )
            out[name] = TILED_DEFAULTS.get(name) if default is None else default
        return out
    try:
        text = (ws.comfyui / "nodes.py").read_text("utf-8", errors="replace")
    except OSError:
        return None
    if "class VAEDecodeTiled" not in text:
        return None
    present = {k: v for k, v in TILED_DEFAULTS.items() if f'"{k}"' in text}
    return present or dict(TILED_DEFAULTS)


def _capacity(gpu: Any, vram_budget: int | None, ram_budget: int | None) -> dict[str, int | None]:
    """The memory each pool may use: the budget when given, else this machine's."""
    import psutil

    vram = vram_budget
    if vram is None and gpu is not None:
        try:
            totals = [d.total_bytes for d in gpu.devices() if d.total_bytes]
        except Exception:  # a probe that fails to read is "unknown", not an error
            totals = []
        vram = max(totals) if totals else None
    ram = ram_budget if ram_budget is not None else int(psutil.virtual_memory().total)
    return {"vram": vram, "ram": ram}


def _has_gpu(gpu: Any) -> bool:
    if gpu is None or getattr(gpu, "backend", "none") == "none":
        return False
    try:
        return bool(gpu.devices())
    except Exception:
        return False


def run_fit(args: FitArgs) -> int:
    from oom_sentinel.bisect.cli import main as bisect_cli

    with bisect_cli._sigterm_interrupts():
        try:
            return _run(args)
        except KeyboardInterrupt:
            message = "interrupted; nothing of the user's was changed"
            if args.as_json:
                echo_json({"result": "interrupted", "message": message})
            click.echo(f"{PROG} fit: {message}", err=True)
            return EXIT_INTERRUPTED
        except SentinelError as exc:
            if args.as_json:  # --json always ends with one object, errors included
                echo_json({"result": "error", "message": str(exc)})
            raise


def _run(args: FitArgs) -> int:
    from dataclasses import replace

    from oom_sentinel.bisect.fit.candidates import (
        apply_env,
        apply_flags,
        apply_prompt,
        flag_candidates,
        knob_candidates,
        loads_a_model,
        order,
    )
    from oom_sentinel.bisect.fit.experiment import RESULT_FITS, RESULT_NOTHING_FITS, Experiment
    from oom_sentinel.bisect.fit.report import (
        build_fit_report,
        changed_prompts,
        fit_files,
        render_fit_terminal,
        write_fit_report,
    )
    from oom_sentinel.bisect.measure.flags import parse_cli_args
    from oom_sentinel.bisect.measure.replay import (
        DEFAULT_START_TIMEOUT_S,
        DEFAULT_TIMEOUT_S,
        Replayer,
        ReplaySettings,
    )
    from oom_sentinel.bisect.measure.workspace import Workspace
    from oom_sentinel.bisect.search.verdict import Threshold
    from oom_sentinel.bisect.session.files import BisectPaths
    from oom_sentinel.bisect.session.fsutil import FileLock, remove_tree
    from oom_sentinel.bisect.session.report import attach_to_snapshot
    from oom_sentinel.bisect.state.states import scan_install
    from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe
    from oom_sentinel.daemon.probes.host import PsutilHostProbe

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = err if args.as_json else Console(highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    inputs = _gather(args)
    install = scan_install(inputs.comfyui)
    root = BisectPaths.for_install(inputs.comfyui).root / "fit"
    with FileLock(root / ".lock", "oom-bisect fit for this install"):
        models = Path(args.models_dir) if args.models_dir else None
        ws = Workspace.create(root / "workspace", install, models_dir=models)
        ws.switch(install.current_state())
        gpu = select_gpu_probe().probe
        host = PsutilHostProbe()
        settings = ReplaySettings(
            python=inputs.python,
            user_flags=inputs.flags,
            timeout_s=args.timeout or DEFAULT_TIMEOUT_S,
            start_timeout_s=args.start_timeout or DEFAULT_START_TIMEOUT_S,
            vram_budget_bytes=inputs.vram_budget,
            record_history=False,  # the history costs speed, and speed is measured here
        )
        object_info = None
        prompt = inputs.prompt
        if prompt is None:
            err.print("converting the UI workflow with this install's /object_info …")
            object_info = Replayer(ws, settings, gpu=gpu, host=host).object_info()
            converted = inputs.workflow.to_api(object_info)
            for w in converted.warnings[:10]:
                err.print(f"  note: {w}")
            prompt = dict(converted.prompt)
        spec = parse_cli_args(ws.cli_args_text() or "")
        tiled = _tiled_vae(ws, object_info)
        has_gpu = _has_gpu(gpu)
        budget = Threshold(inputs.vram_budget, inputs.ram_budget)
        capacity = _capacity(gpu, inputs.vram_budget, inputs.ram_budget)

        def candidates(pool: str | None) -> list[Any]:
            pool = pool or ("vram" if has_gpu else "ram")
            flags = flag_candidates(
                pool,
                spec,
                user_flags=inputs.flags,
                environ=os.environ,
                gpu=has_gpu,
                fragmentation=inputs.fragmentation,
                model=loads_a_model(prompt),
            )
            knobs = knob_candidates(prompt, tiled_vae=tiled, object_info=object_info)
            return order([*flags, *knobs])

        threshold = budget if (budget.vram_bytes or budget.ram_bytes) else None

        def measure(change: Any) -> Any:
            run_settings = replace(
                settings,
                user_flags=apply_flags(inputs.flags, change, spec),
                env={**settings.env, **apply_env(change)},
            )
            replayer = Replayer(ws, run_settings, gpu=gpu, host=host)
            # the baseline runs to the end over an emulated budget: its prompt time is the
            # reference for the speed cost; a change is stopped as soon as it crosses
            return replayer.measure(
                apply_prompt(prompt, change), threshold if change is not None else None
            )

        experiment = Experiment(
            measure,
            candidates,
            budget=budget,
            pool=inputs.pool,
            max_runs=args.max_runs,
            keep_going=args.keep_going,
            events=_Progress(err),
        )
        result = experiment.run()
        doc = build_fit_report(
            result,
            install=str(inputs.comfyui),
            source=inputs.source,
            budget=budget,
            capacity=capacity,
            user_flags=inputs.flags,
            elapsed_s=time.monotonic() - t0,
            runs=experiment.runs,
            max_runs=args.max_runs,
        )
        files = fit_files(doc, changed_prompts(result, prompt))
        report_dir = root / "report"
        remove_tree(report_dir)  # the prompts of an earlier experiment must not linger
        html_path = write_fit_report(files, report_dir)
        attached = None
        if inputs.snapshot is not None:
            try:
                attached = attach_to_snapshot(inputs.snapshot.path, files, folder="fit")
            except OSError as exc:
                err.print(f"{PROG}: warning: cannot attach the fit to the snapshot: {exc}")
    render_fit_terminal(doc, out)
    out.print(f"report: {html_path}", highlight=False)
    if attached is not None:
        out.print(f"attached to the snapshot: {attached}", highlight=False)
    if args.as_json:
        echo_json(
            {
                **doc,
                "report": {"html": str(html_path), "dir": str(report_dir)},
                "attached_to": None if attached is None else str(attached),
            }
        )
    if doc["result"] == RESULT_FITS:
        return EXIT_FITS
    if not args.as_json:
        err.print(f"{PROG} fit: {doc['headline']}")
    if doc["result"] == RESULT_NOTHING_FITS:
        return EXIT_NOTHING_FITS
    return EXIT_ERROR


@click.command("fit")
@click.argument("snapshot_id", required=False)
@click.option("--workflow", metavar="FILE", help="API/UI workflow JSON (instead of a snapshot).")
@click.option("--comfyui", metavar="PATH", help="The ComfyUI install (default: found).")
@click.option("--python", metavar="PATH", help="ComfyUI's Python (default: found).")
@click.option(
    "--flags",
    metavar="'FLAGS'",
    help="The flags ComfyUI runs with (default: the snapshot's or the running ComfyUI's).",
)
@click.option("--vram-budget", metavar="SIZE", help="Emulate a card with SIZE of VRAM (8GiB).")
@click.option("--ram-budget", metavar="SIZE", help="A run using more RAM than SIZE does not fit.")
@click.option(
    "--pool",
    type=click.Choice(["vram", "ram"]),
    default=None,
    help="The memory that ran out (default: the snapshot's, else the baseline's).",
)
@click.option(
    "--max-runs",
    type=int,
    default=12,
    show_default=True,
    help="At most N ComfyUI runs, the baseline included.",
)
@click.option(
    "--keep-going", is_flag=True, help="Measure every change, not only up to the first fit."
)
@click.option("--timeout", type=float, default=None, metavar="S", help="Per prompt (1800).")
@click.option("--start-timeout", type=float, default=None, metavar="S", help="Per start (600).")
@click.option("--models-dir", metavar="PATH", help="The models folder (default: found).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="oom-sentinel's data dir.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON object.")
@handle_errors(PROG)
def fit_command(**kw: Any) -> None:
    """Find the cheapest launch flag or workflow knob that makes a failing workflow fit.

    Replays the failing prompt (a crash snapshot's, or --workflow) on the install as it is,
    then one change at a time, each in a fresh ComfyUI, and recommends the cheapest change
    that fits. The install, its flags and the workflow file are never changed; the changed
    prompts are written beside the report as fit-<change>.json.
    """
    sys.exit(run_fit(FitArgs(**kw)))
