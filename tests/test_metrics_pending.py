"""``scheduler_pending_pods{queue}`` as kube-scheduler's queues: active, backoff, unschedulable,
gated; and the per-decision metrics the latency benchmark records."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from builders import k8s_pod
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.queue import SchedulingQueue
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.metrics.scheduling import SchedulerMetrics


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return k8s_pod(name, {"nvidia.com/gpu": "1"}, **spec)


def pending(m: SchedulerMetrics) -> dict[str, float | None]:
    return {
        q: m.registry.get_sample_value("scheduler_pending_pods", {"queue": q})
        for q in ("active", "backoff", "unschedulable", "gated")
    }


def test_unschedulable_pods_move_to_backoff_on_a_cluster_change_then_to_active() -> None:
    now = [0.0]
    q = SchedulingQueue(clock=lambda: now[0])
    for name in ("a", "b", "c"):
        q.add_or_update(parse_pod_event(pod(name)))
    for _ in range(3):
        qp = q.pop(timeout=0)
        assert qp is not None
        q.done(qp.key, unschedulable=True)
    c = q.counts()
    assert (c["active"], c["backoff"], c["unschedulable"], c["gated"]) == (0, 0, 3, 0)
    q.cluster_changed()  # something freed: they wait out their backoff
    c = q.counts()
    assert (c["active"], c["backoff"], c["unschedulable"]) == (0, 3, 0)
    now[0] = 2.0  # backoff (1 s) over: the next pop moves them to active
    assert q.pop(timeout=0) is not None
    c = q.counts()
    assert (c["active"], c["backoff"], c["unschedulable"], c["in_flight"]) == (2, 0, 0, 1)


def test_a_pod_back_from_a_failed_binding_is_in_backoff() -> None:
    q = SchedulingQueue()
    q.add_or_update(parse_pod_event(pod("p")), backoff=True)
    c = q.counts()
    assert (c["active"], c["backoff"], c["unschedulable"]) == (0, 1, 0)


def test_gated_pods_are_counted_until_their_gates_go() -> None:
    q = SchedulingQueue()
    q.add_or_update(parse_pod_event(pod("p")))
    q.gate("default/p")
    c = q.counts()
    assert (c["active"], c["gated"], len(q)) == (0, 1, 0)
    q.add_or_update(parse_pod_event(pod("p")))  # gates removed
    c = q.counts()
    assert (c["active"], c["gated"]) == (1, 0)
    q.gate("default/p")
    q.remove("default/p")  # deleted while gated
    assert q.counts()["gated"] == 0


def test_the_scheduler_reports_each_queue() -> None:
    sched = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    try:
        name = sched.config.scheduler_name
        gates = [{"name": "example.com/wait"}]
        sched.pods.upsert(pod("gated", schedulerName=name, schedulingGates=gates))
        sched.pods.upsert(pod("other", schedulerName="default-scheduler", schedulingGates=gates))
        sched.pods.upsert(pod("ready", schedulerName=name))
        sched.pods.upsert(pod("failed", schedulerName=name))
        qp = sched.queue.pop(timeout=0)
        assert qp is not None
        sched.queue.done(qp.key, unschedulable=True)
        sched.queue.cluster_changed()
        sched.metrics.set_pending(sched.queue.counts())
        assert pending(sched.metrics) == {"active": 1, "backoff": 1, "unschedulable": 0, "gated": 1}
    finally:
        sched.stop()


def test_each_decision_is_counted_under_its_result_and_profile() -> None:
    m = SchedulerMetrics(profile="p1")
    for result, seconds in (
        ("scheduled", 0.001),
        ("scheduled", 0.003),
        ("unschedulable", 0.2),
        ("error", 0.0),
    ):
        m.observe_attempt(result, seconds)
    count = m.registry.get_sample_value
    assert count("scheduler_schedule_attempts_total", {"result": "scheduled", "profile": "p1"}) == 2
    assert count("scheduler_schedule_attempts_total", {"result": "unschedulable", "profile": "p1"}) == 1
    assert count("scheduler_schedule_attempts_total", {"result": "error", "profile": "p1"}) == 1
    labels = {"result": "scheduled", "profile": "p1"}
    assert count("scheduler_scheduling_attempt_duration_seconds_count", labels) == 2
    assert count("scheduler_scheduling_attempt_duration_seconds_sum", labels) == 0.004
    assert count("scheduler_scheduling_attempt_duration_seconds_bucket", {**labels, "le": "0.002"}) == 1


def test_the_overhead_bench_compares_alternate_decisions_of_the_same_runs() -> None:
    from gpusched.bench.latency import bench_latency, bench_metrics_overhead

    row = bench_metrics_overhead(40, decisions=30, rounds=2)
    assert row["decisions"] == 60
    for key in ("p50_ms", "p99_ms", "cpu_us"):
        assert row[f"{key}_off"] and row[f"{key}_on"] and row[f"{key}_ratio"]
    assert float(row["exposition_kib"]) > 0  # type: ignore[arg-type]
    on, off = bench_latency(40, decisions=30, metrics=True), bench_latency(40, decisions=30)
    assert on["scheduled"] == off["scheduled"] and on["metrics"] and not off["metrics"]
