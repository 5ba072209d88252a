"""kube-scheduler's resource scoring, as the stock scheduler does it (for ``sim.stacks``).

- ``NodeResourcesFitScore``: the NodeResourcesFit score with its default resources (CPU and
  memory, weight 1 each; an extended resource such as ``nvidia.com/gpu`` is not scored by
  default). ``least`` (LeastAllocated, the default strategy): per resource
  ``(allocatable − requested) · 100 // allocatable``; ``most`` (MostAllocated):
  ``requested · 100 // allocatable``; a resource past its allocatable scores 0. ``requested``
  is the node's requests plus the pod's, the pod's *non-zero* request (kube-scheduler counts a
  request of 0 as 100 milli-CPU and 200 MB). The node score is the weighted mean, in integers.
- ``BalancedAllocationScore``: NodeResourcesBalancedAllocation over CPU and memory: the
  balance ``int((1 − std) · 100)`` of the fractions requested/allocatable (capped at 1; for two
  resources the std is ``|f_cpu − f_mem| / 2``), with the pod's actual request and without it:
  ``50 + (50 + with − without) / 2`` (kube-scheduler 1.37, the control plane the tests run).

Both are integers in 0..100; kube-scheduler's default profile weighs each by 1 and adds them.
Neither chooses devices: NVIDIA's device plugin takes the first free GPUs (``core.devices``'s
tightest fit is the same for whole GPUs)."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import F64, CycleState, NodeScores
from gpusched.core.model import PodSpec

STRATEGIES = ("least", "most")
DEFAULT_CPU_MILLI = 100
"""kube-scheduler's non-zero default CPU request (``schedutil.DefaultMilliCPURequest``)."""
DEFAULT_MEMORY_MIB = 200 * 1000 * 1000 // (1024 * 1024)
"""kube-scheduler's non-zero default memory request, 200 MB, in whole MiB (190)."""


def _per_resource(requested: I64, allocatable: I64, most: bool) -> I64:
    cap = np.maximum(allocatable, 1)
    s = requested * 100 // cap if most else (allocatable - requested) * 100 // cap
    out: I64 = np.where((requested > allocatable) | (allocatable == 0), 0, s)
    return out


class NodeResourcesFitScore:
    """LeastAllocated (``least``) or MostAllocated (``most``) over CPU and memory."""

    def __init__(self, strategy: str = "least") -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"NodeResourcesFit strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.name = f"NodeResourcesFit{'Most' if strategy == 'most' else 'Least'}Allocated"

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        cpu = pod.cpu_milli or DEFAULT_CPU_MILLI
        mem = pod.memory_mib or DEFAULT_MEMORY_MIB
        most = self.strategy == "most"
        cpu_cap, mem_cap = snap.cpu_cap[nodes], snap.mem_cap[nodes]
        s_cpu = _per_resource(cpu_cap - snap.cpu_free[nodes] + cpu, cpu_cap, most)
        s_mem = _per_resource(mem_cap - snap.mem_free[nodes] + mem, mem_cap, most)
        return NodeScores(((s_cpu + s_mem) // 2).astype(np.int64))


def _balance(cpu_used: I64, cpu_cap: I64, mem_used: I64, mem_cap: I64) -> I64:
    f_cpu = np.minimum(cpu_used / np.maximum(cpu_cap, 1), 1.0)
    f_mem = np.minimum(mem_used / np.maximum(mem_cap, 1), 1.0)
    out: I64 = np.trunc((1 - np.abs(f_cpu - f_mem) / 2) * 100).astype(np.int64)
    return out


class BalancedAllocationScore:
    """NodeResourcesBalancedAllocation over CPU and memory, as kube-scheduler 1.37 scores it: the
    balance with the pod and without it, ``50 + (50 + with − without) // 2`` (a pod that improves
    the node's balance scores towards 100, one that spoils it towards 50)."""

    name = "NodeResourcesBalancedAllocation"

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores:
        cpu_cap, mem_cap = snap.cpu_cap[nodes], snap.mem_cap[nodes]
        cpu_used, mem_used = cpu_cap - snap.cpu_free[nodes], mem_cap - snap.mem_free[nodes]
        with_pod = _balance(cpu_used + pod.cpu_milli, cpu_cap, mem_used + pod.memory_mib, mem_cap)
        without = _balance(cpu_used, cpu_cap, mem_used, mem_cap)
        return NodeScores(50 + (50 + with_pod - without) // 2)


MIN_FEASIBLE_NODES = 100
"""kube-scheduler's ``minFeasibleNodesToFind``."""


def nodes_to_find(all_nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering, with
    ``percentageOfNodesToScore`` unset (adaptive: 50 % less 1 % per 125 nodes, at least 5 %, at
    least 100 nodes; every node below 100)."""
    if all_nodes < MIN_FEASIBLE_NODES:
        return all_nodes
    pct = max(5, 50 - all_nodes // 125)
    return max(MIN_FEASIBLE_NODES, all_nodes * pct // 100)


class NodesToScore:
    """kube-scheduler scores only the first ``nodes_to_find`` feasible nodes it meets, walking
    the nodes from where the last cycle stopped (``nextStartNodeIndex``, round robin). As a Prefer
    plugin (weighted far above any other) it rates those 100 and the rest 0, so only they are
    scored; it keeps the start index, so one instance serves one scheduler's run. (kube-scheduler
    filters in parallel chunks, so where it stops is approximate; here it is exact.)"""

    name = "NodesToScore"

    def __init__(self) -> None:
        self.start = 0

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        n = len(snap)
        want = nodes_to_find(n)
        if len(nodes) <= want:
            return None  # every node was processed: the start index comes round to itself
        rot = (nodes - self.start) % n
        order = np.argsort(rot, kind="stable")
        self.start = (self.start + int(rot[order[want - 1]]) + 1) % n
        out: F64 = np.zeros(len(nodes))
        out[order[:want]] = 100.0
        return out
