"""Alert channels: apprise over real HTTP, the log, the Event Log seam, the desktop feed --
and no secret of an apprise URL in any log line or error."""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from webhook_receiver import serve

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.config.settings import Settings, parse_settings
from oom_sentinel.daemon.alerts.format import sample_alert
from oom_sentinel.daemon.alerts.notifiers import (
    AppriseChannel,
    EventLogChannel,
    FeedChannel,
    LogChannel,
    build_channels,
    describe_url,
    feed_path,
    read_feed,
    send_all,
)
from oom_sentinel.daemon.alerts.policy import Alert
from oom_sentinel.daemon.core.errors import ConfigError

PASSWORD = "s3cr3tPassw0rd"
SEGMENT = "SEEKRITpathTOKEN42"


@pytest.fixture
def unused_port() -> int:
    return free_port()


def _alert(key: str = "incident:abc", severity: str = "critical") -> Alert:
    return Alert(
        key=key,
        kind="incident",
        severity=severity,
        title="OOM: GPU out of memory on main in KSampler",
        body="tried to allocate 2.00 GiB\nSnapshot: 20270115T080000Z_gpu_KSampler",
        created_s=1_800_000_000.0,
        instance="main",
        pool="gpu",
        snapshot_id="20270115T080000Z_gpu_KSampler",
    )


class RecordingServiceManager:
    """pywin32's servicemanager cannot exist here: records what the channel calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def SetEventSourceName(self, name: str) -> None:
        self.calls.append(("source", name))

    def LogErrorMsg(self, text: str) -> None:
        self.calls.append(("error", text))

    def LogWarningMsg(self, text: str) -> None:
        self.calls.append(("warning", text))

    def LogInfoMsg(self, text: str) -> None:
        self.calls.append(("info", text))


def test_apprise_json_webhook_receives_the_alert_over_http() -> None:
    with serve() as receiver:
        channel = AppriseChannel(receiver.url(auth=f"oom:{PASSWORD}", path=f"hook/{SEGMENT}"))
        result = channel.send(_alert())
        assert result.ok and result.detail == "sent"
        (request,) = receiver.received()
    payload = request.json()
    assert payload["title"] == "OOM: GPU out of memory on main in KSampler"
    assert "Snapshot: 20270115T080000Z_gpu_KSampler" in payload["message"]
    assert payload["type"] == "failure"
    assert request.path == f"/hook/{SEGMENT}"
    # the credentials really were used...
    auth = base64.b64decode(request.headers["Authorization"].split()[1]).decode()
    assert auth == f"oom:{PASSWORD}"
    # ...but the channel's name shows none of them
    assert PASSWORD not in channel.name and SEGMENT not in channel.name
    assert channel.name.startswith(f"json://127.0.0.1:{receiver.port} #")


def test_apprise_form_webhook_works_too() -> None:
    with serve() as receiver:
        result = AppriseChannel(receiver.url(scheme="form")).send(_alert(severity="warning"))
        assert result.ok
        (request,) = receiver.received()
    assert b"title=OOM" in request.body


def test_a_server_error_is_a_failed_send_with_a_reason() -> None:
    with serve([500]) as receiver:
        result = AppriseChannel(receiver.url()).send(_alert())
    assert not result.ok
    assert "500" in result.detail


def test_a_refused_connection_is_a_failed_send(unused_port: int) -> None:
    url = f"json://oom:{PASSWORD}@127.0.0.1:{unused_port}/{SEGMENT}"
    result = AppriseChannel(url).send(_alert())
    assert not result.ok
    assert PASSWORD not in result.detail and SEGMENT not in result.detail


@pytest.mark.parametrize(
    ("url", "hidden"),
    [
        (
            "discord://123456789012345678/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            ["AbCdEfGhIjKl", "1234567890"],
        ),
        ("tgram://123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/12315544", ["AAHdqTcvCH1v"]),
        ("ntfy://ntfy.sh/my-very-private-topic", ["my-very-private-topic"]),
        ("mailto://alice:hunter2pass@gmail.com", ["hunter2pass", "alice"]),
        ("json://u:pw-1234@example.org:8443/x?token=abcd1234", ["pw-1234", "abcd1234"]),
    ],
    ids=["discord", "telegram", "ntfy-topic", "mailto", "json-query"],
)
def test_channel_names_never_show_a_secret(url: str, hidden: list[str]) -> None:
    name = describe_url(url)
    for secret in hidden:
        assert secret not in name
    assert name.split("://")[0] == url.split("://")[0]


def test_an_unusable_url_is_a_config_error_without_the_secret() -> None:
    with pytest.raises(ConfigError) as info:
        AppriseChannel(f"nosuchservice://user:{PASSWORD}@host/{SEGMENT}", label="alerts.urls[1]")
    message = str(info.value)
    assert message.startswith("alerts.urls[1]: apprise cannot use nosuchservice://")
    assert PASSWORD not in message and SEGMENT not in message


def test_no_log_record_of_apprise_requests_or_urllib3_holds_a_secret(
    caplog: pytest.LogCaptureFixture, unused_port: int
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("apprise", "urllib3", "requests"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        with serve([500, 200]) as receiver:
            good = AppriseChannel(receiver.url(auth=f"oom:{PASSWORD}", path=f"api/{SEGMENT}"))
            assert not good.send(_alert()).ok
            assert good.send(_alert()).ok
        down = AppriseChannel(f"json://oom:{PASSWORD}@127.0.0.1:{unused_port}/{SEGMENT}")
        assert not down.send(_alert()).ok
    finally:
        for name in ("apprise", "urllib3", "requests"):
            logging.getLogger(name).setLevel(logging.NOTSET)
    # The daemon's handlers sit on the root logger; the libraries' records reach it only
    # through the scrubbing bridge. (pytest also hooks non-propagating loggers directly:
    # those raw records are the ones the daemon never sees, so they are left out here.)
    for name in ("apprise", "urllib3", "requests"):
        assert logging.getLogger(name).propagate is False
    records = [r for r in caplog.records if r.name.startswith("oom_sentinel.")]
    text = "\n".join(r.getMessage() for r in records)
    assert "oom_sentinel.notify.apprise" in {r.name for r in records}
    assert "127.0.0.1" in text  # the logs are there...
    assert PASSWORD not in text and SEGMENT not in text  # ...without the secrets
    assert base64.b64encode(f"oom:{PASSWORD}".encode()).decode() not in text


def test_log_channel_logs_the_alert(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="oom_sentinel.alerts")
    result = LogChannel().send(_alert())
    assert result.ok
    (record,) = [r for r in caplog.records if r.name == "oom_sentinel.alerts"]
    assert record.levelno == logging.WARNING
    assert "ALERT [critical] OOM: GPU out of memory on main in KSampler" in record.getMessage()
    assert "    Snapshot: 20270115T080000Z_gpu_KSampler" in record.getMessage()


@pytest.mark.parametrize(
    ("severity", "call"),
    [("critical", "error"), ("warning", "warning"), ("info", "info")],
    ids=["critical", "warning", "info"],
)
def test_event_log_channel_writes_one_entry_per_alert(severity: str, call: str) -> None:
    sm = RecordingServiceManager()
    channel = EventLogChannel(sm)
    assert channel.send(_alert(severity=severity)).ok
    assert channel.send(_alert("k2", severity=severity)).ok
    assert sm.calls[0] == ("source", "oom-sentinel")
    assert [c[0] for c in sm.calls[1:]] == [call, call]
    assert sm.calls[1][1].startswith("OOM: GPU out of memory on main in KSampler\n\n")


def test_event_log_failure_is_a_failed_send() -> None:
    class Broken(RecordingServiceManager):
        def LogErrorMsg(self, text: str) -> None:
            raise OSError("event log is full")

    result = EventLogChannel(Broken()).send(_alert())
    assert not result.ok and "event log is full" in result.detail


def test_feed_keeps_the_last_entries_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "run" / "feed.json"
    channel = FeedChannel(path, max_entries=3)
    for n in range(5):
        assert channel.send(_alert(f"k{n}")).ok
    assert channel.send(_alert("k4")).ok  # a retry of the same alert is not a second entry
    entries = read_feed(path)
    assert [e["id"] for e in entries] == ["k2", "k3", "k4"]
    assert entries[-1]["snapshot_id"] == "20270115T080000Z_gpu_KSampler"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["feed.json"]  # no temp file left


def test_feed_path_prefers_config_then_runtime_dir_then_data_dir(tmp_path: Path) -> None:
    settings = parse_settings({"data_dir": str(tmp_path / "data")}, "t")
    assert feed_path(settings, {}) == tmp_path / "data" / "feed.json"
    assert feed_path(settings, {"RUNTIME_DIRECTORY": "/run/oom-sentinel"}) == Path(
        "/run/oom-sentinel/feed.json"
    )
    configured = parse_settings({"alerts": {"desktop_feed_path": str(tmp_path / "f.json")}}, "t")
    assert feed_path(configured, {"RUNTIME_DIRECTORY": "/run/x"}) == tmp_path / "f.json"


def test_build_channels_from_settings(tmp_path: Path) -> None:
    with serve() as receiver:
        url = receiver.url()
        settings = parse_settings(
            {"data_dir": str(tmp_path), "alerts": {"urls": [url, url]}}, "config.toml"
        )
        channels = build_channels(settings, environ={}, platform="linux")
        assert [c.id for c in channels][1:] == ["log", "feed"]
        assert channels[0].id.startswith("apprise:")
        windows = build_channels(
            settings, environ={}, platform="win32", servicemanager=RecordingServiceManager()
        )
        assert [c.id for c in windows][1:] == ["log", "eventlog", "feed"]
        results = send_all(channels, sample_alert(1.0))
        assert [r.ok for r in results] == [True, True, True]
        assert receiver.received()[0].json()["title"].startswith("TEST from oom-sentinel")


def test_build_channels_with_everything_off() -> None:
    settings = Settings.model_validate(
        {"alerts": {"log": False, "desktop_feed": False, "event_log": False}}
    )
    assert build_channels(settings, environ={}, platform="win32") == []


def test_send_all_reports_a_channel_that_raises() -> None:
    class Raising:
        id = "x"
        name = "x"

        def send(self, alert: Any) -> Any:
            raise RuntimeError(f"boom with json://user1:{PASSWORD}@h/x")

    (result,) = send_all([Raising()], _alert())
    assert not result.ok and "boom" in result.detail and PASSWORD not in result.detail


def test_feed_document_shape(tmp_path: Path) -> None:
    path = tmp_path / "feed.json"
    FeedChannel(path).send(_alert())
    doc = json.loads(path.read_text())
    assert doc["version"] == 1
    assert set(doc["entries"][0]) >= {"id", "kind", "severity", "title", "body", "created_s"}
