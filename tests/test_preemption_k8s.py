"""Preemption in the standalone scheduler (issue 28: F1, F1b, F5), on live books with fake API
clients: a preemption that needs several victims finishes with exactly those evictions while
their owners recreate them; a second preemptor evicts no one for a room being made; a restarted
scheduler rebuilds the room from ``status.nominatedNodeName``; a victim already leaving is never
evicted again; a budget is broken at most once per room; repeated preemptions are bounded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from builders import k8s_pod
from gpusched.core.cluster import ClusterState
from gpusched.core.disruption import DisruptionBudget, DisruptionBudgets
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.selectors import LabelSelector
from gpusched.k8s.convert import pod_from_k8s
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.eviction import Eviction, Outcome
from gpusched.k8s.podevents import Kind, parse_pod_event
from gpusched.k8s.preemption import Nominations, Preemptor
from test_gangs_tenants_k8s import World


@pytest.fixture
def world() -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(*a: Any, **kw: Any) -> World:
        made.append(World(*a, **kw))
        return made[-1]

    yield make
    for w in made:
        w.close()


def terminating(w: World, key: str) -> None:
    """The API's view of an evicted pod: bound, with a deletionTimestamp, still holding its GPUs."""
    obj = w.objs[key]
    meta = {**obj["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
    obj = w.objs[key] = {**obj, "metadata": meta, "spec": {**obj["spec"], "nodeName": w.bound[key]}}
    w.s.pods.upsert(obj)


def issue_28(w: World) -> list[str]:
    """One node of 8 GPUs: a priority-5000 pod on 3, five priority-10 pods on the other 5."""
    w.pod("hi", 3, priority=5000)
    lows = [w.pod(f"low{i}", 1, priority=10) for i in range(5)]
    w.drain()
    assert sorted(w.bound) == ["ns/hi", *lows]
    return lows


def leave_one_by_one(w: World, *, replace: bool = True) -> None:
    """Each victim terminates, then goes; its ReplicaSet makes a replacement at once, and the
    scheduler decides everything pending after each step."""
    victims = list(w.evictor.evicted)
    for key in victims:
        terminating(w, key)
    w.retry()
    for i, key in enumerate(victims):
        w.gone(key)
        if replace:
            w.pod(f"replacement{i}", 1, priority=10)
        w.retry()


def test_the_issue_28_preemption_evicts_four_and_the_preemptor_binds(world: Callable[..., World]) -> None:
    w = world(nodes=1, gpus=8)
    lows = issue_28(w)
    w.pod("big", 4, priority=100)
    w.drain()
    assert len(w.evictor.evicted) == 4 and set(w.evictor.evicted) <= set(lows)
    leave_one_by_one(w)
    assert len(w.evictor.evicted) == 4, f"evicted again: {w.evictor.evicted}"
    assert w.bound.get("ns/big") == "n0"
    assert not any(k.startswith("ns/replacement") for k in w.bound)  # they wait: the node is full
    preempted = w.messages("Preempted")
    assert len(preempted) == 4 and all("ns/big" in m for m in preempted)


def test_two_preemptors_on_one_node_evict_for_one_room_only(world: Callable[..., World]) -> None:
    w = world(nodes=1, gpus=8)
    issue_28(w)
    w.pod("big1", 4, priority=100)
    w.pod("big2", 4, priority=100)
    w.drain()
    assert len(w.evictor.evicted) == 4  # one room: the second has no room to make beside it
    leave_one_by_one(w)
    assert len(w.evictor.evicted) == 4, f"evicted again: {w.evictor.evicted}"
    assert sum(k in w.bound for k in ("ns/big1", "ns/big2")) == 1
    assert len(w.messages("Preempted")) == 4


def test_a_restarted_scheduler_keeps_the_room_of_the_nominated_pod(world: Callable[..., World]) -> None:
    """F5: the new scheduler learns the room from ``status.nominatedNodeName``: no eviction again,
    no second Preempted event, and a freed GPU of the room does not go to a replacement."""
    w = world(nodes=1, gpus=8)
    issue_28(w)
    big = w.pod("big", 4, priority=100)
    w.drain()
    victims = list(w.evictor.evicted)
    for key in victims:
        terminating(w, key)
    # a new scheduler: it lists every pod as the API shows them
    w2 = world(nodes=1, gpus=8)
    for key, obj in w.objs.items():
        if key == big:
            obj = {**obj, "status": {**obj["status"], "nominatedNodeName": "n0"}}
        if key in w.bound:
            w2.bound[key] = w.bound[key]
            obj = {**obj, "spec": {**obj["spec"], "nodeName": w.bound[key]}}
        w2.objs[key] = obj
        w2.s.pods.upsert(obj)
    held = w2.s.nominations.get(big)
    assert held is not None and held.node == "n0"
    w2.drain()
    assert w2.evictor.evicted == [] and w2.messages("Preempted") == []
    w2.gone(victims[0])
    key = w2.pod("replacement", 1, priority=10)
    qp = w2.s.queue.get(key)
    assert qp is not None
    w2.s.schedule(qp)  # decided before the preemptor: still not into its room
    assert key not in w2.bound
    for v in victims[1:]:
        w2.gone(v)
    w2.retry()
    assert w2.bound.get(big) == "n0" and w2.evictor.evicted == []


def test_a_rebuilt_nomination_reads_the_spec_the_event_converted_once(world: Callable[..., World]) -> None:
    """A nominated pod's event is converted once: the room rebuilt from it (``Nominations.observe``)
    holds the very ``PodSpec`` the queue holds, not a second conversion of the same object."""
    w = world(nodes=1, gpus=8)
    obj = k8s_pod(
        "big", {"nvidia.com/gpu": "4"}, limits=True, ns="ns", schedulerName=w.s.config.scheduler_name
    )
    obj["status"] = {"phase": "Pending", "nominatedNodeName": "n0"}
    w.s.pods.upsert(obj)
    held, qp = w.s.nominations.get("ns/big"), w.s.queue.get("ns/big")
    assert held is not None and held.node == "n0" and held.seen and qp is not None
    assert held.pod is qp.spec()


def test_a_cleared_nomination_gives_the_room_up_but_our_own_waits_for_its_patch() -> None:
    noms = Nominations("gpusched")
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"schedulerName": "gpusched", "containers": [{"name": "c", "resources": {}}]},
        "status": {"phase": "Pending"},
    }
    noms.nominate(pod_from_k8s(pod), "n0", ("ns/v",))
    noms.observe(parse_pod_event(pod))  # an update from before the status patch: the room stays
    assert noms.get("ns/p") is not None
    noms.observe(parse_pod_event({**pod, "status": {"nominatedNodeName": "n0"}}))
    held = noms.get("ns/p")
    assert held is not None and held.seen and held.victims == ("ns/v",)
    noms.observe(parse_pod_event(pod))  # someone cleared it
    assert noms.get("ns/p") is None
    noms.observe(parse_pod_event({**pod, "status": {"nominatedNodeName": "n1"}}))  # rebuilt, no victims known
    held = noms.get("ns/p")
    assert held is not None and held.node == "n1" and held.victims == ()
    noms.observe(parse_pod_event({**pod, "spec": {**pod["spec"], "nodeName": "n1"}}))  # bound: no room
    assert noms.get("ns/p") is None


def test_repeated_preemptions_per_pod_and_node_are_bounded() -> None:
    now = [0.0]
    noms = Nominations("gpusched", limit=2, window_s=100.0, clock=lambda: now[0])
    snap = ClusterState([NodeSpec("n0", 1000, 1024, 1, "A", 0)])
    pod = PodSpec("p", num_gpu=1, gpu_milli=GPU_MILLI, priority=5)
    for _ in range(2):
        assert noms.may_preempt(pod.key, "n0", snap) == ""
        noms.nominate(pod, "n0", ())
    assert "2 times" in noms.may_preempt(pod.key, "n0", snap)
    assert noms.may_preempt(pod.key, "n1", snap) == ""  # per node
    now[0] = 150.0
    assert noms.may_preempt(pod.key, "n0", snap) == ""  # the window passed


def test_a_lower_priority_pod_terminating_on_the_nominated_node_makes_the_preemptor_wait() -> None:
    noms = Nominations("gpusched")
    snap = ClusterState([NodeSpec("n0", 1000, 1024, 2, "A", 0)])
    victim = PodSpec("v", namespace="ns", num_gpu=1, gpu_milli=GPU_MILLI, priority=1)
    snap.assume(victim, 0, (0,))
    pod = PodSpec("p", namespace="ns", num_gpu=2, gpu_milli=GPU_MILLI, priority=5)
    noms.nominate(pod, "n0", ())
    assert noms.may_preempt(pod.key, "n0", snap) == ""
    meta = {"name": "v", "namespace": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z"}
    noms.observe(parse_pod_event({"metadata": meta, "spec": {"nodeName": "n0"}}))
    assert "terminating" in noms.may_preempt(pod.key, "n0", snap)
    assert noms.leaving() == {"ns/v"}
    noms.observe(parse_pod_event({"metadata": meta, "spec": {"nodeName": "n0"}}, Kind.DELETE))
    assert noms.leaving() == frozenset()


# ------------------------------------------------------------------ Preemptor (F1b)
class BlockingEvictor:
    """Every eviction refused by the budget "db"; deletes recorded."""

    def __init__(self, api: mock.MagicMock) -> None:
        self.api = api
        self.evicted: list[str] = []
        self.deleted: list[str] = []
        self.marked_first: list[bool] = []
        """Per delete: whether the pod had been given its DisruptionTarget condition before."""

    def evict(self, ns: str, name: str, uid: str = "", **_: Any) -> Eviction:
        self.evicted.append(f"{ns}/{name}")
        return Eviction(ns, name, Outcome.BLOCKED, 429, "budget", "db", 5.0)

    def delete(self, ns: str, name: str, uid: str = "", **_: Any) -> Eviction:
        self.deleted.append(f"{ns}/{name}")
        self.marked_first.append(
            any(c.args[0] == name for c in self.api.patch_namespaced_pod_status.call_args_list)
        )
        return Eviction(ns, name, Outcome.EVICTED, 200)


def preemptor() -> tuple[Preemptor, BlockingEvictor, mock.MagicMock]:
    api = mock.MagicMock()
    p = Preemptor(api, EventRecorder(api, workers=1))
    p.evictor = ev = BlockingEvictor(api)  # type: ignore[assignment]
    return p, ev, api


DB = DisruptionBudgets((DisruptionBudget("db", "ns", LabelSelector((("app", "db"),)), 0),))


def db(name: str) -> PodSpec:
    return PodSpec(
        name, namespace="ns", num_gpu=1, gpu_milli=GPU_MILLI, labels={"app": "db"}, uid=f"u-{name}"
    )


def test_a_budget_is_broken_at_most_once_per_room_and_the_victim_gets_disruption_target() -> None:
    p, ev, api = preemptor()
    out = p.run(PodSpec("big", namespace="ns", priority=9), "n0", [db("a"), db("b")], DB)
    assert ev.deleted == ["ns/a", "ns/b"] and out.forced == ["ns/a", "ns/b"] and out.broken == ["db", "db"]
    conds = [
        c.args[2]["status"]["conditions"][0]
        for c in api.patch_namespaced_pod_status.call_args_list
        if "conditions" in c.args[2]["status"]
    ]
    assert [(c["type"], c["reason"]) for c in conds] == [("DisruptionTarget", "PreemptionByScheduler")] * 2
    assert ev.marked_first == [True, True]
    # the same room again: the budget is spent, the victim waits (and the nomination is cleared)
    again = p.run(PodSpec("big", namespace="ns", priority=9), "n0", [db("c")], DB, spent=frozenset({"db"}))
    assert ev.deleted == ["ns/a", "ns/b"] and not again.forced and [b.key for b in again.blocked] == ["ns/c"]
    last = api.patch_namespaced_pod_status.call_args_list[-1].args
    assert last[0] == "big" and last[2] == {"status": {"nominatedNodeName": None}}


def test_a_victim_already_leaving_is_not_evicted_again_nor_told_again() -> None:
    p, ev, api = preemptor()
    out = p.run(PodSpec("big", namespace="ns", priority=9), "n0", [db("a")], DB, leaving={"ns/a"})
    assert ev.evicted == [] and ev.deleted == [] and out.leaving == ["ns/a"]
    p.events.flush()
    assert api.create_namespaced_event.call_count == 0


def test_the_preemptor_is_nominated_before_its_victims_are_evicted() -> None:
    """A scheduler SIGKILLed between the two finds the room when it starts again (F5)."""
    p, ev, api = preemptor()
    patched_before: list[int] = []
    real_evict = ev.evict

    def evict(ns: str, name: str, uid: str = "", **kw: Any) -> Eviction:
        patched_before.append(api.patch_namespaced_pod_status.call_count)
        return real_evict(ns, name, uid, **kw)

    ev.evict = evict  # type: ignore[method-assign]
    p.run(PodSpec("big", namespace="ns", priority=9), "n0", [db("a")], DB)
    first = api.patch_namespaced_pod_status.call_args_list[0].args
    assert patched_before == [1] and first[0] == "big" and first[2] == {"status": {"nominatedNodeName": "n0"}}


def test_the_preemptor_is_tried_at_once_when_its_last_victim_is_gone(world: Callable[..., World]) -> None:
    """No backoff: the room it waited for is free (time to bind, issue 28)."""
    w = world(nodes=1, gpus=8)
    issue_28(w)
    big = w.pod("big", 4, priority=100)
    w.drain()
    victims = list(w.evictor.evicted)
    for key in victims[:-1]:
        w.gone(key)
    w.drain()
    assert big not in w.bound and w.s.queue.get(big) is not None  # waits, unschedulable
    w.gone(victims[-1])
    w.drain()  # no flush, no retry of everything: it was activated
    assert w.bound.get(big) == "n0"


# ------------------------------------------------------------------ reclaim
def test_a_reclaims_room_is_kept_from_pods_outside_the_queues_while_its_victims_leave(
    world: Callable[..., World],
) -> None:
    """The claimant's room is held as a nominated preemptor's is: a pod under no queue, of the
    same priority, does not take the GPUs the reclaimed pods free one by one."""
    from test_gangs_tenants_k8s import cohort

    w = world(cohort(4, 4), {"ns-a": "team-a", "ns-b": "team-b"}, nodes=1, gpus=8)
    borrowers = [w.pod(f"b{i}", 1, ns="ns-b") for i in range(8)]  # team-b borrows all of team-a's 4
    w.drain()
    claim = w.pod("claim", 4, ns="ns-a")
    w.drain()
    assert len(w.evictor.evicted) == 4 and set(w.evictor.evicted) <= set(borrowers)
    held = w.s.nominations.get(claim)
    assert held is not None and held.node == "n0"
    for i, key in enumerate(w.evictor.evicted):
        w.gone(key)
        w.pod(f"free{i}", 1, ns="ns-c")  # under no queue
        w.retry()
    assert w.bound.get(claim) == "n0"
    assert not any(k.startswith("ns-c/") for k in w.bound)
