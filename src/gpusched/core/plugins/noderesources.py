"""NodeResourcesFit: CPU and memory fit (Filter)."""

from __future__ import annotations

from gpusched.core.cluster import BoolArr, ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code


class NodeResourcesFit:
    name = "NodeResourcesFit"

    def filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> BoolArr:
        mask: BoolArr = snap.cpu_free >= pod.cpu_milli
        if pod.memory_mib:
            mask &= snap.mem_free >= pod.memory_mib
        return mask

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        if snap.cpu_free[node] < pod.cpu_milli:
            code = (
                Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                if snap.cpu_cap[node] < pod.cpu_milli
                else Code.UNSCHEDULABLE
            )
            return "Insufficient cpu", code
        code = (
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE if snap.mem_cap[node] < pod.memory_mib else Code.UNSCHEDULABLE
        )
        return "Insufficient memory", code
