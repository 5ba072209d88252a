"""Many paper-protocol runs (policies × seeds), in parallel processes, with a progress hook.

Workers are forked once with the nodes and pods (no pickling per run); each run returns a
compact ``RunSummary`` (the binned curves, not the per-pod arrays).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.policies.pairing import PairingPlan
from gpusched.core.protocol import build_sequence
from gpusched.sim.bound import arrival_bound, arrived_prefix, bound_at, online_best_fit
from gpusched.sim.paper import run_paper


@dataclass(frozen=True)
class RunSummary:
    policy: str
    seed: int
    alloc: list[float]  # allocation % by arrived % (0..130), NaN where no data
    frag_ratio: list[float]  # fragmentation / idle GPU, %, by arrived %
    failed: int
    pods: int
    seconds: float
    model_used: dict[str, tuple[int, int]] = field(default_factory=dict)
    free_by_holder: dict[str, int] = field(default_factory=dict)  # see sim.stranded
    total_gpu_milli: int = 0

    def at(self, pct: int) -> float:
        return self.alloc[pct]


@dataclass(frozen=True)
class SeedBound:
    seed: int
    lp_at_100: float
    lp_at_130: float
    bfd_at_100: float
    bfd_at_130: float
    online_at_100: float = float("nan")
    online_at_130: float = float("nan")
    planned_at_100: float = float("nan")
    planned_at_130: float = float("nan")
    arrival_at_100: float = float("nan")
    arrival_at_130: float = float("nan")


_CTX: dict[str, object] = {}


def _init(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], tune: float) -> None:
    _CTX.update(nodes=nodes, pods=pods, tune=tune, workload=TargetWorkload.from_pods(pods))


def _one(job: tuple[str, int]) -> RunSummary:
    policy, seed = job
    nodes, pods, tune, tw = _CTX["nodes"], _CTX["pods"], _CTX["tune"], _CTX["workload"]
    assert isinstance(tune, float) and isinstance(tw, TargetWorkload)
    r = run_paper(nodes, pods, policy, seed, tune=tune, workload=tw, clock=time.perf_counter)  # type: ignore[arg-type]
    idle = np.maximum(r.total_gpu_milli - r.used, 1)
    ratio = r.curve(r.frag / idle * r.total_gpu_milli)  # curve() reports value / total, in %
    return RunSummary(
        policy,
        seed,
        r.curve().tolist(),
        ratio.tolist(),
        r.failed,
        r.pods,
        r.seconds,
        r.model_used,
        r.free_by_holder,
        r.total_gpu_milli,
    )


def _bound(seed: int) -> SeedBound:
    nodes, pods, tune = _CTX["nodes"], _CTX["pods"], _CTX["tune"]
    assert isinstance(tune, float)
    gpus = sum(n.gpu_count for n in nodes)  # type: ignore[attr-defined]
    seq = build_sequence(pods, gpus * 1000, seed, tune)  # type: ignore[arg-type]
    b100, b130 = bound_at(seq, gpus, 100), bound_at(seq, gpus, 130)
    tw = _CTX["workload"]
    assert isinstance(tw, TargetWorkload)
    plan = PairingPlan.from_workload(tw)  # every type seen, as the default policy's plan
    s100, s130 = (seq[: arrived_prefix(seq, gpus, pct)] for pct in (100, 130))
    pct = 100 / (gpus * GPU_MILLI)
    return SeedBound(
        seed,
        lp_at_100=b100.lp_pct,
        lp_at_130=b130.lp_pct,
        bfd_at_100=b100.bfd_pct,
        bfd_at_130=b130.bfd_pct,
        online_at_100=online_best_fit(s100, gpus) * pct,
        online_at_130=online_best_fit(s130, gpus) * pct,
        planned_at_100=online_best_fit(s100, gpus, plan) * pct,
        planned_at_130=online_best_fit(s130, gpus, plan) * pct,
        arrival_at_100=arrival_bound(s100, gpus) * pct,
        arrival_at_130=arrival_bound(s130, gpus) * pct,
    )


def run_many(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tune: float = 1.3,
    jobs: int = 1,
    with_bounds: bool = False,
    on_done: Callable[[str], None] | None = None,
) -> tuple[list[RunSummary], list[SeedBound]]:
    """Run every (policy, seed); ``on_done`` is called with a label after each run."""
    work = [(p, s) for p in policies for s in seeds]
    runs: list[RunSummary] = []
    bounds: list[SeedBound] = []
    if jobs <= 1:
        _init(nodes, pods, float(tune))
        for w in work:
            runs.append(_one(w))
            if on_done:
                on_done(f"{w[0]} seed {w[1]}")
        for s in seeds if with_bounds else ():
            bounds.append(_bound(s))
            if on_done:
                on_done(f"bound seed {s}")
        return runs, bounds
    ctx = mp.get_context("fork")
    with ctx.Pool(jobs, initializer=_init, initargs=(nodes, pods, float(tune))) as pool:
        for r in pool.imap(_one, work):
            runs.append(r)
            if on_done:
                on_done(f"{r.policy} seed {r.seed}")
        for b in pool.imap(_bound, seeds if with_bounds else []):
            bounds.append(b)
            if on_done:
                on_done(f"bound seed {b.seed}")
    return runs, bounds


def mean_at(runs: Sequence[RunSummary], policy: str, pct: int) -> float:
    vals = [r.at(pct) for r in runs if r.policy == policy]
    return float(np.nanmean(vals)) if vals else float("nan")
