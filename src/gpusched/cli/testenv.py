"""``gpusched testenv up|down``: a throw-away real control plane with kwok GPU nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli.common import reports_errors

testenv_app = typer.Typer(no_args_is_help=True, help="A throw-away real control plane with kwok GPU nodes.")


@testenv_app.command("up")
@reports_errors
def testenv_up_cmd(
    nodes: Annotated[int, typer.Option(help="kwok GPU nodes to create.")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    with_scheduler: Annotated[bool, typer.Option(help="Also run kube-scheduler (default profile).")] = False,
    state_dir: Annotated[Path | None, typer.Option(help="Where the state and logs go.")] = None,
) -> None:
    """Start etcd, kube-apiserver and kwok in the background (built by hack/build-control-plane.sh)."""
    from gpusched.testenv import session

    session.testenv_up(state_dir or session.DEFAULT_STATE_DIR, nodes, gpus_per_node, with_scheduler)


@testenv_app.command("down")
@reports_errors
def testenv_down_cmd(
    state_dir: Annotated[Path | None, typer.Option(help="The state folder given to 'up'.")] = None,
) -> None:
    """Stop the background control plane and remove its state."""
    from gpusched.testenv import session

    session.testenv_down(state_dir or session.DEFAULT_STATE_DIR)
