"""``gpusched bench stacks``: the stacks a platform team would otherwise deploy, side by side on
the churn protocol (``sim.stacks``): every stack on the same cluster and the same arrival
stream per load and seed, in one invocation; runs spread over ``jobs`` processes."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.sim.churn import ChurnConfig
from gpusched.sim.stacks.catalog import Stack
from gpusched.sim.stacks.plot import work_vs_load_plot
from gpusched.sim.stacks.report import StacksReport
from gpusched.sim.stacks.run import GROWTH_LIMIT, StackResult, run_stack
from gpusched.sim.workload import Workload

Progress = Callable[[str], None]
LOAD_SCALING = (
    "Poisson arrivals whose rate makes the offered GPU demand x lifetime the load's share of the "
    "cluster's GPUs (inter-arrival times compressed or stretched); sizes and lifetimes drawn "
    "together from trace rows (deleted - created, capped at max_lifetime_s)"
)
_Job = tuple[Stack, float, int]
_shared: dict[str, object] = {}


def _init(workload: Workload, config: ChurnConfig) -> None:
    _shared["workload"] = workload
    _shared["config"] = config
    _shared["tw"] = TargetWorkload.from_pods([tp.spec for tp in workload.pods])


def _one(job: _Job) -> StackResult:
    stack, load, seed = job
    wl = _shared["workload"]
    cfg = _shared["config"]
    tw = _shared["tw"]
    assert isinstance(wl, Workload) and isinstance(cfg, ChurnConfig) and isinstance(tw, TargetWorkload)
    return run_stack(stack, wl.nodes, wl.pods, replace(cfg, load=load, seed=seed), tw)


def stacks_comparison(
    workload: Workload,
    stacks: Sequence[Stack],
    *,
    loads: Sequence[float] = (0.7, 0.9, 1.1),
    seeds: Sequence[int] = (0, 1, 2),
    config: ChurnConfig | None = None,
    jobs: int = 1,
    on_done: Progress | None = None,
) -> StacksReport:
    """Every stack at every load and seed (load and seed of ``config`` replaced)."""
    if not stacks or not loads or not seeds:
        raise InvalidInput("bench stacks: give at least one stack, load and seed")
    cfg = config or ChurnConfig()
    work: list[_Job] = [(s, ld, sd) for ld in loads for sd in seeds for s in stacks]
    results: list[StackResult] = []
    if jobs <= 1:
        _init(workload, cfg)
        it = map(_one, work)
        for r in it:
            results.append(r)
            if on_done:
                on_done(f"{r.stack} load {r.load} seed {r.seed}")
    else:
        with mp.get_context("fork").Pool(jobs, initializer=_init, initargs=(workload, cfg)) as pool:
            for r in pool.imap(_one, work):
                results.append(r)
                if on_done:
                    on_done(f"{r.stack} load {r.load} seed {r.seed}")
    conf: dict[str, object] = {k: v for k, v in vars(cfg).items() if k not in ("seed", "load", "policy")}
    conf.update(
        loads=list(loads),
        seeds=list(seeds),
        nodes=len(workload.nodes),
        gpus=workload.gpus,
        growth_limit=GROWTH_LIMIT,
        load_scaling=LOAD_SCALING,
    )
    order = {s.name: k for k, s in enumerate(stacks)}
    results.sort(key=lambda r: (r.load, order[r.stack], r.seed))
    return StacksReport(workload.label, conf, results, {s.name: s.label for s in stacks})


def write_stacks_json(report: dict[str, object], out: Path) -> Path:
    """``out/stacks.json``: the whole report, per run too. ``out`` must exist."""
    path = out / "stacks.json"
    path.write_text(json.dumps(report, indent=1))
    return path


def write_stacks_plot(report: StacksReport, out: Path) -> list[str]:
    """``out/stacks_work_vs_load.png``, recorded in ``report.plots``. ``out`` must exist."""
    report.plots = [str(work_vs_load_plot(report, out / "stacks_work_vs_load.png"))]
    return report.plots
