"""The per-user desktop companion: shows oom-sentinel's alerts as desktop notifications.

A system service cannot show a notification: on Linux it has no access to the user's session
bus, on Windows services run in session 0. So the daemon writes its alerts to a small feed file
(``notifiers.FeedChannel``: the last 50, titles and summaries only, world-readable) and this
agent, started in the user's session, polls it. The poll is one ``stat`` per candidate path
every few seconds; the file is read only when its size or mtime changed. Alerts arrive already
grouped and rate-limited by the daemon.

Which alerts were shown is remembered in the user's state dir, so a re-login does not repeat
them; on the very first run, alerts older than a few minutes are taken as seen.

Missing pieces degrade to one line: without the ``desktop`` extra (desktop-notifier) or
without a session bus, ``notify-agent`` says so and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import platformdirs

from oom_sentinel.daemon.alerts.notifiers import FEED_NAME, read_feed
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.errors import SentinelError

__all__ = [
    "DesktopNotifierSender",
    "DesktopSender",
    "DesktopUnavailable",
    "FeedEntry",
    "FeedWatcher",
    "default_feed_paths",
    "run_agent",
    "session_bus_problem",
]

log = logging.getLogger("oom_sentinel.notify_agent")

APP_NAME = "oom-sentinel"
#: ids remembered as shown (the feed holds 50)
SEEN_MAX = 500
#: on the first run, alerts older than this are not shown
FIRST_RUN_GRACE_S = 300.0


class DesktopUnavailable(SentinelError):
    """Desktop notifications cannot be shown here (extra or session bus missing)."""


@dataclass(frozen=True, slots=True)
class FeedEntry:
    id: str
    title: str
    body: str
    severity: str
    created_s: float
    snapshot_id: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeedEntry | None:
        try:
            return cls(
                id=str(data["id"]),
                title=str(data.get("title") or "oom-sentinel"),
                body=str(data.get("body") or ""),
                severity=str(data.get("severity") or "info"),
                created_s=float(data.get("created_s") or 0.0),
                snapshot_id=data.get("snapshot_id")
                if isinstance(data.get("snapshot_id"), str)
                else None,
            )
        except (KeyError, TypeError, ValueError):
            return None


def default_feed_paths(
    environ: Mapping[str, str] | None = None, platform: str = sys.platform
) -> list[Path]:
    """Where a daemon may write its feed, most likely first: the system service's runtime
    dir, a user service's runtime dir, a daemon run by hand (the user data dir), and on
    Windows the service's ``%ProgramData%`` dir."""
    env = os.environ if environ is None else environ
    paths: list[Path] = []
    if platform == "win32":
        program_data = env.get("ProgramData") or env.get("PROGRAMDATA") or r"C:\ProgramData"
        paths.append(Path(program_data) / APP_NAME / FEED_NAME)
    else:
        paths.append(Path("/run") / APP_NAME / FEED_NAME)
        runtime = env.get("XDG_RUNTIME_DIR")
        if runtime:
            paths.append(Path(runtime) / APP_NAME / FEED_NAME)
    paths.append(Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / FEED_NAME)
    return paths


def _state_path() -> Path:
    return Path(platformdirs.user_state_dir(APP_NAME, appauthor=False)) / "notify-agent.json"


class FeedWatcher:
    """Finds new feed entries with low overhead; remembers which were shown."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        state_path: Path | None = None,
        now_s: float,
        grace_s: float = FIRST_RUN_GRACE_S,
    ) -> None:
        self.paths = list(paths)
        self.state_path = state_path
        self._stamps: dict[Path, tuple[int, int, int] | None] = {}
        self._seen: list[str] = []
        self._first_run = True
        self._cutoff_s = now_s - grace_s
        if state_path is not None:
            self._load()

    def poll(self) -> list[FeedEntry]:
        """New entries of every feed that changed since the last poll, oldest first."""
        new: list[FeedEntry] = []
        seen = set(self._seen)
        for path in self.paths:
            try:
                st = path.stat()
                stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                stamp = None
            if stamp is None or stamp == self._stamps.get(path):
                self._stamps[path] = stamp
                continue
            self._stamps[path] = stamp
            for raw in read_feed(path):
                entry = FeedEntry.from_json(raw)
                if entry is None or entry.id in seen:
                    continue
                seen.add(entry.id)
                self._seen.append(entry.id)
                if self._first_run and entry.created_s < self._cutoff_s:
                    continue
                new.append(entry)
        self._first_run = False
        if len(self._seen) > SEEN_MAX:
            self._seen = self._seen[-SEEN_MAX:]
        self._save()
        return sorted(new, key=lambda e: e.created_s)

    def _load(self) -> None:
        assert self.state_path is not None
        try:
            data = json.loads(self.state_path.read_text("utf-8"))
        except (OSError, ValueError):
            return
        seen = data.get("seen") if isinstance(data, dict) else None
        if isinstance(seen, list):
            self._seen = [str(s) for s in seen][-SEEN_MAX:]
            self._first_run = False

    def _save(self) -> None:
        if self.state_path is None:
            return
        try:
            write_text_atomic(self.state_path, json.dumps({"seen": self._seen}))
        except OSError as exc:
            log.warning("cannot remember shown alerts in %s: %s", self.state_path, exc)


class DesktopSender(Protocol):
    def notify(self, entry: FeedEntry) -> None: ...


def session_bus_problem(environ: Mapping[str, str], platform: str = sys.platform) -> str | None:
    """Why desktop notifications cannot work here (Linux: no session bus), or None."""
    if not platform.startswith("linux"):
        return None
    if environ.get("DBUS_SESSION_BUS_ADDRESS"):
        return None
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime, "bus").exists():
        return None
    return (
        "no desktop session bus (DBUS_SESSION_BUS_ADDRESS is not set and there is no "
        "$XDG_RUNTIME_DIR/bus): start notify-agent inside your desktop session"
    )


class DesktopNotifierSender:
    """desktop-notifier (the ``desktop`` extra): D-Bus on Linux, WinRT on Windows."""

    def __init__(self, environ: Mapping[str, str] | None = None, platform: str = sys.platform):
        env = os.environ if environ is None else environ
        try:
            from desktop_notifier import DesktopNotifierSync, Urgency
        except ImportError:
            raise DesktopUnavailable(
                "desktop notifications need the desktop extra: pip install 'oom-sentinel[desktop]'"
            ) from None
        problem = session_bus_problem(env, platform)
        if problem:
            raise DesktopUnavailable(problem)
        if platform.startswith("linux") and not env.get("DBUS_SESSION_BUS_ADDRESS"):
            # dbus-fast only reads the variable; the socket is where systemd puts it
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={env['XDG_RUNTIME_DIR']}/bus"
        self._urgency = {
            "critical": Urgency.Critical,
            "warning": Urgency.Normal,
            "info": Urgency.Low,
        }
        self._default = Urgency.Normal
        self._notifier = DesktopNotifierSync(app_name=APP_NAME)

    def notify(self, entry: FeedEntry) -> None:
        body = entry.body
        if len(body) > 600:  # notification bubbles are small; the snapshot has the rest
            body = body[:597] + "..."
        self._notifier.send(
            title=entry.title,
            message=body,
            urgency=self._urgency.get(entry.severity, self._default),
        )


def run_agent(
    watcher: FeedWatcher,
    sender: DesktopSender,
    stop: threading.Event,
    *,
    interval_s: float = 5.0,
    once: bool = False,
) -> int:
    """Poll and notify until ``stop`` is set (or once). Returns how many were shown."""
    shown = 0
    while True:
        for entry in watcher.poll():
            try:
                sender.notify(entry)
                shown += 1
            except Exception as exc:  # a notification server hiccup must not end the agent
                log.warning("cannot show %r: %s", entry.title, exc)
        if once or stop.wait(interval_s):
            return shown


def feeds_for(paths: Sequence[str]) -> list[Path]:
    return [Path(p).expanduser() for p in paths] if paths else default_feed_paths()


def make_watcher(paths: Sequence[Path], now_s: float) -> FeedWatcher:
    with contextlib.suppress(OSError):
        _state_path().parent.mkdir(parents=True, exist_ok=True)
    return FeedWatcher(paths, state_path=_state_path(), now_s=now_s)
