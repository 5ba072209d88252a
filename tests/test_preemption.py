"""DefaultPreemption (PostFilter): victims, their minimality, the node chosen, and a snapshot left alone."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import builders
from builders import profile, share
from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.model import GPU_MILLI, PodSpec, Taint
from gpusched.core.plugins.preemption import DefaultPreemption
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code
from test_core_properties import Scenario, arrays, assert_arrays_equal, bf_fits, play, pods, scenarios

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


node = partial(builders.node, gpus=2, cpu=64_000, mem=1 << 18, gmem=0)
whole = partial(builders.whole, cpu=1000, memory_mib=1024)


def fill(snap: ClusterState, placed: list[tuple[PodSpec, int, tuple[int, ...]]]) -> None:
    for p, n, g in placed:
        snap.assume(p, n, g)


def test_evicts_the_fewest_least_important_pods() -> None:
    snap = ClusterState([node("n0"), node("n1")])
    # n0: two priority-0 pods; n1: one priority-50, one priority-0
    low_a, low_b, mid_a, low_c = (
        whole(n, priority=p) for n, p in (("low-a", 0), ("low-b", 0), ("mid-a", 50), ("low-c", 0))
    )
    fill(snap, [(low_a, 0, (0,)), (low_b, 0, (1,)), (mid_a, 1, (0,)), (low_c, 1, (1,))])
    prof = profile(preemption=True)
    r = schedule_one(prof, whole("urgent", priority=100), snap)
    assert not r.scheduled and r.status.code == Code.UNSCHEDULABLE
    # one priority-0 victim frees a GPU on either node (n1: low-c; n0: low-a is reprieved
    # first, by name, and stays, so low-b goes); everything else ties, so the lower index wins
    assert r.nominated_node == 0 and r.victims == ("default/low-b",)
    two = schedule_one(prof, whole("urgent2", priority=100, num=2), snap)
    # two GPUs: n0 costs two priority-0 pods, n1 costs a priority-50 pod: n0 (lower highest priority)
    assert two.nominated_node == 0 and sorted(two.victims) == ["default/low-a", "default/low-b"]


def test_preemption_policy_never_waits_instead() -> None:
    snap = ClusterState([node("n0", gpus=1)])
    fill(snap, [(whole("low", priority=0), 0, (0,))])
    polite = replace(whole("polite", priority=100), preemption_policy="Never")
    r = schedule_one(profile(preemption=True), polite, snap)
    assert not r.scheduled and r.victims == () and r.nominated_node == -1
    assert schedule_one(profile(preemption=True), whole("urgent", priority=100), snap).victims == (
        "default/low",
    )
    with pytest.raises(
        ValueError, match="preemptionPolicy 'Sometimes' is not one of PreemptLowerPriority, Never"
    ):
        replace(polite, preemption_policy="Sometimes")


def test_never_evicts_equal_or_higher_priority_and_respects_unresolvable_nodes() -> None:
    taint = Taint("dedicated", "x", "NoSchedule")
    snap = ClusterState([node("tainted", taints=(taint,)), node("n1")])
    fill(snap, [
        (whole("low-t0", priority=0), 0, (0,)), (whole("low-t1", priority=0), 0, (1,)),
        (whole("peer", priority=100), 1, (0,)), (whole("boss", priority=200), 1, (1,)),
    ])  # fmt: skip
    r = schedule_one(profile(preemption=True), whole("urgent", priority=100), snap)
    assert not r.scheduled and r.nominated_node == -1 and r.victims == ()
    assert snap.verify() == [] and len(snap.allocations) == 4


def test_cpu_only_victims_do_not_count_when_gpus_are_the_problem() -> None:
    snap = ClusterState([node("n0", gpus=1, cpu=8000)])
    fill(
        snap,
        [(whole("gpu-low", priority=0), 0, (0,)), (PodSpec("cpu-low", cpu_milli=4000, memory_mib=10), 0, ())],
    )
    r = schedule_one(profile(preemption=True), whole("urgent", priority=10, cpu=2000), snap)
    assert r.victims == ("default/gpu-low",)  # the CPU-only pod is reprieved: evicting it frees no GPU


def test_share_preemption_picks_the_share_that_frees_enough() -> None:
    snap = ClusterState([node("n0", gpus=1)])
    fill(
        snap,
        [
            (share("s300", 300, 1000, memory_mib=100), 0, (0,)),
            (share("s500", 500, 1000, memory_mib=100), 0, (0,)),
        ],
    )
    r = schedule_one(profile(preemption=True), share("want600", 600, 1000, memory_mib=100, priority=10), snap)
    # reprieve order: smallest GPU demand first (s300 stays), so only s500 goes: 200 + 500 = 700 free
    assert r.nominated_node == 0 and r.victims == ("default/s500",)


def test_constructor_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="min_candidates"):
        DefaultPreemption((), min_candidates=0)
    with pytest.raises(ValueError, match="candidate_pct"):
        DefaultPreemption((), candidate_pct=0)


@st.composite
def prioritised(draw: st.DrawFn) -> Scenario:
    sc = draw(scenarios(max_events=24, plain=True))
    events = [
        (k, replace(p, priority=draw(st.sampled_from((0, 0, 10, 100)))) if isinstance(p, PodSpec) else p)
        for k, p in sc.events
    ]
    return Scenario(sc.nodes, events, sc.tiebreak)


@PROPS
@given(sc=prioritised(), pod=pods(900, plain=True), prio=st.sampled_from((10, 100, 1000)))
def test_preemption_properties(sc: Scenario, pod: PodSpec, prio: int) -> None:
    prof = profile("bestfit", sc.pods, preemption=True)
    snap = play(prof, sc)
    pod = replace(pod, priority=prio)
    before_arrays, before_allocs = arrays(snap), dict(snap.allocations)
    r = schedule_one(prof, pod, snap, assume=False)
    assert_arrays_equal(snap, before_arrays, "after preemption")  # the decision books nothing
    assert snap.allocations == before_allocs
    event("scheduled" if r.scheduled else ("preempts" if r.nominated_node >= 0 else "no victims help"))
    if r.scheduled:
        return
    if r.nominated_node < 0:
        # complete: on no node does evicting every lower-priority pod make room
        for n in range(len(snap)):
            probe = snap.copy()
            for key in list(probe.node_pods[n]):
                if probe.allocations[key].pod.priority < prio:
                    probe.forget(key)
            assert not bf_fits(probe, pod, n), f"node {n} would fit after evicting lower-priority pods"
        return
    n = r.nominated_node
    victims = [snap.allocations[k] for k in r.victims]
    assert victims and all(v.node == n and v.pod.priority < prio for v in victims)
    after = snap.copy()
    for v in victims:
        after.forget(v.pod.key)
    assert bf_fits(after, pod, n)  # the victims make room on the nominated node
    for v in victims:  # minimal: putting any single victim back leaves no room
        again = after.copy()
        again.assume(v.pod, v.node, v.gpus)
        assert not bf_fits(again, pod, n), f"{v.pod.key} did not need to go"
    placed = schedule_one(prof, pod, after)
    assert placed.scheduled  # and the scheduler then places it (on n or a node at least as good)


@PROPS
@given(
    sc=prioritised(),
    pod=pods(900, plain=True),
    prio=st.sampled_from((0, 10, 100)),
    noms=st.lists(st.tuples(pods(950, plain=True), st.integers(0, 7), st.sampled_from((0, 10, 100, 1000))),
                  max_size=3),
    twin=st.sampled_from((None, 0, 1000)),
)  # fmt: skip
def test_nominated_pods_keep_their_room(
    sc: Scenario, pod: PodSpec, prio: int, noms: list[tuple[PodSpec, int, int]], twin: int | None
) -> None:
    from builders import schedule_with_nominated
    from gpusched.core.devices import pick_gpus

    prof = profile("bestfit", sc.pods, preemption=True)
    snap = play(prof, sc)
    pod = replace(pod, priority=prio)
    nominated = [
        (replace(p, name=f"nom{i}", priority=pr), n % len(snap)) for i, (p, n, pr) in enumerate(noms)
    ]
    first_choice = schedule_one(prof, pod, snap.copy())
    if twin is not None and first_choice.scheduled:  # a pod just like it, nominated where it would go
        nominated.append((replace(pod, name="twin", priority=twin), first_choice.node))
    before_arrays, before_allocs = arrays(snap), dict(snap.allocations)
    r = schedule_with_nominated(prof, pod, snap, nominated)
    assert_arrays_equal(snap, before_arrays, "after scheduling with nominated pods")
    assert snap.allocations == before_allocs
    plain = schedule_one(prof, pod, snap.copy())
    if not any(p.priority >= prio for p, _ in nominated):
        assert (r.node, r.gpus) == (plain.node, plain.gpus)
    event("nominated pods changed the decision" if (r.node, r.gpus) != (plain.node, plain.gpus) else "same")
    if not r.scheduled:
        return
    # the nominated pods of at least the pod's priority that fitted before, in order, still fit
    with_pod, without = snap.copy(), snap.copy()
    with_pod.assume(pod, r.node, r.gpus)
    for p, n in nominated:
        if p.priority < prio:
            continue
        try:
            without.assume(p, n, pick_gpus(without, p, n))
        except (ValueError, AccountingError):
            continue
        with_pod.assume(p, n, pick_gpus(with_pod, p, n))  # raises if the pod took its room


def test_only_nominated_pods_of_at_least_equal_priority_hold_room() -> None:
    from builders import schedule_with_nominated

    snap = ClusterState([node("n0", gpus=1)])
    prof = profile(preemption=True)
    pod = whole("p", priority=50)
    assert schedule_with_nominated(prof, pod, snap, [(whole("nom-low", priority=10), 0)]).scheduled
    held = schedule_with_nominated(prof, pod, snap, [(whole("nom-same", priority=50), 0)])
    assert not held.scheduled and held.nominated_node == -1  # nothing lower to preempt either
    assert not schedule_with_nominated(prof, pod, snap, [(whole("nom-high", priority=90), 0)]).scheduled
    assert snap.allocations == {} and snap.node_gpu_free(0) == [GPU_MILLI]
