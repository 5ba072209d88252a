"""One scheduling cycle, as steps every front end shares, and ``schedule_one`` that runs them.

The steps, in the order of a cycle (``core.framework`` describes the extension points):

- ``pre_filter``: the pod alone; PreFilter plugins precompute into the typed cycle state.
- ``filter_nodes``: a mask over the nodes (all, or the ones asked about) and, when explained,
  the first failing filter's reason per failed node. ``find_feasible`` and ``diagnose`` are
  its two readings; ``fits`` is the what-if on one node (PreFilter and Filter on a fresh state).
- ``most_preferred``, ``score_nodes``, ``select_host``: prefer, score, pick the node.
- ``choose_devices``: which GPUs of the node the pod takes (the heaviest score plugin's device
  choice there, else best fit).
- ``reserve``, ``permit``, ``unreserve``: Reserve (rolled back on failure), Permit (allow,
  reject or wait), and the rollback; ``WaitingPod`` holds a pod a Permit plugin made wait.

Who runs them: the simulator and the standalone controller call ``schedule_one`` (through
``core.statement`` for nominated pods and gangs); preemption's what-if calls ``fits``; the
extender calls ``pre_filter`` and ``filter_nodes`` for ``/filter``, ``score_nodes`` for
``/prioritize`` and ``choose_devices`` for ``/bind`` (kube-scheduler has chosen the node). The
front ends differ only in the snapshot they pass, the tie-break order and what they do with the
result (bind or not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.framework import CycleState, Profile, ReservePlugin
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Diagnosis, NodeFailure, Status

_SCORE_EPS = 1e-9
_REJECT = (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.ERROR)


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


@dataclass(eq=False, slots=True)
class WaitingPod:
    """A pod a Permit plugin made wait (a gang member before its gang is complete): reserved,
    and assumed in ``snap`` when the cycle assumed it. The front end holds it until it calls
    ``allow`` (then binds it) or ``reject`` (which unreserves and forgets it). Both run under
    whatever lock the front end holds ``snap`` with."""

    profile: Profile
    pod: PodSpec
    snap: ClusterState
    node: int
    gpus: tuple[int, ...]
    state: CycleState
    assumed: bool
    status: Status
    """The Permit WAIT status (which plugins wait, and why)."""
    done: bool = field(default=False)

    def allow(self) -> Status:
        """The wait is over: the pod keeps its booking; the front end binds it."""
        if self.done:
            raise RuntimeError(f"waiting pod {self.pod.key} was already allowed or rejected")
        self.done = True
        return Status.success()

    def reject(self, reason: str = "rejected while waiting on Permit") -> Status:
        """Give the booking back: forget the assumption, unreserve (reverse order)."""
        if self.done:
            raise RuntimeError(f"waiting pod {self.pod.key} was already allowed or rejected")
        self.done = True
        if self.assumed:
            self.snap.forget(self.pod.key)
        unreserve(self.state, self.profile, self.pod, self.snap, self.node)
        return Status(Code.UNSCHEDULABLE, (reason,), "Permit")


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
    waiting: WaitingPod | None = None
    """Set when a Permit plugin answered WAIT (``status.code`` is WAIT): the pod is reserved
    (and assumed) on ``node`` but not scheduled until the front end allows it."""

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


def find_feasible(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState) -> I64:
    """Indices of nodes that pass every Filter plugin."""
    return np.flatnonzero(filter_nodes(state, profile, pod, snap).passed).astype(np.int64)


def diagnose(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState) -> Diagnosis:
    """Per-node reasons for a pod that fits nowhere: the first failing filter names each node."""
    failures = filter_nodes(state, profile, pod, snap, explain=True).failures
    return Diagnosis(
        len(snap), tuple(NodeFailure(snap.names[f.position], f.reason, f.code, f.plugin) for f in failures)
    )


def fits(profile: Profile, pod: PodSpec, snap: ClusterState, node: int) -> bool:
    """The what-if of preemption: would ``pod`` pass PreFilter and every Filter on ``node`` of
    ``snap`` as it is now? A fresh cycle state: the snapshot may have changed since the cycle's
    PreFilter ran (victims evicted), so the precomputed state is computed again."""
    state = CycleState()
    if not pre_filter(state, profile, pod, snap).ok:
        return False
    return bool(filter_nodes(state, profile, pod, snap, np.array([node], dtype=np.int64)).passed[0])


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


# ------------------------------------------------------------ Reserve, Permit
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
    """Roll back every Reserve plugin, newest first (after a Permit rejection or a failed bind)."""
    for rp in reversed(profile.reserves):
        rp.unreserve(state, pod, snap, node)


def permit(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState, node: int) -> Status:
    """Run the Permit plugins: the first rejection (UNSCHEDULABLE*, ERROR) is the answer; else
    WAIT when any plugin waits (the plugins named, their reasons joined); else success."""
    waiting: list[Status] = []
    for pm in profile.permits:
        st = pm.permit(state, pod, snap, node)
        if st.code in _REJECT:
            return st if st.plugin else Status(st.code, st.reasons, pm.name)
        if st.code == Code.WAIT:
            waiting.append(st if st.plugin else Status(st.code, st.reasons, pm.name))
    if waiting:
        reasons = tuple(r for w in waiting for r in w.reasons)
        return Status(Code.WAIT, reasons, ",".join(w.plugin for w in waiting))
    return Status.success()


# ------------------------------------------------------------------ the cycle
def schedule_one(
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    *,
    tiebreak: I64 | None = None,
    diagnose_failures: bool = True,
    assume: bool = True,
) -> ScheduleResult:
    """Run one scheduling cycle for ``pod`` against ``snap``.

    On success the pod is assumed in ``snap`` (unless ``assume`` is False) and the result
    names the node and the GPU indices on it. ``tiebreak[n]`` orders nodes of equal score
    (the simulator passes a seeded permutation; Kubernetes front ends pass name order).
    When a Permit plugin waits, the result's status is WAIT and ``waiting`` holds the pod,
    reserved and (with ``assume``) assumed, for the front end to allow or reject.
    """
    state = CycleState()
    st = pre_filter(state, profile, pod, snap)
    if not st.ok:
        return ScheduleResult(pod, st, diagnosis=Diagnosis(len(snap), (), pre_filter=st))
    feasible = find_feasible(state, profile, pod, snap)
    if len(feasible) == 0:
        diag = diagnose(state, profile, pod, snap) if diagnose_failures else None
        msg = diag.message() if diag else f"0/{len(snap)} nodes are available"
        code = Code.UNSCHEDULABLE
        if diag is not None and len(diag.unresolvable_nodes()) == len(snap):
            code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        status = Status(code, (msg,), "Filter")
        for pfp in profile.post_filters:
            r = pfp.post_filter(state, pod, snap, diag)
            if r.status.ok:
                return ScheduleResult(
                    pod, status, diagnosis=diag, nominated_node=r.nominated_node, victims=r.victims
                )
        return ScheduleResult(pod, status, diagnosis=diag)
    candidates = most_preferred(state, profile, pod, snap, feasible)
    total, choice = score_nodes(state, profile, pod, snap, candidates)
    k = select_host(total, candidates, tiebreak)
    node = int(candidates[k])
    gpus = choose_devices(state, profile, pod, snap, node, int(choice[k]) if choice is not None else -1)
    st = reserve(state, profile, pod, snap, node)
    if not st.ok:
        return ScheduleResult(pod, st, feasible_nodes=len(feasible))
    if assume:
        snap.assume(pod, node, gpus)
    st = permit(state, profile, pod, snap, node)
    if st.code in _REJECT:
        if assume:
            snap.forget(pod.key)
        unreserve(state, profile, pod, snap, node)
        return ScheduleResult(pod, st, feasible_nodes=len(feasible))
    name, score = snap.names[node], float(total[k])
    if st.code == Code.WAIT:
        held = WaitingPod(profile, pod, snap, node, gpus, state, assume, st)
        return ScheduleResult(pod, st, node, name, gpus, score, len(feasible), waiting=held)
    return ScheduleResult(pod, Status.success(), node, name, gpus, score, len(feasible))
