"""The ``gpusched`` app: every command group of ``gpusched.cli`` registered on one typer app."""

from __future__ import annotations

import typer

from gpusched.cli.agent import agent_app
from gpusched.cli.bench import bench_app
from gpusched.cli.defrag import defrag_app
from gpusched.cli.doctor import doctor_app
from gpusched.cli.metrics import metrics_app
from gpusched.cli.serve import extender, scheduler, webhook
from gpusched.cli.simulate import simulate
from gpusched.cli.testenv import down, testenv_app, up
from gpusched.cli.traces import check_trace, policies
from gpusched.cli.ui import ui

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GPU scheduling for Kubernetes.")
app.command()(simulate)
app.add_typer(bench_app, name="bench")
app.command("scheduler")(scheduler)
app.command()(extender)
app.command()(webhook)
app.command("up")(up)
app.command("down")(down)
app.add_typer(testenv_app, name="testenv")
app.add_typer(agent_app, name="agent")
app.command()(policies)
app.command("check-trace")(check_trace)
app.add_typer(doctor_app, name="doctor")
app.add_typer(defrag_app, name="defrag")
app.add_typer(metrics_app, name="metrics")
app.command("ui")(ui)

__all__ = ["app", "extender", "scheduler", "webhook"]
