"""The one worker base every daemon thread uses (daemon/service/workers.py), on real threads:
start and stop, a join that gives up on a stuck target, the last-alive time, and a crash that
is recorded and reported once -- the health the watchdog ping and ``status`` are built on."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from oom_sentinel.daemon.service.workers import Health, Worker


def _looping(worker_box: list[Worker], wake: threading.Event) -> None:
    worker = worker_box[0]
    while not worker.stopping.is_set():
        worker.beat()
        wake.wait(5.0)
        wake.clear()


def _make_loop() -> tuple[Worker, threading.Event]:
    box: list[Worker] = []
    wake = threading.Event()
    worker = Worker("loop", lambda: _looping(box, wake), thread_name="test-loop")
    box.append(worker)
    return worker, wake


def test_start_runs_the_target_on_its_own_named_thread_and_stop_ends_it() -> None:
    worker, wake = _make_loop()
    assert worker.join(0.1) is True  # never started: nothing to wait for
    assert worker.start() is True
    assert worker.start() is False  # already running: one thread, not two
    assert worker.is_alive()
    names = {t.name for t in threading.enumerate()}
    assert "test-loop" in names
    assert worker.stop(5.0, wake=wake.set) is True
    assert not worker.is_alive()
    assert worker.error is None and worker.ended_s is not None
    assert worker.health()["alive"] is False


def test_stop_without_the_wake_gives_up_after_the_timeout() -> None:
    worker, wake = _make_loop()
    worker.start()
    try:
        started = time.monotonic()
        assert worker.stop(0.2) is False  # the target sleeps in wake.wait(5): still alive
        assert time.monotonic() - started < 2.0
        assert worker.is_alive()
    finally:
        wake.set()
        assert worker.join(5.0) is True


def test_last_alive_moves_with_each_beat() -> None:
    now = [100.0]
    box: list[Worker] = []
    wake = threading.Event()
    worker = Worker("loop", lambda: _looping(box, wake), clock=lambda: now[0])
    box.append(worker)
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while worker.last_alive_s != 100.0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        now[0] = 160.0
        wake.set()
        while worker.last_alive_s != 160.0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        worker.stop(5.0, wake=wake.set)


def test_a_crash_is_recorded_logged_with_its_traceback_and_makes_health_false(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    crash = threading.Event()
    box: list[Worker] = []

    def target() -> None:
        while not box[0].stopping.is_set():
            box[0].beat()
            if crash.wait(0.05):
                raise RuntimeError("the sender's socket vanished")

    health = Health()
    seen: list[tuple[str, bool]] = []
    health.on_check = lambda name, ok: seen.append((name, ok))
    worker = health.add(Worker("alerts", target))
    box.append(worker)
    other, wake = _make_loop()
    health.add(other)
    worker.start()
    other.start()
    try:
        assert health.healthy() is True
        crash.set()
        assert worker.join(5.0) is True
        assert worker.error == "RuntimeError: the sender's socket vanished"
        assert health.check() == {"alerts": False, "loop": True}
        assert health.healthy() is False
        assert ("alerts", False) in seen and ("loop", True) in seen
        crashed = [r for r in caplog.records if "the alerts worker crashed" in r.getMessage()]
        assert len(crashed) == 1 and crashed[0].exc_info is not None  # the traceback
        dead = [r.getMessage() for r in caplog.records if "worker is dead" in r.getMessage()]
        assert dead == [
            "the alerts worker is dead (RuntimeError: the sender's socket vanished): "
            "systemd's watchdog is no longer pinged, so the service is restarted"
        ]  # once, though checked three times
        assert health.details()["alerts"]["error"] == worker.error
        # started again (a restart of the component): alive, and a later death is news again
        crash.clear()
        assert worker.start() is True and worker.error is None
        assert health.healthy() is True
    finally:
        worker.stop(5.0)
        other.stop(5.0, wake=wake.set)
