"""The farm's /metrics listener: prometheus_client's WSGI app behind a bearer token and/or TLS,
so Prometheus on another machine can scrape a box without a proxy in front of it.

prometheus_client's own ``start_http_server`` does TLS and mTLS but has no hook for a token,
so this builds the same thing from its parts: its WSGI app, wrapped by a constant-time token
check, served by its ``ThreadingWSGIServer`` (one thread per scrape), the listening socket
wrapped in an ``ssl`` context when certificates are configured. Nothing here reads settings
files other than the token and PEM files named in ``[fleet]``; the token never reaches a log.
"""

from __future__ import annotations

import hmac
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

from oom_sentinel.daemon.core.errors import ConfigError

__all__ = ["ListenerAuth", "bearer_guard", "serve_metrics"]

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class ListenerAuth:
    """What guards the listener; empty: plain HTTP with no check (loopback only)."""

    token: str = ""
    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""

    @classmethod
    def from_files(
        cls,
        *,
        token_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        client_ca_file: str = "",
    ) -> ListenerAuth:
        """Read the token file; ``ConfigError`` (one line, no content) when it is unusable."""
        token = ""
        if token_file:
            try:
                token = Path(token_file).expanduser().read_text("utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise ConfigError(f"fleet.token_file: cannot read {token_file}: {reason}") from None
            if len(token) < 16:
                raise ConfigError(
                    f"fleet.token_file: {token_file} holds {len(token)} characters; a bearer "
                    "token needs at least 16 (e.g. `openssl rand -hex 32`)"
                )
        return cls(token, cert_file, key_file, client_ca_file)


def bearer_guard(app: WsgiApp, token: str) -> WsgiApp:
    """``app`` served only to requests with ``Authorization: Bearer <token>``; 401 otherwise."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="metrics"')],
            )
            return [b"a bearer token is required\n"]
        return app(environ, start_response)

    return guarded


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every 15 s would fill the journal); a client that
    stalls mid-request is dropped after ``timeout`` seconds instead of holding a thread."""

    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _tls_context(auth: ListenerAuth) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(auth.cert_file, auth.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"fleet.tls_cert_file/tls_key_file: cannot load {auth.cert_file} / {auth.key_file}: "
            f"{getattr(exc, 'strerror', None) or exc}"
        ) from None
    if auth.client_ca_file:
        try:
            context.load_verify_locations(auth.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"fleet.tls_client_ca_file: cannot load {auth.client_ca_file}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve_metrics(
    host: str,
    port: int,
    registry: CollectorRegistry,
    auth: ListenerAuth,
    *,
    on_poll: Callable[[], None] | None = None,
) -> Any:
    """A server listening on (host, port) for ``registry``; its ``serve_forever`` (run on a
    worker thread by the caller) calls ``on_poll`` every half second. ``OSError`` when the
    address cannot be bound, ``ConfigError`` for unusable certificates."""
    app: WsgiApp = make_wsgi_app(registry)
    if auth.token:
        app = bearer_guard(app, auth.token)
    context = _tls_context(auth) if auth.cert_file else None

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A failed handshake (no client certificate, plain HTTP on the TLS port) is the
            client's problem: no traceback on the daemon's stderr."""

        def service_actions(self) -> None:
            if on_poll is not None:
                on_poll()

    httpd = make_server(host, port, app, Server, handler_class=_QuietHandler)
    if context is not None:
        # The handshake happens in the request's thread on first read, not in accept(): a
        # client that connects and stalls cannot block the listener.
        httpd.socket = context.wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    return httpd
