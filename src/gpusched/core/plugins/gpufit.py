"""GPUFit: GPU count, share, GPU memory and GPU model constraints (Filter).

Whole GPUs take only GPUs with nothing on them and at least the pod's ``gpu_memory_mib``;
shares take a GPU with their milli and memory free (``ClusterState.gpu_room``)."""

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
        mask: BoolArr = np.count_nonzero(snap.gpu_room(pod, sel), axis=1) >= pod.num_gpu
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
        if pod.is_whole:  # too few GPUs with nothing on them (no share by milli or by memory)
            return "Insufficient GPU", Code.UNSCHEDULABLE
        if np.count_nonzero(snap.gpu_free[node] >= pod.gpu_milli) < pod.num_gpu:
            return "Insufficient GPU share", Code.UNSCHEDULABLE
        return "Insufficient GPU memory", Code.UNSCHEDULABLE
