"""Every worker thread of a running service feeds its health: kill one and systemd's watchdog
ping stops, and the log says which worker died. The service runs in this process (so a test
can kill its threads); systemd's notify socket is a real datagram socket."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_harness import wait_for

from oom_sentinel.bisect.measure.workspace import free_port
from oom_sentinel.config.settings import load_settings
from oom_sentinel.daemon.service.wiring import RunOptions, Service

pytestmark = [
    pytest.mark.timeout(120),
    # the killed threads end on SystemExit, which pytest reports as a thread exception
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
]


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.messages: list[str] = []

    def pings(self) -> int:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return sum("WATCHDOG=1" in m for m in self.messages)


def _die() -> None:
    raise SystemExit  # what ends a thread: nothing in it catches a BaseException


def kill_api(service: Service) -> None:
    assert service.sources is not None
    watcher = service.sources.comfy_watch
    assert watcher is not None and watcher._loop is not None
    watcher._loop.call_soon_threadsafe(_die)


def kill_process(service: Service) -> None:
    assert service.sources is not None
    watcher = service.sources.process_watch
    assert watcher is not None
    watcher._sync = _die  # type: ignore[method-assign]
    watcher._wake()


KILLS: dict[str, Callable[[Service], None]] = {
    "scheduler": lambda s: s.scheduler.shutdown(wait=False),  # type: ignore[union-attr]
    "alerts": lambda s: s.alerts.stop(),  # type: ignore[union-attr]
    "api": kill_api,
    "process": kill_process,
    "install-state": lambda s: s.sources.install_states.close(),  # type: ignore[union-attr]
    "metrics": lambda s: s.metrics.stop(),  # type: ignore[union-attr]
}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Service, NotifySocket]]:
    config = tmp_path / "config.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        "[discovery]\nenabled = false\n[logs]\npoll_interval_ms = 100\n"
        f'[metrics]\nenabled = true\nlisten = "127.0.0.1:{free_port()}"\n'
    )
    notify = NotifySocket(tmp_path / "notify.sock")
    environ = {
        "HOME": str(tmp_path / "home"),
        "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
        "WATCHDOG_USEC": "400000",  # a ping every 0.2 s
    }
    svc = Service(load_settings(str(config)), RunOptions(), environ=environ)
    svc.start()
    stop = threading.Event()
    loop = threading.Thread(target=svc.run, args=(stop,), daemon=True)
    loop.start()
    try:
        yield svc, notify
    finally:
        stop.set()
        svc.wake()
        loop.join(10)
        svc.close()


@pytest.mark.parametrize("worker", KILLS, ids=KILLS.keys())
def test_a_dead_worker_stops_the_watchdog_ping_and_is_named(
    service: tuple[Service, NotifySocket], worker: str, caplog: pytest.LogCaptureFixture
) -> None:
    svc, notify = service
    assert svc.workers() == dict.fromkeys(KILLS, True)
    wait_for(lambda: notify.pings() >= 2, 10, "watchdog pings while every worker lives")
    caplog.set_level(logging.ERROR, logger="oom_sentinel.daemon.service.wiring")
    KILLS[worker](svc)
    wait_for(lambda: not svc.workers()[worker], 10, f"the {worker} worker to end")
    wait_for(
        lambda: any(f"the {worker} worker is dead" in r.getMessage() for r in caplog.records),
        10,
        "the log line naming it",
    )
    before = notify.pings()
    time.sleep(1.0)  # five ping intervals: none may come (an absence, so a wait)
    assert notify.pings() == before, "the watchdog was pinged with a dead worker"
    assert {name for name, ok in svc.workers().items() if not ok} == {worker}
    assert svc.status(time.time())["workers"][worker] is False  # what `status` shows
    dead = [r.getMessage() for r in caplog.records if "worker is dead" in r.getMessage()]
    assert len(dead) == 1, dead  # logged once, not at every turn


def test_a_worker_that_crashes_is_reported_with_its_error(
    service: tuple[Service, NotifySocket],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real exception in a real worker thread (the alert sender's pass raises): status and
    the log name the worker and the error, and systemd's watchdog is no longer pinged."""
    svc, notify = service
    wait_for(lambda: notify.pings() >= 2, 10, "watchdog pings while every worker lives")
    caplog.set_level(logging.ERROR)
    assert svc.alerts is not None
    sender = svc.alerts.sender

    def broken() -> list[object]:
        raise RuntimeError("a bug in the sender")

    monkeypatch.setattr(sender, "run_once", broken)
    sender.wake()
    wait_for(lambda: not svc.workers()["alerts"], 10, "the alert sender to crash")
    before = notify.pings()
    time.sleep(1.0)  # five ping intervals: none may come
    assert notify.pings() == before, "the watchdog was pinged with a crashed worker"
    status = svc.status(time.time())
    assert status["workers"]["alerts"] is False
    assert [n for n, ok in status["workers"].items() if not ok] == ["alerts"]
    health = status["worker_health"]["alerts"]
    assert health["error"] == "RuntimeError: a bug in the sender"
    assert health["alive"] is False and health["ended_s"] is not None
    assert status["worker_health"]["api"]["last_alive_s"] is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "the alerts worker crashed: RuntimeError: a bug in the sender" in m for m in messages
    )
    assert any(
        "the alerts worker is dead (RuntimeError: a bug in the sender)" in m for m in messages
    )
