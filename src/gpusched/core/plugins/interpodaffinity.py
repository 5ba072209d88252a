"""InterPodAffinity: required pod affinity and anti-affinity (Filter) and preferred ones (Prefer),
as kube-scheduler applies them.

- The pod's anti-affinity: a node fails when a pod matching any term runs in the node's domain
  of that term's topology key.
- Running pods' anti-affinity: a node fails when a running pod with a term that selects this pod
  is in the node's domain of that term's key (the rule is symmetric).
- The pod's affinity: a node passes when it has every term's key and, for every term, a pod
  matching all terms runs in its domain; when no pod anywhere matches and the pod matches its own
  terms, it may start the group on any node with the keys.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import numpy.typing as npt

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import F64, CycleState, StateKey
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status

_OK, _AFFINITY, _ANTI, _EXISTING = 0, 1, 2, 3
_REASONS = {
    _AFFINITY: ("node(s) didn't match pod affinity rules", Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
    _ANTI: ("node(s) didn't match pod anti-affinity rules", Code.UNSCHEDULABLE),
    _EXISTING: ("node(s) didn't satisfy existing pods anti-affinity rules", Code.UNSCHEDULABLE),
}
I8 = npt.NDArray[np.int8]

VERDICTS: StateKey[I8] = StateKey("InterPodAffinity")
"""Per node: OK, AFFINITY, ANTI or EXISTING (the first rule it breaks), written by PreFilter."""


def _constrained(pod: PodSpec, snap: ClusterState) -> bool:
    return bool(pod.pod_affinity or pod.pod_anti_affinity or snap.anti_affinity)


class InterPodAffinity:
    name = "InterPodAffinity"

    def pre_filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> Status:
        """Every node's verdict, once per pod and cycle (a pass over the running pods)."""
        if _constrained(pod, snap):
            state.write(VERDICTS, self._verdicts(pod, snap))
        return Status.success()

    def _read(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> I8:
        """The verdicts PreFilter wrote (run here when the caller skipped PreFilter)."""
        return state.read_or_fill(VERDICTS, lambda: self.pre_filter(state, pod, snap))

    def _verdicts(self, pod: PodSpec, snap: ClusterState) -> I8:
        verdict = np.full(len(snap), _OK, dtype=np.int8)

        def fail(kind: int, key: str, domains: set[int]) -> None:
            if domains:
                codes, _ = snap.domains(key)
                hit = np.isin(codes, np.fromiter(domains, dtype=np.int64, count=len(domains)))
                verdict[hit & (verdict == _OK)] = kind

        # running pods' anti-affinity against this pod
        blocked: defaultdict[str, set[int]] = defaultdict(set)
        for a in (snap.allocations[k] for k in snap.anti_affinity):
            for t in a.pod.pod_anti_affinity:
                d = int(snap.domains(t.topology_key)[0][a.node])
                if d >= 0 and t.covers(a.pod.namespace, pod.namespace, pod.labels):
                    blocked[t.topology_key].add(d)
        for key, domains in blocked.items():
            fail(_EXISTING, key, domains)
        # this pod's anti-affinity
        for t in pod.pod_anti_affinity:
            codes, _ = snap.domains(t.topology_key)
            found = np.unique(codes[snap.selected_nodes(t.selector, t.namespaces_of(pod.namespace))])
            fail(_ANTI, t.topology_key, {int(d) for d in found} - {-1})
        # this pod's affinity
        terms = pod.pod_affinity
        if terms:
            first = terms[0]
            matching = [
                a
                for a in snap.selected(first.selector, first.namespaces_of(pod.namespace))
                if all(t.covers(pod.namespace, a.pod.namespace, a.pod.labels) for t in terms[1:])
            ]
            starts_group = not matching and all(
                t.covers(pod.namespace, pod.namespace, pod.labels) for t in terms
            )
            ok = np.ones(len(snap), dtype=bool)
            for t in terms:
                codes, _ = snap.domains(t.topology_key)
                ok &= codes >= 0  # every term's key must be on the node
                if not starts_group:
                    present = np.fromiter({int(codes[a.node]) for a in matching} - {-1}, dtype=np.int64)
                    ok &= np.isin(codes, present)
            verdict[~ok & (verdict == _OK)] = _AFFINITY
        return verdict

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not _constrained(pod, snap):
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        ok: BoolArr = self._read(state, pod, snap) == _OK
        return ok if nodes is None else ok[nodes]

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """Preferred pod affinity and anti-affinity: each running pod a term selects adds (or, for
        anti-affinity, takes away) the term's weight on every node of its domain; rescaled so the
        best node rates 100 and the worst 0."""
        terms = [(p.weight, p.term) for p in pod.preferred_pod_affinity]
        terms += [(-p.weight, p.term) for p in pod.preferred_pod_anti_affinity]
        if not terms:
            return None
        raw = np.zeros(len(nodes), dtype=np.float64)
        for w, t in terms:
            codes, values = snap.domains(t.topology_key)
            on = codes[snap.selected_nodes(t.selector, t.namespaces_of(pod.namespace))]
            per_domain = np.zeros(len(values) + 1, dtype=np.float64)  # the last slot: no label
            per_domain[: len(values)] = w * np.bincount(on[on >= 0], minlength=len(values))
            raw += per_domain[codes[nodes]]  # codes of -1 read the last slot, which stays 0
        hi, lo = (float(raw.max()), float(raw.min())) if len(raw) else (0.0, 0.0)
        return (raw - lo) * (100.0 / (hi - lo)) if hi > lo else np.zeros(len(nodes))

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        kind = int(self._read(state, pod, snap)[node])
        return _REASONS.get(kind, ("node(s) didn't match pod affinity rules", Code.UNSCHEDULABLE))
