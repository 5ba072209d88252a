"""Tenant queues that count DRA devices per DeviceClass (issue 32 item 3): the quota keys
(``devices/<class>``, ``capacity/<class>/<capacity>``) and their bad input, what a claim pod is
charged, and reclaim that evicts the borrower whose claims free the class the claimant needs."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from k8s_objects import allocation, claim, device_class, whole
from test_dra_preemption import World

from gpusched.core.dra.model import AllocationMode, Claim, ExactRequest, Node, Request
from gpusched.core.gang import Unit
from gpusched.core.model import PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.reclaim import plan_reclaim
from gpusched.core.queues.spec import ANY_MODEL, InvalidQueue, QueueSpec, QueueTree, Quota, ResourceKey
from gpusched.core.queues.status import queue_statuses
from gpusched.core.queues.usage import claims_charge
from gpusched.k8s.dra.podclaims import Ready, resolve
from gpusched.k8s.queues import queue_from_k8s
from gpusched.k8s.tenants import status_body


def key(dim: str) -> ResourceKey:
    return ResourceKey(ANY_MODEL, dim)


def test_dra_quota_keys_are_read_and_bad_ones_named() -> None:
    q = queue_from_k8s(
        {
            "metadata": {"name": "team"},
            "spec": {
                "nominalQuota": {
                    "gpus": 2,
                    "dra": {"devices/gpu.example.com": 4, "capacity/share.example.com/memory": 1 << 34},
                },
                "borrowingLimit": {"dra": {"devices/gpu.example.com": 1}},
            },
        }
    )
    assert q.nominal_of(key("devices/gpu.example.com")) == 4
    assert q.nominal_of(key("capacity/share.example.com/memory")) == 1 << 34
    assert q.nominal_of(key("gpus")) == 2
    assert q.device_classes() == {"gpu.example.com", "share.example.com"}
    with pytest.raises(
        InvalidQueue, match=r"Queue t: spec.nominalQuota.dra: 'gpus/x' is not a DRA quota key"
    ):
        queue_from_k8s({"metadata": {"name": "t"}, "spec": {"nominalQuota": {"dra": {"gpus/x": 1}}}})
    with pytest.raises(InvalidQueue, match=r"'devices/Bad_Class' is not a DRA quota key"):
        queue_from_k8s(
            {"metadata": {"name": "t"}, "spec": {"nominalQuota": {"dra": {"devices/Bad_Class": 1}}}}
        )
    with pytest.raises(InvalidQueue, match=r"dra\[devices/gpu\] must be a non-negative integer, got -1"):
        queue_from_k8s({"metadata": {"name": "t"}, "spec": {"nominalQuota": {"dra": {"devices/gpu": -1}}}})
    with pytest.raises(InvalidQueue, match=r"DRA quotas are per DeviceClass, not model"):
        QueueSpec("t", per_model={"A100": Quota(devices={"devices/gpu": 1})})


def test_a_claim_is_charged_per_class_by_what_it_asks() -> None:
    gpu2 = ExactRequest("a", "gpu", count=2)
    share = ExactRequest("b", "share", capacity_requests={"memory": 10})
    mig_or_gpu = Request(
        "c", first_available=(ExactRequest("c/mig", "mig", count=2), ExactRequest("c/gpu", "gpu"))
    )
    admin = ExactRequest("d", "gpu", admin_access=True)
    everything = ExactRequest("e", "nic", mode=AllocationMode.ALL)
    c = Claim(
        "ns/c",
        (
            Request("a", exactly=gpu2),
            Request(
                "b", exactly=ExactRequest("b", "share", count=3, capacity_requests=share.capacity_requests)
            ),
            mig_or_gpu,
            Request("d", exactly=admin),
            Request("e", exactly=everything),
            Request(
                "f", first_available=(ExactRequest("f/one", "gpu"), ExactRequest("f/two", "gpu", count=2))
            ),
        ),
    )
    assert dict(claims_charge([c]).amounts) == {
        key("devices/gpu"): 5,  # 2, 1 if c's fallback is chosen, and the most of f's alternatives
        key("capacity/share/memory"): 30,  # a share counts no device
        key("devices/mig"): 2,
        key("devices/nic"): 1,  # All: at least one
    }


def test_reclaim_evicts_the_borrower_whose_claims_free_the_class_needed() -> None:
    """Queue a lends its quota of two classes to b; b's pods hold one device of each (the lowest
    priority one of class ``first``). a's pod asks for a device of class ``second``: the reclaim
    evicts the holder of ``second`` only, and the DynamicResources what-if sees its device free."""
    w = World({"node-a": 2})
    w.books.upsert_class(device_class("first", "device.attributes['gpu.nvidia.com'].index == 0"))
    w.books.upsert_class(device_class("second", "device.attributes['gpu.nvidia.com'].index == 1"))
    for name, cls, dev, prio in (("x", "first", "gpu-0", 0), ("y", "second", "gpu-1", 1)):
        c = claim(f"{name}-c", [whole(cls)], allocation=allocation("node-a", dev))
        c["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": f"uid-{name}"}]
        w.claims[f"{name}-c"] = c
        w._show(f"{name}-c")
        w.snap.assume(PodSpec(name, cpu_milli=100, namespace="ns", priority=prio, queue="b"), 0, ())
    share = Quota(devices={"devices/first": 1, "devices/second": 1})
    tree = QueueTree([QueueSpec("org"), QueueSpec("a", "org", nominal=share), QueueSpec("b", "org")])
    book = QueueBook(tree)
    charges = w.books.claim_charges()
    assert dict(charges["ns/x"].amounts) == {key("devices/first"): 1}
    for k in ("ns/x", "ns/y"):
        book.charge(k, "b", charges[k])
    assert book.over_nominal("b") and not book.violations()
    by = {st.name: status_body(st, 1, "") for st in queue_statuses(book, {})}  # the Queues' status
    assert by["a"]["quota"]["dra"] == {"devices/first": 1, "devices/second": 1}
    assert by["b"]["usage"]["dra"] == by["b"]["borrowed"]["dra"] == {"devices/first": 1, "devices/second": 1}

    w.claims["p-c"] = claim("p-c", [whole("second")])
    w._show("p-c")
    r = resolve(pod_obj("p", "p-c"), w.books)
    assert isinstance(r, Ready)
    p = PodSpec("p", cpu_milli=100, namespace="ns", priority=5, queue="a", claims=r.claims)
    plan = plan_reclaim(make_profile("bestfit"), w.snap, book, Unit(p.key, (p,), 1))
    assert plan.ok, plan.reason
    assert plan.victims == ("ns/y",)
    assert book.charged.keys() == {"ns/x", "ns/y"}  # the plan changed nothing
    assert w.books.allocated().devices == w.live_union()


def pod_obj(name: str, claim_name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]},
    }


def test_a_queue_naming_an_unknown_device_class_refuses_its_pods() -> None:
    """A pod of a queue whose quota (or an ancestor's) names a DeviceClass the API lacks is refused
    with the queue and class named; nothing is said before the DRA informers have listed."""
    from gpusched.k8s.claims import DraClaims
    from gpusched.k8s.queues import Directory
    from gpusched.k8s.tenants import TenantQueues

    w = World({"node-a": 1})
    claims = DraClaims(None, books=w.books)
    listed = False
    claims.synced = lambda: listed  # type: ignore[method-assign]
    tree = QueueTree(
        [
            QueueSpec("org", nominal=Quota(devices={"devices/nope.example.com": 1})),
            QueueSpec("a", "org", nominal=Quota(devices={"devices/gpu": 1})),
        ]
    )
    d = Directory(tree, {}, {})
    tq = TenantQueues(None, None, None, cluster=None, queue=None, events=None, pool=None)  # type: ignore[arg-type]
    tq.claims = claims
    assert tq._unknown_classes(d, "a", "namespace ns") == ""
    listed = True
    assert tq._unknown_classes(d, "a", "namespace ns") == (
        "Queue org: spec (nominalQuota, borrowingLimit or lendingLimit).dra names DeviceClass "
        "nope.example.com, which does not exist (the queue of namespace ns)"
    )
    w.books.upsert_class(device_class("nope.example.com"))
    assert tq._unknown_classes(d, "a", "namespace ns") == ""


def test_reclaims_what_ifs_leave_the_dra_ledger_as_they_found_it() -> None:
    """plan_reclaim's and landing's what-ifs place the claimant (Reserve runs); each gives back what
    its Reserve took (``scheduler.undo``): a claimant without a room holds nothing afterwards, and one
    that holds a room from an earlier reclaim (its victims leaving) keeps that room unchanged."""
    from gpusched.core.policies import make_profile as profile_of
    from gpusched.k8s.claims import DraClaims
    from gpusched.k8s.tenants import landing

    w = World({"node-a": 2})
    w.holder("y-c", "node-a", ("gpu-1",), [("y", 1)])
    book = QueueBook(
        QueueTree(
            [
                QueueSpec("org"),
                QueueSpec("a", "org", nominal=Quota(devices={"devices/gpu": 2})),
                QueueSpec("b", "org"),
            ]
        )
    )
    book.charge("ns/y", "b", w.books.claim_charges()["ns/y"])
    w.claims["x-c"] = claim("x-c", [whole(count=2)])
    w._show("x-c")
    r = resolve(pod_obj("x", "x-c"), w.books)
    assert isinstance(r, Ready)
    p = PodSpec("x", cpu_milli=100, namespace="ns", priority=5, queue="a", claims=r.claims)
    prof = profile_of("bestfit")
    before = w.books.allocated()
    plan = plan_reclaim(prof, w.snap, book, Unit(p.key, (p,), 1))
    assert plan.victims == ("ns/y",)
    assert w.books.reservation(p.key) is None and w.books.allocated() == before
    assert landing(prof, w.snap, (p,), plan.victims) == [(p, "node-a")]
    assert w.books.reservation(p.key) is None and w.books.allocated() == before

    DraClaims(None, books=w.books).hold_room(p, Node("node-a"), plan.victims)  # as the actuator does
    room = w.books.reservation(p.key)
    assert room is not None and room.room_until is not None
    assert plan_reclaim(prof, w.snap, book, Unit(p.key, (p,), 1)).victims == ("ns/y",)
    assert landing(prof, w.snap, (p,), plan.victims) == [(p, "node-a")]
    assert w.books.reservation(p.key) == room  # the what-ifs neither dropped nor replaced it


def test_an_all_request_is_charged_the_devices_it_took_once_allocated() -> None:
    """``All`` asks for every matching device of the node it lands on: before placement it is charged 1
    (the least; the count depends on the node), once placed what the decision took, then what the API's
    allocation shows. A queue whose quota is smaller than what it took refuses the placement (undone,
    nothing held), one that covers it is charged all of it."""
    from gpusched.core.batch import Outcome, run_cycle

    every = [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]
    for quota, placed in ((2, False), (3, True)):
        w = World({"node-a": 3})
        w.claims["all-c"] = claim("all-c", every)
        w._show("all-c")
        r = resolve(pod_obj("p", "all-c"), w.books)
        assert isinstance(r, Ready)
        p = PodSpec("p", cpu_milli=100, namespace="ns", uid="uid-p", queue="a", claims=r.claims)
        assert claims_charge(r.claims.to_allocate)[key("devices/gpu")] == 1  # before placement
        tree = QueueTree([QueueSpec("a", nominal=Quota(devices={"devices/gpu": quota}))])
        book = QueueBook(tree)
        (o,) = run_cycle(make_profile("bestfit"), w.snap, [Unit(p.key, (p,), 1)], book=book, reclaim=False)
        assert (o.outcome is Outcome.PLACED) is placed, o.reason
        if not placed:
            assert "devices/gpu" in o.reason and w.books.reservation(p.key) is None and not book.charged
            continue
        assert book.charged[p.key][1][key("devices/gpu")] == 3
        assert w.books.claim_charges()["ns/p"][key("devices/gpu")] == 3  # the decision, not yet written
        assert w.books.decided_charge("ns/p") == w.books.claim_charges()["ns/p"]
        w.write(p, "node-a")
        assert w.books.decided_charge("ns/p") is None
        assert w.books.claim_charges()["ns/p"][key("devices/gpu")] == 3  # the API's allocation


@settings(max_examples=200, deadline=None)
@given(
    gpus=st.integers(1, 4),
    held=st.sampled_from([0, 0, 0, 1, 2]),  # All fits only where no matching device is in use
    requests=st.lists(st.one_of(st.just("all"), st.integers(1, 2)), min_size=1, max_size=2),
)
def test_a_placed_claim_pod_is_charged_exactly_the_devices_it_took(
    gpus: int, held: int, requests: list[object]
) -> None:
    """Property: for ExactCount and All requests over a node where others hold some devices, a claim pod
    that is placed is charged, per class, the devices its decision took (the queue's book at placement,
    the books' charge before the write and after it); one that is not placed is charged nothing."""
    from gpusched.core.batch import Outcome, run_cycle

    w = World({"node-a": gpus})
    held = min(held, gpus)
    if held:
        w.holder("other", "node-a", tuple(f"gpu-{i}" for i in range(held)), [("o", 0)])
    reqs = [
        {"name": f"r{i}", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}
        if r == "all"
        else {"name": f"r{i}", "exactly": {"deviceClassName": "gpu", "count": r}}
        for i, r in enumerate(requests)
    ]
    w.claims["c"] = claim("c", reqs)
    w._show("c")
    r = resolve(pod_obj("p", "c"), w.books)
    assert isinstance(r, Ready)
    p = PodSpec("p", cpu_milli=100, namespace="ns", uid="uid-p", queue="a", claims=r.claims)
    book = QueueBook(QueueTree([QueueSpec("a", nominal=Quota(devices={"devices/gpu": 100}))]))
    (o,) = run_cycle(make_profile("bestfit"), w.snap, [Unit(p.key, (p,), 1)], book=book, reclaim=False)
    res = w.books.reservation(p.key)
    if o.outcome is not Outcome.PLACED:
        event("not placed")
        assert res is None and not book.charged
        return
    assert res is not None
    took = sum(len(a.results) for a in res.allocations)
    event(f"All, took {took}" if "all" in requests else "counts only")
    assert book.charged[p.key][1][key("devices/gpu")] == took
    assert w.books.claim_charges()["ns/p"][key("devices/gpu")] == took
    (a,) = res.allocations  # the writer's result as the informer shows it, each result's request named
    c = w.claims["c"]
    c["status"] = {
        "allocation": allocation("node-a"),
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-p"}],
    }
    c["status"]["allocation"]["devices"]["results"] = [
        {"request": x.request, "driver": x.driver, "pool": x.pool, "device": x.device} for x in a.results
    ]
    w._show("c")
    assert w.books.decided_charge("ns/p") is None  # written: charged from the API's copy
    assert w.books.claim_charges()["ns/p"][key("devices/gpu")] == took
