"""The scheduler's side of a MIG re-cut (issue 31 item 3, way (a)): for a MIG pod that fits nowhere it asks
the node whose free slices can be re-cut for it (gpusched.io/mig-reshape), places nothing on that GPU until
the agent answers, and a failed or overdue re-cut leaves a MIGReshapeFailed event on the pod."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from builders import k8s_node, k8s_pod
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.mig import mig_annotation
from gpusched.core.names import ANN_MIG, ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS, LABEL_MIG_RESHAPE_WAY
from gpusched.k8s.convert import pod_from_k8s
from gpusched.k8s.migreshape import MigReshapes
from gpusched.k8s.state import LiveCluster

ALL_1G = tuple(("1g.10gb", s) for s in range(7))


def node(
    name: str, *layouts: tuple[tuple[str, int], ...], selector: str = "a", way: str | None = None
) -> dict[str, Any]:
    def inst(g: int, p: str, s: int) -> MigInstance:
        return MigInstance(p, s, 1, f"MIG-{name}-{g}-{s}", slices_gi=1, slices_ci=1)

    devs = tuple(
        GpuDevice(g, f"GPU-{g}", "NVIDIA A100-SXM4-80GB", 81920, f"0:{g}", 8, 0, True, True,
                  tuple(inst(g, p, s) for p, s in lay))
        for g, lay in enumerate(layouts)
    )  # fmt: skip
    obj = k8s_node(name, 0, labels={"pool": selector, **({LABEL_MIG_RESHAPE_WAY: way} if way else {})})
    inv = Inventory(name, "550", (12, 4), devs)
    obj["metadata"]["annotations"] = {ANN_MIG: mig_annotation(inv, "mixed")}
    return obj


class FakeNodes:
    def __init__(self, cluster: LiveCluster, objs: dict[str, dict[str, Any]]) -> None:
        self.cluster, self.objs, self.patches = cluster, objs, []  # type: list[tuple[str, Any]]

    def read_node(self, name: str, **kw: Any) -> Any:
        return SimpleNamespace(data=json.dumps(self.objs[name]).encode())

    def patch_node(self, name: str, body: Any, **kw: Any) -> None:
        self.patches.append((name, body))
        ann = self.objs[name]["metadata"].setdefault("annotations", {})
        for k, v in body["metadata"]["annotations"].items():
            ann.pop(k, None) if v is None else ann.__setitem__(k, v)
        self.cluster.upsert_node(self.objs[name])  # as the informer brings it back


class Events:
    def __init__(self) -> None:
        self.got: list[tuple[str, str, str]] = []

    def failed(
        self, pod: Any, message: str, reason: str = "FailedScheduling", condition: bool = True
    ) -> bool:
        self.got.append((pod["metadata"]["name"], reason, message))
        return True


@dataclass
class Queued:
    """A pending pod as the scheduling queue holds it (``k8s.queue.QueuedPod``)."""

    obj: dict[str, Any]
    order: tuple[int, str, int]

    @property
    def key(self) -> str:
        return f"{self.obj['metadata']['namespace']}/{self.obj['metadata']['name']}"

    def spec(self) -> Any:
        return pod_from_k8s(self.obj)


class Pending:
    def __init__(self) -> None:
        self.pods: list[Queued] = []

    def add(self, obj: dict[str, Any], priority: int = 0) -> tuple[Any, dict[str, Any]]:
        self.pods.append(Queued(obj, (-priority, "t", len(self.pods))))
        return pod_from_k8s(obj), obj

    def pending(self) -> list[Queued]:
        return list(self.pods)


def setup(
    *objs: dict[str, Any], timeout_s: float = 120.0, pending: Pending | None = None
) -> tuple[MigReshapes, FakeNodes, Events, list[float]]:
    cluster = LiveCluster()
    for o in objs:
        cluster.upsert_node(o)
    nodes, events, now = FakeNodes(cluster, {o["metadata"]["name"]: o for o in objs}), Events(), [0.0]
    r = MigReshapes(nodes, cluster, events, pending=pending, timeout_s=timeout_s, clock=lambda: now[0])
    return r, nodes, events, now


def mig_pod(name: str, profile: str, priority: int = 0) -> dict[str, Any]:
    obj = k8s_pod(name, {f"nvidia.com/mig-{profile}": "1"}, nodeSelector={"pool": "a"})
    obj["spec"]["priority"] = priority
    return obj


def four_g(name: str = "big") -> tuple[Any, dict[str, Any]]:
    obj = k8s_pod(name, {"nvidia.com/mig-4g.40gb": "1"}, nodeSelector={"pool": "a"})
    return pod_from_k8s(obj), obj


def test_a_pod_that_fits_nowhere_gets_a_recut_of_free_slices_and_the_gpu_takes_nothing_meanwhile() -> None:
    r, nodes, _ev, _now = setup(node("n1", ALL_1G), node("other", ALL_1G, selector="b"))
    pod, obj = four_g()
    note = r.consider(pod, obj)
    assert note == "; re-cutting GPU 0 of node n1 for it (4g.40gb at 0)"
    [(name, body)] = nodes.patches  # the node its selector matches
    req = json.loads(body["metadata"]["annotations"][ANN_MIG_RESHAPE])
    assert name == "n1" and req["gpu"] == 0 and req["create"] == [{"profile": "4g.40gb", "start": 0}]
    assert {(d["profile"], d["start"]) for d in req["destroy"]} == {("1g.10gb", s) for s in range(4)}
    with r.cluster.live_books() as snap:  # until the agent answers, nothing is placed on GPU 0 of n1
        one = pod_from_k8s(k8s_pod("small", {"nvidia.com/mig-1g.10gb": "1"}))
        assert not snap.mig_fits(one, snap.index["n1"]) and snap.mig_fits(one, snap.index["other"])
    assert r.consider(pod, obj) == "; waiting for the re-cut of GPU 0 of node n1"  # one request per pod
    assert len(nodes.patches) == 1


def test_a_failed_recut_leaves_an_event_and_frees_the_gpu() -> None:
    r, nodes, events, _now = setup(node("n1", ALL_1G))
    pod, obj = four_g()
    r.consider(pod, obj)
    rid = json.loads(nodes.objs["n1"]["metadata"]["annotations"][ANN_MIG_RESHAPE])["id"]
    status = {"id": rid, "state": "failed", "message": "GPU 0: rolled back: boom"}
    nodes.patch_node("n1", {"metadata": {"annotations": {ANN_MIG_RESHAPE_STATUS: json.dumps(status)}}})
    r.settle()
    msg = "the MIG re-cut of GPU 0 of node n1 failed and was rolled back: GPU 0: rolled back: boom"
    assert events.got == [("big", "MIGReshapeFailed", msg)]
    with r.cluster.live_books() as snap:
        assert snap.nodes[0].mig is not None and snap.nodes[0].mig.reshaping == frozenset()


def test_an_overdue_recut_is_withdrawn_with_an_event() -> None:
    r, nodes, events, now = setup(node("n1", ALL_1G), timeout_s=60)
    pod, obj = four_g()
    r.consider(pod, obj)
    now[0] = 61.0
    r.settle()
    assert ANN_MIG_RESHAPE not in nodes.objs["n1"]["metadata"]["annotations"]
    assert (
        events.got and events.got[0][1] == "MIGReshapeFailed" and "not done within 60 s" in events.got[0][2]
    )


def test_no_recut_when_no_node_can_serve_the_pod() -> None:
    r, nodes, _ev, _now = setup(node("n1", (("7g.80gb", 0),)))
    held = k8s_pod("runs", {"nvidia.com/mig-7g.80gb": "1"}, node_name="n1")
    mig = [{"gpu": 0, "start": 0, "profile": "7g.80gb"}]
    a = {"node": "n1", "gpus": [], "milli": 0, "memoryMiB": 0, "mig": mig}
    held["metadata"]["annotations"] = {"gpusched.io/assignment": json.dumps(a)}
    r.cluster.upsert_pod(held)
    pod, obj = four_g()
    assert r.consider(pod, obj) == "" and nodes.patches == []
    r, nodes, _ev, _now = setup(node("n2", ALL_1G))  # two 4g never fit one GPU: serving one of two is none
    obj = k8s_pod("two", {"nvidia.com/mig-4g.40gb": "2"}, nodeSelector={"pool": "a"})
    assert r.consider(pod_from_k8s(obj), obj) == "" and nodes.patches == []


def test_no_recut_when_the_slices_find_instances_and_something_else_keeps_the_pod_off() -> None:
    """A 4g instance is free on GPU 0 (the pod is kept off by a taint, say): re-cutting GPU 1, which could
    serve it, would not help."""
    balanced = (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))
    r, nodes, _ev, _now = setup(node("n1", (("4g.40gb", 0), ("3g.40gb", 4)), balanced))
    pod, obj = four_g()
    assert r.consider(pod, obj) == "" and nodes.patches == []


# ------------------------------------------------------------------------- a batch of pending pods (item 2)
def request(nodes: FakeNodes, name: str = "n1") -> dict[str, Any]:
    return dict(json.loads(nodes.objs[name]["metadata"]["annotations"][ANN_MIG_RESHAPE]))


def test_three_pending_pods_of_two_profiles_get_one_recut_that_serves_all_three() -> None:
    """A GPU of seven 1g; a 3g and two 2g pods wait in the queue. The first one tried asks for one re-cut
    (3g + 2g + 2g) for all three; the others, tried next, wait for it; a failure tells all three."""
    q = Pending()
    a, b, c = (q.add(mig_pod(n, p)) for n, p in (("a", "3g.40gb"), ("b", "2g.20gb"), ("c", "2g.20gb")))
    r, nodes, events, _now = setup(node("n1", ALL_1G), pending=q)
    note = r.consider(*a)
    assert note.startswith("; re-cutting GPU 0 of node n1 for it (") and "2 other pod(s) wait for it" in note
    req = request(nodes)
    assert sorted(i["profile"] for i in req["create"]) == ["2g.20gb", "2g.20gb", "3g.40gb"]
    assert req["for"] == "default/a,default/b,default/c"
    assert r.consider(*b) == r.consider(*c) == "; waiting for the re-cut of GPU 0 of node n1"
    assert len(nodes.patches) == 1
    status = {"id": req["id"], "state": "failed", "message": "boom"}
    nodes.patch_node("n1", {"metadata": {"annotations": {ANN_MIG_RESHAPE_STATUS: json.dumps(status)}}})
    r.settle()
    assert sorted((n, why) for n, why, _m in events.got) == [(x, "MIGReshapeFailed") for x in "abc"]


def test_the_batch_keeps_the_queues_order_and_the_pods_left_go_to_another_node() -> None:
    """Two nodes of seven 1g; a 7g pod of low priority is tried first, a 4g and a 3g pod of high priority
    wait. One GPU serves the 4g and the 3g (first in the queue's order) and the 7g gets the other node."""
    q = Pending()
    low = q.add(mig_pod("whole", "7g.80gb"), priority=1)
    q.add(mig_pod("four", "4g.40gb"), priority=10)
    q.add(mig_pod("three", "3g.40gb"), priority=10)
    r, nodes, _ev, _now = setup(node("n1", ALL_1G), node("n2", ALL_1G), pending=q)
    assert r.consider(*low) == "; re-cutting GPU 0 of node n2 for it (7g.80gb at 0)"
    assert request(nodes, "n1")["for"] == "default/four,default/three"
    assert request(nodes, "n2")["for"] == "default/whole"


def test_the_node_pools_way_sets_the_scope_and_off_asks_nothing() -> None:
    """A mig-manager node re-cuts only a GPU that no pod holds anything of (GPU 1), a plain one the free
    slices next to a held instance (GPU 0); a node whose way is off is never asked."""
    held = k8s_pod("runs", {"nvidia.com/mig-1g.10gb": "1"}, node_name="n1")
    a = {
        "node": "n1",
        "gpus": [],
        "milli": 0,
        "memoryMiB": 0,
        "mig": [{"gpu": 0, "start": 6, "profile": "1g.10gb"}],
    }
    held["metadata"]["annotations"] = {"gpusched.io/assignment": json.dumps(a)}
    for way, gpu in (("mig-manager", 1), (None, 0)):
        r, nodes, _ev, _now = setup(node("n1", ALL_1G, ALL_1G, way=way))
        r.cluster.upsert_pod(held)
        r.consider(*four_g())
        assert request(nodes)["gpu"] == gpu, way
    r, nodes, _ev, _now = setup(node("n1", ALL_1G, way="off"))
    assert r.consider(*four_g()) == "" and nodes.patches == []
    r, nodes, _ev, _now = setup(node("n1", ALL_1G, way="sideways"))  # no way: logged, never asked
    assert r.consider(*four_g()) == "" and nodes.patches == []
