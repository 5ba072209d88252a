"""The ``gpusched`` command line: one typer app, one module per command group.

- ``simulate`` — the simulator (``cli/simulate.py``);
- ``bench ...`` — benchmarks (``cli/bench.py``);
- ``scheduler``, ``extender``, ``webhook`` — the Kubernetes front ends and the share pods' admission
  webhook (``cli/serve.py``);
- ``up``, ``down`` — a local cluster with gpusched; ``testenv up|down`` — the test control plane
  (``cli/testenv.py``);
- ``doctor pod|node|cluster|snapshot|bench`` (``cli/doctor.py``), ``ui`` — the GPU map (``cli/ui.py``);
- ``policies``, ``check-trace`` (``cli/traces.py``);
- ``agent discover|labels|run|bench|compare-smi`` — the node agent (``cli/agent.py``; also
  ``python -m gpusched.agent``, the DaemonSet's entry point).

Every command module parses options and calls one function of the layer below under
``run_cli`` (``cli/common.py``); what is printed goes through ``cli/render.py``. The app that gathers
them is ``cli/commands.py``, imported only when asked for: ``python -m gpusched.agent`` (the DaemonSet)
loads ``cli/agent.py`` alone, not the simulator and the schedulers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "extender", "main", "run_cli", "scheduler"]


def main() -> None:
    from gpusched.cli.commands import app

    app()


def __getattr__(name: str) -> Any:  # the app and its commands, loaded on first use (PEP 562)
    if name in ("app", "extender", "scheduler", "webhook"):
        from gpusched.cli import commands

        return getattr(commands, name)
    if name == "run_cli":
        from gpusched.cli.common import run_cli

        return run_cli
    raise AttributeError(f"module 'gpusched.cli' has no attribute {name!r}")
