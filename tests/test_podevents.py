"""k8s/podevents.py: a pod event is parsed once (bound, finished, deleting, group, room,
assignment, read from the API object) and its spec converted at most once, whatever the number of
subscribers; the subscribers' state after any sequence of events is the state rebuilt from the
final objects."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

import gpusched.k8s.podevents as podevents
from gpusched.core.model import PodSpec
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.groupref import API, GroupRef
from gpusched.k8s.podevents import Assignment, Kind, PodEvent, PodFeed, Room, parse_pod_event
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

ROOM = "gpusched.io/defrag-room"
ASSIGNMENT = "gpusched.io/assignment"
BAD_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Bogus"}]}]
        }
    }
}


def api_pod(
    name: str = "p",
    *,
    node: str = "",
    phase: str = "Pending",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    nominated: str = "",
    uid: str = "uid-p",
    **spec: Any,
) -> dict[str, Any]:
    """A Pod as the API writes it, by hand: one container asking for one whole GPU."""
    meta: dict[str, Any] = {
        "name": name, "namespace": "ns", "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": dict(labels or {}), "annotations": dict(annotations or {}),
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    body: dict[str, Any] = {
        "schedulerName": "gpusched",
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        **spec,
    }
    if node:
        body["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body, "status": status}


# ------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    ("obj", "kind", "want"),
    [
        (api_pod(), Kind.UPSERT, {"bound": False, "finished": False, "deleting": False, "pending": True}),
        (api_pod(node="n0", phase="Running"), Kind.UPSERT,
         {"bound": True, "finished": False, "pending": False, "holds_resources": True, "live": True}),
        (api_pod(node="n0", phase="Succeeded"), Kind.UPSERT,
         {"bound": True, "finished": True, "holds_resources": False, "live": False}),
        (api_pod(node="n0", phase="Failed"), Kind.UPSERT,
         {"bound": True, "finished": True, "holds_resources": False, "live": False}),
        (api_pod(phase="Failed"), Kind.UPSERT, {"bound": False, "finished": True, "pending": False}),
        (api_pod(node="n0", phase="Running", deleting=True), Kind.UPSERT,  # runs until its grace ends
         {"deleting": True, "holds_resources": True, "pending": False, "live": False}),
        (api_pod(deleting=True), Kind.UPSERT, {"bound": False, "deleting": True, "pending": False}),
        (api_pod(node="n0", phase="Running"), Kind.DELETE,
         {"deleted": True, "bound": True, "holds_resources": False, "live": False}),
        (api_pod(), Kind.DELETE, {"deleted": True, "pending": False}),
    ],
    ids=["pending", "running", "succeeded", "failed", "failed-unbound", "bound-deleting",
         "unbound-deleting", "deleted-bound", "deleted-pending"],
)  # fmt: skip
def test_bound_finished_and_deleting_are_read_from_the_object(
    obj: dict[str, Any], kind: Kind, want: dict[str, bool]
) -> None:
    ev = parse_pod_event(obj, kind)
    assert {k: getattr(ev, k) for k in want} == want
    assert (ev.key, ev.uid, ev.kind) == ("ns/p", "uid-p", kind)
    assert ev.node == obj["spec"].get("nodeName", "") and ev.phase == obj["status"]["phase"]


def test_an_object_without_node_phase_or_uid_is_a_pending_pod_with_empty_fields() -> None:
    ev = parse_pod_event({"metadata": {"name": "bare"}})
    assert (ev.key, ev.uid, ev.node, ev.phase, ev.scheduler_name) == ("default/bare", "", "", "", "")
    assert ev.pending and not ev.bound and not ev.gated and ev.priority == 0
    assert ev.group is None and ev.room is None and ev.assignment is None


def test_scheduler_gates_priority_and_creation_are_read() -> None:
    ev = parse_pod_event(api_pod(priority=7, schedulingGates=[{"name": "kueue"}]))
    assert (ev.scheduler_name, ev.gated, ev.priority, ev.created) == (
        "gpusched", True, 7, "2026-01-01T00:00:00Z"
    )  # fmt: skip
    assert not parse_pod_event(api_pod(schedulingGates=[])).gated


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (api_pod(), None),
        (api_pod(labels={"scheduling.x-k8s.io/pod-group": "g"}), GroupRef(API.COSCHEDULING, "ns", "g")),
        (api_pod(annotations={"scheduling.k8s.io/group-name": "v"}), GroupRef(API.VOLCANO, "ns", "v")),
        (api_pod(schedulingGroup={"podGroupName": "w"}), GroupRef(API.WORKLOAD, "ns", "w")),
    ],
    ids=["none", "coscheduling", "volcano", "workload"],
)
def test_the_group_reference_is_read(obj: dict[str, Any], want: GroupRef | None) -> None:
    assert parse_pod_event(obj).group == want


def test_the_room_is_read_only_where_the_pod_is_nominated_and_a_bad_one_is_kept_as_its_error() -> None:
    raw = json.dumps({"node": "n1", "gpus": [0, 1], "plan": "p1", "expires": 5.0})
    ev = parse_pod_event(api_pod(annotations={ROOM: raw}, nominated="n1"))
    assert ev.room == Room("n1", (0, 1), (), "p1", 5.0) and ev.room_error is None
    assert ev.nominated_node == "n1"
    assert parse_pod_event(api_pod(annotations={ROOM: raw})).room is None  # not nominated
    assert parse_pod_event(api_pod(annotations={ROOM: raw}, nominated="n2")).room is None  # elsewhere
    bad = parse_pod_event(api_pod(annotations={ROOM: "{not json"}, nominated="n1"))
    assert bad.room is None and isinstance(bad.room_error, InvalidRequest)
    assert ROOM in str(bad.room_error) and "ns/p" in str(bad.room_error)


def test_the_assignment_is_read_and_a_bad_one_is_kept_as_its_error() -> None:
    ev = parse_pod_event(
        api_pod(node="n0", phase="Running", annotations={ASSIGNMENT: '{"node":"n0","gpus":[3]}'})
    )
    assert ev.assignment == Assignment("n0", (3,)) and ev.assignment_error is None
    bad = parse_pod_event(api_pod(node="n0", phase="Running", annotations={ASSIGNMENT: '{"node":"n0"}'}))
    assert bad.assignment is None and isinstance(bad.assignment_error, InvalidRequest)
    assert ASSIGNMENT in str(bad.assignment_error)


def test_a_bound_pod_is_converted_leniently_a_pending_one_with_its_constraints_enforced() -> None:
    running = parse_pod_event(api_pod(node="n0", phase="Running", affinity=BAD_AFFINITY))
    assert running.spec().num_gpu == 1  # booked whatever its constraints say
    pending = parse_pod_event(api_pod(affinity=BAD_AFFINITY))
    with pytest.raises(InvalidRequest, match="operator 'Bogus'"):
        pending.spec()
    with pytest.raises(InvalidRequest, match="operator 'Bogus'"):  # the same error, each time
        pending.spec()


# ------------------------------------------------------------------------------ converted once
@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the converter, by pod name."""
    calls: list[str] = []
    real = podevents.pod_from_k8s

    def counting(obj: Any, **kw: Any) -> PodSpec:
        calls.append(obj["metadata"]["name"])
        return real(obj, **kw)

    monkeypatch.setattr(podevents, "pod_from_k8s", counting)
    return calls


class Reader:
    """A subscriber that reads the spec (as the books, the rooms and the queue do)."""

    def __init__(self) -> None:
        self.seen: list[PodSpec | str] = []

    def on_pod_event(self, ev: PodEvent) -> None:
        try:
            self.seen.append(ev.spec())
        except InvalidRequest as e:
            self.seen.append(str(e))


@pytest.mark.parametrize("subscribers", [1, 2, 5])
def test_one_event_is_converted_once_whatever_the_number_of_subscribers(
    subscribers: int, conversions: list[str]
) -> None:
    readers = [Reader() for _ in range(subscribers)]
    feed = PodFeed(readers)
    feed.upsert(api_pod("ok"))
    feed.upsert(api_pod("bad", affinity=BAD_AFFINITY))  # the error is kept: not converted again
    assert conversions == ["ok", "bad"]
    for r in readers:
        assert isinstance(r.seen[0], PodSpec) and r.seen[0].key == "ns/ok"
        assert isinstance(r.seen[1], str) and "operator 'Bogus'" in r.seen[1]


@pytest.fixture
def scheduler() -> Iterator[StandaloneScheduler]:
    s = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    yield s
    s.stop(0.1)


def test_the_schedulers_feed_converts_a_pending_pod_in_a_room_once_for_the_rooms_and_the_queue(
    scheduler: StandaloneScheduler, conversions: list[str]
) -> None:
    """The rooms (Reservations) and the queue both read the spec of a pending pod nominated into
    a defragmentation room; the pod's status updates that change nothing scheduling reads keep it."""
    raw = json.dumps({"node": "n1", "gpus": [0], "plan": "p1", "expires": 5.0})
    obj = api_pod("roomy", annotations={ROOM: raw}, nominated="n1")
    scheduler.pods.upsert(obj)
    assert len(scheduler.reservations) == 1
    qp = scheduler.queue.get("ns/roomy")
    assert qp is not None and qp.spec().key == "ns/roomy"
    assert conversions == ["roomy"]
    scheduler.pods.upsert({**obj, "status": {**obj["status"], "conditions": [{"type": "PodScheduled"}]}})
    assert qp.spec().key == "ns/roomy" and conversions == ["roomy", "roomy"]  # the rooms read the new event
    bound = copy.deepcopy(obj)
    bound["spec"]["nodeName"], bound["status"]["phase"] = "n1", "Running"
    scheduler.cluster.upsert_node(_node("n1"))
    scheduler.pods.upsert(bound)  # the books convert it (leniently), the rest only drop it
    assert conversions == ["roomy", "roomy", "roomy"]
    assert scheduler.queue.get("ns/roomy") is None and len(scheduler.reservations) == 0
    assert scheduler.cluster.bound_node("ns/roomy") == "n1"


def test_a_status_update_keeps_the_queued_conversion_and_a_spec_change_brings_a_new_one(
    scheduler: StandaloneScheduler, conversions: list[str]
) -> None:
    obj = api_pod("q")
    scheduler.pods.upsert(obj)
    qp = scheduler.queue.get("ns/q")
    assert qp is not None and qp.spec().priority == 0
    scheduler.pods.upsert({**obj, "status": {"phase": "Pending", "conditions": []}})
    assert qp.spec().priority == 0 and conversions == ["q"]
    scheduler.pods.upsert({**obj, "spec": {**obj["spec"], "priority": 9}})
    assert qp.spec().priority == 9 and conversions == ["q", "q"]


def test_a_label_only_change_brings_a_new_conversion(
    scheduler: StandaloneScheduler, conversions: list[str]
) -> None:
    """Labels feed topology spread and pod (anti-)affinity (a pod counts itself where its labels
    match): a change of the labels alone is a change of what scheduling reads."""
    obj = api_pod("l", labels={"app": "web"})
    scheduler.pods.upsert(obj)
    qp = scheduler.queue.get("ns/l")
    assert qp is not None and dict(qp.spec().labels) == {"app": "web"}
    scheduler.pods.upsert({**obj, "metadata": {**obj["metadata"], "labels": {"app": "db"}}})
    assert dict(qp.spec().labels) == {"app": "db"} and conversions == ["l", "l"]


# --------------------------------------------------------------------------------- the property
NODES = ("n0", "n1")
NAMES = ("a", "b", "c", "d")


def _node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "4"}
    labels = {"nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": "40960"}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": alloc}}


def _obj(i: int, gen: int, flags: frozenset[str]) -> dict[str, Any]:
    """Pod ``NAMES[i]`` (incarnation ``gen``) in the state ``flags`` says: each pod has its own GPU
    (no two assignments overlap), a group for some, a defragmentation room for one."""
    name = NAMES[i]
    node = NODES[i % 2] if "bound" in flags else ""
    phase = "Succeeded" if "finished" in flags else ("Running" if node else "Pending")
    ann = {ASSIGNMENT: json.dumps({"node": NODES[i % 2], "gpus": [i // 2]})} if node and i != 3 else {}
    if i == 0:
        ann[ROOM] = json.dumps({"node": "n0", "gpus": [3], "plan": "p", "expires": 1e12})
    labels = {"scheduling.x-k8s.io/pod-group": "g"} if i < 2 else {}
    req = {"cpu": "1"} if i == 3 else {"nvidia.com/gpu": "1"}
    return api_pod(
        name, node=node, phase=phase, deleting="deleting" in flags, labels=labels, annotations=ann,
        nominated="n0" if i == 0 else "", uid=f"uid-{name}-{gen}", priority=i,
        containers=[{"name": "c", "resources": {"limits": req}}],
        schedulingGates=[{"name": "g"}] if "gated" in flags and not node else [],
    )  # fmt: skip


Step = tuple[int, frozenset[str] | None]  # pod, flag added (None: deleted)
_ADDED = ["", "", "", "bound", "bound", "gated", "deleting", "finished"]  # a status update most often
steps = st.lists(
    st.tuples(st.integers(0, len(NAMES) - 1), st.sampled_from(_ADDED), st.integers(0, 5)).map(
        lambda t: (t[0], None if t[2] == 0 else frozenset({t[1]} - {""}))  # one step in six a deletion
    ),
    min_size=8,
    max_size=40,
)


def _state(s: StandaloneScheduler) -> dict[str, Any]:
    with s.cluster.live_books() as books:
        booked = {k: (books.names[a.node], a.gpus) for k, a in books.allocations.items()}
        free = books.gpu_free.tolist()
    return {
        "booked": set(booked),
        "placed": booked,
        "free": free,
        "groups": {ref: sorted(keys) for ref, keys in s.gangs._members.items()},
        "rooms": set(s.reservations._held),
        "held": {k: (r.pod.key, r.room) for k, r in s.reservations._held.items()},
        "queued": sorted(qp.key for qp in s.queue.pending()),
        "gated": s.queue.counts()["gated"],
    }


def _expected(now: dict[int, tuple[int, frozenset[str]]]) -> dict[str, Any]:
    """What each subscriber holds of the pods that exist, ``now``, by the rules written out:
    booked while bound and not finished (being deleted too), a group member and a room while
    neither being deleted nor finished, the room only while pending, queued while pending."""
    ended = {i for i, (_, f) in now.items() if f & {"deleting", "finished"}}
    pending = {i for i, (_, f) in now.items() if i not in ended and "bound" not in f}
    booked = {f"ns/{NAMES[i]}" for i, (_, f) in now.items() if "bound" in f and "finished" not in f}
    members = sorted(f"ns/{NAMES[i]}" for i in now if i < 2 and i not in ended)
    return {
        "booked": booked,
        "groups": {GroupRef(API.COSCHEDULING, "ns", "g"): members} if members else {},
        "rooms": {"ns/a"} if 0 in pending else set(),
        "queued": sorted(f"ns/{NAMES[i]}" for i in pending if "gated" not in now[i][1]),
        "gated": sum(1 for i in pending if "gated" in now[i][1]),
    }


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps)
def test_the_subscribers_after_any_events_are_as_rebuilt_from_the_final_objects(seq: list[Step]) -> None:
    """Flags only grow within one pod's life (bound, deleting, finished are never undone; gates
    go once bound); a deletion ends it and the next event recreates it under a new UID."""
    live = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    fresh = StandaloneScheduler(client.ApiClient(), SchedulerConfig())
    try:
        for s in (live, fresh):
            for n in NODES:
                s.cluster.upsert_node(_node(n))
        with live.cluster.live_books():
            pass  # the books exist from now on: every event below updates them in place
        now: dict[int, tuple[int, frozenset[str]]] = {}  # pod -> (incarnation, flags), while it exists
        gen = {i: 0 for i in range(len(NAMES))}
        for i, added in seq:
            if added is None:
                if i in now:
                    live.pods.delete(_obj(i, *now.pop(i)))
                    gen[i] += 1
                continue
            flags = now.get(i, (gen[i], frozenset()))[1] | added
            if "bound" in flags:
                flags -= {"gated"}
            now[i] = (gen[i], flags)
            live.pods.upsert(_obj(i, *now[i]))
        for i, (g, flags) in sorted(now.items()):
            fresh.pods.upsert(_obj(i, g, flags))
        got = _state(live)
        assert got == _state(fresh)
        assert {k: got[k] for k in _expected(now)} == _expected(now)
    finally:
        live.stop(0.1)
        fresh.stop(0.1)
