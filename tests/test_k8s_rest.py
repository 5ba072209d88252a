"""``FastCoreV1`` sends what ``CoreV1Api`` sends for the hot calls: method, path, content type,
body, the bearer token; and maps an answer outside 2xx to ``ApiException`` with its status."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.k8s.binder import APIBinder, read_pod
from gpusched.k8s.rest import FastCoreV1

Seen = list[tuple[str, str, str, str, Any]]


@pytest.fixture
def server() -> Iterator[tuple[str, Seen, dict[str, int]]]:
    seen: Seen = []
    answer = {"status": 201}

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n)) if n else None
            seen.append((self.command, self.path, self.headers.get("Content-Type", ""),
                         self.headers.get("Authorization", ""), body))  # fmt: skip
            out = json.dumps({"kind": "Status", "message": "nope"} if answer["status"] >= 300 else
                             {"metadata": {"name": "p", "uid": "u-1"}}).encode()  # fmt: skip
            self.send_response(answer["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = do_PATCH = _any

        def log_message(self, *a: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, answer
    finally:
        httpd.shutdown()


def _fast(url: str) -> FastCoreV1:
    cfg = client.Configuration()
    cfg.host = url
    cfg.api_key = {"authorization": "t0k"}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return FastCoreV1(client.ApiClient(cfg))


def test_hot_calls_go_where_the_client_sends_them(server: tuple[str, Seen, dict[str, int]]) -> None:
    url, seen, _ = server
    fast = _fast(url)
    from gpusched.core.model import PodSpec

    pod = PodSpec("p", 100, 100, 1, 300, namespace="ml", uid="u-1")
    assert APIBinder(fast).bind(pod, "n3", (2,)).ok  # type: ignore[arg-type]
    assert APIBinder(fast, in_binding=False).bind(pod, "n3", (2,)).ok  # type: ignore[arg-type]
    fast.create_namespaced_event("ml", {"kind": "Event"})
    fast.patch_namespaced_pod_status("p", "ml", {"status": {"nominatedNodeName": "n3"}})
    assert read_pod(fast, "ml", "p") == {"metadata": {"name": "p", "uid": "u-1"}}  # type: ignore[arg-type]
    calls = [(m, p, ct) for m, p, ct, _, _ in seen]
    assert calls == [
        ("POST", "/api/v1/namespaces/ml/pods/p/binding", "application/json"),
        ("PATCH", "/api/v1/namespaces/ml/pods/p", "application/strategic-merge-patch+json"),
        ("POST", "/api/v1/namespaces/ml/pods/p/binding", "application/json"),
        ("POST", "/api/v1/namespaces/ml/events", "application/json"),
        ("PATCH", "/api/v1/namespaces/ml/pods/p/status", "application/strategic-merge-patch+json"),
        ("GET", "/api/v1/namespaces/ml/pods/p", ""),
    ]
    assert all(auth == "Bearer t0k" for *_, auth, _ in seen)
    binding = seen[0][4]
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n3"}
    assert (
        binding["metadata"]["uid"] == "u-1" and "gpusched.io/assignment" in binding["metadata"]["annotations"]
    )
    assert seen[1][4]["metadata"]["uid"] == "u-1"  # the patch's UID precondition


@pytest.mark.parametrize("status", [404, 409, 422, 500])
def test_answers_outside_2xx_raise_with_their_status(
    server: tuple[str, Seen, dict[str, int]], status: int
) -> None:
    url, _, answer = server
    answer["status"] = status
    with pytest.raises(ApiException) as e:
        _fast(url).create_namespaced_binding("ml", {"metadata": {"name": "p"}})
    assert e.value.status == status and "nope" in str(e.value.body)


def test_read_back_of_a_missing_pod_is_none(server: tuple[str, Seen, dict[str, int]]) -> None:
    url, _, answer = server
    answer["status"] = 404
    assert read_pod(_fast(url), "ml", "p") is None  # type: ignore[arg-type]
