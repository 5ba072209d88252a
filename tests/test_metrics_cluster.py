"""The metrics of the books: per (model, pool) GPU counts, memory, stranded capacity; the
kube-scheduler names on the exposition; pending pods by reason and plugin."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload, cluster_fragmentation
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.status import Code, Diagnosis, NodeFailure, Status
from gpusched.metrics.cluster import DEFAULT_POOL, cluster_stats, node_pool
from gpusched.metrics.scheduling import QueueUsage, SchedulerMetrics, diagnosis_labels


def _state() -> ClusterState:
    nodes = [
        NodeSpec("a1", 32000, 65536, 2, "A100", 40960, labels={"karpenter.sh/nodepool": "train"}),
        NodeSpec("a2", 32000, 65536, 2, "A100", 40960, unhealthy_gpus=frozenset({1})),
        NodeSpec("t1", 16000, 32768, 1, "T4", 15360),
        NodeSpec("cpu", 8000, 16384),
    ]
    s = ClusterState(nodes)
    s.assume(PodSpec("whole", cpu_milli=1000, num_gpu=1, gpu_milli=1000), 0, [0])
    s.assume(PodSpec("share", cpu_milli=1000, num_gpu=1, gpu_milli=700, gpu_memory_mib=10240), 0, [1])
    return s


def _samples(m: SchedulerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_pool_is_the_first_pool_label_else_default() -> None:
    assert node_pool({"karpenter.sh/nodepool": "x", "gpusched.io/pool": "y"}) == "y"
    assert node_pool({"eks.amazonaws.com/nodegroup": "ng"}) == "ng"
    assert node_pool({}) == DEFAULT_POOL


def test_groups_count_gpus_by_state_memory_and_allocation() -> None:
    st = cluster_stats(_state(), None)
    assert set(st.groups) == {("A100", "train"), ("A100", DEFAULT_POOL), ("T4", DEFAULT_POOL)}  # no CPU node
    train = st.groups[("A100", "train")]
    assert train.gpus == {"idle": 0, "shared": 1, "full": 1, "unhealthy": 0}
    assert train.gpus_allocated == pytest.approx(1.7)
    assert train.gpu_memory_bytes == 2 * 40960 * 2**20
    assert train.gpu_memory_allocated_bytes == (40960 + 10240) * 2**20  # a whole GPU books all its memory
    assert train.free_gpus == pytest.approx(0.3)
    assert st.groups[("A100", DEFAULT_POOL)].gpus == {"idle": 1, "shared": 0, "full": 0, "unhealthy": 1}
    assert all(g.stranded_gpus == 0.0 for g in st.groups.values())  # no target workload: nothing stranded
    g = st.per_gpu
    assert g.nodes == ("a1", "a2", "t1") and g.pools == ("train", DEFAULT_POOL, DEFAULT_POOL)
    rows = [
        (g.nodes[i], j, g.models[i], g.pools[i]) for i, j in zip(g.node.tolist(), g.gpu.tolist(), strict=True)
    ]
    assert rows == [
        ("a1", 0, "A100", "train"), ("a1", 1, "A100", "train"), ("a2", 0, "A100", DEFAULT_POOL),
        ("a2", 1, "A100", DEFAULT_POOL), ("t1", 0, "T4", DEFAULT_POOL),
    ]  # fmt: skip
    assert g.allocated_ratio.tolist() == [1.0, 0.7, 0.0, 0.0, 0.0]
    assert g.healthy.tolist() == [True, True, True, False, True]


def test_stranded_is_fgd_fragmentation_per_group() -> None:
    s = _state()
    # the target workload: half-GPU pods: the 300 milli left beside the 700 share is stranded
    tw = TargetWorkload.from_pods(
        [PodSpec(f"p{i}", cpu_milli=1000, num_gpu=1, gpu_milli=500) for i in range(4)]
    )
    st = cluster_stats(s, tw)
    train = st.groups[("A100", "train")]
    assert train.stranded_gpus == pytest.approx(0.3)
    assert train.fragmentation_ratio == pytest.approx(1.0)
    assert st.groups[("T4", DEFAULT_POOL)].stranded_gpus == 0.0  # an idle GPU takes a half
    total = sum(g.stranded_gpus for g in st.groups.values())
    assert total * 1000 == pytest.approx(cluster_fragmentation(s, tw))


def test_exposition_uses_kube_scheduler_names_and_labels() -> None:
    m = SchedulerMetrics(profile="gpusched")
    m.observe_attempt("scheduled", 0.003)
    m.observe_attempt("unschedulable", 0.002)
    m.set_pending({"active": 2, "unschedulable": 1, "in_flight": 5})
    m.preempted(3)
    m.set_leader("gpusched-scheduler", True)
    m.set_cluster(cluster_stats(_state(), None))
    got = _samples(m)
    assert got[("scheduler_schedule_attempts_total", (("profile", "gpusched"), ("result", "scheduled")))] == 1
    key = (
        "scheduler_scheduling_attempt_duration_seconds_count",
        (("profile", "gpusched"), ("result", "unschedulable")),
    )
    assert got[key] == 1
    assert got[("scheduler_pending_pods", (("queue", "active"),))] == 2
    assert got[("scheduler_pending_pods", (("queue", "backoff"),))] == 0
    assert ("scheduler_pending_pods", (("queue", "in_flight"),)) not in got  # not a kube-scheduler queue
    assert got[("scheduler_preemption_attempts_total", ())] == 1
    assert got[("scheduler_preemption_victims_sum", ())] == 3
    assert got[("leader_election_master_status", (("name", "gpusched-scheduler"),))] == 1
    assert got[("gpusched_is_leader", ())] == 1
    gl = (("model", "A100"), ("pool", "train"))
    assert got[("gpusched_gpus", (*gl, ("state", "full")))] == 1
    assert got[("gpusched_gpus_allocated", gl)] == pytest.approx(1.7)
    assert got[("gpusched_gpu_allocation_ratio", ())] == pytest.approx(1.7 / 5)
    gpu = (("gpu", "1"), ("model", "A100"), ("node", "a1"), ("pool", "train"))
    assert got[("gpusched_gpu_allocated_ratio", gpu)] == pytest.approx(0.7)
    assert (
        got[("gpusched_gpu_healthy", (("gpu", "1"), ("model", "A100"), ("node", "a2"), ("pool", "default")))]
        == 0
    )
    assert sum(1 for name, _ in got if name == "gpusched_gpu_healthy") == 5
    assert not any(name.startswith("gpusched_queue") for name, _ in got)  # no queues yet: no series


def test_cluster_refresh_is_rate_limited() -> None:
    m, calls = SchedulerMetrics(), []

    def compute():  # type: ignore[no-untyped-def]
        calls.append(1)
        return cluster_stats(_state(), None)

    m.refresh_cluster(compute, min_interval_s=60)
    m.refresh_cluster(compute, min_interval_s=60)
    assert len(calls) == 1 and b"gpusched_gpus{" in m.exposition()
    m.refresh_cluster(compute, min_interval_s=0)
    assert len(calls) == 2


def test_pending_reasons_follow_the_pods_and_forget_the_gone() -> None:
    m = SchedulerMetrics(profile="p")
    m.pod_unschedulable("ns/a", "NodeResourcesFit", "Insufficient nvidia.com/gpu")
    m.pod_unschedulable("ns/b", "NodeResourcesFit", "Insufficient nvidia.com/gpu")
    m.pod_unschedulable("ns/c", "TaintToleration", "untolerated taint")
    got = _samples(m)
    assert got[("gpusched_pending_pods_by_reason", (("reason", "Insufficient nvidia.com/gpu"),))] == 2
    assert got[("scheduler_unschedulable_pods", (("plugin", "TaintToleration"), ("profile", "p")))] == 1
    m.pod_scheduled("ns/a")
    m.pods_pending(["ns/b"])  # c left the queue
    got = _samples(m)
    assert got[("gpusched_pending_pods_by_reason", (("reason", "Insufficient nvidia.com/gpu"),))] == 1
    assert ("scheduler_unschedulable_pods", (("plugin", "TaintToleration"), ("profile", "p"))) not in got


def test_queue_hook_exposes_usage() -> None:
    m = SchedulerMetrics()
    m.set_queue_usage([QueueUsage("team-a", 6, 8, 2)])
    got = _samples(m)
    assert got[("gpusched_queue_gpus_used", (("queue", "team-a"),))] == 6
    assert got[("gpusched_queue_gpus_quota", (("queue", "team-a"),))] == 8


def test_diagnosis_labels_pick_the_reason_most_nodes_gave() -> None:
    fails = (
        NodeFailure("n1", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
        NodeFailure("n2", "untolerated taint", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "TaintToleration"),
        NodeFailure("n3", "untolerated taint", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "TaintToleration"),
    )
    assert diagnosis_labels(Diagnosis(3, fails), Status()) == ("TaintToleration", "untolerated taint")
    pre = Status.unschedulable("no node has model H100", "GPUModel")
    assert diagnosis_labels(Diagnosis(3, (), pre), Status()) == ("GPUModel", "no node has model H100")
    assert diagnosis_labels(None, pre) == ("GPUModel", "no node has model H100")


def test_event_writes_are_exposed_by_result_as_the_recorder_counts_them() -> None:
    from unittest import mock

    from gpusched.k8s.events import RESULTS, EventRecorder

    m = SchedulerMetrics()
    assert not [k for k in _samples(m) if k[0].startswith("gpusched_event_writes")]  # no recorder yet
    core = mock.Mock()
    core.create_namespaced_event.side_effect = [None, RuntimeError("apiserver down")]
    rec = EventRecorder(core, workers=1)
    try:
        m.watch_event_writes(rec.counts)
        rec.scheduled({"metadata": {"name": "a", "namespace": "ns", "uid": "a"}}, "n1")
        rec.scheduled({"metadata": {"name": "b", "namespace": "ns", "uid": "b"}}, "n1")
        rec.flush()
    finally:
        rec.stop()
    got = {dict(k[1])["result"]: v for k, v in _samples(m).items() if k[0] == "gpusched_event_writes_total"}
    assert got == {"sent": 1.0, "failed": 1.0, "dropped": 0.0, "stale": 0.0}
    assert set(got) == set(RESULTS)
