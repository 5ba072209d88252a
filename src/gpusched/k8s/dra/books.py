"""The DRA books: resource.k8s.io objects from informers, converted, and the devices claims hold.

``DraBooks`` keeps the DeviceClasses, ResourceSlices, DeviceTaintRules and ResourceClaims the
informers deliver, converted to the core's model (an object that cannot be converted is kept out and
its error remembered, ``problems``), and is the core's ``ClaimLedger``:

- a claim's devices are held from its ``status.allocation`` as the API shows it, whoever allocated
  it (kube-scheduler, another scheduler, a controller): nothing another allocator gave out is given
  out again here;
- a decision's devices are held from Reserve (``reserve``, called by the DynamicResources plugin in
  the scheduling cycle) until the informer shows the claim allocated (then the API's copy counts,
  and the reservation is dropped: a device is never counted twice), or the decision is given back
  (``unreserve``: the write was refused, the pod decided again);
- a reservation whose write had an unknown outcome is ``hold``-en: kept until the informer shows the
  claim allocated, or for ``grace_s`` (the apiserver's request timeout) while it shows it unallocated;
- a nominated preemptor's room (``hold_room``): the devices its victims' claims free, held for it
  while they leave and kube-controller-manager deallocates their claims.

Preemption's what-if asks ``allocated_without(victims)``: a claim is free there only when every pod
in its ``reservedFor`` is a victim (a shared claim with a consumer that stays is still held).

Thread-safe: informer threads, the scheduling thread and the writers share one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpusched.core.dra.inventory import DraInventory
from gpusched.core.dra.model import (
    AllocatedState,
    Claim,
    ClaimAllocation,
    DeviceClass,
    DeviceId,
    DeviceResult,
    ResourceSlice,
)
from gpusched.core.dra.selector import SelectorCompiler
from gpusched.core.queues.usage import Usage, allocated_charge
from gpusched.k8s.dra.convert import (
    DraObjectError,
    HeldDevice,
    TaintRule,
    allocation_from_k8s,
    claim_from_k8s,
    claim_key,
    device_class_from_k8s,
    slice_from_k8s,
    taint_rule_from_k8s,
)

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Reservation:
    """A decision's devices, per claim key, held until written (or given back)."""

    pod: str
    node: str
    allocations: tuple[ClaimAllocation, ...]
    held_since: float | None = None  # set when its write's outcome is unknown (``hold``)
    room_until: float | None = None  # a preemptor's room (``hold_room``), kept until then at most


def _allocation_of(obj: Mapping[str, Any]) -> ClaimAllocation:
    """A claim's ``status.allocation`` as far as its charge needs it: each result's request, device
    and admin access (``DraObjectError`` when it cannot be read)."""
    at = f"ResourceClaim {claim_key(obj)}: status.allocation.devices.results"
    alloc = (obj.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    out = []
    for i, r in enumerate(results if isinstance(results, list) else ()):
        if not isinstance(r, Mapping) or not all(isinstance(r.get(k), str) for k in ("request", "device")):
            raise DraObjectError(f"{at}[{i}]: a result needs request and device")
        out.append(DeviceResult(r["request"], str(r.get("driver", "")), str(r.get("pool", "")), r["device"],
                                admin_access=bool(r.get("adminAccess"))))  # fmt: skip
    return ClaimAllocation(claim_key(obj), tuple(out), None)


def held_devices(allocations: tuple[ClaimAllocation, ...]) -> dict[str, tuple[HeldDevice, ...]]:
    """Per claim key, the devices a decision takes (admin access holds nothing)."""
    return {
        a.claim: tuple(
            HeldDevice(r.device_id, r.shared, dict(r.consumed_capacity) or None, r.admin_access)
            for r in a.results
        )
        for a in allocations
    }


def consumers_of(obj: Obj) -> tuple[str, ...]:
    """The consumers in a claim's ``status.reservedFor``: a pod as namespace/name (the claim's
    namespace), anything else as group/resource/name (never a pod key, so never freed by a pod's
    eviction)."""
    ns = str((obj.get("metadata") or {}).get("namespace") or "")
    out: list[str] = []
    for r in (obj.get("status") or {}).get("reservedFor") or []:
        if not isinstance(r, Mapping):
            continue
        name = str(r.get("name") or "")
        if r.get("resource") == "pods" and not r.get("apiGroup"):
            out.append(f"{ns}/{name}")
        else:
            out.append(f"{r.get('apiGroup') or ''}/{r.get('resource')}/{name}")
    return tuple(out)


class DraBooks:
    def __init__(
        self,
        compiler: SelectorCompiler,
        *,
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.compiler = compiler
        self.grace_s = grace_s
        self._clock = clock
        self.lock = threading.RLock()
        self._classes: dict[str, DeviceClass] = {}
        self._class_objs: dict[str, Obj] = {}  # the API objects: their opaque configs are copied
        self._slices: dict[str, ResourceSlice] = {}
        self._rules: dict[str, TaintRule] = {}
        self._claims: dict[str, Obj] = {}  # key -> the API object
        self._held: dict[str, tuple[HeldDevice, ...]] = {}  # claim key -> its allocation in the API
        self._reserved: dict[str, Reservation] = {}  # pod key -> its decision
        self._rooms_under: dict[str, Reservation] = {}  # pod key -> its room a decision replaced
        self._consumers: dict[str, tuple[str, ...]] = {}  # claim key -> its reservedFor (``consumers_of``)
        self._by_consumer: dict[str, set[str]] = {}  # consumer -> the claims reserved for it
        self._problems: dict[str, str] = {}  # "Kind name" -> why it cannot be read
        self._inventory: DraInventory | None = None
        self.version = 0
        """Moves forward with every change of the objects or the devices held (``MixedNodes`` caches)."""
        self.slices_version = 0
        """Moves forward with every change of the ResourceSlices."""

    # ------------------------------------------------------------------ informer side
    def upsert_class(self, obj: Obj) -> None:
        with self.lock:
            self._class_objs[str((obj.get("metadata") or {}).get("name"))] = obj
            self._convert("DeviceClass", obj, device_class_from_k8s, self._classes)

    def delete_class(self, obj: Obj) -> None:
        with self.lock:
            self._class_objs.pop(str((obj.get("metadata") or {}).get("name")), None)
            self._drop("DeviceClass", obj, self._classes)

    def upsert_slice(self, obj: Obj) -> None:
        with self.lock:
            self._convert("ResourceSlice", obj, slice_from_k8s, self._slices)
            self.slices_version += 1

    def delete_slice(self, obj: Obj) -> None:
        with self.lock:
            self._drop("ResourceSlice", obj, self._slices)
            self.slices_version += 1

    def upsert_rule(self, obj: Obj) -> None:
        self._convert("DeviceTaintRule", obj, taint_rule_from_k8s, self._rules)

    def delete_rule(self, obj: Obj) -> None:
        self._drop("DeviceTaintRule", obj, self._rules)

    def upsert_claim(self, obj: Obj) -> None:
        key = claim_key(obj)
        with self.lock:
            self._claims[key] = obj
            self._index_consumers(key, consumers_of(obj))
            try:
                held = allocation_from_k8s(obj)
                self._problems.pop(f"ResourceClaim {key}", None)
            except DraObjectError as e:  # an allocation we cannot read: hold nothing we cannot name
                self._problems[f"ResourceClaim {key}"] = str(e)
                held = None
            if held is None:
                self._held.pop(key, None)
            else:
                self._held[key] = held
                self._written(key)
            self.version += 1  # the inventory stays: it holds no claim (the ledger is this book)

    def delete_claim(self, obj: Obj) -> None:
        key = claim_key(obj)
        with self.lock:
            self._claims.pop(key, None)
            self._index_consumers(key, ())
            self._held.pop(key, None)
            self._written(key)
            self.version += 1

    def sync(self, kind: str, items: list[Obj]) -> None:
        """After a (re)list: drop the objects of ``kind`` that are gone."""
        with self.lock:
            if kind == "ResourceClaim":
                for key in set(self._claims) - {claim_key(o) for o in items}:
                    self.delete_claim(self._claims[key])
                return
            books: dict[str, dict[str, Any]] = {
                "DeviceClass": self._classes,
                "ResourceSlice": self._slices,
                "DeviceTaintRule": self._rules,
            }
            book = books[kind]
            if kind == "ResourceSlice":
                self.slices_version += 1
            names = {str((o.get("metadata") or {}).get("name")) for o in items}
            for name in set(book) - names:
                del book[name]
                if kind == "DeviceClass":
                    self._class_objs.pop(name, None)
            for p in [
                p for p in self._problems if p.startswith(kind + " ") and p.split(" ", 1)[1] not in names
            ]:
                del self._problems[p]
            self._changed()

    def _convert(self, kind: str, obj: Obj, fn: Callable[[Obj], Any], book: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        with self.lock:
            try:
                book[name] = fn(obj)
                self._problems.pop(f"{kind} {name}", None)
            except DraObjectError as e:
                book.pop(name, None)  # kept out: a slice's pool then looks incomplete, and is not used
                if self._problems.get(f"{kind} {name}") != str(e):
                    log.warning("%s", e)
                self._problems[f"{kind} {name}"] = str(e)
            self._changed()

    def _drop(self, kind: str, obj: Obj, book: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        with self.lock:
            book.pop(name, None)
            self._problems.pop(f"{kind} {name}", None)
            self._changed()

    def _changed(self) -> None:
        """A class, slice or taint rule changed: the next ``inventory()`` is built anew (with a new
        ``AllocatorMemo``, so no pool or selector result read from the old objects is reused)."""
        self._inventory = None
        self.version += 1

    # ------------------------------------------------------------------ reads
    def claim(self, key: str) -> Obj | None:
        with self.lock:
            return self._claims.get(key)

    def class_names(self) -> frozenset[str]:
        """The DeviceClasses the API has (also those that could not be read)."""
        with self.lock:
            return frozenset(self._class_objs)

    def class_object(self, name: str) -> Obj | None:
        with self.lock:
            return self._class_objs.get(name)

    def problem(self, what: str) -> str:
        """Why ``what`` ("DeviceClass gpu.example.com") could not be read ("" when it could)."""
        with self.lock:
            return self._problems.get(what, "")

    def problems(self) -> dict[str, str]:
        with self.lock:
            return dict(self._problems)

    def slices(self) -> tuple[ResourceSlice, ...]:
        """The slices as converted (without DeviceTaintRules' taints; no inventory built)."""
        with self.lock:
            return tuple(self._slices.values())

    def inventory(self) -> DraInventory:
        with self.lock:
            if self._inventory is None:
                slices = tuple(self._tainted(s) for _, s in sorted(self._slices.items()))
                self._inventory = DraInventory(dict(self._classes), slices, self, self.compiler)
            return self._inventory

    def _tainted(self, s: ResourceSlice) -> ResourceSlice:
        """The slice with the DeviceTaintRules' taints added to the devices they select."""
        rules = list(self._rules.values())
        if not rules:
            return s
        devices = []
        for d in s.devices:
            extra = tuple(r.taint for r in rules if r.selects(s.driver, s.pool, d.name))
            devices.append(replace(d, taints=d.taints + extra) if extra else d)
        return replace(s, devices=tuple(devices))

    # ------------------------------------------------------------------ ClaimLedger
    def allocated(self) -> AllocatedState:
        return self.allocated_without(())

    def allocated_without(self, leaving: Collection[str]) -> AllocatedState:
        """What claims hold once the pods ``leaving`` (namespace/name) are gone, as the API will show
        it after kube-controller-manager's resourceclaim controller has taken them out of
        ``reservedFor`` and deallocated the claims left with no consumer: a claim is freed only when
        it is reserved for someone and every pod it is reserved for is leaving (a shared claim with
        a consumer that stays, or one reserved for something other than a pod, stays held); the
        leavers' own reservations not yet written go too. ``allocated()`` is this with no one."""
        gone = frozenset(leaving)
        with self.lock:
            self._expire()
            per_claim = dict(self._held)
            for k in {c for pod in gone for c in self._by_consumer.get(pod, ())}:  # their claims only
                if k in per_claim and self._freed(self._claims.get(k), gone):
                    del per_claim[k]
            in_flight: dict[str, ClaimAllocation] = {}
            for res in self._reserved.values():
                if res.pod in gone:
                    continue
                for key, devices in held_devices(res.allocations).items():
                    if key not in self._held:  # the API's copy wins once it is seen
                        per_claim.setdefault(key, devices)
                in_flight.update((a.claim, a) for a in res.allocations if a.claim not in self._held)
            exclusive: set[DeviceId] = set()
            consumed: dict[DeviceId, dict[str, int]] = {}
            for devices in per_claim.values():
                for d in devices:
                    if d.admin_access:
                        continue
                    if d.shared:
                        book = consumed.setdefault(d.device, {})
                        for name, v in (d.consumed or {}).items():
                            book[name] = book.get(name, 0) + v
                    else:
                        exclusive.add(d.device)
            return AllocatedState(frozenset(exclusive), consumed, in_flight)

    def _index_consumers(self, claim: str, consumers: tuple[str, ...]) -> None:
        for c in self._consumers.pop(claim, ()):
            keys = self._by_consumer.get(c)
            if keys is not None:
                keys.discard(claim)
                if not keys:
                    del self._by_consumer[c]
        if consumers:
            self._consumers[claim] = consumers
            for c in consumers:
                self._by_consumer.setdefault(c, set()).add(claim)

    @staticmethod
    def _freed(obj: Obj | None, gone: frozenset[str]) -> bool:
        """Whether the claim ``obj`` has consumers and every one of them is a pod in ``gone``."""
        if obj is None:
            return False
        consumers = consumers_of(obj)
        return bool(consumers) and all(c in gone for c in consumers)

    def claim_charges(self) -> dict[str, Usage]:
        """Per pod key, what the claims allocated for it took per DeviceClass: those the API shows
        allocated, charged to the first consumer in ``reservedFor``, and those of its decision not
        yet seen written (``core.queues.usage.allocated_charge``: an ``All`` request every device
        it got). The tenant queues' charge of a booked claim pod. A claim that cannot be read is
        charged nothing."""
        with self.lock:
            by_pod: dict[str, list[tuple[Claim, ClaimAllocation]]] = {}
            for key, obj in self._claims.items():
                if key not in self._held:
                    continue
                consumers = consumers_of(obj)
                if not consumers:
                    continue
                try:
                    got = (claim_from_k8s(obj), _allocation_of(obj))
                except DraObjectError:
                    continue
                by_pod.setdefault(consumers[0], []).append(got)
            for res in self._reserved.values():
                if res.room_until is None:
                    by_pod.setdefault(res.pod, []).extend(self._decided(res))
        return {
            pod: allocated_charge([c for c, _ in got], [a for _, a in got]) for pod, got in by_pod.items()
        }

    def decided_charge(self, pod: str) -> Usage | None:
        """What the claims of ``pod``'s decision (not yet seen written) took per DeviceClass; None
        when it has no decision held."""
        with self.lock:
            res = self._reserved.get(pod)
            if res is None or res.room_until is not None:
                return None
            got = self._decided(res)
        return allocated_charge([c for c, _ in got], [a for _, a in got])

    def _decided(self, res: Reservation) -> list[tuple[Claim, ClaimAllocation]]:
        out = []
        for a in res.allocations:
            obj = self._claims.get(a.claim)
            if obj is None or a.claim in self._held:
                continue  # gone, or seen allocated (charged from the API's copy)
            try:
                out.append((claim_from_k8s(obj), a))
            except DraObjectError:
                continue
        return out

    def consumers(self, claim: str) -> tuple[str, ...]:
        """The consumers ``claim`` (namespace/name) is reserved for, as ``consumers_of`` names them."""
        with self.lock:
            obj = self._claims.get(claim)
            return consumers_of(obj) if obj is not None else ()

    def reserve(self, pod: str, node: str, allocations: tuple[ClaimAllocation, ...]) -> None:
        with self.lock:
            old = self._reserved.get(pod)
            if old is not None and old.room_until is not None:
                self._rooms_under[pod] = old  # back if the decision is given back (a what-if's undo)
            self._reserved[pod] = Reservation(pod, node, allocations)
            self.version += 1

    def unreserve(self, pod: str, *, room: bool = True) -> None:
        """Give ``pod``'s decision back (and its room, unless ``room`` is False). A decision that
        replaced the pod's room gives the room back (while it lasts): a what-if's Reserve undone
        (``core.scheduler.undo``) leaves the books as it found them, and a refused write leaves the
        preemptor its room."""
        with self.lock:
            res = self._reserved.get(pod)
            if res is None or (not room and res.room_until is not None):
                return
            del self._reserved[pod]
            under = self._rooms_under.pop(pod, None)
            if res.room_until is None and under is not None and self._clock() < (under.room_until or 0.0):
                self._reserved[pod] = under
            self.version += 1

    def hold_room(self, pod: str, node: str, allocations: tuple[ClaimAllocation, ...], for_s: float) -> None:
        """A preemptor nominated on ``node``: the devices the what-if gave it there (its victims'
        claims, still allocated until kube-controller-manager deallocates them) are held for it, so
        that no other pod takes them once they are free, for ``for_s`` at most (the preemptor
        deleted or never back). The preemptor's own decisions see them free (``allocated_without``
        with its key); its Reserve replaces the room with the decision."""
        with self.lock:
            self._reserved[pod] = Reservation(pod, node, allocations, room_until=self._clock() + for_s)
            self._rooms_under.pop(pod, None)
            self.version += 1

    def reservation(self, pod: str) -> Reservation | None:
        with self.lock:
            self._expire()  # a held write past its grace is given up here too (its pod asks first)
            return self._reserved.get(pod)

    def reserving(self, claim: str) -> str:
        """The pod whose decision holds ``claim`` (namespace/name) not yet seen written ("" if none)."""
        with self.lock:
            for res in self._reserved.values():
                if any(a.claim == claim for a in res.allocations) and claim not in self._held:
                    return res.pod
            return ""

    def hold(self, pod: str) -> None:
        """The write of ``pod``'s decision had an unknown outcome: keep its devices until the
        informer shows its claims allocated, or for ``grace_s`` while they show unallocated."""
        with self.lock:
            res = self._reserved.get(pod)
            if res is not None and res.held_since is None:
                self._reserved[pod] = Reservation(res.pod, res.node, res.allocations, self._clock())

    def _written(self, claim: str) -> None:
        """The API now shows ``claim`` allocated (or gone): a reservation whose claims all are is done."""
        for pod, res in list(self._reserved.items()):
            keys = {a.claim for a in res.allocations}
            if claim in keys and all(k in self._held or k not in self._claims for k in keys):
                del self._reserved[pod]
                self._rooms_under.pop(pod, None)
                self.version += 1

    def _expire(self) -> None:
        """Held reservations past their grace, whose claims the API still shows unallocated, are
        given up: by then a write the apiserver received has been committed (and seen) or not."""
        now = self._clock()
        for pod, res in list(self._reserved.items()):
            if (res.held_since is not None and now - res.held_since >= self.grace_s) or (
                res.room_until is not None and now >= res.room_until
            ):
                del self._reserved[pod]
                self._rooms_under.pop(pod, None)
                self.version += 1

    def reservations(self) -> list[str]:
        with self.lock:
            return sorted(self._reserved)
