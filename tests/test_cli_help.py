"""Every command's ``--help``: no type noise (``<bool>``, ``<int>``), no double negatives
(``--no-no-api``), and off a terminal not cut at 80 columns."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from gpusched.cli import app
from gpusched.cli.common import HELP_WIDTH_OFF_TTY

_TYPE_NOISE = re.compile(r"<(bool|int|str|float|path|file|text)>", re.IGNORECASE)


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path under ``group`` (typer 0.29 carries its own click: no isinstance on click's)."""
    yield path
    if hasattr(group, "list_commands"):
        ctx = group.context_class(group)
        for name in group.list_commands(ctx):
            yield from _commands(group.get_command(ctx, name), (*path, name))


def test_no_command_shows_type_placeholders_or_double_negatives(monkeypatch: pytest.MonkeyPatch) -> None:
    # the width of help off a terminal (plain_help sets it when stdout is no TTY, as the subprocess test
    # below checks): pinned here, since whether pytest's stdout is a TTY depends on how it runs (xdist or not)
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", HELP_WIDTH_OFF_TTY)
    runner = CliRunner()
    paths = list(_commands(typer.main.get_command(app)))
    assert len(paths) > 30  # every group and command was walked
    for path in paths:
        r = runner.invoke(app, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        assert not _TYPE_NOISE.search(r.output), (path, _TYPE_NOISE.search(r.output))
        assert "--no-no-" not in r.output, path
        assert "…" not in r.output, (path, "an option's help or default was cut")


def test_value_options_show_clicks_names_and_flags_none() -> None:
    out = CliRunner().invoke(app, ["agent", "run", "--help"]).output
    assert re.search(r"--slots\s+INTEGER\s", out)
    assert re.search(r"--fake\s+PATH\s", out)
    assert re.search(r"--no-api\s+No Kubernetes API", out)  # a flag: nothing between name and help
    assert re.search(r"--help\s+Show this message", out)


def test_help_to_a_pipe_is_wider_than_80_columns() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    out = subprocess.run(
        [sys.executable, "-m", "gpusched.cli", "agent", "run", "--help"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    assert max(len(line) for line in out.splitlines()) > 80
    assert "[default: /var/lib/kubelet/device-plugins]" in out
