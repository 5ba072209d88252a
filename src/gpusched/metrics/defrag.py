"""Metrics of the defragmentation controller (``gpusched defrag run``), on its own registry:

- ``gpusched_defrag_plans_total{result}`` — plans started and how they ended: ``completed`` (the
  pending pod was bound after the moves), ``abandoned`` (see the reason below)
- ``gpusched_defrag_plans_abandoned_total{reason}`` — ``pending-pod-gone``, ``blocked-by-pdb``,
  ``stale`` (a step no longer held on fresh books and no new plan was found),
  ``eviction-failed``, ``eviction-timeout`` (an evicted pod did not leave in time),
  ``not-placed`` (the moves were done but the pod was not bound in time), ``leadership-lost``
- ``gpusched_defrag_no_plan_total{reason}`` — pods waited too long, but no plan was started:
  ``fits-now`` (the scheduler will place it) or ``infeasible`` (no plan within the rules)
- ``gpusched_defrag_moves_total`` — pods evicted by plans (each one recreated by its owner)
- ``gpusched_defrag_evictions_total{outcome}`` — Eviction API answers: evicted, blocked, gone, failed
- ``gpusched_defrag_gain_gpus_total`` — GPUs of the pending pods that landed after completed plans
- ``gpusched_defrag_planning_duration_seconds{method}`` — time to plan (fits-now, milp, greedy, none)
- ``leader_election_master_status{name}`` — 1 on the replica holding the Lease (client-go's name)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_PLAN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

ABANDON_REASONS = (
    "pending-pod-gone",
    "blocked-by-pdb",
    "stale",
    "eviction-failed",
    "eviction-timeout",
    "not-placed",
    "leadership-lost",
    "no-controller",
    "record-failed",
)


class DefragMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.plans = Counter(
            "gpusched_defrag_plans",
            "Defragmentation plans started, by how they ended.",
            ["result"],
            registry=r,
        )
        self.abandoned = Counter(
            "gpusched_defrag_plans_abandoned",
            "Defragmentation plans abandoned, by the reason.",
            ["reason"],
            registry=r,
        )
        self.no_plan = Counter(
            "gpusched_defrag_no_plan",
            "Pods that waited too long for which no plan was started, by the reason.",
            ["reason"],
            registry=r,
        )
        self.moves = Counter("gpusched_defrag_moves", "Pods evicted by defragmentation plans.", registry=r)
        self.evictions = Counter(
            "gpusched_defrag_evictions",
            "Eviction API answers to the defragmentation controller, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.gain_gpus = Counter(
            "gpusched_defrag_gain_gpus",
            "GPUs of pending pods that landed after a completed defragmentation plan.",
            registry=r,
        )
        self.planning = Histogram(
            "gpusched_defrag_planning_duration_seconds",
            "Time to plan for one pending pod or gang, by the method that answered.",
            ["method"],
            buckets=_PLAN_BUCKETS,
            registry=r,
        )
        self.leader_status = Gauge(
            "leader_election_master_status",
            "1 when this replica is the leader of the named lease, else 0.",
            ["name"],
            registry=r,
        )
        for reason in ABANDON_REASONS:  # every series from the start: rate() needs a zero
            self.abandoned.labels(reason)
        for result in ("completed", "abandoned"):
            self.plans.labels(result)

    def completed(self, gpus: float) -> None:
        self.plans.labels("completed").inc()
        self.gain_gpus.inc(gpus)

    def abandon(self, reason: str) -> None:
        self.plans.labels("abandoned").inc()
        self.abandoned.labels(reason).inc()

    def set_leader(self, lease: str, leading: bool) -> None:
        self.leader_status.labels(lease).set(1.0 if leading else 0.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
