"""Tenant queues on the real control plane: the Queue CRD's validation and printer columns, borrow
and reclaim (tenant A idle, B borrows, A submits, B's borrowed pods are evicted, A's land), an
unknown queue and a cycle of parents named in events, and native ResourceQuota on GPU resources
beside gpusched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from test_standalone import Env, check_no_overcommit

from gpusched.bench.reclaim import bench_reclaim, gpu_pod, install_queue_crd, queue_body
from gpusched.k8s.queues import GROUP, PLURAL, VERSION
from gpusched.testenv import ControlPlane, ControlPlaneError, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(control_plane: ControlPlane) -> Iterator[Env]:
    install_queue_crd(control_plane)
    e = Env(control_plane)
    try:
        yield e
    finally:
        e.cleanup()


def custom(env: Env) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(env.api)


def status(env: Env, name: str) -> dict[str, Any]:
    resp = custom(env).get_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, _preload_content=False)
    return dict(json.loads(resp.data).get("status") or {})


def test_borrow_and_reclaim(control_plane: ControlPlane) -> None:
    r = bench_reclaim(control_plane, nodes=2, gpus_per_node=4)
    # B ran 8 one-GPU pods on 4 GPUs of quota (4 borrowed); A claimed its 4: exactly 4 of B's left
    assert (r.running, r.borrowed_before, r.claim) == (8, 4, 4)
    assert (r.a_bound, r.b_bound_after, r.evicted) == (4, 4, 4)
    assert r.reclaim_s < 60


def test_queue_validation_status_columns_and_bad_input(env: Env) -> None:
    from kubernetes.client.exceptions import ApiException

    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    api = custom(env)
    t = env.tag
    made: list[str] = []

    def create(body: dict[str, Any]) -> None:
        api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _preload_content=False)
        made.append(body["metadata"]["name"])

    # the schema refuses negative quotas and a queue that is its own parent, naming the field
    with pytest.raises(ApiException) as neg:
        create(queue_body(f"neg-{t}", -1))
    assert neg.value.status == 422 and "spec.nominalQuota.gpus" in neg.value.body
    with pytest.raises(ApiException) as own:
        create(queue_body(f"self-{t}", 1, parent=f"self-{t}"))
    assert own.value.status == 422 and "spec.parent" in own.value.body
    create(queue_body(f"x-{t}", 1, parent=f"y-{t}"))
    create(queue_body(f"y-{t}", 1, parent=f"x-{t}"))
    create(queue_body(f"ok-{t}", 2, namespaces=[env.ns]))
    sched = None
    try:
        env.nodes([(f"{t}-n0", 16000, 65536, 4, "T4")])
        res = {"cpu": "1", "nvidia.com/gpu": "1"}
        env.create_pods([
            env.pod("in-ns", res),  # its namespace is listed by queue ok
            env.pod("unknown", res, ann={"gpusched.io/queue": f"nope-{t}"}),
            env.pod("cyclic", res, ann={"gpusched.io/queue": f"x-{t}"}),
        ])  # fmt: skip
        sched = StandaloneScheduler(env.api, SchedulerConfig(scheduler_name=env.scheduler)).start()

        def settled() -> bool:
            names = {e["involvedObject"]["name"] for e in env.events("FailedScheduling")}
            bound = {p["metadata"]["name"] for p in env.list_pods() if p["spec"].get("nodeName")}
            return bound == {"in-ns"} and {"unknown", "cyclic"} <= names

        wait_until(settled, timeout=60, what="in-ns bound, unknown and cyclic refused")
        assert (
            f"queue 'nope-{t}' (annotation gpusched.io/queue of pod {env.ns}/unknown) is not a known Queue"
            in env.failure("unknown")
        )
        assert "spec.parent forms a cycle of parents" in env.failure("cyclic")

        def valid_false() -> bool:
            conds = status(env, f"x-{t}").get("conditions") or []
            return any(c["type"] == "Valid" and c["status"] == "False" for c in conds)

        wait_until(valid_false, timeout=30, what="queue x marked Valid=False")
        (cond,) = status(env, f"x-{t}")["conditions"]
        assert "spec.parent" in cond["message"] and f"x-{t}" in cond["message"]
        wait_until(
            lambda: status(env, f"ok-{t}").get("usage", {}).get("gpus") == 1, timeout=30, what="ok's usage"
        )
        assert status(env, f"ok-{t}")["quota"] == {"gpus": 2}
        events = json.loads(env.v1.list_namespaced_event("default", field_selector="reason=InvalidQueue",
                                                         _preload_content=False).data)["items"]  # fmt: skip
        assert any(e["involvedObject"]["name"] == f"x-{t}" and "spec.parent" in e["message"] for e in events)
        # kubectl get queues shows quota and usage (the printer columns)
        out = env.cp.kubectl("get", "queues", f"ok-{t}").stdout.split("\n")
        assert out[0].split()[:6] == ["NAME", "PARENT", "WEIGHT", "QUOTA", "GPUS", "USED"]
        assert out[1].split()[:4] == [f"ok-{t}", "1", "2", "1"]
    finally:
        if sched is not None:
            sched.stop()
        for name in made:
            api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name, _preload_content=False)


def test_resource_quota_on_gpu_resources_refuses_pods_and_gpusched_stays_consistent(env: Env) -> None:
    from kubernetes.client.exceptions import ApiException

    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    quota = {
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2", "requests.gpusched.io/gpu-milli": "1000"}},
    }
    env.v1.create_namespaced_resource_quota(env.ns, quota, _preload_content=False)

    def quota_status() -> dict[str, Any]:
        rq = json.loads(env.v1.read_namespaced_resource_quota("gpus", env.ns, _preload_content=False).data)
        return dict(rq.get("status") or {})

    def quota_ready() -> bool:
        return bool(quota_status().get("hard"))

    wait_until(quota_ready, timeout=30, what="the ResourceQuota's status")
    whole = {"cpu": "1", "nvidia.com/gpu": "1"}
    share = {"cpu": "1", "gpusched.io/gpu-milli": "600"}
    env.create_pods([env.pod("w0", whole), env.pod("w1", whole), env.pod("s0", share)], threads=1)
    for name, res, what in (
        ("w2", whole, "requests.nvidia.com/gpu"),
        ("s1", share, "requests.gpusched.io/gpu-milli"),
    ):
        with pytest.raises(ApiException) as refused:
            env.v1.create_namespaced_pod(env.ns, env.pod(name, res), _preload_content=False)
        assert (
            refused.value.status == 403
            and "exceeded quota" in refused.value.body
            and what in refused.value.body
        )
    env.nodes([(f"{env.tag}-n0", 16000, 65536, 4, "T4")])
    sched = StandaloneScheduler(env.api, SchedulerConfig(scheduler_name=env.scheduler)).start()
    try:
        bound = lambda: sum(1 for p in env.list_pods() if p["spec"].get("nodeName"))  # noqa: E731
        wait_until(lambda: bound() == 3, timeout=60, what="the three admitted pods bound")
        # a pod deleted frees quota: the API admits the next one and gpusched places it
        env.v1.delete_namespaced_pod("w0", env.ns, grace_period_seconds=0, _preload_content=False)
        wait_until(lambda: len(env.list_pods()) == 2, timeout=30, what="w0 gone")
        # the quota controller releases w0's GPU a moment after the pod is gone (403 before that)
        used = lambda: (quota_status().get("used") or {}).get("requests.nvidia.com/gpu")  # noqa: E731
        wait_until(lambda: used() == "1", timeout=30, what="the quota to release w0's GPU")
        env.create_pods([env.pod("w3", whole)])
        wait_until(lambda: bound() == 3, timeout=60, what="w3 bound")
        assert check_no_overcommit(env.list_nodes(), env.list_pods()) == 2000 + 600
        with sched.cluster.live_books() as snap:
            assert sorted(k.split("/")[1] for k in snap.allocations) == ["s0", "w1", "w3"]
    finally:
        sched.stop()


def test_the_queue_crd_refuses_what_its_schema_forbids(control_plane: ControlPlane) -> None:
    install_queue_crd(control_plane)
    bad = json.dumps(queue_body("weightless", 1, weight=0))
    with pytest.raises(ControlPlaneError, match=r"spec\.weight"):
        control_plane.kubectl("create", "-f", "-", input=bad)
    assert gpu_pod("p", "ns", "s", {}, "q")["metadata"]["annotations"] == {"gpusched.io/queue": "q"}
