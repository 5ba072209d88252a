"""``schedule_one``: the single scheduling cycle every front end shares.

The simulator, the extender and the standalone controller all call this function; only the
snapshot they pass, the tie-break order and what they do with the result (bind or not) differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.framework import CycleState, Profile, ReservePlugin
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Diagnosis, NodeFailure, Status

_SCORE_EPS = 1e-9


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

    @property
    def scheduled(self) -> bool:
        return self.status.ok and self.node >= 0


def find_feasible(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState) -> I64:
    """Indices of nodes that pass every Filter plugin."""
    mask = None
    for f in profile.filters:
        m = f.filter(state, pod, snap)
        if m is snap.everywhere:
            continue  # the filter does not constrain this pod
        mask = m if mask is None else (mask & m)
        if not mask.any():
            break
    if mask is None:
        return np.arange(len(snap), dtype=np.int64)
    return np.flatnonzero(mask).astype(np.int64)


def diagnose(state: CycleState, profile: Profile, pod: PodSpec, snap: ClusterState) -> Diagnosis:
    """Per-node reasons for a pod that fits nowhere: the first failing filter names each node."""
    failures: list[NodeFailure] = []
    remaining = np.ones(len(snap), dtype=bool)
    for f in profile.filters:
        m = f.filter(state, pod, snap)
        failed = np.flatnonzero(remaining & ~m)
        for n in failed:
            reason, code = f.explain(state, pod, snap, int(n))
            failures.append(NodeFailure(snap.names[n], reason, code, f.name))
        remaining &= m
    return Diagnosis(len(snap), tuple(failures))


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
    """
    state = CycleState()
    for pf in profile.pre_filters:
        st = pf.pre_filter(state, pod, snap)
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
    hint = int(choice[k]) if choice is not None else -1
    gpus = pick_gpus(snap, pod, node, hint)
    reserved: list[ReservePlugin] = []
    for rp in profile.reserves:
        st = rp.reserve(state, pod, snap, node)
        if not st.ok:
            for done in reversed(reserved):
                done.unreserve(state, pod, snap, node)
            return ScheduleResult(pod, st, feasible_nodes=len(feasible))
        reserved.append(rp)
    if assume:
        snap.assume(pod, node, gpus)
    for pm in profile.permits:
        st = pm.permit(state, pod, snap, node)
        if st.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.ERROR):
            if assume:
                snap.forget(pod.key)
            for done in reversed(reserved):
                done.unreserve(state, pod, snap, node)
            return ScheduleResult(pod, st, feasible_nodes=len(feasible))
    return ScheduleResult(
        pod,
        Status.success(),
        node=node,
        node_name=snap.names[node],
        gpus=gpus,
        score=float(total[k]),
        feasible_nodes=len(feasible),
    )
