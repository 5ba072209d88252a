"""The extender's verbs wait for its books before answering (issue 9, fault A).

kube-scheduler calls the extender's urlPrefix directly, with no readiness gate: an extender
restarted under it must not answer /filter or /bind from empty books. Each verb waits (without
blocking the event loop) until ``ready()``, then refuses with an ``Error`` saying why.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusched.extender.app import make_app
from gpusched.extender.handlers import Extender
from gpusched.extender.serve import build_profile
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.state import LiveCluster
from test_extender_handlers import FakeBinder, node, pod

NOT_SYNCED = "informers have not synced"
# n1: one GPU, taken by "busy" (which the informer has not delivered yet when the extender restarts)
N1 = node("n1", gpus=1)
BUSY = pod("busy", gpus=1, node_name="n1", annotations={ANN_ASSIGNMENT: '{"node":"n1","gpus":[0]}'})


class Gate:
    """``ready`` for make_app: False until ``open()``; ``asked`` is set the first time a verb asks."""

    def __init__(self) -> None:
        self.is_open = False
        self.asked = asyncio.Event()

    def __call__(self) -> bool:
        if not self.is_open:
            self.asked.set()
        return self.is_open


@asynccontextmanager
async def serving(ext: Extender, ready: Callable[[], bool], **kw: Any) -> AsyncIterator[TestClient[Any, Any]]:
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(ext, ready=ready, **kw)))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()


async def post(c: TestClient[Any, Any], verb: str, args: Any) -> tuple[int, Any]:
    r = await c.post(verb, data=json.dumps(args).encode(), headers={"Content-Type": "application/json"})
    return r.status, await r.json(content_type=None)


def restarted() -> Extender:
    """An extender just after a restart: empty books, the informers still listing."""
    return Extender(LiveCluster(), build_profile("bestfit"), binder=FakeBinder())


def informers_deliver(ext: Extender) -> None:
    ext.cluster.upsert_node(N1)
    ext.cluster.upsert_pod(BUSY)
    ext.on_pod_event(parse_pod_event(BUSY))


FILTER = {"Pod": pod("p", gpus=1), "Nodes": {"items": [N1]}, "NodeNames": None}  # nodeCacheCapable: false


def test_verbs_before_sync_are_refused_not_answered_from_empty_books() -> None:
    """With empty books the sent node object looks free: the filter must not pass it."""
    ext = restarted()

    async def main() -> None:
        async with serving(ext, lambda: False, sync_wait_s=0.05) as c:
            status, body = await post(c, "/filter", FILTER)
            assert status == 200  # kube-scheduler reads the Error of a 200 into its event, and retries
            assert NOT_SYNCED in body["Error"]
            assert body["Nodes"] is None and body["NodeNames"] is None
            status, body = await post(c, "/bind", {"PodName": "p", "PodUID": "uid-p", "Node": "n1"})
            assert status == 200 and NOT_SYNCED in body["Error"]
            for verb in ("/prioritize", "/preempt"):
                status, body = await post(c, verb, {**FILTER, "NodeNameToMetaVictims": {}})
                assert status == 503 and NOT_SYNCED in body["Error"], verb
            r = await c.get("/readyz")
            assert r.status == 503
            text = await (await c.get("/metrics")).text()
            assert 'gpusched_extender_sync_waits_total{result="refused",verb="filter"} 1.0' in text
            assert 'gpusched_extender_sync_waits_total{result="refused",verb="bind"} 1.0' in text

    asyncio.run(main())
    (binder,) = ext.profile.binds
    assert isinstance(binder, FakeBinder) and binder.calls == []  # nothing was bound
    with ext.cluster.live_books() as snap:
        assert not snap.allocations


def test_filter_sent_just_before_sync_is_answered_after_it() -> None:
    """A filter arriving while the informers list waits for them, without blocking the loop,
    and is then answered from the whole books: n1's only GPU is taken."""
    ext = restarted()
    gate = Gate()

    async def main() -> None:
        async with serving(ext, gate, sync_wait_s=60) as c:
            sent = asyncio.create_task(post(c, "/filter", FILTER))
            asked = asyncio.create_task(gate.asked.wait())
            done, _ = await asyncio.wait({sent, asked}, return_when=asyncio.FIRST_COMPLETED)
            assert asked in done and not sent.done(), f"answered before the informers synced: {sent}"
            r = await c.get("/healthz")  # the loop is not blocked by the waiting filter
            assert r.status == 200 and not sent.done()
            informers_deliver(ext)
            gate.is_open = True
            status, body = await sent
            assert status == 200 and body["Error"] == ""
            assert body["Nodes"]["items"] == []
            assert body["FailedNodes"] == {"n1": "Insufficient GPU"}
            text = await (await c.get("/metrics")).text()
            assert 'gpusched_extender_sync_waits_total{result="served",verb="filter"} 1.0' in text
            # once synced, a bind is served straight away
            status, body = await post(c, "/bind", {"PodName": "busy", "PodUID": "uid-busy", "Node": "n1"})
            assert status == 200 and NOT_SYNCED not in body["Error"]

    asyncio.run(main())


def test_cli_settings_are_checked_and_passed() -> None:
    from gpusched.cli import extender as typer_extender
    from gpusched.cli.serve import extender_main
    from gpusched.extender.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_SYNC_WAIT_S

    with pytest.raises(ValueError, match="--sync-wait-seconds"):
        extender_main(["--sync-wait-seconds", "120"])
    with pytest.raises(ValueError, match="--max-body-bytes"):
        extender_main(["--max-body-bytes", "10"])
    import inspect

    defaults = {k: p.default for k, p in inspect.signature(typer_extender).parameters.items()}
    assert defaults["max_body_bytes"] == DEFAULT_MAX_BODY_BYTES
    assert defaults["sync_wait_seconds"] == DEFAULT_SYNC_WAIT_S
