"""Reclaim time of tenant queues on the real control plane, beside KAI's published figure.

Two tenant queues ``a`` and ``b`` share one cohort (a parent queue) and split ``nodes`` kwok nodes
of ``gpus_per_node`` GPUs in half by nominal quota. Tenant A is idle; B fills the whole cluster
with one-GPU pods (half of them on borrowed quota). Then A submits ``claim`` one-GPU pods (at most
its quota): gpusched must evict that many of B's borrowed pods through the Eviction API and bind
A's. **Reclaim time** is from A's first create until its last pod is bound (read from the API).

KAI scheduler publishes an average reclaim time of 13.9 s at 4000 running jobs
(``KAI_RECLAIM_S``); ``bench_reclaim(nodes=500, gpus_per_node=8)`` runs 4000 of B's pods.
Everything runs in one process (the scheduler included) against a real kube-apiserver; kwok
deletes evicted pods at once (no grace period to wait out), as KAI's benchmark also measures
the scheduler's own time.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from gpusched.k8s.client import api_client
from gpusched.k8s.convert import ANN_QUEUE, RES_GPU
from gpusched.k8s.queues import GROUP, PLURAL, VERSION
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.kwoknodes import kwok_gpu_node

KAI_RECLAIM_S = 13.9
"""KAI scheduler's published average reclaim time at 4000 running jobs (seconds)."""

QUEUE_CRD = (
    Path(__file__).resolve().parents[3] / "deploy" / "helm" / "gpusched" / "crds" / "queues.gpusched.io.yaml"
)
"""The Queue CRD as shipped (the repository's deploy/ folder)."""


@dataclass(frozen=True, slots=True)
class ReclaimResult:
    nodes: int
    gpus_per_node: int
    running: int
    """B's pods running before A submits (B borrows half of them)."""
    claim: int
    borrowed_before: int
    """B's borrowed GPUs as its Queue status said before A submitted."""
    reclaim_s: float
    """From A's first create until its last pod is bound."""
    evicted: int
    """B's pods gone or terminating afterwards."""
    b_bound_after: int
    a_bound: int
    kai_s: float = KAI_RECLAIM_S

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def install_queue_crd(cp: ControlPlane, crd: Path = QUEUE_CRD) -> None:
    """Apply the Queue CRD and wait until it is served."""
    cp.kubectl("apply", "--server-side", "-f", str(crd))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/queues.gpusched.io")


def queue_body(name: str, gpus: int | None = None, parent: str = "", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": name}}
    body["spec"] = {**({"parent": parent} if parent else {}), **spec}
    if gpus is not None:
        body["spec"]["nominalQuota"] = {"gpus": gpus}
    return body


def gpu_pod(name: str, ns: str, scheduler: str, selector: dict[str, str], queue: str) -> dict[str, Any]:
    res = {"cpu": "100m", "memory": "128Mi", RES_GPU: "1"}
    return {
        "metadata": {"name": name, "namespace": ns, "annotations": {ANN_QUEUE: queue}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}],
        },
    }


def _ready(v1: Any, tag: str) -> int:
    resp = v1.list_node(label_selector=f"gpusched.io/bench={tag}", _preload_content=False)
    n = 0
    for item in json.loads(resp.data)["items"]:
        conds = (item.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        n += ready and not (item.get("spec") or {}).get("taints")
    return n


def _bound(v1: Any, ns: str, prefix: str) -> int:
    items = json.loads(v1.list_namespaced_pod(ns, _preload_content=False).data)["items"]
    return sum(
        1 for p in items
        if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
    )  # fmt: skip


def bench_reclaim(
    cp: ControlPlane,
    *,
    nodes: int = 2,
    gpus_per_node: int = 4,
    claim: int | None = None,
    timeout_s: float = 900,
) -> ReclaimResult:
    """Run the scenario of the module on ``cp`` (kwok, the Queue CRD installed here); everything
    it creates is removed afterwards."""
    total = nodes * gpus_per_node
    half = total // 2
    claim = half if claim is None else min(claim, half)
    tag = uuid.uuid4().hex[:8]
    api = api_client(str(cp.kubeconfig_path), qps_pool=32)
    v1: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns, sched_name, label = f"reclaim-{tag}", f"gpusched-{tag}", {"gpusched.io/bench": tag}
    install_queue_crd(cp)
    qa, qb, root = f"a-{tag}", f"b-{tag}", f"org-{tag}"
    queues = [queue_body(root), queue_body(qa, half, root), queue_body(qb, total - half, root)]
    v1.create_namespace({"metadata": {"name": ns}}, _preload_content=False)
    for q in queues:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, q, _preload_content=False)
    names = [f"{tag}-n{i}" for i in range(nodes)]
    sched = None
    try:

        def node(n: str) -> dict[str, Any]:
            return kwok_gpu_node(n, gpus_per_node, model="A100-SXM4-80GB", gpu_memory_mib=81920, labels=label)

        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda n: v1.create_node(node(n), _preload_content=False), names))
        wait_until(
            lambda: _ready(v1, tag) == nodes, timeout=240, what="kwok nodes Ready and untainted", interval=1
        )
        sched = StandaloneScheduler(api, SchedulerConfig(scheduler_name=sched_name)).start()
        wait_until(
            lambda: sched is not None and sched.tenants.directory.synced(), timeout=60, what="queues synced"
        )

        def create(prefix: str, count: int, queue: str) -> None:
            bodies = [gpu_pod(f"{prefix}{i}", ns, sched_name, label, queue) for i in range(count)]
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda b: v1.create_namespaced_pod(ns, b, _preload_content=False), bodies))

        create("b-", total, qb)
        wait_until(
            lambda: _bound(v1, ns, "b-") == total,
            timeout=timeout_s,
            what=f"B's {total} pods bound",
            interval=1,
        )

        def borrowed() -> int:
            resp = custom.get_cluster_custom_object_status(GROUP, VERSION, PLURAL, qb, _preload_content=False)
            st = json.loads(resp.data).get("status") or {}
            return int((st.get("borrowed") or {}).get("gpus", 0))

        wait_until(lambda: borrowed() == half, timeout=60, what="B's status shows what it borrows")
        before = borrowed()
        t0 = time.perf_counter()
        create("a-", claim, qa)
        wait_until(
            lambda: _bound(v1, ns, "a-") == claim,
            timeout=timeout_s,
            what=f"A's {claim} pods bound",
            interval=0.2,
        )
        reclaim_s = time.perf_counter() - t0
        b_after = _bound(v1, ns, "b-")
        return ReclaimResult(
            nodes,
            gpus_per_node,
            total,
            claim,
            before,
            reclaim_s,
            total - b_after,
            b_after,
            _bound(v1, ns, "a-"),
        )
    finally:
        if sched is not None:
            sched.stop()
        v1.delete_namespace(ns, _preload_content=False)
        for n in names:
            v1.delete_node(n, _preload_content=False)
        for q in queues:
            custom.delete_cluster_custom_object(
                GROUP, VERSION, PLURAL, q["metadata"]["name"], _preload_content=False
            )


def bench_reclaim_fresh(nodes: int = 500, gpus_per_node: int = 8, claim: int | None = None) -> ReclaimResult:
    """``bench_reclaim`` on a control plane of its own (``gpusched bench reclaim``)."""
    with ControlPlane(scheduler=False, kwok=True) as cp:
        return bench_reclaim(cp, nodes=nodes, gpus_per_node=gpus_per_node, claim=claim)
