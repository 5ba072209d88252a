"""Filters and scores over the nodes of one extender request, vectorised over the live books.

The cycle's steps are the core's (``core.scheduler``: ``feasible``, ``score_nodes``, and
``best_host`` for a pick), over the request's nodes; this module only translates between the request
(node names, or node objects the books do not know) and snapshot indices, and the failures
into the wire's positions. Only the reasons of failed nodes and the answer lists are built
node by node. A request's name list maps to snapshot indices once
per snapshot (kube-scheduler sends the same list pod after pod while the cluster is small
enough for it to filter every node; with ``percentageOfNodesToScore`` it sends a window that
moves pod after pod, and the cache misses).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from gpusched.core.caches import LRUCache
from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.framework import CycleState, Profile
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.scheduler import best_host, feasible, score_nodes
from gpusched.core.status import Code
from gpusched.extender.protocol import BadRequest, check_names
from gpusched.k8s.convert import InvalidRequest, node_from_k8s
from gpusched.k8s.state import LiveCluster

UNKNOWN_NODE = "node not (yet) known to gpusched"
CACHED_NAMES = 100_000
"""Node names kept in the name-list cache, all lists together (the oldest lists go first)."""
KEPT_LISTS = 8
"""Name lists kept (kube-scheduler sends one list while it filters every node; its moving window
of ``percentageOfNodesToScore`` never repeats, and each list kept costs a miss a comparison)."""
KEPT_PICKS = 4096
"""Picks kept for ``/bind`` (``Evaluator.device_hint``); the oldest go first."""
UNRES = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
Failure = tuple[int, str, Code]  # position in the request, reason, code
F64 = npt.NDArray[np.float64]


@dataclass(slots=True)
class NodeList:
    pos: I64  # positions in the request of the nodes the books know
    idx: I64  # their indices in the snapshot
    arr: npt.NDArray[np.object_] | None = None  # the request's names as an object array

    def names_at(self, names: list[str], positions: I64) -> list[str]:
        if self.arr is None:
            self.arr = np.array(names, dtype=object)
        out: list[str] = self.arr[positions].tolist()
        return out


@dataclass(slots=True)
class Evaluation:
    ok: BoolArr  # per requested node: passes every filter
    failures: list[Failure]
    raw: F64  # raw policy scores, NaN where not scored
    nodes: NodeList | None  # the cached name list (nodes sent by name only)


def index_names(snap: ClusterState, names: list[str]) -> NodeList:
    """The request's names in the snapshot: positions of the known ones and their indices (one
    C-level pass: kube-scheduler's moving window misses the cache pod after pod). The names are
    checked (``check_names``: BadRequest, LimitExceeded) only when some are not found: a name
    the snapshot knows is a node's name, so a list found whole needs no check."""
    try:
        found = np.fromiter(map(snap.index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
    except TypeError:  # an unhashable item, or a non-integer found
        check_names(names)
        raise
    pos = np.flatnonzero(found >= 0)
    if len(pos) < len(names):
        check_names(names)
    return NodeList(pos, found[pos])


def run_filters(
    profile: Profile, pod: PodSpec, snap: ClusterState, idx: I64, explain: bool
) -> tuple[BoolArr, list[Failure], CycleState]:
    """The core's PreFilter and Filter over the snapshot nodes ``idx``: which pass, and (with
    ``explain``) why the others do not, by position in ``idx`` (``core.scheduler.diagnose``'s
    words: the first failing filter names each node)."""
    f = feasible(profile, pod, snap, idx, explain=explain)
    st = f.status
    if not st.ok:
        fails = [(p, st.message(), st.code) for p in range(len(idx))] if explain else []
        return f.passed, fails, f.state
    return f.passed, [(x.position, x.reason, x.code) for x in f.filtered.failures], f.state


@dataclass(frozen=True, slots=True)
class Pick:
    """The node ``schedule_one`` would choose among a request's nodes, and its device choice."""

    node: str
    gpu_hint: int  # the heaviest device-choosing score plugin's GPU there, -1 for none


@dataclass(frozen=True, slots=True)
class _Kept:
    pod: PodSpec
    node: int
    gen: int  # the node's generation when it was scored
    gpu_hint: int


class Evaluator:
    def __init__(self, cluster: LiveCluster, profile: Profile) -> None:
        self.cluster = cluster
        self.profile = profile
        self._snap: ClusterState | None = None
        self._lists: list[tuple[list[str], NodeList]] = []  # recent name lists, the latest first
        self._cached = 0  # names in _lists
        self._picks: LRUCache[str, _Kept] = LRUCache(KEPT_PICKS)  # pod key -> its last pick on self._snap

    def _by_name(self, snap: ClusterState, names: list[str]) -> NodeList:
        if snap is not self._snap:
            self._snap, self._lists, self._cached = snap, [], 0
            self._picks.clear()
        for i, (sent, hit) in enumerate(self._lists):
            # a moving window differs at its first name: a miss costs a comparison or two
            if len(sent) == len(names) and sent[:1] == names[:1] and sent == names:
                if i:
                    self._lists.insert(0, self._lists.pop(i))
                return hit
        hit = index_names(snap, names)
        if len(names) <= CACHED_NAMES:
            self._lists.insert(0, (list(names), hit))  # a copy: the caller's list may change
            self._cached += len(names)
            while len(self._lists) > KEPT_LISTS or self._cached > CACHED_NAMES:
                self._cached -= len(self._lists.pop()[0])
        return hit

    def evaluate(
        self, pod: PodSpec, names: list[str], objs: list[dict[str, Any]] | None, *, score: bool, explain: bool
    ) -> Evaluation:
        """Over the requested nodes (by name, or as objects when ``objs`` is given)."""
        ok = np.zeros(len(names), dtype=bool)
        raw = np.full(len(names), np.nan)
        with self.cluster.live_books() as snap:
            nl = self._by_name(snap, names) if objs is None else index_names(snap, names)
            m, fails, state = run_filters(self.profile, pod, snap, nl.idx, explain)
            if score and m.any():
                raw[nl.pos[m]] = score_nodes(state, self.profile, pod, snap, nl.idx[m])[0]
        ok[nl.pos[m]] = True
        failures = [(int(nl.pos[p]), r, c) for p, r, c in fails]
        unknown = np.ones(len(names), dtype=bool)
        unknown[nl.pos] = False
        rest = np.flatnonzero(unknown).tolist()
        if rest and objs is None:
            failures += [(p, UNKNOWN_NODE, Code.UNSCHEDULABLE) for p in rest]
        elif rest and objs is not None:
            self._evaluate_objects(pod, [(p, objs[p]) for p in rest], ok, failures, raw, score, explain)
        return Evaluation(ok, failures, raw, nl if objs is None else None)

    def _evaluate_objects(
        self,
        pod: PodSpec,
        objs: list[tuple[int, dict[str, Any]]],
        ok: BoolArr,
        failures: list[Failure],
        raw: F64,
        score: bool,
        explain: bool,
    ) -> None:
        """Nodes the books do not know, from their sent objects, with empty books."""
        specs: list[NodeSpec] = []
        keep: list[int] = []
        for p, obj in objs:
            try:
                specs.append(node_from_k8s(obj))
                keep.append(p)
            except (InvalidRequest, TypeError, AttributeError, ValueError, KeyError) as e:
                failures.append((p, f"invalid node: {e}", UNRES))
        try:
            tmp = ClusterState(specs)
        except ValueError as e:  # duplicate names in the request
            raise BadRequest(f"field 'Nodes': {e}") from None
        kpos = np.array(keep, dtype=np.int64)
        tidx = np.arange(len(specs), dtype=np.int64)
        m, fails, state = run_filters(self.profile, pod, tmp, tidx, explain)
        ok[kpos[m]] = True
        failures += [(keep[p], r, c) for p, r, c in fails]
        if score and m.any():
            raw[kpos[m]] = score_nodes(state, self.profile, pod, tmp, tidx[m])[0]

    def pick(self, pod: PodSpec, names: list[str]) -> Pick | None:
        """The node among ``names`` (sent by name) that ``core.scheduler.schedule_one`` would
        choose on the live books: the nodes that pass every filter, narrowed by the pod's soft
        constraints, scored, the highest score winning and equal scores going to the node first in
        name order (the snapshot's order, the standalone scheduler's tie-break): the core's
        ``best_host``; the devices are chosen at ``/bind``. None when no node passes (the caller
        then explains each failure)."""
        with self.cluster.live_books() as snap:
            nl = self._by_name(snap, names)
            m, _, state = run_filters(self.profile, pod, snap, nl.idx, explain=False)
            if not m.any():
                return None
            b = best_host(state, self.profile, pod, snap, np.sort(nl.idx[m]))  # devices: at /bind
            self._picks.put(pod.key, _Kept(pod, b.node, int(snap.gen[b.node]), b.gpu_hint))
            return Pick(snap.names[b.node], b.gpu_hint)

    def device_hint(self, snap: ClusterState, pod: PodSpec, node: int) -> int | None:
        """The device choice of ``pod``'s last pick, when it picked ``node`` of ``snap`` and the
        node has not changed since (same generation): the score there would be the same (a
        score is node-local: ``core.policies.cache`` keys its rows by node generation, too), so
        ``/bind`` need not score the node again. None otherwise (and the pick is forgotten).
        Call it holding the cluster's lock."""
        kept = self._picks.pop(pod.key)
        if kept is None or snap is not self._snap or kept.pod is not pod or kept.node != node:
            return None
        return kept.gpu_hint if kept.gen == int(snap.gen[node]) else None
