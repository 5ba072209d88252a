"""``gpusched bench mig``: MIG placement policies side by side on both MIG workloads, arrival-only.

Per seed: draw requests (with replacement, from the workload's pool or mix) until the memory slices they ask
for reach ``tune`` x the cluster's slices; every policy sees the same sequence on a fresh, empty fleet; one
request at a time, no queue, no retry, no departures (as in the FGD paper's protocol): a request that fits
nowhere is dropped but counts as arrived. Pending time does not exist in this protocol, so no pending p99.

Baselines: the core's ``first-fit``, ``packing`` and ``best-fit`` (``gpusched.core.mig.placement``), and
``static-balanced``: every GPU pre-cut to mig-manager's ``all-balanced`` geometry (2 x 1g, 1 x 2g, 1 x 3g)
and a request served only by a free instance of exactly its profile, first GPU in name order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.placement import MigFleet, MigPolicy
from gpusched.sim.mig import (
    OPENB_MIG_MODELS,
    STATIC,
    MigCluster,
    MigWorkload,
    StaticBalanced,
    inference_workload,
    openb_mig_cluster,
    openb_workload,
)
from gpusched.sim.mig_churn import churn_rows, churn_run
from gpusched.sim.mig_reshape import RESHAPE
from gpusched.sim.traces import read_nodes, read_pods

POLICIES: tuple[str, ...] = (*(p.value for p in MigPolicy), STATIC, RESHAPE)  # RESHAPE: churn only


@dataclass(frozen=True)
class MigRun:
    workload: str
    policy: str
    seed: int
    requests: int
    accepted: int
    arrived_slices: int
    accepted_slices: int
    capacity_slices: int
    gpus: int
    gpus_used_half: int  # GPUs holding an instance when half the capacity had arrived
    gpus_used: int  # ... at the end
    seconds: float

    @property
    def accepted_pct(self) -> float:
        return 100 * self.accepted_slices / self.arrived_slices

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = asdict(self)
        d["accepted_slices_pct"] = round(self.accepted_pct, 2)
        d["accepted_requests_pct"] = round(100 * self.accepted / self.requests, 2)
        return d


def draw(workload: MigWorkload, size_of: dict[str, int], target: int, seed: int) -> list[str]:
    """Requests drawn with replacement until they ask for ``target`` memory slices."""
    rng = np.random.default_rng(seed)
    n = target // min(size_of[p] for p in workload.pool) + 1
    p = None if workload.weights is None else np.array(workload.weights) / sum(workload.weights)
    picks = rng.choice(len(workload.pool), size=n, p=p)
    sizes = np.array([size_of[workload.pool[i]] for i in picks]).cumsum()
    cut = int(np.searchsorted(sizes, target)) + 1
    return [workload.pool[i] for i in picks[:cut]]


def run_one(cluster: MigCluster, workload: MigWorkload, policy: str, seed: int, tune: float) -> MigRun:
    geom = cluster.gpus[0].geometry
    size_of = {p: geom.kind(p).mem_slices for p in set(workload.pool)}
    capacity = cluster.slices
    reqs = draw(workload, size_of, int(tune * capacity), seed)
    t0 = time.perf_counter()
    fleet: MigFleet | None = None if policy == STATIC else cluster.fleet()
    static = StaticBalanced(cluster) if policy == STATIC else None
    pol = None if policy == STATIC else MigPolicy(policy)
    demand = DemandMix()
    arrived = taken = accepted = 0
    half = -1
    for prof in reqs:
        arrived += size_of[prof]
        demand.add(prof)
        if static is not None:
            ok = static.take(prof) >= 0
        else:
            assert fleet is not None and pol is not None
            pl = fleet.choose(prof, pol, demand)
            ok = pl is not None
            if pl is not None:
                fleet.place(pl.gpu, prof, pl.start)
        if ok:
            accepted += 1
            taken += size_of[prof]
        if half < 0 and 2 * arrived >= capacity:
            half = static.gpus_used if static is not None else fleet.gpus_used  # type: ignore[union-attr]
    used = static.gpus_used if static is not None else fleet.gpus_used  # type: ignore[union-attr]
    return MigRun(
        workload.name, policy, seed, len(reqs), accepted, arrived, taken, capacity, len(cluster.gpus),
        max(half, 0), used, round(time.perf_counter() - t0, 3),
    )  # fmt: skip


def mig_bench(
    cluster: MigCluster,
    workloads: Sequence[MigWorkload],
    policies: Sequence[str],
    seeds: Sequence[int],
    tune: float = 1.0,
    on_done: Callable[[str], None] | None = None,
) -> list[MigRun]:
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise InvalidInput(f"unknown MIG policy {', '.join(bad)} (known: {', '.join(POLICIES)})")
    if tune <= 0:
        raise InvalidInput(f"--tune must be positive, got {tune}")
    runs = []
    for wl in workloads:
        for seed in seeds:
            for pol in policies:
                if (
                    pol == RESHAPE
                ):  # all GPUs start idle: arrival-only it would re-cut on demand, like first-fit
                    continue
                runs.append(run_one(cluster, wl, pol, seed, tune))
                if on_done is not None:
                    on_done(f"{wl.name} {pol} {seed}")
    return runs


def summarize(runs: Sequence[MigRun]) -> list[dict[str, object]]:
    """One row per (workload, policy): means over the seeds, and the per-seed accepted slices %."""
    rows: list[dict[str, object]] = []
    keys = list(dict.fromkeys((r.workload, r.policy) for r in runs))
    for wl, pol in keys:
        rs = [r for r in runs if (r.workload, r.policy) == (wl, pol)]
        rows.append(
            {
                "workload": wl,
                "policy": pol,
                "seeds": [r.seed for r in rs],
                "accepted_slices_pct": round(float(np.mean([r.accepted_pct for r in rs])), 2),
                "accepted_slices_pct_per_seed": [round(r.accepted_pct, 2) for r in rs],
                "accepted_requests_pct": round(
                    float(np.mean([100 * r.accepted / r.requests for r in rs])), 2
                ),
                "gpus_used_at_half_pct": round(
                    float(np.mean([100 * r.gpus_used_half / r.gpus for r in rs])), 2
                ),
                "gpus_used_pct": round(float(np.mean([100 * r.gpus_used / r.gpus for r in rs])), 2),
                "requests": int(np.mean([r.requests for r in rs])),
                "seconds": round(float(np.mean([r.seconds for r in rs])), 2),
            }
        )
    return rows


@dataclass(frozen=True)
class ChurnConfig:
    """The churn part of ``bench mig``: every ``stride``-th MIG node, ``arrivals`` requests per run."""

    load: float = 0.9
    arrivals: int = 6000
    stride: int = 16
    life_s: float = 3600.0


def mig_report(
    traces: Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    tune: float = 1.0,
    churn: ChurnConfig | None = None,
    on_done: Callable[[str], None] | None = None,
) -> tuple[dict[str, object], list[dict[str, object]], list[dict[str, object]]]:
    """Both workloads on openb's A100/H100-class nodes, read from ``traces``/csv: (report header,
    arrival-only rows, churn rows; the last empty without ``churn``)."""
    csv_dir = traces / "csv"
    nodes = [
        n for n in read_nodes(csv_dir / "openb_node_list_gpu_node.csv") if n.gpu_model in OPENB_MIG_MODELS
    ]
    cluster = openb_mig_cluster(nodes)
    pods = read_pods(csv_dir / "openb_pod_list_default.csv")
    workloads = [openb_workload(pods, cluster.gpus[0].geometry), inference_workload()]
    runs = mig_bench(cluster, workloads, policies, seeds, tune, on_done)
    churned = []
    if churn is not None:
        if churn.stride < 1:
            raise InvalidInput(f"--churn-stride must be at least 1, got {churn.stride}")
        small = openb_mig_cluster(nodes[:: churn.stride])
        for wl in workloads:
            for seed in seeds:
                for pol in policies:
                    churned.append(churn_run(small, wl, pol, seed, churn.load, churn.arrivals, churn.life_s))
                    if on_done is not None:
                        on_done(f"churn {wl.name} {pol} {seed}")
    notes = [
        f"cluster: {cluster.label}, {len(cluster.gpus)} GPUs, {cluster.slices} memory slices",
        *(f"{w.name}: {w.note}" for w in workloads),
        f"arrival-only to {tune:g} x capacity, seeds {', '.join(map(str, seeds))}; no queue: no pending p99",
    ]
    if churn is not None:
        notes.append(
            f"churn: every {churn.stride}th node ({small.label}), load {churn.load:g}, {churn.arrivals} "
            f"Poisson arrivals, exponential lifetimes (mean {churn.life_s:g} s), FIFO per profile, "
            "first 20 % not counted"
        )
    header: dict[str, object] = {
        "title": "MIG placement (bench mig)",
        "seeds": list(seeds),
        "tune": tune,
        "notes": notes,
        "runs": [r.as_dict() for r in runs],
        "churn_runs": [r.as_dict() for r in churned],
    }
    return header, summarize(runs), churn_rows(churned)
