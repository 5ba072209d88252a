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
    policy: Annotated[
        str, typer.Option("--policy", help="The scheduler's policy (its profile).")
    ] = "default",
    max_moves: Annotated[int, typer.Option("--max-moves", min=0, help="Moves in one plan, at most.")] = 8,
    timeout: Annotated[float, typer.Option("--timeout", min=0.01, help="Seconds of search per plan.")] = 10.0,
    json_out: JsonOpt = False,
) -> None:
    """Dry run: the fewest moves that let the pending GPU pods fit, changing nothing."""
    from gpusched.cli import render
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
    )
    render.defrag_plan(report.to_dict(), json_out)
