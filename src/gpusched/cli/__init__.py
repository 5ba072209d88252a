"""The ``gpusched`` command line: one typer app, one module per command group.

- ``simulate`` — the simulator (``cli/simulate.py``);
- ``bench ...`` — benchmarks (``cli/bench.py``);
- ``scheduler``, ``extender``, ``webhook`` — the Kubernetes front ends and the share pods' admission
  webhook (``cli/serve.py``);
- ``up``, ``down`` — a local cluster with gpusched; ``testenv up|down`` — the test control plane
  (``cli/testenv.py``);
- ``doctor pod|node|cluster|snapshot|bench`` (``cli/doctor.py``), ``ui`` — the GPU map (``cli/ui.py``);
- ``policies``, ``check-trace`` (``cli/traces.py``);
- ``agent discover|labels|run|bench|compare-smi`` — the node agent (``cli/agent.py``;
  ``python -m gpusched.cli agent run ...`` is the DaemonSet's command).

Every command module parses options and calls one function of the layer below under
``run_cli`` (``cli/common.py``); what is printed goes through ``cli/render.py``. The app that gathers
them is ``cli/commands.py``, imported only when asked for. The long-running processes start light
(``main``): ``gpusched agent ...`` (the DaemonSet) loads ``cli/agent.py`` alone, ``gpusched
scheduler|extender|webhook`` ``cli/serve.py`` alone, not the simulator and the other commands. These
are the only entry points: ``gpusched ...`` (the console script) or ``python -m gpusched.cli ...``;
no package below the CLI imports it (an import-linter contract).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["app", "extender", "main", "run_cli", "scheduler"]


def main(argv: Sequence[str] | None = None) -> None:
    """``gpusched ...``: a long-running process's command (the agent, a front end) parsed by its own
    module alone, every other command by the whole app."""
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "agent":
        from gpusched.cli.agent import agent_main

        agent_main(rest)
    elif command in ("scheduler", "extender", "webhook"):
        from gpusched.cli.serve import SERVED, standalone

        standalone(SERVED[command], command, rest, bare=False)
    else:
        from gpusched.cli.commands import app

        app(args=args)


def __getattr__(name: str) -> Any:  # the app and its commands, loaded on first use (PEP 562)
    if name in ("app", "extender", "scheduler", "webhook"):
        from gpusched.cli import commands

        return getattr(commands, name)
    if name == "run_cli":
        from gpusched.cli.common import run_cli

        return run_cli
    raise AttributeError(f"module 'gpusched.cli' has no attribute {name!r}")
