"""Behind Kueue, on the real control plane: Kueue (built from sigs.k8s.io/kueue by hack/build-kueue.sh)
admits Jobs against a ClusterQueue whose quota counts GPU shares (``gpusched.io/gpu-milli``), and
gpusched's standalone scheduler places the admitted Jobs' pods on GPUs.

Kueue's webhooks are not registered (the apiserver cannot reach them here): Jobs are created suspended,
as its defaulting webhook would make them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from test_standalone import Env, check_no_overcommit

from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_MILLI
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.binaries import BinariesUnavailableError
from gpusched.testenv.kueue import KueueError, KueueManager, find_kueue, install_kueue_crds
from realparts import unavailable

pytestmark = pytest.mark.e2e

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QUOTA_MILLI = 1000  # Kueue's quota: one GPU's worth of shares, on a node of two GPUs


@pytest.fixture(scope="module")
def kueue(control_plane: ControlPlane) -> Iterator[KueueManager]:
    try:
        build = find_kueue()
    except BinariesUnavailableError as exc:
        if exc.go_missing:
            unavailable(f"Kueue cannot be built: Go is not installed. {exc}")
        pytest.fail(f"Kueue could not be built: {exc}", pytrace=False)
    install_kueue_crds(control_plane, build)
    manager = KueueManager(control_plane, build)
    try:
        manager.start()
    except KueueError as exc:
        pytest.fail(f"Kueue did not start: {exc}", pytrace=False)
    try:
        yield manager
    finally:
        manager.stop()


@pytest.fixture
def env(control_plane: ControlPlane, kueue: KueueManager) -> Iterator[Env]:
    e = Env(control_plane)
    try:
        yield e
    finally:
        e.cleanup()


def _custom(env: Env) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(env.api)


def _job(env: Env, name: str, queue: str, pods: int, milli: int) -> dict[str, Any]:
    res = {"cpu": "500m", "memory": "512Mi", RES_MILLI: str(milli)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": env.ns, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "suspend": True,  # what Kueue's defaulting webhook sets (not registered here)
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "schedulerName": env.scheduler,
                    "restartPolicy": "Never",
                    "nodeSelector": {"gpusched.io/e2e-group": env.tag},
                    "containers": [
                        {"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}
                    ],
                }
            },
        },
    }


def _workload(env: Env, job: str) -> dict[str, Any] | None:
    resp = _custom(env).list_namespaced_custom_object(
        GROUP, VERSION, env.ns, "workloads", _preload_content=False
    )
    for wl in json.loads(resp.data)["items"]:
        if any(o["kind"] == "Job" and o["name"] == job for o in wl["metadata"].get("ownerReferences", [])):
            return dict(wl)
    return None


def _condition(wl: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((wl or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def _suspended(env: Env, job: str) -> bool:
    from kubernetes import client

    resp = client.BatchV1Api(env.api).read_namespaced_job(job, env.ns, _preload_content=False)
    return bool(json.loads(resp.data)["spec"].get("suspend"))


def _pods_of(env: Env, job: str) -> list[dict[str, Any]]:
    return [p for p in env.list_pods() if p["metadata"].get("labels", {}).get("job-name") == job]


def _active(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]


def test_kueue_admits_and_gpusched_places_gpu_shares(env: Env) -> None:
    from kubernetes import client

    api, t = _custom(env), env.tag
    flavor, cq, lq = f"default-{t}", f"gpu-{t}", "team"
    env.nodes([(f"{t}-n0", 16000, 65536, 2, "T4")])
    api.create_cluster_custom_object(GROUP, VERSION, "resourceflavors",
                                     {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor",
                                      "metadata": {"name": flavor}, "spec": {}})  # fmt: skip
    quota = {"cpu": "8", "memory": "16Gi", RES_MILLI: str(QUOTA_MILLI), "nvidia.com/gpu": "1"}
    api.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ns}},
            "resourceGroups": [{
                "coveredResources": list(quota),
                "flavors": [{"name": flavor,
                             "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}],
            }],
        },
    })  # fmt: skip
    sched = None
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, env.ns, "localqueues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
            "metadata": {"name": lq, "namespace": env.ns}, "spec": {"clusterQueue": cq},
        })  # fmt: skip
        batch = client.BatchV1Api(env.api)
        # first: 2 pods × 400 milli = 800 ≤ 1000; second: 600 more would be 1400 > 1000 (the node has 2000)
        batch.create_namespaced_job(env.ns, _job(env, "first", lq, 2, 400), _preload_content=False)

        def admitted(job: str) -> bool:
            c = _condition(_workload(env, job), "Admitted")
            return bool(c and c["status"] == "True") and not _suspended(env, job)

        wait_until(lambda: admitted("first"), timeout=90, what="job first admitted by Kueue and unsuspended")
        cq_usage = wait_until(
            lambda: _milli_reserved(env, cq, flavor), timeout=30, what="Kueue's usage of cq"
        )
        assert cq_usage == 800
        batch.create_namespaced_job(env.ns, _job(env, "second", lq, 1, 600), _preload_content=False)

        def pending_on_quota() -> str | None:
            c = _condition(_workload(env, "second"), "QuotaReserved")
            return str(c["message"]) if c and c["status"] == "False" and c["message"] else None

        message = wait_until(pending_on_quota, timeout=60, what="job second's Workload pending on quota")
        assert f"insufficient unused quota for {RES_MILLI} in flavor {flavor}, 400 more needed" in message
        assert _suspended(env, "second") and not _pods_of(env, "second")

        sched = StandaloneScheduler(env.api, SchedulerConfig(scheduler_name=env.scheduler)).start()
        placed: dict[str, dict[str, Any]] = {}

        def landed(job: str, n: int) -> bool:
            pods = env.list_pods()
            nodes = env.list_nodes()
            active = _active(pods)
            check_no_overcommit(nodes, active)  # no GPU over-booked, at any poll
            assert sum(int(_milli(p)) for p in active if p["spec"].get("nodeName")) <= QUOTA_MILLI
            for p in pods:
                if p["spec"].get("nodeName"):
                    placed[p["metadata"]["name"]] = p
            mine = [p for p in placed.values() if p["metadata"]["labels"].get("job-name") == job]
            return len(mine) == n

        wait_until(lambda: landed("first", 2), timeout=90, what="job first's 2 pods bound by gpusched")
        wait_until(lambda: admitted("second") and landed("second", 1), timeout=120,
                   what="job second admitted once first finished, its pod bound")  # fmt: skip
        first_done = _condition(_workload(env, "first"), "Finished")
        assert first_done is not None and first_done["status"] == "True"
        for p in placed.values():
            a = json.loads(p["metadata"]["annotations"][ANN_ASSIGNMENT])
            assert a["node"] == p["spec"]["nodeName"] == f"{t}-n0" and len(a["gpus"]) == 1
            assert 0 <= a["gpus"][0] < 2
        assert len(placed) == 3
    finally:
        if sched is not None:
            sched.stop()
        for plural, name in (("clusterqueues", cq), ("resourceflavors", flavor)):
            api.delete_cluster_custom_object(GROUP, VERSION, plural, name, _preload_content=False)


def _milli(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["resources"]["requests"].get(RES_MILLI, "0"))


def _milli_reserved(env: Env, cq: str, flavor: str) -> int | None:
    """The ``gpusched.io/gpu-milli`` Kueue has reserved in ClusterQueue ``cq`` (None before it says)."""
    resp = _custom(env).get_cluster_custom_object(GROUP, VERSION, "clusterqueues", cq, _preload_content=False)
    for fu in (json.loads(resp.data).get("status") or {}).get("flavorsReservation") or []:
        if fu["name"] == flavor:
            for r in fu["resources"]:
                if r["name"] == RES_MILLI and r["total"] != "0":
                    return int(r["total"])
    return None
