"""Gangs in the core: units, all-or-nothing with a minimum, no deadlock between two gangs,
gang-aware preemption, and gangs that can never start."""

from __future__ import annotations

import pytest

from builders import node, profile, whole
from gpusched.core.batch import Outcome, run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.gang import GangSpec, InvalidGang, check_gang, group_units, partly_bound, place_gang
from gpusched.core.scheduler import schedule_one


def gang(name: str, n: int, num: int = 1, **kw: object) -> list:
    return [whole(f"{name}-{i}", num, gang=name, **kw) for i in range(n)]  # type: ignore[arg-type]


def test_a_gang_lands_whole_or_books_nothing() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    too_big = group_units(gang("g", 9), {"default/g": GangSpec("g", min_member=9)})[0]
    before = snap.version
    r = place_gang(profile(), too_big, snap)
    assert not r.scheduled and not snap.allocations and snap.version >= before
    assert "gang default/g waits as a unit (minMember 9): it needs 9 whole GPUs at once, 8 are free" in (
        r.status.message()
    )
    # min_member 6 of 9: 8 fit, the ninth stays pending, the gang runs
    r = place_gang(profile(), group_units(gang("g", 9), {"default/g": GangSpec("g", min_member=6)})[0], snap)
    assert r.scheduled and len(r.placed) == 8 and r.left_out == ("default/g-8",)


def test_a_gang_whose_gpus_add_up_but_not_on_its_nodes_is_undone() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    snap.assume(whole("x0"), 0, [0])
    snap.assume(whole("x1"), 1, [0])  # 6 GPUs free, 3 on each node
    books = sorted(snap.allocations)
    r = place_gang(
        profile(), group_units(gang("g", 3, num=2), {"default/g": GangSpec("g", min_member=3)})[0], snap
    )
    assert not r.scheduled and sorted(snap.allocations) == books
    assert "2 of at least 3 pods fit at once (of 3); pod default/g-2 does not fit" in r.status.message()
    assert "Insufficient GPU" in r.status.message()


def test_two_gangs_each_over_half_the_gpus_never_deadlock() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])  # 8 GPUs
    a, b = gang("a", 5), gang("b", 5)
    gangs = {"default/a": GangSpec("a", min_member=5), "default/b": GangSpec("b", min_member=5)}
    # their pods arrive interleaved; the cycle still takes each gang as one unit
    units = group_units([a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3], a[4], b[4]], gangs)
    out = run_cycle(profile(), snap, units)
    assert [o.outcome for o in out] == [Outcome.PLACED, Outcome.WAITING]
    assert "gang default/b waits as a unit (minMember 5)" in out[1].reason
    assert "it needs 5 whole GPUs at once, 3 are free" in out[1].reason
    assert partly_bound([al.pod for al in snap.allocations.values()], gangs) == []
    assert sorted(snap.allocations) == sorted(p.key for p in a)


def test_running_members_count_toward_the_minimum() -> None:
    units = group_units(gang("g", 2), {"default/g": GangSpec("g", min_member=4)}, running={"default/g": 2})
    assert units[0].need == 2
    with pytest.raises(InvalidGang, match="minMember 4 is larger than its 3 pod"):
        group_units(gang("g", 1), {"default/g": GangSpec("g", min_member=4)}, running={"default/g": 2})


def test_bad_gangs_name_the_field() -> None:
    with pytest.raises(InvalidGang, match="gang default/g: min_member must be an integer >= 1, got 0"):
        GangSpec("g", min_member=0)
    with pytest.raises(InvalidGang, match="timeout_s"):
        GangSpec("g", timeout_s=-1)
    with pytest.raises(InvalidGang, match="minMember 3 is larger than its 2 pod"):
        check_gang(GangSpec("g", min_member=3), 2)
    assert GangSpec("g", timeout_s=30).expired(100, 130) and not GangSpec("g", timeout_s=30).expired(100, 129)
    assert not GangSpec("g").expired(0, 10**9)


def test_units_follow_pending_order_of_their_most_urgent_pod() -> None:
    lone = whole("lone", priority=5)
    g = gang("g", 3, priority=10)
    units = group_units([lone, *g], {})
    assert [u.key for u in units] == ["default/g", "default/lone"] and units[0].need == 1


def test_preemption_takes_a_victims_whole_gang_or_another_victim() -> None:
    snap = ClusterState([node("n0", gpus=2), node("n1", gpus=2)])
    g = gang("g", 3, priority=0)
    snap.assume(g[0], 0, [0])
    snap.assume(g[1], 1, [0])
    snap.assume(g[2], 1, [1])
    single = whole("single", priority=0)
    snap.assume(single, 0, [1])
    prof = profile(preemption=True)
    # a gang member on n0 costs the whole gang (3 pods); the single pod on n0 costs one
    r = schedule_one(prof, whole("urgent", priority=100), snap)
    assert r.victims == ("default/single",)
    # two GPUs on one node: n0 needs g-0 (the whole gang goes) and single; n1 needs the gang alone
    r2 = schedule_one(prof, whole("urgent2", 2, priority=100), snap)
    assert sorted(r2.victims) == ["default/g-0", "default/g-1", "default/g-2"] and r2.nominated_node == 1
    # a gang with a member the preemptor may not evict is no victim at all
    snap.forget("default/g-2")
    snap.assume(whole("g-2", gang="g", priority=500), 1, [1])
    r3 = schedule_one(prof, whole("urgent3", 2, priority=100), snap)
    assert r3.victims == () and not r3.scheduled


def test_a_gang_larger_than_the_free_gpus_is_refused_before_any_member_is_tried() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    unit = group_units(gang("g", 3, num=3), {"default/g": GangSpec("g", min_member=3)})[0]
    r = place_gang(profile(), unit, snap)
    assert not r.scheduled and r.results == () and not snap.allocations
    assert "needs 9 whole GPUs at once, 8 are free" in r.status.message()
