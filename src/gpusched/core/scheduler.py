"""One scheduling cycle, as steps every front end shares, its two halves, and ``schedule_one``.

The steps, in the order of a cycle (``core.framework`` describes the extension points):

- ``pre_filter``: the pod alone; PreFilter plugins precompute into the typed cycle state.
- ``filter_nodes``: a mask over the nodes (all, or the ones asked about) and, when explained,
  the first failing filter's reason per failed node; ``diagnose`` reads it as a ``Diagnosis``.
- ``most_preferred``, ``score_nodes``, ``select_host``: prefer, score, pick the node.
- ``choose_devices``: which GPUs of the node the pod takes (the heaviest score plugin's device
  choice there, else best fit).

The two halves of a cycle, side-effect free (nothing is booked in the snapshot):

- ``feasible``: a fresh cycle state, PreFilter, Filter (``Feasibility``); ``fits`` is its
  what-if on one node.
- ``pick_host``: among the feasible nodes, prefer, score, select (``best_host``), choose devices
  (``Pick``).

``schedule_one`` is the two halves, the PostFilter plugins when no node passes (preemption), then
Reserve (``reserve``, rolled back on failure; ``unreserve`` for a front end whose bind failed) and
the assumption of the pick in the snapshot.

Who runs them: the simulator and the standalone controller call ``schedule_one`` (through
``core.statement`` for nominated pods and gangs); preemption's what-if and defragmentation's
checks call ``fits``; the extender calls ``feasible`` for ``/filter`` (and ``pick_host`` when it
picks in ``/filter``), ``score_nodes`` for ``/prioritize`` and ``choose_devices`` for ``/bind``
(kube-scheduler has chosen the node); doctor, the defragmentation planner and consolidation call
the halves for their what-ifs. The front ends differ only in the snapshot they pass, the
tie-break order and what they do with the result (bind or not).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.framework import LEAVING, CycleState, Profile, ReservePlugin
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Diagnosis, NodeFailure, Status

_SCORE_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class FilterFailure:
    """Why one node failed: ``position`` among the nodes asked about, the first failing filter."""

    position: int
    reason: str
    code: Code
    plugin: str


@dataclass(frozen=True, slots=True)
class Filtered:
    """The Filter step's answer over the nodes asked about (all of the snapshot's, or ``nodes``)."""

    passed: BoolArr
    failures: tuple[FilterFailure, ...] = ()
    """With ``explain``: one per failed node, in filter order, then node order."""


@dataclass(frozen=True, slots=True, eq=False)
class Reserved:
    """What Reserve took for a placed pod: the profile and cycle state it ran with, so that an undo
    of the placement (a gang given back, a per-model quota refusing after placement) unreserves it
    as a failed bind does (``undo``)."""

    profile: Profile
    state: CycleState


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    pod: PodSpec
    status: Status
    node: int = -1
    node_name: str = ""
    gpus: tuple[int, ...] = ()
    score: float = 0.0
    feasible_nodes: int = 0
    diagnosis: Diagnosis | None = None
    nominated_node: int = -1
    victims: tuple[str, ...] = ()
    reserved: Reserved | None = field(default=None, repr=False, compare=False)
    """Set when Reserve ran for the chosen node (``undo`` gives it back)."""

    @property
    def scheduled(self) -> bool:
        return self.status.ok and self.node >= 0


# ------------------------------------------------------------------ PreFilter, Filter
def pre_filter(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState) -> Status:
    """Run the PreFilter plugins; the first status other than success (or SKIP) is the answer."""
    for pf in profile.pre_filters:
        st = pf.pre_filter(state, pod, snap)
        if not st.ok and st.code != Code.SKIP:
            return st
    return Status.success()


def filter_nodes(
    state: CycleState,
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    nodes: I64 | None = None,
    *,
    explain: bool = False,
) -> Filtered:
    """Which nodes pass every Filter plugin: over every node of ``snap``, or over ``nodes`` in
    that order. With ``explain`` every filter runs and each failed node carries the reason of
    the first filter it fails (``explain`` of that plugin); without, the filters stop as soon as
    no node is left. PreFilter must have run on ``state``."""
    if explain:
        remaining = np.ones(len(snap) if nodes is None else len(nodes), dtype=bool)
        failures: list[FilterFailure] = []
        for f in profile.filters:
            m = f.filter(state, pod, snap, nodes)
            for p in np.flatnonzero(remaining & ~m).tolist():
                reason, code = f.explain(state, pod, snap, p if nodes is None else int(nodes[p]))
                failures.append(FilterFailure(p, reason, code, f.name))
            remaining &= m
        return Filtered(remaining, tuple(failures))
    mask: BoolArr | None = None
    for f in profile.filters:
        m = f.filter(state, pod, snap, nodes)
        if m is snap.everywhere:
            continue  # the filter does not constrain this pod
        mask = m if mask is None else (mask & m)
        if not mask.any():
            break
    if mask is None:
        mask = np.ones(len(snap) if nodes is None else len(nodes), dtype=bool)
    return Filtered(mask)


def diagnose(
    state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
) -> Diagnosis:
    """Per-node reasons for a pod that fits nowhere (among ``nodes``, default every node): the
    first failing filter names each node."""
    failures = filter_nodes(state, profile, pod, snap, nodes, explain=True).failures
    where = range(len(snap)) if nodes is None else nodes.tolist()
    return Diagnosis(
        len(where),
        tuple(NodeFailure(snap.names[where[f.position]], f.reason, f.code, f.plugin) for f in failures),
    )


def fits(
    profile: Profile, pod: PodSpec, snap: ClusterState, node: int, *, leaving: Collection[str] = ()
) -> bool:
    """The what-if of preemption: would ``pod`` pass PreFilter and every Filter on ``node`` of
    ``snap`` as it is now? A fresh cycle state (``feasible``): the snapshot may have changed since
    the cycle's PreFilter ran (victims evicted), so the precomputed state is computed again.
    ``leaving``: the pods the what-if took out of ``snap`` (``LEAVING``: what only they hold outside
    the snapshot, their DRA claims, counts as free)."""
    nodes = np.array([node], dtype=np.int64)
    return bool(feasible(profile, pod, snap, nodes, leaving=frozenset(leaving)).passed[0])


# ------------------------------------------------------------------ Prefer, Score
def most_preferred(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, nodes: I64) -> I64:
    """The nodes of ``nodes`` that the pod's soft constraints rate best (all of them when it has
    none): the weighted sum of the prefer plugins' 0–100 ratings, within a small tolerance."""
    total: np.ndarray | None = None
    for wp in profile.preferences:
        r = wp.plugin.prefer(state, pod, snap, nodes)
        if r is not None:
            total = wp.weight * r if total is None else total + wp.weight * r
    if total is None or len(nodes) <= 1:
        return nodes
    best: I64 = nodes[total >= total.max() - 1e-6]
    return best


def score_nodes(
    state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, nodes: I64
) -> tuple[np.ndarray, I64 | None]:
    """Weighted sum of every score plugin over ``nodes``, and the device choice of the
    heaviest plugin that makes one."""
    total = np.zeros(len(nodes), dtype=np.float64)
    choice: I64 | None = None
    choice_weight = -1.0
    for ws in profile.scores:
        r = ws.plugin.score(state, pod, snap, nodes)
        total += ws.weight * r.scores
        if r.gpu_choice is not None and ws.weight > choice_weight:
            choice, choice_weight = r.gpu_choice, ws.weight
    return total, choice


def select_host(total: np.ndarray, nodes: I64, tiebreak: I64 | None) -> int:
    """Highest score wins; equal scores go to the lowest tie-break rank (or lowest index)."""
    best = total.max()
    tied = np.flatnonzero(total >= best - _SCORE_EPS)
    if len(tied) == 1 or tiebreak is None:
        return int(tied[0])
    return int(tied[np.argmin(tiebreak[nodes[tied]])])


def choose_devices(
    state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, node: int, hint: int | None = None
) -> tuple[int, ...]:
    """The GPUs ``pod`` takes on ``node``: the device choice there of the heaviest score plugin
    that makes one (``hint``, when the caller has scored the node already; otherwise the node is
    scored here for a one-GPU pod, the only kind a choice applies to), else the tightest fit
    (``core.devices.pick_gpus``). Raises ValueError when the pod does not fit there."""
    if hint is None:
        hint = -1
        if pod.num_gpu == 1:
            _, choice = score_nodes(state, profile, pod, snap, np.array([node], dtype=np.int64))
            hint = int(choice[0]) if choice is not None else -1
    return pick_gpus(snap, pod, node, hint)


# ------------------------------------------------------------------ the two halves
@dataclass(frozen=True, slots=True)
class Feasibility:
    """The first half of a cycle (``feasible``): PreFilter's answer and, when it let the pod
    through, the Filter step's over the nodes asked about; ``state`` is the cycle state they
    filled, which the second half (``pick_host``) and the device choice read."""

    state: CycleState
    status: Status
    """PreFilter's answer; when it is not success, no node passes and ``filtered`` explains none."""
    filtered: Filtered
    nodes: I64 | None = None
    """The snapshot indices asked about, in the order of ``filtered`` (None: every node)."""

    @property
    def passed(self) -> BoolArr:
        """Per node asked about: passes PreFilter and every Filter."""
        return self.filtered.passed

    def indices(self) -> I64:
        """The snapshot indices of the nodes that pass (in the order asked; ascending for all)."""
        if self.nodes is None:
            return np.flatnonzero(self.filtered.passed).astype(np.int64)
        return self.nodes[self.filtered.passed]

    def diagnosis(self, snap: ClusterState) -> Diagnosis:
        """The failures as a ``Diagnosis`` over the nodes asked about (``explain`` must have been
        set for Filter's reasons): PreFilter's refusal, or the first failing filter per node."""
        total = len(snap) if self.nodes is None else len(self.nodes)
        if not self.status.ok:
            return Diagnosis(total, (), pre_filter=self.status)
        where = range(len(snap)) if self.nodes is None else self.nodes.tolist()
        failures = self.filtered.failures
        return Diagnosis(
            total,
            tuple(NodeFailure(snap.names[where[f.position]], f.reason, f.code, f.plugin) for f in failures),
        )


def feasible(
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    nodes: I64 | None = None,
    *,
    explain: bool = False,
    leaving: frozenset[str] = frozenset(),
) -> Feasibility:
    """The first half of a cycle, side-effect free: a fresh cycle state, PreFilter, then Filter
    over every node of ``snap`` or over ``nodes`` (``filter_nodes``; ``explain`` as there).
    ``leaving``: see ``fits``."""
    state = CycleState()
    if leaving:
        state.write(LEAVING, leaving)
    st = pre_filter(state, profile, pod, snap)
    if not st.ok:
        return Feasibility(
            state, st, Filtered(np.zeros(len(snap) if nodes is None else len(nodes), dtype=bool)), nodes
        )
    return Feasibility(state, st, filter_nodes(state, profile, pod, snap, nodes, explain=explain), nodes)


@dataclass(frozen=True, slots=True)
class Best:
    """The node the pod's preferences and the scores choose, before its devices are chosen."""

    node: int
    score: float
    gpu_hint: int
    """The device choice there of the heaviest score plugin that makes one (-1: none)."""


def best_host(
    state: CycleState,
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    feasible_nodes: I64,
    *,
    tiebreak: I64 | None = None,
) -> Best:
    """Prefer, score, select among ``feasible_nodes`` (non-empty): ``pick_host`` without the
    device choice, for a front end that chooses the devices later (the extender's ``/filter``
    pick, whose ``/bind`` chooses them)."""
    candidates = most_preferred(state, profile, pod, snap, feasible_nodes)
    total, choice = score_nodes(state, profile, pod, snap, candidates)
    k = select_host(total, candidates, tiebreak)
    return Best(int(candidates[k]), float(total[k]), int(choice[k]) if choice is not None else -1)


@dataclass(frozen=True, slots=True)
class Pick:
    """The second half's answer: the node chosen, the GPUs the pod takes there, its score."""

    node: int
    node_name: str
    gpus: tuple[int, ...]
    score: float
    feasible: int
    """How many nodes it was chosen among (the feasible nodes passed in)."""


def pick_host(
    state: CycleState,
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    feasible_nodes: I64,
    *,
    tiebreak: I64 | None = None,
) -> Pick:
    """The second half of a cycle, side-effect free: among ``feasible_nodes`` (non-empty; the
    snapshot indices ``feasible`` let through, ``state`` its cycle state) prefer, score, select
    the host (``best_host``) and choose its devices. Nothing is booked. Raises ValueError when
    the pod does not fit the chosen node's GPUs (``choose_devices``)."""
    b = best_host(state, profile, pod, snap, feasible_nodes, tiebreak=tiebreak)
    gpus = choose_devices(state, profile, pod, snap, b.node, b.gpu_hint)
    return Pick(b.node, snap.names[b.node], gpus, b.score, len(feasible_nodes))


# ------------------------------------------------------------------ Reserve
def reserve(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, node: int) -> Status:
    """Run the Reserve plugins in order. When one fails, the ones before it are unreserved in
    reverse order and its status is the answer."""
    done: list[ReservePlugin] = []
    for rp in profile.reserves:
        st = rp.reserve(state, pod, snap, node)
        if not st.ok:
            for r in reversed(done):
                r.unreserve(state, pod, snap, node)
            return st if st.plugin else Status(st.code, st.reasons, rp.name)
        done.append(rp)
    return Status.success()


def unreserve(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, node: int) -> None:
    """Roll back every Reserve plugin, newest first (after a failed bind)."""
    for rp in reversed(profile.reserves):
        rp.unreserve(state, pod, snap, node)


def undo(snap: ClusterState, r: ScheduleResult) -> None:
    """Take back a placement ``schedule_one`` made: its Reserve plugins unreserved (the DRA devices
    given back to the front end's ledger), then its booking forgotten when it is in ``snap``."""
    if r.reserved is not None:
        unreserve(r.reserved.state, r.reserved.profile, r.pod, snap, r.node)
    if r.pod.key in snap.allocations:
        snap.forget(r.pod.key)


# ------------------------------------------------------------------ the cycle
def schedule_one(
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    *,
    tiebreak: I64 | None = None,
    diagnose_failures: bool = True,
    assume: bool = True,
    leaving: frozenset[str] = frozenset(),
    nodes: I64 | None = None,
) -> ScheduleResult:
    """Run one scheduling cycle for ``pod`` against ``snap``: ``feasible``, then ``pick_host``
    among the nodes that pass and Reserve there, or the PostFilter plugins when none does.

    On success the pod is assumed in ``snap`` (unless ``assume`` is False) and the result
    names the node and the GPU indices on it. ``tiebreak[n]`` orders nodes of equal score
    (the simulator passes a seeded permutation; Kubernetes front ends pass name order).
    ``nodes``: only these snapshot indices are candidates (a gang kept in one topology domain,
    ``core.gangtopology``); None: every node.
    """
    f = feasible(profile, pod, snap, nodes, leaving=leaving)  # leaving: a what-if's evicted pods (``fits``)
    if not f.status.ok:
        total = len(snap) if nodes is None else len(nodes)
        return ScheduleResult(pod, f.status, diagnosis=Diagnosis(total, (), pre_filter=f.status))
    passed = f.indices()
    if len(passed) == 0:
        return _post_filter(f.state, profile, pod, snap, diagnose_failures, nodes)
    p = pick_host(f.state, profile, pod, snap, passed, tiebreak=tiebreak)
    st = reserve(f.state, profile, pod, snap, p.node)
    if not st.ok:
        return ScheduleResult(pod, st, feasible_nodes=p.feasible)
    if assume:
        snap.assume(pod, p.node, p.gpus)
    return ScheduleResult(
        pod, Status.success(), p.node, p.node_name, p.gpus, p.score, p.feasible,
        reserved=Reserved(profile, f.state),
    )  # fmt: skip


def _post_filter(
    state: CycleState,
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    diagnose_failures: bool,
    nodes: I64 | None = None,
) -> ScheduleResult:
    """No node passes: the diagnosis (when asked for), then the PostFilter plugins in order; the
    first that succeeds names the nominated node and the victims."""
    total = len(snap) if nodes is None else len(nodes)
    diag = diagnose(state, profile, pod, snap, nodes) if diagnose_failures else None
    msg = diag.message() if diag else f"0/{total} nodes are available"
    code = Code.UNSCHEDULABLE
    if diag is not None and len(diag.unresolvable_nodes()) == total:
        code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    status = Status(code, (msg,), "Filter")
    for pfp in profile.post_filters:
        r = pfp.post_filter(state, pod, snap, diag)
        if r.status.ok:
            return ScheduleResult(
                pod, status, diagnosis=diag, nominated_node=r.nominated_node, victims=r.victims
            )
    return ScheduleResult(pod, status, diagnosis=diag)
