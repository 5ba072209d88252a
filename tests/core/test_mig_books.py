"""MIG slices in the scheduler's books (issue 31 item 1): a request takes a present, free instance chosen by
the MIG fragmentation measure; bookings never overlap within a GPU; booking and unbooking restore the books;
bad input is named and books nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import profile
from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.errors import InvalidSpec
from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.mig.geometry import Geometry, Instance, MigGpu
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code

A100 = Geometry.of("a100-80gb")
MIXED = (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 4), ("1g.10gb", 6))


def gpu(name: str, layout: tuple[tuple[str, int], ...], geom: Geometry = A100) -> MigGpu:
    g = MigGpu(name, geom)
    for p, s in layout:
        g = g.place(p, s)
    return g


def mig_node(name: str, *layouts: tuple[tuple[str, int], ...], model: str = "a100-80gb") -> NodeSpec:
    geom = Geometry.of(model)
    gpus = tuple(gpu(f"{name}/{i}", lay, geom) for i, lay in enumerate(layouts))
    counts: dict[str, int] = {}
    for lay in layouts:
        for p, _s in lay:
            res = "nvidia.com/mig-" + p.replace("+", ".")
            counts[res] = counts.get(res, 0) + 1
    return NodeSpec(name, 64000, 256000, extended=counts, mig=NodeMig(gpus, tuple(range(len(layouts)))))


def mig_pod(name: str, *profiles: str, counts: bool = True) -> PodSpec:
    ext: dict[str, int] = {}
    for p in profiles if counts else ():
        res = "nvidia.com/mig-" + p.replace("+", ".")
        ext[res] = ext.get(res, 0) + 1
    return PodSpec(name, cpu_milli=100, mig=tuple(sorted(profiles)), extended=ext)


def spans(books: dict[int, MigGpu]) -> dict[int, list[set[int]]]:
    return {
        i: [set(range(x.start, x.start + g.geometry.kind(x.profile).mem_slices)) for x in g.instances]
        for i, g in books.items()
    }


# ------------------------------------------------------------------------------------ placement by measure
def test_a_slice_goes_where_the_fragmentation_measure_grows_least() -> None:
    """Booked 2g at 0; a 1g at slice 2 would leave the 2g start 2 unusable (F +1), at slice 6 it does not
    (F -1): the measure takes slice 6 where first-fit by start would take 2."""
    snap = ClusterState([mig_node("n", MIXED)])
    snap.assume(mig_pod("a", "2g.20gb"), 0, (), mig=(MigSlot(0, 0, "2g.20gb"),))
    b = snap.assume(mig_pod("b", "1g.10gb"), 0, ())
    assert b.mig == (MigSlot(0, 6, "1g.10gb"),)
    assert snap.verify() == []


def test_the_scheduler_places_books_and_names_the_slice() -> None:
    """Through a whole scheduling cycle: the node with a free instance of the profile is chosen and the
    allocation names GPU and start; when none is left anywhere, the reason says so."""
    snap = ClusterState([mig_node("a", (("3g.40gb", 4), ("4g.40gb", 0))), mig_node("b", (("7g.80gb", 0),))])
    prof = profile()
    r = schedule_one(prof, mig_pod("p1", "3g.40gb"), snap)
    assert r.scheduled and r.node_name == "a"
    assert snap.allocations["default/p1"].mig == (MigSlot(0, 4, "3g.40gb"),)
    r = schedule_one(prof, mig_pod("p2", "3g.40gb"), snap)
    assert not r.scheduled and r.status.code is Code.UNSCHEDULABLE
    assert "1 no free MIG instance for 3g.40gb" in r.status.message()
    assert "1 too few MIG 3g.40gb instances present (0 < 1)" in r.status.message()
    assert "default/p2" not in snap.allocations and snap.verify() == []


def test_free_count_but_no_free_instance_of_that_geometry_is_told_apart() -> None:
    """The node's counts say one 1g is free, but the books hold it: the MIG reason, not a count."""
    node = mig_node("n", (("1g.10gb", 0), ("1g.10gb", 1)))
    node = NodeSpec(
        node.name, node.cpu_milli, node.memory_mib, extended={"nvidia.com/mig-1g.10gb": 3}, mig=node.mig
    )
    snap = ClusterState([node])
    snap.assume(mig_pod("a", "1g.10gb", "1g.10gb"), 0, ())
    r = schedule_one(profile(), mig_pod("b", "1g.10gb"), snap)
    assert not r.scheduled
    assert "no free MIG instance for 1g.10gb" in r.status.message()


# ------------------------------------------------------------------------------------------------ bad input
def test_unknown_profile_is_refused_by_the_spec() -> None:
    with pytest.raises(InvalidSpec, match=r"unknown MIG profile '3g\.41gb'"):
        mig_pod("x", "3g.41gb")


def test_a_slice_and_a_whole_gpu_in_one_pod_are_refused() -> None:
    with pytest.raises(InvalidSpec, match=r"both a MIG slice \(1g\.10gb\) and a whole GPU"):
        PodSpec("x", num_gpu=1, gpu_milli=1000, mig=("1g.10gb",))


def test_a_profile_the_gpu_model_lacks_is_unresolvable_and_named() -> None:
    snap = ClusterState([mig_node("n", (("7g.80gb", 0),))])
    r = schedule_one(profile(), mig_pod("x", "1g.5gb"), snap)
    assert not r.scheduled and r.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "GPU model (a100-80gb) has no MIG profile 1g.5gb" in r.status.message()
    assert snap.allocations == {} and snap.verify() == []


def test_slices_that_are_not_present_or_held_are_refused_and_nothing_is_booked() -> None:
    snap = ClusterState([mig_node("n", MIXED)])
    snap.assume(mig_pod("a", "1g.10gb"), 0, (), mig=(MigSlot(0, 2, "1g.10gb"),))
    before = (dict(snap.mig_books[0]), dict(snap.mig_demand))
    with pytest.raises(AccountingError, match="already held"):
        snap.assume(mig_pod("b", "1g.10gb"), 0, (), mig=(MigSlot(0, 2, "1g.10gb"),))
    with pytest.raises(AccountingError, match=r"no MIG 1g\.10gb instance at slice 5"):
        snap.assume(mig_pod("b", "1g.10gb"), 0, (), mig=(MigSlot(0, 5, "1g.10gb"),))
    with pytest.raises(AccountingError, match="no MIG GPU 3"):
        snap.assume(mig_pod("b", "1g.10gb"), 0, (), mig=(MigSlot(3, 2, "1g.10gb"),))
    with pytest.raises(AccountingError, match="already assumed"):
        snap.assume(mig_pod("a", "1g.10gb"), 0, ())
    assert (dict(snap.mig_books[0]), dict(snap.mig_demand)) == before
    assert list(snap.allocations) == ["default/a"] and snap.verify() == []


def test_a_running_pod_is_booked_as_a_fact_without_double_booking() -> None:
    """check=False (a pod the API shows running): the slice already held is skipped, not booked twice."""
    snap = ClusterState([mig_node("n", MIXED)])
    snap.assume(mig_pod("a", "1g.10gb"), 0, (), mig=(MigSlot(0, 2, "1g.10gb"),))
    b = snap.assume(mig_pod("b", "1g.10gb"), 0, (), mig=(MigSlot(0, 2, "1g.10gb"),), check=False)
    assert b.mig == () and snap.verify() == []


# ------------------------------------------------------------------------------------------------ properties
LAYOUTS = (
    (("3g.40gb", 0), ("3g.40gb", 4)),
    (("4g.40gb", 0), ("3g.40gb", 4)),
    MIXED,
    tuple(("1g.10gb", s) for s in range(7)),
    (("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)),
    (("7g.80gb", 0),),
    (("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)),
)
PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@settings(max_examples=60, deadline=None)
@given(
    layouts=st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=3),
    ops=st.lists(
        st.tuples(st.booleans(), st.lists(st.sampled_from(PROFILES), min_size=1, max_size=3)), max_size=25
    ),
)
def test_slices_never_overlap_and_unbooking_restores_the_books(
    layouts: list[tuple[tuple[str, int], ...]], ops: list[tuple[bool, list[str]]]
) -> None:
    node = mig_node("n", *layouts)
    node = NodeSpec("n", node.cpu_milli, node.memory_mib, mig=node.mig)  # counts left out: MIG books alone
    assert node.mig is not None
    snap = ClusterState([node])
    empty = [{i: frozenset(g.instances) for i, g in b.items()} for b in snap.mig_books]
    live: list[str] = []
    for k, (add, profiles) in enumerate(ops):
        if add or not live:
            pod = mig_pod(f"p{k}", *profiles, counts=False)
            books_before = {i: g.instances for i, g in snap.mig_books[0].items()}
            sets_before = {i: frozenset(g.instances) for i, g in snap.mig_books[0].items()}
            demand_before = +snap.mig_demand
            fits = snap.mig_fits(pod, 0)  # the filter's count check and the placement agree
            try:
                a = snap.assume(pod, 0, ())
            except AccountingError:
                assert not fits
                assert {i: g.instances for i, g in snap.mig_books[0].items()} == books_before
                continue
            assert fits
            live.append(pod.key)
            for sl in a.mig:  # every slice is a present instance of its profile
                g = node.mig.gpu(sl.gpu)
                assert g is not None and Instance(sl.profile, sl.start) in g.instances
            copy = snap.copy()  # booking then unbooking restores the books (on a copy: snap goes on)
            copy.forget(pod.key)
            assert {i: frozenset(g.instances) for i, g in copy.mig_books[0].items()} == sets_before
            assert +copy.mig_demand == demand_before
            assert sum(len(g.instances) for g in snap.mig_books[0].values()) == sum(
                len(g.instances) for g in copy.mig_books[0].values()
            ) + len(pod.mig)
        else:
            snap.forget(live.pop(k % len(live)))
        for per_gpu in spans(snap.mig_books[0]).values():  # no two booked slices overlap within a GPU
            seen: set[int] = set()
            for s in per_gpu:
                assert not (s & seen)
                seen |= s
        assert snap.verify() == []
        held = [sl for key in live for sl in snap.allocations[key].mig]
        assert len(held) == len(set(held))  # no instance is booked twice
    for key in live:
        snap.forget(key)
    assert [{i: frozenset(g.instances) for i, g in b.items()} for b in snap.mig_books] == empty
    assert +snap.mig_demand == {}


def test_a_statement_discarded_after_an_eviction_puts_the_slice_back_where_it_was() -> None:
    """A gang's statement evicts a MIG pod and books another on its slice, then is discarded: the victim
    is booked again at its own slice (not wherever the measure would put it now)."""
    from gpusched.core.statement import Statement

    snap = ClusterState([mig_node("n", (("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2)))])
    snap.assume(mig_pod("victim", "1g.10gb"), 0, (), mig=(MigSlot(0, 2, "1g.10gb"),))
    st = Statement(snap)
    st.evict("default/victim")
    st.assume(mig_pod("a", "1g.10gb"), 0, ())
    st.discard()
    assert snap.allocations["default/victim"].mig == (MigSlot(0, 2, "1g.10gb"),)
    assert snap.verify() == []


def test_a_fact_with_no_free_instance_is_booked_by_count_and_never_raises() -> None:
    """check=False, no slices given (a running pod the books cannot place): counted, no slice, no error."""
    snap = ClusterState([mig_node("n", (("7g.80gb", 0),))])
    snap.assume(mig_pod("a", "7g.80gb"), 0, ())
    b = snap.assume(mig_pod("b", "7g.80gb"), 0, (), check=False)
    assert b.mig == () and "default/b" in snap.allocations
    assert snap.verify() == ["extended resources overcommitted"]  # the count shows it; MIG books agree


def test_a_slice_held_on_a_gpu_being_recut_takes_no_free_instance_of_another() -> None:
    """GPU 1 is being re-cut while a pod keeps its 3g there: GPU 0's 3g is still free."""
    snap = ClusterState([recutting_node()])
    snap.assume(mig_pod("runs", "3g.40gb"), 0, (), mig=(MigSlot(1, 4, "3g.40gb"),))
    assert snap.mig_fits(mig_pod("new", "3g.40gb"), 0) and snap.verify() == []
    assert snap.assume(mig_pod("new", "3g.40gb"), 0, ()).mig == (MigSlot(0, 4, "3g.40gb"),)
    snap.forget("default/runs")
    assert snap.verify() == []


def recutting_node() -> NodeSpec:
    """Two A100s with a 3g at slice 4 each; GPU 1 is being re-cut."""
    node = mig_node("n", (("3g.40gb", 4),), (("3g.40gb", 4),))
    assert node.mig is not None
    return replace(node, mig=replace(node.mig, reshaping=frozenset({1})))


# ------------------------------------------------------------------------------------ preemption's what-if
def test_preemptions_reprieve_gives_a_victim_back_exactly_its_slices() -> None:
    """GPU 1 is being re-cut (its free slices only: a pod keeps running there). Low-priority v1 holds
    GPU 1's 3g, v0 GPU 0's; an urgent 3g pod can land only on GPU 0. Reprieving v1 must give it back
    GPU 1's 3g; placed by the measure instead, it would take GPU 0's (the only one free to place on) and
    be evicted for nothing."""
    snap = ClusterState([recutting_node()])
    snap.assume(replace(mig_pod("v0", "3g.40gb"), priority=1), 0, (), mig=(MigSlot(0, 4, "3g.40gb"),))
    snap.assume(replace(mig_pod("v1", "3g.40gb"), priority=2), 0, (), mig=(MigSlot(1, 4, "3g.40gb"),))
    r = schedule_one(profile(preemption=True), replace(mig_pod("urgent", "3g.40gb"), priority=100), snap)
    assert not r.scheduled and r.victims == ("default/v0",)
    assert snap.allocations["default/v1"].mig == (MigSlot(1, 4, "3g.40gb"),) and snap.verify() == []
