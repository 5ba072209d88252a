"""Shared pieces of the transcribed upstream allocator cases: the case record and result rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_builders import (
    GI,
    NODE1,
    A,
    B,
    cls,
    dev,
)

from gpusched.core.dra.model import (
    AttrValue,
    Claim,
    Device,
    DeviceClass,
    DeviceId,
    Node,
    ResourceSlice,
)

P1, P2, P3, P4 = "pool-1", "pool-2", "pool-3", "pool-4"
D0, D1, D2, D3 = "device-0", "device-1", "device-2", "device-3"
CA, CB = cls("class-a", A), cls("class-b", B)
INT_ATTR, VER_ATTR, STR_ATTR, BOOL_ATTR = (
    f"{A}/numa",
    f"{A}/driverVersion",
    f"{A}/stringAttribute",
    f"{A}/boolAttribute",
)

Result = tuple[object, ...]


def r(request: str, driver: str, pool: str, device: str, admin: bool = False) -> Result:
    return (request, driver, pool, device, admin)


@dataclass
class Case:
    claims: list[Claim]
    slices: list[ResourceSlice]
    classes: list[DeviceClass] = field(default_factory=lambda: [CA])
    node: Node = NODE1
    allocated: list[DeviceId] = field(default_factory=list)
    expect: list[list[tuple[object, ...]]] | None = None  # per claim; None: does not fit
    error: str | None = None
    local: bool = True  # upstream: localNodeSelector(node) for every claim
    consumed: dict[DeviceId, dict[str, int]] = field(default_factory=dict)  # other claims' shares
    check_consumed: bool = False  # results carry the consumed capacity (see rc)
    check_binding: bool = False  # results carry (binding conditions, binding failure conditions)


def _id(pool: str, device: str, driver: str = A) -> DeviceId:
    return DeviceId(driver, pool, device)


def _two(
    d1: Mapping[str, AttrValue], d2: Mapping[str, AttrValue], *more: Mapping[str, AttrValue]
) -> tuple[Device, ...]:
    return tuple(dev(f"device-{i + 1}", attrs=a) for i, a in enumerate((d1, d2, *more)))


_CS8 = {"counter-set-1": {"memory": 8 * GI}}


def _mem(gi: int, cset: str = "counter-set-1", **more: int) -> dict[str, dict[str, int]]:
    return {cset: {"memory": gi * GI, **more}}
