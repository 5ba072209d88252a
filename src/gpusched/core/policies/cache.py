"""Per-snapshot caches of node-local values, refreshed by node generation.

A node-local value (a score for a pod shape, or per-node terms of a policy) depends only on
that node's state. A cache entry keeps, per node, the last value and the node generation it
was computed at; a cycle recomputes only nodes whose generation has moved since (in the
simulator: a handful). Keyed by pod shape this is kube-scheduler's old equivalence-class cache.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpusched.core.caches import Rows
from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import F64, NodeScores


class PolicyKey:
    """A policy's part of its cache keys: its workload and parameters, hashed once.

    A tuple re-hashes every member on each lookup; with a workload of a hundred task types that
    cost more than the cached work it guarded. Equal keys still find each other: two policies
    built from the same workload share entries."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: tuple[object, ...]) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, PolicyKey) and self._hash == other._hash and self.value == other.value

    def __repr__(self) -> str:
        return f"PolicyKey({self.value[0]!r}, …)"


def cached_rows(
    snap: ClusterState,
    key: Hashable,
    nodes: I64,
    compute: Callable[[I64], Sequence[npt.NDArray[np.generic]]],
) -> tuple[Any, ...]:
    """Rows ``nodes`` of the arrays ``compute`` returns (first axis = node), recomputing stale rows."""
    entry = snap.caches.rows.get(key)
    if entry is None:
        fresh = compute(np.arange(len(snap), dtype=np.int64))
        entry = Rows(tuple(np.array(a) for a in fresh), snap.gen.copy())
        snap.caches.rows.put(key, entry)
        return tuple(a[nodes] for a in entry.arrays)
    stale = nodes[entry.seen[nodes] != snap.gen[nodes]]
    if len(stale):
        for arr, new in zip(entry.arrays, compute(stale), strict=True):
            arr[stale] = new
        entry.seen[stale] = snap.gen[stale]
    return tuple(a[nodes] for a in entry.arrays)


def cached_scores(
    snap: ClusterState, key: Hashable, nodes: I64, compute: Callable[[I64], tuple[F64 | I64, I64]]
) -> NodeScores:
    """Scores (and GPU choice) of ``nodes`` for one pod shape, recomputing only stale nodes."""
    entry = snap.caches.rows.get(key)
    if entry is None:
        n = len(snap)
        entry = Rows((np.zeros(n), np.full(n, -1, dtype=np.int64)), np.full(n, -1, dtype=np.int64))
        snap.caches.rows.put(key, entry)
    stale = nodes[entry.seen[nodes] != snap.gen[nodes]]
    if len(stale):
        s, g = compute(stale)
        entry.arrays[0][stale] = s
        entry.arrays[1][stale] = g
        entry.seen[stale] = snap.gen[stale]
    scores, gpu = entry.arrays
    return NodeScores(scores[nodes], gpu[nodes])  # type: ignore[arg-type]
