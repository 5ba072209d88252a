"""Writing a decision's claims as kube-scheduler's DynamicResources PreBind does, before the binding.

For each of the pod's claims, in the pod's order: a claim this decision allocated gets the
``resource.kubernetes.io/delete-protection`` finalizer (so it is not deleted while allocated), then
``status.allocation`` (the results, a ``shareID`` for each share, the class and claim configs, the
node selector) and ``status.reservedFor`` with the pod; a claim already allocated gets the pod added
to ``status.reservedFor``. Every write carries the ``resourceVersion`` it read, so a claim changed
meanwhile is read again, never overwritten.

The outcome, as ``k8s/binding.py`` reads a binding's:

- ``WRITTEN``: every claim shows the allocation and the pod; bind now.
- ``REFUSED``: the API refused and this decision wrote nothing that holds devices (a claim is gone,
  was allocated differently by someone else meanwhile, or a write was rejected as invalid): give the
  devices back and decide again.
- ``HELD``: the outcome is unknown (no answer, 5xx, 429) and retrying stopped: the devices stay
  held (``DraBooks.hold``) until the informer shows the claims allocated, or for the grace period.

When the pod is then not bound (refused, gone), ``release`` takes the pod out of ``reservedFor``, as
kube-scheduler's Unreserve does; kube-controller-manager's resourceclaim controller deallocates a
claim whose last consumer is gone, and deletes the claims it made from templates with their pod, so
that is not repeated here.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gpusched.core.dra.model import ClaimAllocation
from gpusched.core.dra.quantity import format_quantity
from gpusched.core.errors import GpuschedError
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.podclaims import ClaimRef

log = logging.getLogger(__name__)

FINALIZER = "resource.kubernetes.io/delete-protection"
REQUEST_TIMEOUT_S = 30.0


class Written(enum.Enum):
    WRITTEN = "written"
    REFUSED = "refused"
    HELD = "held"


@dataclass(frozen=True)
class WriteOutcome:
    result: Written
    message: str = ""
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.result is Written.WRITTEN


class _Refused(GpuschedError):
    """The API refused a write (the message says which and why)."""


class _Unknown(GpuschedError):
    """A write's outcome is unknown (no answer, 5xx, 429)."""


def _status(e: BaseException) -> int | None:
    s = getattr(e, "status", None)
    return s if isinstance(s, int) and s > 0 else None


class ClaimWriter:
    """Writes claims through a ``ResourceV1Api`` (raw JSON in and out)."""

    def __init__(
        self,
        api: Any,
        books: DraBooks,
        *,
        sleep: Callable[[float], None] = time.sleep,
        new_share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.api = api
        self.books = books
        self._sleep = sleep
        self._share_id = new_share_id

    # ------------------------------------------------------------------ API calls
    def _call(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as e:
            code = _status(e)
            if code == 409:
                raise
            if code is not None and 400 <= code < 500 and code != 429:
                raise _Refused(f"{code} {getattr(e, 'reason', '')}: {getattr(e, 'body', '') or e}") from None
            raise _Unknown(f"{code or type(e).__name__}: {e}") from None
        out: dict[str, Any] = orjson.loads(resp.data)
        return out

    def _read(self, ns: str, name: str) -> dict[str, Any]:
        return self._call(self.api.read_namespaced_resource_claim, name, ns)

    # ------------------------------------------------------------------ one claim
    def _write_one(
        self,
        pod: Mapping[str, Any],
        ref: ClaimRef,
        mine: ClaimAllocation | None,
        class_configs: Mapping[str, Any],
    ) -> None:
        ns, _, name = ref.key.partition("/")
        meta = pod.get("metadata") or {}
        consumer = {"resource": "pods", "name": meta.get("name"), "uid": meta.get("uid")}
        for _ in range(8):  # conflicts: read again and redo
            obj = self._read(ns, name)
            if ref.uid and (obj.get("metadata") or {}).get("uid") != ref.uid:
                raise _Refused(f"ResourceClaim {ref.key} was recreated")
            status = obj.setdefault("status", {})
            alloc = status.get("allocation")
            reserved = list(status.get("reservedFor") or [])
            try:
                if alloc is None:
                    if mine is None:
                        raise _Refused(f"ResourceClaim {ref.key} is no longer allocated")
                    if FINALIZER not in (obj["metadata"].get("finalizers") or []):
                        obj["metadata"]["finalizers"] = [
                            *(obj["metadata"].get("finalizers") or []),
                            FINALIZER,
                        ]
                        obj = self._call(self.api.replace_namespaced_resource_claim, name, ns, obj)
                        status = obj.setdefault("status", {})
                    status["allocation"] = self._allocation(obj, mine, class_configs)
                    status["reservedFor"] = [consumer]
                    self._call(self.api.replace_namespaced_resource_claim_status, name, ns, obj)
                    return
                if mine is not None and not _same(alloc, mine):
                    raise _Refused(f"ResourceClaim {ref.key} was allocated by someone else meanwhile")
                if any(r.get("uid") == consumer["uid"] for r in reserved):
                    return
                status["reservedFor"] = [*reserved, consumer]
                self._call(self.api.replace_namespaced_resource_claim_status, name, ns, obj)
                return
            except Exception as e:
                if _status(e) != 409:
                    raise
                continue
        raise _Unknown(f"ResourceClaim {ref.key}: still conflicting after 8 attempts")

    def _allocation(
        self, obj: Mapping[str, Any], mine: ClaimAllocation, class_configs: Mapping[str, Any]
    ) -> dict[str, Any]:
        results = []
        for r in mine.results:
            out: dict[str, Any] = {
                "request": r.request,
                "driver": r.driver,
                "pool": r.pool,
                "device": r.device,
            }
            if r.admin_access:
                out["adminAccess"] = True
            if r.shared:
                out["shareID"] = self._share_id()
            if r.consumed_capacity:
                out["consumedCapacity"] = {
                    k.rpartition("/")[2] if k.startswith(r.driver + "/") else k: format_quantity(v)
                    for k, v in r.consumed_capacity.items()
                }
            if r.binding_conditions:
                out["bindingConditions"] = list(r.binding_conditions)
            if r.binding_failure_conditions:
                out["bindingFailureConditions"] = list(r.binding_failure_conditions)
            results.append(out)
        config: list[dict[str, Any]] = []
        for request in {r.request for r in mine.results}:
            for cfg in class_configs.get(request, ()):
                config.append({"source": "FromClass", "requests": [request], **cfg})
        for cfg in ((obj.get("spec") or {}).get("devices") or {}).get("config") or []:
            config.append({"source": "FromClaim", **cfg})
        alloc: dict[str, Any] = {"devices": {"results": results}}
        if config:
            alloc["devices"]["config"] = config
        if mine.node_name:
            alloc["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [mine.node_name]}]}
                ]
            }
        return alloc

    # ------------------------------------------------------------------ the pod's claims
    def write(
        self,
        pod: Mapping[str, Any],
        refs: tuple[ClaimRef, ...],
        *,
        keep_trying: Callable[[], bool],
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
    ) -> WriteOutcome:
        """Write ``pod``'s claims (its decision is ``books.reservation(pod key)``)."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        res = self.books.reservation(key)
        mine = {a.claim: a for a in res.allocations} if res is not None else {}
        class_configs = self._class_configs(mine)
        delay, attempts = initial_backoff_s, 0
        while True:
            attempts += 1
            try:
                for ref in refs:
                    self._write_one(pod, ref, mine.get(ref.key), class_configs.get(ref.key, {}))
                return WriteOutcome(Written.WRITTEN, attempts=attempts)
            except _Refused as e:
                self.books.unreserve(key)
                return WriteOutcome(Written.REFUSED, str(e), attempts)
            except _Unknown as e:
                if not keep_trying():
                    self.books.hold(key)
                    return WriteOutcome(Written.HELD, str(e), attempts)
                log.warning(
                    "writing the claims of %s: outcome unknown (%s); keeping its devices, retrying", key, e
                )
                self._sleep(delay)
                delay = min(max_backoff_s, delay * 2)

    def _class_configs(self, mine: Mapping[str, ClaimAllocation]) -> dict[str, dict[str, list[Any]]]:
        """Per claim and result request, the ``config`` entries of the classes the request used."""
        out: dict[str, dict[str, list[Any]]] = {}
        for key, alloc in mine.items():
            obj = self.books.claim(key) or {}
            by_request = _request_classes(obj)
            per: dict[str, list[Any]] = {}
            for r in alloc.results:
                cls = self.books.class_object(by_request.get(r.request, ""))
                cfgs = [
                    c for c in ((cls or {}).get("spec") or {}).get("config") or [] if isinstance(c, Mapping)
                ]
                if cfgs:
                    per[r.request] = cfgs
            out[key] = per
        return out

    def release(self, pod: Mapping[str, Any], refs: tuple[ClaimRef, ...]) -> None:
        """Take the pod out of its claims' ``reservedFor`` (its binding did not happen). Best effort:
        a pod that is gone is cleaned up by the resourceclaim controller anyway."""
        uid = (pod.get("metadata") or {}).get("uid")
        for ref in refs:
            ns, _, name = ref.key.partition("/")
            try:
                obj = self._read(ns, name)
                status = obj.get("status") or {}
                reserved = status.get("reservedFor") or []
                if not any(r.get("uid") == uid for r in reserved):
                    continue
                status["reservedFor"] = [r for r in reserved if r.get("uid") != uid]
                self._call(self.api.replace_namespaced_resource_claim_status, name, ns, obj)
            except Exception as e:  # best effort; the resourceclaim controller removes stale entries
                log.warning("taking pod %s out of ResourceClaim %s: %s", uid, ref.key, e)

    def undo(
        self, pod: Mapping[str, Any], refs: tuple[ClaimRef, ...], mine: Mapping[str, ClaimAllocation]
    ) -> None:
        """Take back what ``write`` wrote for ``pod`` (a gang member, when another member's write
        failed: all members or none). A claim holding ``mine`` (this decision's allocation, by claim
        key) with no other consumer is deallocated: ``status.allocation`` and ``reservedFor``
        cleared, then the delete-protection finalizer removed; otherwise the pod leaves
        ``reservedFor``. Claims are visited in reverse order, so a claim the gang shares is left
        by its later members before its first is undone. Best effort, each failure logged: the
        resourceclaim controller deallocates claims whose consumers are gone anyway."""
        uid = (pod.get("metadata") or {}).get("uid")
        for ref in reversed(refs):
            ns, _, name = ref.key.partition("/")
            try:
                self._undo_one(ns, name, uid, mine.get(ref.key))
            except Exception as e:
                log.warning("taking back ResourceClaim %s for pod %s: %s", ref.key, uid, e)

    def _undo_one(self, ns: str, name: str, uid: Any, mine: ClaimAllocation | None) -> None:
        deallocated = False
        for _ in range(8):  # conflicts (the resourceclaim controller writes too): read again and redo
            obj = self._read(ns, name)
            status = obj.setdefault("status", {})
            reserved = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping)]
            others = [r for r in reserved if r.get("uid") != uid]
            alloc = status.get("allocation")
            try:
                if alloc is not None and mine is not None and _same(alloc, mine) and not others:
                    status.pop("allocation", None)
                    status.pop("reservedFor", None)
                    obj = self._call(self.api.replace_namespaced_resource_claim_status, name, ns, obj)
                    deallocated = True
                elif len(others) != len(reserved):
                    status["reservedFor"] = others
                    self._call(self.api.replace_namespaced_resource_claim_status, name, ns, obj)
                    return
                finalizers = list(obj["metadata"].get("finalizers") or [])
                if (
                    deallocated
                    and (obj.get("status") or {}).get("allocation") is None
                    and FINALIZER in finalizers
                ):
                    obj["metadata"]["finalizers"] = [f for f in finalizers if f != FINALIZER]
                    self._call(self.api.replace_namespaced_resource_claim, name, ns, obj)
                return
            except Exception as e:
                if _status(e) != 409:
                    raise
        raise _Unknown(f"ResourceClaim {ns}/{name}: still conflicting after 8 attempts")


def _request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Result request name (``req`` or ``req/sub``) -> its DeviceClass name."""
    out: dict[str, str] = {}
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(r.get("name", ""))
        if r.get("exactly"):
            out[name] = str(r["exactly"].get("deviceClassName", ""))
        for sub in r.get("firstAvailable") or []:
            out[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return out


def _same(alloc: Mapping[str, Any], mine: ClaimAllocation) -> bool:
    """Whether the API's allocation holds the devices this decision chose (our own earlier write)."""
    results = ((alloc.get("devices") or {}).get("results")) or []
    theirs = sorted(
        (str(r.get("request")), str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in results
    )
    ours = sorted((r.request, r.driver, r.pool, r.device) for r in mine.results)
    return theirs == ours
