"""gpusched on a real kubelet (containerd, runc, CNI) with its node agent as the device plugin, for both front
ends: the standalone scheduler (``gpusched scheduler``) and kube-scheduler + ``gpusched extender``.

The session's real node is one per machine (the kubelet's device-plugin directory is fixed): every test
marked ``kubelet`` runs on one xdist worker (tests/conftest.py's ``real-node`` group), and this file runs
after ``test_coexist.py`` there. The XID tests come last: a GPU marked unhealthy stays so for the rest of
the session.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import signal
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from agentpod import NAMESPACE, AgentPod, ImageUnavailable, image_archive
from kubeletlib import EXTENDER, FRONT_ENDS, GPU_UUIDS, ROUTING_OPT_OUT, SLOTS, STANDALONE, KubeletEnv, Ns
from kubernetes.client import ApiException

from gpusched.agent.allocation import ANN_ALLOCATED, RES_SHARE
from gpusched.agent.health import ANN_UNHEALTHY_GPUS
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MEMORY, RES_MILLI
from gpusched.testenv.node import DEVICE_PLUGIN_DIR
from gpusched.webhook.route import ANN_ROUTED_FROM
from realparts import unavailable
from webhookfixture import Webhook

pytestmark = pytest.mark.kubelet

front_ends = pytest.mark.parametrize("scheduler", list(FRONT_ENDS.values()), ids=list(FRONT_ENDS))


# ---------------------------------------------------------------------------------------------- pod specs


def _pod(
    name: str,
    image: str,
    resources: Mapping[str, str],
    *,
    scheduler: str | None = None,
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    res = {"cpu": "10m", "memory": "16Mi", **resources}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                # prints its environment, then waits; exits at once on SIGTERM (pods go fast)
                "command": ["sh", "-c", "trap 'exit 0' TERM; env; sleep 3600 & wait"],
                "resources": {"requests": res, "limits": res},
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "annotations": dict(annotations or {})}, "spec": spec}


def share_pod(
    name: str, image: str, scheduler: str, *, milli: int = 0, memory_mib: int = 0, slot: bool = True
) -> dict[str, Any]:
    """A GPU share (``gpusched.io/gpu-milli`` and/or ``gpusched.io/gpu-memory``). With ``slot`` it carries the
    ``gpusched.io/gpu-share: 1`` slot request that makes the kubelet call the agent's ``Allocate`` (as a user
    writes it where no webhook runs); without, it is written as users write it, and gpusched's mutating
    webhook (the ``webhook`` fixture) must add the slot. The one place share pods are built.
    """
    res = {RES_SHARE: "1"} if slot else {}
    if milli:
        res[RES_MILLI] = str(milli)
    if memory_mib:
        res[RES_MEMORY] = str(memory_mib)
    return _pod(name, image, res, scheduler=scheduler)


def gpu_pod(
    name: str,
    image: str,
    gpus: int,
    *,
    scheduler: str | None = None,
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return _pod(name, image, {RES_GPU: str(gpus)}, scheduler=scheduler, node=node, annotations=annotations)


# ------------------------------------------------------------------------------------------------ helpers


def assignment(pod: Mapping[str, Any]) -> dict[str, Any]:
    raw = pod["metadata"].get("annotations", {}).get(ANN_ASSIGNMENT)
    assert raw, f"pod {pod['metadata']['name']} has no {ANN_ASSIGNMENT}"
    return dict(json.loads(raw))


def visible(env: Mapping[str, str]) -> list[str]:
    return [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]


def container_id(pod: Mapping[str, Any]) -> tuple[str, int]:
    st = pod["status"]["containerStatuses"][0]
    return str(st.get("containerID")), int(st.get("restartCount", 0))


def checkpoint_gpus(resource: str = RES_GPU) -> dict[str, list[str]]:
    """The kubelet's own record of what it allocated (device-manager checkpoint): pod UID -> device IDs."""
    doc = json.loads((DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").read_text())
    out: dict[str, list[str]] = {}
    for e in doc["Data"].get("PodDeviceEntries") or []:
        if e["ResourceName"] != resource:
            continue
        ids = e["DeviceIDs"]
        flat = [d for v in ids.values() for d in v] if isinstance(ids, dict) else list(ids)
        out.setdefault(e["PodUID"], []).extend(flat)
    return out


def checkpoint_envs(pod_uid: str, resource: str) -> str:
    """The Allocate response the kubelet kept for the pod (base64 protobuf, searched as bytes)."""
    doc = json.loads((DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").read_text())
    for e in doc["Data"].get("PodDeviceEntries") or []:
        if e["PodUID"] == pod_uid and e["ResourceName"] == resource:
            return base64.b64decode(e["AllocResp"]).decode(errors="replace")
    return ""


def agent_events(ns: Ns, name: str) -> list[str]:
    return [
        str(e.get("message", ""))
        for e in ns.events(name)
        if (e.get("source") or {}).get("component") == "gpusched-agent"
        or e.get("reportingComponent") == "gpusched-agent"
    ]


def _failed(ns: Ns, name: str) -> dict[str, Any] | None:
    st = ns.pod(name)["status"]
    return dict(st) if st.get("phase") == "Failed" else None


def wait_scheduling_failed(ns: Ns, name: str) -> str:
    def probe() -> str | None:
        msgs = [str(e.get("message", "")) for e in ns.events(name) if e.get("reason") == "FailedScheduling"]
        return msgs[-1] if msgs else None

    return str(ns.wait(f"FailedScheduling of {ns.name}/{name}", probe, 60))


def plugin_registered(env: KubeletEnv, gpus: int, since: float) -> bool:
    """The agent serves (and registered) its sockets again after ``since`` (a restarted kubelet empties the
    directory; a restarted agent makes them anew), and the Node advertises ``gpus`` GPUs with their slots."""
    socks = [DEVICE_PLUGIN_DIR / n for n in ("gpusched-gpu.sock", "gpusched-gpu-share.sock")]
    if not all(p.exists() and p.stat().st_mtime >= since for p in socks):
        return False
    alloc = env.node.node().get("status", {}).get("allocatable", {})
    return bool(alloc.get(RES_GPU) == str(gpus) and alloc.get(RES_SHARE) == str(gpus * SLOTS))


# ------------------------------------------------------------------------------------------------- tests


def test_real_node_advertises_the_agents_resources_and_labels(kubelet_env: KubeletEnv) -> None:
    node = kubelet_env.node.node()
    status, labels = node["status"], node["metadata"]["labels"]
    assert status["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert status["capacity"][RES_GPU] == "4"
    assert status["capacity"][RES_SHARE] == str(4 * SLOTS)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.memory"] == "81920"


@front_ends
def test_two_shares_on_one_gpu_start_and_see_that_gpu_and_their_limits(
    kubelet_env: KubeletEnv, ns: Ns, scheduler: str
) -> None:
    image = kubelet_env.node.busybox_image
    names = [
        ns.create(share_pod(f"share-{i}", image, scheduler, milli=300, memory_mib=20480)) for i in range(2)
    ]
    pods = [ns.running(n) for n in names]
    gpus = [assignment(p)["gpus"] for p in pods]
    assert gpus[0] == gpus[1] and len(gpus[0]) == 1, f"gpusched placed the shares on GPUs {gpus}"
    uuid = GPU_UUIDS[gpus[0][0]]
    for p in pods:
        name = p["metadata"]["name"]
        a = assignment(p)
        assert a["node"] == kubelet_env.node.name and a["milli"] == 300 and a["memoryMiB"] == 20480
        for env in (ns.exec_env(name), ns.logs_env(name)):
            assert visible(env) == [uuid], f"{name}: {env.get('NVIDIA_VISIBLE_DEVICES')}"
            assert env["GPUSCHED_GPU_MILLI"] == "300"
            assert env["GPUSCHED_GPU_MEMORY_MIB"] == "20480"
            assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"
            assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        allocated = json.loads(p["metadata"]["annotations"][ANN_ALLOCATED])
        assert allocated == {"main": {RES_SHARE: [uuid]}}


@front_ends
def test_shares_written_without_the_slot_get_it_from_the_webhook_and_start_on_one_gpu(
    kubelet_env: KubeletEnv, webhook: Webhook, ns: Ns, scheduler: str
) -> None:
    """As users write shares: only ``gpu-memory`` (which must work) and only ``gpu-milli``, no slot. The
    webhook adds ``gpusched.io/gpu-share: 1``, so the kubelet calls the agent's ``Allocate`` for both."""
    image = kubelet_env.node.busybox_image
    shares = {"memory-only": (0, 20480), "milli-only": (300, 0)}  # (milli, memory MiB)
    bodies = {
        name: share_pod(name, image, scheduler, milli=milli, memory_mib=mib, slot=False)
        for name, (milli, mib) in shares.items()
    }
    for body in bodies.values():
        res = body["spec"]["containers"][0]["resources"]
        assert RES_SHARE not in res["limits"] and RES_SHARE not in res["requests"]
        ns.create(body)
    pods = {n: ns.running(n) for n in bodies}
    gpus = [assignment(p)["gpus"] for p in pods.values()]
    assert gpus[0] == gpus[1] and len(gpus[0]) == 1, f"gpusched placed the shares on GPUs {gpus}"
    uuid = GPU_UUIDS[gpus[0][0]]
    want = {
        "memory-only": {
            "GPUSCHED_GPU_MILLI": "0",
            "GPUSCHED_GPU_MEMORY_MIB": "20480",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        },
        "milli-only": {
            "GPUSCHED_GPU_MILLI": "300",
            "GPUSCHED_GPU_MEMORY_MIB": "0",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        },
    }
    limits = {
        "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    }  # fmt: skip
    for name, p in pods.items():
        # the stored pod carries the slot the webhook added, beside the user's request, in limits and requests
        res = p["spec"]["containers"][0]["resources"]
        for field in ("limits", "requests"):
            user = bodies[name]["spec"]["containers"][0]["resources"][field]
            assert res[field] == {**user, RES_SHARE: "1"}, (name, field, res[field])
        a = assignment(p)
        assert a["node"] == kubelet_env.node.name
        assert (a["milli"], a["memoryMiB"]) == shares[name], (name, a)
        for env in (ns.exec_env(name), ns.logs_env(name)):
            assert visible(env) == [uuid], f"{name}: {env.get('NVIDIA_VISIBLE_DEVICES')}"
            assert {k: env.get(k) for k in want[name]} == want[name], name
            assert not (limits - want[name].keys()) & env.keys(), f"{name}: a limit it did not ask for"
        allocated = json.loads(p["metadata"]["annotations"][ANN_ALLOCATED])
        assert allocated == {"main": {RES_SHARE: [uuid]}}


@front_ends
def test_whole_gpu_pod_sees_exactly_its_assigned_gpus(
    kubelet_env: KubeletEnv, ns: Ns, scheduler: str
) -> None:
    image = kubelet_env.node.busybox_image
    name = ns.create(gpu_pod("whole", image, 2, scheduler=scheduler))
    pod = ns.running(name)
    a = assignment(pod)
    assert len(a["gpus"]) == 2
    want = [GPU_UUIDS[i] for i in a["gpus"]]
    env = ns.exec_env(name)
    assert visible(env) == want
    assert visible(ns.logs_env(name)) == want
    # the kubelet's own books: the devices it allocated to the pod are the assigned GPUs
    assert sorted(checkpoint_gpus()[pod["metadata"]["uid"]]) == sorted(want)


@front_ends
def test_pod_asking_more_gpus_than_the_node_has_stays_pending(
    kubelet_env: KubeletEnv, ns: Ns, scheduler: str
) -> None:
    image = kubelet_env.node.busybox_image
    name = ns.create(gpu_pod("too-big", image, 5, scheduler=scheduler))
    msg = wait_scheduling_failed(ns, name)
    assert "0/1 nodes are available" in msg, msg
    assert "gpu" in msg.lower(), msg
    time.sleep(2)
    pod = ns.pod(name)
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"


def test_pod_bound_past_the_scheduler_asking_too_many_gpus_is_refused_by_the_kubelet(
    kubelet_env: KubeletEnv, ns: Ns
) -> None:
    image = kubelet_env.node.busybox_image
    name = ns.create(gpu_pod("too-big", image, 5, node=kubelet_env.node.name))

    def failed() -> dict[str, Any] | None:
        st = ns.pod(name)["status"]
        return st if st.get("phase") == "Failed" else None

    st = ns.wait(f"{name} refused", failed, 60)
    # the kubelet's device manager refuses it before any call to the agent
    assert st["reason"] == "UnexpectedAdmissionError", st
    assert f"available for {RES_GPU}. Requested: 5, Available: 4" in st["message"], st


@pytest.mark.parametrize(
    ("case", "annotation", "expect"),
    [
        ("missing", None, f"annotation {ANN_ASSIGNMENT} is missing"),
        ("malformed", "{not json", f"annotation {ANN_ASSIGNMENT} is not JSON"),
        ("bad-gpus", '{"node": "NODE", "gpus": "0"}', "field gpus is not a list of GPU indices"),
        ("other-node", '{"node": "elsewhere", "gpus": [0]}', "field node is 'elsewhere'"),
        ("gpu-not-on-node", '{"node": "NODE", "gpus": [7]}', "field gpus names GPU 7, which is not on"),
    ],
)
def test_bad_assignment_fails_allocate_with_an_event_naming_pod_and_field(
    kubelet_env: KubeletEnv, ns: Ns, case: str, annotation: str | None, expect: str
) -> None:
    node = kubelet_env.node.name
    ann = {ANN_ASSIGNMENT: annotation.replace("NODE", node)} if annotation else {}
    name = ns.create(gpu_pod(f"bad-{case}", kubelet_env.node.busybox_image, 1, node=node, annotations=ann))

    def failed() -> dict[str, Any] | None:
        st = ns.pod(name)["status"]
        return st if st.get("phase") == "Failed" else None

    st = ns.wait(f"{name} refused at admission", failed, 60)
    assert st.get("reason") == "UnexpectedAdmissionError", st
    assert expect in st.get("message", ""), st  # the kubelet passes the agent's error on
    msgs = ns.wait(f"the agent's event on {name}", lambda: agent_events(ns, name), 30)
    assert any(f"pod {ns.name}/{name}" in m and ANN_ASSIGNMENT in m and expect in m for m in msgs), msgs
    assert not ns.pod(name)["status"].get("containerStatuses", [{}])[0].get("state", {}).get("running")


@front_ends
def test_kubelet_and_agent_restarts_lose_nothing_and_allocate_nothing_twice(
    kubelet_env: KubeletEnv, ns: Ns, scheduler: str
) -> None:
    node, image = kubelet_env.node, kubelet_env.node.busybox_image
    first = [
        ns.create(share_pod("share-a", image, scheduler, milli=500, memory_mib=10240)),
        ns.create(gpu_pod("whole-b", image, 1, scheduler=scheduler)),
    ]
    before = {n: ns.running(n) for n in first}
    envs = {n: visible(ns.exec_env(n)) for n in first}

    def unchanged(names: list[str]) -> None:
        for n in names:
            p = ns.running(n)
            assert container_id(p) == container_id(before[n]), f"{n} was restarted"
            for key in (ANN_ASSIGNMENT, ANN_ALLOCATED):
                assert p["metadata"]["annotations"][key] == before[n]["metadata"]["annotations"][key], (
                    n,
                    key,
                )
            assert visible(ns.exec_env(n)) == envs[n]

    def add(name: str) -> None:
        ns.create(gpu_pod(name, image, 1, scheduler=scheduler))
        before[name] = ns.running(name)
        envs[name] = visible(ns.exec_env(name))

    def no_gpu_twice() -> None:
        whole = [n for n in before if n.startswith("whole")]
        used = [u for n in whole for u in envs[n]]
        assert len(used) == len(set(used)), {n: envs[n] for n in whole}
        cp = checkpoint_gpus()
        devices = [d for uid, ids in cp.items() for d in ids]
        assert len(devices) == len(set(devices)), cp
        for n in whole:
            assert sorted(cp[before[n]["metadata"]["uid"]]) == sorted(envs[n])

    t0 = time.time()
    node.restart_kubelet()
    ns.wait("the agent registered with the new kubelet", lambda: plugin_registered(kubelet_env, 4, t0), 60)
    restart_s = time.time() - t0
    unchanged(first)
    add("whole-c")
    no_gpu_twice()

    t1 = time.time()
    node.restart_agent()
    ns.wait("the restarted agent registered", lambda: plugin_registered(kubelet_env, 4, t1), 60)
    unchanged([*first, "whole-c"])
    add("whole-d")
    no_gpu_twice()
    ns.create(share_pod("share-e", image, scheduler, memory_mib=4096))
    e = ns.running("share-e")
    assert visible(ns.exec_env("share-e")) == [GPU_UUIDS[assignment(e)["gpus"][0]]]
    assert restart_s < 60


# ---------------------------------------------------- forged assignments, mixed schedulers (issues 28, 29)


def routed(ns: Ns) -> Ns:
    """The test's namespace with the webhook's GPU routing on (kubeletlib opts every namespace out), once the
    apiserver sees the label gone: a server-side dry run of a GPU pod comes back routed."""
    ns.cp.kubectl("label", "namespace", ns.name, f"{ROUTING_OPT_OUT}-")
    probe = json.dumps({"apiVersion": "v1", "kind": "Pod", **gpu_pod("routing-probe", "busybox", 1)})
    last: list[str] = []

    def on() -> bool:
        out = ns.cp.kubectl(
            *("create", "--dry-run=server", "-n", ns.name, "-o", "json", "-f", "-"), input=probe, check=False
        )
        last[:] = [out.stderr or out.stdout[-2000:]]
        return out.returncode == 0 and json.loads(out.stdout)["spec"]["schedulerName"] == STANDALONE

    try:
        ns.wait(f"GPU routing on in {ns.name}", on, 30)
    except TimeoutError as e:
        raise AssertionError(f"{e}; the last dry run: {last}") from None
    return ns


def test_a_gpu_pod_for_another_scheduler_is_routed_to_gpusched_and_runs(
    kubelet_env: KubeletEnv, webhook: Webhook, ns: Ns
) -> None:
    """issue 29 item 7: a GPU pod written as for any cluster (no schedulerName: kube-scheduler's) is routed to
    gpusched at admission and runs on the GPU gpusched assigned; one created with spec.nodeName (placed by no
    scheduler, so refused on the node before) is refused at admission, with the way out."""
    routed(ns)
    image = kubelet_env.node.busybox_image
    p = ns.running(ns.create(gpu_pod("any-job", image, 1)))
    assert p["spec"]["schedulerName"] == STANDALONE
    assert p["metadata"]["annotations"][ANN_ROUTED_FROM] == "default-scheduler"
    assert visible(ns.logs_env("any-job")) == [GPU_UUIDS[g] for g in assignment(p)["gpus"]]
    with pytest.raises(ApiException) as refused:
        ns.create(gpu_pod("pinned", image, 1, node=kubelet_env.node.name))
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 400 and 'webhook "gpu-routing.gpusched.io" denied' in message, message
    assert f"nodeSelector kubernetes.io/hostname: {kubelet_env.node.name}" in message, message


def test_a_forged_assignment_is_denied_and_past_the_guard_the_agent_refuses_it(
    kubelet_env: KubeletEnv, webhook: Webhook, ns: Ns
) -> None:
    """issue 28 F3: `victim` holds a GPU; `forged` names it in a hand-written assignment with spec.nodeName.
    A user is denied by the webhook. Past the webhook (here the control plane's admin is a writer: as on a
    cluster without it), the kubelet has free devices and admits the pod, and the agent refuses the GPU,
    naming both pods; the scheduler names the newcomer too, and the victim runs on."""
    image, node = kubelet_env.node.busybox_image, kubelet_env.node.name
    victim = ns.running(ns.create(gpu_pod("victim", image, 1, scheduler=FRONT_ENDS["standalone"])))
    (gpu,) = assignment(victim)["gpus"]
    forged = json.dumps({"node": node, "gpus": [gpu], "milli": 1000, "memoryMiB": 0})
    body = gpu_pod("forged", image, 1, node=node, annotations={ANN_ASSIGNMENT: forged})
    proc = ns.cp.kubectl(
        *("--as", "alice", "--as-group", "system:masters", "create", "-n", ns.name, "-f", "-"),
        input=json.dumps({"apiVersion": "v1", "kind": "Pod", **body}),
        check=False,
    )
    assert proc.returncode != 0, "a user wrote an assignment"
    want = f'"assignment-guard.gpusched.io" denied the request: alice sets annotation {ANN_ASSIGNMENT} on pod'
    assert want in proc.stderr, proc.stderr
    ns.create(body)
    st = ns.wait("forged refused at admission", lambda: _failed(ns, "forged"), 60)
    assert st.get("reason") == "UnexpectedAdmissionError", st
    assert f"names GPU {gpu} ({GPU_UUIDS[gpu]}), which live pod(s) {ns.name}/victim hold" in st["message"], st

    def events(reason: str, component: str) -> list[str] | None:
        return [
            str(e.get("message", ""))
            for e in ns.events("forged")
            if e.get("reason") == reason
            and component in (e.get("reportingComponent"), e["source"].get("component"))
        ] or None

    agent = ns.wait("the agent's event", lambda: events("GPUAssignmentConflict", "gpusched-agent"), 30)
    assert f"pod {ns.name}/forged" in agent[0] and f"{ns.name}/victim" in agent[0], agent
    books = ns.wait(
        "the scheduler's event", lambda: events("GPUAssignmentConflict", FRONT_ENDS["standalone"]), 30
    )
    assert f"pod {ns.name}/forged" in books[0] and f"held by {ns.name}/victim" in books[0], books
    still = ns.pod("victim")
    assert still["status"]["phase"] == "Running" and container_id(still) == container_id(victim)


def test_a_share_without_its_slot_runs_unisolated_with_a_warning(kubelet_env: KubeletEnv, ns: Ns) -> None:
    """issue 29 item 7: a share the webhook never saw (its namespace excluded) lacks gpusched.io/gpu-share, so
    the kubelet never calls the agent and it runs with no GPU environment: the scheduler says so in a Warning
    event on it (and doctor in a finding: tests/test_k8s_state_reports.py)."""
    ns.cp.kubectl("label", "namespace", ns.name, "gpusched.io/webhook=disabled")
    image = kubelet_env.node.busybox_image
    body = share_pod("no-slot", image, FRONT_ENDS["standalone"], milli=100, slot=False)

    def unseen() -> bool:  # the apiserver sees the label (when the session's webhook is registered)
        out = ns.cp.kubectl(
            *("create", "--dry-run=server", "-n", ns.name, "-o", "json", "-f", "-"),
            input=json.dumps({"apiVersion": "v1", "kind": "Pod", **body}),
            check=False,
        )
        return (
            out.returncode == 0
            and RES_SHARE not in json.loads(out.stdout)["spec"]["containers"][0]["resources"]["limits"]
        )

    ns.wait(f"the webhook leaving {ns.name} alone", unseen, 30)
    name = ns.create(body)
    ns.running(name)
    assert "NVIDIA_VISIBLE_DEVICES" not in ns.logs_env(name)  # what the warning is about

    def warned() -> list[str] | None:
        return [
            str(e.get("message")) for e in ns.events(name) if e.get("reason") == "GPUShareWithoutSlot"
        ] or None

    (msg, *_) = ns.wait("the GPUShareWithoutSlot event", warned, 30)
    assert f"pod {ns.name}/{name} asks for a GPU share without the {RES_SHARE}: 1 slot" in msg
    assert "no GPU isolation" in msg, msg


# ------------------------------------------------------------- the agent as the chart's DaemonSet pod; MPS

MPS_STANDIN = Path(__file__).resolve().parents[1] / "fakes" / "nvidia-cuda-mps-control"
ISOLATION = "gpusched.io/gpu-isolation"


def exec_out(ns: Ns, name: str, *cmd: str) -> str:
    out = ns.cp.kubectl("exec", "-n", ns.name, name, "-c", "main", "--", *cmd, check=False)
    assert out.returncode == 0, f"kubectl exec {name} -- {' '.join(cmd)}: {out.stderr}"
    return out.stdout


def mount_roots(ns: Ns, name: str) -> dict[str, str]:
    """Mount point -> the source path mounted there (mountinfo's root field), inside the container."""
    out = {}
    for line in exec_out(ns, name, "cat", "/proc/self/mountinfo").splitlines():
        f = line.split()
        out[f[4]] = f[3]
    return out


def wait_registered(env: KubeletEnv, ns: Ns, since: float, what: str) -> None:
    ns.wait(what, lambda: plugin_registered(env, 4, since), 120)


def gpu_env_of(ns: Ns, name: str) -> dict[str, Any]:
    """What a GPU container got from the agent, comparable across runs: its GPUs as the assignment's indices
    (checked against NVIDIA_VISIBLE_DEVICES), the share limits, and what the agent recorded."""
    p = ns.running(name)
    a = assignment(p)
    env = ns.exec_env(name)
    assert visible(env) == [GPU_UUIDS[g] for g in a["gpus"]], (name, env.get("NVIDIA_VISIBLE_DEVICES"))
    allocated = json.loads(p["metadata"]["annotations"][ANN_ALLOCATED])
    return {
        "gpus": a["gpus"],
        "env": {k: v for k, v in env.items() if k.startswith(("GPUSCHED_GPU_M", "CUDA_"))},
        "allocated": {
            c: {r: [GPU_UUIDS.index(u) for u in ids] for r, ids in rs.items()} for c, rs in allocated.items()
        },
    }


def test_the_agent_run_from_the_image_as_the_charts_daemonset_serves_the_kubelet_as_the_host_agent_does(
    kubelet_env: KubeletEnv, ns: Ns
) -> None:
    """The image of hack/build-image.sh, imported into the node's containerd, runs the chart's agent
    DaemonSet: its pod registers the device plugin, the Node keeps nvidia.com/gpu and the share slots, and a
    share and a whole-GPU pod get what the host-process agent gave the same pods."""
    node, image = kubelet_env.node, kubelet_env.node.busybox_image
    try:
        archive, ref = image_archive()
    except ImageUnavailable as e:
        unavailable(str(e))
    out = node.ctr("images", "import", str(archive), timeout=300)
    assert out.returncode == 0, out.stderr
    assert ref in node.ctr("images", "ls", "-q").stdout.split()

    def run_pods(prefix: str) -> dict[str, Any]:
        names = {
            "share": ns.create(share_pod(f"{prefix}-share", image, STANDALONE, milli=300, memory_mib=8192)),
            "whole": ns.create(gpu_pod(f"{prefix}-whole", image, 1, scheduler=STANDALONE)),
        }
        got = {k: gpu_env_of(ns, n) for k, n in names.items()}
        ns.delete_all()
        return got

    by_host = run_pods("host")
    agent = AgentPod(node, ref)
    t0 = time.time()
    node.stop_agent()
    try:
        agent.apply(slots=SLOTS, scheduler=EXTENDER, accept_envvar=True)

        def running() -> dict[str, Any] | None:
            pods = agent.pods()
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        try:
            pod = ns.wait("the agent's DaemonSet pod Running", running, 120)
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{agent.describe()}") from None
        assert pod["spec"]["nodeName"] == node.name
        assert pod["spec"]["containers"][0]["image"] == ref
        wait_registered(kubelet_env, ns, t0, "the agent pod registered with the kubelet")
        assert node.capacity(RES_GPU) == 4 and node.capacity(RES_SHARE) == 4 * SLOTS
        by_pod = run_pods("pod")
        assert by_pod == by_host
        # the container toolkit lets unprivileged pods pick GPUs: warned, exported, on the Node for doctor
        config = f"/host{node.workdir}/agent-pod/nvidia-container-runtime/config.toml"
        want = {"sharing": "none", "visibleDevicesEnvvar": True, "toolkitConfig": config}
        ns.wait(
            "the agent pod's gpu-isolation annotation",
            lambda: json.loads(node.node()["metadata"].get("annotations", {}).get(ISOLATION, "{}")) == want,
            30,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'gpusched_agent_sharing_mode{mode="none"} 1.0' in metrics
        assert f'gpusched_agent_visible_devices_envvar_accepted{{config="{config}"}} 1.0' in metrics
        logs = node.cp.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
        assert "accept-nvidia-visible-devices-envvar-when-unprivileged = true" in logs
        assert "GPU shares are scheduled but not enforced" in logs
    finally:
        agent.delete()
        ns.wait("the agent pod gone", lambda: not agent.pods(), 90)
        t1 = time.time()
        node.start_agent()
        wait_registered(kubelet_env, ns, t1, "the host agent registered again")


def test_mps_two_shares_on_one_gpu_get_their_limits_from_one_daemon_that_lives_from_first_to_last_share(
    kubelet_env: KubeletEnv, ns: Ns
) -> None:
    """--sharing mps on the real kubelet, with a stand-in nvidia-cuda-mps-control (no GPU here): each share
    container gets its GPU's pipe directory and the daemon's shm mounted and its own limits; the GPU's daemon
    starts with the first share, survives an agent restart, and stops with the last share."""
    node, image = kubelet_env.node, kubelet_env.node.busybox_image
    root = node.workdir / "mps"
    t0 = time.time()
    node.restart_agent(["--sharing", "mps", "--mps-control", str(MPS_STANDIN), "--mps-root", str(root)])
    try:
        wait_registered(kubelet_env, ns, t0, "the agent with --sharing mps registered")
        specs = {"mps-a": (300, 20480), "mps-b": (150, 8192)}  # (milli, MiB)
        for name, (milli, mib) in specs.items():
            ns.create(share_pod(name, image, STANDALONE, milli=milli, memory_mib=mib))
        pods = {n: ns.running(n) for n in specs}
        gpus = {n: assignment(p)["gpus"] for n, p in pods.items()}
        assert gpus["mps-a"] == gpus["mps-b"] and len(gpus["mps-a"]) == 1, gpus
        uuid = GPU_UUIDS[gpus["mps-a"][0]]
        pipe, shm = root / uuid / "pipe", root / uuid / "shm"
        for name, (milli, mib) in specs.items():
            a = assignment(pods[name])
            assert (a["milli"], a["memoryMiB"]) == (milli, mib)
            env = ns.exec_env(name)
            assert visible(env) == [uuid]
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}={mib}M"
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(math.ceil(milli / 10))
            assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env and "LD_PRELOAD" not in env
            mounts = mount_roots(ns, name)
            assert mounts["/run/nvidia-mps"].endswith(f"/mps/{uuid}/pipe"), mounts.get("/run/nvidia-mps")
            assert mounts["/dev/shm"].endswith(f"/mps/{uuid}/shm"), mounts.get("/dev/shm")
            assert "control" in exec_out(ns, name, "ls", "/run/nvidia-mps").split()
            # the daemon's /dev/shm is the container's: the stand-in left its mark there
            assert f"gpusched-fake-mps-{uuid}" in exec_out(ns, name, "ls", "/dev/shm").split()
        pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())

        def starts() -> int:
            return (root / uuid / "log" / "commands.log").read_text().splitlines().count(f"{uuid} -d")

        def alive() -> bool:
            try:
                return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
            except FileNotFoundError:
                return False

        assert alive() and starts() == 1
        # one shared GPU, one daemon
        assert sorted(p.parent.parent.name for p in root.glob("*/pipe/control")) == [uuid]
        assert (shm / f"gpusched-fake-mps-{uuid}").exists()

        t1 = time.time()
        node.restart_agent()
        wait_registered(kubelet_env, ns, t1, "the restarted agent registered")
        time.sleep(3)  # past a reconcile of the restarted agent
        assert alive() and starts() == 1, "the restarted agent did not keep the running shares' daemon"

        node.cp.kubectl("delete", "pod", "-n", ns.name, "mps-a", "--grace-period=1")
        ns.wait("mps-a gone", lambda: [p["metadata"]["name"] for p in ns.pods()] == ["mps-b"], 60)
        time.sleep(6)  # past the agent's next look at the pods (every 5 s while a daemon runs)
        assert alive(), "the daemon stopped while mps-b still runs on it"
        node.cp.kubectl("delete", "pod", "-n", ns.name, "mps-b", "--grace-period=1")
        ns.wait("the daemon stopped with the GPU's last share", lambda: not alive(), 60)
        log = (root / uuid / "log" / "commands.log").read_text().splitlines()
        assert log.count(f"{uuid} quit") == 1 and starts() == 1
        assert not (pipe / "control").exists()
    finally:
        ns.delete_all()
        t2 = time.time()
        node.restart_agent([])
        for pidfile in root.glob("*/pipe/nvidia-cuda-mps-control.pid"):  # a stand-in daemon a failure left
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
        wait_registered(kubelet_env, ns, t2, "the agent without MPS registered again")


# ------------------------------------------------------------------------ last: GPUs become unhealthy


@pytest.mark.parametrize(
    ("scheduler", "bad_gpu"), [(s, i + 1) for i, s in enumerate(FRONT_ENDS.values())], ids=list(FRONT_ENDS)
)
def test_xid_makes_the_gpu_unhealthy_and_new_pods_avoid_it(
    kubelet_env: KubeletEnv, ns: Ns, scheduler: str, bad_gpu: int
) -> None:
    node = kubelet_env.node
    node.inject_xid(bad_gpu, 79)  # "GPU has fallen off the bus": critical

    def unhealthy() -> set[int] | None:
        n = node.node()
        ann = n["metadata"].get("annotations", {}).get(ANN_UNHEALTHY_GPUS, "")
        bad = {int(i) for i in ann.split(",") if i}
        alloc = int(n["status"]["allocatable"].get(RES_GPU, "0"))
        return bad if bad_gpu in bad and alloc == 4 - len(bad) else None

    bad = ns.wait(f"GPU {bad_gpu} unhealthy on the Node (annotation and allocatable)", unhealthy, 60)
    assert node.node()["status"]["capacity"][RES_GPU] == "4"  # the count stays: indices do not shift
    # a pod whose assignment names the failed GPU (placed before it failed, or by stale books) is refused,
    # though the kubelet offers a healthy device
    stale = json.dumps({"node": node.name, "gpus": [bad_gpu], "milli": 1000, "memoryMiB": 0})
    old = ns.create(
        gpu_pod("stale", node.busybox_image, 1, node=node.name, annotations={ANN_ASSIGNMENT: stale})
    )
    st = ns.wait(f"{old} refused", lambda: _failed(ns, old), 60)
    assert f"names GPU {bad_gpu} ({GPU_UUIDS[bad_gpu]}), which is unhealthy" in st["message"], st
    healthy = [i for i in range(4) if i not in bad]
    name = ns.create(gpu_pod("after-xid", node.busybox_image, len(healthy), scheduler=scheduler))
    pod = ns.running(name)
    assert sorted(assignment(pod)["gpus"]) == healthy
    seen = visible(ns.exec_env(name))
    assert sorted(seen) == sorted(GPU_UUIDS[i] for i in healthy)
    assert not {GPU_UUIDS[i] for i in bad} & set(seen)
    # and a share now finds no room at all: every healthy GPU is taken whole
    share = ns.create(share_pod("share-after-xid", node.busybox_image, scheduler, milli=100))
    msg = wait_scheduling_failed(ns, share)
    assert "0/1 nodes are available" in msg, msg
