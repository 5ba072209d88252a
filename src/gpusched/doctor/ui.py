"""``gpusched ui``: the GPU map in the browser, served from a snapshot or the live API.

Routes: ``/`` the page (``page.PAGE``); ``/api/map`` every node's GPUs and who holds them,
stranded capacity, pending pods with their reasons; ``/api/pod?name=NS/NAME`` doctor's report
for one pod (counterfactuals included); ``/api/node?name=NAME``; ``/healthz``. A bad name answers
404 with ``{"error": ...}`` naming it. Live books are read again when older than ``refresh_s``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from gpusched.core.errors import GpuschedError, ResourceError
from gpusched.doctor.analysis import doctor_node, doctor_pod, gpu_map
from gpusched.doctor.books import Books
from gpusched.doctor.errors import UnknownObject
from gpusched.doctor.page import PAGE


class BooksCache:
    """The books, read again by ``load`` when older than ``refresh_s`` (never, for a snapshot)."""

    def __init__(self, load: Callable[[], Books], refresh_s: float | None) -> None:
        self._load, self._refresh = load, refresh_s
        self._books: Books | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def get(self) -> Books:
        with self._lock:
            stale = self._refresh is not None and time.monotonic() - self._at > self._refresh
            if self._books is None or stale:
                self._books = self._load()
                self._at = time.monotonic()
            return self._books


def make_handler(cache: BooksCache) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._send(code, json.dumps(obj).encode(), "application/json")

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if url.path in ("/", "/index.html"):
                    self._send(200, PAGE.encode(), "text/html; charset=utf-8")
                elif url.path == "/healthz":
                    self._send(200, b"ok", "text/plain")
                elif url.path == "/api/map":
                    self._json(200, gpu_map(cache.get()))
                elif url.path == "/api/pod":
                    self._json(200, doctor_pod(cache.get(), q.get("name", "")).to_dict())
                elif url.path == "/api/node":
                    self._json(200, doctor_node(cache.get(), q.get("name", "")).to_dict())
                else:
                    self._json(404, {"error": f"no such page {url.path}"})
            except UnknownObject as e:
                self._json(404, {"error": str(e)})
            except GpuschedError as e:
                self._json(503, {"error": str(e)})

    return Handler


def serve(cache: BooksCache, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    """A started server (in a daemon thread); ``shutdown()`` stops it. ResourceError names the
    address when it cannot listen there."""
    try:
        server = ThreadingHTTPServer((host, port), make_handler(cache))
    except OSError as e:
        raise ResourceError(f"gpusched ui: cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gpusched-ui", daemon=True).start()
    return server
