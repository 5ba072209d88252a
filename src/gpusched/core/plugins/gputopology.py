"""GpuTopology (Prefer): a multi-GPU pod prefers nodes where its GPUs can be NVLink-complete and on one
NUMA node (``core.topology``), so that such a set is taken when one exists anywhere among the feasible
nodes, not only on the node the score plugin ranks first. Only a node whose topology has complete sets of
the pod's size but none among the GPUs the pod fits on now rates lower; nodes without a known topology,
and nodes whose topology has no complete set of that size at all (a PCIe box without NVLink; 4 GPUs on
NVLink pairs), rate as well as those where one fits. Silent (None) for one-GPU pods and shares and
in clusters where no node has a topology, so placements there are exactly as without it."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import F64, CycleState
from gpusched.core.model import PodSpec
from gpusched.core.topology import complete_fits, has_complete


class GpuTopologyPreference:
    name = "GpuTopology"

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """0 where the node's topology has complete sets of the pod's size but none among the GPUs the
        pod fits on; 100 elsewhere."""
        if pod.num_gpu < 2 or not snap.topology_groups:
            return None
        out: F64 = np.full(len(nodes), 100.0)
        for topo, members in snap.topology_groups:
            if not has_complete(topo, pod.num_gpu):
                continue
            at = np.flatnonzero(np.isin(nodes, members))
            if len(at):
                fits = snap.gpu_room(pod, nodes[at]) & snap.gpu_exists[nodes[at]]
                out[at] = np.where(complete_fits(topo, pod.num_gpu, fits), 100.0, 0.0)
        return out
