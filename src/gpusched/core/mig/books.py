"""MIG in the scheduler's books: a node's MIG GPUs as its agent publishes them, the slices a pod takes, and
where a request goes on one node.

A node's MIG GPUs (``NodeMig``) are the GPUs in MIG mode with the instances present on them (mixed strategy:
each instance is one ``nvidia.com/mig-<profile>`` device). The books hold, per GPU, the instances booked by
pods (a ``MigGpu`` with those instances only). A request for a profile takes one *present* instance of that
profile that no pod holds; which one is chosen by the MIG fragmentation measure (``measure``) over the booked
instances: the least growth of F, ties by best fit (fewest free memory slices on the GPU afterwards), then
GPU index, then start. The demand mix that weighs F is the MIG requests booked now plus the request itself,
so a restarted scheduler, which rebuilds its books from the API, weighs the same way.

Pure: integers and small tuples, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.mig.geometry import Instance, MigGpu, MigPlacementError, free_slices
from gpusched.core.mig.measure import DemandMix, fragmentation


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One booked MIG slice: the GPU (its index on the node, NVML order), its start slice and its profile."""

    gpu: int
    start: int
    profile: str


@dataclass(frozen=True)
class NodeMig:
    """A node's MIG-capable GPUs: ``gpus[k]`` is the GPU of index ``indices[k]`` (NVML order on the node),
    with its geometry, MIG mode and the instances present (mixed strategy)."""

    gpus: tuple[MigGpu, ...]
    indices: tuple[int, ...]
    reshaping: frozenset[int] = frozenset()
    """GPU indices being re-cut (``core.mig.reshape``): nothing is placed on them until the new geometry
    is published."""

    def __post_init__(self) -> None:
        if len(self.gpus) != len(self.indices):
            raise MigPlacementError(f"{len(self.gpus)} MIG GPUs but {len(self.indices)} indices")
        if len(set(self.indices)) != len(self.indices):
            raise MigPlacementError(f"a MIG GPU index is listed twice: {list(self.indices)}")
        if any(i < 0 for i in self.indices):
            raise MigPlacementError(f"a MIG GPU index is negative: {list(self.indices)}")

    def gpu(self, index: int) -> MigGpu | None:
        for i, g in zip(self.indices, self.gpus, strict=True):
            if i == index:
                return g
        return None

    def empty_books(self) -> dict[int, MigGpu]:
        """Per GPU index, the GPU with no instance booked."""
        return {
            i: MigGpu(g.name, g.geometry, g.mig_enabled, ())
            for i, g in zip(self.indices, self.gpus, strict=True)
        }

    def profiles(self) -> frozenset[str]:
        """The profile names any of the node's GPU models has."""
        return frozenset(p for g in self.gpus for p in g.geometry.kinds)


def open_gpus(node: NodeMig) -> frozenset[int]:
    """The indices of the GPUs that take pods (in MIG mode, not being re-cut)."""
    return frozenset(
        i for i, g in zip(node.indices, node.gpus, strict=True) if g.mig_enabled and i not in node.reshaping
    )


def free_counts(node: NodeMig) -> Counter[str]:
    """Instances present per profile on the GPUs that take pods (``open_gpus``)."""
    open_ = open_gpus(node)
    return Counter(
        inst.profile
        for i, g in zip(node.indices, node.gpus, strict=True)
        if i in open_
        for inst in g.instances
    )


def demand_of(booked: Counter[str], request: Sequence[str]) -> DemandMix:
    mix = DemandMix()
    for p, n in booked.items():
        if n > 0:
            mix.add(p, n)
    for p in request:
        mix.add(p)
    return mix


def _free_instances(node: NodeMig, books: Mapping[int, MigGpu], profile: str) -> list[tuple[int, int]]:
    """(GPU index, start) of the present instances of ``profile`` that no pod holds, on GPUs in MIG mode."""
    out = []
    for i, g in zip(node.indices, node.gpus, strict=True):
        if not g.mig_enabled or i in node.reshaping:
            continue
        held = books[i].instances
        out += [(i, inst.start) for inst in g.instances if inst.profile == profile and inst not in held]
    return out


def place(
    node: NodeMig, books: Mapping[int, MigGpu], request: Sequence[str], booked: Counter[str]
) -> tuple[MigSlot, ...] | None:
    """The slices ``request`` (one profile name per slice) takes on ``node`` given ``books``, or None when
    they do not all fit. Larger profiles are placed first; each by the least growth of the measure."""
    work = dict(books)
    demand = demand_of(booked, request)
    out: list[MigSlot] = []
    order = sorted(request, key=lambda p: (-_size(node, p), p))
    for p in order:
        best: tuple[int, int, int, int] | None = None
        for i, s in _free_instances(node, work, p):
            g = work[i]
            after = g.place(p, s)
            geom = g.geometry
            grow = fragmentation(geom, after.code, demand) - fragmentation(geom, g.code, demand)
            key = (grow, free_slices(geom, after.code), i, s)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        i, s = best[2], best[3]
        work[i] = work[i].place(p, s)
        out.append(MigSlot(i, s, p))
    return tuple(out)


def _size(node: NodeMig, profile: str) -> int:
    for g in node.gpus:
        k = g.geometry.kinds.get(profile)
        if k is not None:
            return k.mem_slices
    return 0


def why_not(node: NodeMig, books: Mapping[int, MigGpu], request: Sequence[str]) -> tuple[str, bool]:
    """Why ``request`` does not fit on ``node`` now, and whether it never could (no GPU model of the node
    has the profile, or too few instances of it are present even with nothing booked)."""
    have = node.profiles()
    models = ", ".join(sorted({g.geometry.model for g in node.gpus})) or "none"
    for p in sorted(set(request)):
        if p not in have:
            return f"GPU model ({models}) has no MIG profile {p}", True
    present = Counter(i.profile for g in node.gpus if g.mig_enabled for i in g.instances)
    want = Counter(request)
    for p in sorted(want):
        if present[p] < want[p]:
            return f"too few MIG {p} instances present ({present[p]} < {want[p]})", True
    what = f"no free MIG instance for {'+'.join(sorted(request))}"
    if node.reshaping:
        return f"{what} (GPU {min(node.reshaping)} is being re-cut)", False
    return what, False


def book(books: dict[int, MigGpu], slot: MigSlot) -> None:
    """Book ``slot`` (raises MigPlacementError on an overlap or an unknown GPU)."""
    g = books.get(slot.gpu)
    if g is None:
        raise MigPlacementError(f"no MIG GPU {slot.gpu} on this node")
    books[slot.gpu] = g.place(slot.profile, slot.start)


def unbook(books: dict[int, MigGpu], slot: MigSlot) -> None:
    books[slot.gpu] = books[slot.gpu].remove(slot.profile, slot.start)


def check_present(node: NodeMig, books: Mapping[int, MigGpu], slots: Sequence[MigSlot]) -> str | None:
    """Why ``slots`` cannot be booked as a decision (an instance not present, held or named twice), or
    None."""
    seen: set[MigSlot] = set()
    for sl in slots:
        g = node.gpu(sl.gpu)
        if g is None:
            return f"no MIG GPU {sl.gpu}"
        if Instance(sl.profile, sl.start) not in g.instances:
            return f"GPU {sl.gpu} has no MIG {sl.profile} instance at slice {sl.start}"
        if sl in seen or Instance(sl.profile, sl.start) in books[sl.gpu].instances:
            return f"MIG {sl.profile} at slice {sl.start} of GPU {sl.gpu} is already held"
        seen.add(sl)
    return None
