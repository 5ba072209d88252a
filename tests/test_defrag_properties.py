"""Properties of defragmentation plans (hypothesis): carried out move by move on a copy of the books,
a plan never overcommits at any step, never moves a pod that opted out, of higher priority, over
its cap, or beyond a disruption budget, moves gangs whole, and leaves the pending pod fitting."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import RS, gpu_node, profile
from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import (
    DisruptionBudget,
    Plan,
    PriorityRule,
    Rules,
    WorkBudget,
    consolidate,
    plan_for,
)
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import GPU_MILLI, Controller, PodSpec
from gpusched.core.scheduler import fits, schedule_one
from gpusched.core.selectors import LabelSelector

PROFILE = profile("bestfit")
DAEMONSET = Controller("DaemonSet", "agent", "apps")
SHARES = (100, 250, 300, 470, 500, 650, 810)


@st.composite
def scenes(draw: st.DrawFn) -> tuple[ClusterState, PodSpec, Rules]:
    n_nodes = draw(st.integers(2, 5))
    nodes = [
        gpu_node(f"n{i}", draw(st.sampled_from([1, 2, 4, 8])), cpu=draw(st.sampled_from([8_000, 32_000])))
        for i in range(n_nodes)
    ]
    snap = ClusterState(nodes)
    n_pods = draw(st.integers(1, 18))
    for i in range(n_pods):
        kind = draw(st.sampled_from(["share", "share", "whole", "cpu"]))
        labels = {"app": draw(st.sampled_from(["a", "b", "c"]))}
        common = {
            "cpu_milli": draw(st.sampled_from([0, 1000, 4000])),
            "priority": draw(st.integers(0, 2)),
            "movable": draw(st.booleans()) or draw(st.booleans()),
            "labels": labels,
            "gang": draw(st.sampled_from(["", "", "", "g1", "g2"])),
            # mostly recreated pods; some bare, some of a DaemonSet (never moved)
            "controller": draw(st.sampled_from([RS, RS, RS, None, DAEMONSET])),
        }
        if kind == "share":
            p = PodSpec(f"r{i}", num_gpu=1, gpu_milli=draw(st.sampled_from(SHARES)), **common)
        elif kind == "whole":
            p = PodSpec(f"r{i}", num_gpu=draw(st.sampled_from([1, 2])), gpu_milli=GPU_MILLI, **common)
        else:
            p = PodSpec(f"r{i}", **common)
        tie = np.array(draw(st.permutations(range(n_nodes))), dtype=np.int64)
        schedule_one(PROFILE, p, snap, tiebreak=tie, diagnose_failures=False)
    num = draw(st.sampled_from([1, 2, 4, 8]))
    if draw(st.booleans()):
        pend = PodSpec("pend", num_gpu=num, gpu_milli=GPU_MILLI, priority=draw(st.integers(0, 2)))
    else:
        pend = PodSpec("pend", num_gpu=1, gpu_milli=draw(st.sampled_from(SHARES)), priority=1)
    budgets = tuple(
        DisruptionBudget(f"pdb-{app}", "default", LabelSelector((("app", app),)), draw(st.integers(0, 2)))
        for app in draw(st.sets(st.sampled_from(["a", "b"])))
    )
    moved = {f"default/r{i}": 1 for i in draw(st.sets(st.integers(0, n_pods - 1), max_size=3))}
    rules = Rules(
        priority=draw(st.sampled_from(list(PriorityRule))),
        budgets=budgets,
        max_moves=draw(st.integers(0, 6)),
        max_moves_per_pod=1,
        moved=moved,
    )
    return snap, pend, rules


def check_plan(snap: ClusterState, plan: Plan, rules: Rules, pending: PodSpec | None) -> None:
    original = {k: (a.node, a.gpus) for k, a in snap.allocations.items()}
    assert len(plan.moves) <= rules.max_moves
    moved = [m.pod for m in plan.moves]
    assert len(set(moved)) == len(moved), "a pod moved twice in one plan"
    c = snap.copy()
    for mv in plan.moves:
        a = c.allocations[mv.pod]
        assert a.pod.movable, f"opted-out pod {mv.pod} moved"
        ctl = a.pod.controller
        assert ctl is not None and ctl.qualified_kind in rules.recreating, (
            f"{mv.pod} ({ctl}) is not recreated"
        )
        assert rules.moved.get(mv.pod, 0) < rules.max_moves_per_pod, f"{mv.pod} over its move cap"
        if pending is not None:
            if rules.priority is PriorityRule.LOWER:
                assert a.pod.priority < pending.priority
            else:
                assert a.pod.priority <= pending.priority
        c.forget(mv.pod)
        assert c.verify() == []
        assert fits(PROFILE, a.pod, c, c.index[mv.to_node]), f"{mv.pod} does not pass the filters there"
        c.assume(a.pod, c.index[mv.to_node], mv.to_gpus)  # AccountingError if it would overcommit
        assert c.verify() == [], f"overcommitted after moving {mv.pod}"
    for b in rules.budgets:
        n = sum(
            1 for k in moved if b.selects(snap.allocations[k].pod.namespace, snap.allocations[k].pod.labels)
        )
        assert n <= b.allowed, f"budget {b.name} allows {b.allowed}, plan moves {n}"
    gangs = {(a.pod.namespace, a.pod.gang) for k, a in snap.allocations.items() if k in moved and a.pod.gang}
    for ns, g in gangs:
        members = {k for k, a in snap.allocations.items() if a.pod.gang == g and a.pod.namespace == ns}
        assert members <= set(moved), f"gang {g} moved in part"
    if pending is not None:
        (pl,) = plan.placements
        assert fits(PROFILE, pending, c, c.index[pl.node])
        c.assume(pending, c.index[pl.node], pl.gpus)
        assert c.verify() == []
    assert {k: (a.node, a.gpus) for k, a in snap.allocations.items()} == original


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.booleans())
def test_plans_never_overcommit_nor_break_a_rule(
    scene: tuple[ClusterState, PodSpec, Rules], exact: bool
) -> None:
    snap, pend, rules = scene
    before = {k: (a.node, a.gpus) for k, a in snap.allocations.items()}
    plan = plan_for(PROFILE, snap, pend, rules, WorkBudget(exact=exact))
    assert {k: (a.node, a.gpus) for k, a in snap.allocations.items()} == before and snap.verify() == []
    if not plan.feasible:
        assert plan.moves == () and plan.placements == () and plan.reason
        return
    check_plan(snap, plan, rules, pend)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.integers(0, 5))
def test_consolidation_never_overcommits_nor_breaks_a_rule(
    scene: tuple[ClusterState, PodSpec, Rules], k: int
) -> None:
    snap, _, rules = scene
    tw = TargetWorkload.from_pods(
        [PodSpec("w1", num_gpu=1, gpu_milli=GPU_MILLI), PodSpec("w2", num_gpu=2, gpu_milli=GPU_MILLI)]
    )
    plan = consolidate(PROFILE, snap, tw, k, rules)
    assert len(plan.moves) <= k
    check_plan(snap, plan, rules, None)
    if plan.moves:
        assert plan.frag_after is not None and plan.frag_before is not None
        assert plan.frag_after < plan.frag_before
