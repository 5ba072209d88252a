"""FGD: Fragmentation Gradient Descent (Weng et al., ATC '23), as published.

Score = int(100 · sigmoid((F_before − F_after) / 1000)) for the node's best GPU; a share
tries every fitting GPU and keeps the first with the highest (truncated) score.
"""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.fragmentation import TargetWorkload, placement_frag, task_type
from gpusched.core.framework import F64, CycleState, NodeScores
from gpusched.core.model import PodSpec
from gpusched.core.policies.cache import PolicyKey, cached_scores


def sigmoid(x: F64) -> F64:
    out: F64 = 1.0 / (1.0 + np.exp(-x))
    return out


class FGDScore:
    name = "FGDScore"

    def __init__(self, workload: TargetWorkload) -> None:
        self.workload = workload
        self._key = PolicyKey((self.name, workload.keys, tuple(workload.p.tolist())))

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        key = (self._key, task_type(pod), pod.gpu_memory_mib)
        return cached_scores(snap, key, nodes, lambda idx: self._compute(pod, snap, idx))

    def _compute(self, pod: PodSpec, snap: ClusterState, nodes: I64) -> tuple[I64, I64]:
        before, after = placement_frag(snap, pod, nodes, self.workload)
        with np.errstate(over="ignore", invalid="ignore"):
            # Rounded to 1e-6 before truncating: the fragmentation sums differ in their last bits with the
            # batch of nodes they were computed in, and a score a hair under an integer must not truncate
            # one lower for one batch and not for another (the score cache and a fresh pass must agree).
            s = np.trunc(np.round(100 * sigmoid((before[:, None] - after) / 1000), 6))
        s = np.where(np.isfinite(after), s, -1)
        col = np.argmax(s, axis=1)  # first maximum = lowest GPU index
        best = s[np.arange(len(nodes)), col].astype(np.int64)
        gpu = np.where(pod.is_share & (best >= 0), col, -1).astype(np.int64)
        return best, gpu
