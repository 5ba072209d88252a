"""BestFit: the least leftover after placement, 0.5·CPU/128 cores + 0.5·GPU/8 GPUs."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import CycleState, NodeScores
from gpusched.core.model import PodSpec
from gpusched.core.policies.dotprod import MAX_SPEC_CPU, MAX_SPEC_GPU


class BestFitScore:
    name = "BestFitScore"

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        cpu_left = (snap.cpu_free[nodes] - pod.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (snap.gpu_free[nodes].sum(axis=1) - pod.gpu_demand_milli) / MAX_SPEC_GPU
        raw = 0.5 * cpu_left + 0.5 * gpu_left
        return NodeScores(np.trunc((1 - raw) * 100).astype(np.int64))
