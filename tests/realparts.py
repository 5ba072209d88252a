"""What every test of real parts (the control plane, helm, later the kubelet) shares: skip on a
developer's machine when a part is missing, fail under CI (``$CI`` set), where they must run; and a
control plane that is always stopped, its processes with it, however the tests end."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from gpusched.testenv import ControlPlane, ControlPlaneError


def unavailable(reason: str) -> NoReturn:
    """Skip locally; fail under CI, so that CI can never pass by skipping the real parts."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (failing rather than skipping because $CI is set)", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def started(bin_dir: Path, **kwargs: Any) -> Iterator[ControlPlane]:
    """A ``ControlPlane(bin_dir, **kwargs)``, started (failing the test if it does not start) and always
    stopped, its processes with it, however the tests end."""
    cp = ControlPlane(bin_dir=bin_dir, **kwargs)
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


GONE = "<deleted>"
"""What ``node_of`` answers for a pod the API no longer has."""


def node_of(core: Any, namespace: str, name: str) -> str | None:
    """The node pod ``namespace/name`` is bound to (None while pending; ``GONE`` once deleted), read
    from the API with ``core`` (a ``CoreV1Api``)."""
    from kubernetes import client

    try:
        node: str | None = core.read_namespaced_pod(name, namespace).spec.node_name
    except client.ApiException as e:
        if e.status == 404:
            return GONE
        raise
    return node
