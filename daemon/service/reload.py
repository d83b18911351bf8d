"""SIGHUP: re-read the config. A bad new config keeps the old one running and says why; a
change that cannot be applied to a running daemon (data dir, metrics listener, GPU probe,
fleet) is applied at the next restart and named in the log."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from oom_sentinel.config.settings import LoadedSettings, Settings, load_settings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.alerts.notifiers import AlertChannel, build_channels
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.incidents.tracker import IncidentTracker, TrackerConfig
from oom_sentinel.daemon.service.actions import IncidentActions
from oom_sentinel.daemon.service.instances import InstanceRegistry
from oom_sentinel.daemon.service.logrecords import LogRecords

log = logging.getLogger("oom_sentinel")

#: the settings a running daemon keeps until it restarts
RESTART_ONLY = ("data_dir", "metrics", "gpu", "fleet")


def load_again(
    source: Path | None, environ: Mapping[str, str]
) -> tuple[LoadedSettings, Sequence[AlertChannel]] | None:
    """The new settings and alert channels, or None (logged) when they do not load."""
    try:
        loaded = load_settings(source)
        channels = build_channels(loaded.settings, environ=environ)
    except SentinelError as exc:
        log.error("reload failed, keeping the previous configuration: %s", exc)
        return None
    return loaded, channels


def restart_needed(old: Settings, new: Settings) -> list[str]:
    return [name for name in RESTART_ONLY if getattr(old, name) != getattr(new, name)]


def log_reloaded(loaded: LoadedSettings, old: Settings) -> None:
    """The reload's line, naming what waits for a restart (``old``: the settings before)."""
    restart = restart_needed(old, loaded.settings)
    log.info(
        "configuration reloaded from %s%s",
        loaded.source or "built-in defaults",
        f"; {', '.join(restart)} change(s) need a restart" if restart else "",
    )


def apply_settings(
    loaded: LoadedSettings,
    channels: Sequence[AlertChannel],
    registry: InstanceRegistry,
    tracker: IncidentTracker,
    alerts: AlertDispatcher | None,
    records: LogRecords | None,
    actions: IncidentActions | None,
) -> None:
    """Hand the new settings to each stage that reads them while running: the log level,
    the alert limits and channels, the tracker's windows, the log context, the [fleet]
    bucket, and the instances and extra logs (added, never dropped, until a restart)."""
    new = loaded.settings
    registry.settings, registry.config_source = new, loaded.source
    logging.getLogger().setLevel(new.log_level.upper())
    if alerts is not None:
        alerts.reconfigure(new, channels)
    tracker.config = TrackerConfig.from_settings(new.incidents)
    if records is not None:
        records.context_lines = new.logs.context_lines
    if actions is not None:
        actions.fleet = new.fleet
    for inst in registry.configured():
        registry.adopt(inst)
    for path in new.logs.extra:
        registry.follow_extra(path)
