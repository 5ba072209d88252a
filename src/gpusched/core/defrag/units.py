"""Which running pods may move, grouped into *units* that move whole (a gang, or one pod).

A pod may move when a controller that recreates it owns it (``PodSpec.controller``, of a kind in
``Rules.recreating``: a bare pod evicted is lost, not moved), it did not opt out
(``PodSpec.movable``), its priority passes the rule, it
has not reached its move cap in the window, it is not one of the pods the plan is for, and every
disruption budget that selects it allows a move. A gang (``PodSpec.gang``, within a namespace)
is one unit: it moves when all its running members may, and counts as that many moves.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag.types import PriorityRule, Refusal, Rules
from gpusched.core.model import PodSpec


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods that move together: their keys, the nodes they sit on, and per budget (index into
    ``Rules.budgets``) how many of them it selects."""

    members: tuple[str, ...]
    nodes: frozenset[int]
    budget_use: tuple[tuple[int, int], ...]
    gpu_milli: int

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True, slots=True)
class Eligibility:
    units: tuple[Unit, ...]
    unit_of: dict[str, int]
    """Pod key -> index of its unit in ``units`` (movable pods only)."""
    on_node: tuple[tuple[int, ...], ...]
    """Per node, the units with a member there."""
    refused: dict[str, Refusal]
    """Pod key -> why it may not move (the running pods that may not)."""


def _pod_refusal(
    pod: PodSpec, rules: Rules, pending_priority: int | None, exclude: Collection[str]
) -> Refusal | None:
    if pod.key in exclude:
        return Refusal.PENDING
    if not pod.movable:
        return Refusal.OPTED_OUT
    if pod.controller is None:
        return Refusal.NO_CONTROLLER
    if pod.controller.qualified_kind not in rules.recreating:
        return Refusal.NOT_RECREATED
    if pending_priority is not None:
        if rules.priority is PriorityRule.LOWER and pod.priority >= pending_priority:
            return Refusal.PRIORITY
        if rules.priority is PriorityRule.NOT_HIGHER and pod.priority > pending_priority:
            return Refusal.PRIORITY
    if rules.max_priority is not None and pod.priority > rules.max_priority:
        return Refusal.PRIORITY
    if rules.moved.get(pod.key, 0) >= rules.max_moves_per_pod:
        return Refusal.MOVE_CAP
    return None


def eligibility(
    snap: ClusterState, rules: Rules, pending_priority: int | None = None, exclude: Collection[str] = ()
) -> Eligibility:
    """The movable units of ``snap`` under ``rules`` for a plan made for pods of
    ``pending_priority`` (None: consolidation), never moving the pods of ``exclude``."""
    refused: dict[str, Refusal] = {}
    groups: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str]] = []
    for key in sorted(snap.allocations):
        pod = snap.allocations[key].pod
        why = _pod_refusal(pod, rules, pending_priority, exclude)
        if why is not None:
            refused[key] = why
        gk = (pod.namespace, pod.gang) if pod.gang else ("", "\0" + key)
        if gk not in groups:
            groups[gk] = []
            order.append(gk)
        groups[gk].append(key)
    units: list[Unit] = []
    unit_of: dict[str, int] = {}
    on_node: list[list[int]] = [[] for _ in range(len(snap))]
    for gk in order:
        members = groups[gk]
        blocked = [m for m in members if m in refused]
        if blocked:
            for m in members:
                refused.setdefault(m, Refusal.GANG_MEMBER_BLOCKED)
            continue
        use: list[tuple[int, int]] = []
        over = False
        for bi, b in enumerate(rules.budgets):
            n = sum(
                1
                for m in members
                if b.selects(snap.allocations[m].pod.namespace, snap.allocations[m].pod.labels)
            )
            if n:
                use.append((bi, n))
                over = over or n > b.allowed
        if over:
            for m in members:
                refused[m] = Refusal.BUDGET_EXHAUSTED
            continue
        nodes = frozenset(snap.allocations[m].node for m in members)
        ui = len(units)
        units.append(
            Unit(
                tuple(members),
                nodes,
                tuple(use),
                sum(snap.allocations[m].pod.gpu_demand_milli for m in members),
            )
        )
        for m in members:
            unit_of[m] = ui
        for n in nodes:
            on_node[n].append(ui)
    return Eligibility(tuple(units), unit_of, tuple(tuple(x) for x in on_node), refused)


class BudgetTally:
    """Moves charged so far against each disruption budget and the plan's move cap."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.used = [0] * len(rules.budgets)
        self.moves = 0

    def allows(self, units: Collection[Unit]) -> bool:
        extra = [0] * len(self.used)
        moves = self.moves
        for u in units:
            moves += u.size
            for bi, n in u.budget_use:
                extra[bi] += n
        if moves > self.rules.max_moves:
            return False
        return all(self.used[i] + extra[i] <= b.allowed for i, b in enumerate(self.rules.budgets))

    def charge(self, units: Collection[Unit]) -> None:
        for u in units:
            self.moves += u.size
            for bi, n in u.budget_use:
                self.used[bi] += n

    def report(self) -> tuple[tuple[str, int], ...]:
        return tuple(
            (f"{b.namespace}/{b.name}", n) for b, n in zip(self.rules.budgets, self.used, strict=True) if n
        )
