"""``gpusched bench ...``: placement quality and decision latency."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli import render
from gpusched.cli.common import DEFAULT_JOBS, JobsOpt, JsonOpt, NodesOpt, PodsOpt, parse_seeds, reports_errors
from gpusched.cli.policies import PolicyOpt, check_policies

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: placement quality and decision latency.")


@bench_app.command("packing")
@reports_errors
def bench_packing_cmd(
    nodes: NodesOpt = None,
    pods: PodsOpt = None,
    policy: PolicyOpt = None,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51.")] = "42-51",
    tune: Annotated[float, typer.Option(help="Inflate arrivals to this × GPU capacity.")] = 1.3,
    bounds: Annotated[bool, typer.Option(help="Compute the LP ceiling and offline packing per seed.")] = True,
    jobs: JobsOpt = DEFAULT_JOBS,
    json_out: JsonOpt = False,
) -> None:
    """Policies side by side on one trace (paper protocol), with the packing ceiling."""
    from gpusched.sim.report import packing_experiment
    from gpusched.sim.workload import load_workload

    pols = check_policies(policy)
    seed_list = parse_seeds(seeds)
    wl = load_workload(nodes, pods)
    total = len(pols) * len(seed_list) + (len(seed_list) if bounds else 0)
    with render.progress(total, "bench packing") as tick:
        report = packing_experiment(
            wl, pols, seed_list, tune=tune, jobs=jobs, with_bounds=bounds, on_done=tick
        )
    render.packing(report, f"{wl.label}, seeds {seed_list[0]}..{seed_list[-1]}", json_out)


@bench_app.command("mig")
@reports_errors
def bench_mig_cmd(
    traces: Annotated[
        Path, typer.Option(help="The alibaba-gpu-2023 folder (its csv/ holds openb's node and pod lists).")
    ] = Path("../shared/traces/alibaba-gpu-2023"),
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            metavar="POLICY",
            help="first-fit, packing, best-fit, gpusched, static-balanced, gpusched-reshape (churn only).",
        ),
    ] = None,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-44.")] = "42-44",
    tune: Annotated[float, typer.Option(help="Arrivals up to this x the cluster's memory slices.")] = 1.0,
    churn: Annotated[bool, typer.Option(help="Also arrivals, departures and a queue (pending time).")] = True,
    load: Annotated[float, typer.Option(help="Churn: offered load, x the memory slices.")] = 0.9,
    arrivals: Annotated[int, typer.Option(help="Churn: requests per run.")] = 6000,
    churn_stride: Annotated[int, typer.Option(help="Churn: every n-th MIG node of openb.")] = 16,
    json_out: JsonOpt = False,
) -> None:
    """MIG placement: policies side by side on openb's shares as MIG profiles and an inference-heavy mix,
    on openb's A100/H100-class nodes: arrival-only (accepted %, GPUs used) and under churn (pending p99)."""
    from gpusched.sim.mig_bench import POLICIES, ChurnConfig, mig_report

    seed_list = parse_seeds(seeds)
    pols = policy or list(POLICIES)
    cfg = ChurnConfig(load, arrivals, churn_stride) if churn else None
    with render.progress(2 * len(seed_list) * len(pols) * (2 if churn else 1), "bench mig") as tick:
        report, rows, churn_rows = mig_report(traces, pols, seed_list, tune, cfg, on_done=tick)
    render.mig_bench(report, rows, churn_rows, json_out)


@bench_app.command("dra-score")
@reports_errors
def bench_dra_score_cmd(
    nodes: Annotated[int, typer.Option(help="NVIDIA-shaped nodes of 8 A100 40GB (dynamic MIG).")] = 4,
    pods: Annotated[int, typer.Option(help="Claim pods offered per stream (past saturation).")] = 160,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 0-4.")] = "0-4",
    stream: Annotated[list[str] | None, typer.Option(help="mig (MIG-heavy) and/or mixed.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """DRA allocation in the core: kube-scheduler's first-fit against the scored choice (docs/dra.md)."""
    from gpusched.bench.allocator_score import measure
    from gpusched.bench.allocator_score import render as render_rows

    rows = measure(stream or ["mig", "mixed"], parse_seeds(seeds), nodes, pods)
    typer.echo(render_rows(rows, nodes, json_out))


@bench_app.command("topology")
@reports_errors
def bench_topology_cmd(
    shape: Annotated[
        list[str] | None, typer.Option("--shape", help="Node shapes: pcie-4x2-nvlink, 2-socket-2x4-nvlink.")
    ] = None,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-44.")] = "42-44",
    nodes: Annotated[int, typer.Option(help="8-GPU nodes per shape.")] = 16,
    arrivals: Annotated[int, typer.Option(help="Pods per run (1-, 2-, 4-GPU pods and shares).")] = 4000,
    load: Annotated[float, typer.Option(help="Offered GPU load, x the cluster's GPUs.")] = 0.9,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Node placement policy.")] = "default",
    json_out: JsonOpt = False,
) -> None:
    """GPU topology: the fraction of multi-GPU pods placed on an NVLink-complete, single-NUMA GPU set,
    topology-aware (GPU set only, and GPU set and node) against topology-blind best fit, under churn
    on PCIe-with-NVLink-pairs and 2-socket 8-GPU node shapes."""
    from gpusched.sim.topology_bench import SHAPES, topology_report

    shapes = shape or list(SHAPES)
    seed_list = parse_seeds(seeds)
    check_policies([policy])
    with render.progress(3 * len(shapes) * len(seed_list), "bench topology") as tick:
        header, rows = topology_report(
            shapes, seed_list, nodes=nodes, arrivals=arrivals, load=load, policy=policy, on_done=tick
        )
    render.topology_bench(header, rows, json_out)


@bench_app.command("gang-topology")
@reports_errors
def bench_gang_topology_cmd(
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-44.")] = "42-44",
    blocks: Annotated[int, typer.Option(help="Blocks.")] = 2,
    racks: Annotated[int, typer.Option(help="Racks per block.")] = 2,
    cliques: Annotated[int, typer.Option(help="NVLink cliques per rack.")] = 2,
    nodes: Annotated[int, typer.Option(help="Nodes per clique.")] = 4,
    gpus: Annotated[int, typer.Option(help="GPUs per node.")] = 4,
    arrivals: Annotated[int, typer.Option(help="Units per run (single pods and gangs).")] = 4000,
    load: Annotated[float, typer.Option(help="Offered GPU load, x the cluster's GPUs.")] = 0.85,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Node placement policy.")] = "default",
    json_out: JsonOpt = False,
) -> None:
    """Gang topology domains: the fraction of gangs placed within one clique, rack and block, and at
    their ideal level, topology-aware (preferred, required) against topology-blind, under churn."""
    from gpusched.sim.gang_topology_bench import CHOICES, Shape, gang_topology_report

    seed_list = parse_seeds(seeds)
    check_policies([policy])
    shape = Shape(blocks, racks, cliques, nodes, gpus)
    with render.progress(len(CHOICES) * len(seed_list), "bench gang-topology") as tick:
        header, rows = gang_topology_report(
            seed_list, shape=shape, arrivals=arrivals, load=load, policy=policy, on_done=tick
        )
    render.gang_topology_bench(header, rows, json_out)


@bench_app.command("traces")
@reports_errors
def bench_traces_cmd(
    traces: Annotated[
        Path, typer.Option(help="The alibaba-gpu-2023 folder (csv/ and fgd-expected-results/).")
    ] = Path("../shared/traces/alibaba-gpu-2023"),
    policy: PolicyOpt = None,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51.")] = "42-51",
    all_traces: Annotated[
        bool,
        typer.Option("--all", help="Every pod list in csv/, also those without published results."),
    ] = False,
    jobs: JobsOpt = DEFAULT_JOBS,
    json_out: JsonOpt = False,
) -> None:
    """Every trace family with published FGD results: our policies against the published FGD."""
    from gpusched.bench.published import bench_traces

    pols = check_policies(policy or ["default"])
    seed_list = parse_seeds(seeds)
    with render.progress(None, "bench traces") as tick:
        report = bench_traces(traces, pols, seed_list, jobs=jobs, on_done=tick, all_traces=all_traces)
    render.traces(report, json_out)


@bench_app.command("k8s")
@reports_errors
def bench_k8s_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes.")] = 1000,
    pods: Annotated[int, typer.Option(help="Pods to bind in the standalone run.")] = 3000,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Placement policy.")] = "default",
    concurrency: Annotated[int, typer.Option(help="Concurrent extender clients.")] = 8,
    compare: Annotated[
        bool,
        typer.Option(help="Every scheduler as its own process on one control plane, beside kube-scheduler."),
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            help="With --compare: these cases only (comma-separated): kube-scheduler, "
            "kube-scheduler-default, standalone, standalone-shares, extender; also extender-prioritize "
            "(the extender with --no-pick-in-filter) and extender-asyncio (with --event-loop asyncio), "
            "for a before/after in one run."
        ),
    ] = None,
    warmup: Annotated[int, typer.Option(help="With --compare: warm-up pods (kube-scheduler) first.")] = 500,
    arrival_rate: Annotated[float, typer.Option(help="With --compare: steady arrivals, pods/s.")] = 50.0,
    arrival_pods: Annotated[int, typer.Option(help="With --compare: steady-arrival pods per case.")] = 500,
    profile: Annotated[
        Path | None,
        typer.Option(help="With --compare: py-spy samples each gpusched process into this folder."),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            help="With --compare: every case this many times, kube-scheduler between rounds; each "
            "case reported by its best run (best against best, where one run varies a lot)."
        ),
    ] = 1,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            help="With --compare: LABEL=SRC, gpusched from another source folder (e.g. a worktree "
            "of an earlier commit's src/) beside the current one: standalone@LABEL right after "
            "standalone, extender@LABEL right after extender (where they run); repeatable."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Standalone pods/s through a real kube-apiserver, and extender latency (real control plane).
    With --compare: bound pods/s of kube-scheduler, gpusched scheduler and kube-scheduler + gpusched
    extender, each a process, and their creation-to-binding latency under steady arrivals."""
    if compare:
        from gpusched.bench.k8s_compare import CASES, CompareConfig, bench_compare

        cases = tuple(c.strip() for c in only.split(",") if c.strip()) if only else CASES
        cfg = CompareConfig(nodes=nodes, pods=pods, warmup=warmup, arrival_rate=arrival_rate,
                            arrival_pods=arrival_pods, only=cases, profile_dir=profile,
                            variants=tuple(_variant(v) for v in variant or ()), rounds=rounds)  # fmt: skip
        render.k8s_compare(bench_compare(cfg, on_progress=render.note), json_out)
        return
    from gpusched.bench.k8s import bench_k8s

    check_policies([policy])
    render.k8s(bench_k8s(nodes=nodes, pods=pods, policy=policy, concurrency=concurrency), json_out)


@bench_app.command("reclaim")
@reports_errors
def bench_reclaim_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes; B runs one pod per GPU on all of them.")] = 500,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    claim: Annotated[int, typer.Option(help="Pods A submits (one GPU each; at most its quota, half).")] = 8,
    json_out: JsonOpt = False,
) -> None:
    """Tenant queues' reclaim time on a real control plane (B borrows, A submits, B's borrowed pods
    are evicted, A's bound), beside KAI's published 13.9 s at 4000 running jobs."""
    from gpusched.bench.reclaim import bench_reclaim_fresh

    render.reclaim(bench_reclaim_fresh(nodes, gpus_per_node, claim).as_dict(), json_out)


@bench_app.command("gangs-k8s")
@reports_errors
def bench_gangs_k8s_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes (8 GPUs each).")] = 1000,
    gangs: Annotated[int, typer.Option(help="Gangs (coscheduling PodGroups).")] = 500,
    size: Annotated[int, typer.Option(help="Pods per gang (its minMember).")] = 8,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Placement policy.")] = "default",
    json_out: JsonOpt = False,
) -> None:
    """Gang pods/s through a real kube-apiserver, against the same pods without gangs (real control plane)."""
    from gpusched.bench.gangs_k8s import bench_gangs_k8s

    check_policies([policy])
    render.gangs_k8s(bench_gangs_k8s(nodes=nodes, gangs=gangs, size=size, policy=policy).as_dict(), json_out)


@bench_app.command("dra")
@reports_errors
def bench_dra_cmd(
    nodes: Annotated[
        int, typer.Option(help="kwok nodes, 8 A100 40GB each as NVIDIA's DRA driver publishes them.")
    ] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (1-8).")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the streams.")] = 0,
    only: Annotated[
        str | None,
        typer.Option(
            help="These parts only (comma-separated): mig-heavy, mixed, throughput, gangs, gangs-mig."
        ),
    ] = None,
    throughput_per_gpu: Annotated[
        int, typer.Option(help="Throughput stream: 1g.5gb pods per GPU (1-7).")
    ] = 5,
    throughput_rounds: Annotated[
        int, typer.Option(help="Throughput: kube-scheduler and gpusched alternate this often; best of each.")
    ] = 2,
    gang_size: Annotated[int, typer.Option(help="Pods per whole-GPU gang (its PodGroup's minCount).")] = 4,
    gang_load: Annotated[
        float,
        typer.Option(help="Whole-GPU gang pods, and MIG-pair gangs, per GPU (above 1: devices are tight)."),
    ] = 1.5,
    json_out: JsonOpt = False,
) -> None:
    """DRA claims on one real control plane: kube-scheduler, then gpusched standalone, on the same kwok
    nodes, slices and claim streams: pods placed (at the first refusal, at saturation), pods/s, gangs."""
    from gpusched.bench.dra import PARTS, DraBenchConfig, bench_dra

    parts = tuple(p.strip() for p in only.split(",") if p.strip()) if only else PARTS
    cfg = DraBenchConfig(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        seed=seed,
        parts=parts,
        throughput_per_gpu=throughput_per_gpu,
        throughput_rounds=throughput_rounds,
        gang_size=gang_size,
        gang_load=gang_load,
    )
    cfg.check()
    with render.progress(cfg.steps(), "bench dra") as tick:
        report = bench_dra(cfg, on_progress=tick)
    render.dra_bench(report.as_dict(), report.tables(), json_out)


@bench_app.command("extender-pick")
@reports_errors
def bench_extender_pick_cmd(
    nodes: Annotated[int, typer.Option(help="Synthetic GPU nodes in the extender's books.")] = 1000,
    pods: Annotated[int, typer.Option(help="GPU-share pods sent, each to both modes.")] = 400,
    json_out: JsonOpt = False,
) -> None:
    """The extender's CPU per pod: /filter picking the node against /filter + /prioritize, in
    process, alternating on the same books (kube-scheduler's moving node window)."""
    from gpusched.bench.extender_pick import bench_extender_pick

    render.extender_pick(bench_extender_pick(nodes=nodes, pods=pods).as_dict(), json_out)


@bench_app.command("watch-cost")
@reports_errors
def bench_watch_cost_cmd(
    pods: Annotated[int, typer.Option(help="Pod lifecycles per round.")] = 1500,
    watchers: Annotated[
        str, typer.Option(help="Extra watchers of every pod, per round (comma-separated).")
    ] = "0,1,2",
    rounds: Annotated[int, typer.Option(help="Times through the watcher counts.")] = 2,
    json_out: JsonOpt = False,
) -> None:
    """What one more watcher of every pod (as an extender's informer) costs kube-apiserver per pod
    lifecycle: create, bind, status, delete on a real etcd + apiserver (no scheduler, no kwok)."""
    from gpusched.bench.watch_cost import bench_watch_cost

    try:
        counts = [int(w) for w in watchers.split(",") if w.strip()]
    except ValueError:
        raise typer.BadParameter(f"--watchers: comma-separated counts, got {watchers!r}") from None
    report = bench_watch_cost(pods=pods, watchers=counts, rounds=rounds, on_progress=render.note)
    render.watch_cost(report.as_dict(), json_out)


def _variant(text: str) -> tuple[str, Path]:
    label, sep, src = text.partition("=")
    if not sep or not label or not src:
        raise typer.BadParameter(f"--variant: LABEL=SRC, got {text!r}")
    return label, Path(src)


SizesOpt = Annotated[list[int] | None, typer.Option("--nodes", help="Cluster sizes (repeatable).")]
TimedPolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="Policy to time.")]


def _per_size(
    sizes: list[int] | None,
    steps: int,
    run: Callable[..., dict[str, object]],
    table: Callable[[Sequence[Mapping[str, object]]], object],
    json_out: bool,
) -> None:
    """One benchmark row per cluster size (1213 and 5000 nodes unless given), with a progress
    bar of ``steps`` per size; a table, or one JSON object with a ``results`` list."""
    rows = []
    for n in sizes or [1213, 5000]:
        with render.progress(steps, f"{n} nodes") as tick:
            rows.append(run(n, on_progress=lambda a, b: tick("")))
    render.bench_rows(rows, table, json_out)


@bench_app.command("latency")
@reports_errors
def bench_latency_cmd(
    nodes: SizesOpt = None,
    policy: TimedPolicyOpt = "default",
    decisions: Annotated[int, typer.Option(help="Measured decisions per size.")] = 2000,
    load: Annotated[float, typer.Option(help="GPU allocation to hold the cluster at.")] = 0.7,
    constraints: Annotated[
        bool, typer.Option(help="Zone/hostname labels; pods with topology spread or preferred anti-affinity.")
    ] = False,
    metrics: Annotated[
        bool, typer.Option(help="Record the scheduler's per-decision metrics (timed with the decision).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Per-decision latency of schedule_one on synthetic clusters."""
    from gpusched.bench.latency import bench_latency

    check_policies([policy])
    run = functools.partial(
        bench_latency, policy=policy, decisions=decisions, load=load, constraints=constraints, metrics=metrics
    )
    _per_size(nodes, decisions, run, render.latency_table, json_out)


@bench_app.command("metrics-overhead")
@reports_errors
def bench_metrics_overhead_cmd(
    nodes: SizesOpt = None,
    policy: TimedPolicyOpt = "default",
    decisions: Annotated[int, typer.Option(help="Measured decisions per run.")] = 2000,
    rounds: Annotated[int, typer.Option(help="Runs; half their decisions record metrics, alternating.")] = 4,
    json_out: JsonOpt = False,
) -> None:
    """bench latency with and without the scheduler's metrics, side by side in one run; one scrape's cost."""
    from gpusched.bench.latency import bench_metrics_overhead

    check_policies([policy])
    rows = []
    for n in nodes or [1213, 5000]:
        with render.progress(rounds, f"{n} nodes") as tick:
            rows.append(
                bench_metrics_overhead(
                    n, policy=policy, decisions=decisions, rounds=rounds, on_progress=lambda a, b: tick("")
                )
            )
    render.bench_rows(rows, render.metrics_overhead_table, json_out)


@bench_app.command("preemption")
@reports_errors
def bench_preemption_cmd(
    nodes: SizesOpt = None,
    policy: TimedPolicyOpt = "default",
    preemptors: Annotated[int, typer.Option(help="Measured preempting pods per size.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """Time of a scheduling cycle that must preempt, on full synthetic clusters."""
    from gpusched.bench.preemption import bench_preemption

    check_policies([policy])
    run = functools.partial(bench_preemption, policy=policy, preemptors=preemptors)
    _per_size(nodes, preemptors, run, render.preemption_table, json_out)


@bench_app.command("gangs")
@reports_errors
def bench_gangs_cmd(
    nodes: SizesOpt = None,
    size: Annotated[int, typer.Option(help="Pods in the gang (its minMember).")] = 64,
    gpus: Annotated[int, typer.Option(help="Whole GPUs per pod.")] = 1,
    policy: TimedPolicyOpt = "default",
    decisions: Annotated[int, typer.Option(help="Measured gang decisions per size.")] = 30,
    load: Annotated[float, typer.Option(help="GPU allocation the cluster is filled to first (0..1).")] = 0.5,
    json_out: JsonOpt = False,
) -> None:
    """Decision latency of one gang in the core (all-or-nothing), against its pods one by one."""
    from gpusched.bench.gangs import bench_gangs

    check_policies([policy])
    run = functools.partial(bench_gangs, size=size, gpus=gpus, policy=policy, decisions=decisions, load=load)
    _per_size(nodes or [5000], decisions, run, render.gangs_table, json_out)


@bench_app.command("gang-preemption")
@reports_errors
def bench_gang_preemption_cmd(
    nodes: Annotated[int, typer.Option(help="Nodes of 8 GPUs, every GPU held by a low-priority pod.")] = 5000,
    size: Annotated[int, typer.Option(help="Pods of 8 GPUs in the preempting gang (its minMember).")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed plans (the median is reported).")] = 3,
    json_out: JsonOpt = False,
) -> None:
    """A gang as a preemptor in the core: time to find the fewest victims on a full cluster."""
    from gpusched.bench.gang_preemption import bench_gang_preemption

    render.gang_preemption(bench_gang_preemption(nodes, size, repeats).as_dict(), json_out)


@bench_app.command("tenants")
@reports_errors
def bench_tenants_cmd(
    nodes: NodesOpt = None,
    pods: PodsOpt = None,
    tenants: Annotated[
        str, typer.Option(help="Tenants as name:quota%[:weight], comma-separated (3 or more).")
    ] = "research:50,prod:30,batch:20",
    borrow_pct: Annotated[int, typer.Option(help="Borrowing limit, % of each tenant's quota.")] = 50,
    gang_pct: Annotated[int, typer.Option(help="% of whole-GPU jobs that are gangs.")] = 30,
    max_gang: Annotated[int, typer.Option(help="Largest gang (pods).")] = 8,
    load: Annotated[float, typer.Option(help="Offered GPU load the arrivals are brought to.")] = 4.0,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Placement policy.")] = "bestfit",
    seed: Annotated[int, typer.Option(help="Seed of the tenants, gangs and the synthetic default.")] = 0,
    synthetic_nodes: Annotated[int, typer.Option(help="Nodes of the synthetic default workload.")] = 100,
    synthetic_pods: Annotated[int, typer.Option(help="Pods of the synthetic default workload.")] = 2000,
    max_jobs: Annotated[int, typer.Option(help="Replay the first this many GPU pods only (0: all).")] = 0,
    max_nodes: Annotated[int, typer.Option(help="Replay on the first this many nodes only (0: all).")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Multi-tenant replay: tenant queues (quota, borrowing, reclaim, gangs) against a plain queue."""
    from gpusched.sim.synthetic import SyntheticConfig
    from gpusched.sim.tenants import MODES, TenantConfig, parse_tenants, run_tenants
    from gpusched.sim.workload import load_workload

    check_policies([policy])
    names, shares, weights = parse_tenants(tenants)
    cfg = TenantConfig(
        names,
        shares,
        weights,
        borrow_pct=borrow_pct,
        gang_pct=gang_pct,
        max_gang=max_gang,
        load=load,
        seed=seed,
        policy=policy,
        max_jobs=max_jobs,
        max_nodes=max_nodes,
    )
    wl = load_workload(nodes, pods, SyntheticConfig(nodes=synthetic_nodes, pods=synthetic_pods, seed=seed))
    with render.progress(None, "replaying", quiet=json_out) as tick:
        results = run_tenants(wl.nodes, wl.pods, cfg, MODES, on_progress=lambda m, a, b: tick(m))
    render.tenants(results, f"tenants on {wl.label}", cfg, json_out)


@bench_app.command("extender-attack")
@reports_errors
def bench_extender_attack_cmd(
    nodes: Annotated[int, typer.Option(help="Nodes in the books and in each valid filter.")] = 200,
    requests: Annotated[int, typer.Option(help="Valid filters per phase (at most).")] = 300,
    seconds: Annotated[float, typer.Option(help="Seconds per phase (at most).")] = 30.0,
    node_names: Annotated[
        bool, typer.Option(help="Send NodeNames (nodeCacheCapable true) instead of node objects.")
    ] = False,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="The extender's body limit (default: its own default).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Valid /filter p50/p99 alone and under adversarial requests, and the extender's memory (loopback)."""
    from gpusched.bench.extender_attack import bench_extender_attack

    report = bench_extender_attack(
        nodes=nodes,
        requests=requests,
        seconds=seconds,
        names_only=node_names,
        max_body_bytes=max_body_bytes,
        on_progress=render.note,
    )
    render.extender_attack(report, json_out)


BudgetsOpt = Annotated[
    str, typer.Option(help="Move budgets: the largest fraction of pods moved, comma-separated.")
]


@bench_app.command("defrag")
@reports_errors
def bench_defrag_cmd(
    nodes: NodesOpt = None,
    pods: PodsOpt = None,
    sample: Annotated[
        int | None,
        typer.Option(help="Run the workload's pod mix on this many of its nodes (default: 200; 0: all)."),
    ] = 200,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 0-2.")] = "0-2",
    load: Annotated[float, typer.Option(help="Offered load ρ: GPU demand over GPU capacity.")] = 0.9,
    budgets: BudgetsOpt = "0.005,0.01,0.02",
    modes: Annotated[
        str, typer.Option(help="Defragmentation modes beside 'off': triggered, periodic (comma-separated).")
    ] = "triggered,periodic",
    hours: Annotated[float, typer.Option(help="Simulated hours per run (a quarter of them warm-up).")] = 12.0,
    out: Annotated[Path, typer.Option(help="Folder for the plots.")] = Path("gpusched-out"),
    plots: Annotated[bool, typer.Option(help="Write the budget curve and allocation over time.")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Defragmentation under churn: Poisson arrivals of the trace's pod mix at offered load ρ, each pod
    with a lifetime; with defragmentation off, triggered (a pod waited too long) and periodic, per move
    budget. Allocation, pending time by request size, stranded GPU-hours, pods moved."""
    from gpusched.bench.defrag import (
        churn_comparison,
        churn_runs,
        churn_summary,
        sample_nodes,
        write_churn_plots,
    )
    from gpusched.sim.churn import ChurnConfig
    from gpusched.sim.report import output_folder
    from gpusched.sim.workload import load_workload

    seed_list = parse_seeds(seeds)
    budget_list = _fractions(budgets, "budgets")
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    horizon = int(hours * 3600)
    config = ChurnConfig(horizon_s=horizon, warmup_s=horizon // 4)
    wl = load_workload(nodes, pods)
    if sample:
        wl = sample_nodes(wl, sample)
    with render.progress(churn_runs(mode_list, budget_list, seed_list), "churn runs") as tick:
        report = churn_comparison(
            wl,
            seeds=seed_list,
            load=load,
            budgets=budget_list,
            modes=mode_list,
            config=config,
            on_progress=lambda a, b: tick(""),
        )
    if plots:
        output_folder(out)
        write_churn_plots(report, out)
    render.churn(report.to_dict(samples=False), churn_summary(report), report.plots or [], json_out)


TRACE_CSV = Path("../shared/traces/alibaba-gpu-2023/csv")


@bench_app.command("stacks")
@reports_errors
def bench_stacks_cmd(
    nodes: Annotated[Path, typer.Option(help="Node list CSV (openb format).")] = TRACE_CSV
    / "openb_node_list_gpu_node.csv",
    pods: Annotated[Path, typer.Option(help="Pod list CSV with creation and deletion times.")] = TRACE_CSV
    / "openb_pod_list_default.csv",
    sample: Annotated[
        int, typer.Option(help="Run on a seeded sample of this many of the GPU nodes (0: all).")
    ] = 200,
    stacks: Annotated[str, typer.Option(help="Stacks, comma-separated (default: all).")] = "",
    loads: Annotated[str, typer.Option(help="Offered loads ρ, comma-separated.")] = "0.7,0.9,1.1",
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 0-2.")] = "0-2",
    hours: Annotated[float, typer.Option(help="Simulated hours per run (a quarter of them warm-up).")] = 12.0,
    headline_load: Annotated[
        float, typer.Option(help="The load the headline compares waits at (work: at the highest load).")
    ] = 0.9,
    out: Annotated[Path, typer.Option(help="Folder for the plot and stacks.json.")] = Path("gpusched-out"),
    plots: Annotated[bool, typer.Option(help="Write the work-vs-load plot.")] = True,
    jobs: JobsOpt = DEFAULT_JOBS,
    json_out: JsonOpt = False,
) -> None:
    """What you would run otherwise (stock kube-scheduler + NVIDIA device plugin, time-slicing,
    MostAllocated, HAMi-like, FGD) against gpusched, under churn with the trace's lifetimes: work
    carried, pods completed, pending p50/p99 by size, pods that never ran, OOM risk, sustained load."""
    from gpusched.bench.defrag import sample_nodes
    from gpusched.bench.stacks import stacks_comparison, write_stacks_json, write_stacks_plot
    from gpusched.sim.churn import ChurnConfig
    from gpusched.sim.report import output_folder
    from gpusched.sim.stacks.catalog import STACK_NAMES, stacks_named
    from gpusched.sim.workload import load_workload

    chosen = stacks_named([s.strip() for s in stacks.split(",") if s.strip()] or list(STACK_NAMES))
    load_list = _loads(loads)
    seed_list = parse_seeds(seeds)
    horizon = int(hours * 3600)
    wl = load_workload(nodes, pods)
    if sample:
        wl = sample_nodes(wl, sample)
    config = ChurnConfig(horizon_s=horizon, warmup_s=horizon // 4)
    total = len(chosen) * len(load_list) * len(seed_list)
    with render.progress(total, "stack runs") as tick:
        report = stacks_comparison(
            wl, chosen, loads=load_list, seeds=seed_list, config=config, jobs=jobs, on_done=tick
        )
    output_folder(out)
    if plots:
        write_stacks_plot(report, out)
    result = report.to_dict(headline_load)
    write_stacks_json(result, out)
    render.stacks(result, json_out)


def _loads(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"loads: comma-separated numbers such as 0.7,0.9, got {text!r}") from None
    if not values or any(not 0 < v <= 10 for v in values):
        raise typer.BadParameter(f"loads: each must be in (0, 10], got {text!r}")
    return sorted(set(values))


@bench_app.command("defrag-planner")
@reports_errors
def bench_defrag_planner_cmd(
    nodes: SizesOpt = None,
    instances: Annotated[int, typer.Option(help="Pending pods to plan for, per size.")] = 12,
    json_out: JsonOpt = False,
) -> None:
    """The defragmentation planner's cost: p50/p99 planning time (heuristic, exact, both) on 90 %
    allocated synthetic clusters, how often it proved the fewest moves, the heuristic's gap."""
    from gpusched.bench.defrag import planner_cost

    sizes = nodes or [1213, 5000]
    with render.progress(len(sizes) * instances, "plans") as tick:
        report = planner_cost(sizes, instances=instances, on_progress=lambda a, b: tick(""))
    render.defrag_planner(report, json_out)


def _fractions(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{name}: comma-separated fractions such as 0.005,0.01, got {text!r}"
        ) from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise typer.BadParameter(f"{name}: each must be in (0, 1], got {text!r}")
    return values
