"""The room defragmentation frees is kept for the pod it was made for (``k8s/reservation.py``)."""

from __future__ import annotations

import json
from typing import Any

from builders import k8s_pod, node, profile, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.scheduler import schedule_one
from gpusched.doctor import Books, doctor_pod, snapshot_of_state
from gpusched.k8s.podevents import Kind, parse_pod_event
from gpusched.k8s.reservation import (
    ANN_PLAN,
    ANN_ROOM,
    LeaseRecord,
    PlanRecord,
    Reservations,
    Steer,
    room_annotation,
)

NOW = 1_800_000_000.0
PLAN = "p1"


def record(
    plan: str = PLAN, expires: float = NOW + 60, pods: tuple[str, ...] = ("default/big",)
) -> PlanRecord:
    return PlanRecord(plan, pods, "defrag-0", expires)


def backed(rec: PlanRecord | None = None, now: float = NOW) -> Reservations:
    """Rooms as the scheduler holds them when the controller's Lease records ``rec`` (the plan
    of ``pending_big`` by default) and the clock reads ``now``."""
    rec = rec or record()
    return Reservations(lambda wanted: rec, wall=lambda: now)


def pending_big(
    node_name: str = "n1",
    gpus: tuple[int, ...] = (0, 1),
    prio: int = 0,
    plan: str = PLAN,
    expires: float = NOW + 60,
    **kw: Any,
) -> dict[str, Any]:
    room = room_annotation(node_name, gpus, plan=plan, expires=expires)
    obj = k8s_pod("big", {"nvidia.com/gpu": "2"}, annotations={ANN_ROOM: room}, **kw)
    obj["spec"]["priority"] = prio
    obj["status"] = {"nominatedNodeName": node_name}
    return obj


def cluster() -> ClusterState:
    """n1: GPU 0 half taken (the last pod to move), GPU 1 free; n2: two free GPUs (bestfit
    prefers n1, the fuller)."""
    st = ClusterState([node("n1", 2), node("n2", 2)])
    st.assume(share("last", 500), 0, [0])
    return st


def place(st: ClusterState, res: Reservations, pod: Any) -> str:
    with res.hold(st, pod) as steered:
        r = schedule_one(profile("bestfit"), steered, st, assume=False)
    return st.names[r.node] if r.scheduled else ""


def test_a_room_not_yet_free_keeps_its_free_part_from_pods_of_equal_priority() -> None:
    st = cluster()
    res = backed()
    res.on_pod_event(parse_pod_event(pending_big()))
    before = st.gpu_free.copy()
    assert place(st, backed(), share("recreated", 400)) == "n1"  # without the room
    assert place(st, res, share("recreated", 400)) == "n2"
    assert (st.gpu_free == before).all() and "default/big#room0" not in st.allocations
    assert place(st, res, whole("one", 1)) == "n2"


def test_pods_of_higher_priority_are_not_held_back() -> None:
    st = cluster()
    res = backed()
    res.on_pod_event(parse_pod_event(pending_big(prio=0)))
    assert place(st, res, share("urgent", 400, priority=10)) == "n1"


def test_a_room_that_fits_now_is_held_whole_and_the_pod_itself_takes_it() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2)])
    st.assume(share("x", 500), 1, [0])
    res = backed()
    res.on_pod_event(parse_pod_event(pending_big()))
    assert place(st, res, share("s", 400)) == "n2"
    big = whole("big", 2)
    assert place(st, res, big) == "n1"


def test_the_room_goes_when_the_pod_binds_is_deleted_or_loses_its_nomination() -> None:
    res = backed()
    res.on_pod_event(parse_pod_event(pending_big()))
    assert len(res) == 1
    bound = pending_big()
    bound["spec"]["nodeName"] = "n1"
    res.on_pod_event(parse_pod_event(bound))
    assert len(res) == 0
    res.on_pod_event(parse_pod_event(pending_big()))
    res.on_pod_event(parse_pod_event(pending_big(), Kind.DELETE))
    assert len(res) == 0
    res.on_pod_event(parse_pod_event(pending_big()))
    moved = pending_big()
    moved["status"] = {"nominatedNodeName": "n2"}  # nominated elsewhere by someone else: not our room
    res.on_pod_event(parse_pod_event(moved))
    assert len(res) == 0


def test_an_unreadable_room_holds_nothing() -> None:
    res = backed()
    obj = pending_big()
    obj["metadata"]["annotations"][ANN_ROOM] = "{not json"
    res.on_pod_event(parse_pod_event(obj))
    assert len(res) == 0


def test_a_recreated_pod_is_steered_to_where_the_plan_put_the_pod_it_replaces() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2), node("n3", 2)])
    st.assume(share("last", 500), 0, [0])
    st.assume(share("other", 300), 1, [0])  # bestfit's choice for a 400 share: n2, the fuller
    obj = pending_big()
    steer = [Steer("default", (("app", "web"),), "n3")]
    obj["metadata"]["annotations"][ANN_ROOM] = room_annotation(
        "n1", (0, 1), steer, plan=PLAN, expires=NOW + 60
    )
    res = backed()
    res.on_pod_event(parse_pod_event(obj))
    assert place(st, res, share("web-2", 400, labels={"app": "web"})) == "n3"
    assert place(st, res, share("api-1", 400, labels={"app": "api"})) == "n2"  # other labels: not steered
    full = ClusterState([node("n1", 2), node("n2", 2), node("n3", 1)])
    full.assume(share("last", 500), 0, [0])
    full.assume(whole("n3-full", 1), 2, [0])
    assert place(full, res, share("web-3", 400, labels={"app": "web"})) == "n2"  # no room there: elsewhere


# ---------------------------------------------------------- rooms the controller's record backs
def test_a_hand_written_room_holds_nothing() -> None:
    """Issue 28 F4: a room with no plan, or a plan the controller's Lease does not record, is
    ignored: the 400 share lands on n1 as if there were no room, and no message names it."""
    st = cluster()
    for obj, res in (
        (pending_big(plan=""), backed()),  # names no plan
        (pending_big(plan="forged"), backed()),  # a plan the Lease does not record
        (pending_big(), Reservations(lambda wanted: None, wall=lambda: NOW)),  # the Lease records none
        (pending_big(), backed(record(pods=("default/other",)))),  # the plan is for another pod
    ):
        res.on_pod_event(parse_pod_event(obj))
        assert len(res) == 1  # seen, not held
        assert place(st, res, share("recreated", 400)) == "n1"
        assert res.note(share("recreated", 400)) == ""


def test_a_stale_room_expires() -> None:
    st = cluster()
    res = backed(now=NOW + 59)
    res.on_pod_event(parse_pod_event(pending_big(expires=NOW + 60)))
    assert place(st, res, share("recreated", 400)) == "n2"  # held until it lapses
    later = backed(now=NOW + 61)
    later.on_pod_event(parse_pod_event(pending_big(expires=NOW + 60)))
    assert place(st, later, share("recreated", 400)) == "n1"  # lapsed: the node is open again
    gone = backed(record(expires=NOW + 10), now=NOW + 30)  # the Lease's plan lapsed first
    gone.on_pod_event(parse_pod_event(pending_big(expires=NOW + 60)))
    assert place(st, gone, share("recreated", 400)) == "n1"


def test_the_blocked_pods_message_names_the_room() -> None:
    res = backed(now=NOW + 20)
    res.on_pod_event(parse_pod_event(pending_big()))
    note = res.note(share("recreated", 400))
    held = "node n1 GPUs [0, 1] for default/big (plan p1, until 2027-01-15T08:01:00Z)"
    assert note == f" Defragmentation holds: {held}."
    assert res.note(share("urgent", 400, priority=10)) == ""  # not held against higher priority


class FakeLeases:
    """``read_namespaced_lease`` of one Lease, counting the reads."""

    def __init__(self, holder: str, rec: PlanRecord | None) -> None:
        self.reads = 0
        ann = {ANN_PLAN: rec.annotation()} if rec else {}
        self.body: dict[str, Any] = {
            "metadata": {"name": "l", "annotations": ann},
            "spec": {"holderIdentity": holder},
        }

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any:
        self.reads += 1
        return type("R", (), {"data": json.dumps(self.body).encode()})()


def test_the_lease_backs_only_its_holders_plan_and_is_read_at_most_every_refresh() -> None:
    clock = [0.0]
    leases = FakeLeases("defrag-0", record())
    rec = LeaseRecord(leases, "ns", "l", refresh_s=2.0, clock=lambda: clock[0])
    assert rec() == record() and rec() == record() and leases.reads == 1
    clock[0] = 2.5
    leases.body["spec"]["holderIdentity"] = "defrag-1"  # a new leader: the former one's plan lapses
    assert rec() is None and leases.reads == 2
    leases.body["spec"]["holderIdentity"] = "defrag-0"
    clock[0] = 2.6
    assert rec() is None and leases.reads == 2  # cached
    assert rec(["p1"]) is None and leases.reads == 2  # a room names an unrecorded plan: not yet
    clock[0] = 2.8
    assert rec(["p1"]) == record() and leases.reads == 3  # re-read at once (recheck_s), not at refresh_s
    assert LeaseRecord(FakeLeases("", record()), "ns", "l")() == record()  # no holder: no election


def test_doctor_names_the_rooms_that_may_keep_a_pod_off_and_the_hand_written_ones() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2)])
    big, hand = whole("big", 2), whole("hand", 2)
    snap = snapshot_of_state(st, [big, hand, share("small", 400)])
    objs = {p["metadata"]["name"]: p for p in snap.pods}
    for name, plan, n in (("big", PLAN, "n1"), ("hand", "", "n2")):
        room = room_annotation(n, (0, 1), plan=plan, expires=NOW + 60 if plan else 0)
        objs[name]["metadata"]["annotations"][ANN_ROOM] = room
        objs[name]["status"]["nominatedNodeName"] = n
    books = Books.of(snap)
    found = {f.subject: f for f in doctor_pod(books, "default/small").findings if f.code == "defrag-room"}
    assert (
        "node n1 GPUs [0, 1] for default/big (plan p1, expires 2027-01-15T08:01:00Z"
        in found["default/big"].message
    )
    assert "names no plan, so the scheduler holds nothing for it" in found["default/hand"].message
    own = [f for f in doctor_pod(books, "default/big").findings if f.code == "defrag-room-own"]
    assert len(own) == 1 and "plan p1" in own[0].message
