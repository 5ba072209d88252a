"""GPU fragmentation against a target workload (Weng et al., ATC '23), vectorised.

A *task type* is (cpu, gpu_milli, num_gpu, allowed models). For one node and one type, the
fragment is the idle GPU milli that type cannot use there: all of it when the type does not
fit (or is CPU-only, or the model is not allowed), else the slivers of GPUs with less free
milli than the type's per-GPU request. A node's fragmentation is the expectation over the
target workload's type shares ``p``.

Arrays are over ``k`` nodes, ``G`` GPU slots and ``M`` types; all arithmetic is integer
except the final expectation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.model import PodSpec

F64 = npt.NDArray[np.float64]

TypeKey = tuple[int, int, int, frozenset[str]]


def task_type(pod: PodSpec) -> TypeKey:
    return (pod.cpu_milli, pod.gpu_milli, pod.num_gpu, pod.gpu_models)


@dataclass(frozen=True)
class TargetWorkload:
    """The popular task types and their shares (Σ p = 1)."""

    keys: tuple[TypeKey, ...]
    p: F64
    cpu: I64
    milli: I64
    num: I64
    counts: tuple[tuple[TypeKey, int], ...] = ()
    """Every type seen and its pod count, the rare ones too (see ``with_coverage``)."""

    @classmethod
    def from_counts(
        cls, counts: Counter[TypeKey], coverage: float = 0.95, max_types: int | None = None
    ) -> TargetWorkload:
        """Keep the most popular types until they cover ``coverage`` of the pods (and at most
        ``max_types`` of them); renormalise."""
        if not counts:
            raise ValueError("target workload needs at least one pod")
        total = sum(counts.values())
        # most popular first; equal counts by descending (cpu, milli, num, models) as the FGD simulator does
        ordered = sorted(
            counts.items(),
            key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], sorted(kv[0][3])),
            reverse=True,
        )
        kept: list[tuple[TypeKey, int]] = []
        acc = 0
        for key, c in ordered:
            kept.append((key, c))
            acc += c
            if acc >= coverage * total or len(kept) == max_types:
                break
        n = sum(c for _, c in kept)
        return cls(
            keys=tuple(k for k, _ in kept),
            p=np.array([c / n for _, c in kept], dtype=np.float64),
            cpu=np.array([k[0] for k, _ in kept], dtype=np.int64),
            milli=np.array([k[1] for k, _ in kept], dtype=np.int64),
            num=np.array([k[2] for k, _ in kept], dtype=np.int64),
            counts=tuple(ordered),
        )

    def with_coverage(self, coverage: float, max_types: int | None = None) -> TargetWorkload:
        """The same pods, keeping types until they cover ``coverage`` of them (at most ``max_types``)."""
        if not self.counts:
            return self
        return TargetWorkload.from_counts(Counter(dict(self.counts)), coverage, max_types)

    @classmethod
    def from_pods(cls, pods: Iterable[PodSpec], coverage: float = 0.95) -> TargetWorkload:
        return cls.from_counts(Counter(task_type(p) for p in pods), coverage)

    def model_table(self, snap: ClusterState) -> BoolArr:
        """``table[model_id, m]``: type m may run on that model and needs a GPU. The last row
        serves ``model_id == -1`` (nodes without GPUs) and is all False. Cached per snapshot
        (a snapshot's models never change); callers must not modify it."""
        cache_key = ("model_table", self.keys)
        cached = snap.caches.tables.get(cache_key)
        if cached is not None:
            return cached
        t = np.zeros((len(snap.models) + 1, len(self.keys)), dtype=bool)
        for j, key in enumerate(self.keys):
            if key[2] == 0:
                continue
            for i, m in enumerate(snap.models):
                t[i, j] = not key[3] or m in key[3]
        snap.caches.tables.put(cache_key, t)
        return t


@dataclass(frozen=True, slots=True)
class NodeTerms:
    """Per node and type: GPUs with free >= request (``cnt``), sum of free below it (``lt``)."""

    gfree: I64  # (k, G)
    ge: BoolArr  # (k, G, M)
    cnt: I64  # (k, M)
    lt: I64  # (k, M)
    total: I64  # (k,)


def node_terms(gfree: I64, tw: TargetWorkload, exists: BoolArr | None = None) -> NodeTerms:
    ge = gfree[:, :, None] >= tw.milli[None, None, :]
    if exists is not None:  # padding slots of smaller nodes serve no type, not even milli-0 ones
        ge &= exists[:, :, None]
    cnt = ge.sum(axis=1)
    lt = np.where(ge, 0, gfree[:, :, None]).sum(axis=1)
    return NodeTerms(gfree, ge, cnt, lt, gfree.sum(axis=1))


def frag_from_terms(
    cnt: I64, lt: I64, total: I64, cpu_free: I64, allowed: BoolArr, tw: TargetWorkload
) -> F64:
    """Expected fragment over the types; ``cnt``/``lt``/``allowed`` broadcast against (…, M)."""
    fits = (cnt >= tw.num) & (cpu_free[..., None] >= tw.cpu) & allowed
    frag = np.where(fits, lt, total[..., None])
    out: F64 = frag @ tw.p
    return out


def node_fragmentation(snap: ClusterState, tw: TargetWorkload, nodes: I64 | None = None) -> F64:
    """Fragmentation (milli-GPU) of ``nodes`` (all nodes when None) under the current state."""
    idx = np.arange(len(snap)) if nodes is None else nodes
    table = tw.model_table(snap)
    t = node_terms(snap.gpu_free[idx], tw, snap.gpu_exists[idx])
    return frag_from_terms(t.cnt, t.lt, t.total, snap.cpu_free[idx], table[snap.model_id[idx]], tw)


def cluster_fragmentation(snap: ClusterState, tw: TargetWorkload) -> float:
    return float(node_fragmentation(snap, tw).sum())


def frag_after_share(t: NodeTerms, cpu_after: I64, allowed: BoolArr, tw: TargetWorkload, milli: int) -> F64:
    """Fragmentation of each node (k) if GPU j (G) gave up ``milli``: shape (k, G)."""
    g_new = t.gfree - milli  # (k, G)
    ge_new = g_new[:, :, None] >= tw.milli[None, None, :]
    cnt = t.cnt[:, None, :] - t.ge + ge_new
    lt_old = np.where(t.ge, 0, t.gfree[:, :, None])
    lt_new = np.where(ge_new, 0, g_new[:, :, None])
    lt = t.lt[:, None, :] - lt_old + lt_new
    total = np.broadcast_to((t.total - milli)[:, None], g_new.shape)
    cpu = np.broadcast_to(cpu_after[:, None], g_new.shape)
    return frag_from_terms(cnt, lt, total, cpu, allowed[:, None, :], tw)


def frag_after_whole(
    t: NodeTerms, cpu_after: I64, allowed: BoolArr, tw: TargetWorkload, num: int, milli: int
) -> F64:
    """Fragmentation of each node (k) after ``num`` GPUs with ``milli`` free (whole GPUs) go."""
    # the taken GPUs counted in cnt for every type they served; for milli-0 types a GPU left
    # with 0 milli still counts, so nothing changes there
    gone = ((milli >= tw.milli) & (tw.milli > 0)).astype(np.int64) * num
    return frag_from_terms(t.cnt - gone[None, :], t.lt, t.total - num * milli, cpu_after, allowed, tw)


def share_candidates(snap: ClusterState, pod: PodSpec, nodes: I64) -> BoolArr:
    """(k, G): GPU j of node k can take one unit of ``pod`` (``ClusterState.gpu_room``)."""
    ok: BoolArr = snap.gpu_room(pod, nodes) & snap.gpu_exists[nodes]
    return ok


def placement_frag(
    snap: ClusterState, pod: PodSpec, nodes: I64, tw: TargetWorkload, table: BoolArr | None = None
) -> tuple[F64, F64]:
    """Fragmentation of each of ``nodes`` before and after placing ``pod`` there.

    Returns ``before`` (k,) and ``after`` (k, C): for a share, column j is the outcome of
    putting it on GPU j (C = G); otherwise one column (whole GPUs take fully free GPUs, for
    which the outcome has a closed form). Placements that do not fit are +inf.
    """
    if table is None:
        table = tw.model_table(snap)
    allowed = table[snap.model_id[nodes]]
    cpu_after = snap.cpu_free[nodes] - pod.cpu_milli
    t = node_terms(snap.gpu_free[nodes], tw, snap.gpu_exists[nodes])
    before = frag_from_terms(t.cnt, t.lt, t.total, snap.cpu_free[nodes], allowed, tw)
    if pod.num_gpu == 0:
        after = frag_from_terms(t.cnt, t.lt, t.total, cpu_after, allowed, tw)
        return before, after[:, None]
    cand = share_candidates(snap, pod, nodes)
    if pod.is_share:
        after_g = frag_after_share(t, cpu_after, allowed, tw, pod.gpu_milli)
        return before, np.where(cand, after_g, np.inf)
    after = frag_after_whole(t, cpu_after, allowed, tw, pod.num_gpu, pod.gpu_milli)
    fits = cand.sum(axis=1) >= pod.num_gpu
    return before, np.where(fits, after, np.inf)[:, None]
