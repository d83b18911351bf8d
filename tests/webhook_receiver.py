"""A real HTTP receiver on 127.0.0.1 for apprise's json:// and form:// URLs (not a test module).

It answers with the status codes a test scripts (then 200), and records every request: path,
headers and body, so a test can check what really went over the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, statuses: Iterable[int] = ()) -> None:
        self.statuses = list(statuses)
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.port = 0

    def url(self, scheme: str = "json", path: str = "hook", auth: str = "") -> str:
        creds = f"{auth}@" if auth else ""
        return f"{scheme}://{creds}127.0.0.1:{self.port}/{path}"

    def received(self, status: int | None = 200) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if status is None or r.status == status]


@contextmanager
def serve(statuses: Iterable[int] = (), port: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(statuses)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0") or 0)
            body = self.rfile.read(length)
            with receiver.lock:
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests.append(Request(self.path, dict(self.headers), body, status))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound and released: connections are refused)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
