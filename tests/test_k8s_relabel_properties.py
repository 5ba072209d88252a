"""A node whose labels or taints change is updated in place in the live books (no rebuild):
the books stay exactly what a rebuild from the same API objects gives, taints and labels take
effect at once, and ``node_version`` moves so that the scheduler notices."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import k8s_node, k8s_pod
from gpusched.core.model import PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.convert import ANN_ASSIGNMENT, assignment_annotation, pod_from_k8s
from gpusched.k8s.state import LiveCluster

NODES = ("n0", "n1", "n2")
TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}


def node(name: str, tainted: bool, zone: str, gpus: int = 4) -> dict[str, Any]:
    spec = {"taints": [TAINT]} if tainted else None
    return k8s_node(name, gpus, labels={"zone": zone}, spec=spec)


def bound(name: str, node_name: str, gpu: int, milli: int) -> dict[str, Any]:
    obj = k8s_pod(name, {"gpusched.io/gpu-milli": str(milli)}, node_name=node_name)
    obj["metadata"].setdefault("annotations", {})[ANN_ASSIGNMENT] = assignment_annotation(
        node_name, (gpu,), pod_from_k8s(obj)
    )
    return obj


def books(lc: LiveCluster) -> tuple[Any, ...]:
    with lc.live_books() as s:
        assert s.verify() == []
        return (
            {k: (s.names[a.node], a.gpus) for k, a in s.allocations.items()},
            s.gpu_free.tolist(),
            s.cpu_free.tolist(),
            tuple(s.nodes),
        )


event = st.one_of(
    st.tuples(
        st.just("node"),
        st.sampled_from(NODES),
        st.booleans(),
        st.sampled_from("ab"),
        st.sampled_from([4, 4, 2]),
    ),
    st.tuples(st.just("pod"), st.sampled_from(NODES), st.integers(0, 1), st.sampled_from([100, 300, 500])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(event, max_size=25))
def test_relabelling_in_place_keeps_the_books_a_rebuild_gives(events: list[tuple[Any, ...]]) -> None:
    lc = LiveCluster()
    objs: dict[str, dict[str, Any]] = {}
    for n in NODES:
        lc.upsert_node(node(n, False, "a"))
    books(lc)  # the books exist: later node changes go in place where they can
    used: dict[tuple[str, int], int] = {}
    for i, ev in enumerate(events):
        version = lc.node_version
        if ev[0] == "node":
            _, name, tainted, zone, gpus = ev
            obj = node(name, tainted, zone, gpus)
            with lc.live_books() as s:
                changed = s.nodes[s.index[name]] != _spec(obj)
            lc.upsert_node(obj)
            assert (lc.node_version > version) == changed
        else:
            _, name, gpu, milli = ev
            if used.get((name, gpu), 0) + milli > 1000:
                continue  # the API never shows a GPU overcommitted
            used[(name, gpu)] = used.get((name, gpu), 0) + milli
            obj = bound(f"p{i}", name, gpu, milli)
            objs[f"p{i}"] = obj
            lc.upsert_pod(obj)
        live = books(lc)
        fresh = LiveCluster()
        for n in NODES:
            with lc.live_books() as s:
                fresh.upsert_node(_obj_of(s.nodes[s.index[n]]))
        for o in objs.values():
            fresh.upsert_pod(o)
        assert books(fresh) == live


def _spec(obj: dict[str, Any]) -> Any:
    from gpusched.k8s.convert import node_from_k8s

    return node_from_k8s(obj)


def _obj_of(spec: Any) -> dict[str, Any]:
    return node(spec.name, bool(spec.taints), spec.labels["zone"], spec.gpu_count)


def test_a_lifted_taint_is_seen_by_the_next_decision_without_a_rebuild() -> None:
    lc = LiveCluster()
    lc.upsert_node(node("n0", True, "a"))
    profile = make_profile("bestfit", PolicyContext(None, np.random.default_rng(0)))
    pod = PodSpec("p", 100, 100, 1, 300)
    with lc.live_books() as s:
        first = s
        assert not schedule_one(profile, pod, s).scheduled  # tainted, not tolerated
    version = lc.node_version
    lc.upsert_node(node("n0", False, "a"))
    assert lc.node_version == version + 1
    with lc.live_books() as s:
        assert s is first  # relabelled in place
        assert schedule_one(profile, pod, s).scheduled
