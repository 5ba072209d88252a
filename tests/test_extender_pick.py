"""``/filter`` with ``pick``: the one node ``schedule_one`` would choose among the sent nodes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.scheduler import schedule_one
from gpusched.extender.serve import build_profile
from gpusched.k8s.convert import ANN_ASSIGNMENT
from test_extender_handlers import make, node, pod

MODELS = ("Tesla-T4", "A100-SXM4-40GB")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes (names out of order) and pods bound to them, each with a valid assignment."""
    n = draw(st.integers(1, 8))
    names = draw(st.permutations([f"node-{i:02d}" for i in range(n)]))
    nodes, bound = [], []
    for name in names:
        gpus = draw(st.integers(1, 4))
        nodes.append(node(name, gpus=gpus, mem_mib=16384, model=draw(st.sampled_from(MODELS))))
        for g in range(gpus):
            milli = draw(st.sampled_from([0, 0, 250, 500, 1000]))
            if milli:
                ann = json.dumps({"node": name, "gpus": [g], "milli": milli, "memoryMiB": 0})
                annotations = {ANN_ASSIGNMENT: ann}
                bound.append(pod(f"b-{name}-{g}", milli=milli, node_name=name, annotations=annotations))
    return nodes, bound


requests = st.one_of(
    st.builds(lambda m: pod("p", milli=m, uid="u-p"), st.sampled_from([100, 250, 500, 750, 1000])),
    st.builds(lambda g: pod("p", gpus=g, uid="u-p"), st.integers(1, 4)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cl=clusters(), p=requests, policy=st.sampled_from(["default", "bestfit"]), order=st.randoms())
def test_pick_is_schedule_ones_choice(cl: Any, p: dict[str, Any], policy: str, order: Any) -> None:
    nodes, bound = cl
    p["metadata"]["resourceVersion"] = "7"  # converted once: /bind finds the spec /filter used
    ext = make(nodes, bound, policy=policy, pick=True)
    names = [n["metadata"]["name"] for n in nodes]
    order.shuffle(names)  # kube-scheduler's order is not name order
    answer = ext.filter({"Pod": p, "NodeNames": names})
    with ext.cluster.live_books() as snap:
        spec = ext._pod({"Pod": p})
        r = schedule_one(
            build_profile(policy), spec, snap, tiebreak=np.arange(len(snap), dtype=np.int64), assume=False
        )
    assert answer["Error"] == ""
    if r.scheduled:
        assert answer["NodeNames"] == [r.node_name]
        assert answer["FailedNodes"] == {} and answer["FailedAndUnresolvableNodes"] == {}
        # /bind then takes the GPUs schedule_one takes there (the pick's device choice, reused)
        assert ext.reserve(ext._pod({"Pod": p}), "u-p", r.node_name).gpus == r.gpus
    else:  # nothing fits: every node explained, as without pick
        plain = make(nodes, bound, policy=policy, pick=False).filter({"Pod": p, "NodeNames": names})
        assert answer == plain and answer["NodeNames"] == []
        assert set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"]) == set(names)


def test_pick_chooses_among_the_sent_nodes_only() -> None:
    # n1's GPU 0 is half used: best fit for a 500 share; n2 and n3 are empty.
    ann = json.dumps({"node": "n1", "gpus": [0], "milli": 500, "memoryMiB": 0})
    ext = make([node("n1"), node("n2"), node("n3")], [pod("busy", milli=500, node_name="n1",
               annotations={ANN_ASSIGNMENT: ann})], pick=True)  # fmt: skip
    assert ext.filter({"Pod": pod("p", milli=500), "NodeNames": ["n3", "n1", "n2"]})["NodeNames"] == ["n1"]
    assert ext.filter({"Pod": pod("p", milli=500), "NodeNames": ["n3", "n2"]})["NodeNames"] == ["n2"]
    # objects instead of names (nodeCacheCapable false): every passing node, as without pick
    r = ext.filter({"Pod": pod("p", milli=500), "Nodes": {"items": [node("n2"), node("n3")]}})
    assert [n["metadata"]["name"] for n in r["Nodes"]["items"]] == ["n2", "n3"]


@pytest.mark.parametrize(
    "spec",
    [
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10,
            "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}},
        {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}},
        {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]},
    ],
)  # fmt: skip
def test_soft_scheduling_terms_leave_the_choice_to_kube_scheduler(spec: dict[str, Any]) -> None:
    """The extender reads no soft terms (kube-scheduler's Score plugins weigh them): such a pod
    gets every passing node back, so that kube-scheduler scores them and calls /prioritize."""
    ext = make([node("n1"), node("n2"), node("n3", gpus=1, mem_mib=8192)], pick=True)
    p = pod("p", mem=10000)
    p["spec"].update(spec)
    r = ext.filter({"Pod": p, "NodeNames": ["n1", "n2", "n3"]})
    assert r["NodeNames"] == ["n1", "n2"] and r["FailedAndUnresolvableNodes"] == {
        "n3": "Insufficient GPU memory"
    }
    plain = pod("q", mem=10000)
    assert ext.filter({"Pod": plain, "NodeNames": ["n1", "n2", "n3"]})["NodeNames"] == ["n1"]


def test_bind_reuses_the_picks_device_choice_only_while_the_node_is_unchanged() -> None:
    """``/bind`` takes the GPU ``/filter``'s pick chose without scoring the node again, unless
    something was booked or released on that node in between (its generation moved)."""
    ann = json.dumps({"node": "n1", "gpus": [1], "milli": 500, "memoryMiB": 0})
    busy = pod("busy", milli=500, node_name="n1", annotations={ANN_ASSIGNMENT: ann})
    ext = make([node("n1", gpus=2), node("n2", gpus=2)], [busy], policy="default", pick=True)
    request = pod("p", milli=500, uid="u-p")
    request["metadata"]["resourceVersion"] = "7"  # the spec is converted once, kept for /bind
    assert ext.filter({"Pod": request, "NodeNames": ["n1", "n2"]})["NodeNames"] == ["n1"]
    spec = ext._pod({"Pod": request})
    with ext.cluster.live_books() as snap:
        n1 = snap.index["n1"]
        assert ext.evaluator.device_hint(snap, spec, snap.index["n2"]) is None  # another node: no hint
    ext.filter({"Pod": request, "NodeNames": ["n1", "n2"]})
    with ext.cluster.live_books() as snap:
        assert ext.evaluator.device_hint(snap, spec, n1) == 1  # the half-used GPU
        assert ext.evaluator.device_hint(snap, spec, n1) is None  # used once
    ext.filter({"Pod": request, "NodeNames": ["n1", "n2"]})
    other = ext._pod({"Pod": pod("q", milli=250, uid="u-q")})
    ext.cluster.assume(other, n1, (0,))  # n1 changes between the pick and the binding
    with ext.cluster.live_books() as snap:
        assert ext.evaluator.device_hint(snap, spec, n1) is None
    assert ext.reserve(spec, "u-p", "n1").gpus == (1,)  # scored again: still the tightest fit
