"""A per-snapshot cache of node-local scores keyed by pod shape (an equivalence-class cache).

A node-local score depends only on the pod's shape and that node's state. The cache keeps,
per key, the last score of every node and the node generation it was computed at; a cycle
recomputes only nodes whose generation has moved since (in the simulator: a handful).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import F64, NodeScores


@dataclass(slots=True)
class _Entry:
    scores: F64
    gpu: I64
    seen: I64


def cached_scores(
    snap: ClusterState, key: object, nodes: I64, compute: Callable[[I64], tuple[F64 | I64, I64]]
) -> NodeScores:
    entry = snap.score_cache.get(key)
    if not isinstance(entry, _Entry):
        n = len(snap)
        entry = _Entry(np.zeros(n), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
        snap.score_cache[key] = entry
    stale = nodes[entry.seen[nodes] != snap.gen[nodes]]
    if len(stale):
        s, g = compute(stale)
        entry.scores[stale] = s
        entry.gpu[stale] = g
        entry.seen[stale] = snap.gen[stale]
    return NodeScores(entry.scores[nodes], entry.gpu[nodes])
