"""Throughput of the standalone scheduler through a real apiserver, onto kwok GPU nodes.

``bench_standalone(cp)`` creates ``nodes`` kwok nodes (8 GPUs each, a GPU model label and a
GPU memory label), waits until they are Ready and untainted, starts the scheduler in this
process, then creates ``pods`` pods (a seeded mix of whole GPUs and ``gpusched.io/gpu-milli``
shares, all fitting) from a pool of threads and measures pods/s from the first create to
the last successful binding. Everything it creates is labelled and removed afterwards.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from kubernetes import client

from gpusched.k8s.client import api_client
from gpusched.k8s.convert import RES_GPU, RES_MILLI
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.kwoknodes import kwok_gpu_node

_MODELS = (("A100-SXM4-80GB", 81920), ("V100-SXM2-32GB", 32768), ("T4", 15360))


def bench_node(name: str, tag: str, i: int) -> dict[str, Any]:
    model, mem = _MODELS[i % len(_MODELS)]
    return kwok_gpu_node(
        name,
        8,
        model=model,
        gpu_memory_mib=mem,
        memory="768Gi",
        pods="250",
        labels={"gpusched.io/bench": tag},
    )


def _pod(name: str, tag: str, scheduler: str, rng: np.random.Generator) -> dict[str, Any]:
    res: dict[str, str] = {
        "cpu": str(int(rng.choice([1, 2, 4]))),
        "memory": f"{int(rng.choice([2, 8, 16]))}Gi",
    }
    if rng.random() < 0.6:
        res[RES_MILLI] = str(int(rng.choice([100, 250, 300, 500, 700])))
    else:
        res[RES_GPU] = str(int(rng.choice([1, 1, 1, 2, 4, 8])))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpusched.io/bench": tag}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"gpusched.io/bench": tag},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


def _bench_nodes(v1: Any, tag: str) -> list[dict[str, Any]]:
    resp = v1.list_node(label_selector=f"gpusched.io/bench={tag}", _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def _is_ready(item: dict[str, Any]) -> bool:
    conds = (item.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def ready_nodes(v1: Any, tag: str) -> set[str]:
    """Names of the bench nodes ``tag`` that are Ready now."""
    return {i["metadata"]["name"] for i in _bench_nodes(v1, tag) if _is_ready(i)}


def _schedulable(item: dict[str, Any]) -> bool:
    """Ready, and without a NoSchedule or NoExecute taint."""
    taints = (item.get("spec") or {}).get("taints") or []
    return _is_ready(item) and not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in taints)


def settled(item: dict[str, Any]) -> bool:
    """Whether a node is done joining: ``_schedulable`` (the node lifecycle controller lifts
    ``node.kubernetes.io/not-ready`` some time after the node turns Ready) and with its legacy
    ``beta.kubernetes.io/os``/``arch`` labels, which the same controller adds. Until then each of
    those changes is an update to every node watcher."""
    labels = (item.get("metadata") or {}).get("labels") or {}
    legacy = all(f"beta.{k}" in labels for k in ("kubernetes.io/os", "kubernetes.io/arch") if k in labels)
    return _schedulable(item) and legacy


def settled_nodes(v1: Any, tag: str) -> int:
    """How many of the bench nodes ``tag`` are ``settled``."""
    return sum(settled(item) for item in _bench_nodes(v1, tag))


def ready_untainted(v1: Any, tag: str) -> int:
    return sum(_schedulable(item) for item in _bench_nodes(v1, tag))


def bench_standalone(
    cp: ControlPlane,
    nodes: int = 1000,
    pods: int = 3000,
    policy: str = "default",
    *,
    create_threads: int = 16,
    bind_workers: int = 16,
    seed: int = 0,
    timeout_s: float = 600.0,
    backlog: bool = False,
) -> dict[str, Any]:
    """Create ``nodes`` kwok nodes and ``pods`` pods, schedule them all; return the rate.

    ``backlog``: create every pod first with the scheduler standing by (informers synced,
    not leading), then let it lead: ``pods_per_s`` is then the scheduler's own rate (decide
    and bind through the API), without the apiserver's pod-creation rate in the way."""
    tag = uuid.uuid4().hex[:8]
    sched_name = f"gpusched-bench-{tag}"
    ns = f"bench-{tag}"
    api = api_client(str(cp.kubeconfig_path), qps_pool=max(64, create_threads + bind_workers + 8))
    v1: Any = client.CoreV1Api(api)
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    node_names = [f"bench-{tag}-{i:05d}" for i in range(nodes)]
    rng = np.random.default_rng(seed)
    bodies = [_pod(f"p-{i:06d}", tag, sched_name, rng) for i in range(pods)]
    sched = None
    try:
        with ThreadPoolExecutor(create_threads) as ex:
            list(ex.map(lambda a: v1.create_node(bench_node(a[1], tag, a[0]), _preload_content=False),
                        enumerate(node_names)))  # fmt: skip
        wait_until(lambda: ready_untainted(v1, tag) == nodes, timeout=timeout_s, what="bench nodes Ready",
                   control_plane=cp, interval=1.0)  # fmt: skip
        sched = StandaloneScheduler(
            api, SchedulerConfig(scheduler_name=sched_name, policy=policy, bind_workers=bind_workers)
        ).start(lead=not backlog)
        sched.wait_synced()
        s = sched
        t0 = time.perf_counter()
        with ThreadPoolExecutor(create_threads) as ex:
            list(ex.map(lambda b: v1.create_namespaced_pod(ns, b, _preload_content=False), bodies))
        t_created = time.perf_counter() - t0
        if backlog:
            wait_until(lambda: len(s.queue) >= pods, timeout=timeout_s, what="informer to see every pod")
            t0 = time.perf_counter()
            s.start_leading()

        def finished() -> bool:  # all bound, or the rest found unschedulable (too many pods for the nodes)
            return s.scheduled + s.queue.counts()["unschedulable"] >= pods

        wait_until(finished, timeout=timeout_s, what=f"{pods} pods bound", interval=0.05)
        seconds = time.perf_counter() - t0
        resp = v1.list_namespaced_pod(ns, _preload_content=False)
        bound = sum(1 for p in json.loads(resp.data)["items"] if (p.get("spec") or {}).get("nodeName"))
        cycle_s = s.metrics.registry.get_sample_value(
            "gpusched_scheduling_attempt_duration_seconds_sum", {"result": "scheduled"}
        )
        return {
            "pods_per_s": round(s.scheduled / seconds, 1),
            "pods": pods,
            "scheduled": s.scheduled,
            "nodes": nodes,
            "seconds": round(seconds, 3),
            "create_seconds": round(t_created, 3),
            "create_pods_per_s": round(pods / t_created, 1),
            "mode": "backlog" if backlog else "create+schedule",
            "bound_in_api": bound,
            "bind_errors": s.bind_errors,
            "policy": policy,
            "mean_cycle_ms": round(1000 * (cycle_s or 0.0) / max(1, pods), 3),
        }
    finally:
        if sched is not None:
            sched.stop()
        v1.delete_namespace(ns, _preload_content=False)
        v1.delete_collection_node(label_selector=f"gpusched.io/bench={tag}", _preload_content=False)
