"""Reading an allocated ResourceClaim: the devices of this driver's pool that the scheduler gave it.

The kubelet names a claim by namespace, name and UID (``NodePrepareResources``); the driver reads the claim
from the API and takes ``status.allocation.devices.results`` for its own driver and pool (results of other
drivers are theirs to prepare). Every way this can go wrong is a :class:`ClaimError` naming the claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpusched.core.errors import GpuschedError


class ClaimError(GpuschedError, RuntimeError):
    """A claim that cannot be prepared: gone, another object under its name, not allocated, a device this node
    does not publish."""


class ClaimNotFound(ClaimError):
    pass


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class AllocationResult:
    """One ``status.allocation.devices.results[]`` entry."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""
    consumed: Mapping[str, str] = field(default_factory=dict)
    """``consumedCapacity`` (capacity name -> quantity) of a shared device."""


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim (``resource.k8s.io/v1``) as JSON; ``ClaimNotFound`` when there is none."""
        ...


def allocation_results(claim: Mapping[str, Any], ref: ClaimRef) -> list[AllocationResult]:
    """Every allocation result of ``claim`` (which must be the object ``ref`` names)."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        have = meta.get("uid")
        raise ClaimError(f"{ref}: the claim of that name has uid {have!r} now (deleted and created again?)")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{ref} is not allocated (status.allocation is empty)")
    out = []
    for i, r in enumerate(((allocation.get("devices") or {}).get("results")) or []):
        missing = [k for k in ("request", "driver", "pool", "device") if not r.get(k)]
        if missing:
            raise ClaimError(f"{ref}: status.allocation.devices.results[{i}] has no {', '.join(missing)}")
        share = str(r.get("shareID") or "")
        consumed = {str(k): str(v) for k, v in (r.get("consumedCapacity") or {}).items()}
        out.append(
            AllocationResult(
                str(r["request"]), str(r["driver"]), str(r["pool"]), str(r["device"]), share, consumed
            )
        )
    return out


def results_for(claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str) -> list[AllocationResult]:
    """The results of ``driver``; one in another pool of this driver is an error (another node's devices)."""
    mine = [r for r in allocation_results(claim, ref) if r.driver == driver]
    for r in mine:
        if r.pool != pool:
            raise ClaimError(
                f"{ref}: device {r.device} of driver {driver} was allocated from pool {r.pool!r}, not this "
                f"node's pool {pool!r}"
            )
    return mine
