"""Gang topology domains: keep a gang's members in one clique, rack or block (issue 31 item 4).

A cluster's network is a hierarchy of domains named by node labels, narrowest first: the NVLink
domain (``nvidia.com/gpu.clique``, GPU feature discovery's label on GB200/NVL systems), then a
rack, then a block (``TopologyLevels``; the keys are configurable, ``DEFAULT_LEVELS``). As in
Kueue's Topology Aware Scheduling, a domain at a level is named by the node's values of that
level's key *and of every wider level's key* (two racks called ``r1`` in two blocks are two
racks). A node without a level's label is in no domain of that level; a wider label it lacks
counts as the value "" (cliques work on nodes that carry no rack or block label).

A gang asks for one level (``GangTopology``):

- **required**: every member it places now lands in one domain of that level, or the gang waits
  and the reason names the level (``topology-required <key>``);
- **preferred**: one domain of that level if one holds the gang, else one domain of the next wider
  level, and so on; else the fewest domains of the widest level whose room adds up to the gang
  (``fewest_domains``); else anywhere (topology-blind, as without a request).

The choice (``place_in_domain``): the candidate domains are those whose nodes could take the gang's
minimum (an upper bound of how many members fit per node, ``member_room``), the tightest first
(the fewest free GPUs, then the fewest nodes, then by name), so that large domains stay free for
large gangs; the gang's own placement (``statement.schedule_all``) then runs restricted to the
domain's nodes, and the first domain where the minimum fits at once wins. Members of the gang
already bound anchor it: only domains holding all of them are candidates.

Pure: labels and integer books in, a ``GroupResult`` out; no clock, no Kubernetes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.errors import InvalidSpec
from gpusched.core.framework import Profile
from gpusched.core.gangclaims import schedule_gang
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.names import LABEL_BLOCK, LABEL_CLIQUE, LABEL_RACK
from gpusched.core.statement import GroupResult
from gpusched.core.status import Code, Status

DEFAULT_LEVELS: tuple[str, ...] = (LABEL_CLIQUE, LABEL_RACK, LABEL_BLOCK)
"""The default hierarchy, narrowest first: NVLink clique, rack, block."""


class InvalidTopology(InvalidSpec):
    """A topology hierarchy or a gang's topology request that cannot be used (names the key)."""


class Mode(enum.Enum):
    REQUIRED = "required"
    PREFERRED = "preferred"


@dataclass(frozen=True, slots=True)
class GangTopology:
    """A gang's request: ``mode`` at the level ``keys[0]``; ``keys`` is that level's key followed
    by every wider level's (a domain is named by the node's values of all of them)."""

    mode: Mode
    keys: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.keys[0]

    def describe(self) -> str:
        return f"topology-{self.mode.value} {self.key}"


@dataclass(frozen=True, slots=True)
class TopologyLevels:
    """The configured hierarchy of node label keys, narrowest first."""

    keys: tuple[str, ...] = DEFAULT_LEVELS

    def __post_init__(self) -> None:
        if not self.keys:
            raise InvalidTopology("topology levels: at least one node label key is needed")
        for k in self.keys:
            if not isinstance(k, str) or not k or k.strip() != k or " " in k or "," in k:
                raise InvalidTopology(f"topology levels: {k!r} is not a node label key")
        if len(set(self.keys)) != len(self.keys):
            dup = next(k for k in self.keys if self.keys.count(k) > 1)
            raise InvalidTopology(f"topology levels: {dup} is listed twice")

    @classmethod
    def parse(cls, text: str) -> TopologyLevels:
        """From a comma-separated list (the scheduler's ``--gang-topology-levels``)."""
        return cls(tuple(k.strip() for k in text.split(",") if k.strip()))

    def request(self, mode: Mode, key: str) -> GangTopology:
        """The request for ``key`` (one of the levels), or InvalidTopology naming the key and levels."""
        if key not in self.keys:
            raise InvalidTopology(
                f"topology-{mode.value}: {key!r} is not one of the topology levels ({', '.join(self.keys)})"
            )
        return GangTopology(mode, self.keys[self.keys.index(key) :])


@dataclass(frozen=True, slots=True)
class Domain:
    """One domain: its level's key, the values naming it (that level's first, then the wider
    ones'), its nodes (snapshot indices, ascending)."""

    key: str
    values: tuple[str, ...]
    nodes: I64

    def describe(self) -> str:
        return f"{self.key}={self.values[0]}" + (
            f" (in {'/'.join(self.values[1:])})" if len(self.values) > 1 else ""
        )


def domains(snap: ClusterState, keys: Sequence[str]) -> list[Domain]:
    """The domains of the level ``keys[0]`` (wider levels' keys after it): the nodes carrying label
    ``keys[0]``, grouped by their values of every key (a wider label a node lacks counts as the
    value "", so GPU feature discovery's cliques work on nodes without rack or block labels)."""
    if not len(snap):
        return []
    codes = np.stack([snap.domains(k)[0] for k in keys], axis=1)
    labelled = np.flatnonzero(codes[:, 0] >= 0)
    if not len(labelled):
        return []
    paths, group = np.unique(codes[labelled], axis=0, return_inverse=True)
    order = np.argsort(group.reshape(-1), kind="stable")
    bounds = np.cumsum(np.bincount(group.reshape(-1), minlength=len(paths)))[:-1]
    values = [snap.domains(k)[1] for k in keys]
    out = [
        Domain(
            keys[0],
            tuple(values[i][c] if c >= 0 else "" for i, c in enumerate(path.tolist())),
            np.sort(labelled[members]).astype(np.int64),
        )
        for path, members in zip(paths, np.split(order, bounds), strict=True)
    ]
    out.sort(key=lambda d: d.values)
    return out


def member_room(snap: ClusterState, pods: Sequence[PodSpec]) -> I64:
    """Per node, an upper bound of how many of ``pods`` fit there at once (CPU, memory, pod slots
    and GPUs each bound it; for mixed members, the most of any one shape): never less than the
    true number, so a domain pruned by it could not hold the gang."""
    best = np.zeros(len(snap), dtype=np.int64)
    cap = len(pods)
    for p in {(q.cpu_milli, q.memory_mib, q.num_gpu, q.gpu_milli): q for q in pods}.values():
        room = np.minimum(snap.pod_free, cap).astype(np.int64)
        if p.cpu_milli:
            room = np.minimum(room, snap.cpu_free // p.cpu_milli)
        if p.memory_mib:
            room = np.minimum(room, snap.mem_free // p.memory_mib)
        if p.num_gpu:
            usable = np.where(snap.gpu_exists, snap.gpu_free, 0)
            if p.gpu_milli >= GPU_MILLI:
                whole = (usable == GPU_MILLI).sum(axis=1)
                room = np.minimum(room, whole // p.num_gpu)
            elif p.gpu_milli > 0:
                room = np.minimum(room, (usable // p.gpu_milli).sum(axis=1))
            else:  # a share by memory alone: at most as many as GPUs with room
                room = np.minimum(room, (usable > 0).sum(axis=1) * cap)
        best = np.maximum(best, np.maximum(room, 0))
    return best


def candidates(
    snap: ClusterState, pods: Sequence[PodSpec], need: int, keys: Sequence[str], anchor: Sequence[int]
) -> list[Domain]:
    """The domains of level ``keys[0]`` that may hold ``need`` of ``pods`` at once and every node of
    ``anchor`` (the gang's bound members), the tightest first: the fewest free GPU milli, then the
    fewest nodes, then by name."""
    room = member_room(snap, pods)
    free = (
        np.where(snap.gpu_exists, snap.gpu_free, 0).sum(axis=1) if len(snap) else np.zeros(0, dtype=np.int64)
    )
    out: list[tuple[int, int, Domain]] = []
    for d in domains(snap, keys):
        if anchor and not np.isin(np.asarray(anchor, dtype=np.int64), d.nodes).all():
            continue
        if int(room[d.nodes].sum()) < need:
            continue
        out.append((int(free[d.nodes].sum()), len(d.nodes), d))
    out.sort(key=lambda t: (t[0], t[1], t[2].values))
    return [d for _, _, d in out]


@dataclass(frozen=True, slots=True)
class TopologyPlacement:
    """The outcome: the gang's ``result`` and the ``domain`` it was placed in (None: unplaced, or
    placed anywhere by a preferred request none of whose levels held it)."""

    result: GroupResult
    domain: Domain | None


def place_in_domain(
    profile: Profile,
    pods: Sequence[PodSpec],
    snap: ClusterState,
    request: GangTopology,
    *,
    need: int,
    gang: str,
    tiebreak: I64 | None = None,
    diagnose: bool = True,
    leaving: frozenset[str] = frozenset(),
) -> TopologyPlacement:
    """Place at least ``need`` of ``pods`` (the gang ``gang``, ``namespace/name``) at once in one
    domain as ``request`` asks (see the module's doc); nothing stays booked when it fails. The
    profile is used as given (gangs pass one without PostFilters)."""
    anchor = bound_nodes(snap, gang)
    levels = (
        [request.keys]
        if request.mode is Mode.REQUIRED
        else [request.keys[i:] for i in range(len(request.keys))]
    )

    def place(nodes: I64 | None, diagnose_failures: bool = False) -> GroupResult:
        """The gang's own placement (its joint claim search included) on ``nodes`` (None: anywhere)."""
        return schedule_gang(
            profile, pods, snap, tiebreak=tiebreak, min_count=need, diagnose_failures=diagnose_failures,
            nodes=nodes, leaving=leaving,
        )  # fmt: skip

    tried = 0
    most = 0
    for keys in levels:
        for d in candidates(snap, pods, need, keys, anchor):
            tried += 1
            r = place(d.nodes)
            if r.scheduled:
                return TopologyPlacement(r, d)
            most = max(most, sum(1 for x in r.results if x.scheduled))
    if request.mode is Mode.PREFERRED:
        few = fewest_domains(snap, pods, need, request.keys[-1:]) if not anchor else None
        if few is not None:
            r = place(few)
            if r.scheduled:
                return TopologyPlacement(r, None)
        r = place(None, diagnose)
        return TopologyPlacement(r, None)
    return TopologyPlacement(
        GroupResult(
            Status(Code.UNSCHEDULABLE, (_why(snap, request, need, tried, most, anchor),), "GangTopology"), ()
        ),
        None,
    )


def fewest_domains(snap: ClusterState, pods: Sequence[PodSpec], need: int, keys: Sequence[str]) -> I64 | None:
    """The nodes of the fewest domains of level ``keys[0]`` whose room adds up to ``need`` members
    (the roomiest first, then the fewest free GPUs, then by name), for a preferred gang no single
    domain holds; None when even all of them fall short."""
    room = member_room(snap, pods)
    free = np.where(snap.gpu_exists, snap.gpu_free, 0).sum(axis=1)
    ranked = sorted(
        domains(snap, keys), key=lambda d: (-int(room[d.nodes].sum()), int(free[d.nodes].sum()), d.values)
    )
    chosen: list[I64] = []
    total = 0
    for d in ranked:
        if total >= need:
            break
        chosen.append(d.nodes)
        total += int(room[d.nodes].sum())
    if total < need or not chosen:
        return None
    return np.sort(np.concatenate(chosen))


def bound_nodes(snap: ClusterState, gang: str) -> list[int]:
    """The nodes the gang's members booked in ``snap`` hold (sorted, distinct)."""
    return sorted(
        {
            a.node
            for a in snap.allocations.values()
            if a.pod.gang and f"{a.pod.namespace}/{a.pod.gang}" == gang
        }
    )


def _why(
    snap: ClusterState, request: GangTopology, need: int, tried: int, most: int, anchor: Sequence[int]
) -> str:
    all_ = domains(snap, request.keys)
    head = f"{request.describe()}: no {request.key} domain takes {need} member(s) at once"
    if not all_:
        return f"{head}: no node carries the label {request.key}"
    if anchor:
        head += f" beside the {len(anchor)} node(s) its bound members hold"
    if tried:
        return f"{head} ({len(all_)} domain(s); {tried} had room on paper, at most {most} fit in one)"
    return f"{head} ({len(all_)} domain(s), none has room for {need})"
