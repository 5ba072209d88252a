"""A HAMi-like placement (for ``sim.stacks``): HAMi's scheduler with its chart defaults,
``nodeSchedulerPolicy: binpack`` and ``gpuSchedulerPolicy: spread``.

HAMi books a share by GPU memory and cores (``gpumem-percentage``, ``gpucores``); the trace
gives a share as a fraction of one GPU, which is both, so the core's milli booking is HAMi's.
Its node score is the node's device usage, ``tasks/slots + cores used/cores + memory
used/memory`` over the node's GPUs (``deviceSplitCount`` 10 task slots per GPU); binpack
prefers the highest. On the chosen node a share takes the GPU that would be least used after it
(spread: the lowest device score, ``(tasks+1)/10 + (cores+c)/100 + (mem+m)/mem``); whole GPUs
take free GPUs. Not modelled: the 10-task cap per GPU (shares of the trace are rarely below 100
milli), NUMA grouping of devices."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import F64, CycleState, NodeScores
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.policies.cache import cached_rows

SPLIT_COUNT = 10
"""HAMi's default ``deviceSplitCount``: task slots per GPU."""


def gpu_tasks(snap: ClusterState, nodes: I64) -> I64:
    """Per node of ``nodes`` and GPU index, how many pods hold that GPU."""
    out = np.zeros((len(nodes), snap.max_gpus), dtype=np.int64)
    for row, n in enumerate(nodes.tolist()):
        for key in snap.node_pods[n]:
            for g in snap.allocations[key].gpus:
                out[row, g] += 1
    return out


class HamiScore:
    name = "HamiScore"

    def _rows(self, snap: ClusterState, idx: I64) -> tuple[I64]:
        return (gpu_tasks(snap, idx),)

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        (tasks,) = cached_rows(snap, ("HamiScore.tasks",), nodes, lambda idx: self._rows(snap, idx))
        cap = snap.gpu_cap[nodes].astype(np.float64)
        used = cap - snap.gpu_free[nodes]
        total = np.maximum(cap.sum(axis=1), 1.0)
        slots = np.maximum(snap.gpu_count[nodes] * SPLIT_COUNT, 1)
        # cores and memory are the same fraction of each GPU here (see the module doc): counted twice
        node_score: F64 = tasks.sum(axis=1) / slots + 2 * used.sum(axis=1) / total
        gpu = np.full(len(nodes), -1, dtype=np.int64)
        if pod.is_share:
            room = snap.gpu_room(pod, nodes)
            dev = (tasks + 1) / SPLIT_COUNT + 2 * (used + pod.gpu_milli) / GPU_MILLI
            dev = np.where(room, dev, np.inf)
            gpu = np.where(room.any(axis=1), np.argmin(dev, axis=1), -1).astype(np.int64)
        return NodeScores(node_score, gpu)
