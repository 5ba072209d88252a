"""What pods take of queue quotas: ``Usage`` vectors and the charge of one pod.

A pod is charged what it asks for (as Kubernetes ResourceQuota counts requests), whatever the
GPUs it lands on hold: ``gpus`` = ``num_gpu`` when it takes whole GPUs (0 for a share),
``gpu_milli`` = ``num_gpu * gpu_milli``, ``gpu_memory_mib`` = ``num_gpu * gpu_memory_mib``; once
per total (``ANY_MODEL``) and once for the GPU model it lands on, when known. A pod with DRA
claims is also charged, per DeviceClass, what the claims it allocates ask for (``claims_charge``);
a claim already allocated (shared, joined) is charged to the pod it was allocated for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpusched.core.dra.model import AllocationMode, Claim
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


def charge_of(pod: PodSpec, model: str = ANY_MODEL) -> Usage:
    """What ``pod`` is charged: the total, and ``model``'s share when the model is known; and
    what the claims it allocates ask for (``claims_charge``)."""
    if pod.claims is not None and pod.claims.to_allocate:
        return _gpu_charge(pod, model) + claims_charge(pod.claims.to_allocate)
    return _gpu_charge(pod, model)


def _gpu_charge(pod: PodSpec, model: str) -> Usage:
    if pod.num_gpu == 0:
        return Usage()
    amounts = (pod.num_gpu if pod.is_whole else 0, pod.gpu_demand_milli, pod.num_gpu * pod.gpu_memory_mib)
    out: dict[ResourceKey, int] = {}
    for m in {ANY_MODEL, model}:
        for d, v in zip(DIMENSIONS, amounts, strict=True):
            if v:
                out[ResourceKey(m, d)] = v
    return Usage(MappingProxyType(out))
