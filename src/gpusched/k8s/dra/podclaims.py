"""A pod's ResourceClaims, resolved as kube-scheduler's DynamicResources PreFilter does.

Each ``spec.resourceClaims`` entry names a claim directly (``resourceClaimName``) or a template
(``resourceClaimTemplateName``), whose claim kube-controller-manager's resourceclaim controller
creates and records in ``pod.status.resourceClaimStatuses``. The pod waits (``Waiting``, with the
reason) while a claim is not recorded or not seen yet, is being deleted, was not made for this pod,
or is being allocated for another pod; a claim or class that cannot be read is ``Invalid`` (the
message names the object and field). Otherwise ``Ready``: the claims still to allocate (converted),
and the node selectors of those already allocated (a shared claim: the pod must go where it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.core.dra.inventory import PodClaims
from gpusched.core.dra.model import Claim, NodeSelector
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.convert import DraObjectError, allocated_node_selector, claim_from_k8s

RESERVED_FOR_MAX = 256  # resource.k8s.io/v1 ResourceClaimReservedForMaxSize


@dataclass(frozen=True)
class ClaimRef:
    """One of the pod's claims: its entry name in the pod, the claim (namespace/name), its UID."""

    entry: str
    key: str
    uid: str
    allocated: bool


@dataclass(frozen=True)
class Ready:
    refs: tuple[ClaimRef, ...]
    claims: PodClaims


@dataclass(frozen=True)
class Waiting:
    reason: str


@dataclass(frozen=True)
class Invalid:
    reason: str


Resolution = Ready | Waiting | Invalid


def has_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def resolve(pod: Mapping[str, Any], books: DraBooks) -> Resolution:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ns, uid = str(meta.get("namespace", "default")), str(meta.get("uid", ""))
    recorded = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    inventory = books.inventory()
    refs: list[ClaimRef] = []
    to_allocate: list[Claim] = []
    allocated_on: list[NodeSelector] = []
    for i, entry in enumerate(spec.get("resourceClaims") or []):
        entry_name = str(entry.get("name", "")) if isinstance(entry, Mapping) else ""
        where = f"spec.resourceClaims[{i}] ({entry_name or '?'})"
        if not isinstance(entry, Mapping):
            return Invalid(f"{where}: expected an object")
        if entry.get("resourceClaimName"):
            name, from_template = str(entry["resourceClaimName"]), False
        elif entry.get("resourceClaimTemplateName"):
            if entry_name not in recorded:
                return Waiting(
                    f"{where}: waiting for the ResourceClaim of template {entry['resourceClaimTemplateName']}"
                    " to be created (pod.status.resourceClaimStatuses has no entry yet)"
                )
            if recorded[entry_name] is None:
                continue  # the controller decided this pod needs no claim for it
            name, from_template = str(recorded[entry_name]), True
        else:
            return Invalid(f"{where}: neither resourceClaimName nor resourceClaimTemplateName is set")
        key = f"{ns}/{name}"
        obj = books.claim(key)
        if obj is None:
            return Waiting(f"{where}: waiting for ResourceClaim {key} (not found yet)")
        cmeta = obj.get("metadata") or {}
        if cmeta.get("deletionTimestamp"):
            return Waiting(f"{where}: ResourceClaim {key} is being deleted")
        if (
            from_template
            and uid
            and not any(
                o.get("uid") == uid for o in cmeta.get("ownerReferences") or [] if isinstance(o, Mapping)
            )
        ):
            return Invalid(f"{where}: ResourceClaim {key} was not created for this pod")
        status = obj.get("status") or {}
        if status.get("allocation") is not None:
            reserved = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping)]
            if not any(r.get("uid") == uid for r in reserved) and len(reserved) >= RESERVED_FOR_MAX:
                return Waiting(
                    f"{where}: ResourceClaim {key} is reserved for {RESERVED_FOR_MAX} consumers already"
                )
            try:
                selector = allocated_node_selector(obj)
            except DraObjectError as e:
                return Invalid(str(e))
            if selector is not None:
                allocated_on.append(selector)
            refs.append(ClaimRef(entry_name, key, str(cmeta.get("uid", "")), True))
            continue
        other = books.reserving(key)
        if other and other != f"{ns}/{meta.get('name', '')}":
            return Waiting(f"{where}: ResourceClaim {key} is being allocated for pod {other}")
        try:
            claim = claim_from_k8s(obj)
        except DraObjectError as e:
            return Invalid(str(e))
        for request in claim.requests:
            for exact in (request.exactly,) if request.exactly else request.first_available:
                if problem := books.problem(f"DeviceClass {exact.class_name}"):
                    return Invalid(f"ResourceClaim {key}, request {request.name}: {problem}")
        to_allocate.append(claim)
        refs.append(ClaimRef(entry_name, key, str(cmeta.get("uid", "")), False))
    return Ready(tuple(refs), PodClaims(tuple(to_allocate), tuple(allocated_on), inventory))
