"""The scheduler's side of a MIG re-cut (issue 31 item 3, way (a)): for a MIG pod that fits nowhere it asks
the node whose free slices can be re-cut for it (gpusched.io/mig-reshape), places nothing on that GPU until
the agent answers, and a failed or overdue re-cut leaves a MIGReshapeFailed event on the pod."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from builders import k8s_node, k8s_pod
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.mig import mig_annotation
from gpusched.core.names import ANN_MIG, ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS
from gpusched.k8s.convert import pod_from_k8s
from gpusched.k8s.migreshape import MigReshapes
from gpusched.k8s.state import LiveCluster

ALL_1G = tuple(("1g.10gb", s) for s in range(7))


def node(name: str, *layouts: tuple[tuple[str, int], ...], selector: str = "a") -> dict[str, Any]:
    def inst(g: int, p: str, s: int) -> MigInstance:
        return MigInstance(p, s, 1, f"MIG-{name}-{g}-{s}", slices_gi=1, slices_ci=1)

    devs = tuple(
        GpuDevice(g, f"GPU-{g}", "NVIDIA A100-SXM4-80GB", 81920, f"0:{g}", 8, 0, True, True,
                  tuple(inst(g, p, s) for p, s in lay))
        for g, lay in enumerate(layouts)
    )  # fmt: skip
    obj = k8s_node(name, 0, labels={"pool": selector})
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


def setup(
    *objs: dict[str, Any], timeout_s: float = 120.0
) -> tuple[MigReshapes, FakeNodes, Events, list[float]]:
    cluster = LiveCluster()
    for o in objs:
        cluster.upsert_node(o)
    nodes, events, now = FakeNodes(cluster, {o["metadata"]["name"]: o for o in objs}), Events(), [0.0]
    return MigReshapes(nodes, cluster, events, timeout_s=timeout_s, clock=lambda: now[0]), nodes, events, now


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
