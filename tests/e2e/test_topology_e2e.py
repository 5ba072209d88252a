"""GPU topology end to end on kwok (issue 31 item 4): the standalone scheduler reads the node agent's
``gpusched.io/gpu-topology`` annotation from the Node, and a 4-GPU pod takes one NVLink island."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpusched.agent.inventory import GpuDevice, Inventory
from gpusched.agent.labels import ANN_TOPOLOGY, topology_annotation
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"


def two_islands() -> Inventory:
    """8 GPUs: NVLink islands 0-3 (NUMA 0) and 4-7 (NUMA 1), every pair in an island peered."""
    devs = tuple(
        GpuDevice(
            g,
            f"GPU-{g}",
            "NVIDIA A100-SXM4-80GB",
            81920,
            f"00000000:{g + 16:02x}:00.0",
            8,
            0,
            nvlink_peers=tuple(p for p in range(4 * (g // 4), 4 * (g // 4) + 4) if p != g),
            numa_node=g // 4,
        )
        for g in range(8)
    )
    return Inventory("topo", "550.107.02", (12, 4), devs)


class Topo:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:8]
        self.ns = f"topo-{self.tag}"
        self.node = f"topo-{self.tag}"
        self.scheduler = f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path))
        self.v1 = client.CoreV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})

    def create_node(self) -> None:
        cap = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
        body = {
            "metadata": {
                "name": self.node,
                "labels": {
                    "type": "kwok",
                    GROUP: self.tag,
                    "nvidia.com/gpu.product": "A100-SXM4-80GB",
                    "nvidia.com/gpu.memory": "81920",
                },
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    ANN_TOPOLOGY: topology_annotation(two_islands()),  # as the agent writes it
                },
            },
            "status": {"capacity": cap, "allocatable": cap},
        }
        self.v1.create_node(body, _preload_content=False)

        def ready() -> bool:
            n = json.loads(self.v1.read_node(self.node, _preload_content=False).data)
            return any(
                c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
            )

        wait_until(ready, timeout=120, what="kwok node Ready", control_plane=self.cp, interval=1)

    def pod(self, name: str, gpus: int) -> None:
        body = {
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "schedulerName": self.scheduler,
                "nodeSelector": {GROUP: self.tag},
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
                ],
            },
        }
        self.v1.create_namespaced_pod(self.ns, body, _preload_content=False)

    def assignment(self, name: str) -> dict[str, Any] | None:
        """The pod's ``gpusched.io/assignment`` once it is bound, else None."""
        p = json.loads(self.v1.read_namespaced_pod(name, self.ns, _preload_content=False).data)
        ann = (p["metadata"].get("annotations") or {}).get(ANN_ASSIGNMENT)
        return dict(json.loads(ann)) if p["spec"].get("nodeName") and ann else None

    def cleanup(self) -> None:
        self.v1.delete_namespace(self.ns, _preload_content=False)
        self.v1.delete_node(self.node, _preload_content=False)


@pytest.fixture
def topo(control_plane: ControlPlane) -> Iterator[Topo]:
    t = Topo(control_plane)
    try:
        yield t
    finally:
        t.cleanup()


def test_a_four_gpu_pod_lands_on_one_nvlink_island(topo: Topo) -> None:
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    topo.create_node()
    sched = StandaloneScheduler(topo.api, SchedulerConfig(scheduler_name=topo.scheduler)).start()
    try:
        # a one-GPU pod breaks island 0 (GPU 0); topology-blind best fit would then give the 4-GPU pod
        # GPUs 1, 2, 3, 4 (two islands, two NUMA nodes); topology-aware gives it island 1 whole
        topo.pod("one", 1)
        wait_until(lambda: topo.assignment("one"), timeout=60, what="the one-GPU pod bound")
        one = topo.assignment("one")
        assert one is not None and one["node"] == topo.node and one["gpus"] == [0], one
        topo.pod("four", 4)
        wait_until(lambda: topo.assignment("four"), timeout=60, what="the 4-GPU pod bound")
        four = topo.assignment("four")
        assert four is not None and four["node"] == topo.node and four["gpus"] == [4, 5, 6, 7], four
    finally:
        sched.stop()
