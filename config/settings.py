"""The typed settings model and the config-file search, so every part reads one validated,
frozen ``Settings`` value instead of poking at dicts or the environment.

A bad file never starts anything: ``load_settings`` raises ``ConfigError`` with one line that
names the file, the key path and what is wrong, e.g.
``config.toml: instances[0].port: must be 1..65535, got 0``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from oom_sentinel.daemon.core.errors import ConfigError

__all__ = [
    "ENV_CONFIG",
    "SYSTEM_CONFIG",
    "AlertSettings",
    "DiscoverySettings",
    "FleetSettings",
    "GpuSettings",
    "IncidentSettings",
    "InstallStateSettings",
    "InstanceSettings",
    "LoadedSettings",
    "LogSettings",
    "MetricsSettings",
    "SamplingSettings",
    "Settings",
    "SnapshotSettings",
    "config_search_path",
    "default_toml_text",
    "load_settings",
    "parse_settings",
]

APP_NAME = "oom-sentinel"
ENV_CONFIG = "OOM_SENTINEL_CONFIG"
SYSTEM_CONFIG = Path("/etc/oom-sentinel/config.toml")
#: the system unit's StateDirectory=
SYSTEM_DATA_DIR = Path("/var/lib/oom-sentinel")


def _range(lo: float, hi: float | None = None) -> Callable[[Any], Any]:
    """A validator whose message reads like the README: ``must be 1..65535, got 0``."""

    def check(value: Any) -> Any:
        if value < lo or (hi is not None and value > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"must be {bound}, got {value}")
        return value

    return check


Port = Annotated[int, AfterValidator(_range(1, 65535))]
PositiveMs = Annotated[int, AfterValidator(_range(1))]
NonNegative = Annotated[int, AfterValidator(_range(0))]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class InstanceSettings(_Section):
    """One ComfyUI install the user names explicitly."""

    name: str = ""
    path: str = ""
    url: str = ""
    port: Port | None = None
    logs: tuple[str, ...] = ()


class DiscoverySettings(_Section):
    enabled: bool = True
    interval_s: PositiveMs = 30
    processes: bool = True


class LogSettings(_Section):
    extra: tuple[str, ...] = ()
    poll_interval_ms: PositiveMs = 2000
    context_lines: NonNegative = 200


class SamplingSettings(_Section):
    interval_ms: PositiveMs = 1000
    active_interval_ms: PositiveMs = 250
    timeline_s: PositiveMs = 600


class GpuSettings(_Section):
    """Which GPU probe runs (``daemon/probes/gpu_select.py`` applies it)."""

    backend: Literal["auto", "nvml", "fake", "none"] = "auto"
    fake_dir: str = ""
    nvml_retry_s: PositiveMs = 60


class IncidentSettings(_Section):
    merge_window_s: NonNegative = 10
    storm_window_s: NonNegative = 300
    settle_ms: NonNegative = 1000


class ApiSettings(_Section):
    """How each ComfyUI's HTTP API is read (``daemon/comfy/watch.py``)."""

    websocket: bool = True
    idle_poll_ms: PositiveMs = 10000


class SnapshotSettings(_Section):
    max_count: NonNegative = 500
    max_age_days: NonNegative = 90


class AlertSettings(_Section):
    """Where alerts go and how often (``daemon/alerts/policy.py`` decides, ``alert_outbox.py`` sends)."""

    #: apprise URLs (Discord, Slack, Telegram, ntfy, mailto, json://...); secrets stay in them
    urls: tuple[str, ...] = ()
    #: log every alert to the daemon's log (the journal under systemd)
    log: bool = True
    #: write the Windows Event Log entry for every alert (Windows only)
    event_log: bool = True
    #: write the small feed file the per-user desktop companion (`notify-agent`) reads
    desktop_feed: bool = True
    #: where that feed lives; "" = $RUNTIME_DIRECTORY/feed.json, else <data_dir>/feed.json
    desktop_feed_path: str = ""
    group_window_s: NonNegative = 300
    repeat_interval_s: NonNegative = 14400
    max_per_hour: NonNegative = 20
    retry_initial_s: PositiveMs = 30
    retry_max_interval_s: PositiveMs = 1800
    retry_max_age_s: PositiveMs = 86400
    soft_oom_warning_count: NonNegative = 5
    soft_oom_warning_window_s: PositiveMs = 600
    send_recovered: bool = False


def _loopback_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT (e.g. 127.0.0.1:9866), got {value!r}")
    if host != "localhost":
        import ipaddress

        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"must be a loopback address (127.0.0.1, ::1 or localhost), got {host!r}"
            )
    return value


class MetricsSettings(_Section):
    """The optional Prometheus exporter (``daemon/fleet/metrics.py``); loopback only."""

    enabled: bool = False
    listen: Annotated[str, AfterValidator(_loopback_listen)] = "127.0.0.1:9866"


# --- [fleet]: a farm of GPU boxes (Prometheus beyond loopback, snapshots in one bucket) ---------


def _any_listen(value: str) -> str:
    """``HOST:PORT`` where HOST may be any address ("" = the farm listener is off)."""
    if not value:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT (e.g. 0.0.0.0:9866), got {value!r}")
    return value


def _bucket_url(value: str) -> str:
    if not value:
        return value
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"must be s3://BUCKET[/PREFIX], got {value!r}")
    if parts.username or parts.password or parts.query:
        raise ValueError(
            "must be s3://BUCKET[/PREFIX] without credentials or query (credentials come "
            "from the AWS environment: AWS_ACCESS_KEY_ID, ~/.aws, an instance role)"
        )
    return value


class FleetSettings(_Section):
    """A farm (``daemon/fleet/metrics_server.py``, ``daemon/fleet/bucket.py``); everything off by default."""

    #: serve /metrics on this address, beyond loopback ("" = off); needs token_file or mTLS
    listen: Annotated[str, AfterValidator(_any_listen)] = ""
    #: a file holding the bearer token Prometheus must send (``authorization: credentials_file``)
    token_file: str = ""
    #: TLS for the farm listener: the server's certificate and key (PEM)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: mTLS: only scrapers presenting a certificate signed by this CA are served
    tls_client_ca_file: str = ""
    #: every finished snapshot is uploaded to s3://BUCKET/PREFIX/<host>/<instance>/<id>/
    bucket_url: Annotated[str, AfterValidator(_bucket_url)] = ""
    #: an S3-compatible endpoint (MinIO, Ceph, R2...); "" = AWS (or $AWS_ENDPOINT_URL)
    endpoint_url: str = ""
    #: the bucket's region; "" = the AWS environment's default
    region: str = ""
    #: the host part of each key; "" = this machine's host name
    host: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> FleetSettings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
        if self.listen and not (self.token_file or self.tls_client_ca_file):
            raise ValueError(
                "listen: a non-loopback /metrics needs token_file (a bearer token) or "
                "tls_client_ca_file (mTLS)"
            )
        return self


class InstallStateSettings(_Section):
    """Install-state history (``daemon/install/history.py``)."""

    enabled: bool = True
    #: git/custom-node capture without the interpreter: the safety net for missed file events
    interval_s: PositiveMs = 300
    #: capture with ComfyUI's interpreter too (pip freeze, torch/CUDA versions)
    full_interval_s: PositiveMs = 21600
    debounce_ms: NonNegative = 2000
    probe_interpreter: bool = True
    probe_timeout_s: PositiveMs = 60


class Settings(_Section):
    """Everything configurable, parsed once and passed explicitly (never read from globals)."""

    data_dir: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    instances: tuple[InstanceSettings, ...] = ()
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    logs: LogSettings = Field(default_factory=LogSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    incidents: IncidentSettings = Field(default_factory=IncidentSettings)
    snapshots: SnapshotSettings = Field(default_factory=SnapshotSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    install_state: InstallStateSettings = Field(default_factory=InstallStateSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)

    def resolved_data_dir(self) -> Path:
        """The data dir: configured, else systemd's $STATE_DIRECTORY, else -- for root, once
        the system service has created it -- /var/lib/oom-sentinel (so `sudo oom-sentinel
        snapshots list` reads what the system unit wrote), else the platform's user dir."""
        if self.data_dir:
            return Path(os.path.expanduser(self.data_dir))
        state_dir = os.environ.get("STATE_DIRECTORY")
        if state_dir:
            return Path(state_dir.split(":")[0])
        if hasattr(os, "geteuid") and os.geteuid() == 0 and SYSTEM_DATA_DIR.is_dir():
            return SYSTEM_DATA_DIR
        return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


@dataclass(frozen=True)
class LoadedSettings:
    """Settings plus where they came from (``None``: built-in defaults)."""

    settings: Settings
    source: Path | None


def default_toml_text() -> str:
    """The documented default config shipped with the package."""
    # Not importlib.resources: this is a namespace package (no __init__.py, see pyproject),
    # and on Python 3.11 resources cannot read those under an editable install.
    return (Path(__file__).parent / "default.toml").read_text("utf-8")


def config_search_path(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Candidate files after an explicit --config, in the documented order."""
    env = os.environ if environ is None else environ
    paths: list[Path] = []
    if env.get(ENV_CONFIG):
        paths.append(Path(env[ENV_CONFIG]))
    paths.append(Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "config.toml")
    paths.append(SYSTEM_CONFIG)
    return paths


def _key_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _describe(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if "input" in err and kind != "value_error":
        shown = repr(err["input"])
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg = f"{msg[0].lower()}{msg[1:]}, got {shown}"
    return msg


def parse_settings(data: Mapping[str, Any], origin: str) -> Settings:
    """Validate a parsed TOML mapping; ``origin`` names the file in the error line."""
    try:
        return Settings.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"{origin}: {_key_path(first['loc'])}: {_describe(first)}") from None


def _read_file(path: Path) -> Settings:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return parse_settings(data, str(path))


def load_settings(
    explicit: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> LoadedSettings:
    """Find and validate the config; with no file anywhere, the built-in defaults."""
    env = os.environ if environ is None else environ
    if explicit is None and env.get(ENV_CONFIG):
        explicit = env[ENV_CONFIG]  # named on purpose: a missing file is an error, not a skip
    if explicit is not None:
        path = Path(explicit)
        return LoadedSettings(_read_file(path), path)
    for path in config_search_path(env):
        if path.is_file():
            return LoadedSettings(_read_file(path), path)
    return LoadedSettings(Settings(), None)
