"""Prometheus metrics, so a farm of ComfyUI machines is watched by Prometheus and Alertmanager
rather than by anything we write.

Off by default (``[metrics] enabled``), and on a loopback address: that endpoint has no
authentication, and per-process memory names processes. A farm sets ``[fleet] listen``: any
address, but only behind a bearer token or mTLS (``metrics_server.py``).

No label is per-prompt or per-process (no prompt id, no pid): each would start a new series
at every prompt or restart in every Prometheus of the farm. The one per-incident label,
``snapshot`` on ``oom_sentinel_last_incident_timestamp_seconds``, is shown for the latest
incident of each instance only (incidents are rare; a storm is one incident), so an alert can
name the snapshot and the ``oom-bisect`` command.

Everything lives in a private ``CollectorRegistry`` (never the process-global one), so two
exporters -- or a test -- never see each other's series. The memory gauges are rendered from
the latest ``MemorySample`` at scrape time by a custom collector: a process that exits simply
disappears, with no stale labelled series left behind. Unknown values (``None``: WDDM, an
unsupported NVML query) are left out, never exported as 0.

=============================================  ===============================================
metric                                         what
=============================================  ===============================================
``oom_sentinel_gpu_memory_{total,used,free}_bytes{gpu,name}``        per GPU
``oom_sentinel_gpu_process_memory_bytes{gpu,process,instance}``      per process name on a GPU
``oom_sentinel_host_{ram_total,ram_available,swap_total,swap_used}_bytes``
``oom_sentinel_comfyui_rss_bytes{instance}``                         ComfyUI's process tree
``oom_sentinel_incidents_total{instance,pool}``                      snapshots written
``oom_sentinel_last_incident_timestamp_seconds{instance,pool,node,snapshot,regression}``
                                                                     the latest per instance
``oom_sentinel_oom_failures_total{instance,pool}``                   failures incl. storm repeats
``oom_sentinel_soft_ooms_total{instance}``                           recovered OOMs
``oom_sentinel_prompts_total{instance,outcome}``                     finished prompts
``oom_sentinel_prompt_peak_{vram,ram}_bytes{instance}``              histograms of prompt peaks
``oom_sentinel_prompt_last_peak_vram_bytes{instance}``               the latest prompt's peak
``oom_sentinel_prompt_duration_seconds{instance}``                   histogram
``oom_sentinel_worker_up{worker}``                                   1 alive, 0 dead
``oom_sentinel_last_sample_timestamp_seconds`` / ``_age_seconds``    sampler health
``oom_sentinel_alerts_{sent,failed}_total{channel}``, ``_alerts_pending``
``oom_sentinel_config_last_reload_success``                          1 ok, 0 kept the old config
``oom_sentinel_build_info{version}``
=============================================  ===============================================
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from oom_sentinel.daemon.core.errors import SentinelError
from oom_sentinel.daemon.core.units import GIB
from oom_sentinel.daemon.probes.base import MemorySample
from oom_sentinel.daemon.service.workers import Worker

if TYPE_CHECKING:
    from oom_sentinel.config.settings import FleetSettings, MetricsSettings
    from oom_sentinel.daemon.alerts.notifiers import SendResult
    from oom_sentinel.daemon.incidents.tracker import Incident

__all__ = ["MetricsError", "MetricsExporter", "parse_listen"]

#: prompt peak buckets: the VRAM sizes of common cards and the RAM sizes of common machines
PEAK_BUCKETS_BYTES = tuple(
    float(g * GIB) for g in (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 80, 96, 128, 192)
)
DURATION_BUCKETS_S = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class MetricsError(SentinelError):
    """The metrics listener could not start (address in use, bad address)."""


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9866"`` / ``"[::1]:9866"`` -> (host, port)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class _SampleCollector(Collector):
    """Renders the latest memory sample at scrape time (no stale per-process series)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sample: MemorySample | None = None
        self._watched: dict[int, str] = {}

    def update(self, sample: MemorySample, watched: Mapping[int, str]) -> None:
        with self._lock:
            self._sample = sample
            self._watched = dict(watched)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            sample, watched = self._sample, dict(self._watched)
        age = GaugeMetricFamily(
            "oom_sentinel_last_sample_age_seconds",
            "Seconds since the last memory sample (sampler health).",
        )
        stamp = GaugeMetricFamily(
            "oom_sentinel_last_sample_timestamp_seconds",
            "Wall-clock time of the last memory sample.",
        )
        if sample is not None:
            age.add_metric([], max(0.0, self._clock() - sample.time_s))
            stamp.add_metric([], sample.time_s)
        yield age
        yield stamp
        if sample is None:
            return
        gpu_families = {
            field: GaugeMetricFamily(
                f"oom_sentinel_gpu_memory_{field}_bytes",
                f"GPU memory {field}, per device.",
                labels=["gpu", "name"],
            )
            for field in ("total", "used", "free")
        }
        for gpu in sample.gpus:
            labels = [str(gpu.index), gpu.name]
            for field, family in gpu_families.items():
                value = getattr(gpu, f"{field}_bytes")
                if value is not None:
                    family.add_metric(labels, value)
        yield from gpu_families.values()
        procs = GaugeMetricFamily(
            "oom_sentinel_gpu_process_memory_bytes",
            "GPU memory per process name (absent where the driver cannot say, e.g. WDDM).",
            labels=["gpu", "process", "instance"],
        )
        # Summed per (gpu, process name, instance): a pid is never a label -- every restart of
        # ComfyUI would start a new series in every Prometheus of the farm.
        per_process: dict[tuple[str, str, str], int] = {}
        for proc in sample.gpu_processes:
            if proc.used_bytes is not None:
                key = (str(proc.device_index), proc.name or "", watched.get(proc.pid, ""))
                per_process[key] = per_process.get(key, 0) + proc.used_bytes
        for key, used in per_process.items():
            procs.add_metric(list(key), used)
        yield procs
        host = sample.host
        for name, attr, doc in (
            ("ram_total", "ram_total_bytes", "System RAM."),
            ("ram_available", "ram_available_bytes", "Available system RAM."),
            ("swap_total", "swap_total_bytes", "Swap (Windows: the commit limit is separate)."),
            ("swap_used", "swap_used_bytes", "Swap in use."),
        ):
            family = GaugeMetricFamily(f"oom_sentinel_host_{name}_bytes", doc)
            value = getattr(host, attr) if host is not None else None
            if value is not None:
                family.add_metric([], value)
            yield family
        rss = GaugeMetricFamily(
            "oom_sentinel_comfyui_rss_bytes",
            "Resident memory of the watched ComfyUI process trees, per instance.",
            labels=["instance"],
        )
        per_instance: dict[str, int] = {}
        for tree in sample.process_trees:
            name = watched.get(tree.root_pid, "")
            per_instance[name] = per_instance.get(name, 0) + tree.rss_bytes
        for name, value in per_instance.items():
            rss.add_metric([name], value)
        yield rss


class _LastIncidentCollector(Collector):
    """The latest incident of each instance, rendered at scrape time: one series per instance,
    replaced (not accumulated) by the next incident."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[tuple[str, str, str, str, str], float]] = {}

    def update(
        self, instance: str, pool: str, node: str, snapshot: str, regression: bool, at_s: float
    ) -> None:
        labels = (instance, pool, node, snapshot, "true" if regression else "false")
        with self._lock:
            self._latest[instance] = (labels, at_s)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "oom_sentinel_last_incident_timestamp_seconds",
            "When the latest incident of an instance was recorded; its labels name the "
            "snapshot (and whether an install change is suspected).",
            labels=["instance", "pool", "node", "snapshot", "regression"],
        )
        with self._lock:
            latest = list(self._latest.values())
        for labels, at_s in latest:
            family.add_metric(list(labels), at_s)
        yield family


class MetricsExporter:
    """The exporter; call its ``observe_*``/``set_*`` methods from the loop (all thread-safe).

    ``start()`` serves ``/metrics`` on the configured loopback address; without it the
    registry can still be read (``registry``) -- nothing listens until asked.
    """

    def __init__(
        self,
        settings: MetricsSettings,
        *,
        clock: Callable[[], float] = time.time,
        version: str | None = None,
        fleet: FleetSettings | None = None,
    ) -> None:
        self.settings = settings
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._server: Any = None
        #: the /metrics server's thread (service.workers), started by ``start``
        self.worker = Worker("metrics", self._serve, thread_name="metrics-http")
        self._samples = _SampleCollector(clock)
        self.registry.register(self._samples)
        self._last_incident = _LastIncidentCollector()
        self.registry.register(self._last_incident)
        self.fleet = fleet
        reg = self.registry
        self._incidents = Counter(
            "oom_sentinel_incidents",
            "OOM incidents recorded (one snapshot each).",
            ["instance", "pool"],
            registry=reg,
        )
        self._failures = Counter(
            "oom_sentinel_oom_failures",
            "OOM failures, storm repeats included.",
            ["instance", "pool"],
            registry=reg,
        )
        self._soft = Counter(
            "oom_sentinel_soft_ooms", "Recovered (soft) OOMs.", ["instance"], registry=reg
        )
        self._prompts = Counter(
            "oom_sentinel_prompts", "Prompts finished.", ["instance", "outcome"], registry=reg
        )
        self._peak_vram = Histogram(
            "oom_sentinel_prompt_peak_vram_bytes",
            "Peak GPU memory of a prompt.",
            ["instance"],
            buckets=PEAK_BUCKETS_BYTES,
            registry=reg,
        )
        self._peak_ram = Histogram(
            "oom_sentinel_prompt_peak_ram_bytes",
            "Peak RAM of ComfyUI's process tree during a prompt.",
            ["instance"],
            buckets=PEAK_BUCKETS_BYTES,
            registry=reg,
        )
        self._last_peak = Gauge(
            "oom_sentinel_prompt_last_peak_vram_bytes",
            "Peak GPU memory of the latest prompt.",
            ["instance"],
            registry=reg,
        )
        self._duration = Histogram(
            "oom_sentinel_prompt_duration_seconds",
            "How long a prompt ran.",
            ["instance"],
            buckets=DURATION_BUCKETS_S,
            registry=reg,
        )
        self._workers = Gauge(
            "oom_sentinel_worker_up", "1 while a worker thread is alive.", ["worker"], registry=reg
        )
        self._sent = Counter(
            "oom_sentinel_alerts_sent", "Alerts delivered, per channel.", ["channel"], registry=reg
        )
        self._send_failed = Counter(
            "oom_sentinel_alerts_failed",
            "Alert deliveries that failed (and will be retried), per channel.",
            ["channel"],
            registry=reg,
        )
        self._pending = Gauge(
            "oom_sentinel_alerts_pending", "Alerts waiting in the outbox.", registry=reg
        )
        self._reload = Gauge(
            "oom_sentinel_config_last_reload_success",
            "1 when the last config reload succeeded, 0 when the old config was kept.",
            registry=reg,
        )
        self._reload.set(1)
        info = Gauge("oom_sentinel_build_info", "The running version.", ["version"], registry=reg)
        info.labels(version=version or _version()).set(1)
        self._counted: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- serving -----------------------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Listen on ``[fleet] listen`` (token/mTLS) when set, else on the loopback
        ``[metrics] listen``; returns the (host, port) bound."""
        from oom_sentinel.daemon.fleet.metrics_server import ListenerAuth, serve_metrics

        fleet = self.fleet
        if fleet is not None and fleet.listen:
            key, listen = "fleet.listen", fleet.listen
            auth = ListenerAuth.from_files(
                token_file=fleet.token_file,
                cert_file=fleet.tls_cert_file,
                key_file=fleet.tls_key_file,
                client_ca_file=fleet.tls_client_ca_file,
            )
        else:
            key, listen, auth = "metrics.listen", self.settings.listen, ListenerAuth()
        host, port = parse_listen(listen)
        try:
            server = serve_metrics(host, port, self.registry, auth, on_poll=self._beat)
        except OSError as exc:
            raise MetricsError(f"{key}: cannot listen on {listen}: {exc.strerror or exc}") from None
        self._server = server
        self.worker.start()
        bound = server.server_address
        return str(bound[0]), int(bound[1])

    def is_alive(self) -> bool:
        """Whether the /metrics server thread runs (a worker the watchdog checks)."""
        return self.worker.is_alive()

    def _serve(self) -> None:
        server = self._server
        if server is not None:
            server.serve_forever()

    def _beat(self) -> None:
        self.worker.beat()

    def stop(self) -> None:
        if self._server is not None:
            if self.worker.is_alive():
                self.worker.request_stop()
                self._server.shutdown()  # returns once serve_forever has
            self._server.server_close()
            self._server = None
        self.worker.join(5)

    # -- observations ------------------------------------------------------------------------
    def observe_sample(
        self, sample: MemorySample, watched: Mapping[int, str] | None = None
    ) -> None:
        """The latest memory sample; ``watched`` maps ComfyUI pids to instance names."""
        self._samples.update(sample, watched or {})

    def observe_incident(self, incident: Incident) -> None:
        """A ``WriteSnapshot`` (new incident) or an ``UpdateIncident``/``CloseIncident`` (its
        count grew): counts the incident once and each failure once."""
        labels = {"instance": incident.instance, "pool": str(incident.pool)}
        with self._lock:
            before = self._counted.get(incident.id)
            self._counted[incident.id] = max(incident.count, before or 0)
            if len(self._counted) > 10_000:  # bounded: forget the oldest
                for key in list(self._counted)[:5_000]:
                    del self._counted[key]
        if before is None:
            self._incidents.labels(**labels).inc()
            self._failures.labels(**labels).inc(incident.count)
        elif incident.count > before:
            self._failures.labels(**labels).inc(incident.count - before)

    def observe_snapshot(
        self, incident: Incident, snapshot_id: str, *, regression: bool = False
    ) -> None:
        """A snapshot was written for ``incident``: it becomes the instance's latest incident
        (``oom_sentinel_last_incident_timestamp_seconds``) that alert rules name."""
        self.set_last_incident(
            incident.instance,
            str(incident.pool),
            incident.node_type or "",
            snapshot_id,
            regression=regression,
        )

    def set_last_incident(
        self,
        instance: str,
        pool: str,
        node: str,
        snapshot_id: str,
        *,
        regression: bool = False,
        at_s: float | None = None,
    ) -> None:
        """Name an instance's latest incident; ``at_s`` (default: now) is when it was recorded
        -- a restarted daemon restores it from the snapshot on disk."""
        at = self._clock() if at_s is None else at_s
        self._last_incident.update(instance, pool, node, snapshot_id, regression, at)

    def observe_soft_oom(self, instance: str) -> None:
        self._soft.labels(instance=instance).inc()

    def observe_prompt(
        self,
        instance: str,
        outcome: str,
        *,
        peak_vram_bytes: int | None = None,
        peak_ram_bytes: int | None = None,
        duration_s: float | None = None,
    ) -> None:
        """A finished prompt (``outcome``: "success", "oom", "error", "interrupted")."""
        self._prompts.labels(instance=instance, outcome=outcome).inc()
        if peak_vram_bytes is not None:
            self._peak_vram.labels(instance=instance).observe(peak_vram_bytes)
            self._last_peak.labels(instance=instance).set(peak_vram_bytes)
        if peak_ram_bytes is not None:
            self._peak_ram.labels(instance=instance).observe(peak_ram_bytes)
        if duration_s is not None:
            self._duration.labels(instance=instance).observe(duration_s)

    def set_worker_alive(self, worker: str, alive: bool) -> None:
        self._workers.labels(worker=worker).set(1 if alive else 0)

    def observe_alert_result(self, result: SendResult) -> None:
        """Pass as ``AlertDispatcher(on_result=...)``; labelled by the secret-free channel id."""
        (self._sent if result.ok else self._send_failed).labels(channel=result.channel_id).inc()

    def set_alerts_pending(self, count: int) -> None:
        self._pending.set(count)

    def set_config_reload(self, ok: bool) -> None:
        self._reload.set(1 if ok else 0)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("oom-sentinel")
    except Exception:
        return "unknown"
