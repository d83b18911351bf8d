"""Metrics for a farm: the [fleet] listener behind a bearer token or mTLS, scraped over real
HTTP(S) on 127.0.0.1 with certificates made by the real openssl, and labels that never grow
with prompts or processes."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import snapshot_samples as samples
from prometheus_client.parser import text_string_to_metric_families

from oom_sentinel.config.settings import FleetSettings, MetricsSettings, parse_settings
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.fleet.metrics import MetricsExporter
from oom_sentinel.daemon.probes.base import GpuProcessSample, MemorySample, ProcessTreeSample

TOKEN = "f" * 40


def _exporter(tmp_path: Path, **fleet: str) -> MetricsExporter:
    return MetricsExporter(
        MetricsSettings(enabled=True),
        fleet=FleetSettings(listen="127.0.0.1:0", **fleet),
        version="9.9",
    )


def _get(url: str, *, token: str | None = None, context: ssl.SSLContext | None = None) -> str:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10, context=context) as resp:
        return resp.read().decode()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def test_a_non_loopback_listen_needs_a_token_or_mtls() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"fleet": {"listen": "0.0.0.0:9866"}}, "config.toml")
    assert str(info.value) == (
        "config.toml: fleet: listen: a non-loopback /metrics needs token_file (a bearer "
        "token) or tls_client_ca_file (mTLS)"
    )
    ok = parse_settings(
        {"fleet": {"listen": "0.0.0.0:9866", "token_file": "/etc/oom-sentinel/token"}}, "c"
    )
    assert ok.fleet.listen == "0.0.0.0:9866"
    # the loopback-only [metrics] listen stays loopback-only
    with pytest.raises(ConfigError):
        parse_settings({"metrics": {"listen": "0.0.0.0:9866"}}, "config.toml")


def test_the_token_guards_the_farm_listener(tmp_path: Path, token_file: Path) -> None:
    exporter = _exporter(tmp_path, token_file=str(token_file))
    exporter.observe_soft_oom("main")
    host, port = exporter.start()
    url = f"http://{host}:{port}/metrics"
    try:
        for wrong in (None, "x" * 40, TOKEN[:-1]):
            with pytest.raises(urllib.error.HTTPError) as info:
                _get(url, token=wrong)
            assert info.value.code == 401
            assert info.value.headers["WWW-Authenticate"].startswith("Bearer")
            assert TOKEN not in info.value.read().decode()
        text = _get(url, token=TOKEN)
        assert 'oom_sentinel_soft_ooms_total{instance="main"} 1.0' in text
    finally:
        exporter.stop()


@pytest.mark.parametrize("content", ["", "short"], ids=["empty", "short"])
def test_an_unusable_token_file_is_one_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        _exporter(tmp_path, token_file=str(path)).start()
    assert str(info.value).startswith(f"fleet.token_file: {path} holds {len(content)} characters")
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError) as info:
        _exporter(tmp_path, token_file=str(missing)).start()
    assert str(info.value) == f"fleet.token_file: cannot read {missing}: No such file or directory"


# --- mTLS with certificates from the real openssl ------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key_and_csr(cwd: Path, name: str, cn: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd,
    )  # fmt: skip


def _sign(cwd: Path, name: str, ca: str, ext: str) -> None:
    (cwd / f"{name}.ext").write_text(ext + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


def _ca(cwd: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make test certificates)")
    d = tmp_path / "pki"
    d.mkdir()
    _ca(d, "ca")
    _ca(d, "other-ca")
    _key_and_csr(d, "server", "127.0.0.1")
    _sign(d, "server", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    _key_and_csr(d, "prometheus", "prometheus")
    _sign(d, "prometheus", "ca", "extendedKeyUsage=clientAuth")
    _key_and_csr(d, "intruder", "intruder")
    _sign(d, "intruder", "other-ca", "extendedKeyUsage=clientAuth")
    return d


def _client(pki: Path, cert: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert is not None:
        context.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    return context


def test_mtls_serves_only_scrapers_with_a_certificate_from_the_ca(
    tmp_path: Path, pki: Path
) -> None:
    exporter = _exporter(
        tmp_path,
        tls_cert_file=str(pki / "server.pem"),
        tls_key_file=str(pki / "server.key"),
        tls_client_ca_file=str(pki / "ca.pem"),
    )
    exporter.observe_soft_oom("main")
    host, port = exporter.start()
    url = f"https://{host}:{port}/metrics"
    try:
        text = _get(url, context=_client(pki, "prometheus"))
        assert 'oom_sentinel_soft_ooms_total{instance="main"} 1.0' in text
        for cert in (None, "intruder"):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                _get(url, context=_client(pki, cert))
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            _get(f"http://{host}:{port}/metrics")  # plain HTTP on the TLS port
        # the listener survived the refused handshakes
        assert "oom_sentinel_build_info" in _get(url, context=_client(pki, "prometheus"))
    finally:
        exporter.stop()


def test_tls_and_token_together(tmp_path: Path, pki: Path, token_file: Path) -> None:
    exporter = _exporter(
        tmp_path,
        token_file=str(token_file),
        tls_cert_file=str(pki / "server.pem"),
        tls_key_file=str(pki / "server.key"),
    )
    host, port = exporter.start()
    url = f"https://{host}:{port}/metrics"
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(url, context=_client(pki, None))
        assert info.value.code == 401
        assert "oom_sentinel_build_info" in _get(url, token=TOKEN, context=_client(pki, None))
    finally:
        exporter.stop()


def test_a_bad_certificate_is_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "cert.pem"
    bogus.write_text("not a certificate")
    exporter = _exporter(
        tmp_path, tls_cert_file=str(bogus), tls_key_file=str(bogus), tls_client_ca_file=str(bogus)
    )
    with pytest.raises(ConfigError) as info:
        exporter.start()
    assert str(info.value).startswith("fleet.tls_cert_file/tls_key_file: cannot load ")


# --- cardinality ----------------------------------------------------------------------------

#: labels whose values change per prompt or per process: never a label of a served series
HIGH_CARDINALITY = {"pid", "prompt_id", "prompt", "client_id", "root_pid"}


def _series(exporter: MetricsExporter) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    from prometheus_client import generate_latest

    text = generate_latest(exporter.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _churn(exporter: MetricsExporter, generation: int) -> None:
    """A ComfyUI restart (new pids) and a hundred prompts, as the daemon reports them."""
    pid = 10_000 + generation
    exporter.observe_sample(
        MemorySample(
            samples.T0 + generation,
            samples.memory().gpus,
            (
                GpuProcessSample(pid=pid, device_index=0, used_bytes=20 * 2**30, name="python"),
                GpuProcessSample(pid=pid + 1, device_index=0, used_bytes=2**30, name="python"),
            ),
            samples.memory().host,
            (ProcessTreeSample(root_pid=pid, rss_bytes=9 * 2**30, process_count=2),),
        ),
        watched={pid: "main", pid + 1: "main"},
    )
    for n in range(100):
        exporter.observe_prompt(
            "main",
            "success" if n % 7 else "oom",
            peak_vram_bytes=(10 + n % 9) * 2**30,
            peak_ram_bytes=8 * 2**30,
            duration_s=float(n),
        )


def test_pids_and_prompt_ids_never_become_series() -> None:
    exporter = MetricsExporter(MetricsSettings(listen="127.0.0.1:0"), version="9.9")
    exporter.observe_incident(samples.incident())
    exporter.observe_soft_oom("main")
    _churn(exporter, 1)
    first = _series(exporter)
    for generation in range(2, 6):
        _churn(exporter, generation)
    later = _series(exporter)
    labels = {name for _, pairs in later for name, _ in pairs}
    assert not labels & HIGH_CARDINALITY, labels & HIGH_CARDINALITY
    # five restarts and 500 prompts later: the same series, no new ones
    assert later == first
    procs = [s for s in later if s[0] == "oom_sentinel_gpu_process_memory_bytes"]
    assert procs == [
        (
            "oom_sentinel_gpu_process_memory_bytes",
            (("gpu", "0"), ("instance", "main"), ("process", "python")),
        )
    ]
    assert exporter.registry.get_sample_value(
        "oom_sentinel_gpu_process_memory_bytes",
        {"gpu": "0", "instance": "main", "process": "python"},
    ) == float(21 * 2**30)  # the two processes, summed


def test_only_the_latest_incident_per_instance_names_its_snapshot() -> None:
    exporter = MetricsExporter(MetricsSettings(listen="127.0.0.1:0"), clock=lambda: 1000.0)
    incident = samples.incident()
    for n in range(20):
        exporter.observe_snapshot(replace(incident, id=f"i{n}"), f"snap-{n}")
    exporter.observe_snapshot(replace(incident, instance="other"), "snap-x", regression=True)
    last = sorted(s for s in _series(exporter) if s[0].startswith("oom_sentinel_last_incident"))
    assert [dict(pairs)["snapshot"] for _, pairs in last] == ["snap-19", "snap-x"]
    assert dict(last[1][1])["regression"] == "true"
    assert dict(last[0][1])["node"] == (incident.node_type or "")


# --- the daemon, end to end -----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_daemon_serves_the_farm_listener_and_names_each_snapshot(
    tmp_path: Path, token_file: Path
) -> None:
    from datetime import datetime, timedelta

    from daemon_harness import Daemon, append, cuda_oom_record, noise_lines, snapshot_dirs, wait_for
    from s3_server import free_port

    port = free_port()
    log = tmp_path / "user" / "comfyui.log"
    log.parent.mkdir()
    t0 = datetime(2026, 11, 30, 10, 0, 0)
    log.write_text(noise_lines(t0, 5))
    config = (
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 200\n"
        # [metrics] stays off: [fleet] listen is the opt-in
        f'[fleet]\nlisten = "127.0.0.1:{port}"\ntoken_file = "{token_file}"\n'
    )
    daemon = Daemon(tmp_path, logs=[log], config=config).start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(url)
        assert info.value.code == 401
        append(log, cuda_oom_record(t0 + timedelta(seconds=2)))
        (snap,) = wait_for(lambda: snapshot_dirs(daemon.data_dir), 30, "the snapshot")

        def named() -> bool:
            return f'snapshot="{snap.name}"' in _get(url, token=TOKEN)

        wait_for(named, 30, "the snapshot in the scrape")
        text = _get(url, token=TOKEN)
        assert "oom_sentinel_last_incident_timestamp_seconds{" in text
        assert TOKEN not in daemon.stderr()
    finally:
        assert daemon.stop() == 0
