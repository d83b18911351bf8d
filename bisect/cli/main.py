"""The ``oom-bisect`` command: find the update that made a workflow run out of memory.

A thin front end, like git's ``builtin/bisect.c`` over ``bisect.c``: it parses arguments,
finds the install and its interpreter, starts or resumes the session (session.py), hands the
step loop (runner.py) a measuring function (workspace.py + replay.py), draws progress with
rich, and turns the answer into a report (report.py) and an exit status.

Exit statuses (also in README.md, "oom-bisect"):

====  ===========================================================================
0     found: the culprit(s) are named
1     error: a runtime failure, or an endpoint that misbehaves (the good state is bad)
2     usage: a bad option, term or STATE (git's refs: ``BadRef``)
3     an input file (workflow, snapshot, log) cannot be used
4     not-reproduced: the bad state neither runs out of memory nor crosses the threshold
5     ambiguous: only skipped commits are left; the candidates are listed
130   interrupted (Ctrl-C / SIGTERM); ``oom-bisect run`` resumes the session
====  ===========================================================================

git's "only skipped left" is status 2 in ``git bisect``; here 2 already means "usage" for
every oom-sentinel command, and a script must be able to tell "your arguments are wrong"
from "the answer is a list", so ambiguity gets its own status.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from oom_sentinel.bisect.search.plan import Error, Found, OnlySkippedLeft, Step, Test
from oom_sentinel.bisect.search.verdict import DEFAULT_MARGIN, Terms, Threshold
from oom_sentinel.bisect.session.files import (
    BisectPaths,
    LogRecord,
    Session,
    begin,
    bisect_home,
    reset_paths,
    session_lock,
    workflow_sha256,
)
from oom_sentinel.bisect.session.fsutil import remove_tree
from oom_sentinel.bisect.state.states import (
    ABSENT,
    CORE,
    Install,
    State,
    differing_repos,
    is_package,
    node_key,
    node_name,
    parse_state_tokens,
    repo_label,
    resolve_state,
    scan_install,
    split_state_arg,
)
from oom_sentinel.daemon.core import units
from oom_sentinel.daemon.core.clikit import echo_json, handle_errors
from oom_sentinel.daemon.core.errors import (
    EXIT_ERROR,
    BadRef,
    BisectError,
    ConfigError,
    InputError,
    SentinelError,
)

__all__ = [
    "EXIT_AMBIGUOUS",
    "EXIT_FOUND",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_REPRODUCED",
    "PROG",
    "RESULT_EXIT",
    "main",
    "parse_budget",
    "parse_size",
]

PROG = "oom-bisect"
EXIT_FOUND = 0
EXIT_NOT_REPRODUCED = 4
EXIT_AMBIGUOUS = 5
EXIT_INTERRUPTED = 130
#: the ``result`` word of --json and the exit status it ends with
RESULT_EXIT = {
    "found": EXIT_FOUND,
    "ambiguous": EXIT_AMBIGUOUS,
    "not-reproduced": EXIT_NOT_REPRODUCED,
    "error": EXIT_ERROR,
}


def parse_size(text: str, what: str = "size") -> int:
    """A size flag's value in bytes: ``units.parse_size`` (``8GiB``, ``8GB``, ``8G``,
    ``8192MiB``, ``512M``, bytes; every K/M/G binary, as ComfyUI's own flags mean them), or a
    usage error naming ``what``."""
    value = units.parse_size(text or "")
    if value is None:
        raise ConfigError(f"{what}: {text!r} is not a size (e.g. 8GiB, 8192MiB, 12GB)")
    if value <= 0:
        raise ConfigError(f"{what}: {text!r} must be more than zero")
    return value


def parse_budget(values: Sequence[str]) -> Threshold | None:
    """``--budget`` values: ``vram=10GiB``, ``ram=16GiB`` or a bare size (VRAM)."""
    vram = ram = None
    for v in values:
        pool, eq, size = v.partition("=")
        if not eq:
            pool, size = "vram", v
        pool = pool.strip().lower()
        if pool not in ("vram", "ram"):
            raise ConfigError(f"--budget: {v!r}: the pool must be vram or ram (e.g. vram=10GiB)")
        bytes_ = parse_size(size, "--budget")
        if pool == "vram":
            vram = bytes_
        else:
            ram = bytes_
    return None if vram is None and ram is None else Threshold(vram, ram)


# --------------------------------------------------------------------------- the group


class _Group(click.Group):
    """``oom-bisect SNAPSHOT_ID`` is the default command: an unknown first word is an id."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and self.get_command(ctx, name) is None:
            cmd = self.get_command(ctx, "snapshot")
            return "snapshot", cmd, args
        return super().resolve_command(ctx, args)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors (for bug reports).")
@click.version_option(package_name="oom-sentinel", prog_name=PROG)
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Replay a workflow across ComfyUI and custom-node commits and name the culprit.

    \b
    oom-bisect SNAPSHOT_ID                 bisect the regression a crash snapshot suspects
    oom-bisect run --workflow F --good S --bad S   bisect between two install states
    oom-bisect status | log | replay LOG | reset   as git bisect users expect
    oom-bisect good | bad | skip [STATE]   a verdict by hand

    STATE: comfyui=REF node:NAME=REF …, a ComfyUI-Manager snapshot file, before-last-update,
    HEAD@{N}, or an oom-sentinel snapshot id (ID, ID:good, ID:bad).
    """
    ctx.obj = {"verbose": verbose}


# --------------------------------------------------------------------------- finding things


def _session_installs(home: Path) -> list[Path]:
    """Installs with a bisect session in progress (read from their session files)."""
    out = []
    try:
        roots = sorted(p for p in home.iterdir() if p.is_dir())
    except OSError:
        return []
    for root in roots:
        if not (root / "session" / "started").is_file():
            continue
        try:
            data = json.loads((root / "session" / "session.json").read_text("utf-8"))
            out.append(Path(data["install"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def discover_comfyui(
    *, processes: Sequence[Any] | None = None, home: Path | None = None
) -> tuple[Path, Any]:
    """The one ComfyUI install to bisect: a session in progress, else discovery.

    Returns the path and the discovered instance (None when it came from a session).
    ``processes`` replaces the process scan (tests).
    """
    sessions = _session_installs(bisect_home())
    if len(sessions) == 1:
        return sessions[0], None
    from oom_sentinel.daemon.comfy.discovery import discover_instances
    from oom_sentinel.daemon.comfy.processes import find_comfy_processes

    procs = find_comfy_processes() if processes is None else processes
    found = discover_instances(home=home or Path.home(), environ=os.environ, processes=list(procs))
    paths: dict[str, Any] = {}
    for inst in found:
        code = inst.code_dir or inst.path
        paths.setdefault(str(Path(code).resolve()), inst)
    if len(paths) == 1:
        key, inst = next(iter(paths.items()))
        return Path(key), inst
    if not paths:
        raise ConfigError("no ComfyUI install found; give --comfyui PATH")
    listed = ", ".join(sorted(paths))
    raise ConfigError(f"several ComfyUI installs found ({listed}); give --comfyui PATH")


def _resolve_comfyui(comfyui: str | None) -> tuple[Path, Any]:
    if comfyui:
        path = Path(comfyui).expanduser()
        if not path.is_dir():
            raise ConfigError(f"--comfyui: {path} is not a directory")
        return path.resolve(), None
    return discover_comfyui()


def _find_python(explicit: str | None, comfyui: Path, discovered: Any) -> str:
    if explicit:
        p = Path(explicit).expanduser()
        if not p.exists():
            raise ConfigError(f"--python: {p} does not exist")
        return str(p)
    if discovered is not None and getattr(discovered, "python", None):
        return str(discovered.python)
    from oom_sentinel.daemon.comfy.interpreter import find_interpreter

    found = find_interpreter(comfyui)
    if found is not None:
        return str(found)
    raise ConfigError(
        f"cannot tell which Python runs ComfyUI at {comfyui} (no .venv, venv or "
        "python_embeded found); give --python PATH"
    )


def _paths(comfyui: str | None) -> BisectPaths:
    path, _ = _resolve_comfyui(comfyui)
    return BisectPaths.for_install(path)


# --------------------------------------------------------------------------- progress


class _Progress:
    """Runner events drawn on stderr with rich (plain lines when not a terminal)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.adaptive = False

    def step(self, number: int, test: Test, session: Session) -> None:
        from oom_sentinel.bisect.session.runner import describe_test

        self.adaptive = session.setup.adaptive
        p = session.progress()
        left = f"~{p.steps_left} left" if p.steps_left else "last"
        tokens = " ".join(test.state.tokens(session.setup.repos()))
        short = re.sub(r"\b([0-9a-f]{10})[0-9a-f]{30,54}\b", r"\1", tokens)
        self.console.print(
            f"[bold]step {number}[/bold] ({left}): {describe_test(test, session)}  [dim]{short}[/dim]"
        )

    def run_start(self, test: Test, index: int, repeat: int) -> None:
        if repeat > 1:
            at_most = "at most " if self.adaptive else ""
            self.console.print(f"  run {index} of {at_most}{repeat} …", highlight=False)

    def run_done(self, test: Test, m: Any) -> None:
        o = m.outcome
        kind = type(o).__name__.lower()
        extra = ""
        reason = getattr(o, "reason", None) or getattr(o, "evidence", None)
        if reason:
            extra = f" — {str(reason)[:100]}"
        from oom_sentinel.bisect.search.verdict import Oom, Timeout
        from oom_sentinel.bisect.session.report import peak_text

        secs = sum(v for k, v in m.timings.items() if k in ("ready_s", "prompt_s"))
        partial = m.stopped_early or isinstance(o, Oom | Timeout)
        self.console.print(
            f"  {kind}: VRAM {peak_text(m.peaks.vram_bytes, partial)}, "
            f"RAM {peak_text(m.peaks.ram_bytes, partial)}"
            f"{' (stopped early)' if m.stopped_early else ''} in {secs:.1f} s{extra}",
            highlight=False,
        )

    def judged(self, test: Test, judgement: Any) -> None:
        from oom_sentinel.bisect.search.confidence import describe

        self.console.print(f"  {describe(judgement)}", highlight=False)

    def verdict(self, test: Test, record: LogRecord, cached: bool) -> None:
        word = record.verdict.value
        style = {"old": "green", "new": "red", "skip": "yellow"}[word]
        from_cache = " (from the outcome cache)" if cached else ""
        self.console.print(f"  → [{style}]{record_word(record)}[/{style}]{from_cache}")


def record_word(record: LogRecord) -> str:
    return {"old": "good", "new": "bad", "skip": "skip"}[record.verdict.value]


# --------------------------------------------------------------------------- run


@dataclass
class _RunArgs:
    workflow: str | None = None
    good: str | None = None
    bad: str | None = None
    comfyui: str | None = None
    python: str | None = None
    #: "auto" or a count (parsed in _start)
    repeat: str | None = None
    max_repeat: int | None = None
    budget: tuple[str, ...] = ()
    vram_budget: str | None = None
    timeout: float | None = None
    start_timeout: float | None = None
    term_old: str | None = None
    term_new: str | None = None
    flags: str | None = None
    margin: float | None = None
    timeout_is_bad: bool = False
    no_history: bool = False
    fork_server: bool = False
    runs_per_state: int | None = None
    history_with_native_allocator: bool = False
    models_dir: str | None = None
    as_json: bool = False
    max_steps: int | None = None
    parallel: int | None = None
    env_cache_max: str | None = None
    #: set by the snapshot front end
    snapshot: Any = None
    good_state: State | None = None
    bad_state: State | None = None
    prompt: dict[str, Any] | None = None
    snapshot_flags: tuple[str, ...] | None = None
    snapshot_budget: Threshold | None = None
    snapshot_cap: int | None = None
    snapshot_pool: str | None = None
    pool: str | None = None
    notes: list[str] = field(default_factory=list)


def _run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--comfyui", metavar="PATH", help="The ComfyUI install (default: found)."),
        click.option("--python", metavar="PATH", help="ComfyUI's Python (default: found)."),
        click.option(
            "--repeat",
            default=None,
            metavar="N|auto",
            help="Run each state N times and take the median (default 1); auto: measure the "
            "noise on the good state and repeat a state only while it is within that band of "
            "the threshold (SAME / DIFFERENT / UNKNOWN), then re-check each culprit and its "
            "parent.",
        ),
        click.option(
            "--max-repeat",
            type=int,
            default=None,
            metavar="N",
            help="With --repeat auto: at most N runs per state before it is UNKNOWN (default 5).",
        ),
        click.option(
            "--budget",
            multiple=True,
            metavar="[vram=|ram=]SIZE",
            help="Bad above this peak, instead of the good state's peak +10%.",
        ),
        click.option(
            "--vram-budget",
            metavar="SIZE",
            help="Cap torch's VRAM at SIZE per GPU, to reproduce a smaller card (e.g. 8GiB).",
        ),
        click.option(
            "--timeout",
            type=float,
            default=None,
            metavar="S",
            help="A prompt running longer is a timeout (default 1800).",
        ),
        click.option(
            "--start-timeout",
            type=float,
            default=None,
            metavar="S",
            help="ComfyUI must answer within S seconds of starting (default 600).",
        ),
        click.option("--term-old", metavar="TERM", help="Word for good states (e.g. fits)."),
        click.option("--term-new", metavar="TERM", help="Word for bad states (e.g. ooms)."),
        click.option(
            "--flags",
            metavar="'FLAGS'",
            help="ComfyUI flags to keep (e.g. '--lowvram --reserve-vram 2'); default: those "
            "of the running ComfyUI or the snapshot.",
        ),
        click.option(
            "--margin",
            type=float,
            default=None,
            help="Allowance over the good peak (default 0.10).",
        ),
        click.option(
            "--timeout-is-bad", is_flag=True, help="Count a timeout as bad, not as a skip."
        ),
        click.option(
            "--pool",
            type=click.Choice(["any", "vram", "ram"]),
            default=None,
            help="Which peak crossing the threshold is bad (default: any; from a snapshot: "
            "the pool that ran out). An OOM is bad in any case.",
        ),
        click.option("--no-history", is_flag=True, help="Don't record torch's allocator history."),
        click.option(
            "--fork-server",
            is_flag=True,
            help="Fork each replay from an interpreter that preloaded torch and ComfyUI's other "
            "third-party packages (Linux; faster starts, the same peaks).",
        ),
        click.option(
            "--history-with-native-allocator",
            is_flag=True,
            help="When a culprit's OOM has no allocator history because torch ran "
            "cudaMallocAsync (ComfyUI's default), replay it once with --disable-cuda-malloc "
            "for the history only (marked as such; verdicts and peaks are not from it).",
        ),
        click.option(
            "--runs-per-state",
            type=int,
            default=None,
            metavar="K",
            help="Leak mode: queue the workflow K times in one server per state (the seed, or "
            "a no-op input, changes between runs so ComfyUI's cache cannot skip them) and "
            "take the peak after K runs (default 1).",
        ),
        click.option("--models-dir", metavar="PATH", help="The models folder (default: found)."),
        click.option(
            "--parallel",
            type=int,
            default=None,
            metavar="N",
            help="Measure N states of a culprit's range at once, one per GPU "
            "(CUDA_VISIBLE_DEVICES per replay): ⌈log_{N+1} M⌉ rounds instead of ⌈log2 M⌉ "
            "(default: the GPUs NVML sees; 1 on CPU).",
        ),
        click.option(
            "--env-cache-max",
            metavar="SIZE",
            help="Size budget of the per-state Python environments, least recently used "
            "removed first (default 50GiB).",
        ),
        click.option("--max-steps", type=int, default=None, hidden=True),
        click.option("--json", "as_json", is_flag=True, help="End with one JSON object."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


@main.command("run")
@click.option("--workflow", metavar="FILE", help="API/UI workflow JSON, or a PNG/WebP with one.")
@click.option(
    "--good",
    metavar="STATE",
    multiple=True,
    help="A state where the workflow fits (repeat it: --good comfyui=A --good node:X=B).",
)
@click.option(
    "--bad",
    metavar="STATE",
    multiple=True,
    help="A state where it runs out of memory (repeatable).",
)
@_run_options
@handle_errors(PROG)
def run_command(good: tuple[str, ...], bad: tuple[str, ...], **kw: Any) -> None:
    """Start a bisect (or resume the one in progress) and run it to the answer."""
    args = _RunArgs(
        good=merge_state_option("--good", good), bad=merge_state_option("--bad", bad), **kw
    )
    sys.exit(_run(args))


def merge_state_option(option: str, values: Sequence[str]) -> str | None:
    """Every ``--good`` (or ``--bad``) value merged into one STATE, so none is dropped.

    ``comfyui=A`` and ``node:X=B`` given separately are one state; the same ``REPO=REF``
    twice is harmless; one repo with two different refs is a usage error naming it (which
    ref was meant cannot be guessed). Words that are not pairs (a snapshot, HEAD@{N},
    before-last-update) pass through for ``resolve_state`` to judge.
    """
    if not values:
        return None
    words: list[str] = []
    refs: dict[str, str] = {}
    for value in values:
        for word in split_state_arg(value):
            if "=" not in word:
                words.append(word)
                continue
            try:
                ((repo, ref),) = parse_state_tokens([word]).items()
            except BadRef as exc:
                raise BadRef(f"{option}: {exc}") from None
            if repo in refs:
                if refs[repo] != ref:
                    raise BadRef(
                        f"{option}: {repo_label(repo)} is given twice with different refs "
                        f"({refs[repo]!r} and {ref!r}); give it once"
                    )
                continue
            refs[repo] = ref
            words.append(f"{repo}={ref}")
    return shlex.join(words)


def state_lines(
    term: str,
    option: str,
    arg: str,
    state: State,
    good: State,
    bad: State,
    origin: str | None = None,
) -> list[str]:
    """A chosen state in full, every repo of either endpoint with what the user asked for and
    the commit it resolved to, printed before the first measurement: what is measured must
    be what the user believes is measured."""
    asked: dict[str, str] = {}
    base = "as installed"
    if origin is not None:
        base = f"from {origin}"
    else:
        for word in split_state_arg(arg):
            if "=" in word:
                asked.update(parse_state_tokens([word]))
            else:
                base = word
    names = sorted({n for n, _ in good.nodes} | {n for n, _ in bad.nodes})
    # of a package set (hundreds of pins) only the packages that differ are listed
    pkgs = [r for r in differing_repos(good, bad) if is_package(r)]
    repos = [CORE, *map(node_key, names), *pkgs]
    width = max(len(repo_label(r)) for r in repos)
    where = origin or option
    lines = [f"{term} state ({where}):"]
    for repo in repos:
        ref = asked.get(repo, base)
        mark = "" if good.value(repo) == bad.value(repo) else "  *"
        lines.append(f"  {repo_label(repo):<{width}}  {ref} → {state.value(repo)}{mark}")
    if state.packages:
        same = len(state.packages) - sum(state.value(p) != ABSENT for p in pkgs)
        lines.append(f"  (and {same} more package(s), the same in both states)")
    return lines


def check_named_repos(option: str, arg: str | None, install: Install) -> None:
    """Every ``node:NAME`` a STATE names must be a custom node of this install (a usage error
    naming it otherwise; ``node:NAME=absent`` included, which would silently mean nothing)."""
    if not arg:
        return
    for word in split_state_arg(arg):
        if "=" not in word:
            continue
        for repo in parse_state_tokens([word]):
            if repo != CORE and install.node(node_name(repo)) is None:
                raise BadRef(
                    f"{option}: {repo_label(repo)}: no such custom node in {install.custom_nodes}"
                )


@main.command("snapshot", hidden=True)
@click.argument("snapshot_id")
@click.option("--data-dir", type=click.Path(file_okay=False), help="oom-sentinel's data dir.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
@_run_options
@handle_errors(PROG)
def snapshot_command(
    snapshot_id: str, data_dir: str | None, config_path: str | None, **kw: Any
) -> None:
    """Bisect the regression a crash snapshot suspects (also: ``oom-bisect SNAPSHOT_ID``)."""
    from oom_sentinel.bisect.state.from_snapshot import read_snapshot_start
    from oom_sentinel.daemon.incidents.snapshot import find_snapshot, load_snapshot

    snap = load_snapshot(find_snapshot(_snapshots_dir(data_dir, config_path), snapshot_id))
    start = read_snapshot_start(snap)
    args = _RunArgs(**kw)
    args.snapshot = snap
    if start.good is None:
        raise InputError(
            f"snapshot {snap.id}: records no earlier good state (it is not a suspected "
            "regression); use oom-bisect run --workflow … --good … --bad …"
        )
    if start.bad is None or start.prompt is None:
        what = "install state" if start.bad is None else "prompt (prompt.json)"
        raise InputError(f"snapshot {snap.id}: has no {what} to replay")
    args.good_state, args.bad_state, args.prompt = start.good, start.bad, start.prompt
    args.snapshot_flags = start.flags
    args.snapshot_budget = start.budget
    args.snapshot_cap = start.vram_cap_bytes
    args.snapshot_pool = start.pool
    if args.comfyui is None and start.comfyui is not None:
        args.comfyui = str(start.comfyui)
    if args.python is None and start.python is not None and Path(start.python).exists():
        args.python = start.python
    sys.exit(_run(args))


def _snapshots_dir(data_dir: str | None, config_path: str | None) -> Path:
    from oom_sentinel.daemon.incidents.snapshot import snapshots_dir

    if data_dir:
        return snapshots_dir(Path(data_dir).expanduser())
    from oom_sentinel.config.settings import load_settings

    return snapshots_dir(load_settings(config_path).settings.resolved_data_dir())


def _snapshot_resolver(data_dir: str | None = None) -> Callable[[str], State]:
    """``--good SNAPSHOT_ID`` (the state at that crash), ``ID:good``, ``ID:bad``."""

    def resolve(word: str) -> State:
        from oom_sentinel.bisect.state.from_snapshot import snapshot_state
        from oom_sentinel.daemon.incidents.snapshot import (
            SnapshotNotFound,
            find_snapshot,
            load_snapshot,
        )

        ref, _, which = word.rpartition(":") if word.endswith((":good", ":bad")) else (word, "", "")
        where = _snapshots_dir(data_dir, None)
        try:
            found = find_snapshot(where, ref)
        except SnapshotNotFound as exc:
            raise BadRef(
                f"{word!r} is neither a state (comfyui=REF node:NAME=REF …, a ComfyUI-Manager "
                f"snapshot file, HEAD@{{N}}, before-last-update) nor a crash snapshot ({exc})"
            ) from None
        return snapshot_state(load_snapshot(found), which or "crash")

    return resolve


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (systemd, ``kill``) takes the Ctrl-C path, so ComfyUI is killed on the way out."""

    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: _RunArgs) -> int:
    with _sigterm_interrupts():
        try:
            return _run_inner(args)
        except SentinelError as exc:
            if args.as_json:  # --json always ends with one object, errors included
                echo_json(_error_doc(args, exc))
            raise


def _error_doc(args: _RunArgs, exc: SentinelError) -> dict[str, Any]:
    """The --json object for a run that failed with ``exc`` (with the session's counts, when
    one exists)."""
    doc: dict[str, Any] = {
        "result": "error",
        "culprits": [],
        "measurements": 0,
        "steps": [],
        "message": str(exc),
    }
    with contextlib.suppress(Exception):
        from oom_sentinel.bisect.session.report import build_report

        sess = Session.open(_paths(args.comfyui))
        report = build_report(sess, sess.next_step())
        doc["measurements"] = report["measurements"]
        doc["steps"] = report["steps"]
    return doc


def _run_inner(args: _RunArgs) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = err if args.as_json else Console(highlight=False, soft_wrap=True)
    comfyui, discovered = _resolve_comfyui(args.comfyui)
    paths = BisectPaths.for_install(comfyui)
    install = scan_install(comfyui)
    created = not paths.root.exists()
    paths.root.mkdir(parents=True, exist_ok=True)
    try:
        with session_lock(paths):
            if Session.exists(paths):
                sess = Session.open(paths)
                if (sess.setup.good.packages or sess.setup.bad.packages) and sess.setup.python:
                    install = _with_packages(install, sess.setup.python)
                _check_resume(sess, args, install)
                err.print(f"resuming the bisect of {sess.setup.install}", highlight=False)
            else:
                sess = _start(paths, install, args, discovered, err)
            try:
                step, stats = _drive(sess, install, args, err)
            except KeyboardInterrupt:
                err.print(
                    f"{PROG}: interrupted; the session is kept: `{PROG} run` resumes it "
                    "(at most the measurement in progress is repeated)",
                    highlight=False,
                )
                return EXIT_INTERRUPTED
            return _finish(sess, step, args, out, err, stats)
    except BaseException:
        if created and not Session.exists(paths):
            # bad input leaves nothing behind (git: no BISECT_* files after a junk ref)
            remove_tree(paths.root)
        raise


def _start(
    paths: BisectPaths, install: Install, args: _RunArgs, discovered: Any, err: Console
) -> Session:
    """A new session: everything that can fail fails before the first file is written."""
    snap_words: dict[str, State] = {}
    if args.snapshot is not None:
        assert args.good_state is not None and args.bad_state is not None
        snap_words = {"@good": args.good_state, "@bad": args.bad_state}
        good_arg: str = "@good"
        bad_arg: str = "@bad"
    else:
        missing = [
            o
            for o, v in (("--workflow", args.workflow), ("--good", args.good), ("--bad", args.bad))
            if not v
        ]
        if missing:
            raise ConfigError(f"no bisect in progress: give {', '.join(missing)} to start one")
        assert args.good and args.bad
        good_arg, bad_arg = args.good, args.bad
        check_named_repos("--good", good_arg, install)
        check_named_repos("--bad", bad_arg, install)
    file_resolver = _snapshot_resolver()

    def resolver(word: str) -> State:
        return snap_words[word] if word in snap_words else file_resolver(word)

    terms = Terms.checked(args.term_old, args.term_new)
    repeat, adaptive, max_repeat = parse_repeat(args.repeat, args.max_repeat)
    runs_per_state = 1 if args.runs_per_state is None else args.runs_per_state
    if runs_per_state < 1:
        raise ConfigError(f"--runs-per-state must be at least 1, got {runs_per_state}")
    budget = parse_budget(args.budget) or args.snapshot_budget
    cap = parse_size(args.vram_budget, "--vram-budget") if args.vram_budget else args.snapshot_cap
    python = _find_python(args.python, install.comfyui, discovered)
    flags: tuple[str, ...] | None = None
    if args.flags is not None:
        flags = tuple(split_state_arg(args.flags)) if args.flags.strip() else ()
    elif args.snapshot_flags is not None:
        flags = args.snapshot_flags
    elif discovered is not None and getattr(discovered, "pid", None):
        flags = _running_flags(discovered)
    flags = _device_flags(flags, python, err)
    # resolve both ends first: a junk ref must not leave a workspace behind
    good = resolve_state(good_arg, install, snapshot_resolver=resolver)
    bad = resolve_state(bad_arg, install, snapshot_resolver=resolver)
    if good.packages or bad.packages:
        # a state names packages: they are a dimension, against the interpreter's own set
        install = _with_packages(install, python)
        good = resolve_state(good_arg, install, snapshot_resolver=resolver)
        bad = resolve_state(bad_arg, install, snapshot_resolver=resolver)
    if good == bad:
        raise BisectError("the good and bad states are the same: there is nothing to bisect")
    prompt = args.prompt
    source = f"snapshot {args.snapshot.id}" if args.snapshot is not None else "--good/--bad"
    extra: dict[str, Any] = {
        "vram_budget_bytes": cap,
        "start_timeout_s": args.start_timeout,
        "record_history": not args.no_history,
        "fork_server": args.fork_server,
        "runs_per_state": runs_per_state,
        "history_native": bool(args.history_with_native_allocator),
        "models_dir": args.models_dir,
        "snapshot_dir": str(args.snapshot.path) if args.snapshot is not None else None,
        "pool": args.pool or args.snapshot_pool or "any",
        "env_cache_max_bytes": (
            parse_size(args.env_cache_max, "--env-cache-max") if args.env_cache_max else None
        ),
    }
    if install.packages:
        from oom_sentinel.bisect.state.envs import lock_for

        extra["interpreter_lock"] = lock_for(install.packages).digest()
    if prompt is None:
        from oom_sentinel.bisect.workflow.load import load_workflow

        assert args.workflow is not None
        loaded = load_workflow(args.workflow)
        extra["workflow_file"] = str(Path(args.workflow).resolve())
        if loaded.needs_conversion:
            prompt = _convert_ui(loaded, paths, install, bad, python, flags, extra, err)
        else:
            prompt = loaded.to_api({}).prompt
    sess = begin(
        paths,
        install,
        good_arg,
        bad_arg,
        prompt=prompt,
        snapshot_resolver=resolver,
        terms=terms,
        flags=flags,
        python=python,
        budget=budget,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        repeat=repeat,
        adaptive=adaptive,
        max_repeat=max_repeat,
        timeout_s=args.timeout,
        timeout_is_bad=args.timeout_is_bad,
        source=source,
        extra=extra,
    )
    # the states in full, once every input is known to be usable, before the first measurement
    origin = f"snapshot {args.snapshot.id}" if args.snapshot is not None else None
    for line in state_lines(terms.old, "--good", good_arg, good, good, bad, origin):
        err.print(line, highlight=False, markup=False)
    for line in state_lines(terms.new, "--bad", bad_arg, bad, good, bad, origin):
        err.print(line, highlight=False, markup=False)
    err.print("(* differs between the two states: the repos the bisect searches)", markup=False)
    return sess


def parse_repeat(repeat: str | None, max_repeat: int | None) -> tuple[int, bool, int]:
    """``--repeat N|auto`` and ``--max-repeat N`` as (repeat, adaptive, max_repeat)."""
    from oom_sentinel.bisect.search.confidence import DEFAULT_MAX_REPEAT

    adaptive = repeat is not None and repeat.strip().lower() == "auto"
    if max_repeat is not None and not adaptive:
        raise ConfigError(
            "--max-repeat needs --repeat auto (with --repeat N every state runs N times)"
        )
    if max_repeat is not None and max_repeat < 1:
        raise ConfigError(f"--max-repeat must be at least 1, got {max_repeat}")
    count = 1
    if repeat is not None and not adaptive:
        try:
            count = int(repeat)
        except ValueError:
            raise ConfigError(f"--repeat: {repeat!r} is not a number or 'auto'") from None
        if count < 1:
            raise ConfigError(f"--repeat must be at least 1, got {count}")
    return count, adaptive, DEFAULT_MAX_REPEAT if max_repeat is None else max_repeat


def _running_flags(discovered: Any) -> tuple[str, ...] | None:
    """The running ComfyUI's flags; None when that process is gone."""
    from oom_sentinel.bisect.state.from_snapshot import flags_from_argv
    from oom_sentinel.daemon.comfy.processes import find_comfy_processes

    for proc in find_comfy_processes():
        if proc.pid == discovered.pid:
            return flags_from_argv(proc.argv)
    return None


def _device_flags(flags: tuple[str, ...] | None, python: str, err: Console) -> tuple[str, ...]:
    """The replays' flags, with ``--cpu`` added when nothing gave flags and ComfyUI's own
    interpreter sees no GPU (device.py); the one line saying so goes to stderr."""
    from oom_sentinel.bisect.measure.device import choose_device

    facts = None
    if flags is None:
        from oom_sentinel.daemon.comfy.interpreter import probe_interpreter
        from oom_sentinel.daemon.core.errors import ProbeError

        with contextlib.suppress(ProbeError):
            facts, _ = probe_interpreter(python, pip=False)
    choice = choose_device(flags or (), flags is not None, facts)
    if choice.note:
        err.print(f"note: {choice.note}", highlight=False, markup=False)
    return choice.flags


def _convert_ui(
    loaded: Any,
    paths: BisectPaths,
    install: Install,
    bad: State,
    python: str,
    flags: Sequence[str],
    extra: Mapping[str, Any],
    err: Console,
) -> dict[str, Any]:
    """A UI workflow becomes an API prompt against the bad state's ``/object_info``."""
    err.print("converting the UI workflow with the bad state's /object_info …", highlight=False)
    ws = _workspace(paths, install, extra)
    ws.switch(bad)
    replayer = _replayer(ws, python, flags, extra, timeout_s=None)
    info = replayer.object_info()
    result = loaded.to_api(info)
    for w in result.warnings[:10]:
        err.print(f"  note: {w}", highlight=False)
    return dict(result.prompt)


def _workspace(
    paths: BisectPaths, install: Install, extra: Mapping[str, Any], lane: int = 0
) -> Any:
    from oom_sentinel.bisect.measure.workspace import Workspace

    models = extra.get("models_dir")
    return Workspace.create(
        paths.lane_workspace(lane), install, models_dir=Path(models) if models else None
    )


def _lane(
    ws: Any,
    replayer: Any,
    prompt: Mapping[str, Any],
    interpreter: Callable[[State], str | Any],
) -> Callable[..., Any]:
    """One lane's measurement: its workspace shows the state, the state's interpreter (the
    user's, or the state's own package env) runs it."""

    def measure(state: State, threshold: Threshold | None) -> Any:
        ws.switch(state)
        chosen = interpreter(state)
        if not isinstance(chosen, str):
            return chosen  # the state's packages cannot be installed: a skip, with uv's reason
        replayer.settings = replace(replayer.settings, python=chosen)
        return replayer.measure(prompt, threshold)

    return measure


def parallel_devices(
    parallel: int | None, flags: Sequence[str], environ: Mapping[str, str] | None = None
) -> list[str | None]:
    """The GPU of each ``--parallel`` lane (None: leave CUDA_VISIBLE_DEVICES alone).

    The GPUs are those the user's ``CUDA_VISIBLE_DEVICES`` lists, else those the GPU probe
    (NVML, or the fake GPU) sees. Default: one lane per GPU; on CPU (``--cpu``, or no GPU
    seen) one lane. More lanes than GPUs is an error: two replays on one GPU would measure
    each other's memory.
    """
    env = os.environ if environ is None else environ
    if parallel is not None and parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, got {parallel}")
    if "--cpu" in flags:
        if parallel not in (None, 1):
            raise ConfigError(f"--parallel {parallel}: the replays run on the CPU (--cpu)")
        return [None]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe

        probe = select_gpu_probe(environ=env).probe
        try:
            gpus = [str(d.index) for d in probe.devices()]
        finally:
            probe.close()
    if parallel is None:
        parallel = max(1, len(gpus))
    if parallel == 1:
        return [None]
    if parallel > len(gpus):
        raise ConfigError(
            f"--parallel {parallel}: only {len(gpus)} GPU(s) visible "
            "(one replay per GPU, so that no replay measures another's memory)"
        )
    return list(gpus[:parallel])


def _replayer(
    ws: Any,
    python: str,
    flags: Sequence[str],
    extra: Mapping[str, Any],
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
) -> Any:
    from oom_sentinel.bisect.measure.replay import (
        DEFAULT_START_TIMEOUT_S,
        DEFAULT_TIMEOUT_S,
        Replayer,
        ReplaySettings,
    )
    from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe
    from oom_sentinel.daemon.probes.host import PsutilHostProbe

    settings = ReplaySettings(
        python=python,
        user_flags=tuple(flags),
        timeout_s=timeout_s or DEFAULT_TIMEOUT_S,
        start_timeout_s=extra.get("start_timeout_s") or DEFAULT_START_TIMEOUT_S,
        vram_budget_bytes=extra.get("vram_budget_bytes"),
        record_history=bool(extra.get("record_history", True)),
        fork_server=bool(extra.get("fork_server", False)),
        env=dict(env or {}),
        runs_per_state=int(extra.get("runs_per_state") or 1),
    )
    gpu = select_gpu_probe().probe
    return Replayer(ws, settings, gpu=gpu, host=PsutilHostProbe())


def _check_resume(sess: Session, args: _RunArgs, install: Install) -> None:
    """``run`` with arguments while a session exists: they must describe that session."""
    s = sess.setup
    if args.good or args.bad or args.snapshot is not None:
        resolver = _snapshot_resolver()
        words = {"@good": args.good_state, "@bad": args.bad_state}
        for which, arg, have in (
            ("good", args.good, s.good),
            ("bad", args.bad, s.bad),
        ):
            st = words.get(f"@{which}") if args.snapshot is not None else None
            if st is None and arg:
                st = resolve_state(arg, install, snapshot_resolver=resolver)
            if st is not None and st != have:
                raise BisectError(
                    f"a bisect with another {which} state is in progress for {s.install} "
                    f"({PROG} status shows it, {PROG} reset ends it)"
                )
    if args.workflow or args.prompt is not None:
        prompt = args.prompt
        if prompt is None and args.workflow:
            from oom_sentinel.bisect.workflow.load import load_workflow

            loaded = load_workflow(args.workflow)
            prompt = None if loaded.needs_conversion else loaded.to_api({}).prompt
        if prompt is not None and workflow_sha256(prompt) != s.workflow_sha256:
            raise BisectError(
                f"a bisect of another workflow is in progress for {s.install} "
                f"({PROG} status shows it, {PROG} reset ends it)"
            )


@dataclass
class _Stats:
    launched: int = 0
    finished: int = 0


def _drive(sess: Session, install: Install, args: _RunArgs, err: Console) -> tuple[Step, _Stats]:
    from oom_sentinel.bisect.session.runner import Runner

    s = sess.setup
    extra = dict(s.extra)
    prompt = sess.prompt()
    if prompt is None:
        raise InputError(f"{sess.paths.session}: the session has no prompt.json; reset it")
    python = s.python or _find_python(args.python, install.comfyui, None)
    devices = parallel_devices(args.parallel, s.flags)
    lanes = []
    for lane, device in enumerate(devices):
        ws = _workspace(sess.paths, install, extra, lane)
        env = {} if device is None else {"CUDA_VISIBLE_DEVICES": device}
        replayer = _replayer(ws, python, s.flags, extra, s.timeout_s, env)
        lanes.append(_lane(ws, replayer, prompt, _state_python(sess, python, err, ws)))
    if replayer.gpu is not None and getattr(replayer.gpu, "backend", "none") == "none":
        err.print("note: no GPU probe (NVML unavailable): VRAM is measured through torch only")
    if len(lanes) > 1:
        err.print(
            f"parallel: {len(lanes)} replays at once in a culprit's range, one per GPU "
            f"(CUDA_VISIBLE_DEVICES={', '.join(d for d in devices if d is not None)})",
            highlight=False,
        )
    measure = lanes[0]

    measure_history = None
    if extra.get("history_native") and extra.get("record_history", True):
        from oom_sentinel.bisect.measure.replay import Replayer

        native = Replayer(
            ws,
            replace(replayer.settings, native_allocator=True),
            gpu=replayer.gpu,
            host=replayer.host,
        )

        def measure_history(state: State) -> Any:
            ws.switch(state)
            return native.measure(prompt, None)

    environment = {
        "python": python,
        "vram_budget_bytes": extra.get("vram_budget_bytes"),
    }
    if int(extra.get("runs_per_state") or 1) > 1:  # K runs' peak is another measurement
        environment["runs_per_state"] = int(extra["runs_per_state"])
    runner = Runner(
        sess,
        measure,
        prompt,
        environment=environment,
        events=_Progress(err),
        lanes=lanes,
        measure_history=measure_history,
    )
    stats = _Stats()
    try:
        step = runner.run(max_steps=args.max_steps)
    finally:
        stats.launched, stats.finished = runner.launched, runner.finished
    return step, stats


def _with_packages(install: Install, python: str) -> Install:
    """``install`` with its interpreter's package set, read as the daemon records it."""
    from oom_sentinel.bisect.state.states import packages_from_freeze
    from oom_sentinel.daemon.comfy.interpreter import probe_interpreter

    _, lines = probe_interpreter(python, pip=True)
    if lines is None:
        raise InputError(f"{python}: cannot list its installed packages (pip freeze failed)")
    return replace(install, packages=tuple(sorted(packages_from_freeze(lines).items())))


def _state_python(
    sess: Session, python: str, err: Console, ws: Any
) -> Callable[[State], str | Any]:
    """Which interpreter measures a state (the workspace already shows it): the user's when
    the state's package set is the interpreter's own (or it names none), else its own env
    (envs.py), built on first use. A set uv cannot install is a skip measurement. A state the
    search made (not an endpoint) is refused when its set breaks a requirement neither
    endpoint broke, and gets the ``requirements.txt`` of the repos it moved installed on top,
    as Manager does when it checks out a commit."""
    s = sess.setup
    own = s.extra.get("interpreter_lock")
    if not (s.good.packages or s.bad.packages):
        return lambda state: python
    from oom_sentinel.bisect.measure.replay import Measurement, Peaks
    from oom_sentinel.bisect.search.verdict import Skip
    from oom_sentinel.bisect.state import gitrepo
    from oom_sentinel.bisect.state.envs import (
        DEFAULT_MAX_BYTES,
        EnvCache,
        EnvUnavailable,
        lock_for,
        new_requirement_lines,
    )

    cache = EnvCache(
        sess.paths.envs, python, max_bytes=s.extra.get("env_cache_max_bytes") or DEFAULT_MAX_BYTES
    )
    endpoints = {lock_for(s.good.packages), lock_for(s.bad.packages)}

    def problems(lock: Any) -> frozenset[str]:
        if lock.digest() == own:
            return frozenset()
        try:
            cache.python_for(lock)
        except EnvUnavailable:
            return frozenset()
        return frozenset(cache.problems(lock))

    def requirements(state: State) -> str:
        """What the moved repos' requirements.txt files, as the workspace shows them now, ask
        for beyond what they asked for at both endpoints alike (``new_requirement_lines``): a
        line both recorded states had was lived with in their package sets (v0.8.0 lists
        torchaudio, which its own torch build cannot have), so installing it only for the
        commits between would measure those in another environment than the endpoints."""
        texts = []
        for span in s.spans:
            value = state.value(span.repo)
            if is_package(span.repo) or not gitrepo.is_commit_id(value):
                continue
            folder = ws.comfyui if span.repo == CORE else ws.custom_nodes / node_name(span.repo)
            try:
                now = (folder / "requirements.txt").read_text("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            recorded = [
                gitrepo.file_at(folder, end, "requirements.txt", f"the {span.repo} repository")
                for end in (s.good.value(span.repo), s.bad.value(span.repo))
                if gitrepo.is_commit_id(end)
            ]
            texts.append(new_requirement_lines(now, recorded))
        return "\n".join(t for t in texts if t)

    def choose(state: State) -> str | Any:
        lock = lock_for(state.packages)
        endpoint = state in (s.good, s.bad)
        if endpoint and lock.digest() == own:
            return python
        tolerated = None
        if lock not in endpoints:
            tolerated = frozenset().union(*(problems(e) for e in endpoints))
        try:
            if endpoint:
                py = cache.python_for(lock, tolerated)
            else:
                mine = python if lock.digest() == own else None
                py = cache.python_with_requirements(
                    lock, requirements(state), tolerated, base_python=mine
                )
        except EnvUnavailable as exc:
            err.print(f"  packages: {exc}", highlight=False, markup=False)
            return Measurement(outcome=Skip(f"packages: {exc}"), peaks=Peaks())
        if cache.last == "built":
            err.print(f"  packages: built the env {py.parent.parent}", highlight=False)
        cache.last = None
        return str(py)

    return choose


def _finish(
    sess: Session, step: Step, args: _RunArgs, out: Console, err: Console, stats: _Stats
) -> int:
    from oom_sentinel.bisect.session.report import build_report, render_terminal, write_reports

    report = build_report(sess, step)
    snapshot_dir = sess.setup.extra.get("snapshot_dir")
    attached = None
    written = None
    if not isinstance(step, Test):
        try:
            written = write_reports(report, sess.paths.root / "report")
        except OSError as exc:
            err.print(f"{PROG}: warning: cannot write the report: {exc}", highlight=False)
        if snapshot_dir:
            from oom_sentinel.bisect.session.report import _files, attach_to_snapshot

            try:
                attached = attach_to_snapshot(Path(snapshot_dir), _files(report))
            except OSError as exc:
                err.print(
                    f"{PROG}: warning: cannot attach the report to {snapshot_dir}: {exc}",
                    highlight=False,
                )
    render_terminal(report, out)
    if written is not None:
        out.print(f"report: {written.html_path}", highlight=False)
    if attached is not None:
        out.print(f"attached to the snapshot: {attached}", highlight=False)
    result = report["result"]
    if isinstance(step, Test):
        result = "in-progress"
    if args.as_json:
        echo_json(
            {
                "result": result,
                "culprits": [
                    {
                        "repo": c["repo"],
                        "commit": c["commit"],
                        "previous": c["previous"],
                        "subject": c["subject"],
                        "together": c["together"],
                        "delta": c["delta"],
                        "delta_text": c.get("delta_text"),
                        "nodes": c.get("nodes") or [],
                        "nodes_text": c.get("nodes_text"),
                    }
                    for c in report["culprits"]
                ],
                "search": report["search"],
                "measurements": report["measurements"],
                "steps": report["steps"],
                "repeat": report["repeat"],
                "max_repeat": report["max_repeat"],
                "rechecks": report["rechecks"],
                "candidates": [
                    {"repo": c["repo"], "commit": c["commit"], "subject": c["subject"]}
                    for c in report["candidates"]
                ],
                "message": report["message"],
                "launched_now": stats.launched,
                "report": None
                if written is None
                else {"json": str(written.json_path), "html": str(written.html_path)},
                "attached_to": None if attached is None else str(attached),
            }
        )
    if isinstance(step, Error) and not args.as_json:
        err.print(f"{PROG}: {step.message}", highlight=False)
    if isinstance(step, Test):
        return EXIT_INTERRUPTED
    return RESULT_EXIT.get(result, EXIT_ERROR)


# --------------------------------------------------------------------------- session commands


_comfyui_option = click.option(
    "--comfyui", metavar="PATH", help="The install whose session to use (default: the one)."
)


@main.command("checkout")
@click.argument("state", nargs=-1, required=True)
@click.option("--into", required=True, metavar="DIR", help="Where to build it (new or empty).")
@click.option("--comfyui", metavar="PATH", help="The live install (default: found).")
@click.option("--python", metavar="PATH", help="ComfyUI's Python (default: found).")
@click.option(
    "--flags",
    metavar="'FLAGS'",
    help="ComfyUI flags for the launcher (default: those of the running ComfyUI).",
)
@click.option("--port", type=int, default=None, help="The launcher's port (default: a free one).")
@click.option("--models-dir", metavar="PATH", help="The models folder (default: found).")
@click.option(
    "--data-dir", metavar="PATH", help="oom-sentinel's data folder (snapshots, recorded states)."
)
@click.option("--print", "print_only", is_flag=True, help="Show the plan; write nothing.")
@handle_errors(PROG)
def checkout_command(
    state: tuple[str, ...],
    into: str,
    comfyui: str | None,
    python: str | None,
    flags: str | None,
    port: int | None,
    models_dir: str | None,
    data_dir: str | None,
    print_only: bool,
) -> None:
    """Build STATE as a separate, runnable install in DIR: shared clones, its own venv and
    folders, a launcher (run.sh / run.bat). The live install is only read.

    STATE is what --good/--bad take: REPO=REF pairs (pkg:NAME=VERSION too), a ComfyUI-Manager
    snapshot, HEAD@{N}, before-last-update, a snapshot id, or a state id from
    `oom-sentinel states list`."""
    from oom_sentinel.bisect.measure.workspace import free_port
    from oom_sentinel.bisect.state.checkout import do_checkout, plan_checkout
    from oom_sentinel.bisect.state.envs import EnvCache

    comfy, discovered = _resolve_comfyui(comfyui)
    install = scan_install(comfy)
    py = _find_python(python, install.comfyui, discovered)
    resolver = _state_resolver(data_dir)
    words = list(state)
    chosen = resolve_state(words, install, snapshot_resolver=resolver)
    if chosen.packages:
        install = _with_packages(install, py)
        chosen = resolve_state(words, install, snapshot_resolver=resolver)
    if flags is not None:
        flag_words = tuple(split_state_arg(flags)) if flags.strip() else ()
    elif discovered is not None and getattr(discovered, "pid", None):
        flag_words = _running_flags(discovered) or ()
    else:
        flag_words = ()
    plan = plan_checkout(
        Path(into),
        chosen,
        install,
        py,
        flags=flag_words,
        port=port or free_port(),
        models_dir=Path(models_dir) if models_dir else None,
    )
    for line in plan.lines():
        click.echo(line)
    if print_only:
        return
    launcher = do_checkout(plan, EnvCache(BisectPaths.for_install(install.comfyui).envs, py))
    click.echo(f"ready: {launcher}")


def _state_resolver(data_dir: str | None) -> Callable[[str], State]:
    """Snapshot ids first (as --good/--bad), then the state ids the daemon recorded."""
    snapshots = _snapshot_resolver(data_dir)

    def resolve(word: str) -> State:
        try:
            return snapshots(word)
        except BadRef:
            if not re.fullmatch(r"[0-9a-fA-F]{4,16}", word):
                raise
            found = _recorded_state(word, data_dir)
            if found is None:
                raise
            return found

    return resolve


def _recorded_state(word: str, data_dir: str | None) -> State | None:
    """The install state ``word`` names in the daemon's store (``oom-sentinel states``)."""
    from oom_sentinel.bisect.state.states import state_from_install_state
    from oom_sentinel.daemon.install.history import load_state, resolve_state_ref
    from oom_sentinel.daemon.store.db import Store

    if data_dir:
        directory = Path(data_dir).expanduser()
    else:
        from oom_sentinel.config.settings import load_settings

        directory = load_settings(None).settings.resolved_data_dir()
    store = Store.open_existing(directory)
    if store is None:
        return None
    try:
        state_id = resolve_state_ref(store, word)
        recorded = load_state(store, state_id)
    except InputError:
        return None
    finally:
        store.close()
    return None if recorded is None else state_from_install_state(recorded, f"state {state_id}")


@main.command("status")
@_comfyui_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors(PROG)
def status_command(comfyui: str | None, as_json: bool) -> None:
    """Where the bisect stands: tested states, the next one, the threshold."""
    sess = Session.open(_paths(comfyui))
    st = sess.status()
    if as_json:
        from oom_sentinel.bisect.session.report import build_report

        report = build_report(sess, st.step)
        echo_json(
            {
                "result": report["result"],
                "phase": st.progress.phase,
                "tested": st.progress.tested,
                "steps_left": st.progress.steps_left,
                "expected": None
                if st.expected is None
                else {r: st.expected.value(r) for r in sess.setup.repos()},
                "next": report["next"],
                "culprits": report["culprits"],
                "candidates": report["candidates"],
                "measurements": report["measurements"],
                "launches": report["launches"],
                "steps": report["steps"],
            }
        )
        return
    from dataclasses import replace

    from oom_sentinel.bisect.session.runner import effective_threshold

    for line in replace(st, threshold=effective_threshold(sess)).lines():
        click.echo(line)
    click.echo(_answer_line(sess, st.step))


def _answer_line(sess: Session, step: Step) -> str:
    if isinstance(step, Found):
        names = "; ".join(
            f"{repo_label(c.repo)} {c.value}"
            + (f" (with {', '.join(map(repo_label, c.together))})" if c.together else "")
            for c in step.culprits
        )
        return f"answer: found: {names}"
    if isinstance(step, OnlySkippedLeft):
        return f"answer: ambiguous among {len(step.candidates)} candidate(s)"
    if isinstance(step, Error):
        return f"answer: {step.message}"
    return f"not finished: `{PROG} run` continues"


@main.command("log")
@_comfyui_option
@handle_errors(PROG)
def log_command(comfyui: str | None) -> None:
    """Print the session log (edit it and feed it to `replay`)."""
    click.echo(Session.open(_paths(comfyui)).log_text(), nl=False)


@main.command("replay")
@click.argument("logfile", type=click.Path(dir_okay=False))
@_comfyui_option
@handle_errors(PROG)
def replay_command(logfile: str, comfyui: str | None) -> None:
    """Reset the verdicts to those of LOGFILE (an edited `oom-bisect log`)."""
    sess = Session.open(_paths(comfyui))
    n = sess.replay(Path(logfile))
    click.echo(f"replayed {n} verdict(s)")
    click.echo(_answer_line(sess, sess.next_step()))


@main.command("reset")
@_comfyui_option
@handle_errors(PROG)
def reset_command(comfyui: str | None) -> None:
    """End the bisect: remove the session and its workspace (the outcome cache stays)."""
    paths = _paths(comfyui)
    reset_paths(paths)
    click.echo(f"removed the bisect session and workspace under {paths.root}")


def _mark(word: str, tokens: Sequence[str], comfyui: str | None) -> None:
    paths = _paths(comfyui)
    sess = Session.open(paths)
    state = None
    if tokens:
        state = _manual_state(sess, tokens)
    rec = sess.mark(word, state)
    click.echo(
        f"marked {sess.setup.terms.word(rec.verdict)}: "
        + " ".join(rec.state.tokens(sess.setup.repos()))
    )
    step = sess.next_step()
    if isinstance(step, Test):
        click.echo("next: " + " ".join(step.state.tokens(sess.setup.repos())))
    else:
        click.echo(_answer_line(sess, step))


def _manual_state(sess: Session, tokens: Sequence[str]) -> State:
    """``comfyui=REF node:NAME=REF``; repos not named keep the value of the state being
    measured (or of the next one)."""
    from oom_sentinel.bisect.state import gitrepo

    words = split_state_arg(list(tokens))
    refs = parse_state_tokens(words)
    base = sess.expected()
    if base is None:
        step = sess.next_step()
        base = step.state if isinstance(step, Test) else sess.setup.bad
    values = {}
    for repo, ref in refs.items():
        if repo not in sess.setup.repos():
            raise BisectError(
                f"{repo_label(repo)} is not one of the repos this bisect changes "
                f"({', '.join(map(repo_label, sess.setup.repos()))})"
            )
        path = sess.setup.repo_paths.get(repo)
        if path and not ref.startswith(("absent", "disabled", "installed", "version:")):
            values[repo] = gitrepo.resolve_commit(Path(path), ref, repo_label(repo))
        else:
            values[repo] = ref
    try:
        return base.with_values(values)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _mark_command(word: str, help_text: str) -> click.Command:
    @click.command(word, help=help_text)
    @click.argument("state", nargs=-1)
    @_comfyui_option
    @handle_errors(PROG)
    def cmd(state: tuple[str, ...], comfyui: str | None) -> None:
        _mark(word, state, comfyui)

    return cmd


for _word, _help in (
    ("good", "Mark STATE (default: the one being measured, else the next) as good."),
    ("bad", "Mark STATE (default: the one being measured, else the next) as bad."),
    ("old", "Same as good (git's neutral term)."),
    ("new", "Same as bad (git's neutral term)."),
    ("skip", "Mark STATE as untestable."),
):
    main.add_command(_mark_command(_word, _help))


@main.command("mark")
@click.argument("term")
@click.argument("state", nargs=-1)
@_comfyui_option
@handle_errors(PROG)
def mark_command(term: str, state: tuple[str, ...], comfyui: str | None) -> None:
    """Mark with the session's own terms (e.g. `oom-bisect mark fits`)."""
    _mark(term, state, comfyui)


# --------------------------------------------------------------------------- fit (cli_fit.py)

from oom_sentinel.bisect.cli.fit import fit_command  # noqa: E402

main.add_command(fit_command)
