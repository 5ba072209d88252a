"""Gang throughput of the standalone scheduler through a real apiserver, onto kwok GPU nodes.

``bench_gangs_k8s`` starts a control plane (with kwok and the gang CRDs), creates ``nodes`` kwok
nodes of 8 GPUs, then runs two rounds on them with the same pods (``gangs`` x ``size`` pods of 1
or 2 whole GPUs, seeded; everything fits):

- **gangs**: each ``size`` pods form a coscheduling PodGroup (``scheduling.x-k8s.io/v1alpha1``,
  ``minMember`` = ``size``), so every pod is decided with its gang, all or nothing;
- **plain**: the same pods without a group, each decided alone;

each in backlog mode (every pod created with the scheduler standing by, informers synced, then it
leads): pods/s is the scheduler's own rate, decide and bind through the API, from the moment it
leads until the last binding. The ratio gangs/plain is the cost of deciding by gang.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from kubernetes import client

from gpusched.bench.k8s_standalone import bench_node, ready_untainted
from gpusched.core.names import LABEL_BENCH
from gpusched.k8s.client import api_client
from gpusched.k8s.convert import RES_GPU
from gpusched.k8s.groupref import API, LABEL_COSCHEDULING
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.gangcrds import find_gang_crds, install_gang_crds

_LABEL = LABEL_BENCH


@dataclass(frozen=True, slots=True)
class GangRound:
    mode: str
    """"gangs" or "plain"."""
    pods: int
    scheduled: int
    bound_in_api: int
    seconds: float
    pods_per_s: float
    partly_bound_gangs: int
    """Gangs with some but not all of their pods bound at the end (must be 0)."""


@dataclass(frozen=True, slots=True)
class GangBenchReport:
    nodes: int
    gangs: int
    size: int
    policy: str
    gangs_round: GangRound
    plain_round: GangRound

    @property
    def ratio(self) -> float:
        """pods/s by gang over pods/s pod by pod."""
        return round(self.gangs_round.pods_per_s / max(1e-9, self.plain_round.pods_per_s), 3)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio_gangs_to_plain": self.ratio}


def _pod(name: str, tag: str, scheduler: str, gpus: int, group: str) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "2Gi", RES_GPU: str(gpus)}
    labels = {_LABEL: tag, **({LABEL_COSCHEDULING: group} if group else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {_LABEL: tag},
            "containers": [{"name": "main", "image": "pause", "resources": {"requests": res, "limits": res}}],
        },
    }


def _round(
    cp: ControlPlane, api: Any, tag: str, mode: str, gpus: list[int], size: int, policy: str, timeout_s: float
) -> GangRound:
    v1: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    ns = f"bench-{mode}-{tag}"
    sched_name = f"gpusched-bench-{mode}-{tag}"
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    a = API.COSCHEDULING.value
    n_gangs = len(gpus) // size
    sched = StandaloneScheduler(
        api, SchedulerConfig(scheduler_name=sched_name, policy=policy, bind_workers=16)
    ).start(lead=False)
    try:
        with ThreadPoolExecutor(16) as ex:
            if mode == "gangs":
                body = {"apiVersion": a.api_version, "kind": a.kind, "spec": {"minMember": size}}
                list(ex.map(lambda g: custom.create_namespaced_custom_object(
                    a.group, a.version, ns, a.plural, {**body, "metadata": {"name": f"g-{g:05d}"}}),
                    range(n_gangs)))  # fmt: skip
            groups = [f"g-{i // size:05d}" if mode == "gangs" else "" for i in range(len(gpus))]
            bodies = [
                _pod(f"g-{i // size:05d}-{i % size}", tag, sched_name, n, groups[i])
                for i, n in enumerate(gpus)
            ]
            list(ex.map(lambda b: v1.create_namespaced_pod(ns, b, _preload_content=False), bodies))
        sched.wait_synced()
        wait_until(lambda: len(sched.queue) >= len(gpus), timeout=timeout_s, what="informer to see every pod")
        t0 = time.perf_counter()
        sched.start_leading()
        wait_until(lambda: sched.scheduled >= len(gpus), timeout=timeout_s, what=f"{len(gpus)} pods bound",
                   interval=0.05)  # fmt: skip
        seconds = time.perf_counter() - t0
        items = json.loads(v1.list_namespaced_pod(ns, _preload_content=False).data)["items"]
        per_gang: dict[str, int] = {}
        for p in items:
            g = p["metadata"]["name"].rsplit("-", 1)[0]
            per_gang[g] = per_gang.get(g, 0) + int(bool((p.get("spec") or {}).get("nodeName")))
        return GangRound(
            mode=mode,
            pods=len(gpus),
            scheduled=sched.scheduled,
            bound_in_api=sum(per_gang.values()),
            seconds=round(seconds, 3),
            pods_per_s=round(sched.scheduled / seconds, 1),
            partly_bound_gangs=sum(1 for n in per_gang.values() if 0 < n < size),
        )
    finally:
        sched.stop()
        v1.delete_namespace(ns, _preload_content=False)
        wait_until(
            lambda: not _bound_pods(v1, ns), timeout=timeout_s, what="the round's pods gone", interval=1.0
        )


def _bound_pods(v1: Any, ns: str) -> int:
    items = json.loads(v1.list_namespaced_pod(ns, _preload_content=False).data)["items"]
    return len(items)


def bench_gangs_k8s(
    nodes: int = 1000, gangs: int = 500, size: int = 8, policy: str = "default", *, seed: int = 0,
    timeout_s: float = 900.0,
) -> GangBenchReport:  # fmt: skip
    """Both rounds (gangs, then plain) on one control plane and one set of nodes."""
    rng = np.random.default_rng(seed)
    gpus = [int(g) for g in rng.choice([1, 1, 2], size=gangs * size)]
    tag = uuid.uuid4().hex[:8]
    with ControlPlane(scheduler=False, kwok=True) as cp:
        install_gang_crds(cp, find_gang_crds())
        api = api_client(str(cp.kubeconfig_path), qps_pool=64)
        v1: Any = client.CoreV1Api(api)
        names = [f"bench-{tag}-{i:05d}" for i in range(nodes)]
        with ThreadPoolExecutor(16) as ex:
            list(
                ex.map(
                    lambda a: v1.create_node(bench_node(a[1], tag, a[0]), _preload_content=False),
                    enumerate(names),
                )
            )
        wait_until(lambda: ready_untainted(v1, tag) == nodes, timeout=timeout_s, what="bench nodes Ready",
                   control_plane=cp, interval=1.0)  # fmt: skip
        gang_round = _round(cp, api, tag, "gangs", gpus, size, policy, timeout_s)
        plain_round = _round(cp, api, tag, "plain", gpus, size, policy, timeout_s)
    return GangBenchReport(nodes, gangs, size, policy, gang_round, plain_round)
