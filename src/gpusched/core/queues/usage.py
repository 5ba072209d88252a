"""What pods take of queue quotas: ``Usage`` vectors and the charge of one pod.

A pod is charged what it asks for (as Kubernetes ResourceQuota counts requests), whatever the
GPUs it lands on hold: ``gpus`` = ``num_gpu`` when it takes whole GPUs (0 for a share),
``gpu_milli`` = ``num_gpu * gpu_milli``, ``gpu_memory_mib`` = ``num_gpu * gpu_memory_mib``; once
per total (``ANY_MODEL``) and once for the GPU model it lands on, when known. A pod with DRA
claims is also charged, per DeviceClass, what the claims it allocates ask for (``claims_charge``);
a claim already allocated (shared, joined) is charged to the pod it was allocated for. Once a claim's
devices are chosen (the pod placed, or its claim allocated in the API), it is charged what the
allocation took (``allocated_charge``): an ``All`` request every device it got, not the 1 it is
charged before (how many devices ``All`` takes depends on the node it lands on).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gpusched.core.dra.model import AllocationMode, Claim, ClaimAllocation, ExactRequest
from gpusched.core.model import PodSpec
from gpusched.core.queues.spec import ANY_MODEL, DIMENSIONS, ResourceKey, dra_key

_EMPTY: Mapping[ResourceKey, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Usage:
    """Integer amounts per resource key (absent = 0)."""

    amounts: Mapping[ResourceKey, int] = field(default_factory=lambda: _EMPTY)

    def __getitem__(self, key: ResourceKey) -> int:
        return self.amounts.get(key, 0)

    def __iter__(self) -> Iterator[ResourceKey]:
        return iter(self.amounts)

    def __add__(self, other: Usage) -> Usage:
        out = dict(self.amounts)
        for k, v in other.amounts.items():
            out[k] = out.get(k, 0) + v
        return Usage(MappingProxyType({k: v for k, v in out.items() if v}))

    def __neg__(self) -> Usage:
        return Usage(MappingProxyType({k: -v for k, v in self.amounts.items()}))

    def __sub__(self, other: Usage) -> Usage:
        return self + (-other)

    def get(self, dim: str, model: str = ANY_MODEL) -> int:
        return self[ResourceKey(model, dim)]

    @property
    def zero(self) -> bool:
        return not any(self.amounts.values())

    @staticmethod
    def total(usages: Iterable[Usage]) -> Usage:
        out = Usage()
        for u in usages:
            out = out + u
        return out


def claims_charge(claims: Iterable[Claim]) -> Usage:
    """What DRA claims ask for, per DeviceClass (``dra_key``; totals only, no model): ``count``
    devices of an ``exactly`` request's class (``All``: 1, the least it gets), or, when it asks for
    capacity (``capacity.requests``: a share), ``count`` times each capacity of the class; a
    ``firstAvailable`` request the most any of its alternatives asks of each class (whichever is
    chosen, the charge covers it). Admin access is charged nothing (it holds nothing)."""
    out: dict[ResourceKey, int] = {}
    for claim in claims:
        for req in claim.requests:
            alts = (req.exactly,) if req.exactly is not None else req.first_available
            most: dict[ResourceKey, int] = {}
            for r in alts:
                if r is None or r.admin_access:
                    continue
                n = r.count if r.mode is AllocationMode.EXACT_COUNT else 1
                asks = (
                    {dra_key(r.class_name, c): n * v for c, v in r.capacity_requests.items()}
                    if r.capacity_requests
                    else {dra_key(r.class_name): n}
                )
                for d, v in asks.items():
                    k = ResourceKey(ANY_MODEL, d)
                    most[k] = max(most.get(k, 0), v)
            for k, v in most.items():
                out[k] = out.get(k, 0) + v
    return Usage(MappingProxyType({k: v for k, v in out.items() if v}))


def allocated_charge(claims: Iterable[Claim], allocations: Sequence[ClaimAllocation]) -> Usage:
    """What ``claims`` are charged once allocated: per result (admin access: nothing), one device
    of its request's class (an ``All`` request: every device it got; a ``firstAvailable`` request:
    the class of the alternative chosen), or, for a share (``capacity.requests``), each capacity
    it asks. A claim without an allocation in ``allocations`` (or whose results name a request it
    lacks) is charged what it asks (``claims_charge``)."""
    by_claim = {a.claim: a for a in allocations}
    out: dict[ResourceKey, int] = {}
    asked: list[Claim] = []
    for claim in claims:
        a = by_claim.get(claim.name)
        reqs: dict[str, ExactRequest] = {}
        for req in claim.requests:
            for r in (req.exactly,) if req.exactly is not None else req.first_available:
                if r is not None:
                    reqs[r.name] = r
        if a is None or any(res.request not in reqs for res in a.results):
            asked.append(claim)
            continue
        for res in a.results:
            r = reqs[res.request]
            if res.admin_access or r.admin_access:
                continue
            asks = (
                {dra_key(r.class_name, c): v for c, v in r.capacity_requests.items()}
                if r.capacity_requests
                else {dra_key(r.class_name): 1}
            )
            for d, v in asks.items():
                k = ResourceKey(ANY_MODEL, d)
                out[k] = out.get(k, 0) + v
    return Usage(MappingProxyType({k: v for k, v in out.items() if v})) + claims_charge(asked)


def charge_of(
    pod: PodSpec, model: str = ANY_MODEL, allocations: Sequence[ClaimAllocation] | None = None
) -> Usage:
    """What ``pod`` is charged: the total, and ``model``'s share when the model is known; and
    what the claims it allocates ask for (``claims_charge``), or, with ``allocations`` (the
    decision's, once it is placed), what they took (``allocated_charge``)."""
    if pod.claims is not None and pod.claims.to_allocate:
        claims = pod.claims.to_allocate
        dra = claims_charge(claims) if allocations is None else allocated_charge(claims, allocations)
        return gpu_charge(pod, model) + dra
    return gpu_charge(pod, model)


def gpu_charge(pod: PodSpec, model: str = ANY_MODEL) -> Usage:
    """What ``pod`` is charged for the GPUs it asks (its DRA claims apart)."""
    if pod.num_gpu == 0:
        return Usage()
    amounts = (pod.num_gpu if pod.is_whole else 0, pod.gpu_demand_milli, pod.num_gpu * pod.gpu_memory_mib)
    out: dict[ResourceKey, int] = {}
    for m in {ANY_MODEL, model}:
        for d, v in zip(DIMENSIONS, amounts, strict=True):
            if v:
                out[ResourceKey(m, d)] = v
    return Usage(MappingProxyType(out))
