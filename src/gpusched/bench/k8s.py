"""``gpusched bench k8s``: both Kubernetes front ends against the real control plane.

- standalone: pods/s bound through a real kube-apiserver onto ``nodes`` kwok GPU nodes
  (``bench.k8s_standalone``), pods created while the scheduler runs, and with a backlog
  (all pods created first: the scheduler's own rate, without the create path);
- extender: filter + prioritize latency at ``nodes`` nodes under concurrent requests
  (``bench.k8s_extender``).
"""

from __future__ import annotations

from typing import Any

from gpusched.bench.k8s_extender import bench_extender
from gpusched.bench.k8s_standalone import bench_standalone
from gpusched.testenv import ControlPlane


def bench_k8s(
    nodes: int = 1000, pods: int = 3000, policy: str = "default", concurrency: int = 8, requests: int = 2000
) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "pods": pods, "policy": policy}
    with ControlPlane(scheduler=False, kwok=True) as cp:  # the controller-manager lifts the not-ready taint
        live = bench_standalone(cp, nodes=nodes, pods=pods, policy=policy)
    with ControlPlane(scheduler=False, kwok=True) as cp:  # the controller-manager lifts the not-ready taint
        backlog = bench_standalone(cp, nodes=nodes, pods=pods, policy=policy, backlog=True)
    ext = bench_extender(nodes=nodes, requests=requests, concurrency=concurrency)
    ext1 = bench_extender(nodes=nodes, requests=requests, concurrency=1)
    out.update(
        pods_per_s=live["pods_per_s"],
        pods_per_s_backlog=backlog["pods_per_s"],
        extender_p50_ms=ext["extender_p50_ms"],
        extender_p99_ms=ext["extender_p99_ms"],
        extender_concurrency=concurrency,
        extender_p50_ms_serial=ext1["extender_p50_ms"],
        extender_p99_ms_serial=ext1["extender_p99_ms"],
        standalone=live,
        standalone_backlog=backlog,
        extender=ext,
    )
    return out
