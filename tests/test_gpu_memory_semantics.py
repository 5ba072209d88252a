"""``nvidia.com/gpu: N`` with ``gpusched.io/gpu-memory`` is N whole GPUs of at least that much memory
(issue 9): the conversion, the core's filter, device choice and books, and the Kubernetes books.

The rule: never book less than the kubelet hands out. A pod with ``nvidia.com/gpu: N`` holds N GPUs
whole (1000 milli and all their memory each), and nothing else, no share by milli or by memory,
ever sits on one of them. The property test drives Kubernetes pod objects through ``pod_from_k8s``
and ``schedule_one`` and checks the books against the requests as written, independently of the
core's own arithmetic.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.cluster import ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.convert import (
    ANN_ASSIGNMENT,
    RES_GPU,
    RES_MEMORY,
    RES_MILLI,
    assignment_annotation,
    pod_from_k8s,
)
from gpusched.k8s.state import LiveCluster

ALL_POLICIES = ("random", "dotprod", "packing", "clustering", "bestfit", "fgd", "default")
T4_MIB, A10_MIB = 15360, 24576


def k8s_pod(
    name: str, res: dict[str, str], node: str = "", gpus: tuple[int, ...] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]},
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node:
        obj["spec"]["nodeName"] = node
        if gpus is not None:
            obj["metadata"]["annotations"][ANN_ASSIGNMENT] = assignment_annotation(
                node, gpus, pod_from_k8s(obj)
            )
    return obj


def spec(name: str, **res: str) -> PodSpec:
    names = {"gpu": RES_GPU, "milli": RES_MILLI, "memory": RES_MEMORY}
    return pod_from_k8s(k8s_pod(name, {names.get(k, k): v for k, v in res.items()}))


def gpu_node(name: str, gpus: int = 1, gmem: int = T4_MIB, model: str = "T4") -> NodeSpec:
    return NodeSpec(
        name, cpu_milli=32_000, memory_mib=131_072, gpu_count=gpus, gpu_model=model, gpu_memory_mib=gmem
    )


def profile(policy: str, pods: list[PodSpec]) -> Profile:
    ctx = PolicyContext(workload=TargetWorkload.from_pods(pods), rng=np.random.default_rng(0))
    return make_profile(policy, ctx)


# ------------------------------------------------------------------------------------ the issue
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_the_issue_whole_gpu_with_memory_never_joins_a_share(policy: str) -> None:
    """On a 1-GPU node a 600-milli share holds GPU 0; two pods of nvidia.com/gpu 1 + gpu-memory 10000
    used to land beside it (shares by memory, 0 milli). Now neither does; with a second node, one
    takes that node's GPU whole and the other waits."""
    share = spec("share", milli="600")
    wm = [spec(f"wm-{i}", gpu="1", memory="10000") for i in range(2)]
    prof = profile(policy, [share, *wm])
    snap = ClusterState([gpu_node("n0")])
    assert schedule_one(prof, share, snap).gpus == (0,)
    for p in wm:
        r = schedule_one(prof, p, snap, diagnose_failures=True)
        assert not r.scheduled
        assert (
            r.diagnosis is not None
            and r.diagnosis.message() == "0/1 nodes are available: 1 Insufficient GPU."
        )
    assert snap.verify() == [] and int(snap.gpu_free[0, 0]) == 400

    snap = ClusterState([gpu_node("n0"), gpu_node("n1")])
    snap.assume(share, 0, [0])
    first, second = (schedule_one(prof, p, snap) for p in wm)
    assert (first.node, first.gpus) == (1, (0,)) and not second.scheduled
    assert int(snap.gpu_free[1, 0]) == 0 and int(snap.gpu_mem_free[1, 0]) == 0  # booked whole
    assert snap.verify() == []


def test_whole_gpu_with_memory_is_booked_whole_and_shares_nothing() -> None:
    snap = ClusterState([gpu_node("n0", gpus=2)])
    wm = spec("wm", gpu="1", memory="10000")
    snap.assume(wm, 0, [0])
    assert snap.gpu_free[0].tolist() == [0, 1000] and snap.gpu_mem_free[0].tolist() == [0, T4_MIB]
    prof = profile("default", [wm])
    for other in (spec("m", milli="100"), spec("g", memory="1024"), spec("mg", milli="100", memory="1024")):
        assert snap.check_fits(other, 0, [0]) is not None, other
        r = schedule_one(prof, other, snap)
        assert r.gpus == (1,), other  # the free GPU, never GPU 0
        snap.forget(other.key)
    snap.forget(wm.key)
    assert snap.gpu_free[0].tolist() == [1000, 1000] and snap.gpu_mem_free[0].tolist() == [T4_MIB, T4_MIB]
    assert snap.verify() == []


def test_whole_gpu_never_joins_a_share_by_memory() -> None:
    snap = ClusterState([gpu_node("n0", gpus=2)])
    snap.assume(spec("g", memory="1024"), 0, [0])  # GPU 0: all 1000 milli free, 1024 MiB taken
    for whole in (spec("w", gpu="1"), spec("wm", gpu="1", memory="10000"), spec("wk", milli="1000")):
        assert "a share holds 1024 MiB" in (snap.check_fits(whole, 0, [0]) or "")
        assert pick_gpus(snap, whole, 0) == (1,)
    two = spec("w2", gpu="2")
    r = schedule_one(profile("default", [two]), two, snap, diagnose_failures=True)
    assert not r.scheduled and r.diagnosis is not None
    assert r.diagnosis.message() == "0/1 nodes are available: 1 Insufficient GPU."


def test_the_memory_figure_picks_gpus_with_that_much_memory() -> None:
    nodes = [
        gpu_node("t4"),
        gpu_node("a10", gmem=A10_MIB, model="A10"),
        gpu_node("unknown", gmem=0, model="G2"),
    ]
    snap = ClusterState(nodes)
    prof = profile("default", [spec("w", gpu="1")])
    r = schedule_one(prof, spec("big", gpu="1", memory="20000"), snap)
    assert r.node_name == "a10"  # only the A10 has 20000 MiB
    r = schedule_one(prof, spec("huge", gpu="1", memory="30000"), snap, diagnose_failures=True)
    assert not r.scheduled and r.diagnosis is not None
    assert r.diagnosis.message() == "0/3 nodes are available: 3 Insufficient GPU memory."
    # a node whose GPU memory is unknown never qualifies for a memory figure; a plain whole GPU takes it
    r = schedule_one(prof, spec("small", gpu="1", memory="1024"), snap)
    assert r.node_name == "t4"
    assert schedule_one(prof, spec("fig", gpu="1", memory="1"), snap).scheduled is False
    assert schedule_one(prof, spec("plain", gpu="1"), snap).node_name == "unknown"
    assert snap.verify() == []


def test_live_cluster_books_a_bound_whole_gpu_with_memory_whole() -> None:
    """Rebuilding the books from the API: the bound pod holds GPU 0 whole, so a share by memory that
    would fit its leftover memory goes to GPU 1."""
    lc = LiveCluster()
    lc.upsert_node(
        {
            "metadata": {
                "name": "n1",
                "labels": {"nvidia.com/gpu.product": "T4", "nvidia.com/gpu.memory": str(T4_MIB)},
            },
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", RES_GPU: "2"}},
        }
    )
    lc.upsert_pod(k8s_pod("wm", {RES_GPU: "1", RES_MEMORY: "10000"}, node="n1", gpus=(0,)))
    ann = json.loads(
        k8s_pod("wm", {RES_GPU: "1", RES_MEMORY: "10000"}, node="n1", gpus=(0,))["metadata"]["annotations"][
            ANN_ASSIGNMENT
        ]
    )
    assert ann["milli"] == 1000
    with lc.live_books() as st:
        assert st.gpu_free[0].tolist() == [0, 1000] and st.gpu_mem_free[0].tolist() == [0, T4_MIB]
        mem_share = spec("g", memory="4096")
        assert schedule_one(profile("default", [mem_share]), mem_share, st).gpus == (1,)


# ------------------------------------------------------------------------------------ property
KINDS = ("whole", "whole-mem", "share", "share-mem", "mem", "cpu")


@st.composite
def k8s_requests(draw: st.DrawFn) -> dict[str, str]:
    kind = draw(st.sampled_from(KINDS))
    res = {"cpu": str(draw(st.sampled_from((0, 1, 2))))}
    if kind.startswith("whole"):
        res[RES_GPU] = str(draw(st.sampled_from((1, 1, 2, 4))))
        if draw(st.booleans()):
            res[RES_MILLI] = "1000"  # says the same
    if kind.startswith("share"):
        res[RES_MILLI] = str(draw(st.integers(1, 1000)))
    if kind.endswith("mem"):
        res[RES_MEMORY] = str(draw(st.sampled_from((1024, 4096, 10000, 16384, 20000, 30000))))
    return res


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[NodeSpec], list[tuple[str, Any]], str]:
    nodes = [
        gpu_node(
            f"n{i}", gpus=draw(st.integers(1, 4)), gmem=draw(st.sampled_from((0, T4_MIB, A10_MIB, 81920)))
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    events: list[tuple[str, Any]] = []
    for i in range(draw(st.integers(1, 30))):
        if i and draw(st.integers(0, 5)) == 0:
            events.append(("del", draw(st.integers(0, 100))))
        else:
            events.append(("add", k8s_pod(f"p{i}", draw(k8s_requests()))))
    return nodes, events, draw(st.sampled_from(ALL_POLICIES))


def is_whole(res: dict[str, str]) -> bool:
    """nvidia.com/gpu (any gpu-memory only picks the GPUs), or gpu-milli 1000: one whole GPU."""
    return RES_GPU in res or res.get(RES_MILLI) == str(GPU_MILLI)


def check_books(snap: ClusterState, requests: dict[str, dict[str, str]]) -> None:
    """The books against the requests as written: a pod with nvidia.com/gpu holds its GPUs alone, with
    1000 milli each; per GPU the milli booked stays ≤ 1000 and the memory ≤ the GPU's."""
    holders: dict[tuple[int, int], list[str]] = defaultdict(list)
    milli: dict[tuple[int, int], int] = defaultdict(int)
    mem: dict[tuple[int, int], int] = defaultdict(int)
    for key, a in snap.allocations.items():
        res, node = requests[key], snap.nodes[a.node]
        whole = is_whole(res)
        if whole:
            assert len(a.gpus) == int(res.get(RES_GPU, 1)) and a.pod.gpu_milli == GPU_MILLI, key
            assert node.gpu_memory_mib >= int(res.get(RES_MEMORY, 0)), key
        for g in a.gpus:
            holders[a.node, g].append(key)
            milli[a.node, g] += a.pod.gpu_milli
            mem[a.node, g] += node.gpu_memory_mib if whole else int(res.get(RES_MEMORY, 0))
    for (n, g), keys in holders.items():
        if any(RES_GPU in requests[k] for k in keys):
            assert len(keys) == 1, f"node {n} GPU {g}: a whole-GPU pod beside others: {keys}"
        assert milli[n, g] <= GPU_MILLI and mem[n, g] <= snap.nodes[n].gpu_memory_mib, (n, g, keys)
        assert int(snap.gpu_free[n, g]) == GPU_MILLI - milli[n, g]
        assert int(snap.gpu_mem_free[n, g]) == snap.nodes[n].gpu_memory_mib - mem[n, g]
    assert snap.verify() == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams())
def test_whole_gpu_pods_never_share_and_the_books_never_overflow(
    stream: tuple[list[NodeSpec], list[tuple[str, Any]], str],
) -> None:
    nodes, events, policy = stream
    pods = [pod_from_k8s(x) for kind, x in events if kind == "add"]
    prof = profile(policy, pods)
    snap = ClusterState(nodes)
    requests: dict[str, dict[str, str]] = {}
    for kind, x in events:
        if kind == "del":
            live = sorted(snap.allocations)
            if live:
                snap.forget(live[x % len(live)])
            check_books(snap, requests)
            continue
        pod = pod_from_k8s(x)
        requests[pod.key] = x["spec"]["containers"][0]["resources"]["requests"]
        r = schedule_one(prof, pod, snap)
        check_books(snap, requests)
        if r.scheduled or not pod.num_gpu:
            continue
        # completeness, loosely: a node with nothing on it that has the GPUs and memory takes the pod
        for n, nd in enumerate(nodes):
            if (
                not snap.node_pods[n]
                and nd.gpu_count >= pod.num_gpu
                and nd.gpu_memory_mib >= pod.gpu_memory_mib
            ):
                raise AssertionError(f"{pod} fits the empty node {nd.name} but was not scheduled")
