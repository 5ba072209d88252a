"""GPU topology of a node (NVLink peers, NUMA node per GPU) and the choice of GPU sets it drives.

Integers only. A node's ``GpuTopology`` comes from the agent's ``gpusched.io/gpu-topology``
annotation (parsed by the k8s adapter). A node without one is placed topology-blind.

The choice (``choose``), among the GPUs a pod fits on:

- a multi-GPU pod takes an *NVLink-complete* set (every pair of its GPUs NVLink peers) on *one NUMA
  node* when one fits; else the best-connected set: most NVLink pairs, then fewest NUMA nodes;
- among equally connected sets it takes GPUs from the islands (NVLink-connected components) and
  NUMA nodes with the fewest untouched GPUs left: it breaks an already broken island before a whole
  one (as HAMi does), so whole islands stay free for the multi-GPU pods that need them; then the
  tightest GPUs (least free milli, then memory: best fit) and the lowest indices;
- a one-GPU pod or share takes the tightest GPU first (as topology-blind best fit does: a share on a
  used GPU breaks no free set), and among equally tight ones the one in the most broken island and
  NUMA node, then the lowest index.

Per topology and set size the candidate sets are precomputed once (at most C(8, 4) = 70 on the
8-GPU nodes gpusched books), so a choice is a handful of vector operations over them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpusched.core.errors import InvalidSpec

I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]

UNKNOWN_NUMA = -1
"""A GPU whose NUMA node is not known (the agent reported none)."""


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """Per GPU (index 0..n-1): its NUMA node (``UNKNOWN_NUMA`` when not known) and its NVLink peers
    (sorted; the relation is symmetric and never holds a GPU itself)."""

    numa: tuple[int, ...]
    peers: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.numa)
        if len(self.peers) != n:
            raise InvalidSpec(f"GPU topology: {n} NUMA nodes but {len(self.peers)} NVLink peer lists")
        for g, v in enumerate(self.numa):
            if not isinstance(v, int) or isinstance(v, bool) or v < UNKNOWN_NUMA:
                raise InvalidSpec(f"GPU topology: GPU {g} NUMA node must be an integer >= -1, got {v!r}")
        for g, ps in enumerate(self.peers):
            for p in ps:
                if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < n or p == g:
                    raise InvalidSpec(
                        f"GPU topology: GPU {g} NVLink peer {p!r} is not another of its {n} GPUs"
                    )
                if g not in self.peers[p]:
                    raise InvalidSpec(
                        f"GPU topology: GPU {g} lists {p} as NVLink peer but {p} does not list {g}"
                    )
            if list(ps) != sorted(set(ps)):
                raise InvalidSpec(
                    f"GPU topology: GPU {g} NVLink peers {list(ps)} are not sorted and distinct"
                )

    @staticmethod
    def of(numa: Sequence[int], peers: Sequence[Sequence[int]]) -> GpuTopology:
        """A topology from per-GPU NUMA nodes and peer lists, the peer relation made symmetric.
        Raises InvalidSpec for a peer that names no other GPU of the node."""
        n = len(numa)
        sym: list[set[int]] = [set() for _ in range(n)]
        for g, ps in enumerate(peers):
            for p in ps:
                if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < n or p == g:
                    raise InvalidSpec(
                        f"GPU topology: GPU {g} NVLink peer {p!r} is not another of its {n} GPUs"
                    )
                sym[g].add(p)
                sym[p].add(g)
        return GpuTopology(tuple(numa), tuple(tuple(sorted(s)) for s in sym))

    @property
    def gpu_count(self) -> int:
        return len(self.numa)

    def islands(self) -> tuple[int, ...]:
        """Per GPU, its NVLink island: the lowest index of its connected component."""
        out = list(range(self.gpu_count))
        for g in range(self.gpu_count):
            stack = [g]
            seen = {g}
            while stack:
                for p in self.peers[stack.pop()]:
                    if p not in seen:
                        seen.add(p)
                        stack.append(p)
            out[g] = min(seen)
        return tuple(out)

    def nvlink_pairs(self, gpus: Sequence[int]) -> int:
        return sum(1 for a, b in itertools.combinations(gpus, 2) if b in self.peers[a])

    def is_complete(self, gpus: Sequence[int]) -> bool:
        """``gpus`` are NVLink-complete (every pair peered) and on one NUMA node: the measure of
        ``gpusched bench topology``. A single GPU always is."""
        k = len(gpus)
        return self.nvlink_pairs(gpus) == k * (k - 1) // 2 and len({self.numa[g] for g in gpus}) <= 1


@dataclass(frozen=True, slots=True)
class _Sets:
    """Every k-subset of a topology's GPUs (lexicographic order), with what the choice reads."""

    members: I64  # (C, k)
    masks: I64  # (C,) bit g set for member g
    complete: BoolArr  # NVLink-complete and one NUMA node
    pairs: I64  # NVLink pairs among the members
    numas: I64  # distinct NUMA nodes among the members


@functools.lru_cache(maxsize=512)
def _sets(topo: GpuTopology, k: int) -> _Sets:
    combos = list(itertools.combinations(range(topo.gpu_count), k))
    members = np.array(combos, dtype=np.int64).reshape(len(combos), k)
    masks = (np.int64(1) << members).sum(axis=1).astype(np.int64)
    pairs = np.array([topo.nvlink_pairs(c) for c in combos], dtype=np.int64)
    numas = np.array([len({topo.numa[g] for g in c}) for c in combos], dtype=np.int64)
    complete = (pairs == k * (k - 1) // 2) & (numas <= 1)
    return _Sets(members, masks, complete, pairs, numas)


@functools.lru_cache(maxsize=256)
def _groups(topo: GpuTopology) -> tuple[I64, I64]:
    """(G, G) booleans as int: same island, same NUMA node."""
    isl = np.array(topo.islands(), dtype=np.int64)
    numa = np.array(topo.numa, dtype=np.int64)
    return (isl[:, None] == isl[None, :]).astype(np.int64), (numa[:, None] == numa[None, :]).astype(np.int64)


def choose(
    topo: GpuTopology, fits: BoolArr, untouched: BoolArr, free_milli: I64, free_mem: I64, k: int
) -> tuple[int, ...]:
    """The ``k`` GPUs to take among those with ``fits`` (see the module's rules). ``untouched``:
    GPUs with nothing on them (what the islands' and NUMA nodes' free counts count); ``free_milli``
    and ``free_mem``: per GPU, for the best-fit tie-break. All arrays are the node's first
    ``topo.gpu_count`` GPUs. The caller ensures at least ``k`` GPUs fit."""
    s = _sets(topo, k)
    n = topo.gpu_count
    fit_mask = int((fits[:n].astype(np.int64) << np.arange(n, dtype=np.int64)).sum())
    ok = (s.masks & ~np.int64(fit_mask)) == 0
    idx = np.flatnonzero(ok)
    m = s.members[idx]
    same_island, same_numa = _groups(topo)
    free = untouched[:n].astype(np.int64)
    island_free = (same_island @ free)[m].sum(axis=1)
    numa_free = (same_numa @ free)[m].sum(axis=1)
    tight = (free_mem[:n][m].sum(axis=1), free_milli[:n][m].sum(axis=1))
    spread = (numa_free, island_free)
    keys: tuple[npt.NDArray[Any], ...]
    if k == 1:  # best fit first (a share on a used GPU breaks nothing), then the most broken island
        keys = (idx, *spread, *tight)
    else:  # the best-connected set first, then the most broken islands, then best fit
        keys = (idx, *tight, *spread, s.numas[idx], -s.pairs[idx], ~s.complete[idx])
    order = np.lexsort(keys)  # the last key sorts first; idx: lowest indices (lexicographic sets)
    return tuple(int(g) for g in m[order[0]])


def has_complete(topo: GpuTopology, k: int) -> bool:
    """Whether the topology has any NVLink-complete single-NUMA set of ``k`` GPUs (a PCIe box without
    NVLink has none for k >= 2; 4 NVLink pairs have none for k >= 3)."""
    return k <= topo.gpu_count and bool(_sets(topo, k).complete.any())


def complete_fits(topo: GpuTopology, k: int, fits: BoolArr) -> BoolArr:
    """Per row of ``fits`` ((nodes, >= G) booleans: GPUs with room for the pod), whether an
    NVLink-complete single-NUMA set of ``k`` of them exists."""
    s = _sets(topo, k)
    n = topo.gpu_count
    masks = s.masks[s.complete]
    if not len(masks):
        return np.zeros(len(fits), dtype=bool)
    fit_masks = (fits[:, :n].astype(np.int64) << np.arange(n, dtype=np.int64)).sum(axis=1)
    out: BoolArr = ((masks[None, :] & ~fit_masks[:, None]) == 0).any(axis=1)
    return out
