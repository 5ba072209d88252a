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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload, node_fragmentation
from gpusched.core.model import GPU_MILLI, PodSpec

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
class PerGPU:
    """The GPU map: the GPU nodes (``nodes``, ``models``, ``pools``) and one entry per GPU in the
    arrays (``node``: an index into ``nodes``)."""

    nodes: tuple[str, ...]
    models: tuple[str, ...]
    pools: tuple[str, ...]
    node: npt.NDArray[np.int64]
    gpu: npt.NDArray[np.int64]
    allocated_ratio: npt.NDArray[np.float64]
    healthy: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.gpu)


MIG_STATES = ("held", "free", "reshaping")
"""A MIG instance present on a GPU in MIG mode is ``held`` by a pod, else ``reshaping`` when its GPU is being
re-cut (it takes no pod until the new geometry is published), else ``free``."""


@dataclass(frozen=True)
class MigCount:
    """MIG instances of one profile on one node (GPUs in MIG mode), by state."""

    node: str
    pool: str
    model: str
    profile: str
    held: int
    free: int
    reshaping: int

    @property
    def present(self) -> int:
        return self.held + self.free + self.reshaping


def mig_counts(snap: ClusterState) -> tuple[MigCount, ...]:
    """Per node with a MIG geometry and per (model class, profile) present there: instances held, free and
    on a GPU being re-cut (``core.mig.books``; nodes in the books' order, then model, then profile)."""
    out: list[MigCount] = []
    for n, nd in enumerate(snap.nodes):
        nm = nd.mig
        if nm is None:
            continue
        tally: dict[tuple[str, str], list[int]] = {}
        for i, g in zip(nm.indices, nm.gpus, strict=True):
            if not g.mig_enabled:
                continue
            held = set(snap.mig_books[n][i].instances)
            for x in g.instances:
                row = tally.setdefault((g.geometry.model, x.profile), [0, 0, 0])
                row[0 if x in held else 2 if i in nm.reshaping else 1] += 1
        pool = node_pool(snap.nodes[n].labels)
        out += [MigCount(snap.names[n], pool, m, p, *row) for (m, p), row in sorted(tally.items())]
    return tuple(out)


def mig_pending(pods: Iterable[PodSpec]) -> dict[str, int]:
    """MIG slices the pending pods ask for, per profile."""
    out: dict[str, int] = {}
    for pod in pods:
        for p in pod.mig:
            out[p] = out.get(p, 0) + 1
    return dict(sorted(out.items()))


@dataclass
class ClusterStats:
    groups: dict[tuple[str, str], GroupStats]
    per_gpu: PerGPU
    mig: tuple[MigCount, ...] = ()
    """Per node and profile: MIG instances held, free and being re-cut (``mig_counts``)."""
    mig_pending: Mapping[str, int] = field(default_factory=dict)
    """MIG slices pending pods ask for, per profile (``mig_pending``)."""


def cluster_stats(
    snap: ClusterState, tw: TargetWorkload | None, pending: Iterable[PodSpec] = ()
) -> ClusterStats:
    """The books in ``snap`` grouped by (GPU model, pool), GPU-less nodes left out, and per GPU; MIG
    instances per node and profile, and the MIG slices ``pending`` pods ask for.
    Vectorised: about 10 ms at 5000 nodes of 8 GPUs (it runs under the books' lock)."""
    n = len(snap)
    stranded = node_fragmentation(snap, tw) if tw is not None and n else np.zeros(n)
    gpu_nodes = np.flatnonzero(snap.gpu_count > 0)
    keys: dict[tuple[str, str], int] = {}
    gid = np.empty(len(gpu_nodes), dtype=np.int64)
    pools: list[str] = []
    for k, i in enumerate(gpu_nodes):
        nd = snap.nodes[i]
        pool = node_pool(nd.labels)
        pools.append(pool)
        gid[k] = keys.setdefault((nd.gpu_model, pool), len(keys))
    m = len(keys)
    count = snap.gpu_count[gpu_nodes]
    present = np.arange(snap.gpu_free.shape[1])[None, :] < count[:, None]
    exists = snap.gpu_exists[gpu_nodes] & present
    free = np.where(present, snap.gpu_free[gpu_nodes], 0)
    used = np.where(present, snap.gpu_cap[gpu_nodes] - snap.gpu_free[gpu_nodes], 0)
    mem_cap = np.where(present, snap.gpu_mem_cap[gpu_nodes], 0)
    mem_used = mem_cap - np.where(present, snap.gpu_mem_free[gpu_nodes], 0)
    idle = exists & (used == 0) & (mem_used == 0)
    full = exists & ~idle & (free == 0)
    states = {
        "idle": idle,
        "shared": exists & ~idle & ~full,
        "full": full,
        "unhealthy": present & ~exists,
    }

    def by_group(per_node: npt.NDArray[np.generic]) -> npt.NDArray[np.float64]:
        return np.bincount(gid, weights=per_node.astype(np.float64), minlength=m).astype(np.float64)

    nodes_n = np.bincount(gid, minlength=m)
    state_n = {st: by_group(a.sum(axis=1)) for st, a in states.items()}
    alloc = by_group(used.sum(axis=1)) / GPU_MILLI
    mem_b = by_group(mem_cap.sum(axis=1)) * 2**20
    mem_u = by_group(mem_used.sum(axis=1)) * 2**20
    free_g = by_group(free.sum(axis=1)) / GPU_MILLI
    strand = by_group(stranded[gpu_nodes]) / GPU_MILLI
    groups = {
        key: GroupStats(
            nodes=int(nodes_n[g]),
            gpus={st: int(state_n[st][g]) for st in GPU_STATES},
            gpus_allocated=float(alloc[g]),
            gpu_memory_bytes=int(mem_b[g]),
            gpu_memory_allocated_bytes=int(mem_u[g]),
            free_gpus=float(free_g[g]),
            stranded_gpus=float(strand[g]),
        )
        for key, g in keys.items()
    }
    rows, cols = np.nonzero(present)  # row-major: node by node, GPU by GPU
    per_gpu = PerGPU(
        nodes=tuple(snap.names[i] for i in gpu_nodes),
        models=tuple(snap.nodes[i].gpu_model for i in gpu_nodes),
        pools=tuple(pools),
        node=rows.astype(np.int64),
        gpu=cols.astype(np.int64),
        allocated_ratio=used[rows, cols] / GPU_MILLI,
        healthy=exists[rows, cols],
    )
    return ClusterStats(groups, per_gpu, mig_counts(snap), mig_pending(pending))
