"""resource.k8s.io/v1 objects as the allocator sees them: typed, immutable, integers only.

Quantities are integers in their base unit (bytes for memory, a count for everything else):
``quantity.parse_quantity`` turns ``"40Gi"`` into ``42949672960`` and refuses what is not a whole
number of base units (``"500m"``, ``"0.5"``), so nothing fractional enters the core.

Attribute and capacity names are qualified ``domain/name``; a name without a domain belongs to the
device's driver (as in the API), see ``qualify``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple


@dataclass(frozen=True)
class Version:
    """A semantic-version attribute value (``versionValue``); compared as text for equality."""

    text: str


AttrValue = int | bool | str | Version


def qualify(driver: str, name: str) -> str:
    """``name`` with the driver's domain when it has none (the API's rule for attribute names)."""
    return name if "/" in name else f"{driver}/{name}"


@dataclass(frozen=True)
class RequestPolicy:
    """``capacity.requestPolicy``: a default, and either valid values or a range with a step."""

    default: int | None = None
    valid_values: tuple[int, ...] = ()
    min: int | None = None
    max: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Capacity:
    value: int
    policy: RequestPolicy | None = None


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"
    NONE = "None"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@dataclass(frozen=True)
class Toleration:
    """``operator`` is ``Equal`` or ``Exists``; an empty key with ``Exists`` tolerates every taint,
    an empty effect every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect.value:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class Requirement:
    """One node-selector requirement on a label (or on ``metadata.name`` when ``field``)."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: tuple[str, ...] = ()
    field: bool = False


@dataclass(frozen=True)
class NodeSelector:
    """OR of terms; each term is an AND of requirements."""

    terms: tuple[tuple[Requirement, ...], ...]


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeScope:
    """Where a slice's (or, with ``perDeviceNodeSelection``, a device's) devices can be reached:
    exactly one of ``node_name``, ``selector``, ``all_nodes``, ``per_device`` is set."""

    node_name: str | None = None
    selector: NodeSelector | None = None
    all_nodes: bool = False
    per_device: bool = False


@dataclass(frozen=True)
class CounterConsumption:
    counter_set: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class Device:
    name: str
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    consumes_counters: tuple[CounterConsumption, ...] = ()
    allow_multiple_allocations: bool = False
    taints: tuple[Taint, ...] = ()
    scope: NodeScope | None = None  # only with the slice's perDeviceNodeSelection
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    scope: NodeScope
    generation: int = 1
    slice_count: int = 1
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()  # CEL expressions


class AllocationMode(StrEnum):
    EXACT_COUNT = "ExactCount"
    ALL = "All"


@dataclass(frozen=True)
class ExactRequest:
    """``exactly`` or one ``firstAvailable`` entry (then ``name`` is the sub-request's)."""

    name: str
    class_name: str
    selectors: tuple[str, ...] = ()
    mode: AllocationMode = AllocationMode.EXACT_COUNT
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity_requests: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """A claim's request: ``exactly`` set, or ``first_available`` (tried in order)."""

    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[ExactRequest, ...] = ()


@dataclass(frozen=True)
class Constraint:
    """``requests`` empty means all of the claim's requests. Attribute names are qualified."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True)
class Claim:
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()


class DeviceId(NamedTuple):
    """A device by driver, pool and name. A NamedTuple, not a dataclass: it is hashed in every
    device lookup of the allocator's search (a dataclass's ``__hash__`` runs in Python)."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class AllocatedState:
    """What other claims already hold: exclusive devices, and the capacity consumed on devices that
    allow multiple allocations. ``in_flight``: claims a decision not yet written has allocated (a
    gang member decided before this one), by claim key: a pod sharing one uses that allocation."""

    devices: frozenset[DeviceId] = frozenset()
    consumed: Mapping[DeviceId, Mapping[str, int]] = field(default_factory=dict)
    in_flight: Mapping[str, ClaimAllocation] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceResult:
    request: str  # "req" or "req/sub"
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    consumed_capacity: Mapping[str, int] = field(default_factory=dict)
    shared: bool = False  # a share of a multi-allocation device: the adapter gives it a shareID
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    @property
    def device_id(self) -> DeviceId:
        return DeviceId(self.driver, self.pool, self.device)


@dataclass(frozen=True)
class ClaimAllocation:
    claim: str
    results: tuple[DeviceResult, ...]
    node_name: str | None  # set when any device is local to the node (then the claim is node-bound)
