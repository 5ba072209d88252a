"""The extender decides as ``schedule_one`` does: over the same books, the node ``schedule_one``
picks passes ``/filter`` and gets ``/prioritize``'s top score, and ``/bind`` to it books the very
GPUs ``schedule_one`` chose (a property over random clusters of GPU shares and whole GPUs)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.scheduler import schedule_one
from gpusched.extender.protocol import MAX_PRIORITY
from gpusched.k8s.convert import ANN_ASSIGNMENT, pod_from_k8s
from test_extender_handlers import FakeBinder, make, node, pod

MILLI = (100, 250, 300, 500, 700)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    n = draw(st.integers(1, 5))
    nodes = [node(f"n{i}", gpus=draw(st.integers(1, 4)), mem_mib=draw(st.sampled_from([16384, 40960])))
             for i in range(n)]  # fmt: skip
    bound = []
    for i in range(draw(st.integers(0, 12))):
        k = draw(st.integers(0, n - 1))
        g = draw(st.integers(0, int(nodes[k]["status"]["capacity"]["nvidia.com/gpu"]) - 1))
        milli = draw(st.sampled_from(MILLI))
        ann = json.dumps({"node": f"n{k}", "gpus": [g], "milli": milli, "memoryMiB": 0})
        bound.append(
            pod(f"b{i}", milli=milli, uid=f"uid-b{i}", node_name=f"n{k}", annotations={ANN_ASSIGNMENT: ann})
        )
    if draw(st.booleans()):
        want = pod("p", milli=draw(st.sampled_from(MILLI)), uid="uid-p")
    else:
        want = pod("p", gpus=draw(st.integers(1, 2)), uid="uid-p")
    return nodes, bound, want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.sampled_from(["default", "bestfit"]))
def test_extender_places_as_schedule_one(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]], policy: str
) -> None:
    nodes, bound, want = cluster
    binder = FakeBinder()
    e = make(nodes, bound, policy=policy, binder=binder)
    with e.cluster.live_books() as snap:
        if snap.verify():
            return  # the drawn bound pods overbook a GPU: not a state the books can be in
        mirror = snap.copy()
    spec = pod_from_k8s(want, constraints="skip")
    order = mirror.names  # name order: the tie-break of the Kubernetes front ends
    r = schedule_one(e.profile, spec, mirror, tiebreak=None, diagnose_failures=False)
    names = list(order)
    passed = e.filter({"Pod": want, "NodeNames": names})
    if not r.scheduled:
        assert passed["NodeNames"] == []
        return
    assert r.node_name in passed["NodeNames"]
    scores = {h["Host"]: h["Score"] for h in e.prioritize({"Pod": want, "NodeNames": passed["NodeNames"]})}
    assert scores[r.node_name] == max(scores.values()) == MAX_PRIORITY
    answer = e.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": r.node_name})
    assert answer == {"Error": ""}
    ((*_, node_name, ann),) = binder.calls
    assert node_name == r.node_name and tuple(json.loads(ann)["gpus"]) == r.gpus
