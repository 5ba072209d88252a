"""The agent beside another device plugin: it finds a second plugin serving its GPUs in the kubelet's
directory (a conflict only where the agent serves those devices too), publishes it on the Node where doctor
names it, and beside NVIDIA's plugin records from the kubelet's PodResources which GPUs each container got.
On the real kubelet with NVIDIA's plugin: tests/kubelet/test_coexist.py."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpusched.agent import coexist
from gpusched.agent.allocation import ANN_ALLOCATED
from gpusched.agent.fake import FakeBackend
from gpusched.agent.plugin import DevicePluginServicer, NodeDevices
from gpusched.agent.podresources_v1 import api_pb2 as pr
from gpusched.agent.podresources_v1 import api_pb2_grpc as prg
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.v1beta1 import api_pb2_grpc as pbg
from gpusched.doctor.checks import node_findings

DOC = {"hostname": "co-node", "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "count": 2}]}


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="co", dir="/tmp"))  # unix socket paths must stay short
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _backend() -> FakeBackend:
    return FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t")


def _serve_plugin(path: Path, devices: NodeDevices, resource: str) -> grpc.Server:
    """A device plugin listing ``devices``' IDs of ``resource`` on ``path`` (stands in for NVIDIA's)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = DevicePluginServicer(resource, devices, None, threading.Event())  # type: ignore[arg-type]
    pbg.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def _agent(plugin_dir: Path, pods: MemoryPods, **cfg: Any) -> Agent:
    return Agent(AgentConfig(node="co-node", plugin_dir=plugin_dir, **cfg), _backend(), pods, pods)


def test_a_second_plugin_listing_the_agents_gpus_marks_the_node_until_it_goes(plugin_dir: Path) -> None:
    pods = MemoryPods()
    agent = _agent(plugin_dir, pods)
    agent.plugin.start(watch_interval_s=60)  # its own sockets (gpusched-gpu.sock, ...): never "another"
    theirs = NodeDevices("co-node", _backend().inventory())
    uuids = sorted(d.uuid for d in theirs.whole_gpus)
    nvidia = _serve_plugin(plugin_dir / "nvidia-gpu.sock", theirs, "nvidia.com/gpu")
    other = _serve_plugin(plugin_dir / "rdma.sock", theirs, "example.com/none")  # lists no device
    mute = socket.socket(socket.AF_UNIX)  # a socket that is no device plugin: skipped, no error
    mute.bind(str(plugin_dir / "mute.sock"))
    mute.listen()
    try:
        value = agent.check_other_plugins()
        assert value is not None
        mark = json.loads(value)
        assert mark == {
            "resources": {"nvidia.com/gpu": ["nvidia-gpu.sock"]},
            "sockets": {"nvidia-gpu.sock": uuids},
        }
        node = pods.get_node("co-node")
        assert node["metadata"]["annotations"][coexist.ANN_CONFLICT] == value
        nvidia.stop(0).wait()
        (plugin_dir / "nvidia-gpu.sock").unlink(missing_ok=True)  # gRPC removes it
        assert agent.check_other_plugins() is None
        assert coexist.ANN_CONFLICT not in node["metadata"]["annotations"]
    finally:
        mute.close()
        nvidia.stop(0)
        other.stop(0)
        agent.plugin.stop()


def test_beside_nvidias_plugin_with_no_nvidia_resources_it_is_no_conflict(plugin_dir: Path) -> None:
    pods = MemoryPods()
    agent = _agent(plugin_dir, pods, nvidia_resources=False)
    agent.plugin.start(watch_interval_s=60)
    theirs = NodeDevices("co-node", _backend().inventory())
    nvidia = _serve_plugin(plugin_dir / "nvidia-gpu.sock", theirs, "nvidia.com/gpu")
    try:
        assert [o.socket for o in coexist.other_plugins(plugin_dir, [])] == [
            "gpusched-gpu-share.sock",
            "nvidia-gpu.sock",
        ]
        assert agent.check_other_plugins() is None
        assert coexist.ANN_CONFLICT not in (pods.get_node("co-node")["metadata"].get("annotations") or {})
    finally:
        nvidia.stop(0)
        agent.plugin.stop()


def test_doctor_names_two_plugins_on_one_node_from_the_agents_mark() -> None:
    mark = json.dumps({"resources": {"nvidia.com/gpu": ["nvidia-gpu.sock"]}, "sockets": {}})
    node = {
        "metadata": {
            "name": "n1",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "2"},
            "annotations": {coexist.ANN_CONFLICT: mark},
        },
        "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}},
    }
    (f,) = [f for f in node_findings(node) if f.code == "device-plugin-conflict"]
    assert f.severity == "error" and f.subject == "n1"
    assert f.evidence["resources"] == {"nvidia.com/gpu": ["nvidia-gpu.sock"]}
    assert "nvidia-gpu.sock" in f.message and "registered last" in f.message and "nvidia.com/gpu" in f.message
    node["metadata"]["annotations"] = {coexist.ANN_CONFLICT: "{not json"}
    assert [f.code for f in node_findings(node) if f.code.startswith("device-plugin-conflict")] == [
        "device-plugin-conflict-unreadable"
    ]
    node["metadata"]["annotations"] = {}
    assert not [f for f in node_findings(node) if f.code.startswith("device-plugin-conflict")]


class _PodResources(prg.PodResourcesListerServicer):
    def __init__(self, resp: pr.ListPodResourcesResponse) -> None:
        self.resp = resp

    def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
        return self.resp


def _listed(name: str, containers: dict[str, dict[str, list[str]]]) -> pr.PodResources:
    """A pod as the kubelet's PodResources List answers: container -> resource -> device IDs."""
    return pr.PodResources(
        name=name,
        namespace="ns",
        containers=[
            pr.ContainerResources(
                name=c,
                devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in res.items()],
            )
            for c, res in containers.items()
        ],
    )


def _pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": dict(annotations or {})},
        "spec": {"nodeName": "co-node"},
    }


def test_beside_nvidias_plugin_the_kubelets_choice_is_recorded_as_allocated(plugin_dir: Path) -> None:
    uuids = [d.uuid for d in _backend().inventory().devices]
    share = json.dumps({"main": {"gpusched.io/gpu-share": [f"{uuids[0]}::3"]}})
    pods = MemoryPods([_pod("whole"), _pod("mixed", {ANN_ALLOCATED: share}), _pod("cpu")])
    gpu, nic = "nvidia.com/gpu", "example.com/nic"
    resp = pr.ListPodResourcesResponse(
        pod_resources=[
            _listed("whole", {"main": {gpu: [uuids[1]]}}),
            _listed("mixed", {"side": {gpu: [uuids[0]], nic: ["x"]}}),
            _listed("cpu", {"main": {}}),
        ]
    )
    sock = plugin_dir / "pod-resources.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prg.add_PodResourcesListerServicer_to_server(_PodResources(resp), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    agent = _agent(plugin_dir, pods, nvidia_resources=False, pod_resources_socket=sock)
    try:
        assert agent.record_kubelet_allocations() == 2
        ann = {p["metadata"]["name"]: p["metadata"]["annotations"].get(ANN_ALLOCATED) for p in pods.pods}
        assert json.loads(ann["whole"]) == {"main": {"nvidia.com/gpu": [uuids[1]]}}
        assert json.loads(ann["mixed"]) == {  # the agent's own share record kept beside the kubelet's
            "main": {"gpusched.io/gpu-share": [f"{uuids[0]}::3"]},
            "side": {"nvidia.com/gpu": [uuids[0]]},
        }
        assert ann["cpu"] is None
        assert agent.record_kubelet_allocations() == 0  # nothing changed
    finally:
        server.stop(0)
    # no kubelet answering: logged, nothing written, no exception
    assert agent.record_kubelet_allocations() == 0
