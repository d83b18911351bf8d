"""Snapshots in one bucket: every box of a farm uploads its finished snapshots to
``s3://BUCKET/PREFIX/<host>/<instance>/<snapshot id>/``, and ``snapshots list|show --from``
read the fleet's incidents back from there.

Uploads go through the alert outbox (``alert_outbox.py``) as their own item kind
(``UPLOAD_KIND``) on their own channel (``BucketChannel``): written to the store before
anything is sent, retried with the alerts' backoff while the bucket is unreachable, kept
across restarts, and never sent to a notification channel. A snapshot's files are uploaded
with ``snapshot.json`` last, so a reader that sees it sees the whole snapshot -- the same
"complete or not there" rule as on disk. The files are uploaded as the daemon wrote them,
already redacted (``snapshot.py``). A repeated upload (a crash between the upload and marking
it sent) writes the same keys again: nothing is duplicated.

boto3 is imported here, on first use, and only when ``[fleet] bucket_url`` is set: the daemon
of a single box never loads it. Credentials come from boto3's usual chain (environment,
``~/.aws``, an instance role), never from our config, so no secret is ever ours to leak.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from oom_sentinel.daemon.alerts.notifiers import SendResult
from oom_sentinel.daemon.alerts.policy import Alert
from oom_sentinel.daemon.core.errors import InputError, SentinelError
from oom_sentinel.daemon.incidents.snapshot import SNAPSHOT_NAME_RE
from oom_sentinel.daemon.incidents.snapshot import _sanitize as _key_part

if TYPE_CHECKING:
    from oom_sentinel.config.settings import FleetSettings

__all__ = [
    "MARKER",
    "UPLOAD_KIND",
    "Bucket",
    "BucketChannel",
    "BucketError",
    "BucketUrl",
    "RemoteSnapshot",
    "download",
    "find_remote",
    "remote_snapshots",
    "upload_item",
]

#: the outbox item kind of a snapshot upload (an ``Alert`` row no notifier ever gets)
UPLOAD_KIND = "snapshot_upload"
#: uploaded last: its presence marks a complete snapshot
MARKER = "snapshot.json"
INSTALL_HINT = "boto3 is not installed (pip install 'oom-sentinel[fleet]')"


class BucketError(SentinelError):
    """The bucket could not be read or written (unreachable, no credentials, no such bucket)."""


@dataclass(frozen=True, slots=True)
class BucketUrl:
    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> BucketUrl:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or "@" in parts.netloc:
            raise InputError(f"{url!r}: not a bucket URL (expected s3://BUCKET[/PREFIX])")
        return cls(parts.netloc, parts.path.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def _describe(exc: BaseException) -> str:
    """One secret-free line for a boto3/botocore failure."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        code = error.get("Code") or "error"
        message = error.get("Message") or ""
        return f"{code}: {message}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"


class Bucket:
    """The few S3 calls we need, on one boto3 client (thread-safe for these calls)."""

    def __init__(self, url: BucketUrl, *, endpoint_url: str = "", region: str = "") -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise BucketError(INSTALL_HINT) from None
        self.url = url
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or None,
            config=Config(
                connect_timeout=10,
                read_timeout=60,
                retries={"max_attempts": 2, "mode": "standard"},
            ),
        )

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(Bucket=self.url.bucket, **kwargs)
        except Exception as exc:  # botocore raises many unrelated types; all mean "failed"
            raise BucketError(f"{self.url}: cannot {what}: {_describe(exc)}") from None

    def put_file(self, key: str, path: Path) -> None:
        with path.open("rb") as body:
            self._call(f"upload {key}", self._client.put_object, Key=key, Body=body)

    def get_bytes(self, key: str) -> bytes:
        response = self._call(f"read {key}", self._client.get_object, Key=key)
        return bytes(response["Body"].read())

    def keys(self, prefix: str) -> Iterator[str]:
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._call(
                f"list {prefix or '/'}", self._client.list_objects_v2, Prefix=prefix, **extra
            )
            for item in page.get("Contents", ()):
                yield str(item["Key"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")


# --- uploading, through the outbox ----------------------------------------------------------


def _host_name(fleet: FleetSettings) -> str:
    return fleet.host or socket.gethostname() or "unknown"


def upload_item(
    fleet: FleetSettings, *, snapshot_id: str, path: Path, instance: str, created_s: float
) -> Alert:
    """The outbox item for one finished snapshot. Its key prefix (``host/instance/id``) is
    fixed now, so an upload retried after a rename of the host still lands in one place."""
    where = "/".join((_key_part(_host_name(fleet), 64), _key_part(instance or "unknown", 64)))
    return Alert(
        key=f"upload:{snapshot_id}",
        kind=UPLOAD_KIND,
        severity="info",
        title=f"upload snapshot {snapshot_id}",
        body=f"{where}/{snapshot_id}",
        created_s=created_s,
        instance=instance,
        snapshot_id=snapshot_id,
        snapshot_path=str(path),
    )


class BucketChannel:
    """The outbox channel that uploads (``AlertChannel``: ``send`` never raises). The boto3
    client is made on the first upload, on the sender thread."""

    def __init__(self, fleet: FleetSettings) -> None:
        self.url = BucketUrl.parse(fleet.bucket_url)
        self.id = f"bucket:{self.url}"
        self.name = str(self.url)
        self._fleet = fleet
        self._bucket: Bucket | None = None
        self._lock = threading.Lock()

    def _client(self) -> Bucket:
        with self._lock:
            if self._bucket is None:
                self._bucket = Bucket(
                    self.url, endpoint_url=self._fleet.endpoint_url, region=self._fleet.region
                )
            return self._bucket

    def send(self, alert: Alert) -> SendResult:
        if alert.kind != UPLOAD_KIND or not alert.snapshot_path:
            return SendResult(self.id, self.name, True, "not a snapshot upload; nothing to do")
        directory = Path(alert.snapshot_path)
        try:
            files = sorted(
                (p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")),
                key=lambda p: (p.name == MARKER, p.name),  # snapshot.json last
            )
        except OSError as exc:
            return SendResult(
                self.id, self.name, False, f"{directory}: cannot read: {exc.strerror or exc}"
            )
        if not any(p.name == MARKER for p in files):
            return SendResult(self.id, self.name, False, f"{directory}: no {MARKER}")
        try:
            bucket = self._client()
            for path in files:
                bucket.put_file(self.url.key(alert.body, path.name), path)
        except BucketError as exc:
            return SendResult(self.id, self.name, False, str(exc))
        return SendResult(
            self.id, self.name, True, f"{len(files)} files to {self.url}/{alert.body}/"
        )


# --- reading the fleet's snapshots ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemoteSnapshot:
    """One complete snapshot in the bucket (its ``snapshot.json`` is there)."""

    host: str
    instance: str
    id: str
    #: the key prefix of its files, without the trailing slash
    key: str

    @property
    def ref(self) -> str:
        return f"{self.host}/{self.instance}/{self.id}"


def remote_snapshots(bucket: Bucket) -> list[RemoteSnapshot]:
    """Every complete snapshot under the bucket URL's prefix, newest first."""
    base = bucket.url.key()
    found = []
    for key in bucket.keys(f"{base}/" if base else ""):
        rest = key[len(base) + 1 :] if base else key
        parts = rest.split("/")
        if len(parts) != 4 or parts[3] != MARKER or not SNAPSHOT_NAME_RE.match(parts[2]):
            continue
        host, instance, snapshot_id, _ = parts
        found.append(RemoteSnapshot(host, instance, snapshot_id, key[: -len(MARKER) - 1]))
    return sorted(found, key=lambda s: (s.id, s.host, s.instance), reverse=True)


def find_remote(snapshots: list[RemoteSnapshot], ref: str, where: str) -> RemoteSnapshot:
    """The snapshot a user means: ``ID``, ``HOST/INSTANCE/ID`` or a unique prefix of either."""
    exact = [s for s in snapshots if ref in (s.id, s.ref)]
    matches = exact or [
        s for s in snapshots if ref and (s.id.startswith(ref) or s.ref.startswith(ref))
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise InputError(f"no snapshot {ref!r} in {where}")
    shown = ", ".join(s.ref for s in matches[:5]) + (", ..." if len(matches) > 5 else "")
    raise InputError(
        f"{ref!r} matches {len(matches)} snapshots in {where}: {shown}; give HOST/INSTANCE/ID"
    )


def download(bucket: Bucket, snapshot: RemoteSnapshot, into: Path, *, only: str = "") -> Path:
    """Copy one snapshot's files (or just ``only``) to ``into/<id>``; returns that directory."""
    target = into / snapshot.id
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    # one GET for a single file (what `list` reads); a listing for the whole snapshot
    keys = [f"{snapshot.key}/{only}"] if only else bucket.keys(f"{snapshot.key}/")
    for key in keys:
        name = key[len(snapshot.key) + 1 :]
        if "/" in name or name in ("", ".", ".."):
            continue
        data = bucket.get_bytes(key)
        path = target / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return target
