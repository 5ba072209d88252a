"""``gpusched metrics check``: every shipped dashboard panel query and alert expression against a
Prometheus (``gpusched.metrics.check``).

Exit status: 0 when every expression parses (empty ones are reported, not failed), 1 when one is
refused (or, with ``--require-data``, when one is empty), 2 when the URL cannot be queried.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli.common import JsonOpt, reports_errors

metrics_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="gpusched's dashboards and alerts on your Prometheus."
)


class Only(StrEnum):
    dashboards = "dashboards"
    alerts = "alerts"


@metrics_app.command("check")
@reports_errors
def check(
    prometheus: Annotated[
        str,
        typer.Option(
            "--prometheus",
            help="Prometheus's base URL: http(s)://HOST:PORT, with a path prefix if it has one.",
            show_default=False,
        ),
    ],
    only: Annotated[
        Only | None, typer.Option("--only", help="Check only the dashboards or only the alerts.")
    ] = None,
    require_data: Annotated[
        bool, typer.Option("--require-data", help="Exit 1 when any expression returns no series.")
    ] = False,
    token: Annotated[
        str,
        typer.Option("--token", envvar="GPUSCHED_PROMETHEUS_TOKEN", help="Bearer token.", show_default=False),
    ] = "",
    ca_file: Annotated[
        Path | None, typer.Option("--ca-file", help="CA bundle that signed Prometheus's certificate.")
    ] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Skip TLS certificate verification.")] = False,
    rate_interval: Annotated[
        str, typer.Option("--rate-interval", help="What Grafana's $__rate_interval stands for.")
    ] = "5m",
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds per query.")] = 30.0,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate every dashboard panel query and alert expression as an instant query: data, empty or error."""
    from gpusched.cli import render
    from gpusched.metrics.check import Connection, Kind, shipped_checks
    from gpusched.metrics.check import check as run_check

    conn = Connection(
        prometheus, token=token, ca_file=str(ca_file or ""), insecure=insecure, timeout_s=timeout
    )
    kind: Kind | None = None if only is None else ("panel" if only is Only.dashboards else "alert")
    report = run_check(conn, shipped_checks(kind, rate_interval=rate_interval))
    render.metrics_check(report, json_out)
    if not report.parses or (require_data and not report.all_data):
        raise typer.Exit(1)
