"""DefaultPreemption (PostFilter): make room for a pod by evicting lower-priority pods.

Runs when a pod fits nowhere, after kube-scheduler's DefaultPreemption (a pod whose
``preemptionPolicy`` is Never evicts no one):

1. **Candidates**: nodes that failed for a *resolvable* reason (Unschedulable, not
   UnschedulableAndUnresolvable) and hold pods of lower priority than the preemptor.
   At most ``max(min_candidates, candidate_pct % of the nodes)`` are examined, starting at an
   offset derived from the pod's name (deterministic, and different pods spread over nodes).
2. **Victims per node**: in a ``Statement``, evict every lower-priority pod on the node; if the
   pod still does not fit (``core.scheduler.fits``: PreFilter and every Filter, on the changed
   snapshot), the node is no candidate. Otherwise put the would-be victims back
   one by one, most important first (highest priority, then the smallest GPU demand), keeping
   each one that leaves room for the preemptor: what stays evicted is a minimal set in that
   order. The statement is discarded: the snapshot is untouched. The what-if's cycle state names
   the pods evicted so far (``LEAVING``): DRA devices held by claims whose every consumer is among
   them count as free (a claim shared with a pod that stays does not), and DynamicResources' Filter
   runs again on that.
   Gangs go whole (gang-aware): a lower-priority pod of a gang (``PodSpec.gang``) is evicted
   only with every other member of its gang, wherever they run, and only when all of them are of
   lower priority; otherwise it is no victim and another is chosen. Reprieves, too, put a
   whole gang back at once, larger gangs before smaller units of the same priority.
   With PodDisruptionBudgets (``budgets``, data the front end reads: ``core.disruption``), the
   would-be victims are split as kube-scheduler's ``SelectVictimsOnNode`` does — those whose
   eviction would break a budget (counted in that order) and the others — and the violating
   ones are reprieved first; a victim left from that group counts as one PDB violation.
3. **Node**: the fewest harm, compared in order (kube-scheduler's ``pickOneNodeForPreemption``):
   the fewest PDB violations, the highest victim priority, the sum of victim priorities, the
   number of victims, the GPU milli evicted, then node index. So a choice that breaks no
   budget wins whenever one exists.

The result names the node and the victims (``PostFilterResult``); the front end evicts them
and schedules the pod again once they are gone. The decision itself books nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

from gpusched.core.cluster import ClusterState
from gpusched.core.disruption import NO_BUDGETS, DisruptionBudgets
from gpusched.core.framework import CycleState, FilterPlugin, PostFilterResult, PreFilterPlugin, Profile
from gpusched.core.gang import gang_key
from gpusched.core.model import Allocation, PodSpec
from gpusched.core.scheduler import fits
from gpusched.core.statement import Statement
from gpusched.core.status import Diagnosis, Status

_PRIORITY_OFFSET = 1 << 31  # sums of priorities stay monotone in the number of victims


class DefaultPreemption:
    name = "DefaultPreemption"

    def __init__(
        self,
        filters: Sequence[FilterPlugin],
        *,
        min_candidates: int = 100,
        candidate_pct: int = 10,
        budgets: Callable[[], DisruptionBudgets] | None = None,
    ) -> None:
        if min_candidates < 1 or not 0 < candidate_pct <= 100:
            raise ValueError("min_candidates must be >= 1 and candidate_pct in 1..100")
        self.filters = tuple(filters)
        self.budgets = budgets or (lambda: NO_BUDGETS)
        """The PodDisruptionBudgets now (the front end's reader; data, read once per PostFilter)."""
        self.min_candidates = min_candidates
        self.candidate_pct = candidate_pct
        self.what_if = Profile(
            f"{self.name}.what-if",
            pre_filters=tuple(f for f in self.filters if isinstance(f, PreFilterPlugin)),
            filters=self.filters,
        )
        """The filters the preemptor must pass once victims are gone, and their PreFilters."""

    # ---------------------------------------------------------------- helpers

    def _candidates(self, pod: PodSpec, snap: ClusterState, diagnosis: Diagnosis | None) -> list[int]:
        unresolvable = diagnosis.unresolvable_nodes() if diagnosis is not None else frozenset()
        n = len(snap)
        limit = min(n, max(self.min_candidates, n * self.candidate_pct // 100))
        start = zlib.crc32(pod.key.encode()) % n if n else 0
        out: list[int] = []
        for k in range(n):
            node = (start + k) % n
            if snap.names[node] in unresolvable:
                continue
            if any(snap.allocations[key].pod.priority < pod.priority for key in snap.node_pods[node]):
                out.append(node)
                if len(out) >= limit:
                    break
        return out

    def victims_on(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int
    ) -> list[Allocation] | None:
        """A minimal set of lower-priority pods on ``node`` (with the rest of their gangs,
        wherever they run) whose eviction lets ``pod`` fit, or None when evicting all of them is
        not enough. ``snap`` is left as it was."""
        found = self.select_victims(pod, snap, node, NO_BUDGETS)
        return None if found is None else found[0]

    def select_victims(
        self, pod: PodSpec, snap: ClusterState, node: int, budgets: DisruptionBudgets
    ) -> tuple[list[Allocation], int] | None:
        """``victims_on`` with disruption budgets (kube-scheduler's ``SelectVictimsOnNode``):
        (victims, how many of them break a budget). The units whose eviction would break a
        budget (counted most important first) are reprieved before the others."""
        units = _victim_units(pod, snap, node)
        if not units:
            return None
        leaving = {a.pod.key for u in units for a in u}  # what only they hold outside the books frees
        with Statement(snap) as st:
            for u in units:
                for a in u:
                    st.evict(a.pod.key)
            if not fits(self.what_if, pod, snap, node, leaving=leaving):
                return None
            order = sorted(units, key=_reprieve_order)
            violating: set[str] = set()
            if budgets:
                violating = {p.key for p in budgets.split([a.pod for u in order for a in u])[0]}
                order.sort(key=lambda u: not any(a.pod.key in violating for a in u))  # stable
            victims: list[Allocation] = []
            for u in order:
                for a in u:  # reprieve the unit, as it was (MIG slices too; rooms may overbook)
                    st.assume(a.pod, a.node, a.gpus, check=False, mig=a.mig)
                leaving.difference_update(a.pod.key for a in u)
                if not fits(self.what_if, pod, snap, node, leaving=leaving):
                    for a in u:
                        st.evict(a.pod.key)
                    leaving.update(a.pod.key for a in u)
                    victims.extend(u)
            # leaving the block discards the statement: the snapshot is as it was
        return victims, sum(1 for v in victims if v.pod.key in violating)

    # -------------------------------------------------------------- PostFilter
    def post_filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, diagnosis: Diagnosis | None
    ) -> PostFilterResult:
        if pod.preemption_policy == "Never":
            return PostFilterResult(
                Status.unschedulable("not eligible due to preemptionPolicy=Never.", self.name)
            )
        best: tuple[tuple[int, int, int, int, int, int], int, list[Allocation]] | None = None
        budgets = self.budgets()
        for node in self._candidates(pod, snap, diagnosis):
            found = self.select_victims(pod, snap, node, budgets)
            if found is None:
                continue
            victims, violations = found
            key = (
                violations,
                max(v.pod.priority for v in victims) if victims else -_PRIORITY_OFFSET,
                sum(v.pod.priority + _PRIORITY_OFFSET for v in victims),
                len(victims),
                sum(v.pod.gpu_demand_milli for v in victims),
                node,
            )
            if best is None or key < best[0]:
                best = (key, node, victims)
        if best is None:
            why = "preemption: no node where evicting lower-priority pods helps"
            return PostFilterResult(Status.unschedulable(why, self.name))
        _, node, victims = best
        return PostFilterResult(Status.success(), node, tuple(v.pod.key for v in victims))


def _victim_units(pod: PodSpec, snap: ClusterState, node: int) -> list[tuple[Allocation, ...]]:
    """The lower-priority pods on ``node`` as units of eviction: a pod alone, or a gang whole
    (every member booked anywhere), left out unless every member is of lower priority."""
    units: list[tuple[Allocation, ...]] = []
    gangs: dict[str, list[Allocation]] | None = None
    seen: set[str] = set()
    for k in sorted(snap.node_pods[node]):
        a = snap.allocations[k]
        if a.pod.priority >= pod.priority:
            continue
        g = gang_key(a.pod)
        if not g:
            units.append((a,))
            continue
        if g in seen:
            continue
        seen.add(g)
        if gangs is None:
            gangs = {}
            for b in snap.allocations.values():
                if b.pod.gang:
                    gangs.setdefault(gang_key(b.pod), []).append(b)
        members = sorted(gangs[g], key=lambda b: b.pod.key)
        if all(b.pod.priority < pod.priority for b in members):
            units.append(tuple(members))
    return units


def _reprieve_order(unit: tuple[Allocation, ...]) -> tuple[int, int, int, str]:
    """Most important first: highest priority, then the most pods (a gang kept whole spares
    several pods), then the smallest GPU demand, then key."""
    return (
        -max(a.pod.priority for a in unit),
        -len(unit),
        sum(a.pod.gpu_demand_milli for a in unit),
        unit[0].pod.key,
    )
