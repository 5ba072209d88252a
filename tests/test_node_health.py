"""GPU health on the scheduler side: ``gpusched.io/unhealthy-gpus`` (written by the node agent) keeps
those GPUs out of the books' offers, the GPU count comes from capacity, pods already on a failed GPU stay
booked, and a malformed annotation is refused naming the node and the annotation."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.agent.health import ANN_UNHEALTHY_GPUS, health_patch
from gpusched.core.cluster import ClusterState
from gpusched.core.devices import fitting_gpus, pick_gpus
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.model import GPU_MILLI, InvalidSpec, NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.convert import (
    ANN_ASSIGNMENT,
    InvalidRequest,
    assignment_annotation,
    node_from_k8s,
    pod_from_k8s,
)
from gpusched.k8s.state import LiveCluster


def node(
    name: str = "n0",
    gpus: int = 4,
    *,
    unhealthy: str | None = None,
    allocatable_gpus: int | None = None,
    capacity: bool = True,
) -> dict[str, Any]:
    alloc = {
        "cpu": "64",
        "memory": "256Gi",
        "nvidia.com/gpu": str(gpus if allocatable_gpus is None else allocatable_gpus),
    }
    status: dict[str, Any] = {"allocatable": alloc}
    if capacity:
        status["capacity"] = {**alloc, "nvidia.com/gpu": str(gpus)}
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": "40960"},
    }
    if unhealthy is not None:
        meta["annotations"] = {ANN_UNHEALTHY_GPUS: unhealthy}
    return {"metadata": meta, "status": status}


def pod(
    name: str, res: dict[str, str], node_name: str = "", gpus: tuple[int, ...] | None = None
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": ann},
        "spec": {"containers": [{"name": "c", "resources": {"limits": res}}]},
        "status": {"phase": "Running" if node_name else "Pending"},
    }
    if node_name:
        obj["spec"]["nodeName"] = node_name
        if gpus is not None:
            ann[ANN_ASSIGNMENT] = assignment_annotation(node_name, gpus, pod_from_k8s(obj))
    return obj


# ------------------------------------------------------------------------------------------- convert


def test_annotation_marks_gpus_unhealthy() -> None:
    spec = node_from_k8s(node(unhealthy="0,3"))
    assert spec.gpu_count == 4 and spec.unhealthy_gpus == frozenset({0, 3})
    assert node_from_k8s(node()).unhealthy_gpus == frozenset()
    assert node_from_k8s(node(unhealthy="")).unhealthy_gpus == frozenset()
    assert node_from_k8s(node(unhealthy=" 2 , 1 ")).unhealthy_gpus == frozenset({1, 2})


def test_what_the_agent_writes_is_what_the_scheduler_reads() -> None:
    n = node()
    patch = health_patch(n, [3, 1], gpu_count=4)
    assert patch is not None
    n["metadata"]["annotations"] = patch["metadata"]["annotations"]
    assert node_from_k8s(n).unhealthy_gpus == frozenset({1, 3})


def test_gpus_are_counted_from_capacity_not_allocatable() -> None:
    """The kubelet drops unhealthy devices from allocatable: 4 GPUs, GPU 1 failed -> allocatable 3. The
    books keep 4 GPUs (indices stay those of the assignments) with GPU 1 withheld, not 3 renumbered."""
    spec = node_from_k8s(node(gpus=4, allocatable_gpus=3, unhealthy="1"))
    assert spec.gpu_count == 4 and spec.unhealthy_gpus == frozenset({1})
    # a node reporting no capacity (as some tests and kwok setups do) is counted from allocatable
    assert node_from_k8s(node(gpus=2, capacity=False)).gpu_count == 2
    with pytest.raises(InvalidRequest, match=r"node n0: capacity nvidia.com/gpu 129 is more than 128"):
        node_from_k8s(node(gpus=129, allocatable_gpus=1))


def test_indices_beyond_the_gpu_count_name_no_gpu() -> None:
    assert node_from_k8s(node(gpus=2, unhealthy="1,2,7")).unhealthy_gpus == frozenset({1})
    assert node_from_k8s(node(gpus=2, unhealthy="99999999999999999999999")).unhealthy_gpus == frozenset()


@pytest.mark.parametrize(
    "value", ["x", "0,,1", "-1", "1.5", "0x1", "1;2", "²", "1" * 5000, "GPU-1234-uuid", "0, 1 2"]
)
def test_malformed_annotation_names_node_and_annotation(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        node_from_k8s(node("gpu-7", unhealthy=value))
    msg = str(info.value)
    assert msg.startswith("node gpu-7: annotation gpusched.io/unhealthy-gpus ") and "'0,3'" in msg
    assert len(msg) < 200  # the value is shown, cut short


def test_model_refuses_unhealthy_gpu_it_does_not_have() -> None:
    with pytest.raises(InvalidSpec, match=r"node n: unhealthy GPU\(s\) \[2\] not among its 2 GPUs"):
        NodeSpec("n", 1000, 1000, gpu_count=2, gpu_model="A", unhealthy_gpus=frozenset({2}))


# ---------------------------------------------------------------------------------------------- books

WHOLE = PodSpec("whole", num_gpu=1, gpu_milli=GPU_MILLI)
POLICIES = ("default", "fgd", "bestfit", "packing", "dotprod", "clustering", "random")
SHARE = PodSpec("share", num_gpu=1, gpu_milli=300, gpu_memory_mib=1024)
MEMORY_ONLY = PodSpec("mem", num_gpu=1, gpu_milli=0, gpu_memory_mib=1024)


def test_books_withhold_an_unhealthy_gpu_and_keep_its_pods() -> None:
    spec = node_from_k8s(node(gpus=2, unhealthy="0"))
    snap = ClusterState([spec])
    on_bad = PodSpec("on-bad", num_gpu=1, gpu_milli=400, gpu_memory_mib=2048)
    snap.assume(on_bad, 0, (0,))  # a pod already running on GPU 0 when it failed: still booked
    assert snap.verify() == [] and snap.node_gpu_free(0) == [600, 1000]
    for p in (WHOLE, SHARE, MEMORY_ONLY):
        assert fitting_gpus(snap, p, 0).tolist() == [False, True]
        assert pick_gpus(snap, p, 0) == (1,)
    two = PodSpec("two", num_gpu=2, gpu_milli=GPU_MILLI)
    r = schedule_one(profile("default"), two, snap)
    assert not r.scheduled  # one healthy GPU is not two
    snap.forget("default/on-bad")
    assert snap.verify() == [] and fitting_gpus(snap, WHOLE, 0).tolist() == [False, True]


@pytest.mark.parametrize(
    "policy", ["default", "fgd", "bestfit", "packing", "dotprod", "clustering", "random"]
)
def test_new_pods_avoid_the_unhealthy_gpu_then_recovery_brings_it_back(policy: str) -> None:
    cluster = LiveCluster()
    cluster.upsert_node(node("n0", gpus=2, unhealthy="1"))
    prof = profile(policy)
    placed = []
    for i in range(4):  # four 300-milli shares: 3 fit on GPU 0, the 4th finds no healthy room
        p = replace_name(SHARE, f"s{i}")
        with cluster.live_books() as snap:
            r = schedule_one(prof, p, snap)
            if r.scheduled:
                cluster.assume(p, r.node, r.gpus)  # as the front ends do: kept until seen bound
                placed.append(r.gpus)
    assert placed == [(0,), (0,), (0,)]
    cluster.upsert_node(node("n0", gpus=2))  # the agent removed the annotation: recovered
    with cluster.live_books() as snap:
        assert snap.nodes[0].unhealthy_gpus == frozenset()
        r = schedule_one(prof, replace_name(WHOLE, "w"), snap, assume=False)
        assert r.scheduled and r.gpus == (1,)


def profile(policy: str) -> Profile:
    workload = TargetWorkload.from_pods([WHOLE, SHARE, MEMORY_ONLY, replace(SHARE, name="s2", gpu_milli=700)])
    return make_profile(policy, PolicyContext(workload=workload, rng=np.random.default_rng(0)))


def replace_name(p: PodSpec, name: str) -> PodSpec:
    return replace(p, name=name)


def test_running_pods_on_a_failed_gpu_are_booked_without_conflict() -> None:
    cluster = LiveCluster()
    cluster.upsert_pod(pod("on-1", {"gpusched.io/gpu-milli": "500"}, "n0", (1,)))
    cluster.upsert_pod(pod("whole-0", {"nvidia.com/gpu": "1"}, "n0", (0,)))
    cluster.upsert_node(node("n0", gpus=2, unhealthy="1"))
    with cluster.live_books() as snap:
        assert snap.verify() == [] and snap.node_gpu_free(0) == [0, 500]
        assert set(snap.allocations) == {"default/on-1", "default/whole-0"}
        assert not fitting_gpus(snap, SHARE, 0).any()  # GPU 0 taken whole, GPU 1 unhealthy
    assert cluster.conflicts == []


def test_malformed_annotation_is_logged_naming_node_and_annotation(caplog: pytest.LogCaptureFixture) -> None:
    cluster = LiveCluster()
    with caplog.at_level(logging.WARNING, logger="gpusched.k8s.state"):
        cluster.upsert_node(node("gpu-9", unhealthy="zero"))
    assert "node gpu-9: annotation gpusched.io/unhealthy-gpus 'zero'" in caplog.text
    assert cluster.node_names() == []  # nothing is booked on a node whose health cannot be read


def test_a_known_node_that_turns_unreadable_is_withheld_until_it_reads_again() -> None:
    # Keeping its last spec would go on offering a GPU the agent has just reported failed.
    cluster = LiveCluster()
    cluster.upsert_pod(pod("on-0", {"gpusched.io/gpu-milli": "500"}, "n0", (0,)))
    cluster.upsert_node(node("n0", gpus=2))
    cluster.upsert_node(node("n0", gpus=2, unhealthy="1,x"))  # malformed: GPU 1 failed, and more
    with cluster.live_books() as snap:
        assert snap.verify() == [] and set(snap.allocations) == {"default/on-0"}  # still booked
        assert not fitting_gpus(snap, SHARE, 0).any() and not fitting_gpus(snap, WHOLE, 0).any()
        cpu_only = PodSpec("cpu-only", cpu_milli=100)
        assert not schedule_one(profile("default"), cpu_only, snap, assume=False).scheduled
    cluster.upsert_node(node("n0", gpus=2, unhealthy="1"))  # readable again
    with cluster.live_books() as snap:
        assert fitting_gpus(snap, SHARE, 0).tolist() == [True, False]
        assert snap.nodes[0].taints == ()


# ------------------------------------------------------------------------------------------ property


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeSpec]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        count = draw(st.integers(1, 4))
        bad = draw(st.frozensets(st.integers(0, count - 1), max_size=count))
        out.append(
            NodeSpec(
                f"n{i}",
                cpu_milli=64000,
                memory_mib=1 << 20,
                gpu_count=count,
                gpu_model="A",
                gpu_memory_mib=draw(st.sampled_from([0, 40960])),
                unhealthy_gpus=bad,
            )
        )
    return out


@st.composite
def gpu_pods(draw: st.DrawFn, name: str) -> PodSpec:
    kind = draw(st.sampled_from(["share", "memory", "whole"]))
    if kind == "whole":
        return PodSpec(name, num_gpu=draw(st.integers(1, 3)), gpu_milli=GPU_MILLI)
    mem = draw(st.sampled_from([0, 1024, 20480])) if kind == "share" else draw(st.sampled_from([1024, 20480]))
    milli = draw(st.integers(1, 1000)) if kind == "share" else 0
    return PodSpec(name, num_gpu=1, gpu_milli=milli, gpu_memory_mib=mem)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), nodes=clusters())
def test_books_never_offer_an_unhealthy_gpu(data: st.DataObject, nodes: list[NodeSpec]) -> None:
    """Whatever the cluster, the pods already running (also on failed GPUs) and the stream of new pods:
    no offer (``gpu_room``, ``fitting_gpus``, ``pick_gpus``) and no decision of any policy lands a pod on
    an unhealthy GPU, the books stay exact, and the same GPUs recovered are offered again when free."""
    snap = ClusterState(nodes)
    unhealthy = np.zeros(snap.gpu_exists.shape, dtype=bool)
    for n, nd in enumerate(nodes):
        unhealthy[n, list(nd.unhealthy_gpus)] = True
    # pods that were running before their GPU failed: booked where they are, healthy or not
    for i in range(data.draw(st.integers(0, 6), "running")):
        p = data.draw(gpu_pods(f"run{i}"), "running pod")
        n = data.draw(st.integers(0, len(nodes) - 1))
        if p.num_gpu > nodes[n].gpu_count:
            continue
        gpus = data.draw(st.permutations(range(nodes[n].gpu_count)))[: p.num_gpu]
        if snap.check_fits(p, n, gpus) is None:
            snap.assume(p, n, gpus)
    assert snap.verify() == []
    prof = profile(data.draw(st.sampled_from(POLICIES), "policy"))
    for i in range(data.draw(st.integers(1, 8), "new pods")):
        p = data.draw(gpu_pods(f"new{i}"), "new pod")
        room = snap.gpu_room(p, slice(None))
        assert not (room & unhealthy).any()
        for n in range(len(nodes)):
            fit = fitting_gpus(snap, p, n)
            assert not (fit & unhealthy[n]).any()
            if np.count_nonzero(fit) >= p.num_gpu:
                assert not unhealthy[n, list(pick_gpus(snap, p, n))].any()
        r = schedule_one(prof, p, snap)
        if r.scheduled:
            assert not unhealthy[r.node, list(r.gpus)].any(), (r.node_name, r.gpus)
        assert snap.verify() == []
    # recovery: the same books with every GPU healthy offer each formerly unhealthy GPU left entirely free
    healed = ClusterState([NodeSpec(**{**_fields(nd), "unhealthy_gpus": frozenset()}) for nd in nodes])
    for a in snap.allocations.values():
        healed.assume(a.pod, a.node, a.gpus, check=False)
    assert healed.verify() == []
    whole = PodSpec("probe", num_gpu=1, gpu_milli=GPU_MILLI)
    for n, g in zip(*np.nonzero(unhealthy), strict=True):
        if healed.gpu_free[n, g] == GPU_MILLI and healed.gpu_mem_free[n, g] == healed.gpu_mem_cap[n, g]:
            assert fitting_gpus(healed, whole, int(n))[g]


def _fields(nd: NodeSpec) -> dict[str, Any]:
    return {f: getattr(nd, f) for f in NodeSpec.__dataclass_fields__}
