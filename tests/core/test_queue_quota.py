"""Tenant queues: validation that names the field, admission within quota, borrowing up to the
borrowing limit, lending limits, per-model quota, status, DRF order, water filling, reclaim."""

from __future__ import annotations

from fractions import Fraction

import pytest

from builders import node, profile, whole
from gpusched.core.batch import Outcome, run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.gang import GangSpec, group_units
from gpusched.core.model import PodSpec
from gpusched.core.queues import (
    InvalidQueue,
    QueueBook,
    QueueSpec,
    QueueTree,
    Quota,
    charge_of,
    plan_reclaim,
    queue_statuses,
)
from gpusched.core.queues.fairshare import dominant_share, water_fill


def tree(a: dict | None = None, b: dict | None = None, c: dict | None = None) -> QueueTree:
    return QueueTree([
        QueueSpec("root"),
        QueueSpec("A", "root", Quota(gpus=4), **(a or {})),
        QueueSpec("B", "root", Quota(gpus=4), **(b or {})),
        QueueSpec("C", "root", Quota(gpus=0), **(c or {})),
    ])


def gpus(n: int) -> object:
    return charge_of(whole("x", n))


def test_validation_names_the_queue_and_field() -> None:
    with pytest.raises(InvalidQueue, match=r"queue A: nominal.gpus must be a non-negative integer, got -1"):
        QueueSpec("A", nominal=Quota(gpus=-1))
    with pytest.raises(InvalidQueue, match=r"queue A: borrowingLimit.gpu_memory_mib"):
        QueueSpec("A", borrowing_limit=Quota(gpu_memory_mib=-5))
    with pytest.raises(InvalidQueue, match="queue A: parent 'nope' is not a known queue"):
        QueueTree([QueueSpec("A", "nope")])
    with pytest.raises(InvalidQueue, match="parent cycle"):
        QueueTree([QueueSpec("a", "b"), QueueSpec("b", "c"), QueueSpec("c", "a")])
    with pytest.raises(InvalidQueue, match="queue A: defined twice"):
        QueueTree([QueueSpec("A"), QueueSpec("A")])
    with pytest.raises(InvalidQueue, match="weight must be a positive integer"):
        QueueSpec("A", weight=0)
    t = tree()
    with pytest.raises(InvalidQueue, match="pod ns/p: queue 'zzz' is not a known queue"):
        t.leaf("zzz", who="pod ns/p")
    with pytest.raises(InvalidQueue, match="has child queues"):
        t.leaf("root")


def test_a_queue_borrows_idle_quota_up_to_its_borrowing_limit() -> None:
    book = QueueBook(tree(b={"borrowing_limit": Quota(gpus=2)}))
    for i in range(6):
        assert book.check("B", gpus(1)).ok
        book.charge(f"b{i}", "B", gpus(1))
    v = book.check("B", gpus(1))
    assert not v.ok and v.queue == "B" and "over its borrowingLimit 2" in v.reason
    # A uses its own quota whatever B borrowed: 2 left idle in the cohort
    assert book.check("A", gpus(2)).ok and not book.check("A", gpus(3)).ok
    assert book.borrowed("B")[next(iter(book.borrowed("B")))] == 2
    assert book.violations() == []


def test_lending_limit_keeps_part_of_a_quota_for_its_owner() -> None:
    book = QueueBook(tree(a={"lending_limit": Quota(gpus=1)}))
    # the pool B can borrow from: A lends 1, C has none; B has 4 of its own
    assert book.check("B", gpus(5)).ok and not book.check("B", gpus(6)).ok
    book.charge("b", "B", gpus(5))
    # A keeps 3 guaranteed though B borrowed its 1 lendable GPU
    assert book.check("A", gpus(3)).ok and not book.check("A", gpus(4)).ok


def test_hierarchy_pools_children_and_the_root_caps_everything() -> None:
    t = QueueTree([
        QueueSpec("root", nominal=Quota(gpus=2)),
        QueueSpec("research", "root", Quota(gpus=4), lending_limit=Quota(gpus=0)),
        QueueSpec("r1", "research", Quota(gpus=1)),
        QueueSpec("r2", "research", Quota(gpus=1)),
        QueueSpec("prod", "root", Quota(gpus=4)),
    ])
    book = QueueBook(t)
    # r1 may use r2's idle quota, research's own 4 and the root's 2, prod's 4: 12 in all
    assert book.check("r1", gpus(12)).ok and not book.check("r1", gpus(13)).ok
    book.charge("p", "prod", gpus(4))
    assert book.check("r1", gpus(8)).ok and not book.check("r1", gpus(9)).ok
    # research lends nothing: prod borrows only the root's 2
    book.release("p")
    assert book.check("prod", gpus(6)).ok and not book.check("prod", gpus(7)).ok
    assert [s.name for s in queue_statuses(book, {"r1": 2})][:2] == ["prod", "r1"]
    assert {s.name: s.pending for s in queue_statuses(book, {"r1": 2})}["research"] == 2


def test_per_model_quota_limits_pods_that_land_on_that_model() -> None:
    t = QueueTree([QueueSpec("A", nominal=Quota(gpus=8), per_model={"H100": Quota(gpus=1)})])
    book = QueueBook(t)
    snap = ClusterState([node("h", gpus=4, model="H100"), node("a", gpus=4, model="A100")])
    pods = [whole(f"p{i}", queue="A", gpu_models=frozenset({"H100"})) for i in range(2)]
    out = run_cycle(profile(), snap, group_units(pods, {}), book=book)
    assert [o.outcome for o in out] == [Outcome.PLACED, Outcome.WAITING]
    assert "gpus[H100] would be 2 of 1" in out[1].reason and len(snap.allocations) == 1


def test_pods_of_unknown_queues_wait_with_the_reason_and_nothing_is_bound() -> None:
    snap = ClusterState([node("n", gpus=4)])
    out = run_cycle(profile(), snap, group_units([whole("p", queue="ghost")], {}), book=QueueBook(tree()))
    assert out[0].outcome is Outcome.WAITING and "queue 'ghost' is not a known queue" in out[0].reason
    assert not snap.allocations


def test_dominant_share_is_weighted_and_zero_within_quota() -> None:
    t = QueueTree([
        QueueSpec("root"),
        QueueSpec("A", "root", Quota(gpus=4, gpu_memory_mib=40_000), weight=2),
        QueueSpec("B", "root", Quota(gpus=4, gpu_memory_mib=40_000)),
    ])
    book = QueueBook(t)
    mem_heavy = charge_of(PodSpec("m", num_gpu=1, gpu_milli=500, gpu_memory_mib=30_000))
    assert dominant_share(book, "A", gpus(4)) == 0
    # A: 2 GPUs over 8 (weight 2) -> 1/8; B: memory 30000+... over -> dominant on memory
    assert dominant_share(book, "A", gpus(6)) == Fraction(2, 8) / 2
    book.charge("m1", "B", mem_heavy)
    assert dominant_share(book, "B", mem_heavy) == Fraction(20_000, 80_000)


def test_water_fill_gives_guarantees_then_surplus_by_weight() -> None:
    got = water_fill(12, {"a": 10, "b": 10, "c": 1}, {"a": 2, "b": 2, "c": 2}, {"a": 2, "b": 1, "c": 1})
    assert got["c"] == 1 and sum(got.values()) == 12 and got["a"] > got["b"]
    assert water_fill(5, {"a": 1, "b": 1}, {}, {}) == {"a": 1, "b": 1}


def test_reclaim_evicts_borrowers_lowest_priority_and_whole_gangs_only() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])  # 8 GPUs
    book = QueueBook(tree())
    prof = profile()
    bpods = [whole(f"b{i}", queue="B", priority=10) for i in range(4)]  # within B's quota
    gang = [whole(f"g{i}", queue="B", gang="g", priority=1) for i in range(2)]
    low = [whole(f"l{i}", queue="B", priority=0) for i in range(2)]
    units = group_units([*bpods, *gang, *low], {"default/g": GangSpec("g", min_member=2)})
    assert all(o.outcome is Outcome.PLACED for o in run_cycle(prof, snap, units, book=book))
    # A needs 3 of its own 4 GPUs back: the priority-0 pods go first, then the gang whole; the
    # trim then spares a priority-0 pod the gang's two GPUs make unnecessary
    ask = group_units([whole(f"a{i}", queue="A", namespace="a") for i in range(3)], {})
    # one unit per pod: the first needs one victim (the lowest priority one)
    plan = plan_reclaim(prof, snap, book, ask[0])
    assert plan.victims == ("default/l0",) or plan.victims == ("default/l1",)
    a_gang = group_units(
        [whole(f"a{i}", queue="A", namespace="a", gang="ja") for i in range(3)],
        {"a/ja": GangSpec("ja", "a", min_member=3)},
    )[0]
    plan = plan_reclaim(prof, snap, book, a_gang)
    assert len(plan.victims) == 3 and {"default/g0", "default/g1"} <= set(plan.victims)
    # B back at its quota (4): nothing more to reclaim from it
    for k in plan.victims:
        snap.forget(k)
        book.release(k)
    more = group_units([whole(f"z{i}", queue="A", namespace="a") for i in range(5)], {})
    out = run_cycle(prof, snap, more, book=book, evict_now=True)
    assert [o.outcome for o in out].count(Outcome.PLACED) == 4
    assert all("default/b" not in v for o in out for v in o.victims)


class _NoneAllowed:
    """A budget over pods labelled app=keep allowing no disruption."""

    def split(self, pods):  # type: ignore[no-untyped-def]
        bad = [p for p in pods if p.labels.get("app") == "keep"]
        return bad, [p for p in pods if p not in bad]


def test_reclaim_prefers_victims_no_budget_protects() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    book = QueueBook(tree())
    prof = profile()
    kept = [whole(f"k{i}", queue="B", labels={"app": "keep"}) for i in range(6)]
    other = [whole(f"o{i}", queue="B", priority=5) for i in range(2)]
    run_cycle(prof, snap, group_units([*kept, *other], {}), book=book)
    unit = group_units([whole("a", queue="A", namespace="a")], {})[0]
    # without budgets the lowest priority pod goes; with them, a higher-priority one no budget covers
    assert plan_reclaim(prof, snap, book, unit).victims[0].startswith("default/k")
    plan = plan_reclaim(prof, snap, book, unit, budgets=_NoneAllowed())
    assert plan.victims[0].startswith("default/o") and plan.budget_violations == 0
