"""Consolidation: up to K moves that most reduce the cluster's fragmentation for the workload.

Fragmentation is FGD's (``core.fragmentation``): per node, the idle GPU milli that the target
workload's task types could not use there, in expectation over their shares. Greedy best
improvement: at each step every candidate pod (a movable single pod — gangs stay put — on a node
with fragmentation, the most fragmented nodes first, at most ``candidates`` of them) is taken
off its node and tried on every node where it passes the filters (its own node included, on
other GPUs); the move with the largest drop in fragmentation (source plus destination) is made
on the books, if it drops by at least ``min_gain_milli``. It stops after ``max_moves`` moves,
when no move gains enough, or when the work budget is spent. Every move is carried out on the
books (a ``Statement``), so each one is checked as it would be done, then everything is undone:
the plan is a proposal and ``snap`` is left as it was.
"""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag.apply import apply_plan
from gpusched.core.defrag.types import Method, Move, Plan, PlanError, Rules, WorkBudget
from gpusched.core.defrag.units import BudgetTally, eligibility
from gpusched.core.devices import pick_gpus
from gpusched.core.fragmentation import TargetWorkload, node_fragmentation, placement_frag
from gpusched.core.framework import Profile
from gpusched.core.model import PodSpec
from gpusched.core.scheduler import feasible
from gpusched.core.statement import Statement


def consolidate(
    profile: Profile,
    snap: ClusterState,
    workload: TargetWorkload,
    max_moves: int,
    rules: Rules | None = None,
    budget: WorkBudget | None = None,
    *,
    candidates: int = 48,
    min_gain_milli: int = 50,
) -> Plan:
    """A consolidation plan of at most ``max_moves`` moves (see the module doc)."""
    rules = rules or Rules()
    budget = budget or WorkBudget()
    for name, v in (("max_moves", max_moves), ("candidates", candidates), ("min_gain_milli", min_gain_milli)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PlanError(f"consolidate: {name} must be a non-negative integer, got {v!r}")
    limit = min(max_moves, rules.max_moves)
    tally = BudgetTally(rules)
    work = 0
    moves: list[Move] = []
    moved: set[str] = set()
    frag = node_fragmentation(snap, workload)
    before = float(frag.sum())
    stop = budget.should_stop
    with Statement(snap) as st:
        while len(moves) < limit and work < budget.max_work and not (stop is not None and stop()):
            el = eligibility(snap, rules, None, moved)
            by_frag = np.argsort(-frag, kind="stable")
            pool: list[str] = []
            for n in by_frag.tolist():
                if frag[n] <= 0 or len(pool) >= candidates:
                    break
                for k in sorted(snap.node_pods[n]):
                    u = el.unit_of.get(k)
                    if u is None or el.units[u].size != 1 or not snap.allocations[k].pod.num_gpu:
                        continue
                    if tally.allows([el.units[u]]):
                        pool.append(k)
            best: tuple[float, str, int, tuple[int, ...]] | None = None
            for k in pool:
                if work >= budget.max_work:
                    break
                work += 1
                a = st.evict(k)
                src_after = float(node_fragmentation(snap, workload, np.array([a.node]))[0])
                passed = feasible(profile, a.pod, snap).indices()
                if len(passed):
                    b, aft = placement_frag(snap, a.pod, passed, workload)
                    frag_now = frag[passed].copy()
                    own = passed == a.node
                    frag_now[own] = b[own]  # the source, with the pod gone
                    delta = aft - b[:, None] + (b - frag_now)[:, None]  # change at the destination
                    delta = delta + (src_after - frag[a.node])  # and at the source
                    i, c = np.unravel_index(int(np.argmin(delta)), delta.shape)
                    gain = -float(delta[i, c])
                    d = int(passed[i])
                    gpus = _gpus_for(snap, a.pod, d, int(c))
                    same = d == a.node and tuple(sorted(gpus)) == a.gpus
                    if gpus and not same and gain >= min_gain_milli and (best is None or gain > best[0]):
                        best = (gain, k, d, gpus)
                st.assume(a.pod, a.node, a.gpus)  # put it back: only the best move is made
            if best is None:
                break
            _, k, d, gpus = best
            a = snap.allocations[k]
            one = Plan(
                (),
                True,
                Method.GREEDY,
                (Move(k, snap.names[a.node], a.gpus, snap.names[d], gpus, a.pod.gpu_demand_milli),),
            )
            why = apply_plan(st, profile, one)
            if why is not None:  # the filters refused what placement_frag allowed: drop this pod
                if k not in snap.allocations:
                    st.assume(a.pod, a.node, a.gpus)
                moved.add(k)
                continue
            tally.charge([el.units[el.unit_of[k]]])
            moves.append(one.moves[0])
            moved.add(k)
            frag[[snap.index[one.moves[0].from_node], d]] = node_fragmentation(
                snap, workload, np.array([snap.index[one.moves[0].from_node], d])
            )
        after = float(node_fragmentation(snap, workload).sum())
        st.discard()
    return Plan(
        (),
        True,
        Method.GREEDY,
        tuple(moves),
        (),
        reason="" if moves else "no move reduces fragmentation enough",
        work=work,
        budgets_used=tally.report(),
        frag_before=before,
        frag_after=after,
    )


def _gpus_for(snap: ClusterState, pod: PodSpec, node: int, column: int) -> tuple[int, ...]:
    """The GPUs of ``placement_frag``'s column: a share's GPU ``column``; whole GPUs best fit."""
    if pod.is_share:
        return (column,)
    try:
        return pick_gpus(snap, pod, node)
    except ValueError:
        return ()
