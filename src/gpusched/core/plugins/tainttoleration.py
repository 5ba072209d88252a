"""TaintToleration: NoSchedule/NoExecute taints the pod does not tolerate (Filter), and
PreferNoSchedule taints it does not tolerate (Prefer: fewer is better)."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import F64, CycleState
from gpusched.core.model import NodeSpec, PodSpec, Taint
from gpusched.core.status import Code

_BLOCKING = ("NoSchedule", "NoExecute")


def untolerated(pod: PodSpec, node: NodeSpec) -> Taint | None:
    for t in node.taints:
        if t.effect in _BLOCKING and not any(tol.tolerates(t) for tol in pod.tolerations):
            return t
    return None


class TaintToleration:
    name = "TaintToleration"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        key = ("TaintToleration", pod.tolerations)
        nds = snap.nodes
        mask = snap.caches.node_mask(key, len(nds), lambda n: untolerated(pod, nds[n]) is None)
        if mask is None:
            mask = snap.everywhere  # no taint in the way: the cycle skips it
        return mask if nodes is None else mask[nodes]

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """Fewer untolerated PreferNoSchedule taints is better (100 for none); None when no node
        among ``nodes`` has one the pod does not tolerate."""
        soft = snap.caches.soft_taints
        if soft is None:
            soft = any(t.effect == "PreferNoSchedule" for nd in snap.nodes for t in nd.taints)
            snap.caches.soft_taints = soft
        if not soft:
            return None
        raw = np.array(
            [
                sum(
                    1
                    for t in snap.nodes[n].taints
                    if t.effect == "PreferNoSchedule" and not any(tol.tolerates(t) for tol in pod.tolerations)
                )
                for n in nodes.tolist()
            ],
            dtype=np.float64,
        )
        top = float(raw.max()) if len(raw) else 0.0
        return (top - raw) * (100.0 / top) if top > 0 else None

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        t = untolerated(pod, snap.nodes[node])
        taint = f"{{{t.key}: {t.value}}}" if t else "{}"
        return f"node(s) had untolerated taint {taint}", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
