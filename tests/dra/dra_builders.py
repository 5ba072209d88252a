"""Compact builders for DRA test data: upstream's allocator test helpers, transcribed into Python."""

from __future__ import annotations

from collections.abc import Mapping

from gpusched.core.dra.model import (
    AllocationMode,
    AttrValue,
    Capacity,
    Claim,
    Constraint,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceClass,
    ExactRequest,
    Node,
    NodeScope,
    NodeSelector,
    Request,
    Requirement,
    ResourceSlice,
)

GI = 2**30
NODE1 = Node("node-1", {"region": "region-1", "planet": "earth"})
NODE2 = Node("node-2", {"region": "region-2", "planet": "earth"})
A, B = "driver-a", "driver-b"
ALL_NODES = "nodeSelectionAll"
PER_DEVICE = "nodeSelectionPerDevice"


def cls(name: str, driver: str, multi: bool | None = None) -> DeviceClass:
    expr = f'device.driver == "{driver}"'
    if multi is not None:
        expr += f" && device.allowMultipleAllocations == {str(multi).lower()}"
    return DeviceClass(name, (expr,))


def label_selector(key: str, *values: str) -> NodeSelector:
    return NodeSelector(((Requirement(key, "In", values),),))


def scope(where: object) -> NodeScope:
    if isinstance(where, NodeSelector):
        return NodeScope(selector=where)
    if where == ALL_NODES:
        return NodeScope(all_nodes=True)
    if where == PER_DEVICE:
        return NodeScope(per_device=True)
    assert isinstance(where, str)
    return NodeScope(node_name=where)


def dev(
    name: str,
    capacity: dict[str, int] | None = None,
    attrs: Mapping[str, AttrValue] | None = None,
    counters: dict[str, dict[str, int]] | None = None,
    from_counters: bool = False,
    **kw: object,
) -> Device:
    caps = {n: Capacity(v) for n, v in (capacity or {}).items()}
    uses = tuple(CounterConsumption(s, c) for s, c in (counters or {}).items())
    if from_counters:
        for use in uses:
            caps.update({n: Capacity(v) for n, v in use.counters.items()})
    if "node" in kw:
        kw["scope"] = scope(kw.pop("node"))
    return Device(name, attrs or {}, caps, uses, **kw)  # type: ignore[arg-type]


def slc(
    name: str,
    where: object,
    pool: str,
    driver: str,
    *devices: Device,
    count: int = 1,
    gen: int = 1,
    counter_sets: dict[str, dict[str, int]] | None = None,
) -> ResourceSlice:
    sets = tuple(CounterSet(n, c) for n, c in (counter_sets or {}).items())
    return ResourceSlice(name, driver, pool, scope(where), gen, count, devices, sets)


def one(name: str, where: object, pool: str, driver: str, **kw: object) -> ResourceSlice:
    return slc(name, where, pool, driver, dev("device-1"), **kw)  # type: ignore[arg-type]


def ex(name: str, class_name: str, count: int = 1, *selectors: str, **kw: object) -> ExactRequest:
    return ExactRequest(name, class_name, tuple(selectors), count=count, **kw)  # type: ignore[arg-type]


def all_ex(name: str, class_name: str, *selectors: str, **kw: object) -> ExactRequest:
    return ExactRequest(name, class_name, tuple(selectors), AllocationMode.ALL, 0, **kw)  # type: ignore[arg-type]


def req(name: str, class_name: str, count: int = 1, *selectors: str, **kw: object) -> Request:
    return Request(name, exactly=ex(name, class_name, count, *selectors, **kw))


def all_req(name: str, class_name: str, *selectors: str, **kw: object) -> Request:
    return Request(name, exactly=all_ex(name, class_name, *selectors, **kw))


def first(name: str, *subs: ExactRequest) -> Request:
    return Request(name, first_available=subs)


def claim(name: str, *requests: Request, constraints: tuple[Constraint, ...] = ()) -> Claim:
    return Claim(name, requests, constraints)


def mem_at_least(gi: int, driver: str = A) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{gi}Gi")) >= 0'
