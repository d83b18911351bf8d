"""The prompt lifecycle: what ComfyUI's API and the process watcher report becomes ``runs``
rows and, for a failed prompt, an ``Observation`` handed to the next stage (``observe``: the
incident tracker). A prompt that ran out of memory gets its row only once its incident counted
it durably (its snapshot on disk), so a crash in between re-reads it from ComfyUI's history
instead of losing it; a prompt whose server went away waits LOST_RUN_GRACE_S for the process
watcher to say whether the OS killed it. What it keeps (the prompt, workflow, API context,
process ends) is what snapshot assembly reads. Main loop only."""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oom_sentinel.daemon.classify.events import Pool
from oom_sentinel.daemon.comfy.process_watch import ProcessExit, kill_observation
from oom_sentinel.daemon.comfy.watch import ApiContext, ApiStatus, PromptDone, PromptStarted
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.incidents.tracker import Incident, IncidentTracker, Observation
from oom_sentinel.daemon.install.history import InstallStateTracker
from oom_sentinel.daemon.probes.timeline import Sampler, Timeline
from oom_sentinel.daemon.service.instances import InstanceRegistry
from oom_sentinel.daemon.store.db import Store
from oom_sentinel.daemon.store.runs import RunRecord, has_run, record_run, run_from_done

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter

log = logging.getLogger("oom_sentinel")

#: A prompt whose server went away waits this long for the process watcher to say whether the
#: OS killed it (evidence collection may run journalctl, which has a 5 s timeout).
LOST_RUN_GRACE_S = 15.0
#: Prompts (API prompt, workflow, error context) kept for snapshots written after the fact.
CAPTURED_PROMPTS = 64
#: Prompt ids remembered as handled without asking the store again.
RECENT_PROMPT_IDS = 4096


@dataclass
class Captured:
    """What the API gave for one prompt, kept for its snapshot."""

    instance: str
    prompt: Mapping[str, Any] | None
    workflow: Mapping[str, Any] | None
    seen_s: float
    done: PromptDone | None = None


@dataclass(frozen=True)
class _LostRun:
    """A prompt whose server went away, waiting for the process watcher's verdict."""

    run: RunRecord
    since_s: float


@dataclass(frozen=True)
class _PendingRun:
    """An OOM run, written once its incident counted its API record (snapshot on disk)."""

    run: RunRecord
    #: the API observation's record id (``api_record_id``)
    record_id: str


def api_record_id(instance: str, prompt_id: str) -> str:
    """The record id of a prompt's API error: one prompt fails once."""
    return f"api|{instance}|{prompt_id}"


class PromptLifecycle:
    """Prompts seen running, done or lost, and the process ends that explain lost ones."""

    def __init__(
        self,
        registry: InstanceRegistry,
        store: Store,
        tracker: IncidentTracker,
        *,
        observe: Callable[[Observation], None],
        counted_by: Callable[[str], str | None],
        clock: Callable[[], float],
        horizon_s: float,
        handled_prompts: set[str] | None = None,
        sampler: Sampler | None = None,
        timeline: Timeline | None = None,
        install_states: InstallStateTracker | None = None,
        metrics: MetricsExporter | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.tracker = tracker  # read only: which incident a killed prompt belongs to
        self._observe = observe
        self._counted_by = counted_by
        self.clock = clock
        #: a prompt found in history (on connect) that ended after this moment becomes an
        #: incident: the last time a daemon on this data dir was alive, else now -- an OOM
        #: from before the first start is recorded as a run, not alarmed on
        self.horizon_s = horizon_s
        self.sampler = sampler
        self.timeline = timeline
        self.install_states = install_states
        self.metrics = metrics
        self.api_up: dict[str, bool] = {}
        #: instance -> (prompt_id, seen running at)
        self.running: dict[str, tuple[str, float]] = {}
        #: prompt_id -> what the API gave for it (prompt, workflow, error context)
        self.captured: OrderedDict[str, Captured] = OrderedDict()
        #: instance -> the latest /system_stats and /internal/logs tail
        self.api_context: dict[str, ApiContext] = {}
        #: pid -> how it ended (the snapshot's process and kernel sections)
        self.exits: OrderedDict[int, ProcessExit] = OrderedDict()
        #: (pid, create time) of processes that ended: never watched again
        self.dead: set[tuple[int, float | None]] = set()
        #: prompts whose server went away, waiting for the process watcher's verdict
        self._lost: list[_LostRun] = []
        #: OOM runs written once their incident's snapshot is on disk
        self._pending_runs: list[_PendingRun] = []
        #: prompt ids the snapshots on disk were built from (read at start-up)
        self.handled_prompts: set[str] = handled_prompts if handled_prompts is not None else set()
        #: prompt ids recorded (or pending) lately; the runs table is the durable record
        self._recorded: OrderedDict[str, None] = OrderedDict()

    # -- what the API says -------------------------------------------------------------------

    def on_api(self, message: Any) -> bool:
        """One API watcher message; True when an instance's process changed (the service
        re-points its watchers)."""
        if isinstance(message, PromptDone):
            self._on_prompt_done(message)
        elif isinstance(message, PromptStarted):
            self._on_prompt_started(message)
        elif isinstance(message, ApiContext):
            self.api_context[message.instance] = message
        elif isinstance(message, ApiStatus):
            return self._on_api_status(message)
        return False

    def _on_api_status(self, status: ApiStatus) -> bool:
        self.api_up[status.instance] = status.connected
        inst = self.registry.get(status.instance)
        if not status.connected:
            return False
        self.api_context[status.instance] = ApiContext(
            status.instance, status.at_s, status.system_stats, None
        )
        if inst is None:
            return False
        proc = self.registry.lookup_process(inst, self.dead)
        if proc is not None and (inst.process is None or inst.process.pid != proc.pid):
            log.info("ComfyUI %r is running as pid %d", inst.name, proc.pid)
            inst.pid, inst.process = proc.pid, proc
            if not inst.python:
                inst.python = proc.interpreter
            return True
        return False

    def _capture(
        self,
        prompt_id: str,
        instance: str,
        prompt: Mapping[str, Any] | None,
        workflow: Mapping[str, Any] | None,
        seen_s: float,
        done: PromptDone | None = None,
    ) -> None:
        old = self.captured.get(prompt_id)
        entry = Captured(
            instance,
            prompt if prompt is not None else (old.prompt if old else None),
            workflow if workflow is not None else (old.workflow if old else None),
            old.seen_s if old else seen_s,
            done or (old.done if old else None),
        )
        self.captured[prompt_id] = entry
        self.captured.move_to_end(prompt_id)
        while len(self.captured) > CAPTURED_PROMPTS:
            self.captured.popitem(last=False)

    def _on_prompt_started(self, started: PromptStarted) -> None:
        self._capture(
            started.prompt_id, started.instance, started.prompt, started.workflow, started.seen_s
        )
        # one line per prompt: from here on a kill of ComfyUI is recorded with this prompt
        log.info("ComfyUI %r is running prompt %s", started.instance, started.prompt_id)
        self.running[started.instance] = (started.prompt_id, started.seen_s)
        self._update_sampling()

    def _update_sampling(self) -> None:
        if self.sampler is not None:
            self.sampler.set_active(bool(self.running))

    def _on_prompt_done(self, done: PromptDone) -> None:
        running = self.running.get(done.instance)
        started_s = None
        if running is not None and running[0] == done.prompt_id:
            started_s = running[1]
            del self.running[done.instance]
            self._update_sampling()
        captured = self.captured.get(done.prompt_id)
        if started_s is None and captured is not None:
            started_s = captured.seen_s
        if done.prompt_id in self._recorded:
            return
        self._recorded[done.prompt_id] = None
        while len(self._recorded) > RECENT_PROMPT_IDS:
            self._recorded.popitem(last=False)
        if has_run(self.store, done.instance, done.prompt_id):
            return  # reported again after a reconnect
        self._capture(done.prompt_id, done.instance, done.prompt, done.workflow, done.seen_s, done)
        inst = self.registry.get(done.instance)
        pid = inst.pid if inst is not None else None
        exited = self._recent_exit(done.instance) if done.outcome == "lost" else None
        if exited is not None and pid is None:
            pid = exited.process.pid  # its peak is that process's, though it is gone now
        run = self._run_of(done, pid=pid, started_s=started_s)
        if done.outcome == "lost":
            if exited is not None:  # the process watcher spoke first
                self._save_run(self._lost_outcome(run, exited))
            elif pid is None:
                self._save_run(run)  # no process to ask: crashed
            else:
                self._lost.append(_LostRun(run, self.clock()))
            return
        obs = done.observation
        rid = api_record_id(done.instance, done.prompt_id)
        if obs is not None:
            counted_by = self._counted_by(rid)
            if counted_by is not None:
                # counted before a restart (its snapshot was written, its run row was not):
                # the row names that incident, and nothing is counted again
                self._save_run(dataclasses.replace(run, incident_id=counted_by))
                return
        fresh = not done.backfill or (done.ended_s or done.seen_s) >= self.horizon_s
        if obs is not None and fresh and done.prompt_id not in self.handled_prompts:
            # the workflow is part of what makes a storm "the same failure" (incidents.py)
            extra = {"record_id": rid}
            if run.fingerprint:
                extra["workflow_fingerprint"] = run.fingerprint
            obs = dataclasses.replace(obs, evidence={**obs.evidence, **extra})
            if not obs.event.recovered:
                self._pending_runs.append(_PendingRun(run, rid))
                self._observe(obs)
                return
            self._observe(obs)
        self._save_run(run)

    def _recent_exit(self, instance: str) -> ProcessExit | None:
        now = self.clock()
        for exit in reversed(self.exits.values()):
            if exit.instance == instance and now - exit.death.died_at_s < LOST_RUN_GRACE_S:
                return exit
        return None

    def _lost_outcome(self, run: RunRecord, exit: ProcessExit) -> RunRecord:
        """A lost prompt's run, once its process's end is known: killed or crashed."""
        incident_id = None
        if exit.os_kill:
            for inc in self.tracker.open_incidents():
                if inc.instance == exit.instance and inc.pool is Pool.KILLED_BY_OS:
                    incident_id = inc.id
        outcome = "killed" if exit.os_kill else ("sigkill" if exit.sigkill else "crashed")
        return dataclasses.replace(
            run,
            outcome=outcome,
            incident_id=incident_id,
            pid=run.pid or exit.process.pid,
        )

    def _run_of(self, done: PromptDone, *, pid: int | None, started_s: float | None) -> RunRecord:
        """The run row, measured now: one fresh sample closes the memory window."""
        if self.sampler is not None and done.outcome != "lost":
            self.sampler.sample_once()
        samples = self.timeline.snapshot() if self.timeline is not None else ()
        now = self.clock()
        state_id = None
        if self.install_states is not None:
            inst = self.registry.get(done.instance)
            proc = inst.process if inst is not None else None
            state_id = self.install_states.state_id_for_run(
                done.instance,
                started_s=done.started_s or started_s or done.seen_s,
                process_start_s=proc.create_time_s if proc and proc.pid == pid else None,
            )
        return run_from_done(
            done,
            recorded_s=now,
            pid=pid,
            samples=samples,
            started_s=started_s,
            window_end_s=now,
            install_state_id=state_id,
        )

    def _save_run(self, run: RunRecord) -> None:
        try:
            new = record_run(self.store, run)
        except SentinelError as exc:
            log.error("could not record run %s: %s", run.prompt_id, exc)
            return
        log.debug("run %s on %s: %s", run.prompt_id, run.instance, run.outcome)
        if new and self.metrics is not None:  # each prompt counted once, like its row
            self.metrics.observe_prompt(
                run.instance,
                run.outcome,
                peak_vram_bytes=run.peak_vram_bytes,
                peak_ram_bytes=run.peak_rss_bytes,
                duration_s=run.duration_s,
            )

    # -- each turn of the loop ---------------------------------------------------------------

    def flush_runs(self) -> None:
        """Write the rows of OOM runs whose incident has counted them (snapshot on disk)."""
        if not self._pending_runs:
            return
        keep: list[_PendingRun] = []
        for pending in self._pending_runs:
            incident_id = self._counted_by(pending.record_id)
            if incident_id is None:
                keep.append(pending)  # its snapshot is not written yet
                continue
            self._save_run(dataclasses.replace(pending.run, incident_id=incident_id))
        self._pending_runs = keep

    def expire_lost_runs(self, now: float) -> None:
        """Prompts whose server went away and no process exit explained it: crashed."""
        if not self._lost:
            return
        keep: list[_LostRun] = []
        for lost in self._lost:
            if now - lost.since_s >= LOST_RUN_GRACE_S:
                self._save_run(lost.run)
            else:
                keep.append(lost)
        self._lost = keep

    def next_deadline(self) -> float | None:
        """When the oldest lost prompt's grace ends (the loop wakes then)."""
        if not self._lost:
            return None
        return min(lost.since_s for lost in self._lost) + LOST_RUN_GRACE_S

    # -- what the process watcher says -------------------------------------------------------

    def on_process_exit(self, exit: ProcessExit) -> None:
        proc = exit.process
        self.dead.add((proc.pid, proc.create_time_s))
        self.exits[proc.pid] = exit
        while len(self.exits) > CAPTURED_PROMPTS:
            self.exits.popitem(last=False)
        inst = self.registry.get(exit.instance)
        if inst is not None and inst.pid == proc.pid:
            inst.pid, inst.process = None, None
        # the prompt it was running: still marked running, or just reported lost (a prompt
        # seen after the death runs on the restarted ComfyUI and is left alone)
        prompt_id: str | None = None
        running = self.running.get(exit.instance)
        if running is not None and running[1] <= exit.death.died_at_s:
            prompt_id = running[0]
            del self.running[exit.instance]
            self._update_sampling()
        lost_here = [lost for lost in self._lost if lost.run.instance == exit.instance]
        if prompt_id is None and lost_here:
            prompt_id = lost_here[-1].run.prompt_id
        if exit.os_kill:
            self._observe(kill_observation(exit, prompt_id=prompt_id))
        for lost in lost_here:
            self._lost.remove(lost)
            self._save_run(self._lost_outcome(lost.run, exit))

    # -- what snapshot assembly reads --------------------------------------------------------

    def evidence_of(self, incident: Incident) -> tuple[Captured | None, ProcessExit | None]:
        """The prompt an incident is about (what the API gave for it) and, for a kill, how
        its process ended."""
        prompt_id: str | None = None
        exit: ProcessExit | None = None
        for obs in incident.observations:
            pid_value = obs.evidence.get("prompt_id")
            if prompt_id is None and isinstance(pid_value, str):
                prompt_id = pid_value
            killed = obs.evidence.get("pid") if obs.source == "process" else None
            if exit is None and isinstance(killed, int):
                exit = self.exits.get(killed)
        if prompt_id is None and incident.instance in self.running:
            prompt_id = self.running[incident.instance][0]
        return (self.captured.get(prompt_id) if prompt_id else None), exit
