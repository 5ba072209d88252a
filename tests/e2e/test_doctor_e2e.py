"""``gpusched doctor`` on the real control plane: seven seeded faults (the seventh: a pod waiting
for quota in its tenant queue). For each, doctor (the ``kubectl gpusched doctor pod ... --json``
command, reading the API) names the cause, and its counterfactual, applied in the API, holds:
the standalone scheduler then binds the pod where doctor said (or, for drift, doctor finds the
books and the device plugin agreeing again).

Each test has its own namespace, schedulerName and node group (a label every pod selects), and
removes what it made.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the node agent's own names: doctor must read what the agent writes
from gpusched.agent.allocation import ANN_ALLOCATED
from gpusched.agent.health import ANN_UNHEALTHY_GPUS as ANN_UNHEALTHY
from gpusched.agent.labels import ANN_TOPOLOGY
from gpusched.k8s.convert import ANN_ASSIGNMENT, ANN_MODELS
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.kwoknodes import kwok_gpu_node

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"


class Env:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:8]
        self.ns = f"doc-{self.tag}"
        self.scheduler = f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path))
        self.v1 = client.CoreV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})

    def node(self, short: str, gpus: int, model: str = "A100", gmem: int = 40960, **kw: Any) -> str:
        name = f"{self.tag}-{short}"
        body = kwok_gpu_node(name, gpus, model=model, gpu_memory_mib=gmem, labels={GROUP: self.tag})
        body["metadata"]["annotations"].update(kw.pop("annotations", {}))
        if "taints" in kw:
            body["spec"] = {"taints": kw.pop("taints")}
        self.v1.create_node(body, _preload_content=False)
        mine = {(t["key"], t.get("value", "")) for t in (body.get("spec") or {}).get("taints", [])}

        def ready() -> bool:
            n = json.loads(self.v1.read_node(name, _preload_content=False).data)
            up = any(
                c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
            )
            return up and {(t["key"], t.get("value", "")) for t in n["spec"].get("taints") or []} == mine

        wait_until(ready, timeout=120, what=f"node {name} Ready", control_plane=self.cp, interval=0.5)
        return name

    def pod(
        self,
        name: str,
        res: dict[str, str],
        *,
        ann: dict[str, str] | None = None,
        node: str = "",
        gpus: list[int] | None = None,
        tolerations: list[dict[str, str]] | None = None,
    ) -> None:
        annotations = dict(ann or {})
        if node:
            annotations[ANN_ASSIGNMENT] = json.dumps({"node": node, "gpus": gpus or [], "milli": 1000})
        spec: dict[str, Any] = {
            "schedulerName": self.scheduler,
            "nodeSelector": {GROUP: self.tag},
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}],
        }
        if tolerations:
            spec["tolerations"] = tolerations
        if node:
            spec["nodeName"] = node
        body = {"metadata": {"name": name, "namespace": self.ns, "annotations": annotations}, "spec": spec}
        self.v1.create_namespaced_pod(self.ns, body, _preload_content=False)

    def replicated(self, app: str, res: dict[str, str], *, node: str, gpus: list[int]) -> str:
        """A pod of a ReplicaSet (``app``, one replica), bound by hand to ``node``/``gpus``; its name.
        Defragmentation moves only such pods: its controller recreates it."""
        from kubernetes import client

        spec = {
            "schedulerName": self.scheduler,
            "nodeSelector": {GROUP: self.tag},
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}],
        }
        body = {
            "metadata": {"name": app, "namespace": self.ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": {"app": app}}, "spec": spec},
            },
        }
        client.AppsV1Api(self.api).create_namespaced_replica_set(self.ns, body, _preload_content=False)

        def created() -> str | None:
            return next(
                (p["metadata"]["name"] for p in self.pods() if p["metadata"]["labels"].get("app") == app),
                None,
            )

        name = str(wait_until(created, timeout=60, what=f"the pod of ReplicaSet {app}"))
        milli = int(res.get("gpusched.io/gpu-milli", "1000"))
        ann = {ANN_ASSIGNMENT: json.dumps({"node": node, "gpus": gpus, "milli": milli})}
        self.v1.patch_namespaced_pod(
            name, self.ns, {"metadata": {"annotations": ann}}, _preload_content=False
        )
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
        self.v1.create_namespaced_binding(self.ns, binding, _preload_content=False)
        return name

    def read_pod(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.v1.read_namespaced_pod(name, self.ns, _preload_content=False).data))

    def delete_pod(self, name: str) -> None:
        self.v1.delete_namespaced_pod(name, self.ns, grace_period_seconds=0, _preload_content=False)

        def gone() -> bool:
            return name not in {p["metadata"]["name"] for p in self.pods()}

        wait_until(gone, timeout=60, what=f"pod {name} deleted")

    def pods(self) -> list[dict[str, Any]]:
        return list(json.loads(self.v1.list_namespaced_pod(self.ns, _preload_content=False).data)["items"])

    def schedule(
        self, *, bound: tuple[str, ...] | list[str] = (), pending: tuple[str, ...] | list[str] = ()
    ) -> None:
        """Run a standalone scheduler until ``bound`` are bound and ``pending`` were turned away."""
        from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

        def settled() -> bool:
            where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.pods()}
            failed = {e["involvedObject"]["name"] for e in self.events("FailedScheduling")}
            return all(where.get(b) for b in bound) and all(p in failed and not where.get(p) for p in pending)

        sched = StandaloneScheduler(self.api, SchedulerConfig(scheduler_name=self.scheduler)).start()
        try:
            wait_until(
                settled, timeout=90, what=f"bound {bound}, turned away {pending}", control_plane=self.cp
            )
        finally:
            sched.stop()

    def events(self, reason: str) -> list[dict[str, Any]]:
        resp = self.v1.list_namespaced_event(
            self.ns, field_selector=f"reason={reason}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def doctor(self, *args: str) -> dict[str, Any]:
        """``kubectl gpusched doctor ... --json`` against the API, as kubectl runs the plugin."""
        code = "from gpusched.cli.doctor import kubectl_main; kubectl_main()"
        cmd = [
            sys.executable,
            "-c",
            code,
            "doctor",
            *args,
            "--kubeconfig",
            str(self.cp.kubeconfig_path),
            "--json",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))

    def diagnose(self, pod: str) -> tuple[set[str], dict[str, Any]]:
        """The codes of the error findings, and the first counterfactual."""
        r = self.doctor("pod", f"{self.ns}/{pod}")
        errors = {f["code"] for f in r["findings"] if f["severity"] == "error"}
        return errors, (r["counterfactuals"] or [{}])[0]

    def cleanup(self) -> None:
        self.v1.delete_namespace(self.ns, _preload_content=False)
        self.v1.delete_collection_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False)


@pytest.fixture
def env(control_plane: ControlPlane) -> Iterator[Env]:
    e = Env(control_plane)
    try:
        yield e
    finally:
        e.cleanup()


def test_missing_toleration(env: Env) -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    node = env.node("ml", 2, taints=[taint])
    env.pod("p", {"nvidia.com/gpu": "1"})
    env.schedule(pending=["p"])
    causes, cf = env.diagnose("p")
    assert "untolerated-taint" in causes
    assert cf["kind"] == "toleration" and cf["node"] == node and cf["verified"]
    assert cf["change"]["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                            "effect": "NoSchedule"}]  # fmt: skip
    env.delete_pod("p")
    env.pod("p", {"nvidia.com/gpu": "1"}, tolerations=cf["change"]["tolerations"])
    env.schedule(bound=["p"])
    assert env.read_pod("p")["spec"]["nodeName"] == node


def test_impossible_gpu_model(env: Env) -> None:
    node = env.node("a100", 2)
    env.pod("p", {"nvidia.com/gpu": "1"}, ann={ANN_MODELS: "B200"})
    env.schedule(pending=["p"])
    causes, cf = env.diagnose("p")
    assert "no-such-model" in causes
    assert cf["kind"] == "gpu-model" and cf["change"]["gpu_models"] == ["A100"] and cf["node"] == node
    env.delete_pod("p")
    env.pod("p", {"nvidia.com/gpu": "1"}, ann={ANN_MODELS: "|".join(cf["change"]["gpu_models"])})
    env.schedule(bound=["p"])
    assert env.read_pod("p")["spec"]["nodeName"] == node


def test_more_gpu_memory_than_any_gpu_has(env: Env) -> None:
    node = env.node("a100", 1, gmem=40960)
    env.pod("p", {"gpusched.io/gpu-milli": "500", "gpusched.io/gpu-memory": "81920"})
    env.schedule(pending=["p"])
    causes, cf = env.diagnose("p")
    assert "gpu-memory-too-large" in causes
    assert (
        cf["kind"] == "gpu-memory" and cf["change"]["gpu_memory_mib"] == 40960 and "≤ 40 GiB" in cf["message"]
    )
    env.delete_pod("p")
    env.pod(
        "p", {"gpusched.io/gpu-milli": "500", "gpusched.io/gpu-memory": str(cf["change"]["gpu_memory_mib"])}
    )
    env.schedule(bound=["p"])
    assert env.read_pod("p")["spec"]["nodeName"] == node


def test_fragmentation_that_migrations_fix(env: Env) -> None:
    n1, n2 = env.node("n1", 2), env.node("n2", 2)
    # shares of ReplicaSets (a bare pod is never moved: doctor names it instead, issue 28 F2)
    a = env.replicated("a", {"gpusched.io/gpu-milli": "400"}, node=n1, gpus=[0])
    b = env.replicated("b", {"gpusched.io/gpu-milli": "400"}, node=n2, gpus=[1])
    env.pod("p", {"nvidia.com/gpu": "2"})
    env.schedule(pending=["p"])
    causes, cf = env.diagnose("p")
    assert "unschedulable" in causes
    assert cf["kind"] == "moves" and "(1 move)" in cf["message"] and cf["verified"]
    plan = cf["change"]["plan"]
    (move,) = plan["moves"]
    # the migration: the moved pod is deleted, its ReplicaSet recreates it, the scheduler places both
    name = move["pod"].split("/", 1)[1]
    assert name in (a, b)
    env.delete_pod(name)
    env.schedule(bound=["p"])
    assert env.read_pod("p")["spec"]["nodeName"] == plan["placements"][0]["node"] == cf["node"]


def test_unhealthy_gpu(env: Env) -> None:
    node = env.node("sick", 2, annotations={ANN_UNHEALTHY: "1"})
    env.pod("w", {"nvidia.com/gpu": "1"}, node=node, gpus=[0])
    env.pod("p", {"nvidia.com/gpu": "1"})
    env.schedule(pending=["p"])
    causes, cf = env.diagnose("p")
    assert "unhealthy-gpu" in causes
    assert cf["kind"] == "healthy-gpu" and cf["node"] == node and cf["change"]["unhealthy"] == [1]
    nr = env.doctor("node", node)
    assert any(f["code"] == "unhealthy-gpu" and f["evidence"]["unhealthy"] == [1] for f in nr["findings"])
    # the repair: the agent clears the annotation once the GPU is healthy again
    env.v1.patch_node(node, {"metadata": {"annotations": {ANN_UNHEALTHY: None}}})
    env.schedule(bound=["p"])
    p = env.read_pod("p")
    assert p["spec"]["nodeName"] == node and json.loads(p["metadata"]["annotations"][ANN_ASSIGNMENT])[
        "gpus"
    ] == [1]


def test_drift_between_assignment_and_device_plugin_allocation(env: Env) -> None:
    topo = {"gpus": [{"index": g, "uuid": f"GPU-{env.tag}-{g}"} for g in range(2)], "nvlinkGroups": []}
    node = env.node("n", 2, annotations={ANN_TOPOLOGY: json.dumps(topo)})
    env.pod("p", {"nvidia.com/gpu": "1"})
    env.schedule(bound=["p"])
    (assigned,) = json.loads(env.read_pod("p")["metadata"]["annotations"][ANN_ASSIGNMENT])["gpus"]
    other = 1 - assigned

    def record(g: int) -> None:  # what the device plugin writes after Allocate
        ann = json.dumps({"c": {"nvidia.com/gpu": [f"GPU-{env.tag}-{g}"]}})
        env.v1.patch_namespaced_pod("p", env.ns, {"metadata": {"annotations": {ANN_ALLOCATED: ann}}})

    record(other)
    r = env.doctor("pod", f"{env.ns}/p")
    (drift,) = [f for f in r["findings"] if f["code"] == "drift-gpus"]
    assert f"booked GPU(s) [{assigned}] of {node}" in drift["message"]
    assert f"handed out GPU(s) [{other}]" in drift["message"]
    c = env.doctor("cluster")
    assert any(f["code"] == "drift-gpus" and f["subject"] == f"{env.ns}/p" for f in c["findings"])
    record(assigned)  # the device plugin's allocation brought back to the assignment
    r = env.doctor("pod", f"{env.ns}/p")
    assert [f["code"] for f in r["findings"] if f["level"] == "device"] == ["allocation-agrees"]


def test_gpu_map_from_the_live_api(env: Env) -> None:
    """``gpusched ui``'s endpoints on the live API: the map, a pending pod's reasons and its
    counterfactual, a bad name answered 404 naming it."""
    import urllib.error
    import urllib.request

    from gpusched.cli.doctor import load_books
    from gpusched.doctor.ui import BooksCache, serve

    node = env.node("ml", 2, taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
    env.pod("p", {"nvidia.com/gpu": "1"})
    env.schedule(pending=["p"])
    server = serve(BooksCache(lambda: load_books(None, str(env.cp.kubeconfig_path)), 0.0), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{url}/api/map") as r:
            m = json.load(r)
        (n,) = [n for n in m["nodes"] if n["name"] == node]
        assert len(n["gpus"]) == 2 and n["taints"] == ["dedicated=ml:NoSchedule"]
        (p,) = [p for p in m["pending"] if p["pod"] == f"{env.ns}/p"]
        assert "untolerated taint {dedicated: ml}" in p["message"]
        with urllib.request.urlopen(f"{url}/api/pod?name={env.ns}/p") as r:
            assert json.load(r)["counterfactuals"][0]["kind"] == "toleration"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}/api/pod?name={env.ns}/nope")
        assert e.value.code == 404 and f"{env.ns}/nope" in json.load(e.value)["error"]
        with urllib.request.urlopen(f"{url}/") as r:
            assert b"gpusched" in r.read()
    finally:
        server.shutdown()


def test_waits_for_quota_in_its_queue(env: Env, tmp_path: Path) -> None:
    """A Queue with a 1-GPU quota over the namespace, one GPU pod running in it, a second pending:
    doctor names the quota and the raise it needs; the Queue patched so, the pod binds."""
    from kubernetes import client

    from gpusched.bench.reclaim import install_queue_crd, queue_body
    from gpusched.k8s.queues import GROUP as QGROUP
    from gpusched.k8s.queues import PLURAL, VERSION

    install_queue_crd(env.cp)
    custom = client.CustomObjectsApi(env.api)
    queue = f"q-{env.tag}"
    custom.create_cluster_custom_object(
        QGROUP, VERSION, PLURAL, queue_body(queue, 1, namespaces=[env.ns]), _preload_content=False
    )
    try:
        node = env.node("n", 2)
        env.pod("w", {"nvidia.com/gpu": "1"})
        env.schedule(bound=["w"])
        env.pod("p", {"nvidia.com/gpu": "1"})
        env.schedule(pending=["p"])
        causes, cf = env.diagnose("p")
        assert "queue" in causes
        assert cf["kind"] == "quota" and cf["verified"] and cf["node"] == node
        assert cf["message"].startswith(
            f"waits for quota in queue {queue}: needs 1 more GPU(s) (used 1 of quota 1"
        )
        assert cf["change"]["raises"] == [
            {"key": "gpus", "by": 1, "field": "spec.nominalQuota.gpus", "to": 2}
        ]
        # the live cluster saved with its Queues and Namespaces: the snapshot says the same
        saved = tmp_path / "snap.json"
        code = "from gpusched.cli.doctor import kubectl_main; kubectl_main()"
        kc = str(env.cp.kubeconfig_path)
        subprocess.run([sys.executable, "-c", code, "doctor", "snapshot", str(saved), "--kubeconfig", kc],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        assert any(q["metadata"]["name"] == queue for q in json.loads(saved.read_text())["queues"])
        args = ["doctor", "pod", f"{env.ns}/p", "--snapshot", str(saved), "--json"]
        r = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        assert json.loads(r.stdout)["counterfactuals"][0]["change"] == cf["change"]
        c = env.doctor("cluster")
        (row,) = [q for q in c["queues"] if q["queue"] == queue]
        assert (row["usage"], row["quota"], row["pending"]) == ({"gpus": 1}, {"gpus": 1}, 1)
        assert any(r["reason"] == f"waits for quota in queue {queue}" for r in c["top_reasons"])
        # the counterfactual applied: the Queue's quota raised by the amount doctor named
        custom.patch_cluster_custom_object(QGROUP, VERSION, PLURAL, queue, cf["change"]["patch"])
        env.schedule(bound=["p"])
        assert env.read_pod("p")["spec"]["nodeName"] == node
        causes, _ = env.diagnose("w")
        assert "queue" not in causes
    finally:
        custom.delete_cluster_custom_object(QGROUP, VERSION, PLURAL, queue, _preload_content=False)
