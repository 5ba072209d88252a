"""``gpusched bench preemption``: how long one scheduling cycle takes when the pod must preempt.

A synthetic cluster is filled with low-priority pods (each pod of the workload tried once, in
order, without preemption). Then pods of priority 1000 with a whole-GPU or share request that no
node can take as it is (1, 4 and 8 whole GPUs, a 470-milli share, in turn) go through
``schedule_one`` with ``DefaultPreemption``. Each is measured on the same full cluster: the
victims are named, not evicted, as a front end would before the API deletes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from gpusched.bench.latency import latency_setting
from gpusched.core.errors import InvalidInput
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one

SHAPES: tuple[tuple[int, int], ...] = ((1, GPU_MILLI), (4, GPU_MILLI), (8, GPU_MILLI), (1, 470))
"""(GPUs, milli per GPU) of the preemptors, in turn."""


def bench_preemption(
    nodes: int,
    *,
    policy: str = "default",
    preemptors: int = 20,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    if nodes <= 0 or preemptors <= 0:
        raise InvalidInput("nodes and preemptors must be positive")
    snap, pods, ctx, ranks = latency_setting(nodes, 6 * nodes, seed)
    fill, profile = make_profile(policy, ctx), make_profile(policy, ctx, preemption=True)
    for p in pods:
        schedule_one(fill, p, snap, tiebreak=ranks, diagnose_failures=False)
    lat = np.empty(preemptors)
    preempting = victims = placed = 0
    for k in range(preemptors):
        num, milli = SHAPES[k % len(SHAPES)]
        pod = PodSpec(
            f"preemptor-{k}", cpu_milli=4000, memory_mib=16_384, num_gpu=num, gpu_milli=milli, priority=1000
        )
        t0 = time.perf_counter()
        r = schedule_one(profile, pod, snap, tiebreak=ranks)
        lat[k] = time.perf_counter() - t0
        if r.scheduled:  # it fitted after all: take it out again so every preemptor sees the same cluster
            placed += 1
            snap.forget(pod.key)
        elif r.victims:
            preempting += 1
            victims += len(r.victims)
        if on_progress:
            on_progress(k + 1, preemptors)
    assert not snap.verify()
    ms = lat * 1e3
    return {
        "nodes": nodes,
        "gpus": int(snap.gpu_count.sum()),
        "policy": policy,
        "alloc_pct": round(100 * snap.gpu_allocation_ratio(), 2),
        "preemptors": preemptors,
        "preempting": preempting,
        "fitted_without": placed,
        "victims_per_preemption": round(victims / preempting, 2) if preempting else 0.0,
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p90_ms": round(float(np.percentile(ms, 90)), 2),
        "max_ms": round(float(ms.max()), 2),
    }
