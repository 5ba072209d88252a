"""``gpusched bench defrag``: what defragmentation buys under churn, what it buys in the paper
protocol, and what planning costs.

- ``churn_comparison``: the churn protocol (``sim.churn``) per seed without defragmentation and
  with it, per mode and move budget (the budget curve); a ``ChurnReport`` (``to_dict`` for
  ``--json``; ``write_churn_plots`` for the PNGs).
- ``paper_consolidation``: the paper protocol with a one-shot consolidation at 100 % and 130 %
  arrived, against ``default`` without it, moves counted.
- ``planner_cost``: planning time (p50/p99) on fragmented synthetic clusters of the given sizes,
  for pending 2-, 4- and 8-GPU pods that do not fit: the heuristic alone, the exact model alone
  and both (the planner's default); how often the exact model proved its optimum, and the
  heuristic's gap in moves on the instances where both found a plan.

Each takes ``on_progress(done, total)`` for a progress bar and returns plain values or a typed
report; nothing here prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import Rules, WorkBudget, plan_for
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.protocol import tie_ranks
from gpusched.core.scheduler import feasible, schedule_one
from gpusched.sim.churn import ChurnConfig, ChurnReport, ChurnResult, DefragConfig, run_churn
from gpusched.sim.churn_plots import allocation_over_time_plot, budget_curve_plot
from gpusched.sim.paper_consolidate import PaperConsolidation, run_paper_consolidated
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload
from gpusched.sim.workload import Workload

Progress = Callable[[int, int], None]


def sample_nodes(workload: Workload, nodes: int, seed: int = 0) -> Workload:
    """``workload`` on a seeded random sample of ``nodes`` of its nodes (GPU nodes only), with the
    same pods: the churn protocol draws its mix from them and scales the arrival rate to the
    sample's GPUs, so a trace's cluster can be studied at a size a run can afford."""
    gpu_nodes = [n for n in workload.nodes if n.gpu_count]
    if not 0 < nodes <= len(gpu_nodes):
        raise InvalidInput(f"sample of {nodes} nodes: the workload has {len(gpu_nodes)} GPU nodes")
    rng = np.random.default_rng([seed, 0x5A3])
    keep = sorted(int(i) for i in rng.choice(len(gpu_nodes), size=nodes, replace=False))
    label = f"{workload.label} (a sample of {nodes} of its {len(gpu_nodes)} GPU nodes, seed {seed})"
    return Workload([gpu_nodes[i] for i in keep], workload.pods, label)


def churn_runs(modes: Sequence[str], budgets: Sequence[float], seeds: Sequence[int]) -> int:
    """How many runs ``churn_comparison`` makes (for a progress bar's total)."""
    return len(seeds) * (1 + len([m for m in modes if m != "off"]) * len(budgets))


def churn_comparison(
    workload: Workload,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    load: float = 0.9,
    budgets: Sequence[float] = (0.005, 0.01, 0.02),
    modes: Sequence[str] = ("triggered", "periodic"),
    config: ChurnConfig | None = None,
    defrag: DefragConfig | None = None,
    on_progress: Progress | None = None,
) -> ChurnReport:
    """Per seed: the run without defragmentation, then one per mode and move budget (fraction of
    the pods, e.g. 0.02 for 2 %). ``config`` and ``defrag`` give the other settings (their load,
    seed, mode and budget are replaced)."""
    if not seeds:
        raise InvalidInput("churn comparison: give at least one seed")
    bad = [b for b in budgets if not 0 < b <= 1]
    if bad:
        raise InvalidInput(f"churn comparison: move budgets are fractions in (0, 1], got {bad[0]!r}")
    unknown = [m for m in modes if m not in ("triggered", "periodic")]
    if unknown:
        raise InvalidInput(f"churn comparison: mode {unknown[0]!r} is not one of triggered, periodic")
    base_cfg = config or ChurnConfig()
    base_defrag = defrag or DefragConfig()
    tw = TargetWorkload.from_pods([tp.spec for tp in workload.pods])
    total = churn_runs(modes, budgets, seeds)
    results: list[ChurnResult] = []
    done = 0
    for seed in seeds:
        cfg = replace(base_cfg, load=load, seed=seed)
        runs = [replace(base_defrag, mode="off")]
        runs += [replace(base_defrag, mode=m, move_budget=b) for m in modes for b in budgets]
        for d in runs:
            results.append(run_churn(workload.nodes, workload.pods, cfg, d, workload=tw))
            done += 1
            if on_progress:
                on_progress(done, total)
    conf: dict[str, object] = {k: v for k, v in vars(replace(base_cfg, load=load)).items() if k != "seed"}
    conf.update(
        seeds=list(seeds),
        nodes=len(workload.nodes),
        gpus=workload.gpus,
        wait_threshold_s=base_defrag.wait_threshold_s,
        period_s=base_defrag.period_s,
        consolidation_moves=base_defrag.consolidation_moves,
        max_moves_per_plan=base_defrag.max_moves_per_plan,
        restart_penalty_s=base_defrag.restart_penalty_s,
        priority_rule=base_defrag.priority.value,
    )
    return ChurnReport(workload.label, conf, results)


def churn_summary(report: ChurnReport) -> list[dict[str, object]]:
    """Per run label: the means over seeds of the headline figures (the table to print)."""
    out: list[dict[str, object]] = []
    labels = list(dict.fromkeys(r.label for r in report.results))
    for label in labels:
        rs = [r for r in report.results if r.label == label]

        def mean(f: Callable[[ChurnResult], float], rs: list[ChurnResult] = rs) -> float:
            return round(float(np.mean([f(r) for r in rs])), 3)

        row: dict[str, object] = {
            "label": label,
            "seeds": len(rs),
            "mean_alloc_pct": mean(lambda r: r.mean_alloc_pct),
            "saturated_alloc_pct": mean(lambda r: r.saturated_alloc_pct),
            "peak_alloc_pct": mean(lambda r: r.peak_alloc_pct),
            "stranded_idle_gpu_hours": mean(lambda r: r.stranded_idle_gpu_hours),
            "stranded_frag_gpu_hours": mean(lambda r: r.stranded_frag_gpu_hours),
            "moved_pct": mean(lambda r: r.moved_pct),
        }
        for cls in ("share", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs"):
            if all(cls in r.pending for r in rs):
                for q in ("p50_s", "p99_s"):
                    row[f"{cls} {q}"] = round(float(np.mean([r.pending[cls][q] for r in rs])), 1)
        out.append(row)
    return out


def write_churn_plots(report: ChurnReport, out: Path) -> list[str]:
    """``out/churn_budget_curve.png`` and ``out/churn_allocation_seed<first>.png``; their paths
    are recorded in ``report.plots``. ``out`` must exist."""
    paths = [
        budget_curve_plot(report, out / "churn_budget_curve.png"),
        allocation_over_time_plot(
            report, report.results[0].seed, out / f"churn_allocation_seed{report.results[0].seed}.png"
        ),
    ]
    report.plots = [str(p) for p in paths]
    return report.plots


# ---------------------------------------------------------------------------------- paper protocol
def paper_consolidation(
    workload: Workload,
    *,
    seeds: Sequence[int] = (42, 43, 44),
    policy: str = "default",
    max_moves: int = 64,
    targeted: bool = False,
    on_progress: Progress | None = None,
) -> dict[str, object]:
    """The paper protocol with a one-shot consolidation of up to ``max_moves`` moves at 100 % and
    130 % arrived (then the failed pods retried once; with ``targeted``, the moves left planned
    for the failed pods, biggest first), against the same seeds without it."""
    specs = [tp.spec for tp in workload.pods]
    tw = TargetWorkload.from_pods(specs)
    runs: list[PaperConsolidation] = []
    for k, seed in enumerate(seeds):
        runs.append(
            run_paper_consolidated(
                workload.nodes,
                specs,
                seed,
                policy=policy,
                max_moves=max_moves,
                workload=tw,
                targeted=targeted,
            )
        )
        if on_progress:
            on_progress(k + 1, len(seeds))

    def mean(attr: str) -> float:
        return round(float(np.mean([getattr(r, attr) for r in runs])), 2)

    return {
        "workload": workload.label,
        "protocol": "paper + one-shot consolidation" + (" + targeted plans" if targeted else ""),
        "policy": policy,
        "max_moves": max_moves,
        "alloc_at_100_without": mean("alloc_at_100_without"),
        "alloc_at_100": mean("alloc_at_100"),
        "alloc_at_130_without": mean("alloc_at_130_without"),
        "alloc_at_130": mean("alloc_at_130"),
        "moves": {str(c): int(sum(r.moves.get(c, 0) for r in runs)) for c in (100, 130)},
        "targeted_placed": {str(c): int(sum(r.targeted_placed.get(c, 0) for r in runs)) for c in (100, 130)},
        "per_seed": [r.to_dict() for r in runs],
    }


# ------------------------------------------------------------------------------------ planner cost
PENDING_SHAPES = (8, 4, 2)


def fragmented_cluster(
    nodes: int, seed: int, fill: float = 0.9
) -> tuple[ClusterState, list[PodSpec], TargetWorkload]:
    """A synthetic cluster of ``nodes`` nodes fragmented by churn: the default mix at 130 % demand
    placed in order (what fits), then one-GPU pods and shares removed at random (departures: they
    are most of the pods) until ``fill`` of the GPUs is allocated (the churn runs' steady state is
    near 87 %). Returns the books, the pod pool and its target workload."""
    ns, pods = synthetic_workload(SyntheticConfig(nodes=nodes, seed=seed, gpu_demand_pct=130))
    specs = [tp.spec for tp in pods]
    tw = TargetWorkload.from_pods(specs)
    snap = ClusterState(ns)
    profile = make_profile("default", PolicyContext(workload=tw))
    ranks = tie_ranks(ns, seed)
    rng = np.random.default_rng([seed, 0xF7A6])
    for p in specs:
        schedule_one(profile, p, snap, tiebreak=ranks, diagnose_failures=False)
    running = sorted(k for k, a in snap.allocations.items() if a.pod.num_gpu == 1)
    for i in rng.permutation(len(running)):
        if snap.gpu_allocation_ratio() <= fill:
            break
        snap.forget(running[int(i)])
    return snap, specs, tw


def planner_cost(
    sizes: Sequence[int] = (1213, 5000),
    *,
    instances: int = 12,
    seed: int = 0,
    on_progress: Progress | None = None,
) -> dict[str, object]:
    """Planning time on fragmented clusters of each size (see the module doc)."""
    if not sizes or any(n <= 0 for n in sizes) or instances <= 0:
        raise InvalidInput("planner cost: sizes and instances must be positive")
    total = len(sizes) * instances
    done = 0
    out: list[dict[str, object]] = []
    for n in sizes:
        snap, _, tw = fragmented_cluster(n, seed)
        profile = make_profile("default", PolicyContext(workload=tw))
        ranks = tie_ranks(snap.nodes, seed)
        rules = Rules(max_moves=16)
        times: dict[str, list[float]] = {"greedy": [], "exact": [], "both": []}
        found = {"greedy": 0, "exact": 0, "both": 0}
        proven = {"exact": 0, "both": 0}
        gaps: list[int] = []
        ran_both = exact_best = 0
        methods: dict[str, int] = {}
        cases = 0
        k = 0
        while cases < instances and k < instances * 10:
            num = PENDING_SHAPES[k % len(PENDING_SHAPES)]
            pod = PodSpec(
                f"pending-{k}",
                cpu_milli=4000 * num,
                memory_mib=16_384 * num,
                num_gpu=num,
                gpu_milli=GPU_MILLI,
            )
            k += 1
            if len(feasible(profile, pod, snap).indices()):
                continue  # fits as it is: nothing to plan
            cases += 1
            answers = {}
            for name, budget in (
                ("greedy", WorkBudget(exact=False)),
                ("exact", WorkBudget(greedy=False)),
                ("both", WorkBudget()),
            ):
                t0 = time.perf_counter()
                plan = plan_for(profile, snap, pod, rules, budget, tiebreak=ranks)
                times[name].append(time.perf_counter() - t0)
                answers[name] = plan
                if plan.feasible:
                    found[name] += 1
                    if name in proven:
                        proven[name] += int(plan.optimal)
                if name == "both":
                    methods[plan.method.value] = methods.get(plan.method.value, 0) + 1
            b = answers["both"]
            if b.feasible and b.exact_moves is not None and b.greedy_moves is not None:
                ran_both += 1
                exact_best += int(b.optimal)
                gaps.append(b.greedy_moves - min(b.exact_moves, b.greedy_moves))
            done += 1
            if on_progress:
                on_progress(done, total)
        row: dict[str, object] = {"nodes": n, "gpus": int(snap.gpu_count.sum()), "instances": cases}
        row["allocation_pct"] = round(100 * snap.gpu_allocation_ratio(), 2)
        for name, ts in times.items():
            ms = np.array(ts or [0.0]) * 1e3
            row[name] = {
                "p50_ms": round(float(np.percentile(ms, 50)), 1),
                "p99_ms": round(float(np.percentile(ms, 99)), 1),
                "found": found[name],
                **({"proven_optimal": proven[name]} if name in proven else {}),
            }
        row["both_methods"] = methods
        row["exact_ran"] = ran_both
        row["exact_proven_optimal"] = exact_best
        row["heuristic_gap_moves"] = {
            "instances": len(gaps),
            "equal": sum(1 for x in gaps if x == 0),
            "mean": round(float(np.mean(gaps)), 3) if gaps else None,
            "max": max(gaps) if gaps else None,
        }
        out.append(row)
    return {"seed": seed, "rules": {"max_moves": 16}, "sizes": out}
