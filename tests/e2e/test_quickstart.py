"""docs/quickstart.md's commands as written, in one shell, as a newcomer runs them after the clone and the
install (its first block, which this checkout has done): ``gpusched up``, ``source`` of the env file it
prints, the local examples, the share pods' assignment and slot, ``gpusched doctor`` on the pod that cannot
fit, ``gpusched down``. ``$HOME`` is a temporary folder (the default state folder lives under it); the
control plane binaries are the cached build ($GPUSCHED_CONTROLPLANE_BIN), as on a second run.

Both of the page's paths: kwok nodes (``test_quickstart_as_written``; the ```` ```sh real-node ```` blocks are
left out), and the real node (``test_quickstart_on_a_real_node_as_written``, marked ``kubelet``: root,
containerd and the local images; every block, the containers' GPU environment included). ``$GPUSCHED_UP_NODE``
(``gpusched up --node``'s variable) picks the path without changing the commands."""

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
REAL_NODE_BLOCK = "sh real-node"


def quickstart_blocks(real_node: bool) -> list[str]:
    """The ```sh blocks of the page after the first (the clone and the install); the ```sh real-node ones
    only for the real node."""
    blocks = re.findall(r"```(sh|sh real-node)\n(.*?)```", QUICKSTART.read_text(), re.S)
    assert "git clone" in blocks[0][1] and "pip install" in blocks[0][1], blocks[0]
    return [text for kind, text in blocks[1:] if real_node or kind != REAL_NODE_BLOCK]


def run_quickstart(
    control_plane_bin: Path, home: Path, real_node: bool, extra_env: dict[str, str], timeout: float
) -> tuple[list[str], float]:
    """The page's blocks in one ``bash`` (``set -euo pipefail``); each block's output (split at the
    ``+++ N`` lines), and the wall time. ``gpusched down`` always runs after, in case a block failed."""
    home.mkdir()
    scripts = Path(sys.executable).parent
    env = {**os.environ, "HOME": str(home), "GPUSCHED_CONTROLPLANE_BIN": str(control_plane_bin),
           "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}", **extra_env}  # fmt: skip
    if shutil.which("gpusched", path=env["PATH"]) is None:
        unavailable("the gpusched command is not installed (python3 -m pip install -e .)")
    script = "set -euo pipefail\n" + "\n".join(
        f"echo '+++ {i}'\n{b}" for i, b in enumerate(quickstart_blocks(real_node))
    )
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    finally:
        wall = time.monotonic() - t0
        subprocess.run(
            ["gpusched", "down"], cwd=ROOT, env=env, capture_output=True, timeout=300
        )  # after a failure
    out = proc.stdout
    print(f"\nquickstart ({wall:.1f} s):\n{out}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (home / ".cache" / "gpusched" / "testenv").exists()  # down removed its state
    return out.split("+++ ")[1:], wall


def check_shares_and_doctor(share: str, doctor: str, fits_with: int) -> dict[str, object]:
    assert re.search(r"share-a\s+1/1\s+Running", share) and re.search(r"share-b\s+1/1\s+Running", share), (
        share
    )
    assert re.search(r"too-big\s+0/1\s+Pending", share), share
    assignment: dict[str, object] = json.loads(
        next(line for line in share.splitlines() if line.startswith('{"node"'))
    )
    assert assignment["milli"] == 500 and assignment["memoryMiB"] == 20480, assignment
    assert isinstance(assignment["gpus"], list) and len(assignment["gpus"]) == 1, assignment
    limits = json.loads(next(line for line in share.splitlines() if '"gpusched.io/gpu-share"' in line))
    assert limits["gpusched.io/gpu-share"] == "1"
    assert "gpu-count-too-large: the pod asks 8 GPUs; no node has more than 4" in doctor, doctor
    assert f"fits if nvidia.com/gpu ≤ {fits_with} (asks 8" in doctor, doctor
    return assignment


def test_quickstart_as_written(control_plane_bin: Path, tmp_path: Path) -> None:
    blocks, _ = run_quickstart(
        control_plane_bin, tmp_path / "home", False, {"GPUSCHED_UP_NODE": "kwok"}, timeout=300
    )
    up, share, doctor, _down = blocks
    assert "gpusched up: 2 kwok node(s) x 4 NVIDIA-A100-SXM4-80GB GPU(s)" in up
    for line in ("next:", "kubectl apply -f deploy/examples/local/", "gpusched doctor pod gpu-demo/too-big"):
        assert line in up
    check_shares_and_doctor(share, doctor, fits_with=4)  # the second node's 4 GPUs are free


@pytest.mark.kubelet
def test_quickstart_on_a_real_node_as_written(control_plane_bin: Path, tmp_path: Path) -> None:
    """The real node's path: its containers run and print the GPU environment the agent's device plugin
    gave them, the one GPU of the assignment for both shares, each with its own limits."""
    from gpusched.testenv.node import NodePartsMissingError, find_node_images, missing_parts
    from gpusched.testenv.nodeholder import another_real_node_runs

    missing = missing_parts(control_plane_bin)
    if missing:
        unavailable("the real node cannot run here: " + "; ".join(missing))
    try:
        images = find_node_images()
    except NodePartsMissingError as exc:
        unavailable(str(exc))
    # One real node per machine: wait here for another one (the kubelet tests' session node, on another
    # xdist worker) to go, as `gpusched up --node real` itself waits only LOCK_WAIT_S.
    deadline = time.monotonic() + 1800
    while another_real_node_runs():
        assert time.monotonic() < deadline, "another real node ran on this machine for 30 minutes"
        time.sleep(2)
    blocks, wall = run_quickstart(
        control_plane_bin, tmp_path / "home", True,
        {"GPUSCHED_UP_NODE": "real", "GPUSCHED_NODE_IMAGES": str(images)},
        timeout=1200,  # another real node on this machine (the kubelet tests) is waited for, up to 600 s
    )  # fmt: skip
    up, share, logs, doctor, down = blocks
    assert f"gpusched up: node images from $GPUSCHED_NODE_IMAGES: {images}" in up, up
    assert "gpusched up: 1 real node gpu-node-0 (containerd, kubelet, gpusched's agent) x 4 fake " in up, up
    assert "kubectl -n gpu-demo logs share-a" in up, up
    assignment = check_shares_and_doctor(share, doctor, fits_with=3)  # one of its 4 GPUs holds the shares
    assert assignment["node"] == "gpu-node-0", assignment
    assert logs.startswith("2\n--- share-a\n"), logs
    a, b = logs.split("--- share-b\n")
    env_a = dict(line.split("=", 1) for line in a.splitlines() if "=" in line)
    env_b = dict(line.split("=", 1) for line in b.splitlines() if "=" in line)
    uuid = env_a["NVIDIA_VISIBLE_DEVICES"]
    assert uuid.startswith("GPU-") and "," not in uuid, env_a
    assert env_b["NVIDIA_VISIBLE_DEVICES"] == uuid  # both shares on the one GPU of the assignment
    assert (env_a["GPUSCHED_GPU_MILLI"], env_a["GPUSCHED_GPU_MEMORY_MIB"]) == ("500", "20480"), env_a
    assert (env_b["GPUSCHED_GPU_MILLI"], env_b["GPUSCHED_GPU_MEMORY_MIB"]) == ("300", "8192"), env_b
    assert "gpusched down: stopped" in down, down
    assert not Path("/sys/class/net/gpusched-br0").exists()  # the node's teardown ran
    print(f"real-node quickstart as written: {wall:.1f} s")
