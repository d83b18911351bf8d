"""``oom-sentinel doctor [INSTANCE]``: the seed guide's first diagnosis of an OOM-prone ComfyUI.

One command instead of ``nvidia-smi``, ``ps``, ``python -c "import torch; ..."`` in the right
venv, ``free -h`` and a look through old logs: the findings come in the order the guide asks
(other GPU users and a second instance first), each with a verdict and what to do. ``--json``
gives the same findings plus the facts behind them, for scripts and bug reports.

Exit status: 0 when no finding is a problem (warnings and unknowns do not fail), 1 when at
least one is, 2 for usage errors (an unknown instance name, a missing ``--python``).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import click

from oom_sentinel.daemon.comfy.interpreter import DEFAULT_TIMEOUT_S
from oom_sentinel.daemon.core.clikit import echo_json, handle_errors
from oom_sentinel.daemon.core.redact import redact, redact_text
from oom_sentinel.daemon.doctor.checks import (
    DoctorFacts,
    Finding,
    diagnose,
    exit_status,
    overall_verdict,
    report_json,
)

__all__ = ["doctor_command", "render_report"]

PROG = "oom-sentinel"

_LABEL = {"ok": "OK", "warning": "WARNING", "problem": "PROBLEM", "unknown": "UNKNOWN"}
_COLOR = {"ok": "green", "warning": "yellow", "problem": "red", "unknown": "blue"}
_PYTHON_SOURCE = {
    "--python": "named with --python",
    "process": "the running ComfyUI's interpreter",
    "install": "found in the install",
}


@click.command("doctor")
@click.argument("instance", required=False, metavar="[INSTANCE]")
@click.option(
    "--comfyui",
    metavar="PATH|URL",
    help="The ComfyUI to diagnose: its install folder or its http URL.",
)
@click.option(
    "--python",
    "python",
    type=click.Path(dir_okay=False),
    help="ComfyUI's interpreter (default: the running process's, or the install's venv / "
    "python_embeded).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings and facts as JSON.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1.0),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds the torch probe may take in ComfyUI's interpreter.",
)
@click.option("--no-torch", is_flag=True, help="Do not run torch in ComfyUI's interpreter.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Where snapshots are read.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@handle_errors(PROG)
def doctor_command(
    instance: str | None,
    comfyui: str | None,
    python: str | None,
    as_json: bool,
    timeout_s: float,
    no_torch: bool,
    data_dir: str | None,
    config_path: str | None,
) -> None:
    """Diagnose an out-of-memory-prone ComfyUI: GPU users, a second instance, CUDA in
    ComfyUI's own interpreter, free VRAM, RAM and swap, launch flags, the last incidents.

    INSTANCE is a name from discovery (the folder name, with :PORT when two share it) or the
    config;
    without one, the running ComfyUI (or the first configured or found install) is diagnosed.
    Exit status: 0 no problem found, 1 a problem found, 2 bad usage.
    """
    from oom_sentinel.config.settings import load_settings
    from oom_sentinel.daemon.doctor.collect import DoctorOptions, collect_facts

    settings = load_settings(config_path).settings
    options = DoctorOptions(
        instance=instance,
        comfyui=comfyui,
        python=python,
        timeout_s=timeout_s,
        data_dir=Path(data_dir).expanduser() if data_dir else None,
        settings=settings,
        torch=not no_torch,
    )
    if not as_json and sys.stderr.isatty():
        click.echo("Looking at processes, the GPU, memory and ComfyUI's interpreter…", err=True)
    facts = collect_facts(options)
    findings = diagnose(facts)
    if as_json:
        echo_json(redact(report_json(facts, findings)))
    else:
        click.echo(render_report(facts, findings, width=_width()))
    sys.exit(exit_status(findings))


def _width() -> int:
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        return 100
    return max(60, min(120, shutil.get_terminal_size((100, 24)).columns))


def _wrap(text: str, width: int, indent: str) -> list[str]:
    out: list[str] = []
    for para in text.splitlines():
        out += textwrap.wrap(
            para,
            width=width,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or [indent]
    return out


def render_report(
    facts: DoctorFacts, findings: list[Finding] | tuple[Finding, ...], *, width: int = 100
) -> str:
    """The human report: who was examined, then one block per finding, then the summary."""
    lines: list[str] = []
    target = facts.target
    if target is not None:
        where = [target.path or target.url]
        if facts.process is not None:
            where.append(f"pid {facts.process.pid}")
        where.append(target.url)
        lines.append(f"ComfyUI {target.name!r}: " + ", ".join(dict.fromkeys(w for w in where if w)))
    else:
        lines.append("No ComfyUI install was found or named; checking the machine only.")
    if facts.python:
        how = _PYTHON_SOURCE.get(facts.python_source or "", facts.python_source or "")
        lines.append(f"Interpreter: {facts.python}" + (f" ({how})" if how else ""))
    lines.append("")
    pad = " " * 10
    for finding in findings:
        label = _LABEL[finding.verdict]
        head = click.style(f"{label:<8}", fg=_COLOR[finding.verdict], bold=True)
        title = redact_text(finding.title)
        wrapped = textwrap.wrap(title, width=max(20, width - 10)) or [""]
        lines.append(f"{head}  {wrapped[0]}")
        lines += [pad + rest for rest in wrapped[1:]]
        if finding.detail:
            lines += _wrap(redact_text(finding.detail), width, pad)
        if finding.action:
            lines += _wrap("→ " + redact_text(finding.action), width, pad)
        lines.append("")
    counts = {v: sum(1 for f in findings if f.verdict == v) for v in _LABEL}
    parts = [f"{counts[v]} {_LABEL[v].lower()}" for v in ("problem", "warning", "unknown", "ok")]
    verdict = overall_verdict(findings)
    lines.append(
        f"Verdict: {_LABEL[verdict]} ({', '.join(parts)}); exit status {exit_status(findings)}."
    )
    return "\n".join(lines)
