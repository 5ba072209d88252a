"""DotProd: the smallest dot product of free and requested (CPU, GPU), normalised by the
largest node spec (128 cores, 8 GPUs); prefers the node with the least free resources along
the pod's request."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import CycleState, NodeScores
from gpusched.core.model import PodSpec

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


class DotProductScore:
    name = "DotProductScore"

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        cpu_left = snap.cpu_free[nodes] / MAX_SPEC_CPU
        gpu_left = snap.gpu_free[nodes].sum(axis=1) / MAX_SPEC_GPU
        d = (cpu_left * (pod.cpu_milli / MAX_SPEC_CPU) + gpu_left * (pod.gpu_demand_milli / MAX_SPEC_GPU)) / 2
        return NodeScores(np.trunc(100 * (1 - d)).astype(np.int64))
