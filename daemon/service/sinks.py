"""Where incidents go besides the snapshot: the alert dispatcher (its outbox and sender, and
the [fleet] bucket upload channel) and the Prometheus exporter. Both optional extras load only
when configured (prometheus_client, boto3), which keeps the daemon's start-up footprint."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from oom_sentinel.config.settings import Settings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.alerts.notifiers import build_channels
from oom_sentinel.daemon.store.db import Store

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on (off by default)
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter

log = logging.getLogger("oom_sentinel")


def start_metrics(settings: Settings, clock: Callable[[], float]) -> MetricsExporter | None:
    """The /metrics listener when ``[metrics]`` or ``[fleet] listen`` asks for it."""
    if not (settings.metrics.enabled or settings.fleet.listen):
        return None
    from oom_sentinel.daemon.fleet.metrics import MetricsExporter

    metrics = MetricsExporter(settings.metrics, clock=clock, fleet=settings.fleet)
    host, port = metrics.start()
    scheme = "https" if settings.fleet.listen and settings.fleet.tls_cert_file else "http"
    log.info("metrics on %s://%s:%d/metrics", scheme, host, port)
    return metrics


def build_alerts(
    store: Store,
    settings: Settings,
    environ: Mapping[str, str],
    clock: Callable[[], float],
    metrics: MetricsExporter | None,
    snapshots_dir: Path,
) -> AlertDispatcher:
    """The alert dispatcher (not started), with the bucket channel when ``bucket_url`` is set."""
    upload_channel = None
    if settings.fleet.bucket_url:  # boto3 loads on the first upload, never before
        from oom_sentinel.daemon.fleet.bucket import BucketChannel

        upload_channel = BucketChannel(settings.fleet)
        log.info("snapshots are uploaded to %s", upload_channel.name)
    return AlertDispatcher(
        store,
        settings,
        build_channels(settings, environ=environ),
        clock=clock,
        on_result=metrics.observe_alert_result if metrics is not None else None,
        upload_channel=upload_channel,
        snapshots_dir=snapshots_dir,
    )
