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

import numpy as np
import numpy.typing as npt

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import F64, CycleState, StateKey
from gpusched.core.model import PodSpec
from gpusched.core.plugins.nodeaffinity import NodeAffinity
from gpusched.core.plugins.tainttoleration import TaintToleration
from gpusched.core.selectors import SpreadConstraint, selects
from gpusched.core.status import Code, Status

_OK, _SKEW, _MISSING = 0, 1, 2
REASON = "node(s) didn't match pod topology spread constraints"
I8 = npt.NDArray[np.int8]

VERDICTS: StateKey[I8] = StateKey("PodTopologySpread")
"""Per node: OK, SKEW or MISSING under the pod's hard constraints, written by PreFilter."""


class PodTopologySpread:
    name = "PodTopologySpread"

    def pre_filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> Status:
        """Every node's verdict under the hard constraints, once per pod and cycle."""
        if any(c.hard for c in pod.spread):
            state.write(VERDICTS, self._verdicts(state, pod, snap))
        return Status.success()

    def _read(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> I8:
        """The verdicts PreFilter wrote (run here when the caller skipped PreFilter)."""
        return state.read_or_fill(VERDICTS, lambda: self.pre_filter(state, pod, snap))

    def _admitted(self, state: CycleState, pod: PodSpec, snap: ClusterState, c: SpreadConstraint) -> BoolArr:
        """The nodes whose domains count for ``c`` (its node affinity and taint policies)."""
        admitted = np.ones(len(snap), dtype=bool)
        if c.node_affinity_policy == "Honor":
            admitted &= NodeAffinity().filter(state, pod, snap)
        if c.node_taints_policy == "Honor":
            admitted &= TaintToleration().filter(state, pod, snap)
        return admitted

    def _counts(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, c: SpreadConstraint
    ) -> tuple[I64, I64, BoolArr]:
        """Per node its domain (-1: no topology key); per domain the pods in the pod's namespace
        that ``c`` selects on counted nodes; and which domains have a counted node."""
        codes, values = snap.domains(c.topology_key)
        counted = self._admitted(state, pod, snap, c) & (codes >= 0)
        on = snap.selected_nodes(c.selector, (pod.namespace,))
        on = on[counted[on]]
        counts = np.bincount(codes[on], minlength=len(values)).astype(np.int64)
        present = np.zeros(len(values), dtype=bool)
        present[codes[counted]] = True
        return codes, counts, present

    def _verdicts(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> I8:
        """Per node: OK, SKEW (too many matching pods in its domain) or MISSING (no topology key)."""
        verdict = np.full(len(snap), _OK, dtype=np.int8)
        for c in pod.spread:
            if not c.hard:
                continue
            codes, counts, present = self._counts(state, pod, snap, c)
            low = int(counts[present].min()) if present.any() else 0
            if c.min_domains and int(present.sum()) < c.min_domains:
                low = 0
            own = 1 if selects(c.selector, pod.labels) else 0
            missing = codes < 0
            here = np.where(missing, 0, counts[np.maximum(codes, 0)]) if len(counts) else np.zeros(len(snap))
            verdict[missing] = _MISSING
            verdict[~missing & (here + own - low > c.max_skew) & (verdict == _OK)] = _SKEW
        return verdict

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not any(c.hard for c in pod.spread):
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        ok: BoolArr = self._read(state, pod, snap) == _OK
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
            codes, counts, _ = self._counts(state, pod, snap, c)
            mine = codes[nodes]
            missing |= mine < 0
            if len(counts):
                raw += np.where(mine < 0, 0, counts[np.maximum(mine, 0)])
        out = np.zeros(len(nodes), dtype=np.float64)
        ok = ~missing
        if ok.any():
            hi, lo = float(raw[ok].max()), float(raw[ok].min())
            out[ok] = (hi - raw[ok]) * 100.0 / (hi - lo) if hi > lo else 100.0
        return out

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        if self._read(state, pod, snap)[node] == _MISSING:
            return f"{REASON} (missing required label)", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        return REASON, Code.UNSCHEDULABLE
