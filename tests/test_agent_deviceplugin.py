"""The device plugin over real gRPC on unix sockets, against a fake kubelet (Registration) and fake pods."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpusched.agent.allocation import ANN_ALLOCATED, RES_SHARE
from gpusched.agent.fake import FakeBackend
from gpusched.agent.health import ANN_UNHEALTHY_GPUS, TAINT_UNHEALTHY
from gpusched.agent.plugin import DevicePlugin, NodeDevices
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.testing import FakeKubelet, Watcher
from gpusched.agent.v1beta1 import api_pb2 as pb
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MEMORY, RES_MILLI

REPO = Path(__file__).resolve().parents[1]
NODE = "gpu-node-1"
A100 = "NVIDIA A100-SXM4-80GB"
# NVML index 1 has MIG on, so the scheduler's GPUs 0, 1, 2 are NVML's 0, 2, 3.
DOC = {
    "hostname": NODE,
    "gpus": [
        {"model": A100, "uuid": "GPU-0000", "numaNode": 0},
        {
            "model": A100,
            "uuid": "GPU-1111",
            "migMode": True,
            "mig": [
                {"profile": "1g.10gb", "start": 0, "uuid": "MIG-1g-a"},
                {"profile": "1g.10gb", "start": 1, "uuid": "MIG-1g-b"},
                {"profile": "3g.40gb", "start": 4, "uuid": "MIG-3g"},
            ],
        },
        {"model": A100, "uuid": "GPU-2222", "numaNode": 1},
        {"model": A100, "uuid": "GPU-3333", "numaNode": 1},
    ],
}
SCHED = {0: "GPU-0000", 1: "GPU-2222", 2: "GPU-3333"}


def pod(
    name: str,
    *,
    created: str = "2026-01-01T00:00:00Z",
    assignment: Any = "default",
    gpus: list[int] | None = None,
    containers: list[dict[str, Any]] | None = None,
    milli: int = 1000,
    memory: int = 0,
    phase: str = "Pending",
    bound_rv: int | None = None,
) -> dict[str, Any]:
    ann = {}
    if assignment == "default":
        assignment = json.dumps({"node": NODE, "gpus": gpus or [0], "milli": milli, "memoryMiB": memory})
    if assignment is not None:
        ann[ANN_ASSIGNMENT] = assignment
    if containers is None:
        containers = [{"name": "main", "resources": {"limits": {RES_GPU: str(len(gpus or [0]))}}}]
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": ann,
            **({"resourceVersion": str(bound_rv)} if bound_rv is not None else {}),
        },
        "spec": {"nodeName": NODE, "containers": containers},
        "status": {"phase": phase},
    }


def share_containers(milli: int | None, memory: int | None) -> list[dict[str, Any]]:
    lim: dict[str, str] = {RES_SHARE: "1"}
    if milli is not None:
        lim[RES_MILLI] = str(milli)
    if memory is not None:
        lim[RES_MEMORY] = str(memory)
    return [{"name": "main", "resources": {"limits": lim}}]


@pytest.fixture
def env() -> Iterator[dict[str, Any]]:
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))  # unix socket paths must stay short
    kubelet = FakeKubelet(d).start()
    pods = MemoryPods()
    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "test")
    agent = Agent(AgentConfig(node=NODE, plugin_dir=d, slots=4), backend, pods, pods)
    agent.plugin.start(watch_interval_s=0.05)
    chans: list[grpc.Channel] = []

    def stub(resource: str) -> Any:
        sock = next(s.socket.name for s in agent.plugin.servers if s.resource == resource)
        ch, st = kubelet.plugin(sock)
        chans.append(ch)
        return st

    yield {"dir": d, "kubelet": kubelet, "pods": pods, "agent": agent, "plugin": agent.plugin, "stub": stub}
    for ch in chans:
        ch.close()
    agent.plugin.stop()
    kubelet.stop()
    shutil.rmtree(d, ignore_errors=True)


def allocate(stub: Any, *ids: str) -> pb.ContainerAllocateResponse:
    req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])
    resp = stub.Allocate(req, timeout=10)
    assert len(resp.container_responses) == 1
    return resp.container_responses[0]


def allocate_error(stub: Any, *ids: str) -> str:
    with pytest.raises(grpc.RpcError) as e:
        allocate(stub, *ids)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(e.value.details())


# ---------------------------------------------------------------------------------------- registration
def test_registers_every_resource_and_again_after_the_kubelet_restarts(env: dict[str, Any]) -> None:
    kubelet: FakeKubelet = env["kubelet"]
    regs = kubelet.wait_registrations(4)
    assert sorted(r.resource_name for r in regs) == sorted(
        [RES_GPU, RES_SHARE, "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
    )
    assert {r.version for r in regs} == {"v1beta1"}
    assert all(r.options.get_preferred_allocation_available for r in regs)
    assert all((env["dir"] / r.endpoint).exists() and "/" not in r.endpoint for r in regs)
    kubelet.restart()  # empties the directory, as the kubelet does
    regs = kubelet.wait_registrations(8)
    assert len(regs) == 8, "the plugin did not register again after the kubelet restarted"
    assert sorted(r.resource_name for r in regs[4:]) == sorted(r.resource_name for r in regs[:4])
    # the plugin serves again on the new sockets
    w = Watcher(kubelet, next(r.endpoint for r in regs[4:] if r.resource_name == RES_GPU))
    assert set(w.wait_for(lambda lst: len(lst) == 3)) == set(SCHED.values())
    w.close()


def test_beside_nvidias_plugin_only_the_share_slots_are_served() -> None:
    # --no-nvidia-resources (the chart's agent.resources.nvidiaGpu=false): NVIDIA's device plugin keeps
    # nvidia.com/gpu and the MIG resources, and the kubelet must never see two plugins for one resource.
    inv = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t").inventory()
    assert NodeDevices(NODE, inv).resources() == [
        RES_GPU, RES_SHARE, "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
    ]
    beside = NodeDevices(NODE, inv, nvidia_resources=False)
    assert beside.resources() == [RES_SHARE]
    assert {s.resource for s in DevicePlugin(beside, MemoryPods()).servers} == {RES_SHARE}
    mig_only = FakeBackend.from_dict({"gpus": [DOC["gpus"][1]]}, "t")  # type: ignore[index]
    assert NodeDevices(NODE, mig_only.inventory(), nvidia_resources=False).resources() == []


def test_registration_is_retried_until_the_kubelet_is_there(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    try:
        devices = NodeDevices(NODE, FakeBackend.from_dict({"gpus": [{"model": "Tesla T4"}]}, "t").inventory())
        plugin = DevicePlugin(devices, MemoryPods(), plugin_dir=d)
        plugin.start(watch_interval_s=0.05)  # no kubelet yet: registering fails, the plugin keeps serving
        kubelet = FakeKubelet(d).start()
        assert len(kubelet.wait_registrations(2)) >= 2
        plugin.stop()
        kubelet.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------- devices and health
def test_list_and_watch_sends_devices_then_a_new_list_when_an_xid_marks_a_gpu_unhealthy(
    env: dict[str, Any],
) -> None:
    kubelet: FakeKubelet = env["kubelet"]
    regs = {r.resource_name: r.endpoint for r in kubelet.wait_registrations(4)}
    gpu = Watcher(kubelet, regs[RES_GPU])
    share = Watcher(kubelet, regs[RES_SHARE])
    mig = Watcher(kubelet, regs["nvidia.com/mig-1g.10gb"])
    first = gpu.wait_for(lambda lst: len(lst) == 3)
    assert first == {u: "Healthy" for u in SCHED.values()}
    assert len(share.wait_for(lambda lst: len(lst) == 12)) == 12  # 4 slots x 3 GPUs
    assert mig.wait_for(lambda lst: len(lst) == 2) == {"MIG-1g-a": "Healthy", "MIG-1g-b": "Healthy"}
    lst = env["plugin"].devices.list_response(RES_GPU)
    assert {d.ID: [n.ID for n in d.topology.nodes] for d in lst.devices} == {
        "GPU-0000": [0],
        "GPU-2222": [1],
        "GPU-3333": [1],
    }
    agent: Agent = env["agent"]
    agent.handle_xids([type("E", (), {"gpu_index": 2, "xid": 13, "critical": False})()])  # application error
    assert env["plugin"].devices.unhealthy == set()
    from gpusched.agent.inventory import XidEvent

    agent.handle_xids([XidEvent(2, 79)])  # fell off the bus: NVML index 2 = the scheduler's GPU 1
    assert gpu.wait_for(lambda lst: lst.get("GPU-2222") == "Unhealthy") == {
        "GPU-0000": "Healthy",
        "GPU-2222": "Unhealthy",
        "GPU-3333": "Healthy",
    }
    sl = share.wait_for(lambda lst: lst.get("GPU-2222::0") == "Unhealthy")
    assert {k for k, v in sl.items() if v == "Unhealthy"} == {f"GPU-2222::{k}" for k in range(4)}
    assert agent.last_xid == {2: 79}
    agent.sync_node()
    node = env["pods"].get_node(NODE)
    assert node["metadata"]["annotations"][ANN_UNHEALTHY_GPUS] == "1"
    assert not (node.get("spec") or {}).get("taints")
    for i in (0, 3):
        agent.handle_xids([XidEvent(i, 48)])
    agent.sync_node()
    node = env["pods"].get_node(NODE)
    assert node["metadata"]["annotations"][ANN_UNHEALTHY_GPUS] == "0,1,2"
    assert node["spec"]["taints"] == [{"key": TAINT_UNHEALTHY, "value": "true", "effect": "NoSchedule"}]
    for i in (0, 2, 3):
        env["plugin"].mark(i, healthy=True)  # recovery
    agent.sync_node()
    node = env["pods"].get_node(NODE)
    assert ANN_UNHEALTHY_GPUS not in node["metadata"]["annotations"] and node["spec"]["taints"] == []
    for w in (gpu, share, mig):
        w.close()


def test_node_gets_gfd_labels_and_the_topology_annotation(env: dict[str, Any]) -> None:
    agent: Agent = env["agent"]
    agent.sync_node()
    node = env["pods"].get_node(NODE)
    lab = node["metadata"]["labels"]
    assert (
        lab["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB" and lab["nvidia.com/mig.strategy"] == "mixed"
    )
    assert lab["nvidia.com/mig-1g.10gb.count"] == "2"
    assert "gpusched.io/gpu-topology" in node["metadata"]["annotations"]
    n = len(env["pods"].node_patches)
    agent.sync_node()  # nothing changed: no write (no fight with GFD writing the same values)
    assert len(env["pods"].node_patches) == n


# -------------------------------------------------------------------------------------------- Allocate
def test_whole_gpu_allocate_gives_the_assigned_gpu_whatever_device_the_kubelet_picked(
    env: dict[str, Any],
) -> None:
    env["pods"].pods += [pod("p", gpus=[2])]
    r = allocate(env["stub"](RES_GPU), "GPU-0000")
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-3333"
    assert not r.cdi_devices
    ann = json.loads(env["pods"].pods[0]["metadata"]["annotations"][ANN_ALLOCATED])
    assert ann == {"main": {RES_GPU: ["GPU-3333"]}}


def test_each_container_gets_its_slice_of_the_assignment(env: dict[str, Any]) -> None:
    cs = [{"name": n, "resources": {"limits": {RES_GPU: "1"}}} for n in ("a", "b")]
    env["pods"].pods += [pod("p", gpus=[1, 0], containers=cs)]
    st = env["stub"](RES_GPU)
    assert allocate(st, "GPU-3333").envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2222"
    assert allocate(st, "GPU-0000").envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0000"
    ann = json.loads(env["pods"].pods[0]["metadata"]["annotations"][ANN_ALLOCATED])
    assert ann == {"a": {RES_GPU: ["GPU-2222"]}, "b": {RES_GPU: ["GPU-0000"]}}


def test_the_oldest_matching_pending_pod_is_served_first(env: dict[str, Any]) -> None:
    env["pods"].pods += [
        pod("young", created="2026-01-01T00:00:05Z", gpus=[0]),
        pod("old", created="2026-01-01T00:00:01Z", gpus=[1]),
        pod("two", created="2026-01-01T00:00:00Z", gpus=[0, 2]),  # asks for 2: not this call
        pod("running", created="2025-01-01T00:00:00Z", gpus=[2], phase="Running"),
    ]
    st = env["stub"](RES_GPU)
    assert allocate(st, "GPU-0000").envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2222"
    assert allocate(st, "GPU-0000").envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0000"
    env["pods"].pods[0]["status"]["phase"] = "Succeeded"  # young is done: its GPU 0 is free for two
    assert allocate(st, "GPU-0000", "GPU-3333").envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0000,GPU-3333"
    assert "no Pending pod" in allocate_error(st, "GPU-0000")


def test_pods_are_served_in_the_order_they_were_bound_which_is_the_kubelets(env: dict[str, Any]) -> None:
    """Two shares created in one order and bound in the other (the real kubelet's test caught it): the
    kubelet admits, and calls Allocate for, the one bound first; its resource version is the smaller."""
    env["pods"].pods += [
        pod("mem", created="2026-01-01T00:00:01Z", bound_rv=120, gpus=[0], milli=0, memory=20480,
            containers=share_containers(None, 20480)),
        pod("milli", created="2026-01-01T00:00:02Z", bound_rv=118, gpus=[0], milli=300, memory=0,
            containers=share_containers(300, None)),
    ]  # fmt: skip
    st = env["stub"](RES_SHARE)
    first, second = allocate(st, "GPU-3333::0"), allocate(st, "GPU-3333::1")
    assert (first.envs["GPUSCHED_GPU_MILLI"], first.envs["GPUSCHED_GPU_MEMORY_MIB"]) == ("300", "0")
    assert (second.envs["GPUSCHED_GPU_MILLI"], second.envs["GPUSCHED_GPU_MEMORY_MIB"]) == ("0", "20480")


def test_a_share_gets_its_gpu_and_its_limits_as_env(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("s", gpus=[1], milli=300, memory=8192, containers=share_containers(300, 8192))]
    r = allocate(env["stub"](RES_SHARE), "GPU-0000::3")
    assert dict(r.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-2222",
        "GPUSCHED_GPU_UUIDS": "GPU-2222",
        "GPUSCHED_GPU_MILLI": "300",
        "GPUSCHED_GPU_MEMORY_MIB": "8192",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "8192m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
    }


def test_a_memory_only_share_gets_a_memory_limit_and_no_compute_limit(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("m", gpus=[0], milli=0, memory=4096, containers=share_containers(None, 4096))]
    r = allocate(env["stub"](RES_SHARE), "GPU-3333::0")
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0000" and r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert "CUDA_DEVICE_SM_LIMIT" not in r.envs and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in r.envs


def test_mig_slices_are_the_kubelets_choice(env: dict[str, Any]) -> None:
    st = env["stub"]("nvidia.com/mig-1g.10gb")
    assert allocate(st, "MIG-1g-b").envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1g-b"
    assert "not on node" in allocate_error(st, "MIG-3g")


def test_cdi_names_when_cdi_is_on(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("p", gpus=[0])]
    env["plugin"].allocator.cdi = True
    r = allocate(env["stub"](RES_GPU), "GPU-0000")
    assert [c.name for c in r.cdi_devices] == ["nvidia.com/gpu=GPU-0000"]


BAD = [
    ("missing", None, "pod team/bad: annotation gpusched.io/assignment is missing"),
    ("not JSON", "{node", "pod team/bad: annotation gpusched.io/assignment is not JSON"),
    (
        "other node",
        json.dumps({"node": "elsewhere", "gpus": [0], "milli": 1000, "memoryMiB": 0}),
        "pod team/bad: annotation gpusched.io/assignment field node is 'elsewhere'",
    ),
    (
        "GPU not here",
        json.dumps({"node": NODE, "gpus": [7], "milli": 1000, "memoryMiB": 0}),
        "pod team/bad: annotation gpusched.io/assignment field gpus names GPU 7, "
        "which is not on node gpu-node-1",
    ),
    (
        "MIG GPU is not a whole GPU",
        json.dumps({"node": NODE, "gpus": [3], "milli": 1000, "memoryMiB": 0}),
        "field gpus names GPU 3, which is not on node",
    ),
    (
        "gpus not a list",
        json.dumps({"node": NODE, "gpus": "0", "milli": 1000}),
        "pod team/bad: annotation gpusched.io/assignment: field gpus is not a list",
    ),
    (
        "milli negative",
        json.dumps({"node": NODE, "gpus": [0], "milli": -1}),
        "field milli is not a non-negative",
    ),
    ("no node", json.dumps({"gpus": [0]}), "field node is missing"),
]


@pytest.mark.parametrize(("case", "annotation", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_assignment_fails_allocate_naming_pod_and_field(
    env: dict[str, Any], case: str, annotation: Any, message: str
) -> None:
    env["pods"].pods += [pod("bad", assignment=annotation)]
    details = allocate_error(env["stub"](RES_GPU), "GPU-0000")
    assert message in details, details
    assert (
        env["pods"].events
        and env["pods"].events[-1][0] == "team/bad"
        and message in env["pods"].events[-1][2]
    )
    assert ANN_ALLOCATED not in env["pods"].pods[0]["metadata"]["annotations"]


def test_a_share_assignment_with_two_gpus_is_refused(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("s", gpus=[0, 1], milli=300, containers=share_containers(300, None))]
    assert "must name one GPU for a share" in allocate_error(env["stub"](RES_SHARE), "GPU-0000::0")


def test_unknown_device_ids_are_refused(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("p", gpus=[0])]
    assert "GPU-9999" in allocate_error(env["stub"](RES_GPU), "GPU-9999")


def test_a_restarted_agent_does_not_allocate_a_container_twice(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("p", gpus=[0])]
    allocate(env["stub"](RES_GPU), "GPU-0000")
    fresh = DevicePlugin(env["plugin"].devices, env["pods"]).allocator  # no memory of the first allocation
    with pytest.raises(Exception, match="no Pending pod"):
        fresh.allocate_container(RES_GPU, ["GPU-0000"])


class _ApiDown(MemoryPods):
    down = True

    def annotate_pod(self, namespace: str, name: str, annotations: Any) -> None:
        if self.down:
            raise ConnectionError("API unreachable")
        super().annotate_pod(namespace, name, annotations)


def test_with_the_api_down_allocate_still_answers_and_remembers(tmp_path: Path) -> None:
    pods = _ApiDown([pod("p", gpus=[1])])
    devices = NodeDevices(NODE, FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t").inventory())
    alloc = DevicePlugin(devices, pods).allocator
    assert alloc.allocate_container(RES_GPU, ["GPU-0000"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2222"
    with pytest.raises(Exception, match="no Pending pod"):
        alloc.allocate_container(RES_GPU, ["GPU-0000"])
    assert ANN_ALLOCATED not in pods.pods[0]["metadata"]["annotations"]
    assert not alloc.flush_annotations()  # still down: kept for later
    pods.down = False
    assert alloc.flush_annotations()  # the API is back: caught up
    assert json.loads(pods.pods[0]["metadata"]["annotations"][ANN_ALLOCATED]) == {
        "main": {RES_GPU: ["GPU-2222"]}
    }
    with pytest.raises(Exception, match="no Pending pod"):  # and a restarted agent knows it too
        DevicePlugin(devices, pods).allocator.allocate_container(RES_GPU, ["GPU-0000"])


# ---------------------------------------------------------------------------------- preferred allocation
def test_preferred_allocation_names_the_assigned_devices(env: dict[str, Any]) -> None:
    env["pods"].pods += [pod("p", gpus=[2, 1])]
    st = env["stub"](RES_GPU)
    req = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-0000", "GPU-2222", "GPU-3333"], allocation_size=2
            )
        ]
    )
    resp = st.GetPreferredAllocation(req, timeout=10)
    assert sorted(resp.container_responses[0].deviceIDs) == ["GPU-2222", "GPU-3333"]
    env["pods"].pods += [
        pod("s", created="2026-01-02T00:00:00Z", gpus=[1], milli=500, containers=share_containers(500, None))
    ]
    req = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-0000::0", "GPU-2222::1", "GPU-2222::2"], allocation_size=1
            )
        ]
    )
    resp = env["stub"](RES_SHARE).GetPreferredAllocation(req, timeout=10)
    assert list(resp.container_responses[0].deviceIDs) == ["GPU-2222::1"]
    # no matching pod: the kubelet's own order
    req = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-3333", "GPU-0000"],
                must_include_deviceIDs=["GPU-0000"],
                allocation_size=3,
            )
        ]
    )
    resp = st.GetPreferredAllocation(req, timeout=10)
    assert list(resp.container_responses[0].deviceIDs) == ["GPU-0000", "GPU-3333"]


def test_options() -> None:
    from gpusched.agent.plugin import DevicePluginServicer

    o = DevicePluginServicer.GetDevicePluginOptions(None, pb.Empty(), None)  # type: ignore[arg-type]
    assert o.get_preferred_allocation_available and not o.pre_start_required


# ------------------------------------------------------------------------------------- generated stubs
PROTO = Path.home() / "go/pkg/mod/k8s.io/kubelet@v0.37.2/pkg/apis/deviceplugin/v1beta1/api.proto"


@pytest.mark.skipif(not PROTO.exists(), reason=f"{PROTO} absent (built with the kubelet by hack/)")
def test_committed_stubs_are_what_the_generation_script_writes(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    r = subprocess.run(
        ["bash", str(REPO / "hack/gen-deviceplugin.sh"), str(PROTO)],
        env={
            "OUT": str(tmp_path),
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "PYTHON": __import__("sys").executable,
            "GOMODCACHE": str(Path.home() / "go/pkg/mod"),
            "HOME": str(Path.home()),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    for f in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        assert (tmp_path / f).read_text() == (REPO / "src/gpusched/agent/v1beta1" / f).read_text(), f


def test_gogo_options_are_stripped_by_the_generation_script(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    proto = tmp_path / "api.proto"
    proto.write_text(
        'syntax = "proto3";\npackage v1beta1;\nimport "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        "option (gogoproto.goproto_stringer_all) = false;\n"
        'message Empty {}\nmessage Device { string ID = 1 [(gogoproto.customname) = "ID"]; }\n'
    )
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(REPO / "hack/gen-deviceplugin.sh"), str(proto)],
        env={
            "OUT": str(out),
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "PYTHON": __import__("sys").executable,
            "HOME": str(Path.home()),
            "GOMODCACHE": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "Device" in (out / "api_pb2.pyi").read_text()


# ------------------------------------------------------------------- forged assignments (issue 28 F3)
def holder(name: str, resource: str, devices: list[str], **kw: Any) -> dict[str, Any]:
    """A pod the agent already served ``devices`` of ``resource`` (its gpusched.io/allocated), Running."""
    p = pod(name, phase="Running", **kw)
    p["metadata"]["annotations"][ANN_ALLOCATED] = json.dumps({"main": {resource: devices}})
    return p


def test_a_forged_assignment_on_a_held_gpu_is_refused_naming_both_pods(env: dict[str, Any]) -> None:
    """issue 28 F3: `forged` is created with spec.nodeName and an assignment naming GPU 0, which `victim`
    holds; the kubelet has a free nvidia.com/gpu device and calls Allocate: the agent refuses, naming both,
    with a Warning event on the newcomer, and hands out nothing."""
    env["pods"].pods += [holder("victim", RES_GPU, ["GPU-0000"], gpus=[0]), pod("forged", gpus=[0])]
    details = allocate_error(env["stub"](RES_GPU), "GPU-2222")
    assert "pod team/forged: annotation gpusched.io/assignment names GPU 0 (GPU-0000)" in details
    assert "live pod(s) team/victim hold (whole)" in details
    assert env["pods"].events == [("team/forged", "GPUAssignmentConflict", details)]
    assert ANN_ALLOCATED not in env["pods"].pods[1]["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("held", "milli", "asked", "refused"),
    [
        ("whole", 100, 100, True),  # a share beside a whole GPU
        ("share-700", 300, 300, False),  # 700 + 300: the GPU's 1000
        ("share-700", 400, 400, True),  # 700 + 400
        ("share-700", 0, 400, True),  # a written milli of 0 does not hide the 400 its container asks for
        ("done-whole", 1000, 1000, False),  # the holder has finished
    ],
)
def test_a_share_over_what_live_pods_hold_is_refused(
    env: dict[str, Any], held: str, milli: int, asked: int, refused: bool
) -> None:
    if held.endswith("whole"):
        h = holder("h", RES_GPU, ["GPU-0000"], gpus=[0])
        if held == "done-whole":
            h["status"]["phase"] = "Succeeded"
    else:
        h = holder(
            "h", RES_SHARE, ["GPU-0000::0"], gpus=[0], milli=700, containers=share_containers(700, None)
        )
    env["pods"].pods += [h, pod("s", gpus=[0], milli=milli, containers=share_containers(asked, None))]
    st = env["stub"](RES_SHARE)
    if refused:
        assert "team/h" in allocate_error(st, "GPU-0000::1")
        assert env["pods"].events[-1][:2] == ("team/s", "GPUAssignmentConflict")
    else:
        assert allocate(st, "GPU-0000::1").envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0000"


def test_what_the_agent_handed_out_while_the_api_was_down_counts(tmp_path: Path) -> None:
    """The holder's gpusched.io/allocated could not be written (API down): the agent's memory of it still
    refuses the forged pod."""
    pods = _ApiDown([pod("victim", gpus=[1]), pod("forged", gpus=[1], created="2026-01-01T00:00:09Z")])
    devices = NodeDevices(NODE, FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t").inventory())
    alloc = DevicePlugin(devices, pods).allocator
    alloc.allocate_container(RES_GPU, ["GPU-0000"])  # victim, the older
    pods.pods[0]["status"]["phase"] = "Running"
    with pytest.raises(Exception, match="live pod\\(s\\) team/victim hold"):
        alloc.allocate_container(RES_GPU, ["GPU-2222"])
