"""The pools a node can use: slices that reach the node, grouped by (driver, pool), newest generation.

A pool is *incomplete* while fewer slices of its newest generation are seen than it announces
(``resourceSliceCount``); *invalid* when a device name repeats in it. Pools are visited in
(driver, pool) name order and slices in name order; devices keep the driver's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.dra.model import (
    CounterSet,
    Device,
    Node,
    NodeScope,
    NodeSelector,
    Requirement,
    ResourceSlice,
)


@dataclass(frozen=True)
class Candidate:
    """One device of a pool, with the slice scope that made it reachable."""

    driver: str
    pool: str
    device: Device
    node_local: bool


@dataclass(frozen=True)
class Pool:
    driver: str
    name: str
    devices: tuple[Candidate, ...]
    counter_sets: dict[str, CounterSet]
    incomplete: bool
    invalid: str | None


def _requirement_matches(req: Requirement, node: Node) -> bool:
    if req.field:
        value: str | None = node.name if req.key == "metadata.name" else None
    else:
        value = node.labels.get(req.key)
    if req.operator == "In":
        return value is not None and value in req.values
    if req.operator == "NotIn":
        return value is None or value not in req.values
    if req.operator == "Exists":
        return value is not None
    if req.operator == "DoesNotExist":
        return value is None
    return False


def selector_matches(selector: NodeSelector, node: Node) -> bool:
    return any(all(_requirement_matches(r, node) for r in term) for term in selector.terms)


def scope_reaches(scope: NodeScope, node: Node) -> bool | None:
    """True/False whether the scope reaches the node; None for per-device selection."""
    if scope.per_device:
        return None
    if scope.all_nodes:
        return True
    if scope.node_name is not None:
        return scope.node_name == node.name
    if scope.selector is not None:
        return selector_matches(scope.selector, node)
    return False


def gather_pools(slices: tuple[ResourceSlice, ...] | list[ResourceSlice], node: Node) -> list[Pool]:
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for s in slices:
        if s.generation == newest[(s.driver, s.pool)]:
            by_pool.setdefault((s.driver, s.pool), []).append(s)
    pools = []
    for (driver, name), group in sorted(by_pool.items()):
        group.sort(key=lambda s: s.name)
        counters = {cs.name: cs for s in group for cs in s.shared_counters}
        seen: set[str] = set()
        invalid = None
        devices: list[Candidate] = []
        for s in group:
            for d in s.devices:
                if d.name in seen:
                    invalid = f"device {d.name} appears twice"
                seen.add(d.name)
            reach = scope_reaches(s.scope, node)
            for d in s.devices:
                local = s.scope.node_name is not None
                if reach is None:
                    if d.scope is None or not scope_reaches(d.scope, node):
                        continue
                    local = d.scope.node_name is not None
                elif not reach:
                    continue
                devices.append(Candidate(driver, name, d, local))
        if not devices and not any(scope_reaches(s.scope, node) for s in group):
            continue
        incomplete = len(group) < max(s.slice_count for s in group)
        pools.append(Pool(driver, name, tuple(devices), counters, incomplete, invalid))
    return pools
