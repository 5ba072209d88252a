"""``testenv.etcd.compact`` against a fake of etcd's v3 JSON gateway (the real one: the e2e compare bench)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpusched.testenv.etcd import EtcdError, compact


class _Gateway:
    def __init__(self, revision: int, compacted: int = 0, fail: str | None = None) -> None:
        self.revision, self.compacted, self.fail = revision, compacted, fail
        self.requests: list[tuple[str, dict[str, object]]] = []


@pytest.fixture
def gateway() -> Iterator[tuple[_Gateway, str]]:
    gw = _Gateway(revision=1234)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            gw.requests.append((self.path, body))
            out: dict[str, object]
            if self.path == "/v3/kv/range":
                out, code = {"header": {"revision": str(gw.revision)}}, 200
            elif gw.fail:
                out, code = {"error": gw.fail, "code": 11, "message": gw.fail}, 400
            elif int(body["revision"]) <= gw.compacted:
                msg = "etcdserver: mvcc: required revision has been compacted"
                out, code = {"error": msg, "code": 11, "message": msg}, 400
            else:
                gw.compacted = int(body["revision"])
                out, code = {"header": {"revision": str(gw.revision)}}, 200
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield gw, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


def test_compacts_physically_at_the_current_revision(gateway: tuple[_Gateway, str]) -> None:
    gw, url = gateway
    assert compact(url) == 1234
    assert gw.requests[-1] == ("/v3/kv/compaction", {"revision": "1234", "physical": True})
    assert gw.compacted == 1234


def test_nothing_written_since_the_last_compaction_is_no_error(gateway: tuple[_Gateway, str]) -> None:
    gw, url = gateway
    compact(url)
    assert compact(url) == 1234 and gw.compacted == 1234
    gw.revision = 2000
    assert compact(url) == 2000 and gw.compacted == 2000


def test_any_other_refusal_is_raised_with_etcds_words(gateway: tuple[_Gateway, str]) -> None:
    gw, url = gateway
    gw.fail = "etcdserver: permission denied"
    with pytest.raises(EtcdError, match=r"HTTP 400.*permission denied"):
        compact(url)


def test_an_etcd_that_does_not_answer_is_named() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(EtcdError, match=rf"etcd http://127.0.0.1:{port}/v3/kv/range: no answer"):
        compact(f"http://127.0.0.1:{port}", timeout=5.0)
