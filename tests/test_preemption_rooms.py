"""Nominated pods' rooms (``core.statement.holding``, issue 28 F1): a preemptor's room is held for
it whether it fits there yet or not, so the GPUs its victims free one by one never go to pods of
lower priority (its victims' replacements), and a second preemptor does not evict for a room
that is already being made."""

from __future__ import annotations

from functools import partial
from random import Random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import builders
from builders import profile, schedule_with_nominated
from gpusched.core.cluster import ClusterState
from gpusched.core.model import PodSpec
from gpusched.core.scheduler import schedule_one
from gpusched.core.statement import holding, room_gpus
from test_core_properties import arrays, assert_arrays_equal, bf_fits

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

node = partial(builders.node, cpu=64_000, mem=1 << 18, gmem=0)
whole = partial(builders.whole, cpu=1000)


def f1_node() -> tuple[ClusterState, list[PodSpec]]:
    """Issue 28's reproduction: 8 GPUs, a priority-5000 pod on 3, five priority-10 pods on one each."""
    snap = ClusterState([node("n0", gpus=8)])
    snap.assume(whole("hi", 3, priority=5000), 0, (0, 1, 2))
    lows = [whole(f"low{i}", priority=10) for i in range(5)]
    for i, p in enumerate(lows):
        snap.assume(p, 0, (3 + i,))
    return snap, lows


def test_the_issue_28_room_is_held_while_its_victims_leave_one_by_one() -> None:
    snap, _ = f1_node()
    prof = profile(preemption=True)
    big = whole("big", 4, priority=100)
    r = schedule_one(prof, big, snap, assume=False)
    assert not r.scheduled and len(r.victims) == 4
    room = [(big, r.nominated_node)]
    for n, gone in enumerate(r.victims):
        snap.forget(gone)  # one victim gone: its GPU is free, the others still terminating
        again = whole(f"replacement{n}", priority=10)  # its ReplicaSet's replacement
        placed = schedule_with_nominated(prof, again, snap, room, leaving=r.victims)
        assert not placed.scheduled, f"the replacement took a GPU of the room after {n + 1} victim(s) left"
        assert placed.nominated_node == -1  # and it has no one to preempt
    assert schedule_one(prof, big, snap, assume=False).scheduled  # the preemptor's room is whole


def test_a_second_preemptor_does_not_evict_for_a_room_being_made() -> None:
    snap, _ = f1_node()
    prof = profile(preemption=True)
    first, second = whole("first", 4, priority=100), whole("second", 4, priority=100)
    r1 = schedule_one(prof, first, snap, assume=False)
    assert len(r1.victims) == 4
    r2 = schedule_with_nominated(prof, second, snap, [(first, 0)], leaving=r1.victims)
    assert not r2.scheduled and r2.victims == () and r2.nominated_node == -1
    # a higher priority still may take the room (kube-scheduler: rooms bind lower priorities only)
    r3 = schedule_with_nominated(prof, whole("third", 4, priority=1000), snap, [(first, 0)])
    assert len(r3.victims) == 4


def test_a_room_takes_free_gpus_first_then_its_victims_then_other_lower_priority_gpus() -> None:
    snap, lows = f1_node()
    snap.forget(lows[4].key)  # GPU 7 free
    big = whole("big", 4, priority=100)
    got = room_gpus(snap, big, 0, leaving={lows[1].key, lows[2].key})
    assert set(got) == {7, 4, 5, 3}  # free 7, leaving 4 and 5, then lower-priority 3 (not 0..2)
    got = room_gpus(snap, whole("mid", 4, priority=7), 0)  # nothing on the node is lower
    assert 7 in got
    # it fits now: exactly what pick_gpus gives
    snap2 = ClusterState([node("n0", gpus=2)])
    assert room_gpus(snap2, whole("x", 1), 0) == (0,)


def test_holding_leaves_the_snapshot_exactly_as_it_was() -> None:
    snap, _ = f1_node()
    before, allocs = arrays(snap), dict(snap.allocations)
    rooms = [(whole("big", 4, priority=100), 0), (whole("low", 1, priority=1), 0), (whole("far", 1), 5)]
    with holding(snap, rooms, 10, skip=("default/nobody",)) as held:
        assert held == 1  # the 1-priority room is below 10; node 5 does not exist
        assert snap.cpu_free[0] < before["cpu_free"][0]
        assert (snap.gpu_free[0] < 0).sum() == 4 - 0  # overbooked: the victims still hold them
    assert_arrays_equal(snap, before, "after holding")
    assert snap.allocations == allocs


def gpu_pod(name: str, kind: int, prio: int, cpu: int) -> PodSpec:
    """kind 0..3: a share of 300 or 600 milli, 1 or 2 whole GPUs (4, 8 for preemptors)."""
    if kind < 2:
        return builders.share(name, (300, 600)[kind], cpu=cpu, priority=prio)
    return whole(name, (1, 2, 4, 8)[kind - 2], cpu=cpu, priority=prio)


@st.composite
def full_clusters(draw: st.DrawFn) -> tuple[ClusterState, list[PodSpec]]:
    """1 to 3 nodes of 2..8 GPUs, filled by pods of mixed priorities (most below 1000), and the
    pods that would arrive later (replacements and others, all below 1000)."""
    nodes = [
        builders.node(
            f"n{i}", gpus=draw(st.sampled_from((2, 4, 8))), cpu=draw(st.sampled_from((8000, 64_000)))
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    snap = ClusterState(nodes)
    prof = profile()
    for i in range(draw(st.integers(1, 24))):
        p = gpu_pod(f"r{i}", draw(st.integers(0, 3)), draw(st.sampled_from((0, 10, 100, 5000))), 1000)
        got = schedule_one(prof, p, snap, assume=False)
        if got.scheduled:
            snap.assume(p, got.node, got.gpus)
    later = [
        gpu_pod(
            f"a{i}",
            draw(st.integers(0, 3)),
            draw(st.sampled_from((0, 10, 100))),
            draw(st.sampled_from((0, 2000))),
        )
        for i in range(draw(st.integers(0, 10)))
    ]
    return snap, later


@PROPS
@given(
    world=full_clusters(),
    kind=st.integers(0, 5),
    order=st.randoms(use_true_random=False),
)
def test_a_room_being_freed_is_never_given_to_pods_of_lower_priority(
    world: tuple[ClusterState, list[PodSpec]], kind: int, order: Random
) -> None:
    """A preemptor evicts its victims; they leave one by one in any order while pods of lower
    priority keep arriving (its victims' replacements, others): whatever is placed, once every
    victim is gone the preemptor fits on its nominated node."""
    snap, queue = world
    prof = profile(preemption=True)
    place = profile()
    pre = (
        gpu_pod("preemptor", kind, 1000, 2000)
        if kind < 4
        else whole("preemptor", 4 * (kind - 3), priority=1000)
    )
    r = schedule_one(prof, pre, snap, assume=False)
    if r.scheduled or not r.victims:
        event("no preemption")
        return
    event("preempts")
    room = [(pre, r.nominated_node)]
    victims = list(r.victims)
    order.shuffle(victims)
    placed = 0
    for k, gone in enumerate(victims):
        snap.forget(gone)
        for p in queue[k :: len(victims)]:  # some arrive after each departure
            got = schedule_with_nominated(place, p, snap, room, leaving=victims[k + 1 :])
            if got.scheduled:
                snap.assume(p, got.node, got.gpus)
                placed += 1
    event("lower-priority pods placed meanwhile" if placed else "none placed")
    assert bf_fits(snap, pre, r.nominated_node), "a pod of lower priority took the preemptor's room"
