"""``/bind``'s first attempt on the event loop (``extender.apibind``): against a fake apiserver
(aiohttp), the Binding it sends, how it reads each answer, and that anything but success goes on
to the threaded binding loop, which settles it as before."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpusched.core.mig.books import MigSlot
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.extender.apibind import AsyncAPIBinder
from gpusched.extender.app import make_app
from gpusched.extender.serve import EVENT_LOOPS, new_event_loop
from gpusched.k8s.convert import ANN_ASSIGNMENT, parse_assignment
from gpusched.k8s.migconvert import assignment_mig
from test_extender_handlers import FakeBinder, make, node, pod


class FakeAPI:
    """``POST /api/v1/namespaces/{ns}/pods/{name}/binding``: records the body, answers ``status``."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.status = 201
        self.message = ""

    def app(self) -> web.Application:
        async def binding(request: web.Request) -> web.Response:
            self.bodies.append(json.loads(await request.read()))
            self.headers.append(dict(request.headers))
            body = {"kind": "Status", "message": self.message} if self.status >= 300 else {"kind": "Status"}
            return web.json_response(body, status=self.status)

        app = web.Application()
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
        return app


def cfg(host: str, token: str = "") -> Any:
    auth = (
        {"BearerToken": {"in": "header", "key": "authorization", "value": f"Bearer {token}"}} if token else {}
    )
    return SimpleNamespace(
        host=host,
        ssl_ca_cert=None,
        verify_ssl=True,
        cert_file=None,
        key_file=None,
        auth_settings=lambda: auth,
    )


@pytest.fixture(params=EVENT_LOOPS)
def api(request: pytest.FixtureRequest) -> Iterator[tuple[FakeAPI, TestServer, asyncio.AbstractEventLoop]]:
    """The fake apiserver and the binder on each event loop ``gpusched extender`` can run."""
    loop = new_event_loop(request.param)
    fake = FakeAPI()
    server = TestServer(fake.app(), loop=loop)
    loop.run_until_complete(server.start_server())
    yield fake, server, loop
    loop.run_until_complete(server.close())
    loop.close()


POD = PodSpec(name="p", namespace="ns", uid="uid-p", gpu_milli=250, gpu_memory_mib=0, num_gpu=1)


def bind_once(binder: AsyncAPIBinder, loop: asyncio.AbstractEventLoop) -> Status:
    async def go() -> Status:
        try:
            return await binder.bind(POD, "n1", (3,))
        finally:
            await binder.close()

    return loop.run_until_complete(go())


def test_sends_the_binding_with_its_assignment_and_uid(
    api: tuple[FakeAPI, TestServer, asyncio.AbstractEventLoop],
) -> None:
    fake, server, loop = api
    st = bind_once(AsyncAPIBinder(cfg(str(server.make_url("")), token="t0k")), loop)
    assert st.ok
    (body,) = fake.bodies
    assert body["kind"] == "Binding" and body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert body["metadata"]["uid"] == "uid-p" and body["metadata"]["name"] == "p"
    ann = {"metadata": {"annotations": body["metadata"]["annotations"]}, "spec": {"nodeName": "n1"}}
    assert parse_assignment(ann) == ("n1", (3,))
    assert ANN_ASSIGNMENT in body["metadata"]["annotations"]
    assert fake.headers[0]["Authorization"] == "Bearer t0k"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (404, Code.UNSCHEDULABLE_AND_UNRESOLVABLE),  # the pod is gone
        (422, Code.UNSCHEDULABLE),  # refused, nothing written
        (409, Code.ERROR),  # already bound, perhaps by an attempt whose answer was lost: unknown
        (429, Code.ERROR),
        (500, Code.ERROR),
    ],
)
def test_reads_answers_as_the_threaded_binder_does(
    api: tuple[FakeAPI, TestServer, asyncio.AbstractEventLoop], status: int, code: Code
) -> None:
    fake, server, loop = api
    fake.status, fake.message = status, "nope"
    st = bind_once(AsyncAPIBinder(cfg(str(server.make_url("")))), loop)
    assert st.code == code and st.reasons[0].startswith(f"{status} ") and "nope" in st.reasons[0]


def test_no_answer_is_an_unknown_outcome() -> None:
    loop = asyncio.new_event_loop()
    try:
        st = bind_once(AsyncAPIBinder(cfg("http://127.0.0.1:9"), timeout_s=2.0), loop)  # nothing listens
    finally:
        loop.close()
    assert st.code == Code.ERROR


class FirstBinder:
    """A first binder answering ``answer`` and counting its calls."""

    def __init__(self, answer: Status) -> None:
        self.answer, self.calls, self.closed = answer, 0, False

    async def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status:
        self.calls += 1
        return self.answer

    async def close(self) -> None:
        self.closed = True


def post_bind(first: FirstBinder, threaded: FakeBinder, api_pod: dict[str, Any] | None) -> tuple[Any, Any]:
    e = make([node("n1", gpus=1)], binder=threaded, bind_budget_s=5.0)  # each case settles on its first read
    e.pod_getter = lambda ns, name: api_pod  # type: ignore[assignment,return-value]
    e.filter({"Pod": pod("p", gpus=1, uid="uid-p"), "NodeNames": ["n1"]})
    loop = asyncio.new_event_loop()
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(e, first_binder=first)), loop=loop)

    async def go() -> Any:
        r = await c.post(
            "/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"}
        )
        return await r.json()

    try:
        loop.run_until_complete(c.start_server())
        answer = loop.run_until_complete(go())
    finally:
        loop.run_until_complete(c.close())
        loop.close()
    assert first.closed
    with e.cluster.live_books() as snap:
        return answer, snap.allocations.get("default/p")


def test_a_first_attempt_that_binds_is_final() -> None:
    first, threaded = FirstBinder(Status.success()), FakeBinder()
    answer, held = post_bind(first, threaded, None)
    assert answer == {"Error": ""} and first.calls == 1 and threaded.calls == []
    assert held is not None  # booked until the informer shows it bound


def test_an_unknown_first_outcome_is_settled_by_reading_the_pod_back() -> None:
    # the first attempt lost its answer; the API shows the pod bound to n1: bound, no second attempt
    first, threaded = FirstBinder(Status(Code.ERROR, ("ClientOSError",))), FakeBinder()
    answer, held = post_bind(first, threaded, pod("p", gpus=1, uid="uid-p", node_name="n1"))
    assert answer == {"Error": ""} and threaded.calls == []
    assert held is not None


def test_a_refused_first_attempt_releases_the_gpus() -> None:
    first = FirstBinder(Status(Code.UNSCHEDULABLE, ("403 Forbidden: no",)))
    answer, held = post_bind(first, FakeBinder(), pod("p", gpus=1, uid="uid-p"))
    assert "403 Forbidden" in answer["Error"]
    assert held is None


def test_parallel_binding_cycles_are_not_serialised() -> None:
    """kube-scheduler binds pods in parallel goroutines: ``PARALLEL`` /bind requests must all be
    at the apiserver at once. The fake apiserver holds every binding until that many are in
    flight (a serialised /bind would never get there and each binding would fail after 10 s)."""
    parallel = 8
    e = make([node(f"n{i}", gpus=1) for i in range(parallel)],
             binder=FakeBinder(fail=Status(Code.UNSCHEDULABLE, ("threaded retry",))))  # fmt: skip
    for i in range(parallel):
        e.filter({"Pod": pod(f"p{i}", gpus=1, uid=f"uid-{i}"), "NodeNames": [f"n{i}"]})
    loop = asyncio.new_event_loop()
    arrived, all_in = 0, asyncio.Event()

    async def binding(request: web.Request) -> web.Response:
        nonlocal arrived
        arrived += 1
        if arrived == parallel:
            all_in.set()
        try:
            await asyncio.wait_for(all_in.wait(), 10.0)
        except TimeoutError:
            return web.json_response({"message": "alone"}, status=500)
        return web.json_response({"kind": "Status"}, status=201)

    api = web.Application()
    api.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
    api_server = TestServer(api, loop=loop)
    loop.run_until_complete(api_server.start_server())
    first = AsyncAPIBinder(cfg(str(api_server.make_url(""))))
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(e, first_binder=first)), loop=loop)

    async def bind(i: int) -> Any:
        args = {"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"uid-{i}", "Node": f"n{i}"}
        r = await c.post("/bind", json=args)
        return await r.json()

    async def all_binds() -> list[Any]:
        return await asyncio.gather(*(bind(i) for i in range(parallel)))

    try:
        loop.run_until_complete(c.start_server())
        answers = loop.run_until_complete(all_binds())
    finally:
        loop.run_until_complete(c.close())
        loop.run_until_complete(api_server.close())
        loop.close()
    assert answers == [{"Error": ""}] * parallel
    assert arrived == parallel


class StalledBinder(FirstBinder):
    """A first binder whose apiserver never answers."""

    async def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status:
        self.calls += 1
        await asyncio.sleep(3600)
        return self.answer


def test_a_stalled_first_attempt_ends_within_the_budget_and_keeps_the_gpus() -> None:
    """kube-scheduler gives ``/bind`` 10 s: an apiserver that does not answer must not hold the
    request past the extender's budget (the client's own timeout is 30 s); the outcome is unknown,
    so the booking stays, and kube-scheduler's retry of the pod is sent back to the same node."""
    e = make([node("n1", gpus=1), node("n2", gpus=1)], binder=FakeBinder(), bind_budget_s=0.5)

    def slow_read(ns: str, name: str) -> dict[str, Any]:  # as slow as the bindings: no time left for it
        time.sleep(5.0)
        return pod("p", gpus=1, uid="uid-p")

    e.pod_getter = slow_read  # type: ignore[assignment]
    args = {"Pod": pod("p", gpus=1, uid="uid-p"), "NodeNames": ["n1", "n2"]}
    assert e.filter(args)["NodeNames"] == ["n1", "n2"]
    loop = asyncio.new_event_loop()
    first = StalledBinder(Status.success())
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(e, first_binder=first)), loop=loop)

    async def go() -> tuple[Any, float]:
        t0 = loop.time()
        r = await c.post(
            "/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n2"}
        )
        return await r.json(), loop.time() - t0

    try:
        loop.run_until_complete(c.start_server())
        answer, took = loop.run_until_complete(go())
    finally:
        loop.run_until_complete(c.close())
        loop.close()
    assert "no answer within 0.5 s" in answer["Error"] and took < 3.0
    assert e.settler.held() == ["default/p"]  # the settler reads it back later
    with e.cluster.live_books() as snap:
        held = snap.allocations.get("default/p")
        assert held is not None and snap.names[held.node] == "n2"  # kept: the binding may still land
    # kube-scheduler retries the pod: the same node again, not a second booking elsewhere
    assert e.filter(args)["NodeNames"] == ["n2"]
    r = e.filter({**args, "NodeNames": ["n1"]})
    assert r["NodeNames"] == [] and "held on node n2" in r["FailedNodes"]["n1"]


class Slices:
    """The books' MIG slices of one pod (``k8s.binder.MigBooks``)."""

    def __init__(self, slots: dict[str, tuple[MigSlot, ...]]) -> None:
        self.slots = slots

    def mig_of(self, key: str) -> tuple[MigSlot, ...]:
        return self.slots.get(key, ())


def test_a_mig_pods_binding_carries_the_slices_the_books_placed(
    api: tuple[FakeAPI, TestServer, asyncio.AbstractEventLoop],
) -> None:
    """The extender's first binder writes the MIG slices its books chose into the assignment, as the
    standalone scheduler's does, so the agent hands the container exactly those instances."""
    fake, server, loop = api
    mig_pod = PodSpec(name="m", namespace="ns", uid="uid-m", mig=("1g.10gb", "3g.40gb"))
    placed = (MigSlot(0, 6, "1g.10gb"), MigSlot(2, 4, "3g.40gb"))
    binder = AsyncAPIBinder(cfg(str(server.make_url(""))), mig=Slices({"ns/m": placed}))

    async def go() -> Status:
        try:
            return await binder.bind(mig_pod, "n1", ())
        finally:
            await binder.close()

    assert loop.run_until_complete(go()).ok
    (body,) = fake.bodies
    assert assignment_mig({"metadata": {"annotations": body["metadata"]["annotations"]}}) == placed
