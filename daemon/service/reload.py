"""SIGHUP: re-read the config. A bad new config keeps the old one running and says why; a
change that cannot be applied to a running daemon (data dir, metrics listener, GPU probe,
fleet) is applied at the next restart and named in the log."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from oom_sentinel.config.settings import LoadedSettings, Settings, load_settings
from oom_sentinel.daemon.errors import SentinelError
from oom_sentinel.daemon.notifiers import AlertChannel, build_channels

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


def log_reloaded(loaded: LoadedSettings, restart: Sequence[str]) -> None:
    log.info(
        "configuration reloaded from %s%s",
        loaded.source or "built-in defaults",
        f"; {', '.join(restart)} change(s) need a restart" if restart else "",
    )
