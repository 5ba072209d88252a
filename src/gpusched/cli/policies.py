"""The placement-policy option of the commands that run the core (``simulate``, ``bench``,
``scheduler``, ``extender``): its own module, as it loads the core's policies (numpy, scipy), which
``gpusched.cli.common`` and the light commands (``python -m gpusched.cli agent``) do without."""

from __future__ import annotations

from typing import Annotated

import typer

from gpusched.core.policies import POLICIES

DEFAULT_POLICIES = ["default", "fgd", "bestfit"]


def check_policies(policies: list[str] | None) -> list[str]:
    chosen = policies or DEFAULT_POLICIES
    bad = [p for p in chosen if p not in POLICIES]
    if bad:
        raise typer.BadParameter(f"unknown policy {', '.join(bad)}; choose from {', '.join(POLICIES)}")
    return chosen


PolicyOpt = Annotated[
    list[str] | None, typer.Option("--policy", "-p", help=f"Policy: {', '.join(POLICIES)}.")
]
