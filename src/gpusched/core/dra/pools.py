"""The pools a node can use: slices that reach the node, grouped by (driver, pool), newest generation.

A pool is *incomplete* while fewer slices of its generation are seen than it announces
(``resourceSliceCount``); *invalid* when its slices contradict each other (a device or counter set
twice, a device consuming a counter no set offers). Pools are visited in
(driver, pool) name order and slices in name order; devices keep the driver's order.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    every_device: tuple[Candidate, ...]  # also those on other nodes: they consume the same counters
    slices: tuple[ResourceSlice, ...] = ()  # of the generation used

    def notes(self) -> tuple[str, ...]:
        """What makes devices of the pool unusable, naming the field: the pool is incomplete (fewer
        slices than ``spec.pool.resourceSliceCount``), or a device consumes more of a counter than
        its set declares (it can never be allocated). Added to a refusal's reason."""
        notes = _overdrawn(self.slices, self.counter_sets)
        if not self.incomplete:
            return notes
        announced = max(s.slice_count for s in self.slices)
        generation = self.slices[0].generation
        return (
            f"resource pool {self.driver}/{self.name} is incomplete: {len(self.slices)} of {announced}"
            f" slices (spec.pool.resourceSliceCount) of generation {generation} are published, so its"
            " devices are not used until all are",
            *notes,
        )


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


def gather_pools(slices: Sequence[ResourceSlice], node: Node) -> list[Pool]:
    """The pools with a slice that reaches ``node``, at the newest generation among those slices.

    Completeness and validity are judged over all slices of that generation, also those published
    for other nodes (a pool may span nodes); devices are the ones that reach the node."""
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for s in slices:
        by_pool.setdefault((s.driver, s.pool), []).append(s)
    pools = []
    for (driver, name), group in sorted(by_pool.items()):
        mine = [s for s in group if scope_reaches(s.scope, node) is not False]
        if not mine:
            continue
        generation = max(s.generation for s in mine)
        current = sorted((s for s in group if s.generation == generation), key=lambda s: s.name)
        devices: list[Candidate] = []
        for s in current:
            reach = scope_reaches(s.scope, node)
            for d in s.devices:
                if reach is None:  # perDeviceNodeSelection
                    if d.scope is not None and scope_reaches(d.scope, node):
                        devices.append(Candidate(driver, name, d, d.scope.node_name is not None))
                elif reach:
                    devices.append(Candidate(driver, name, d, s.scope.node_name is not None))
        counters = {cs.name: cs for s in current for cs in s.shared_counters}
        incomplete = len(current) < max(s.slice_count for s in current)
        everything = tuple(Candidate(driver, name, d, False) for s in current for d in s.devices)
        pools.append(
            Pool(
                driver,
                name,
                tuple(devices),
                counters,
                incomplete,
                _invalid(current),
                everything,
                tuple(current),
            )
        )
    return pools


def _overdrawn(current: Sequence[ResourceSlice], sets: dict[str, CounterSet]) -> tuple[str, ...]:
    """Devices that consume more of a counter than their set declares (never allocatable)."""
    out = []
    for s in current:
        for i, d in enumerate(s.devices):
            for j, use in enumerate(d.consumes_counters):
                found = sets.get(use.counter_set)
                for counter, value in sorted(use.counters.items()):
                    if found is not None and counter in found.counters and value > found.counters[counter]:
                        out.append(
                            f"ResourceSlice {s.name}: spec.devices[{i}].consumesCounters[{j}].counters"
                            f".{counter}: device {d.name} consumes {value}, more than counter set"
                            f" {use.counter_set} declares ({found.counters[counter]})"
                        )
    return tuple(out)


def _invalid(current: list[ResourceSlice]) -> str | None:
    """Why a pool's slices contradict each other (None when they do not)."""
    names: set[str] = set()
    sets: dict[str, CounterSet] = {}
    for s in current:
        for cs in s.shared_counters:
            if cs.name in sets:
                return f"counter set {cs.name} is published twice"
            sets[cs.name] = cs
    for s in current:
        for i, d in enumerate(s.devices):
            if d.name in names:
                return f"device {d.name} appears twice"
            names.add(d.name)
            for j, use in enumerate(d.consumes_counters):
                field = f"ResourceSlice {s.name}: spec.devices[{i}].consumesCounters[{j}]"
                found = sets.get(use.counter_set)
                if found is None:
                    return (
                        f"{field}.counterSet: device {d.name} consumes from unknown counter set"
                        f" {use.counter_set} (no slice of the pool declares it in spec.sharedCounters)"
                    )
                unknown = sorted(set(use.counters) - set(found.counters))
                if unknown:
                    return (
                        f"{field}.counters: device {d.name} consumes unknown counters {unknown} of"
                        f" {use.counter_set}"
                    )
    return None
