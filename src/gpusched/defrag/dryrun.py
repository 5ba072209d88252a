"""``gpusched defrag plan``: what defragmentation would do on the cluster now, changing nothing.

The books are the standalone scheduler's (``doctor.books.Books``: bound pods where their
assignment annotation says, the policy's profile, nodes in name order as the scheduler ranks
ties), the rules the cluster's PodDisruptionBudgets (``disruptionsAllowed`` each, shared by every
plan of the run) and the opt-out annotation (``PodSpec.movable``).

What is planned:

- the pending GPU pods (a gang as one target), most important first (``core.pending`` order); a
  pod asking for MIG slices gets ``core.defrag.mig.room_for``'s plan (MIG pods moved to free
  instances of their profiles elsewhere, then a re-cut where one is needed: its ``reason``):
  each plan is carried out on the books (a ``Statement``, undone at the end) before the next
  target is planned, so that two plans never count on the same room or move a pod twice, and
  the pods that fit now take their room too;
- or one named pending pod (its whole gang when it has one);
- or a consolidation of at most K moves (``--consolidate K``).

The report gives every plan (moves, where the pending pods land, the method that answered and
whether it proved the fewest moves), the GPU demand that lands, the cluster's fragmentation
(FGD's, for the target workload of the pods seen) before and after all the plans, and each
budget with what it allows, what the plans use of it and the running pods it keeps in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpusched.core.defrag import (
    RECREATING_KINDS,
    DisruptionBudget,
    Plan,
    Rules,
    WorkBudget,
    apply_plan,
    consolidate,
    plan_for,
)
from gpusched.core.defrag.mig import room_for
from gpusched.core.fragmentation import node_fragmentation
from gpusched.core.model import PodSpec
from gpusched.core.pending import pending_order
from gpusched.core.statement import Statement
from gpusched.defrag.errors import UnknownTarget
from gpusched.doctor.books import Books


@dataclass(frozen=True)
class PlannedFor:
    """One plan and what it was made for (``pods``: the pending pod, or a gang's; empty for a
    consolidation)."""

    pods: tuple[str, ...]
    gpu_milli: int
    priority: int
    plan: Plan
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "for": list(self.pods),
            "gpu_milli": self.gpu_milli,
            "priority": self.priority,
            "seconds": round(self.seconds, 4),
            **self.plan.to_dict(),
        }


@dataclass(frozen=True)
class BudgetUse:
    """A PodDisruptionBudget in the run: what it allows, what the plans use of it, and how many
    running pods it selects while it allows nothing (they stay put)."""

    key: str
    allowed: int
    used: int
    holds: int

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.key, "allowed": self.allowed, "used": self.used, "holds": self.holds}


@dataclass(frozen=True)
class DryRun:
    source: str
    policy: str
    mode: str
    """``pending`` | ``pod`` | ``consolidate``."""
    plans: tuple[PlannedFor, ...]
    budgets: tuple[BudgetUse, ...]
    frag_before_milli: float
    frag_after_milli: float
    invalid: Mapping[str, str] = field(default_factory=dict)

    @property
    def moves(self) -> int:
        return sum(p.plan.move_count for p in self.plans)

    @property
    def landing(self) -> tuple[PlannedFor, ...]:
        """The plans whose pending pods land (moves or none)."""
        return tuple(p for p in self.plans if p.pods and p.plan.feasible)

    @property
    def gpu_milli_landing(self) -> int:
        return sum(p.gpu_milli for p in self.landing)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "policy": self.policy,
            "mode": self.mode,
            "moves": self.moves,
            "gain": {
                "pods_landing": sum(len(p.pods) for p in self.landing),
                "gpus_landing": self.gpu_milli_landing / 1000,
                "fragmentation_before_gpus": round(self.frag_before_milli / 1000, 3),
                "fragmentation_after_gpus": round(self.frag_after_milli / 1000, 3),
            },
            "plans": [p.to_dict() for p in self.plans],
            "budgets": [b.to_dict() for b in self.budgets],
            "invalid": dict(self.invalid),
        }


def pod_key_of(name: str) -> str:
    """``NAMESPACE/NAME``, or ``NAME`` in ``default``."""
    return name if "/" in name else f"default/{name}"


def _created(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def pending_targets(books: Books, only: str | None = None, *, mig: bool = False) -> list[list[PodSpec]]:
    """The pending GPU pods to plan for, most important first, a gang's members together; or
    ``only`` (a pod key) and its gang; with ``mig``, pods asking for MIG slices too. Raises
    UnknownTarget for a pod the cluster does not have or that is not pending."""
    if only is not None:
        key = pod_key_of(only)
        if key not in books.pod_objs:
            raise UnknownTarget(f"pod {key}: no such pod in {books.snapshot.source or 'the cluster'}")
        if key not in books.pending:
            node = (books.pod_objs[key].get("spec") or {}).get("nodeName")
            where = f"it is bound to node {node}" if node else "it is finished or being deleted"
            raise UnknownTarget(f"pod {key} is not pending: {where}")
    groups: dict[tuple[str, str], list[PodSpec]] = {}
    order: dict[tuple[str, str], tuple[int, str, int]] = {}
    for i, (key, pod) in enumerate(sorted(books.pending.items())):
        if pod.num_gpu == 0 and not (mig and pod.mig):
            continue
        gk = (pod.namespace, pod.gang) if pod.gang else ("", key)
        groups.setdefault(gk, []).append(pod)
        rank = pending_order(pod.priority, _created(books.pod_objs[key]), i)
        order[gk] = min(order.get(gk, rank), rank)
    if only is not None:
        key = pod_key_of(only)
        pod = books.pending[key]
        gk = (pod.namespace, pod.gang) if pod.gang else ("", key)
        if gk not in groups:
            raise UnknownTarget(f"pod {key} asks for no GPU: defragmentation makes room for GPU pods")
        return [groups[gk]]
    return [groups[gk] for gk in sorted(groups, key=lambda g: order[g])]


def _spend(rules: Rules, plan: Plan) -> Rules:
    """The rules for the next plan of the run: the budgets less what ``plan`` used, its moved
    pods at their cap."""
    used = dict(plan.budgets_used)
    budgets = tuple(
        replace(b, allowed=max(0, b.allowed - used.get(f"{b.namespace}/{b.name}", 0))) for b in rules.budgets
    )
    moved = dict(rules.moved)
    for m in plan.moves:
        moved[m.pod] = moved.get(m.pod, 0) + 1
    return replace(rules, budgets=budgets, moved=moved)


def _budget_uses(
    books: Books, budgets: Sequence[DisruptionBudget], plans: Sequence[PlannedFor]
) -> tuple[BudgetUse, ...]:
    used: dict[str, int] = {}
    for p in plans:
        for k, n in p.plan.budgets_used:
            used[k] = used.get(k, 0) + n
    out = []
    for b in budgets:
        key = f"{b.namespace}/{b.name}"
        holds = 0
        if b.allowed == 0:
            holds = sum(
                1 for a in books.state.allocations.values() if b.selects(a.pod.namespace, a.pod.labels)
            )
        out.append(BudgetUse(key, b.allowed, used.get(key, 0), holds))
    return tuple(out)


def dry_run(
    books: Books,
    budgets: Sequence[DisruptionBudget] = (),
    *,
    pod: str | None = None,
    consolidate_moves: int | None = None,
    max_moves: int = 8,
    timeout_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    invalid: Mapping[str, str] | None = None,
    recreating: frozenset[str] = RECREATING_KINDS,
) -> DryRun:
    """Plan on ``books`` (left as they were) as the module doc says. ``timeout_s`` bounds each
    plan's search (the planner answers with the best it found by then); only pods whose
    controller's kind is in ``recreating`` move (``Rules.recreating``)."""
    snap = books.state
    profile = books.profile
    tiebreak = np.arange(len(snap), dtype=np.int64)  # the standalone scheduler's: nodes in name order
    rules = Rules(budgets=tuple(budgets), max_moves=max_moves, recreating=recreating)
    workload = books.workload
    before = float(node_fragmentation(snap, workload).sum()) if len(snap) else 0.0
    plans: list[PlannedFor] = []
    with Statement(snap) as st:
        if consolidate_moves is not None:
            mode = "consolidate"
            t0 = clock()
            plan = consolidate(profile, snap, workload, consolidate_moves, rules, _work(clock, timeout_s))
            plans.append(PlannedFor((), 0, 0, plan, clock() - t0))
            if plan.feasible:
                apply_plan(st, profile, plan)
        else:
            mode = "pod" if pod is not None else "pending"
            for group in pending_targets(books, pod, mig=True):
                t0 = clock()
                if len(group) == 1 and group[0].mig:  # MIG slices move to free instances (core.defrag.mig)
                    plan = room_for(profile, snap, group[0], rules).plan
                else:
                    plan = plan_for(profile, snap, group, rules, _work(clock, timeout_s), tiebreak=tiebreak)
                pf = PlannedFor(
                    tuple(p.key for p in group),
                    sum(p.gpu_demand_milli for p in group),
                    max(p.priority for p in group),
                    plan,
                    clock() - t0,
                )
                plans.append(pf)
                if plan.feasible and apply_plan(st, profile, plan, {p.key: p for p in group}) is None:
                    rules = _spend(rules, plan)
        after = float(node_fragmentation(snap, workload).sum()) if len(snap) else 0.0
    return DryRun(
        books.snapshot.source,
        books.policy,
        mode,
        tuple(plans),
        _budget_uses(books, budgets, plans),
        before,
        after,
        {**books.invalid, **(invalid or {})},
    )


def _work(clock: Callable[[], float], timeout_s: float) -> WorkBudget:
    deadline = clock() + timeout_s
    return WorkBudget(should_stop=lambda: clock() >= deadline)
