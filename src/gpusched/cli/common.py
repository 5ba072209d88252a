"""What every ``gpusched`` command shares: the error convention, option types and checks.

The pattern of a command module: parse and check options (``typer.BadParameter`` for a bad
one), then call one function of the layer below under ``run_cli``; what is shown or written
goes through ``gpusched.cli.render``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec

import typer
import typer.core
import typer.rich_utils

from gpusched.core.errors import GpuschedError

P = ParamSpec("P")

DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))
ERROR_EXIT = 2  # as click's usage errors: the input was wrong, not the program


HELP_WIDTH_OFF_TTY = 120
"""Columns of ``--help`` written to a file or a pipe (rich would cut it at 80): wide enough that no
option's help or default is cut; ``$COLUMNS`` or typer's ``$TERMINAL_WIDTH`` still decide."""

_CLICK_TYPE_NAMES = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "path": "PATH", "file": "PATH"}
_typer_option_type = typer.core.TyperOption.display_type_rich
_typer_argument_type = typer.core.TyperArgument.display_type_rich


def _click_name(label: str | None) -> str | None:
    if label and label.startswith("<") and label.endswith(">"):
        inner = label[1:-1]
        return _CLICK_TYPE_NAMES.get(inner, inner)
    return label


def _option_metavar(self: typer.core.TyperOption, ctx: Any) -> str | None:
    """An option's value placeholder in ``--help``: none for a flag (typer 0.29 shows ``<bool>``
    beside ``--help`` and every switch), click's names for values (``INTEGER``, ``PATH``, ``TEXT``)
    instead of typer's ``<int>``; a metavar given to the option wins."""
    if self.is_flag or self.count:
        return None
    return _click_name(_typer_option_type(self, ctx))


def _argument_metavar(self: typer.core.TyperArgument, ctx: Any) -> str | None:
    return _click_name(_typer_argument_type(self, ctx))


def plain_help() -> None:
    """Help without type noise, and not cut at 80 columns off a terminal (see ``HELP_WIDTH_OFF_TTY``).
    Applied once when this module is imported: every command module imports it."""
    typer.core.TyperOption.display_type_rich = _option_metavar  # type: ignore[method-assign]
    typer.core.TyperArgument.display_type_rich = _argument_metavar  # type: ignore[method-assign,assignment]
    if typer.rich_utils.MAX_WIDTH is None and not os.environ.get("COLUMNS") and not sys.stdout.isatty():
        typer.rich_utils.MAX_WIDTH = HELP_WIDTH_OFF_TTY


plain_help()


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
    propagate)."""

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
