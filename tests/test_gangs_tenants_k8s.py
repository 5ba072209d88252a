"""Gangs in the standalone scheduler beside tenant queues, preemption and rooms (``k8s/gangs.py``
wired by ``k8s/scheduler.py``), on live books with fake API clients: a gang is admitted by its
queue as a unit (never pushing it past quota plus borrowing, never partly bound), reclaims lent
quota as a unit, preempts lower-priority pods as a unit and is nominated while they leave, keeps
out of rooms held for others, and counts one scheduling attempt per member."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from builders import k8s_node, k8s_pod
from gpusched.core.gang import GangSpec, partly_bound
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.eviction import Eviction, Outcome
from gpusched.k8s.groupref import API, LABEL_COSCHEDULING
from gpusched.k8s.queues import Directory, queue_from_k8s, valid_tree
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.k8s.state import pod_key
from test_gangs_k8s import FakeGroups, wire


class Queues:
    """A ``QueueDirectory`` that has listed ``objs`` (Queue objects by name)."""

    def __init__(self, objs: Mapping[str, dict[str, Any]], by_namespace: Mapping[str, str]) -> None:
        tree, bad = valid_tree({n: queue_from_k8s(o) for n, o in objs.items()})
        self.directory = Directory(tree, bad, dict(by_namespace))
        self.objs = dict(objs)

    def installed(self) -> bool:
        return True

    synced = ready = installed

    def current(self) -> Directory:
        return self.directory

    def objects(self) -> dict[str, dict[str, Any]]:
        return dict(self.objs)

    def start(self) -> None: ...

    stop = start


def qobj(name: str, gpus: int, parent: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"nominalQuota": {"gpus": gpus}, **({"parent": parent} if parent else {})}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": spec}


class Groups(FakeGroups):
    def stop(self) -> None: ...


class FakeEvictor:
    def __init__(self) -> None:
        self.evicted: list[str] = []

    def evict(self, ns: str, name: str, uid: str = "", **_: Any) -> Eviction:
        self.evicted.append(f"{ns}/{name}")
        return Eviction(ns, name, Outcome.EVICTED, 201)

    delete = evict


class World:
    """A ``StandaloneScheduler`` with its API calls faked: binds recorded, evictions recorded,
    events captured, PodGroups and Queues given by hand."""

    def __init__(
        self, queues: Mapping[str, dict[str, Any]] | None = None, by_ns: Mapping[str, str] | None = None,
        nodes: int = 2, gpus: int = 4,
    ) -> None:  # fmt: skip
        s = self.s = StandaloneScheduler(client.ApiClient(), SchedulerConfig(policy="bestfit"))
        self.bound: dict[str, str] = {}
        self.api = mock.MagicMock()
        self.events = EventRecorder(self.api, workers=1)
        wire(s, self.events, Groups, time.monotonic)
        s.actuator.bind = lambda profile, qp, pod, node, gpus: self._bound(pod, node, gpus)  # type: ignore[method-assign]
        self.evictor = FakeEvictor()
        s._preemptor.evictor = s.tenants.evictor = self.evictor  # type: ignore[assignment]
        s._preemptor.core = self.api
        if queues is not None:
            s.tenants.directory = Queues(queues, by_ns or {})  # type: ignore[assignment]
        self.groups = cast(Groups, s.gangs.groups)
        for i in range(nodes):
            s.cluster.upsert_node(k8s_node(f"n{i}", gpus=gpus))
        s.leading.set()
        self.objs: dict[str, dict[str, Any]] = {}

    def _bound(self, pod: Any, node: str, gpus: tuple[int, ...]) -> None:
        self.bound[pod.key] = node
        obj = self.objs[pod.key]
        self.s.cluster.upsert_pod(
            {**obj, "spec": {**obj["spec"], "nodeName": node}, "status": {"phase": "Running"}}
        )

    def pod(self, name: str, gpus: int, *, gang: str = "", ns: str = "ns", priority: int = 0) -> str:
        obj = k8s_pod(
            name, {"nvidia.com/gpu": str(gpus)}, limits=True, ns=ns,
            schedulerName=self.s.config.scheduler_name, priority=priority,
        )  # fmt: skip
        if gang:
            obj["metadata"]["labels"] = {LABEL_COSCHEDULING: gang}
        self.objs[pod_key(obj)] = obj
        self.s.pods.upsert(obj)
        return pod_key(obj)

    def gang(
        self, name: str, n: int, gpus: int, *, ns: str = "ns", priority: int = 0, min_member: int = 0
    ) -> None:
        self.groups.add(API.COSCHEDULING, name, {"minMember": min_member or n}, ns=ns)
        for i in range(n):
            self.pod(f"{name}-{i}", gpus, gang=name, ns=ns, priority=priority)

    def drain(self) -> None:
        while (qp := self.s.queue.pop(timeout=0.0)) is not None:
            self.s.schedule(qp)

    def gone(self, key: str) -> None:
        """The pod ``key`` finished (or its eviction completed)."""
        self.s.pods.delete(self.objs[key])
        self.s.cluster.delete_pod(key)
        self.bound.pop(key, None)

    def retry(self) -> None:
        self.s.queue.move_all_to_active()
        self.drain()

    def messages(self, reason: str = "") -> list[str]:
        self.events.flush()
        out = []
        for c in self.api.create_namespaced_event.call_args_list:
            body = c.args[1]
            if not reason or body["reason"] == reason:
                out.append(body["message"])
        return out

    def attempts(self) -> dict[str, float]:
        out = {}
        for metric in self.s.metrics.registry.collect():
            for smp in metric.samples:
                if smp.name == "scheduler_schedule_attempts_total":
                    out[smp.labels["result"]] = smp.value
        return out

    def close(self) -> None:
        self.s.stop()  # flushes and stops its events (``self.events``)


@pytest.fixture
def world() -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(*a: Any, **kw: Any) -> World:
        made.append(World(*a, **kw))
        return made[-1]

    yield make
    for w in made:
        w.close()


def cohort(a: int, b: int, borrow_a: int | None = None) -> dict[str, dict[str, Any]]:
    qa = qobj("team-a", a, "org")
    if borrow_a is not None:
        qa["spec"]["borrowingLimit"] = {"gpus": borrow_a}
    return {"org": qobj("org", 0), "team-a": qa, "team-b": qobj("team-b", b, "org")}


# ------------------------------------------------------------------ quota
def test_a_gang_over_its_queues_quota_waits_as_a_unit_naming_the_queue(world: Callable[..., World]) -> None:
    w = world(cohort(2, 1, borrow_a=1), {"ns": "team-a"})
    w.gang("big", 4, 1)  # 4 GPUs: over team-a's 2 + borrowing 1
    w.drain()
    assert w.bound == {}
    with w.s.cluster.live_books() as snap:
        assert not snap.allocations  # nothing of the gang held
    msg = [m for m in w.messages("GangWaiting") if "big" in m]
    assert msg and "queue team-a" in msg[0] and "borrowingLimit" in msg[0], msg
    w.gang("fits", 3, 1)  # 2 of its own + 1 borrowed
    w.drain()
    assert sorted(w.bound) == ["ns/fits-0", "ns/fits-1", "ns/fits-2"]


def test_an_unknown_queue_makes_the_gang_wait_with_an_event_naming_it(world: Callable[..., World]) -> None:
    w = world(cohort(2, 2), {"ns": "nowhere"})
    w.gang("g", 2, 1)
    w.drain()
    assert w.bound == {}
    assert any("'nowhere'" in m and "nothing is bound" in m for m in w.messages("GangWaiting"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 4), st.integers(1, 2), st.booleans()), min_size=1, max_size=10
    ),
    st.integers(0, 4),
    st.integers(0, 4),
    st.one_of(st.none(), st.integers(0, 3)),
)
def test_streams_of_gangs_and_pods_keep_queues_within_quota_and_gangs_whole(
    jobs: list[tuple[bool, int, int, bool]], a: int, b: int, borrow: int | None
) -> None:
    w = World(cohort(a, b, borrow_a=borrow), {"ns-a": "team-a", "ns-b": "team-b"})
    try:
        _stream(w, jobs, a, b, borrow)
    finally:
        w.close()


def _stream(w: World, jobs: list[tuple[bool, int, int, bool]], a: int, b: int, borrow: int | None) -> None:
    gangs: dict[str, GangSpec] = {}
    for i, (is_gang, n, g, in_a) in enumerate(jobs):
        ns = "ns-a" if in_a else "ns-b"
        if is_gang:
            w.gang(f"j{i}", n, g, ns=ns)
            gangs[f"{ns}/j{i}"] = GangSpec(f"j{i}", ns, n)
        else:
            w.pod(f"j{i}", g, ns=ns)
        w.drain()
        with w.s.cluster.live_books() as snap:
            used = {q: 0 for q in ("ns-a", "ns-b")}
            for al in snap.allocations.values():
                used[al.pod.namespace] += al.pod.num_gpu
            assert partly_bound([al.pod for al in snap.allocations.values()], gangs) == []
        assert used["ns-a"] + used["ns-b"] <= a + b  # the cohort's quota
        if borrow is not None:
            assert used["ns-a"] <= a + borrow, (used, a, borrow)


# ------------------------------------------------------------------ reclaim
def test_a_gang_reclaims_its_lent_quota_as_a_unit(world: Callable[..., World]) -> None:
    w = world(cohort(4, 4), {"ns-a": "team-a", "ns-b": "team-b"}, nodes=2, gpus=4)
    borrowers = [w.pod(f"b{i}", 1, ns="ns-b") for i in range(8)]  # team-b borrows all of team-a's 4
    w.drain()
    assert len(w.bound) == 8
    w.gang("train", 2, 2, ns="ns-a")  # 4 GPUs, within team-a's own quota
    w.drain()
    assert not any(k.startswith("ns-a/") for k in w.bound)
    assert len(w.evictor.evicted) == 4 and set(w.evictor.evicted) <= set(borrowers)
    assert any("reclaiming 4 pod(s)" in m for m in w.messages("GangWaiting"))
    w.retry()  # the victims are still leaving: the gang waits, nothing more is evicted
    assert len(w.evictor.evicted) == 4 and not any(k.startswith("ns-a/") for k in w.bound)
    for k in w.evictor.evicted:
        w.gone(k)
    w.retry()
    assert sorted(k for k in w.bound if k.startswith("ns-a/")) == ["ns-a/train-0", "ns-a/train-1"]


# ------------------------------------------------------------------ preemption and rooms
def test_a_high_priority_gang_preempts_the_fewest_lower_priority_pods_and_is_nominated(
    world: Callable[..., World],
) -> None:
    w = world()
    low = [w.pod(f"low{i}", 1, priority=1) for i in range(8)]
    w.drain()
    w.gang("urgent", 2, 2, priority=100)
    w.drain()
    assert len(w.evictor.evicted) == 4 and set(w.evictor.evicted) <= set(low)
    nominated = {n.pod.key: n.node for n in w.s.nominations.all()}
    assert sorted(nominated) == ["ns/urgent-0", "ns/urgent-1"]
    statuses = [c.args for c in w.api.patch_namespaced_pod_status.call_args_list]
    assert sorted(a[0] for a in statuses) == ["urgent-0", "urgent-1"]
    # a low pod recreated while the victims leave does not take the room, nor evict again
    w.retry()
    assert len(w.evictor.evicted) == 4
    for k in w.evictor.evicted:
        w.gone(k)
    w.pod("sneaky", 2, priority=1)
    w.drain()
    assert "ns/sneaky" not in w.bound  # the nominated gang's room is kept from a lower priority
    w.retry()
    assert {k: w.bound[k] for k in ("ns/urgent-0", "ns/urgent-1")} == {
        k: nominated[k] for k in ("ns/urgent-0", "ns/urgent-1")
    }


def test_a_gang_does_not_land_in_a_room_nominated_for_a_higher_priority_pod(
    world: Callable[..., World],
) -> None:
    w = world(nodes=1, gpus=4)
    for i in range(2):
        w.pod(f"old{i}", 1, priority=50)
    w.drain()
    vip = w.pod("vip", 2, priority=100)
    held = w.s.queue.get(vip)
    assert held is not None
    w.s.nominations.nominate(held.spec(), "n0", ())  # its room: the 2 free GPUs
    w.gang("g", 2, 1, priority=10)
    qp = w.s.queue.get("ns/g-0")
    assert qp is not None
    w.s.schedule(qp)
    assert not any(k.startswith("ns/g-") for k in w.bound)
    # of higher priority than the nominated pod, the room is no obstacle
    w.gang("h", 2, 1, priority=101)
    qp = w.s.queue.get("ns/h-0")
    assert qp is not None
    w.s.schedule(qp)
    assert sorted(k for k in w.bound if k.startswith("ns/h-")) == ["ns/h-0", "ns/h-1"]


# ------------------------------------------------------------------ metrics
def test_gang_attempts_are_counted_per_pod_with_their_result(world: Callable[..., World]) -> None:
    w = world(nodes=1, gpus=4)
    w.gang("fits", 3, 1)
    w.gang("waits", 2, 1)
    w.drain()
    got = w.attempts()
    assert got.get("scheduled") == 3
    assert got.get("unschedulable", 0) >= 2  # both members of the waiting gang, each time it is tried


# ------------------------------------------------------------------ the queue book, kept
def test_the_queue_book_is_built_once_and_follows_the_bookings(world: Callable[..., World]) -> None:
    w = world(cohort(4, 4), {"ns-a": "team-a", "ns-b": "team-b"})
    t = w.s.tenants

    def same_as_fresh() -> None:
        with w.s.cluster.live_books() as snap:
            d = t.directory.current()
            kept = t.book(snap, d)
            t.keep_book = False
            fresh = t.book(snap, d)
            t.keep_book = True
        assert kept.charged == fresh.charged and kept.demand == fresh.demand

    for i in range(5):
        w.pod(f"a{i}", 1, ns="ns-a")
    w.gang("g", 2, 1, ns="ns-b")
    w.drain()
    assert len(w.bound) == 7
    same_as_fresh()  # the pods booked by the decisions were charged as they were booked
    for i in range(12):  # over the cohort's 8: each is refused by quota
        w.pod(f"x{i}", 1, ns="ns-a")
    before = t.books_built
    w.drain()
    assert t.books_built - before <= 1, "the book was rebuilt for each queued pod"
    same_as_fresh()
    w.gone("ns-a/a0")  # a change the scheduler did not make: the book is built anew
    before = t.books_built
    with w.s.cluster.live_books() as snap:
        t.book(snap, t.directory.current())
    assert t.books_built == before + 1
    same_as_fresh()


def test_a_queued_pod_does_not_land_in_a_room_nominated_for_another(world: Callable[..., World]) -> None:
    w = world(cohort(4, 4), {"ns-a": "team-a"}, nodes=1, gpus=4)
    for i in range(2):
        w.pod(f"old{i}", 1, ns="ns-b", priority=50)
    w.drain()
    vip = w.pod("vip", 2, ns="ns-b", priority=100)
    held = w.s.queue.get(vip)
    assert held is not None
    w.s.nominations.nominate(held.spec(), "n0", ())  # its room: the 2 free GPUs
    key = w.pod("queued", 2, ns="ns-a", priority=10)
    qp = w.s.queue.get(key)
    assert qp is not None
    w.s.schedule(qp)
    assert key not in w.bound
    w.s.nominations.drop(vip)  # the preemptor is gone: the room is free
    w.retry()
    assert key in w.bound or vip in w.bound
