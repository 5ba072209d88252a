"""What the ``gpusched`` commands show: rich tables and lines on stdout, progress bars and error
lines on stderr, JSON on stdout. The command modules decide what to show; only this module
knows how."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer
from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # the simulator's types, for annotations only: gpusched agent ... loads no simulator
    from gpusched.metrics.check import Report as MetricsCheckReport
    from gpusched.sim.replay import ReplayResult
    from gpusched.sim.report import PackingReport, ReplayReport
    from gpusched.sim.tenants import TenantConfig, TenantResult

out_console = Console()
err_console = Console(stderr=True)


# ------------------------------------------------------------------------------------ plumbing
def error(message: str) -> None:
    """One ``error:`` line on stderr, never wrapped, never read as markup."""
    msg = Text("error: ", style="red")
    msg.append(message)
    err_console.print(msg, soft_wrap=True, highlight=False)


def line(text: str) -> None:
    out_console.print(text)


def note(text: str) -> None:
    """A line on stderr (progress of a long benchmark)."""
    err_console.print(text)


def emit_json(obj: Any) -> None:
    """One JSON object on stdout (indented; numpy values allowed)."""
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


# ------------------------------------------------------------------------------ whole outputs
def packing(report: PackingReport, title: str, json_out: bool, results_file: Path | None = None) -> None:
    """A packing report: one JSON object, or the policy and free-capacity tables (and the files)."""
    if json_out:
        emit_json(report.to_dict())
        return
    out_console.print(packing_table(report, title))
    out_console.print(free_table(report))
    for f in report.plots or []:
        out_console.print(f"plot: {f}", soft_wrap=True)
    if results_file is not None:
        out_console.print(f"results: {results_file}", soft_wrap=True)  # a path to copy: never wrapped


def replay(report: ReplayReport, title: str, json_out: bool) -> None:
    """A replay report: JSON without the time series (they stay in results.json), or two tables."""
    if json_out:
        emit_json(report.to_dict(samples=False))
        return
    out_console.print(replay_table(report.results, title))
    out_console.print(replay_class_table(report.results))
    for f in report.plots:
        out_console.print(f"plot: {f}")


def bench_rows(
    rows: list[dict[str, object]], table: Callable[[Sequence[Mapping[str, object]]], object], json_out: bool
) -> None:
    """Benchmark rows (one per cluster size): ``{"results": rows}`` as JSON, or a table."""
    if json_out:
        emit_json({"results": rows})
    else:
        out_console.print(table(rows))


def traces(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    seeds = report["seeds"]
    t = Table(title=f"allocation % at 100 % / 130 % arrived, seeds {seeds[0]}..{seeds[-1]}")
    trace_rows = report["traces"]
    cols = [k for k in trace_rows[0] if k != "trace"] if trace_rows else []
    t.add_column("trace")
    for c in cols:
        t.add_column(c, justify="right")
    for r in trace_rows:
        t.add_row(r["trace"], *(f"{r[c]:.2f}" if r[c] is not None else "-" for c in cols))
    out_console.print(t)


K8S_KEYS = (
    "pods_per_s",
    "pods_per_s_backlog",
    "extender_p50_ms",
    "extender_p99_ms",
    "extender_p50_ms_serial",
    "extender_p99_ms_serial",
)


def k8s(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    for k in K8S_KEYS:
        out_console.print(f"{k}: {report[k]}")


def reclaim(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    out_console.print(
        f"reclaim: {report['reclaim_s']:.2f} s for {report['claim']} pods of the owner bound "
        f"({report['evicted']} borrowed pods evicted; {report['running']} running on {report['nodes']} nodes "
        f"x {report['gpus_per_node']} GPUs; {report['borrowed_before']} GPUs borrowed before)"
    )
    out_console.print(f"KAI published: {report['kai_s']} s average at 4000 running jobs")


def extender_pick(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    out_console.print(
        f"extender CPU per pod, {report['nodes']} nodes, windows of {report['window']}: /filter picking "
        f"{report['pick_cpu_ms_per_pod']} ms, /filter + /prioritize "
        f"{report['filter_prioritize_cpu_ms_per_pod']} ms (ratio {report['ratio']}); "
        f"picked node among the best scored: {report['same_best']:.0%}"
    )


def watch_cost(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    t = Table(title=f"apiserver and etcd CPU ms per pod lifecycle ({report['pods_per_round']} pods a round)")
    for col in ("extra watchers", "pods/s", "apiserver", "etcd"):
        t.add_column(col, justify="right")
    for r in report["rounds"]:
        t.add_row(
            str(r["watchers"]),
            f"{r['pods_per_s']:.0f}",
            f"{r['apiserver_ms_per_pod']:.3f}",
            f"{r['etcd_ms_per_pod']:.3f}",
        )
    medians = ", ".join(f"{w}: {v}" for w, v in report["apiserver_ms_per_pod_by_watchers"].items())
    slope = report["apiserver_ms_per_pod_per_watcher"]
    t.caption = f"apiserver medians by extra watchers: {medians}; each watcher adds {slope} ms"
    out_console.print(t)


def gang_preemption(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    out_console.print(
        f"gang of {report['size']} x 8 GPUs preempting on {report['nodes']} full nodes: "
        f"{report['victims']} victims (fewest possible {report['minimum_victims']}), "
        f"{report['placed']} members placed; median {report['wall_median_s']} s wall, "
        f"{report['cpu_median_s']} s CPU of {report['repeats']}"
    )


def gangs_k8s(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    for key in ("gangs_round", "plain_round"):
        r = report[key]
        out_console.print(
            f"{r['mode']}: {r['pods_per_s']} pods/s ({r['scheduled']} of {r['pods']} pods "
            f"in {r['seconds']} s; gangs partly bound: {r['partly_bound_gangs']})"
        )
    out_console.print(
        f"gangs/plain: {report['ratio_gangs_to_plain']} ({report['gangs']} gangs of {report['size']} pods, "
        f"{report['nodes']} kwok nodes, policy {report['policy']})"
    )


def dra_bench(report: Mapping[str, Any], tables: Sequence[Any], json_out: bool) -> None:
    """``bench dra``: its tables (``bench.dra.Table``: title, columns, rows), or the report as JSON."""
    if json_out:
        emit_json(report)
        return
    out_console.print(
        f"DRA claims, {report['nodes']} kwok nodes ({report['gpus']} GPUs), seed {report['seed']}: "
        f"{report['command']}"
    )
    for table in tables:
        t = Table(title=table.title, box=box.SIMPLE_HEAVY)
        for i, col in enumerate(table.columns):
            t.add_column(col, justify="left" if i < 2 else "right", no_wrap=i < 2)
        for row in table.rows:
            t.add_row(*row)
        out_console.print(t)
    ratio = report["throughput_ratio_gpusched_to_kube_scheduler"]
    if ratio is not None:
        rounds, rates = report["throughput_rounds"], report["throughput_pods_per_s"]
        out_console.print(
            f"throughput, best of {rounds} each: kube-scheduler {rates['kube-scheduler']} pods/s, "
            f"gpusched {rates['gpusched']} pods/s, ratio gpusched / kube-scheduler {ratio}"
        )


K8S_COMPARE_KEYS = (
    "kube_scheduler_pods_per_s",
    "kube_scheduler_runs_pods_per_s",
    "kube_scheduler_default_pods_per_s",
    "standalone_pods_per_s",
    "standalone_shares_pods_per_s",
    "extender_pods_per_s",
    "kube_scheduler_default_ratio",
    "standalone_ratio",
    "standalone_shares_ratio",
    "extender_ratio",
    "extender_prioritize_pods_per_s",
    "extender_prioritize_ratio",
    "latency_p50_ms",
    "latency_p99_ms",
)


def k8s_compare(report: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
        return
    for k in K8S_COMPARE_KEYS:
        out_console.print(f"{k}: {report[k]}")
    out_console.print(k8s_compare_cpu_table(report))


CPU_PROCESSES = {
    "kube-scheduler": "kube-sched",
    "gpusched": "gpusched",
    "kube-apiserver": "apiserver",
    "etcd": "etcd",
    "kwok": "kwok",
    "kube-controller-manager": "ctrl-mgr",
    "bench": "bench",
    "all": "all",
}
"""Processes of the CPU table, with their column headings."""


def k8s_compare_cpu_table(report: Mapping[str, Any]) -> Table:
    """Each run of ``bench k8s --compare``: its rate and the CPU each process spent per bound pod."""
    t = Table(title="Backlog: pods/s, CPU ms per bound pod by process, busy cores (first binding to last)")
    for col in ("case", "pods/s", *CPU_PROCESSES.values(), "cores"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for c in report.get("cases") or []:
        cpu = c.get("cpu_ms_per_pod") or {}
        cells = [f"{cpu[p]:.2f}" if p in cpu else "-" for p in CPU_PROCESSES]
        cores = c.get("cores_used")
        name = c["case"] if c["run"] == 1 else f"{c['case']} ({c['run']})"
        t.add_row(name, f"{c['pods_per_s']:.1f}", *cells, "-" if cores is None else f"{cores:.2f}")
    return t


def extender_attack(report: dict[str, Any], json_out: bool) -> None:
    if json_out:
        emit_json(report)
    else:
        out_console.print(extender_attack_tables(report))


# ------------------------------------------------------------------------------------- tables
def packing_table(report: PackingReport, title: str) -> Table:
    t = Table(title=title)
    for col in ("policy", "alloc @100%", "alloc @130%", "min..max @100%", "gap to LP @100%", "s/run"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in report.results:
        t.add_row(
            r.policy,
            f"{r.alloc_at_100:.2f}",
            f"{r.alloc_at_130:.2f}",
            f"{r.alloc_at_100_min:.2f}..{r.alloc_at_100_max:.2f}",
            f"{r.gap_to_bound_at_100:.2f}" if r.gap_to_bound_at_100 is not None else "-",
            f"{r.seconds_per_run:.2f}",
        )
    b = report.bound
    if b is not None:
        t.caption = (
            f"ceiling for any scheduler (LP): {b.bound_at_100:.2f} @100%, "
            f"{b.bound_at_130:.2f} @130%; "
            f"ceiling when each pod that fits is placed on arrival: "
            f"{b.arrival_bound_at_100:.2f} @100%, {b.arrival_bound_at_130:.2f} @130%; "
            f"offline best-fit-decreasing: {b.bfd_at_100:.2f} @100%, {b.bfd_at_130:.2f} @130%; "
            f"online without CPU/node limits, best fit: {b.online_bf_at_100:.2f} @100%, "
            f"{b.online_bf_at_130:.2f} @130%; pairing plan: {b.online_plan_at_100:.2f} @100%, "
            f"{b.online_plan_at_130:.2f} @130%"
        )
    return t


def free_table(report: PackingReport, largest: int = 4) -> Table:
    """Per policy: the free GPU capacity at the end of the runs and the GPU contents that hold
    most of it ("810 2.85" = GPUs holding one 810-milli share alone leave 2.85 % of the cluster)."""
    t = Table(title="Free GPU capacity at the end of the run, % of the cluster, by what holds the GPU")
    t.add_column("policy")
    t.add_column("free", justify="right")
    t.add_column("largest: GPU holding → free %")
    for r in report.results:
        total = sum(x.pct for x in r.free_at_end)
        top = [x for x in r.free_at_end if x.holder != "other"][:largest]
        largest_text = " · ".join(f"{x.holder} → {x.pct:.2f}" for x in top)
        t.add_row(r.policy, f"{total:.2f}", largest_text)
    return t


def replay_table(results: Sequence[ReplayResult], title: str) -> Table:
    """One row per policy. Allocation is time-weighted over the arrival window ("arriving")
    and at its peak; the whole-horizon mean (long-lived pods stretch it) is in the JSON."""
    t = Table(title=title)
    cols: list[str] = ["policy", "scheduled", "expired", "timed out", "pending s p50/p90/p99/max"]
    cols += ["alloc % arriving", "peak %"]
    for col in cols:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        waits = (r.pending_p50_s, r.pending_p90_s, r.pending_p99_s, r.pending_max_s)
        pend = "/".join(f"{v:.0f}" for v in waits)
        t.add_row(
            r.policy,
            str(r.scheduled),
            str(r.expired),
            str(r.timed_out),
            pend,
            f"{r.busy_alloc_pct:.2f}",
            f"{r.peak_alloc_pct:.2f}",
        )
    return t


def replay_class_table(results: Sequence[ReplayResult]) -> Table:
    """Pending time by request size: whether big pods wait while small ones flow."""
    t = Table(title="Pending time by request size (scheduled pods; s)")
    for col in ("policy", "request", "pods", "scheduled", "not scheduled", "p50", "p99", "max"):
        t.add_column(col, justify="left" if col in ("policy", "request") else "right")
    for r in results:
        for cls, row in r.by_class.items():
            lost = int(row["expired"] + row["timed_out"] + row["never_scheduled"])
            t.add_row(
                r.policy,
                cls,
                str(int(row["pods"])),
                str(int(row["scheduled"])),
                str(lost),
                f"{row['pending_p50_s']:.0f}",
                f"{row['pending_p99_s']:.0f}",
                f"{row['pending_max_s']:.0f}",
            )
        t.add_section()
    return t


def latency_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="schedule_one latency")
    cols = ("nodes", "gpus", "policy", "decisions", "p50_ms", "p90_ms", "p99_ms", "max_ms", "pods_per_s")
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    return t


def metrics_overhead_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="schedule_one without/with the scheduler's metrics (alternate decisions)")
    heads = ("nodes", "p50 ms", "×", "p99 ms", "×", "CPU µs", "×", "scrape ms")
    for h in heads:
        t.add_column(h, justify="right", no_wrap=True)
    for r in rows:
        cells = [str(r["nodes"])]
        for key, fmt in (("p50_ms", ".3g"), ("p99_ms", ".3g"), ("cpu_us", ".0f")):
            cells += [f"{r[key + '_off']:{fmt}}/{r[key + '_on']:{fmt}}", f"{r[key + '_ratio']:.3f}"]
        t.add_row(*cells, f"{r['scrape_ms']:.0f}")
    return t


def preemption_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="scheduling cycles that preempt")
    cols = ("nodes", "alloc_pct", "preempting", "victims_per_preemption", "p50_ms", "p90_ms", "max_ms")
    heads = ("nodes", "GPU alloc %", "preempting", "victims each", "p50 ms", "p90 ms", "max ms")
    for h in heads:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    return t


def gangs_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    t = Table(title="one gang's decision in the core (all-or-nothing) against its pods one by one")
    heads = ("nodes", "alloc %", "gang", "p50 ms", "p99 ms", "CPU p50", "pods CPU p50", "×", "refused CPU")
    for h in heads:
        t.add_column(h, justify="right")
    for r in rows:
        g, p, ref = r["gang_ms"], r["pods_one_by_one_ms"], r["refused_ms"]
        t.add_row(
            str(r["nodes"]),
            str(r["alloc_pct"]),
            str(r["gang"]),
            str(g["p50_ms"]),
            str(g["p99_ms"]),
            str(g["cpu_p50_ms"]),
            str(p["cpu_p50_ms"]),
            str(r["gang_over_pods_cpu"]),
            f"{ref['cpu_p50_ms']} ({ref['gang']})",
        )
    return t


TENANT_COLUMNS = (
    ("pending_p50_s", "p50 s"),
    ("pending_p99_s", "p99 s"),
    ("gpu_hours", "GPU-h"),
    ("fair_gpu_hours", "fair"),
    ("reclaims_made", "recl."),
    ("pods_reclaimed", "lost"),
    ("quota_violations", "viol."),
    ("partial_gang_idle_gpu_hours", "idle"),
)
TENANT_CAPTION = (
    "p50/p99: pending s (arrival to bind); GPU-h used and the weighted fair share; recl.: reclaims made; "
    "lost: pods reclaimed from it; viol.: cycles over quota + borrowing limit; idle: GPU-h held by "
    "partly bound gangs"
)


def tenants(results: Sequence[TenantResult], title: str, scenario: TenantConfig, json_out: bool) -> None:
    """The multi-tenant replay: every mode's tenants, as JSON or one table (modes side by side)."""
    if json_out:
        emit_json({"title": title, "scenario": scenario.to_dict(), "results": [r.to_dict() for r in results]})
        return
    t = Table(title=title, caption=TENANT_CAPTION, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("tenant", no_wrap=True)
    t.add_column("mode", no_wrap=True)
    for _, head in TENANT_COLUMNS:
        t.add_column(head, justify="right", no_wrap=True)
    for i in range(len(results[0].rows)):
        for r in results:
            row = r.rows[i]
            t.add_row(
                str(row["tenant"]),
                r.mode,
                *(str(row[c]) for c, _ in TENANT_COLUMNS),
                end_section=r is results[-1],
            )
    out_console.print(t)


def extender_attack_tables(report: dict[str, Any]) -> Group:
    """Rich tables: valid filter latency side by side, the attacks' answers, memory."""

    lat = Table(
        title=f"valid /filter, {report['nodes']} nodes "
        f"({'NodeNames' if report['node_cache_capable'] else 'node objects'}, "
        f"{report['valid_body_bytes']} B)"
    )
    lat.add_column("")
    for c in ("count", "p50 ms", "p99 ms", "max ms", "answers"):
        lat.add_column(c, justify="right")
    for phase in ("alone", "under_attack"):
        r = report[phase]
        ans = ", ".join(f"{k}: {v}" for k, v in r["answers"].items())
        lat.add_row(
            phase.replace("_", " "),
            str(r["count"]),
            str(r["p50_ms"]),
            str(r["p99_ms"]),
            str(r["max_ms"]),
            ans,
        )
    att = Table(title=f"attacks (body limit {report['max_body_bytes']} B)")
    att.add_column("kind")
    for c in ("count", "p50 ms", "p99 ms", "answers"):
        att.add_column(c, justify="right")
    for kind, r in report["attacks"].items():
        ans = ", ".join(f"{k}: {v}" for k, v in sorted(r["answers"].items()))
        att.add_row(kind, str(r["count"]), str(r["p50_ms"]), str(r["p99_ms"]), ans)
    mem = Table(title="extender RSS (MB)")
    for k in report["rss_mb"]:
        mem.add_column(k.replace("_", " "), justify="right")
    mem.add_row(*(str(v) for v in report["rss_mb"].values()))
    return Group(lat, att, mem)


# ------------------------------------------------------------------------------ the node agent
# ``gpusched agent ...`` prints plain lines (``typer.echo``: never wrapped, no markup) and the
# standard library's JSON, as it did before it moved here: scripts and hack/gpu-check.sh read them.
def read_json(path: Path) -> Any:
    """A JSON file a command reads (``compare-smi``'s ``discover --json`` output)."""
    return json.loads(path.read_text())


def agent_inventory(inv: Any, readings: Mapping[int, Any], json_out: bool) -> None:
    """``agent discover``: the inventory with each GPU's readings as sorted JSON, or one line per GPU.
    ``inv`` is a ``gpusched.agent.inventory.Inventory``, ``readings`` its ``Readings`` by GPU index
    (not imported here: the front ends' entry points reach this module, and the agent stays
    imported by the CLI's agent commands alone)."""
    if json_out:
        doc = inv.to_json()
        doc["readings"] = {str(i): r.__dict__ for i, r in readings.items()}
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    typer.echo(
        f"{inv.hostname}: driver {inv.driver_version}, CUDA {inv.cuda_driver_version[0]}."
        f"{inv.cuda_driver_version[1]}, {len(inv.devices)} GPU(s)"
    )
    for d in inv.devices:
        mig = f", MIG {[m.profile for m in d.mig_instances]}" if d.mig_enabled else ""
        typer.echo(
            f"  {d.index}: {d.name} {d.memory_mib} MiB {d.uuid} {d.pci_bus_id} "
            f"cc {d.compute_major}.{d.compute_minor} numa {d.numa_node} "
            f"nvlink {list(d.nvlink_peers)}{mig}"
        )


def agent_labels(labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
    """``agent labels``: ``key=value`` lines, the labels sorted, then the annotations."""
    for k in sorted(labels):
        typer.echo(f"{k}={labels[k]}")
    for k, v in annotations.items():
        typer.echo(f"{k}={v}")


def agent_bench(result: Mapping[str, Any]) -> None:
    """``agent bench``: one measurement as indented JSON."""
    typer.echo(json.dumps(result, indent=2))


def agent_smi_differences(diffs: Sequence[str]) -> None:
    """``agent compare-smi``: one line per difference, then the verdict."""
    for d in diffs:
        typer.echo(d)
    typer.echo("agent and nvidia-smi agree" if not diffs else f"{len(diffs)} difference(s)")


# ---------------------------------------------------------------------------------- defragmentation
def agent_mig_reshape(report: Mapping[str, Any]) -> None:
    """``agent mig-reshape``: the plan and each result, as JSON."""
    typer.echo(json.dumps(report, indent=2))


def churn(
    report: Mapping[str, Any], rows: Sequence[Mapping[str, object]], plots: Sequence[str], json_out: bool
) -> None:
    """The churn comparison: the whole report as JSON, or one row per run label (means over seeds)."""
    if json_out:
        emit_json({**report, "summary": list(rows)})
        return
    sizes = [c for c in ("share", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs") if rows and f"{c} p99_s" in rows[0]]
    table = Table(
        title="Defragmentation under churn (means over seeds)",
        caption="share … 8: p99 pending seconds by request size (GPUs)",
    )
    table.add_column("run", ratio=1)
    for col in ("alloc%", "sat.%", "moved%", "idle GPU·h"):
        table.add_column(col, justify="right", no_wrap=True)
    for c in sizes:
        table.add_column(c.split()[0], justify="right", no_wrap=True)
    for r in rows:
        table.add_row(
            str(r["label"]),
            f"{r['mean_alloc_pct']:.2f}",
            f"{r['saturated_alloc_pct']:.2f}",
            f"{r['moved_pct']:.2f}",
            f"{r['stranded_idle_gpu_hours']:.0f}",
            *(f"{r[f'{c} p99_s']:.0f}" for c in sizes),
        )
    out_console.print(table)
    for f in plots:
        out_console.print(f"plot: {f}", soft_wrap=True)


def stacks(report: Mapping[str, Any], json_out: bool) -> None:
    """Stacks × loads: JSON, or one table per load, the sustained loads and the headline."""
    if json_out:
        emit_json(report)
        return
    rows = report["summary"]
    sizes = ("share", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs")
    conf = report["config"]
    for load in sorted({r["load"] for r in rows}):
        table = Table(
            title=f"Stacks at offered load {load:g} ({conf['gpus']} GPUs, seeds {conf['seeds']}, means)",
            caption="work: GPU-hours of pods running / capacity; share..8: pending p50/p99 in minutes by "
            "size (GPUs); OOM: pod-hours at risk, % of pods; queue: stable, or growth in % of capacity/h",
        )
        table.add_column("stack", ratio=1)
        for col in ("work%", "done/h", "never", "OOM h", "OOM%", "queue"):
            table.add_column(col, justify="right", no_wrap=True)
        for c in sizes:
            table.add_column(c.split()[0], justify="right", no_wrap=True)
        for r in (r for r in rows if r["load"] == load):
            cells = []
            for c in sizes:
                p = r["pending"].get(c)
                cells.append(f"{p['p50_s'] / 60:.0f}/{p['p99_s'] / 60:.0f}" if p else "-")
            table.add_row(
                str(r["stack"]),
                f"{r['work_pct']:.1f}",
                f"{r['completed_per_h']:.0f}",
                f"{r['never_ran']:.0f}",
                f"{r['oom_risk_pod_h']:.0f}",
                f"{r['oom_risk_pods_pct']:.1f}",
                "stable" if r["stable"] else f"+{100 * r['backlog_growth']:.1f}",
                *cells,
            )
        out_console.print(table)
    sus = report["sustained_load"]
    out_console.print(
        "largest load sustained (queue stable in every seed): "
        + ", ".join(f"{k} {'<' + str(min(conf['loads'])) if v is None else v}" for k, v in sus.items()),
        soft_wrap=True,
    )
    for key in ("headline", "headline_defrag"):
        if key in report:
            out_console.print(report[key]["sentence"], soft_wrap=True)
    for f in report.get("plots", []):
        out_console.print(f"plot: {f}", soft_wrap=True)


def defrag_planner(report: Mapping[str, Any], json_out: bool) -> None:
    """The planner's cost per cluster size: JSON, or a table."""
    if json_out:
        emit_json(report)
        return
    table = Table(title="Defragmentation planner: time to plan for one pending pod")
    for col in (
        "nodes",
        "plans",
        "heuristic p50/p99 ms",
        "exact p50/p99 ms",
        "both p50/p99 ms",
        "found",
        "proven fewest",
        "heuristic gap",
    ):
        table.add_column(col, justify="right")
    for r in report["sizes"]:
        gap = r["heuristic_gap_moves"]
        table.add_row(
            str(r["nodes"]),
            str(r["instances"]),
            *(f"{r[m]['p50_ms']:.0f} / {r[m]['p99_ms']:.0f}" for m in ("greedy", "exact", "both")),
            f"{r['both']['found']}/{r['instances']}",
            f"{r['both']['proven_optimal']}/{r['instances']}",
            f"{gap['equal']}/{gap['instances']} equal" if gap["instances"] else "-",
        )
    out_console.print(table)


def _held(gpus: list[int], mig: list[dict[str, Any]] | None) -> str:
    """A move's GPUs, or its MIG slices as ``profile@start of GPU g``."""
    if not mig:
        return str(gpus)
    return ", ".join(f"{x['profile']}@{x['start']} of GPU {x['gpu']}" for x in mig)


def defrag_plan(report: Mapping[str, Any], json_out: bool) -> None:
    """``defrag plan``: the whole dry run as JSON, or a table of moves per plan, the gain and the
    PodDisruptionBudgets."""
    if json_out:
        emit_json(report)
        return
    gain = report["gain"]
    plans = report["plans"]
    if not plans:
        out_console.print("No pending GPU pod: nothing to plan for.")
    for p in plans:
        target = ", ".join(p["for"]) or "consolidation"
        if not p["feasible"]:
            out_console.print(f"[yellow]{target}[/]: no plan ({p['method']}): {p['reason']}", soft_wrap=True)
            continue
        ms = p["seconds"] * 1000
        if p["method"] == "fits-now":
            head = f"[bold]{target}[/]: fits now, no move needed, {ms:.0f} ms"
        else:
            proven = "fewest moves proven" if p["optimal"] else "fewest not proven"
            head = f"[bold]{target}[/]: {len(p['moves'])} move(s), {p['method']} ({proven}), {ms:.0f} ms"
        if not p["moves"] and p["reason"]:
            head += f": {p['reason']}"
        out_console.print(head, soft_wrap=True)
        if p["moves"]:
            table = Table(show_edge=False)
            for col in ("#", "pod", "from", "to", "GPUs"):
                table.add_column(col, overflow="fold")
            for i, m in enumerate(p["moves"], 1):
                table.add_row(
                    str(i),
                    m["pod"],
                    f"{m['from_node']} {_held(m['from_gpus'], m.get('from_mig'))}",
                    f"{m['to_node']} {_held(m['to_gpus'], m.get('to_mig'))}",
                    f"{m['gpu_milli'] / 1000:g}",
                )
            out_console.print(table)
        for pl in p["placements"]:
            where = f"GPUs {pl['gpus']}" if not pl.get("mig") else f"MIG {_held([], pl['mig'])}"
            out_console.print(f"  then {pl['pod']} lands on {pl['node']} {where}", soft_wrap=True)
        if p["moves"] and p["reason"]:
            out_console.print(f"  {p['reason']}", soft_wrap=True)
        for k in p.get("kept", []):
            out_console.print(f"  kept in place: {k['pod']}: {k['reason']}", soft_wrap=True)
    out_console.print(
        f"Gain: {gain['pods_landing']} pending pod(s) land ({gain['gpus_landing']:g} GPUs) after "
        f"{report['moves']} move(s); fragmentation {gain['fragmentation_before_gpus']:g} → "
        f"{gain['fragmentation_after_gpus']:g} GPUs",
        soft_wrap=True,
    )
    if report["budgets"]:
        table = Table(title="PodDisruptionBudgets", show_edge=False)
        for col in ("budget", "allowed", "used", "holds in place"):
            table.add_column(col, justify="left" if col == "budget" else "right", overflow="fold")
        for b in report["budgets"]:
            table.add_row(b["budget"], str(b["allowed"]), str(b["used"]), str(b["holds"]))
        out_console.print(table)
    for what, why in report["invalid"].items():
        err_console.print(f"[yellow]unreadable[/] {what}: {why}", soft_wrap=True)


METRICS_OUTCOME_STYLE = {"data": "green", "empty": "yellow", "error": "red"}


def metrics_check(report: MetricsCheckReport, json_out: bool) -> None:
    """``metrics check``: one table per dashboard (and one for the alerts), each expression's outcome
    coloured, then one summary line."""
    if json_out:
        emit_json(report.to_dict())
        return
    groups: dict[str, list[Any]] = {}
    for r in report.results:
        groups.setdefault(r.group, []).append(r)
    for group, rows in groups.items():
        table = Table(title=group, title_justify="left", show_edge=False)
        for col in ("panel" if rows[0].kind == "panel" else "alert", "outcome", "series", "expression"):
            table.add_column(col, justify="right" if col == "series" else "left", overflow="fold")
        for r in rows:
            style = METRICS_OUTCOME_STYLE[r.outcome]
            detail = Text(r.expr)
            if r.error:
                detail.append("\n" + r.error, style="red")
            table.add_row(Text(r.name), Text(r.outcome, style=style), str(r.series), detail)
        out_console.print(table)
    parts = []
    for kind, label in (("panel", "panel queries"), ("alert", "alert expressions")):
        t = report.tally(kind)
        if t.total:
            extra = ", ".join(f"{n} {o}" for o, n in (("empty", t.empty), ("error", t.error)) if n)
            style = "green" if t.data == t.total else ("red" if t.error else "yellow")
            parts.append(
                f"[{style}]{t.data}/{t.total} {label} with data[/]" + (f" ({extra})" if extra else "")
            )
    out_console.print(", ".join(parts) + f" on {escape(report.prometheus)}", soft_wrap=True, highlight=False)


# ------------------------------------------------------------------------------------ bench mig
def mig_bench(
    report: Mapping[str, object],
    rows: Sequence[Mapping[str, object]],
    churn: Sequence[Mapping[str, object]],
    json_out: bool,
) -> None:
    if json_out:
        emit_json({**report, "results": list(rows), "churn": list(churn)})
        return
    t = Table(title=str(report["title"]), box=box.SIMPLE_HEAVY)
    t.add_column("workload", no_wrap=True)
    t.add_column("policy", no_wrap=True)
    for col in ("accepted slices %", "per seed", "accepted requests %", "GPUs used at 50 % arrived",
                "GPUs used at end", "requests", "s/run"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        per_seed = " ".join(f"{v:.2f}" for v in r["accepted_slices_pct_per_seed"])  # type: ignore[attr-defined]
        t.add_row(
            str(r["workload"]), str(r["policy"]), f"{r['accepted_slices_pct']:.2f}", per_seed,
            f"{r['accepted_requests_pct']:.2f}", f"{r['gpus_used_at_half_pct']:.2f} %",
            f"{r['gpus_used_pct']:.2f} %", str(r["requests"]), f"{r['seconds']:.2f}",
        )  # fmt: skip
    t.caption = "\n".join(str(n) for n in report["notes"])  # type: ignore[attr-defined]
    out_console.print(t)
    if churn:
        out_console.print(mig_churn_table(churn))


def _bench_table(
    header: Mapping[str, object], rows: Sequence[Mapping[str, object]], json_out: bool, *labels: str
) -> Table | None:
    """The JSON (header and ``results``) and None with ``json_out``; else the titled table with its
    left-aligned label columns, to be filled."""
    if json_out:
        emit_json({**header, "results": list(rows)})
        return None
    t = Table(title=str(header["title"]), box=box.SIMPLE_HEAVY)
    for label in labels:
        t.add_column(label, no_wrap=True)
    return t


def topology_bench(
    header: Mapping[str, object], rows: Sequence[Mapping[str, object]], json_out: bool
) -> None:
    t = _bench_table(header, rows, json_out, "node shape", "GPU set choice")
    if t is None:
        return
    for col in ("NVLink-complete, 1 NUMA %", "per seed", "2-GPU %", "4-GPU %", "on 1 NUMA node %",
                "multi-GPU pods", "accepted %", "s/run"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        per_seed = " ".join(f"{v:.2f}" for v in r["complete_pct_per_seed"])  # type: ignore[attr-defined]
        by = r["complete_pct_by_size"]
        t.add_row(
            str(r["shape"]), str(r["choice"]), f"{r['complete_pct']:.2f}", per_seed,
            f"{by.get('2', 0.0):.2f}", f"{by.get('4', 0.0):.2f}", f"{r['one_numa_pct']:.2f}",  # type: ignore[attr-defined]
            str(r["multi_placed"]), f"{r['accepted_pct']:.2f}", f"{r['seconds']:.2f}",
        )  # fmt: skip
    t.caption = "After a warm-up of the first 20 % of arrivals; the same pod stream for every choice."
    out_console.print(t)


def gang_topology_bench(
    header: Mapping[str, object], rows: Sequence[Mapping[str, object]], json_out: bool
) -> None:
    t = _bench_table(header, rows, json_out, "gangs ask")
    if t is None:
        return
    for col in ("in 1 clique %", "in 1 rack %", "in 1 block %", "at ideal level %", "per seed",
                "gangs placed %", "units placed %", "GPUs placed %", "s/run"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        per_seed = " ".join(f"{v:.2f}" for v in r["ideal_pct_per_seed"])  # type: ignore[attr-defined]
        t.add_row(
            str(r["choice"]), f"{r['within_clique_pct']:.2f}", f"{r['within_rack_pct']:.2f}",
            f"{r['within_block_pct']:.2f}", f"{r['ideal_pct']:.2f}", per_seed, f"{r['gangs_placed_pct']:.2f}",
            f"{r['placed_pct']:.2f}", f"{r['gpu_placed_pct']:.2f}", f"{r['seconds']:.2f}",
        )  # fmt: skip
    t.caption = (
        "Of the gangs (2+ members) placed after a warm-up of the first 20 % of arrivals; the same stream "
        "for every row. Ideal level: the narrowest whose domains hold the gang's GPUs."
    )
    out_console.print(t)


def mig_churn_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="MIG placement under churn (pending time)", box=box.SIMPLE_HEAVY)
    t.add_column("workload", no_wrap=True)
    t.add_column("policy", no_wrap=True)
    for col in ("load", "placed on arrival %", "pending mean s", "pending p99 s", "p99 per seed",
                "still pending", "slices used %", "GPUs used %", "reshapes/h"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        per_seed = " ".join(f"{v:g}" for v in r["pending_p99_s_per_seed"])  # type: ignore[attr-defined]
        t.add_row(
            str(r["workload"]), str(r["policy"]), f"{r['load']:g}", f"{r['placed_on_arrival_pct']:.2f}",
            f"{r['pending_mean_s']:.1f}", f"{r['pending_p99_s']:.1f}", per_seed, str(r["still_pending"]),
            f"{r['used_slices_pct']:.2f}", f"{r['gpus_used_pct']:.2f}", f"{r['reshapes_per_hour']:g}",
        )  # fmt: skip
    return t
