"""A gang of claim pods on the real control plane (issue 32 item 3): gpusched allocates the members'
claims jointly where pod-by-pod allocation fails, and the control plane's own kube-scheduler, given the
same pods one by one, ends with a partial gang. A gang that fits under no joint choice binds nothing and
holds no device.

Shares ``test_dra_e2e``'s ``DraEnv`` (its module fixture ``dra``: a namespace, DeviceClasses, kwok nodes
with slices in NVIDIA's driver's shape, one standalone scheduler) and ``test_gangs_e2e``'s gang CRDs;
the gangs are coscheduling PodGroups.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_dra_e2e import A100, H100, DraEnv, dra, exactly, gpu  # noqa: F401 (dra: the fixture)
from test_gangs_e2e import gang_apis  # noqa: F401 (the fixture)

from gpusched.k8s.groupref import LABEL_COSCHEDULING
from gpusched.testenv import wait_until

pytestmark = pytest.mark.e2e

IS_A100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-40GB'"


def templates(env: DraEnv) -> None:
    """flex: two A100s, else any one GPU (firstAvailable); pair: two A100s; one-a100: one A100."""
    env.template(
        "flex",
        [
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "two", **exactly(env.gpu_class, 2, [IS_A100])},
                    {"name": "one", **exactly(env.gpu_class, 1)},
                ],
            }
        ],
    )
    env.template("pair", [{"name": "gpu", "exactly": exactly(env.gpu_class, 2, [IS_A100])}])
    env.template("one-a100", [{"name": "gpu", "exactly": exactly(env.gpu_class, 1, [IS_A100])}])


def group(env: DraEnv, name: str, min_member: int) -> None:
    from kubernetes import client

    client.CustomObjectsApi(env.api).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", env.ns, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
         "spec": {"minMember": min_member}},
    )  # fmt: skip


def results(env: DraEnv, pod: str) -> list[tuple[str, str]]:
    """(request, device) of the pod's claim as the API shows it ([] when not allocated)."""
    alloc = (env.claim_of(pod, "gpu").get("status") or {}).get("allocation") or {}
    return sorted((r["request"], r["device"]) for r in alloc.get("devices", {}).get("results", []))


def pending_reason(env: DraEnv, pod: str) -> str | None:
    """kube-scheduler's (or gpusched's) PodScheduled=False reason, once it has said so."""
    for c in (env.read_pod(pod).get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("reason"))
    return None


def events(env: DraEnv, pod: str, reason: str = "FailedScheduling") -> list[str]:
    resp = env.v1.list_namespaced_event(
        env.ns, field_selector=f"involvedObject.name={pod},reason={reason}", _preload_content=False
    )
    return [str(e["message"]) for e in json.loads(resp.data)["items"]]


def member(env: DraEnv, name: str, group: str, template: str, *, gang: str = "") -> None:
    """A pod with one claim from ``template``: for gpusched in PodGroup ``gang``, or without a gang
    for the control plane's own kube-scheduler."""
    entry = [{"name": "gpu", "resourceClaimTemplateName": template}]
    if gang:
        env.pod(name, group, entry, **{LABEL_COSCHEDULING: gang})
    else:
        env.pod(name, group, entry, scheduler="default-scheduler")


def told(env: DraEnv, pod: str, text: str) -> None:
    wait_until(lambda: any(text in m for m in events(env, pod)), timeout=60,
               what=f"{pod} told {text!r}", control_plane=env.cp)  # fmt: skip


def node_gpus() -> list[dict[str, Any]]:
    """Two A100s, then an H100 (device order): a flex pod decided first takes both A100s."""
    return [gpu(0, A100), gpu(1, A100), gpu(2, H100)]


def test_a_gang_pod_by_pod_allocation_splits_is_placed_jointly_by_gpusched(
    gang_apis: None,  # noqa: F811
    dra: DraEnv,  # noqa: F811
) -> None:
    templates(dra)
    # kube-scheduler, pod by pod (flex first, as gpusched decides them): flex takes both A100s
    # (its first sub-request), pair fits nowhere: a partial gang
    k_group = f"kube-{dra.tag}"
    k_node = dra.node_with_gpus(k_group, "kube", node_gpus())
    member(dra, "k-flex", k_group, "flex")
    assert dra.bound("k-flex") == k_node
    member(dra, "k-pair", k_group, "pair")
    wait_until(lambda: pending_reason(dra, "k-pair") == "Unschedulable", timeout=60,
               what="kube-scheduler refusing k-pair", control_plane=dra.cp)  # fmt: skip
    assert results(dra, "k-flex") == [("gpu/two", "gpu-0"), ("gpu/two", "gpu-1")]
    assert not dra.read_pod("k-pair")["spec"].get("nodeName") and results(dra, "k-pair") == []

    # gpusched, the same pods as a gang of two: flex falls back to its second sub-request on the
    # H100, pair gets both A100s, and both are bound
    g_group = f"gang-{dra.tag}"
    g_node = dra.node_with_gpus(g_group, "gang", node_gpus())
    group(dra, "jointly", 2)
    member(dra, "flex", g_group, "flex", gang="jointly")
    member(dra, "pair", g_group, "pair", gang="jointly")
    assert dra.bound("flex") == g_node and dra.bound("pair") == g_node
    assert results(dra, "flex") == [("gpu/one", "gpu-2")]
    assert results(dra, "pair") == [("gpu", "gpu-0"), ("gpu", "gpu-1")]
    for pod in ("flex", "pair"):
        claim = dra.claim_of(pod, "gpu")
        assert [r["name"] for r in claim["status"]["reservedFor"]] == [pod]
    held = [d for d in dra.devices_held() if d[0] == g_node]
    assert sorted(held) == sorted(set(held)) and len(held) == 3

    # a gang that fits under no joint choice (three members need three A100s of two): nothing
    # bound, no claim allocated, no device held in gpusched's books, each member told why
    n_group = f"none-{dra.tag}"
    n_node = dra.node_with_gpus(n_group, "none", node_gpus())
    group(dra, "toobig", 3)
    members = (("n-flex", "flex"), ("n-pair", "pair"), ("n-one", "one-a100"))
    for name, template in members:
        member(dra, name, n_group, template, gang="toobig")
    for name, _ in members:
        told(dra, name, "no joint choice of the members' claims fits")
    for name, _ in members:
        assert not dra.read_pod(name)["spec"].get("nodeName") and results(dra, name) == []
    assert not [d for d in dra.devices_held() if d[0] == n_node]
    assert not [k for k in dra.sched.claims.books.reservations() if k.startswith(f"{dra.ns}/n-")]


def test_a_gang_members_written_claim_is_taken_back_on_the_real_api(dra: DraEnv) -> None:  # noqa: F811
    """What ``DraClaims.write_all`` does to the members written before one that failed, against the
    real apiserver's validation: the claim is deallocated (allocation and reservedFor cleared in one
    status update), the delete-protection finalizer removed; the devices show free again. The pod is
    real (left pending: no scheduler serves its name), so the resourceclaim controller keeps it in
    ``reservedFor`` meanwhile."""
    from gpusched.core.dra.model import ClaimAllocation, DeviceResult
    from gpusched.k8s.dra.podclaims import ClaimRef
    from gpusched.k8s.dra.writer import FINALIZER

    node = dra.node_with_gpus(f"undo-{dra.tag}", "undo", [gpu(0, A100)])
    dra.claim("undo-me", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
    obj = dra.read_claim("undo-me")
    dra.pod(
        "holder", f"undo-{dra.tag}", [{"name": "gpu", "resourceClaimName": "undo-me"}], scheduler="nobody"
    )
    pod = dra.read_pod("holder")
    mine = ClaimAllocation(f"{dra.ns}/undo-me", (DeviceResult("gpu", "gpu.nvidia.com", node, "gpu-0"),), node)
    ref = ClaimRef("gpu", f"{dra.ns}/undo-me", obj["metadata"]["uid"], False)
    books, writer = dra.sched.claims.books, dra.sched.claims.writer
    books.reserve(f"{dra.ns}/holder", node, (mine,))
    assert writer.write(pod, (ref,), keep_trying=lambda: True).ok
    written = dra.read_claim("undo-me")
    assert written["status"]["allocation"] and FINALIZER in written["metadata"]["finalizers"]
    writer.undo(pod, (ref,), {mine.claim: mine})
    books.unreserve(f"{dra.ns}/holder")
    after = dra.read_claim("undo-me")
    assert not after["status"].get("allocation") and not after["status"].get("reservedFor")
    assert FINALIZER not in (after["metadata"].get("finalizers") or [])
    wait_until(lambda: not [d for d in dra.devices_held() if d[0] == node], timeout=10, what="gpu-0 free")
