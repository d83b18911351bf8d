"""The sources besides the log followers (which the loop polls itself): the memory sampler
and its timeline, the API watcher, the process watcher and the install-state tracker -- built,
started, pointed at the instances and closed together; and the inbox their threads hand
reports to. After any change to the registry (discovery, an API (re)connect, a process's end,
a reload) ``point`` makes the API watcher follow every instance's URL, the process watcher
every known living process, the sampler the same pids and the install-state tracker the same
installs; ``available`` tells the tracker which sources watch each instance, so a snapshot
waits only for those (a log that does not exist yet, or an API that is down, is not waited
for)."""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.comfy.process_watch import ProcessWatcher
from oom_sentinel.daemon.comfy.watch import ComfyWatcher, WatchOptions
from oom_sentinel.daemon.incidents.tracker import IncidentTracker
from oom_sentinel.daemon.install.history import InstallStateTracker
from oom_sentinel.daemon.kernel.oom import SystemRoots
from oom_sentinel.daemon.probes.base import MemorySample
from oom_sentinel.daemon.probes.gpu_select import select_gpu_probe
from oom_sentinel.daemon.probes.host import PsutilHostProbe
from oom_sentinel.daemon.probes.timeline import Sampler, Timeline
from oom_sentinel.daemon.service.instances import WatchedInstance
from oom_sentinel.daemon.service.workers import Worker
from oom_sentinel.daemon.store.db import Store

log = logging.getLogger("oom_sentinel")

#: read the kernel log from this file instead of /dev/kmsg (a ``kmsg``-format capture: what a
#: container without /dev/kmsg can be given, and how the suite shows the daemon a kernel kill)
KMSG_ENV = "OOM_SENTINEL_KMSG"


class Sources:
    """The sampler, the watchers and the install-state tracker, and their inbox. ``post``
    from any thread; everything else from the main loop."""

    def __init__(
        self,
        settings: Settings,
        environ: Mapping[str, str],
        *,
        wake: Callable[[], None],
        on_sample: Callable[[MemorySample], None] | None,
    ) -> None:
        self.settings = settings
        self.environ = environ
        self._wake = wake
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.gpu_line, self.timeline, self.sampler = build_sampler(settings, environ, on_sample)
        self.comfy_watch: ComfyWatcher | None = None
        self.process_watch: ProcessWatcher | None = None
        self.install_states: InstallStateTracker | None = None
        self._available: dict[str, frozenset[str]] = {}

    # -- the inbox -----------------------------------------------------------------------------

    def post(self, kind: str, payload: Any) -> None:
        """Hand a report to the main loop (any thread): ``"api"``, ``"process"``,
        ``"discovered"``."""
        self._inbox.put((kind, payload))
        self._wake()

    def drain(self) -> Iterator[tuple[str, Any]]:
        while True:
            try:
                yield self._inbox.get_nowait()
            except queue.Empty:
                return

    # -- life cycle ----------------------------------------------------------------------------

    def start_watchers(self, *, backfill_since_s: float) -> None:
        """The API watcher and the process watcher, started; prompts that ran while no
        daemon watched (since ``backfill_since_s``) are read back from ComfyUI's history."""
        self.comfy_watch, self.process_watch = start_watchers(
            self.settings,
            self.environ,
            self.post,
            backfill_since_s=backfill_since_s,
            memory=self.timeline.snapshot,
        )

    def start_install_states(
        self, store: Store, scheduler: Any, clock: Callable[[], float]
    ) -> InstallStateTracker | None:
        """The install-state tracker on the scheduler, when ``[install_state]`` is on."""
        if not self.settings.install_state.enabled:
            return None
        states = self.install_states = InstallStateTracker(
            store, self.settings.install_state, clock=clock
        )
        states.start(scheduler)
        return states

    def workers(self) -> list[Worker]:
        watchers = (self.comfy_watch, self.process_watch, self.install_states)
        return [w.worker for w in watchers if w is not None]

    def close(self) -> None:
        if self.comfy_watch is not None:
            self.comfy_watch.stop()
        if self.process_watch is not None:
            self.process_watch.stop()
        if self.install_states is not None:
            self.install_states.close()
        self.sampler.gpu.close()

    # -- following the instances ---------------------------------------------------------------

    def point(
        self,
        instances: Mapping[str, WatchedInstance],
        dead: Collection[tuple[int, float | None]],
    ) -> None:
        """Every source follows ``instances`` now (``dead``: processes seen ending)."""
        if self.comfy_watch is not None:
            urls = {name: inst.url for name, inst in instances.items() if inst.url}
            self.comfy_watch.set_instances(urls)
        watcher = self.process_watch
        if watcher is not None:
            watching = watcher.watching()
            for name, inst in instances.items():
                proc = inst.process
                if proc is not None and (proc.pid, proc.create_time_s) in dead:
                    inst.pid, inst.process = None, None  # a stale discovery of a dead process
                    proc = None
                if proc is None:
                    if name in watching:
                        watcher.forget(name)
                elif watching.get(name) != proc.pid:
                    watcher.watch(name, proc)
        self.sampler.set_watched(i.pid for i in instances.values() if i.pid)
        if self.install_states is not None:
            self.install_states.update(instances.values())

    def available(
        self,
        tracker: IncidentTracker,
        instances: Collection[str],
        *,
        reading: Collection[str],
        api_up: Mapping[str, bool],
    ) -> None:
        """Tell ``tracker`` which sources watch each instance, where that changed."""
        watching = self.process_watch.watching() if self.process_watch is not None else {}
        for name in set(instances) | set(reading):
            sources = set()
            if name in reading:
                sources.add("log")
            if api_up.get(name):
                sources.add("api")
            if name in watching:
                sources.add("process")
            frozen = frozenset(sources)
            if self._available.get(name) != frozen:
                self._available[name] = frozen
                tracker.set_available_sources(name, frozen)


def build_sampler(
    settings: Settings,
    environ: Mapping[str, str],
    on_sample: Callable[[MemorySample], None] | None,
) -> tuple[str, Timeline, Sampler]:
    """The GPU probe chosen for this machine (its one-line description), the memory
    timeline and the sampler that fills it (started with the scheduler)."""
    choice = select_gpu_probe(settings.gpu, environ)
    log.info("%s", choice.line)
    timeline = Timeline.from_settings(settings.sampling)
    sampler = Sampler(
        timeline, choice.probe, PsutilHostProbe(), settings.sampling, on_sample=on_sample
    )
    return choice.line, timeline, sampler


def start_watchers(
    settings: Settings,
    environ: Mapping[str, str],
    post: Callable[[str, Any], None],
    *,
    backfill_since_s: float,
    memory: Callable[[], Sequence[MemorySample]],
) -> tuple[ComfyWatcher, ProcessWatcher]:
    """The API watcher and the process watcher, started; each hands what it sees to ``post``
    (the service's inbox) as ``("api", message)`` / ``("process", exit)``."""
    comfy_watch = ComfyWatcher(
        lambda m: post("api", m),
        WatchOptions(
            active_poll_s=settings.sampling.active_interval_ms / 1000,
            idle_poll_s=settings.api.idle_poll_ms / 1000,
            websocket=settings.api.websocket,
            # prompts that ran while no daemon watched are read back from history
            backfill_since_s=backfill_since_s,
        ),
    )
    comfy_watch.start()
    kmsg = environ.get(KMSG_ENV)
    process_watch = ProcessWatcher(
        lambda m: post("process", m),
        roots=SystemRoots(kmsg=Path(kmsg)) if kmsg else None,
        memory=memory,
    )
    process_watch.start()
    log.info("process watcher: %s", process_watch.backend)
    return comfy_watch, process_watch
