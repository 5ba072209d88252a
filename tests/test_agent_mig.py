"""The agent and MIG (issue 31): it publishes the node's MIG geometry for the scheduler, and its Allocate
hands a container exactly the MIG device of the pod's assignment; a missing, foreign or held instance fails
with an event naming the pod and the field. Over real gRPC against the fake kubelet
(tests/test_agent_deviceplugin)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from builders import k8s_node
from gpusched.agent.allocation import ANN_ALLOCATED
from gpusched.agent.fake import FakeBackend
from gpusched.agent.inventory import XidEvent
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.testing import FakeKubelet
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.geometry import Instance
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, assignment_annotation, node_from_k8s
from gpusched.k8s.migconvert import assignment_mig
from test_agent_deviceplugin import NODE, allocate, allocate_error, env, pod

__all__ = ["env"]  # the fixture, shared with the device plugin's tests

MIG_1G, MIG_3G = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def S(gpu: int, start: int, profile: str) -> dict[str, Any]:
    return {"gpu": gpu, "start": start, "profile": profile}


def mig_pod(name: str, slices: list[dict[str, Any]], containers: dict[str, str], node: str = NODE) -> Any:
    a = json.dumps({"node": node, "gpus": [], "milli": 0, "memoryMiB": 0, "mig": slices})
    cs = [{"name": c, "resources": {"limits": {res: "1"}}} for c, res in containers.items()]
    return pod(name, assignment=a, containers=cs)


def test_the_node_annotation_carries_the_geometry_the_scheduler_reads(env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    agent.sync_node()
    obj = env["pods"].get_node(NODE)
    doc = json.loads(obj["metadata"]["annotations"]["gpusched.io/mig-geometry"])
    assert doc["strategy"] == "mixed"
    assert [(g["index"], g["model"], g["migEnabled"]) for g in doc["gpus"]] == [
        (0, "a100-80gb", False),
        (1, "a100-80gb", True),
        (2, "a100-80gb", False),
        (3, "a100-80gb", False),
    ]
    node = k8s_node(NODE, 3)
    node["metadata"]["annotations"] = obj["metadata"]["annotations"]
    spec = node_from_k8s(node)
    assert spec.mig is not None and spec.mig.indices == (0, 1, 2, 3)
    g1 = spec.mig.gpu(1)
    assert g1 is not None and set(g1.instances) == {
        Instance("1g.10gb", 0),
        Instance("1g.10gb", 1),
        Instance("3g.40gb", 4),
    }


def test_allocate_gives_the_assigned_mig_device_whatever_the_kubelet_picked(env: dict[str, Any]) -> None:
    env["pods"].pods += [
        mig_pod("p", [S(1, 1, "1g.10gb"), S(1, 4, "3g.40gb")],
                {"small": MIG_1G, "big": MIG_3G})
    ]  # fmt: skip
    r = allocate(env["stub"](MIG_1G), "MIG-1g-a")
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1g-b"
    r = allocate(env["stub"](MIG_3G), "MIG-3g")
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-3g"
    ann = json.loads(env["pods"].pods[0]["metadata"]["annotations"][ANN_ALLOCATED])
    assert ann == {"small": {MIG_1G: ["MIG-1g-b"]}, "big": {MIG_3G: ["MIG-3g"]}}


def test_preferred_allocation_names_the_assigned_mig_device(env: dict[str, Any]) -> None:
    env["pods"].pods += [mig_pod("p", [S(1, 1, "1g.10gb")], {"main": MIG_1G})]
    assert env["plugin"].allocator.preferred(MIG_1G, ["MIG-1g-a", "MIG-1g-b"], [], 1) == ["MIG-1g-b"]


def test_an_assignment_without_mig_slices_leaves_the_kubelets_choice(env: dict[str, Any]) -> None:
    """A pod placed by books that did not know the geometry (its assignment has no mig field)."""
    env["pods"].pods += [
        pod("p", gpus=[], containers=[{"name": "main", "resources": {"limits": {MIG_1G: "1"}}}])
    ]
    assert allocate(env["stub"](MIG_1G), "MIG-1g-a").envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1g-a"


def _refused(env: dict[str, Any], slices: list[dict[str, Any]], message: str, node: str = NODE) -> None:
    env["pods"].pods += [mig_pod("bad", slices, {"main": MIG_1G}, node=node)]
    details = allocate_error(env["stub"](MIG_1G), "MIG-1g-a")
    assert message in details, details
    assert (
        env["pods"].events
        and env["pods"].events[-1][0] == "team/bad"
        and message in env["pods"].events[-1][2]
    )
    assert ANN_ALLOCATED not in env["pods"].pods[-1]["metadata"]["annotations"]


def test_a_missing_instance_fails_naming_pod_and_field(env: dict[str, Any]) -> None:
    _refused(
        env,
        [S(1, 5, "1g.10gb")],
        "pod team/bad: annotation gpusched.io/assignment field mig names MIG 1g.10gb at slice 5 of GPU 1, "
        "which node gpu-node-1 does not have (GPU 1 holds: 1g.10gb at 0, 1g.10gb at 1, 3g.40gb at 4)",
    )


def test_a_foreign_gpu_fails_naming_pod_and_field(env: dict[str, Any]) -> None:
    _refused(env, [S(9, 0, "1g.10gb")], "of GPU 9, which is not on node gpu-node-1")


def test_a_gpu_outside_mig_mode_fails_naming_pod_and_field(env: dict[str, Any]) -> None:
    _refused(env, [S(0, 0, "1g.10gb")], "of GPU 0, which is not in MIG mode on node")


def test_an_assignment_for_another_node_fails(env: dict[str, Any]) -> None:
    _refused(env, [S(1, 0, "1g.10gb")], "field node is 'elsewhere'", node="elsewhere")


def test_an_instance_a_live_pod_holds_is_refused_naming_both(env: dict[str, Any]) -> None:
    holder = mig_pod("holder", [S(1, 0, "1g.10gb")], {"main": MIG_1G})
    holder["metadata"]["annotations"][ANN_ALLOCATED] = json.dumps({"main": {MIG_1G: ["MIG-1g-a"]}})
    holder["status"]["phase"] = "Running"
    env["pods"].pods += [holder]
    _refused(env, [S(1, 0, "1g.10gb")], "(MIG-1g-a), which live pod team/holder holds")
    assert env["pods"].events[-1][1] == "GPUAssignmentConflict"


def test_the_assignment_annotation_round_trips_its_mig_slices() -> None:
    from gpusched.core.model import PodSpec

    slots = (MigSlot(1, 4, "3g.40gb"), MigSlot(0, 6, "1g.10gb+me"))
    p = PodSpec("x", mig=("1g.10gb+me", "3g.40gb"))
    raw = assignment_annotation("n", (), p, slots)
    assert json.loads(raw)["mig"][0] == {"gpu": 1, "start": 4, "profile": "3g.40gb"}
    assert assignment_mig({"metadata": {"name": "x", "annotations": {ANN_ASSIGNMENT: raw}}}) == slots
    no_mig = assignment_annotation("n", (0,), PodSpec("y", num_gpu=1, gpu_milli=1000))
    assert "mig" not in json.loads(no_mig)  # whole GPUs: the format as it was


# ------------------------------------------------------------------------------------ the single strategy
SINGLE_DOC = {
    "hostname": NODE,
    "gpus": [
        {
            "model": "NVIDIA A100-SXM4-80GB",
            "uuid": f"GPU-{g}",
            "numaNode": g,
            "migMode": True,
            "mig": [{"profile": "3g.40gb", "start": s, "uuid": f"MIG-{g}-{s}"} for s in (0, 4)],
        }
        for g in range(2)
    ],
}


@pytest.fixture
def single() -> Iterator[dict[str, Any]]:
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    kubelet = FakeKubelet(d).start()
    pods = MemoryPods()
    backend = FakeBackend.from_dict(json.loads(json.dumps(SINGLE_DOC)), "test")
    agent = Agent(AgentConfig(node=NODE, plugin_dir=d, mig_strategy="single"), backend, pods, pods)
    agent.plugin.start(watch_interval_s=0.05)
    chans: list[grpc.Channel] = []

    def stub(resource: str) -> Any:
        sock = next(s.socket.name for s in agent.plugin.servers if s.resource == resource)
        ch, st = kubelet.plugin(sock)
        chans.append(ch)
        return st

    yield {"pods": pods, "agent": agent, "plugin": agent.plugin, "stub": stub}
    for ch in chans:
        ch.close()
    agent.plugin.stop()
    kubelet.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_single_strategy_serves_each_mig_device_as_a_gpu_in_the_schedulers_order(
    single: dict[str, Any],
) -> None:
    agent: Agent = single["agent"]
    assert agent.devices.resources() == [RES_GPU]
    assert [u for u, _d in agent.devices.devices(RES_GPU)] == ["MIG-0-0", "MIG-0-4", "MIG-1-0", "MIG-1-4"]
    single["pods"].pods += [pod("p", gpus=[2])]  # the scheduler's GPU 2: GPU 1's MIG device at slice 0
    r = allocate(single["stub"](RES_GPU), "MIG-0-0")
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1-0"
    agent.sync_node()
    obj = single["pods"].get_node(NODE)
    lab = obj["metadata"]["labels"]
    assert (
        lab["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
        and lab["nvidia.com/gpu.count"] == "4"
    )
    node = {**obj, "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}}
    assert "gpusched.io/gpu-topology" not in obj["metadata"]["annotations"]  # it describes physical GPUs
    spec = node_from_k8s(node)  # the scheduler books the 4 MIG devices as 4 GPUs of the MIG memory
    assert (spec.gpu_count, spec.gpu_memory_mib, spec.mig) == (4, int(lab["nvidia.com/gpu.memory"]), None)


def test_single_strategy_a_failed_gpu_takes_its_mig_devices_with_it(single: dict[str, Any]) -> None:
    agent: Agent = single["agent"]
    agent.handle_xids([XidEvent(1, 79)])
    assert agent.devices.unhealthy_sched_indices() == [2, 3]
    health = {d.ID: d.health for d in agent.devices.list_response(RES_GPU).devices}
    assert health == {
        "MIG-0-0": "Healthy",
        "MIG-0-4": "Healthy",
        "MIG-1-0": "Unhealthy",
        "MIG-1-4": "Unhealthy",
    }
    single["pods"].pods += [pod("p", gpus=[3])]
    assert "GPU 3 (MIG-1-4), which is unhealthy" in allocate_error(single["stub"](RES_GPU), "MIG-0-0")
