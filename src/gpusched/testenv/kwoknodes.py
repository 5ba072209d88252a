"""Node objects for kwok (simulated kubelets) with GPUs, labelled as gpu-feature-discovery does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched.k8s.convert import LABEL_MEMORY, LABEL_PRODUCT, RES_GPU, RES_MEMORY, RES_MILLI, RES_SHARE

# The node agent's default: gpusched.io/gpu-share slots per GPU (gpusched.agent.plugin.DEFAULT_SLOTS).
SHARE_SLOTS_PER_GPU = 16

LABEL_COUNT = "nvidia.com/gpu.count"


def kwok_gpu_node(
    name: str,
    gpus: int,
    *,
    model: str,
    gpu_memory_mib: int,
    cpu: str = "96",
    memory: str = "1024Gi",
    pods: str = "110",
    labels: Mapping[str, str] | None = None,
    share_slots: int = SHARE_SLOTS_PER_GPU,
) -> dict[str, Any]:
    """A Node that kwok manages, with ``gpus`` GPUs of ``model`` (advertised as ``nvidia.com/gpu``
    with the share slots gpusched's node agent advertises, ``share_slots`` per GPU, that the webhook's
    ``gpusched.io/gpu-share: 1`` asks for), and the milli and memory totals."""
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": pods,
        RES_GPU: str(gpus),
        RES_MILLI: str(1000 * gpus),
        RES_MEMORY: str(gpu_memory_mib * gpus),
        RES_SHARE: str(share_slots * gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                LABEL_PRODUCT: model,
                LABEL_MEMORY: str(gpu_memory_mib),
                LABEL_COUNT: str(gpus),
                **(labels or {}),
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": resources, "allocatable": resources},
    }
