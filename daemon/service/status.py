"""What ``oom-sentinel status`` reads: ``status.json`` in the data dir, refreshed every
STATUS_INTERVAL_S by the main loop (redacted: a ComfyUI URL's token must not be there), and
the store's ``last_alive_s``, which tells the next start since when prompts went unwatched."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.core.atomic import write_json_atomic
from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.core.redact import redact
from oom_sentinel.daemon.logs.tail import LogTailManager
from oom_sentinel.daemon.probes.base import MemorySample
from oom_sentinel.daemon.service.instances import InstanceRegistry
from oom_sentinel.daemon.service.pipeline import Pipeline
from oom_sentinel.daemon.service.sources import Sources
from oom_sentinel.daemon.service.workers import Health
from oom_sentinel.daemon.store.db import Store

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter

log = logging.getLogger("oom_sentinel")

#: How often ``status.json`` (read by ``oom-sentinel status``) is refreshed.
STATUS_INTERVAL_S = 5.0
STATUS_FILE = "status.json"  # cli_run.STATUS_FILE reads it
#: store meta key: the last time this daemon was alive, so a prompt that failed while it was
#: down (found in history at the next connect) still becomes an incident
META_LAST_ALIVE = "last_alive_s"


def unwatched_since(store: Store, started_s: float) -> float:
    """Since when prompts may have ended unwatched: a little before this data dir's daemon
    was last alive (``last_alive_s`` is written every STATUS_INTERVAL_S), else now -- an OOM
    from before the first start is recorded as a run, not alarmed on."""
    try:
        last_alive = store.get_meta(META_LAST_ALIVE)
        if last_alive is not None:
            return min(started_s, float(last_alive) - STATUS_INTERVAL_S)
    except (TypeError, ValueError):
        pass
    return started_s


def _sample_json(latest: MemorySample | None) -> dict[str, Any] | None:
    if latest is None:
        return None
    return {
        "time_s": latest.time_s,
        "ram_total_bytes": latest.host.ram_total_bytes if latest.host else None,
        "ram_available_bytes": latest.host.ram_available_bytes if latest.host else None,
        "swap_used_bytes": latest.host.swap_used_bytes if latest.host else None,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "used_bytes": g.used_bytes,
                "total_bytes": g.total_bytes,
            }
            for g in latest.gpus
        ],
        "processes": [{"pid": t.root_pid, "rss_bytes": t.rss_bytes} for t in latest.process_trees],
    }


def build_status(
    now: float,
    *,
    started_s: float,
    config: str | None,
    data_dir: Path,
    sources: Sources | None,
    tails: LogTailManager | None,
    pipeline: Pipeline | None,
    registry: InstanceRegistry,
    health: Health,
) -> dict[str, Any]:
    """What ``oom-sentinel status`` shows: what is watched, the last sample, incidents, and
    every worker thread's health (a dead one also stops systemd's watchdog ping)."""
    records = pipeline.records if pipeline is not None else None
    logs = []
    if tails is not None:
        for key, follower in tails.followers.items():
            st = follower.state
            logs.append(
                {
                    "path": key,
                    "instance": records.instance_of(key) if records is not None else None,
                    "reading": st.path,
                    "offset": st.offset,
                    "error": st.error,
                }
            )
    prompts = pipeline.prompts if pipeline is not None else None
    api_up = prompts.api_up if prompts is not None else {}
    running = prompts.running if prompts is not None else {}
    actions = pipeline.actions if pipeline is not None else None
    return {
        "pid": os.getpid(),
        "started_s": started_s,
        "updated_s": now,
        "config": config,
        "data_dir": str(data_dir),
        "gpu": sources.gpu_line if sources is not None else "",
        "wake": tails.wake_backend if tails is not None else None,
        "instances": [
            {
                "name": i.name,
                "path": i.path,
                "url": i.url,
                "pid": i.pid,
                "source": i.source,
                "api": api_up.get(i.name, False),
                "running_prompt": (running.get(i.name) or (None,))[0],
            }
            for i in registry.by_name.values()
        ],
        "logs": logs,
        "last_sample": _sample_json(sources.timeline.latest() if sources is not None else None),
        "incidents_written": actions.incidents_written if actions is not None else 0,
        "last_incident": actions.last_incident if actions is not None else None,
        "workers": health.check(),
        # when each was last seen working, and what ended a dead one
        "worker_health": health.details(),
    }


def write_status(
    data_dir: Path,
    status: Mapping[str, Any],
    now: float,
    store: Store | None,
    metrics: MetricsExporter | None,
    alerts: AlertDispatcher | None,
) -> None:
    """Save ``last_alive_s``, the outbox's pending count (metrics) and ``status.json``."""
    if store is not None:
        try:
            store.set_meta(META_LAST_ALIVE, f"{now:.3f}")
        except SentinelError as exc:
            log.debug("could not save %s: %s", META_LAST_ALIVE, exc)
    if metrics is not None and alerts is not None:
        try:
            metrics.set_alerts_pending(alerts.outbox.counts()["pending"])
        except SentinelError as exc:
            log.debug("could not count the alert outbox: %s", exc)
    try:
        # `oom-sentinel status` prints it: a ComfyUI URL's token must not be there
        write_json_atomic(data_dir / STATUS_FILE, redact(status))
    except OSError as exc:
        log.debug("could not write %s: %s", STATUS_FILE, exc)
