"""What the books say about the GPUs, per GPU model and node pool: pure functions of a
``ClusterState`` (no Prometheus here, no I/O), read by ``scheduling.ClusterCollector``.

Stranded capacity is FGD's fragmentation measure (``core.fragmentation.node_fragmentation``):
per node, the expected free GPU milli that a pod drawn from the target workload could not use
there (all of it when the pod does not fit the node at all, else the slivers of GPUs with less
free than the pod's per-GPU request). Summed over a group of nodes and divided by 1000 it is in
GPUs; divided by the group's free milli it is the fragmentation ratio. Without a target workload
(no pod seen yet) nothing is stranded by definition: ``stranded`` is 0.

A node's pool is the first of ``POOL_LABELS`` it carries, else ``DEFAULT_POOL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload, node_fragmentation
from gpusched.core.model import GPU_MILLI

POOL_LABELS = (
    "gpusched.io/pool",
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
)
DEFAULT_POOL = "default"

GPU_STATES = ("idle", "shared", "full", "unhealthy")
"""A GPU is ``unhealthy`` (the agent marked it), else ``idle`` (nothing on it), ``full`` (no
milli left) or ``shared`` (partly allocated)."""


def node_pool(labels: Mapping[str, str]) -> str:
    for key in POOL_LABELS:
        if labels.get(key):
            return labels[key]
    return DEFAULT_POOL


@dataclass
class GroupStats:
    """One (GPU model, node pool): GPUs in units of one GPU, memory in bytes."""

    nodes: int = 0
    gpus: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GPU_STATES, 0))
    gpus_allocated: float = 0.0
    gpu_memory_bytes: int = 0
    gpu_memory_allocated_bytes: int = 0
    free_gpus: float = 0.0
    stranded_gpus: float = 0.0

    @property
    def fragmentation_ratio(self) -> float:
        return self.stranded_gpus / self.free_gpus if self.free_gpus > 0 else 0.0


@dataclass(frozen=True)
class GPUStat:
    node: str
    gpu: int
    model: str
    pool: str
    allocated_ratio: float
    healthy: bool


@dataclass
class ClusterStats:
    groups: dict[tuple[str, str], GroupStats]
    per_gpu: list[GPUStat]


def cluster_stats(snap: ClusterState, tw: TargetWorkload | None, *, per_gpu: bool = True) -> ClusterStats:
    """The books in ``snap`` grouped by (GPU model, pool); GPU-less nodes are left out.
    ``per_gpu``: also one ``GPUStat`` per GPU (the GPU map)."""
    groups: dict[tuple[str, str], GroupStats] = {}
    gpus: list[GPUStat] = []
    n = len(snap)
    stranded = node_fragmentation(snap, tw) if tw is not None and n else np.zeros(n)
    mib = 1024 * 1024
    for i, nd in enumerate(snap.nodes):
        count = int(snap.gpu_count[i])
        if not count:
            continue
        pool = node_pool(nd.labels)
        g = groups.setdefault((nd.gpu_model, pool), GroupStats())
        g.nodes += 1
        free = snap.gpu_free[i, :count]
        used = snap.gpu_cap[i, :count] - free
        for j in range(count):
            healthy = bool(snap.gpu_exists[i, j])
            if not healthy:
                state = "unhealthy"
            elif used[j] == 0 and snap.gpu_mem_free[i, j] == snap.gpu_mem_cap[i, j]:
                state = "idle"
            elif free[j] == 0:
                state = "full"
            else:
                state = "shared"
            g.gpus[state] += 1
            if per_gpu:
                gpus.append(GPUStat(nd.name, j, nd.gpu_model, pool, float(used[j]) / GPU_MILLI, healthy))
        g.gpus_allocated += float(used.sum()) / GPU_MILLI
        g.gpu_memory_bytes += int(snap.gpu_mem_cap[i, :count].sum()) * mib
        mem_used = snap.gpu_mem_cap[i, :count] - snap.gpu_mem_free[i, :count]
        g.gpu_memory_allocated_bytes += int(mem_used.sum()) * mib
        g.free_gpus += float(free.sum()) / GPU_MILLI
        g.stranded_gpus += float(stranded[i]) / GPU_MILLI
    return ClusterStats(groups, gpus)
