"""The standalone scheduler against the real control plane, onto kwok GPU nodes.

Each test uses its own schedulerName, namespace and node group (a label every pod selects),
and removes what it made, so tests never see each other's pods or nodes.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.k8s.convert import ANN_ASSIGNMENT, ANN_MODELS, node_from_k8s, pod_from_k8s
from gpusched.testenv import ControlPlane, free_port, wait_until

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"


class Env:
    """One test's namespace, node group and schedulerName, with raw-JSON API helpers."""

    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:8]
        self.ns = f"sa-{self.tag}"
        self.scheduler = f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=32)
        self.v1 = client.CoreV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})

    def nodes(
        self,
        specs: list[tuple[str, int, int, int, str]],
        labels: dict[str, dict[str, str]] | None = None,
        allocatable: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """(name, cpu milli, memory MiB, GPUs, model) → kwok nodes, waited for Ready and untainted;
        ``labels`` and ``allocatable`` add labels and resources by node name."""
        mem_of = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
        extra = labels

        def make(s: tuple[str, int, int, int, str]) -> None:
            name, cpu, mem, gpus, model = s
            res = {"cpu": f"{cpu}m", "memory": f"{mem}Mi", "pods": "1000", "nvidia.com/gpu": str(gpus)}
            res.update((allocatable or {}).get(name, {}))
            labels = {"type": "kwok", GROUP: self.tag, "nvidia.com/gpu.product": model}
            labels.update((extra or {}).get(name, {}))
            if model in mem_of:
                labels["nvidia.com/gpu.memory"] = str(mem_of[model])
            body = {
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
                "status": {"capacity": res, "allocatable": res},
            }
            self.v1.create_node(body, _preload_content=False)

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(make, specs))

        def ready() -> bool:
            items = self.list_nodes()
            return len(items) == len(specs) and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                and not n["spec"].get("taints")
                for n in items
            )

        wait_until(
            ready, timeout=240, what="kwok nodes Ready and untainted", control_plane=self.cp, interval=1
        )

    def pod(
        self,
        name: str,
        res: dict[str, str],
        ann: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "annotations": ann or {},
                "labels": labels or {},
            },
            "spec": {
                "schedulerName": self.scheduler,
                "nodeSelector": {GROUP: self.tag},
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}
                ],
            },
        }

    def schedule_until(
        self, bound: int, *, failed: bool = False, timeout: float = 60
    ) -> dict[str, str | None]:
        """Run a standalone scheduler until ``bound`` pods are bound (and, with ``failed``, a
        FailedScheduling event exists), stop it; pod name -> node (None: not bound)."""
        from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

        def where() -> dict[str, str | None]:
            return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.list_pods()}

        def settled() -> bool:
            placed = sum(1 for n in where().values() if n)
            return placed == bound and (not failed or bool(self.events("FailedScheduling")))

        sched = StandaloneScheduler(self.api, SchedulerConfig(scheduler_name=self.scheduler)).start()
        try:
            wait_until(
                settled, timeout=timeout, what=f"{bound} pods bound" + (" and a FailedScheduling" * failed)
            )
        finally:
            sched.stop()
        return where()

    def failure(self, name: str) -> str:
        """The message of the one FailedScheduling event of pod ``name``."""
        (event,) = [e for e in self.events("FailedScheduling") if e["involvedObject"]["name"] == name]
        return str(event["message"])

    def create_pods(self, bodies: list[dict[str, Any]], threads: int = 8) -> None:
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda b: self.v1.create_namespaced_pod(self.ns, b, _preload_content=False), bodies))

    def list_nodes(self) -> list[dict[str, Any]]:
        resp = self.v1.list_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False)
        return list(json.loads(resp.data)["items"])

    def list_pods(self) -> list[dict[str, Any]]:
        return list(json.loads(self.v1.list_namespaced_pod(self.ns, _preload_content=False).data)["items"])

    def events(self, reason: str) -> list[dict[str, Any]]:
        resp = self.v1.list_namespaced_event(
            self.ns, field_selector=f"reason={reason}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def cleanup(self) -> None:
        self.v1.delete_namespace(self.ns, _preload_content=False)
        self.v1.delete_collection_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False)

    def spawn(self, tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        cmd = [
            *(sys.executable, "-m", "gpusched.cli", "scheduler"),
            *("--kubeconfig", str(self.cp.kubeconfig_path), "--scheduler-name", self.scheduler),
            *("--namespace", self.ns, "--lease-name", f"lease-{self.tag}", "--port", str(port), *args),
        ]
        log = (tmp / f"{name}.log").open("ab")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), port


@pytest.fixture
def env(control_plane: ControlPlane) -> Iterator[Env]:
    e = Env(control_plane)
    try:
        yield e
    finally:
        e.cleanup()


def check_no_overcommit(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> int:
    """Read back from the API: per GPU milli ≤ 1000, per node cpu/memory ≤ allocatable, every
    bound pod annotated with its own node and as many GPUs as it asks. Returns GPU milli placed."""
    specs = {n["metadata"]["name"]: node_from_k8s(n) for n in nodes}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    gpu: dict[tuple[str, int], int] = defaultdict(int)
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        core = pod_from_k8s(p)
        a = json.loads(p["metadata"]["annotations"][ANN_ASSIGNMENT])
        assert a["node"] == node and len(a["gpus"]) == core.num_gpu, p["metadata"]["name"]
        cpu[node] += core.cpu_milli
        mem[node] += core.memory_mib
        for g in a["gpus"]:
            assert 0 <= g < specs[node].gpu_count
            gpu[node, g] += core.gpu_milli
    for name, s in specs.items():
        assert cpu[name] <= s.cpu_milli and mem[name] <= s.memory_mib, name
    assert all(v <= 1000 for v in gpu.values()), {k: v for k, v in gpu.items() if v > 1000}
    return sum(gpu.values())


def traces_dir() -> Path:
    env = os.environ.get("GPUSCHED_TRACES")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "traces"


# ------------------------------------------------------------------------ (b)
def test_trace_slice_matches_the_core(env: Env) -> None:
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    csv_dir = traces_dir() / "alibaba-gpu-2023" / "csv"
    if not (csv_dir / "openb_pod_list_default.csv").is_file():
        pytest.skip(f"Alibaba GPU trace 2023 not found under {csv_dir} (set $GPUSCHED_TRACES)")
    with (csv_dir / "openb_node_list_gpu_node.csv").open() as f:
        rows = list(csv.DictReader(f))[::8]  # 152 of the 1213 GPU nodes; the 2000 pods overload them
    env.nodes([(f"{env.tag}-{r['sn']}", int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
               for r in rows])  # fmt: skip
    with (csv_dir / "openb_pod_list_default.csv").open() as f:
        trace = list(csv.DictReader(f))[:2000]
    bodies = []
    for r in trace:
        res = {"cpu": f"{r['cpu_milli']}m", "memory": f"{r['memory_mib']}Mi"}
        num, milli = int(r["num_gpu"]), int(r["gpu_milli"])
        if num and milli >= 1000:
            res["nvidia.com/gpu"] = str(num)
        elif num:
            res["gpusched.io/gpu-milli"] = str(milli)
        bodies.append(env.pod(r["name"], res, {ANN_MODELS: r["gpu_spec"]} if r.get("gpu_spec") else None))
    env.create_pods(bodies)
    specs = [pod_from_k8s(b) for b in bodies]
    workload = TargetWorkload.from_pods(specs)
    cfg = SchedulerConfig(scheduler_name=env.scheduler, workload=workload, profile_refresh_s=1e9)
    sched = StandaloneScheduler(env.api, cfg).start()
    try:
        wait_until(lambda: sched.scheduled + sched.queue.counts()["unschedulable"] >= len(bodies),
                   timeout=600, what="every trace pod decided", control_plane=env.cp, interval=1)  # fmt: skip
        wait_until(lambda: sum(1 for p in env.list_pods() if p["spec"].get("nodeName")) == sched.scheduled,
                   timeout=60, what="bindings visible in the API")  # fmt: skip
    finally:
        sched.stop()
    nodes, pods = env.list_nodes(), env.list_pods()
    placed_milli = check_no_overcommit(nodes, pods)

    # the core alone: same nodes (name order = tie-break ranks), same pods in the scheduler's order
    order = sorted(pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
    snap = ClusterState(sorted((node_from_k8s(n) for n in nodes), key=lambda n: n.name))
    profile = make_profile("default", PolicyContext(workload))
    tiebreak = np.arange(len(snap), dtype=np.int64)
    want = {}
    for p in order:
        r = schedule_one(profile, pod_from_k8s(p), snap, tiebreak=tiebreak, diagnose_failures=False)
        if r.scheduled:
            want[f"{env.ns}/{p['metadata']['name']}"] = (r.node_name, r.gpus)
    got = {}
    for p in pods:
        if p["spec"].get("nodeName"):
            gpus = tuple(json.loads(p["metadata"]["annotations"][ANN_ASSIGNMENT])["gpus"])
            got[f"{env.ns}/{p['metadata']['name']}"] = (p["spec"]["nodeName"], gpus)
    assert 0 < len(got) < len(bodies)  # overloaded: some placed, some not
    assert len(got) == len(want)
    assert placed_milli == snap.allocated_gpu_milli()
    assert got == want


# ------------------------------------------------------------------------ (c)
def test_killed_scheduler_restarts_without_double_booking(env: Env, tmp_path: Path) -> None:
    env.nodes([(f"{env.tag}-n{i:02d}", 32000, 262144, 8, "A100") for i in range(30)])  # 240 GPUs
    rng = np.random.default_rng(7)
    bodies = []
    for i in range(400):  # ≈ 300 GPUs asked: some stay pending
        res = {"cpu": "1", "memory": "2Gi"}
        if rng.random() < 0.5:
            res["gpusched.io/gpu-milli"] = str(int(rng.choice([200, 300, 500])))
        else:
            res["nvidia.com/gpu"] = str(int(rng.choice([1, 1, 2, 4])))
        bodies.append(env.pod(f"p-{i:04d}", res))
    env.create_pods(bodies)

    def bound() -> int:
        return sum(1 for p in env.list_pods() if p["spec"].get("nodeName"))

    first, _ = env.spawn(tmp_path, "first", "--no-leader-elect")
    try:
        wait_until(lambda: bound() >= 60, timeout=180, what="the first scheduler to bind 60 pods")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    at_kill = bound()
    second, _ = env.spawn(tmp_path, "second", "--no-leader-elect")
    try:

        def settled() -> bool:
            pods = env.list_pods()
            return all(
                p["spec"].get("nodeName")
                or any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
                for p in pods
            )

        wait_until(settled, timeout=300, what="every pod bound or pending with a reason", interval=2)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    pods = env.list_pods()
    assert len(pods) == len(bodies)  # nothing lost
    # the first scheduler may already have placed everything that fits before the kill lands, so
    # the restart must keep every binding (>=) and double-book nothing; what it adds is timing-dependent
    assert sum(1 for p in pods if p["spec"].get("nodeName")) >= at_kill
    check_no_overcommit(env.list_nodes(), pods)
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    assert pending and all("nodes are available" in json.dumps(p["status"]["conditions"]) for p in pending)


# ------------------------------------------------------------------------ (d)
def _leader_metric(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("gpusched_is_leader "):
            return float(line.split()[1])
    return None


def test_two_replicas_one_leader_and_failover(env: Env, tmp_path: Path) -> None:
    from kubernetes import client

    env.nodes([(f"{env.tag}-n{i}", 64000, 262144, 8, "A100") for i in range(4)])
    coord = client.CoordinationV1Api(env.api)
    procs = [env.spawn(tmp_path, f"replica{i}", "--leader-elect") for i in range(2)]
    try:
        for _, port in procs:
            wait_until(lambda p=port: _http(p, "/readyz") == 200, timeout=60, what="replica ready")

        def holder_now() -> str:
            return str(coord.read_namespaced_lease(f"lease-{env.tag}", env.ns).spec.holder_identity or "")

        holder = wait_until(holder_now, timeout=60, what="a lease holder")
        wait_until(lambda: sorted(_leader_metric(p) or 0 for _, p in procs) == [0, 1], timeout=30,
                   what="exactly one replica leading")  # fmt: skip
        leader = next(i for i, (_, p) in enumerate(procs) if _leader_metric(p) == 1)
        env.create_pods([env.pod(f"a-{i:03d}", {"cpu": "1", "nvidia.com/gpu": "1"}) for i in range(12)])
        wait_until(lambda: sum(1 for p in env.list_pods() if p["spec"].get("nodeName")) == 12, timeout=90,
                   what="the leader to bind 12 pods")  # fmt: skip
        reporters = {e.get("reportingInstance") for e in env.events("Scheduled")}
        assert reporters == {holder}  # only the leader scheduled

        procs[leader][0].send_signal(signal.SIGKILL)
        procs[leader][0].wait()
        killed_at = time.monotonic()
        other = procs[1 - leader][1]
        wait_until(lambda: _leader_metric(other) == 1, timeout=40, what="the standby to take over")
        assert time.monotonic() - killed_at < 25
        assert holder_now() not in ("", holder)
        env.create_pods(
            [env.pod(f"b-{i:03d}", {"cpu": "1", "gpusched.io/gpu-milli": "500"}) for i in range(8)]
        )
        wait_until(lambda: sum(1 for p in env.list_pods() if p["spec"].get("nodeName")) == 20, timeout=90,
                   what="the new leader to bind 8 more pods")  # fmt: skip
        check_no_overcommit(env.list_nodes(), env.list_pods())
        assert _http(other, "/healthz") == 200
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)


def _http(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


# --------------------------------------------------------------------- events
def test_invalid_and_unschedulable_pods_get_events(env: Env) -> None:
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    env.nodes([(f"{env.tag}-n0", 16000, 65536, 4, "T4")])
    env.create_pods([
        env.pod("invalid", {"cpu": "1", "gpusched.io/gpu-milli": "2500"}),
        env.pod("too-big", {"cpu": "1", "nvidia.com/gpu": "8"}),
        env.pod("fits", {"cpu": "1", "nvidia.com/gpu": "1"}),
    ])  # fmt: skip
    sched = StandaloneScheduler(env.api, SchedulerConfig(scheduler_name=env.scheduler)).start()
    try:

        def all_events() -> bool:
            failed = {e["involvedObject"]["name"] for e in env.events("FailedScheduling")}
            return (
                "too-big" in failed
                and bool(env.events("InvalidGPURequest"))
                and bool(env.events("Scheduled"))
            )

        wait_until(all_events, timeout=60, what="the events")
    finally:
        sched.stop()
    (bad,) = env.events("InvalidGPURequest")
    assert bad["type"] == "Warning" and bad["involvedObject"]["name"] == "invalid"
    assert "gpusched.io/gpu-milli 2500 is more than one GPU" in bad["message"]
    (failed,) = [e for e in env.events("FailedScheduling") if e["involvedObject"]["name"] == "too-big"]
    assert failed["type"] == "Warning" and failed["message"].startswith("0/")
    assert "nodes are available: " in failed["message"] and "Insufficient" in failed["message"]
    (ok,) = env.events("Scheduled")
    assert ok["message"] == f"Successfully assigned {env.ns}/fits to {env.tag}-n0"
    pods = {p["metadata"]["name"]: p for p in env.list_pods()}
    (cond,) = [c for c in pods["too-big"]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == failed["message"]
    assert not pods["invalid"]["spec"].get("nodeName")


def test_an_unschedulable_condition_queued_behind_the_binding_never_marks_a_bound_pod(env: Env) -> None:
    """The recorder queues the PodScheduled=False write; the pod may be bound or deleted before it
    is sent. Against the real apiserver: a pod changed meanwhile but still pending gets the
    condition; a bound pod keeps PodScheduled=True; a deleted one gets nothing."""
    from gpusched.k8s.events import EventRecorder
    from gpusched.k8s.rest import FastCoreV1

    env.nodes([(f"{env.tag}-n0", 16000, 65536, 4, "T4")])
    names = ("relabelled", "bound", "gone")
    env.create_pods([env.pod(n, {"cpu": "1", "nvidia.com/gpu": "1"}) for n in names])
    seen = {p["metadata"]["name"]: p for p in env.list_pods()}  # what the scheduler's watch had
    env.v1.patch_namespaced_pod("relabelled", env.ns, {"metadata": {"labels": {"x": "y"}}})
    binding = {"metadata": {"name": "bound"}, "target": {"kind": "Node", "name": f"{env.tag}-n0"}}
    env.v1.create_namespaced_binding(env.ns, binding, _preload_content=False)
    env.v1.delete_namespaced_pod("gone", env.ns, grace_period_seconds=0)
    wait_until(lambda: len(env.list_pods()) == 2, timeout=30, what="'gone' deleted")
    rec = EventRecorder(FastCoreV1(env.api), env.scheduler, workers=1)
    try:
        for name in names:
            rec.failed(seen[name], f"0/1 nodes are available: {name} waits.")
        rec.flush()
    finally:
        rec.stop()
    pods = {p["metadata"]["name"]: p for p in env.list_pods()}
    cond = {n: [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"] for n, p in pods.items()}
    assert [(c["status"], c["reason"], c["message"]) for c in cond["relabelled"]] == [
        ("False", "Unschedulable", "0/1 nodes are available: relabelled waits.")
    ]
    assert pods["bound"]["spec"]["nodeName"] == f"{env.tag}-n0"
    assert [c["status"] for c in cond["bound"]] == ["True"]
    assert (rec.counts()["stale"], rec.counts()["failed"]) == (2, 0)
    assert {e["involvedObject"]["name"] for e in env.events("FailedScheduling")} == set(names)


def test_required_node_affinity_on_the_driver_version(env: Env) -> None:

    driver = "nvidia.com/cuda.driver-version.major"
    old, new = f"{env.tag}-old", f"{env.tag}-new"
    env.nodes(
        [(old, 16000, 65536, 8, "T4"), (new, 16000, 65536, 1, "T4")],
        labels={old: {driver: "470"}, new: {driver: "550"}},
    )

    def pod(name: str, op: str, value: str) -> dict[str, Any]:
        body = env.pod(name, {"cpu": "1", "nvidia.com/gpu": "1"})
        expr = {"key": driver, "operator": op, "values": [value]}
        terms = [{"matchExpressions": [expr]}]
        body["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
        return body

    # Two pods need a driver newer than 534, and only the 1-GPU node has one: the second must wait
    # although the old node has 8 free GPUs.
    env.create_pods([pod("new-1", "Gt", "534"), pod("new-2", "Gt", "534"), pod("legacy", "Lt", "500")])
    where = env.schedule_until(2, failed=True)
    assert where["legacy"] == old
    assert {where["new-1"], where["new-2"]} == {new, None}
    (waiting,) = [n for n in ("new-1", "new-2") if where[n] is None]
    assert "didn't match Pod's node affinity/selector" in env.failure(waiting)


def test_pod_anti_affinity_and_topology_spread(env: Env) -> None:

    zone = "topology.kubernetes.io/zone"
    names = [f"{env.tag}-{z}{i}" for z in "ab" for i in range(2)]
    env.nodes(
        [(n, 16000, 65536, 8, "T4") for n in names],
        labels={n: {zone: f"zone-{n[-2]}", "kubernetes.io/hostname": n} for n in names},
    )

    def replica(name: str, group: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = env.pod(name, {"cpu": "1", "gpusched.io/gpu-milli": "250"}, labels={"app": group})
        body["spec"].update(spec)
        return body

    selector = {"matchLabels": {"app": "web"}}
    apart = {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector}
    anti = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [apart]}}}
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": zone,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "inf"}},
            }
        ]
    }
    # 5 web replicas that refuse to share a node, on 4 nodes; 6 inference pods spread over 2 zones
    env.create_pods(
        [replica(f"web-{i}", "web", anti) for i in range(5)]
        + [replica(f"inf-{i}", "inf", spread) for i in range(6)]
    )
    env.schedule_until(10, failed=True, timeout=90)
    pods = env.list_pods()
    web = [p["spec"].get("nodeName") for p in pods if p["metadata"]["labels"]["app"] == "web"]
    assert sorted(n for n in web if n) == sorted(names) and web.count(None) == 1  # one per node
    zones = Counter(p["spec"]["nodeName"][-2] for p in pods if p["metadata"]["labels"]["app"] == "inf")
    assert zones == {"a": 3, "b": 3}
    (waiting,) = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    assert "4 node(s) didn't satisfy existing pods anti-affinity rules" in env.failure(
        waiting
    )  # kube's order


def test_preferred_anti_affinity_spreads_replicas_before_packing(env: Env) -> None:

    names = [f"{env.tag}-n{i}" for i in range(3)]
    env.nodes(
        [(n, 16000, 65536, 8, "T4") for n in names], labels={n: {"kubernetes.io/hostname": n} for n in names}
    )
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "inf"}}}
    soft = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }

    def replica(i: int, spec: dict[str, Any]) -> dict[str, Any]:
        body = env.pod(f"inf-{i}", {"cpu": "1", "gpusched.io/gpu-milli": "250"}, labels={"app": "inf"})
        body["spec"]["affinity"] = spec
        return body

    # four replicas that prefer apart: one per node, then the fourth still lands (soft)
    env.create_pods([replica(i, soft) for i in range(4)])
    per_node = Counter(env.schedule_until(4).values())
    assert sorted(per_node.values()) == [1, 1, 2]  # packing alone would put all four on one GPU


def test_scheduling_gates_hold_a_pod_until_removed(env: Env) -> None:
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    env.nodes([(f"{env.tag}-n0", 16000, 65536, 4, "T4")])
    gated = env.pod("gated", {"cpu": "1", "nvidia.com/gpu": "1"})
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    env.create_pods([gated, env.pod("free", {"cpu": "1", "nvidia.com/gpu": "1"})])
    sched = StandaloneScheduler(env.api, SchedulerConfig(scheduler_name=env.scheduler)).start()
    try:

        def node_of(name: str) -> str | None:
            return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in env.list_pods()}.get(name)

        wait_until(lambda: node_of("free") is not None, timeout=60, what="the ungated pod bound")
        time.sleep(1.0)  # the gated pod had every chance to be (wrongly) placed
        assert node_of("gated") is None
        assert not [e for e in env.events("FailedScheduling") if e["involvedObject"]["name"] == "gated"]
        (obj,) = [p for p in env.list_pods() if p["metadata"]["name"] == "gated"]
        assert ANN_ASSIGNMENT not in (obj["metadata"].get("annotations") or {})  # never tried
        assert sched.bind_errors == 0
        env.v1.patch_namespaced_pod("gated", env.ns, {"spec": {"schedulingGates": None}})
        wait_until(lambda: node_of("gated") is not None, timeout=60, what="the pod bound once ungated")
    finally:
        sched.stop()


def test_extended_resources_are_counted(env: Env) -> None:

    nic, plain = f"{env.tag}-nic", f"{env.tag}-plain"
    env.nodes(
        [(nic, 16000, 65536, 2, "T4"), (plain, 16000, 65536, 8, "T4")],
        allocatable={nic: {"example.com/nic": "1"}},
    )
    res = {"cpu": "1", "nvidia.com/gpu": "1", "example.com/nic": "1"}
    env.create_pods([env.pod("nic-1", res), env.pod("nic-2", res)])
    where = env.schedule_until(1, failed=True)
    assert {where["nic-1"], where["nic-2"]} == {nic, None}  # never onto the node without the NIC
    (waiting,) = [n for n in ("nic-1", "nic-2") if where[n] is None]
    assert "Insufficient example.com/nic" in env.failure(waiting)


def test_high_priority_pod_preempts_the_fewest_lower_priority_pods(env: Env) -> None:
    from kubernetes import client

    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    classes = client.SchedulingV1Api(env.api)
    low, high = f"low-{env.tag}", f"high-{env.tag}"
    for name, value in ((low, 10), (high, 1000)):
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
        classes.create_priority_class({**body, "value": value}, _preload_content=False)

    def pod(name: str, res: dict[str, str], pclass: str) -> dict[str, Any]:
        body = env.pod(name, {"cpu": "1", **res})
        body["spec"]["priorityClassName"] = pclass
        return body

    sched = None
    try:
        env.nodes([(f"{env.tag}-n0", 16000, 65536, 2, "T4")])
        # one GPU holds a whole-GPU pod, the other two shares: all priority 10
        env.create_pods([
            pod("low-whole", {"nvidia.com/gpu": "1"}, low),
            pod("low-share-a", {"gpusched.io/gpu-milli": "500"}, low),
            pod("low-share-b", {"gpusched.io/gpu-milli": "400"}, low),
        ], threads=1)  # fmt: skip
        sched = StandaloneScheduler(env.api, SchedulerConfig(scheduler_name=env.scheduler)).start()
        wait_until(
            lambda: all(p["spec"].get("nodeName") for p in env.list_pods()), timeout=60, what="low pods bound"
        )
        env.create_pods([pod("urgent", {"nvidia.com/gpu": "1"}, high)])

        def urgent_bound() -> bool:
            pods = env.list_pods()
            return any(p["metadata"]["name"] == "urgent" and p["spec"].get("nodeName") for p in pods)

        wait_until(urgent_bound, timeout=90, what="the high-priority pod bound after preemption")
        sched.events.flush()
    finally:
        if sched is not None:
            sched.stop()
        for name in (low, high):
            classes.delete_priority_class(name, _preload_content=False)
    pods = {p["metadata"]["name"]: p for p in env.list_pods()}
    # evicting the whole-GPU pod frees a GPU with one victim; the two shares would be two
    assert "low-whole" not in pods or pods["low-whole"]["metadata"].get("deletionTimestamp")
    assert pods["low-share-a"]["spec"]["nodeName"] and pods["low-share-b"]["spec"]["nodeName"]
    assert not pods["low-share-a"]["metadata"].get("deletionTimestamp")
    assert not pods["low-share-b"]["metadata"].get("deletionTimestamp")
    assert pods["urgent"]["spec"]["priority"] == 1000
    (ev,) = env.events("Preempted")
    assert ev["involvedObject"]["name"] == "low-whole"
    assert ev["message"] == f"Preempted by {env.ns}/urgent on node {env.tag}-n0"
    live = [p for p in pods.values() if not p["metadata"].get("deletionTimestamp")]
    assert check_no_overcommit(env.list_nodes(), live) == 1000 + 500 + 400


def test_whole_gpu_with_a_memory_figure_never_shares_a_gpu(env: Env) -> None:
    """Issue 9: ``nvidia.com/gpu: 1`` + ``gpusched.io/gpu-memory`` is one whole GPU of at least that much
    memory, not a share by memory. With a 600-milli share on one 1-GPU node, the first such pod takes the
    other node's GPU whole and the second waits: nothing joins the share, and no node is asked for more
    nvidia.com/gpu than it has (a real kubelet refuses that at admission)."""
    env.nodes([(f"{env.tag}-n{i}", 16000, 65536, 1, "T4") for i in range(2)])  # 15360 MiB each
    env.create_pods([env.pod("share", {"cpu": "1", "gpusched.io/gpu-milli": "600"})])
    share_node = env.schedule_until(1)["share"]
    assert share_node is not None
    whole = {"cpu": "1", "nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "10000"}
    env.create_pods([env.pod(f"whole-{i}", whole) for i in range(2)], threads=1)
    where = env.schedule_until(2, failed=True)  # a fresh scheduler: it rebuilds its books from the API
    (placed,) = [n for n in ("whole-0", "whole-1") if where[n]]
    (waiting,) = [n for n in ("whole-0", "whole-1") if not where[n]]
    assert where[placed] not in (None, share_node)
    assert "Insufficient GPU" in env.failure(waiting)
    pods = {p["metadata"]["name"]: p for p in env.list_pods()}
    assignment = json.loads(pods[placed]["metadata"]["annotations"][ANN_ASSIGNMENT])
    assert assignment == {"node": where[placed], "gpus": [0], "milli": 1000, "memoryMiB": 10000}
    asked: Counter[str] = Counter()
    for p in pods.values():
        if p["spec"].get("nodeName"):
            asked[p["spec"]["nodeName"]] += int(
                p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)
            )
    assert all(n <= 1 for n in asked.values()), asked
    assert check_no_overcommit(env.list_nodes(), list(pods.values())) == 600 + 1000
