"""Pods with Dynamic Resource Allocation claims (``spec.resourceClaims``) in the standalone scheduler.

``DraClaims`` is the scheduler's one hook into DRA (``k8s/dra/``):

- ``start``: informers for DeviceClasses, ResourceSlices, ResourceClaims and DeviceTaintRules into
  the ``DraBooks``. They do not hold up the scheduler: until they have listed, a claim pod waits.
- ``prepare(obj, pod)`` before deciding: the pod's claims resolved (``k8s/dra/podclaims.py``) and
  attached to its ``PodSpec`` (``claims``: the claims to allocate, the inventory), for the core's
  DynamicResources plugin, which allocates them per node and reserves the chosen node's devices in
  the books. Or a ``ClaimsRefusal``: why the pod waits (a claim not created yet) or cannot be
  allocated as written (the message names the object and field).
- ``write(obj, pod)`` before binding: ``status.allocation`` and ``status.reservedFor`` written as
  kube-scheduler does (``k8s/dra/writer.py``); an unknown outcome keeps the devices held.
- ``release(obj)`` when the binding did not happen: the pod leaves ``reservedFor``.
- ``write_all(members)`` for a gang (its members' claims allocated jointly by the core,
  ``core/gangclaims.py``): every member's claims written before any member is bound, or none: when
  one member's write fails, what it and the members before it wrote is taken back and every member's
  devices are given back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.core.dra.allocator import Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import Node
from gpusched.core.dra.selector import DraError
from gpusched.core.model import PodSpec
from gpusched.core.queues.usage import Usage
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.mixed import MixedNodes
from gpusched.k8s.dra.podclaims import ClaimRef, Invalid, Waiting, has_claims, resolve
from gpusched.k8s.dra.writer import ClaimWriter, WriteOutcome, Written
from gpusched.k8s.informer import Handlers, Reflector
from gpusched.k8s.state import LiveCluster


@dataclass(frozen=True)
class GangWrite:
    """The outcome of ``write_all``: ``failed`` names the member whose write did not succeed ("" when
    every member's did), ``outcome`` its write's."""

    failed: str = ""
    outcome: WriteOutcome | None = None

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class ClaimsRefusal:
    """Why a claim pod is not decided now: ``reason`` is the event's (FailedScheduling while it
    waits for something to change, InvalidResourceClaim for input that must be fixed)."""

    message: str
    reason: str = "FailedScheduling"


ROOM_S = 300.0
"""How long a preemptor's DRA room is held at most (its victims' grace periods, then
kube-controller-manager's deallocation, then its own decision; docs/dra.md)."""

WAITING_FOR_INFORMERS = (
    "waiting for the DRA informers (ResourceSlices, DeviceClasses, ResourceClaims) to list"
)


class DraClaims:
    def __init__(
        self,
        api: Any,
        *,
        on_change: Callable[[], None] = lambda: None,
        books: DraBooks | None = None,
        writer: ClaimWriter | None = None,
        cluster: LiveCluster | None = None,
    ) -> None:
        """``on_change``: called after every DRA object the informers deliver (a claim created or
        deallocated, a slice published): claim pods that waited may be decided now. ``cluster``: the
        GPU books, told which GPUs claims hold on nodes the agent also serves (``k8s/dra/mixed.py``)."""
        from kubernetes import client

        self._on_change = on_change
        self.resource = client.ResourceV1Api(api) if api is not None else None
        self.books = books or DraBooks(CelCompiler())
        self.writer = writer or ClaimWriter(self.resource, self.books)
        self._refs: dict[str, tuple[ClaimRef, ...]] = {}  # pod key -> its claims at its last prepare
        self._room_busy: set[str] = set()  # preemptors whose room was still busy at their last prepare
        self._lock = threading.Lock()
        self._reflectors: list[Reflector] = []
        self.mixed = MixedNodes(self.books, cluster) if cluster is not None else None

    # ------------------------------------------------------------------ informers
    def start(self) -> None:
        b, r = self.books, self.resource
        assert r is not None

        def handlers(kind: str, up: Callable[[Any], None], down: Callable[[Any], None]) -> Handlers:
            def then(fn: Callable[[Any], None]) -> Callable[[Any], None]:
                def call(arg: Any) -> None:
                    fn(arg)
                    if self.mixed is not None:
                        self.mixed.refresh()
                    self._on_change()

                return call

            return Handlers(then(up), then(down), then(lambda items: b.sync(kind, items)))

        self._reflectors = [
            Reflector(
                "deviceclasses", r.list_device_class, handlers("DeviceClass", b.upsert_class, b.delete_class)
            ),
            Reflector(
                "resourceslices",
                r.list_resource_slice,
                handlers("ResourceSlice", b.upsert_slice, b.delete_slice),
            ),
            Reflector(
                "devicetaintrules",
                r.list_device_taint_rule,
                handlers("DeviceTaintRule", b.upsert_rule, b.delete_rule),
            ),
            Reflector(
                "resourceclaims",
                r.list_resource_claim_for_all_namespaces,
                handlers("ResourceClaim", b.upsert_claim, b.delete_claim),
            ),
        ]
        for refl in self._reflectors:
            refl.start()

    def synced(self) -> bool:
        return bool(self._reflectors) and all(r.synced.is_set() for r in self._reflectors)

    def stop(self) -> None:
        for r in self._reflectors:
            r.stop()

    # ------------------------------------------------------------------ the cycle
    def prepare(self, obj: Mapping[str, Any], pod: PodSpec) -> PodSpec | ClaimsRefusal:
        """``pod`` with its claims attached (unchanged when it has none), or why it is not decided."""
        if not has_claims(obj):
            return pod
        if not self.synced():
            return ClaimsRefusal(WAITING_FOR_INFORMERS)
        busy = bool(self.room_waits(pod.key))  # as the cycle about to run reads the ledger (``room_freed``)
        with self._lock:
            noted = set(self._room_busy)
        gone = {k for k in noted if (room := self.books.reservation(k)) is None or room.room_until is None}
        with self._lock:  # a pod deleted while its room was busy is forgotten with its room
            self._room_busy -= gone
            if busy:
                self._room_busy.add(pod.key)
            else:
                self._room_busy.discard(pod.key)
        held = self.books.reservation(pod.key)
        if held is not None and held.held_since is not None:
            return ClaimsRefusal(
                f"the write of its claims to node {held.node} is being settled (outcome unknown)"
            )
        self.books.unreserve(pod.key, room=False)  # an earlier decision not carried out (a room stays)
        r = resolve(obj, self.books)
        if isinstance(r, Waiting):
            return ClaimsRefusal(r.reason)
        if isinstance(r, Invalid):
            return ClaimsRefusal(r.reason, "InvalidResourceClaim")
        with self._lock:
            self._refs[pod.key] = r.refs
        return dataclasses.replace(pod, claims=r.claims)

    def write(self, obj: Mapping[str, Any], pod: PodSpec, *, keep_trying: Callable[[], bool]) -> WriteOutcome:
        """Write the decision's claims before the binding (WRITTEN at once for a pod without)."""
        if pod.claims is None:
            return WriteOutcome(Written.WRITTEN, attempts=0)
        with self._lock:
            refs = self._refs.pop(pod.key, ())
        if not refs:
            return WriteOutcome(Written.WRITTEN, attempts=0)
        out = self.writer.write(obj, refs, keep_trying=keep_trying)
        if out.ok:
            with self._lock:
                self._refs[pod.key] = refs  # for ``release``
        return out

    def hold_room(self, pod: PodSpec, node: Node, victims: Collection[str]) -> None:
        """``pod`` preempts ``victims`` to land on ``node``: the devices its claims take there once the
        victims' claims are freed are held for it (``DraBooks.hold_room``) until it is decided there,
        or for ``ROOM_S``. Nothing when it has no claim to allocate or they would not fit."""
        if pod.claims is None or not pod.claims.to_allocate:
            return
        try:
            out = pod.claims.allocate(node, self.books.allocated_without({*victims, pod.key}))
        except DraError:
            return
        if isinstance(out, Fits):
            self.books.hold_room(pod.key, node.name, out.allocations, ROOM_S)

    def drop_room(self, key: str) -> None:
        """The preemptor gave its room up (no preemption helps any more): the room goes, unless its
        victims' claims still hold its devices (the victims are gone but kube-controller-manager has
        not deallocated their claims yet: the preemptor is decided again when it has)."""
        if not self.room_waits(key):
            res = self.books.reservation(key)
            if res is not None and res.room_until is not None:
                self.books.unreserve(key)

    def room_waits(self, key: str) -> str:
        """Why preemptor ``key`` waits rather than preempting again ("" when it need not): devices of
        its room are still allocated to others' claims (its victims are gone, kube-controller-
        manager has not deallocated their claims yet; GPUs would be free at that moment, claims
        are not)."""
        res = self.books.reservation(key)
        if res is None or res.room_until is None:
            return ""
        held = self.books.allocated_without({key})
        room = {r.device_id for a in res.allocations for r in a.results}
        busy = room & (held.devices | set(held.consumed))
        if not busy:
            return ""
        return f"waiting for {len(busy)} device(s) of its victims' ResourceClaims to be deallocated"

    def room_freed(self, key: str) -> str:
        """Why preemptor ``key`` is decided again instead of preempting ("" when it need not be): its
        room was still busy when it was prepared (its victims' claims allocated, as its cycle read
        the ledger) and is free now: kube-controller-manager deallocated them while it was decided.
        A preemption that cycle chose elsewhere is stale (it fits its room now); carried out, it
        would evict a pod for nothing, and break a budget it broke "knowingly" (found under load
        by ``tests/e2e/test_dra_preempt_e2e.py``: the PodDisruptionBudget's pod deleted)."""
        with self._lock:
            if key not in self._room_busy:
                return ""
            self._room_busy.discard(key)
        res = self.books.reservation(key)
        if res is None or res.room_until is None or self.room_waits(key):
            return ""
        return "its room's devices were freed while it was decided: decided again"

    # ------------------------------------------------------------------ tenant queues
    def claim_charges(self) -> Mapping[str, Usage]:
        """Per booked pod, what its claims ask per DeviceClass (``DraBooks.claim_charges``)."""
        return self.books.claim_charges()

    def decided_charge(self, pod: str) -> Usage | None:
        """What the claims of ``pod``'s decision took per DeviceClass (``DraBooks.decided_charge``)."""
        return self.books.decided_charge(pod)

    def unknown_classes(self, names: Collection[str]) -> list[str]:
        """Those of ``names`` that are no DeviceClass the API has (none until the informers listed)."""
        if not names or not self.synced():
            return []
        known = self.books.class_names()
        return sorted(n for n in names if n not in known)

    def write_all(
        self, members: Sequence[tuple[Mapping[str, Any], PodSpec]], *, keep_trying: Callable[[], bool]
    ) -> GangWrite:
        """Write the claims of a gang's placed members, in order, before any is bound; or none: when
        a member's write fails, what it and the members before it wrote is taken back (``ClaimWriter.undo``:
        claims they allocated deallocated, the pods out of ``reservedFor``) and every member's devices
        are given back (the failed write's own stay held when its outcome is unknown, as for a pod)."""
        mine = {}
        for _, pod in members:
            res = self.books.reservation(pod.key)
            mine[pod.key] = {a.claim: a for a in res.allocations} if res is not None else {}
        with self._lock:
            refs = {pod.key: self._refs.get(pod.key, ()) for _, pod in members}
        done: list[tuple[Mapping[str, Any], PodSpec]] = []
        for obj, pod in members:
            out = self.write(obj, pod, keep_trying=keep_trying)
            if out.ok:
                done.append((obj, pod))
                continue
            for o, p in reversed([*done, (obj, pod)]):  # the failed one's claims written before it too
                with self._lock:
                    self._refs.pop(p.key, None)
                self.writer.undo(o, refs[p.key], mine[p.key])
            for _, p in members:
                if p.key != pod.key or out.result is not Written.HELD:
                    self.books.unreserve(p.key)
            return GangWrite(pod.key, out)
        return GangWrite()

    def release(self, obj: Mapping[str, Any], pod: PodSpec) -> None:
        """The binding did not happen: the pod leaves its claims' ``reservedFor``."""
        with self._lock:
            refs = self._refs.pop(pod.key, ())
        if refs:
            self.writer.release(obj, refs)

    def bound(self, pod: PodSpec) -> None:
        with self._lock:
            self._refs.pop(pod.key, None)
            self._room_busy.discard(pod.key)
