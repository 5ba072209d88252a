"""What every ``gpusched`` command shares: the error convention, option types and checks.

The pattern of a command module: parse and check options (``typer.BadParameter`` for a bad
one), then call one function of the layer below under ``run_cli``; what is shown or written
goes through ``gpusched.cli.render``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec

import typer

from gpusched.core.errors import GpuschedError

P = ParamSpec("P")

DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))
ERROR_EXIT = 2  # as click's usage errors: the input was wrong, not the program


def run_cli(fn: Callable[[], None]) -> None:
    """Run ``fn``; a ``GpuschedError`` (bad input, bad settings, a part that cannot be used)
    becomes one ``error:`` line on stderr and exit status 2. Anything else is a bug and keeps its
    traceback."""
    from gpusched.cli import render

    try:
        fn()
    except GpuschedError as e:
        render.error(str(e))
        raise typer.Exit(ERROR_EXIT) from None


def reports_errors(fn: Callable[P, None]) -> Callable[P, None]:
    """A command that runs under ``run_cli``. ``__wrapped__`` is the bare command (errors
    propagate), for the ``python -m`` entry points that started it so before."""

    @functools.wraps(fn)
    def command(*args: P.args, **kwargs: P.kwargs) -> None:
        run_cli(lambda: fn(*args, **kwargs))

    return command


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,45,50-51``."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise typer.BadParameter(f"seeds {text!r}: use a list like 42-51 or 42,43,50-51") from None
    if not seeds:
        raise typer.BadParameter("no seeds given")
    return seeds


NodesOpt = Annotated[Path | None, typer.Option("--nodes", help="Node list CSV (Alibaba openb format).")]
PodsOpt = Annotated[Path | None, typer.Option("--pods", help="Pod list CSV (Alibaba openb format).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="Parallel processes.")]
