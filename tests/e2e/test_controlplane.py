"""The e2e control plane itself: a kwok GPU node becomes Ready, pods on it run, kube-scheduler binds pods."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
NAMESPACE = "default"


def node_manifest(name: str, gpus: int = 8) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", "gpusched.io/e2e": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod_manifest(name: str, *, gpus: int, node_name: str | None = None, **spec: Any) -> dict[str, Any]:
    resources = {"cpu": "1", "memory": "1Gi", GPU: str(gpus)}
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
        **spec,
    }
    if node_name is not None:
        pod_spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


def node_is_ready(node: Any) -> bool:
    conditions = node.status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


@pytest.fixture
def gpu_node(control_plane: ControlPlane, core_v1: Any, unique_name: Callable[[str], str]) -> Iterator[str]:
    """A fresh kwok node with 8 GPUs, waited for until Ready."""
    name = unique_name("gpu-node")
    core_v1.create_node(node_manifest(name))
    wait_until(
        lambda: node_is_ready(core_v1.read_node(name)),
        timeout=60,
        what=f"kwok to mark node {name} Ready",
        control_plane=control_plane,
    )
    yield name
    core_v1.delete_node(name)


def pod_phase(core_v1: Any, name: str) -> str | None:
    phase: str | None = core_v1.read_namespaced_pod(name, NAMESPACE).status.phase
    return phase


def test_kwok_node_capacity_and_pod_running(
    control_plane: ControlPlane, core_v1: Any, gpu_node: str, unique_name: Callable[[str], str]
) -> None:
    node = core_v1.read_node(gpu_node)
    assert node.status.allocatable[GPU] == "8"
    assert node.status.capacity[GPU] == "8"
    assert node_is_ready(node)

    name = unique_name("bound")
    core_v1.create_namespaced_pod(NAMESPACE, pod_manifest(name, gpus=1, node_name=gpu_node))
    wait_until(
        lambda: pod_phase(core_v1, name) == "Running",
        timeout=60,
        what=f"kwok to run pod {name}",
        control_plane=control_plane,
    )
    pod = core_v1.read_namespaced_pod(name, NAMESPACE)
    assert pod.spec.node_name == gpu_node
    assert pod.status.pod_ip
    core_v1.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_default_scheduler_binds_gpu_pod_to_kwok_node(
    control_plane: ControlPlane, core_v1: Any, gpu_node: str, unique_name: Callable[[str], str]
) -> None:
    name = unique_name("scheduled")
    manifest = pod_manifest(
        name,
        gpus=2,
        schedulerName="default-scheduler",
        nodeSelector={"kubernetes.io/hostname": gpu_node},
    )
    core_v1.create_namespaced_pod(NAMESPACE, manifest)

    def bound_node() -> str | None:
        node_name: str | None = core_v1.read_namespaced_pod(name, NAMESPACE).spec.node_name
        return node_name

    assert (
        wait_until(bound_node, timeout=90, what=f"kube-scheduler to bind {name}", control_plane=control_plane)
        == gpu_node
    )
    wait_until(
        lambda: pod_phase(core_v1, name) == "Running",
        timeout=60,
        what=f"kwok to run pod {name}",
        control_plane=control_plane,
    )

    def scheduled_event() -> bool:
        selector = f"involvedObject.name={name}"
        events = core_v1.list_namespaced_event(NAMESPACE, field_selector=selector).items
        return any(
            e.reason == "Scheduled"
            and "default-scheduler" in (e.reporting_component, e.source and e.source.component)
            for e in events
        )

    wait_until(scheduled_event, timeout=30, what=f"the Scheduled event of {name}")
    core_v1.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_kubectl_server_side_dry_run(control_plane: ControlPlane, unique_name: Callable[[str], str]) -> None:
    manifest = pod_manifest(unique_name("dry-run"), gpus=1)
    out = control_plane.kubectl(
        "apply", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(manifest)
    )
    applied = json.loads(out.stdout)
    assert applied["metadata"]["uid"]  # filled in by the apiserver, never persisted
    assert applied["spec"]["schedulerName"] == "default-scheduler"
    rejected = control_plane.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps({**manifest, "spec": {"containers": []}}),
        check=False,
    )
    assert rejected.returncode != 0
    assert "spec.containers" in rejected.stderr
