"""``gpusched doctor pod|node|cluster|snapshot|bench``: why a pod is pending, what would make it
fit, and where the GPUs went (``gpusched.doctor``); also ``kubectl gpusched doctor ...`` through
the ``kubectl-gpusched`` console script (``kubectl_main``).

Every command reads the live cluster (``--kubeconfig``, else ``$KUBECONFIG``, else in-cluster) or
a snapshot file (``--snapshot FILE``: ``gpusched doctor snapshot`` or ``gpusched simulate
--snapshot`` writes one). Text with colour, or ``--json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli.books import KubeconfigOpt, SnapshotOpt, load_books
from gpusched.cli.common import JsonOpt, reports_errors
from gpusched.doctor import render

doctor_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Why a pod is pending, and what would make it fit."
)

PolicyOpt = Annotated[str, typer.Option("--policy", help="The scheduler's policy (its profile).")]


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
    render.json_out(report.to_dict()) if json_out else render.render_pod(report)


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
    render.json_out(report.to_dict()) if json_out else render.render_node(report)


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
    render.json_out(report.to_dict()) if json_out else render.render_cluster(report)


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
    render.wrote(out, len(snap.nodes), len(snap.pods))


@doctor_app.command("bench")
@reports_errors
def bench(
    nodes: Annotated[int, typer.Option(help="Nodes of the synthetic cluster.")] = 5000,
    repeat: Annotated[int, typer.Option(help="Timed runs.")] = 3,
    queues: Annotated[
        bool,
        typer.Option(help="The same cluster without and with a Queue tree over every pod, side by side."),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Doctor's time for one pending pod (every counterfactual tried) on a large cluster."""
    from gpusched.doctor.bench import bench_doctor, bench_doctor_queues

    if queues:
        with_queues = bench_doctor_queues(nodes, repeat=repeat)
        render.json_out(with_queues) if json_out else render.bench_queues(with_queues)
        return
    result = bench_doctor(nodes, repeat=repeat)
    render.json_out(result) if json_out else render.bench(result)


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
