"""NodeResourcesFit: CPU and memory fit (Filter)."""

from __future__ import annotations

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code


class NodeResourcesFit:
    name = "NodeResourcesFit"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        sel = slice(None) if nodes is None else nodes
        cpu, mem = snap.cpu_free[sel], snap.mem_free[sel]
        mask: BoolArr = cpu >= pod.cpu_milli
        if pod.memory_mib:
            mask &= mem >= pod.memory_mib
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
