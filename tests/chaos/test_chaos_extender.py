"""Chaos runs of the extender (``gpusched extender``) behind a real kube-scheduler configured from
deploy/extender/scheduler-config.yaml (urlPrefix on a loopback port), against the real control plane
(issue 9: "Never book a GPU twice"). One control plane for the module; each test its own namespace and
kwok node group, and its own extender process on the port kube-scheduler calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import scenarios
import yaml
from chaoslib import Extender, RunFactory

from gpusched.testenv import ControlPlane, free_port
from realparts import started

pytestmark = pytest.mark.chaos

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "extender" / "scheduler-config.yaml"


@pytest.fixture(scope="module")
def cp(control_plane_bin: Path) -> Iterator[tuple[ControlPlane, int]]:
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    with started(control_plane_bin, scheduler_config=config, controller_manager=True, kwok=True) as c:
        yield c, port


def front(cp: tuple[ControlPlane, int], tmp_path: Path, scenario: str, seed: int) -> Extender:
    control_plane, port = cp
    return Extender(control_plane.kubeconfig_path, tmp_path / f"extender-{scenario}-{seed}.log", port)


def test_apiserver_killed(
    cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int
) -> None:
    s = "apiserver-killed"
    scenarios.apiserver_killed(chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)))


def test_extender_killed(
    cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int
) -> None:
    """Restarted 1–2 s after the SIGKILL, while kube-scheduler keeps calling it (two kills: a restart
    takes about 5 s here, and pods arrive for 12 s)."""
    s = "front-end-killed"
    scenarios.front_end_killed(
        chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)),
        tmp_path,
        delay_s=(1.0, 2.0),
        kills=(0.15, 0.55),
    )


def test_pods_deleted(cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int) -> None:
    s = "pods-deleted"
    scenarios.pods_deleted(chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)))


def test_ambiguous_binding(
    cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int
) -> None:
    s = "ambiguous-binding"
    scenarios.ambiguous_binding(chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)), tmp_path)
