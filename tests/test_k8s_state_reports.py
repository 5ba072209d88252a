"""What the scheduler's books (gpusched.k8s.state.LiveCluster) tell the cluster, without a control plane:
two bound pods whose assignments overlap (issue 28 F3: a forged gpusched.io/assignment) keep the earlier
holder, by binding time, and name the newcomer in an event; a Node that cannot be read gets one event per
change (issue 28 F5), not a WARNING on every update; a bound GPU share without its gpusched.io/gpu-share
slot gets a Warning event (issue 29 item 7). Events go through the real EventRecorder onto a fake API."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from builders import k8s_node, k8s_pod
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.state import LiveCluster

ANN_UNHEALTHY = "gpusched.io/unhealthy-gpus"


class FakeCore:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_kw: Any) -> None:
        self.events.append(body)


@pytest.fixture
def api() -> tuple[FakeCore, EventRecorder]:
    core = FakeCore()
    rec = EventRecorder(core, "gpusched")
    yield core, rec
    rec.stop()


def sent(core: FakeCore, rec: EventRecorder) -> list[tuple[str, str, str, str]]:
    """(kind/name, type, reason, message) of the events written so far."""
    rec.flush()
    out = []
    for e in core.events:
        inv = e["involvedObject"]
        out.append((f"{inv['kind']}/{inv['name']}", e["type"], e["reason"], e["message"]))
    return out


def bound(
    name: str, gpus: str, at: str, res: dict[str, str] | None = None, node: str = "n"
) -> dict[str, Any]:
    """A pod bound to ``node`` at ``at`` (its PodScheduled condition), carrying the assignment ``gpus``."""
    obj = k8s_pod(name, res or {"nvidia.com/gpu": "1"}, limits=True, node_name=node)
    obj["metadata"]["creationTimestamp"] = at
    obj["metadata"]["annotations"][ANN_ASSIGNMENT] = f'{{"node":"{node}","gpus":{gpus},"milli":1000}}'
    obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at}]
    return obj


def booked(lc: LiveCluster) -> dict[str, tuple[int, ...]]:
    with lc.live_books() as st:
        return {k: a.gpus for k, a in st.allocations.items()}


# ------------------------------------------------------------------- F3: overlapping assignments
VICTIM = bound("victim", "[0]", "2026-12-07T04:00:00Z")
FORGED = bound("forged", "[0]", "2026-12-07T04:05:00Z")  # sorts before "victim" by key


@pytest.mark.parametrize("order", ["victim-first", "forged-first"])
def test_rebuild_keeps_the_earlier_holder_and_names_the_newcomer(
    api: tuple[FakeCore, EventRecorder], order: str
) -> None:
    """A restarted scheduler sees both pods bound on GPU 0 (whichever its informer delivers first): the
    victim, bound first, is booked on it; the forged pod is the conflict, named with the victim in an
    event on it. Booked in key order, the victim was the one reported."""
    core, rec = api
    lc = LiveCluster(reporter=rec)
    lc.upsert_node(k8s_node("n", 2))
    for p in (VICTIM, FORGED) if order == "victim-first" else (FORGED, VICTIM):
        lc.upsert_pod(copy.deepcopy(p))
    books = booked(lc)
    assert books["default/victim"] == (0,)
    assert [c.split(":", 1)[0] for c in lc.conflicts] == ["default/forged"]
    (event,) = sent(core, rec)
    assert event[:3] == ("Pod/forged", "Warning", "GPUAssignmentConflict")
    assert "pod default/forged (bound 2026-12-07T04:05:00Z)" in event[3]
    assert "held by default/victim (bound 2026-12-07T04:00:00Z), bound before it" in event[3]


def test_a_forged_pod_seen_live_is_named_with_the_holder(api: tuple[FakeCore, EventRecorder]) -> None:
    core, rec = api
    lc = LiveCluster(reporter=rec)
    lc.upsert_node(k8s_node("n", 2))
    lc.upsert_pod(copy.deepcopy(VICTIM))
    assert booked(lc) == {"default/victim": (0,)}  # the books exist: the next pod is booked into them
    lc.upsert_pod(copy.deepcopy(FORGED))
    (event,) = sent(core, rec)
    assert event[0] == "Pod/forged" and "held by default/victim" in event[3]
    lc.upsert_pod(copy.deepcopy(VICTIM))  # an update of the holder: no new conflict, no new event
    assert len(sent(core, rec)) == 1


def test_the_kubelets_time_stands_for_a_pod_created_bound() -> None:
    """A pod created with spec.nodeName has no binding: the kubelet's PodScheduled time (later than its
    creation) or, without it, the creation time orders it."""
    lc = LiveCluster()
    lc.upsert_node(k8s_node("n", 1))
    early = bound("b-early", "[0]", "2026-12-07T04:00:00Z")
    late = bound("a-late", "[0]", "2026-12-07T04:00:00Z")
    late["metadata"]["creationTimestamp"] = "2026-12-07T03:00:00Z"  # created first, bound later
    late["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-07T04:00:01Z"
    lc.upsert_pod(late)
    lc.upsert_pod(early)
    booked(lc)
    assert [c.split(":", 1)[0] for c in lc.conflicts] == ["default/a-late"]


# ------------------------------------------------------------------------ F5: unreadable nodes
def bad_node(value: str = "x", gpus: int = 2) -> dict[str, Any]:
    obj = k8s_node("n", gpus)
    obj["metadata"]["uid"] = "uid-n"
    obj["metadata"]["annotations"] = {ANN_UNHEALTHY: value}
    return obj


@pytest.mark.parametrize("known", [False, True])
def test_an_unreadable_node_gets_one_event_per_change(
    api: tuple[FakeCore, EventRecorder], caplog: pytest.LogCaptureFixture, known: bool
) -> None:
    core, rec = api
    lc = LiveCluster(reporter=rec)
    if known:
        lc.upsert_node(k8s_node("n", 2))
    with caplog.at_level(logging.WARNING, logger="gpusched.k8s.state"):
        for _ in range(5):  # the Node's heartbeats: the same object, again and again
            lc.upsert_node(bad_node("x"))
    assert len([r for r in caplog.records if "node n" in r.getMessage()]) == 1
    events = sent(core, rec)
    assert [e[:3] for e in events] == [("Node/n", "Warning", "NodeUnreadable")]
    verb = "withheld from new pods" if known else "ignored"
    assert (
        verb in events[0][3] and "gpusched.io/unhealthy-gpus 'x' is not a list of GPU indices" in events[0][3]
    )
    assert "n" in lc.unreadable
    lc.upsert_node(bad_node("y"))  # another reason: news
    lc.upsert_node(k8s_node("n", 2) | {"metadata": {"name": "n", "uid": "uid-n"}})  # reads again
    assert "n" not in lc.unreadable
    lc.upsert_node(bad_node("x"))  # broken again as the first time: news again
    assert [e[1:3] for e in sent(core, rec)] == [
        ("Warning", "NodeUnreadable"),
        ("Warning", "NodeUnreadable"),
        ("Normal", "NodeReadable"),
        ("Warning", "NodeUnreadable"),
    ]


def test_a_new_leader_reports_the_nodes_unreadable_now(api: tuple[FakeCore, EventRecorder]) -> None:
    core, rec = api
    lc = LiveCluster()  # a standby replica: its informers run, it reports nothing
    lc.upsert_node(bad_node())
    lc.report_to(rec)  # it leads
    assert [e[:3] for e in sent(core, rec)] == [("Node/n", "Warning", "NodeUnreadable")]
    lc.sync_nodes([])  # the node is deleted
    assert lc.unreadable == {}


# ------------------------------------------------------------------ item 7: a share without slot
def share(name: str, slot: bool) -> dict[str, Any]:
    obj = bound(name, "[1]", "2026-12-07T04:00:00Z", {"gpusched.io/gpu-milli": "300"})
    if slot:
        obj["spec"]["containers"][0]["resources"]["limits"]["gpusched.io/gpu-share"] = "1"
    return obj


@pytest.mark.parametrize(
    ("slots_offered", "slot", "warned"), [(True, False, True), (True, True, False), (False, False, False)]
)
def test_a_share_without_its_slot_is_warned_where_the_agent_offers_slots(
    api: tuple[FakeCore, EventRecorder], slots_offered: bool, slot: bool, warned: bool
) -> None:
    """Where the node's device plugin offers gpusched.io/gpu-share (gpusched's agent), a bound share
    without the slot never reaches it and runs with no GPU isolation: a Warning event says so. Without
    the agent (no slots offered) the missing slot changes nothing."""
    core, rec = api
    lc = LiveCluster(reporter=rec)
    node = k8s_node("n", 2)
    if slots_offered:
        node["status"]["allocatable"]["gpusched.io/gpu-share"] = "32"
    lc.upsert_node(node)
    lc.upsert_pod(share("s", slot))
    events = sent(core, rec)
    if warned:
        (event,) = events
        assert event[:3] == ("Pod/s", "Warning", "GPUShareWithoutSlot")
        assert "booked on GPU 1 of node n" in event[3] and "no GPU isolation" in event[3]
    else:
        assert events == []


# ------------------------------------------------------------------------------------------ doctor
def test_doctor_names_the_unreadable_node_and_the_share_without_slot() -> None:
    from gpusched.doctor.analysis import doctor_cluster
    from gpusched.doctor.books import Books
    from gpusched.doctor.snapshot import Snapshot

    node = k8s_node("n", 2)
    node["status"]["allocatable"]["gpusched.io/gpu-share"] = "32"
    broken = bad_node() | {"metadata": {**bad_node()["metadata"], "name": "broken"}}
    snap = Snapshot([node, broken], [share("s", slot=False), share("t", slot=True)], "test")
    findings = {(f.code, f.subject) for f in doctor_cluster(Books.of(snap)).findings}
    assert ("unreadable", "node/broken") in findings
    assert ("share-without-slot", "default/s") in findings
    assert not any(code == "share-without-slot" and subject == "default/t" for code, subject in findings)
