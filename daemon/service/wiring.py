"""The watchdog's wiring and its main loop: what ``oom-sentinel run`` is.

Data flows one way (DESIGN §3), each stage a room of this package handed to the one before it:
sources (log followers, API and process watchers, sampler; ``sources`` points them at the
``instances``) → records (``logrecords``: log lines → observations; ``prompts``: API/process
reports → runs rows and observations) → incidents (``incidents.IncidentTracker``) → snapshot
(``actions`` writes what ``assembly`` builds) → store and alerts (``sinks``). The loop reads
like earlyoom's ``poll_loop``: read what the sources have, decide, act, commit log offsets,
then sleep until a file event, a source's message, a deadline or the safety poll. Only this
(main) thread touches the stages; every other thread is a ``workers.Worker`` whose health
gates systemd's watchdog ping. Exactly-once across ``kill -9``: a log record's offset moves
past it only once the incident that counted it is durable (``actions``), and ``recovery``
repairs what a crash between two writes left; a crash costs a re-read, never a duplicate.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oom_sentinel.config.settings import LoadedSettings, Settings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.comfy.watch import ApiStatus
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef, clean_leftovers, snapshots_dir
from oom_sentinel.daemon.incidents.tracker import Incident, IncidentTracker, TrackerConfig
from oom_sentinel.daemon.logs.tail import LogTailManager
from oom_sentinel.daemon.probes.base import MemorySample
from oom_sentinel.daemon.service.actions import IncidentActions, counted_by
from oom_sentinel.daemon.service.instances import InstanceRegistry, RunOptions, WatchedInstance
from oom_sentinel.daemon.service.logrecords import LogRecords
from oom_sentinel.daemon.service.logsetup import install_signal_handlers
from oom_sentinel.daemon.service.pipeline import Pipeline
from oom_sentinel.daemon.service.prompts import PromptLifecycle
from oom_sentinel.daemon.service.recovery import catch_up_fleet, recover, resume_storms
from oom_sentinel.daemon.service.reload import apply_settings, load_again, log_reloaded
from oom_sentinel.daemon.service.scheduling import WorkerScheduler, build_scheduler, prune
from oom_sentinel.daemon.service.sdnotify import Notifier
from oom_sentinel.daemon.service.sinks import build_alerts, start_metrics
from oom_sentinel.daemon.service.sources import Sources
from oom_sentinel.daemon.service.status import (
    STATUS_FILE,
    STATUS_INTERVAL_S,
    build_status,
    unwatched_since,
    write_status,
)
from oom_sentinel.daemon.service.workers import Health, WatchdogPing, Worker
from oom_sentinel.daemon.store.db import Store

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter

__all__ = ["RunOptions", "Service", "WatchedInstance", "run_service"]

log = logging.getLogger("oom_sentinel")


class Service:
    """The daemon: build with settings, ``start()``, ``run(stop)``, ``close()``."""

    def __init__(
        self,
        loaded: LoadedSettings,
        options: RunOptions | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        on_incident: Callable[[Incident, SnapshotRef], None] | None = None,
    ) -> None:
        self.loaded = loaded
        self.settings: Settings = loaded.settings
        self.options = options or RunOptions()
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.on_incident = on_incident
        data_dir = self.options.data_dir or self.settings.resolved_data_dir()
        self.data_dir = Path(data_dir).expanduser()
        self.snapshots_dir = snapshots_dir(self.data_dir)
        self.registry = InstanceRegistry(
            self.settings, self.options, self.environ, config_source=loaded.source
        )
        self.instances = self.registry.by_name
        self.notifier = Notifier(self.environ)
        #: every worker thread, checked together (status, metrics, the watchdog ping)
        self.health = Health()
        self.watchdog = WatchdogPing(self.notifier, self.environ, self.health)
        self.tracker = IncidentTracker(TrackerConfig.from_settings(self.settings.incidents))
        self._reload_requested = threading.Event()
        self.started_s = clock()
        self._last_status = 0.0
        # the sources and stages, built by start()
        self.store: Store | None = None
        self.tails: LogTailManager | None = None
        self.scheduler: WorkerScheduler | None = None
        self.sources: Sources | None = None
        self.alerts: AlertDispatcher | None = None
        self.metrics: MetricsExporter | None = None
        self.records: LogRecords | None = None
        self.pipeline: Pipeline | None = None
        self.prompts: PromptLifecycle | None = None
        self.actions: IncidentActions | None = None

    # -- start-up ----------------------------------------------------------------------------

    def start(self) -> str:
        """Self-test and start every source; returns the one summary line that is logged."""
        settings = self.settings
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        store = self.store = Store.open(self.data_dir)
        self.snapshots_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for leftover in clean_leftovers(self.snapshots_dir):
            log.info("removed an unfinished snapshot left by a crash: %s", leftover)
        tails = self.tails = LogTailManager(store, poll_interval_ms=settings.logs.poll_interval_ms)
        counted = functools.partial(counted_by, store)
        self.records = LogRecords(tails, counted, context_lines=settings.logs.context_lines)
        handled_prompts: set[str] = set()
        remember = self.records.remember
        recent = recover(store, self.snapshots_dir, remember, handled_prompts)
        resume_storms(store, self.tracker, self.clock())

        self.metrics = start_metrics(settings, self.clock)
        if self.metrics is not None:  # its worker_up gauge hears every worker's health
            self.health.on_check = self.metrics.set_worker_alive
            self.health.add(self.metrics.worker)
        alerts = build_alerts(
            store, settings, self.environ, self.clock, self.metrics, self.snapshots_dir
        )
        self.alerts = alerts

        on_sample = self._on_sample if self.metrics is not None else None
        sources = self.sources = Sources(
            settings, self.environ, wake=self.wake, on_sample=on_sample
        )
        horizon_s = unwatched_since(store, self.started_s)
        pipeline = self.pipeline = Pipeline(
            self.records,
            self.tracker,
            self.registry,
            store,
            clock=self.clock,
            counted_by=counted,
            horizon_s=horizon_s,
            handled_prompts=handled_prompts,
            snapshots_dir=self.snapshots_dir,
            fleet=settings.fleet,
            sources=sources,
            alerts=alerts,
            metrics=self.metrics,
            on_incident=self.on_incident,
        )
        self.prompts, self.actions = pipeline.prompts, pipeline.actions
        catch_up_fleet(recent, self.clock(), pipeline.actions, settings.alerts.retry_max_age_s)

        sources.start_watchers(backfill_since_s=horizon_s)
        self.registry.follow = self.records.follow  # an adopted instance's logs are followed
        for inst in self.registry.configured():
            self.registry.adopt(inst)
        if settings.discovery.enabled or self.registry.explicit:
            self._merge_discovered(self.registry.discover())
        for path in (*settings.logs.extra, *self.options.watch_logs):
            self.registry.follow_extra(path)
        tails.start()
        # The first poll fixes where each file is read from (its end, for a file never seen
        # before), so everything written after the ready line is read, even a record that
        # lands just before ComfyUI-Manager rotates the file.
        self.records.handle_lines(tails.poll(), self.clock(), pipeline.act)
        self._sync_watchers()
        self._start_scheduler()
        alerts.start()
        self.health.add(alerts.worker)
        self._retention_job()
        summary = self.summary()
        log.info("%s", summary)
        if not self.instances and not self.records.keys:
            log.info(
                "no ComfyUI install found yet; looking again every %d s (running ComfyUI "
                "processes, ~/ComfyUI, the Windows portable build, ComfyUI Desktop)",
                settings.discovery.interval_s,
            )
        return summary

    def _start_scheduler(self) -> None:
        """The periodic jobs (``scheduling``), and the install-state tracker on them."""
        assert self.sources is not None and self.store is not None and self.pipeline is not None
        discovery = self.settings.discovery.enabled or self.registry.explicit
        scheduler = self.scheduler = build_scheduler(
            self.settings,
            self.sources.sampler,
            discovery_job=self._discovery_job if discovery else None,
            retention_job=self._retention_job,
        )
        states = self.sources.start_install_states(self.store, scheduler, self.clock)
        if states is not None:
            self.pipeline.set_install_states(states)
            states.update(self.instances.values())
        scheduler.start()
        for worker in (*self.sources.workers(), scheduler.worker):
            self.health.add(worker)

    def summary(self) -> str:
        logs = len(self.records.keys) if self.records is not None else 0
        gpu = self.sources.gpu_line if self.sources is not None else ""
        return (
            f"watching {len(self.instances)} ComfyUI instance(s): {self.registry.summary()}; "
            f"{logs} log file(s); {gpu}; data in {self.data_dir}"
        )

    def _discovery_job(self) -> None:
        assert self.sources is not None
        self.sources.post("discovered", self.registry.discover())

    def _retention_job(self) -> None:
        prune(self.snapshots_dir, self.settings, self.clock(), self.store)

    # -- the stages, wired -------------------------------------------------------------------

    def _merge_discovered(self, found: Iterable[Any]) -> None:
        self.registry.merge_discovered(found)
        self._sync_watchers()

    def _sync_watchers(self) -> None:
        """After every change to the instances (``Sources.point``)."""
        if self.sources is not None:
            self.sources.point(self.instances, self.prompts.dead if self.prompts else ())

    def _refresh_sources(self) -> None:
        if self.sources is not None and self.records is not None and self.prompts is not None:
            reading, api_up = self.records.reading(), self.prompts.api_up
            self.sources.available(self.tracker, self.instances, reading=reading, api_up=api_up)

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        assert self.tails is not None and self.pipeline is not None
        self.notifier.ready(self.summary())
        while not stop.is_set():
            now = self.clock()
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            self._refresh_sources()
            self._drain_inbox()
            self.pipeline.turn(self.tails.poll(), now)
            self.watchdog.tick(now)
            if now - self._last_status >= STATUS_INTERVAL_S:
                self._write_status(now)
            if stop.is_set():
                break
            self.tails.wait(self._wait_timeout(self.clock()))

    def wake(self) -> None:
        if self.tails is not None:
            self.tails.wake()

    def _wait_timeout(self, now: float) -> float:
        timeout = self.settings.logs.poll_interval_ms / 1000
        ping = self.watchdog.next_due()
        due = self.pipeline.next_deadline(now, ping) if self.pipeline is not None else ping
        return timeout if due is None else min(timeout, max(0.0, due - now))

    def _drain_inbox(self) -> None:
        assert self.prompts is not None and self.sources is not None
        for kind, payload in self.sources.drain():
            try:
                if kind == "discovered":
                    self._merge_discovered(payload)
                elif kind == "api":
                    if self.prompts.on_api(payload):
                        self._sync_watchers()
                    if isinstance(payload, ApiStatus):
                        self._refresh_sources()
                elif kind == "process":
                    self.prompts.on_process_exit(payload)
                    self._sync_watchers()
                    self._refresh_sources()
            except SentinelError as exc:
                log.error("could not handle a %s report: %s", kind, exc)

    # -- health and status -------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        """What ``oom-sentinel status`` shows (``status.build_status``)."""
        return build_status(
            now,
            started_s=self.started_s,
            config=str(self.loaded.source) if self.loaded.source else None,
            data_dir=self.data_dir,
            sources=self.sources,
            tails=self.tails,
            pipeline=self.pipeline,
            registry=self.registry,
            health=self.health,
        )

    def _write_status(self, now: float) -> None:
        self._last_status = now
        status = self.status(now)
        write_status(self.data_dir, status, now, self.store, self.metrics, self.alerts)

    def workers(self) -> dict[str, bool]:
        """Liveness of every worker thread (``workers.Health``); a dead one is logged once by
        name. The log follower needs none: the loop polls it."""
        return self.health.check()

    def healthy(self) -> bool:
        """Every worker alive: only then is systemd's watchdog pinged."""
        return self.health.healthy()

    def _on_sample(self, sample: MemorySample) -> None:
        if self.metrics is not None:
            watched = {i.pid: i.name for i in list(self.instances.values()) if i.pid}
            self.metrics.observe_sample(sample, watched=watched)

    # -- reload ---------------------------------------------------------------------------

    def request_reload(self) -> None:
        """From the SIGHUP handler (or the Windows service): reload on the loop's next turn."""
        self._reload_requested.set()
        self.wake()

    def reload(self) -> bool:
        """Re-read the config (``reload``); a bad one keeps the old running and says why."""
        self.notifier.reloading()
        again = load_again(self.loaded.source, self.environ)
        if self.metrics is not None:
            self.metrics.set_config_reload(again is not None)
        if again is not None:
            loaded, channels = again
            old, self.loaded, self.settings = self.settings, loaded, loaded.settings
            registry, records, actions = self.registry, self.records, self.actions
            apply_settings(loaded, channels, registry, self.tracker, self.alerts, records, actions)
            self._sync_watchers()
            log_reloaded(loaded, old)
        self.notifier.ready(self.summary())
        return again is not None

    # -- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        self.notifier.stopping()
        with contextlib.suppress(OSError):
            (self.data_dir / STATUS_FILE).unlink()
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                self.scheduler.shutdown(wait=False)
        if self.alerts is not None:
            self.alerts.stop(timeout_s=2.0)
        if self.metrics is not None:
            self.metrics.stop()
        if self.sources is not None:
            self.sources.close()
        if self.tails is not None:
            self.tails.close()
        if self.store is not None:
            self.store.close()
        self.notifier.close()


def run_service(
    loaded: LoadedSettings,
    *,
    stop: threading.Event,
    on_ready: Callable[[str], None] | None = None,
    event_sink: Callable[[Incident, SnapshotRef], None] | None = None,
    options: RunOptions | None = None,
    install_signals: bool = False,
) -> int:
    """Run the daemon until ``stop`` is set; the entry point of every front end (CLI,
    systemd, the Windows service). Returns the exit status.

    ``install_signals`` (the CLI, on the main thread): SIGTERM/SIGINT set ``stop`` and SIGHUP
    reloads the config."""
    service = Service(loaded, options, on_incident=event_sink)
    if install_signals:
        install_signal_handlers(stop, service.request_reload)
    try:
        summary = service.start()
        if on_ready is not None:
            on_ready(summary)

        def wake_on_stop() -> None:
            stop.wait()
            service.wake()

        Worker("stop-waker", wake_on_stop).start()
        service.run(stop)
    finally:
        service.close()
    return 0
