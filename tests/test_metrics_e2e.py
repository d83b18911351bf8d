"""The metrics the README documents are recorded by the running daemon: ``oom-sentinel run``
watches the stand-in, real prompts run (one succeeds, one runs out of VRAM), the OOM's alert is
delivered to a real webhook receiver, and ``/metrics`` is scraped over HTTP."""

from __future__ import annotations

import json
import urllib.request

import pytest
from daemon_harness import Daemon, wait_for
from prometheus_client.parser import text_string_to_metric_families
from standin_proc import start_standin
from test_watch_e2e import make_install
from webhook_receiver import Receiver

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.daemon.alerts.notifiers import url_channel_id
from oom_sentinel.daemon.probes.fake_gpu import FakeDevice, FakeGpuDir

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(m: Samples, name: str, **labels: str) -> float | None:
    return m.get((name, tuple(sorted(labels.items()))))


def test_the_running_daemon_records_prompt_alert_and_worker_metrics(tmp_path) -> None:
    gpu = FakeGpuDir(tmp_path / "gpu").create([FakeDevice(0, "NVIDIA RTX 4060", 8192 * MIB)])
    install = make_install(tmp_path / "ComfyUI")  # recognised as ComfyUI: its pid is known
    srv = start_standin(
        tmp_path / "base", code_dir=install, base_directory=False, fake_gpu=gpu.root
    )
    receiver = Receiver()
    hook = receiver.url()
    port = free_port()
    daemon = Daemon(
        tmp_path,
        comfyui=[srv.url],
        config=(
            "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 500\n"
            f'[metrics]\nenabled = true\nlisten = "127.0.0.1:{port}"\n'
            f"[alerts]\nurls = {json.dumps([hook])}\nretry_initial_s = 1\n"
        ),
        env={"OOM_SENTINEL_FAKE_GPU": str(gpu.root)},
    )
    try:
        daemon.start()
        wait_for(lambda: "is up" in daemon.stderr(), 30, "the API")
        instance = next(
            line.split("ComfyUI ", 1)[1].split(" API", 1)[0].strip("'")
            for line in daemon.stderr().splitlines()
            if " API at " in line and "is up" in line
        )
        ok = {
            "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 256}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }
        oom = {
            "1": {"class_type": "AllocateVRAM", "inputs": {"mib": 64 * 1024}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        }
        for prompt in (ok, oom):
            srv.post_prompt(prompt)
        wait_for(lambda: receiver.requests, 60, f"the alert; daemon:\n{daemon.stderr()}")

        def recorded() -> Samples | None:
            m = scrape(port)
            sent = value(m, "oom_sentinel_alerts_sent_total", channel=url_channel_id(hook))
            oom_runs = value(m, "oom_sentinel_prompts_total", instance=instance, outcome="oom")
            return m if sent == 1 and oom_runs == 1 else None

        m = wait_for(recorded, 30, "the prompt and alert metrics")
        assert value(m, "oom_sentinel_prompts_total", instance=instance, outcome="success") == 1
        assert value(m, "oom_sentinel_prompt_duration_seconds_count", instance=instance) == 2
        # the peaks of the runs table: what the timeline measured (the fake GPU showed both)
        from oom_sentinel.daemon.store.db import Store
        from oom_sentinel.daemon.store.runs import list_runs

        store = Store.open_existing(daemon.data_dir)
        assert store is not None
        with store:
            runs = list_runs(store, instance=instance)
        for metric, field in (
            ("oom_sentinel_prompt_peak_vram_bytes_count", "peak_vram_bytes"),
            ("oom_sentinel_prompt_peak_ram_bytes_count", "peak_rss_bytes"),
        ):
            measured = sum(getattr(r, field) is not None for r in runs)
            assert (value(m, metric, instance=instance) or 0) == measured, (metric, runs)
        assert any(r.peak_vram_bytes for r in runs), runs
        assert value(m, "oom_sentinel_incidents_total", instance=instance, pool="gpu") == 1
        for worker in ("scheduler", "alerts", "api", "process", "install-state", "metrics"):
            assert value(m, "oom_sentinel_worker_up", worker=worker) == 1, worker
        assert value(m, "oom_sentinel_alerts_pending") == 0
        assert daemon.stop() == 0
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        srv.kill()
        receiver.close()
