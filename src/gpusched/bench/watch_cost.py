"""``gpusched bench watch-cost``: what one more watcher of every pod costs the apiserver.

Both of gpusched's front ends keep their books from their own informers, and in extender mode
that watch comes on top of kube-scheduler's: every pod event is written to one more stream.
This measures that cost alone, on a real control plane (etcd and kube-apiserver; no scheduler,
no kwok): each round starts ``watchers`` extra watches of every pod (JSON, through
``k8s.informer.Reflector``, as the front ends watch), then runs ``pods`` pod lifecycles as a
scheduler and a kubelet would make them (create, a Binding with the assignment annotation, a
status update to Running, delete), ``threads`` at a time, and reads the CPU time that the
apiserver and etcd spent per lifecycle (``bench.proc_cpu``). The rounds cycle through the
watcher counts ``rounds`` times, so that the machine's drift touches every count alike; the
report gives each count's median and the apiserver's extra CPU per pod for each watcher added.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from gpusched.bench.proc_cpu import CpuSampler
from gpusched.core.errors import InvalidInput
from gpusched.core.model import PodSpec
from gpusched.k8s.client import api_client
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_MILLI, assignment_annotation
from gpusched.k8s.informer import Handlers, Reflector
from gpusched.k8s.rest import FastCoreV1
from gpusched.testenv import ControlPlane

NAMESPACE = "watch-cost"
NODE = "watch-cost-node"


@dataclass(frozen=True)
class WatchRound:
    watchers: int
    pods: int
    pods_per_s: float
    apiserver_ms_per_pod: float
    etcd_ms_per_pod: float


@dataclass
class WatchCostReport:
    pods: int
    rounds: list[WatchRound] = field(default_factory=list)

    def medians(self) -> dict[int, float]:
        """The apiserver's median CPU ms per pod lifecycle, by number of extra watchers."""
        by: dict[int, list[float]] = {}
        for r in self.rounds:
            by.setdefault(r.watchers, []).append(r.apiserver_ms_per_pod)
        return {w: round(statistics.median(v), 3) for w, v in sorted(by.items())}

    def per_watcher_ms(self) -> float | None:
        """The apiserver's extra CPU ms per pod lifecycle for each watcher added: the slope of
        the medians over the watcher counts (least squares); None with a single count."""
        m = self.medians()
        if len(m) < 2:
            return None
        xs, ys = list(m), list(m.values())
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        return round(
            sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs), 3
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "pods_per_round": self.pods,
            "apiserver_ms_per_pod_by_watchers": {str(k): v for k, v in self.medians().items()},
            "apiserver_ms_per_pod_per_watcher": self.per_watcher_ms(),
            "rounds": [asdict(r) for r in self.rounds],
        }


def _pod(name: str) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "1Gi", RES_MILLI: "300"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "watch-cost"}},
        "spec": {
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}]
        },
    }


def _binding(name: str) -> dict[str, Any]:
    ann = assignment_annotation(NODE, (0,), PodSpec(name, num_gpu=1, gpu_milli=300, namespace=NAMESPACE))
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": {ANN_ASSIGNMENT: ann}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    }


def bench_watch_cost(
    pods: int = 1500,
    watchers: Sequence[int] = (0, 1, 2),
    rounds: int = 2,
    threads: int = 8,
    *,
    bin_dir: Path | None = None,
    on_progress: Callable[[str], None] = lambda _m: None,
) -> WatchCostReport:
    if pods < 1 or rounds < 1 or threads < 1:
        raise InvalidInput(f"pods, rounds and threads must be positive, got {pods}, {rounds} and {threads}")
    if not watchers or min(watchers) < 0 or max(watchers) > 16:
        raise InvalidInput(f"watchers: one or more counts of 0-16 extra watchers, got {list(watchers)}")
    report = WatchCostReport(pods)
    on_progress("starting etcd and kube-apiserver")
    with ControlPlane(bin_dir=bin_dir, scheduler=False, controller_manager=False, kwok=False) as cp:
        api = api_client(str(cp.kubeconfig_path), qps_pool=2 * threads)
        v1: Any = client.CoreV1Api(api)
        fast = FastCoreV1(api)
        v1.create_namespace({"metadata": {"name": NAMESPACE}})
        v1.create_node({"metadata": {"name": NODE}})
        pids = {name: [pid] for name, pid in cp.pids().items() if name in ("kube-apiserver", "etcd")}

        def life(name: str) -> None:
            fast.create_namespaced_pod(NAMESPACE, _pod(name))
            fast.create_namespaced_binding(NAMESPACE, _binding(name))
            status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
            fast.patch_namespaced_pod_status(name, NAMESPACE, status)
            v1.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0, _preload_content=False)

        for r in range(rounds):
            for w in watchers:
                extra = [
                    Reflector(
                        f"extra-{k}",
                        v1.list_pod_for_all_namespaces,
                        Handlers(lambda _o: None, lambda _o: None),
                    )
                    for k in range(w)
                ]
                for x in extra:
                    x.start()
                    if not x.wait_synced(60.0):
                        raise TimeoutError("an extra pod watch did not sync in 60 s")
                time.sleep(1.0)
                names = [f"p{r}-{w}-{i:06d}" for i in range(pods)]
                sampler = CpuSampler(pids).start()
                t0 = time.monotonic()
                with ThreadPoolExecutor(threads) as ex:
                    list(ex.map(life, names))
                t1 = time.monotonic()
                time.sleep(0.5)  # the watchers' last events
                sampler.stop()
                used = sampler.used(t0, time.monotonic())
                for x in extra:
                    x.stop()
                one = WatchRound(
                    w,
                    pods,
                    round(pods / (t1 - t0), 1),
                    round(1e3 * used.get("kube-apiserver", 0.0) / pods, 3),
                    round(1e3 * used.get("etcd", 0.0) / pods, 3),
                )
                report.rounds.append(one)
                on_progress(
                    f"round {r + 1}, {w} extra watcher(s): apiserver {one.apiserver_ms_per_pod} ms, "
                    f"etcd {one.etcd_ms_per_pod} ms per pod ({one.pods_per_s} pods/s)"
                )
    return report
