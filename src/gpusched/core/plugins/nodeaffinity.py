"""NodeAffinity: the pod's nodeSelector against node labels (Filter).

Labels never change within a snapshot, so each selector's mask is computed once and cached.
"""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code


class NodeAffinity:
    name = "NodeAffinity"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not pod.node_selector:
            return np.ones(len(snap) if nodes is None else len(nodes), dtype=bool)
        key = ("NodeAffinity", tuple(sorted(pod.node_selector.items())))
        cached = snap.score_cache.get(key)
        if cached is None:
            sel = pod.node_selector.items()
            cached = np.array([all(nd.labels.get(k) == v for k, v in sel) for nd in snap.nodes], dtype=bool)
            snap.score_cache[key] = cached
        assert isinstance(cached, np.ndarray)
        return cached if nodes is None else cached[nodes]

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        return "node(s) didn't match Pod's node affinity/selector", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
