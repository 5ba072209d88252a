"""The import-linter contract that keeps the node agent at the edge sees the imports it polices."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _agent_contract() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c.get("forbidden_modules") == ["gpusched.agent"])


def test_the_agent_contract_breaks_when_a_source_imports_the_agent(tmp_path: Path) -> None:
    c = _agent_contract()
    assert {"gpusched.core", "gpusched.k8s", "gpusched.sim"} <= set(c["source_modules"])  # type: ignore[arg-type]
    # gpusched.cli does import gpusched.agent (the agent's commands, cli/agent.py, lazily): made a
    # source, the same contract must break
    cfg = tmp_path / "canary.toml"
    cfg.write_text(
        '[tool.importlinter]\nroot_package = "gpusched"\n\n[[tool.importlinter.contracts]]\n'
        'name = "canary"\ntype = "forbidden"\nsource_modules = ["gpusched.cli"]\n'
        'forbidden_modules = ["gpusched.agent"]\nallow_indirect_imports = true\n'
    )
    script = Path(sys.executable).with_name("lint-imports")
    cmd = (
        [str(script)]
        if script.exists()
        else [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
        ]
    )
    r = subprocess.run(
        [*cmd, "--no-logo", "--no-cache", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gpusched.cli.agent -> gpusched.agent.run" in r.stdout
