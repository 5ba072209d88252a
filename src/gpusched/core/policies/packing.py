"""GpuPacking: partially used GPUs first, then used nodes, then idle nodes."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import CycleState, NodeScores
from gpusched.core.model import GPU_MILLI, PodSpec


class GpuPackingScore:
    name = "GpuPackingScore"

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        out = np.zeros(len(nodes), dtype=np.int64)
        if pod.num_gpu == 0:
            return NodeScores(out)
        gfree = snap.gpu_free[nodes]
        exists = snap.gpu_exists[nodes]
        full_free = ((gfree == GPU_MILLI) & exists).sum(axis=1)
        idle = full_free == snap.gpu_count[nodes]
        # the GPUs "best" selection would take: ascending free (stable), those that fit
        key = np.where((gfree >= pod.gpu_milli) & exists, gfree, 10 * GPU_MILLI)
        order = np.argsort(key, axis=1, kind="stable")[:, : pod.num_gpu]
        take = np.take_along_axis(gfree, order, axis=1)
        k_free = (take == GPU_MILLI).sum(axis=1)
        s = (take * 100 // GPU_MILLI).sum(axis=1)
        partial = np.maximum(100 - s // 10, 50)
        used_node = np.maximum(50 - k_free, 33)
        out = np.where(k_free > 0, used_node, partial)
        out = np.where(idle, np.maximum(33 - full_free, full_free), out)
        return NodeScores(out.astype(np.int64))
