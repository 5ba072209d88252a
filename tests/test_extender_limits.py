"""What one request may carry, and what the extender answers beyond it (issue 9, fault B).

Over a limit: HTTP 400 ``{"Error": ...}`` naming the field and the limit (413 for the body);
never a 5xx, a traceback or a stall. A node claiming more than ``MAX_GPUS_PER_NODE`` GPUs (or an
absurd amount of anything) is refused where nodes are converted, for the informer too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.extender import app as app_module
from gpusched.extender.app import make_app
from gpusched.extender.handlers import Extender
from gpusched.extender.protocol import (
    MAX_DEPTH,
    MAX_NAME_CHARS,
    MAX_NODES,
    MAX_QUANTITY_CHARS,
    MAX_VICTIMS_PER_NODE,
    json_depth,
)
from gpusched.k8s.convert import MAX_GPUS_PER_NODE, InvalidRequest, node_from_k8s
from gpusched.k8s.state import LiveCluster
from test_extender_handlers import make, node, pod

VERBS = ("/filter", "/prioritize", "/preempt", "/bind")
POST = b"POST /filter HTTP/1.1\r\nHost: x\r\n"


def run(ext: Extender, test: Callable[[TestClient[Any, Any]], Coroutine[Any, Any, None]], **kw: Any) -> None:
    async def main() -> None:
        c: TestClient[Any, Any] = TestClient(TestServer(make_app(ext, **kw)))
        await c.start_server()
        try:
            await test(c)
        finally:
            await c.close()

    asyncio.run(main())


async def post(c: TestClient[Any, Any], verb: str, data: Any, **kw: Any) -> tuple[int, Any]:
    raw = data if isinstance(data, bytes) else orjson.dumps(data)
    r = await c.post(verb, data=raw, headers={"Content-Type": "application/json"}, **kw)
    text = await r.text()
    return r.status, json.loads(text)  # every answer is JSON


def with_alloc(name: str, **alloc: str) -> dict[str, Any]:
    n = node(name)
    n["status"]["allocatable"] = {**n["status"]["allocatable"], **alloc}
    n["status"]["capacity"] = n["status"]["allocatable"]
    return n


# ----------------------------------------------------------------------------------- nodes' claims
def test_node_gpu_count_is_capped_where_nodes_are_converted() -> None:
    assert node_from_k8s(with_alloc("ok", **{"nvidia.com/gpu": str(MAX_GPUS_PER_NODE)})).gpu_count == 128
    with pytest.raises(InvalidRequest, match=r"nvidia.com/gpu 129 is more than 128"):
        node_from_k8s(with_alloc("big", **{"nvidia.com/gpu": str(MAX_GPUS_PER_NODE + 1)}))
    live = LiveCluster()  # the informer path: the node is ignored, the books stay narrow
    live.upsert_node(with_alloc("big", **{"nvidia.com/gpu": "10000"}))
    live.upsert_node(node("n1"))
    with live.live_books() as snap:
        assert list(snap.index) == ["n1"] and snap.max_gpus == 2


@pytest.mark.parametrize(
    ("alloc", "labels", "needle"),
    [
        ({"nvidia.com/gpu": "100000000"}, {}, "nvidia.com/gpu 100000000 is more than 128"),
        ({"cpu": "1e30"}, {}, "allocatable cpu: '1e30' is more than"),
        ({"cpu": "1e4000"}, {}, "allocatable cpu: '1e4000' is more than"),
        ({"cpu": "Infinity"}, {}, "allocatable cpu: 'Infinity' is more than"),
        ({"memory": "NaN"}, {}, "allocatable memory: 'NaN' is not a Kubernetes quantity"),
        ({"memory": "1e30"}, {}, "allocatable memory: '1e30' is more than"),
        ({"pods": "1e30"}, {}, "allocatable pods: '1e30' is more than"),
        ({"rdma/hca": "1e30"}, {}, "allocatable rdma/hca: '1e30' is more than"),
        ({"hugepages-2Mi": "1e40"}, {}, "allocatable hugepages-2Mi: '1e40' is more than"),
        ({}, {"nvidia.com/gpu.memory": "9" * 30}, "label nvidia.com/gpu.memory: '9999"),
    ],
)
def test_node_object_with_absurd_claim_fails_alone(
    alloc: dict[str, str], labels: dict[str, str], needle: str
) -> None:
    """Sent as an object (nodeCacheCapable: false): that node fails, unresolvable, with the
    reason; the other nodes are served; no 5xx."""
    bad = with_alloc("bad", **alloc)
    bad["metadata"]["labels"].update(labels)
    ext = make([node("n1")])

    async def test(c: TestClient[Any, Any]) -> None:
        args = {"Pod": pod("p", milli=100), "Nodes": {"items": [bad, node("n2")]}, "NodeNames": None}
        status, body = await post(c, "/filter", args)
        assert status == 200 and body["Error"] == ""
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["n2"]
        assert needle in body["FailedAndUnresolvableNodes"]["bad"]
        status, body = await post(c, "/prioritize", args)
        assert status == 200 and body == [{"Host": "bad", "Score": 0}, {"Host": "n2", "Score": 10}]

    run(ext, test)


# ------------------------------------------------------------------------------------ request limits
def names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


N = MAX_NODES + 1
OVER = [
    ("/filter", {"NodeNames": names(N)}, f"'NodeNames' has {N} entries, more than the limit of {MAX_NODES}"),
    ("/prioritize", {"NodeNames": names(N)}, f"more than the limit of {MAX_NODES}"),
    ("/filter", {"Nodes": {"items": [{}] * N}}, f"'Nodes.items' has {N} entries"),
    ("/filter", {"NodeNames": ["n1", "x" * 254]}, f"254 characters, more than the limit of {MAX_NAME_CHARS}"),
    ("/prioritize", {"NodeNames": ["x" * 10_000]}, "10000 characters, more than the limit of 253"),
    ("/filter", {"Nodes": {"items": [node("x" * 300)]}}, "'Nodes.items.metadata.name': a node name of 300"),
    (
        "/preempt",
        {"NodeNameToMetaVictims": {f"n{i}": {} for i in range(N)}},
        f"'NodeNameToMetaVictims' has {N}",
    ),
    ("/preempt", {"NodeNameToVictims": {"x" * 254: {"Pods": []}}}, "'NodeNameToVictims': a node name of 254"),
    (
        "/preempt",
        {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u"}] * (MAX_VICTIMS_PER_NODE + 1)}}},
        f"'NodeNameToMetaVictims[n1].Pods' has {MAX_VICTIMS_PER_NODE + 1} entries",
    ),
]


@pytest.mark.parametrize(("verb", "args", "needle"), OVER)
def test_over_limit_requests_get_400_naming_field_and_limit(
    verb: str, args: dict[str, Any], needle: str
) -> None:
    ext = make([node("n1")])

    async def test(c: TestClient[Any, Any]) -> None:
        status, body = await post(c, verb, {"Pod": pod("p", milli=100), **args})
        assert status == 400, body
        assert needle in body["Error"]

    run(ext, test)


@pytest.mark.parametrize(
    ("quantity", "needle"),
    [
        ("9" * 65, f"a quantity of 65 characters, more than the limit of {MAX_QUANTITY_CHARS}"),
        ("1e4000", "'1e4000' is more than the limit of 1e18"),
        ("Infinity", "'Infinity' is more than the limit of 1e18"),
        ("2Ei", "'2Ei' is more than the limit of 1e18"),
    ],
)
def test_pod_quantity_over_limit_gets_400(quantity: str, needle: str) -> None:
    ext = make([node("n1")])
    p = pod("p", milli=100)
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": quantity}}}]

    async def test(c: TestClient[Any, Any]) -> None:
        for verb in ("/filter", "/prioritize", "/preempt"):
            status, body = await post(c, verb, {"Pod": p, "NodeNames": ["n1"]})
            assert status == 400, (verb, body)
            assert "Pod.spec.initContainers[0].resources.requests[cpu]" in body["Error"]
            assert needle in body["Error"]

    run(ext, test)


# -------------------------------------------------------------------------------------------- bodies
def test_body_over_the_limit_gets_413_before_it_is_read() -> None:
    ext = make([node("n1")])
    small = orjson.dumps({"Pod": pod("p", milli=100), "NodeNames": ["n1"]})
    big = small[:-1] + b', "pad": "' + b"x" * 5000 + b'"}'

    async def test(c: TestClient[Any, Any]) -> None:
        assert (await post(c, "/filter", small))[0] == 200
        for verb in VERBS:
            status, body = await post(c, verb, big)
            assert status == 413, (verb, body)
            assert f"of {len(big)} bytes is over the limit of 4096 bytes (--max-body-bytes)" in body["Error"]

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: cut off at the limit
            for _ in range(100):
                yield b" " * 1000

        r = await c.post("/filter", data=chunks())
        assert r.status == 413
        assert "over the limit of 4096 bytes" in (await r.json())["Error"]
        text = await (await c.get("/metrics")).text()
        assert 'gpusched_extender_rejected_requests_total{reason="body_too_large",verb="filter"} 2.0' in text

    run(ext, test, max_body_bytes=4096)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"Pod":' + b"[" * 100_000 + b"]" * 100_000 + b',"NodeNames":["n1"]}',
        b'{"Pod":{"metadata":{"name":"p"},"spec":{"containers":[{"resources":{"limits":{"cpu":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b'}}}]}},"NodeNames":["n1"]}',
        # deep, but under what orjson parses: a node echoed back in the answer would not encode
        b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[{"metadata":{"name":"n2"},"x":'
        + b"[" * 300
        + b"]" * 300
        + b"}]}}",
        b'{"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":' + b"[" * 5000 + b"]" * 5000 + b"}]}}}",
    ],
    ids=["top", "pod", "quantity", "node-300", "victim"],
)
def test_deep_nesting_gets_400(body: bytes) -> None:
    ext = make([node("n1")])

    async def test(c: TestClient[Any, Any]) -> None:
        for verb in VERBS:
            status, answer = await post(c, verb, body)
            assert status == 400, (verb, answer)
            assert f"deeper than {MAX_DEPTH} levels" in answer["Error"]

    run(ext, test)


def _depth(x: Any) -> int:
    if isinstance(x, dict):
        return 1 + max((_depth(v) for v in x.values()), default=0)
    if isinstance(x, list):
        return 1 + max((_depth(v) for v in x), default=0)
    return 0


TRICKY = '[]{}"\\a\n'
JSON = st.recursive(
    st.none() | st.integers(-1000, 1000) | st.text(TRICKY, max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(TRICKY, max_size=4), kids, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, indent=st.booleans(), chunk=st.sampled_from([1, 2, 3, 7, 1 << 22]))
def test_json_depth_matches_the_parsed_value(value: Any, indent: bool, chunk: int) -> None:
    """Brackets inside strings, escaped quotes and backslash runs split across chunks."""
    from gpusched.extender import protocol

    data = json.dumps(value, indent=1).encode() if indent else orjson.dumps(value)
    old = protocol._STEP_CHUNK
    protocol._STEP_CHUNK = chunk
    try:
        assert json_depth(data) == _depth(value)
    finally:
        protocol._STEP_CHUNK = old


# ------------------------------------------------------------------------------- slow or cut bodies
def test_body_cut_short_or_malformed_mid_way_gets_408_not_a_hang(caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp keeps the handler waiting for a body that never completes (a client that stops
    sending, or a malformed chunk once the handler runs): the read is bounded."""
    ext = make([node("n1")])

    async def test(c: TestClient[Any, Any]) -> None:
        port = c.server.port
        for data in (
            [POST + b"Content-Length: 100\r\n\r\n", b'{"Pod":'],
            [
                b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                b'4\r\n{"a"\r\n',
                b"z\r\n",
            ],
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for part in data:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.05)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), head
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            assert "request body not received within 0.3 s" in body["Error"]
            writer.close()
        # a client that goes away mid-body: no "internal error" logged
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        writer.close()
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.ERROR, logger="gpusched.extender.app"):
        run(ext, test, body_timeout_s=0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_large_bodies_wait_for_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only LARGE_BODIES large bodies are read and answered at once: another waits for the slot
    (a slow sender keeps it at most body_timeout_s); a small one does not wait."""
    monkeypatch.setattr(app_module, "LARGE_BODY_BYTES", 1000)
    monkeypatch.setattr(app_module, "LARGE_BODIES", 1)
    ext = make([node("n1")])
    valid = orjson.dumps({"Pod": pod("p", milli=100), "NodeNames": ["n1"]})
    padded = valid[:-1] + b',"pad":"' + b"x" * 2000 + b'"}'
    release = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:  # no Content-Length: large; holds the only slot
        yield valid[:10]
        await release.wait()
        yield valid[10:]

    async def test(c: TestClient[Any, Any]) -> None:
        first = asyncio.create_task(c.post("/filter", data=slow()))
        await asyncio.sleep(0.2)
        second = asyncio.create_task(post(c, "/filter", padded))
        status, body = await post(c, "/filter", valid)  # small: served meanwhile
        assert status == 200 and body["NodeNames"] == ["n1"]
        await asyncio.sleep(0.2)
        assert not second.done() and not first.done()
        release.set()
        r = await first
        assert r.status == 200 and (await r.json())["NodeNames"] == ["n1"]
        status, body = await second
        assert status == 200 and body["NodeNames"] == ["n1"]

    run(ext, test, body_timeout_s=30)


def test_slow_sender_keeps_a_large_body_slot_at_most_body_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "LARGE_BODY_BYTES", 1000)
    monkeypatch.setattr(app_module, "LARGE_BODIES", 1)
    ext = make([node("n1")])
    valid = orjson.dumps({"Pod": pod("p", milli=100), "NodeNames": ["n1"]})
    padded = valid[:-1] + b',"pad":"' + b"x" * 2000 + b'"}'
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield valid[:10]
        await never.wait()
        yield b""

    async def test(c: TestClient[Any, Any]) -> None:
        first = asyncio.create_task(c.post("/filter", data=stalled()))
        await asyncio.sleep(0.1)
        status, body = await post(c, "/filter", padded)  # served once the stalled one is cut off
        assert status == 200 and body["NodeNames"] == ["n1"]
        r = await first
        assert r.status == 408 and "not received within 0.5 s" in (await r.json())["Error"]
        text = await (await c.get("/metrics")).text()
        assert 'gpusched_extender_rejected_requests_total{reason="body_timeout",verb="filter"} 1.0' in text

    run(ext, test, body_timeout_s=0.5)


# ---------------------------------------------------------------------------------- malformed HTTP
MALFORMED = {
    "garbage bytes": b"\x00\xff\x13\x37 garbage\r\n\r\n",
    "bad request line": b"POST /filter HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "bad method": b"P@ST /filter HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad version": b"POST /filter HTTP/9.9\r\nHost: x\r\n\r\n",
    "header without colon": b"POST /filter HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    "control char in header": b"POST /filter HTTP/1.1\r\nHost: x\x01y\r\n\r\n",
    "negative Content-Length": b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "two Content-Lengths": POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "bad chunk size": POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "header over 8190 bytes": b"POST /filter HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
    "TLS on the HTTP port": bytes.fromhex("160301020001") + b"\x00" * 40,
}


def test_malformed_http_gets_a_400_status_line() -> None:
    """aiohttp's parser answers these itself (text/plain, before any handler); a regression
    guard (it passed before issue 9 too); gpusched.extender.app's docstring lists what aiohttp
    does not answer."""

    async def main() -> None:
        runner = web.AppRunner(make_app(make([node("n1")])), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            for name, data in MALFORMED.items():
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(data)
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), 10)
                assert line.split(b" ")[1:2] == [b"400"], (name, line)
                writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


# ------------------------------------------------------------------------------------------- fuzzing
QUANTITIES = (
    st.sampled_from(
        ["1", "100m", "2Gi", "0", "-1", "1e30", "1e4000", "Infinity", "NaN", "x", "1Ki", "9" * 70, "", "1.5"]
    )
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.none()
)
ABSURD = st.sampled_from(["1e30", "1e4000", "Infinity", "NaN", "1e19", str(2**63)])
NAMES = st.text(max_size=12) | st.sampled_from(["n1", "n2", "x" * 300])
ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=12,
)
RESOURCE_NAMES = ["cpu", "memory", "pods", "nvidia.com/gpu", "gpusched.io/gpu-milli", "gpusched.io/gpu-memory",  # noqa: E501
                  "rdma/hca", "hugepages-2Mi", "ephemeral-storage"]  # fmt: skip
RESOURCES = st.dictionaries(st.sampled_from(RESOURCE_NAMES), QUANTITIES | ANY, max_size=4)
POD = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": NAMES, "uid": st.text(max_size=4)}) | ANY},
    optional={
        "spec": st.fixed_dictionaries(
            {"containers": st.lists(st.fixed_dictionaries({"resources": st.fixed_dictionaries(
                {"limits": RESOURCES, "requests": RESOURCES})}) | ANY, max_size=2)},
            optional={"overhead": RESOURCES, "priority": ANY},
        ) | ANY
    },
)  # fmt: skip
NODE = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": NAMES, "labels": st.dictionaries(
        st.sampled_from(["nvidia.com/gpu.product", "nvidia.com/gpu.memory"]), QUANTITIES | ANY)}) | ANY},
    optional={"status": st.fixed_dictionaries({"allocatable": RESOURCES}) | ANY, "spec": ANY},
)  # fmt: skip
ARGS = st.fixed_dictionaries(
    {},
    optional={
        "Pod": POD | ANY,
        "Nodes": st.fixed_dictionaries({"items": st.lists(NODE, max_size=3)}) | ANY,
        "NodeNames": st.lists(NAMES, max_size=3) | ANY,
        "NodeNameToMetaVictims": st.dictionaries(NAMES, st.fixed_dictionaries(
            {"Pods": st.lists(st.fixed_dictionaries({"UID": st.text(max_size=3)}) | ANY, max_size=2) | ANY})),
        "PodName": NAMES | ANY,
        "PodUID": st.text(max_size=4) | ANY,
        "Node": NAMES | ANY,
    },
)  # fmt: skip


def _deep(rng: random.Random) -> bytes:
    d = rng.choice([MAX_DEPTH + 1, 300, 5000, 100_000])
    deep = b"[" * d + b"]" * d
    return rng.choice(
        [
            deep,
            b'{"Pod":' + deep + b"}",
            b'{"Pod":{"metadata":{"name":"p"},"spec":{"containers":[{"resources":{"limits":{"cpu":'
            + deep
            + b'}}}]}},"NodeNames":["n1"]}',
            b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[{"metadata":{"name":"n9"},"x":'
            + deep
            + b"}]}}",
            b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[{"metadata":{"name":"n9"},"status":'
            + b'{"allocatable":{"cpu":'
            + deep
            + b"}}}]}}",
            b'{"Pod":{"metadata":{"name":"p"}},"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":'
            + deep
            + b"}]}}}",
        ]
    )


@st.composite
def near_valid(draw: st.DrawFn) -> bytes:
    """A valid request with a few fields replaced: reaches the conversions and the filters."""
    p = pod("p", milli=draw(st.sampled_from([0, 100, 1000])), gpus=draw(st.sampled_from([0, 1, 2])))
    if not draw(st.integers(0, 2)):
        p["spec"]["containers"][0]["resources"]["limits"].update(draw(RESOURCES))
    items = []
    for i in range(draw(st.integers(0, 3))):
        n = node(f"new{i}", gpus=draw(st.integers(0, 8)))  # unknown to the books: converted
        n["status"]["allocatable"].update(
            draw(st.dictionaries(st.sampled_from(RESOURCE_NAMES), ABSURD | QUANTITIES))
        )
        n["metadata"]["labels"].update(
            draw(st.dictionaries(st.sampled_from(["nvidia.com/gpu.memory"]), QUANTITIES))
        )
        items.append(n)
    args: dict[str, Any] = {"Pod": p, "PodName": "p", "PodUID": "uid-p", "Node": draw(NAMES)}
    if draw(st.integers(0, 3)):
        args["Nodes"] = {"items": items}
    else:
        args["NodeNames"] = [n["metadata"]["name"] for n in items]
    args["NodeNameToMetaVictims"] = {n["metadata"]["name"]: {"Pods": [{"UID": "uid-x"}]} for n in items}
    return orjson.dumps(args)


BODIES = {
    "near-valid": near_valid(),
    "anything": ARGS.map(orjson.dumps)
    | ANY.map(orjson.dumps)
    | st.binary(max_size=40)
    | st.randoms(use_true_random=False).map(_deep),
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_fuzz_every_verb_answers_200_400_or_413_in_json(kind: str) -> None:
    """Random and malformed requests, and valid ones with fields replaced by odd or absurd
    values: never a 5xx, never an answer that is not JSON."""
    ext = make([node("n1"), node("n2", gpus=4)])

    async def main() -> None:
        c: TestClient[Any, Any] = TestClient(TestServer(make_app(ext, max_body_bytes=64 * 1024)))
        await c.start_server()
        loop = asyncio.get_running_loop()
        try:

            @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
            @given(body=BODIES[kind], verb=st.sampled_from(VERBS))
            def check(body: bytes, verb: str) -> None:
                fut = asyncio.run_coroutine_threadsafe(post(c, verb, body), loop)
                status, answer = fut.result(60)
                assert status in (200, 400, 413), (verb, body[:300], status, answer)
                assert isinstance(answer, (dict, list)), answer

            await loop.run_in_executor(None, check)
        finally:
            await c.close()

    asyncio.run(main())


def test_the_middlewares_act_on_the_verbs_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a verb is logged and answered 500 in JSON, and timed; the other routes keep
    aiohttp's own answers (404, 405 in text) and are neither timed nor gated."""
    ext = make([node("n1")])

    def broken(args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(ext, "filter", broken)

    async def test(c: TestClient[Any, Any]) -> None:
        status, body = await post(c, "/filter", {"Pod": pod("p"), "NodeNames": ["n1"]})
        assert status == 500 and body == {"Error": "internal error: RuntimeError: boom"}
        for method, path, code in (("GET", "/filter", 405), ("POST", "/nope", 404), ("GET", "/healthz", 200)):
            r = await c.request(method, path)
            assert r.status == code and r.content_type == "text/plain", path
        metrics = await (await c.get("/metrics")).text()
        timed = [
            ln
            for ln in metrics.splitlines()
            if ln.startswith("gpusched_extender_request_duration_seconds_count")
        ]
        assert timed == ['gpusched_extender_request_duration_seconds_count{verb="filter"} 1.0']

    with caplog.at_level(logging.ERROR, logger="gpusched.extender.app"):
        run(ext, test)
    assert any("extender filter failed" in r.getMessage() for r in caplog.records)
