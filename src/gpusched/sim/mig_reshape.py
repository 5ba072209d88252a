"""Pre-cut MIG geometry that follows demand, in the simulator: ``gpusched-reshape``.

Every GPU starts cut to mig-manager's ``all-balanced`` (3g at 4, 2g at 0, 1g at 2 and 3). A request takes a
free pre-cut instance of exactly its profile, first GPU in name order (as the device plugin serves
``nvidia.com/mig-<profile>``). When none is free, an *idle* GPU (no instance in use; first in name order) is
re-cut by the core's rule (``gpusched.core.mig.reshape.demand_layout``): the request's profile first, then
the profiles seen most often, each at the start the fragmentation measure prefers, until nothing more fits. A
GPU with any instance in use is never touched. Each re-cut counts as one reshape.
"""

from __future__ import annotations

from gpusched.core.mig.geometry import Geometry, Instance
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import demand_layout
from gpusched.sim.mig import MigCluster

__all__ = ["BALANCED_LAYOUT", "RESHAPE", "ReshapingBooks", "balanced", "demand_layout"]

RESHAPE = "gpusched-reshape"
BALANCED_LAYOUT = (("3g", 4), ("2g", 0), ("1g", 2), ("1g", 3))


def balanced(geom: Geometry) -> tuple[Instance, ...]:
    by_key = {k.key: name for name, k in geom.kinds.items()}
    return tuple(Instance(by_key[key], start) for key, start in BALANCED_LAYOUT)


class ReshapingBooks:
    """Pre-cut instances per GPU (name order) and which are busy."""

    def __init__(self, cluster: MigCluster) -> None:
        self.geoms = [g.geometry for g in sorted(cluster.gpus, key=lambda g: g.name)]
        self.cut: list[list[Instance]] = [list(balanced(g)) for g in self.geoms]
        self.busy: list[set[Instance]] = [set() for _ in self.geoms]
        self.reshapes = 0
        self.used_slices = 0

    def take(self, profile: str, demand: DemandMix) -> tuple[int, int] | None:
        hit = self._free(profile)
        if hit is None:
            idle = next(
                (i for i, b in enumerate(self.busy) if not b and profile in self.geoms[i].kinds), None
            )
            if idle is None:
                return None
            self.cut[idle] = list(demand_layout(self.geoms[idle], profile, demand))
            self.reshapes += 1
            hit = self._free(profile)
            if hit is None:  # the profile does not fit an empty GPU of this model
                return None
        gpu, inst = hit
        self.busy[gpu].add(inst)
        self.used_slices += self.geoms[gpu].kind(profile).mem_slices
        return gpu, inst.start

    def _free(self, profile: str) -> tuple[int, Instance] | None:
        for gpu, insts in enumerate(self.cut):
            for inst in insts:
                if inst.profile == profile and inst not in self.busy[gpu]:
                    return gpu, inst
        return None

    def release(self, profile: str, gpu: int, start: int) -> None:
        self.busy[gpu].remove(Instance(profile, start))
        self.used_slices -= self.geoms[gpu].kind(profile).mem_slices

    @property
    def gpus_used(self) -> int:
        return sum(1 for b in self.busy if b)
