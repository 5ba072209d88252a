"""``gpusched bench packing``: policies side by side on one trace, with the packing ceiling.

For each policy: mean GPU allocation at 100 % and 130 % arrived over the seeds, per seed,
and seconds per run; per seed, the LP ceiling and the offline best-fit-decreasing packing
of the same arrived pods (``bound_at_100``/``bound_at_130``), so every run shows its
distance to optimal; ``arrival_bound_at_*``, the ceiling for a scheduler that places each pod
which fits when it arrives; and two online yardsticks without CPU or node limits
(``online_bf_at_*``, ``online_plan_at_*``). Per policy, ``free_at_end`` tells where the free GPU
capacity sits when the runs end, by what holds the GPU ("810" = one 810-milli share alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpusched.core.model import NodeSpec, PodSpec
from gpusched.sim.experiment import RunSummary, SeedBound, run_many


def _r2(x: float | np.floating) -> float:
    return round(float(x), 2)


TOP_HOLDERS = 8


def free_at_end(runs: Sequence[RunSummary], top: int = TOP_HOLDERS) -> list[dict[str, object]]:
    """Free GPU capacity at the end of the runs by what holds the GPU (``sim.stranded``), as a
    mean % of the cluster over the runs: the ``top`` largest, then the rest as "other"."""
    sums: dict[str, float] = {}
    for r in runs:
        for k, milli in r.free_by_holder.items():
            sums[k] = sums.get(k, 0.0) + 100 * milli / max(r.total_gpu_milli, 1)
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))
    n = max(len(runs), 1)
    out: list[dict[str, object]] = [{"holder": k, "pct": _r2(v / n)} for k, v in ranked[:top]]
    rest = sum(v for _, v in ranked[top:])
    if rest:
        out.append({"holder": "other", "pct": _r2(rest / n)})
    return out


def packing_report(
    runs: Sequence[RunSummary], bounds: Sequence[SeedBound], policies: Sequence[str], seeds: Sequence[int]
) -> dict[str, object]:
    by_seed = {b.seed: b for b in bounds}
    results = []
    for policy in policies:
        rs = sorted((r for r in runs if r.policy == policy), key=lambda r: r.seed)
        per_seed = []
        for r in rs:
            entry: dict[str, object] = {
                "seed": r.seed,
                "alloc_at_100": _r2(r.at(100)),
                "alloc_at_130": _r2(r.at(130)),
                "failed_pods": r.failed,
            }
            b = by_seed.get(r.seed)
            if b is not None:
                entry.update(
                    bound_at_100=_r2(b.lp_at_100),
                    bound_at_130=_r2(b.lp_at_130),
                    bfd_at_100=_r2(b.bfd_at_100),
                    bfd_at_130=_r2(b.bfd_at_130),
                    arrival_bound_at_100=_r2(b.arrival_at_100),
                    arrival_bound_at_130=_r2(b.arrival_at_130),
                    online_bf_at_100=_r2(b.online_at_100),
                    online_bf_at_130=_r2(b.online_at_130),
                    online_plan_at_100=_r2(b.planned_at_100),
                    online_plan_at_130=_r2(b.planned_at_130),
                )
            per_seed.append(entry)
        a100 = np.array([r.at(100) for r in rs], dtype=float)
        a130 = np.array([r.at(130) for r in rs], dtype=float)
        res: dict[str, object] = {
            "policy": policy,
            "alloc_at_100": _r2(np.nanmean(a100)),
            "alloc_at_130": _r2(np.nanmean(a130)),
            "alloc_at_100_min": _r2(np.nanmin(a100)),
            "alloc_at_100_max": _r2(np.nanmax(a100)),
            "per_seed": per_seed,
            "seconds_per_run": round(float(np.mean([r.seconds for r in rs])), 3),
            "free_at_end": free_at_end(rs),
        }
        if bounds:
            lp = float(np.mean([b.lp_at_100 for b in bounds]))
            res["gap_to_bound_at_100"] = _r2(lp - float(np.nanmean(a100)))
        results.append(res)
    out: dict[str, object] = {"seeds": list(seeds), "results": results}
    if bounds:
        out["bound"] = {
            "bound_at_100": _r2(np.mean([b.lp_at_100 for b in bounds])),
            "bound_at_130": _r2(np.mean([b.lp_at_130 for b in bounds])),
            "bfd_at_100": _r2(np.mean([b.bfd_at_100 for b in bounds])),
            "bfd_at_130": _r2(np.mean([b.bfd_at_130 for b in bounds])),
            "arrival_bound_at_100": _r2(np.mean([b.arrival_at_100 for b in bounds])),
            "arrival_bound_at_130": _r2(np.mean([b.arrival_at_130 for b in bounds])),
            "online_bf_at_100": _r2(np.mean([b.online_at_100 for b in bounds])),
            "online_bf_at_130": _r2(np.mean([b.online_at_130 for b in bounds])),
            "online_plan_at_100": _r2(np.mean([b.planned_at_100 for b in bounds])),
            "online_plan_at_130": _r2(np.mean([b.planned_at_130 for b in bounds])),
        }
    return out


def bench_packing(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tune: float = 1.3,
    jobs: int = 1,
    with_bounds: bool = True,
    on_done: Callable[[str], None] | None = None,
) -> tuple[dict[str, object], list[RunSummary], list[SeedBound]]:
    runs, bounds = run_many(
        nodes, pods, policies, seeds, tune=tune, jobs=jobs, with_bounds=with_bounds, on_done=on_done
    )
    return packing_report(runs, bounds, policies, seeds), runs, bounds
