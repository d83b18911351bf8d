"""The channels an alert leaves by, each behind one small ``send(alert) -> SendResult`` seam.

=====================  =========================================================================
channel                what it does
=====================  =========================================================================
``AppriseChannel``     one apprise URL (Discord, Slack, Telegram, ntfy, email, json:// ...)
``LogChannel``         the daemon's log -- the journal under systemd
``EventLogChannel``    the Windows Application Event Log (pywin32 ``servicemanager``)
``FeedChannel``        a small JSON file the per-user desktop companion polls (``notify_agent``)
=====================  =========================================================================

Secrets: an apprise URL carries its credentials (webhook tokens, passwords, ntfy topics). They
must never reach a log, an error message or ``alert test``'s output, yet apprise, requests and
urllib3 log URLs and paths at debug level and put them in exception texts. So every channel is
named by a secret-free display name (scheme, host when it is a real host name, and a short hash
of the URL to tell channels apart), and the loggers of those three libraries are bridged: their
records are scrubbed of every fragment of every configured URL that could be secret, then of
anything ``redact_text`` recognises, and only then re-logged under ``oom_sentinel.notify``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from oom_sentinel.daemon.alerts.policy import Alert, Severity
from oom_sentinel.daemon.core.atomic import write_text_atomic
from oom_sentinel.daemon.core.errors import ConfigError
from oom_sentinel.daemon.core.redact import REDACTED, redact_text

if TYPE_CHECKING:
    from oom_sentinel.config.settings import Settings

__all__ = [
    "FEED_NAME",
    "AlertChannel",
    "AppriseChannel",
    "EventLogChannel",
    "FeedChannel",
    "LogChannel",
    "SendResult",
    "build_channels",
    "describe_url",
    "feed_path",
    "read_feed",
    "scrub",
    "send_all",
    "url_channel_id",
]

FEED_NAME = "feed.json"
FEED_VERSION = 1
#: entries the feed keeps (the companion polls every few seconds)
FEED_MAX_ENTRIES = 50
#: the Event Log truncates longer strings
_EVENT_LOG_MAX_CHARS = 30_000
#: libraries whose log records may carry an apprise URL, a webhook path or an auth header
_BRIDGED_LOGGERS = ("apprise", "urllib3", "requests")
#: URL fragments shorter than this are not treated as secrets (passwords: 4)
_MIN_FRAGMENT = 6

log = logging.getLogger("oom_sentinel.alerts")


@dataclass(frozen=True, slots=True)
class SendResult:
    """The outcome of one send on one channel; ``detail`` is secret-free."""

    channel_id: str
    channel_name: str
    ok: bool
    detail: str


class AlertChannel(Protocol):
    """One way out. ``id`` is stable across restarts and secret-free (the outbox keys on it);
    ``name`` is what a person reads. ``send`` never raises."""

    id: str
    name: str

    def send(self, alert: Alert) -> SendResult: ...


# --- secrets ------------------------------------------------------------------------------------

_secrets_lock = threading.Lock()
_secrets: tuple[str, ...] = ()


def _is_public_host(host: str) -> bool:
    """A host name we may print: an IP address, localhost, or a dotted DNS name. Apprise puts
    webhook ids and bot tokens where the host goes (``discord://ID/TOKEN``, ``tgram://TOKEN``)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    return "." in host and all(part.isalnum() or "-" in part for part in host.split("."))


def _secret_fragments(url: str) -> set[str]:
    """Every part of ``url`` that could be a secret, in the forms a log might show it."""
    out: set[str] = set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return {url} if len(url) >= 4 else set()
    # Short fragments are left alone: scrubbing "oom" or "hook" everywhere would maim every
    # message while protecting nothing a guess would not find.
    user, password = parts.username, parts.password
    if password and len(password) >= 4:
        out |= {password, unquote(password)}
    if user and len(user) >= _MIN_FRAGMENT:
        out |= {user, unquote(user)}
    if user and password:
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        out.add(token)
    host = parts.hostname or ""
    if len(host) >= _MIN_FRAGMENT and not _is_public_host(host):
        out.add(host)
    for segment in parts.path.split("/"):
        if len(segment) >= _MIN_FRAGMENT:
            out |= {segment, unquote(segment)}
    with contextlib.suppress(ValueError):
        for _key, value in parse_qsl(parts.query, keep_blank_values=False):
            if len(value) >= 4:
                out.add(value)
    if len(parts.fragment) >= 4:
        out.add(parts.fragment)
    return {s for s in out if s}


def _register_secrets(url: str) -> None:
    global _secrets
    with _secrets_lock:
        merged = set(_secrets) | _secret_fragments(url)
        _secrets = tuple(sorted(merged, key=len, reverse=True))


def scrub(text: str) -> str:
    """``text`` without any fragment of a configured URL that could be secret, then redacted."""
    for fragment in _secrets:
        if fragment in text:
            text = text.replace(fragment, REDACTED)
    return redact_text(text)


class _Bridge(logging.Handler):
    """Scrubs the bridged libraries' records and re-logs them under ``oom_sentinel.notify``;
    also collects the WARNING+ lines logged while a send runs (the reason of a failure, which
    apprise only logs -- from its own worker threads, so the capture is not per thread; sends
    are serialised by ``_send_lock``)."""

    _captures: ClassVar[list[list[str]]] = []
    _captures_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = scrub(" ".join(record.getMessage().split()))
        except Exception:  # a broken record must not break a send
            return
        if record.levelno >= logging.WARNING:
            with self._captures_lock:
                for captured in self._captures:
                    captured.append(message)
        logging.getLogger(f"oom_sentinel.notify.{record.name}").log(record.levelno, "%s", message)

    @classmethod
    @contextlib.contextmanager
    def capture(cls) -> Iterator[list[str]]:
        captured: list[str] = []
        with _send_lock:
            with cls._captures_lock:
                cls._captures.append(captured)
            try:
                yield captured
            finally:
                with cls._captures_lock:
                    cls._captures.remove(captured)


#: one apprise call at a time, so a failure's reason is that call's
_send_lock = threading.RLock()
_bridge_lock = threading.Lock()


def _install_bridge() -> None:
    with _bridge_lock:
        for name in _BRIDGED_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(h, _Bridge) for h in logger.handlers):
                logger.addHandler(_Bridge())
            logger.propagate = False


# --- apprise ------------------------------------------------------------------------------------


def url_channel_id(url: str) -> str:
    """A stable, secret-free id for one URL: ``apprise:<12 hex of its SHA-256>``."""
    return "apprise:" + hashlib.sha256(url.encode("utf-8", "replace")).hexdigest()[:12]


def describe_url(url: str) -> str:
    """``json://127.0.0.1:8080 #1a2b3c`` / ``discord://… #4d5e6f``: scheme, host only when it
    is a real host name, and a short hash; never a credential, path or query."""
    suffix = url_channel_id(url)[len("apprise:") :][:6]
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"?://… #{suffix}"
    scheme = parts.scheme or "?"
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # tgram://BOT_ID:TOKEN/... puts the token where a port would be
        port, host = None, ""
    shown = host if _is_public_host(host) else "…"
    if port and shown != "…":
        shown += f":{port}"
    return scrub(f"{scheme}://{shown} #{suffix}")


_NOTIFY_TYPES = {Severity.CRITICAL: "failure", Severity.WARNING: "warning", Severity.INFO: "info"}


class AppriseChannel:
    """One apprise URL. Raises ``ConfigError`` (secret-free) for a URL apprise cannot use."""

    def __init__(self, url: str, *, label: str = "alerts.urls") -> None:
        _install_bridge()
        _register_secrets(url)
        self._url = url
        self.id = url_channel_id(url)
        self.name = describe_url(url)
        try:
            import apprise
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ConfigError(f"{label}: the apprise package is not installed") from exc
        self._apprise = apprise
        obj = apprise.Apprise()
        with _Bridge.capture() as captured:
            added = obj.add(url)
        if not added:
            reason = captured[-1] if captured else "unknown service or malformed URL"
            raise ConfigError(f"{label}: apprise cannot use {self.name}: {reason}")
        self._obj = obj

    def send(self, alert: Alert) -> SendResult:
        try:
            notify_type = _NOTIFY_TYPES[Severity(alert.severity)]
        except ValueError:
            notify_type = "info"
        try:
            with _Bridge.capture() as captured:
                result = self._obj.notify(
                    body=alert.body, title=alert.title, notify_type=notify_type
                )
        except Exception as exc:  # apprise plugins raise anything; never let it out
            return SendResult(self.id, self.name, False, scrub(f"{type(exc).__name__}: {exc}"))
        if result:
            return SendResult(self.id, self.name, True, "sent")
        reason = captured[-1] if captured else "the service did not accept the notification"
        return SendResult(self.id, self.name, False, reason)


# --- the log ------------------------------------------------------------------------------------


class LogChannel:
    """The daemon's own log (stderr, so the journal under systemd). Never fails."""

    id = "log"
    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or log

    def send(self, alert: Alert) -> SendResult:
        level = logging.INFO if alert.severity == Severity.INFO else logging.WARNING
        body = "\n".join("    " + line for line in alert.body.splitlines())
        self._log.log(level, "ALERT [%s] %s\n%s", alert.severity, alert.title, body)
        return SendResult(self.id, self.name, True, "logged")


# --- Windows Event Log --------------------------------------------------------------------------


class EventLogChannel:
    """The Application Event Log through pywin32's ``servicemanager`` (source ``oom-sentinel``).

    ``servicemanager`` is injected: the real module on Windows, a recording fake in tests.
    """

    id = "eventlog"
    name = "Windows Event Log"

    def __init__(self, servicemanager: Any, source: str = "oom-sentinel") -> None:
        self._sm = servicemanager
        self._source = source
        self._named = False

    def send(self, alert: Alert) -> SendResult:
        text = f"{alert.title}\n\n{alert.body}"[:_EVENT_LOG_MAX_CHARS]
        try:
            if not self._named:
                self._sm.SetEventSourceName(self._source)
                self._named = True
            if alert.severity == Severity.CRITICAL:
                self._sm.LogErrorMsg(text)
            elif alert.severity == Severity.WARNING:
                self._sm.LogWarningMsg(text)
            else:
                self._sm.LogInfoMsg(text)
        except Exception as exc:
            return SendResult(self.id, self.name, False, scrub(f"{type(exc).__name__}: {exc}"))
        return SendResult(self.id, self.name, True, "written")


# --- the desktop feed ---------------------------------------------------------------------------


def feed_path(settings: Settings, environ: Mapping[str, str] | None = None) -> Path:
    """Where the desktop feed is written: configured, else systemd's runtime dir, else the
    data dir (see ``[alerts] desktop_feed_path``)."""
    env = os.environ if environ is None else environ
    if settings.alerts.desktop_feed_path:
        return Path(os.path.expanduser(settings.alerts.desktop_feed_path))
    runtime = env.get("RUNTIME_DIRECTORY", "")
    if runtime:
        return Path(runtime.split(":")[0]) / FEED_NAME
    return settings.resolved_data_dir() / FEED_NAME


def read_feed(path: Path) -> list[dict[str, Any]]:
    """The feed's entries, oldest first; [] for a missing or unreadable feed."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]


class FeedChannel:
    """Appends each alert to a small JSON file (the last ``max_entries``) that the per-user
    ``notify-agent`` polls: a system service cannot reach a desktop session itself."""

    id = "feed"

    def __init__(self, path: str | os.PathLike[str], max_entries: int = FEED_MAX_ENTRIES) -> None:
        self.path = Path(path)
        self.name = f"desktop feed ({self.path})"
        self._max = max_entries
        self._lock = threading.Lock()

    def send(self, alert: Alert) -> SendResult:
        entry = {
            "id": alert.key,
            "kind": alert.kind,
            "severity": alert.severity,
            "title": alert.title,
            "body": alert.body,
            "created_s": alert.created_s,
            "instance": alert.instance,
            "snapshot_id": alert.snapshot_id,
            "snapshot_path": alert.snapshot_path,
        }
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                entries = [e for e in read_feed(self.path) if e.get("id") != alert.key]
                entries = ([*entries, entry])[-self._max :]
                doc = {"version": FEED_VERSION, "entries": entries}
                # 0644: the desktop companion runs as another user
                write_text_atomic(self.path, json.dumps(doc, ensure_ascii=False) + "\n", mode=0o644)
        except OSError as exc:
            return SendResult(
                self.id, self.name, False, f"{exc.filename or self.path}: {exc.strerror or exc}"
            )
        return SendResult(self.id, self.name, True, "written")


# --- choosing the channels ----------------------------------------------------------------------


def _load_servicemanager() -> Any | None:  # pragma: no cover - Windows only
    try:
        import servicemanager
    except ImportError:
        log.warning("Windows Event Log alerts are off: pywin32 is not installed")
        return None
    return servicemanager


def build_channels(
    settings: Settings,
    *,
    environ: Mapping[str, str] | None = None,
    platform: str = sys.platform,
    servicemanager: Any | None = None,
) -> list[AlertChannel]:
    """Every channel the settings ask for, apprise URLs first. ``ConfigError`` (one line, no
    secret) for a URL apprise cannot use."""
    alerts = settings.alerts
    channels: list[AlertChannel] = []
    seen: set[str] = set()
    for index, url in enumerate(alerts.urls):
        channel = AppriseChannel(url, label=f"alerts.urls[{index}]")
        if channel.id not in seen:
            seen.add(channel.id)
            channels.append(channel)
    if alerts.log:
        channels.append(LogChannel())
    if alerts.event_log and platform == "win32":
        module = servicemanager if servicemanager is not None else _load_servicemanager()
        if module is not None:
            channels.append(EventLogChannel(module))
    if alerts.desktop_feed:
        channels.append(FeedChannel(feed_path(settings, environ)))
    return channels


def send_all(channels: Sequence[AlertChannel], alert: Alert) -> list[SendResult]:
    """Send ``alert`` through every channel now, in order (``alert test``); never raises."""
    results: list[SendResult] = []
    for channel in channels:
        try:
            results.append(channel.send(alert))
        except Exception as exc:  # a channel broke its contract; report it, go on
            results.append(
                SendResult(channel.id, channel.name, False, scrub(f"{type(exc).__name__}: {exc}"))
            )
    return results
