"""Random: a uniformly random feasible node; a share takes a random fitting GPU."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.devices import fitting_gpus
from gpusched.core.framework import CycleState, NodeScores
from gpusched.core.model import PodSpec


class RandomScore:
    name = "RandomScore"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        scores = np.zeros(len(nodes), dtype=np.int64)
        k = int(self.rng.integers(len(nodes)))
        scores[k] = 100
        gpu = np.full(len(nodes), -1, dtype=np.int64)
        if pod.is_share:
            fit = np.flatnonzero(fitting_gpus(snap, pod, int(nodes[k])))
            gpu[k] = int(self.rng.choice(fit))
        return NodeScores(scores, gpu)
