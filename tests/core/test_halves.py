"""The two halves of a cycle (``core.scheduler.feasible`` and ``pick_host``): side-effect free, and
``schedule_one`` is exactly their pick, assumed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import node, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import feasible, pick_host, schedule_one
from gpusched.core.status import Code, Status
from test_core_properties import ALL_POLICIES, DETERMINISTIC, Scenario, pods, profile_for, scenarios

HALVES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def books(snap: ClusterState) -> tuple[object, ...]:
    """Everything the books hold: free capacity, allocations, pods per node, node generations."""
    arrays = tuple(
        getattr(snap, f).tolist()
        for f in ("cpu_free", "mem_free", "pod_free", "ext_free", "gpu_free", "gpu_mem_free", "gen")
    )
    allocs = sorted((k, a.node, a.gpus) for k, a in snap.allocations.items())
    return arrays, allocs, [sorted(s) for s in snap.node_pods]


def _played(policy: str, sc: Scenario) -> ClusterState:
    snap = ClusterState(sc.nodes)
    prof = profile_for(policy, sc.pods)
    for kind, x in sc.events:
        if kind == "add" and isinstance(x, PodSpec):
            schedule_one(prof, x, snap, tiebreak=sc.tiebreak, diagnose_failures=False)
        elif kind == "del" and isinstance(x, int) and snap.allocations:
            snap.forget(sorted(snap.allocations)[x % len(snap.allocations)])
    return snap


@pytest.mark.parametrize("policy", ALL_POLICIES)
@HALVES
@given(sc=scenarios(max_events=20), pod=pods(999), data=st.data())
def test_the_halves_leave_the_books_as_they_were(
    policy: str, sc: Scenario, pod: PodSpec, data: st.DataObject
) -> None:
    snap = _played(policy, sc)
    prof = profile_for(policy, sc.pods)
    before = books(snap)
    some = np.array(data.draw(st.lists(st.integers(0, len(snap) - 1), max_size=len(snap))), dtype=np.int64)
    for nodes, explain in ((None, False), (None, True), (some, data.draw(st.booleans()))):
        f = feasible(prof, pod, snap, nodes, explain=explain)
        assert books(snap) == before
        found = f.indices()
        if len(found):
            p = pick_host(f.state, prof, pod, snap, found, tiebreak=sc.tiebreak)
            assert p.node in found.tolist() and p.feasible == len(found)
            assert books(snap) == before
    assert snap.verify() == []


@pytest.mark.parametrize("policy", DETERMINISTIC)
@HALVES
@given(sc=scenarios(max_events=20), pod=pods(999))
def test_schedule_one_is_the_pick_of_the_halves_assumed(policy: str, sc: Scenario, pod: PodSpec) -> None:
    snap = _played(policy, sc)
    prof = profile_for(policy, sc.pods)
    cycled = snap.copy()
    r = schedule_one(prof, pod, cycled, tiebreak=sc.tiebreak, diagnose_failures=False)
    f = feasible(prof, pod, snap)
    found = f.indices()
    assert r.scheduled == (len(found) > 0)
    if not r.scheduled:
        assert books(cycled) == books(snap)
        return
    p = pick_host(f.state, prof, pod, snap, found, tiebreak=sc.tiebreak)
    assert (r.node, r.node_name, r.gpus, r.score, r.feasible_nodes) == (
        p.node,
        p.node_name,
        p.gpus,
        p.score,
        p.feasible,
    )
    snap.assume(pod, p.node, p.gpus)
    assert books(cycled) == books(snap)


def test_feasibility_explains_the_nodes_asked_about_by_name() -> None:
    snap = ClusterState([node("n0", gpus=1), node("n1", gpus=4), node("n2", gpus=2)])
    f = feasible(make_profile("bestfit"), whole("w", 2), snap, np.array([2, 0], dtype=np.int64), explain=True)
    assert f.status.ok and f.indices().tolist() == [2]
    d = f.diagnosis(snap)
    assert d.num_nodes == 2 and [x.node for x in d.failures] == ["n0"]


def test_a_pre_filter_refusal_passes_no_node() -> None:
    class Refuse:
        name = "Refuse"

        def pre_filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> Status:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ("no",), self.name)

    prof = replace(make_profile("bestfit"), pre_filters=(Refuse(),))
    snap = ClusterState([node("n0", gpus=1)])
    f = feasible(prof, share("s", 100), snap, explain=True)
    assert not f.status.ok and f.indices().tolist() == [] and f.filtered.failures == ()
    assert f.diagnosis(snap).pre_filter == f.status
    r = schedule_one(prof, share("s", 100), snap)
    assert not r.scheduled and r.status == f.status and snap.allocations == {}


def test_the_halves_run_no_reserve_plugin() -> None:
    """Reserve is side bookkeeping (DRA's ledger): only ``schedule_one`` runs it, after the pick."""
    log: list[str] = []

    class Recorder:
        name = "Recorder"

        def reserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> Status:
            log.append(f"reserve {snap.names[node]}")
            return Status.success()

        def unreserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> None:
            log.append("unreserve")

    prof = replace(make_profile("bestfit"), reserves=(Recorder(),))
    snap = ClusterState([node("n0", gpus=1), node("n1", gpus=2)])
    f = feasible(prof, whole("w", 2), snap)
    p = pick_host(f.state, prof, whole("w", 2), snap, f.indices())
    assert p.node_name == "n1" and p.gpus == (0, 1) and log == []
    assert schedule_one(prof, whole("w", 2), snap).node_name == "n1" and log == ["reserve n1"]
