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
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.background import BackgroundScheduler

from oom_sentinel.config.settings import LoadedSettings, Settings
from oom_sentinel.daemon.alert_dispatch import AlertDispatcher
from oom_sentinel.daemon.comfy_watch import ApiStatus, ComfyWatcher, WatchOptions
from oom_sentinel.daemon.errors import SentinelError
from oom_sentinel.daemon.gpu_select import select_gpu_probe
from oom_sentinel.daemon.host_probe import PsutilHostProbe
from oom_sentinel.daemon.incidents import Incident, IncidentTracker, Observation, TrackerConfig
from oom_sentinel.daemon.kernel_oom import SystemRoots
from oom_sentinel.daemon.logtail import LogTailManager
from oom_sentinel.daemon.probes import MemorySample
from oom_sentinel.daemon.process_watch import ProcessWatcher
from oom_sentinel.daemon.sdnotify import Notifier, watchdog_interval_s
from oom_sentinel.daemon.service.actions import IncidentActions, counted_by
from oom_sentinel.daemon.service.assembly import SnapshotAssembler
from oom_sentinel.daemon.service.instances import InstanceRegistry, RunOptions, WatchedInstance
from oom_sentinel.daemon.service.logrecords import RECORD_IDLE_S, LogRecords
from oom_sentinel.daemon.service.logsetup import install_signal_handlers
from oom_sentinel.daemon.service.prompts import PromptLifecycle
from oom_sentinel.daemon.service.recovery import catch_up_fleet, recover, resume_storms
from oom_sentinel.daemon.service.reload import load_again, log_reloaded, restart_needed
from oom_sentinel.daemon.service.scheduling import build_scheduler, prune
from oom_sentinel.daemon.service.sinks import build_alerts, start_metrics
from oom_sentinel.daemon.service.sources import AvailableSources, point_sources
from oom_sentinel.daemon.service.status import (
    META_LAST_ALIVE,
    STATUS_FILE,
    STATUS_INTERVAL_S,
    build_status,
    write_status,
)
from oom_sentinel.daemon.snapshot import SnapshotRef, clean_leftovers, snapshots_dir
from oom_sentinel.daemon.state_history import InstallStateTracker
from oom_sentinel.daemon.store import Store
from oom_sentinel.daemon.timeline import Sampler, Timeline

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.metrics import MetricsExporter

__all__ = ["RunOptions", "Service", "WatchedInstance", "run_service"]

log = logging.getLogger("oom_sentinel")

#: read the kernel log from this file instead of /dev/kmsg (a ``kmsg``-format capture: what a
#: container without /dev/kmsg can be given, and how the suite shows the daemon a kernel kill)
KMSG_ENV = "OOM_SENTINEL_KMSG"


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
        self.data_dir = Path(
            self.options.data_dir or self.settings.resolved_data_dir()
        ).expanduser()
        self.snapshots_dir = snapshots_dir(self.data_dir)
        self.registry = InstanceRegistry(
            self.settings, self.options, self.environ, config_source=loaded.source
        )
        self.instances = self.registry.by_name
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.notifier = Notifier(self.environ)
        self._watchdog_s = watchdog_interval_s(self.environ)
        self._last_ping = 0.0
        #: workers seen dead (each is logged once, by name)
        self._dead_workers: set[str] = set()
        self.tracker = IncidentTracker(TrackerConfig.from_settings(self.settings.incidents))
        self.gpu_line = ""
        self._reload_requested = threading.Event()
        self.started_s = clock()
        self._last_status = 0.0
        self._sources = AvailableSources(self.tracker)
        # the sources and stages, built by start()
        self.store: Store | None = None
        self.tails: LogTailManager | None = None
        self.scheduler: BackgroundScheduler | None = None
        self.sampler: Sampler | None = None
        self.timeline: Timeline | None = None
        self.alerts: AlertDispatcher | None = None
        self.metrics: MetricsExporter | None = None
        self.comfy_watch: ComfyWatcher | None = None
        self.process_watch: ProcessWatcher | None = None
        self.install_states: InstallStateTracker | None = None
        self.records: LogRecords | None = None
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
        recent = recover(
            store,
            self.snapshots_dir,
            remember_record=self.records.remember,
            handled_prompts=handled_prompts,
        )
        resume_storms(store, self.tracker, self.clock())

        self.metrics = start_metrics(settings, self.clock)
        self.alerts = build_alerts(
            store,
            settings,
            self.environ,
            clock=self.clock,
            metrics=self.metrics,
            snapshots_dir=self.snapshots_dir,
        )

        choice = select_gpu_probe(settings.gpu, self.environ)
        self.gpu_line = choice.line
        log.info("%s", choice.line)
        self.timeline = Timeline.from_settings(settings.sampling)
        self.sampler = Sampler(
            self.timeline,
            choice.probe,
            PsutilHostProbe(),
            settings.sampling,
            on_sample=self._on_sample if self.metrics is not None else None,
        )
        # prompts that ran while no daemon watched are read back from history: anything after
        # the last status write (every STATUS_INTERVAL_S) may have ended while none watched
        horizon_s = self.started_s
        with contextlib.suppress(TypeError, ValueError):
            last_alive = store.get_meta(META_LAST_ALIVE)
            if last_alive is not None:
                horizon_s = min(self.started_s, float(last_alive) - STATUS_INTERVAL_S)
        prompts = self.prompts = PromptLifecycle(
            self.registry,
            store,
            self.tracker,
            observe=self._observe,
            counted_by=counted,
            clock=self.clock,
            horizon_s=horizon_s,
            handled_prompts=handled_prompts,
            sampler=self.sampler,
            timeline=self.timeline,
            metrics=self.metrics,
        )
        assembler = SnapshotAssembler(
            prompts,
            self.records.log_text,
            clock=self.clock,
            sampler=self.sampler,
            timeline=self.timeline,
        )
        self.actions = IncidentActions(
            store,
            self.tracker,
            self.registry,
            assembler,
            snapshots_dir=self.snapshots_dir,
            release=self.records.release,
            clock=self.clock,
            fleet=settings.fleet,
            alerts=self.alerts,
            metrics=self.metrics,
            on_incident=self.on_incident,
        )
        catch_up_fleet(
            recent,
            self.clock(),
            alerts=self.alerts,
            metrics=self.metrics,
            retry_max_age_s=settings.alerts.retry_max_age_s,
            queue_upload=self.actions.queue_upload,
        )

        self.comfy_watch = ComfyWatcher(
            lambda m: self._post("api", m),
            WatchOptions(
                active_poll_s=settings.sampling.active_interval_ms / 1000,
                idle_poll_s=settings.api.idle_poll_ms / 1000,
                websocket=settings.api.websocket,
                backfill_since_s=horizon_s,
            ),
        )
        self.comfy_watch.start()
        kmsg = self.environ.get(KMSG_ENV)
        self.process_watch = ProcessWatcher(
            lambda m: self._post("process", m),
            roots=SystemRoots(kmsg=Path(kmsg)) if kmsg else None,
            memory=self.timeline.snapshot,
        )
        self.process_watch.start()
        log.info("process watcher: %s", self.process_watch.backend)
        for inst in self.registry.configured():
            self._adopt(inst)
        if settings.discovery.enabled or self.registry.explicit:
            self._merge_discovered(self.registry.discover())
        for path in (*settings.logs.extra, *self.options.watch_logs):
            self._follow_extra(path)
        tails.start()
        # The first poll fixes where each file is read from (its end, for a file never seen
        # before), so everything written after the ready line is read, even a record that
        # lands just before ComfyUI-Manager rotates the file.
        self.records.handle_lines(tails.poll(), self.clock(), self._act)
        self._sync_watchers()
        self._start_scheduler()
        self.alerts.start()
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
        assert self.sampler is not None and self.store is not None
        discovery = self.settings.discovery.enabled or self.registry.explicit
        scheduler = self.scheduler = build_scheduler(
            self.settings,
            self.sampler,
            discovery_job=self._discovery_job if discovery else None,
            retention_job=self._retention_job,
        )
        if self.settings.install_state.enabled:
            states = InstallStateTracker(self.store, self.settings.install_state, clock=self.clock)
            self.install_states = states
            # the stages that read install states see the tracker once it runs
            assert self.prompts is not None and self.actions is not None
            self.prompts.install_states = self.actions.assembler.install_states = states
            states.start(scheduler)
            states.update(self.instances.values())
        scheduler.start()

    def summary(self) -> str:
        logs = len(self.records.keys) if self.records is not None else 0
        return (
            f"watching {len(self.instances)} ComfyUI instance(s): {self.registry.summary()}; "
            f"{logs} log file(s); {self.gpu_line}; data in {self.data_dir}"
        )

    def _discovery_job(self) -> None:
        self._inbox.put(("discovered", self.registry.discover()))
        self.wake()

    def _retention_job(self) -> None:
        prune(self.snapshots_dir, self.settings, self.clock(), self.store)

    # -- the stages, wired -------------------------------------------------------------------

    def _act(self, observations: list[Observation]) -> None:
        """Records → incidents → actions: a batch of observations, folded and acted on."""
        assert self.actions is not None
        self.actions.apply(self.tracker.observe_many(observations, self.clock()))

    def _observe(self, obs: Observation) -> None:
        assert self.actions is not None
        self.actions.apply(self.tracker.observe(obs, self.clock()))

    def _adopt(self, inst: WatchedInstance) -> None:
        assert self.records is not None
        kept = self.registry.adopt(inst)
        for path in kept.log_paths:
            self.records.follow(path, instance=kept.name)

    def _merge_discovered(self, found: Iterable[Any]) -> None:
        assert self.records is not None
        for kept in self.registry.merge_discovered(found):
            for path in kept.log_paths:
                self.records.follow(path, instance=kept.name)
        self._sync_watchers()

    def _follow_extra(self, path: str) -> None:
        assert self.records is not None
        self.records.follow(path, instance=self.registry.instance_for_log(path))

    def _sync_watchers(self) -> None:
        """After every change to the instances (``sources.point_sources``)."""
        point_sources(
            self.instances,
            self.prompts.dead if self.prompts is not None else (),
            comfy_watch=self.comfy_watch,
            process_watch=self.process_watch,
            sampler=self.sampler,
            install_states=self.install_states,
        )

    def _refresh_sources(self) -> None:
        self._sources.refresh(
            self.instances,
            reading=self.records.reading() if self.records is not None else (),
            api_up=self.prompts.api_up if self.prompts is not None else {},
            watching=self.process_watch.watching() if self.process_watch is not None else (),
        )

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        assert self.tails is not None and self.records is not None
        assert self.actions is not None and self.prompts is not None
        self.notifier.ready(self.summary())
        while not stop.is_set():
            now = self.clock()
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            self._refresh_sources()
            self._drain_inbox()
            self.records.handle_lines(self.tails.poll(), now, self._act)
            self.records.flush_idle(now, self._act)
            self.actions.apply(self.tracker.tick(self.clock()))
            self.actions.retry_unwritten(self.clock())
            if self.alerts is not None:
                self.alerts.tick()
            self.prompts.expire_lost_runs(self.clock())
            self.prompts.flush_runs()
            self.records.commit_offsets()
            self._ping_watchdog(now)
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
        deadlines = [self.tracker.next_deadline()]
        if self.records is not None and self.records.assembling():
            deadlines.append(now + RECORD_IDLE_S)
        if self._watchdog_s is not None:
            deadlines.append(self._last_ping + self._watchdog_s)
        if self.prompts is not None:
            deadlines.append(self.prompts.next_deadline())
        if self.actions is not None:
            deadlines.append(self.actions.next_retry())
        for deadline in deadlines:
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - now))
        return timeout

    def _post(self, kind: str, payload: Any) -> None:
        """Hand a watcher's record to the main loop (any thread)."""
        self._inbox.put((kind, payload))
        self.wake()

    def _drain_inbox(self) -> None:
        assert self.prompts is not None
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
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
            gpu_line=self.gpu_line,
            latest=self.timeline.latest() if self.timeline is not None else None,
            tails=self.tails,
            records=self.records,
            registry=self.registry,
            prompts=self.prompts,
            incidents_written=self.actions.incidents_written if self.actions else 0,
            last_incident=self.actions.last_incident if self.actions else None,
            workers=self.workers(),
            worker_health={},
        )

    def _write_status(self, now: float) -> None:
        self._last_status = now
        status = self.status(now)
        write_status(
            self.data_dir, status, now, store=self.store, metrics=self.metrics, alerts=self.alerts
        )

    def _ping_watchdog(self, now: float) -> None:
        if self._watchdog_s is None or now - self._last_ping < self._watchdog_s * 0.9:
            return
        if self.healthy():
            self.notifier.watchdog()
            self._last_ping = now

    def workers(self) -> dict[str, bool]:
        """Liveness of every worker thread (the watchdog pings only when all are alive): the
        scheduler (memory sampling, discovery, retention), the alert sender, the API watcher,
        the process watcher, the install-state watcher and the metrics server. A worker that
        dies is logged once by name; the log follower needs none (the main loop polls it)."""
        alive = {
            "scheduler": self.scheduler is not None and self.scheduler.running,
            "alerts": self.alerts is not None and self.alerts.is_alive(),
            "api": self.comfy_watch is not None and self.comfy_watch.is_alive(),
            "process": self.process_watch is not None and self.process_watch.is_alive(),
        }
        if self.install_states is not None:
            alive["install-state"] = self.install_states.is_alive()
        if self.metrics is not None:
            alive["metrics"] = self.metrics.is_alive()
            for name, ok in alive.items():
                self.metrics.set_worker_alive(name, ok)
        for name, ok in alive.items():
            if not ok and name not in self._dead_workers:
                self._dead_workers.add(name)
                log.error(
                    "the %s worker is dead: systemd's watchdog is no longer pinged, so the "
                    "service is restarted",
                    name,
                )
            elif ok:
                self._dead_workers.discard(name)
        return alive

    def healthy(self) -> bool:
        """Every worker alive: only then is systemd's watchdog pinged."""
        return all(self.workers().values())

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
        if again is None:
            self.notifier.ready(self.summary())
            return False
        loaded, channels = again
        new = loaded.settings
        restart = restart_needed(self.settings, new)
        self.loaded, self.settings = loaded, new
        self.registry.settings, self.registry.config_source = new, loaded.source
        logging.getLogger().setLevel(new.log_level.upper())
        if self.alerts is not None:
            self.alerts.reconfigure(new, channels)
        self.tracker.config = TrackerConfig.from_settings(new.incidents)
        if self.records is not None:
            self.records.context_lines = new.logs.context_lines
        if self.actions is not None:
            self.actions.fleet = new.fleet
        for inst in self.registry.configured():
            self._adopt(inst)
        for path in new.logs.extra:
            self._follow_extra(path)
        self._sync_watchers()
        log_reloaded(loaded, restart)
        self.notifier.ready(self.summary())
        return True

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
        if self.comfy_watch is not None:
            self.comfy_watch.stop()
        if self.process_watch is not None:
            self.process_watch.stop()
        if self.install_states is not None:
            self.install_states.close()
        if self.tails is not None:
            self.tails.close()
        if self.sampler is not None:
            self.sampler.gpu.close()
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

        waker = threading.Thread(target=wake_on_stop, name="stop-waker", daemon=True)
        waker.start()
        service.run(stop)
    finally:
        service.close()
    return 0
