"""Protocol 1, "paper": the published FGD experiment (Weng et al., ATC '23).

Per seed: sort the pods by name and shuffle them; append pods sampled with replacement
from the name-sorted pool until the GPU demand reaches ``tune`` × the cluster's GPUs;
submit one at a time, no queue, no retry, no departures; a pod that fits nowhere is
dropped but still counts as arrived. After every pod, log allocated and arrived GPU milli;
bin by arrived % exactly as the authors' analysis script does. The stream, the nodes' tie-break
ranks and the seeded profile are ``core.protocol``'s (the doctor's simulated snapshot uses them too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpusched.core.fragmentation import TargetWorkload, node_fragmentation
from gpusched.core.framework import Profile
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.protocol import paper_setup
from gpusched.core.scheduler import schedule_one
from gpusched.sim.stranded import free_by_holder

MAX_PCT = 130


@dataclass
class PaperRun:
    policy: str
    seed: int
    total_gpu_milli: int
    arrived: np.ndarray  # cumulative arrived GPU milli after each pod
    used: np.ndarray  # allocated GPU milli after each pod
    frag: np.ndarray  # cluster fragmentation (milli) after each pod
    failed: int
    pods: int
    seconds: float = 0.0
    model_used: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # model -> (used, total) milli at end
    free_by_holder: dict[str, int] = field(default_factory=dict)  # free milli at end by GPU contents

    def curve(self, values: np.ndarray | None = None, max_pct: int = MAX_PCT) -> np.ndarray:
        """Column k = mean of round(value %, 2) over pod events whose arrived % rounds to k
        (falling back to k±1), as in the authors' analysis; NaN where there is none."""
        v = self.used if values is None else values
        scale = self.total_gpu_milli / 100
        arr = np.round(self.arrived / scale)  # numpy rounds half to even, like the authors' pandas
        val = np.round(v / scale, 2)
        out = np.full(max_pct + 1, np.nan)
        for k in range(max_pct + 1):
            sel = arr == k
            if not sel.any():
                sel = (arr >= k - 1) & (arr <= k + 1)
            if sel.any():
                out[k] = round(float(val[sel].mean()), 2)
        return out

    def alloc_at(self, pct: int) -> float:
        return float(self.curve()[pct])


def run_paper(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    policy: str,
    seed: int,
    *,
    tune: float = 1.3,
    workload: TargetWorkload | None = None,
    profile: Profile | None = None,
    on_pod: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> PaperRun:
    setup = paper_setup(nodes, pods, policy, seed, tune=tune, workload=workload, profile=profile)
    snap, tw, profile, seq, ranks = setup.snap, setup.workload, setup.profile, setup.sequence, setup.ranks
    t0 = clock() if clock else 0.0
    n = len(seq)
    arrived = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    frag = np.zeros(n, dtype=np.float64)
    node_frag = node_fragmentation(snap, tw)
    frag_total = float(node_frag.sum())
    acc_arrived = 0
    acc_used = 0
    failed = 0
    for i, pod in enumerate(seq):
        acc_arrived += pod.gpu_demand_milli
        r = schedule_one(profile, pod, snap, tiebreak=ranks, diagnose_failures=False)
        if r.scheduled:
            acc_used += pod.gpu_demand_milli
            nf = float(node_fragmentation(snap, tw, np.array([r.node]))[0])
            frag_total += nf - node_frag[r.node]
            node_frag[r.node] = nf
        else:
            failed += 1
        arrived[i], used[i], frag[i] = acc_arrived, acc_used, frag_total
        if on_pod is not None:
            on_pod(i + 1, n)
    model_used = {}
    for mi, m in enumerate(snap.models):
        sel = snap.model_id == mi
        cap = int(snap.gpu_cap[sel].sum())
        model_used[m] = (cap - int(snap.gpu_free[sel].sum()), cap)
    errs = snap.verify()
    if errs:
        raise AssertionError(f"accounting broken after run: {errs}")
    return PaperRun(
        policy=policy,
        seed=seed,
        total_gpu_milli=snap.total_gpu_milli,
        arrived=arrived,
        used=used,
        frag=frag,
        failed=failed,
        pods=n,
        seconds=(clock() - t0) if clock else 0.0,
        model_used=model_used,
        free_by_holder=free_by_holder(snap),
    )
