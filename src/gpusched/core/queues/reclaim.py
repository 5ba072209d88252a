"""Reclaim: a queue takes back the quota it lent, by evicting pods of queues that borrow.

When a unit (a gang or a pod) of queue ``A`` is refused by quota, or does not fit the cluster,
while ``A`` would stay within its own quota, the pods of borrowing queues (those over their own
quota) are what stands in its way. ``plan_reclaim`` chooses victims among them:

- whole gangs only (a borrower's gang goes whole or stays);
- lowest priority first, then the largest units (fewest victims), then by key;
- never from a queue within its quota: a unit is taken only while its queue, with the victims
  chosen so far gone, still borrows;
- disruption budgets respected: units whose eviction breaks none are tried first; only when they
  are not enough are the others tried, and the plan counts the pods over budget;
- enough that the unit's quota check passes *and* its pods fit the cluster at once
  (``gang.place_gang`` on the snapshot with the victims gone), then trimmed: each victim, most
  important first, is spared if the unit still fits without evicting it.

Nothing is booked or evicted: the book and the snapshot end as they began. The front end evicts
the victims (``ReclaimPlan.victims``) and places the unit once they are gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import Profile
from gpusched.core.gang import Unit
from gpusched.core.model import PodSpec
from gpusched.core.preemption_gang import (
    Budgets,
    VictimUnit,
    group_victims,
    place_without,
    spare_order,
    victim_order,
    violations,
)
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.usage import Usage, charge_of

__all__ = ["Budgets", "ReclaimPlan", "plan_reclaim", "unit_charge", "violations"]


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    """``victims``: pod keys to evict (whole gangs), empty with ``reason`` when no plan helps;
    ``budget_violations``: pods evicted beyond their disruption budgets (0 when avoidable)."""

    victims: tuple[str, ...]
    budget_violations: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.victims)


def unit_charge(pods: Sequence[PodSpec]) -> Usage:
    """The quota charge of pods before they land (no model known)."""
    return Usage.total(charge_of(p) for p in pods)


def _borrower_units(book: QueueBook, snap: ClusterState, claimant: str) -> list[VictimUnit]:
    root = book.tree.root(claimant)
    borrowing = {
        q for q in book.tree.leaves() if q != claimant and book.tree.root(q) == root and book.over_nominal(q)
    }
    held = [
        snap.allocations[k] for k, (q, _u) in book.charged.items() if q in borrowing and k in snap.allocations
    ]
    return group_victims(held, lambda a: book.charged[a.pod.key][0])


def _fits(
    profile: Profile,
    unit: Unit,
    snap: ClusterState,
    book: QueueBook,
    chosen: Sequence[VictimUnit],
    charge: Usage,
    tiebreak: I64 | None,
) -> bool:
    released = []
    try:
        for v in chosen:
            for a in v.allocations:
                released.append((a.pod.key, *book.release(a.pod.key)))
        return book.check(unit.queue, charge).ok and _physical(profile, unit, snap, chosen, tiebreak)
    finally:
        for key, queue, usage in released:
            book.charge(key, queue, usage)


def plan_reclaim(
    profile: Profile,
    snap: ClusterState,
    book: QueueBook,
    unit: Unit,
    *,
    budgets: Budgets | None = None,
    tiebreak: I64 | None = None,
) -> ReclaimPlan:
    """Victims among borrowing queues' pods that let ``unit`` (of a leaf queue that would stay
    within its own quota) be admitted and placed; see the module's rules."""
    charge = unit_charge(unit.pods)
    if not book.within(unit.queue, charge):
        return ReclaimPlan((), reason=f"queue {unit.queue} would borrow itself: it reclaims nothing")
    cands = sorted(_borrower_units(book, snap, unit.queue), key=victim_order)
    if not cands:
        return ReclaimPlan((), reason="no borrowing queue holds pods to reclaim")
    safe = [v for v in cands if violations(budgets, (a.pod for a in v.allocations)) == 0]
    passes = [(safe, True), (cands, False)] if budgets is not None else [(cands, False)]
    for pool, strict in passes:
        chosen = _choose(profile, unit, snap, book, pool, charge, budgets, tiebreak, strict)
        if chosen is not None:
            pods = [a.pod for v in chosen for a in v.allocations]
            return ReclaimPlan(tuple(sorted(p.key for p in pods)), violations(budgets, pods))
    return ReclaimPlan((), reason="evicting every borrowed pod would not make room")


def _choose(
    profile: Profile,
    unit: Unit,
    snap: ClusterState,
    book: QueueBook,
    pool: Sequence[VictimUnit],
    charge: Usage,
    budgets: Budgets | None,
    tiebreak: I64 | None,
    strict: bool,
) -> list[VictimUnit] | None:
    chosen: list[VictimUnit] = []
    released: list[tuple[str, str, Usage]] = []
    found = False
    try:
        for v in pool:
            if not book.over_nominal(v.queue):
                continue  # its queue is back within its quota: it keeps the rest
            if strict and violations(budgets, (a.pod for w in [*chosen, v] for a in w.allocations)):
                continue  # together with those chosen it would break a budget
            chosen.append(v)
            for a in v.allocations:
                released.append((a.pod.key, *book.release(a.pod.key)))
            if book.check(unit.queue, charge).ok:
                found = _physical(profile, unit, snap, chosen, tiebreak)
                if found:
                    break
    finally:
        for key, queue, usage in released:
            book.charge(key, queue, usage)
    if not found:
        return None
    for v in sorted(chosen, key=spare_order):  # spare the most important
        rest = [w for w in chosen if w is not v]
        if _fits(profile, unit, snap, book, rest, charge, tiebreak):
            chosen = rest
    return chosen


def _physical(
    profile: Profile, unit: Unit, snap: ClusterState, chosen: Sequence[VictimUnit], tiebreak: I64 | None
) -> bool:
    return place_without(profile, unit, snap, chosen, tiebreak) is not None
