"""The ``gpusched`` command line: thin wiring of options to the simulator and benchmarks."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpusched.agent.cli import agent_app
from gpusched.core.model import InvalidSpec
from gpusched.core.policies import POLICIES
from gpusched.sim.traces import TraceError
from gpusched.sim.workload import Workload

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GPU scheduling for Kubernetes.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: placement quality and decision latency.")
app.add_typer(bench_app, name="bench")
out_console = Console()
err_console = Console(stderr=True)

DEFAULT_POLICIES = ["default", "fgd", "bestfit"]
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,45,50-51``."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise typer.BadParameter(f"seeds {text!r}: use a list like 42-51 or 42,43,50-51") from None
    if not seeds:
        raise typer.BadParameter("no seeds given")
    return seeds


def check_policies(policies: list[str] | None) -> list[str]:
    chosen = policies or DEFAULT_POLICIES
    bad = [p for p in chosen if p not in POLICIES]
    if bad:
        raise typer.BadParameter(f"unknown policy {', '.join(bad)}; choose from {', '.join(POLICIES)}")
    return chosen


def emit_json(obj: Any) -> None:
    sys.stdout.write(
        orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
    )


@contextmanager
def progress(total: int | None, label: str, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr; yields a callback that advances it by one."""
    if quiet:
        yield lambda _msg: None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
        console=err_console,
        transient=True,
    ) as prog:
        task = prog.add_task(label, total=total, last="")
        yield lambda msg: prog.update(task, advance=1, last=msg)


def run_cli(fn: Callable[[], None]) -> None:
    """Turn expected failures (bad input) into one clear line and exit status 2."""
    try:
        fn()
    except (TraceError, InvalidSpec, ValueError, OSError) as e:
        msg = Text("error: ", style="red")
        msg.append(str(e))
        err_console.print(msg, soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None


NodesOpt = Annotated[Path | None, typer.Option("--nodes", help="Node list CSV (Alibaba openb format).")]
PodsOpt = Annotated[Path | None, typer.Option("--pods", help="Pod list CSV (Alibaba openb format).")]
PolicyOpt = Annotated[
    list[str] | None, typer.Option("--policy", "-p", help=f"Policy: {', '.join(POLICIES)}.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="Parallel processes.")]


@app.command()
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
    jobs: JobsOpt = DEFAULT_JOBS,
    json_out: JsonOpt = False,
) -> None:
    """Run the trace-driven simulator (default: the synthetic workload, paper protocol)."""
    from gpusched.sim.synthetic import SyntheticConfig
    from gpusched.sim.workload import load_workload

    pols = check_policies(policy)
    seed_list = parse_seeds(seeds)
    if protocol not in ("paper", "replay"):
        raise typer.BadParameter(f"protocol {protocol!r}: use paper or replay")

    def go() -> None:
        cfg = SyntheticConfig(nodes=synthetic_nodes, pods=synthetic_pods, seed=synthetic_seed)
        wl = load_workload(nodes, pods, cfg)
        out.mkdir(parents=True, exist_ok=True)
        if protocol == "paper":
            _simulate_paper(wl, pols, seed_list, tune, jobs, out, plots, bounds, json_out)
        else:
            _simulate_replay(wl, pols, seed_list[0], load_factor, out, plots, json_out)

    run_cli(go)


def _simulate_paper(
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
    from gpusched.bench.packing import bench_packing
    from gpusched.sim import plots as P
    from gpusched.sim.report import free_table, packing_table

    specs = [tp.spec for tp in wl.pods]
    total = len(pols) * len(seeds) + (len(seeds) if bounds else 0)
    with progress(total, "simulating") as tick:
        report, runs, bnds = bench_packing(
            wl.nodes, specs, pols, seeds, tune=tune, jobs=jobs, with_bounds=bounds, on_done=tick
        )
    report = {"workload": wl.label, "protocol": "paper", "tune": tune, **report}
    files: list[str] = []
    if plots:
        files = [
            str(P.allocation_plot(runs, out / "allocation.png", bnds)),
            str(P.fragmentation_plot(runs, out / "fragmentation.png")),
            str(P.model_plot(runs, out / "gpu_models.png")),
            str(P.free_plot(report["results"], out / "free_capacity.png")),  # type: ignore[arg-type]
        ]
    report["plots"] = files
    (out / "results.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    if json_out:
        emit_json(report)
        return
    out_console.print(packing_table(report, f"Paper protocol on {wl.label}, seeds {seeds[0]}..{seeds[-1]}"))
    out_console.print(free_table(report))
    for f in files:
        out_console.print(f"plot: {f}")
    out_console.print(f"results: {out / 'results.json'}")


def _simulate_replay(
    wl: Workload, pols: list[str], seed: int, load_factor: float, out: Path, plots: bool, json_out: bool
) -> None:
    import time

    from gpusched.sim import plots as P
    from gpusched.sim.replay import run_replay
    from gpusched.sim.report import replay_class_table, replay_table
    from gpusched.sim.workload import compress_arrivals

    pods = compress_arrivals(wl.pods, load_factor)
    results = []
    for pol in pols:
        with progress(len(pods), f"replay {pol}") as tick:
            results.append(
                run_replay(
                    wl.nodes, pods, pol, seed=seed, on_event=lambda a, t: tick(""), clock=time.perf_counter
                )
            )
    files = [str(P.replay_plot(results, out / "replay.png"))] if plots else []
    rows = [r.to_dict() for r in results]
    report = {
        "workload": wl.label,
        "protocol": "replay",
        "load_factor": load_factor,
        "results": rows,
        "plots": files,
    }
    (out / "results.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    if json_out:  # the time series stay in results.json
        emit_json({**report, "results": [{k: v for k, v in r.items() if k != "samples"} for r in rows]})
        return
    out_console.print(replay_table(results, f"Replay of {wl.label} (arrivals ×{load_factor})"))
    out_console.print(replay_class_table(results))
    for f in files:
        out_console.print(f"plot: {f}")


@bench_app.command("packing")
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
    from gpusched.bench.packing import bench_packing
    from gpusched.sim.report import free_table, packing_table
    from gpusched.sim.workload import load_workload

    pols = check_policies(policy)
    seed_list = parse_seeds(seeds)

    def go() -> None:
        wl = load_workload(nodes, pods)
        specs = [tp.spec for tp in wl.pods]
        total = len(pols) * len(seed_list) + (len(seed_list) if bounds else 0)
        with progress(total, "bench packing") as tick:
            report, _, _ = bench_packing(
                wl.nodes, specs, pols, seed_list, tune=tune, jobs=jobs, with_bounds=bounds, on_done=tick
            )
        report = {"workload": wl.label, "tune": tune, **report}
        if json_out:
            emit_json(report)
        else:
            out_console.print(packing_table(report, f"{wl.label}, seeds {seed_list[0]}..{seed_list[-1]}"))
            out_console.print(free_table(report))

    run_cli(go)


@bench_app.command("traces")
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
    from rich.table import Table

    from gpusched.bench.published import bench_traces

    pols = check_policies(policy or ["default"])
    seed_list = parse_seeds(seeds)

    def go() -> None:
        with progress(None, "bench traces") as tick:
            report = bench_traces(traces, pols, seed_list, jobs=jobs, on_done=tick, all_traces=all_traces)
        if json_out:
            emit_json(report)
            return
        t = Table(title=f"allocation % at 100 % / 130 % arrived, seeds {seed_list[0]}..{seed_list[-1]}")
        rows = report["traces"]
        assert isinstance(rows, list)
        cols = [k for k in rows[0] if k != "trace"] if rows else []
        t.add_column("trace")
        for c in cols:
            t.add_column(c, justify="right")
        for r in rows:
            t.add_row(r["trace"], *(f"{r[c]:.2f}" if r[c] is not None else "-" for c in cols))
        out_console.print(t)

    run_cli(go)


@bench_app.command("k8s")
def bench_k8s_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes.")] = 1000,
    pods: Annotated[int, typer.Option(help="Pods to bind in the standalone run.")] = 3000,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Placement policy.")] = "default",
    concurrency: Annotated[int, typer.Option(help="Concurrent extender clients.")] = 8,
    json_out: JsonOpt = False,
) -> None:
    """Standalone pods/s through a real kube-apiserver, and extender latency (real control plane)."""
    from gpusched.bench.k8s import bench_k8s
    from gpusched.testenv import ControlPlaneError

    check_policies([policy])

    def go() -> None:
        try:
            report = bench_k8s(nodes=nodes, pods=pods, policy=policy, concurrency=concurrency)
        except ControlPlaneError as e:
            raise ValueError(str(e)) from None
        if json_out:
            emit_json(report)
        else:
            keys = (
                "pods_per_s",
                "pods_per_s_backlog",
                "extender_p50_ms",
                "extender_p99_ms",
                "extender_p50_ms_serial",
                "extender_p99_ms_serial",
            )
            for k in keys:
                out_console.print(f"{k}: {report[k]}")

    run_cli(go)


SizesOpt = Annotated[list[int] | None, typer.Option("--nodes", help="Cluster sizes (repeatable).")]
TimedPolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="Policy to time.")]


def _per_size(
    sizes: list[int] | None,
    steps: int,
    run: Callable[..., dict[str, object]],
    table: Callable[[list[dict[str, object]]], object],
    json_out: bool,
) -> None:
    """One benchmark row per cluster size (1213 and 5000 nodes unless given), with a progress
    bar of ``steps`` per size; a table, or one JSON object with a ``results`` list."""

    def go() -> None:
        rows = []
        for n in sizes or [1213, 5000]:
            with progress(steps, f"{n} nodes") as tick:
                rows.append(run(n, on_progress=lambda a, b: tick("")))
        if json_out:
            emit_json({"results": rows})
        else:
            out_console.print(table(rows))

    run_cli(go)


@bench_app.command("latency")
def bench_latency_cmd(
    nodes: SizesOpt = None,
    policy: TimedPolicyOpt = "default",
    decisions: Annotated[int, typer.Option(help="Measured decisions per size.")] = 2000,
    load: Annotated[float, typer.Option(help="GPU allocation to hold the cluster at.")] = 0.7,
    constraints: Annotated[
        bool, typer.Option(help="Zone/hostname labels; pods with topology spread or preferred anti-affinity.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Per-decision latency of schedule_one on synthetic clusters."""
    from gpusched.bench.latency import bench_latency
    from gpusched.sim.report import latency_table

    check_policies([policy])
    run = functools.partial(
        bench_latency, policy=policy, decisions=decisions, load=load, constraints=constraints
    )
    _per_size(nodes, decisions, run, latency_table, json_out)


@bench_app.command("preemption")
def bench_preemption_cmd(
    nodes: SizesOpt = None,
    policy: TimedPolicyOpt = "default",
    preemptors: Annotated[int, typer.Option(help="Measured preempting pods per size.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """Time of a scheduling cycle that must preempt, on full synthetic clusters."""
    from gpusched.bench.preemption import bench_preemption
    from gpusched.sim.report import preemption_table

    check_policies([policy])
    run = functools.partial(bench_preemption, policy=policy, preemptors=preemptors)
    _per_size(nodes, preemptors, run, preemption_table, json_out)


@bench_app.command("extender-attack")
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
    from gpusched.bench.extender_attack import bench_extender_attack, report_table

    def go() -> None:
        report = bench_extender_attack(
            nodes=nodes,
            requests=requests,
            seconds=seconds,
            names_only=node_names,
            max_body_bytes=max_body_bytes,
            on_progress=lambda msg: err_console.print(msg),
        )
        if json_out:
            emit_json(report)
        else:
            out_console.print(report_table(report))

    run_cli(go)


def _register_scheduler() -> None:
    from gpusched.k8s.cli_scheduler import scheduler_command

    app.command("scheduler")(scheduler_command)


_register_scheduler()


@app.command()
def extender(
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig (default: $KUBECONFIG, else in-cluster).")
    ] = None,
    port: Annotated[
        int, typer.Option(help="Port for /filter, /prioritize, /bind, /preempt, /metrics.")
    ] = 8888,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Placement policy.")] = "default",
    tls_cert: Annotated[str | None, typer.Option(help="Serve HTTPS with this certificate (PEM).")] = None,
    tls_key: Annotated[str | None, typer.Option(help="Key of --tls-cert (PEM).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    bind_threads: Annotated[int, typer.Option(help="Concurrent binding API calls.")] = 32,
    log_level: Annotated[str, typer.Option(help="debug, info, warning.")] = "info",
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body, HTTP 413 above (nodeCacheCapable false: all nodes).")
    ] = 32 * 1024 * 1024,
    sync_wait_seconds: Annotated[
        float, typer.Option(help="How long a verb waits for the informers to sync before refusing.")
    ] = 2.0,
) -> None:
    """Serve the kube-scheduler extender (see deploy/extender/scheduler-config.yaml)."""
    from gpusched.extender.cli_extender import extender_command

    check_policies([policy])
    run_cli(
        lambda: extender_command(
            kubeconfig,
            port,
            policy,
            tls_cert,
            tls_key,
            host,
            bind_threads,
            log_level,
            max_body_bytes=max_body_bytes,
            sync_wait_s=sync_wait_seconds,
        )
    )


testenv_app = typer.Typer(no_args_is_help=True, help="A throw-away real control plane with kwok GPU nodes.")
app.add_typer(testenv_app, name="testenv")
app.add_typer(agent_app, name="agent")


@testenv_app.command("up")
def testenv_up_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes to create.")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    with_scheduler: Annotated[bool, typer.Option(help="Also run kube-scheduler (default profile).")] = False,
    state_dir: Annotated[Path | None, typer.Option(help="Where the state and logs go.")] = None,
) -> None:
    """Start etcd, kube-apiserver and kwok in the background (built by hack/build-control-plane.sh)."""
    from gpusched.testenv import ControlPlaneError, session

    def go() -> None:
        try:
            session.testenv_up(
                state_dir or session.DEFAULT_STATE_DIR, nodes, gpus_per_node, with_scheduler
            )
        except (session.TestEnvError, ControlPlaneError) as e:
            raise ValueError(str(e)) from None

    run_cli(go)


@testenv_app.command("down")
def testenv_down_cmd(
    state_dir: Annotated[Path | None, typer.Option(help="The state folder given to 'up'.")] = None,
) -> None:
    """Stop the background control plane and remove its state."""
    from gpusched.testenv import session

    def go() -> None:
        try:
            session.testenv_down(state_dir or session.DEFAULT_STATE_DIR)
        except session.TestEnvError as e:
            raise ValueError(str(e)) from None

    run_cli(go)


@app.command()
def policies() -> None:
    """List the placement policies."""
    for p in POLICIES:
        out_console.print(p)


@app.command("check-trace")
def check_trace(
    pods: Annotated[list[Path], typer.Argument(help="Pod list CSV files to validate.")],
    nodes: NodesOpt = None,
) -> None:
    """Validate trace files: every row is read and checked; the first bad one is named."""
    from gpusched.sim.traces import read_nodes, read_pods

    def go() -> None:
        if nodes is not None:
            out_console.print(f"{nodes}: {len(read_nodes(nodes))} nodes ok")
        for p in pods:
            out_console.print(f"{p}: {len(read_pods(p))} pods ok")

    run_cli(go)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
