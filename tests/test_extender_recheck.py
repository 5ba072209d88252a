"""A nominated pod failing on its nominated node is answered after the books are checked against
the API (the extender's informer lagging behind kube-scheduler's).

kube-scheduler nominates a preemptor, deletes its victims and retries the pod as soon as its own
informer shows them gone. When the extender's informer has not delivered those deletions yet, a
filter answered from its books fails the pod, and kube-scheduler sends it back to wait for a
cluster event that has already passed: the pod then waits for the five-minute flush (CI saw the
e2e preemption test time out that way under load). The filter reads the node's pods from the API
and releases what the API no longer has, then answers again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpusched.extender.handlers import Extender
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.k8s.podevents import Kind, PodFeed, parse_pod_event
from test_extender_handlers import make, node, pod
from test_extender_sync import post, serving


def victim(uid: str = "uid-low", **meta: Any) -> dict[str, Any]:
    """``low``: bound to n1 on its only GPU."""
    p = pod("low", gpus=1, uid=uid, node_name="n1",
            annotations={ANN_ASSIGNMENT: json.dumps({"node": "n1", "gpus": [0]})})  # fmt: skip
    p["metadata"].update(meta)
    return p


def preemptor(nominated: str = "n1") -> dict[str, Any]:
    p = pod("vip", gpus=1, uid="uid-vip")
    p["spec"]["priority"] = 100000
    if nominated:
        p["status"]["nominatedNodeName"] = nominated
    return p


class Lister:
    """The API's pods per node, as ``node_pods`` reads them; records each read."""

    def __init__(self, pods: list[dict[str, Any]], fail: Exception | None = None) -> None:
        self.pods, self.fail = pods, fail
        self.reads: list[str] = []

    def __call__(self, node_name: str) -> list[dict[str, Any]]:
        self.reads.append(node_name)
        if self.fail is not None:
            raise self.fail
        return [p for p in self.pods if p["spec"].get("nodeName") == node_name]


def extender(api: Lister) -> Extender:
    """n1 with one GPU, which ``low`` holds in the books (the informer has not seen it go)."""
    return make([node("n1", gpus=1)], [victim()], node_pods=api)


def filter_once(ext: Extender, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The filter's answer through the HTTP app (the recheck is the app's), and its metrics."""

    async def main() -> tuple[dict[str, Any], str]:
        async with serving(ext, lambda: True) as c:
            status, answer = await post(c, "/filter", body)
            assert status == 200
            return answer, await (await c.get("/metrics")).text()

    return asyncio.run(main())


def booked(ext: Extender) -> list[str]:
    with ext.cluster.live_books() as snap:
        return sorted(snap.allocations)


def test_a_preemptor_whose_victim_the_api_deleted_passes_its_nominated_node() -> None:
    api = Lister([])  # the victim is gone from the API
    ext = extender(api)
    answer, metrics = filter_once(ext, {"Pod": preemptor(), "NodeNames": ["n1"]})
    assert answer["NodeNames"] == ["n1"] and answer["FailedNodes"] == {}
    assert api.reads == ["n1"]
    assert booked(ext) == []
    assert 'gpusched_extender_node_rechecks_total{result="released"} 1.0' in metrics
    # the victim's events still on their way (terminating, then deleted) book nothing again
    feed = PodFeed([ext.cluster, ext])
    feed.upsert(victim(deletionTimestamp="2026-12-07T13:00:00Z"))
    assert booked(ext) == []
    feed.delete(victim())
    assert booked(ext) == []


def test_a_victim_still_terminating_keeps_its_gpu() -> None:
    """kube-scheduler's own cache keeps a terminating pod's resources until it is deleted: so do the books."""
    api = Lister([victim(deletionTimestamp="2026-12-07T13:00:00Z")])
    ext = extender(api)
    answer, metrics = filter_once(ext, {"Pod": preemptor(), "NodeNames": ["n1"]})
    assert answer["NodeNames"] == [] and answer["FailedNodes"] == {"n1": "Insufficient GPU"}
    assert api.reads == ["n1"]
    assert booked(ext) == ["default/low"]
    assert 'gpusched_extender_node_rechecks_total{result="unchanged"} 1.0' in metrics


def test_a_pod_recreated_under_the_same_name_is_not_the_victim() -> None:
    """A StatefulSet's pod deleted and created again (another UID) on the node: the old one is gone."""
    api = Lister([victim(uid="uid-new")])
    ext = extender(api)
    answer, _ = filter_once(ext, {"Pod": preemptor(), "NodeNames": ["n1"]})
    assert answer["NodeNames"] == ["n1"]
    assert booked(ext) == []


def test_pods_not_nominated_there_and_failed_reads_answer_from_the_books() -> None:
    api = Lister([])
    ext = extender(api)
    for body in (
        {"Pod": preemptor(nominated=""), "NodeNames": ["n1"]},  # not nominated: no read per filter
        {"Pod": preemptor(nominated="n2"), "NodeNames": ["n1"]},  # nominated elsewhere
    ):
        answer, _ = filter_once(ext, body)
        assert answer["FailedNodes"] == {"n1": "Insufficient GPU"}
    assert api.reads == []
    broken = Lister([], fail=OSError("connection refused"))
    ext = extender(broken)
    answer, metrics = filter_once(ext, {"Pod": preemptor(), "NodeNames": ["n1"]})
    assert answer["FailedNodes"] == {"n1": "Insufficient GPU"}  # the answer stands
    assert broken.reads == ["n1"] and booked(ext) == ["default/low"]
    assert 'gpusched_extender_node_rechecks_total{result="failed"} 1.0' in metrics


def test_an_old_pods_deletion_keeps_the_booking_of_its_successor() -> None:
    """The informer delivers the old pod's deletion after the new pod (same name) was booked."""
    ext = extender(Lister([]))
    cluster = ext.cluster
    cluster.reconcile_node("n1", [])  # the old one released early
    new = victim(uid="uid-new")
    cluster.on_pod_event(parse_pod_event(new))
    assert booked(ext) == ["default/low"]
    cluster.on_pod_event(parse_pod_event(victim(), Kind.DELETE))
    assert booked(ext) == ["default/low"]  # the new pod keeps its GPU
    with cluster.live_books() as snap:
        assert snap.allocations["default/low"].pod.uid == "uid-new"


def test_before_the_nomination_reaches_the_pod_the_node_preempt_kept_is_read() -> None:
    """kube-scheduler may retry the preemptor before its informer shows the nomination."""
    api = Lister([])
    ext = extender(api)
    vip = preemptor(nominated="")
    args = {"Pod": vip, "NodeNameToVictims": {"n1": {"Pods": [victim()], "NumPDBViolations": 0}}}
    assert list(ext.preempt(args)["NodeNameToMetaVictims"]) == ["n1"]
    answer, _ = filter_once(ext, {"Pod": vip, "NodeNames": ["n1"]})
    assert answer["NodeNames"] == ["n1"] and api.reads == ["n1"]
