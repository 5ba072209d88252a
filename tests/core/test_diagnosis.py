"""Diagnosis: one reason per node, worded and ordered as kube-scheduler words them."""

from __future__ import annotations

from builders import node, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.model import PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code, Diagnosis, NodeFailure, Status

# ------------------------------------------------------------------------------- diagnosis, status


def crowded() -> ClusterState:
    """n1, n2: model A, 8 cores of which 6 are taken; n3: model B, 32 cores free."""
    snap = ClusterState(
        [node("n1", gpus=1, cpu=8000), node("n2", gpus=1, cpu=8000), node("n3", gpus=1, model="B")]
    )
    snap.assume(PodSpec("busy1", cpu_milli=6000), 0, [])
    snap.assume(PodSpec("busy2", cpu_milli=6000), 1, [])
    return snap


WANTS_A = whole("gpu-a", 1, cpu=4000, gpu_models=frozenset({"A"}))


def test_diagnosis_counts_one_reason_per_node() -> None:
    snap = crowded()
    r = schedule_one(make_profile("bestfit"), WANTS_A, snap, diagnose_failures=True)
    assert not r.scheduled and r.node == -1
    assert r.diagnosis is not None
    assert dict(r.diagnosis.reason_counts()) == {"Insufficient cpu": 2, "GPU model mismatch": 1}
    assert {(f.node, f.plugin) for f in r.diagnosis.failures} == {
        ("n1", "NodeResourcesFit"),
        ("n2", "NodeResourcesFit"),
        ("n3", "GPUFit"),
    }
    msg = r.diagnosis.message()
    assert msg.startswith("0/3 nodes are available: ") and msg.endswith(".")
    assert sorted(msg.removeprefix("0/3 nodes are available: ").removesuffix(".").split(", ")) == [
        "1 GPU model mismatch",
        "2 Insufficient cpu",
    ]
    assert r.status.reasons == (msg,) and r.status.plugin == "Filter"
    # n1 and n2 would take the pod once the busy pods leave: resolvable; n3 never would
    assert r.diagnosis.unresolvable_nodes() == frozenset({"n3"})
    assert r.status.code == Code.UNSCHEDULABLE


def test_diagnosis_message_is_ordered_like_kube_scheduler() -> None:
    r = schedule_one(make_profile("bestfit"), WANTS_A, crowded(), diagnose_failures=True)
    assert r.status.message() == "0/3 nodes are available: 1 GPU model mismatch, 2 Insufficient cpu."


def test_diagnosis_message_format() -> None:
    fails = (
        NodeFailure("a", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
        NodeFailure("b", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
        NodeFailure("c", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
    )
    assert Diagnosis(3, fails).message() == "0/3 nodes are available: 3 Insufficient cpu."
    pre = Status.unschedulable("pod has unbound gang members", "Gang")
    assert (
        Diagnosis(5, (), pre_filter=pre).message() == "0/5 nodes are available: pod has unbound gang members."
    )


def test_all_nodes_unresolvable_gives_unschedulable_and_unresolvable() -> None:
    snap = ClusterState(
        [node("n1", gpus=2, model="B"), node("n2", gpus=2, model="C"), node("n3", gpus=8, model="B")]
    )
    r = schedule_one(make_profile("bestfit"), WANTS_A, snap, diagnose_failures=True)
    assert r.status.message() == "0/3 nodes are available: 3 GPU model mismatch."
    assert r.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    # CPU capacity below the request is unresolvable too
    snap2 = ClusterState([node("small", gpus=1, cpu=2000), node("b", gpus=1, model="B")])
    r2 = schedule_one(make_profile("bestfit"), WANTS_A, snap2, diagnose_failures=True)
    assert r2.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert dict(r2.diagnosis.reason_counts()) == {"Insufficient cpu": 1, "GPU model mismatch": 1}  # type: ignore[union-attr]


def test_without_diagnosis_no_per_node_reasons() -> None:
    r = schedule_one(make_profile("bestfit"), WANTS_A, crowded(), diagnose_failures=False)
    assert not r.scheduled and r.diagnosis is None
    assert r.status.message().startswith("0/3 nodes are available")
