"""``gpusched bench gangs``: decision latency of a whole gang in the core.

A synthetic cluster (``bench.latency.latency_setting``) is filled to ``load`` of its GPU milli
with the workload's pods (tried once each, in order). Then, ``decisions`` times, one gang of
``size`` pods goes through ``gang.place_gang`` (all-or-nothing through ``Statement``), timed, and
is taken out again so that every decision sees the same cluster. Side by side in the same run:

- ``gang``: the gang placed (``size`` pods of ``gpus`` whole GPUs each);
- ``pods``: the same pods placed one by one with ``schedule_one`` (no gang), the baseline;
- ``refused``: a gang of 8-GPU pods one larger than the free 8-GPU nodes: members are placed
  until the last fails, then all are undone (the worst case of a gang that waits: the free GPUs
  add up but the nodes do not, so the cheap count refuses nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from gpusched.bench.latency import latency_setting
from gpusched.core.errors import InvalidInput
from gpusched.core.gang import GangSpec, Unit, place_gang
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one


def _gang(name: str, size: int, gpus: int) -> Unit:
    pods = tuple(
        PodSpec(f"{name}-{k}", cpu_milli=2000, memory_mib=8192, num_gpu=gpus, gpu_milli=GPU_MILLI, gang=name)
        for k in range(size)
    )
    return Unit(f"default/{name}", pods, size, GangSpec(name, min_member=size))


def _pct(ms: np.ndarray) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def bench_gangs(
    nodes: int,
    *,
    size: int = 64,
    gpus: int = 1,
    policy: str = "default",
    decisions: int = 30,
    load: float = 0.5,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    if nodes <= 0 or size <= 0 or gpus <= 0 or decisions <= 0 or not 0 <= load < 1:
        raise InvalidInput("nodes, size, gpus and decisions must be positive and load in [0, 1)")
    snap, pods, ctx, ranks = latency_setting(nodes, 6 * nodes, seed)
    profile = make_profile(policy, ctx)
    target = load * snap.total_gpu_milli
    for p in pods:
        if snap.allocated_gpu_milli() >= target:
            break
        schedule_one(profile, p, snap, tiebreak=ranks, diagnose_failures=False)
    free_whole = int((snap.gpu_free == GPU_MILLI).sum())
    if size * gpus > free_whole:
        raise InvalidInput(f"a gang of {size}x{gpus} GPUs does not fit the {free_whole} free whole GPUs left")
    gang = _gang("g", size, gpus)
    lat_gang: list[float] = []
    lat_pods: list[float] = []
    lat_refused: list[float] = []
    tried = 0
    eight = (snap.gpu_count == 8) & ((snap.gpu_free == GPU_MILLI).sum(axis=1) == 8)
    too_big = _gang("big", int(eight.sum()) + 1, 8)
    for k in range(decisions):
        t0 = time.perf_counter()
        r = place_gang(profile, gang, snap, tiebreak=ranks)
        lat_gang.append(time.perf_counter() - t0)
        assert r.scheduled
        for p in gang.pods:
            snap.forget(p.key)
        t0 = time.perf_counter()
        for p in gang.pods:
            schedule_one(profile, p, snap, tiebreak=ranks)
        lat_pods.append(time.perf_counter() - t0)
        for p in gang.pods:
            snap.forget(p.key)
        if k < 2:  # a refusal tries a pod per free 8-GPU node: two of them
            t0 = time.perf_counter()
            refused = place_gang(profile, too_big, snap, tiebreak=ranks, diagnose=False)
            lat_refused.append(time.perf_counter() - t0)
            assert not refused.scheduled
            tried = len(refused.results)
        if on_progress:
            on_progress(k + 1, decisions)
    assert not snap.verify()
    g, one, ref = (np.array(x) * 1e3 for x in (lat_gang, lat_pods, lat_refused))
    return {
        "nodes": nodes,
        "gpus": int(snap.gpu_count.sum()),
        "alloc_pct": round(100 * snap.gpu_allocation_ratio(), 1),
        "gang": f"{size}x{gpus}",
        "decisions": decisions,
        "gang_ms": _pct(g),
        "pods_one_by_one_ms": _pct(one),
        "gang_over_pods": round(float(np.median(g) / np.median(one)), 2),
        "refused_ms": {**_pct(ref), "gang": f"{len(too_big.pods)}x8", "pods_tried": tried},
    }
