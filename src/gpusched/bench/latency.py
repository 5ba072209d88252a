"""``gpusched bench latency``: per-decision latency of ``schedule_one`` on synthetic clusters.

The cluster is first filled to ``load`` (fraction of GPU milli allocated); then each measured
decision schedules one pod and, to hold the load steady, releases a random earlier pod
(not timed). Reported: latency percentiles over the decisions and decisions per second.

With ``constraints`` the nodes carry zone and hostname labels and every pod a label ``app``
(20 apps); a third of the pods spread over the zones (DoNotSchedule, maxSkew 3) and a third
prefer not to share a node with their app (preferred anti-affinity), as Deployments do.

With ``metrics`` each decision also records what the standalone scheduler records per decision
(``k8s.scheduler``: ``observe_attempt``, ``pod_scheduled`` or ``pod_unschedulable`` with its
labels), inside the timed region. ``bench_metrics_overhead`` alternates runs with and without
and reports the ratios, and the cost of one scrape (the cluster gauges and the exposition).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.selectors import LabelSelector, PodAffinityTerm, PreferredPodTerm, SpreadConstraint
from gpusched.metrics.cluster import cluster_stats
from gpusched.metrics.scheduling import SchedulerMetrics, diagnosis_labels
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload


class LatencySetting(NamedTuple):
    """The setting of every latency benchmark: an empty synthetic cluster
    (``sim.synthetic.synthetic_workload``), its pods (GPU demand 2.5× the cluster), the policy
    context learnt from them, and a seeded tie-break order."""

    snap: ClusterState
    pods: list[PodSpec]
    ctx: PolicyContext
    ranks: np.ndarray


def latency_setting(nodes: int, pods: int, seed: int) -> LatencySetting:
    cfg = SyntheticConfig(nodes=nodes, pods=pods, seed=seed, gpu_demand_pct=250.0)
    node_specs, tpods = synthetic_workload(cfg)
    specs = [tp.spec for tp in tpods]
    ctx = PolicyContext(workload=TargetWorkload.from_pods(specs), rng=np.random.default_rng(seed))
    snap = ClusterState(node_specs)
    return LatencySetting(snap, specs, ctx, np.random.default_rng(seed).permutation(len(snap)))


ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"


def with_constraints(snap: ClusterState, pods: list[PodSpec]) -> tuple[ClusterState, list[PodSpec]]:
    """The same cluster with zone and hostname labels, and the pods with apps and constraints."""
    nodes = [
        dataclasses.replace(n, labels={**n.labels, ZONE: f"zone-{i % 3}", HOST: n.name})
        for i, n in enumerate(snap.nodes)
    ]
    out = []
    for i, p in enumerate(pods):
        name = f"app-{i % 20}"
        mine = LabelSelector((("app", name),))
        kw: dict[str, object] = {}
        if i % 3 == 0:
            kw["spread"] = (SpreadConstraint(ZONE, max_skew=3, selector=mine),)
        elif i % 3 == 1:
            kw["preferred_pod_anti_affinity"] = (PreferredPodTerm(100, PodAffinityTerm(HOST, mine)),)
        out.append(dataclasses.replace(p, labels={"app": name}, **kw))  # type: ignore[arg-type]
    return ClusterState(nodes), out


class LatencyRun(NamedTuple):
    """One measured run: per-decision seconds and CPU seconds, which decisions recorded metrics,
    the measured loop's CPU and wall seconds, the books after."""

    lat: np.ndarray
    cpu: np.ndarray
    recorded: np.ndarray
    cpu_s: float
    wall_s: float
    scheduled: int
    snap: ClusterState
    ctx: PolicyContext


def _measure(
    nodes: int,
    *,
    policy: str,
    decisions: int,
    load: float,
    seed: int,
    constraints: bool,
    metrics: SchedulerMetrics | None,
    on_progress: Callable[[int, int], None] | None,
    record_parity: int | None = None,
) -> LatencyRun:
    """``record_parity``: with ``metrics``, only decisions ``k`` with ``k % 2 == record_parity``
    record them (the others are the control, in the same run); ``None``: every one does."""
    if nodes <= 0 or decisions <= 0:
        raise InvalidInput("nodes and decisions must be positive")
    if not 0.0 <= load < 1.0:
        raise InvalidInput(f"load must be in [0, 1), got {load}")
    snap, pods, ctx, ranks = latency_setting(nodes, max(8 * nodes, decisions * 2), seed)
    if constraints:
        snap, pods = with_constraints(snap, pods)
    profile = make_profile(policy, ctx)
    rng = np.random.default_rng(seed + 1)
    placed: list[str] = []
    i = 0
    while snap.gpu_allocation_ratio() < load and i < len(pods):
        r = schedule_one(profile, pods[i], snap, tiebreak=ranks, diagnose_failures=False)
        if r.scheduled:
            placed.append(pods[i].key)
        i += 1
    lat, cpu = np.empty(decisions), np.empty(decisions)
    recorded = np.zeros(decisions, dtype=bool)
    if metrics is not None:
        recorded[:] = True if record_parity is None else np.arange(decisions) % 2 == record_parity
    ok = 0
    t_all, cpu_all = time.perf_counter(), time.process_time()
    for k in range(decisions):
        pod = pods[(i + k) % len(pods)]
        if pod.key in snap.allocations:
            snap.forget(pod.key)
            placed.remove(pod.key)
        c0, t0 = time.thread_time(), time.perf_counter()
        r = schedule_one(profile, pod, snap, tiebreak=ranks, diagnose_failures=False)
        if metrics is not None and recorded[k]:  # what k8s.scheduler records per decision
            dt = time.perf_counter() - t0
            if r.scheduled:
                metrics.observe_attempt("scheduled", dt)
                metrics.pod_scheduled(pod.key)
            else:
                metrics.observe_attempt("unschedulable", dt)
                metrics.pod_unschedulable(pod.key, *diagnosis_labels(r.diagnosis, r.status))
        lat[k], cpu[k] = time.perf_counter() - t0, time.thread_time() - c0
        if r.scheduled:
            ok += 1
            placed.append(pod.key)
            victim = placed.pop(int(rng.integers(len(placed))))
            snap.forget(victim)
        if on_progress:
            on_progress(k + 1, decisions)
    cpu_all, wall = time.process_time() - cpu_all, time.perf_counter() - t_all
    assert not snap.verify()
    return LatencyRun(lat, cpu, recorded, cpu_all, wall, ok, snap, ctx)


def bench_latency(
    nodes: int,
    *,
    policy: str = "default",
    decisions: int = 2000,
    load: float = 0.7,
    seed: int = 0,
    constraints: bool = False,
    metrics: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    run = _measure(
        nodes, policy=policy, decisions=decisions, load=load, seed=seed, constraints=constraints,
        metrics=SchedulerMetrics() if metrics else None, on_progress=on_progress,
    )  # fmt: skip
    ms = run.lat * 1e3
    return {
        "nodes": nodes,
        "gpus": int(run.snap.gpu_count.sum()),
        "policy": policy,
        "constraints": constraints,
        "metrics": metrics,
        "decisions": decisions,
        "scheduled": run.scheduled,
        "load": round(run.snap.gpu_allocation_ratio(), 3),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "max_ms": round(float(ms.max()), 3),
        "pods_per_s": round(decisions / float(run.lat.sum()), 1),
        "pods_per_s_wall": round(decisions / run.wall_s, 1),
        "cpu_us_per_decision": round(float(run.cpu.mean()) * 1e6, 1),
    }


def bench_metrics_overhead(
    nodes: int,
    *,
    policy: str = "default",
    decisions: int = 2000,
    rounds: int = 3,
    load: float = 0.7,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Decisions with and without the scheduler's per-decision metrics, alternating within each
    run (even decisions record in one round, odd ones in the next), so that the drift of a
    shared machine hits both alike. Per mode: latency percentiles and CPU time per decision
    (the thread's), then with / without. The scrape (``cluster_stats`` + the exposition, as the
    scheduler's ``/metrics`` does at most every 5 s) is timed once on the books of the last
    round, with its CPU share at a 15 s scrape interval."""
    if rounds <= 0:
        raise InvalidInput("rounds must be positive")
    lat: dict[bool, list[np.ndarray]] = {False: [], True: []}
    cpu: dict[bool, list[np.ndarray]] = {False: [], True: []}
    m = SchedulerMetrics()
    last: LatencyRun | None = None
    for k in range(rounds):
        last = _measure(
            nodes, policy=policy, decisions=decisions, load=load, seed=seed + k, constraints=False,
            metrics=m, on_progress=None, record_parity=k % 2,
        )  # fmt: skip
        for on in (False, True):
            lat[on].append(last.lat[last.recorded == on])
            cpu[on].append(last.cpu[last.recorded == on])
        if on_progress:
            on_progress(k + 1, rounds)
    assert last is not None
    t0, c0 = time.perf_counter(), time.process_time()
    m.set_cluster(cluster_stats(last.snap, last.ctx.workload))
    body = m.exposition()
    scrape_s, scrape_cpu = time.perf_counter() - t0, time.process_time() - c0
    row: dict[str, object] = {"nodes": nodes, "policy": policy, "decisions": decisions * rounds}
    ms = {o: np.concatenate(lat[o]) * 1e3 for o in (False, True)}
    us = {o: np.concatenate(cpu[o]) * 1e6 for o in (False, True)}
    for key, without, with_ in (
        ("p50_ms", float(np.percentile(ms[False], 50)), float(np.percentile(ms[True], 50))),
        ("p99_ms", float(np.percentile(ms[False], 99)), float(np.percentile(ms[True], 99))),
        ("cpu_us", float(us[False].mean()), float(us[True].mean())),
    ):
        row[f"{key}_off"], row[f"{key}_on"] = round(without, 4), round(with_, 4)
        row[f"{key}_ratio"] = round(with_ / without, 3) if without else None
    row["scrape_ms"] = round(scrape_s * 1e3, 1)
    row["scrape_cpu_pct_at_15s"] = round(scrape_cpu / 15.0 * 100, 3)
    row["exposition_kib"] = round(len(body) / 1024, 1)
    return row
