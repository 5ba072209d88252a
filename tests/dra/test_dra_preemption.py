"""Preemption of pods that hold DRA devices (issue 32 item 3): the what-if frees a victim's claims only
when no pod that stays consumes them (core/plugins/preemption.py with ``LEAVING``, DynamicResources'
Filter run again, ``DraBooks.allocated_without``), and victims are chosen fewest and lowest first.

The property: after any sequence of preemptions, each carried out as the API and kube-controller-
manager's resourceclaim controller carry it out (victims out of ``reservedFor``, a claim with no
consumer left deallocated, the preemptor's claim written on the nominated node), the books equal
the union of the live claims' allocations, no device is held by two claims, and what the what-if
predicted to be free is what the controller freed."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from k8s_objects import DRIVER, allocation, claim, device_class, gpu_device, gpu_slice, pod, whole

from gpusched.core.cluster import ClusterState
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import DeviceId, Node
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.claims import DraClaims
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.podclaims import Ready, resolve

Obj = dict[str, Any]


class World:
    """The API's claims and pods (bound pods in the snapshot), the books fed from them as an informer
    would, and the controller's deallocation when consumers go."""

    def __init__(self, nodes: dict[str, int]) -> None:
        self.books = DraBooks(CelCompiler())
        self.books.upsert_class(device_class("gpu"))
        for n, gpus in nodes.items():
            self.books.upsert_slice(gpu_slice(n, [gpu_device(i) for i in range(gpus)]))
        self.snap = ClusterState([NodeSpec(n, 64000, 65536) for n in nodes])
        self.claims: dict[str, Obj] = {}  # name -> the API object
        self.seq = 0

    def _show(self, name: str) -> None:
        self.books.upsert_claim(copy.deepcopy(self.claims[name]))

    def holder(
        self, name: str, node: str, devices: tuple[str, ...], consumers: list[tuple[str, int]]
    ) -> None:
        """A claim ``name`` allocated ``devices`` on ``node``, reserved for and used by the bound pods
        ``consumers`` (name, priority)."""
        c = claim(name, [whole(count=len(devices))], allocation=allocation(node, *devices))
        c["status"]["reservedFor"] = [
            {"resource": "pods", "name": p, "uid": f"uid-{p}"} for p, _ in consumers
        ]
        self.claims[name] = c
        self._show(name)
        n = self.snap.names.index(node)
        for p, prio in consumers:
            if f"ns/{p}" not in self.snap.allocations:
                self.snap.assume(
                    PodSpec(p, cpu_milli=100, namespace="ns", priority=prio, uid=f"uid-{p}"), n, ()
                )

    def preemptor(self, name: str, prio: int, count: int = 1) -> PodSpec:
        self.claims[f"{name}-gpu"] = claim(f"{name}-gpu", [whole(count=count)])
        self._show(f"{name}-gpu")
        r = resolve(pod(name, [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]), self.books)
        assert isinstance(r, Ready)
        return PodSpec(name, cpu_milli=100, namespace="ns", priority=prio, uid=f"uid-{name}", claims=r.claims)

    def evict(self, victims: tuple[str, ...]) -> None:
        """The victims go; the resourceclaim controller takes them out of ``reservedFor`` and
        deallocates a claim left with no consumer (kube-controller-manager 1.37)."""
        names = {v.split("/", 1)[1] for v in victims}
        for v in victims:
            self.snap.forget(v)
        for name, c in self.claims.items():
            status = c.get("status") or {}
            before = status.get("reservedFor") or []
            after = [r for r in before if r["name"] not in names]
            if len(after) == len(before):
                continue
            status["reservedFor"] = after
            if not after:
                status.pop("allocation", None)
            self._show(name)

    def write(self, p: PodSpec, node: str) -> None:
        """The writer's result as the informer shows it: the preemptor's claim allocated, reserved."""
        res = self.books.reservation(p.key)
        assert res is not None and res.node == node
        for a in res.allocations:
            c = self.claims[a.claim.split("/", 1)[1]]
            c["status"] = {
                "allocation": allocation(node, *(r.device for r in a.results)),
                "reservedFor": [{"resource": "pods", "name": p.name, "uid": p.uid}],
            }
            self._show(a.claim.split("/", 1)[1])
        assert self.snap.allocations[p.key].node == self.snap.names.index(node)  # schedule_one assumed it

    def live_union(self) -> frozenset[DeviceId]:
        """The devices the API's claims with a live consumer hold, checking none is held twice."""
        seen: list[DeviceId] = []
        for c in self.claims.values():
            status = c.get("status") or {}
            if "allocation" not in status:
                continue
            assert status.get("reservedFor"), "an allocated claim with no consumer left is deallocated"
            for r in status["allocation"]["devices"]["results"]:
                seen.append(DeviceId(r["driver"], r["pool"], r["device"]))
        assert len(seen) == len(set(seen)), f"a device allocated to two claims: {sorted(seen)}"
        return frozenset(seen)


def preempt(w: World, p: PodSpec) -> tuple[str, tuple[str, ...]]:
    r = schedule_one(make_profile("bestfit", preemption=True), p, w.snap)
    assert not r.scheduled, "the preemptor fits somewhere without preemption"
    assert r.nominated_node >= 0, r.status.message()
    return w.snap.names[r.nominated_node], r.victims


def test_a_low_priority_claim_holder_is_the_victim_and_its_device_goes_to_the_preemptor() -> None:
    w = World({"node-a": 2})
    w.holder("c0", "node-a", ("gpu-0",), [("hi", 100)])
    w.holder("c1", "node-a", ("gpu-1",), [("lo", 1)])
    p = w.preemptor("pre", 50)
    node, victims = preempt(w, p)
    assert (node, victims) == ("node-a", ("ns/lo",))
    assert w.books.allocated_without(victims).devices == {DeviceId(DRIVER, "node-a", "gpu-0")}
    w.evict(victims)
    r = schedule_one(make_profile("bestfit", preemption=True), p, w.snap)
    assert r.scheduled and r.node_name == "node-a"
    w.write(p, "node-a")
    assert w.claims["pre-gpu"]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
    assert w.books.allocated().devices == w.live_union()


def test_a_shared_claim_is_freed_only_when_every_consumer_goes() -> None:
    """gpu-0's claim is shared by a low- and a high-priority pod: evicting the low one frees
    nothing, so there is no preemption; shared by two low ones, both are the victims."""
    w = World({"node-a": 1})
    w.holder("c0", "node-a", ("gpu-0",), [("lo", 1), ("hi", 100)])
    p = w.preemptor("pre", 50)
    r = schedule_one(make_profile("bestfit", preemption=True), p, w.snap)
    assert not r.scheduled and r.nominated_node < 0 and not r.victims

    w = World({"node-a": 1})
    w.holder("c0", "node-a", ("gpu-0",), [("lo", 1), ("lo2", 2)])
    p = w.preemptor("pre", 50)
    node, victims = preempt(w, p)
    assert (node, sorted(victims)) == ("node-a", ["ns/lo", "ns/lo2"])


def test_a_claim_reserved_for_something_other_than_a_pod_is_never_freed() -> None:
    w = World({"node-a": 1})
    w.holder("c0", "node-a", ("gpu-0",), [("lo", 1)])
    w.claims["c0"]["status"]["reservedFor"].append({"apiGroup": "batch", "resource": "jobs", "name": "j"})
    w._show("c0")
    r = schedule_one(make_profile("bestfit", preemption=True), w.preemptor("pre", 50), w.snap)
    assert not r.scheduled and not r.victims


def test_victims_are_the_lowest_priority_then_the_fewest() -> None:
    """As for GPUs (kube-scheduler's pickOneNodeForPreemption): the lowest highest-victim priority,
    then the smallest sum of priorities (fewer victims)."""
    w = World({"node-a": 1, "node-b": 1, "node-c": 1})
    w.holder("ca", "node-a", ("gpu-0",), [("a1", 3), ("a2", 3)])  # two victims, priority 3
    w.holder("cb", "node-b", ("gpu-0",), [("b1", 5)])  # one, priority 5
    w.holder("cc", "node-c", ("gpu-0",), [("c1", 3)])  # one, priority 3
    assert preempt(w, w.preemptor("pre", 50)) == ("node-c", ("ns/c1",))


def test_a_pod_without_claims_on_the_node_is_not_a_victim_for_a_device() -> None:
    """The lowest pod on the node holds no claim: only the claim holder is evicted (reprieves run
    the DynamicResources filter on the what-if)."""
    w = World({"node-a": 1})
    w.holder("c0", "node-a", ("gpu-0",), [("holder", 10)])
    w.snap.assume(PodSpec("bystander", cpu_milli=100, namespace="ns", priority=0), 0, ())
    assert preempt(w, w.preemptor("pre", 50)) == ("node-a", ("ns/holder",))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 2), st.booleans(), st.integers(0, 9)),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.tuples(st.integers(1, 2), st.integers(0, 12)), min_size=1, max_size=6),
)
def test_after_any_preemptions_the_ledger_is_the_union_of_live_allocations(
    holders: list[tuple[int, int, bool, int]], preemptors: list[tuple[int, int]]
) -> None:
    """Holders: (node, devices, shared by a second pod, priority), placed where free; then
    preemptors (devices, priority) come one by one and each that can preempt does: the what-if's
    freed devices are the controller's, the room held for the preemptor keeps a lower-priority claim
    pod off them, the books equal the live claims' union, nothing is held twice, and the preemptor
    gets its claim on the nominated node."""
    w = World({"node-0": 2, "node-1": 2, "node-2": 3, "node-3": 1})
    rooms = DraClaims(None, books=w.books)
    free = {
        n: [f"gpu-{i}" for i in range(g)]
        for n, g in (("node-0", 2), ("node-1", 2), ("node-2", 3), ("node-3", 1))
    }
    for i, (n, count, shared, prio) in enumerate(holders):
        node = f"node-{n}"
        if len(free[node]) < count:
            continue
        devs = tuple(free[node][:count])
        del free[node][:count]
        consumers = [(f"h{i}", prio)] + ([(f"h{i}s", prio + 3)] if shared else [])
        w.holder(f"c{i}", node, devs, consumers)
    assert w.books.allocated().devices == w.live_union()
    for j, (count, prio) in enumerate(preemptors):
        p = w.preemptor(f"p{j}", prio, count)
        r = schedule_one(make_profile("bestfit", preemption=True), p, w.snap)
        if r.scheduled:  # it fitted as things are
            event("fitted")
            w.write(p, r.node_name)
        elif r.nominated_node >= 0:
            event(f"preempted {len(r.victims)}")
            node = w.snap.names[r.nominated_node]
            predicted = w.books.allocated_without(r.victims)
            for v in r.victims:  # victims are of lower priority, and every one holds a claim there
                assert w.snap.allocations[v].pod.priority < prio
            rooms.hold_room(p, Node(node), r.victims)  # as the actuator does at nomination
            w.evict(r.victims)
            room = w.books.reservation(p.key)
            assert room is not None
            assert w.books.allocated_without({p.key}) == predicted  # what the controller freed
            # meanwhile a claim pod of any priority below it takes nothing of the room
            other = w.preemptor(f"o{j}", prio - 1, count)
            o = schedule_one(make_profile("bestfit"), other, w.snap)
            if o.scheduled:
                event("another claim pod placed while the room is held")
                taken = {r.device_id for a in w.books.reservation(other.key).allocations for r in a.results}
                assert not taken & {r.device_id for a in room.allocations for r in a.results}
                w.snap.forget(other.key)
            w.books.unreserve(other.key)
            del w.claims[f"o{j}-gpu"]
            w.books.delete_claim(claim(f"o{j}-gpu", []))
            again = schedule_one(make_profile("bestfit", preemption=True), p, w.snap)
            assert again.scheduled and again.node_name == node
            w.write(p, node)
        assert w.books.allocated().devices == w.live_union()
        assert not w.books.reservations()


def test_the_preemptors_room_keeps_the_freed_device_from_others_until_it_is_decided() -> None:
    """``DraClaims.hold_room`` at nomination: once the victim is gone and its claim deallocated, a
    lower-priority claim pod finds the device held, the preemptor itself gets it. Given up while the
    victim's claim still holds it (kube-controller-manager not done), the room stays; given up with
    the device free, it goes."""

    w = World({"node-a": 1})
    claims = DraClaims(None, books=w.books)
    w.holder("c0", "node-a", ("gpu-0",), [("lo", 1)])
    p = w.preemptor("pre", 50)
    node, victims = preempt(w, p)
    claims.hold_room(p, Node(node), victims)
    w.snap.forget("ns/lo")  # the victim is gone; its claim is not deallocated yet
    claims.drop_room(p.key)  # given up meanwhile (nothing lower left on the node): the room stays
    assert w.books.reservation(p.key) is not None
    w.evict(())
    w.claims["c0"]["status"] = {}  # kube-controller-manager deallocates it
    w._show("c0")
    other = w.preemptor("other", 10)
    r = schedule_one(make_profile("bestfit", preemption=True), other, w.snap)
    assert not r.scheduled and not r.victims  # held for the preemptor, and nothing to evict for it
    r = schedule_one(make_profile("bestfit", preemption=True), p, w.snap)
    assert r.scheduled and r.node_name == "node-a"
    w.write(p, "node-a")
    assert w.books.allocated().devices == w.live_union() == {DeviceId(DRIVER, "node-a", "gpu-0")}

    w = World({"node-a": 1})
    claims = DraClaims(None, books=w.books)
    w.holder("c0", "node-a", ("gpu-0",), [("lo", 1)])
    p = w.preemptor("pre", 50)
    claims.hold_room(p, Node("node-a"), ("ns/lo",))
    w.evict(("ns/lo",))  # gone and deallocated: the device is free
    claims.drop_room(p.key)
    assert w.books.reservation(p.key) is None


def test_a_gang_of_claim_pods_that_preempts_holds_a_room_for_each_member() -> None:
    """A gang's members are nominated where the what-if lands them, and each gets a DRA room as a single
    preemptor does (``DraClaims.hold_room``, member by member, each seeing the rooms before it): the two
    devices the victims' claims free go one to each member, and a third claim pod finds both held."""
    from gpusched.core.batch import Outcome, UnitOutcome
    from gpusched.core.gang import Unit
    from gpusched.core.preemption_gang import plan_gang_preemption
    from gpusched.k8s.actuator import Acts, Actuator, Decision, Popped
    from gpusched.k8s.preemption import Nominations

    w = World({"node-a": 2})
    w.holder("c0", "node-a", ("gpu-0",), [("lo0", 0)])
    w.holder("c1", "node-a", ("gpu-1",), [("lo1", 0)])
    members = (w.preemptor("m0", 100), w.preemptor("m1", 100))
    unit = Unit("ns/g", members, 2)
    profile = make_profile("bestfit", preemption=True)
    plan = plan_gang_preemption(profile, w.snap, unit)  # as run_cycle's gang preemption
    assert set(plan.victims) == {"ns/lo0", "ns/lo1"}, plan.reason
    o = UnitOutcome(unit, Outcome.PREEMPT, victims=plan.victims, nominated=plan.placement)

    class Group:
        class ref:
            @staticmethod
            def describe() -> str:
                return "PodGroup ns/g"

    claims = DraClaims(None, books=w.books)
    act = Actuator(
        cluster=None, queue=None, events=None, metrics=None, pool=None, settler=None,
        nominations=Nominations("gpusched"), preemptor=None, budgets=None, reservations=None,
        tenants=None, gangs=None, claims=claims, mig=None, running=(None, None),
    )  # fmt: skip
    d = Decision(Popped(unit, {}, group=Group()), o, profile)
    acts = Acts(d)
    act._rooms(d, w.snap, acts)
    assert acts.preempt is not None
    rooms = [w.books.reservation(m.key) for m in members]
    assert all(r is not None and r.room_until is not None for r in rooms)
    held = [r.device for room in rooms if room is not None for a in room.allocations for r in a.results]
    assert sorted(held) == ["gpu-0", "gpu-1"]  # one each, none twice
    w.evict(tuple(o.victims))  # gone and deallocated
    other = w.preemptor("other", 10)
    r = schedule_one(make_profile("bestfit"), other, w.snap)
    assert not r.scheduled  # both devices held for the gang


def test_a_preemptor_whose_room_is_freed_while_it_is_decided_preempts_no_one_else() -> None:
    """Found under load by ``test_dra_preempt_e2e.py`` (a PodDisruptionBudget's pod deleted): the
    preemptor is tried again when its victim is deleted, while the victim's claim is still allocated,
    so its cycle preempts elsewhere; kube-controller-manager deallocates the claim before the outcome
    is carried out. That preemption is stale (its room is free): nobody is evicted, it is decided again
    and lands in its room."""
    from types import SimpleNamespace

    from gpusched.core.batch import Outcome, UnitOutcome, single
    from gpusched.k8s.actuator import Acts, Actuator, Decision, Popped
    from gpusched.k8s.podevents import Kind, parse_pod_event
    from gpusched.k8s.preemption import Nominations

    w = World({"node-a": 1, "node-b": 1})
    w.holder("ca", "node-a", ("gpu-0",), [("cheap", 0)])
    w.holder("cb", "node-b", ("gpu-0",), [("dear", 5)])
    p = w.preemptor("pre", 50)
    obj = pod("pre", [{"name": "gpu", "resourceClaimName": "pre-gpu"}])
    claims = DraClaims(None, books=w.books)
    claims.synced = lambda: True  # type: ignore[method-assign]
    noms = Nominations("gpusched")
    act = Actuator(
        cluster=None, queue=None, events=None, metrics=None, pool=None, settler=None,
        nominations=noms, preemptor=None, budgets=None, reservations=SimpleNamespace(note=lambda _p: ""),
        tenants=None, gangs=None, claims=claims, mig=None, running=(None, None),
    )  # fmt: skip
    profile = make_profile("bestfit", preemption=True)

    def decide() -> Acts:
        prepared = claims.prepare(obj, p)
        assert isinstance(prepared, PodSpec)
        r = schedule_one(profile, prepared, w.snap)
        assert not r.scheduled and r.nominated_node >= 0, r.status.message()
        o = UnitOutcome(single(p), Outcome.PREEMPT, victims=r.victims, nominated_node=r.nominated_node)
        d = Decision(Popped(single(p), {}), o, profile)
        acts = Acts(d)
        acts.message = act._rooms(d, w.snap, acts)
        return acts

    first = decide()
    assert first.preempt is not None and [v.key for v in first.preempt[1]] == ["ns/cheap"]
    w.snap.forget("ns/cheap")  # the victim is deleted: its preemptor is tried again at once
    gone = {
        "metadata": {"name": "cheap", "namespace": "ns", "uid": "uid-cheap"},
        "spec": {"nodeName": "node-a"},
    }
    assert noms.observe(parse_pod_event(gone, Kind.DELETE)) == ["ns/pre"]
    prepared = claims.prepare(obj, p)  # its claim ca still allocated: its room is busy
    assert isinstance(prepared, PodSpec)
    r = schedule_one(profile, prepared, w.snap)
    assert r.victims == ("ns/dear",)  # node-a looks full to this cycle
    w.claims["ca"]["status"] = {}  # kube-controller-manager deallocates ca meanwhile
    w._show("ca")
    o = UnitOutcome(single(p), Outcome.PREEMPT, victims=r.victims, nominated_node=r.nominated_node)
    d = Decision(Popped(single(p), {}), o, profile)
    second = Acts(d)
    second.message = act._rooms(d, w.snap, second)
    assert second.preempt is None, "a stale preemption evicted ns/dear"
    assert "freed while it was decided" in second.message
    prepared = claims.prepare(obj, p)
    assert isinstance(prepared, PodSpec)
    r = schedule_one(profile, prepared, w.snap)
    assert r.scheduled and r.node_name == "node-a"  # in its room


def test_the_note_of_a_busy_room_goes_with_the_room() -> None:
    """What ``prepare`` notes for ``room_freed`` does not outlive the room (a preemptor deleted while
    its room was busy leaves nothing behind once its room is gone)."""
    w = World({"node-a": 1})
    w.holder("ca", "node-a", ("gpu-0",), [("lo", 0)])
    p = w.preemptor("pre", 50)
    other = w.preemptor("other", 10)
    claims = DraClaims(None, books=w.books)
    claims.synced = lambda: True  # type: ignore[method-assign]
    claims.hold_room(p, Node("node-a"), ("ns/lo",))
    assert isinstance(
        claims.prepare(pod("pre", [{"name": "gpu", "resourceClaimName": "pre-gpu"}]), p), PodSpec
    )
    assert claims._room_busy == {"ns/pre"}  # ca still holds its room's device
    w.books.unreserve(p.key)  # its room goes (the preemptor deleted, or the room expired)
    assert isinstance(
        claims.prepare(pod("other", [{"name": "gpu", "resourceClaimName": "other-gpu"}]), other), PodSpec
    )
    assert claims._room_busy == set()
