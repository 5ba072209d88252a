"""Geometry that follows demand (issue 31 item 3, first part): the layout a GPU should be re-cut to for the
MIG requests that find no free instance, keeping every instance a pod holds.

MIG allows creating and destroying instances while others on the GPU keep running (../shared/reference/
mig.md §3, "dynamic"), so only the *free* slices of a GPU are re-cut: the instances pods hold stay where
they are, the free instances not in the target are destroyed and the missing ones created. The target keeps
the held instances, then places the pending requests (larger profiles first), each at the start where the
MIG fragmentation measure grows least, keeps the other instances present that still fit (only what the new
ones overlap is destroyed), then fills what is left with the most requested profiles (the demand mix), so
that the next requests find an instance too. A node's plan takes the GPU where the most pending
slices become placeable, then the fewest instances destroyed, then the lowest index.

Pure: this decides; applying it (NVML through the agent, way (a); or mig-manager, way (b)) is elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.mig.books import NodeMig
from gpusched.core.mig.geometry import Geometry, Instance, MigGpu
from gpusched.core.mig.measure import DemandMix, fragmentation


@dataclass(frozen=True)
class ReshapePlan:
    """Re-cut GPU ``gpu`` (its index on the node): destroy ``destroy`` (free instances), create ``create``;
    ``serves`` the pending requests the new instances are for."""

    gpu: int
    destroy: tuple[Instance, ...]
    create: tuple[Instance, ...]
    serves: tuple[str, ...]


def _best_start(gpu: MigGpu, profile: str, demand: DemandMix) -> int | None:
    starts = gpu.free_starts(profile)
    if not starts:
        return None
    geom, before = gpu.geometry, fragmentation(gpu.geometry, gpu.code, demand)
    return min(starts, key=lambda s: (fragmentation(geom, gpu.place(profile, s).code, demand) - before, s))


def target_layout(
    geom: Geometry,
    keep: Sequence[Instance],
    pending: Sequence[str],
    demand: DemandMix,
    present: Sequence[Instance] = (),
) -> tuple[tuple[Instance, ...], tuple[str, ...]]:
    """The layout of a GPU that keeps ``keep``, serves as many of ``pending`` as fit, keeps the other
    ``present`` instances that still fit (a re-cut destroys only what it must), then fills with the demand;
    and the pending requests it serves."""
    gpu = MigGpu("plan", geom)
    for i in keep:
        gpu = gpu.place(i.profile, i.start)
    served = []
    for p in sorted((p for p in pending if p in geom.kinds), key=lambda p: (-geom.kinds[p].mem_slices, p)):
        s = _best_start(gpu, p, demand)
        if s is not None:
            gpu = gpu.place(p, s)
            served.append(p)
    for i in present:
        if i not in gpu.instances and i.start in gpu.free_starts(i.profile):
            gpu = gpu.place(i.profile, i.start)
    for p in sorted(geom.kinds, key=lambda p: (-demand.count(p), p)):
        if demand.count(p) == 0:
            break
        while (s := _best_start(gpu, p, demand)) is not None:
            gpu = gpu.place(p, s)
    return gpu.instances, tuple(served)


def plan_gpu(
    index: int, present: MigGpu, held: MigGpu, pending: Sequence[str], demand: DemandMix
) -> ReshapePlan | None:
    """The re-cut of GPU ``index`` (``present``: its instances; ``held``: those pods hold), or None when it
    serves no pending request or changes nothing."""
    if not present.mig_enabled:
        return None
    target, served = target_layout(present.geometry, held.instances, pending, demand, present.instances)
    destroy = tuple(i for i in present.instances if i not in target and i not in held.instances)
    create = tuple(i for i in target if i not in present.instances)
    if not served or not create:
        return None
    return ReshapePlan(index, destroy, create, served)


def plan_node(
    node: NodeMig, books: Mapping[int, MigGpu], pending: Sequence[str], demand: DemandMix
) -> ReshapePlan | None:
    """The GPU of ``node`` to re-cut for ``pending`` (requests that find no free instance), or None."""
    best: tuple[tuple[int, int, int], ReshapePlan] | None = None
    if node.reshaping:
        return None  # one re-cut at a time per node
    for i, g in zip(node.indices, node.gpus, strict=True):
        plan = plan_gpu(i, g, books[i], pending, demand)
        if plan is None:
            continue
        key = (-len(plan.serves), len(plan.destroy), i)
        if best is None or key < best[0]:
            best = (key, plan)
    return best[1] if best else None
