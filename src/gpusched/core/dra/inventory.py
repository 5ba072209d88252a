"""The cluster's DRA inventory for one decision, and one pod's claims against it (typed core data).

``DraInventory`` is what a front end knows of ``resource.k8s.io``: the DeviceClasses, the
ResourceSlices (DeviceTaintRules already merged into their devices' taints) and the ``ClaimLedger``,
the front end's in-memory book of what claims hold (allocated by anyone, and the decisions still
being written). Slices are indexed by the node they reach, so one node's allocation looks only at the
pools that touch it. The ledger is read once per scheduling cycle and written at Reserve (as
kube-scheduler's DynamicResources plugin keeps its in-flight allocations), so pods decided one after
the other, also a gang's members in one cycle, never take the same device.

``PodClaims`` travels with the pod (``PodSpec.claims``): the claims still to allocate, the node
selectors of its claims already allocated (the pod must go where they are), and the inventory it was
prepared against. The DynamicResources plugin runs the allocator per node from it: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpusched.core.dra.allocator import Allocator, DoesNotFit, Fits, Outcome
from gpusched.core.dra.memo import AllocatorMemo
from gpusched.core.dra.model import (
    AllocatedState,
    Claim,
    ClaimAllocation,
    DeviceClass,
    DeviceId,
    Node,
    NodeSelector,
    ResourceSlice,
)
from gpusched.core.dra.pools import Pool, selector_matches
from gpusched.core.dra.score import SCORED, SearchBudget
from gpusched.core.dra.selector import SelectorCompiler


class ClaimLedger(Protocol):
    """The front end's book of allocated devices (no I/O: an in-memory structure)."""

    def allocated(self) -> AllocatedState:
        """Every device held by a claim: allocated in the API, or reserved and not yet seen so."""
        ...

    def allocated_without(self, leaving: Collection[str]) -> AllocatedState:
        """``allocated()`` once the pods ``leaving`` (namespace/name) are gone (preemption's
        what-if): a claim is freed only when every consumer it is reserved for is leaving (a claim
        shared with a pod that stays is still held), and the leavers' own reservations go."""
        ...

    def reserve(self, pod: str, node: str, allocations: tuple[ClaimAllocation, ...]) -> None:
        """Hold the devices ``pod`` (namespace/name) was given on ``node`` until the front end has
        written them or given them back."""
        ...

    def unreserve(self, pod: str) -> None: ...


@dataclass(frozen=True)
class FixedLedger:
    """A ledger that never changes (tests, what-ifs): ``reserve`` and ``unreserve`` do nothing."""

    state: AllocatedState = field(default_factory=AllocatedState)

    def allocated(self) -> AllocatedState:
        return self.state

    def allocated_without(self, leaving: Collection[str]) -> AllocatedState:
        return self.state

    def reserve(self, pod: str, node: str, allocations: tuple[ClaimAllocation, ...]) -> None:
        return None

    def unreserve(self, pod: str) -> None:
        return None


@dataclass(frozen=True, eq=False)
class DraInventory:
    classes: Mapping[str, DeviceClass]
    slices: tuple[ResourceSlice, ...]
    ledger: ClaimLedger
    compiler: SelectorCompiler
    budget: SearchBudget = SCORED
    """How many solutions the allocator scores per node (``FIRST_FIT``: kube-scheduler's choice)."""
    memo: AllocatorMemo = field(default_factory=AllocatorMemo, repr=False)
    """Pools per node and selector results per device, kept while this inventory lives (its slices
    and classes do not change: a front end builds a new inventory when one does)."""
    _by_node: dict[str, tuple[ResourceSlice, ...]] = field(init=False, repr=False)
    _everywhere: tuple[ResourceSlice, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pools: dict[tuple[str, str], list[ResourceSlice]] = {}
        for s in self.slices:
            pools.setdefault((s.driver, s.pool), []).append(s)
        everywhere: list[ResourceSlice] = []
        by_node: dict[str, list[ResourceSlice]] = {}
        for group in pools.values():
            if any(s.scope.node_name is None for s in group):
                everywhere.extend(group)  # a selector, allNodes or per-device pool: judged per node
                continue
            for node in {s.scope.node_name for s in group if s.scope.node_name is not None}:
                by_node.setdefault(node, []).extend(group)  # the whole pool: completeness spans nodes
        object.__setattr__(self, "_by_node", {n: tuple(g) for n, g in by_node.items()})
        object.__setattr__(self, "_everywhere", tuple(everywhere))

    def slices_for(self, node: str) -> tuple[ResourceSlice, ...]:
        """The slices of every pool that may reach ``node`` (the allocator picks what does)."""
        return self._by_node.get(node, ()) + self._everywhere

    def pools(self, node: Node) -> list[Pool]:
        """The pools that reach ``node`` (``gather_pools``), gathered once per node."""
        return self.memo.pools(self.slices_for(node.name), node)

    def allocator(self, node: str, allocated: AllocatedState) -> Allocator:
        return Allocator(
            self.classes, self.slices_for(node), self.compiler, allocated, self.budget, self.memo
        )


@dataclass(frozen=True, eq=False)
class PodClaims:
    """One pod's ResourceClaims as the DynamicResources plugin needs them."""

    to_allocate: tuple[Claim, ...]
    """Claims not allocated yet, in the pod's order: allocated together on the chosen node."""
    allocated_on: tuple[NodeSelector, ...]
    """The node selectors of its claims already allocated (shared claims): the node must match each."""
    inventory: DraInventory
    avoid_nodes: frozenset[str] = frozenset()
    """Nodes this decision keeps the pod off (a gang's joint search, ``core.gangclaims``)."""
    avoid_devices: frozenset[DeviceId] = frozenset()
    """Devices this decision does not offer the pod's claims (a gang's joint search): left out of
    the slices as if not published, so they are neither taken nor charged to counters."""

    def reaches(self, node: Node) -> bool:
        return all(selector_matches(s, node) for s in self.allocated_on)

    def allocate(self, node: Node, allocated: AllocatedState) -> Outcome:
        """The claims to allocate on ``node`` where ``allocated`` is held already: the best of the
        solutions the inventory's budget enumerates (it fits where kube-scheduler's first solution
        does). A claim another pod's decision in flight allocated (``in_flight``: a gang's shared
        claim) is not allocated again, and the pod must go where it is; raises ``DraError``."""
        if node.name in self.avoid_nodes:
            return DoesNotFit(f"the gang's joint search keeps this member off node {node.name}")
        claims = self.to_allocate
        if allocated.in_flight:  # a claim shared with a pod decided before: allocated once, there
            for c in claims:
                a = allocated.in_flight.get(c.name)
                if a is not None and a.node_name is not None and a.node_name != node.name:
                    return DoesNotFit(
                        f"claim {c.name} is being allocated on node {a.node_name} for another pod"
                    )
            claims = tuple(c for c in claims if c.name not in allocated.in_flight)
            if not claims:
                return Fits(())
        inv = self.inventory
        if not self.avoid_devices:
            return inv.allocator(node.name, allocated).allocate(node, claims)
        slices = tuple(_without(s, self.avoid_devices) for s in inv.slices_for(node.name))
        return Allocator(inv.classes, slices, inv.compiler, allocated, inv.budget, inv.memo).allocate(
            node, claims
        )

    def check(self) -> None:
        """Raise ``DraError`` for what no node can change: an unknown or missing class, a selector
        that does not compile, a claim over the device limit (the allocator on a node with no pools)."""
        Allocator(self.inventory.classes, (), self.inventory.compiler, memo=self.inventory.memo).allocate(
            Node(name=""), self.to_allocate
        )


def _without(s: ResourceSlice, devices: frozenset[DeviceId]) -> ResourceSlice:
    kept = tuple(d for d in s.devices if DeviceId(s.driver, s.pool, d.name) not in devices)
    return s if len(kept) == len(s.devices) else replace(s, devices=kept)


def claim_names(claims: Sequence[Claim]) -> str:
    return ", ".join(c.name for c in claims)
