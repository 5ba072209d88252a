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

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import F64, CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code

_OK, _AFFINITY, _ANTI, _EXISTING = 0, 1, 2, 3
_REASONS = {
    _AFFINITY: ("node(s) didn't match pod affinity rules", Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
    _ANTI: ("node(s) didn't match pod anti-affinity rules", Code.UNSCHEDULABLE),
    _EXISTING: ("node(s) didn't satisfy existing pods anti-affinity rules", Code.UNSCHEDULABLE),
}


class InterPodAffinity:
    name = "InterPodAffinity"

    def _verdicts(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> np.ndarray:
        stamp = (id(snap), snap.version)
        cached = state.read(self.name)
        if isinstance(cached, tuple) and cached[0] == stamp:
            return cached[1]  # type: ignore[no-any-return]
        labels = [nd.labels for nd in snap.nodes]
        running = list(snap.allocations.values())
        verdict = np.full(len(snap), _OK, dtype=np.int8)

        def fail(kind: int, key: str, domains: set[str]) -> None:
            for i, lab in enumerate(labels):
                if verdict[i] == _OK and lab.get(key) in domains:
                    verdict[i] = kind

        # running pods' anti-affinity against this pod
        if snap.anti_affinity:
            blocked: defaultdict[str, set[str]] = defaultdict(set)
            for a in (snap.allocations[k] for k in snap.anti_affinity):
                for t in a.pod.pod_anti_affinity:
                    d = labels[a.node].get(t.topology_key)
                    if d is not None and t.covers(a.pod.namespace, pod.namespace, pod.labels):
                        blocked[t.topology_key].add(d)
            for key, domains in blocked.items():
                fail(_EXISTING, key, domains)
        # this pod's anti-affinity
        for t in pod.pod_anti_affinity:
            domains = {
                d
                for a in running
                if (d := labels[a.node].get(t.topology_key)) is not None
                and t.covers(pod.namespace, a.pod.namespace, a.pod.labels)
            }
            fail(_ANTI, t.topology_key, domains)
        # this pod's affinity
        terms = pod.pod_affinity
        if terms:
            matching = [
                a
                for a in running
                if all(t.covers(pod.namespace, a.pod.namespace, a.pod.labels) for t in terms)
            ]
            keys = [t.topology_key for t in terms]
            starts_group = not matching and all(
                t.covers(pod.namespace, pod.namespace, pod.labels) for t in terms
            )
            present = [{labels[a.node].get(k) for a in matching} - {None} for k in keys]
            for i, lab in enumerate(labels):
                if verdict[i] != _OK:
                    continue
                if any(k not in lab for k in keys) or (
                    not starts_group and not all(lab[k] in dom for k, dom in zip(keys, present, strict=True))
                ):
                    verdict[i] = _AFFINITY
        state.write(self.name, (stamp, verdict))
        return verdict

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if not (pod.pod_affinity or pod.pod_anti_affinity or snap.anti_affinity):
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        ok: BoolArr = self._verdicts(state, pod, snap) == _OK
        return ok if nodes is None else ok[nodes]

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """Preferred pod affinity and anti-affinity: each running pod a term selects adds (or, for
        anti-affinity, takes away) the term's weight on every node of its domain; rescaled so the
        best node rates 100 and the worst 0."""
        terms = [(p.weight, p.term) for p in pod.preferred_pod_affinity]
        terms += [(-p.weight, p.term) for p in pod.preferred_pod_anti_affinity]
        if not terms:
            return None
        by_domain: defaultdict[tuple[str, str], float] = defaultdict(float)
        for a in snap.allocations.values():
            lab = snap.nodes[a.node].labels
            for w, t in terms:
                d = lab.get(t.topology_key)
                if d is not None and t.covers(pod.namespace, a.pod.namespace, a.pod.labels):
                    by_domain[(t.topology_key, d)] += w
        keys = {t.topology_key for _, t in terms}
        raw = np.array(
            [
                sum(
                    by_domain.get((k, v), 0.0) for k in keys if (v := snap.nodes[n].labels.get(k)) is not None
                )
                for n in nodes.tolist()
            ],
            dtype=np.float64,
        )
        hi, lo = (float(raw.max()), float(raw.min())) if len(raw) else (0.0, 0.0)
        return (raw - lo) * (100.0 / (hi - lo)) if hi > lo else np.zeros(len(nodes))

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        kind = int(self._verdicts(state, pod, snap)[node])
        return _REASONS.get(kind, ("node(s) didn't match pod affinity rules", Code.UNSCHEDULABLE))
