"""Every prompt ComfyUI ran: when, how it ended, how much memory it took, which workflow.

An OOM after an update is only a *regression* if the same workflow used to fit. Run history
answers that: each prompt's start, end, outcome and peak memory (from the memory timeline
between its start and end, sampled every 250 ms while it runs), keyed by the workflow
``fingerprint`` (a hash of the API prompt that ignores seeds and file names, so re-queuing the
same workflow matches) and, once install-state tracking is wired in, the install state it ran
under. The next issue's regression check and ``oom-sentinel runs`` read it.

The table is migration 2 of ``store.MIGRATIONS``; one row per ``(instance, prompt_id)`` --
ComfyUI's prompt ids are uuid4s, so a re-report of the same prompt (the API watcher reconnected
and read history again) is ignored, which is what keeps the record exactly-once.

Outcomes: ``success``; ``oom`` (the error was classified as out of memory); ``error`` (any
other error); ``interrupted``; ``killed`` (its server was killed by the OS for memory while it ran);
``sigkill`` (shown "killed (SIGKILL)": its server got a SIGKILL that no evidence ties to memory --
a user's ``kill -9``, a launcher, a teardown; no incident); ``crashed`` (its server went away
while it ran, no kill seen).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from oom_sentinel.daemon.comfy.prompt_fingerprint import workflow_fingerprint, workflow_hash
from oom_sentinel.daemon.comfy.watch import PromptDone
from oom_sentinel.daemon.probes.base import MemorySample
from oom_sentinel.daemon.store.db import Store

__all__ = [
    "OUTCOMES",
    "OUTCOME_LABELS",
    "PeakMemory",
    "RunOutcome",
    "RunRecord",
    "has_run",
    "list_runs",
    "peak_memory",
    "record_run",
    "run_from_done",
    "run_outcome",
]

RunOutcome = Literal["success", "oom", "error", "interrupted", "killed", "sigkill", "crashed"]
OUTCOMES: tuple[str, ...] = (
    "success",
    "oom",
    "error",
    "interrupted",
    "killed",
    "sigkill",
    "crashed",
)
#: how ``runs`` shows an outcome where its stored name is terse
OUTCOME_LABELS: dict[str, str] = {"sigkill": "killed (SIGKILL)"}


@dataclass(frozen=True, slots=True)
class PeakMemory:
    """The highest values the timeline saw while a prompt ran (None: never measured)."""

    #: RSS of the ComfyUI process and its children
    rss_bytes: int | None = None
    #: GPU memory NVML attributes to the ComfyUI process
    vram_bytes: int | None = None
    #: everything used on the GPU(s) the process was on (other programs included)
    gpu_used_bytes: int | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One ``runs`` row."""

    instance: str
    prompt_id: str
    outcome: str
    started_s: float | None
    ended_s: float | None
    #: ``fingerprint.fingerprint`` of the API prompt (same workflow across runs)
    fingerprint: str | None
    #: ``fingerprint.workflow_hash`` (exactly this prompt)
    workflow_hash: str | None
    peak_rss_bytes: int | None
    peak_vram_bytes: int | None
    peak_gpu_used_bytes: int | None
    #: for an OOM: the pool; for any error: where and what
    pool: str | None
    node_id: str | None
    node_type: str | None
    exception_type: str | None
    #: nodes served from cache (a fully cached run measures nothing) and the prompt's size
    cached_nodes: int | None
    node_count: int | None
    pid: int | None
    install_state_id: str | None
    incident_id: str | None
    recorded_s: float

    @property
    def duration_s(self) -> float | None:
        if self.started_s is None or self.ended_s is None:
            return None
        return max(0.0, self.ended_s - self.started_s)

    def to_json(self) -> dict[str, Any]:
        """The documented ``runs --json`` shape (field order is the column order)."""
        return {
            "instance": self.instance,
            "prompt_id": self.prompt_id,
            "outcome": self.outcome,
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            "duration_s": self.duration_s,
            "fingerprint": self.fingerprint,
            "workflow_hash": self.workflow_hash,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_vram_bytes": self.peak_vram_bytes,
            "peak_gpu_used_bytes": self.peak_gpu_used_bytes,
            "pool": self.pool,
            "node_id": self.node_id,
            "node_type": self.node_type,
            "exception_type": self.exception_type,
            "cached_nodes": self.cached_nodes,
            "node_count": self.node_count,
            "pid": self.pid,
            "install_state_id": self.install_state_id,
            "incident_id": self.incident_id,
            "recorded_s": self.recorded_s,
        }


_COLUMNS = (
    "instance, prompt_id, outcome, started_s, ended_s, fingerprint, workflow_hash, "
    "peak_rss_bytes, peak_vram_bytes, peak_gpu_used_bytes, pool, node_id, node_type, "
    "exception_type, cached_nodes, node_count, pid, install_state_id, incident_id, recorded_s"
)


# ---- pure ------------------------------------------------------------------------------------


def _max(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def peak_memory(
    samples: Sequence[MemorySample], pid: int | None, start_s: float, end_s: float
) -> PeakMemory:
    """Peaks of ``pid``'s process tree and GPU use over the samples in ``[start_s, end_s]``."""
    window = [s for s in samples if start_s <= s.time_s <= end_s]
    if pid is None or not window:
        return PeakMemory(samples=len(window))
    rss: list[int | None] = []
    vram: list[int | None] = []
    device_used: list[int | None] = []
    devices: set[int] = set()
    for sample in window:
        for tree in sample.process_trees:
            if tree.root_pid == pid:
                rss.append(tree.rss_bytes)
        mine = [p for p in sample.gpu_processes if p.pid == pid]
        if mine:
            known = [p.used_bytes for p in mine if p.used_bytes is not None]
            vram.append(sum(known) if known else None)
            devices.update(p.device_index for p in mine)
    if devices:
        for sample in window:
            device_used.extend(g.used_bytes for g in sample.gpus if g.index in devices)
    return PeakMemory(
        rss_bytes=_max(rss),
        vram_bytes=_max(vram),
        gpu_used_bytes=_max(device_used),
        samples=len(window),
    )


def run_outcome(done: PromptDone, *, killed: bool = False) -> RunOutcome:
    """The run's outcome from what the API said (``killed``: its server was killed by the OS)."""
    if done.outcome == "success":
        return "success"
    if done.outcome == "interrupted":
        return "interrupted"
    if done.outcome == "lost":
        return "killed" if killed else "crashed"
    return "oom" if done.event is not None else "error"


def run_from_done(
    done: PromptDone,
    *,
    recorded_s: float,
    pid: int | None = None,
    samples: Sequence[MemorySample] = (),
    started_s: float | None = None,
    window_end_s: float | None = None,
    killed: bool = False,
    install_state_id: str | None = None,
    incident_id: str | None = None,
) -> RunRecord:
    """The run row of one finished prompt (pure). ``started_s`` stands in when ComfyUI's
    own start time is unknown (a lost prompt: when it was seen running). Peaks are taken over
    the samples from the start to ``window_end_s`` (default: when the outcome was seen) --
    ComfyUI keeps a prompt's outputs cached after it ends, so a sample taken just after the
    end still shows what it held; a prompt shorter than the sampling interval has no better
    measurement."""
    start = done.started_s if done.started_s is not None else started_s
    end = done.ended_s if done.ended_s is not None else (done.seen_s if start else None)
    peak = (
        peak_memory(samples, pid, start, max(end, done.seen_s, window_end_s or 0.0))
        if start is not None and end is not None
        else PeakMemory()
    )
    error = done.error or {}
    prompt = done.prompt
    fp = wh = None
    if prompt:
        try:
            fp, wh = workflow_fingerprint(prompt), workflow_hash(prompt)
        except (TypeError, ValueError):
            fp = wh = None

    def text(key: str) -> str | None:
        value = error.get(key)
        return value if isinstance(value, str) else None

    return RunRecord(
        instance=done.instance,
        prompt_id=done.prompt_id,
        outcome=run_outcome(done, killed=killed),
        started_s=start,
        ended_s=end,
        fingerprint=fp,
        workflow_hash=wh,
        peak_rss_bytes=peak.rss_bytes,
        peak_vram_bytes=peak.vram_bytes,
        peak_gpu_used_bytes=peak.gpu_used_bytes,
        pool=str(done.event.pool) if done.event is not None else None,
        node_id=text("node_id"),
        node_type=text("node_type"),
        exception_type=text("exception_type"),
        cached_nodes=len(done.cached_nodes) if done.outcome != "lost" else None,
        node_count=done.node_count,
        pid=pid,
        install_state_id=install_state_id,
        incident_id=incident_id,
        recorded_s=recorded_s,
    )


# ---- the store -------------------------------------------------------------------------------


def record_run(store: Store, run: RunRecord) -> bool:
    """Insert the run; False when this prompt of this instance is already recorded."""
    with store.transaction("save a run") as db:
        cur = db.execute(
            f"INSERT INTO runs ({_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (instance, prompt_id) DO NOTHING",
            (
                run.instance,
                run.prompt_id,
                run.outcome,
                run.started_s,
                run.ended_s,
                run.fingerprint,
                run.workflow_hash,
                run.peak_rss_bytes,
                run.peak_vram_bytes,
                run.peak_gpu_used_bytes,
                run.pool,
                run.node_id,
                run.node_type,
                run.exception_type,
                run.cached_nodes,
                run.node_count,
                run.pid,
                run.install_state_id,
                run.incident_id,
                run.recorded_s,
            ),
        )
        return cur.rowcount > 0


def has_run(store: Store, instance: str, prompt_id: str) -> bool:
    rows = store.query(
        "look up a run",
        "SELECT 1 FROM runs WHERE instance = ? AND prompt_id = ?",
        (instance, prompt_id),
    )
    return bool(rows)


def _row(row: Sequence[Any]) -> RunRecord:
    return RunRecord(*row)


def list_runs(
    store: Store,
    *,
    instance: str | None = None,
    fingerprint: str | None = None,
    outcome: str | None = None,
    since_s: float | None = None,
    limit: int | None = None,
) -> list[RunRecord]:
    """Runs newest first (by end, else by when they were recorded), optionally filtered."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("instance", instance), ("fingerprint", fingerprint)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if outcome is not None:
        where.append("outcome = ?")
        params.append(outcome)
    if since_s is not None:
        where.append("coalesce(ended_s, recorded_s) >= ?")
        params.append(since_s)
    sql = f"SELECT {_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY coalesce(ended_s, recorded_s) DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [_row(r) for r in store.query("list runs", sql, params)]
