"""Decide whether an OOM is a *suspected regression*: the same workflow (or, failing that,
something on the same ComfyUI) succeeded under an earlier, different install state.

"It ran yesterday; after updating, it runs out of memory" is the case ``oom-bisect`` exists
for, and the snapshot is where the user learns to run it. The opposite matters as much: when
the install did not change since the workflow last fitted, pointing at an update would send
the user on a bisect that cannot find anything -- the advice must stay about the workflow.

The decision is pure: it takes the state the failing prompt ran under, the recorded successful
runs and a way to look up states by id, and returns a ``RegressionVerdict`` whose
``to_section()`` is the snapshot's ``regression`` section (documented in
``snapshot.schema.json``). The snapshot's id is only known once the writer names its
directory, so the section, the advice and the summary carry ``SNAPSHOT_ID_PLACEHOLDER``,
which ``snapshot.build_snapshot_json`` replaces with the final id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from oom_sentinel.daemon.classify.advice import Advice
from oom_sentinel.daemon.incidents.snapshot import SNAPSHOT_ID_PLACEHOLDER
from oom_sentinel.daemon.install.diff import StateDiff, diff_states
from oom_sentinel.daemon.install.state import InstallState

__all__ = [
    "BISECT_ADVICE_KEY",
    "SUMMARY_SUFFIX",
    "GoodRun",
    "RegressionVerdict",
    "assess_regression",
    "good_run_from_record",
    "same_code_state",
]

#: ``advice[].key`` of the "run oom-bisect" advice item.
BISECT_ADVICE_KEY = "bisect-regression"
#: what a suspected regression appends to the snapshot's summary, before the bisect command
SUMMARY_SUFFIX = " -- suspected regression after an install change; run: oom-bisect "

Match = Literal["workflow", "instance"]
DiffFn = Callable[[InstallState, InstallState], StateDiff]


@dataclass(frozen=True, slots=True)
class GoodRun:
    """A successful prompt as regression detection needs it (from a ``runs`` row)."""

    prompt_id: str
    instance: str
    fingerprint: str | None
    #: the install state it ran under (None: not recorded)
    state_id: str | None
    ended_s: float | None
    peak_vram_bytes: int | None = None
    #: RSS of ComfyUI's process tree
    peak_ram_bytes: int | None = None
    peak_gpu_used_bytes: int | None = None
    #: every node was served from cache: it measured nothing and proves nothing fits
    fully_cached: bool = False


def good_run_from_record(run: Any) -> GoodRun:
    """A ``GoodRun`` from a ``runs.RunRecord`` (read by attribute, so this module does not
    depend on the runs table's module)."""
    cached = getattr(run, "cached_nodes", None)
    count = getattr(run, "node_count", None)
    return GoodRun(
        prompt_id=str(run.prompt_id),
        instance=str(run.instance),
        fingerprint=getattr(run, "fingerprint", None),
        state_id=getattr(run, "install_state_id", None),
        ended_s=getattr(run, "ended_s", None) or getattr(run, "recorded_s", None),
        peak_vram_bytes=getattr(run, "peak_vram_bytes", None),
        peak_ram_bytes=getattr(run, "peak_rss_bytes", None),
        peak_gpu_used_bytes=getattr(run, "peak_gpu_used_bytes", None),
        fully_cached=bool(cached is not None and count and cached >= count),
    )


def same_code_state(a: InstallState, b: InstallState, diff: DiffFn = diff_states) -> bool:
    """Whether two states run the same code: equal ids, or nothing that a diff can see moved.

    States of one install differ in id without differing in code when one side lacks facts
    the other has -- a state rebuilt from the reflog has no pip list, dirty files or version;
    a capture between interpreter probes carries the last ones -- and ``diff_states`` only
    compares what both sides know."""
    return a.state_id == b.state_id or diff(a, b).is_empty


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class RegressionVerdict:
    """The answer, with everything the snapshot shows for it."""

    suspected: bool
    #: one sentence: why suspected, or why not
    reason: str
    #: how the last good run was matched: the same workflow fingerprint, or only the instance
    match: Match | None = None
    fingerprint: str | None = None
    bad_state: InstallState | None = None
    last_good_state: InstallState | None = None
    last_good_run: GoodRun | None = None
    diff: StateDiff | None = None

    @property
    def bisect_command(self) -> str | None:
        return f"oom-bisect {SNAPSHOT_ID_PLACEHOLDER}" if self.suspected else None

    def to_section(self) -> dict[str, Any]:
        """The snapshot's ``regression`` section (shape in ``snapshot.schema.json``)."""
        run = self.last_good_run
        return {
            "suspected": self.suspected,
            "reason": self.reason,
            "match": self.match,
            "fingerprint": self.fingerprint,
            "bad_state_id": self.bad_state.state_id if self.bad_state is not None else None,
            "last_good_state_id": self.last_good_state.state_id
            if self.last_good_state is not None
            else None,
            "last_good_run": None
            if run is None
            else {
                "prompt_id": run.prompt_id,
                "instance": run.instance,
                "finished": _iso(run.ended_s),
                "state_id": run.state_id,
                "peak_vram_bytes": run.peak_vram_bytes,
                "peak_ram_bytes": run.peak_ram_bytes,
                "peak_gpu_used_bytes": run.peak_gpu_used_bytes,
            },
            "diff": self.diff.to_dict() if self.diff is not None else None,
            "diff_summary": self.diff.summary_lines() if self.diff is not None else [],
            "bisect_command": self.bisect_command,
            "last_good_state": self.last_good_state.to_dict()
            if self.last_good_state is not None
            else None,
            "bad_state": self.bad_state.to_dict() if self.bad_state is not None else None,
        }

    def advice(self) -> Advice | None:
        """The first advice item for a suspected regression (None otherwise: then the
        workflow advice stands alone)."""
        if not self.suspected or self.diff is None:
            return None
        what = "This workflow" if self.match == "workflow" else "A workflow on this ComfyUI"
        when = _iso(self.last_good_run.ended_s) if self.last_good_run else None
        changed = _changed_text(self.diff)
        return Advice(
            key=BISECT_ADVICE_KEY,
            text=(
                f"{what} succeeded{' at ' + when if when else ''} before the install changed "
                f"({changed}). Run `oom-bisect {SNAPSHOT_ID_PLACEHOLDER}` to find the commit "
                "that made it run out of memory."
            ),
        )

    def summary_suffix(self) -> str | None:
        """Appended to the snapshot's summary when suspected."""
        if not self.suspected:
            return None
        return SUMMARY_SUFFIX + SNAPSHOT_ID_PLACEHOLDER


def _changed_text(diff: StateDiff) -> str:
    parts: list[str] = []
    for change in diff.repos[:3]:
        label = "ComfyUI" if change.repo == "ComfyUI/" else f"custom_nodes/{change.repo}"
        rng = change.range
        if rng is not None and rng.ahead:
            parts.append(f"{label} +{rng.ahead} commit{'s' if rng.ahead != 1 else ''}")
        else:
            parts.append(f"{label} moved")
    extra_repos = len(diff.repos) - 3
    if extra_repos > 0:
        parts.append(f"{extra_repos} more repo{'s' if extra_repos != 1 else ''}")
    if diff.nodes:
        parts.append(f"{len(diff.nodes)} custom-node change{'s' if len(diff.nodes) != 1 else ''}")
    if diff.pip:
        gpu = [p.name for p in diff.pip if p.gpu_stack]
        parts.append(
            f"{len(diff.pip)} pip change{'s' if len(diff.pip) != 1 else ''}"
            + (f" incl. {', '.join(gpu[:3])}" if gpu else "")
        )
    return ", ".join(parts) or "see the diff"


def _latest(runs: Iterable[GoodRun]) -> GoodRun | None:
    best: GoodRun | None = None
    for run in runs:
        if best is None or (run.ended_s or 0.0) > (best.ended_s or 0.0):
            best = run
    return best


def assess_regression(
    *,
    instance: str,
    bad_state: InstallState | None,
    fingerprint: str | None,
    runs: Sequence[GoodRun],
    state: Callable[[str], InstallState | None],
    diff: DiffFn = diff_states,
    full_diff: DiffFn | None = None,
) -> RegressionVerdict:
    """Whether the OOM of a prompt that ran under ``bad_state`` is a suspected regression.

    ``runs``: successful runs (any instance; others are ignored). The last good run is the
    most recent one of this instance with the same workflow ``fingerprint``; without a
    fingerprint, or when this workflow never succeeded here, the most recent successful run
    of the instance (``match="instance"``). Fully cached runs prove nothing and are skipped.
    It is suspected when that run's state differs in code from ``bad_state`` (see
    ``same_code_state``). ``state`` looks a state up by id; ``diff`` decides sameness (pure
    by default) and ``full_diff`` (default: ``diff``) builds the diff the snapshot shows,
    e.g. with commit ranges resolved in the user's repos."""
    if bad_state is None:
        return RegressionVerdict(
            False,
            "the install state this prompt ran under is unknown (no capture or reflog for it)",
            fingerprint=fingerprint,
        )
    mine = [r for r in runs if r.instance == instance and not r.fully_cached]
    match: Match = "workflow"
    candidates = [r for r in mine if fingerprint is not None and r.fingerprint == fingerprint]
    if not candidates:
        match = "instance"
        candidates = mine
    last = _latest(candidates)
    if last is None:
        return RegressionVerdict(
            False,
            "no earlier successful run on this instance is recorded, so there is nothing to "
            "compare with",
            fingerprint=fingerprint,
            bad_state=bad_state,
        )
    what = "this workflow" if match == "workflow" else "a workflow on this instance"
    finished = _iso(last.ended_s) or "an unknown time"
    if last.state_id is None:
        return RegressionVerdict(
            False,
            f"{what} last succeeded at {finished} (prompt {last.prompt_id}), but no install "
            "state was recorded for that run",
            match=match,
            fingerprint=fingerprint,
            bad_state=bad_state,
            last_good_run=last,
        )
    good_state = bad_state if last.state_id == bad_state.state_id else state(last.state_id)
    if good_state is None:
        return RegressionVerdict(
            False,
            f"{what} last succeeded at {finished} under install state {last.state_id}, which "
            "is no longer in the store",
            match=match,
            fingerprint=fingerprint,
            bad_state=bad_state,
            last_good_run=last,
        )
    if same_code_state(good_state, bad_state, diff):
        return RegressionVerdict(
            False,
            f"the install has not changed since {what} last succeeded at {finished} (prompt "
            f"{last.prompt_id}); the cause is in the workflow or what else uses the memory, "
            "not an update",
            match=match,
            fingerprint=fingerprint,
            bad_state=bad_state,
            last_good_state=good_state,
            last_good_run=last,
        )
    shown = (full_diff or diff)(good_state, bad_state)
    return RegressionVerdict(
        True,
        f"{what} succeeded at {finished} (prompt {last.prompt_id}) under install state "
        f"{good_state.state_id}; it ran out of memory under {bad_state.state_id}",
        match=match,
        fingerprint=fingerprint,
        bad_state=bad_state,
        last_good_state=good_state,
        last_good_run=last,
        diff=shown,
    )
