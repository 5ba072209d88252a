"""NodeAffinity: the pod's nodeSelector and required node affinity against node labels (Filter),
and its preferred node affinity (Prefer).

Required node affinity is Kubernetes' ``requiredDuringSchedulingIgnoredDuringExecution``: the
node must match at least one selector term, and a term matches when all its requirements do.
Each constraint's mask is computed once per snapshot and cached; a node relabelled in place is
asked again alone (``SnapshotCaches.node_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import F64, CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code


def affinity_matches(pod: PodSpec, name: str, labels: Mapping[str, str]) -> bool:
    """Does a node with ``name`` and ``labels`` pass the pod's nodeSelector and required affinity?"""
    if any(labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    return not pod.node_affinity or any(t.matches(name, labels) for t in pod.node_affinity)


class NodeAffinity:
    name = "NodeAffinity"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not pod.node_selector and not pod.node_affinity:
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        key = ("NodeAffinity", tuple(sorted(pod.node_selector.items())), pod.node_affinity)
        nds = snap.nodes
        mask = snap.caches.node_mask(
            key, len(nds), lambda n: affinity_matches(pod, nds[n].name, nds[n].labels)
        )
        if mask is None:
            mask = snap.everywhere
        return mask if nodes is None else mask[nodes]

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """Preferred node affinity: the weights of the terms each node matches, 100 for the most."""
        if not pod.preferred_node_affinity:
            return None
        raw = np.array(
            [
                sum(
                    p.weight
                    for p in pod.preferred_node_affinity
                    if p.term.matches(snap.names[n], snap.nodes[n].labels)
                )
                for n in nodes.tolist()
            ],
            dtype=np.float64,
        )
        top = float(raw.max()) if len(raw) else 0.0
        return raw * (100.0 / top) if top > 0 else np.zeros(len(nodes))

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        return "node(s) didn't match Pod's node affinity/selector", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
