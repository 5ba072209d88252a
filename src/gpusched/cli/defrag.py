"""``gpusched defrag plan|run``: defragmentation on a live cluster (``gpusched.defrag``).

``plan`` is a dry run: it reads the cluster (``--kubeconfig``, else ``$KUBECONFIG``, else
in-cluster; or ``--snapshot FILE``), plans, prints the moves and changes nothing. ``run`` is the
opt-in controller: leader-elected, it plans for GPU pods that waited too long and carries the
plans out through the Eviction API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli.common import JsonOpt, reports_errors

defrag_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Move running pods so that pending GPU pods fit."
)

PolicyOpt = Annotated[str, typer.Option("--policy", help="The scheduler's policy (its profile).")]
RecreatingOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--recreating",
        metavar="KIND.GROUP",
        help="Also move pods of this controller kind (TFJob.kubeflow.org): one that recreates the pods "
        "it owns when they are evicted. Repeatable. Always: ReplicaSet.apps, StatefulSet.apps, "
        "Job.batch, ReplicationController.",
    ),
]
KubeconfigOpt = Annotated[
    str | None, typer.Option("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, else in-cluster).")
]


@defrag_app.command("plan")
@reports_errors
def plan(
    pod: Annotated[
        str | None,
        typer.Argument(help="Plan for this pending pod only: NAMESPACE/NAME (or NAME in default)."),
    ] = None,
    consolidate: Annotated[
        int | None,
        typer.Option("--consolidate", min=1, help="Instead: up to K moves that most reduce fragmentation."),
    ] = None,
    kubeconfig: KubeconfigOpt = None,
    snapshot: Annotated[
        Path | None, typer.Option("--snapshot", help="Read this doctor snapshot file instead of the API.")
    ] = None,
    policy: PolicyOpt = "default",
    max_moves: Annotated[int, typer.Option("--max-moves", min=0, help="Moves in one plan, at most.")] = 8,
    timeout: Annotated[float, typer.Option("--timeout", min=0.01, help="Seconds of search per plan.")] = 10.0,
    recreating: RecreatingOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Dry run: the fewest moves that let the pending GPU pods fit, changing nothing."""
    from gpusched.cli import render
    from gpusched.core.defrag import recreating_kinds
    from gpusched.defrag.dryrun import dry_run
    from gpusched.defrag.live import read_view

    if pod is not None and consolidate is not None:
        raise typer.BadParameter("give a pod or --consolidate, not both")
    view = read_view(kubeconfig, snapshot, policy)
    report = dry_run(
        view.books,
        view.budgets,
        pod=pod,
        consolidate_moves=consolidate,
        max_moves=max_moves,
        timeout_s=timeout,
        invalid=view.invalid,
        recreating=recreating_kinds(recreating or ()),
    )
    render.defrag_plan(report.to_dict(), json_out)


@defrag_app.command("run")
@reports_errors
def run(
    kubeconfig: KubeconfigOpt = None,
    scheduler_name: Annotated[
        str, typer.Option("--scheduler-name", help="Plan for pending pods of this schedulerName.")
    ] = "gpusched",
    policy: PolicyOpt = "default",
    wait: Annotated[
        float, typer.Option("--wait", min=0.0, help="Seconds a GPU pod waits before a plan is made for it.")
    ] = 300.0,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between cycles.")] = 10.0,
    max_moves: Annotated[int, typer.Option("--max-moves", min=1, help="Moves in one plan, at most.")] = 8,
    max_moves_per_window: Annotated[
        int, typer.Option("--max-moves-per-window", min=1, help="Moves in one window, at most.")
    ] = 32,
    window: Annotated[float, typer.Option("--window", min=1.0, help="The window, in seconds.")] = 3600.0,
    max_moves_per_pod: Annotated[
        int, typer.Option("--max-moves-per-pod", min=1, help="Times one pod may move in a window.")
    ] = 1,
    grace_period: Annotated[
        int | None,
        typer.Option("--grace-period", min=0, help="Seconds evicted pods get (default: their own)."),
    ] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", help="Namespace of the leader Lease.")
    ] = "kube-system",
    lease_name: Annotated[str, typer.Option("--lease-name", help="The leader Lease.")] = "gpusched-defrag",
    leader_elect: Annotated[
        bool, typer.Option("--leader-elect/--no-leader-elect", help="Act only while holding the Lease.")
    ] = True,
    port: Annotated[int, typer.Option("--port", help="Port of /healthz, /readyz and /metrics.")] = 10259,
    recreating: RecreatingOpt = None,
    log_level: Annotated[str, typer.Option("--log-level", help="Python log level.")] = "INFO",
) -> None:
    """The controller: plan for GPU pods that waited too long, evict through the Eviction API
    (never past a PodDisruptionBudget), keep the freed room for the pod (nominated node)."""
    from gpusched.core.defrag import recreating_kinds
    from gpusched.core.policies import POLICIES
    from gpusched.defrag.controller import ControllerConfig
    from gpusched.defrag.serve import serve_defrag

    if policy not in POLICIES:
        raise typer.BadParameter(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    config = ControllerConfig(
        scheduler_name=scheduler_name,
        policy=policy,
        wait_s=wait,
        interval_s=interval,
        max_moves=max_moves,
        max_moves_per_window=max_moves_per_window,
        window_s=window,
        max_moves_per_pod=max_moves_per_pod,
        grace_period_s=grace_period,
        lease_name=lease_name,
        recreating=recreating_kinds(recreating or ()),
    )
    serve_defrag(
        config,
        kubeconfig=kubeconfig,
        namespace=namespace,
        port=port,
        leader_elect=leader_elect,
        log_level=log_level,
    )
