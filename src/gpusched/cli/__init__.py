"""The ``gpusched`` command line: one typer app, one module per command group.

- ``simulate`` — the simulator (``cli/simulate.py``);
- ``bench ...`` — benchmarks (``cli/bench.py``);
- ``scheduler``, ``extender``, ``webhook`` — the Kubernetes front ends and the share pods' admission
  webhook (``cli/serve.py``);
- ``testenv up|down`` — the test control plane (``cli/testenv.py``);
- ``doctor pod|node|cluster|snapshot|bench`` (``cli/doctor.py``), ``ui`` — the GPU map (``cli/ui.py``);
- ``policies``, ``check-trace`` (``cli/traces.py``);
- ``agent discover|labels|run|bench|compare-smi`` — the node agent (``cli/agent.py``; also
  ``python -m gpusched.agent``, the DaemonSet's entry point).

Every command module parses options and calls one function of the layer below under
``run_cli`` (``cli/common.py``); what is printed goes through ``cli/render.py``.
"""

from __future__ import annotations

import typer

from gpusched.cli.agent import agent_app
from gpusched.cli.bench import bench_app
from gpusched.cli.common import run_cli
from gpusched.cli.doctor import doctor_app
from gpusched.cli.serve import extender, scheduler, webhook
from gpusched.cli.simulate import simulate
from gpusched.cli.testenv import testenv_app
from gpusched.cli.traces import check_trace, policies
from gpusched.cli.ui import ui

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GPU scheduling for Kubernetes.")
app.command()(simulate)
app.add_typer(bench_app, name="bench")
app.command("scheduler")(scheduler)
app.command()(extender)
app.command()(webhook)
app.add_typer(testenv_app, name="testenv")
app.add_typer(agent_app, name="agent")
app.command()(policies)
app.command("check-trace")(check_trace)
app.add_typer(doctor_app, name="doctor")
app.command("ui")(ui)

__all__ = ["app", "extender", "main", "run_cli", "scheduler"]


def main() -> None:
    app()
