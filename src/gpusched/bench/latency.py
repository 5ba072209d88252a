"""``gpusched bench latency``: per-decision latency of ``schedule_one`` on synthetic clusters.

The cluster is first filled to ``load`` (fraction of GPU milli allocated); then each measured
decision schedules one pod and, to hold the load steady, releases a random earlier pod
(not timed). Reported: latency percentiles over the decisions and decisions per second.

With ``constraints`` the nodes carry zone and hostname labels and every pod a label ``app``
(20 apps); a third of the pods spread over the zones (DoNotSchedule, maxSkew 3) and a third
prefer not to share a node with their app (preferred anti-affinity), as Deployments do.
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


def bench_latency(
    nodes: int,
    *,
    policy: str = "default",
    decisions: int = 2000,
    load: float = 0.7,
    seed: int = 0,
    constraints: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
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
    lat = np.empty(decisions)
    ok = 0
    t_all = time.perf_counter()
    for k in range(decisions):
        pod = pods[(i + k) % len(pods)]
        if pod.key in snap.allocations:
            snap.forget(pod.key)
            placed.remove(pod.key)
        t0 = time.perf_counter()
        r = schedule_one(profile, pod, snap, tiebreak=ranks, diagnose_failures=False)
        lat[k] = time.perf_counter() - t0
        if r.scheduled:
            ok += 1
            placed.append(pod.key)
            victim = placed.pop(int(rng.integers(len(placed))))
            snap.forget(victim)
        if on_progress:
            on_progress(k + 1, decisions)
    wall = time.perf_counter() - t_all
    assert not snap.verify()
    ms = lat * 1e3
    return {
        "nodes": nodes,
        "gpus": int(snap.gpu_count.sum()),
        "policy": policy,
        "constraints": constraints,
        "decisions": decisions,
        "scheduled": ok,
        "load": round(snap.gpu_allocation_ratio(), 3),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "max_ms": round(float(ms.max()), 3),
        "pods_per_s": round(decisions / float(lat.sum()), 1),
        "pods_per_s_wall": round(decisions / wall, 1),
    }
