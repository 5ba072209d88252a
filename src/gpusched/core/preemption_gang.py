"""A gang as a preemptor: the fewest lower-priority victims that let its minimum fit at once.

``DefaultPreemption`` (``plugins/preemption.py``) makes room for one pod on one node. A gang
needs room for ``Unit.need`` pods at once, on whatever nodes; ``plan_gang_preemption`` finds it
in a copy of the books (a ``Statement`` what-if; the snapshot ends as it began):

- **victims** are units of eviction of lower priority than every member of the gang: a pod
  alone, or a whole gang (every member booked anywhere), left out unless all its members are of
  lower priority (the single-pod path's gang-aware rule);
- **order**: lowest priority first, then the largest units (fewest victims), then key;
- **disruption budgets** as the single-pod path and reclaim count them (kube-scheduler's
  ``filterPodsWithPDBViolation``): a plan that breaks no budget is sought first (units whose
  eviction, with those before them, breaks none), the others only when it does not exist, and
  the plan counts the pods over budget;
- **enough**: the shortest prefix of that order after which ``gang.place_gang`` places the
  gang's minimum (found by doubling, then bisection: a few what-ifs even among thousands of
  candidates), then **trimmed**: each chosen unit, most important first, is spared when the gang
  still fits without evicting it (a what-if per unit; beyond ``EXACT_TRIM`` units, those that
  hold more GPU on some node than is left there once the members are placed are kept without
  one: a large plan stays fast, at the cost of a victim the gang could have done without by
  landing elsewhere);
- a member with ``preemptionPolicy: Never`` makes the gang evict no one.

The plan names the victims and, for nomination, where each member would land once they are
gone (``GangPreemption.placement``). ``reclaim`` (``queues/reclaim.py``) chooses among borrowing
queues' pods with the same units and what-if.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import Profile
from gpusched.core.gang import Unit, gang_key, place_gang
from gpusched.core.model import Allocation, PodSpec
from gpusched.core.scheduler import undo
from gpusched.core.statement import Statement

EXACT_TRIM = 32
"""Up to this many chosen units, each is tried for sparing; beyond, only those ``Slack`` admits."""


class Budgets(Protocol):
    """Disruption budgets as victim choosers read them (``core.disruption.DisruptionBudgets``
    fits): ``split`` orders pods into those whose eviction would break a budget, counted in
    order as kube-scheduler does, and the others."""

    def split(self, pods: Sequence[PodSpec]) -> tuple[list[PodSpec], list[PodSpec]]: ...


def violations(budgets: Budgets | None, pods: Iterable[PodSpec]) -> int:
    """Pods of ``pods`` whose eviction together breaks a budget (0 without budgets)."""
    return 0 if budgets is None else len(budgets.split(list(pods))[0])


@dataclass(frozen=True, slots=True)
class VictimUnit:
    """What is evicted together: one pod, or every booked member of a gang."""

    key: str
    """The gang key, or the pod key."""
    queue: str
    allocations: tuple[Allocation, ...]

    @property
    def priority(self) -> int:
        return max(a.pod.priority for a in self.allocations)

    @property
    def size(self) -> int:
        return sum(a.pod.gpu_demand_milli for a in self.allocations)

    @property
    def pods(self) -> list[PodSpec]:
        return [a.pod for a in self.allocations]


def victim_order(v: VictimUnit) -> tuple[int, int, str]:
    """Evicted first: lowest priority, then the largest unit (fewest victims), then key."""
    return (v.priority, -v.size, v.key)


def spare_order(v: VictimUnit) -> tuple[int, int, str]:
    """Spared first when trimming: the most important (highest priority, smallest)."""
    return (-v.priority, v.size, v.key)


def group_victims(
    allocations: Iterable[Allocation], queue_of: Callable[[Allocation], str]
) -> list[VictimUnit]:
    """``allocations`` as units of eviction (a gang's members together), unordered."""
    groups: dict[str, list[Allocation]] = {}
    queues: dict[str, str] = {}
    for a in allocations:
        g = gang_key(a.pod) or a.pod.key
        groups.setdefault(g, []).append(a)
        queues.setdefault(g, queue_of(a))
    return [VictimUnit(k, queues[k], tuple(sorted(v, key=lambda a: a.pod.key))) for k, v in groups.items()]


def place_without(
    profile: Profile, unit: Unit, snap: ClusterState, victims: Iterable[VictimUnit], tiebreak: I64 | None
) -> tuple[tuple[PodSpec, int], ...] | None:
    """Where ``unit``'s members land (pod, node index) with ``victims`` gone, or None when its
    minimum does not fit at once. The snapshot ends as it began."""
    keys = [a.pod.key for v in victims for a in v.allocations]
    gone = frozenset(keys)  # what only they hold outside the books (DRA claims) is free too
    with Statement(snap) as st:
        for key in keys:
            st.evict(key)
        r = place_gang(profile, unit, snap, tiebreak=tiebreak, diagnose=False, leaving=gone)
        if not r.scheduled:
            return None
        placed = tuple((res.pod, res.node) for res in r.placed)
        for res in r.placed:  # place_gang booked them outside the statement (and Reserve, its claims)
            undo(snap, res)
        return placed


@dataclass(frozen=True, slots=True)
class GangPreemption:
    """``victims``: pod keys to evict (empty with ``reason`` when no plan helps);
    ``placement``: where each member would land once they are gone (to nominate);
    ``budget_violations``: victims evicted beyond their disruption budgets (0 when avoidable)."""

    victims: tuple[str, ...]
    placement: tuple[tuple[PodSpec, int], ...] = ()
    budget_violations: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.victims)


def plan_gang_preemption(
    profile: Profile,
    snap: ClusterState,
    unit: Unit,
    *,
    budgets: Budgets | None = None,
    tiebreak: I64 | None = None,
) -> GangPreemption:
    """Victims of lower priority whose eviction lets ``unit``'s minimum fit; see the module."""
    if any(p.preemption_policy == "Never" for p in unit.pods):
        return GangPreemption((), reason="not eligible due to preemptionPolicy=Never")
    placed = place_without(profile, unit, snap, (), tiebreak)
    if placed is not None:
        return GangPreemption((), placed, reason="preemption: the gang fits without evicting anyone")
    prio = min(p.priority for p in unit.pods)
    units = group_victims(snap.allocations.values(), lambda a: a.pod.queue)
    cands = sorted((v for v in units if v.priority < prio), key=victim_order)
    if not cands:
        return GangPreemption((), reason="preemption: no pods of lower priority to evict")
    passes = (
        [(_budget_safe(cands, budgets), True), (cands, False)] if budgets is not None else [(cands, False)]
    )
    for pool, strict in passes:
        if strict and len(pool) == len(cands):
            continue  # every candidate is safe: the second pass is the same
        chosen = shortest_prefix(
            pool, lambda vs: place_without(profile, unit, snap, vs, tiebreak) is not None
        )
        if chosen is None:
            continue
        placement = place_without(profile, unit, snap, chosen, tiebreak)
        assert placement is not None
        chosen = trim(
            chosen,
            lambda vs: place_without(profile, unit, snap, vs, tiebreak) is not None,
            Slack(snap, chosen, placement) if len(chosen) > EXACT_TRIM else None,
        )
        placement = place_without(profile, unit, snap, chosen, tiebreak)
        assert placement is not None
        pods = sorted((p for v in chosen for p in v.pods), key=lambda p: (-p.priority, p.key))
        return GangPreemption(tuple(sorted(p.key for p in pods)), placement, violations(budgets, pods))
    return GangPreemption((), reason="preemption: evicting every pod of lower priority would not make room")


def _budget_safe(cands: Sequence[VictimUnit], budgets: Budgets | None) -> list[VictimUnit]:
    """The candidates, in order, that together with those kept before them break no budget."""
    kept: list[VictimUnit] = []
    pods: list[PodSpec] = []
    for v in cands:
        if violations(budgets, [*pods, *v.pods]) == 0:
            kept.append(v)
            pods.extend(v.pods)
    return kept


def shortest_prefix(
    pool: Sequence[VictimUnit], fits: Callable[[Sequence[VictimUnit]], bool]
) -> list[VictimUnit] | None:
    """The shortest prefix of ``pool`` with which ``fits`` holds (doubling, then bisection:
    O(log n) what-ifs), or None when even all of ``pool`` is not enough."""
    if not pool:
        return None
    hi = 1
    while hi < len(pool) and not fits(pool[:hi]):
        hi *= 2
    hi = min(hi, len(pool))
    if not fits(pool[:hi]):
        return None
    lo = hi // 2  # pool[:lo] does not fit (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(pool[:mid]):
            hi = mid
        else:
            lo = mid
    return list(pool[:hi])


def trim(
    chosen: Sequence[VictimUnit], fits: Callable[[Sequence[VictimUnit]], bool], slack: Slack | None = None
) -> list[VictimUnit]:
    """Spare each chosen unit, most important first, when ``fits`` still holds without it;
    ``slack`` rules out, without a what-if, the units that cannot be spared."""
    out = list(chosen)
    for v in sorted(chosen, key=spare_order):
        if slack is not None and not slack.admits(v):
            continue
        rest = [w for w in out if w is not v]
        if fits(rest):
            out = rest
            if slack is not None:
                slack.take(v)
    return out


class Slack:
    """Per node a victim holds: the GPU milli free once the chosen victims are gone, less what
    the gang's placement puts there. A victim that holds more on some node than its slack cannot
    be spared (the gang needs that room), so no what-if is spent on it; a spared one takes its
    share of the slack."""

    def __init__(
        self, snap: ClusterState, chosen: Sequence[VictimUnit], placement: Sequence[tuple[PodSpec, int]]
    ) -> None:
        self.left: dict[int, int] = {}
        for v in chosen:
            for n, m in _held(v).items():
                self.left[n] = self.left.get(n, 0) + m
        for n in self.left:
            self.left[n] += int(snap.gpu_free[n][snap.gpu_exists[n]].sum())
        for p, n in placement:
            if n in self.left:
                self.left[n] -= p.gpu_demand_milli

    def admits(self, v: VictimUnit) -> bool:
        return all(m <= self.left.get(n, 0) for n, m in _held(v).items())

    def take(self, v: VictimUnit) -> None:
        for n, m in _held(v).items():
            self.left[n] -= m


def _held(v: VictimUnit) -> dict[int, int]:
    out: dict[int, int] = {}
    for a in v.allocations:
        out[a.node] = out.get(a.node, 0) + a.pod.gpu_demand_milli
    return out
