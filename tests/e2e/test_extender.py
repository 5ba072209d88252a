"""The extender behind a real kube-scheduler: deploy/extender/scheduler-config.yaml with urlPrefix on
loopback, our extender as a process (``python -m gpusched.cli extender``), kwok GPU nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.testenv import ControlPlane, ControlPlaneError, free_port, wait_until
from realparts import GONE
from realparts import node_of as bound_to

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "extender" / "scheduler-config.yaml"
NAMESPACE = "default"
GPU_MEM = 40960  # MiB per GPU
GPUS = 2  # per node


class Env:
    def __init__(self, cp: ControlPlane, port: int, log: Path) -> None:
        self.cp, self.port, self.log = cp, port, log
        from kubernetes import client

        self.core = client.CoreV1Api(cp.api_client())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url(path), data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def env(control_plane_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    # the controller manager clears the not-ready taint that kube-apiserver puts on new nodes
    cp = ControlPlane(bin_dir=control_plane_bin, scheduler_config=config, controller_manager=True, kwok=True)
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the e2e control plane did not start: {exc}", pytrace=False)
    log = tmp_path_factory.mktemp("extender") / "extender.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpusched.cli", "extender", "--kubeconfig", str(cp.kubeconfig_path),
             "--host", "127.0.0.1", "--port", str(port), "--policy", "default"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    e = Env(cp, port, log)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the extender exited: {log.read_text()[-3000:]}")
            try:
                return e.get("/readyz")[0] == 200
            except OSError:
                return False

        wait_until(ready, timeout=60, what="the extender to be ready", control_plane=cp)
        yield e
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        cp.stop()


def gpu_node(name: str) -> dict[str, Any]:
    res = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(GPUS)}
    labels = {
        "kubernetes.io/hostname": name,
        "type": "kwok",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.memory": str(GPU_MEM),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "status": {"capacity": res, "allocatable": res},
    }


def share_pod(name: str, mem: int, milli: int = 0) -> dict[str, Any]:
    res = {"cpu": "100m", "memory": "128Mi", "gpusched.io/gpu-memory": str(mem)}
    if milli:
        res["gpusched.io/gpu-milli"] = str(milli)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "gpusched-e2e"}},
        "spec": {
            "schedulerName": "gpusched",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


def test_kube_scheduler_places_gpu_shares_through_the_extender(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    core = env.core
    nodes = [unique_name("gpu") for _ in range(2)]
    for n in nodes:
        core.create_node(gpu_node(n))
    wait_until(
        lambda: json.loads(env.get("/state")[1])["nodes"] == 2,
        timeout=60,
        what="the extender to see both nodes",
        control_plane=env.cp,
    )

    def node_of(name: str) -> str | None:
        node: str | None = core.read_namespaced_pod(name, NAMESPACE).spec.node_name
        return node

    # 4 shares of half a GPU and 10 GiB first (at most 2 per GPU by milli), then 12 of 10 GiB fill
    # the 4 x 40 GiB exactly, and 3 more cannot fit anywhere.
    milli_pods = [unique_name("milli") for _ in range(4)]
    for p in milli_pods:
        core.create_namespaced_pod(NAMESPACE, share_pod(p, 10240, 500))
    for p in milli_pods:
        wait_until(lambda p=p: node_of(p), timeout=90, what=f"{p} bound", control_plane=env.cp)
    mem_pods = [unique_name("mem") for _ in range(15)]
    for p in mem_pods:
        core.create_namespaced_pod(NAMESPACE, share_pod(p, 10240))
    everything = milli_pods + mem_pods

    def bound() -> list[Any]:
        pods = [core.read_namespaced_pod(p, NAMESPACE) for p in everything]
        return [p for p in pods if p.spec.node_name]

    wait_until(lambda: len(bound()) >= 16, timeout=120, what="16 pods bound", control_plane=env.cp)

    def failed_scheduling(name: str) -> str | None:
        events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        msgs = [e.message or "" for e in events if e.reason == "FailedScheduling"]
        return next((m for m in msgs if "Insufficient GPU memory" in m), None)

    pending = [p for p in mem_pods if not node_of(p)]
    assert len(pending) == 3
    for p in pending:
        msg = wait_until(lambda p=p: failed_scheduling(p), timeout=60, what=f"FailedScheduling of {p}")
        assert "0/2 nodes are available" in msg
    assert len(bound()) == 16  # still: nothing else was squeezed in

    use: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for pod in bound():
        ann = json.loads(pod.metadata.annotations[ANN_ASSIGNMENT])
        assert ann["node"] == pod.spec.node_name and pod.spec.node_name in nodes
        assert len(ann["gpus"]) == 1
        u = use[(ann["node"], ann["gpus"][0])]
        u[0] += ann["milli"]
        u[1] += ann["memoryMiB"]
    assert len(use) == 4
    for (node, gpu), (milli, mem) in use.items():
        assert milli <= 1000, f"{node} GPU {gpu}: {milli} milli"
        assert mem <= GPU_MEM, f"{node} GPU {gpu}: {mem} MiB"
    assert sum(m for m, _ in use.values()) == 2000
    assert sum(g for _, g in use.values()) == 16 * 10240
    state = json.loads(env.get("/state")[1])
    assert state["pods"] >= 16

    for p in everything:
        core.delete_namespaced_pod(p, NAMESPACE, grace_period_seconds=0)
    for n in nodes:
        core.delete_node(n)


def whole_gpu_pod(name: str, gpus: int, priority_class: str = "") -> dict[str, Any]:
    res = {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "schedulerName": "gpusched",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": res, "limits": res}}],
    }  # fmt: skip
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_preemption_of_whole_gpu_pods_goes_through_the_extender(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    from kubernetes import client

    core = env.core
    sched = client.SchedulingV1Api(env.cp.api_client())
    high = unique_name("high")
    sched.create_priority_class(
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": high},
         "value": 100000}
    )  # fmt: skip
    n = unique_name("gpu")
    core.create_node(gpu_node(n))
    wait_until(
        lambda: json.loads(env.get("/state")[1])["nodes"] >= 1,
        timeout=60,
        what="the extender to see the node",
    )
    low = [unique_name("low") for _ in range(GPUS)]
    for p in low:
        core.create_namespaced_pod(NAMESPACE, whole_gpu_pod(p, 1))

    def node_of(name: str) -> str | None:
        return bound_to(core, NAMESPACE, name)

    for p in low:
        assert wait_until(lambda p=p: node_of(p), timeout=90, what=f"{p} bound", control_plane=env.cp) == n
    vip = unique_name("vip")
    core.create_namespaced_pod(NAMESPACE, whole_gpu_pod(vip, 1, high))
    assert wait_until(lambda: node_of(vip), timeout=120, what=f"{vip} bound after preemption") == n
    assert sorted(node_of(p) for p in low) == [GONE, n]  # exactly one victim
    _, text = env.get("/metrics")
    counts = [
        ln for ln in text.splitlines() if ln.startswith("gpusched_extender_request_duration_seconds_count")
    ]
    preempts = next(float(ln.split()[-1]) for ln in counts if 'verb="preempt"' in ln)
    assert preempts >= 1  # kube-scheduler asked the extender about its victims
    for p in [vip, *low]:
        if node_of(p) != GONE:
            core.delete_namespaced_pod(p, NAMESPACE, grace_period_seconds=0)
    core.delete_node(n)
    sched.delete_priority_class(high)


def test_malformed_requests_get_clean_answers(env: Env) -> None:
    for verb in ("/filter", "/prioritize", "/bind", "/preempt"):
        status, body = env.post(verb, b"{not json")
        assert status == 400 and "not valid JSON" in body["Error"]
    status, body = env.post("/filter", json.dumps({"NodeNames": ["x"]}).encode())
    assert status == 200 and "missing field 'Pod'" in body["Error"]
    bad = share_pod("bad", 1024, 5000)
    status, body = env.post("/filter", json.dumps({"Pod": bad, "NodeNames": ["x"]}).encode())
    assert status == 200 and "more than one GPU" in body["Error"]
    status, body = env.post("/prioritize", json.dumps({"Pod": bad, "NodeNames": ["x"]}).encode())
    assert status == 400 and "more than one GPU" in body["Error"]
    status, body = env.post("/bind", json.dumps({"PodName": "nope", "Node": "x"}).encode())
    assert status == 200 and body["Error"]
    status, body = env.post("/preempt", json.dumps({"Pod": []}).encode())
    assert status == 400 and "'Pod' must be dict" in body["Error"]
    assert env.get("/healthz") == (200, "ok")
    status, text = env.get("/metrics")
    assert status == 200 and 'gpusched_extender_request_duration_seconds_count{verb="filter"}' in text
    assert "Traceback" not in env.log.read_text()


def test_whole_gpu_with_a_memory_figure_never_shares_a_gpu_through_the_extender(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    """Issue 9 in extender mode: kube-scheduler counts nvidia.com/gpu, so on the node holding a 600-milli
    share (0 of 1 nvidia.com/gpu requested) only the extender can keep ``nvidia.com/gpu: 1`` +
    ``gpusched.io/gpu-memory`` off the shared GPU. One such pod takes the other node's GPU whole; the
    second waits, refused by the extender on the share's node ("Insufficient GPU")."""
    core = env.core
    group = unique_name("g")
    nodes = [unique_name("gpu1") for _ in range(2)]
    for n in nodes:
        body = gpu_node(n)
        body["status"]["allocatable"] = body["status"]["capacity"] = {
            **body["status"]["capacity"],
            "nvidia.com/gpu": "1",
        }
        body["metadata"]["labels"]["gpusched.io/e2e-group"] = group
        core.create_node(body)
    wait_until(
        lambda: json.loads(env.get("/state")[1])["nodes"] >= 2,
        timeout=60,
        what="the extender to see the nodes",
    )

    def pod(name: str, res: dict[str, str]) -> dict[str, Any]:
        res = {"cpu": "100m", "memory": "128Mi", **res}
        container = {"name": "main", "image": "registry.k8s.io/pause:3.10",
                     "resources": {"requests": res, "limits": res}}  # fmt: skip
        spec = {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"gpusched.io/e2e-group": group}, "containers": [container]}  # fmt: skip
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    def node_of(name: str) -> str | None:
        node: str | None = core.read_namespaced_pod(name, NAMESPACE).spec.node_name
        return node

    share = unique_name("share")
    core.create_namespaced_pod(NAMESPACE, pod(share, {"gpusched.io/gpu-milli": "600"}))
    share_node = wait_until(lambda: node_of(share), timeout=90, what=f"{share} bound", control_plane=env.cp)
    whole = [unique_name("whole") for _ in range(2)]
    for p in whole:
        core.create_namespaced_pod(
            NAMESPACE, pod(p, {"nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "10000"})
        )

    def refused(name: str) -> str | None:
        events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        return next((e.message for e in events if e.reason == "FailedScheduling" and e.message), None)

    def settled() -> tuple[str, str, str] | None:
        placed = [p for p in whole if node_of(p)]
        waiting = [p for p in whole if not node_of(p) and refused(p)]
        if len(placed) == 1 and len(waiting) == 1:
            return placed[0], waiting[0], str(refused(waiting[0]))
        assert len(placed) < 2, f"both whole-GPU pods bound: {[node_of(p) for p in whole]}"
        return None

    placed, waiting, msg = wait_until(settled, timeout=120, what="one whole-GPU pod bound, one refused")
    assert node_of(placed) in nodes and node_of(placed) != share_node and node_of(waiting) is None
    assert "Insufficient GPU" in msg, msg  # the extender's reason for the share's node
    ann = json.loads(core.read_namespaced_pod(placed, NAMESPACE).metadata.annotations[ANN_ASSIGNMENT])
    assert ann == {"node": node_of(placed), "gpus": [0], "milli": 1000, "memoryMiB": 10000}
    assert node_of(share) == share_node
    for p in [share, *whole]:
        core.delete_namespaced_pod(p, NAMESPACE, grace_period_seconds=0)
    for n in nodes:
        core.delete_node(n)


def test_a_gpu_a_dra_claim_holds_on_a_mixed_node_is_not_given_through_the_extender(
    env: Env, unique_name: Callable[[str], str]
) -> None:
    """A mixed node (docs/dra.md): the agent's UUIDs in gpusched.io/gpu-topology, a ResourceSlice of
    gpu.nvidia.com for the same GPUs, a claim allocated to gpu-0 (as kube-scheduler's DRA plugin would
    write it). The extender reads DRA, books GPU 0 as taken: the pod gets GPU 1, the next one waits."""
    import uuid

    from kubernetes import client

    from gpusched.k8s.convert import parse_assignment

    core, res = env.core, client.ResourceV1Api(env.cp.api_client())
    n = unique_name("mixed")
    uuids = [f"GPU-{uuid.uuid4()}" for _ in range(GPUS)]
    node = gpu_node(n)
    topo = {"gpus": [{"index": i, "uuid": u, "numa": None, "nvlink": []} for i, u in enumerate(uuids)]}
    node["metadata"]["annotations"]["gpusched.io/gpu-topology"] = json.dumps(topo)
    core.create_node(node)
    devices = [
        {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": u}}}
        for i, u in enumerate(uuids)
    ]
    pool = {"name": n, "generation": 1, "resourceSliceCount": 1}
    res.create_resource_slice(
        {
            "metadata": {"name": n},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": n, "pool": pool, "devices": devices},
        }
    )
    claim = unique_name("claim")
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    res.create_namespaced_resource_claim(
        NAMESPACE, {"metadata": {"name": claim}, "spec": {"devices": {"requests": [request]}}}
    )
    c = json.loads(res.read_namespaced_resource_claim(claim, NAMESPACE, _preload_content=False).data)
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": n, "device": "gpu-0"}]
            }
        }
    }
    res.replace_namespaced_resource_claim_status(claim, NAMESPACE, c)
    wait_until(
        lambda: json.loads(env.get("/state")[1]).get("claimed_gpus", 0) >= 1,
        timeout=60,
        what="the extender to book the claimed GPU",
        control_plane=env.cp,
    )
    first, second = unique_name("dp"), unique_name("dp")
    pod = whole_gpu_pod(first, 1)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": n}
    core.create_namespaced_pod(NAMESPACE, pod)

    def assigned(name: str) -> tuple[str, tuple[int, ...]] | None:
        obj = json.loads(core.read_namespaced_pod(name, NAMESPACE, _preload_content=False).data)
        return parse_assignment(obj) if obj["spec"].get("nodeName") else None

    assert wait_until(lambda: assigned(first), timeout=60, what=f"{first} bound", control_plane=env.cp) == (
        n,
        (1,),
    )
    pod = whole_gpu_pod(second, 1)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": n}
    core.create_namespaced_pod(NAMESPACE, pod)

    def refused() -> bool:
        evs = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={second}").items
        return any(e.reason == "FailedScheduling" for e in evs)

    wait_until(refused, timeout=60, what=f"{second} refused", control_plane=env.cp)
    assert assigned(second) is None
    for p in (first, second):
        core.delete_namespaced_pod(p, NAMESPACE, grace_period_seconds=0)
    res.delete_namespaced_resource_claim(claim, NAMESPACE)
    res.delete_resource_slice(n)
    core.delete_node(n)
