"""Fixtures for the e2e tests: a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) with kwok playing the kubelets, built from the official Go modules.

The binaries come from ``$GPUSCHED_CONTROLPLANE_BIN`` or ``hack/build-control-plane.sh`` (cached; the first
build needs Go and takes many minutes). Without Go the e2e tests are skipped, unless ``$CI`` is set: then they
fail, so that CI can never pass by skipping them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.testenv import ControlPlane
from realparts import started, unavailable


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs against a real Kubernetes control plane (needs Go once, to build it)"
    )


@pytest.fixture(scope="session")
def control_plane(control_plane_bin: Path) -> Iterator[ControlPlane]:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        unavailable("the 'kubernetes' Python client is not installed (pip install kubernetes==37.0.2)")
    with started(control_plane_bin, scheduler=True, controller_manager=True, kwok=True) as cp:
        yield cp


@pytest.fixture(scope="session")
def core_v1(control_plane: ControlPlane) -> Any:
    """A ``kubernetes.client.CoreV1Api`` for the admin of ``control_plane``."""
    from kubernetes import client

    return client.CoreV1Api(control_plane.api_client())


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """DNS-1123 names that no other test uses."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    return make
