"""NodeResourcesFit: pod count, CPU, memory and extended resources fit (Filter).

Extended resources are whatever else a node advertises in whole units (``rdma/hca``, MIG slices
such as ``nvidia.com/mig-1g.10gb``, ...); a pod asking for one that a node lacks does not fit
there. The reasons are kube-scheduler's: "Too many pods", "Insufficient cpu", "Insufficient <name>".
On a node whose MIG geometry is known (``NodeSpec.mig``) a pod's MIG slices must also find free instances
of their profiles (``ClusterState.mig_fits``); the reason then names the profile the GPU model lacks, or
that no free instance is left.
"""

from __future__ import annotations

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.status import Code


def _code(cap: int, want: int) -> Code:
    """Unresolvable when even an empty node could not hold it: preemption would not help."""
    return Code.UNSCHEDULABLE_AND_UNRESOLVABLE if cap < want else Code.UNSCHEDULABLE


class NodeResourcesFit:
    name = "NodeResourcesFit"

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        sel = slice(None) if nodes is None else nodes
        mask: BoolArr = snap.cpu_free[sel] >= pod.cpu_milli
        if pod.memory_mib:
            mask &= snap.mem_free[sel] >= pod.memory_mib
        if snap.pod_limits:
            mask &= snap.pod_free[sel] >= 1
        for res, amount in pod.extended.items():
            if amount:
                i = snap.ext_index.get(res)
                if i is None:
                    mask[:] = False
                else:
                    mask &= snap.ext_free[sel, i] >= amount
        if pod.mig:  # which instances, on a node whose MIG geometry is known (core.mig.books)
            for k, n in enumerate(range(len(snap)) if nodes is None else nodes):
                if mask[k] and not snap.mig_fits(pod, int(n)):
                    mask[k] = False
        return mask

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        if snap.pod_free[node] < 1:
            return "Too many pods", _code(int(snap.pod_cap[node]), 1)
        if snap.cpu_free[node] < pod.cpu_milli:
            return "Insufficient cpu", _code(int(snap.cpu_cap[node]), pod.cpu_milli)
        if snap.mem_free[node] < pod.memory_mib:
            return "Insufficient memory", _code(int(snap.mem_cap[node]), pod.memory_mib)
        if not snap.mig_fits(pod, node):  # before the counts: it names the profile and the model
            why, never = snap.mig_why_not(pod, node)
            return why, Code.UNSCHEDULABLE_AND_UNRESOLVABLE if never else Code.UNSCHEDULABLE
        for res, amount in sorted(pod.extended.items()):
            i = snap.ext_index.get(res)
            if i is None:
                return f"Insufficient {res}", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            if snap.ext_free[node, i] < amount:
                return f"Insufficient {res}", _code(int(snap.ext_cap[node, i]), amount)
        return "node(s) didn't have the resources", Code.UNSCHEDULABLE  # the filter passed it: not asked
