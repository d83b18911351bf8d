"""A bisect session kept in files, so it survives Ctrl-C, a crash or a reboot and costs at
most one measurement to resume (modelled on git's ``BISECT_*`` files).

Layout, under the user cache dir (never inside the user's repos)::

    <cache>/bisect/<install key>/          one per ComfyUI install (like git: one per repo)
        .lock                              held while a command changes the session
        session/
            started                        exists while a session exists; removed last by reset
            session.json                   the setup: repos, endpoints, candidates, terms,
                                           threshold, workflow hash, flags (written once)
            prompt.json                    the API prompt being replayed (written once)
            log                            append-only, one line per verdict (below)
            expected                       the state being measured now; a resume measures it again
        workspace/                         the isolated copy (workspace.py)
    <cache>/bisect/outcomes/               measured runs by (state, workflow, flags, budget)

The session directory is assembled under a temporary name and renamed into place, so a
junk ref or any bad input leaves nothing behind, and a half-created session cannot exist.
Every write is atomic (temp file, fsync, rename) or an fsynced append; a torn last log line
(a crash mid-append) is ignored on reading and cut off before the next append.

Log syntax (what ``log`` prints and ``replay`` reads back; ``#`` starts a comment)::

    # oom-bisect log, format 1
    fits comfyui=3f2a… node:ComfyUI-Foo=9c1e… outcome=ok peak_vram_mib=20480.0 peak_ram_mib=6100.5 runs=1 # subject
    ooms comfyui=77aa… node:ComfyUI-Foo=9c1e… outcome=oom peak_lower_bound=1 reason='CUDA out of memory…' # subject
    skip comfyui=12bc… node:ComfyUI-Foo=9c1e… outcome=skip reason='won'"'"'t start' # subject
    ooms comfyui=77aa… node:ComfyUI-Foo=absent outcome=manual # marked by hand

The first word is a verdict: the session's terms, the neutral ``old``/``new``, or ``skip``.
Then one ``REPO=VALUE`` per repo that differs between the endpoints (repos that don't differ
are the same in every tested state); abbreviated commit ids are accepted when unambiguous.
Then optional ``KEY=VALUE`` details; unknown keys are ignored. Words are shell-quoted.
``peak_lower_bound=1`` says the peaks are what the run reached before it stopped (an OOM, a
run stopped early at the threshold, a timeout): the state needs at least that much.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import secrets
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import platformdirs

from oom_sentinel.bisect.measure.workspace import remove_workspace
from oom_sentinel.bisect.search.confidence import DEFAULT_MAX_REPEAT
from oom_sentinel.bisect.search.plan import (
    Observation,
    Plan,
    Progress,
    RepoSpan,
    Step,
    Test,
    next_step,
    progress,
)
from oom_sentinel.bisect.search.verdict import (
    DEFAULT_MARGIN,
    Ok,
    Oom,
    Outcome,
    Skip,
    Terms,
    Threshold,
    Timeout,
    Verdict,
    median_peaks,
    threshold_from_good,
)
from oom_sentinel.bisect.session.fsutil import FileLock, append_line, remove_tree
from oom_sentinel.bisect.state import gitrepo
from oom_sentinel.bisect.state.states import (
    CORE,
    PKG_PREFIX,
    Install,
    SnapshotResolver,
    State,
    check_value,
    differing_repos,
    is_package,
    node_name,
    repo_label,
    resolve_state,
)
from oom_sentinel.daemon.core.atomic import fsync_dir, write_text_atomic
from oom_sentinel.daemon.core.errors import BisectError, ConfigError, InputError, NotBisecting
from oom_sentinel.daemon.core.units import MIB, format_bytes

__all__ = [
    "ENV_CACHE_DIR",
    "LOG_FORMAT",
    "BisectPaths",
    "LogRecord",
    "OutcomeCache",
    "Session",
    "SessionSetup",
    "Status",
    "begin",
    "bisect_home",
    "format_record",
    "outcome_from_json",
    "outcome_to_json",
    "parse_log",
    "remove_tree",
    "reset_paths",
    "session_lock",
    "workflow_sha256",
]

ENV_CACHE_DIR = "OOM_SENTINEL_CACHE_DIR"
LOG_FORMAT = 1
SETUP_FORMAT = 1


# --------------------------------------------------------------------------- where things live


def bisect_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$OOM_SENTINEL_CACHE_DIR/bisect`` or the platform's user cache dir + ``/bisect``."""
    env = os.environ if environ is None else environ
    base = env.get(ENV_CACHE_DIR) or platformdirs.user_cache_dir("oom-sentinel", appauthor=False)
    return Path(base).expanduser() / "bisect"


def _install_key(comfyui: Path) -> str:
    real = str(Path(comfyui).expanduser().resolve())
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(real).name).strip("-.") or "comfyui"
    return f"{slug[:40]}-{hashlib.sha256(real.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class BisectPaths:
    """Where one install's session and workspace live (see the module docstring)."""

    root: Path
    outcomes: Path

    @classmethod
    def for_install(cls, comfyui: Path, home: Path | None = None) -> BisectPaths:
        home = bisect_home() if home is None else home
        return cls(home / _install_key(comfyui), home / "outcomes")

    @property
    def session(self) -> Path:
        return self.root / "session"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    def lane_workspace(self, lane: int) -> Path:
        """The workspace of ``--parallel`` lane ``lane`` (lane 0 is the one workspace)."""
        return self.workspace if lane == 0 else self.root / f"workspace-{lane}"

    def workspaces(self) -> list[Path]:
        """Every workspace on disk, lane 0 first (reset removes them all)."""
        lanes = sorted(self.root.glob("workspace-*"), key=lambda p: p.name)
        return [self.workspace, *lanes]

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def envs(self) -> Path:
        """Per-state environments (envs.py), shared by every install: same lock, same env."""
        return self.outcomes.parent / "envs"


_held: dict[Path, int] = {}
_locks: dict[Path, FileLock] = {}


@contextlib.contextmanager
def session_lock(paths: BisectPaths) -> Iterator[None]:
    """Exclusive per install, re-entrant within this process.

    Every command that changes the session takes it; a front end running a whole bisect
    holds it for the run, so ``reset`` or ``replay`` from another terminal fail with one
    line instead of pulling the workspace out from under a measurement.
    """
    key = paths.lock
    if _held.get(key):
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    lock = FileLock(key, "the bisect session")
    lock.acquire()
    _held[key] = 1
    _locks[key] = lock
    try:
        yield
    finally:
        _held.pop(key, None)
        _locks.pop(key, None)
        lock.release()


# --------------------------------------------------------------------------- setup


def workflow_sha256(prompt: Mapping[str, Any]) -> str:
    """A stable hash of an API prompt (key order and whitespace don't matter)."""
    canon = json.dumps(prompt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def _threshold_json(t: Threshold | None) -> dict[str, Any] | None:
    return None if t is None else {"vram_bytes": t.vram_bytes, "ram_bytes": t.ram_bytes}


def _threshold_from(d: Mapping[str, Any] | None) -> Threshold | None:
    return None if d is None else Threshold(d.get("vram_bytes"), d.get("ram_bytes"))


@dataclass(frozen=True)
class SessionSetup:
    """Everything fixed at start (``session.json``)."""

    install: str
    good: State
    bad: State
    spans: tuple[RepoSpan, ...]
    #: user repo path of every differing repo (for commit subjects in reports)
    repo_paths: Mapping[str, str] = field(default_factory=dict)
    terms: Terms = field(default_factory=Terms)
    workflow_sha256: str = ""
    #: the user's ComfyUI launch flags (unfiltered; the workspace filters per commit)
    flags: tuple[str, ...] = ()
    python: str | None = None
    #: an explicit budget; None: the good endpoint's peak × (1 + margin)
    budget: Threshold | None = None
    margin: float = DEFAULT_MARGIN
    repeat: int = 1
    #: ``--repeat auto``: a verdict with confidence (confidence.py), up to ``max_repeat`` runs
    adaptive: bool = False
    max_repeat: int = DEFAULT_MAX_REPEAT
    timeout_s: float | None = None
    timeout_is_bad: bool = False
    verify_endpoints: bool = True
    #: where the endpoints came from, in words ("snapshot 2026-01-02_…", "--good/--bad")
    source: str = ""
    created_at: str = ""
    #: the front end's own keys (kept verbatim)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def repos(self) -> list[str]:
        return [s.repo for s in self.spans]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SETUP_FORMAT,
            "install": self.install,
            "good": self.good.to_json(),
            "bad": self.bad.to_json(),
            "spans": [
                {"repo": s.repo, "good": s.good, "bad": s.bad, "commits": list(s.commits)}
                for s in self.spans
            ],
            "repo_paths": dict(self.repo_paths),
            "terms": {"old": self.terms.old, "new": self.terms.new},
            "workflow_sha256": self.workflow_sha256,
            "flags": list(self.flags),
            "python": self.python,
            "budget": _threshold_json(self.budget),
            "margin": self.margin,
            "repeat": self.repeat,
            "adaptive": self.adaptive,
            "max_repeat": self.max_repeat,
            "timeout_s": self.timeout_s,
            "timeout_is_bad": self.timeout_is_bad,
            "verify_endpoints": self.verify_endpoints,
            "source": self.source,
            "created_at": self.created_at,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], origin: str) -> SessionSetup:
        if d.get("format") != SETUP_FORMAT:
            raise InputError(f"{origin}: unknown session format {d.get('format')!r}")
        try:
            return cls(
                install=str(d["install"]),
                good=State.from_json(d["good"]),
                bad=State.from_json(d["bad"]),
                spans=tuple(
                    RepoSpan(s["repo"], s["good"], s["bad"], tuple(s["commits"]))
                    for s in d["spans"]
                ),
                repo_paths=dict(d.get("repo_paths") or {}),
                terms=Terms(d["terms"]["old"], d["terms"]["new"]),
                workflow_sha256=str(d.get("workflow_sha256") or ""),
                flags=tuple(d.get("flags") or ()),
                python=d.get("python"),
                budget=_threshold_from(d.get("budget")),
                margin=float(d.get("margin", DEFAULT_MARGIN)),
                repeat=int(d.get("repeat", 1)),
                adaptive=bool(d.get("adaptive", False)),
                max_repeat=int(d.get("max_repeat", DEFAULT_MAX_REPEAT)),
                timeout_s=d.get("timeout_s"),
                timeout_is_bad=bool(d.get("timeout_is_bad", False)),
                verify_endpoints=bool(d.get("verify_endpoints", True)),
                source=str(d.get("source") or ""),
                created_at=str(d.get("created_at") or ""),
                extra=dict(d.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{origin}: damaged session file ({exc})") from None


# --------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class LogRecord:
    """One verdict line of the log."""

    verdict: Verdict
    state: State
    #: "ok", "oom", "skip", "timeout" (measured) or "manual" (marked by hand)
    outcome: str = "manual"
    peak_vram_bytes: int | None = None
    peak_ram_bytes: int | None = None
    runs: int | None = None
    #: the skip reason or OOM evidence, one line
    reason: str | None = None
    comment: str = ""
    #: the peaks are a lower bound: a run they rest on stopped before the prompt finished
    peak_lower_bound: bool = False


def _mib(n: int | None) -> str | None:
    return None if n is None else f"{n / MIB:.1f}"


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_record(rec: LogRecord, terms: Terms, repos: Sequence[str]) -> str:
    """One log line for ``rec``; ``repos`` are the session's differing repos, in order."""
    words = [terms.word(rec.verdict), *rec.state.tokens(repos), f"outcome={rec.outcome}"]
    for key, value in (
        ("peak_vram_mib", _mib(rec.peak_vram_bytes)),
        ("peak_ram_mib", _mib(rec.peak_ram_bytes)),
        ("runs", None if rec.runs is None else str(rec.runs)),
        ("peak_lower_bound", "1" if rec.peak_lower_bound else None),
        ("reason", None if rec.reason is None else _one_line(rec.reason)),
    ):
        if value is not None:
            words.append(shlex.quote(f"{key}={value}"))
    line = " ".join(words)
    if rec.comment:
        line += " # " + _one_line(rec.comment)
    return line


def _expand(value: str, repo: str, span: RepoSpan) -> str:
    """Full id for an abbreviated commit, when it names exactly one candidate of ``span``."""
    with contextlib.suppress(ValueError):
        return check_value(value, repo)
    if re.fullmatch(r"[0-9a-f]{4,63}", value):
        hits = [c for c in (span.good, *span.commits) if c.startswith(value)]
        if len(set(hits)) == 1:
            return hits[0]
        if hits:
            raise ValueError(f"{repo_label(repo)}: {value!r} is ambiguous")
    raise ValueError(f"{repo_label(repo)}: {value!r} is not a value this bisect tests")


def parse_log(text: str, setup: SessionSetup, origin: str) -> list[LogRecord]:
    """Read a log back. A last line without its newline is a torn append and is ignored."""
    lines = text.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]  # torn tail
    spans = {s.repo: s for s in setup.spans}
    records = []
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{origin}:{no}"
        body, _, comment = _split_comment(line)
        try:
            words = shlex.split(body)
        except ValueError as exc:
            raise InputError(f"{where}: cannot parse line: {exc}") from None
        if not words:
            continue
        verdict = setup.terms.parse(words[0])
        if verdict is None:
            raise InputError(
                f"{where}: {words[0]!r} is not a verdict (use {setup.terms.old}, "
                f"{setup.terms.new} or skip)"
            )
        values: dict[str, str] = {}
        details: dict[str, str] = {}
        for w in words[1:]:
            key, eq, value = w.partition("=")
            if not eq:
                raise InputError(f"{where}: {w!r} is not KEY=VALUE")
            if key == CORE or key.startswith(("node:", PKG_PREFIX)):
                if key not in spans:
                    raise InputError(
                        f"{where}: {repo_label(key)} is not one of the repos this bisect changes"
                    )
                try:
                    values[key] = _expand(value, key, spans[key])
                except ValueError as exc:
                    raise InputError(f"{where}: {exc}") from None
            else:
                details[key] = value
        missing = [r for r in setup.repos() if r not in values]
        if missing:
            raise InputError(f"{where}: no value for {', '.join(map(repo_label, missing))}")
        try:
            rec = LogRecord(
                verdict=verdict,
                state=setup.good.with_values(values),
                outcome=details.get("outcome", "manual"),
                peak_vram_bytes=_bytes(details.get("peak_vram_mib")),
                peak_ram_bytes=_bytes(details.get("peak_ram_mib")),
                runs=int(details["runs"]) if "runs" in details else None,
                peak_lower_bound=details.get("peak_lower_bound") == "1",
                reason=details.get("reason"),
                comment=comment.strip(),
            )
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        records.append(rec)
    return records


def _split_comment(line: str) -> tuple[str, str, str]:
    """Split at the first ``#`` that starts a word outside quotes (shell comment rules)."""
    quote: str | None = None
    prev_space = True
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev_space:
            return line[:i], "#", line[i + 1 :]
        prev_space = ch.isspace() and quote is None
    return line, "", ""


def _bytes(mib: str | None) -> int | None:
    if mib is None:
        return None
    return round(float(mib) * MIB)


# --------------------------------------------------------------------------- outcome cache


def outcome_to_json(o: Outcome) -> dict[str, Any]:
    if isinstance(o, Ok):
        return {
            "kind": "ok",
            "peak_vram_bytes": o.peak_vram_bytes,
            "peak_ram_bytes": o.peak_ram_bytes,
            "duration_s": o.duration_s,
            "stopped_early": o.stopped_early,
        }
    if isinstance(o, Oom):
        return {
            "kind": "oom",
            "evidence": o.evidence,
            "pool": o.pool,
            "peak_vram_bytes": o.peak_vram_bytes,
            "peak_ram_bytes": o.peak_ram_bytes,
        }
    if isinstance(o, Skip):
        return {"kind": "skip", "reason": o.reason}
    return {
        "kind": "timeout",
        "after_s": o.after_s,
        "peak_vram_bytes": o.peak_vram_bytes,
        "peak_ram_bytes": o.peak_ram_bytes,
    }


def outcome_from_json(d: Mapping[str, Any]) -> Outcome:
    kind = d.get("kind")
    if kind == "ok":
        return Ok(
            d.get("peak_vram_bytes"),
            d.get("peak_ram_bytes"),
            d.get("duration_s"),
            bool(d.get("stopped_early", False)),
        )
    if kind == "oom":
        return Oom(
            str(d.get("evidence", "")),
            d.get("pool"),
            d.get("peak_vram_bytes"),
            d.get("peak_ram_bytes"),
        )
    if kind == "skip":
        return Skip(str(d.get("reason", "")))
    if kind == "timeout":
        return Timeout(d.get("after_s"), d.get("peak_vram_bytes"), d.get("peak_ram_bytes"))
    raise ValueError(f"unknown outcome kind {kind!r}")


class OutcomeCache:
    """Measured runs by (state, workflow hash, flags, budget, environment), across sessions.

    A reset keeps it: measuring the same state of the same workflow again would give the
    same answer, and a measurement costs a ComfyUI start plus a whole prompt.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def key(
        state: State,
        workflow_sha256: str,
        flags: Sequence[str],
        budget: Threshold | None,
        environment: Mapping[str, Any] | None = None,
    ) -> str:
        canon = json.dumps(
            {
                "state": state.to_json(),
                "workflow": workflow_sha256,
                "flags": list(flags),
                "budget": _threshold_json(budget),
                "environment": dict(environment or {}),
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canon.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> list[Outcome]:
        try:
            data = json.loads(self._path(key).read_text("utf-8"))
            return [outcome_from_json(d) for d in data["runs"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []  # missing or damaged: measure again

    def put(self, key: str, runs: Sequence[Outcome]) -> None:
        data = {"runs": [outcome_to_json(o) for o in runs]}
        write_text_atomic(self._path(key), json.dumps(data, indent=1) + "\n")


# --------------------------------------------------------------------------- the session


@dataclass(frozen=True)
class Status:
    """What ``oom-bisect status`` shows."""

    setup: SessionSetup
    step: Step
    progress: Progress
    records: tuple[LogRecord, ...]
    expected: State | None
    threshold: Threshold | None

    def lines(self) -> list[str]:
        """A plain-text rendering (the CLI may draw its own)."""
        t = self.setup.terms
        p = self.progress
        out = [
            f"bisecting {self.setup.install}: {len(self.setup.spans)} repo(s) differ "
            f"({', '.join(map(repo_label, self.setup.repos()))})",
            f"tested {p.tested} state(s); phase {p.phase}; about {p.steps_left} step(s) left",
        ]
        if p.groups:
            sets = "; ".join(" + ".join(map(repo_label, g)) for g in p.groups)
            out.append(f"culprit sets so far: {sets}")
        if p.repo is not None:
            out.append(f"{repo_label(p.repo)}: {p.candidates_left} candidate(s) left")
        if self.threshold is not None:
            parts = []
            if self.threshold.vram_bytes is not None:
                parts.append(f"VRAM > {format_bytes(self.threshold.vram_bytes)}")
            if self.threshold.ram_bytes is not None:
                parts.append(f"RAM > {format_bytes(self.threshold.ram_bytes)}")
            out.append(f"{t.new} = out of memory" + (" or " + " or ".join(parts) if parts else ""))
        if self.expected is not None:
            out.append("being measured: " + " ".join(self.expected.tokens(self.setup.repos())))
        elif isinstance(self.step, Test):
            out.append("next: " + " ".join(self.step.state.tokens(self.setup.repos())))
        return out


class Session:
    """One install's bisect session on disk. Every query rereads the files."""

    def __init__(self, paths: BisectPaths, setup: SessionSetup) -> None:
        self.paths = paths
        self.setup = setup

    # -- lifecycle

    @staticmethod
    def exists(paths: BisectPaths) -> bool:
        return (paths.session / "started").is_file()

    @classmethod
    def open(cls, paths: BisectPaths) -> Session:
        if not cls.exists(paths):
            raise NotBisecting(f"{paths.root}: no bisect session (start one with oom-bisect run)")
        # a replay server left by an oom-bisect that died: it holds memory and a port
        from oom_sentinel.bisect.measure.replay import kill_leftover_replay

        kill_leftover_replay(paths.workspace)
        p = paths.session / "session.json"
        try:
            data = json.loads(p.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(
                f"{p}: cannot read the session ({exc}); oom-bisect reset clears it"
            ) from None
        return cls(paths, SessionSetup.from_json(data, str(p)))

    @classmethod
    def create(
        cls, paths: BisectPaths, setup: SessionSetup, prompt: Mapping[str, Any] | None = None
    ) -> Session:
        """Write a new session atomically (all files, then one rename)."""
        if not setup.spans:
            raise BisectError("the good and bad states are the same: there is nothing to bisect")
        paths.root.mkdir(parents=True, exist_ok=True)
        with session_lock(paths):
            if cls.exists(paths):
                raise BisectError(
                    f"a bisect is already in progress for {setup.install} "
                    "(oom-bisect status shows it, oom-bisect reset ends it)"
                )
            _remove_leftovers(paths)
            if not setup.created_at:
                setup = _replace_created(setup)
            tmp = paths.root / f"session.tmp-{os.getpid()}-{secrets.token_hex(4)}"
            tmp.mkdir(mode=0o700)
            try:
                write_text_atomic(
                    tmp / "session.json", json.dumps(setup.to_json(), indent=2) + "\n"
                )
                if prompt is not None:
                    write_text_atomic(tmp / "prompt.json", json.dumps(prompt, indent=1) + "\n")
                write_text_atomic(tmp / "log", _log_header(setup))
                write_text_atomic(tmp / "started", setup.created_at + "\n")
                os.rename(tmp, paths.session)
            except BaseException:
                remove_tree(tmp)
                raise
            fsync_dir(paths.root)
        return cls(paths, setup)

    def reset(self) -> None:
        reset_paths(self.paths)

    # -- reading

    def records(self) -> list[LogRecord]:
        return parse_log(self.log_text(), self.setup, str(self.paths.session / "log"))

    def log_text(self) -> str:
        """The log as ``oom-bisect log`` prints it (a torn last line left out)."""
        try:
            text = (self.paths.session / "log").read_text("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        if text and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        return text

    def prompt(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.paths.session / "prompt.json").read_text("utf-8"))
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def plan(self) -> Plan:
        s = self.setup
        obs = tuple(Observation(r.state, r.verdict) for r in self.records())
        return Plan(s.good, s.bad, s.spans, obs, s.verify_endpoints)

    def next_step(self) -> Step:
        return next_step(self.plan())

    def progress(self) -> Progress:
        return progress(self.plan())

    def expected(self) -> State | None:
        try:
            return State.from_json(json.loads((self.paths.session / "expected").read_text("utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def threshold(self, records: Sequence[LogRecord] | None = None) -> Threshold | None:
        """Bad above this; None until the good endpoint has a verdict (unless a budget is set).

        Derived from the log (the latest measured verdict on the good state), so a resumed or
        replayed session uses the same threshold as the original run.
        """
        s = self.setup
        if s.budget is not None and (
            s.budget.vram_bytes is not None or s.budget.ram_bytes is not None
        ):
            return s.budget
        recs = self.records() if records is None else records
        good = [r for r in recs if r.state == s.good]
        if not good:
            return None
        g = good[-1]
        run = Ok(g.peak_vram_bytes, g.peak_ram_bytes)
        return threshold_from_good([run], margin=s.margin)

    def status(self) -> Status:
        recs = self.records()
        obs_plan = self.plan()
        return Status(
            self.setup,
            next_step(obs_plan),
            progress(obs_plan),
            tuple(recs),
            self.expected(),
            self.threshold(recs),
        )

    # -- writing

    def set_expected(self, state: State) -> None:
        """Say which state is being measured now (a resume measures it again)."""
        write_text_atomic(self.paths.session / "expected", json.dumps(state.to_json()) + "\n")

    def clear_expected(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.paths.session / "expected")

    def record(
        self,
        state: State,
        verdict: Verdict,
        runs: Sequence[Outcome] = (),
        comment: str = "",
    ) -> LogRecord:
        """Append a measured verdict (``runs``: what the measurements saw) and clear ``expected``."""
        rec = _record_from_runs(state, verdict, runs, comment)
        self._append(rec)
        return rec

    def mark(self, word: str, state: State | None = None, comment: str = "") -> LogRecord:
        """A manual verdict (``good``/``bad``/``skip`` or the session's terms) on ``state``,
        by default the state being measured or else the next one to test."""
        verdict = self.setup.terms.parse(word)
        if verdict is None:
            t = self.setup.terms
            raise ConfigError(f"{word!r} is not a verdict here: use {t.old}, {t.new} or skip")
        if state is None:
            state = self.expected()
        if state is None:
            step = self.next_step()
            if not isinstance(step, Test):
                raise BisectError(
                    "nothing to mark: the bisect has finished (see oom-bisect status)"
                )
            state = step.state
        self._check_state(state)
        rec = LogRecord(verdict, state, "manual", comment=comment or "marked by hand")
        self._append(rec)
        return rec

    def _check_state(self, state: State) -> None:
        s = self.setup
        for repo in differing_repos(s.good, state):
            if repo not in s.repos():
                raise BisectError(
                    f"{repo_label(repo)} is not one of the repos this bisect changes, so that state "
                    "is not part of it"
                )

    def _append(self, rec: LogRecord) -> None:
        self._check_state(rec.state)
        with session_lock(self.paths):
            if not self.exists(self.paths):
                raise NotBisecting(f"{self.paths.root}: the session was reset")
            append_line(
                self.paths.session / "log", format_record(rec, self.setup.terms, self.setup.repos())
            )
            self.clear_expected()

    def replay(self, logfile: Path) -> int:
        """Reset the verdicts to those of ``logfile`` (an edited ``log``); returns their number.

        The file is read and checked completely first: a bad line changes nothing.
        """
        try:
            text = Path(logfile).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{logfile}: cannot read: {exc}") from None
        recs = parse_log(text, self.setup, str(logfile))
        body = _log_header(self.setup) + "".join(
            format_record(r, self.setup.terms, self.setup.repos()) + "\n" for r in recs
        )
        with session_lock(self.paths):
            if not self.exists(self.paths):
                raise NotBisecting(f"{self.paths.root}: the session was reset")
            write_text_atomic(self.paths.session / "log", body)
            self.clear_expected()
        return len(recs)

    # -- cache

    def cache_key(self, state: State, environment: Mapping[str, Any] | None = None) -> str:
        s = self.setup
        return OutcomeCache.key(state, s.workflow_sha256, s.flags, s.budget, environment)

    def cached_runs(
        self, state: State, environment: Mapping[str, Any] | None = None
    ) -> list[Outcome]:
        return OutcomeCache(self.paths.outcomes).get(self.cache_key(state, environment))

    def store_runs(
        self, state: State, runs: Sequence[Outcome], environment: Mapping[str, Any] | None = None
    ) -> None:
        OutcomeCache(self.paths.outcomes).put(self.cache_key(state, environment), runs)


def _record_from_runs(
    state: State, verdict: Verdict, runs: Sequence[Outcome], comment: str
) -> LogRecord:
    if not runs:
        return LogRecord(verdict, state, "manual", comment=comment)
    vram, ram = median_peaks(runs)
    kinds = [type(o) for o in runs]
    reason = None
    if verdict is Verdict.SKIP:
        skips = [o for o in runs if isinstance(o, Skip | Timeout)]
        outcome = "timeout" if skips and all(isinstance(o, Timeout) for o in skips) else "skip"
        first = skips[0] if skips else None
        reason = first.reason if isinstance(first, Skip) else "timed out" if first else None
    elif Oom in kinds and verdict is Verdict.NEW:
        outcome = "oom"
        reason = next(o.evidence for o in runs if isinstance(o, Oom))
    else:
        outcome = "ok"
    lower = verdict is Verdict.NEW and any(_incomplete(o) for o in runs)
    return LogRecord(verdict, state, outcome, vram, ram, len(runs), reason, comment, lower)


def _incomplete(o: Outcome) -> bool:
    """A run that stopped before the prompt finished: its peaks are what it reached so far."""
    return isinstance(o, Oom | Timeout) or (isinstance(o, Ok) and o.stopped_early)


def _replace_created(setup: SessionSetup) -> SessionSetup:
    now = _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    return replace(setup, created_at=now)


def _log_header(setup: SessionSetup) -> str:
    repos = setup.repos()
    return (
        f"# oom-bisect log, format {LOG_FORMAT}: one verdict per line; "
        "oom-bisect replay FILE reads it back\n"
        f"# install: {setup.install}\n"
        f"# terms: {setup.terms.old} {setup.terms.new}\n"
        f"# {setup.terms.old} endpoint: {' '.join(setup.good.tokens(repos))}\n"
        f"# {setup.terms.new} endpoint: {' '.join(setup.bad.tokens(repos))}\n"
    )


# --------------------------------------------------------------------------- start and reset


def begin(
    paths: BisectPaths,
    install: Install,
    good: str | Sequence[str],
    bad: str | Sequence[str],
    *,
    prompt: Mapping[str, Any] | None = None,
    snapshot_resolver: SnapshotResolver | None = None,
    terms: Terms | None = None,
    flags: Sequence[str] = (),
    python: str | None = None,
    budget: Threshold | None = None,
    margin: float = DEFAULT_MARGIN,
    repeat: int = 1,
    adaptive: bool = False,
    max_repeat: int = DEFAULT_MAX_REPEAT,
    timeout_s: float | None = None,
    timeout_is_bad: bool = False,
    verify_endpoints: bool = True,
    source: str = "",
    extra: Mapping[str, Any] | None = None,
) -> Session:
    """Resolve the endpoints, list the candidates and create the session.

    Everything that can fail (a junk ref, a bad snapshot, equal endpoints, a running session)
    fails before the first file is written.
    """
    if repeat < 1:
        raise ConfigError(f"--repeat must be at least 1, got {repeat}")
    if max_repeat < 1:
        raise ConfigError(f"--max-repeat must be at least 1, got {max_repeat}")
    if Session.exists(paths):
        raise BisectError(
            f"a bisect is already in progress for {install.comfyui} "
            "(oom-bisect status shows it, oom-bisect reset ends it)"
        )
    g = resolve_state(good, install, snapshot_resolver=snapshot_resolver)
    b = resolve_state(bad, install, snapshot_resolver=snapshot_resolver)
    if g.packages or b.packages:
        # a package set is a whole lock: a side without one runs the interpreter's own set
        if not install.packages:
            raise BisectError(
                "a state names Python packages but the interpreter's own set was not read"
            )
        g = g if g.packages else g.with_packages(dict(install.packages))
        b = b if b.packages else b.with_packages(dict(install.packages))
    repos = differing_repos(g, b)
    if not repos:
        raise BisectError("the good and bad states are the same: there is nothing to bisect")
    spans = []
    repo_paths = {}
    for repo in repos:
        gv, bv = g.value(repo), b.value(repo)
        if is_package(repo):
            path = None  # a package version is one step: no history between two pins
        else:
            path = install.comfyui if repo == CORE else _node_path(install, repo)
        commits: tuple[str, ...] = ()
        if path is not None:
            repo_paths[repo] = str(path)
            if gitrepo.is_commit_id(gv) and gitrepo.is_commit_id(bv):
                commits = gitrepo.first_parent_range(path, gv, bv, repo_label(repo))
        spans.append(RepoSpan(repo, gv, bv, commits))
    setup = SessionSetup(
        install=str(install.comfyui),
        good=g,
        bad=b,
        spans=tuple(spans),
        repo_paths=repo_paths,
        terms=terms or Terms(),
        workflow_sha256=workflow_sha256(prompt) if prompt is not None else "",
        flags=tuple(flags),
        python=python,
        budget=budget,
        margin=margin,
        repeat=repeat,
        adaptive=adaptive,
        max_repeat=max_repeat,
        timeout_s=timeout_s,
        timeout_is_bad=timeout_is_bad,
        verify_endpoints=verify_endpoints,
        source=source,
        extra=dict(extra or {}),
    )
    return Session.create(paths, setup, prompt)


def _node_path(install: Install, repo: str) -> Path | None:
    node = install.node(node_name(repo))
    return node.path if node is not None and node.kind == "git" else None


def _remove_leftovers(paths: BisectPaths) -> None:
    for p in paths.root.glob("session.tmp-*"):
        remove_tree(p)
    if paths.session.exists() and not Session.exists(paths):
        remove_tree(paths.session)  # an interrupted reset: `started` was already gone


def reset_paths(paths: BisectPaths) -> None:
    """End the session: remove the workspace, then the session files, ``started`` last.

    Safe to run again after an interruption; nothing in the user's repos needs undoing
    because the workspace never registered anything there (see workspace.py).
    """
    if not paths.root.exists():
        raise NotBisecting(f"{paths.root}: no bisect session")
    with session_lock(paths):
        had = paths.session.exists() or paths.workspace.exists()
        from oom_sentinel.bisect.measure.replay import kill_leftover_replay

        for ws in reversed(paths.workspaces()):  # the --parallel lanes' too, lane 0 last
            kill_leftover_replay(ws)  # before its files go from under it
            remove_workspace(ws)
        if paths.session.exists():
            for child in sorted(paths.session.iterdir()):
                if child.name != "started":
                    remove_tree(child)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths.session / "started")
            fsync_dir(paths.session)
            os.rmdir(paths.session)
        for p in paths.root.glob("session.tmp-*"):
            remove_tree(p)
        fsync_dir(paths.root)
    if not had:
        raise NotBisecting(f"{paths.root}: no bisect session")
