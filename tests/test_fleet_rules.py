"""The shipped Prometheus alerting rules, tested with the real ``promtool test rules`` against
series the real exporter served: a scripted hour on one GPU box (an OOM, its storm, soft OOMs,
a suspected regression, low VRAM then low RAM, a stalled sampler, a dead worker, the daemon
going away), scraped over HTTP once a simulated minute."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
import yaml
from click.testing import CliRunner
from prom_series import ScrapeRecorder

from oom_sentinel.config.settings import MetricsSettings
from oom_sentinel.daemon.cli.fleet import RULES_FILE
from oom_sentinel.daemon.cli.main import main
from oom_sentinel.daemon.fleet.metrics import MetricsExporter
from oom_sentinel.daemon.probes.base import (
    GpuDeviceSample,
    GpuProcessSample,
    HostSample,
    MemorySample,
    ProcessTreeSample,
)

GIB = 1024**3
HOST = "gpu-01"
GPU_NAME = "NVIDIA GeForce RTX 4090"
SNAP_A = "20260102T100500Z_gpu_KSampler"
SNAP_B = "20260102T102500Z_gpu_VAEDecode"
MINUTES = 60
ALERTS = (
    "ComfyUIOutOfMemory",
    "ComfyUIOutOfMemoryStorm",
    "ComfyUISoftOomRateRising",
    "ComfyUIRegressionSuspected",
    "GpuMemoryHeadroomLow",
    "HostRamHeadroomLow",
    "OomSentinelDown",
    "OomSentinelSamplerStalled",
    "OomSentinelWorkerUnhealthy",
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian/Ubuntu: apt-get install prometheus; .ci/run does)",
)


def _sample(minute: int, now: float) -> MemorySample:
    free = 0.2 * GIB if 20 <= minute < 35 else 8 * GIB  # under 1% free for 15 minutes
    available = 2 * GIB if 36 <= minute < 50 else 40 * GIB
    return MemorySample(
        time_s=now,
        gpus=(
            GpuDeviceSample(
                index=0,
                name=GPU_NAME,
                total_bytes=24 * GIB,
                used_bytes=int(24 * GIB - free),
                free_bytes=int(free),
            ),
        ),
        gpu_processes=(
            GpuProcessSample(pid=4242, device_index=0, used_bytes=int(20 * GIB), name="python"),
        ),
        host=HostSample(
            ram_total_bytes=64 * GIB,
            ram_available_bytes=int(available),
            swap_total_bytes=8 * GIB,
            swap_used_bytes=0,
        ),
        process_trees=(ProcessTreeSample(root_pid=4242, rss_bytes=9 * GIB),),
    )


def _scripted_hour() -> ScrapeRecorder:
    """Drive the real exporter through the hour; promtool's clock starts at 0."""
    clock = {"now": 0.0}
    exporter = MetricsExporter(
        MetricsSettings(listen="127.0.0.1:0"), clock=lambda: clock["now"], version="9.9"
    )
    host, port = exporter.start()
    recorder = ScrapeRecorder(
        f"http://{host}:{port}/metrics", job="oom-sentinel", host=HOST, port=9866
    )
    incident_a = samples.incident(node_type="KSampler")
    incident_b = replace(samples.incident(node_type="VAEDecode"), id="inc-b")
    try:
        for minute in range(MINUTES):
            now = clock["now"] = minute * 60.0
            if not 41 <= minute < 47:  # the sampler stalls for six minutes
                exporter.observe_sample(_sample(minute, now), watched={4242: "main"})
            for worker in ("sampler", "logtail", "api"):
                exporter.set_worker_alive(worker, not (worker == "logtail" and minute >= 40))
            if minute == 5:
                exporter.observe_incident(incident_a)
                exporter.observe_snapshot(incident_a, SNAP_A)
            if minute in (6, 7, 8):  # a storm: the same failure joins the incident
                exporter.observe_incident(replace(incident_a, count=3 * (minute - 5)))
            if 10 <= minute < 15:
                exporter.observe_soft_oom("main")
            if minute == 25:
                exporter.observe_incident(incident_b)
                exporter.observe_snapshot(incident_b, SNAP_B, regression=True)
            if minute == 50:
                exporter.stop()  # the daemon goes away: scrapes fail from here on
            recorder.scrape()
    finally:
        exporter.stop()
    return recorder


def _alert(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"exp_labels": labels, "exp_annotations": annotations}


def _incident_alert(snapshot: str, node: str) -> dict[str, Any]:
    return _alert(
        {
            "severity": "critical",
            "host": HOST,
            "instance": "main",
            "pool": "gpu",
            "node": node,
            "snapshot": snapshot,
        },
        {
            "summary": f"ComfyUI main on {HOST} ran out of gpu memory in {node}",
            "snapshot": snapshot,
            "description": f"Snapshot {snapshot}. On {HOST}: oom-sentinel snapshots show "
            f"{snapshot} (or --from your [fleet] bucket_url).",
        },
    )


def _expectations() -> list[dict[str, Any]]:
    """What an on-call person should have been paged with, minute by minute."""
    storm = _alert(
        {
            "severity": "critical",
            "host": HOST,
            "instance": "main",
            "pool": "gpu",
            "node": "KSampler",
            "snapshot": SNAP_A,
        },
        {
            "summary": f"OOM storm: ComfyUI main on {HOST} keeps running out of gpu memory",
            "snapshot": SNAP_A,
            "description": "At least 5 gpu OOM failures in 10 minutes; the latest snapshot is "
            f"{SNAP_A}.",
        },
    )
    soft = _alert(
        {"severity": "warning", "host": HOST, "instance": "main", "pool": "gpu"},
        {
            "summary": f"ComfyUI main on {HOST} recovers from OOMs more and more often",
            "description": "3 or more recovered (soft) OOMs in 15 minutes, over twice the usual "
            "rate: prompts run at the edge of VRAM and will start failing.",
        },
    )
    regression = _alert(
        {
            "severity": "critical",
            "host": HOST,
            "instance": "main",
            "pool": "gpu",
            "node": "VAEDecode",
            "snapshot": SNAP_B,
        },
        {
            "summary": f"ComfyUI main on {HOST}: OOM after an update, in VAEDecode",
            "snapshot": SNAP_B,
            "bisect": f"oom-bisect {SNAP_B}",
            "description": f"The workflow of snapshot {SNAP_B} succeeded under an earlier install "
            f"state. On {HOST}, run: oom-bisect {SNAP_B}",
        },
    )
    vram = _alert(
        {"severity": "warning", "host": HOST, "gpu": "0", "name": GPU_NAME, "pool": "gpu"},
        {
            "summary": f"GPU 0 ({GPU_NAME}) on {HOST} has had under 3% VRAM free for 10 minutes",
            "description": "The next larger prompt will run out of GPU memory; see what holds "
            f"it: oom-sentinel status on {HOST}.",
        },
    )
    ram = _alert(
        {"severity": "warning", "host": HOST, "pool": "ram"},
        {
            "summary": f"{HOST} has had under 5% RAM available for 10 minutes",
            "description": "Model offloading to RAM will fail next, or the kernel OOM killer "
            "will end ComfyUI.",
        },
    )
    stalled = _alert(
        {"severity": "warning", "host": HOST},
        {
            "summary": f"oom-sentinel on {HOST} has taken no memory sample for over 2 minutes",
            "description": "Snapshots would carry stale memory numbers; see journalctl -u "
            "oom-sentinel.",
        },
    )
    worker = _alert(
        {"severity": "warning", "host": HOST, "worker": "logtail"},
        {
            "summary": f"oom-sentinel on {HOST}: its logtail worker is dead",
            "description": f"Part of the watchdog stopped; oom-sentinel status on {HOST} says "
            "which, and the journal why.",
        },
    )
    down = _alert(
        {"severity": "critical", "host": HOST},
        {
            "summary": f"oom-sentinel on {HOST} is not answering scrapes",
            "description": f"OOMs on {HOST} go unrecorded; check: systemctl status oom-sentinel.",
        },
    )
    firing: dict[str, dict[str, list[dict[str, Any]]]] = {
        # a healthy box: nothing fires
        "3m": {name: [] for name in ALERTS},
        "9m": {
            "ComfyUIOutOfMemory": [_incident_alert(SNAP_A, "KSampler")],
            "ComfyUIOutOfMemoryStorm": [storm],
        },
        "14m": {"ComfyUISoftOomRateRising": [soft]},
        "22m": {"ComfyUIOutOfMemory": [], "ComfyUIOutOfMemoryStorm": []},
        # the regression pages once, with the bisect command (not also as a plain OOM)
        "26m": {"ComfyUIRegressionSuspected": [regression], "ComfyUIOutOfMemory": []},
        "32m": {"GpuMemoryHeadroomLow": [vram], "ComfyUISoftOomRateRising": []},
        "45m": {
            "OomSentinelSamplerStalled": [stalled],
            "OomSentinelWorkerUnhealthy": [worker],
            "GpuMemoryHeadroomLow": [],
        },
        "48m": {"HostRamHeadroomLow": [ram], "OomSentinelSamplerStalled": []},
        # the daemon is gone: one page for that, its other series went stale
        "53m": {name: [down] if name == "OomSentinelDown" else [] for name in ALERTS},
    }
    return [
        {"eval_time": at, "alertname": name, "exp_alerts": alerts}
        for at, by_name in firing.items()
        for name, alerts in by_name.items()
    ]


def _promtool_test(
    tmp_path: Path, *groups: tuple[ScrapeRecorder, list[dict[str, Any]]]
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on one test group per (scrapes, expectations)."""
    test_file = tmp_path / "oom-sentinel.test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES_FILE)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": recorder.input_series(),
                        "alert_rule_test": cases,
                    }
                    for recorder, cases in groups
                ],
            },
            sort_keys=False,
        )
    )
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )


def _steady_then_burst() -> ScrapeRecorder:
    """Three hours of one soft OOM a minute on "tiled" (a known workload: no page), then five
    a minute for ten minutes (rising: a page)."""
    clock = {"now": 0.0}
    exporter = MetricsExporter(
        MetricsSettings(listen="127.0.0.1:0"), clock=lambda: clock["now"], version="9.9"
    )
    host, port = exporter.start()
    recorder = ScrapeRecorder(
        f"http://{host}:{port}/metrics", job="oom-sentinel", host=HOST, port=9866
    )
    try:
        for minute in range(200):
            clock["now"] = minute * 60.0
            exporter.observe_sample(_sample(0, clock["now"]), watched={4242: "tiled"})
            for _ in range(5 if minute >= 185 else 1):
                exporter.observe_soft_oom("tiled")
            recorder.scrape()
    finally:
        exporter.stop()
    return recorder


def _rising_expectations() -> list[dict[str, Any]]:
    rising = _alert(
        {"severity": "warning", "host": HOST, "instance": "tiled", "pool": "gpu"},
        {
            "summary": f"ComfyUI tiled on {HOST} recovers from OOMs more and more often",
            "description": "3 or more recovered (soft) OOMs in 15 minutes, over twice the usual "
            "rate: prompts run at the edge of VRAM and will start failing.",
        },
    )
    return [
        {"eval_time": "3m", "alertname": "ComfyUISoftOomRateRising", "exp_alerts": [rising]},
        # 15 in every 15 minutes for hours: that is this instance's normal
        {"eval_time": "150m", "alertname": "ComfyUISoftOomRateRising", "exp_alerts": []},
        {"eval_time": "184m", "alertname": "ComfyUISoftOomRateRising", "exp_alerts": []},
        {"eval_time": "195m", "alertname": "ComfyUISoftOomRateRising", "exp_alerts": [rising]},
    ]


@pytest.fixture(scope="module")
def recorder() -> ScrapeRecorder:
    return _scripted_hour()


def test_the_scrapes_are_real_exporter_output(recorder: ScrapeRecorder) -> None:
    assert recorder.steps == MINUTES
    assert len(recorder.texts) == 50  # minutes 0..49 answered, 50..59 did not
    names = {s["series"].split("{")[0] for s in recorder.input_series()}
    for needed in (
        "oom_sentinel_last_incident_timestamp_seconds",
        "oom_sentinel_oom_failures_total",
        "oom_sentinel_soft_ooms_total",
        "oom_sentinel_gpu_memory_free_bytes",
        "oom_sentinel_host_ram_available_bytes",
        "oom_sentinel_last_sample_age_seconds",
        "oom_sentinel_worker_up",
        "up",
    ):
        assert needed in names


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


@needs_promtool
def test_the_rules_page_for_what_happened(tmp_path: Path, recorder: ScrapeRecorder) -> None:
    done = _promtool_test(
        tmp_path, (recorder, _expectations()), (_steady_then_burst(), _rising_expectations())
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_fails_a_wrong_expectation(tmp_path: Path, recorder: ScrapeRecorder) -> None:
    """The harness can fail: an OOM page expected while the box was healthy is refused."""
    wrong = [
        {
            "eval_time": "3m",
            "alertname": "ComfyUIOutOfMemory",
            "exp_alerts": [_incident_alert(SNAP_A, "KSampler")],
        }
    ]
    done = _promtool_test(tmp_path, (recorder, wrong))
    assert done.returncode != 0
    assert "ComfyUIOutOfMemory" in done.stdout + done.stderr


def test_fleet_rules_prints_the_shipped_file() -> None:
    result = CliRunner().invoke(main, ["fleet", "rules"])
    assert result.exit_code == 0
    assert result.output == RULES_FILE.read_text("utf-8")
    rules = yaml.safe_load(result.output)["groups"][0]["rules"]
    assert tuple(sorted(r["alert"] for r in rules)) == tuple(sorted(ALERTS))
    assert all("host" in r["expr"] or r["alert"] == "OomSentinelDown" for r in rules)


def _readme_scrape_config() -> dict[str, Any]:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")
    section = readme[readme.index("## For a farm") :]
    block = section[section.index("```yaml\n") + 8 :]
    return yaml.safe_load(block[: block.index("```")])


@needs_promtool
def test_the_readmes_scrape_config_is_valid_prometheus_config(tmp_path: Path) -> None:
    config = _readme_scrape_config()
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "oom-sentinel" and job["honor_labels"] is True
    token = tmp_path / "token"
    token.write_text("t" * 40)
    job["authorization"]["credentials_file"] = str(token)
    config["rule_files"] = [str(RULES_FILE)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout + done.stderr
    # the relabelling gives `host` as the rules' tests assume: the target's name, no port
    (relabel,) = job["relabel_configs"]
    assert re.fullmatch(relabel["regex"], "gpu-01:9866").group(1) == "gpu-01"  # type: ignore[union-attr]
