"""Scheduling metrics, named after kube-scheduler's where one exists.

- ``gpusched_schedule_attempts_total{result}`` — scheduled | unschedulable | error
- ``gpusched_scheduling_attempt_duration_seconds{result}`` — one ``schedule_one`` cycle
- ``gpusched_binding_duration_seconds{result}`` — annotate + bind through the API
- ``gpusched_extender_request_duration_seconds{verb}`` — extender filter/prioritize/bind/preempt
- ``gpusched_pending_pods`` — pods waiting for gpusched
- ``gpusched_gpu_allocation_ratio`` — allocated / total GPU milli
- ``gpusched_gpu_fragmentation_ratio`` — fragmented / idle GPU milli (FGD's measure)
- ``gpusched_is_leader`` — 1 on the replica holding the Lease
- ``gpusched_preemption_attempts_total`` — preemptions started (victims chosen)
- ``gpusched_preemption_victims_total`` — pods evicted to make room
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.attempts = Counter(
            "gpusched_schedule_attempts", "Scheduling attempts by result.", ["result"], registry=r
        )
        self.attempt_duration = Histogram(
            "gpusched_scheduling_attempt_duration_seconds",
            "Latency of one scheduling cycle.",
            ["result"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.binding_duration = Histogram(
            "gpusched_binding_duration_seconds",
            "Latency of annotating and binding one pod.",
            ["result"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.extender_duration = Histogram(
            "gpusched_extender_request_duration_seconds",
            "Latency of extender requests by verb.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pending = Gauge("gpusched_pending_pods", "Pods waiting to be scheduled by gpusched.", registry=r)
        self.gpu_allocation = Gauge(
            "gpusched_gpu_allocation_ratio", "Allocated GPU milli over total GPU milli.", registry=r
        )
        self.fragmentation = Gauge(
            "gpusched_gpu_fragmentation_ratio", "Fragmented GPU milli over idle GPU milli.", registry=r
        )
        self.is_leader = Gauge(
            "gpusched_is_leader", "1 when this replica holds the leader Lease.", registry=r
        )

        self.preemption_attempts = Counter(
            "gpusched_preemption_attempts", "Preemptions started: victims chosen and evicted.", registry=r
        )
        self.preemption_victims = Counter(
            "gpusched_preemption_victims", "Pods evicted to make room for higher-priority pods.", registry=r
        )

    def observe_attempt(self, result: str, seconds: float) -> None:
        self.attempts.labels(result).inc()
        self.attempt_duration.labels(result).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
