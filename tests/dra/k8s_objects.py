"""resource.k8s.io/v1 objects as decoded JSON, for the adapter's tests (NVIDIA's driver's shape)."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"


def gpu_device(i: int, memory: str = "40Gi", **extra: Any) -> dict[str, Any]:
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "index": {"int": i},
            "driverVersion": {"version": "550.54.15"},
        },
        "capacity": {"memory": {"value": memory}},
        **extra,
    }


def gpu_slice(node: str, devices: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
            **spec,
        },
    }


def device_class(name: str, expression: str = "device.driver == 'gpu.nvidia.com'") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def claim(
    name: str, requests: list[dict[str, Any]], ns: str = "ns", uid: str = "", **status: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "resourceVersion": "1"},
        "spec": {"devices": {"requests": requests}},
    }
    if status:
        out["status"] = status
    return out


def whole(cls: str = "gpu", count: int = 1, name: str = "gpu") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count}}


def allocation(node: str, *devices: str, request: str = "gpu") -> dict[str, Any]:
    return {
        "devices": {
            "results": [{"request": request, "driver": DRIVER, "pool": node, "device": d} for d in devices]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def pod(
    name: str, claims: list[dict[str, str]], ns: str = "ns", statuses: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
        "spec": {"resourceClaims": claims},
    }
    if statuses is not None:
        out["status"] = {"resourceClaimStatuses": statuses}
    return out
