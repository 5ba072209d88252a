"""The room defragmentation frees is kept for the pod it was made for (``k8s/reservation.py``)."""

from __future__ import annotations

from typing import Any

from builders import k8s_pod, node, profile, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.reservation import ANN_ROOM, Reservations, Steer, room_annotation


def pending_big(
    node_name: str = "n1", gpus: tuple[int, ...] = (0, 1), prio: int = 0, **kw: Any
) -> dict[str, Any]:
    obj = k8s_pod(
        "big", {"nvidia.com/gpu": "2"}, annotations={ANN_ROOM: room_annotation(node_name, gpus)}, **kw
    )
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
    res = Reservations()
    res.observe(pending_big())
    before = st.gpu_free.copy()
    assert place(st, Reservations(), share("recreated", 400)) == "n1"  # without the room
    assert place(st, res, share("recreated", 400)) == "n2"
    assert (st.gpu_free == before).all() and "default/big#room0" not in st.allocations
    assert place(st, res, whole("one", 1)) == "n2"


def test_pods_of_higher_priority_are_not_held_back() -> None:
    st = cluster()
    res = Reservations()
    res.observe(pending_big(prio=0))
    assert place(st, res, share("urgent", 400, priority=10)) == "n1"


def test_a_room_that_fits_now_is_held_whole_and_the_pod_itself_takes_it() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2)])
    st.assume(share("x", 500), 1, [0])
    res = Reservations()
    res.observe(pending_big())
    assert place(st, res, share("s", 400)) == "n2"
    big = whole("big", 2)
    assert place(st, res, big) == "n1"


def test_the_room_goes_when_the_pod_binds_is_deleted_or_loses_its_nomination() -> None:
    res = Reservations()
    res.observe(pending_big())
    assert len(res) == 1
    bound = pending_big()
    bound["spec"]["nodeName"] = "n1"
    res.observe(bound)
    assert len(res) == 0
    res.observe(pending_big())
    res.observe(pending_big(), deleted=True)
    assert len(res) == 0
    res.observe(pending_big())
    moved = pending_big()
    moved["status"] = {"nominatedNodeName": "n2"}  # nominated elsewhere by someone else: not our room
    res.observe(moved)
    assert len(res) == 0


def test_an_unreadable_room_holds_nothing() -> None:
    res = Reservations()
    obj = pending_big()
    obj["metadata"]["annotations"][ANN_ROOM] = "{not json"
    res.observe(obj)
    assert len(res) == 0


def test_a_recreated_pod_is_steered_to_where_the_plan_put_the_pod_it_replaces() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2), node("n3", 2)])
    st.assume(share("last", 500), 0, [0])
    st.assume(share("other", 300), 1, [0])  # bestfit's choice for a 400 share: n2, the fuller
    obj = pending_big()
    steer = [Steer("default", (("app", "web"),), "n3")]
    obj["metadata"]["annotations"][ANN_ROOM] = room_annotation("n1", (0, 1), steer)
    res = Reservations()
    res.observe(obj)
    assert place(st, res, share("web-2", 400, labels={"app": "web"})) == "n3"
    assert place(st, res, share("api-1", 400, labels={"app": "api"})) == "n2"  # other labels: not steered
    full = ClusterState([node("n1", 2), node("n2", 2), node("n3", 1)])
    full.assume(share("last", 500), 0, [0])
    full.assume(whole("n3-full", 1), 2, [0])
    assert place(full, res, share("web-3", 400, labels={"app": "web"})) == "n2"  # no room there: elsewhere
