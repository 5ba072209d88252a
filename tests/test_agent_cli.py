"""``gpusched agent discover / labels / compare-smi`` (``gpusched.cli.agent``) on a fake node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusched.agent.smi import compare
from gpusched.cli import app

FAKE = """
hostname: cli-node
driverVersion: "550.107.02"
cudaVersion: "12.4"
gpus:
  - {model: NVIDIA A100-SXM4-80GB, count: 2, numaNode: 0}
  - {model: NVIDIA A100-SXM4-80GB, migMode: true, mig: [{profile: 7g.80gb, start: 0}]}
"""


def test_discover_json_and_labels(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(FAKE)
    r = CliRunner().invoke(app, ["agent", "discover", "--json", "--fake", str(f)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["hostname"] == "cli-node" and len(doc["devices"]) == 3
    assert doc["devices"][2]["mig_instances"][0]["profile"] == "7g.80gb"
    r = CliRunner().invoke(app, ["agent", "labels", "--fake", str(f)])
    assert r.exit_code == 0, r.output
    assert "nvidia.com/gpu.count=3" in r.output.splitlines()
    assert "nvidia.com/mig-7g.80gb.count=1" in r.output.splitlines()


def test_a_bad_fake_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        "gpus:\n  - {model: NVIDIA A100-SXM4-80GB, migMode: true, mig: [{profile: 9g.99gb, start: 0}]}\n"
    )
    r = CliRunner().invoke(app, ["agent", "discover", "--fake", str(f)])
    assert r.exit_code == 2
    assert f"{f}: gpus[0] (GPU index 0): field mig[0]: unknown MIG profile '9g.99gb'" in r.output


SMI = """<?xml version="1.0" ?>
<nvidia_smi_log><driver_version>550.107.02</driver_version><cuda_version>12.4</cuda_version>
<gpu id="00000000:07:00.0"><product_name>NVIDIA A100-SXM4-80GB</product_name><uuid>GPU-a</uuid>
<pci><pci_bus_id>00000000:07:00.0</pci_bus_id></pci><fb_memory_usage><total>81920
MiB</total></fb_memory_usage>
<mig_mode><current_mig>Disabled</current_mig></mig_mode></gpu></nvidia_smi_log>"""


def test_compare_with_nvidia_smi() -> None:
    agent = {
        "driver_version": "550.107.02",
        "cuda_driver_version": "12.4",
        "devices": [
            {
                "uuid": "GPU-a",
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "pci_bus_id": "00000000:07:00.0",
                "mig_enabled": False,
                "mig_instances": [],
            }
        ],
    }
    assert compare(agent, SMI) == []
    agent["devices"][0]["memory_mib"] = 40960
    agent["devices"][0]["mig_enabled"] = True
    assert compare(agent, SMI) == [
        "GPU 0 memory MiB: agent 40960, nvidia-smi 81920",
        "GPU 0 MIG enabled: agent True, nvidia-smi False",
    ]


def test_discover_text_and_errors_of_the_agent_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line per GPU; a bad option value or a missing node name is one ``error:`` line, exit 2."""
    f = tmp_path / "gpus.yaml"
    f.write_text(FAKE)
    r = CliRunner().invoke(app, ["agent", "discover", "--fake", str(f)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "cli-node: driver 550.107.02, CUDA 12.4, 3 GPU(s)"
    assert len(lines) == 4 and lines[3].endswith(", MIG ['7g.80gb']")
    r = CliRunner().invoke(app, ["agent", "labels", "--fake", str(f), "--mig-strategy", "single"])
    assert r.exit_code == 0 and "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-MIG-INVALID" in r.output
    assert "nvidia.com/gpu.count=0" in r.output  # GFD's label for a node that breaks the single rules
    r = CliRunner().invoke(
        app, ["agent", "run", "--fake", str(f), "--no-api", "--node", "n", "--mig-strategy", "single"]
    )
    assert (r.exit_code, r.output) == (
        2,
        "error: MIG strategy single: GPU(s) [0, 1] are not in MIG mode (every GPU must be)\n",
    )
    monkeypatch.delenv("NODE_NAME", raising=False)
    r = CliRunner().invoke(app, ["agent", "run", "--fake", str(f), "--no-api"])
    assert (r.exit_code, r.output) == (2, "error: --node or $NODE_NAME is required\n")


def test_compare_smi_exits_1_on_a_difference(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(FAKE)
    discovered = tmp_path / "discover.json"
    discovered.write_text(CliRunner().invoke(app, ["agent", "discover", "--json", "--fake", str(f)]).output)
    smi = tmp_path / "smi.xml"
    smi.write_text(SMI)
    r = CliRunner().invoke(app, ["agent", "compare-smi", str(discovered), str(smi)])
    assert r.exit_code == 1, r.output
    assert r.output.splitlines()[0] == "GPU count: agent 3, nvidia-smi 1"
    assert r.output.splitlines()[-1] == "2 difference(s)"


def test_python_m_gpusched_agent_runs_the_same_commands(tmp_path: Path) -> None:
    """The DaemonSet's entry point (``python -m gpusched.cli agent run ...``) is the CLI's agent app."""
    f = tmp_path / "gpus.yaml"
    f.write_text(FAKE)
    cmd = [sys.executable, "-m", "gpusched.cli", "agent", "labels", "--fake", str(f)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == CliRunner().invoke(app, ["agent", "labels", "--fake", str(f)]).output


def test_the_daemonsets_entry_point_loads_no_scheduler_and_no_simulator() -> None:
    # python -m gpusched.cli agent runs on every GPU node: gpusched.cli.main parses the agent's options
    # alone, without the rest of the CLI (the simulator, the core's policies, numpy, scipy).
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys, gpusched.cli as c\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    c.main(['agent', 'labels', '--help'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'scipy', 'matplotlib') "
        "or m.startswith(('gpusched.sim', 'gpusched.core.policies', 'gpusched.k8s', "
        "'gpusched.cli.commands'))))"
    )
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
