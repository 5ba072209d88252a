"""``gpusched doctor pod|node|cluster|snapshot|bench``: why a pod is pending, what would make it
fit, and where the GPUs went (``gpusched.doctor``); also ``kubectl gpusched doctor ...`` through
the ``kubectl-gpusched`` console script (``kubectl_main``).

Every command reads the live cluster (``--kubeconfig``, else ``$KUBECONFIG``, else in-cluster) or
a snapshot file (``--snapshot FILE``: ``gpusched doctor snapshot`` or ``gpusched simulate
--snapshot`` writes one). Text with colour, or ``--json``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpusched.cli.common import JsonOpt, reports_errors
from gpusched.doctor.books import Books
from gpusched.doctor.findings import ClusterReport, Counterfactual, Finding, NodeReport, PodReport

doctor_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Why a pod is pending, and what would make it fit."
)

SnapshotOpt = Annotated[
    Path | None, typer.Option("--snapshot", help="Read this snapshot file instead of the live API.")
]
KubeconfigOpt = Annotated[
    str | None, typer.Option("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, else in-cluster).")
]
PolicyOpt = Annotated[str, typer.Option("--policy", help="The scheduler's policy (its profile).")]

_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "error": "bold red"}
_MARK = {"ok": "✓", "info": "·", "warn": "!", "error": "✗"}
_LEVEL_TITLE = {
    "node": "Node",
    "device": "Device plugin / container",
    "scheduling": "Scheduling",
    "counterfactual": "What would make it fit",
}


def load_books(snapshot: Path | None, kubeconfig: str | None, policy: str = "default") -> Books:
    """The books of a snapshot file, or of the live API."""
    from gpusched.doctor.snapshot import load_snapshot
    from gpusched.doctor.source import from_api

    snap = load_snapshot(snapshot) if snapshot is not None else from_api(kubeconfig)
    return Books.of(snap, policy)


def _console() -> Console:
    return Console(soft_wrap=True, highlight=False)


def _json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _finding(out: Console, f: Finding) -> None:
    line = Text(f"  {_MARK[f.severity]} ", style=_STYLE[f.severity])
    line.append(f"{f.code}: ", style=_STYLE[f.severity])
    line.append(f.message)
    out.print(line)
    shown = {k: v for k, v in f.evidence.items() if v not in (None, "", [], {})}
    if shown and f.severity in ("warn", "error"):
        ev = ", ".join(f"{k}={v}" for k, v in shown.items())
        out.print(Text(f"      evidence: {ev}", style="dim"))


def _findings(out: Console, findings: Sequence[Finding]) -> None:
    for level in ("node", "device", "scheduling"):
        fs = [f for f in findings if f.level == level]
        if fs:
            out.print(Text(_LEVEL_TITLE[level], style="bold underline"))
            for f in fs:
                _finding(out, f)


def _counterfactuals(out: Console, cfs: Sequence[Counterfactual]) -> None:
    if not cfs:
        return
    out.print(Text(_LEVEL_TITLE["counterfactual"], style="bold underline"))
    for i, c in enumerate(cfs):
        style = "bold green" if i == 0 and c.verified else ("green" if c.verified else "yellow")
        line = Text("  → " if i == 0 else "    ", style=style)
        line.append(c.message, style=style)
        line.append("  (checked on a copy of the books)" if c.verified else "  (not checked)", style="dim")
        out.print(line)


def render_pod(r: PodReport, out: Console | None = None) -> None:
    out = out or _console()
    head = Text(f"pod {r.pod}", style="bold")
    head.append(f"  {r.phase or '?'}" + (f" on {r.node}" if r.node else ""), style="dim")
    out.print(head)
    _findings(out, r.findings)
    _counterfactuals(out, r.counterfactuals)


def render_node(r: NodeReport, out: Console | None = None) -> None:
    out = out or _console()
    out.print(Text(f"node {r.node}", style="bold"))
    _findings(out, r.findings)
    if r.gpus:
        t = Table("GPU", "health", "free milli", "free MiB", "pods")
        for g in r.gpus:
            pods = ", ".join(f"{p['pod']} ({p['milli']})" for p in g["pods"]) or "-"
            health = Text("ok", style="green") if g["healthy"] else Text("UNHEALTHY", style="bold red")
            t.add_row(str(g["index"]), health, str(g["free_milli"]), str(g["free_memory_mib"]), pods)
        out.print(t)


def render_cluster(r: ClusterReport, out: Console | None = None) -> None:
    out = out or _console()
    out.print(Text(f"cluster: {r.nodes} nodes, {r.gpus} GPUs, {r.pending} pending pod(s)", style="bold"))
    if r.top_reasons:
        t = Table("why pods wait", "pods", title="Top reasons")
        for reason, n in r.top_reasons:
            t.add_row(reason, str(n))
        out.print(t)
    if r.stranded_by_model:
        t = Table("model", "GPUs", "free GPUs", "stranded GPUs", title="Stranded capacity by model")
        for m, v in sorted(r.stranded_by_model.items()):
            stranded = v["stranded_milli"] / 1000
            t.add_row(m, f"{v['gpus']:g}", f"{v['free_milli'] / 1000:g}",
                      Text(f"{stranded:.2f}", style="yellow" if stranded >= 1 else ""))  # fmt: skip
        out.print(t)
    drift = [f for f in r.findings if f.code.startswith("drift")]
    out.print(Text(f"Drift: {len(drift)} pod(s)", style="bold red" if drift else "bold green"))
    _findings(out, _grouped(r.findings))


def _grouped(findings: Sequence[Finding], shown: int = 3) -> list[Finding]:
    """At most ``shown`` findings of one code, then one line counting the rest."""
    out: list[Finding] = []
    by_code: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        by_code.setdefault((f.level, f.code), []).append(f)
    for fs in by_code.values():
        out += fs[:shown]
        if len(fs) > shown:
            rest = fs[shown:]
            names = ", ".join(f.subject for f in rest[:5]) + (", ..." if len(rest) > 5 else "")
            f0 = fs[0]
            more = f"and {len(rest)} more like it: {names}"
            out.append(Finding(f0.level, f0.severity, f0.code, more, {}, ""))
    return out


# ----------------------------------------------------------------------------------- commands
@doctor_app.command("pod")
@reports_errors
def pod(
    name: Annotated[str, typer.Argument(help="NAMESPACE/NAME (or NAME in default).")],
    snapshot: SnapshotOpt = None,
    kubeconfig: KubeconfigOpt = None,
    policy: PolicyOpt = "default",
    json_out: JsonOpt = False,
) -> None:
    """Walk node, device plugin and scheduling for one pod; for a pending one, what would make it fit."""
    from gpusched.doctor.analysis import doctor_pod

    report = doctor_pod(load_books(snapshot, kubeconfig, policy), name)
    _json(report.to_dict()) if json_out else render_pod(report)


@doctor_app.command("node")
@reports_errors
def node(
    name: Annotated[str, typer.Argument(help="Node name.")],
    snapshot: SnapshotOpt = None,
    kubeconfig: KubeconfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """GPU inventory, health, registration and drift of one node, and who holds each GPU."""
    from gpusched.doctor.analysis import doctor_node

    report = doctor_node(load_books(snapshot, kubeconfig), name)
    _json(report.to_dict()) if json_out else render_node(report)


@doctor_app.command("cluster")
@reports_errors
def cluster(
    snapshot: SnapshotOpt = None,
    kubeconfig: KubeconfigOpt = None,
    policy: PolicyOpt = "default",
    json_out: JsonOpt = False,
) -> None:
    """The top reasons pods wait, stranded capacity by GPU model, drift."""
    from gpusched.doctor.analysis import doctor_cluster

    report = doctor_cluster(load_books(snapshot, kubeconfig, policy))
    _json(report.to_dict()) if json_out else render_cluster(report)


@doctor_app.command("snapshot")
@reports_errors
def snapshot_cmd(
    out: Annotated[Path, typer.Argument(help="File to write (JSON).")],
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Save the live cluster's nodes and pods to a snapshot file that --snapshot reads."""
    from gpusched.doctor.snapshot import write_snapshot
    from gpusched.doctor.source import from_api

    snap = from_api(kubeconfig)
    write_snapshot(out, snap)
    _console().print(f"wrote {out}: {len(snap.nodes)} nodes, {len(snap.pods)} pods")


@doctor_app.command("bench")
@reports_errors
def bench(
    nodes: Annotated[int, typer.Option(help="Nodes of the synthetic cluster.")] = 5000,
    repeat: Annotated[int, typer.Option(help="Timed runs.")] = 3,
    json_out: JsonOpt = False,
) -> None:
    """Doctor's time for one pending pod (every counterfactual tried) on a large cluster."""
    from gpusched.doctor.bench import bench_doctor

    result = bench_doctor(nodes, repeat=repeat)
    if json_out:
        _json(result)
    else:
        t = Table("step", "seconds", title=f"doctor pod at {nodes} nodes ({result['pods']} pods)")
        for k, v in result["seconds"].items():
            t.add_row(k, f"{v:.3f}")
        _console().print(t)


def kubectl_app() -> typer.Typer:
    """The ``kubectl gpusched`` plugin's commands: ``doctor ...`` and ``ui``."""
    from gpusched.cli.ui import ui

    app = typer.Typer(
        add_completion=False,
        no_args_is_help=True,
        help="gpusched as a kubectl plugin: doctor and the GPU map.",
    )
    app.add_typer(doctor_app, name="doctor")
    app.command("ui")(ui)
    return app


def kubectl_main() -> None:
    """``kubectl-gpusched`` (kubectl runs it for ``kubectl gpusched doctor ...``)."""
    kubectl_app()(prog_name="kubectl gpusched")
