"""``k8s.informer_async.AsyncReflector`` against a fake apiserver (aiohttp): what it asks for
(the list's version, bookmarks, no compression, the token), what it hands on, and how it
recovers: a watch that ends resumes from the last version seen (a bookmark's too), ``410 Gone``
as an event or as an answer relists, another error backs off and resumes, and any chunking of
the stream, a last event without its newline included, gives the same events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.k8s.aio import AioAPI
from gpusched.k8s.informer import Handlers
from gpusched.k8s.informer_async import AsyncReflector
from test_extender_apibind import cfg


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


Script = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeAPI:
    """``GET /api/v1/pods``: the list (``items`` at ``list_rv``), and with ``watch=true`` the next
    of ``watches``: each one answers one watch request (a stream of events, or an HTTP error)."""

    def __init__(self, items: list[dict[str, Any]], list_rv: str, watches: list[Script]) -> None:
        self.items, self.list_rv = items, list_rv
        self.watches = watches
        self.requests: list[tuple[dict[str, str], dict[str, str]]] = []  # (query, headers)
        self.done = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((dict(request.query), dict(request.headers)))
        if request.query.get("watch") != "true":
            return web.json_response({"items": self.items, "metadata": {"resourceVersion": self.list_rv}})
        if not self.watches:
            self.done.set()
            await asyncio.sleep(3600)  # a quiet watch until the test stops the reflector
        return await self.watches.pop(0)(request)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self.handle)
        return app

    def watch_requests(self) -> list[dict[str, str]]:
        return [q for q, _ in self.requests if q.get("watch") == "true"]

    def list_requests(self) -> int:
        return sum(1 for q, _ in self.requests if q.get("watch") != "true")


def stream(*chunks: bytes) -> Script:
    """A watch answered with ``chunks`` (each written and flushed apart), then ended."""

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        for c in chunks:
            await resp.write(c)
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    return answer


def status(code: int) -> Script:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"kind": "Status", "code": code, "message": f"status {code}"}, status=code)

    return answer


class Seen:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []  # (upsert|delete|synced, name or count)

    def handlers(self) -> Handlers:
        return Handlers(
            lambda o: self.events.append(("upsert", o["metadata"]["name"])),
            lambda o: self.events.append(("delete", o["metadata"]["name"])),
            lambda items: self.events.append(("synced", str(len(items)))),
        )


def run(fake: FakeAPI, seen: Seen, token: str = "") -> AsyncReflector:
    """Serve ``fake``, run a reflector until its scripted watches are used up, stop it."""

    async def go() -> AsyncReflector:
        server = TestServer(fake.app())
        await server.start_server()
        api = AioAPI(cfg(str(server.make_url("")).rstrip("/"), token=token), user_agent="test")
        r = AsyncReflector("pods", api, "/api/v1/pods", seen.handlers(), backoff_s=0.01).start()
        try:
            await asyncio.wait_for(fake.done.wait(), 10)
        finally:
            await r.stop()
            await api.close()
            await server.close()
        return r

    return asyncio.run(go())


def test_lists_then_watches_from_the_lists_version_and_resumes_from_the_last_one_seen() -> None:
    bookmark = {"metadata": {"resourceVersion": "15"}}
    fake = FakeAPI(
        [pod("a", "3"), pod("b", "4")],
        "10",
        [
            stream(event("ADDED", pod("c", "11")), event("MODIFIED", pod("a", "12")), event("BOOKMARK", bookmark)),
            stream(event("DELETED", pod("b", "16"))),
        ],
    )
    seen = Seen()
    r = run(fake, seen, token="t0k")
    assert seen.events == [
        ("upsert", "a"), ("upsert", "b"), ("synced", "2"),
        ("upsert", "c"), ("upsert", "a"),
        ("delete", "b"),
    ]  # fmt: skip
    watches = fake.watch_requests()
    assert [w["resourceVersion"] for w in watches] == ["10", "15", "16"]  # the bookmark's, then the last event's
    assert all(w["allowWatchBookmarks"] == "true" and int(w["timeoutSeconds"]) > 0 for w in watches)
    assert fake.list_requests() == 1 and r.relists == 1 and r.synced.is_set()
    for _, headers in fake.requests:
        assert headers["Accept-Encoding"] == "identity"  # 1.37 would gzip every event otherwise
        assert headers["Authorization"] == "Bearer t0k"
        assert headers["Accept"] == "application/json"


def test_gone_as_an_event_or_as_an_answer_relists() -> None:
    gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
    fake = FakeAPI(
        [pod("a", "3")],
        "10",
        [stream(event("ADDED", pod("b", "11")), event("ERROR", gone)), status(410)],
    )
    seen = Seen()
    r = run(fake, seen)
    assert fake.list_requests() == 3 and r.relists == 3
    assert [w["resourceVersion"] for w in fake.watch_requests()] == ["10", "10", "10"]
    assert seen.events.count(("synced", "1")) == 3 and ("upsert", "b") in seen.events


def test_other_errors_back_off_and_resume_where_they_were() -> None:
    fake = FakeAPI(
        [],
        "10",
        [
            stream(event("ADDED", pod("a", "11"))),
            status(500),
            stream(b"{not json\n"),  # a broken line: resumed from the version before it
            stream(event("ADDED", pod("b", "12"))),
        ],
    )
    seen = Seen()
    r = run(fake, seen)
    assert [w["resourceVersion"] for w in fake.watch_requests()] == ["10", "11", "11", "11", "12"]
    assert r.relists == 1 and [e for e in seen.events if e[0] == "upsert"] == [("upsert", "a"), ("upsert", "b")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=40), st.booleans())
def test_any_chunking_of_the_stream_gives_the_same_events(cuts: list[int], last_newline: bool) -> None:
    names = [f"p{i}" for i in range(6)]
    data = b"\n".join(event("ADDED", pod(n, str(20 + i))).rstrip(b"\n") for i, n in enumerate(names))
    data += b"\n" if last_newline else b""
    chunks, i = [], 0
    for c in cuts * (len(data) // sum(cuts) + 1):
        if i >= len(data):
            break
        chunks.append(data[i : i + c])
        i += c
    fake = FakeAPI([], "10", [stream(*chunks)])
    seen = Seen()
    run(fake, seen)
    assert [n for k, n in seen.events if k == "upsert"] == names
    assert [w["resourceVersion"] for w in fake.watch_requests()] == ["10", "25"]
