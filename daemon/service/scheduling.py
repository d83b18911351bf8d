"""The periodic jobs, on one APScheduler: memory sampling (the sampler adds its own job),
discovery of installs that appear later, snapshot retention and glibc heap trims. A job only
hands its result to the main loop (``discovery_job`` puts it in the inbox) or does work that
touches no stage (retention prunes old snapshot directories)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from threading import Event
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.core.heap import release_free_heap
from oom_sentinel.daemon.incidents.retention import prune_snapshots
from oom_sentinel.daemon.probes.timeline import Sampler
from oom_sentinel.daemon.service.workers import Worker
from oom_sentinel.daemon.store.db import Store

log = logging.getLogger("oom_sentinel")

#: glibc heap trims: the first once start-up work is done, then periodically
HEAP_TRIM_FIRST_S = 15.0
HEAP_TRIM_INTERVAL_S = 600.0


class WorkerScheduler(BackgroundScheduler):
    """APScheduler's ``BackgroundScheduler`` whose loop runs on a ``Worker`` (health name
    "scheduler"), so it is started, stopped and reported like every other daemon thread; each
    pass over the due jobs is a heartbeat. Mirrors ``BackgroundScheduler.start``/``shutdown``,
    which make their own thread."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.worker = Worker("scheduler", self._main_loop, thread_name="APScheduler")

    def start(self, *args: Any, **kwargs: Any) -> None:
        event: Event | None = getattr(self, "_event", None)  # BlockingScheduler's wake-up
        if event is None or event.is_set():
            self._event = Event()
        BaseScheduler.start(self, *args, **kwargs)
        self.worker.start()

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        # BlockingScheduler's: stop, then wake the loop so it sees the stopped state
        super(BackgroundScheduler, self).shutdown(*args, **kwargs)
        self.worker.stop(5.0)

    def _process_jobs(self) -> float | None:
        self.worker.beat()
        wait: float | None = super()._process_jobs()
        return wait


def build_scheduler(
    settings: Settings,
    sampler: Sampler,
    *,
    discovery_job: Callable[[], None] | None,
    retention_job: Callable[[], None],
) -> WorkerScheduler:
    """The scheduler with every periodic job added (not started)."""
    scheduler = WorkerScheduler(timezone="UTC")
    sampler.start(scheduler)
    if discovery_job is not None:
        scheduler.add_job(
            discovery_job,
            "interval",
            seconds=settings.discovery.interval_s,
            id="discovery",
            coalesce=True,
            max_instances=1,
        )
    scheduler.add_job(retention_job, "interval", hours=1, id="retention", coalesce=True)
    # a minute after start (the first captures and the API handshake are done), then
    # every ten: a few ms of glibc work that keeps RSS near what is live
    scheduler.add_job(
        release_free_heap,
        "interval",
        seconds=HEAP_TRIM_INTERVAL_S,
        next_run_time=datetime.now(UTC) + timedelta(seconds=HEAP_TRIM_FIRST_S),
        id="heap-trim",
        coalesce=True,
    )
    return scheduler


def prune(snapshots: Path, settings: Settings, now_s: float, store: Store | None) -> None:
    """Retention: old snapshots beyond ``[snapshots] max_count`` / ``max_age_days`` go."""
    try:
        removed = prune_snapshots(
            snapshots,
            max_count=settings.snapshots.max_count,
            max_age_days=settings.snapshots.max_age_days,
            now_s=now_s,
            store=store,
        )
    except SentinelError as exc:
        log.warning("retention: %s", exc)
        return
    if removed:
        log.info("retention: removed %d old snapshot(s)", len(removed))
