"""GPU health end to end on kwok: the standalone scheduler reads the node agent's
``gpusched.io/unhealthy-gpus`` annotation from the Node. A new pod avoids the failed GPU, a pod that
needs it waits, and recovery (the annotation removed) brings the GPU back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpusched.agent.health import ANN_UNHEALTHY_GPUS
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"


class Health:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:8]
        self.ns = f"health-{self.tag}"
        self.node = f"health-{self.tag}"
        self.scheduler = f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path))
        self.v1 = client.CoreV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})

    def create_node(self, gpus: int, unhealthy: str) -> None:
        """As the kubelet and the agent report a node whose GPU(s) ``unhealthy`` failed: capacity keeps every
        GPU, allocatable leaves the failed ones out, the annotation names them."""
        bad = len([g for g in unhealthy.split(",") if g])
        cap = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        body = {
            "metadata": {
                "name": self.node,
                "labels": {
                    "type": "kwok",
                    GROUP: self.tag,
                    "nvidia.com/gpu.product": "A100-SXM4-80GB",
                    "nvidia.com/gpu.memory": "81920",
                },
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", ANN_UNHEALTHY_GPUS: unhealthy},
            },
            "status": {"capacity": cap, "allocatable": {**cap, "nvidia.com/gpu": str(gpus - bad)}},
        }
        self.v1.create_node(body, _preload_content=False)

        def ready() -> bool:
            n = self.get_node()
            return any(
                c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
            )

        wait_until(ready, timeout=120, what="kwok node Ready", control_plane=self.cp, interval=1)

    def get_node(self) -> dict[str, Any]:
        return dict(json.loads(self.v1.read_node(self.node, _preload_content=False).data))

    def pod(self, name: str, res: dict[str, str]) -> None:
        body = {
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "schedulerName": self.scheduler,
                "nodeSelector": {GROUP: self.tag},
                "containers": [{"name": "c", "image": "pause", "resources": {"limits": res}}],
            },
        }
        self.v1.create_namespaced_pod(self.ns, body, _preload_content=False)

    def placement(self) -> dict[str, tuple[str, list[int]] | None]:
        """pod -> (node, assigned GPUs), None while not bound."""
        items = json.loads(self.v1.list_namespaced_pod(self.ns, _preload_content=False).data)["items"]
        out: dict[str, tuple[str, list[int]] | None] = {}
        for p in items:
            node = p["spec"].get("nodeName")
            ann = (p["metadata"].get("annotations") or {}).get(ANN_ASSIGNMENT)
            out[p["metadata"]["name"]] = (node, json.loads(ann)["gpus"]) if node and ann else None
        return out

    def failed(self, name: str) -> bool:
        resp = self.v1.list_namespaced_event(self.ns, field_selector="reason=FailedScheduling")
        return any(e.involved_object.name == name for e in resp.items)

    def cleanup(self) -> None:
        self.v1.delete_namespace(self.ns, _preload_content=False)
        self.v1.delete_node(self.node, _preload_content=False)


@pytest.fixture
def health(control_plane: ControlPlane) -> Iterator[Health]:
    h = Health(control_plane)
    try:
        yield h
    finally:
        h.cleanup()


def test_new_pods_avoid_an_unhealthy_gpu_until_it_recovers(health: Health) -> None:
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    health.create_node(gpus=3, unhealthy="1")
    sched = StandaloneScheduler(health.api, SchedulerConfig(scheduler_name=health.scheduler)).start()
    try:
        # GPU 1 failed: two whole-GPU pods take GPUs 0 and 2 (numbered as the agent numbers them, although
        # allocatable says 2), a memory-only share finds no healthy GPU left and waits
        health.pod("whole-a", {"nvidia.com/gpu": "1"})
        health.pod("whole-b", {"nvidia.com/gpu": "1"})
        wait_until(
            lambda: all(health.placement().get(n) for n in ("whole-a", "whole-b")),
            timeout=60,
            what="two whole-GPU pods bound",
        )
        placed = health.placement()
        a, b = placed["whole-a"], placed["whole-b"]
        assert a and b and sorted(a[1] + b[1]) == [0, 2], placed
        health.pod("share", {"gpusched.io/gpu-memory": "8192"})
        wait_until(lambda: health.failed("share"), timeout=60, what="FailedScheduling for the share")
        assert health.placement()["share"] is None

        # recovery: the agent removes the annotation (a JSON merge patch with null, as it writes it)
        health.v1.patch_node(health.node, {"metadata": {"annotations": {ANN_UNHEALTHY_GPUS: None}}})
        wait_until(lambda: health.placement().get("share"), timeout=90, what="the share bound after recovery")
        assert health.placement()["share"] == (health.node, [1])
    finally:
        sched.stop()
