"""The desktop companion: finds new alerts in the daemon's feed, shows each once, and degrades
to one line without desktop-notifier or a session bus."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oom_sentinel.daemon.alerts.notifiers import FeedChannel
from oom_sentinel.daemon.alerts.notify_agent import (
    FeedEntry,
    FeedWatcher,
    default_feed_paths,
    run_agent,
    session_bus_problem,
)
from oom_sentinel.daemon.alerts.policy import Alert

HERE = Path(__file__).parent
T0 = 1_800_000_000.0


def _alert(key: str, at: float = T0, severity: str = "critical") -> Alert:
    return Alert(
        key,
        "incident",
        severity,
        f"OOM {key}",
        f"body of {key}",
        at,
        instance="main",
        snapshot_id=f"snap-{key}",
    )


class Recorder:
    """The agent's sender seam: records what it would show."""

    def __init__(self, fail_first: bool = False) -> None:
        self.shown: list[FeedEntry] = []
        self.fail_first = fail_first

    def notify(self, entry: FeedEntry) -> None:
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("notification server went away")
        self.shown.append(entry)


def test_new_alerts_are_shown_once_in_order(tmp_path: Path) -> None:
    feed = tmp_path / "feed.json"
    channel = FeedChannel(feed)
    watcher = FeedWatcher(
        [tmp_path / "absent.json", feed], state_path=tmp_path / "state.json", now_s=T0
    )
    assert watcher.poll() == []
    channel.send(_alert("a", T0 + 1))
    channel.send(_alert("b", T0 + 2))
    assert [e.id for e in watcher.poll()] == ["a", "b"]
    assert watcher.poll() == []  # unchanged file: not even read again
    channel.send(_alert("c", T0 + 3))
    entries = watcher.poll()
    assert [e.id for e in entries] == ["c"]
    assert entries[0].title == "OOM c" and entries[0].snapshot_id == "snap-c"


def test_a_restarted_agent_does_not_repeat_what_it_showed(tmp_path: Path) -> None:
    feed = tmp_path / "feed.json"
    state = tmp_path / "state.json"
    FeedChannel(feed).send(_alert("a", T0))
    first = FeedWatcher([feed], state_path=state, now_s=T0 + 10)
    assert [e.id for e in first.poll()] == ["a"]
    FeedChannel(feed).send(_alert("b", T0 + 20))
    again = FeedWatcher([feed], state_path=state, now_s=T0 + 30)  # a re-login
    assert [e.id for e in again.poll()] == ["b"]


def test_first_run_skips_old_alerts(tmp_path: Path) -> None:
    feed = tmp_path / "feed.json"
    FeedChannel(feed).send(_alert("old", T0 - 3600))
    FeedChannel(feed).send(_alert("recent", T0 - 60))
    watcher = FeedWatcher([feed], state_path=tmp_path / "s.json", now_s=T0)
    assert [e.id for e in watcher.poll()] == ["recent"]


def test_a_recreated_feed_is_read_again(tmp_path: Path) -> None:
    feed = tmp_path / "feed.json"
    watcher = FeedWatcher([feed], now_s=T0)
    FeedChannel(feed).send(_alert("a", T0 + 1))
    assert len(watcher.poll()) == 1
    feed.unlink()  # /run is cleared at a reboot; the daemon starts a new feed
    assert watcher.poll() == []
    FeedChannel(feed).send(_alert("b", T0 + 2))
    assert [e.id for e in watcher.poll()] == ["b"]


def test_garbage_in_the_feed_is_ignored(tmp_path: Path) -> None:
    feed = tmp_path / "feed.json"
    feed.write_text(
        '{"version": 1, "entries": [{"id": 3}, "x", {"id": "ok", "created_s": "nan?"}]}'
    )
    watcher = FeedWatcher([feed], now_s=T0)
    assert watcher.poll() == []
    feed.write_text("not json")
    assert watcher.poll() == []


def test_run_agent_sends_through_the_sender_and_survives_a_failure(tmp_path: Path) -> None:
    feed = tmp_path / "feed.json"
    watcher = FeedWatcher([feed], now_s=T0)
    FeedChannel(feed).send(_alert("a", T0 + 1))
    FeedChannel(feed).send(_alert("b", T0 + 2, severity="warning"))
    sender = Recorder(fail_first=True)
    assert run_agent(watcher, sender, threading.Event(), once=True) == 1
    assert [e.id for e in sender.shown] == ["b"]
    assert sender.shown[0].severity == "warning"


def test_run_agent_stops_when_asked(tmp_path: Path) -> None:
    stop = threading.Event()
    watcher = FeedWatcher([tmp_path / "feed.json"], now_s=T0)
    sender = Recorder()
    thread = threading.Thread(
        target=run_agent, args=(watcher, sender, stop), kwargs={"interval_s": 0.05}, daemon=True
    )
    thread.start()
    FeedChannel(tmp_path / "feed.json").send(_alert("late", time.time()))
    deadline = time.monotonic() + 15
    while not sender.shown and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(15)
    assert not thread.is_alive() and [e.id for e in sender.shown] == ["late"]


def test_default_feed_paths_cover_system_user_and_windows() -> None:
    linux = default_feed_paths({"XDG_RUNTIME_DIR": "/run/user/1000"}, "linux")
    assert linux[:2] == [
        Path("/run/oom-sentinel/feed.json"),
        Path("/run/user/1000/oom-sentinel/feed.json"),
    ]
    windows = default_feed_paths({"ProgramData": r"C:\ProgramData"}, "win32")
    assert windows[0] == Path(r"C:\ProgramData") / "oom-sentinel" / "feed.json"


def test_session_bus_problem(tmp_path: Path) -> None:
    assert session_bus_problem({}, "linux") is not None
    assert session_bus_problem({"DBUS_SESSION_BUS_ADDRESS": "unix:path=/x"}, "linux") is None
    (tmp_path / "bus").touch()
    assert session_bus_problem({"XDG_RUNTIME_DIR": str(tmp_path)}, "linux") is None
    assert session_bus_problem({}, "win32") is None


def _agent(env: dict[str, str], *args: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    code = pre + "from oom_sentinel.daemon.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "notify-agent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "DISPLAY")}
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "no-session")
    return env


def test_without_a_session_bus_the_agent_says_so_in_one_line(tmp_path: Path) -> None:
    proc = _agent(_clean_env(tmp_path), "--once", "--feed", str(tmp_path / "f.json"))
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("oom-sentinel: error: no desktop session bus")


def test_without_desktop_notifier_the_agent_names_the_extra(tmp_path: Path) -> None:
    pre = "import sys; sys.modules['desktop_notifier'] = None\n"  # as if not installed
    proc = _agent(_clean_env(tmp_path), "--once", pre=pre)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "oom-sentinel: error: desktop notifications need the desktop extra: "
        "pip install 'oom-sentinel[desktop]'"
    )


@pytest.fixture
def session_bus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A private D-Bus session bus and a stand-in notification server on it."""
    if shutil.which("dbus-daemon") is None:
        pytest.skip("dbus-daemon is not installed (Debian: apt-get install dbus-daemon)")
    bus = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address=1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert bus.stdout is not None
    address = bus.stdout.readline().strip()
    out = tmp_path / "notifications.jsonl"
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": address}
    server = subprocess.Popen(
        [sys.executable, str(HERE / "notification_server.py"), str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None
    try:
        assert server.stdout.readline().strip() == "ready"
        yield address, out
    finally:
        for proc in (server, bus):
            proc.terminate()
            proc.wait(10)
        server.stdout.close()
        bus.stdout.close()


def test_the_real_adapter_shows_alerts_on_a_session_bus(
    tmp_path: Path, session_bus: tuple[str, Path]
) -> None:
    address, out = session_bus
    feed = tmp_path / "feed.json"
    FeedChannel(feed).send(_alert("a", time.time()))
    FeedChannel(feed).send(_alert("b", time.time(), severity="info"))
    env = {**_clean_env(tmp_path), "DBUS_SESSION_BUS_ADDRESS": address}
    state = tmp_path / "state.json"
    proc = _agent(env, "--once", "--feed", str(feed), "--state", str(state))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2 notification(s) shown"
    shown = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(n["app_name"], n["summary"], n["body"]) for n in shown] == [
        ("oom-sentinel", "OOM a", "body of a"),
        ("oom-sentinel", "OOM b", "body of b"),
    ]
    assert [n["urgency"] for n in shown] == [2, 0]  # critical, low
    again = _agent(env, "--once", "--feed", str(feed), "--state", str(state))
    assert again.stdout.strip() == "0 notification(s) shown"
