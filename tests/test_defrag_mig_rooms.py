"""Rooms for MIG slices (issue 31 item 5, ``k8s/reservation.py``): a plan that moves MIG slices keeps the
slice it frees for the pending pod, and the slice it chose for each moved pod for its replacement, in the
standalone scheduler's books; the replacement takes its planned slice, nothing else takes either."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from builders import k8s_pod, profile
from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot
from gpusched.core.model import Controller, PodSpec
from gpusched.core.scheduler import schedule_one
from gpusched.defrag.controller import ControllerConfig, DefragController
from gpusched.doctor import Books, doctor_pod, snapshot_of_state
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.reservation import ANN_ROOM, PlanRecord, Reservations, Steer, room_annotation
from migbuilders import BALANCED, HALVES, held, mig_node, mig_pod, res

NOW = 1_800_000_000.0
PLAN = "p1"
RS = Controller("ReplicaSet", "web", "apps")
WEB = (("app", "web"),)


def rooms(pods: tuple[str, ...] = ("default/big",), expires: float = NOW + 60) -> Reservations:
    rec = PlanRecord(PLAN, pods, "defrag-0", expires)
    return Reservations(lambda wanted: rec, wall=lambda: NOW)


def pending(
    name: str, node: str, room: tuple[MigSlot, ...], steer: tuple[Steer, ...] = (), prio: int = 0, **kw: Any
) -> dict[str, Any]:
    """A pending 3g.40gb pod nominated into a MIG room on ``node``."""
    ann = room_annotation(node, (), steer, plan=PLAN, expires=NOW + 60, mig=room)
    obj = k8s_pod(name, {res("3g.40gb"): "1"}, annotations={ANN_ROOM: ann}, **kw)
    obj["spec"]["priority"] = prio
    obj["status"] = {"nominatedNodeName": node}
    return obj


def cluster() -> ClusterState:
    """After the eviction: n1's GPU 0 (halves) has its 3g.40gb at 4 free (the pending pod's room), n2's GPU 0
    holds its 4g.40gb and its 3g.40gb is free, n2's GPU 1 (halves) is free. Best fit puts a 3g.40gb on n1
    GPU 0 or n2 GPU 0 (the fuller GPUs), never on n2 GPU 1."""
    snap = ClusterState([mig_node("n1", HALVES), mig_node("n2", HALVES, HALVES)])
    held(snap, "n1-4g", 0, (0, 0, "4g.40gb"))
    held(snap, "n2-4g", 1, (0, 0, "4g.40gb"))
    return snap


ROOM = (MigSlot(0, 4, "3g.40gb"),)
TARGET = MigSlot(1, 4, "3g.40gb")  # the plan put the moved pod on n2 GPU 1: not where best fit would
STEER = (Steer("default", WEB, "n2", (TARGET,)),)


def land(snap: ClusterState, held_rooms: Reservations, pod: PodSpec) -> tuple[str, tuple[MigSlot, ...]]:
    """Where ``pod`` lands in a cycle tried inside the rooms (booked: the rooms go, the pod stays)."""
    with held_rooms.hold(snap, pod) as steered:
        r = schedule_one(profile("bestfit"), steered, snap)
    if not r.scheduled:
        return "", ()
    return snap.names[r.node], snap.allocations[pod.key].mig


def test_the_freed_slice_and_the_target_slice_are_kept_from_an_equal_pod() -> None:
    snap, held_rooms = cluster(), rooms()
    held_rooms.on_pod_event(parse_pod_event(pending("big", "n1", ROOM, STEER)))
    other = mig_pod("other", "3g.40gb", labels={"app": "api"})
    assert land(snap, held_rooms, other) == ("n2", (MigSlot(0, 4, "3g.40gb"),))
    late = mig_pod("late", "3g.40gb")  # the last free 3g.40gb's are the two held: it waits
    assert land(snap, held_rooms, late) == ("", ())
    assert set(snap.allocations) == {"default/n1-4g", "default/n2-4g", "default/other"}  # placeholders went


def test_the_replacement_takes_the_planned_slice_and_the_pending_pod_its_room() -> None:
    snap, held_rooms = cluster(), rooms()
    held_rooms.on_pod_event(parse_pod_event(pending("big", "n1", ROOM, STEER)))
    web = mig_pod("web-2", "3g.40gb", labels=dict(WEB), controller=RS)
    assert land(snap, held_rooms, web) == ("n2", (TARGET,))  # best fit alone: n1 GPU 0 or n2 GPU 0
    big = mig_pod("big", "3g.40gb")
    assert land(snap, held_rooms, big) == ("n1", ROOM)


def test_the_pending_pod_does_not_take_the_slice_kept_for_the_moved_pod() -> None:
    snap = ClusterState([mig_node("n1", HALVES), mig_node("n2", HALVES)])
    held(snap, "n1-3g", 0, (0, 4, "3g.40gb"))  # the moved pod has not left yet
    held_rooms = rooms()
    steer = (Steer("default", WEB, "n2", (MigSlot(0, 4, "3g.40gb"),)),)
    held_rooms.on_pod_event(parse_pod_event(pending("big", "n1", ROOM, steer)))
    assert land(snap, held_rooms, mig_pod("big", "3g.40gb")) == ("", ())


def test_a_room_of_higher_priority_is_not_kept_from_a_pod_above_it_and_an_expired_one_from_none() -> None:
    """With n2 GPU 0's 3g.40gb taken, the room's and the steer's are the only free 3g.40gb: a pod of
    higher priority takes the room's (best fit: the fuller GPU), the next one the steer's; once the plan
    lapsed, three pods of equal priority take all three."""
    snap = cluster()
    held(snap, "n2-3g", 1, (0, 4, "3g.40gb"))
    held_rooms = rooms()
    held_rooms.on_pod_event(parse_pod_event(pending("big", "n1", ROOM, STEER)))
    assert land(snap, held_rooms, mig_pod("urgent", "3g.40gb", priority=10)) == ("n1", ROOM)
    assert land(snap, held_rooms, mig_pod("urgent-2", "3g.40gb", priority=10)) == ("n2", (TARGET,))
    snap2, lapsed = cluster(), rooms(expires=NOW - 1)
    lapsed.on_pod_event(parse_pod_event(pending("big", "n1", ROOM, STEER)))
    assert land(snap2, lapsed, mig_pod("a", "3g.40gb"))[0] != ""
    assert land(snap2, lapsed, mig_pod("b", "3g.40gb"))[0] != ""
    assert land(snap2, lapsed, mig_pod("c", "3g.40gb"))[0] != ""  # all three 3g.40gb free to take


def test_the_room_annotation_round_trips_its_slices() -> None:
    ev = parse_pod_event(pending("big", "n1", ROOM, STEER))
    assert ev.room is not None and ev.room.mig == ROOM and ev.room.steer == STEER


PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
LAYOUTS = (
    HALVES,
    (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)),
    tuple(("1g.10gb", s) for s in range(7)),
)


@st.composite
def scenes(draw: st.DrawFn) -> tuple[ClusterState, list[dict[str, Any]], list[PodSpec]]:
    """Two or three nodes of one or two MIG GPUs cut from ``LAYOUTS``; one or two rooms, each with a steer,
    on free instances (no instance in two rooms); then pods of random profile, priority at most the rooms',
    labels that may match a steer."""
    layouts = [
        [draw(st.sampled_from(LAYOUTS)) for _ in range(draw(st.integers(1, 2)))]
        for _ in range(draw(st.integers(2, 3)))
    ]
    snap = ClusterState([mig_node(f"n{k}", *lay) for k, lay in enumerate(layouts)])
    free = [
        (snap.names[n], MigSlot(i, x.start, x.profile))
        for n, nd in enumerate(snap.nodes)
        if nd.mig is not None
        for i, g in zip(nd.mig.indices, nd.mig.gpus, strict=True)
        for x in g.instances
    ]
    picks = draw(st.lists(st.sampled_from(range(len(free))), min_size=2, max_size=4, unique=True))
    objs = []
    for r in range(len(picks) // 2):
        (node, slot), (tnode, target) = free[picks[2 * r]], free[picks[2 * r + 1]]
        steer = (Steer("default", (("app", f"moved{r}"),), tnode, (target,)),)
        ann = room_annotation(node, (), steer, plan=PLAN, expires=NOW + 60, mig=(slot,))
        obj = k8s_pod(f"room{r}", {res(slot.profile): "1"}, annotations={ANN_ROOM: ann})
        obj["spec"]["priority"] = 5
        obj["status"] = {"nominatedNodeName": node}
        objs.append(obj)
    pods = []
    for k in range(draw(st.integers(1, 10))):
        labels = {"app": draw(st.sampled_from(["moved0", "moved1", "api"]))}
        pods.append(
            mig_pod(f"p{k}", draw(st.sampled_from(PROFILES)), labels=labels, priority=draw(st.integers(0, 5)))
        )
    return snap, objs, pods


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_a_held_mig_room_is_never_given_to_another_pod(
    scene: tuple[ClusterState, list[dict[str, Any]], list[PodSpec]],
) -> None:
    """Property: pods arrive one by one, each tried inside the rooms and booked where it lands. No pod takes
    a room's slice but the pod it is kept for, and no pod takes a steer's slice but a replacement the steer
    matches (its labels)."""
    snap, objs, pods = scene
    keys = tuple(f"default/{o['metadata']['name']}" for o in objs)
    held_rooms = rooms(keys)
    kept: dict[tuple[str, MigSlot], str] = {}  # slice -> the labels (steer) or pod key (room) it is kept for
    for o in objs:
        ev = parse_pod_event(o)
        held_rooms.on_pod_event(ev)
        assert ev.room is not None
        kept[(ev.room.node, ev.room.mig[0])] = ev.key
        s = ev.room.steer[0]
        kept[(s.node, s.mig[0])] = dict(s.labels)["app"]
    for pod in pods:
        node, slots = land(snap, held_rooms, pod)
        for x in slots:
            owner = kept.get((node, x))
            assert owner is None or owner == pod.labels["app"], f"{pod.key} took {node} {x}, kept for {owner}"


def test_a_re_cut_room_keeps_the_freed_slices_for_the_pending_pod() -> None:
    """The pending pod lands after the scheduler re-cuts the freed slices (a 2g.20gb from two 1g.10gb): its
    room names the freed slices, each held from an equal pod, though the pod itself does not fit there yet."""
    snap = ClusterState([mig_node("n1", LAYOUTS[2])])
    freed = (MigSlot(0, 0, "1g.10gb"), MigSlot(0, 1, "1g.10gb"))
    held_rooms = rooms()
    obj = pending("big", "n1", freed)
    obj["spec"]["containers"][0]["resources"]["requests"] = {res("2g.20gb"): "1"}
    held_rooms.on_pod_event(parse_pod_event(obj))
    got = [land(snap, held_rooms, mig_pod(f"small-{k}", "1g.10gb"))[1] for k in range(6)]
    assert all(x not in freed for slots in got for x in slots)
    assert got[-1] == ()  # five 1g.10gb were left to take


def test_doctor_names_a_mig_rooms_slices_and_those_kept_for_the_moved_pods() -> None:
    snap = snapshot_of_state(cluster(), [mig_pod("big", "3g.40gb"), mig_pod("small", "3g.40gb")])
    objs = {p["metadata"]["name"]: p for p in snap.pods}
    objs["big"]["metadata"]["annotations"][ANN_ROOM] = pending("big", "n1", ROOM, STEER)["metadata"][
        "annotations"
    ][ANN_ROOM]
    objs["big"]["status"]["nominatedNodeName"] = "n1"
    (found,) = [f for f in doctor_pod(Books.of(snap), "default/small").findings if f.code == "defrag-room"]
    assert (
        "node n1 MIG slices 3g.40gb on GPU 0 at 4 for default/big, and for the pods it moves MIG slices "
        "3g.40gb on GPU 1 at 4 on node n2 (plan p1" in found.message
    )
    assert found.evidence["mig"] == [{"gpu": 0, "start": 4, "profile": "3g.40gb"}]


def test_the_controller_writes_a_re_cut_plans_room_with_the_freed_slices_and_the_moved_pods_slice() -> None:
    """``room_for`` answers with a re-cut (no placement): the controller's room for the pending pod names the
    slices its moves free, on their node, and the steer the slice the moved pod takes."""
    snap = ClusterState([mig_node("a", BALANCED, HALVES), mig_node("b", BALANCED)])
    held(snap, "small", 0, (0, 2, "1g.10gb"), controller=RS, labels={"app": "small"})  # blocks a 4g at 0
    held(snap, "h4", 0, (1, 0, "4g.40gb"))
    held(snap, "h3", 0, (1, 4, "3g.40gb"))
    held(snap, "b2", 1, (0, 0, "2g.20gb"))
    held(snap, "b3", 1, (0, 4, "3g.40gb"))
    shot = snapshot_of_state(snap, [mig_pod("w", "4g.40gb")])
    for p in shot.pods:
        p["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
        if not p["spec"].get("nodeName"):
            p["spec"]["schedulerName"] = "gpusched"
    books = Books.of(shot)
    ctl = DefragController(
        client.ApiClient(), lambda: books, ControllerConfig(), wall=lambda: NOW, ledger=Ledger()
    )
    patched: dict[str, Any] = {}

    def patch(name: str, ns: str, body: dict[str, Any], **kw: Any) -> None:
        patched.update(body["metadata"]["annotations"])

    ctl.core.patch_namespaced_pod = patch  # type: ignore[method-assign]
    ctl.core.patch_namespaced_pod_status = lambda name, ns, body, **kw: None  # type: ignore[method-assign]
    ctl.events.about = lambda *a, **kw: None  # type: ignore[method-assign]
    group = ctl._target(books)
    assert group is not None and [p.key for p in group] == ["default/w"]
    plan = ctl._plan(books, group)
    assert plan.feasible and not plan.placements and "after re-cutting it" in plan.reason
    (mv,) = plan.moves
    ctl._reserve(books, plan)
    room = json.loads(patched[ANN_ROOM])
    assert room["node"] == "a" and room["mig"] == [{"gpu": 0, "start": 2, "profile": "1g.10gb"}]
    (steer,) = room["steer"]
    assert steer["node"] == mv.to_node and steer["labels"] == {"app": "small"}
    assert steer["mig"] == [{"gpu": x.gpu, "start": x.start, "profile": x.profile} for x in mv.to_mig]
    ctl.events.stop()


class Ledger:
    """The Lease's record, in memory: plans only (this test moves nothing)."""

    def __init__(self) -> None:
        self.record: PlanRecord | None = None

    def moves(self, now: float) -> list[tuple[float, str]]:
        return []

    def set_plan(self, record: PlanRecord) -> None:
        self.record = record
