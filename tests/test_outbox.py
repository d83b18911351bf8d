"""The alert outbox: real SQLite, real HTTP. Retries with backoff, survives a restart, gives up
once, and the dispatcher turns a storm into one alert and one summary on the wire."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import snapshot_samples as samples
from webhook_receiver import Receiver, serve

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.config.settings import Settings, parse_settings
from oom_sentinel.daemon.alerts.dispatch import AlertDispatcher
from oom_sentinel.daemon.alerts.notifiers import AppriseChannel, LogChannel
from oom_sentinel.daemon.alerts.outbox import Outbox, OutboxSender, RetryPolicy
from oom_sentinel.daemon.alerts.policy import Alert
from oom_sentinel.daemon.incidents.snapshot import write_snapshot
from oom_sentinel.daemon.incidents.tracker import (
    CloseIncident,
    CountSoftOom,
    IncidentTracker,
    Observation,
    WriteSnapshot,
)
from oom_sentinel.daemon.store.db import Store

T0 = 1_800_000_000.0
SECRET = "t0pSecretHookToken"


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _alert(key: str = "incident:1", created: float = T0) -> Alert:
    return Alert(key, "incident", "critical", "OOM on main", "body", created, instance="main")


def _wait_for(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_retry_delays_double_up_to_the_cap() -> None:
    retry = RetryPolicy(initial_s=30, max_interval_s=200, max_age_s=3600)
    assert [retry.delay_s(n) for n in range(1, 6)] == [30, 60, 120, 200, 200]


def test_server_error_then_success_retries_with_backoff(tmp_path: Path) -> None:
    with serve([500, 500, 200]) as receiver, Store.open(tmp_path) as store:
        channel = AppriseChannel(receiver.url())
        outbox = Outbox(store, RetryPolicy(initial_s=30, max_interval_s=600, max_age_s=86400))
        assert outbox.enqueue(_alert(), [channel.id], T0) == 1
        channels = {channel.id: channel}

        (first,) = outbox.deliver_due(channels, T0)
        assert not first.ok
        (row,) = outbox.rows()
        assert (row.state, row.attempts, row.next_attempt_s) == ("pending", 1, T0 + 30)
        assert "500" in (row.last_error or "")
        assert outbox.deliver_due(channels, T0 + 29) == []  # not due yet: nothing sent

        (second,) = outbox.deliver_due(channels, T0 + 30)
        assert not second.ok
        assert outbox.rows()[0].next_attempt_s == T0 + 30 + 60  # doubled

        (third,) = outbox.deliver_due(channels, T0 + 90)
        assert third.ok
        assert [r.status for r in receiver.received(None)] == [500, 500, 200]
        (row,) = outbox.rows()
        assert (row.state, row.attempts, row.last_error) == ("sent", 3, None)
        assert outbox.deliver_due(channels, T0 + 10_000) == []
        assert outbox.counts() == {"pending": 0, "sent": 1, "given_up": 0}


def test_pending_alert_survives_a_restart(tmp_path: Path) -> None:
    port = free_port()
    url = f"json://127.0.0.1:{port}/hook/{SECRET}"
    store = Store.open(tmp_path)
    outbox = Outbox(store)
    channel = AppriseChannel(url)
    outbox.enqueue(_alert(), [channel.id], T0)
    (failed,) = outbox.deliver_due({channel.id: channel}, T0)  # the service is down
    assert not failed.ok
    store.close()

    # the daemon restarts with the same config; the notification service is back up
    with serve(port=port) as receiver, Store.open(tmp_path) as store:
        outbox = Outbox(store)
        (row,) = outbox.rows()
        assert row.state == "pending" and row.alert.title == "OOM on main"
        channel = AppriseChannel(url)
        (result,) = outbox.deliver_due({channel.id: channel}, T0 + 31)
        assert result.ok
        (request,) = receiver.received()
        assert request.json()["title"] == "OOM on main"
        assert outbox.rows()[0].state == "sent"


def test_give_up_after_max_age_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="oom_sentinel.alerts")
    with serve([500] * 100) as receiver, Store.open(tmp_path) as store:
        channel = AppriseChannel(receiver.url(path=f"hook/{SECRET}"))
        outbox = Outbox(store, RetryPolicy(initial_s=10, max_interval_s=40, max_age_s=100))
        outbox.enqueue(_alert(), [channel.id], T0)
        now = T0
        for _ in range(20):  # the loop keeps calling, long past the max age
            outbox.deliver_due({channel.id: channel}, now)
            now += 15
        (row,) = outbox.rows()
        assert row.state == "given_up"
        attempts = len(receiver.received(None))
    given_up = [r for r in caplog.records if "given up" in r.getMessage()]
    assert len(given_up) == 1
    message = given_up[0].getMessage()
    assert f"after {attempts} attempt(s)" in message and "500" in message
    assert SECRET not in "\n".join(r.getMessage() for r in caplog.records)


def test_alert_older_than_max_age_at_start_is_given_up_unsent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="oom_sentinel.alerts")
    with serve() as receiver, Store.open(tmp_path) as store:
        channel = AppriseChannel(receiver.url())
        outbox = Outbox(store, RetryPolicy(max_age_s=3600))
        outbox.enqueue(_alert(), [channel.id], T0)
        assert outbox.deliver_due({channel.id: channel}, T0 + 7200) == []
        assert receiver.received(None) == []
        assert outbox.rows()[0].state == "given_up"
    assert sum("given up" in r.getMessage() for r in caplog.records) == 1


def test_a_channel_removed_from_the_config_is_given_up(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        outbox = Outbox(store)
        outbox.enqueue(_alert(), ["apprise:gone"], T0)
        assert outbox.deliver_due({}, T0) == []
        (row,) = outbox.rows()
        assert row.state == "given_up" and row.last_error == "the channel is no longer configured"


def test_one_channel_down_does_not_resend_to_the_others(tmp_path: Path) -> None:
    with serve() as good, serve([503, 503]) as flaky, Store.open(tmp_path) as store:
        a, b = AppriseChannel(good.url()), AppriseChannel(flaky.url())
        outbox = Outbox(store, RetryPolicy(initial_s=5))
        outbox.enqueue(_alert(), [a.id, b.id], T0)
        channels = {a.id: a, b.id: b}
        for step in range(4):
            outbox.deliver_due(channels, T0 + step * 20)
        assert len(good.received()) == 1
        assert len(flaky.received()) == 1 and len(flaky.received(None)) == 3


def test_enqueue_is_idempotent_per_key_and_channel(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        outbox = Outbox(store)
        assert outbox.enqueue(_alert(), ["log", "feed"], T0) == 2
        assert outbox.enqueue(_alert(), ["log", "feed"], T0 + 1) == 0
        assert len(outbox.rows()) == 2


def test_sender_thread_delivers_when_woken_and_stops(tmp_path: Path) -> None:
    with serve() as receiver, Store.open(tmp_path) as store:
        channel = AppriseChannel(receiver.url())
        outbox = Outbox(store)
        sender = OutboxSender(outbox, {channel.id: channel}, idle_s=30)
        sender.start()
        try:
            assert sender.is_alive()
            outbox.enqueue(_alert(created=time.time()), [channel.id], time.time())
            sender.wake()
            _wait_for(lambda: len(receiver.received()) == 1)
        finally:
            assert sender.stop(timeout_s=10)
        assert not sender.is_alive()
        assert outbox.counts()["sent"] == 1


def test_prune_drops_old_finished_rows_only(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        outbox = Outbox(store)
        outbox.enqueue(_alert("a"), ["log"], T0)
        outbox.enqueue(_alert("b"), ["log"], T0)
        outbox.deliver_due({"log": LogChannel()}, T0)
        outbox.enqueue(_alert("c"), ["gone-later"], T0)
        assert outbox.prune(T0 + 40 * 86400) == 2
        assert [r.key for r in outbox.rows()] == ["c"]


# --- the dispatcher, end to end -------------------------------------------------------------


def _settings(tmp_path: Path, receiver: Receiver, **alerts: object) -> Settings:
    return parse_settings(
        {
            "data_dir": str(tmp_path / "data"),
            "alerts": {
                "urls": [receiver.url(path=f"hook/{SECRET}")],
                "desktop_feed": False,
                **alerts,
            },
        },
        "config.toml",
    )


def test_storm_is_one_alert_and_one_summary_on_the_wire(tmp_path: Path) -> None:
    clock = Clock()
    with serve() as receiver:
        settings = _settings(tmp_path, receiver)
        store = Store.open(settings.resolved_data_dir())
        channels = [AppriseChannel(u) for u in settings.alerts.urls]
        dispatcher = AlertDispatcher(store, settings, channels, clock=clock)
        tracker = IncidentTracker()
        snapshots = tmp_path / "data" / "snapshots"
        written = 0

        def run(actions: list[Any]) -> None:
            nonlocal written
            for action in actions:
                if isinstance(action, WriteSnapshot):
                    content = replace(
                        samples.content(at=action.incident.first_seen_s),
                        incident=action.incident,
                    )
                    dispatcher.handle(action, write_snapshot(snapshots, content))
                    written += 1
                else:
                    dispatcher.handle(action)
            dispatcher.tick()
            dispatcher.deliver_now()

        for i in range(20):  # a queue of 20 prompts, each failing 10 s after the previous
            clock.now = T0 + i * 10
            obs = Observation("main", "log", samples.LOG_EVENT, clock.now, {"prompt_id": f"p{i}"})
            run(tracker.observe(obs, now=clock.now))
            clock.now += 2
            run(tracker.tick(clock.now))
        assert written == 1
        assert len(receiver.received()) == 1  # the first failure: one alert, at once
        clock.now = T0 + 800  # the storm window passes
        closing = tracker.tick(clock.now)
        assert any(isinstance(a, CloseIncident) for a in closing)
        run(closing)
        first, summary = (r.json() for r in receiver.received())
        assert first["title"].startswith("OOM: GPU out of memory on main")
        assert "Snapshot: 2027" in first["message"]
        assert summary["title"] == "OOM storm on main: 19 more failure(s) (storm over)"
        store.close()


def test_dispatcher_resumes_grouping_and_sends_what_was_queued_after_a_restart(
    tmp_path: Path,
) -> None:
    clock = Clock()
    with serve([500]) as receiver:
        settings = _settings(tmp_path, receiver)
        data_dir = settings.resolved_data_dir()
        store = Store.open(data_dir)
        dispatcher = AlertDispatcher(
            store, settings, [AppriseChannel(u) for u in settings.alerts.urls], clock=clock
        )
        incident = samples.incident(at=T0)
        ref = write_snapshot(data_dir / "snapshots", samples.content(at=T0))
        (alert,) = dispatcher.on_incident_written(incident, ref)
        assert not dispatcher.deliver_now()[0].ok  # the service answered 500
        store.close()

        clock.now = T0 + 60  # restart, before the retry is due
        store = Store.open(data_dir)
        dispatcher = AlertDispatcher(
            store, settings, [AppriseChannel(u) for u in settings.alerts.urls], clock=clock
        )
        assert dispatcher.on_incident_written(incident, ref) == []  # not alerted twice
        dispatcher.start()
        try:
            _wait_for(lambda: len(receiver.received()) == 1)
        finally:
            assert dispatcher.stop()
        assert receiver.received()[0].json()["title"] == alert.title
        store.close()


def test_soft_oom_early_warning_goes_out(tmp_path: Path) -> None:
    clock = Clock()
    with serve() as receiver:
        settings = _settings(
            tmp_path, receiver, soft_oom_warning_count=3, soft_oom_warning_window_s=300
        )
        with Store.open(settings.resolved_data_dir()) as store:
            dispatcher = AlertDispatcher(
                store, settings, [AppriseChannel(u) for u in settings.alerts.urls], clock=clock
            )
            tracker = IncidentTracker()
            soft = replace(samples.LOG_EVENT, recovered=True)
            for n in range(3):
                clock.now = T0 + n * 30
                for action in tracker.observe(
                    Observation("main", "log", soft, clock.now), clock.now
                ):
                    assert isinstance(action, CountSoftOom)
                    dispatcher.handle(action)
            dispatcher.deliver_now()
            (warning,) = receiver.received()
            assert warning.json()["title"] == "Early warning: 3 recovered OOMs on main"


def test_secrets_never_reach_logs_or_queued_payloads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    with serve([500, 500, 200]) as receiver:
        settings = _settings(tmp_path, receiver, retry_initial_s=1)
        clock = Clock()
        with Store.open(settings.resolved_data_dir()) as store:
            dispatcher = AlertDispatcher(
                store, settings, [AppriseChannel(u) for u in settings.alerts.urls], clock=clock
            )
            ref = write_snapshot(tmp_path / "data" / "snapshots", samples.content())
            dispatcher.on_incident_written(samples.incident(), ref)
            for step in range(4):
                clock.now = T0 + step * 5
                dispatcher.deliver_now()
            assert len(receiver.received()) == 1
            dumped = json.dumps([r[0] for r in store.query("dump", "SELECT * FROM alert_outbox")])
            dumped += json.dumps(store.query("dump", "SELECT * FROM meta"))
    records = [r.getMessage() for r in caplog.records if r.name.startswith("oom_sentinel")]
    out = capsys.readouterr()
    for text in ("\n".join(records), out.out, out.err, dumped):
        assert SECRET not in text
    assert (receiver.received()[0].path) == f"/hook/{SECRET}"  # it was used all the same
