"""Mixed nodes: GPUs that a DRA driver publishes in a ResourceSlice and gpusched's agent also serves
through its device plugin (``nvidia.com/gpu``), matched by UUID (the slice's ``uuid`` attribute, the
agent's ``gpusched.io/gpu-topology`` annotation).

Another allocator (kube-scheduler with the DRA driver) may give such a GPU to a ResourceClaim. The
GPU books of the device-plugin path must then count it as taken: ``MixedNodes.refresh`` hands the
indices of the GPUs claims hold on each node to ``LiveCluster.set_claimed_gpus`` (they take no new
pod, ``NodeSpec.claimed_gpus``). A GPU held by several claims (shares) is withheld once. Used by the
standalone scheduler and the extender alike (docs/dra.md, "Mixed nodes").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpusched.core.dra.model import AllocatedState, DeviceId, ResourceSlice, qualify
from gpusched.core.plugins.dynamicresources import GPU_DRIVERS
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.state import LiveCluster

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharedGpu:
    """One GPU both a DRA driver (``device``) and the agent's device plugin (``index``) serve."""

    node: str
    index: int
    uuid: str
    device: DeviceId
    claimed: bool


def device_uuid(s: ResourceSlice, attributes: Mapping[str, object]) -> str:
    v = attributes.get(qualify(s.driver, "uuid"), attributes.get("uuid"))
    return v if isinstance(v, str) else ""


@dataclass(frozen=True)
class SliceIndex:
    """What the slices say about GPUs: the devices publishing each UUID, and per node (slice
    ``nodeName``) the (driver, pool) of a slice of a GPU driver or with devices carrying a ``uuid``."""

    by_uuid: Mapping[str, tuple[DeviceId, ...]]
    gpu_nodes: Mapping[str, tuple[str, str]]

    @classmethod
    def of(cls, slices: Iterable[ResourceSlice]) -> SliceIndex:
        by_uuid: dict[str, list[DeviceId]] = {}
        gpu_nodes: dict[str, tuple[str, str]] = {}
        for s in slices:
            gpu_like = s.driver in GPU_DRIVERS
            for d in s.devices:
                u = device_uuid(s, d.attributes)
                if u:
                    by_uuid.setdefault(u, []).append(DeviceId(s.driver, s.pool, d.name))
                    gpu_like = True
            if gpu_like and s.scope.node_name is not None:
                gpu_nodes.setdefault(s.scope.node_name, (s.driver, s.pool))
        return cls({u: tuple(ds) for u, ds in by_uuid.items()}, gpu_nodes)


def held_devices(allocated: AllocatedState) -> frozenset[DeviceId]:
    """Devices a claim holds: exclusively, or a share of (capacity consumed)."""
    shared = {d for d, used in allocated.consumed.items() if any(used.values())}
    return frozenset(allocated.devices) | frozenset(shared)


def shared_gpus(
    index: SliceIndex, held: frozenset[DeviceId], uuids: Mapping[str, Mapping[str, int]]
) -> dict[str, tuple[SharedGpu, ...]]:
    """Per node, the GPUs (by UUID) that a slice publishes and the agent serves there, and whether a
    claim holds each (exclusively or a share of it). UUIDs are unique, so a slice's scope is not read;
    a UUID published twice (an old pool generation) is claimed when either device is held."""
    out: dict[str, tuple[SharedGpu, ...]] = {}
    for node, by_uuid in sorted(uuids.items()):
        gs = []
        for u, i in sorted(by_uuid.items(), key=lambda kv: kv[1]):
            devs = index.by_uuid.get(u)
            if devs:
                gs.append(SharedGpu(node, i, u, devs[0], any(d in held for d in devs)))
        if gs:
            out[node] = tuple(gs)
    return out


@dataclass(frozen=True)
class UnmappedNode:
    """A node that serves ``gpus`` GPUs as ``nvidia.com/gpu`` without gpusched's agent's GPU UUIDs
    (NVIDIA's device plugin, or an agent without its topology annotation) where a GPU DRA driver
    publishes devices too: which GPUs claims hold cannot be told, so gpusched withholds them all."""

    node: str
    gpus: int
    driver: str
    pool: str


def unmapped_nodes(
    index: SliceIndex, uuids: Mapping[str, Mapping[str, int]], gpu_counts: Mapping[str, int]
) -> dict[str, UnmappedNode]:
    """The nodes of ``gpu_counts`` (nodes serving ``nvidia.com/gpu``) without UUIDs in ``uuids``
    for which a slice (``nodeName``) of a GPU driver, or with devices carrying a ``uuid``, exists."""
    out = {}
    for node, (driver, pool) in sorted(index.gpu_nodes.items()):
        if gpu_counts.get(node) and not uuids.get(node):
            out[node] = UnmappedNode(node, gpu_counts[node], driver, pool)
    return out


def claimed_gpus(
    shared: Mapping[str, tuple[SharedGpu, ...]], unmapped: Mapping[str, UnmappedNode] | None = None
) -> dict[str, frozenset[int]]:
    """Per node, the indices of the shared GPUs a claim holds, and every GPU of an unmapped node
    (nodes with none left out)."""
    out = {n: frozenset(g.index for g in gs if g.claimed) for n, gs in shared.items()}
    for n, u in (unmapped or {}).items():
        out[n] = frozenset(range(u.gpus))
    return {n: gs for n, gs in out.items() if gs}


def describe_unmapped(unmapped: Mapping[str, UnmappedNode]) -> list[str]:
    return [
        f"node {u.node}: serves {u.gpus} nvidia.com/gpu without gpusched's agent's GPU UUIDs "
        f"(annotation gpusched.io/gpu-topology) while DRA driver {u.driver} publishes GPUs there "
        f"(ResourceSlice pool {u.pool}): gpusched cannot tell which GPUs ResourceClaims hold, so it "
        "refuses the combination and places no device-plugin GPU pod there (all its GPUs withheld); "
        "run gpusched's agent as the node's device plugin, or serve its GPUs by DRA alone (docs/dra.md, "
        "Mixed nodes)"
        for u in unmapped.values()
    ]


def describe(shared: Mapping[str, tuple[SharedGpu, ...]]) -> list[str]:
    """One line per mixed node: which GPUs both serve, which of them claims hold, what gpusched does."""
    lines = []
    for node, gs in shared.items():
        held = [g.index for g in gs if g.claimed]
        dev = gs[0].device
        lines.append(
            f"node {node}: GPU(s) {', '.join(str(g.index) for g in gs)} are served both by gpusched's "
            f"agent (nvidia.com/gpu) and by DRA driver {dev.driver} (ResourceSlice pool {dev.pool}); "
            + (
                f"GPU(s) {', '.join(map(str, held))} held by ResourceClaims are booked as taken, "
                if held
                else "none is held by a ResourceClaim now; those that will be are booked as taken, "
            )
            + "no device-plugin pod is placed on them (docs/dra.md, Mixed nodes)"
        )
    return lines


@dataclass(frozen=True)
class _Pass:
    """The last ``refresh``: at which slice and node versions, what was held, what it found, and
    which nodes each held-or-not device's UUID belongs to."""

    key: tuple[int, int]
    held: frozenset[DeviceId]
    shared: Mapping[str, tuple[SharedGpu, ...]]
    unmapped: Mapping[str, UnmappedNode]
    nodes_of: Mapping[DeviceId, set[str]]


class MixedNodes:
    """Keeps ``LiveCluster``'s claimed GPUs in step with the DRA books (``refresh`` after every DRA
    object delivered, and before the books are read)."""

    def __init__(self, books: DraBooks, cluster: LiveCluster) -> None:
        self.books = books
        self.cluster = cluster
        self._reported: dict[str, tuple[int, ...]] = {}
        self._index: tuple[int, SliceIndex] | None = None
        self._held: tuple[int, frozenset[DeviceId]] | None = None
        self._lock = threading.Lock()
        self._last: _Pass | None = None
        cluster.claimed_source = self  # a node whose GPU UUIDs change asks at once

    def _state(self) -> tuple[SliceIndex, frozenset[DeviceId]]:
        """The slice index and the held devices, cached by the books' versions."""
        sv, v = self.books.slices_version, self.books.version
        if self._index is None or self._index[0] != sv:
            self._index = (sv, SliceIndex.of(self.books.slices()))
        if self._held is None or self._held[0] != v:
            self._held = (v, held_devices(self.books.allocated()))
        return self._index[1], self._held[1]

    def claimed(
        self, uuids: Mapping[str, Mapping[str, int]], gpu_counts: Mapping[str, int]
    ) -> dict[str, frozenset[int]]:
        index, held = self._state()
        return claimed_gpus(shared_gpus(index, held, uuids), unmapped_nodes(index, uuids, gpu_counts))

    def shared(self) -> dict[str, tuple[SharedGpu, ...]]:
        index, held = self._state()
        return shared_gpus(index, held, self.cluster.gpu_uuids())

    def unmapped(self) -> dict[str, UnmappedNode]:
        index, _ = self._state()
        return unmapped_nodes(index, self.cluster.gpu_uuids(), self.cluster.gpu_counts())

    def refresh(self) -> None:
        """Hand ``LiveCluster`` the GPUs claims hold now. When only claims changed since the last full
        pass (same slices, same nodes), only the nodes of the devices whose hold changed are redone."""
        with self._lock:
            key = (self.books.slices_version, self.cluster.node_version)  # read first: conservative
            index, held = self._state()
            last = self._last
            incremental = last is not None and last.key == key
            if last is not None and incremental:
                shared, unmapped, nodes_of = dict(last.shared), last.unmapped, last.nodes_of
                for n in {n for d in held ^ last.held for n in nodes_of.get(d, ())}:
                    shared[n] = tuple(
                        replace(g, claimed=any(d in held for d in index.by_uuid.get(g.uuid, ())))
                        for g in shared[n]
                    )
            else:
                uuids = self.cluster.gpu_uuids()
                shared = shared_gpus(index, held, uuids)
                unmapped = unmapped_nodes(index, uuids, self.cluster.gpu_counts())
                by_device: dict[DeviceId, set[str]] = {}
                for n, gs in shared.items():
                    for g in gs:
                        for d in index.by_uuid.get(g.uuid, ()):
                            by_device.setdefault(d, set()).add(n)
                nodes_of = by_device
            changed = self.cluster.set_claimed_gpus(claimed_gpus(shared, unmapped))
            ours = key[1] + (1 if changed else 0)  # set_claimed_gpus moves node_version by one
            after = (key[0], ours) if self.cluster.node_version == ours else (-1, -1)  # else: redo all
            self._last = _Pass(after, held, shared, unmapped, nodes_of)
            self._report(shared, unmapped)

    def _report(
        self, shared: Mapping[str, tuple[SharedGpu, ...]], unmapped: Mapping[str, UnmappedNode]
    ) -> None:
        now: dict[str, tuple[int, ...]] = {n: tuple(g.index for g in gs) for n, gs in shared.items()}
        now |= {n: (-1, u.gpus) for n, u in unmapped.items()}
        if now != self._reported:  # once per change: the mixed nodes, at start and when they change
            new = {n for n in now if self._reported.get(n) != now[n]}
            for line in describe({n: shared[n] for n in new if n in shared}):
                log.warning("%s", line)
            for line in describe_unmapped({n: unmapped[n] for n in new if n in unmapped}):
                log.error("%s", line)
            self._reported = now
