"""``gpusched bench gangs``: decision latency of a whole gang in the core.

A synthetic cluster (``bench.latency.latency_setting``) is filled to ``load`` of its GPU milli
with the workload's pods (each booked on a random node with room, not timed). Then, ``decisions``
times, one gang of ``size`` pods goes through ``gang.place_gang`` (all-or-nothing through
``Statement``), timed, and is taken out again so that every decision sees the same cluster. Side
by side in the same run:

- ``gang``: the gang placed (``size`` pods of ``gpus`` whole GPUs each);
- ``pods``: the same pods placed one by one with ``schedule_one`` (no gang), the baseline;
- ``refused``: a gang of 8-GPU pods one larger than the free 8-GPU nodes: members are placed
  until the last fails, then all are undone (the worst case of a gang that waits: the free GPUs
  add up but the nodes do not, so the cheap count refuses nothing).

Each is timed on the wall clock and in CPU time of the process (``cpu_p50_ms``): on a shared
machine the wall clock also counts the time other processes held the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from gpusched.bench.latency import latency_setting
from gpusched.core.cluster import ClusterState
from gpusched.core.devices import pick_gpus
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


def _pct(ms: np.ndarray, cpu_ms: np.ndarray) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "cpu_p50_ms": round(float(np.percentile(cpu_ms, 50)), 2),
        "cpu_p99_ms": round(float(np.percentile(cpu_ms, 99)), 2),
    }


class _Clock:
    """Wall and CPU time of the blocks it times, in seconds."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> None:
        self._w, self._c = time.perf_counter(), time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.wall.append(time.perf_counter() - self._w)
        self.cpu.append(time.process_time() - self._c)

    def pct(self) -> dict[str, float]:
        return _pct(np.array(self.wall) * 1e3, np.array(self.cpu) * 1e3)


def _fill(snap: ClusterState, pods: list[PodSpec], target: float, ranks: np.ndarray) -> None:
    """Book pods until ``target`` GPU milli is allocated, each on a random node with room (a quick
    first fit in ``ranks`` order: the fill is the setting, not what is measured)."""
    order = np.argsort(ranks)
    for p in pods:
        if snap.allocated_gpu_milli() >= target:
            break
        room = (snap.cpu_free >= p.cpu_milli) & (snap.mem_free >= p.memory_mib)
        if p.num_gpu:
            room &= snap.gpu_room(p, slice(None)).sum(axis=1) >= p.num_gpu
        if p.gpu_models:
            room &= np.isin(snap.model_id, [snap.model_index.get(m, -2) for m in p.gpu_models])
        fit = order[room[order]]
        if len(fit):
            node = int(fit[0])
            snap.assume(p, node, pick_gpus(snap, p, node))


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
    _fill(snap, pods, load * snap.total_gpu_milli, ranks)
    free_whole = int((snap.gpu_free == GPU_MILLI).sum())
    if size * gpus > free_whole:
        raise InvalidInput(f"a gang of {size}x{gpus} GPUs does not fit the {free_whole} free whole GPUs left")
    gang = _gang("g", size, gpus)
    t_gang, t_pods, t_refused = _Clock(), _Clock(), _Clock()
    tried = 0
    eight = (snap.gpu_count == 8) & ((snap.gpu_free == GPU_MILLI).sum(axis=1) == 8)
    too_big = _gang("big", int(eight.sum()) + 1, 8)
    for k in range(decisions):
        with t_gang:
            r = place_gang(profile, gang, snap, tiebreak=ranks)
        assert r.scheduled
        for p in gang.pods:
            snap.forget(p.key)
        with t_pods:
            for p in gang.pods:
                schedule_one(profile, p, snap, tiebreak=ranks)
        for p in gang.pods:
            snap.forget(p.key)
        if k < 2:  # a refusal tries a pod per free 8-GPU node: two of them
            with t_refused:
                refused = place_gang(profile, too_big, snap, tiebreak=ranks, diagnose=False)
            assert not refused.scheduled
            tried = len(refused.results)
        if on_progress:
            on_progress(k + 1, decisions)
    assert not snap.verify()
    return {
        "nodes": nodes,
        "gpus": int(snap.gpu_count.sum()),
        "alloc_pct": round(100 * snap.gpu_allocation_ratio(), 1),
        "gang": f"{size}x{gpus}",
        "decisions": decisions,
        "gang_ms": t_gang.pct(),
        "pods_one_by_one_ms": t_pods.pct(),
        "gang_over_pods_cpu": round(float(np.median(t_gang.cpu) / np.median(t_pods.cpu)), 2),
        "refused_ms": {**t_refused.pct(), "gang": f"{len(too_big.pods)}x8", "pods_tried": tried},
    }
