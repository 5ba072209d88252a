"""The tenant queues' metrics (``gpusched_queue_*``): the standalone scheduler publishes every
Queue's status each time its tenant queues compute it: used, quota, borrowed, pending and
admitted pods follow admission and pods ending, and a deleted Queue's series go."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from builders import k8s_node, k8s_pod
from gpusched.core.model import PodSpec
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.spec import ANY_MODEL, QueueSpec, QueueTree, Quota, ResourceKey
from gpusched.core.queues.status import QueueStatus, queue_statuses
from gpusched.core.queues.usage import Usage, charge_of
from gpusched.k8s.queues import Directory, queue_from_k8s, valid_tree
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.metrics.scheduling import QueueUsage, SchedulerMetrics


class Queues:
    """A ``QueueDirectory`` that has listed ``objs`` (Queue objects by name)."""

    def __init__(self, objs: Mapping[str, dict[str, Any]], by_namespace: Mapping[str, str]) -> None:
        self.objs = dict(objs)
        self.by_namespace = dict(by_namespace)

    def installed(self) -> bool:
        return True

    def synced(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def current(self) -> Directory:
        tree, bad = valid_tree({n: queue_from_k8s(o) for n, o in self.objs.items()})
        return Directory(tree, bad, self.by_namespace)

    def objects(self) -> dict[str, dict[str, Any]]:
        return dict(self.objs)

    def start(self) -> None: ...

    def stop(self) -> None: ...


class StatusWrites:
    def __init__(self) -> None:
        self.written: dict[str, dict[str, Any]] = {}

    def patch_cluster_custom_object_status(self, *args: Any, **_: Any) -> None:
        name, body = args[3], args[4]
        self.written[name] = body["status"]


def qobj(name: str, gpus: int | None, parent: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"parent": parent} if parent else {}
    if gpus is not None:
        spec["nominalQuota"] = {"gpus": gpus}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": spec}


def gauges(m: SchedulerMetrics, family: str) -> dict[tuple[str, ...], float]:
    """``family``'s samples: label values (queue first) → value."""
    out = {}
    for metric in m.registry.collect():
        for s in metric.samples:
            if s.name == family:
                out[tuple(s.labels.values())] = s.value
    return out


def test_the_scheduler_publishes_its_queues_after_admission_pods_ending_and_deletion() -> None:
    sched = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    sched.actuator.bind = lambda *args: None  # type: ignore[method-assign]  # the decisions stay assumed
    # a cohort of 4 GPUs: team-a (2, the pods of namespace ml) and team-b (2) lend to org
    objs = {"org": qobj("org", None), "team-a": qobj("team-a", 2, "org"), "team-b": qobj("team-b", 2, "org")}
    sched.tenants.directory = Queues(objs, {"ml": "team-a"})  # type: ignore[assignment]
    writes = StatusWrites()
    sched.tenants.custom = writes
    try:
        sched.cluster.upsert_node(k8s_node("n0", gpus=8, model="T4"))
        pods = [
            k8s_pod(f"p{i}", {"nvidia.com/gpu": "1"}, ns="ml", schedulerName=sched.config.scheduler_name)
            for i in range(5)
        ]
        for p in pods:
            sched.pods.upsert(p)
        sched.leading.set()
        for _ in pods:
            qp = sched.queue.pop(timeout=0)
            assert qp is not None
            sched.schedule(qp)
        # admitted: 2 of team-a's quota and 2 borrowed from team-b; the fifth is over the cohort's 4
        assert sorted(sched.cluster.assumed()) == [f"ml/p{i}" for i in range(4)]
        sched.tenants.write_status()
        m = sched.metrics
        assert gauges(m, "gpusched_queue_gpus_used") == {("org",): 4, ("team-a",): 4, ("team-b",): 0}
        assert gauges(m, "gpusched_queue_gpus_quota") == {("org",): 4, ("team-a",): 2, ("team-b",): 2}
        assert gauges(m, "gpusched_queue_gpus_borrowed") == {("org",): 0, ("team-a",): 2, ("team-b",): 0}
        assert gauges(m, "gpusched_queue_pending_pods") == {("org",): 1, ("team-a",): 1, ("team-b",): 0}
        assert gauges(m, "gpusched_queue_admitted_pods") == {("org",): 4, ("team-a",): 4, ("team-b",): 0}
        usage = gauges(m, "gpusched_queue_resource_usage")
        assert usage[("team-a", "gpus", "")] == 4 and usage[("team-a", "gpus", "T4")] == 4
        assert usage[("team-a", "gpu_milli", "")] == 4000
        assert gauges(m, "gpusched_queue_resource_quota")[("team-a", "gpus", "")] == 2
        assert writes.written["team-a"]["usage"]["gpus"] == 4  # the same figures as the Queue's status

        # a pod ends (the informer shows it Succeeded): the queue gives one GPU back
        sched.cluster.upsert_pod({**pods[0], "spec": {**pods[0]["spec"], "nodeName": "n0"}})
        sched.cluster.upsert_pod({**pods[0], "spec": {**pods[0]["spec"], "nodeName": "n0"},
                                  "status": {"phase": "Succeeded"}})  # fmt: skip
        sched.tenants.write_status()
        assert gauges(m, "gpusched_queue_gpus_used")[("team-a",)] == 3
        assert gauges(m, "gpusched_queue_gpus_borrowed")[("team-a",)] == 1
        assert gauges(m, "gpusched_queue_admitted_pods")[("team-a",)] == 3

        # team-b is deleted: its series go, the others stay
        del sched.tenants.directory.objs["team-b"]  # type: ignore[attr-defined]
        sched.tenants.write_status()
        for family in ("gpusched_queue_gpus_used", "gpusched_queue_gpus_quota", "gpusched_queue_pending_pods",
                       "gpusched_queue_resource_quota", "gpusched_queue_resource_usage"):  # fmt: skip
            queues = {labels[0] for labels in gauges(m, family)}
            assert queues == {"org", "team-a"}, family
    finally:
        sched.stop()


def test_a_queue_deleted_and_made_again_gets_its_status_written_anew() -> None:
    sched = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    sched.tenants.directory = Queues({"a": qobj("a", 2)}, {})  # type: ignore[assignment]
    writes = StatusWrites()
    sched.tenants.custom = writes
    try:
        assert sched.tenants.write_status() == 1
        assert sched.tenants.write_status() == 0  # unchanged: not written again
        again = qobj("a", 2)
        again["metadata"]["uid"] = "uid-a-2"
        sched.tenants.directory.objs["a"] = again  # type: ignore[attr-defined]
        assert sched.tenants.write_status() == 1
    finally:
        sched.stop()


def status(quota: Mapping[ResourceKey, int], usage: Mapping[ResourceKey, int]) -> QueueStatus:
    borrowed = {k: max(0, usage.get(k, 0) - q) for k, q in quota.items() if usage.get(k, 0) > q}
    return QueueStatus("q", Usage(dict(usage)), borrowed, dict(quota), 1, 2)


GPUS, MILLI = ResourceKey(ANY_MODEL, "gpus"), ResourceKey(ANY_MODEL, "gpu_milli")


def test_gpu_figures_are_in_the_quotas_dimension_and_absent_without_one() -> None:
    used = {GPUS: 2, MILLI: 2500}  # two whole GPUs and a half share
    whole = QueueUsage.of(status({GPUS: 3}, used))
    assert (whole.gpus_used, whole.gpus_quota, whole.gpus_borrowed) == (2, 3, 0)
    milli = QueueUsage.of(status({MILLI: 2000}, used))
    assert (milli.gpus_used, milli.gpus_quota, milli.gpus_borrowed) == (2.5, 2.0, 0.5)
    free = QueueUsage.of(status({}, used))
    assert (free.gpus_used, free.gpus_quota) == (2.5, None)
    m = SchedulerMetrics()
    m.set_queue_usage([free])
    assert gauges(m, "gpusched_queue_gpus_quota") == {}  # no quota: no series (no false alert)
    assert gauges(m, "gpusched_queue_resource_quota") == {}
    assert gauges(m, "gpusched_queue_resource_usage") == {("q", "gpus", ""): 2, ("q", "gpu_milli", ""): 2500}


pods_st = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.integers(1, 3),
        st.sampled_from([1000, 500, 300]),
        st.sampled_from(["T4", "A100"]),
    ),
    max_size=12,
)


@given(pods=pods_st, qa=st.integers(0, 4), qb=st.integers(0, 4))
def test_published_figures_add_up_as_the_books_do(
    pods: list[tuple[str, int, int, str]], qa: int, qb: int
) -> None:
    tree = QueueTree([
        QueueSpec("org"),  # its quota: what its children lend it
        QueueSpec("a", "org", nominal=Quota(gpus=qa, gpu_milli=1000 * qa)),
        QueueSpec("b", "org", nominal=Quota(gpus=qb, gpu_milli=1000 * qb)),
    ])  # fmt: skip
    book = QueueBook(tree)
    for i, (q, n, milli, model) in enumerate(pods):  # charged without a check: over quota too
        pod = PodSpec(f"p{i}", num_gpu=n if milli == 1000 else 1, gpu_milli=milli)
        book.charge(f"p{i}", q, charge_of(pod, model))
    m = SchedulerMetrics()
    m.set_queue_statuses(queue_statuses(book, {"a": 1}))
    used, quota = gauges(m, "gpusched_queue_gpus_used"), gauges(m, "gpusched_queue_gpus_quota")
    borrowed = gauges(m, "gpusched_queue_gpus_borrowed")
    for q in ("a", "b"):  # a leaf borrows what it uses over its quota, in the quota's dimension
        assert borrowed[(q,)] == max(0.0, used[(q,)] - quota[(q,)])
    assert quota == {("org",): qa + qb, ("a",): qa, ("b",): qb}
    usage = gauges(m, "gpusched_queue_resource_usage")
    for (q, dim, model), v in usage.items():  # every dimension as the book charges it
        assert v == book.usage(q)[ResourceKey(model, dim)]
        if q == "org":
            kids = sum(usage.get((k, dim, model), 0) for k in ("a", "b"))
            assert v == kids
    assert gauges(m, "gpusched_queue_admitted_pods")[("org",)] == len(pods)
    assert gauges(m, "gpusched_queue_pending_pods") == {("org",): 1, ("a",): 1, ("b",): 0}
