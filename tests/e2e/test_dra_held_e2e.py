"""Mixed nodes, the other direction (docs/dra.md): a GPU that a device-plugin pod holds on a node where
another DRA driver publishes the same GPUs is refused to claims by the real kube-scheduler, through the
DeviceTaintRule gpusched's agent writes (``agent/dra/heldtaints.py``), and given again once the rule goes.

A kwok node; NVIDIA's driver's slice (two GPUs with their UUIDs) published by the test (``test_dra_e2e``'s
``DraEnv``); a pod bound to the node with the agent's ``gpusched.io/allocated`` naming GPU 0, as the device
plugin hands it out; claim pods scheduled by the control plane's own kube-scheduler.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_dra_e2e import A100, DRIVER, DraEnv, dra, exactly, gpu

from gpusched.agent.dra.heldtaints import LABEL_NODE, TAINT_KEY, HeldTaints, KubeTaintRules, held_gpus
from gpusched.agent.fake import FakeBackend
from gpusched.agent.pods import KubePods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"


__all__ = ["dra"]  # test_dra_e2e's fixture, a DraEnv of this module's own


def test_devicetaintrules_are_served_as_resource_k8s_io_v1(control_plane: ControlPlane) -> None:
    groups = json.loads(control_plane.kubectl("get", "--raw", "/apis/resource.k8s.io").stdout)
    served = {v["version"] for v in groups["versions"]}
    kinds = json.loads(control_plane.kubectl("get", "--raw", "/apis/resource.k8s.io/v1").stdout)
    assert "devicetaintrules" in {r["name"] for r in kinds["resources"]}, served
    assert groups["preferredVersion"]["version"] == "v1"


def _claim_pod(dra: DraEnv, name: str, group: str, count: int) -> None:
    dra.claim(name, [{"name": "gpu", "exactly": exactly(dra.gpu_class, count=count)}])
    dra.v1.create_namespaced_pod(
        dra.ns,
        {
            "metadata": {"name": name},
            "spec": {  # no schedulerName: the control plane's own kube-scheduler allocates the claim
                "nodeSelector": {GROUP: group},
                "containers": [{"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
        },
        _preload_content=False,
    )


def _node_with_two_gpus(dra: DraEnv, group: str, name: str) -> tuple[str, list[str], FakeBackend]:
    """A kwok node whose two A100s NVIDIA's driver's slice publishes with their UUIDs, and the agent's fake
    backend for them."""
    uuids = [f"GPU-{uuid.uuid4()}" for _ in range(2)]
    devices = [gpu(i, A100) for i in range(2)]
    for d, u in zip(devices, uuids, strict=True):
        d["attributes"]["uuid"] = {"string": u}
    node = dra.node_with_gpus(group, name, devices)
    inventory = {"hostname": node, "gpus": [{"model": A100[0], "uuid": u} for u in uuids]}
    return node, uuids, FakeBackend.from_dict(inventory, "t")


def test_kube_scheduler_refuses_a_claim_the_gpu_a_device_plugin_pod_holds(dra: DraEnv) -> None:
    group = f"held-{dra.tag}"
    node, uuids, backend = _node_with_two_gpus(dra, group, "held")
    inv = backend.inventory()
    dra.v1.create_namespaced_pod(  # a device-plugin pod the agent handed GPU 0
        dra.ns,
        {
            "metadata": {
                "name": "dp-pod",
                "annotations": {"gpusched.io/allocated": json.dumps({"c": {"nvidia.com/gpu": [uuids[0]]}})},
            },
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        },
        _preload_content=False,
    )
    held = HeldTaints(KubeTaintRules(str(dra.cp.kubeconfig_path)), node)

    def pods() -> list[dict[str, Any]]:
        resp = dra.v1.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    try:
        created, _ = held.sync(held_gpus(pods(), node, inv, {}))
        assert len(created) == 1
        (r,) = json.loads(dra.res.list_device_taint_rule(label_selector=f"{LABEL_NODE}={node}",
                                                         _preload_content=False).data)["items"]  # fmt: skip
        assert r["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-0"}
        assert r["spec"]["taint"]["key"] == TAINT_KEY and r["spec"]["taint"]["effect"] == "NoSchedule"
        # both GPUs: kube-scheduler refuses (gpu-0 is tainted); one GPU: it gets gpu-1, never gpu-0
        _claim_pod(dra, "both", group, 2)
        dra.failure("both", contains="cannot allocate all claims", timeout=60)
        _claim_pod(dra, "one", group, 1)
        assert dra.bound("one") == node
        (res,) = dra.read_claim("one")["status"]["allocation"]["devices"]["results"]
        assert res["device"] == "gpu-1"
        # the device-plugin pod goes: the rule goes, and the waiting claim... still needs two: free gpu-1
        dra.v1.delete_namespaced_pod("dp-pod", dra.ns, grace_period_seconds=0, _preload_content=False)
        dra.v1.delete_namespaced_pod("one", dra.ns, grace_period_seconds=0, _preload_content=False)
        wait_until(lambda: not [p for p in pods() if p["metadata"]["name"] == "dp-pod"], timeout=30,
                   what="dp-pod gone", control_plane=dra.cp)  # fmt: skip
        _, deleted = held.sync(held_gpus(pods(), node, inv, {}))
        assert len(deleted) == 1
        assert dra.bound("both", timeout=90) == node  # kube-scheduler retries: both GPUs free now
        results = dra.read_claim("both")["status"]["allocation"]["devices"]["results"]
        assert sorted(x["device"] for x in results) == ["gpu-0", "gpu-1"]
    finally:
        held.sync(set())


def test_the_agent_taints_a_gpu_at_the_binding_it_watches(dra: DraEnv, tmp_path: Path) -> None:
    """The agent's pod watch on the real apiserver: once a DRA driver publishes the node's GPUs, a pod
    bound to the node with a ``gpusched.io/assignment`` naming GPU 1 gets its DeviceTaintRule from the
    watch event, with no resync (its period is an hour here) and no Allocate (kwok starts no container)."""
    node, _, backend = _node_with_two_gpus(dra, f"watch-{dra.tag}", "watch")
    pods = KubePods(str(dra.cp.kubeconfig_path))
    rules = KubeTaintRules(str(dra.cp.kubeconfig_path))
    cfg = AgentConfig(node=node, plugin_dir=tmp_path / "dp", held_taints_s=3600.0)
    agent = Agent(cfg, backend, pods, pods, taint_api=rules)
    try:
        agent.sync_held_taints()  # the resync at start: nothing held; the watch starts
        assert rules.list_rules(node) == []
        assignment = json.dumps({"node": node, "gpus": [1], "milli": 1000, "memoryMiB": 0})
        dra.v1.create_namespaced_pod(
            dra.ns,
            {
                "metadata": {"name": "bound", "annotations": {"gpusched.io/assignment": assignment}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
            },
            _preload_content=False,
        )
        wait_until(lambda: len(rules.list_rules(node)) == 1, timeout=10, what="the rule of GPU 1",
                   control_plane=dra.cp)  # fmt: skip
        (r,) = rules.list_rules(node)
        assert r["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-1"}
    finally:
        agent.stop()
        HeldTaints(rules, node).sync(set())
