"""PodTopologySpread: hard topology spread constraints (Filter) and ScheduleAnyway ones (Prefer),
as kube-scheduler applies them.

For each ``DoNotSchedule`` constraint, the domains are the values of its topology key on the
nodes the pod's node selector and required node affinity admit (nodeAffinityPolicy Honor, the
default) and, with nodeTaintsPolicy Honor, whose taints the pod tolerates (default Ignore).
Pods in the pod's namespace that match the selector are counted per domain; a node passes when
its domain's count, plus one if the pod matches its own selector, minus the smallest count over
the domains is at most ``max_skew``.
A node without the topology key fails, and no eviction would change that.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import F64, CycleState
from gpusched.core.model import PodSpec
from gpusched.core.plugins.nodeaffinity import NodeAffinity
from gpusched.core.plugins.tainttoleration import TaintToleration
from gpusched.core.selectors import SpreadConstraint, selects
from gpusched.core.status import Code

_OK, _SKEW, _MISSING = 0, 1, 2
REASON = "node(s) didn't match pod topology spread constraints"


class PodTopologySpread:
    name = "PodTopologySpread"

    def _admitted(self, state: CycleState, pod: PodSpec, snap: ClusterState, c: SpreadConstraint) -> BoolArr:
        """The nodes whose domains count for ``c`` (its node affinity and taint policies)."""
        admitted = np.ones(len(snap), dtype=bool)
        if c.node_affinity_policy == "Honor":
            admitted &= NodeAffinity().filter(state, pod, snap)
        if c.node_taints_policy == "Honor":
            admitted &= TaintToleration().filter(state, pod, snap)
        return admitted

    def _counts(
        self,
        pod: PodSpec,
        snap: ClusterState,
        c: SpreadConstraint,
        domain: list[str | None],
        counted: list[bool],
    ) -> Counter[str | None]:
        """Pods in the pod's namespace that ``c`` selects, per domain of the counted nodes."""
        counts: Counter[str | None] = Counter()
        for a in snap.allocations.values():
            if counted[a.node] and a.pod.namespace == pod.namespace and selects(c.selector, a.pod.labels):
                counts[domain[a.node]] += 1
        return counts

    def _verdicts(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> np.ndarray:
        """Per node: OK, SKEW (too many matching pods in its domain) or MISSING (no topology key),
        cached in the cycle state for this snapshot version."""
        stamp = (id(snap), snap.version)
        cached = state.read(self.name)
        if isinstance(cached, tuple) and cached[0] == stamp:
            return cached[1]  # type: ignore[no-any-return]
        verdict = np.full(len(snap), _OK, dtype=np.int8)
        for c in pod.spread:
            if not c.hard:
                continue
            admitted = self._admitted(state, pod, snap, c)
            domain = [nd.labels.get(c.topology_key) for nd in snap.nodes]
            counted = [d is not None and bool(admitted[i]) for i, d in enumerate(domain)]
            counts = self._counts(pod, snap, c, domain, counted)
            domains = {d for d, ok in zip(domain, counted, strict=True) if ok}
            low = min((counts[d] for d in domains), default=0)
            if c.min_domains and len(domains) < c.min_domains:
                low = 0
            own = 1 if selects(c.selector, pod.labels) else 0
            for i, d in enumerate(domain):
                if d is None:
                    verdict[i] = _MISSING
                elif counts[d] + own - low > c.max_skew and verdict[i] == _OK:
                    verdict[i] = _SKEW
        state.write(self.name, (stamp, verdict))
        return verdict

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not any(c.hard for c in pod.spread):
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        ok: BoolArr = self._verdicts(state, pod, snap) == _OK
        return ok if nodes is None else ok[nodes]

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """ScheduleAnyway constraints: the fewer selected pods in a node's domains, the better
        (100 for the emptiest); a node without a topology key rates 0."""
        soft = [c for c in pod.spread if not c.hard]
        if not soft:
            return None
        raw = np.zeros(len(nodes), dtype=np.float64)
        missing = np.zeros(len(nodes), dtype=bool)
        for c in soft:
            admitted = self._admitted(state, pod, snap, c)
            domain = [nd.labels.get(c.topology_key) for nd in snap.nodes]
            counted = [d is not None and bool(admitted[i]) for i, d in enumerate(domain)]
            counts = self._counts(pod, snap, c, domain, counted)
            for k, n in enumerate(nodes.tolist()):
                if domain[n] is None:
                    missing[k] = True
                else:
                    raw[k] += counts[domain[n]]
        out = np.zeros(len(nodes), dtype=np.float64)
        ok = ~missing
        if ok.any():
            hi, lo = float(raw[ok].max()), float(raw[ok].min())
            out[ok] = (hi - raw[ok]) * 100.0 / (hi - lo) if hi > lo else 100.0
        return out

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        if self._verdicts(state, pod, snap)[node] == _MISSING:
            return f"{REASON} (missing required label)", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        return REASON, Code.UNSCHEDULABLE
