"""Writing a decision's claims (k8s/dra/writer.py) and holding their devices (k8s/dra/books.py), on a
recording fake of ResourceV1Api: each outcome of the API read as k8s/binding.py reads a binding's."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from k8s_objects import DRIVER, allocation, claim, pod, whole
from kubernetes.client.exceptions import ApiException

from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import ClaimAllocation, DeviceId, DeviceResult
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.podclaims import ClaimRef
from gpusched.k8s.dra.writer import FINALIZER, ClaimWriter, Written


class _Resp:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.data = json.dumps(obj).encode()


class FakeResourceApi:
    """Claims by (ns, name); ``fail[method]`` lists HTTP statuses (or 0: no answer) to answer before
    succeeding; ``lost[method]`` counts calls that are committed but whose answer is lost."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): copy.deepcopy(c) for c in claims}
        self.fail: dict[str, list[int]] = {}
        self.lost: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []
        self.rv = 10

    def _maybe_fail(self, method: str) -> None:
        queue = self.fail.get(method) or []
        if queue:
            code = queue.pop(0)
            if code == 0:
                raise ConnectionResetError("connection reset by peer")
            raise ApiException(status=code, reason="scripted")

    def read_namespaced_resource_claim(self, name: str, ns: str, **_: Any) -> _Resp:
        self.calls.append(("read", name))
        self._maybe_fail("read")
        if (ns, name) not in self.claims:
            raise ApiException(status=404, reason="NotFound")
        return _Resp(self.claims[(ns, name)])

    def _replace(self, method: str, name: str, ns: str, body: dict[str, Any], part: str) -> _Resp:
        self.calls.append((method, name))
        self._maybe_fail(method)
        cur = self.claims[(ns, name)]
        if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.rv += 1
        new = copy.deepcopy(cur)
        if part == "status":
            new["status"] = copy.deepcopy(body.get("status") or {})
        else:
            new["metadata"] = copy.deepcopy(body["metadata"])
        new["metadata"]["resourceVersion"] = str(self.rv)
        self.claims[(ns, name)] = new
        if self.lost.get(method):
            self.lost[method] -= 1
            raise TimeoutError("read timed out")
        return _Resp(new)

    def replace_namespaced_resource_claim(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> _Resp:
        return self._replace("replace", name, ns, body, "metadata")

    def replace_namespaced_resource_claim_status(
        self, name: str, ns: str, body: dict[str, Any], **_: Any
    ) -> _Resp:
        return self._replace("status", name, ns, body, "status")


NODE = "node-a"


def decision(claim_key: str = "ns/c", *devices: str) -> tuple[ClaimAllocation, ...]:
    results = tuple(DeviceResult("gpu", DRIVER, NODE, d) for d in devices or ("gpu-0",))
    return (ClaimAllocation(claim_key, results, NODE),)


def setup(
    *claims: dict[str, Any], devices: tuple[str, ...] = ("gpu-0",)
) -> tuple[FakeResourceApi, DraBooks, ClaimWriter]:
    api = FakeResourceApi(*claims)
    books = DraBooks(CelCompiler())
    for c in claims:
        books.upsert_claim(c)
    books.reserve("ns/p", NODE, decision("ns/c", *devices))
    return api, books, ClaimWriter(api, books, sleep=lambda s: None, new_share_id=lambda: "share-1")


REF = ClaimRef("gpu", "ns/c", "uid-c", False)
POD = pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
always: Callable[[], bool] = lambda: True  # noqa: E731
never: Callable[[], bool] = lambda: False  # noqa: E731


def test_an_unallocated_claim_gets_the_finalizer_then_its_allocation_and_the_pod() -> None:
    api, _books, writer = setup(claim("c", [whole()]))
    out = writer.write(POD, (REF,), keep_trying=always)
    assert out.ok and out.attempts == 1
    assert [m for m, _ in api.calls] == ["read", "replace", "status"]
    got = api.claims[("ns", "c")]
    assert FINALIZER in got["metadata"]["finalizers"]
    assert got["status"]["allocation"] == allocation(NODE, "gpu-0")
    assert got["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "uid-p"}]


def test_a_share_gets_a_share_id_and_its_consumed_capacity() -> None:
    api, books, writer = setup(claim("c", [whole()]))
    share = DeviceResult(
        "gpu", DRIVER, NODE, "gpu-0", consumed_capacity={f"{DRIVER}/memory": 2**30}, shared=True
    )
    books.reserve("ns/p", NODE, (ClaimAllocation("ns/c", (share,), NODE),))
    assert writer.write(POD, (REF,), keep_trying=always).ok
    (result,) = api.claims[("ns", "c")]["status"]["allocation"]["devices"]["results"]
    assert result["shareID"] == "share-1" and result["consumedCapacity"] == {"memory": "1Gi"}


def test_a_claim_already_allocated_only_gains_the_pod_in_reserved_for() -> None:
    other = {"resource": "pods", "name": "q", "uid": "uid-q"}
    api, books, writer = setup(
        claim("c", [whole()], allocation=allocation(NODE, "gpu-0"), reservedFor=[other])
    )
    ref = ClaimRef("gpu", "ns/c", "uid-c", True)
    books.unreserve("ns/p")
    assert writer.write(POD, (ref,), keep_trying=always).ok
    assert [m for m, _ in api.calls] == ["read", "status"]
    assert api.claims[("ns", "c")]["status"]["reservedFor"] == [
        other,
        {"resource": "pods", "name": "p", "uid": "uid-p"},
    ]


def test_a_conflict_is_read_again_and_written_on_the_fresh_copy() -> None:
    api, _books, writer = setup(claim("c", [whole()]))
    api.fail["status"] = [409]
    out = writer.write(POD, (REF,), keep_trying=always)
    assert out.ok
    assert [m for m, _ in api.calls] == ["read", "replace", "status", "read", "status"]
    assert api.claims[("ns", "c")]["status"]["allocation"] == allocation(NODE, "gpu-0")


def test_a_claim_allocated_by_someone_else_meanwhile_is_refused_and_the_devices_given_back() -> None:
    api, books, writer = setup(claim("c", [whole()]))
    api.claims[("ns", "c")]["status"] = {"allocation": allocation(NODE, "gpu-1")}
    out = writer.write(POD, (REF,), keep_trying=always)
    assert out.result is Written.REFUSED and "allocated by someone else" in out.message
    assert books.reservation("ns/p") is None
    assert api.claims[("ns", "c")]["status"]["allocation"] == allocation(NODE, "gpu-1")  # untouched


@pytest.mark.parametrize("code", [422, 403, 404])
def test_a_refusal_writes_nothing_and_gives_the_devices_back(code: int) -> None:
    api, books, writer = setup(claim("c", [whole()]))
    api.fail["status"] = [code]
    out = writer.write(POD, (REF,), keep_trying=always)
    assert out.result is Written.REFUSED and str(code) in out.message
    assert books.reservation("ns/p") is None
    assert DeviceId(DRIVER, NODE, "gpu-0") not in books.allocated().devices


def test_an_unknown_outcome_is_retried_with_the_same_decision() -> None:
    api, _books, writer = setup(claim("c", [whole()]))
    api.fail["status"] = [503, 0]
    out = writer.write(POD, (REF,), keep_trying=always)
    assert out.ok and out.attempts == 3
    assert api.claims[("ns", "c")]["status"]["allocation"] == allocation(NODE, "gpu-0")


def test_a_write_committed_but_unanswered_is_recognised_as_ours() -> None:
    api, _books, writer = setup(claim("c", [whole()]))
    api.lost["status"] = 1  # committed, the answer lost: the retry finds our allocation
    out = writer.write(POD, (REF,), keep_trying=always)
    assert out.ok and out.attempts == 2
    assert api.claims[("ns", "c")]["status"]["reservedFor"] == [
        {"resource": "pods", "name": "p", "uid": "uid-p"}
    ]


def test_an_unknown_outcome_when_retrying_stops_holds_the_devices_until_the_api_says() -> None:
    now = [0.0]
    api = FakeResourceApi(claim("c", [whole()]))
    books = DraBooks(CelCompiler(), grace_s=60.0, clock=lambda: now[0])
    books.upsert_claim(api.claims[("ns", "c")])
    books.reserve("ns/p", NODE, decision())
    writer = ClaimWriter(api, books, sleep=lambda s: None)
    api.fail["status"] = [500]
    out = writer.write(POD, (REF,), keep_trying=never)
    assert out.result is Written.HELD
    gpu0 = DeviceId(DRIVER, NODE, "gpu-0")
    now[0] = 59.0
    assert gpu0 in books.allocated().devices  # held: the write may have landed
    assert books.reservation("ns/p") is not None
    now[0] = 61.0
    assert books.reservation("ns/p") is None  # past the grace, still unallocated in the API: given up
    assert gpu0 not in books.allocated().devices


def test_a_held_write_seen_landed_is_counted_once_from_the_api() -> None:
    _api, books, _writer = setup(claim("c", [whole()]))
    books.hold("ns/p")
    landed = claim("c", [whole()], allocation=allocation(NODE, "gpu-0"))
    books.upsert_claim(landed)
    assert books.reservation("ns/p") is None  # the API's copy counts now
    assert books.allocated().devices == {DeviceId(DRIVER, NODE, "gpu-0")}


def test_release_takes_only_this_pod_out_of_reserved_for() -> None:
    other = {"resource": "pods", "name": "q", "uid": "uid-q"}
    me = {"resource": "pods", "name": "p", "uid": "uid-p"}
    api, _books, writer = setup(
        claim("c", [whole()], allocation=allocation(NODE, "gpu-0"), reservedFor=[other, me])
    )
    writer.release(POD, (REF,))
    assert api.claims[("ns", "c")]["status"]["reservedFor"] == [other]


def gang_of_two(
    shared: bool = False,
) -> tuple[FakeResourceApi, DraBooks, Any, list[tuple[dict[str, Any], Any]]]:
    """Members p (claim c) and q (claim d; with ``shared`` also c, allocated by p's decision)."""
    from gpusched.core.dra.inventory import PodClaims
    from gpusched.core.model import PodSpec
    from gpusched.k8s.claims import DraClaims

    api = FakeResourceApi(claim("c", [whole()]), claim("d", [whole()]))
    books = DraBooks(CelCompiler())
    books.reserve("ns/p", NODE, decision("ns/c", "gpu-0"))
    books.reserve("ns/q", NODE, decision("ns/d", "gpu-1"))
    writer = ClaimWriter(api, books, sleep=lambda s: None)
    dra = DraClaims(None, books=books, writer=writer)
    ref_d = ClaimRef("gpu", "ns/d", "uid-d", False)
    dra._refs = {"ns/p": (REF,), "ns/q": ((REF, ref_d) if shared else (ref_d,))}
    specs = [PodSpec(n, namespace="ns", claims=PodClaims((), (), books.inventory())) for n in ("p", "q")]
    members = [(pod("p", [{"name": "gpu", "resourceClaimName": "c"}]), specs[0]),
               (pod("q", [{"name": "gpu", "resourceClaimName": "d"}]), specs[1])]  # fmt: skip
    return api, books, dra, members


@pytest.mark.parametrize("shared", [False, True])
def test_a_gang_whose_second_member_cannot_be_written_leaves_no_claim_allocated(shared: bool) -> None:
    """All members or none: q's claim is refused (422), so p's claim, written first, is taken back:
    no allocation, no reservedFor, no finalizer (also when removing it conflicts once); every
    member's devices are given back."""
    api, books, dra, members = gang_of_two(shared)
    calls = {"n": 0}
    real = api.replace_namespaced_resource_claim_status

    def refuse_d(name: str, ns: str, body: dict[str, Any], **kw: Any) -> Any:
        if name == "d":
            calls["n"] += 1
            api.fail["replace"] = [409]  # the undo's finalizer removal conflicts once (the controller wrote)
            raise ApiException(status=422, reason="Invalid")
        return real(name, ns, body, **kw)

    api.replace_namespaced_resource_claim_status = refuse_d  # type: ignore[method-assign]
    w = dra.write_all(members, keep_trying=always)
    assert not w.ok and w.failed == "ns/q" and w.outcome.result is Written.REFUSED and calls["n"] == 1
    c = api.claims[("ns", "c")]
    assert "allocation" not in c["status"] and "reservedFor" not in c["status"]
    assert FINALIZER not in (c["metadata"].get("finalizers") or [])
    assert books.reservations() == []


def test_a_gang_whose_members_are_all_written_keeps_every_allocation() -> None:
    """Every member's claims are written (p's c, q's d; c shared, allocated once) and nothing is taken back:
    the books keep both members' devices until the informer brings the API's copies."""
    api, books, dra, members = gang_of_two(shared=True)
    w = dra.write_all(members, keep_trying=always)
    assert w.ok and w.failed == "" and w.outcome is None
    c, d = api.claims[("ns", "c")], api.claims[("ns", "d")]
    assert [r["device"] for r in c["status"]["allocation"]["devices"]["results"]] == ["gpu-0"]
    assert [r["device"] for r in d["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]
    assert [r["uid"] for r in c["status"]["reservedFor"]] == ["uid-p", "uid-q"]  # shared, allocated once
    assert [r["uid"] for r in d["status"]["reservedFor"]] == ["uid-q"]
    assert books.reservations() == ["ns/p", "ns/q"]
    assert books.allocated().devices == {DeviceId(DRIVER, NODE, "gpu-0"), DeviceId(DRIVER, NODE, "gpu-1")}
