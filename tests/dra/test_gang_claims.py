"""Gangs of claim pods (core/gangclaims.py through core/batch.run_cycle): every member's claims are
allocated jointly against the one ledger, or nothing is held; and an undone placement (a per-model
quota refusing after placement) gives back what Reserve took."""

from __future__ import annotations

from dra_builders import claim, cls, dev, ex, first, req, slc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from builders import node, profile, whole
from gpusched.core.batch import Outcome, run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.inventory import ClaimLedger, DraInventory, PodClaims
from gpusched.core.dra.model import Claim, DeviceId, ResourceSlice
from gpusched.core.gang import GangSpec, group_units, place_gang
from gpusched.core.gangclaims import JOINT_PASSES
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.queues import QueueBook, QueueSpec, QueueTree, Quota
from gpusched.core.scheduler import undo
from gpusched.core.statement import schedule_all
from gpusched.k8s.dra.books import DraBooks

D = "driver-a"
BIG = f'device.attributes["{D}"].big == true'


def books() -> DraBooks:
    return DraBooks(CelCompiler())


def inventory(ledger: ClaimLedger, *slices: ResourceSlice) -> DraInventory:
    return DraInventory({"gpu": cls("gpu", D)}, slices, ledger, CelCompiler())


def claim_pod(name: str, inv: DraInventory, c: Claim, gang: str = "g", **kw: object) -> PodSpec:
    return PodSpec(
        name,
        cpu_milli=100,
        namespace="ns",
        gang=gang,
        claims=PodClaims((c,), (), inv),
        **kw,  # type: ignore[arg-type]
    )


def held(b: DraBooks) -> dict[str, list[str]]:
    """Per pod, the devices its reservation holds (``pool/device``)."""
    out = {}
    for pod in b.reservations():
        res = b.reservation(pod)
        assert res is not None
        out[pod] = [f"{r.pool}/{r.device}" for a in res.allocations for r in a.results]
    return out


def one_node_gang(b: DraBooks) -> tuple[ClusterState, list[PodSpec]]:
    """gpu-0 and gpu-1 are big, gpu-2 is not. a: two big GPUs, else any one (firstAvailable);
    b: two big GPUs. Pod by pod (a first) a takes both big GPUs and b fits nowhere; jointly a
    falls back to its second sub-request on gpu-2 and b gets the big ones."""
    s = slc("n1", "n1", "n1", D, dev("gpu-0", attrs={"big": True}), dev("gpu-1", attrs={"big": True}),
            dev("gpu-2", attrs={"big": False}))  # fmt: skip
    inv = inventory(b, s)
    a = claim_pod("a", inv, claim("ns/a", first("gpu", ex("two", "gpu", 2, BIG), ex("one", "gpu", 1))))
    bb = claim_pod("b", inv, claim("ns/b", req("gpu", "gpu", 2, BIG)))
    return ClusterState([NodeSpec("n1", 8000, 16384)]), [a, bb]


def test_a_gang_whose_members_fit_only_jointly_is_placed_and_its_ledger_is_the_union() -> None:
    b = books()
    snap, pods = one_node_gang(b)
    greedy = schedule_all(profile(), pods, snap)  # pod by pod, as kube-scheduler allocates
    assert not greedy.scheduled and "pod ns/b" in greedy.status.message() and not held(b)
    unit = group_units(pods, {"ns/g": GangSpec("g", "ns", 2)})[0]
    (o,) = run_cycle(profile(), snap, [unit])
    assert o.outcome is Outcome.PLACED, o.reason
    assert held(b) == {"ns/a": ["n1/gpu-2"], "ns/b": ["n1/gpu-0", "n1/gpu-1"]}
    (a_alloc,) = b.reservation("ns/a").allocations  # type: ignore[union-attr]
    assert [r.request for r in a_alloc.results] == ["gpu/one"]  # the later sub-request, only as needed
    assert sorted(snap.allocations) == ["ns/a", "ns/b"]


def test_a_member_is_moved_to_another_node_when_its_first_node_is_the_only_one_for_the_next() -> None:
    """n1 and n2 have one GPU each, only n1's is "fast". a (any GPU) lands on n1 first (the
    tie-break); c needs the fast GPU: pod by pod it fits nowhere, jointly a goes to n2."""
    b = books()
    s1 = slc("n1", "n1", "n1", D, dev("gpu-0", attrs={"fast": True}))
    s2 = slc("n2", "n2", "n2", D, dev("gpu-0", attrs={"fast": False}))
    inv = inventory(b, s1, s2)
    n1_only = f'device.attributes["{D}"].fast == true'
    a = claim_pod("a", inv, claim("ns/a", req("gpu", "gpu", 1)))
    c = claim_pod("c", inv, claim("ns/c", req("gpu", "gpu", 1, n1_only)))
    snap = ClusterState([NodeSpec("n1", 8000, 16384), NodeSpec("n2", 8000, 16384)])
    assert not schedule_all(profile(), [a, c], snap).scheduled and not held(b)
    r = place_gang(profile(), group_units([a, c], {"ns/g": GangSpec("g", "ns", 2)})[0], snap)
    assert r.scheduled, r.status.message()
    assert {x.pod.key: x.node_name for x in r.placed} == {"ns/a": "n2", "ns/c": "n1"}
    assert held(b) == {"ns/a": ["n2/gpu-0"], "ns/c": ["n1/gpu-0"]}
    assert all(x.pod is p for x, p in zip(r.placed, (a, c), strict=True))  # the unit's own specs


def test_a_gang_that_fits_under_no_joint_choice_holds_nothing_and_says_how_far_it_searched() -> None:
    b = books()
    snap, pods = one_node_gang(b)
    inv = pods[0].claims.inventory  # type: ignore[union-attr]
    third = claim_pod("c", inv, claim("ns/c", req("gpu", "gpu", 1)))
    unit = group_units([*pods, third], {"ns/g": GangSpec("g", "ns", 3)})[0]
    (o,) = run_cycle(profile(), snap, [unit])
    assert o.outcome is Outcome.WAITING
    assert (
        "gang ns/g waits as a unit" in o.reason and "no joint choice of the members' claims fits" in o.reason
    )
    assert f"at most {JOINT_PASSES}" in o.reason
    assert not held(b) and not snap.allocations


def test_a_gang_without_claims_is_tried_once() -> None:
    snap = ClusterState([node("n", gpus=1)])
    pods = [whole(f"p{i}", gang="g", namespace="ns") for i in range(2)]
    r = place_gang(profile(), group_units(pods, {"ns/g": GangSpec("g", "ns", 2)})[0], snap)
    assert not r.scheduled and "joint" not in r.status.message()


def test_a_claim_pod_refused_by_a_per_model_quota_after_placement_gives_its_devices_back() -> None:
    """The leak: the pod is placed (Reserve books its claim's device in the ledger), then charged
    with the node's GPU model, which its queue's per-model quota refuses; the undo must give the
    device back, not only forget the booking."""
    b = books()
    inv = inventory(b, slc("h", "h", "h", D, dev("gpu-0")))
    t = QueueTree([QueueSpec("A", nominal=Quota(gpus=8), per_model={"H100": Quota(gpus=0)})])
    pod = claim_pod(
        "p", inv, claim("ns/c", req("gpu", "gpu", 1)), gang="", num_gpu=1, gpu_milli=1000, queue="A"
    )
    snap = ClusterState([node("h", gpus=1, model="H100")])
    (o,) = run_cycle(profile(), snap, group_units([pod], {}), book=QueueBook(t), reclaim=False)
    assert o.outcome is Outcome.WAITING and "gpus[H100]" in o.reason
    assert not snap.allocations
    assert b.allocated().devices == frozenset() and not held(b)


def test_unreserving_on_discard_leaves_devices_held_by_others_alone() -> None:
    b = books()
    snap, pods = one_node_gang(b)
    b.reserve("ns/other", "n1", ())  # someone else's decision in flight
    schedule_all(profile(), pods, snap)  # a fits, b does not: a's devices go back, not others'
    assert not snap.allocations
    assert held(b) == {"ns/other": []}


def test_a_claim_two_members_share_is_allocated_once_and_both_go_where_it_is() -> None:
    """a and c name one claim (not allocated yet); c has one more claim of its own. The shared
    claim is allocated once, by a; c is not given it again, and lands on the node it is on."""
    b = books()
    inv = inventory(
        b, slc("n1", "n1", "n1", D, dev("gpu-0")), slc("n2", "n2", "n2", D, dev("gpu-0"), dev("gpu-1"))
    )
    shared = claim("ns/shared", req("gpu", "gpu", 1))
    a = claim_pod("a", inv, shared)
    c = PodSpec("c", cpu_milli=100, namespace="ns", gang="g",
                claims=PodClaims((shared, claim("ns/own", req("gpu", "gpu", 1))), (), inv))  # fmt: skip
    snap = ClusterState([NodeSpec("n1", 8000, 16384), NodeSpec("n2", 8000, 16384)])
    r = place_gang(profile(), group_units([a, c], {"ns/g": GangSpec("g", "ns", 2)})[0], snap)
    assert r.scheduled, r.status.message()
    assert {x.pod.key: x.node_name for x in r.placed} == {"ns/a": "n2", "ns/c": "n2"}
    assert held(b) == {"ns/a": ["n2/gpu-0"], "ns/c": ["n2/gpu-1"]}
    (own,) = b.reservation("ns/c").allocations  # type: ignore[union-attr]
    assert own.claim == "ns/own"


@st.composite
def gang_case(draw: st.DrawFn) -> tuple[ClusterState, list[PodSpec], DraBooks, int]:
    """1-3 nodes with 1-4 devices each (some big, some already held by others), 2-4 members each
    with one claim: 1-2 devices (any or big), or firstAvailable two big else any one; some members
    share a claim."""
    b = books()
    names = [f"n{i}" for i in range(draw(st.integers(1, 3)))]
    slices, held_by_others = [], []
    for n in names:
        devs = [dev(f"gpu-{j}", attrs={"big": draw(st.booleans())}) for j in range(draw(st.integers(1, 4)))]
        slices.append(slc(n, n, n, D, *devs))
        held_by_others += [DeviceId(D, n, d.name) for d in devs if draw(st.integers(0, 5)) == 0]
    if held_by_others:
        b.upsert_claim({  # allocated by someone else, in the API
            "metadata": {"namespace": "other", "name": "x", "uid": "u"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": D, "pool": d.pool, "device": d.device} for d in held_by_others
            ]}}},
        })  # fmt: skip
    inv = inventory(b, *slices)
    claims: list[Claim] = []
    pods = []
    for i in range(draw(st.integers(2, 4))):
        if claims and draw(st.integers(0, 4)) == 0:
            c = draw(st.sampled_from(claims))  # shared with an earlier member
        else:
            kind = draw(st.sampled_from(["any", "big", "first", "first"]))
            count = draw(st.integers(1, 2))
            if kind == "first":
                c = claim(f"ns/c{i}", first("gpu", ex("two", "gpu", 2, BIG), ex("one", "gpu", 1)))
            else:
                c = claim(f"ns/c{i}", req("gpu", "gpu", count, *((BIG,) if kind == "big" else ())))
            claims.append(c)
        pods.append(claim_pod(f"m{i}", inv, c))
    snap = ClusterState([NodeSpec(n, 8000, 16384) for n in names])
    return snap, pods, b, len(held_by_others)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gang_case())
def test_a_gang_of_claim_pods_is_placed_whole_with_each_device_once_or_holds_nothing(
    case: tuple[ClusterState, list[PodSpec], DraBooks, int],
) -> None:
    snap, pods, b, others = case
    before = b.allocated().devices
    assert len(before) == others
    greedy = schedule_all(profile(), pods, snap)  # pod by pod, as kube-scheduler would allocate
    for x in greedy.placed:
        undo(snap, x)
    assert not snap.allocations and b.allocated().devices == before
    unit = group_units(pods, {"ns/g": GangSpec("g", "ns", len(pods))})[0]
    (o,) = run_cycle(profile(), snap, [unit])
    event(f"{o.outcome.value}, pod by pod {'fits' if greedy.scheduled else 'does not fit'}")
    assert o.outcome is Outcome.PLACED or not greedy.scheduled
    if o.outcome is not Outcome.PLACED:
        assert not snap.allocations and not b.reservations() and b.allocated().devices == before
        return
    assert sorted(snap.allocations) == sorted(p.key for p in pods)
    given: list[DeviceId] = []
    claim_node: dict[str, str] = {}
    for p in pods:
        res = b.reservation(p.key)
        if res is None:  # its claims are shared ones an earlier member allocated (checked below)
            continue
        assert res.node == snap.names[snap.allocations[p.key].node]
        for a in res.allocations:
            assert a.claim not in claim_node  # a shared claim is allocated once
            claim_node[a.claim] = res.node
            given += [r.device_id for r in a.results]
            assert all(r.pool == res.node for r in a.results)  # node-local devices of its node
    assert len(given) == len(set(given))  # no device given twice
    assert not set(given) & before  # nor one another claim holds
    assert b.allocated().devices == before | set(given)  # the ledger: the union, nothing else
    for p in pods:  # every claim of every member is allocated, where the member runs
        assert p.claims is not None
        for c in p.claims.to_allocate:
            assert claim_node[c.name] == snap.names[snap.allocations[p.key].node]
