"""The Prometheus exporter, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import urllib.request

import pytest
import snapshot_samples as samples
from prometheus_client.parser import text_string_to_metric_families

from oom_sentinel.config.settings import MetricsSettings, parse_settings
from oom_sentinel.daemon.alerts.notifiers import SendResult
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.fleet.metrics import MetricsError, MetricsExporter
from oom_sentinel.daemon.probes.base import GpuDeviceSample, MemorySample

GIB = 1024**3


def _scrape(host: str, port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def exporter() -> MetricsExporter:
    exp = MetricsExporter(
        MetricsSettings(listen="127.0.0.1:0"), clock=lambda: samples.T0 + 2.5, version="9.9"
    )
    yield exp
    exp.stop()


def test_metrics_are_off_by_default() -> None:
    assert MetricsSettings().enabled is False
    assert MetricsSettings().listen == "127.0.0.1:9866"


@pytest.mark.parametrize(
    "listen",
    ["0.0.0.0:9866", "192.168.1.5:9866", "example.org:80", "9866"],
    ids=["any", "lan", "name", "no-host"],
)
def test_only_loopback_listen_addresses_are_accepted(listen: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"metrics": {"listen": listen}}, "config.toml")
    assert str(info.value).startswith("config.toml: metrics.listen: ")


def test_scrape_shows_memory_per_gpu_and_process(exporter: MetricsExporter) -> None:
    exporter.observe_sample(samples.memory(), watched={4242: "main"})
    host, port = exporter.start()
    assert host == "127.0.0.1" and port > 0
    m = _scrape(host, port)
    gpu = (("gpu", "0"), ("name", "NVIDIA GeForce RTX 4090"))
    assert m[("oom_sentinel_gpu_memory_total_bytes", gpu)] == 24 * GIB
    assert m[("oom_sentinel_gpu_memory_used_bytes", gpu)] == 23.5 * GIB
    comfy = (("gpu", "0"), ("instance", "main"), ("process", "python"))
    other = (("gpu", "0"), ("instance", ""), ("process", "blender"))
    assert m[("oom_sentinel_gpu_process_memory_bytes", comfy)] == 20 * GIB
    assert m[("oom_sentinel_gpu_process_memory_bytes", other)] == 3 * GIB
    # pid 31337's memory is unknown: left out, never 0 (the only series are the two above)
    assert sorted(k[1] for k in m if k[0] == "oom_sentinel_gpu_process_memory_bytes") == sorted(
        [comfy, other]
    )
    assert m[("oom_sentinel_host_ram_available_bytes", ())] == 39 * GIB
    assert m[("oom_sentinel_comfyui_rss_bytes", (("instance", "main"),))] == 9 * GIB
    assert m[("oom_sentinel_last_sample_age_seconds", ())] == pytest.approx(2.6)
    assert m[("oom_sentinel_build_info", (("version", "9.9"),))] == 1


def test_a_process_that_exits_leaves_no_stale_series(exporter: MetricsExporter) -> None:
    host, port = exporter.start()
    exporter.observe_sample(samples.memory())
    assert any(("process", "blender") in k[1] for k in _scrape(host, port))
    exporter.observe_sample(MemorySample(samples.T0 + 1, (), (), None))
    m = _scrape(host, port)
    assert not any(("process", "blender") in k[1] for k in m)
    assert not any(k[0] == "oom_sentinel_gpu_memory_used_bytes" for k in m)


def test_unknown_gpu_numbers_are_absent(exporter: MetricsExporter) -> None:
    host, port = exporter.start()
    gpu = GpuDeviceSample(
        index=1, name="Radeon", total_bytes=16 * GIB, used_bytes=None, free_bytes=None
    )
    exporter.observe_sample(MemorySample(samples.T0, (gpu,), (), None))
    m = _scrape(host, port)
    assert (
        m[("oom_sentinel_gpu_memory_total_bytes", (("gpu", "1"), ("name", "Radeon")))] == 16 * GIB
    )
    assert not any(k[0] == "oom_sentinel_gpu_memory_used_bytes" for k in m)


def test_incidents_soft_ooms_prompts_and_health(exporter: MetricsExporter) -> None:
    host, port = exporter.start()
    incident = samples.incident()
    exporter.observe_incident(incident)
    exporter.observe_incident(incident)  # the same incident again counts nothing
    from dataclasses import replace

    exporter.observe_incident(replace(incident, count=5))  # a storm grew it
    exporter.observe_soft_oom("main")
    exporter.observe_soft_oom("main")
    exporter.observe_prompt(
        "main", "success", peak_vram_bytes=14 * GIB, peak_ram_bytes=9 * GIB, duration_s=42.0
    )
    exporter.observe_prompt("main", "oom")
    exporter.set_worker_alive("sampler", True)
    exporter.set_worker_alive("logtail", False)
    exporter.observe_alert_result(SendResult("apprise:abc", "json://…", True, "sent"))
    exporter.observe_alert_result(SendResult("apprise:abc", "json://…", False, "500"))
    exporter.set_alerts_pending(1)
    exporter.set_config_reload(False)
    m = _scrape(host, port)
    pool = (("instance", "main"), ("pool", "gpu"))
    assert m[("oom_sentinel_incidents_total", pool)] == 1
    assert m[("oom_sentinel_oom_failures_total", pool)] == 5
    assert m[("oom_sentinel_soft_ooms_total", (("instance", "main"),))] == 2
    assert m[("oom_sentinel_prompts_total", (("instance", "main"), ("outcome", "success")))] == 1
    assert m[("oom_sentinel_prompts_total", (("instance", "main"), ("outcome", "oom")))] == 1
    assert m[("oom_sentinel_prompt_last_peak_vram_bytes", (("instance", "main"),))] == 14 * GIB
    bucket = (("instance", "main"), ("le", "1.7179869184e+10"))  # 16 GiB
    assert m[("oom_sentinel_prompt_peak_vram_bytes_bucket", bucket)] == 1
    assert m[("oom_sentinel_prompt_duration_seconds_sum", (("instance", "main"),))] == 42.0
    assert m[("oom_sentinel_worker_up", (("worker", "sampler"),))] == 1
    assert m[("oom_sentinel_worker_up", (("worker", "logtail"),))] == 0
    assert m[("oom_sentinel_alerts_sent_total", (("channel", "apprise:abc"),))] == 1
    assert m[("oom_sentinel_alerts_failed_total", (("channel", "apprise:abc"),))] == 1
    assert m[("oom_sentinel_alerts_pending", ())] == 1
    assert m[("oom_sentinel_config_last_reload_success", ())] == 0


def test_two_exporters_do_not_share_series() -> None:
    a = MetricsExporter(MetricsSettings(listen="127.0.0.1:0"))
    b = MetricsExporter(MetricsSettings(listen="127.0.0.1:0"))
    a.observe_soft_oom("x")
    assert a.registry.get_sample_value("oom_sentinel_soft_ooms_total", {"instance": "x"}) == 1
    assert b.registry.get_sample_value("oom_sentinel_soft_ooms_total", {"instance": "x"}) is None


def test_a_port_in_use_is_one_line(exporter: MetricsExporter) -> None:
    _host, port = exporter.start()
    second = MetricsExporter(MetricsSettings(listen=f"127.0.0.1:{port}"))
    with pytest.raises(MetricsError) as info:
        second.start()
    assert str(info.value).startswith(f"metrics.listen: cannot listen on 127.0.0.1:{port}: ")


def test_stop_closes_the_listener(exporter: MetricsExporter) -> None:
    host, port = exporter.start()
    _scrape(host, port)
    exporter.stop()
    with pytest.raises(OSError):
        _scrape(host, port)
