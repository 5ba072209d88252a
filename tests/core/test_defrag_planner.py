"""The defragmentation planner (core.defrag): rules, exactness against brute force, consolidation."""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pytest

import builders
from builders import RS, gpu_node, profile
from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.defrag import (
    DisruptionBudget,
    Method,
    Plan,
    PlanError,
    PriorityRule,
    Refusal,
    Rules,
    WorkBudget,
    apply_plan,
    consolidate,
    eligibility,
    plan_for,
)
from gpusched.core.fragmentation import TargetWorkload, cluster_fragmentation
from gpusched.core.model import PodSpec
from gpusched.core.selectors import LabelSelector
from gpusched.core.statement import Statement

BESTFIT = profile("bestfit")

# running pods that a ReplicaSet recreates: defragmentation may move them
share = partial(builders.share, controller=RS)
whole = partial(builders.whole, controller=RS)


def fragmented(nodes: int = 3, gpus: int = 4) -> ClusterState:
    """Nodes n0..: n0 and n1 with a 500-share on every GPU, the last one with 300-shares on GPUs 0-1."""
    snap = ClusterState([gpu_node(f"n{i}", gpus, cpu=64_000) for i in range(nodes)])
    k = 0
    for n in range(nodes - 1):
        for g in range(gpus):
            snap.assume(share(f"s{k}", 500), n, (g,))
            k += 1
    snap.assume(share("small-0", 300), nodes - 1, (0,))
    snap.assume(share("small-1", 300), nodes - 1, (1,))
    return snap


def books(snap: ClusterState) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {k: (a.node, a.gpus) for k, a in snap.allocations.items()}


def carry_out(snap: ClusterState, plan: Plan, pending: list[PodSpec]) -> ClusterState:
    """The plan applied to a copy, each step booked and the books checked after it."""
    c = snap.copy()
    for mv in plan.moves:
        a = c.forget(mv.pod)
        assert c.names[a.node] == mv.from_node
        c.assume(a.pod, c.index[mv.to_node], mv.to_gpus)
        assert c.verify() == []
    specs = {p.key: p for p in pending}
    for pl in plan.placements:
        c.assume(specs[pl.pod], c.index[pl.node], pl.gpus)
        assert c.verify() == []
    return c


# ------------------------------------------------------------------------------------------- basics
def test_a_pod_that_fits_needs_no_move() -> None:
    snap = fragmented()
    plan = plan_for(BESTFIT, snap, share("p", 400))
    assert plan.feasible and plan.method is Method.FITS_NOW and plan.moves == () and plan.optimal
    assert len(plan.placements) == 1


@pytest.mark.parametrize("exact", [True, False])
def test_fewest_moves_clear_the_least_used_node(exact: bool) -> None:
    snap = fragmented()
    before = books(snap)
    plan = plan_for(BESTFIT, snap, whole("big", 4), budget=WorkBudget(exact=exact))
    assert plan.feasible and plan.move_count == 2 and plan.optimal
    assert {m.pod for m in plan.moves} == {"default/small-0", "default/small-1"}
    assert plan.placements[0].node == "n2" and plan.placements[0].gpus == (0, 1, 2, 3)
    assert books(snap) == before and snap.verify() == []  # the snapshot is left as it was
    after = carry_out(snap, plan, [whole("big", 4)])
    assert "default/big" in after.allocations


def test_opted_out_pod_is_never_moved_and_the_plan_routes_around_it() -> None:
    snap = fragmented()
    a = snap.forget("default/small-0")
    snap.assume(PodSpec("small-0", num_gpu=1, gpu_milli=300, movable=False), a.node, a.gpus)
    el = eligibility(snap, Rules())
    assert el.refused["default/small-0"] is Refusal.OPTED_OUT
    plan = plan_for(BESTFIT, snap, whole("big", 4))
    # n2 cannot be cleared; n0 or n1 (four 500-shares) can, if the shares find room elsewhere
    assert all(m.pod != "default/small-0" for m in plan.moves)
    if plan.feasible:
        assert plan.placements[0].node != "n2"


def test_opt_out_is_validated() -> None:
    with pytest.raises(Exception, match="movable must be True or False"):
        PodSpec("x", movable="no")  # type: ignore[arg-type]


def test_disruption_budget_at_its_limit_blocks_and_the_plan_routes_around_it() -> None:
    snap = ClusterState([gpu_node(f"n{i}", 2, cpu=64_000) for i in range(3)])
    snap.assume(share("a", 300, labels={"app": "web"}), 0, (0,))
    snap.assume(share("b", 600), 1, (0,))
    snap.assume(share("c", 600), 1, (1,))
    snap.assume(share("d", 900), 2, (0,))
    snap.assume(share("e", 900), 2, (1,))
    big = whole("big", 2)
    free = plan_for(BESTFIT, snap, big)
    assert free.feasible and [m.pod for m in free.moves] == ["default/a"]
    pdb = DisruptionBudget("web", "default", LabelSelector((("app", "web"),)), allowed=0)
    plan = plan_for(BESTFIT, snap, big, Rules(budgets=(pdb,)))
    assert plan.feasible and "default/a" not in {m.pod for m in plan.moves}
    assert plan.move_count == 2 and plan.budgets_used == ()
    pdb1 = DisruptionBudget("web", "default", LabelSelector((("app", "web"),)), allowed=1)
    used = plan_for(BESTFIT, snap, big, Rules(budgets=(pdb1,)))
    assert used.budgets_used == (("default/web", 1),)


def test_priority_rule() -> None:
    snap = fragmented()
    strict = plan_for(BESTFIT, snap, whole("big", 4), Rules(priority=PriorityRule.LOWER))
    assert not strict.feasible and "no node could take it" in strict.reason
    ok = plan_for(BESTFIT, snap, whole("big", 4, priority=1), Rules(priority=PriorityRule.LOWER))
    assert ok.feasible and ok.move_count == 2


def test_move_caps() -> None:
    snap = fragmented()
    capped = plan_for(BESTFIT, snap, whole("big", 4), Rules(max_moves=1))
    assert not capped.feasible and capped.moves == ()
    moved_before = Rules(moved={"default/small-0": 1}, max_moves_per_pod=1)
    plan = plan_for(BESTFIT, snap, whole("big", 4), moved_before)
    assert all(m.pod != "default/small-0" for m in plan.moves)


def test_a_running_gang_moves_whole() -> None:
    snap = ClusterState([gpu_node(f"n{i}", 2, cpu=64_000) for i in range(3)])
    snap.assume(share("g-0", 300, gang="g"), 0, (0,))
    snap.assume(share("g-1", 300, gang="g"), 1, (0,))
    snap.assume(share("x", 600, movable=False), 2, (0,))
    snap.assume(share("y", 600, movable=False), 2, (1,))
    snap.assume(share("z", 100), 1, (1,))
    plan = plan_for(BESTFIT, snap, whole("big", 2))
    assert plan.feasible
    moved = {m.pod for m in plan.moves}
    # n0 costs the whole gang (2 moves), n1 the gang and z (3): n0 wins with both gang members
    assert moved == {"default/g-0", "default/g-1"} and plan.placements[0].node == "n0"
    blocked = ClusterState(snap.nodes)
    for a in snap.allocations.values():
        pod = a.pod
        if pod.name == "g-1":
            pod = share("g-1", 300, gang="g", movable=False)
        elif pod.name in ("x", "y"):
            pod = share(pod.name, 600, movable=False)
        blocked.assume(pod, a.node, a.gpus)
    el = eligibility(blocked, Rules())
    assert el.refused["default/g-0"] is Refusal.GANG_MEMBER_BLOCKED
    p2 = plan_for(BESTFIT, blocked, whole("big", 2))
    assert not (p2.feasible and {"default/g-0", "default/g-1"} & {m.pod for m in p2.moves})


def test_a_pending_gang_gets_a_plan_for_all_or_none() -> None:
    snap = fragmented(nodes=4)
    gang = [whole("job-0", 4, gang="job"), whole("job-1", 4, gang="job")]
    plan = plan_for(BESTFIT, snap, gang, Rules(max_moves=16))
    assert plan.feasible and len(plan.placements) == 2
    assert len({p.node for p in plan.placements}) == 2
    carry_out(snap, plan, gang)
    too_few = plan_for(BESTFIT, snap, gang, Rules(max_moves=2))
    assert not too_few.feasible and too_few.placements == ()


def test_bad_inputs_name_what_is_wrong() -> None:
    snap = fragmented()
    with pytest.raises(PlanError, match="given twice"):
        plan_for(BESTFIT, snap, [share("p", 100), share("p", 100)])
    with pytest.raises(PlanError, match="already running on n2"):
        plan_for(BESTFIT, snap, share("small-0", 300))
    with pytest.raises(PlanError, match="no pending pod"):
        plan_for(BESTFIT, snap, [])
    with pytest.raises(PlanError, match="allowed must be a non-negative integer"):
        DisruptionBudget("b", "default", LabelSelector(), allowed=-1)
    with pytest.raises(PlanError, match="max_work must be a positive integer"):
        WorkBudget(max_work=0)
    with pytest.raises(PlanError, match=r"moved\['x'\]"):
        Rules(moved={"x": -1})
    with pytest.raises(PlanError, match="tiebreak has 2 ranks for 3 nodes"):
        plan_for(BESTFIT, snap, whole("big", 4), tiebreak=np.arange(2))


def test_work_budget_and_deadline_stop_the_search() -> None:
    snap = fragmented()
    stopped = plan_for(BESTFIT, snap, whole("big", 4), budget=WorkBudget(should_stop=lambda: True))
    assert not stopped.feasible and "work budget spent" in stopped.reason


def test_apply_plan_reports_a_stale_plan() -> None:
    snap = fragmented()
    plan = plan_for(BESTFIT, snap, whole("big", 4))
    snap.forget("default/small-0")
    with Statement(snap) as st:
        why = apply_plan(st, BESTFIT, plan, {"default/big": whole("big", 4)})
    assert why is not None and "small-0 is not running" in why


# ------------------------------------------------------------------------------ exact vs brute force
def _place_all(snap: ClusterState, pods: list[PodSpec], forbidden: set[int]) -> bool:
    """Can ``pods`` (each with its own forbidden node first in the list) all be booked, anywhere
    but the forbidden nodes? Exhaustive over nodes and GPU sets."""
    if not pods:
        return True
    pod, rest = pods[0], pods[1:]
    own = _own[pod.key]
    for n in range(len(snap)):
        if n in forbidden or n == own:
            continue
        combos = itertools.combinations(range(int(snap.gpu_count[n])), pod.num_gpu)
        for gpus in combos:
            if snap.check_fits(pod, n, gpus) is not None:
                continue
            snap.assume(pod, n, gpus)
            ok = _place_all(snap, rest, forbidden)
            snap.forget(pod.key)
            if ok:
                return True
    return False


_own: dict[str, int] = {}


def brute_force_moves(snap: ClusterState, pod: PodSpec) -> int | None:
    """The fewest moves of the planner's model — pods leave the node the pending pod lands on, for
    other nodes, no chains — by trying every target, subset of its pods, and destination."""
    best: int | None = None
    for n in range(len(snap)):
        keys = sorted(snap.node_pods[n])
        for k in range(len(keys) + 1):
            if best is not None and k >= best:
                break
            if any(_fits_after(snap, pod, n, subset) for subset in itertools.combinations(keys, k)):
                best = k
                break
    return best


def _fits_after(snap: ClusterState, pod: PodSpec, n: int, subset: tuple[str, ...]) -> bool:
    c = snap.copy()
    moved = []
    for key in subset:
        a = c.forget(key)
        _own[key] = a.node
        moved.append(a.pod)
    for gpus in itertools.combinations(range(int(c.gpu_count[n])), pod.num_gpu):
        if c.check_fits(pod, n, gpus) is not None:
            continue
        c.assume(pod, n, gpus)
        ok = _place_all(c, moved, {n})
        c.forget(pod.key)
        if ok:
            return True
    return False


def random_instance(seed: int) -> tuple[ClusterState, PodSpec]:
    rng = np.random.default_rng(seed)
    nodes = [gpu_node(f"n{i}", int(rng.choice([2, 2, 4])), cpu=16_000) for i in range(3)]
    snap = ClusterState(nodes)
    for i in range(int(rng.integers(5, 10))):
        if rng.random() < 0.7:
            p = share(f"r{i}", int(rng.choice([200, 300, 500, 700])), cpu=int(rng.choice([1000, 4000])))
        else:
            p = whole(f"r{i}", 1, cpu=2000)
        options = [
            (n, gs)
            for n in range(len(snap))
            for gs in itertools.combinations(range(int(snap.gpu_count[n])), p.num_gpu)
            if snap.check_fits(p, n, gs) is None
        ]
        if options:
            n, gs = options[int(rng.integers(len(options)))]
            snap.assume(p, n, gs)
    num = int(rng.choice([1, 2, 4]))
    pend = whole("pend", num, cpu=2000) if rng.random() < 0.7 else share("pend", 800, cpu=2000)
    return snap, pend


@pytest.mark.parametrize("seed", range(60))
def test_exact_plan_has_the_brute_force_fewest_moves(seed: int) -> None:
    snap, pend = random_instance(seed)
    if not any(snap.gpu_count >= pend.num_gpu):
        pytest.skip("no node has enough GPUs")
    want = brute_force_moves(snap, pend)
    rules = Rules(max_moves=10)
    both = plan_for(BESTFIT, snap, pend, rules, WorkBudget(exact_dests=10, exact_targets=10))
    exact = plan_for(BESTFIT, snap, pend, rules, WorkBudget(greedy=False, exact_dests=10, exact_targets=10))
    greedy = plan_for(BESTFIT, snap, pend, rules, WorkBudget(exact=False))
    if want is None:
        assert not both.feasible and not exact.feasible and not greedy.feasible
        return
    for plan in (both, exact):
        assert plan.feasible, plan.reason
        assert plan.move_count == want, (plan.method, plan.greedy_moves, plan.exact_moves)
        assert plan.optimal
        carry_out(snap, plan, [pend])
    if want:
        assert exact.method is Method.MILP
    assert not greedy.feasible or greedy.move_count >= want


# ------------------------------------------------------------------------------------- consolidation
def test_consolidation_reduces_fragmentation_step_by_step() -> None:
    snap = fragmented()
    tw = TargetWorkload.from_pods([whole("w1", 1), whole("w4", 4), share("s", 500)])
    before = books(snap)
    frag0 = cluster_fragmentation(snap, tw)
    plan = consolidate(BESTFIT, snap, tw, max_moves=3)
    assert books(snap) == before
    assert 0 < plan.move_count <= 3
    assert plan.frag_before == pytest.approx(frag0)
    assert plan.frag_after is not None and plan.frag_after < frag0
    c = snap.copy()
    last = frag0
    for mv in plan.moves:
        a = c.forget(mv.pod)
        c.assume(a.pod, c.index[mv.to_node], mv.to_gpus)
        now = cluster_fragmentation(c, tw)
        assert now < last
        last = now
    assert last == pytest.approx(plan.frag_after)


def test_consolidation_respects_opt_out_and_zero_moves() -> None:
    snap = ClusterState([gpu_node(f"n{i}", 2, cpu=64_000) for i in range(2)])
    snap.assume(share("a", 300, movable=False), 0, (0,))
    snap.assume(share("b", 300, movable=False), 1, (0,))
    tw = TargetWorkload.from_pods([whole("w", 2)])
    plan = consolidate(BESTFIT, snap, tw, max_moves=4)
    assert plan.moves == () and plan.reason
    assert consolidate(BESTFIT, fragmented(), tw, max_moves=0).moves == ()
    with pytest.raises(PlanError, match="max_moves must be a non-negative integer"):
        consolidate(BESTFIT, snap, tw, max_moves=-1)


def test_accounting_error_is_not_swallowed_by_apply() -> None:
    snap = fragmented()
    with pytest.raises(AccountingError):
        snap.assume(share("small-0", 300), 0, (0,))
