"""A real HTTP receiver on 127.0.0.1 for apprise's json:// and form:// URLs (not a test module).

It answers with the status codes a test scripts (then 200), and records every request: path,
headers and body, so a test can check what really went over the wire. ``Receiver()`` serves
until ``close()``; ``serve()`` is the same as a context manager.
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
    def __init__(self, statuses: Iterable[int] = (), port: int = 0) -> None:
        self.statuses = list(statuses)
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        receiver = self

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

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "hook", *, scheme: str = "json", auth: str = "") -> str:
        creds = f"{auth}@" if auth else ""
        return f"{scheme}://{creds}127.0.0.1:{self.port}/{path}"

    def received(self, status: int | None = 200) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if status is None or r.status == status]

    @property
    def bodies(self) -> list[Any]:
        """Every request's body as JSON (``{"raw": text}`` where it is not JSON), in order."""
        out: list[Any] = []
        for request in self.received(status=None):
            try:
                out.append(request.json())
            except ValueError:
                out.append({"raw": request.body.decode("utf-8", "replace")})
        return out

    def texts(self) -> list[str]:
        return [json.dumps(b) for b in self.bodies]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def serve(statuses: Iterable[int] = (), port: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(statuses, port)
    try:
        yield receiver
    finally:
        receiver.close()
