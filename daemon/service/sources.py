"""Pointing the sources at the instances: after any change to the registry (discovery, an API
(re)connect, a process's end, a reload) the API watcher follows every instance's URL, the
process watcher every known living process, the sampler the same pids and the install-state
tracker the same installs; and the tracker learns which sources watch each instance, so a
snapshot waits only for those (a log that does not exist yet, or an API that is down, is not
waited for)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from oom_sentinel.daemon.comfy_watch import ComfyWatcher
from oom_sentinel.daemon.incidents import IncidentTracker
from oom_sentinel.daemon.process_watch import ProcessWatcher
from oom_sentinel.daemon.service.instances import WatchedInstance
from oom_sentinel.daemon.state_history import InstallStateTracker
from oom_sentinel.daemon.timeline import Sampler


def point_sources(
    instances: Mapping[str, WatchedInstance],
    dead: Collection[tuple[int, float | None]],
    *,
    comfy_watch: ComfyWatcher | None,
    process_watch: ProcessWatcher | None,
    sampler: Sampler | None,
    install_states: InstallStateTracker | None,
) -> None:
    """Every watcher follows ``instances`` now (``dead``: processes seen ending)."""
    if comfy_watch is not None:
        comfy_watch.set_instances({name: inst.url for name, inst in instances.items() if inst.url})
    if process_watch is not None:
        watching = process_watch.watching()
        for name, inst in instances.items():
            proc = inst.process
            if proc is not None and (proc.pid, proc.create_time_s) in dead:
                inst.pid, inst.process = None, None  # a stale discovery of a dead process
                proc = None
            if proc is None:
                if name in watching:
                    process_watch.forget(name)
            elif watching.get(name) != proc.pid:
                process_watch.watch(name, proc)
    if sampler is not None:
        sampler.set_watched(i.pid for i in instances.values() if i.pid)
    if install_states is not None:
        install_states.update(instances.values())


class AvailableSources:
    """Which sources watch each instance, told to the tracker when it changes."""

    def __init__(self, tracker: IncidentTracker) -> None:
        self.tracker = tracker
        self._sources: dict[str, frozenset[str]] = {}

    def refresh(
        self,
        instances: Collection[str],
        *,
        reading: Collection[str],
        api_up: Mapping[str, bool],
        watching: Collection[str],
    ) -> None:
        for name in set(instances) | set(reading):
            sources = set()
            if name in reading:
                sources.add("log")
            if api_up.get(name):
                sources.add("api")
            if name in watching:
                sources.add("process")
            frozen = frozenset(sources)
            if self._sources.get(name) != frozen:
                self._sources[name] = frozen
                self.tracker.set_available_sources(name, frozen)
