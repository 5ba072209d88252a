"""One batch scheduling cycle: the one decider of every pending pod (single pods, gangs, queues).

``run_cycle`` tries pending units (``gang.group_units``; a pod outside any gang is a unit of one,
``single``) one at a time against a snapshot, each within the rooms ``hold`` keeps for others
(nominated preemptors', defragmentation's; ``Hold``), which may steer a single pod:

1. **Order**: units that stay within their queue's own quota first, then those that would borrow,
   the queue with the smallest weighted dominant share first (``queues.fairshare``); within that,
   the pending order the units came in (priority, creation, arrival).
2. **Quota**: the unit's charge (all its pods) must pass ``QueueBook.check``. A pod naming an
   unknown queue, or one with child queues, waits with the error as its reason; nothing is bound.
3. **Placement**: a gang through ``gang.place_gang``: at least its minimum at once, or nothing
   booked; a single pod through one ``schedule_one`` (its reason the per-node diagnosis, its
   PostFilter's answer with it).
   Once placed, each pod is charged to its queue with the GPU model it landed on; if a per-model
   quota then refuses, the unit is undone and waits.
4. **Reclaim**: a unit refused by quota, or that does not fit, while its queue would stay within
   its own quota, gets victims among borrowing queues' pods (``queues.reclaim``). With
   ``evict_now`` (the simulator) they are evicted from the snapshot and the book at once and the
   unit is tried again; otherwise the outcome names them for the front end to evict (the unit
   waits until they are gone).
5. **Preemption** (queues off, the profile has PostFilters): a single pod that does not fit gets
   the profile's PostFilter answer (victims and node; a WAITING single pod names the PostFilter's
   ``nominated_node``, -1 when no preemption helps); a gang gets ``preemption_gang``'s plan
   (the fewest lower-priority victims, whole gangs, budget-safe first, with which its minimum
   fits at once; ``UnitOutcome.nominated`` says where each member lands once they are gone).
   With ``evict_now`` the victims go at once and the gang is tried again. Otherwise a unit waits
   as a unit with the reason of the pod that did not fit.

At the end of a cycle no gang is partly booked by it, and every pod it booked is charged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import Profile
from gpusched.core.gang import Unit, place_gang, without_post_filters
from gpusched.core.model import PodSpec
from gpusched.core.plugins.dynamicresources import decided
from gpusched.core.preemption_gang import Budgets, plan_gang_preemption
from gpusched.core.queues.fairshare import surplus_order
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.reclaim import plan_reclaim, unit_charge
from gpusched.core.queues.spec import InvalidQueue
from gpusched.core.queues.usage import charge_of
from gpusched.core.scheduler import ScheduleResult, schedule_one, undo


class Outcome(enum.Enum):
    PLACED = "placed"  # booked in the snapshot (and charged): bind its pods
    WAITING = "waiting"  # nothing booked; ``reason`` says why
    RECLAIM = "reclaim"  # nothing booked; evict ``victims`` (borrowed quota), then try again
    PREEMPT = "preempt"  # nothing booked; evict ``victims`` (priority), nominated ``node``


@dataclass(frozen=True, slots=True)
class UnitOutcome:
    unit: Unit
    outcome: Outcome
    placed: tuple[ScheduleResult, ...] = ()
    """The pods booked (PLACED), in order."""
    reason: str = ""
    victims: tuple[str, ...] = ()
    """Pods to evict (RECLAIM, PREEMPT); with ``evict_now`` those already evicted (PLACED)."""
    nominated_node: int = -1
    """PREEMPT of a single pod: the node its victims leave; WAITING of a single pod: the node its
    PostFilter nominated (-1: no preemption helps it)."""
    nominated: tuple[tuple[PodSpec, int], ...] = ()
    """PREEMPT of a gang: where each member lands (pod, node index) once the victims are gone."""
    budget_violations: int = 0
    last: ScheduleResult | None = None
    """A single pod not placed: its cycle's result (diagnosis, PostFilter answer); else None."""


class Hold(Protocol):
    """The rooms a unit must leave alone while it is tried (the front end's nominated preemptors
    and defragmentation rooms): within the block they are booked in ``snap``; afterwards ``snap``
    is as it was. Yields the unit to try (``unit``, or a single pod steered by a plan)."""

    def hold(self, snap: ClusterState, unit: Unit) -> AbstractContextManager[Unit]: ...


def single(pod: PodSpec) -> Unit:
    """A pod outside any gang: a unit of one."""
    return Unit(pod.key, (pod,), 1)


def _order(units: Sequence[Unit], book: QueueBook | None) -> list[Unit]:
    if book is None:
        return list(units)

    def key(iu: tuple[int, Unit]) -> tuple[object, ...]:
        i, u = iu
        if u.queue not in book.tree or not book.tree.is_leaf(u.queue):
            return (0, 0, i)
        return (*surplus_order(book, u.queue, unit_charge(u.pods)), i)

    return [u for _, u in sorted(enumerate(units), key=key)]


def _charge_placed(book: QueueBook, snap: ClusterState, unit: Unit, placed: Sequence[ScheduleResult]) -> str:
    """Charge the placed pods with their nodes' models; on a refusal undo charges and bookings, and
    what their Reserve plugins took (a claim pod's DRA devices go back to the ledger)."""
    done: list[str] = []
    for r in placed:
        took = decided(r.reserved.state, r.node) if r.reserved is not None else None  # `All`: what it got
        charge = charge_of(r.pod, snap.nodes[r.node].gpu_model, took)
        v = book.check(unit.queue, charge)
        if not v.ok:
            for k in done:
                book.release(k)
            for q in placed:
                undo(snap, q)
            return v.reason
        book.charge(r.pod.key, unit.queue, charge)
        done.append(r.pod.key)
    return ""


def _evict(snap: ClusterState, book: QueueBook, victims: Sequence[str]) -> None:
    for k in victims:
        snap.forget(k)
        if k in book.charged:
            book.release(k)


def run_cycle(
    profile: Profile,
    snap: ClusterState,
    units: Sequence[Unit],
    *,
    book: QueueBook | None = None,
    budgets: Budgets | None = None,
    tiebreak: I64 | None = None,
    evict_now: bool = False,
    reclaim: bool = True,
    diagnose: bool = True,
    hold: Hold | None = None,
) -> list[UnitOutcome]:
    """Try every unit once, in the order of the module's rules; one outcome per unit, in the
    order tried. ``book`` None: no queues (a plain priority queue over gangs). A unit equal to
    one that waited earlier in the cycle (same queue, minimum, pod shapes and priority) waits
    with its reason without being tried again: the cycle only takes room until it evicts.
    ``hold``: the rooms each unit is tried clear of (none: the snapshot as it is)."""
    out: list[UnitOutcome] = []
    failed: dict[tuple[object, ...], UnitOutcome] = {}

    def one(unit: Unit) -> UnitOutcome:
        held = hold.hold(snap, unit) if hold is not None else contextlib.nullcontext(unit)
        with held as tried:
            o = _one(profile, snap, tried, book, budgets, tiebreak, evict_now, reclaim, diagnose)
        return o if tried is unit else dataclasses.replace(o, unit=unit)

    for unit in _order(units, book):
        sig = (unit.queue, unit.need, tuple(p.shape() for p in unit.pods), max(p.priority for p in unit.pods))
        if sig in failed:  # an equal unit found no room in this cycle, and room only shrank since
            same = failed[sig]
            out.append(
                UnitOutcome(unit, same.outcome, reason=same.reason)
                if same.outcome is Outcome.WAITING
                else one(unit)
            )
            continue
        o = one(unit)
        out.append(o)
        if o.victims and evict_now:
            failed.clear()  # evictions made room
        elif o.outcome is Outcome.WAITING:
            failed[sig] = o
    return out


def _one(
    profile: Profile,
    snap: ClusterState,
    unit: Unit,
    book: QueueBook | None,
    budgets: Budgets | None,
    tiebreak: I64 | None,
    evict_now: bool,
    reclaim: bool,
    diagnose: bool,
) -> UnitOutcome:
    refusal = ""
    if book is not None:
        try:
            book.tree.leaf(unit.queue, who=f"pod {unit.pods[0].key}")
        except InvalidQueue as e:
            return UnitOutcome(unit, Outcome.WAITING, reason=str(e))
        v = book.check(unit.queue, unit_charge(unit.pods))
        refusal = "" if v.ok else f"quota: {v.reason}"
    nominated = -1
    placed: tuple[ScheduleResult, ...] = ()
    last: ScheduleResult | None = None
    if not refusal:
        if unit.gang is None and len(unit.pods) == 1:  # a single pod: its PostFilter's answer with it
            r1 = _single(
                profile if book is None else without_post_filters(profile), unit, snap, tiebreak, diagnose
            )
            if r1.victims:
                return UnitOutcome(
                    unit,
                    Outcome.PREEMPT,
                    reason=_why(r1),
                    victims=r1.victims,
                    nominated_node=r1.nominated_node,
                    last=r1,
                )
            ok, nominated = r1.scheduled, r1.nominated_node
            placed, last = ((r1,), None) if ok else ((), r1)
            refusal = "" if ok else _why(r1)
        else:
            r = place_gang(profile, unit, snap, tiebreak=tiebreak, diagnose=diagnose)
            ok, placed, refusal = r.scheduled, r.placed, "" if r.scheduled else r.status.message()
        if ok:
            why = _charge_placed(book, snap, unit, placed) if book is not None else ""
            if not why:
                return UnitOutcome(unit, Outcome.PLACED, placed)
            refusal = f"quota: {why}"
    if book is not None and reclaim:
        plan = plan_reclaim(profile, snap, book, unit, budgets=budgets, tiebreak=tiebreak)
        if plan.ok:
            if not evict_now:
                return UnitOutcome(
                    unit,
                    Outcome.RECLAIM,
                    reason=refusal,
                    victims=plan.victims,
                    budget_violations=plan.budget_violations,
                )
            _evict(snap, book, plan.victims)
            again = _one(profile, snap, unit, book, budgets, tiebreak, False, False, False)
            if again.outcome is Outcome.PLACED:
                return UnitOutcome(
                    unit,
                    Outcome.PLACED,
                    again.placed,
                    victims=plan.victims,
                    budget_violations=plan.budget_violations,
                )
            return UnitOutcome(
                unit,
                Outcome.WAITING,
                reason=f"reclaimed but did not land: {again.reason}",
                victims=plan.victims,
                budget_violations=plan.budget_violations,
            )
    if book is None and unit.gang is not None and profile.post_filters:
        return _preempt_gang(profile, snap, unit, budgets, tiebreak, evict_now, refusal)
    return UnitOutcome(unit, Outcome.WAITING, reason=refusal, nominated_node=nominated, last=last)


def _why(r: ScheduleResult) -> str:
    return r.diagnosis.message() if r.diagnosis else r.status.message()


def _single(
    profile: Profile, unit: Unit, snap: ClusterState, tiebreak: I64 | None, diagnose: bool
) -> ScheduleResult:
    """One ``schedule_one`` for a unit of one pod, booked in ``snap`` when it fits."""
    r = schedule_one(profile, unit.pods[0], snap, tiebreak=tiebreak, diagnose_failures=diagnose, assume=False)
    if r.scheduled:
        snap.assume(r.pod, r.node, r.gpus)
    return r


def _preempt_gang(
    profile: Profile,
    snap: ClusterState,
    unit: Unit,
    budgets: Budgets | None,
    tiebreak: I64 | None,
    evict_now: bool,
    refusal: str,
) -> UnitOutcome:
    plan = plan_gang_preemption(profile, snap, unit, budgets=budgets, tiebreak=tiebreak)
    if not plan.ok:
        return UnitOutcome(unit, Outcome.WAITING, reason=f"{refusal}; {plan.reason}")
    if not evict_now:
        return UnitOutcome(
            unit, Outcome.PREEMPT, reason=refusal, victims=plan.victims, nominated=plan.placement,
            budget_violations=plan.budget_violations,
        )  # fmt: skip
    for k in plan.victims:
        snap.forget(k)
    r = place_gang(profile, unit, snap, tiebreak=tiebreak, diagnose=False)
    outcome = Outcome.PLACED if r.scheduled else Outcome.WAITING
    why = "" if r.scheduled else f"preempted but did not land: {r.status.message()}"
    return UnitOutcome(
        unit, outcome, r.placed, reason=why, victims=plan.victims, budget_violations=plan.budget_violations
    )
