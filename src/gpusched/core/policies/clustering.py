"""GpuClustering: nodes already hosting the same class of task (no-gpu, share-gpu, N-gpu)."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import CycleState, NodeScores
from gpusched.core.model import PodSpec
from gpusched.core.policies.dotprod import MAX_SPEC_GPU


def pod_class(pod: PodSpec) -> str:
    if pod.num_gpu == 0:
        return "no-gpu"
    return "share-gpu" if pod.is_share else f"{pod.num_gpu}-gpu"


class GpuClusteringScore:
    name = "GpuClusteringScore"

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        out = np.zeros(len(nodes), dtype=np.int64)
        if pod.num_gpu == 0:
            return NodeScores(out)
        mine = pod_class(pod)
        base = 25 * (MAX_SPEC_GPU - snap.gpu_free[nodes].sum(axis=1)) // MAX_SPEC_GPU
        for k, n in enumerate(nodes):
            classes = {pod_class(snap.allocations[p].pod) for p in snap.node_pods[n]} - {"no-gpu"}
            if not classes:
                bonus = 25
            elif classes == {mine}:
                bonus = 75
            elif mine in classes:
                bonus = 50
            else:
                bonus = 0
            out[k] = bonus + base[k]
        return NodeScores(out)
