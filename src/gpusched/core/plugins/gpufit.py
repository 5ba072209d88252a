"""GPUFit: GPU count, share, GPU memory and GPU model constraints (Filter)."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code


def model_mask(snap: ClusterState, models: frozenset[str]) -> BoolArr:
    """Nodes whose GPU model is one of ``models`` (all nodes with GPUs when empty)."""
    if not models:
        return snap.gpu_count > 0
    ids = [snap.model_index[m] for m in models if m in snap.model_index]
    return np.isin(snap.model_id, ids)


class GPUFit:
    name = "GPUFit"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if pod.num_gpu == 0:
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        sel = slice(None) if nodes is None else nodes
        ok = snap.gpu_free[sel] >= pod.gpu_milli
        if pod.gpu_memory_mib:
            ok &= snap.gpu_mem_free[sel] >= pod.gpu_memory_mib
        mask: BoolArr = np.count_nonzero(ok, axis=1) >= pod.num_gpu
        if pod.gpu_models:
            mask &= model_mask(snap, pod.gpu_models)[sel]
        return mask

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        nd = snap.nodes[node]
        unres = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        if pod.gpu_models and nd.gpu_model not in pod.gpu_models:
            return "GPU model mismatch", unres
        if nd.gpu_count < pod.num_gpu:
            return "Insufficient GPU count", unres
        if pod.gpu_memory_mib and nd.gpu_memory_mib < pod.gpu_memory_mib:
            return "Insufficient GPU memory", unres
        g = snap.gpu_free[node]
        if np.count_nonzero(g >= pod.gpu_milli) < pod.num_gpu:
            return (
                "Insufficient GPU" if pod.gpu_milli >= 1000 else "Insufficient GPU share"
            ), Code.UNSCHEDULABLE
        return "Insufficient GPU memory", Code.UNSCHEDULABLE
