"""``gpusched policies`` and ``gpusched check-trace``: what can be scheduled by, and with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli import render
from gpusched.cli.common import NodesOpt, reports_errors
from gpusched.core.policies import POLICIES


def policies() -> None:
    """List the placement policies."""
    for p in POLICIES:
        render.line(p)


@reports_errors
def check_trace(
    pods: Annotated[list[Path], typer.Argument(help="Pod list CSV files to validate.")],
    nodes: NodesOpt = None,
) -> None:
    """Validate trace files: every row is read and checked; the first bad one is named."""
    from gpusched.sim.traces import read_nodes, read_pods

    if nodes is not None:
        render.line(f"{nodes}: {len(read_nodes(nodes))} nodes ok")
    for p in pods:
        render.line(f"{p}: {len(read_pods(p))} pods ok")
