"""The one-way chain, built once and turned once per loop: records (``logrecords``, and
``prompts`` for what the API and process watchers report) → incidents (the tracker) →
snapshot and store (``actions``, from ``assembly``) → alerts. Each stage is handed the next
one: the records stage gets ``act`` (the tracker folds a batch, ``actions`` applies what it
decided), the prompt lifecycle gets ``observe``. What still flows back: ``actions`` releases
the log records an incident counted durably (``LogRecords.release``: the hold on the read
position), and ``prompts``/``actions`` read the tracker's open incidents -- an acknowledgement
and two reads, no stage calls a hub."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from oom_sentinel.config.settings import FleetSettings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef
from oom_sentinel.daemon.incidents.tracker import Incident, IncidentTracker, Observation
from oom_sentinel.daemon.install.history import InstallStateTracker
from oom_sentinel.daemon.logs.tail import LogLine
from oom_sentinel.daemon.service.actions import IncidentActions
from oom_sentinel.daemon.service.assembly import SnapshotAssembler
from oom_sentinel.daemon.service.instances import InstanceRegistry
from oom_sentinel.daemon.service.logrecords import RECORD_IDLE_S, LogRecords
from oom_sentinel.daemon.service.prompts import PromptLifecycle
from oom_sentinel.daemon.service.sources import Sources
from oom_sentinel.daemon.store.db import Store

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter


class Pipeline:
    """The stages after the sources; main loop only."""

    def __init__(
        self,
        records: LogRecords,
        tracker: IncidentTracker,
        registry: InstanceRegistry,
        store: Store,
        *,
        clock: Callable[[], float],
        counted_by: Callable[[str], str | None],
        horizon_s: float,
        handled_prompts: set[str],
        snapshots_dir: Path,
        fleet: FleetSettings,
        sources: Sources,
        alerts: AlertDispatcher | None,
        metrics: MetricsExporter | None,
        on_incident: Callable[[Incident, SnapshotRef], None] | None,
    ) -> None:
        self.records = records
        self.tracker = tracker
        self.clock = clock
        self.alerts = alerts
        sampler, timeline = sources.sampler, sources.timeline
        self.prompts = PromptLifecycle(
            registry,
            store,
            tracker,
            observe=self.observe,
            counted_by=counted_by,
            clock=clock,
            horizon_s=horizon_s,
            handled_prompts=handled_prompts,
            sampler=sampler,
            timeline=timeline,
            metrics=metrics,
        )
        assembler = SnapshotAssembler(
            self.prompts, records.log_text, clock=clock, sampler=sampler, timeline=timeline
        )
        self.actions = IncidentActions(
            store,
            tracker,
            registry,
            assembler,
            snapshots_dir=snapshots_dir,
            release=records.release,
            clock=clock,
            fleet=fleet,
            alerts=alerts,
            metrics=metrics,
            on_incident=on_incident,
        )

    def set_install_states(self, states: InstallStateTracker) -> None:
        """The stages that read install states see the tracker once it runs."""
        self.prompts.install_states = states
        self.actions.assembler.install_states = states

    def act(self, observations: list[Observation]) -> None:
        """A batch of observations, folded by the tracker and acted on."""
        self.actions.apply(self.tracker.observe_many(observations, self.clock()))

    def observe(self, obs: Observation) -> None:
        self.actions.apply(self.tracker.observe(obs, self.clock()))

    def turn(self, lines: Sequence[LogLine], now: float) -> None:
        """One turn of the loop after the inbox: new lines, idle records, the tracker's
        deadlines, failed writes, alerts, lost and pending runs, then the read positions."""
        self.records.handle_lines(lines, now, self.act)
        self.records.flush_idle(now, self.act)
        self.actions.apply(self.tracker.tick(self.clock()))
        self.actions.retry_unwritten(self.clock())
        if self.alerts is not None:
            self.alerts.tick()
        self.prompts.expire_lost_runs(self.clock())
        self.prompts.flush_runs()
        self.records.commit_offsets()

    def next_deadline(self, now: float, *others: float | None) -> float | None:
        """The soonest moment a stage (or one of ``others``: the watchdog ping) has work
        without new input."""
        deadlines = [
            *others,
            self.tracker.next_deadline(),
            now + RECORD_IDLE_S if self.records.assembling() else None,
            self.prompts.next_deadline(),
            self.actions.next_retry(),
        ]
        due = [d for d in deadlines if d is not None]
        return min(due) if due else None
