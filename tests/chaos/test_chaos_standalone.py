"""Chaos runs of the standalone scheduler (``gpusched scheduler``) against the real control plane (issue 9:
"Never book a GPU twice"). One control plane for the module (no kube-scheduler: the pods name our
scheduler); each test its own namespace, kwok node group and schedulerName."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import scenarios
from chaoslib import RunFactory, Standalone

from gpusched.testenv import ControlPlane
from realparts import started

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def cp(control_plane_bin: Path) -> Iterator[ControlPlane]:
    with started(control_plane_bin, scheduler=False, controller_manager=True, kwok=True) as c:
        yield c


def front(cp: ControlPlane, tmp_path: Path, scenario: str, seed: int) -> Standalone:
    name = f"gpusched-{uuid.uuid4().hex[:6]}"
    return Standalone(cp.kubeconfig_path, tmp_path / f"standalone-{scenario}-{seed}.log", name)


def test_apiserver_killed(cp: ControlPlane, chaos_run: RunFactory, tmp_path: Path, seed: int) -> None:
    s = "apiserver-killed"
    scenarios.apiserver_killed(chaos_run(cp, s, seed, front(cp, tmp_path, s, seed)))


def test_scheduler_killed(cp: ControlPlane, chaos_run: RunFactory, tmp_path: Path, seed: int) -> None:
    s = "front-end-killed"
    scenarios.front_end_killed(
        chaos_run(cp, s, seed, front(cp, tmp_path, s, seed)), tmp_path, delay_s=(0.0, 0.5)
    )


def test_pods_deleted(cp: ControlPlane, chaos_run: RunFactory, tmp_path: Path, seed: int) -> None:
    s = "pods-deleted"
    scenarios.pods_deleted(chaos_run(cp, s, seed, front(cp, tmp_path, s, seed)))


def test_ambiguous_binding(cp: ControlPlane, chaos_run: RunFactory, tmp_path: Path, seed: int) -> None:
    s = "ambiguous-binding"
    scenarios.ambiguous_binding(chaos_run(cp, s, seed, front(cp, tmp_path, s, seed)), tmp_path)
