"""A tiny threaded HTTP server for health, readiness and metrics (reusable by every front end).

    srv = ProbeServer(port, {
        "/healthz": lambda: (200, "text/plain", b"ok"),
        "/readyz": lambda: (200 if ready() else 503, "text/plain", b"..."),
        "/metrics": lambda: (200, CONTENT_TYPE, metrics.exposition()),
    }).start()
    ...
    srv.stop()

Port 0 picks a free port (``srv.port`` tells which). Handlers run in the server's threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
Route = Callable[[], Response]


def text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


class ProbeServer:
    def __init__(self, port: int, routes: Mapping[str, Route], host: str = "0.0.0.0") -> None:
        self.routes = dict(routes)
        routes_ref = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes_ref.get(self.path.split("?", 1)[0])
                if route is None:
                    status, ctype, body = text(404, "not found\n")
                else:
                    try:
                        status, ctype, body = route()
                    except Exception as e:  # a probe must answer, never hang
                        log.exception("handler %s failed", self.path)
                        status, ctype, body = text(500, f"error: {e}\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ProbeServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
