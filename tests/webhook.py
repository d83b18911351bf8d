"""A webhook endpoint on 127.0.0.1 for alert tests: real HTTP, bodies kept in order."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A webhook endpoint on 127.0.0.1 that keeps every JSON body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    outer.bodies.append(json.loads(raw))
                except ValueError:
                    outer.bodies.append({"raw": raw.decode("utf-8", "replace")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def texts(self) -> list[str]:
        return [json.dumps(b) for b in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
