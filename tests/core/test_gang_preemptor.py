"""A gang as a preemptor (``core/preemption_gang.py``, ``batch.run_cycle``): the fewest
lower-priority victims, whole victim gangs, budget-safe victims first, the books untouched by the
what-if, and where each member lands once the victims are gone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, profile, whole
from gpusched.core.batch import Outcome, run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.disruption import DisruptionBudget, DisruptionBudgets
from gpusched.core.gang import GangSpec, Unit, gang_key, group_units, partly_bound
from gpusched.core.preemption_gang import (
    VictimUnit,
    group_victims,
    place_without,
    plan_gang_preemption,
    shortest_prefix,
)
from gpusched.core.selectors import LabelSelector

PROF = profile()
PREEMPTING = profile(preemption=True)


def gang_unit(name: str, n: int, num: int = 1, priority: int = 10, min_member: int | None = None) -> Unit:
    pods = [whole(f"{name}-{i}", num, gang=name, priority=priority) for i in range(n)]
    return group_units(pods, {f"default/{name}": GangSpec(name, min_member=min_member or n)})[0]


def full(nodes: int = 2, gpus: int = 4, priority: int = 0, **kw: object) -> ClusterState:
    """Every GPU taken by a one-GPU pod of ``priority``."""
    snap = ClusterState([node(f"n{i}", gpus=gpus) for i in range(nodes)])
    for n in range(nodes):
        for g in range(gpus):
            snap.assume(whole(f"low-{n}-{g}", priority=priority, **kw), n, [g])  # type: ignore[arg-type]
    return snap


def books(snap: ClusterState) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {k: (a.node, tuple(a.gpus)) for k, a in snap.allocations.items()}


def test_a_gang_evicts_only_as_many_lower_priority_pods_as_its_minimum_needs() -> None:
    snap = full()
    before = books(snap)
    plan = plan_gang_preemption(PROF, snap, gang_unit("g", 2, num=2))
    assert plan.ok and len(plan.victims) == 4, plan  # two GPUs for each of two members, not all 8
    assert books(snap) == before  # a what-if: nothing evicted, nothing booked
    assert sorted(p.key for p, _ in plan.placement) == ["default/g-0", "default/g-1"]
    # the placement is where the victims leave room
    freed = {(before[k][0], g) for k in plan.victims for g in before[k][1]}
    for p, n in plan.placement:
        assert sum(1 for (m, _) in freed if m == n) >= p.num_gpu


def test_pods_of_equal_or_higher_priority_are_never_victims() -> None:
    snap = full(priority=10)
    plan = plan_gang_preemption(PROF, snap, gang_unit("g", 2, priority=10))
    assert not plan.ok and "no pods of lower priority" in plan.reason
    # preemptionPolicy Never on a member: the gang evicts no one
    pods = [whole(f"g-{i}", gang="g", priority=99, preemption_policy="Never") for i in range(2)]
    never = group_units(pods, {"default/g": GangSpec("g", min_member=2)})[0]
    assert "preemptionPolicy=Never" in plan_gang_preemption(PROF, full(), never).reason


def test_a_victim_gang_goes_whole_and_a_mixed_priority_gang_is_no_victim() -> None:
    snap = ClusterState([node(f"n{i}", gpus=2) for i in range(2)])
    for i in range(2):  # a low gang, one member per node
        snap.assume(whole(f"v-{i}", gang="v", priority=0), i, [0])
    snap.assume(whole("s0", priority=1), 0, [1])
    snap.assume(whole("s1", priority=1), 1, [1])
    plan = plan_gang_preemption(PROF, snap, gang_unit("g", 1, num=2))
    # the gang (lowest priority) goes whole, though one node's two GPUs would have been enough
    # with s0 alone; its two members are one unit, evicted first
    assert set(plan.victims) >= {"default/v-0", "default/v-1"} or set(plan.victims) == {"default/s0"}
    vs = {gang_key(snap.allocations[k].pod) for k in plan.victims if snap.allocations[k].pod.gang}
    for g in vs:
        assert {k for k, a in snap.allocations.items() if gang_key(a.pod) == g} <= set(plan.victims)
    # a gang with a member of the preemptor's priority is no victim at all
    snap2 = ClusterState([node("n0", gpus=2)])
    snap2.assume(whole("m-0", gang="m", priority=0), 0, [0])
    snap2.assume(whole("m-1", gang="m", priority=10), 0, [1])
    assert not plan_gang_preemption(PROF, snap2, gang_unit("g", 1, num=2)).ok


def test_victims_a_budget_protects_are_spared_when_another_choice_exists() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    for g in range(4):
        snap.assume(whole(f"db-{g}", priority=0, labels={"app": "db"}), 0, [g])
        snap.assume(whole(f"web-{g}", priority=1), 1, [g])
    budgets = DisruptionBudgets((DisruptionBudget("db", "default", LabelSelector((("app", "db"),)), 0),))
    unit = gang_unit("g", 2, num=2)
    # without budgets the lowest priority goes (db); with the budget, web does and breaks none
    assert all("db-" in k for k in plan_gang_preemption(PROF, snap, unit).victims)
    plan = plan_gang_preemption(PROF, snap, unit, budgets=budgets)
    assert plan.ok and all("web-" in k for k in plan.victims) and plan.budget_violations == 0
    # when only protected pods can make room, they go and are counted
    for g in range(4):
        snap.forget(f"default/web-{g}")
        snap.assume(whole(f"web-{g}", priority=10), 1, [g])
    plan = plan_gang_preemption(PROF, snap, unit, budgets=budgets)
    assert plan.ok and plan.budget_violations == 4


def test_run_cycle_preempts_for_a_gang_and_lands_it_whole_with_evict_now() -> None:
    snap = full()
    unit = gang_unit("g", 2, num=2)
    (o,) = run_cycle(PREEMPTING, snap, [unit])
    assert o.outcome is Outcome.PREEMPT and len(o.victims) == 4 and len(o.nominated) == 2
    assert len(snap.allocations) == 8  # the front end evicts; nothing moved here
    (o,) = run_cycle(PREEMPTING, snap, [unit], evict_now=True)
    assert o.outcome is Outcome.PLACED and len(o.placed) == 2 and len(o.victims) == 4
    assert not any(v in snap.allocations for v in o.victims)
    # without preemption in the profile the gang only waits
    (o,) = run_cycle(PROF, full(), [unit])
    assert o.outcome is Outcome.WAITING and not o.victims


def test_the_shortest_prefix_is_found_by_bisection() -> None:
    pool = [VictimUnit(str(i), "", ()) for i in range(100)]
    calls: list[int] = []

    def fits(vs: object) -> bool:
        calls.append(len(vs))  # type: ignore[arg-type]
        return len(vs) >= 37  # type: ignore[arg-type]

    got = shortest_prefix(pool, fits)
    assert got is not None and len(got) == 37 and len(calls) <= 16
    assert shortest_prefix(pool, lambda vs: False) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 2), st.integers(0, 3)), min_size=1, max_size=16),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(0, 6),
)
def test_a_plan_is_lower_priority_whole_gangs_sufficient_minimal_and_leaves_the_books(
    held: list[tuple[int, int, int]], members: int, num: int, prio: int
) -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(3)])
    gangs: dict[str, GangSpec] = {}
    for i, (p, n, g) in enumerate(held):  # g > 0: member of victim gang vg<g> (placed where it fits)
        pod = whole(f"h{i}", n, priority=p, gang=f"vg{g}" if g else "")
        for nd in range(len(snap)):
            free = [k for k, f in enumerate(snap.node_gpu_free(nd)) if f == 1000]
            if len(free) >= n:
                snap.assume(pod, nd, free[:n])
                break
    for a in snap.allocations.values():
        if a.pod.gang:
            gangs[gang_key(a.pod)] = GangSpec(a.pod.gang, min_member=1)
    unit = gang_unit("g", members, num=num, priority=prio)
    before = books(snap)
    plan = plan_gang_preemption(PROF, snap, unit)
    assert books(snap) == before
    if not plan.ok:
        return
    victims = [snap.allocations[k].pod for k in plan.victims]
    assert all(v.priority < prio for v in victims)
    for g in {gang_key(v) for v in victims if v.gang}:  # whole gangs
        assert {k for k, a in snap.allocations.items() if gang_key(a.pod) == g} <= set(plan.victims)
    vus = group_victims([snap.allocations[k] for k in plan.victims], lambda a: "")
    assert place_without(PROF, unit, snap, vus, None) is not None  # enough
    for u in vus:  # minimal: sparing any one unit leaves the gang short
        assert place_without(PROF, unit, snap, [w for w in vus if w is not u], None) is None
    assert partly_bound([a.pod for a in snap.allocations.values()], gangs) == []


def test_a_large_plan_keeps_the_victims_its_members_need_without_a_what_if_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """40 nodes full of one-GPU pods, a gang of 5 x 8 GPUs: 40 victims (more than EXACT_TRIM),
    exactly the pods of the 5 nodes it lands on, found with a handful of what-ifs, not one per
    victim."""
    import gpusched.core.preemption_gang as pg

    snap = full(nodes=40, gpus=8)
    calls: list[int] = []
    real = pg.place_without

    def counting(*a: object, **kw: object) -> object:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pg, "place_without", counting)
    plan = plan_gang_preemption(PROF, snap, gang_unit("g", 5, num=8))
    assert len(plan.victims) == 40 > pg.EXACT_TRIM
    assert {snap.allocations[k].node for k in plan.victims} == {n for _, n in plan.placement}
    assert len(calls) < 20, len(calls)
