"""The one decider and the one actuator of the standalone scheduler (``k8s/actuator.py``): each
kind of unit outcome makes exactly its API calls (bind, nominate and evict, reclaim, event and
condition), recorded by a fake API; a single pod and a gang are decided by the same
``core.batch.run_cycle``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpusched.core import batch
from gpusched.k8s import scheduler as scheduler_module
from gpusched.k8s.convert import pod_from_k8s
from gpusched.k8s.eviction import Evictor
from test_gangs_tenants_k8s import World, cohort


class Recorder:
    """A fake API client: every call recorded as (what, object, detail), answered 201."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.messages: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **_: Any) -> Any:
            self.calls.append(_summary(name, args))
            if name == "create_namespaced_event":
                self.messages.append(args[1]["message"])
            return SimpleNamespace(status=201, data=b"{}")

        return call


def _summary(name: str, args: tuple[Any, ...]) -> tuple[str, str, str]:
    if name == "create_namespaced_binding":
        body = args[1]
        return "bind", body["metadata"]["name"], body["target"]["name"]
    if name == "create_namespaced_event":
        body = args[1]
        return "event", body["involvedObject"]["name"], body["reason"]
    if name == "patch_namespaced_pod_status":
        status = args[2]["status"]
        if "nominatedNodeName" in status:
            return "nominate", args[0], str(status["nominatedNodeName"])
        return "condition", args[0], status["conditions"][0]["type"]
    if name == "create_namespaced_pod_eviction":
        return "evict", args[0], ""
    if name.startswith("patch_namespaced_custom_object"):
        return "group-status", args[4], ""
    return name, str(args[0]) if args else "", ""


class Recorded:
    """A ``World`` whose API calls from now on go to one ``Recorder`` (binds included)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.rec = rec = Recorder()
        s = w.s
        s._binder.core = rec
        del s.actuator.bind  # the real binding (World records binds without the API)
        w.events.core = rec
        s._preemptor.core = rec
        s._preemptor.evictor = s.tenants.evictor = Evictor(rec)
        s.gangs.status.custom = rec

    def calls(self) -> Counter[tuple[str, str, str]]:
        self.w.events.flush()
        return Counter(self.rec.calls)


@pytest.fixture
def world() -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(*a: Any, **kw: Any) -> World:
        made.append(World(*a, **kw))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_placed_binds_and_tells_scheduled(world: Callable[..., World]) -> None:
    w = world(nodes=1)
    r = Recorded(w)
    w.pod("p", 2)
    w.drain()
    assert r.calls() == Counter({("bind", "p", "n0"): 1, ("event", "p", "Scheduled"): 1})


def test_waiting_tells_failed_scheduling_and_its_condition_once(world: Callable[..., World]) -> None:
    w = world(nodes=1)
    r = Recorded(w)
    w.pod("big", 8)
    w.drain()
    w.retry()  # the same reason again: nothing new written
    assert r.calls() == Counter(
        {("event", "big", "FailedScheduling"): 1, ("condition", "big", "PodScheduled"): 1}
    )
    assert w.s.queue.counts()["unschedulable"] == 1


def test_preempt_nominates_evicts_and_tells_the_preemptor(world: Callable[..., World]) -> None:
    w = world(nodes=1)
    w.pod("low", 4, priority=10)
    w.drain()
    r = Recorded(w)
    w.pod("hi", 4, priority=1000)
    w.drain()
    assert r.calls() == Counter(
        {
            ("nominate", "hi", "n0"): 1,
            ("evict", "low", ""): 1,
            ("event", "low", "Preempted"): 1,
            ("event", "hi", "FailedScheduling"): 1,
            ("condition", "hi", "PodScheduled"): 1,
        }
    )
    assert w.s.nominations.get("ns/hi") is not None


def test_a_room_no_preemption_helps_any_more_is_given_up_and_cleared(world: Callable[..., World]) -> None:
    w = world(nodes=1)
    w.pod("top", 4, priority=2000)
    w.drain()
    key = w.pod("p", 4, priority=1000)
    w.s.nominations.nominate(pod_from_k8s(w.objs[key]), "n0", ())  # a room from an earlier preemption
    r = Recorded(w)
    w.drain()  # only a higher-priority pod holds n0: no preemption helps
    assert r.calls() == Counter(
        {
            ("nominate", "p", "None"): 1,  # cleared
            ("event", "p", "FailedScheduling"): 1,
            ("condition", "p", "PodScheduled"): 1,
        }
    )
    assert w.s.nominations.get(key) is None


def test_reclaim_evicts_the_borrower_without_a_nomination(world: Callable[..., World]) -> None:
    w = world(cohort(2, 2), {"a": "team-a", "b": "team-b"}, nodes=1)
    for i in range(4):
        w.pod(f"b{i}", 1, ns="b")  # team-b borrows team-a's 2
    w.drain()
    r = Recorded(w)
    w.pod("a0", 2, ns="a")
    w.drain()
    calls = r.calls()
    evicted = [name for (what, name, _), _n in calls.items() if what == "evict"]
    assert len(evicted) == 2
    assert calls == Counter(
        {
            **{("evict", v, ""): 1 for v in evicted},
            **{("event", v, "Preempted"): 1 for v in evicted},
            ("event", "a0", "FailedScheduling"): 1,
            ("condition", "a0", "PodScheduled"): 1,
        }
    )
    assert r.rec.messages[-1].endswith("; reclaiming 2 pod(s) from borrowing queues")


def test_a_placed_gang_binds_each_member_and_tells_its_group(world: Callable[..., World]) -> None:
    w = world(nodes=1)
    r = Recorded(w)
    w.gang("g", 2, 2)
    w.drain()
    assert r.calls() == Counter(
        {
            ("bind", "g-0", "n0"): 1,
            ("bind", "g-1", "n0"): 1,
            ("event", "g-0", "Scheduled"): 1,
            ("event", "g-1", "Scheduled"): 1,
            ("event", "g", "GangScheduled"): 1,
            ("group-status", "g", ""): 1,
        }
    )


def test_a_waiting_gang_tells_each_member_and_its_group(world: Callable[..., World]) -> None:
    w = world(nodes=1)
    r = Recorded(w)
    w.gang("g", 3, 2)
    w.drain()
    assert r.calls() == Counter(
        {
            ("event", "g-0", "FailedScheduling"): 1,
            ("event", "g-1", "FailedScheduling"): 1,
            ("event", "g-2", "FailedScheduling"): 1,
            ("condition", "g-0", "PodScheduled"): 1,
            ("condition", "g-1", "PodScheduled"): 1,
            ("condition", "g-2", "PodScheduled"): 1,
            ("event", "g", "GangWaiting"): 1,
            ("group-status", "g", ""): 1,
        }
    )
    assert w.s.queue.counts()["unschedulable"] == 3


def test_a_single_pod_and_a_gang_go_through_the_same_decider(
    world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    decided: list[tuple[str, bool]] = []

    def run_cycle(*a: Any, **kw: Any) -> list[batch.UnitOutcome]:
        out = batch.run_cycle(*a, **kw)
        decided.extend((o.unit.key, o.unit.gang is not None) for o in out)
        return out

    monkeypatch.setattr(scheduler_module, "run_cycle", run_cycle)
    w = world(nodes=1)
    w.pod("alone", 1)
    w.gang("g", 2, 1)
    w.drain()
    assert sorted(w.bound) == ["ns/alone", "ns/g-0", "ns/g-1"]
    assert decided == [("ns/alone", False), ("ns/g", True)]
