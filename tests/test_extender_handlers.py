"""The extender's verbs without a control plane: hand-built v1 dicts, a fake binder."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from builders import HOST, k8s_node, k8s_pod
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.extender.app import make_app
from gpusched.extender.evaluate import UNKNOWN_NODE
from gpusched.extender.handlers import Extender
from gpusched.extender.protocol import MAX_PRIORITY, normalise
from gpusched.extender.serve import build_profile
from gpusched.k8s.convert import ANN_ASSIGNMENT, ANN_MODELS, assignment_annotation, parse_assignment
from gpusched.k8s.podevents import PodFeed, parse_pod_event
from gpusched.k8s.state import LiveCluster


def node(
    name: str, gpus: int = 2, mem_mib: int = 16384, model: str = "Tesla-T4", **spec: Any
) -> dict[str, Any]:
    """A node of the extender's tests (``builders.k8s_node``): 32 cores, 128 GiB, 110 pods."""
    return k8s_node(
        name, gpus, cpu="32", mem="128Gi", model=model, gpu_mem_mib=mem_mib, pods="110", capacity=True,
        labels={HOST: name}, spec=spec,
    )  # fmt: skip


def pod(
    name: str, *, milli: int = 0, mem: int = 0, gpus: int = 0, uid: str = "", node_name: str = "",
    annotations: dict[str, str] | None = None, cpu: str = "1",
) -> dict[str, Any]:  # fmt: skip
    """A pod (``builders.k8s_pod``, requests == limits) asking for GPU ``milli``, GPU ``mem`` MiB
    or whole ``gpus``."""
    res: dict[str, str] = {"cpu": cpu, "memory": "1Gi"}
    if milli:
        res["gpusched.io/gpu-milli"] = str(milli)
    if mem:
        res["gpusched.io/gpu-memory"] = str(mem)
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    return k8s_pod(name, res, limits=True, node_name=node_name, uid=uid, annotations=annotations)


class FakeBinder:
    def __init__(self, fail: Status | None = None, delay: float = 0.0) -> None:
        """``fail``: the answer to every bind (none: bind and record)."""
        self.calls: list[tuple[str, str, str, str, str]] = []
        self.fail, self.delay = fail, delay
        self.lock = threading.Lock()

    name = "FakeBinder"

    def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status:
        """A Bind plugin that records what APIBinder would send: namespace, name, UID, node, annotation."""
        if self.delay:
            time.sleep(self.delay)
        if self.fail is not None:
            return self.fail
        with self.lock:
            ann = assignment_annotation(node, gpus, pod)
            self.calls.append((pod.namespace, pod.name, pod.uid, node, ann))
        return Status.success()


def make(nodes: list[dict[str, Any]], bound: list[dict[str, Any]] = (), policy: str = "bestfit",  # type: ignore[assignment]
         binder: FakeBinder | None = None, **kw: Any) -> Extender:  # fmt: skip
    live = LiveCluster()
    for n in nodes:
        live.upsert_node(n)
    ext = Extender(live, build_profile(policy), binder=binder or FakeBinder(), **kw)
    feed = PodFeed([live, ext])  # as extender/serve.py wires its informer: the books, then the extender
    for p in bound:
        feed.upsert(p)
    return ext


@pytest.fixture
def ext() -> Extender:
    # n1: 2 GPUs of 16 GiB, GPU 0 half used; n2: 1 GPU of 16 GiB; n3: 4 A100 of 40 GiB
    return make(
        [node("n1"), node("n2", gpus=1), node("n3", gpus=4, mem_mib=40960, model="A100-SXM4-40GB")],
        [pod("busy", milli=500, mem=8192, node_name="n1", annotations={
            ANN_ASSIGNMENT: json.dumps({"node": "n1", "gpus": [0], "milli": 500, "memoryMiB": 8192})})],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ filter
def test_filter_node_names_with_reasons(ext: Extender) -> None:
    r = ext.filter({"Pod": pod("p", mem=20000), "NodeNames": ["n1", "n2", "n3", "ghost"]})
    assert r["Error"] == ""
    assert r["NodeNames"] == ["n3"] and r["Nodes"] is None
    assert r["FailedAndUnresolvableNodes"] == {
        "n1": "Insufficient GPU memory",
        "n2": "Insufficient GPU memory",
    }
    assert r["FailedNodes"] == {"ghost": UNKNOWN_NODE}


def test_filter_resolvable_share_and_count(ext: Extender) -> None:
    r = ext.filter({"Pod": pod("p", milli=600), "NodeNames": ["n1", "n2", "n3"]})
    assert r["NodeNames"] == ["n1", "n2", "n3"]  # n1 GPU 1 is free
    r = ext.filter({"Pod": pod("p", gpus=2), "NodeNames": ["n1", "n2", "n3"]})
    assert r["NodeNames"] == ["n3"]
    assert r["FailedNodes"] == {"n1": "Insufficient GPU"}  # evicting "busy" would help
    assert r["FailedAndUnresolvableNodes"] == {"n2": "Insufficient GPU count"}


def test_filter_model_constraint(ext: Extender) -> None:
    p = pod("p", milli=100, annotations={ANN_MODELS: "A100-SXM4-40GB"})
    r = ext.filter({"Pod": p, "NodeNames": ["n1", "n3"]})
    assert r["NodeNames"] == ["n3"]
    assert r["FailedAndUnresolvableNodes"] == {"n1": "GPU model mismatch"}


def test_filter_full_nodes_returns_objects_and_evaluates_unknown_nodes(ext: Extender) -> None:
    extra = node("n9", gpus=1, mem_mib=81920, model="H100-80GB-HBM3")
    tainted = node(
        "n8", gpus=8, mem_mib=81920, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    )
    items = [node("n1"), node("n2", gpus=1), extra, tainted]
    r = ext.filter({"Pod": pod("p", mem=30000), "Nodes": {"items": items}, "NodeNames": None})
    assert r["NodeNames"] is None
    assert [n["metadata"]["name"] for n in r["Nodes"]["items"]] == ["n9"]
    assert r["Nodes"]["items"][0] == extra
    assert r["FailedAndUnresolvableNodes"] == {
        "n1": "Insufficient GPU memory",
        "n2": "Insufficient GPU memory",
        "n8": "node(s) had untolerated taint {dedicated: x}",
    }


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"NodeNames": ["n1"]}, "missing field 'Pod'"),
        ({"Pod": "x", "NodeNames": ["n1"]}, "'Pod' must be dict"),
        ({"Pod": pod("p", milli=100)}, "neither 'Nodes' nor 'NodeNames'"),
        ({"Pod": pod("p", milli=100), "NodeNames": "n1"}, "'NodeNames' must be list"),
        ({"Pod": pod("p", milli=100), "NodeNames": [1, 2]}, "list of strings"),
        ({"Pod": pod("p", milli=2000), "NodeNames": ["n1"]}, "more than one GPU"),
        (
            {"Pod": pod("p", milli=100, annotations={ANN_MODELS: "bad model!"}), "NodeNames": ["n1"]},
            "gpu-models",
        ),
        ({"Pod": pod("p", milli=100), "Nodes": {"items": "x"}}, "Nodes.items"),
        ({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": 7}}, "NodeNames": ["n1"]}, "v1.Pod"),
        ({"Pod": {"metadata": {"name": "p"}, "spec": "x"}, "NodeNames": ["n1"]}, "v1.Pod"),
    ],
)
def test_filter_malformed_sets_error(ext: Extender, args: dict[str, Any], needle: str) -> None:
    r = ext.filter(args)
    assert needle in r["Error"]
    assert r["NodeNames"] is None and r["Nodes"] is None


# -------------------------------------------------------------------------------------------- prioritize
def test_normalise() -> None:
    assert normalise([1.0, 2.0, 3.0]).tolist() == [0, 5, 10]
    assert normalise([-7.0, -7.0]).tolist() == [MAX_PRIORITY, MAX_PRIORITY]
    assert normalise([]).tolist() == []


def test_prioritize_bestfit_prefers_least_leftover(ext: Extender) -> None:
    r = ext.prioritize({"Pod": pod("p", milli=300), "NodeNames": ["n1", "n2", "n3", "ghost"]})
    scores = {h["Host"]: h["Score"] for h in r}
    assert list(scores) == ["n1", "n2", "n3", "ghost"]
    # leftover GPU milli after placement: n2 700, n1 1200, n3 3700 (bestfit: least leftover wins)
    assert scores["n2"] == MAX_PRIORITY and scores["n3"] == 0 and 0 < scores["n1"] < MAX_PRIORITY
    assert scores["ghost"] == 0


def test_prioritize_infeasible_nodes_score_zero(ext: Extender) -> None:
    r = ext.prioritize({"Pod": pod("p", mem=20000), "NodeNames": ["n1", "n3"]})
    assert r == [{"Host": "n1", "Score": 0}, {"Host": "n3", "Score": MAX_PRIORITY}]


@pytest.mark.parametrize(
    "policy", ["default", "fgd", "bestfit", "packing", "clustering", "dotprod", "random"]
)
def test_every_policy_serves(policy: str) -> None:
    e = make([node("n1"), node("n2", gpus=4)], policy=policy)
    r = e.prioritize({"Pod": pod("p", milli=250), "NodeNames": ["n1", "n2"]})
    assert len(r) == 2 and all(0 <= h["Score"] <= MAX_PRIORITY for h in r)
    assert e.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n2"}) == {
        "Error": ""
    }


# -------------------------------------------------------------------------------------------------- bind
def test_bind_picks_gpu_and_annotates(ext: Extender) -> None:
    (binder,) = ext.profile.binds
    assert isinstance(binder, FakeBinder)
    ext.filter({"Pod": pod("p", milli=400, mem=4096), "NodeNames": ["n1"]})
    assert ext.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"}) == {
        "Error": ""
    }
    ((ns, name, uid, nd, ann),) = binder.calls
    assert (ns, name, uid, nd) == ("default", "p", "uid-p", "n1")
    assert json.loads(ann) == {"node": "n1", "gpus": [0], "milli": 400, "memoryMiB": 4096}  # best fit: GPU 0
    with ext.cluster.live_books() as snap:
        assert snap.allocations["default/p"].gpus == (0,)
        assert snap.node_gpu_free(snap.index["n1"]) == [100, 1000]


BIND_ARGS = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"}


@pytest.mark.parametrize(
    ("answer", "api_pod", "error", "held"),
    [
        # the API refused and wrote nothing: released
        (Status(Code.UNSCHEDULABLE, ("403 Forbidden",)), pod("p", gpus=1), "403 Forbidden", False),
        # the pod is gone: released
        (Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ("404 Not Found",)), None, "404", False),
        # outcome unknown and the pod still pending: the GPU stays booked (the budget is 0: no retry)
        (Status(Code.ERROR, ("ProtocolError",)), pod("p", gpus=1), "ProtocolError", True),
        # 409: an earlier attempt committed; the API shows the pod bound here: bound, booked
        (Status(Code.ERROR, ("409 Conflict",)), pod("p", gpus=1, node_name="n1"), "", True),
        # 409 and the pod recreated under another UID: released
        (Status(Code.ERROR, ("409 Conflict",)), pod("p", gpus=1, uid="other"), "409", False),
    ],
)
def test_bind_failure_keeps_the_booking_until_the_api_settles_it(
    answer: Status, api_pod: dict[str, Any] | None, error: str, held: bool
) -> None:
    e = make([node("n1", gpus=1)], binder=FakeBinder(fail=answer), bind_budget_s=0.0)
    e.pod_getter = lambda ns, name: api_pod if api_pod is not None else _raise_404()
    e.filter({"Pod": pod("p", gpus=1), "NodeNames": ["n1"]})
    r = e.bind(BIND_ARGS)
    assert (error in r["Error"]) if error else r["Error"] == ""
    with e.cluster.live_books() as snap:
        assert ("default/p" in snap.allocations) is held
        assert snap.node_gpu_free(0) == ([0] if held else [1000])
    assert e.settler.held() == (["default/p"] if held and error else [])


def _raise_404() -> dict[str, Any]:
    err = RuntimeError("not found")
    err.status = 404  # type: ignore[attr-defined]
    raise err


def test_bind_errors(ext: Extender) -> None:
    assert "never filtered" in ext.bind({"PodName": "zz", "PodUID": "u", "Node": "n1"})["Error"]
    assert "missing field 'Node'" in ext.bind({"PodName": "zz"})["Error"]
    ext.filter({"Pod": pod("p", mem=20000), "NodeNames": ["n1"]})
    assert "no longer fits" in ext.bind({"PodName": "p", "PodUID": "uid-p", "Node": "n1"})["Error"]
    assert UNKNOWN_NODE in ext.bind({"PodName": "p", "PodUID": "uid-p", "Node": "ghost"})["Error"]


def test_bind_uses_informer_pending_pod_then_getter() -> None:
    e = make([node("n1")])
    e.on_pod_event(parse_pod_event(pod("p", milli=100)))  # pending pod seen by the informer, never filtered
    assert e.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"})["Error"] == ""
    e.pod_getter = lambda ns, name: pod(name, milli=200)
    assert e.bind({"PodName": "q", "PodNamespace": "default", "PodUID": "uid-q", "Node": "n1"})["Error"] == ""
    assert "has UID" in e.bind({"PodName": "r", "PodUID": "other", "Node": "n1"})["Error"]

    def missing(ns: str, name: str) -> dict[str, Any]:
        raise KeyError(f"{ns}/{name} not found")

    e.pod_getter = missing
    assert "cannot read pod default/s" in e.bind({"PodName": "s", "PodUID": "uid-s", "Node": "n1"})["Error"]


def test_concurrent_binds_never_double_book() -> None:
    binder = FakeBinder(delay=0.002)
    e = make([node("n1", gpus=2, mem_mib=16384)], binder=binder)  # room for 2 x 2 = 4 pods of 8 GiB
    n = 24
    for i in range(n):
        e.filter({"Pod": pod(f"p{i}", mem=8192), "NodeNames": ["n1"]})
    results: list[dict[str, str]] = []
    start = threading.Barrier(n)

    def go(i: int) -> None:
        start.wait()
        results.append(
            e.bind({"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"uid-p{i}", "Node": "n1"})
        )

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if not r["Error"]]
    assert len(ok) == len(binder.calls) == 4
    per_gpu: dict[int, int] = {}
    for *_, ann in binder.calls:
        for g in json.loads(ann)["gpus"]:
            per_gpu[g] = per_gpu.get(g, 0) + 8192
    assert all(v <= 16384 for v in per_gpu.values())
    with e.cluster.live_books() as snap:
        assert not snap.verify()


# ----------------------------------------------------------------------------------------------- preempt
def test_preempt_keeps_nodes_where_victims_make_room() -> None:
    bound = [
        pod("a", gpus=1, node_name="n1", annotations={ANN_ASSIGNMENT: '{"node":"n1","gpus":[0]}'}),
        pod("b", gpus=1, node_name="n1", annotations={ANN_ASSIGNMENT: '{"node":"n1","gpus":[1]}'}),
        pod("c", gpus=1, node_name="n2"),
        pod("cpu", node_name="n2", cpu="1"),
    ]
    e = make([node("n1"), node("n2", gpus=1)], bound)
    with e.cluster.live_books() as snap:
        before = (dict(snap.allocations), snap.gpu_free.copy(), snap.cpu_free.copy())
    args = {
        "Pod": pod("p", gpus=1),
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 1},
            "n2": {"Pods": [{"UID": "uid-cpu"}], "NumPDBViolations": 0},  # frees no GPU
            "ghost": {"Pods": [{"UID": "x"}]},
        },
    }
    assert e.preempt(args) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 1}}
    }
    full = {"Pod": pod("p", gpus=1), "NodeNameToVictims": {"n2": {"Pods": [bound[2]], "NumPDBViolations": 0}}}
    assert e.preempt(full) == {
        "NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": "uid-c"}], "NumPDBViolations": 0}}
    }
    with e.cluster.live_books() as snap:  # victims were evicted on the live books and put back exactly
        assert snap.allocations == before[0] and len(snap.allocations) == 4
        assert (snap.gpu_free == before[1]).all() and (snap.cpu_free == before[2]).all()
        assert snap.verify() == []


# ---------------------------------------------------------------------------------------------- HTTP app
@pytest.fixture
def client(ext: Extender) -> Iterator[tuple[TestClient[Any, Any], asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(ext)), loop=loop)
    loop.run_until_complete(c.start_server())
    yield c, loop
    loop.run_until_complete(c.close())
    loop.close()


def test_http_verbs_and_errors(client: tuple[TestClient[Any, Any], asyncio.AbstractEventLoop]) -> None:
    c, loop = client

    async def post(path: str, data: bytes) -> tuple[int, Any]:
        r = await c.post(path, data=data, headers={"Content-Type": "application/json"})
        return r.status, await r.json(content_type=None)

    def run(path: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return loop.run_until_complete(post(path, data))

    ok = run("/filter", {"Pod": pod("p", milli=100), "NodeNames": ["n1"]})
    assert ok == (200, {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": {},
                        "FailedAndUnresolvableNodes": {}, "Error": ""})  # fmt: skip
    for verb in ("/filter", "/prioritize", "/bind", "/preempt"):
        status, body = run(verb, b"{not json")
        assert status == 400 and "not valid JSON" in body["Error"]
        status, body = run(verb, b"[1, 2]")
        assert status == 400 and "JSON object" in body["Error"]
    assert run("/filter", {"NodeNames": ["n1"]})[0] == 200
    status, body = run("/prioritize", {"Pod": pod("p", milli=5000), "NodeNames": ["n1"]})
    assert status == 400 and "more than one GPU" in body["Error"]
    assert run("/preempt", {"Pod": 1})[0] == 400
    assert run("/bind", {"PodName": "p", "PodUID": "uid-p", "Node": "n1"}) == (200, {"Error": ""})
    assert run("/bind", {"PodName": 3, "Node": "n1"})[1]["Error"].startswith("field 'PodName'")

    async def get(path: str) -> tuple[int, str]:
        r = await c.get(path)
        return r.status, await r.text()

    assert loop.run_until_complete(get("/healthz")) == (200, "ok")
    assert loop.run_until_complete(get("/readyz")) == (200, "ok")
    status, text = loop.run_until_complete(get("/metrics"))
    assert status == 200 and 'gpusched_extender_request_duration_seconds_count{verb="filter"}' in text
    assert "gpusched_gpu_allocation_ratio" in text
    status, text = loop.run_until_complete(get("/state"))
    assert json.loads(text)["nodes"] == 3


def test_assignment_annotation_roundtrip(ext: Extender) -> None:
    ext.filter({"Pod": pod("p", gpus=2), "NodeNames": ["n3"]})
    ext.bind({"PodName": "p", "PodUID": "uid-p", "Node": "n3"})
    (binder,) = ext.profile.binds
    assert isinstance(binder, FakeBinder)
    ann = binder.calls[0][4]
    assert parse_assignment({"metadata": {"annotations": {ANN_ASSIGNMENT: ann}}}) == ("n3", (0, 1))


def test_http_binds_run_in_parallel_without_double_booking() -> None:
    binder = FakeBinder(delay=0.3)
    e = make([node(f"n{i}", gpus=1, mem_mib=16384) for i in range(4)], binder=binder)
    for i in range(12):
        e.filter({"Pod": pod(f"p{i}", mem=8192), "NodeNames": ["n0"]})
    loop = asyncio.new_event_loop()
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(e)), loop=loop)

    async def bind(i: int, nd: str) -> str:
        args = {"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"uid-p{i}", "Node": nd}
        r = await c.post("/bind", data=json.dumps(args).encode())
        return str((await r.json())["Error"])

    async def main() -> tuple[list[str], list[str], float]:
        await c.start_server()
        t0 = time.perf_counter()
        spread = await asyncio.gather(*(bind(i, f"n{i}") for i in range(4)))  # 4 nodes at once
        wall = time.perf_counter() - t0
        crowd = await asyncio.gather(*(bind(i, "n0") for i in range(4, 12)))  # 1 GPU, 16 GiB: room for 1 more
        await c.close()
        return spread, crowd, wall

    spread, crowd, wall = loop.run_until_complete(main())
    loop.close()
    assert spread == [""] * 4
    assert wall < 4 * 0.3  # the API calls overlapped
    assert sum(not err for err in crowd) == 1 and all("no longer fits" in err for err in crowd if err)
    with e.cluster.live_books() as snap:
        assert not snap.verify() and snap.node_gpu_free(snap.index["n0"]) == [1000]
        assert int(snap.gpu_mem_free[snap.index["n0"], 0]) == 0


def test_cli_rejects_half_tls_and_unknown_policy() -> None:
    from gpusched.extender.serve import extender_command

    with pytest.raises(ValueError, match="go together"):
        extender_command(tls_cert="cert.pem")
    with pytest.raises(ValueError, match="unknown policy"):
        extender_command(policy="nope")
    with pytest.raises(ValueError, match="unknown event loop 'tornado'; choose one of uvloop, asyncio"):
        extender_command(event_loop="tornado")


def test_event_loops() -> None:
    """uvloop by default (a dependency wherever the extender runs), the standard loop on request."""
    import uvloop

    from gpusched.extender.serve import new_event_loop

    for kind, cls in (("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)):
        loop = new_event_loop(kind)
        try:
            assert isinstance(loop, cls)
            assert (kind == "uvloop") == isinstance(loop, uvloop.Loop)
        finally:
            loop.close()
