"""The instance registry: which ComfyUI installs the daemon watches, from the config, the
command line and discovery, merged by install path. It only knows instances; what follows
their logs, API and processes is wired by the service from what ``adopt`` returns."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.comfy.discovery import (
    DiscoveredInstance,
    describe_install,
    discover_instances,
)
from oom_sentinel.daemon.comfy.processes import ComfyProcess, find_comfy_processes, process_for
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.incidents.snapshot import InstanceInfo

log = logging.getLogger("oom_sentinel")


@dataclass(frozen=True)
class RunOptions:
    """Command-line additions to the settings, for a one-off run without a config file."""

    data_dir: str | None = None
    watch_logs: tuple[str, ...] = ()
    #: ComfyUI instances named by URL (``http://host:port``) or install PATH
    comfyui: tuple[str, ...] = ()


@dataclass
class WatchedInstance:
    """One ComfyUI the daemon watches; refreshed by discovery (pid and flags change)."""

    name: str
    path: str | None
    url: str | None
    log_paths: tuple[str, ...]
    pid: int | None = None
    python: str | None = None
    source: str = "config"
    process: ComfyProcess | None = None
    #: the user gave the URL (or port): discovery must not change it
    url_fixed: bool = False

    def info(self) -> InstanceInfo:
        return InstanceInfo(name=self.name, path=self.path, url=self.url)


def _instance_name_for_url(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


def _from_discovered(d: DiscoveredInstance, *, source: str | None = None) -> WatchedInstance:
    return WatchedInstance(
        name=d.name,
        path=d.path,
        url=d.url,
        log_paths=tuple(d.log_paths),
        pid=d.pid,
        python=d.python,
        source=source or d.source,
        process=d.process,
    )


class InstanceRegistry:
    """Instance name → ``WatchedInstance``; touched by the main loop only (discovery runs in
    the scheduler and hands its result over)."""

    def __init__(
        self,
        settings: Settings,
        options: RunOptions,
        environ: Mapping[str, str],
        *,
        config_source: Path | None = None,
    ) -> None:
        self.settings = settings
        self.options = options
        self.environ = environ
        self.config_source = config_source
        self.by_name: dict[str, WatchedInstance] = {}
        #: the user named instances: discovery only refreshes those (their processes)
        self.explicit = bool(settings.instances or options.comfyui)
        #: the next stage: where an adopted instance's logs go (``LogRecords.follow``)
        self.follow: Callable[..., None] = lambda path, *, instance: None

    def follow_extra(self, path: str) -> None:
        """A log named in ``[logs] extra`` or with --watch-log: followed for its instance."""
        self.follow(path, instance=self.instance_for_log(path))

    def get(self, name: str) -> WatchedInstance | None:
        return self.by_name.get(name)

    def summary(self) -> str:
        parts = []
        for inst in self.by_name.values():
            where = f"pid {inst.pid}" if inst.pid else (inst.path or inst.url or "")
            parts.append(f"{inst.name} ({where})")
        return ", ".join(parts) if parts else "none yet"

    def configured(self) -> list[WatchedInstance]:
        """The instances of the config's ``[[instances]]`` and of ``--comfyui``."""
        out: list[WatchedInstance] = []
        for i, cfg in enumerate(self.settings.instances):
            url = cfg.url or (f"http://127.0.0.1:{cfg.port}" if cfg.port else None)
            if cfg.path:
                described = describe_install(Path(cfg.path).expanduser(), name=cfg.name)
                inst = _from_discovered(described, source="config")
            elif url:
                inst = WatchedInstance(
                    name=_instance_name_for_url(url),
                    path=None,
                    url=url,
                    log_paths=(),
                    source="config",
                )
            else:
                raise ConfigError(f"{self.config_source}: instances[{i}]: needs a path or a url")
            if cfg.name:
                inst.name = cfg.name
            if url:
                inst.url, inst.url_fixed = url, True  # the user's URL: discovery keeps it
            inst.log_paths = tuple(dict.fromkeys((*inst.log_paths, *cfg.logs)))
            out.append(inst)
        for target in self.options.comfyui:
            if target.startswith(("http://", "https://")):
                out.append(
                    WatchedInstance(
                        name=_instance_name_for_url(target),
                        path=None,
                        url=target.rstrip("/"),
                        log_paths=(),
                        source="cli",
                        url_fixed=True,
                    )
                )
            else:
                path = Path(target).expanduser()
                if not path.is_dir():
                    raise ConfigError(f"--comfyui {target}: not a directory or an http URL")
                out.append(_from_discovered(describe_install(path), source="cli"))
        return out

    def discover(self) -> tuple[DiscoveredInstance, ...]:
        """Runs in the scheduler thread (and once at start): every process is walked."""
        procs: list[ComfyProcess] = []
        try:
            if self.settings.discovery.processes:
                procs = list(find_comfy_processes())
        except Exception:  # psutil may fail on exotic systems; discovery is best effort
            log.exception("could not list processes; discovery continues with locations only")
            procs = []
        home = self.environ.get("HOME") or str(Path.home())
        found = discover_instances(home=home, environ=self.environ, processes=procs)
        if self.explicit:
            # Only processes of the instances the user named: match them by install path.
            known = {os.path.realpath(i.path) for i in list(self.by_name.values()) if i.path}
            return tuple(
                d for d in found if d.pid is not None and os.path.realpath(d.path) in known
            )
        return found

    def adopt(self, inst: WatchedInstance) -> WatchedInstance:
        """Add ``inst``, or refresh the known one of its name, and follow its logs; returns
        the one kept."""
        kept = self._adopt(inst)
        for path in kept.log_paths:
            self.follow(path, instance=kept.name)
        return kept

    def _adopt(self, inst: WatchedInstance) -> WatchedInstance:
        existing = self.by_name.get(inst.name)
        if existing is None:
            self.by_name[inst.name] = inst
            log.info(
                "watching ComfyUI %r (%s)%s",
                inst.name,
                inst.path or inst.url,
                f", pid {inst.pid}" if inst.pid else "",
            )
            return inst
        if inst.pid != existing.pid and inst.pid is not None:
            log.info("ComfyUI %r is running as pid %d", inst.name, inst.pid)
        existing.pid = inst.pid
        existing.process = inst.process
        existing.python = inst.python or existing.python
        existing.log_paths = tuple(dict.fromkeys((*existing.log_paths, *inst.log_paths)))
        if inst.url and not existing.url_fixed:
            existing.url = inst.url
        return existing

    def merge_discovered(self, found: Iterable[DiscoveredInstance]) -> list[WatchedInstance]:
        """Adopt what discovery found, keeping a known install's name and source."""
        by_path = {os.path.realpath(i.path): i for i in self.by_name.values() if i.path}
        adopted = []
        for d in found:
            match = by_path.get(os.path.realpath(d.path))
            inst = _from_discovered(d)
            if match is not None:
                inst.name = match.name
                inst.source = match.source
            adopted.append(self.adopt(inst))
        return adopted

    def instance_for_log(self, path: str) -> str:
        """A log named with --watch-log belongs to the instance whose install holds it."""
        real = os.path.realpath(os.path.expanduser(path))
        for inst in self.by_name.values():
            if inst.path and real.startswith(os.path.realpath(inst.path) + os.sep):
                return inst.name
        return os.path.basename(path) or path

    def lookup_process(
        self, inst: WatchedInstance, dead: Collection[tuple[int, float | None]]
    ) -> ComfyProcess | None:
        """The running ComfyUI process of ``inst`` (not one that ``dead`` says ended): by
        install path, else by URL."""
        try:
            procs = find_comfy_processes()
        except Exception:
            log.exception("could not list processes")
            return None
        live = (p for p in procs if (p.pid, p.create_time_s) not in dead)
        return process_for(live, path=inst.path, url=inst.url)
