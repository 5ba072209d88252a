"""The paper protocol (``sim.paper``) for one seed with a one-shot defragmentation at each
checkpoint: ``core.defrag.consolidate``'s moves, optionally plans of moves for the pods that failed
(``plan_for``), then one retry of every pod that failed so far — what a descheduler buys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpusched.core.defrag import Rules, WorkBudget, apply_plan, consolidate, plan_for
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.protocol import paper_setup
from gpusched.core.scheduler import schedule_one
from gpusched.core.statement import Statement
from gpusched.sim.paper import PaperRun, run_paper


@dataclass
class PaperConsolidation:
    """The paper protocol for one seed with a one-shot consolidation at each checkpoint (arrived
    GPU demand reaching that % of the cluster), against the same seed without it (``run_paper``)."""

    seed: int
    policy: str
    max_moves: int
    alloc_at_100_without: float
    alloc_at_130_without: float
    alloc_at_100: float
    alloc_at_130: float
    moves: dict[int, int]
    """Checkpoint % -> moves made there."""
    placed_after: dict[int, int]
    """Checkpoint % -> pods that had failed before it and were placed right after the moves."""
    frag_drop_milli: dict[int, float]
    pods: int
    targeted_placed: dict[int, int] = field(default_factory=dict)
    """Checkpoint % -> failed pods placed by a plan of moves made for them (``targeted``)."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def run_paper_consolidated(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    seed: int,
    *,
    policy: str = "default",
    tune: float = 1.3,
    checkpoints: Sequence[int] = (100, 130),
    max_moves: int = 64,
    workload: TargetWorkload | None = None,
    work: WorkBudget | None = None,
    targeted: bool = False,
    targeted_attempts: int = 40,
) -> PaperConsolidation:
    """``sim.paper``'s protocol (same pod stream, tie-break and profile as ``run_paper``), with,
    when arrived demand first reaches each checkpoint %, ``core.defrag.consolidate`` (up to
    ``max_moves`` moves, carried out) and then one retry of every pod that failed so far — what a
    descheduler buys. With ``targeted``, what is left of ``max_moves`` then goes to the pods that
    failed, biggest first (at most ``targeted_attempts`` of them): ``plan_for`` finds the fewest
    moves that let each land. Allocation is binned as ``PaperRun.curve`` does; the retries count at
    the checkpoint's arrived demand."""
    tw = workload or TargetWorkload.from_pods(pods)
    base = run_paper(nodes, pods, policy, seed, tune=tune, workload=tw)
    setup = paper_setup(nodes, pods, policy, seed, tune=tune, workload=tw)
    snap, profile, seq, ranks = setup.snap, setup.profile, setup.sequence, setup.ranks
    arrived: list[int] = []
    used: list[int] = []
    acc_arrived = acc_used = 0
    failed: list[PodSpec] = []
    todo = sorted(checkpoints)
    moves: dict[int, int] = {}
    placed_after: dict[int, int] = {}
    frag_drop: dict[int, float] = {}
    targeted_placed: dict[int, int] = {}
    budget = work or WorkBudget(max_work=10_000)
    for pod in seq:
        acc_arrived += pod.gpu_demand_milli
        r = schedule_one(profile, pod, snap, tiebreak=ranks, diagnose_failures=False)
        if r.scheduled:
            acc_used += pod.gpu_demand_milli
        else:
            failed.append(pod)
        arrived.append(acc_arrived)
        used.append(acc_used)
        last = pod is seq[-1]
        while todo and (acc_arrived * 100 >= todo[0] * snap.total_gpu_milli or last):
            c = todo.pop(0)  # the last checkpoint (130 %) is where the stream ends
            plan = consolidate(profile, snap, tw, max_moves, Rules(max_moves=max_moves), budget)
            with Statement(snap) as st:
                if apply_plan(st, profile, plan) is None:
                    st.commit()
                    moves[c] = plan.move_count
                    frag_drop[c] = float((plan.frag_before or 0.0) - (plan.frag_after or 0.0))
                else:
                    moves[c] = 0
                    frag_drop[c] = 0.0
            if targeted:  # the pods that failed, biggest first, each with the fewest moves
                left = max_moves - moves[c]
                for p in sorted(failed, key=lambda p: -p.gpu_demand_milli)[:targeted_attempts]:
                    if left <= 0:
                        break
                    tp = plan_for(profile, snap, p, Rules(max_moves=left), budget, tiebreak=ranks)
                    if not tp.feasible or not tp.moves:
                        continue
                    with Statement(snap) as st:
                        if apply_plan(st, profile, tp, {p.key: p}) is not None:
                            continue
                        st.commit()
                    left -= tp.move_count
                    moves[c] += tp.move_count
                    acc_used += p.gpu_demand_milli
                    arrived.append(acc_arrived)
                    used.append(acc_used)
                    targeted_placed[c] = targeted_placed.get(c, 0) + 1
                failed = [p for p in failed if p.key not in snap.allocations]
            still: list[PodSpec] = []
            n_placed = 0
            for p in failed:
                rr = schedule_one(profile, p, snap, tiebreak=ranks, diagnose_failures=False)
                if rr.scheduled:
                    acc_used += p.gpu_demand_milli
                    n_placed += 1
                    arrived.append(acc_arrived)
                    used.append(acc_used)
                else:
                    still.append(p)
            failed = still
            placed_after[c] = n_placed
    if errs := snap.verify():
        raise AssertionError(f"accounting broken after the consolidated paper run: {errs}")
    run = PaperRun(
        policy=policy,
        seed=seed,
        total_gpu_milli=snap.total_gpu_milli,
        arrived=np.asarray(arrived, dtype=np.int64),
        used=np.asarray(used, dtype=np.int64),
        frag=np.zeros(len(arrived)),
        failed=len(failed),
        pods=len(seq),
    )
    return PaperConsolidation(
        seed=seed,
        policy=policy,
        max_moves=max_moves,
        alloc_at_100_without=base.alloc_at(100),
        alloc_at_130_without=base.alloc_at(130),
        alloc_at_100=run.alloc_at(100),
        alloc_at_130=run.alloc_at(130),
        moves=moves,
        placed_after=placed_after,
        frag_drop_milli=frag_drop,
        pods=len(seq),
        targeted_placed=targeted_placed,
    )
