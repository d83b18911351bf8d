"""Snapshots in one bucket, against a real S3-protocol server (moto's standalone server) on
127.0.0.1: uploads through the alert outbox (retried, kept across restarts, never sent to a
notifier), and ``snapshots list|show --from`` reading the fleet's incidents back."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from click.testing import CliRunner
from daemon_harness import Daemon, append, cuda_oom_record, noise_lines, snapshot_dirs, wait_for
from s3_server import aws_env, free_port, s3_server

from oom_sentinel.config.settings import FleetSettings, Settings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.alerts.notifiers import LogChannel
from oom_sentinel.daemon.alerts.outbox import PENDING, SENT
from oom_sentinel.daemon.cli.main import main
from oom_sentinel.daemon.fleet.bucket import (
    UPLOAD_KIND,
    Bucket,
    BucketChannel,
    BucketError,
    BucketUrl,
    upload_item,
)
from oom_sentinel.daemon.incidents.snapshot import SnapshotRef, write_snapshot
from oom_sentinel.daemon.store.db import Store

BUCKET = "gpu-farm"
URL = f"s3://{BUCKET}/oom"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("moto")
    with s3_server(tmp / "moto.log") as url:
        yield url


@pytest.fixture
def s3(endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh empty bucket on the server, and a raw client to look into it."""
    for key, value in aws_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    existing = {b["Name"] for b in client.list_buckets()["Buckets"]}
    if BUCKET in existing:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for item in page.get("Contents", ()):
                client.delete_object(Bucket=BUCKET, Key=item["Key"])
    else:
        client.create_bucket(Bucket=BUCKET)
    return client


def _keys(client: Any) -> list[str]:
    page = client.list_objects_v2(Bucket=BUCKET)
    return sorted(item["Key"] for item in page.get("Contents", ()))


def _fleet(endpoint: str, host: str = "gpu-01") -> FleetSettings:
    return FleetSettings(bucket_url=URL, endpoint_url=endpoint, host=host)


def _snapshot(tmp_path: Path, **changes: Any) -> SnapshotRef:
    return write_snapshot(tmp_path / "data" / "snapshots", samples.content(**changes))


SECRET = "hf_SeedHuggingFaceToken0123456789abcd"


def test_an_upload_puts_every_file_under_host_and_instance(
    tmp_path: Path, endpoint: str, s3: Any
) -> None:
    ref = _snapshot(tmp_path, log_text=f"HF_TOKEN={SECRET}\n{samples.LOG_TEXT}")
    channel = BucketChannel(_fleet(endpoint))
    item = upload_item(
        _fleet(endpoint), snapshot_id=ref.id, path=ref.path, instance="main", created_s=1.0
    )
    assert item.kind == UPLOAD_KIND and item.key == f"upload:{ref.id}"
    result = channel.send(item)
    assert result.ok, result.detail
    files = sorted(p.name for p in ref.path.iterdir())
    assert _keys(s3) == [f"oom/gpu-01/main/{ref.id}/{name}" for name in files]
    for name in files:  # byte for byte what the daemon wrote (already redacted)
        body = s3.get_object(Bucket=BUCKET, Key=f"oom/gpu-01/main/{ref.id}/{name}")["Body"]
        uploaded = body.read()
        assert uploaded == (ref.path / name).read_bytes()
        assert SECRET.encode() not in uploaded  # redacted before it ever left the box
    assert channel.send(item).ok  # a repeat writes the same keys: nothing doubles
    assert len(_keys(s3)) == len(files)


def test_snapshot_json_is_uploaded_last(
    tmp_path: Path, endpoint: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that sees snapshot.json sees the whole snapshot: it goes up last, and an
    upload that fails half-way leaves no snapshot.json behind."""
    ref = _snapshot(tmp_path)
    channel = BucketChannel(_fleet(endpoint))
    item = upload_item(
        _fleet(endpoint), snapshot_id=ref.id, path=ref.path, instance="main", created_s=1.0
    )
    real_put = Bucket.put_file
    order: list[str] = []

    def put_then_fail(self: Bucket, key: str, path: Path) -> None:
        if key.endswith("/timeline.csv"):
            raise BucketError(f"{self.url}: cannot upload {key}: the connection broke")
        order.append(key.rsplit("/", 1)[1])
        real_put(self, key, path)

    monkeypatch.setattr(Bucket, "put_file", put_then_fail)
    result = channel.send(item)
    assert not result.ok and "the connection broke" in result.detail
    assert not any(k.endswith("/snapshot.json") for k in _keys(s3))
    monkeypatch.setattr(Bucket, "put_file", real_put)
    order.clear()
    monkeypatch.setattr(
        Bucket, "put_file", lambda self, key, path: (order.append(key), real_put(self, key, path))
    )
    assert channel.send(item).ok
    assert order[-1].endswith("/snapshot.json") and len(order) == len(list(ref.path.iterdir()))


def test_uploads_are_retried_and_survive_a_restart(
    tmp_path: Path, endpoint: str, s3: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ref = _snapshot(tmp_path)
    data_dir = tmp_path / "data"
    settings = Settings()
    now = {"t": 1000.0}
    dead = _fleet(f"http://127.0.0.1:{free_port()}")  # the bucket is unreachable
    store = Store.open(data_dir)
    dispatcher = AlertDispatcher(
        store, settings, [LogChannel()], clock=lambda: now["t"], upload_channel=BucketChannel(dead)
    )
    item = upload_item(dead, snapshot_id=ref.id, path=ref.path, instance="main", created_s=1000.0)
    assert dispatcher.queue_upload(item) is True
    assert dispatcher.queue_upload(item) is False  # queued once
    (result,) = dispatcher.deliver_now()
    assert not result.ok and "cannot upload" in result.detail
    (row,) = dispatcher.outbox.rows()
    assert (row.state, row.attempts) == (PENDING, 1)
    store.close()

    # the daemon restarts; the bucket is back (same bucket URL: the same outbox channel)
    now["t"] += 3600
    store = Store.open(data_dir)
    alive = BucketChannel(_fleet(endpoint))
    assert alive.id == BucketChannel(dead).id
    dispatcher = AlertDispatcher(
        store, settings, [LogChannel()], clock=lambda: now["t"], upload_channel=alive
    )
    with caplog.at_level(logging.INFO, logger="oom_sentinel.alerts"):
        (result,) = dispatcher.deliver_now()
    assert result.ok, result.detail
    (row,) = dispatcher.outbox.rows()
    assert row.state == SENT
    assert f"oom/gpu-01/main/{ref.id}/snapshot.json" in _keys(s3)
    assert "ALERT" not in caplog.text  # the upload never went to a notifier
    store.close()


def test_alerts_never_go_to_the_bucket(tmp_path: Path, endpoint: str, s3: Any) -> None:
    ref = _snapshot(tmp_path)
    store = Store.open(tmp_path / "data")
    try:
        dispatcher = AlertDispatcher(
            store, Settings(), [LogChannel()], upload_channel=BucketChannel(_fleet(endpoint))
        )
        alerts = dispatcher.on_incident_written(samples.incident(), ref)
        assert alerts
        dispatcher.deliver_now()
        rows = dispatcher.outbox.rows()
        assert {r.channel for r in rows} == {"log"}
        assert _keys(s3) == []
    finally:
        store.close()


# --- reading the fleet back ---------------------------------------------------------------


def _upload(tmp_path: Path, endpoint: str, host: str, instance: str, **changes: Any) -> str:
    ref = write_snapshot(
        tmp_path / host / "snapshots", samples.content(instance=instance, **changes)
    )
    fleet = _fleet(endpoint, host)
    item = upload_item(fleet, snapshot_id=ref.id, path=ref.path, instance=instance, created_s=1)
    assert BucketChannel(fleet).send(item).ok
    return ref.id


def _cli(tmp_path: Path, *args: str) -> Any:
    config = tmp_path / "empty.toml"
    config.write_text("")
    return CliRunner().invoke(main, [*args, "--config", str(config)], catch_exceptions=False)


def test_list_and_show_read_the_fleet(tmp_path: Path, endpoint: str, s3: Any) -> None:
    first = _upload(tmp_path, endpoint, "gpu-01", "main")
    later = _upload(tmp_path, endpoint, "gpu-02", "flux", at=samples.T0 + 60, node_type="VAEDecode")
    s3.put_object(Bucket=BUCKET, Key="oom/gpu-03/main/20260101T000000Z_gpu_x/log.txt", Body=b"")

    result = _cli(
        tmp_path, "snapshots", "list", "--from", URL, "--endpoint-url", endpoint, "--json"
    )
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)
    # newest first; the half-uploaded one (no snapshot.json) is not listed
    assert [(e["host"], e["instance"], e["id"]) for e in entries] == [
        ("gpu-02", "flux", later),
        ("gpu-01", "main", first),
    ]
    assert entries[0]["node_type"] == "VAEDecode" and entries[0]["pool"] == "gpu"
    assert entries[1]["path"] == f"{URL}/gpu-01/main/{first}"

    table = _cli(tmp_path, "snapshots", "list", "--from", URL, "--endpoint-url", endpoint)
    assert table.exit_code == 0
    assert f"gpu-01/main/{first}" in table.output and "VAEDecode" in table.output

    shown = _cli(
        tmp_path, "snapshots", "show", f"gpu-02/flux/{later}", "--from", URL,
        "--endpoint-url", endpoint,
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("From gpu-02, instance flux\n")
    assert f"Files in {URL}/gpu-02/flux/{later}" in shown.output
    assert "What to try" in shown.output and "/tmp" not in shown.output.split("Files in")[1][:80]

    as_json = _cli(
        tmp_path, "snapshots", "show", first[:16], "--from", URL, "--endpoint-url", endpoint,
        "--json",
    )  # fmt: skip
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["id"] == first


def test_ambiguous_and_missing_remote_ids_are_one_line(
    tmp_path: Path, endpoint: str, s3: Any
) -> None:
    same = _upload(tmp_path, endpoint, "gpu-01", "main")
    assert _upload(tmp_path, endpoint, "gpu-02", "main") == same  # the same moment on two boxes
    both = _cli(tmp_path, "snapshots", "show", same, "--from", URL, "--endpoint-url", endpoint)
    assert both.exit_code != 0
    assert both.output.strip() == (
        f"oom-sentinel: error: {same!r} matches 2 snapshots in {URL}: gpu-02/main/{same}, "
        f"gpu-01/main/{same}; give HOST/INSTANCE/ID"
    )
    none = _cli(tmp_path, "snapshots", "show", "2030", "--from", URL, "--endpoint-url", endpoint)
    assert none.output.strip() == f"oom-sentinel: error: no snapshot '2030' in {URL}"


def test_an_unreachable_bucket_or_bad_url_is_one_line(tmp_path: Path, s3: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = _cli(tmp_path, "snapshots", "list", "--from", URL, "--endpoint-url", dead)
    assert result.exit_code != 0
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"oom-sentinel: error: {URL}: cannot list oom/: ")
    bad = _cli(tmp_path, "snapshots", "list", "--from", "https://example.org/x")
    assert bad.output.strip() == (
        "oom-sentinel: error: 'https://example.org/x': not a bucket URL (expected "
        "s3://BUCKET[/PREFIX])"
    )


def test_the_bucket_url_needs_no_credentials_in_it() -> None:
    assert BucketUrl.parse("s3://b/a/b/") == BucketUrl("b", "a/b")
    assert str(BucketUrl.parse("s3://b")) == "s3://b"
    from oom_sentinel.config.settings import parse_settings
    from oom_sentinel.daemon.core.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_settings({"fleet": {"bucket_url": "s3://KEY:SECRET@b/x"}}, "config.toml")
    assert "SECRET" not in str(info.value)
    assert str(info.value).startswith("config.toml: fleet.bucket_url: must be s3://BUCKET")


# --- the daemon, end to end ---------------------------------------------------------------

T0 = datetime(2026, 11, 30, 10, 0, 0)


def _daemon_config(endpoint: str) -> str:
    return (
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 200\n"
        "[alerts]\nretry_initial_s = 1\nretry_max_interval_s = 1\n"
        f'[fleet]\nbucket_url = "{URL}"\nendpoint_url = "{endpoint}"\nhost = "gpu-07"\n'
    )


@pytest.mark.timeout(180)
def test_the_daemon_uploads_each_snapshot_even_across_a_restart(
    tmp_path: Path, endpoint: str, s3: Any
) -> None:
    log = tmp_path / "user" / "comfyui.log"
    log.parent.mkdir()
    log.write_text(noise_lines(T0, 5))
    env = aws_env(tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    daemon = Daemon(tmp_path, logs=[log], config=_daemon_config(down), env=env).start()
    try:
        append(log, cuda_oom_record(T0 + timedelta(seconds=2)))
        (snap,) = wait_for(lambda: snapshot_dirs(daemon.data_dir), 30, "the snapshot")
        wait_for(lambda: "cannot upload" in daemon.stderr(), 30, "a failed upload try")
    finally:
        assert daemon.stop() == 0
    assert _keys(s3) == []

    daemon.config.write_text(_daemon_config(endpoint))  # the bucket is reachable again
    daemon.start()
    try:
        key = f"oom/gpu-07/{replace_unsafe(snap)}/{snap.name}/snapshot.json"
        wait_for(lambda: key in _keys(s3), 30, f"{key} in the bucket")
        names = {k.rsplit("/", 1)[1] for k in _keys(s3)}
        assert names == {p.name for p in snap.iterdir()}
    finally:
        assert daemon.stop() == 0


def replace_unsafe(snap: Path) -> str:
    """The instance part of the key: the snapshot's instance name, made key-safe."""
    from oom_sentinel.daemon.incidents.snapshot import _sanitize

    data = json.loads((snap / "snapshot.json").read_text())
    return _sanitize(data["instance"]["name"] or "unknown", 64)


def test_a_bucket_without_boto3_is_a_clear_retryable_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_boto3(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "boto3" or name.startswith("botocore"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_boto3)
    ref = _snapshot(tmp_path)
    fleet = FleetSettings(bucket_url=URL)
    result = BucketChannel(fleet).send(
        upload_item(fleet, snapshot_id=ref.id, path=ref.path, instance="main", created_s=1)
    )
    assert not result.ok
    assert result.detail == "boto3 is not installed (pip install 'oom-sentinel[fleet]')"
    with pytest.raises(Exception, match="boto3 is not installed"):
        Bucket(BucketUrl.parse(URL))


@pytest.mark.timeout(180)
def test_at_start_the_daemon_catches_up_what_a_crash_left_unqueued(
    tmp_path: Path, endpoint: str, s3: Any
) -> None:
    """Killed between writing a snapshot and queueing its upload: the next start queues it
    (and names it in the metrics again); a snapshot older than retry_max_age_s is left."""
    import time
    import urllib.request

    snaps = tmp_path / "data" / "snapshots"
    fresh = write_snapshot(snaps, samples.content(at=time.time() - 120, node_type="VAEDecode"))
    stale = write_snapshot(snaps, samples.content(at=time.time() - 3 * 86400))
    token = tmp_path / "token"
    token.write_text("t" * 32)
    port = free_port()
    config = _daemon_config(endpoint) + (f'listen = "127.0.0.1:{port}"\ntoken_file = "{token}"\n')
    daemon = Daemon(tmp_path, config=config, env=aws_env(tmp_path)).start()
    try:
        key = f"oom/gpu-07/main/{fresh.id}/snapshot.json"
        wait_for(lambda: key in _keys(s3), 30, f"{key} in the bucket")
        assert not any(stale.id in k for k in _keys(s3))
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {'t' * 32}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            text = resp.read().decode()
        (line,) = [
            ln for ln in text.splitlines() if ln.startswith("oom_sentinel_last_incident_timestamp")
        ]
        assert f'snapshot="{fresh.id}"' in line and 'node="VAEDecode"' in line
        assert float(line.rsplit(" ", 1)[1]) == pytest.approx(fresh.created_s, abs=1)
    finally:
        assert daemon.stop() == 0
