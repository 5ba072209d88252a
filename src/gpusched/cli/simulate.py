"""``gpusched simulate``: the trace-driven simulator, paper or replay protocol."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli import render
from gpusched.cli.common import DEFAULT_JOBS, JobsOpt, JsonOpt, NodesOpt, PodsOpt, parse_seeds, reports_errors
from gpusched.cli.policies import PolicyOpt, check_policies
from gpusched.sim.report import ReplayReport, output_folder, packing_experiment, write_results
from gpusched.sim.synthetic import SyntheticConfig
from gpusched.sim.workload import Workload, compress_arrivals, load_workload


@reports_errors
def simulate(
    nodes: NodesOpt = None,
    pods: PodsOpt = None,
    policy: PolicyOpt = None,
    protocol: Annotated[
        str, typer.Option(help="paper (the published experiment) or replay (in time).")
    ] = "paper",
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51.")] = "42-44",
    tune: Annotated[
        float, typer.Option(help="Paper protocol: inflate arrivals to this × GPU capacity.")
    ] = 1.3,
    load_factor: Annotated[float, typer.Option(help="Replay: compress arrivals by this factor.")] = 1.0,
    synthetic_seed: Annotated[int, typer.Option(help="Seed of the synthetic default workload.")] = 0,
    synthetic_nodes: Annotated[int, typer.Option(help="Nodes of the synthetic default workload.")] = 1213,
    synthetic_pods: Annotated[int, typer.Option(help="Pods of the synthetic default workload.")] = 8152,
    out: Annotated[Path, typer.Option(help="Folder for plots and results.json.")] = Path("gpusched-out"),
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    bounds: Annotated[bool, typer.Option(help="Paper protocol: compute the packing ceiling.")] = True,
    snapshot: Annotated[
        Path | None,
        typer.Option(
            help="Also save a snapshot for `gpusched doctor --snapshot` / `gpusched ui`: the end state "
            "of the first policy and seed (paper protocol), with the pods that did not fit."
        ),
    ] = None,
    jobs: JobsOpt = DEFAULT_JOBS,
    json_out: JsonOpt = False,
) -> None:
    """Run the trace-driven simulator (default: the synthetic workload, paper protocol)."""
    pols = check_policies(policy)
    seed_list = parse_seeds(seeds)
    if protocol not in ("paper", "replay"):
        raise typer.BadParameter(f"protocol {protocol!r}: use paper or replay")
    cfg = SyntheticConfig(nodes=synthetic_nodes, pods=synthetic_pods, seed=synthetic_seed)
    wl = load_workload(nodes, pods, cfg)
    output_folder(out)
    if protocol == "paper":
        _paper(wl, pols, seed_list, tune, jobs, out, plots, bounds, json_out)
    else:
        _replay(wl, pols, seed_list[0], load_factor, out, plots, json_out)
    if snapshot is not None:
        from gpusched.doctor.simsnap import save_paper_snapshot

        specs = [tp.spec for tp in wl.pods]
        save_paper_snapshot(snapshot, wl.nodes, specs, pols[0], seed_list[0], tune=tune)


def _paper(
    wl: Workload,
    pols: list[str],
    seeds: list[int],
    tune: float,
    jobs: int,
    out: Path,
    plots: bool,
    bounds: bool,
    json_out: bool,
) -> None:
    from gpusched.sim.plots import paper_plots

    total = len(pols) * len(seeds) + (len(seeds) if bounds else 0)
    with render.progress(total, "simulating") as tick:
        report = packing_experiment(wl, pols, seeds, tune=tune, jobs=jobs, with_bounds=bounds, on_done=tick)
    report.protocol = "paper"
    report.plots = paper_plots(report, out) if plots else []
    written = write_results(report, out)
    title = f"Paper protocol on {wl.label}, seeds {seeds[0]}..{seeds[-1]}"
    render.packing(report, title, json_out, written)


def _replay(
    wl: Workload, pols: list[str], seed: int, load_factor: float, out: Path, plots: bool, json_out: bool
) -> None:
    from gpusched.sim.plots import replay_plots
    from gpusched.sim.replay import run_replay

    pods = compress_arrivals(wl.pods, load_factor)
    results = []
    for pol in pols:
        with render.progress(len(pods), f"replay {pol}") as tick:
            results.append(
                run_replay(
                    wl.nodes, pods, pol, seed=seed, on_event=lambda a, t: tick(""), clock=time.perf_counter
                )
            )
    report = ReplayReport(wl.label, load_factor, results, replay_plots(results, out) if plots else [])
    write_results(report, out)
    render.replay(report, f"Replay of {wl.label} (arrivals ×{load_factor})", json_out)
