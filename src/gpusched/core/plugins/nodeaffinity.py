"""NodeAffinity: the pod's nodeSelector and required node affinity against node labels (Filter).

Required node affinity is Kubernetes' ``requiredDuringSchedulingIgnoredDuringExecution``: the
node must match at least one selector term, and a term matches when all its requirements do.
Labels never change within a snapshot, so each constraint's mask is computed once and cached.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import NODE_NAME_FIELD, NodeSelectorTerm, PodSpec, SelectorRequirement
from gpusched.core.status import Code


def requirement_matches(req: SelectorRequirement, labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics: NotIn and DoesNotExist hold where the label is absent; Gt and Lt
    need a label whose value is an integer."""
    value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    try:
        have = int(value) if value is not None else None
    except ValueError:
        return False
    if have is None:
        return False
    want = int(req.values[0])
    return have > want if op == "Gt" else have < want


def term_matches(term: NodeSelectorTerm, name: str, labels: Mapping[str, str]) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False
    fields = {NODE_NAME_FIELD: name}
    return all(requirement_matches(r, labels) for r in term.match_expressions) and all(
        requirement_matches(r, fields) for r in term.match_fields
    )


def affinity_matches(pod: PodSpec, name: str, labels: Mapping[str, str]) -> bool:
    """Does a node with ``name`` and ``labels`` pass the pod's nodeSelector and required affinity?"""
    if any(labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    return not pod.node_affinity or any(term_matches(t, name, labels) for t in pod.node_affinity)


class NodeAffinity:
    name = "NodeAffinity"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not pod.node_selector and not pod.node_affinity:
            return np.ones(len(snap) if nodes is None else len(nodes), dtype=bool)
        key = ("NodeAffinity", tuple(sorted(pod.node_selector.items())), pod.node_affinity)
        cached = snap.score_cache.get(key)
        if cached is None:
            cached = np.array([affinity_matches(pod, nd.name, nd.labels) for nd in snap.nodes], dtype=bool)
            snap.score_cache[key] = cached
        assert isinstance(cached, np.ndarray)
        return cached if nodes is None else cached[nodes]

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        return "node(s) didn't match Pod's node affinity/selector", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
