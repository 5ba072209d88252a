"""docs/quickstart.md's commands as written, in one shell, as a newcomer runs them after the clone and the
install (its first block, which this checkout has done): ``gpusched up``, ``source`` of the env file it
prints, the local examples, the share pods' assignment and slot, ``gpusched doctor`` on the pod that cannot
fit, ``gpusched down``. ``$HOME`` is a temporary folder (the default state folder lives under it); the
control plane binaries are the cached build ($GPUSCHED_CONTROLPLANE_BIN), as on a second run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from realparts import unavailable

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"


def quickstart_blocks() -> list[str]:
    """The ```sh blocks of the page after the first (the clone and the install)."""
    blocks = re.findall(r"```sh\n(.*?)```", QUICKSTART.read_text(), re.S)
    assert "git clone" in blocks[0] and "pip install" in blocks[0], blocks[0]
    return blocks[1:]


def test_quickstart_as_written(control_plane_bin: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    scripts = Path(sys.executable).parent
    env = {**os.environ, "HOME": str(home), "GPUSCHED_CONTROLPLANE_BIN": str(control_plane_bin),
           "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    if shutil.which("gpusched", path=env["PATH"]) is None:
        unavailable("the gpusched command is not installed (python3 -m pip install -e .)")
    script = "set -euo pipefail\n" + "\n".join(
        f"echo '+++ {i}'\n{b}" for i, b in enumerate(quickstart_blocks())
    )
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        wall = time.monotonic() - t0
        subprocess.run(
            ["gpusched", "down"], cwd=ROOT, env=env, capture_output=True, timeout=120
        )  # after a failure
    out = proc.stdout
    print(f"\nquickstart ({wall:.1f} s):\n{out}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    up, share, doctor, _down = out.split("+++ ")[1:]
    assert "gpusched up: 2 kwok node(s) x 4 NVIDIA-A100-SXM4-80GB GPU(s)" in up
    for line in ("next:", "kubectl apply -f deploy/examples/local/", "gpusched doctor pod gpu-demo/too-big"):
        assert line in up
    assert re.search(r"share-a\s+1/1\s+Running", share) and re.search(r"share-b\s+1/1\s+Running", share), (
        share
    )
    assert re.search(r"too-big\s+0/1\s+Pending", share), share
    assignment = json.loads(next(line for line in share.splitlines() if line.startswith('{"node"')))
    assert assignment["milli"] == 500 and assignment["memoryMiB"] == 20480 and len(assignment["gpus"]) == 1
    limits = json.loads(next(line for line in share.splitlines() if '"gpusched.io/gpu-share"' in line))
    assert limits["gpusched.io/gpu-share"] == "1"
    assert "gpu-count-too-large: the pod asks 8 GPUs; no node has more than 4" in doctor, doctor
    assert "fits if nvidia.com/gpu ≤ 4" in doctor, doctor
    assert not (home / ".cache" / "gpusched" / "testenv").exists()  # down removed its state
