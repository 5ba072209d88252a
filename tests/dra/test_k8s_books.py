"""The DRA books (k8s/dra/books.py) and a pod's claims resolved against them (k8s/dra/podclaims.py).

The property: whatever order decisions, writes seen by the informer, refusals, claims allocated by
someone else and deallocations come in, the books hold exactly the devices that claims hold (in the
API or reserved by a decision not yet seen written), never one twice, and a decision never takes a
device another claim holds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from k8s_objects import DRIVER, allocation, claim, device_class, gpu_device, gpu_slice, pod, whole

from gpusched.core.dra.allocator import Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import DeviceId, Node
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.podclaims import Invalid, Ready, Waiting, resolve

NODE = "node-a"
GPUS = 6


def books_with_gpus(n: int = GPUS) -> DraBooks:
    books = DraBooks(CelCompiler())
    books.upsert_class(device_class("gpu"))
    books.upsert_slice(gpu_slice(NODE, [gpu_device(i) for i in range(n)]))
    return books


def test_a_template_claim_not_recorded_yet_waits_with_its_reason() -> None:
    books = books_with_gpus()
    p = pod("p", [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    r = resolve(p, books)
    assert isinstance(r, Waiting) and "template one-gpu to be created" in r.reason
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    r = resolve(p, books)
    assert isinstance(r, Waiting) and "ResourceClaim ns/p-gpu-x (not found yet)" in r.reason
    c = claim("p-gpu-x", [whole()])
    books.upsert_claim(c)
    r = resolve(p, books)
    assert isinstance(r, Invalid) and "was not created for this pod" in r.reason
    c["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": "uid-p"}]
    books.upsert_claim(c)
    r = resolve(p, books)
    assert isinstance(r, Ready) and [cl.name for cl in r.claims.to_allocate] == ["ns/p-gpu-x"]


def test_an_allocated_claim_pins_the_pod_to_its_node_and_a_claim_being_allocated_waits() -> None:
    books = books_with_gpus()
    books.upsert_claim(claim("shared", [whole()], allocation=allocation(NODE, "gpu-0")))
    r = resolve(pod("p", [{"name": "gpu", "resourceClaimName": "shared"}]), books)
    assert isinstance(r, Ready) and not r.claims.to_allocate
    assert r.claims.reaches(Node(NODE)) and not r.claims.reaches(Node("node-b"))
    books.upsert_claim(claim("c", [whole()]))
    first = resolve(pod("q", [{"name": "gpu", "resourceClaimName": "c"}]), books)
    assert isinstance(first, Ready)
    fits = first.claims.allocate(Node(NODE), books.allocated())
    assert isinstance(fits, Fits)
    books.reserve("ns/q", NODE, fits.allocations)
    r = resolve(pod("r", [{"name": "gpu", "resourceClaimName": "c"}]), books)
    assert isinstance(r, Waiting) and "being allocated for pod ns/q" in r.reason


def test_a_bad_class_or_claim_is_invalid_naming_it() -> None:
    books = books_with_gpus()
    books.upsert_class({"metadata": {"name": "broken"}, "spec": {"selectors": [{"cel": {}}]}})
    books.upsert_claim(claim("c", [whole("broken")]))
    r = resolve(pod("p", [{"name": "gpu", "resourceClaimName": "c"}]), books)
    assert (
        isinstance(r, Invalid)
        and "DeviceClass broken: spec.selectors[0].cel.expression: is required" in r.reason
    )
    books.upsert_claim(claim("c", [{"name": "gpu"}]))
    r = resolve(pod("p", [{"name": "gpu", "resourceClaimName": "c"}]), books)
    assert (
        isinstance(r, Invalid) and "ResourceClaim ns/c: spec.devices.requests[0]: exactly one of" in r.reason
    )


def test_a_device_taint_rule_taints_the_devices_it_selects() -> None:
    books = books_with_gpus(2)
    rule = {
        "metadata": {"name": "xid"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": NODE, "device": "gpu-0"},
            "taint": {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
        },
    }
    books.upsert_rule(rule)
    (s,) = books.inventory().slices
    assert [len(d.taints) for d in s.devices] == [1, 0]
    books.delete_rule(rule)
    (s,) = books.inventory().slices
    assert [len(d.taints) for d in s.devices] == [0, 0]


def test_a_slice_that_cannot_be_read_is_kept_out_and_named() -> None:
    books = books_with_gpus(0)
    books.upsert_slice(gpu_slice("node-b", [gpu_device(0, "1.5Gi")]))
    assert [sl.name for sl in books.inventory().slices] == ["node-a-gpu"]
    assert "spec.devices[0].capacity.memory.value" in books.problem("ResourceSlice node-b-gpu")


def test_capacity_consumed_by_shares_in_the_api_is_booked() -> None:
    books = DraBooks(CelCompiler())
    books.upsert_class(device_class("gpu"))
    shareable = gpu_device(0, allowMultipleAllocations=True)
    books.upsert_slice(gpu_slice(NODE, [shareable]))
    held = allocation(NODE, "gpu-0")
    held["devices"]["results"][0].update(shareID="s1", consumedCapacity={"memory": "30Gi"})
    books.upsert_claim(claim("other", [whole()], allocation=held))
    ten = {"name": "gpu", "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"memory": "10Gi"}}}}
    fifteen = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"memory": "15Gi"}}},
    }
    for name, req, fits in (("ten", ten, True), ("fifteen", fifteen, False)):
        books.upsert_claim(claim(name, [req]))
        r = resolve(pod(name, [{"name": "gpu", "resourceClaimName": name}]), books)
        assert isinstance(r, Ready)
        assert isinstance(r.claims.allocate(Node(NODE), books.allocated()), Fits) is fits, name


# ------------------------------------------------------------------------------------ property
OPS = st.lists(
    st.tuples(
        st.sampled_from(["decide", "land", "refuse", "foreign", "dealloc", "delete"]), st.integers(1, 4)
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_books_hold_exactly_what_claims_hold_and_never_a_device_twice(ops: list[tuple[str, int]]) -> None:
    books = books_with_gpus()
    pending: dict[str, tuple[str, frozenset[str]]] = {}  # claim name -> (pod, devices), not seen written
    in_api: dict[str, frozenset[str]] = {}  # claim name -> devices, as the API shows it allocated

    def truth() -> list[str]:
        return [d for devs in [*in_api.values(), *(d for _, d in pending.values())] for d in devs]

    def api_claim(name: str, devices: frozenset[str] | None, k: int = 1) -> dict[str, Any]:
        status = {"allocation": allocation(NODE, *sorted(devices))} if devices else {}
        return claim(name, [whole(count=k)], **status)

    for n, (op, k) in enumerate(ops):
        if op == "decide":
            name = f"c{n}"
            books.upsert_claim(api_claim(name, None, k))
            r = resolve(pod(f"p{n}", [{"name": "gpu", "resourceClaimName": name}]), books)
            assert isinstance(r, Ready)
            out = r.claims.allocate(Node(NODE), books.allocated())
            if isinstance(out, Fits):
                devices = frozenset(res.device for res in out.allocations[0].results)
                assert not devices & set(truth()), "a decision took a device another claim holds"
                books.reserve(f"ns/p{n}", NODE, out.allocations)
                pending[name] = (f"ns/p{n}", devices)
            else:
                assert len(truth()) + k > GPUS, "a fitting claim was refused"
        elif op == "land" and pending:
            name = sorted(pending)[k % len(pending)]
            _, devices = pending.pop(name)
            books.upsert_claim(api_claim(name, devices))
            in_api[name] = devices
        elif op == "refuse" and pending:
            name = sorted(pending)[k % len(pending)]
            pod_key, _ = pending.pop(name)
            books.unreserve(pod_key)
        elif op == "foreign":
            free = [f"gpu-{i}" for i in range(GPUS) if f"gpu-{i}" not in truth()][:k]
            if free:
                name = f"f{n}"
                books.upsert_claim(api_claim(name, frozenset(free)))
                in_api[name] = frozenset(free)
        elif op in ("dealloc", "delete") and in_api:
            name = sorted(in_api)[k % len(in_api)]
            del in_api[name]
            if op == "dealloc":
                books.upsert_claim(api_claim(name, None))
            else:
                books.delete_claim(api_claim(name, None))
        held = truth()
        assert len(held) == len(set(held)), "a device held by two claims"
        assert books.allocated().devices == {DeviceId(DRIVER, NODE, d) for d in held}


SHARE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["decide", "land", "refuse", "foreign", "dealloc", "delete"]), st.integers(1, 4)
    ),
    max_size=30,
)
CAPACITY = 40 * 2**30
MEM = f"{DRIVER}/memory"


@settings(max_examples=200, deadline=None)
@given(SHARE_OPS)
def test_books_sum_the_capacity_shares_consume_and_never_exceed_a_device(ops: list[tuple[str, int]]) -> None:
    """The same for shares of devices that allow multiple allocations: the ledger's consumed capacity
    per device is the sum over the claims that hold a share (in the API, or reserved), and a decision
    never takes a device past its capacity nor refuses one with room."""
    books = DraBooks(CelCompiler())
    books.upsert_class(device_class("gpu"))
    devices = [gpu_device(i, allowMultipleAllocations=True) for i in range(2)]
    books.upsert_slice(gpu_slice(NODE, devices))
    pending: dict[str, tuple[str, str, int]] = {}  # claim -> (pod, device, bytes), not seen written
    in_api: dict[str, tuple[str, int]] = {}  # claim -> (device, bytes)

    def used() -> dict[str, int]:
        out: dict[str, int] = {}
        for dev, amount in [*in_api.values(), *((d, a) for _, d, a in pending.values())]:
            out[dev] = out.get(dev, 0) + amount
        return out

    def api_claim(name: str, gib: int, held: tuple[str, int] | None = None) -> dict[str, Any]:
        request = {
            "name": "gpu",
            "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"memory": f"{gib}Gi"}}},
        }
        if held is None:
            return claim(name, [request])
        alloc = allocation(NODE, held[0])
        alloc["devices"]["results"][0].update(
            shareID=f"s-{name}", consumedCapacity={"memory": f"{held[1] // 2**30}Gi"}
        )
        return claim(name, [request], allocation=alloc)

    for n, (op, k) in enumerate(ops):
        gib = 5 * k
        if op == "decide":
            name = f"c{n}"
            books.upsert_claim(api_claim(name, gib))
            r = resolve(pod(f"p{n}", [{"name": "gpu", "resourceClaimName": name}]), books)
            assert isinstance(r, Ready)
            out = r.claims.allocate(Node(NODE), books.allocated())
            room = [d for d in ("gpu-0", "gpu-1") if used().get(d, 0) + gib * 2**30 <= CAPACITY]
            if isinstance(out, Fits):
                (res,) = out.allocations[0].results
                assert res.shared and res.device in room, "a share taken past the device's capacity"
                assert res.consumed_capacity == {MEM: gib * 2**30}
                books.reserve(f"ns/p{n}", NODE, out.allocations)
                pending[name] = (f"ns/p{n}", res.device, gib * 2**30)
            else:
                assert not room, "a share that fits was refused"
        elif op == "land" and pending:
            name = sorted(pending)[k % len(pending)]
            _, dev, amount = pending.pop(name)
            books.upsert_claim(api_claim(name, amount // 2**30, (dev, amount)))
            in_api[name] = (dev, amount)
        elif op == "refuse" and pending:
            name = sorted(pending)[k % len(pending)]
            pod_key, _, _ = pending.pop(name)
            books.unreserve(pod_key)
        elif op == "foreign":
            room = [d for d in ("gpu-0", "gpu-1") if used().get(d, 0) + gib * 2**30 <= CAPACITY]
            if room:
                name = f"f{n}"
                books.upsert_claim(api_claim(name, gib, (room[0], gib * 2**30)))
                in_api[name] = (room[0], gib * 2**30)
        elif op in ("dealloc", "delete") and in_api:
            name = sorted(in_api)[k % len(in_api)]
            del in_api[name]
            if op == "dealloc":
                books.upsert_claim(api_claim(name, 5))
            else:
                books.delete_claim(api_claim(name, 5))
        truth = used()
        assert all(v <= CAPACITY for v in truth.values())
        state = books.allocated()
        assert not state.devices
        booked = {did.device: c.get(MEM, 0) for did, c in state.consumed.items() if c.get(MEM, 0)}
        assert booked == {d: v for d, v in truth.items() if v}
