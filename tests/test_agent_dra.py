"""The agent as a DRA driver (``gpusched agent run --dra``): the ResourceSlice it builds from the fake NVML
backend, its publication (generation, owner, deletion), health as device taints, the kubelet-plugin sockets,
NodePrepareResources / NodeUnprepareResources over gRPC and the CDI specs they write, and the refusal to serve
GPUs a device plugin serves."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpusched.agent.dra.cdi import CdiSpecs
from gpusched.agent.dra.claims import ClaimError, ClaimRef
from gpusched.agent.dra.driver import Preparer
from gpusched.agent.dra.migprepare import MigClaims, MigInstances
from gpusched.agent.dra.node import DraConfig, DraNode, refuse_device_plugin_beside
from gpusched.agent.dra.pluginregistration_v1 import api_pb2 as regpb
from gpusched.agent.dra.pluginregistration_v1 import api_pb2_grpc as regpbg
from gpusched.agent.dra.publish import MemorySlices, SlicePublisher
from gpusched.agent.dra.slices import DraConfigError, build_slice, check_driver_name, check_effect
from gpusched.agent.dra.v1 import api_pb2 as pb
from gpusched.agent.dra.v1 import api_pb2_grpc as pbg
from gpusched.agent.fake import FakeBackend, FakeConfigError
from gpusched.agent.inventory import Inventory, XidEvent
from gpusched.agent.plugin import wait_until
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.sharing import Sharing
from gpusched.agent.testing import FakeKubelet
from test_agent_mig_reshape import backends  # noqa: F401 (fixture: the fake backend and NVML's)
from test_agent_nvml_lib import fake_nvml_lib, nvml_env  # noqa: F401 (its fixtures)

REPO = Path(__file__).resolve().parents[1]
DRIVER = "gpu.nvidia.com"
NODE = "dra-node-1"
UUIDS = [f"GPU-d7a00000-0000-4000-8000-00000000000{i}" for i in range(3)]
MIG_UUID = "MIG-d7a00000-0000-4000-8000-0000000000aa"
DOC: dict[str, Any] = {
    "hostname": NODE,
    "driverVersion": "550.107.02",
    "cudaVersion": "12.4",
    "gpus": [
        {"model": "NVIDIA A100-SXM4-80GB", "uuid": UUIDS[0], "pciBusId": "00000000:07:00.0", "numaNode": 0},
        {"model": "NVIDIA A100-SXM4-80GB", "uuid": UUIDS[1], "pciBusId": "00000000:0F:00.0", "numaNode": 0},
        {
            "model": "NVIDIA A100-SXM4-80GB",
            "uuid": UUIDS[2],
            "migMode": True,
            "mig": [{"profile": "3g.40gb", "start": 4}, {"profile": "1g.10gb", "start": 0, "uuid": MIG_UUID}],
        },
    ],
}


def inventory() -> Inventory:
    return FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t").inventory()


def claim(uid: str, results: list[dict[str, str]], *, ns: str = "ns1", name: str = "c1") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def result(device: str, request: str = "gpu", driver: str = DRIVER, pool: str = NODE) -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


# ------------------------------------------------------------------------------------------ the slice


def test_whole_gpus_are_devices_in_nvidias_shape_and_a_mig_gpu_its_mig_devices() -> None:
    s = build_slice(inventory(), NODE, DRIVER)
    spec = s.spec(3)
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    names = [d["name"] for d in spec["devices"]]
    assert names == ["gpu-0", "gpu-1", "gpu-2-mig-1g10gb-0", "gpu-2-mig-3g40gb-4"]
    gpu1 = spec["devices"][1]
    assert gpu1["attributes"]["type"] == {"string": "gpu"}
    assert gpu1["attributes"]["uuid"] == {"string": UUIDS[1]}
    assert gpu1["attributes"]["index"] == {"int": 1}
    assert gpu1["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert gpu1["attributes"]["architecture"] == {"string": "Ampere"}
    assert gpu1["attributes"]["cudaComputeCapability"] == {"version": "8.0.0"}
    assert gpu1["attributes"]["driverVersion"] == {"version": "550.107.2"}
    assert gpu1["attributes"]["cudaDriverVersion"] == {"version": "12.4.0"}
    assert gpu1["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:0f:00.0"}
    assert gpu1["capacity"] == {"memory": {"value": "81920Mi"}}
    assert "taints" not in gpu1
    mig = spec["devices"][2]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["uuid"] == {"string": MIG_UUID}
    assert mig["attributes"]["parentUUID"] == {"string": UUIDS[2]}
    assert mig["attributes"]["profile"] == {"string": "1g.10gb"}
    assert (
        mig["capacity"]["memory"]["value"].endswith("Mi")
        and int(mig["capacity"]["multiprocessors"]["value"]) > 0
    )
    # what Prepare needs: the ID a container sees
    assert s.by_name["gpu-2-mig-1g10gb-0"].visible_id == MIG_UUID
    assert s.by_name["gpu-1"].visible_id == UUIDS[1]


def test_an_unhealthy_gpu_and_its_mig_devices_carry_the_xid_taint() -> None:
    s = build_slice(inventory(), NODE, DRIVER, unhealthy={UUIDS[0]: 79, UUIDS[2]: 48}, effect="NoExecute")
    taints = {d.name: [(t.key, t.value, t.effect) for t in d.taints] for d in s.devices}
    assert taints == {
        "gpu-0": [("gpu.nvidia.com/xid", "79", "NoExecute")],
        "gpu-1": [],
        "gpu-2-mig-1g10gb-0": [("gpu.nvidia.com/xid", "48", "NoExecute")],
        "gpu-2-mig-3g40gb-4": [("gpu.nvidia.com/xid", "48", "NoExecute")],
    }
    assert s.spec(1)["devices"][0]["taints"] == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
    ]
    none = build_slice(inventory(), NODE, DRIVER, unhealthy={UUIDS[0]: 79}, effect="None")
    assert all(not d.taints for d in none.devices)


def test_with_shares_whole_gpus_are_shared_devices_with_consumable_milli_and_memory() -> None:
    plain = build_slice(inventory(), NODE, DRIVER).spec(1)["devices"][0]
    assert "allowMultipleAllocations" not in plain and "requestPolicy" not in plain["capacity"]["memory"]
    devices = build_slice(inventory(), NODE, DRIVER, shares=True).spec(1)["devices"]
    gpu0 = devices[0]
    assert gpu0["allowMultipleAllocations"] is True
    assert gpu0["capacity"] == {
        "memory": {
            "value": "81920Mi",
            "requestPolicy": {"default": "81920Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        "milli": {
            "value": "1000",
            "requestPolicy": {"default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}},
        },
    }
    assert all("allowMultipleAllocations" not in d for d in devices if "-mig-" in d["name"])


def test_bad_driver_names_and_effects_are_refused_naming_the_flag() -> None:
    assert check_driver_name("gpu.gpusched.io") == "gpu.gpusched.io"
    for bad in ("GPU.nvidia.com", "gpu_nvidia", "x" * 64, "-gpu.io"):
        with pytest.raises(DraConfigError, match="--dra-driver"):
            check_driver_name(bad)
    with pytest.raises(DraConfigError, match="--dra-unhealthy-effect 'Evict'"):
        check_effect("Evict")


# ------------------------------------------------------------------------------------ publication


def test_the_slice_is_created_owned_by_the_node_and_rewritten_with_a_new_generation_only_on_change() -> None:
    api = MemorySlices(node_uids={NODE: "node-uid-1"})
    api.create_slice(  # an older agent's slice of the same driver and node: replaced by this one
        {"metadata": {"name": "old-name"}, "spec": {"driver": DRIVER, "nodeName": NODE, "devices": []}}
    )
    api.create_slice({"metadata": {"name": "other"}, "spec": {"driver": "other.io", "nodeName": NODE}})
    pub = SlicePublisher(api)
    assert pub.sync(build_slice(inventory(), NODE, DRIVER))
    assert sorted(api.slices) == ["dra-node-1-gpu.nvidia.com", "other"]
    s = api.slices["dra-node-1-gpu.nvidia.com"]
    assert s["spec"]["pool"]["generation"] == 1
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}
    ]
    assert not pub.sync(build_slice(inventory(), NODE, DRIVER))  # unchanged: not written
    # the apiserver stores quantities normalised (81920Mi as 80Gi): still the same slice, not written again
    s["spec"]["devices"][0]["capacity"]["memory"]["value"] = "80Gi"
    assert not pub.sync(build_slice(inventory(), NODE, DRIVER))
    assert pub.writes == 1
    assert pub.sync(build_slice(inventory(), NODE, DRIVER, unhealthy={UUIDS[1]: 79}))
    s = api.slices["dra-node-1-gpu.nvidia.com"]
    assert s["spec"]["pool"]["generation"] == 2
    assert s["spec"]["devices"][1]["taints"][0]["value"] == "79"
    pub.delete(build_slice(inventory(), NODE, DRIVER))
    assert sorted(api.slices) == ["other"]


def test_a_critical_xid_in_dra_mode_taints_the_device_in_the_published_slice(tmp_path: Path) -> None:
    api = MemorySlices()
    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t")
    pods = MemoryPods()
    cfg = AgentConfig(
        node=NODE,
        plugin_dir=tmp_path / "dp",
        dra=DraConfig(
            cdi_dir=tmp_path / "cdi", registry_dir=tmp_path / "reg", plugins_dir=tmp_path / "plugins"
        ),
    )
    agent = Agent(cfg, backend, pods, pods, api)
    assert agent.dra is not None
    agent.dra.publish()
    agent.handle_xids([XidEvent(1, 13)])  # an application error: no taint
    agent.dra.publish()
    assert "taints" not in api.slices[f"{NODE}-{DRIVER}"]["spec"]["devices"][1]
    agent.handle_xids([XidEvent(1, 79)])
    agent.dra.publish()
    dev = api.slices[f"{NODE}-{DRIVER}"]["spec"]["devices"][1]
    assert dev["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    assert api.slices[f"{NODE}-{DRIVER}"]["spec"]["pool"]["generation"] == 2
    assert not (tmp_path / "dp").exists()  # no device-plugin socket was ever served


# ------------------------------------------------------------------------- prepare / unprepare, gRPC


class Env:
    def __init__(self, root: Path, backend: Any = None, mig: str = "static", sharing: Any = None) -> None:
        self.root = root
        self.api = MemorySlices()
        self.dev = root / "dev"
        self.dev.mkdir(exist_ok=True)
        self.config = DraConfig(
            cdi_dir=root / "cdi", dev_root=self.dev, registry_dir=root / "reg", plugins_dir=root / "plugins",
            mig=mig, proc_root=root / "host",
        )  # fmt: skip
        inv = backend.inventory() if backend is not None else inventory()
        self.node = DraNode(NODE, inv, self.config, self.api, self.api, backend, sharing or Sharing())

    def channel(self, path: Path) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{path}")

    def prepare(self, *refs: ClaimRef) -> pb.NodePrepareResourcesResponse:
        with self.channel(self.node.plugin.dra_socket) as ch:
            req = pb.NodePrepareResourcesRequest(
                claims=[pb.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
            )
            return pbg.DRAPluginStub(ch).NodePrepareResources(req, timeout=10)

    def unprepare(self, *refs: ClaimRef) -> pb.NodeUnprepareResourcesResponse:
        with self.channel(self.node.plugin.dra_socket) as ch:
            req = pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
            )
            return pbg.DRAPluginStub(ch).NodeUnprepareResources(req, timeout=10)


@pytest.fixture
def env() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # short: unix socket paths are < 108 bytes
    e = Env(root)
    e.node.start()
    try:
        yield e
    finally:
        e.node.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_registration_socket_names_the_driver_its_dra_socket_and_the_v1_service(env: Env) -> None:
    sock = env.config.registry_dir / f"{DRIVER}-reg.sock"
    assert sock.is_socket()
    with env.channel(sock) as ch:
        stub = regpbg.RegistrationStub(ch)
        info = stub.GetInfo(regpb.InfoRequest(), timeout=10)
        stub.NotifyRegistrationStatus(regpb.RegistrationStatus(plugin_registered=True), timeout=10)
    assert (info.type, info.name) == ("DRAPlugin", DRIVER)
    assert info.endpoint == str(env.config.plugins_dir / DRIVER / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert env.node.plugin.registration.registered.is_set()
    assert f"{NODE}-{DRIVER}" in env.api.slices  # published at start


def test_prepare_writes_the_claims_cdi_spec_and_answers_its_device_ids(env: Env) -> None:
    (env.dev / "nvidia1").touch()  # a stand-in device node for GPU 1 (and none for the control devices)
    env.api.claims[("ns1", "c1")] = claim(
        "uid-1", [result("gpu-1", "gpu"), result("gpu-2-mig-1g10gb-0", "g/mig")]
    )
    resp = env.prepare(ClaimRef("ns1", "c1", "uid-1"))
    got = resp.claims["uid-1"]
    assert got.error == ""
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in got.devices
    ] == [
        (["gpu"], NODE, "gpu-1", ["k8s.gpu.nvidia.com/claim=uid-1-gpu-1"]),
        (["g"], NODE, "gpu-2-mig-1g10gb-0", ["k8s.gpu.nvidia.com/claim=uid-1-gpu-2-mig-1g10gb-0"]),
    ]
    spec = json.loads((env.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-1.json").read_text())
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [
            {
                "name": "uid-1-gpu-1",
                "containerEdits": {
                    "env": [f"NVIDIA_VISIBLE_DEVICES={UUIDS[1]}", "GPUSCHED_DRA_CLAIM=ns1/c1"],
                    "deviceNodes": [{"path": "/dev/nvidia1", "hostPath": str(env.dev / "nvidia1")}],
                },
            },
            {
                "name": "uid-1-gpu-2-mig-1g10gb-0",
                "containerEdits": {
                    "env": [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID}", "GPUSCHED_DRA_CLAIM=ns1/c1"]
                },
            },
        ],
    }


def test_devices_of_one_request_are_visible_together_and_other_drivers_results_are_left_alone(
    env: Env,
) -> None:
    env.api.claims[("ns1", "c1")] = claim(
        "uid-2", [result("gpu-0"), result("gpu-1"), result("other-0", driver="other.example.com", pool="p")]
    )
    got = env.prepare(ClaimRef("ns1", "c1", "uid-2")).claims["uid-2"]
    assert [d.device_name for d in got.devices] == ["gpu-0", "gpu-1"]
    spec = CdiSpecs(env.config.cdi_dir, DRIVER).read("uid-2")
    assert spec is not None
    envs = [d["containerEdits"]["env"][0] for d in spec["devices"]]
    assert envs == [f"NVIDIA_VISIBLE_DEVICES={UUIDS[0]},{UUIDS[1]}"] * 2


def test_a_share_gets_its_consumed_capacity_as_env_and_a_cdi_device_of_its_own(env: Env) -> None:
    shares = [
        {**result("gpu-0", "a"), "shareID": "s-1", "consumedCapacity": {"milli": "250", "memory": "10Gi"}},
        {**result("gpu-0", "b"), "shareID": "s-2", "consumedCapacity": {"gpu.nvidia.com/milli": "1k"}},
    ]
    env.api.claims[("ns1", "c1")] = claim("uid-s", shares)
    got = env.prepare(ClaimRef("ns1", "c1", "uid-s")).claims["uid-s"]
    assert got.error == ""
    assert [(d.share_id, list(d.cdi_device_ids)) for d in got.devices] == [
        ("s-1", ["k8s.gpu.nvidia.com/claim=uid-s-gpu-0-s-1"]),
        ("s-2", ["k8s.gpu.nvidia.com/claim=uid-s-gpu-0-s-2"]),
    ]
    spec = CdiSpecs(env.config.cdi_dir, DRIVER).read("uid-s")
    assert spec is not None
    # --sharing none: the device plugin's share variables, as information (nothing enforces them)
    assert [(d["name"], d["containerEdits"]["env"][2:]) for d in spec["devices"]] == [
        ("uid-s-gpu-0-s-1", ["GPUSCHED_GPU_MILLI=250", "GPUSCHED_GPU_MEMORY_MIB=10240",
                             "CUDA_DEVICE_MEMORY_LIMIT_0=10240m", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
                             "CUDA_DEVICE_SM_LIMIT=25", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"]),
        ("uid-s-gpu-0-s-2", ["GPUSCHED_GPU_MILLI=1000", "GPUSCHED_GPU_MEMORY_MIB=0"]),
    ]  # fmt: skip
    bad = [{**result("gpu-1"), "shareID": "s-3", "consumedCapacity": {"milli": "lots"}}]
    env.api.claims[("ns1", "bad")] = claim("uid-bad", bad, name="bad")
    err = env.prepare(ClaimRef("ns1", "bad", "uid-bad")).claims["uid-bad"].error
    assert "ns1/bad (uid uid-bad): device gpu-1: consumedCapacity {'milli': 'lots'} is no quantity" in err


def test_prepare_is_idempotent_in_one_agent_and_across_a_restart(env: Env) -> None:
    env.api.claims[("ns1", "c1")] = claim("uid-3", [result("gpu-0")])
    ref = ClaimRef("ns1", "c1", "uid-3")
    first = env.prepare(ref)
    spec = (env.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-3.json").read_text()
    del env.api.claims[("ns1", "c1")]  # answered from memory: the API is not read again
    assert env.prepare(ref) == first
    env.api.claims[("ns1", "c1")] = claim("uid-3", [result("gpu-0")])
    restarted = Preparer(env.api, CdiSpecs(env.config.cdi_dir, DRIVER, env.dev), env.node.current_slice)
    assert restarted.prepare(ref).response() == first.claims["uid-3"]
    assert (env.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-3.json").read_text() == spec


def test_a_claim_that_cannot_be_prepared_gets_an_error_naming_it_and_the_others_are_prepared(
    env: Env,
) -> None:
    env.api.claims[("ns1", "ok")] = claim("uid-ok", [result("gpu-0")], name="ok")
    env.api.claims[("ns1", "moved")] = claim("uid-new", [result("gpu-0")], name="moved")
    env.api.claims[("ns1", "bare")] = {"metadata": {"namespace": "ns1", "name": "bare", "uid": "uid-bare"}}
    env.api.claims[("ns1", "far")] = claim("uid-far", [result("gpu-0", pool="other-node")], name="far")
    env.api.claims[("ns1", "ghost")] = claim("uid-ghost", [result("gpu-9")], name="ghost")
    refs = [
        ClaimRef("ns1", "ok", "uid-ok"),
        ClaimRef("ns1", "missing", "uid-missing"),
        ClaimRef("ns1", "moved", "uid-old"),
        ClaimRef("ns1", "bare", "uid-bare"),
        ClaimRef("ns1", "far", "uid-far"),
        ClaimRef("ns1", "ghost", "uid-ghost"),
    ]
    resp = env.prepare(*refs)
    assert resp.claims["uid-ok"].error == "" and len(resp.claims["uid-ok"].devices) == 1
    assert "ResourceClaim ns1/missing not found" in resp.claims["uid-missing"].error
    assert "ns1/moved (uid uid-old)" in resp.claims["uid-old"].error
    assert "uid 'uid-new' now" in resp.claims["uid-old"].error
    assert "ns1/bare (uid uid-bare) is not allocated" in resp.claims["uid-bare"].error
    assert "pool 'other-node'" in resp.claims["uid-far"].error
    assert "device gpu-9 is not published" in resp.claims["uid-ghost"].error
    written = sorted(p.name for p in env.config.cdi_dir.iterdir())
    assert written == ["k8s.gpu.nvidia.com-claim_uid-ok.json"]


def test_unprepare_removes_the_spec_and_is_idempotent(env: Env) -> None:
    env.api.claims[("ns1", "c1")] = claim("uid-4", [result("gpu-1")])
    ref = ClaimRef("ns1", "c1", "uid-4")
    env.prepare(ref)
    path = env.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-4.json"
    assert path.exists()
    for _ in range(2):  # again: no error (never prepared, or already unprepared)
        resp = env.unprepare(ref, ClaimRef("ns1", "never", "uid-never"))
        assert set(resp.claims) == {"uid-4", "uid-never"}
        assert all(c.error == "" for c in resp.claims.values())
        assert not path.exists()
    env.api.claims[("ns1", "c1")] = claim("uid-4", [result("gpu-0")])  # prepared again: read again
    assert env.prepare(ref).claims["uid-4"].devices[0].device_name == "gpu-0"


def test_the_sockets_are_served_again_when_removed_and_gone_after_stop() -> None:
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    e = Env(root)
    try:
        e.node.plugin.start(watch_interval_s=0.05)
        e.node.plugin.registration_socket.unlink()
        assert wait_until(e.node.plugin.registration_socket.is_socket, 10)
        e.node.plugin.stop()
        assert not e.node.plugin.registration_socket.exists() and not e.node.plugin.dra_socket.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------- never beside a device plugin


def test_dra_beside_a_device_plugin_is_refused_naming_what_serves_the_gpus() -> None:
    with pytest.raises(DraConfigError, match="--no-nvidia-resources"):
        refuse_device_plugin_beside(nvidia_resources=False, sharing="none", other_plugins=[])
    with pytest.raises(DraConfigError, match="--sharing mps"):
        refuse_device_plugin_beside(nvidia_resources=True, sharing="mps", other_plugins=[])
    refuse_device_plugin_beside(nvidia_resources=True, sharing="hami-core", other_plugins=[])
    refuse_device_plugin_beside(nvidia_resources=True, sharing="none", other_plugins=[])
    # a live device plugin listing this node's GPUs (gpusched's own, in device-plugin mode, stands in for
    # NVIDIA's) in the kubelet's directory: the DRA agent does not start
    d = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    kubelet = FakeKubelet(d).start()
    pods = MemoryPods()
    plugin_agent = Agent(
        AgentConfig(node=NODE, plugin_dir=d),
        FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t"),
        pods,
        pods,
    )
    dra_cfg = DraConfig(cdi_dir=d / "cdi", registry_dir=d / "reg", plugins_dir=d / "plugins")
    dra_agent = Agent(
        AgentConfig(node=NODE, plugin_dir=d, dra=dra_cfg),
        FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t"),
        pods,
        pods,
        MemorySlices(),
    )
    try:
        plugin_agent.start(serve_metrics=False)
        with pytest.raises(
            DraConfigError, match=r"another device plugin serves this node's GPUs \(gpusched-gpu.sock"
        ):
            dra_agent.start(serve_metrics=False)
        assert not (d / "reg").exists()
    finally:
        plugin_agent.stop()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_the_run_command_refuses_dra_with_no_nvidia_resources_in_one_error_line(tmp_path: Path) -> None:
    f = tmp_path / "gpus.json"
    f.write_text(json.dumps(DOC))
    base = [sys.executable, "-m", "gpusched.cli", "agent", "run", "--fake", str(f), "--no-api",
            "--node", NODE, "--plugin-dir", str(tmp_path / "dp"), "--metrics-port", "0", "--dra",
            "--dra-registry-dir", str(tmp_path / "reg"), "--dra-plugins-dir", str(tmp_path)]  # fmt: skip
    for extra, says in ((["--no-nvidia-resources"], "--dra with --no-nvidia-resources"),
                        (["--dra-driver", "Bad_Name"], "--dra-driver 'Bad_Name'")):  # fmt: skip
        # a run that is not refused serves until stopped: the timeout fails the test
        r = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode != 0
        assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "reg").exists()


# ---------------------------------------------------------------------------------- generated stubs
KUBELET_MOD = Path.home() / "go/pkg/mod/k8s.io/kubelet@v0.37.2"


@pytest.mark.skipif(
    not KUBELET_MOD.exists(), reason=f"{KUBELET_MOD} absent (built with the kubelet by hack/)"
)
def test_committed_dra_stubs_are_what_the_generation_script_writes(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    r = subprocess.run(
        ["bash", str(REPO / "hack/gen-dra.sh"), str(KUBELET_MOD)],
        env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin:/usr/local/bin", "PYTHON": sys.executable,
             "HOME": str(Path.home()), "GOMODCACHE": str(Path.home() / "go/pkg/mod")},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for pkg in ("v1", "pluginregistration_v1"):
        for f in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
            assert (tmp_path / pkg / f).read_text() == (
                REPO / "src/gpusched/agent/dra" / pkg / f
            ).read_text(), f


# ------------------------------------------------------------------------------------------ dynamic MIG

DYN_DOC: dict[str, Any] = {
    "hostname": NODE,
    "driverVersion": "550.107.02",
    "cudaVersion": "12.4",
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "uuid": UUIDS[0]},
        {"model": "NVIDIA A100-SXM4-80GB", "uuid": UUIDS[1], "migMode": True, "mig": []},
    ],
}


def dyn_backend(**gpu1: Any) -> FakeBackend:
    doc = json.loads(json.dumps(DYN_DOC))
    doc["gpus"][1].update(gpu1)
    return FakeBackend.from_dict(doc, "t")


def test_dynamic_mig_publishes_every_placement_consuming_its_gpus_counter_set_in_nvidias_shape() -> None:
    s = build_slice(dyn_backend().inventory(), NODE, DRIVER, mig="dynamic")
    specs = dict(s.specs(4))
    assert list(specs) == [f"{NODE}-{DRIVER}", f"{NODE}-{DRIVER}-counters"]
    assert all(
        sp["pool"] == {"name": NODE, "generation": 4, "resourceSliceCount": 2} for sp in specs.values()
    )
    (cset,) = specs[f"{NODE}-{DRIVER}-counters"]["sharedCounters"]
    assert "devices" not in specs[f"{NODE}-{DRIVER}-counters"]
    assert cset["name"] == "gpu-1-counter-set"
    slices = {f"memory-slice-{i}": {"value": "1"} for i in range(8)}
    assert cset["counters"] == {
        "multiprocessors": {"value": "98"}, "copy-engines": {"value": "7"}, "decoders": {"value": "5"},
        "encoders": {"value": "0"}, "jpeg-engines": {"value": "1"}, "ofa-engines": {"value": "1"},
        "memory": {"value": "81920Mi"}, **slices,
    }  # fmt: skip
    devices = {d["name"]: d for d in specs[f"{NODE}-{DRIVER}"]["devices"]}
    assert "gpu-0" in devices and "gpu-1" not in devices  # the MIG-mode GPU: placements instead
    mig = sorted(n for n in devices if n.startswith("gpu-1-mig-"))
    assert len(mig) == 7 + 7 + 4 + 3 + 2 + 1 + 1  # every start of every profile (mig.md §2a)
    assert {
        "gpu-1-mig-1g10gb-19-6",
        "gpu-1-mig-1g10gb-me-20-0",
        "gpu-1-mig-3g40gb-9-4",
        "gpu-1-mig-7g80gb-0-0",
    } < set(mig)
    d = devices["gpu-1-mig-3g40gb-9-4"]
    attrs = {k: next(iter(v.values())) for k, v in d["attributes"].items()}
    assert attrs["type"] == "mig" and attrs["profile"] == "3g.40gb" and attrs["parentUUID"] == UUIDS[1]
    assert "uuid" not in attrs  # the instance does not exist until Prepare
    assert d["capacity"]["multiprocessors"] == {"value": "42"} and d["capacity"]["memory"] == {
        "value": "40960Mi"
    }
    (use,) = d["consumesCounters"]
    assert use["counterSet"] == "gpu-1-counter-set"
    assert {k for k in use["counters"] if k.startswith("memory-slice")} == {
        f"memory-slice-{i}" for i in (4, 5, 6, 7)
    }
    assert use["counters"]["multiprocessors"] == {"value": "42"} and use["counters"]["copy-engines"] == {
        "value": "3"
    }
    assert "consumesCounters" not in devices["gpu-0"]
    static = build_slice(dyn_backend().inventory(), NODE, DRIVER)  # static: no placements, no counters
    assert [n for n, _ in static.specs(1)] == [f"{NODE}-{DRIVER}"] and not static.counter_sets


def _fits(parts: list[Any], counters: dict[str, int]) -> bool:
    used: dict[str, int] = {}
    for p in parts:
        for k, v in p.counters.items():
            used[k] = used.get(k, 0) + v
    return all(v <= counters[k] for k, v in used.items())


@pytest.mark.parametrize(
    "model",
    ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200",
     "NVIDIA A30"],
)  # fmt: skip
def test_the_counters_admit_exactly_the_legal_mig_layouts(model: str) -> None:
    """Over every set of placements with disjoint memory slices: the counters fit it exactly when the
    GPU can hold it (the profile table's rules: starts, overlaps, per-profile maxima, SM slices)."""
    from gpusched.agent import migprofiles
    from gpusched.agent.dra.migdynamic import partitions

    gpu = {
        "model": model,
        "migMode": True,
        **({"memoryMiB": 183360, "computeCapability": "10.0"} if "B200" in model else {}),
    }
    dev = FakeBackend.from_dict({"gpus": [gpu]}, "t").inventory().devices[0]
    gp = partitions(dev)
    assert gp is not None
    parts = list(gp.parts)
    checked = legal = 0

    def walk(i: int, chosen: list[Any], used: set[int]) -> None:
        nonlocal checked, legal
        if i == len(parts):
            insts = [
                migprofiles.instance(dev.name, dev.memory_mib, p.placement.profile, p.placement.start, "u")
                for p in chosen
            ]
            try:
                migprofiles.validate(dev.name, dev.memory_mib, insts)
                ok = True
            except migprofiles.MigError:
                ok = False
            assert _fits(chosen, gp.counters) == ok, [p.name for p in chosen]
            checked += 1
            legal += ok
            return
        walk(i + 1, chosen, used)
        span = set(range(parts[i].placement.start, parts[i].placement.start + parts[i].placement.size))
        if not span & used:
            walk(i + 1, [*chosen, parts[i]], used | span)

    walk(0, [], set())
    assert checked > legal > 10  # illegal layouts were among them (two +me, ...)
    # two placements sharing a memory slice never fit together
    at0 = [p for p in parts if p.placement.start == 0]
    assert len(at0) > 2 and all(not _fits([a, b], gp.counters) for a in at0 for b in at0 if a is not b)


def _withheld(**gpu1: Any) -> set[str]:
    """The placements published on the empty GPU 1 and not with ``gpu1``'s instances made by hand."""
    every, names = (
        {d.name for d in build_slice(b.inventory(), NODE, DRIVER, mig="dynamic").devices}
        for b in (dyn_backend(), dyn_backend(**gpu1))
    )
    assert names <= every
    return every - names


def test_a_placement_under_an_instance_no_claim_made_is_withheld() -> None:
    """Exactly the placements sharing a memory slice with the foreign instance go: a 3g.40gb at 4 (slices
    4-7) and a 1g.10gb at 3 (slice 3; its neighbours' placements stay)."""
    assert _withheld(mig=[{"profile": "3g.40gb", "start": 4}]) == {
        "gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5", "gpu-1-mig-1g10gb-19-6",
        "gpu-1-mig-1g10gb-me-20-4", "gpu-1-mig-1g10gb-me-20-5", "gpu-1-mig-1g10gb-me-20-6",
        "gpu-1-mig-1g20gb-15-4", "gpu-1-mig-1g20gb-15-6", "gpu-1-mig-2g20gb-14-4", "gpu-1-mig-3g40gb-9-4",
        "gpu-1-mig-7g80gb-0-0",
    }  # fmt: skip
    assert _withheld(mig=[{"profile": "1g.10gb", "start": 3}]) == {
        "gpu-1-mig-1g10gb-19-3", "gpu-1-mig-1g10gb-me-20-3", "gpu-1-mig-1g20gb-15-2", "gpu-1-mig-2g20gb-14-2",
        "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-4g40gb-5-0", "gpu-1-mig-7g80gb-0-0",
    }  # fmt: skip
    backend = dyn_backend(mig=[{"profile": "3g.40gb", "start": 4}])
    (inst,) = backend.inventory().devices[1].mig_instances
    ours = build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic", ours={inst.uuid})
    assert not _withheld() and {d.name for d in ours.devices} == {
        d.name for d in build_slice(dyn_backend().inventory(), NODE, DRIVER, mig="dynamic").devices
    }  # a prepared claim's instance withholds nothing (the counters keep its placements apart)


def test_the_pool_of_several_slices_is_written_whole_with_one_generation() -> None:
    backend = dyn_backend()
    api = MemorySlices({NODE: "node-uid"})
    pub = SlicePublisher(api)
    assert pub.sync(build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic"))
    assert sorted(api.slices) == [f"{NODE}-{DRIVER}", f"{NODE}-{DRIVER}-counters"]
    assert not pub.sync(build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic"))
    backend.create_mig_instance(1, "1g.10gb", 0)  # made by hand: its placements go, the pool is rewritten
    assert pub.sync(build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic"))
    gens = {n: s["spec"]["pool"]["generation"] for n, s in api.slices.items()}
    assert gens == {f"{NODE}-{DRIVER}": 2, f"{NODE}-{DRIVER}-counters": 2}
    assert pub.sync(build_slice(backend.inventory(), NODE, DRIVER))  # back to static: the counters slice goes
    assert sorted(api.slices) == [f"{NODE}-{DRIVER}"]
    assert api.slices[f"{NODE}-{DRIVER}"]["spec"]["pool"]["resourceSliceCount"] == 1


@pytest.fixture
def dyn() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    e = Env(root, dyn_backend(), mig="dynamic")
    e.node.start()
    try:
        yield e
    finally:
        e.node.stop()
        shutil.rmtree(root, ignore_errors=True)


def _instances(e: Env) -> list[tuple[str, int, str]]:
    assert e.node.mig is not None
    return [
        (m.profile, m.placement_start, m.uuid) for m in e.node.mig.ops.inventory().devices[1].mig_instances
    ]


def test_prepare_creates_the_placements_instance_and_unprepare_destroys_it(dyn: Env) -> None:
    dyn.api.claims[("ns1", "c1")] = claim("uid-m", [result("gpu-1-mig-3g40gb-9-4")])
    ref = ClaimRef("ns1", "c1", "uid-m")
    got = dyn.prepare(ref).claims["uid-m"]
    assert got.error == ""
    ((profile, start, mig_uuid),) = _instances(dyn)
    assert (profile, start) == ("3g.40gb", 4) and mig_uuid.startswith("MIG-")
    spec = json.loads((dyn.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-m.json").read_text())
    assert spec["devices"][0]["name"] == "uid-m-gpu-1-mig-3g40gb-9-4"
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in spec["devices"][0]["containerEdits"]["env"]
    checkpoint = dyn.config.plugins_dir / DRIVER / "mig-claims.json"
    assert json.loads(checkpoint.read_text())["claims"]["uid-m"][0]["uuid"] == mig_uuid
    # its placement stays published (the claim's allocation holds the counters), the slice unchanged
    assert "gpu-1-mig-3g40gb-9-4" in dyn.node.current_slice().by_name
    assert dyn.prepare(ref).claims["uid-m"].error == "" and len(_instances(dyn)) == 1  # idempotent
    # a restarted agent (a new Preparer, the checkpoint read again) answers with the same instance
    assert dyn.node.mig is not None
    again = Preparer(dyn.api, CdiSpecs(dyn.config.cdi_dir, DRIVER, dyn.dev), dyn.node.current_slice,
                     MigInstances(dyn.node.mig.ops, MigClaims(checkpoint)))  # fmt: skip
    assert again.prepare(ref).devices[0].visible_id == mig_uuid and len(_instances(dyn)) == 1
    assert again.unprepare(ref) is None  # the restarted one destroys it, from the checkpoint
    assert _instances(dyn) == [] and json.loads(checkpoint.read_text())["claims"] == {}
    assert dyn.unprepare(ref).claims["uid-m"].error == ""  # again: nothing left, no error


def test_a_failed_create_rolls_back_the_claims_instances_and_is_the_prepare_error(dyn: Env) -> None:
    from gpusched.agent.reshape.fakeops import CREATE, Failing, FailSpec

    assert dyn.node.mig is not None
    dyn.node.mig.ops = Failing(dyn.node.mig.ops, FailSpec(CREATE, nth=2))
    dyn.api.claims[("ns1", "c1")] = claim(
        "uid-f", [result("gpu-1-mig-1g10gb-19-0"), result("gpu-1-mig-3g40gb-9-4", "b")]
    )
    err = dyn.prepare(ClaimRef("ns1", "c1", "uid-f")).claims["uid-f"].error
    assert "ResourceClaim ns1/c1 (uid uid-f): cannot create MIG 3g.40gb at memory slice 4 of GPU 1" in err
    assert "injected failure" in err and "rolled back: destroyed MIG-" in err
    assert _instances(dyn) == []  # the 1g made first was destroyed again
    assert not (dyn.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-f.json").exists()
    # a placement the GPU cannot take now (overlapping an instance made meanwhile) fails the same way
    dyn.node.mig.ops.create_mig_instance(1, "1g.10gb", 5)
    dyn.api.claims[("ns1", "c2")] = claim("uid-g", [result("gpu-1-mig-3g40gb-9-4")], name="c2")
    err = dyn.prepare(ClaimRef("ns1", "c2", "uid-g")).claims["uid-g"].error
    assert "not published" in err  # the hand-made instance withholds the placement: never created
    assert [(p, s) for p, s, _ in _instances(dyn)] == [("1g.10gb", 5)]


def test_with_hami_core_a_dra_share_gets_the_same_enforced_limits_as_a_device_plugin_share() -> None:
    """``--sharing hami-core`` under DRA: the share's consumed capacity becomes HAMi-core's limits and
    library in the container's CDI edits, exactly as ``Sharing.container`` gives a device-plugin share."""
    from gpusched.agent.allocation import Assignment

    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    lib = root / "libvgpu.so"
    lib.write_bytes(b"")
    sharing = Sharing("hami-core", None, lib)
    e = Env(root, sharing=sharing)
    e.node.start()
    try:
        share = {**result("gpu-1"), "shareID": "s-9", "consumedCapacity": {"milli": "300", "memory": "20Gi"}}
        e.api.claims[("ns1", "c1")] = claim("uid-h", [share])
        assert e.prepare(ClaimRef("ns1", "c1", "uid-h")).claims["uid-h"].error == ""
        spec = CdiSpecs(e.config.cdi_dir, DRIVER).read("uid-h")
        assert spec is not None
        (dev,) = spec["devices"]
        want = sharing.container(UUIDS[1], Assignment(NODE, (1,), 300, 20480), ("x", "y"))
        assert dev["containerEdits"]["env"][2:] == [f"{k}={v}" for k, v in want.envs.items()]
        assert "CUDA_DEVICE_MEMORY_LIMIT_0=20480m" in dev["containerEdits"]["env"]
        assert "CUDA_DEVICE_SM_LIMIT=30" in dev["containerEdits"]["env"]
        assert f"LD_PRELOAD={lib}" in dev["containerEdits"]["env"]
        assert dev["containerEdits"]["mounts"] == [
            {"hostPath": str(lib), "containerPath": str(lib), "options": ["ro", "nosuid", "nodev", "bind"]}
        ]
    finally:
        e.node.stop()
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------- mixed nodes: GPUs device-plugin pods hold, tainted


def _dp_pod(
    name: str, *, assigned: list[int] | None = None, allocated: str = "", phase: str = "Running"
) -> dict[str, Any]:
    ann = {}
    if assigned is not None:
        ann["gpusched.io/assignment"] = json.dumps(
            {"node": NODE, "gpus": assigned, "milli": 1000, "memoryMiB": 0}
        )
    if allocated:
        ann["gpusched.io/allocated"] = json.dumps({"main": {"nvidia.com/gpu": [allocated]}})
    return {
        "metadata": {"namespace": "ns1", "name": name, "uid": f"uid-{name}", "annotations": ann},
        "spec": {"nodeName": NODE},
        "status": {"phase": phase},
    }


def test_gpus_device_plugin_pods_hold_get_a_taint_rule_for_other_drivers_devices_until_free() -> None:
    from gpusched.agent.dra.heldtaints import TAINT_KEY, HeldTaints, MemoryTaintRules, held_gpus

    inv = inventory()
    pods = [
        _dp_pod("handed", allocated=UUIDS[1]),  # the agent handed it GPU 1
        _dp_pod("bound", assigned=[0]),  # assigned GPU 0, not started yet
        _dp_pod("done", allocated=UUIDS[2], phase="Succeeded"),  # holds nothing any more
    ]
    assert held_gpus(pods, NODE, inv, {}) == {UUIDS[0], UUIDS[1]}
    nvidia = {  # NVIDIA's driver publishes the node's GPUs (and a MIG device of GPU 1) in its own slice
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE},
            "devices": [
                {"name": "gpu-0", "attributes": {"uuid": {"string": UUIDS[0]}}},
                {"name": "gpu-1", "attributes": {"gpu.nvidia.com/uuid": {"string": UUIDS[1]}}},
                {"name": "gpu-1-mig-1g10gb-19-0",
                 "attributes": {"uuid": {"string": "MIG-x"}, "parentUUID": {"string": UUIDS[1]}}},
                {"name": "gpu-2", "attributes": {"uuid": {"string": UUIDS[2]}}},
            ],
        }
    }  # fmt: skip
    other_node = {"spec": {**nvidia["spec"], "nodeName": "elsewhere", "pool": {"name": "elsewhere"}}}
    api = MemoryTaintRules([nvidia, other_node])
    held = HeldTaints(api, NODE)
    created, deleted = held.sync({UUIDS[1]})
    assert len(created) == 2 and deleted == []
    rules = sorted(api.rules.values(), key=lambda r: r["spec"]["deviceSelector"]["device"])
    assert [r["spec"]["deviceSelector"] for r in rules] == [
        {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1"},
        {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1-mig-1g10gb-19-0"},
    ]
    assert all(
        r["spec"]["taint"] == {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} for r in rules
    )
    assert all(r["metadata"]["labels"] == {"gpusched.io/held-gpu-node": NODE} for r in rules)
    assert held.sync({UUIDS[1]}) == ([], [])  # nothing changed: nothing written
    created, deleted = held.sync({UUIDS[0]})  # GPU 1 free, GPU 0 held
    assert len(created) == 1 and len(deleted) == 2
    assert [r["spec"]["deviceSelector"]["device"] for r in api.rules.values()] == ["gpu-0"]
    assert held.sync(set())[1] and api.rules == {}


def test_gpuscheds_allocator_places_mig_claims_on_the_agents_dynamic_pool_through_its_counters() -> None:
    """The agent's dynamic-MIG pool, as the API would store it, converted and allocated by gpusched's own
    allocator claim after claim (each seeing the earlier ones): two 3g.40gb take the two halves, then no 1g
    and no 7g fit; kube-scheduler takes the same pool in tests/kubelet/test_dra_node.py."""
    from gpusched.core.dra.allocator import Allocator, DoesNotFit, Fits
    from gpusched.core.dra.celexpr import CelCompiler
    from gpusched.core.dra.model import AllocatedState, DeviceClass, DeviceId, Node
    from gpusched.k8s.dra.convert import claim_from_k8s, slice_from_k8s

    pool = build_slice(dyn_backend().inventory(), NODE, DRIVER, mig="dynamic")
    slices = [slice_from_k8s({"metadata": {"name": n}, "spec": sp}) for n, sp in pool.specs(1)]
    mig = DeviceClass("mig", (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'",))

    def place(profiles: list[str]) -> list[str | None]:
        held: set[DeviceId] = set()
        got: list[str | None] = []
        for i, profile in enumerate(profiles):
            sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].profile == '{profile}'"}}
            request = {"name": "g", "exactly": {"deviceClassName": "mig", "selectors": [sel]}}
            meta = {"namespace": "ns1", "name": f"c{i}", "uid": f"u{i}"}
            c = claim_from_k8s({"metadata": meta, "spec": {"devices": {"requests": [request]}}})
            state = AllocatedState(frozenset(held))
            out = Allocator({"mig": mig}, slices, CelCompiler(), state).allocate(Node(NODE), [c])
            if isinstance(out, Fits):
                (r,) = out.allocations[0].results
                held.add(DeviceId(r.driver, r.pool, r.device))
                got.append(r.device)
            else:
                assert isinstance(out, DoesNotFit)
                got.append(None)
        return got

    got = place(["3g.40gb", "3g.40gb", "1g.10gb", "7g.80gb"])
    assert got == ["gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4", None, None]
    # one +me profile per GPU: memory slices are left, its OFA engine counter is not
    assert place(["1g.10gb+me", "1g.10gb+me"]) == ["gpu-1-mig-1g10gb-me-20-0", None]


class _CountingPods(MemoryPods):
    listed = 0

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        self.listed += 1
        return super().pods_on_node(node)


def test_the_device_plugin_agent_taints_held_gpus_only_where_a_dra_driver_publishes_them(
    tmp_path: Path,
) -> None:
    from gpusched.agent.dra.heldtaints import MemoryTaintRules

    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t")
    pods = _CountingPods([_dp_pod("handed", allocated=UUIDS[0])])
    rules = MemoryTaintRules()
    agent = Agent(AgentConfig(node=NODE, plugin_dir=tmp_path / "dp"), backend, pods, pods, taint_api=rules)
    agent.sync_held_taints()
    agent.sync_held_taints()  # rules of an earlier agent looked for once; then no DRA slice: nothing read
    assert rules.rules == {} and pods.listed == 1
    rules.slices.append(
        {"spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE},
                  "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": UUIDS[0]}}}]}}
    )  # fmt: skip
    agent.sync_held_taints()
    assert [r["spec"]["deviceSelector"]["device"] for r in rules.rules.values()] == ["gpu-0"]
    pods.pods.clear()  # the pod went
    agent.sync_held_taints()
    assert rules.rules == {}
    dra_agent = Agent(
        AgentConfig(node=NODE, plugin_dir=tmp_path / "dp2", dra=DraConfig(plugins_dir=tmp_path / "p")),
        backend, pods, pods, MemorySlices(), taint_api=rules,
    )  # fmt: skip
    assert dra_agent.held_taints is None  # the DRA driver serves the GPUs itself: no device-plugin pods


def test_dynamic_mig_instances_are_made_and_undone_through_nvml_as_through_the_fake(
    backends: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The same Prepare/Unprepare of placements on both backends: the fake one, and NvmlBackend over the
    fake libnvidia-ml (``test_agent_mig_reshape``'s fixture: the NVML calls of ``agent/reshape/nvmlops.py``).
    GPU 2 is an A30 with a 2g.12gb at slice 2 that no claim made."""
    ops = backends.start(fail="nvmlDeviceCreateGpuInstanceWithPlacement:2")
    mig = MigInstances(ops, MigClaims(tmp_path / "mig-claims.json"))
    inv, ours = mig.snapshot()
    node = inv.hostname
    pool = build_slice(inv, node, DRIVER, mig="dynamic", ours=ours)
    names = {d.name for d in pool.devices if d.gpu_index == 2}
    assert "gpu-2-mig-2g12gb-5-0" in names and "gpu-2-mig-2g12gb-5-2" not in names  # under the 2g at 2
    want = [(n, pool.by_name[n].placement) for n in ("gpu-2-mig-1g6gb-14-0", "gpu-2-mig-1g6gb-14-1")]
    ref = ClaimRef("ns1", "c1", "uid-n")
    with pytest.raises(
        ClaimError, match=r"cannot create MIG 1g\.6gb at memory slice 1 of GPU 2.*rolled back"
    ):
        mig.create(ref, want)  # the second creation fails: the first instance goes again

    def layout() -> list[tuple[str, int]]:
        dev = mig.ops.inventory().by_index(2)
        assert dev is not None
        return sorted((m.profile, m.placement_start) for m in dev.mig_instances)

    assert layout() == [("2g.12gb", 2)]
    made = mig.create(ref, want)  # the injected failure was once: now both are made
    assert layout() == [("1g.6gb", 0), ("1g.6gb", 1), ("2g.12gb", 2)]
    assert set(made) == {n for n, _ in want} and all(u.startswith("MIG-") for u in made.values())
    assert mig.destroy(ref) and layout() == [("2g.12gb", 2)]
    assert not mig.destroy(ref)  # nothing left of it


# ------------------------------------------------------------------------- MIG capability device nodes


def fake_caps(root: Path, dev: Path, table: dict[str, int], files: dict[str, int] | None = None) -> None:
    """A fake host: ``/proc/driver/nvidia-caps/mig-minors`` holding ``table``, capability files
    (``gpu2/mig/gi1/access`` -> its minor) and a ``/dev/nvidia-caps`` node for every minor."""
    minors = root / "proc/driver/nvidia-caps/mig-minors"
    minors.parent.mkdir(parents=True, exist_ok=True)
    minors.write_text("config 1\nmonitor 2\n" + "".join(f"{k} {v}\n" for k, v in table.items()))
    for path, n in (files or {}).items():
        f = root / "proc/driver/nvidia/capabilities" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"DeviceFileMinor: {n}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for n in [*table.values(), *(files or {}).values()]:
        (dev / "nvidia-caps" / f"nvidia-cap{n}").touch()


def test_mig_capability_minors_come_from_the_table_else_the_capability_file_and_absence_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpusched.agent.dra.migcaps import MigCaps

    host, dev = tmp_path / "host", tmp_path / "dev"
    caps = MigCaps(host, dev)
    with caplog.at_level("WARNING", logger="gpusched.agent.dra.migcaps"):
        assert caps.device_nodes(0, 1, 0) == [] and caps.device_nodes(2, 3, 0) == []
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no NVIDIA driver on this node" in said[0]  # once, not per device

    fake_caps(
        host, dev, {"gpu0/gi1/access": 21, "gpu0/gi1/ci0/access": 22, "gpu0/gi2/access": 30},
        files={"gpu0/mig/gi2/ci1/access": 33, "gpu0/mig/gi1/access": 99},  # the table wins where it has one
    )  # fmt: skip
    caps = MigCaps(host, dev)

    def node(n: int) -> dict[str, str]:
        return {
            "path": f"/dev/nvidia-caps/nvidia-cap{n}",
            "hostPath": str(dev / f"nvidia-caps/nvidia-cap{n}"),
        }

    assert caps.device_nodes(0, 1, 0) == [node(21), node(22)]
    assert caps.device_nodes(0, 2, 1) == [node(30), node(33)]  # the CI's minor from its capability file
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpusched.agent.dra.migcaps"):
        assert caps.device_nodes(0, 5, 0) == []  # an instance the host tells nothing of
        (dev / "nvidia-caps/nvidia-cap22").unlink()
        assert caps.device_nodes(0, 1, 0) == [node(21)]  # a node not made, no major known: left out, named
    assert any("gi5" in r.getMessage() for r in caplog.records)
    assert any("nvidia-cap22" in r.getMessage() for r in caplog.records)
    (host / "proc/devices").write_text("Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps\n")
    (host / "proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access").parent.mkdir(parents=True)
    (host / "proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access").write_text(
        "DeviceFileMinor: 22\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    )
    # the runtime makes a node the host never made, from its type, numbers and mode (NVIDIA's driver's way)
    assert caps.device_nodes(0, 1, 0) == [
        node(21),
        {"path": "/dev/nvidia-caps/nvidia-cap22", "type": "c", "major": 508, "minor": 22, "fileMode": 256},
    ]


def test_static_and_dynamic_mig_devices_get_their_capability_nodes_in_the_cdi_spec(env: Env) -> None:
    mig = next(m for m in inventory().devices[2].mig_instances if m.uuid == MIG_UUID)
    fake_caps(
        env.root / "host", env.dev,
        {f"gpu2/gi{mig.gi_id}/access": 41, f"gpu2/gi{mig.gi_id}/ci{mig.ci_id}/access": 42},
    )  # fmt: skip
    env.api.claims[("ns1", "c1")] = claim(
        "uid-c", [result("gpu-1", "gpu"), result("gpu-2-mig-1g10gb-0", "g")]
    )
    assert env.prepare(ClaimRef("ns1", "c1", "uid-c")).claims["uid-c"].error == ""
    spec = json.loads((env.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-c.json").read_text())
    nodes = [d["containerEdits"].get("deviceNodes", []) for d in spec["devices"]]
    assert nodes[0] == []  # a whole GPU has no capability node
    assert [n["path"] for n in nodes[1]] == [
        "/dev/nvidia-caps/nvidia-cap41",
        "/dev/nvidia-caps/nvidia-cap42",
    ]
    assert nodes[1][0]["hostPath"] == str(env.dev / "nvidia-caps/nvidia-cap41")

    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    dyn = Env(root, dyn_backend(), mig="dynamic")
    fake_caps(root / "host", dyn.dev, {"gpu1/gi1/access": 51, "gpu1/gi1/ci0/access": 52})
    dyn.node.start()
    try:
        dyn.api.claims[("ns1", "c1")] = claim("uid-d", [result("gpu-1-mig-3g40gb-9-4")])
        assert dyn.prepare(ClaimRef("ns1", "c1", "uid-d")).claims["uid-d"].error == ""
        assert dyn.node.mig is not None
        (made,) = dyn.node.mig.ops.inventory().devices[1].mig_instances
        assert (made.gi_id, made.ci_id) == (1, 0)  # the fake's first instance on the GPU
        spec = json.loads((dyn.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-d.json").read_text())
        paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
        assert paths == ["/dev/nvidia-caps/nvidia-cap51", "/dev/nvidia-caps/nvidia-cap52"]
        checkpoint = json.loads((dyn.config.plugins_dir / DRIVER / "mig-claims.json").read_text())
        assert (checkpoint["claims"]["uid-d"][0]["gi"], checkpoint["claims"]["uid-d"][0]["ci"]) == (1, 0)
    finally:
        dyn.node.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_gpus_device_node_and_capability_paths_use_its_nvml_minor_not_its_index() -> None:
    """NVML numbers GPUs by PCI bus, the driver its device nodes in probe order: GPU 1 here is
    ``/dev/nvidia5`` and GPU 2 (MIG) ``/dev/nvidia4``; stand-ins for the index-named nodes exist too, so
    a spec that named a GPU by its index would take the wrong node."""
    doc = json.loads(json.dumps(DOC))
    doc["gpus"][1]["minor"], doc["gpus"][2]["minor"] = 5, 4
    backend = FakeBackend.from_dict(doc, "t")
    assert [d.device_minor for d in backend.inventory().devices] == [0, 5, 4]
    s = build_slice(backend.inventory(), NODE, DRIVER)
    minors = {d.name: d.attributes["minor"].value for d in s.devices if "minor" in d.attributes}
    assert minors == {"gpu-0": 0, "gpu-1": 5}  # the attribute NVIDIA's driver publishes (GPU 2 is MIG)
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    e = Env(root, backend)
    for n in (1, 2, 4, 5):
        (e.dev / f"nvidia{n}").touch()
    mig = next(m for m in backend.inventory().devices[2].mig_instances if m.uuid == MIG_UUID)
    gi, ci = mig.gi_id, mig.ci_id
    fake_caps(
        root / "host", e.dev,
        {f"gpu2/gi{gi}/access": 61, f"gpu2/gi{gi}/ci{ci}/access": 62,  # the index's: wrong
         f"gpu4/gi{gi}/access": 71, f"gpu4/gi{gi}/ci{ci}/access": 72},
    )  # fmt: skip
    e.node.start()
    try:
        e.api.claims[("ns1", "c1")] = claim(
            "uid-m", [result("gpu-1", "gpu"), result("gpu-2-mig-1g10gb-0", "g")]
        )
        assert e.prepare(ClaimRef("ns1", "c1", "uid-m")).claims["uid-m"].error == ""
        spec = json.loads((e.config.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-m.json").read_text())
        paths = [[n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]]
        assert paths == [
            ["/dev/nvidia5"],
            ["/dev/nvidia4", "/dev/nvidia-caps/nvidia-cap71", "/dev/nvidia-caps/nvidia-cap72"],
        ]
        assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == str(e.dev / "nvidia5")
    finally:
        e.node.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_fake_gpus_minor_is_checked_and_unique() -> None:
    doc = json.loads(json.dumps(DOC))
    doc["gpus"][1]["minor"] = 2  # GPU 2's, by default
    with pytest.raises(FakeConfigError, match="GPU index 2: /dev/nvidia2 is also GPU index 1's"):
        FakeBackend.from_dict(doc, "t")
    doc["gpus"][1]["minor"] = -1
    with pytest.raises(
        FakeConfigError, match=r"gpus\[1\] \(GPU index 1\): field minor must be a non-negative"
    ):
        FakeBackend.from_dict(doc, "t")
    doc["gpus"][1].update(minor=7, count=2)
    with pytest.raises(FakeConfigError, match="field minor names one GPU's device node; it needs count 1"):
        FakeBackend.from_dict(doc, "t")


def _nvidia_slice(gpus: int) -> dict[str, Any]:
    """NVIDIA's driver's slice on NODE: ``gpu-<i>`` with the fake GPUs' UUIDs."""
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": UUIDS[i]}}} for i in range(gpus)]
    return {
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE}, "devices": devices}
    }


def test_a_gpu_handed_to_a_device_plugin_pod_is_tainted_before_allocate_answers(tmp_path: Path) -> None:
    """The event, not the 10 s resync: when the kubelet's Allocate hands a bound pod the GPU of its
    assignment, the DeviceTaintRule of the GPU's device in another driver's slice exists before Allocate
    answers, i.e. before the kubelet can start the container; no list call is made on that path."""
    from gpusched.agent.dra.heldtaints import MemoryTaintRules

    class Counting(MemoryTaintRules):
        lists = 0

        def slices_on_node(self, node: str) -> list[dict[str, Any]]:
            self.lists += 1
            return super().slices_on_node(node)

        def list_rules(self, node: str) -> list[dict[str, Any]]:
            self.lists += 1
            return super().list_rules(node)

    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t")
    pods = MemoryPods([])
    rules = Counting([_nvidia_slice(2)])
    cfg = AgentConfig(node=NODE, plugin_dir=tmp_path / "dp", held_taints_s=3600.0)  # no resync in this test
    agent = Agent(cfg, backend, pods, pods, taint_api=rules)
    agent.sync_held_taints()  # the resync at start: nothing held yet
    assert rules.rules == {}
    pod = _dp_pod("new", assigned=[1], phase="Pending")  # just bound, its container not started
    pod["spec"]["containers"] = [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    pods.pods.append(pod)
    lists = rules.lists
    seen: list[list[str]] = []
    create = rules.create_rule

    def creating(body: Any) -> None:  # the rule is written while Allocate has not answered yet
        assert not seen
        create(body)

    rules.create_rule = creating  # type: ignore[method-assign]
    dev_id = next(i for i, _ in agent.devices.devices("nvidia.com/gpu"))
    resp = agent.plugin.allocator.allocate_container("nvidia.com/gpu", [dev_id])
    seen.append([resp.envs["NVIDIA_VISIBLE_DEVICES"]])
    assert seen == [[UUIDS[1]]]
    assert [r["spec"]["deviceSelector"]["device"] for r in rules.rules.values()] == ["gpu-1"]
    assert rules.lists == lists  # the event path reads nothing
    assert agent.held_taints is not None and agent.held_taints.add([UUIDS[1]]) == []  # known: not again
    pods.pods.clear()  # the pod went: the resync deletes the rule
    agent.sync_held_taints()
    assert rules.rules == {}


def test_a_pod_bound_with_its_assignment_is_tainted_at_the_watch_event_and_a_stale_resync_keeps_it(
    tmp_path: Path,
) -> None:
    """Where a DRA driver publishes the node's GPUs, the agent watches the pods bound to its node: a pod
    bound with a ``gpusched.io/assignment`` gets its GPU's rule at that event, before the kubelet admits
    it (no Allocate yet, no resync); a resync whose pod list was read before that binding does not delete
    the rule; once the pod is gone, the resync does."""
    from gpusched.agent.dra.heldtaints import MemoryTaintRules, held_gpus

    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t")
    pods = MemoryPods([])
    rules = MemoryTaintRules([_nvidia_slice(2)])
    cfg = AgentConfig(node=NODE, plugin_dir=tmp_path / "dp", held_taints_s=3600.0)
    agent = Agent(cfg, backend, pods, pods, taint_api=rules)
    agent.sync_held_taints()  # the resync at start: a DRA driver publishes here, the watch starts
    assert rules.rules == {} and agent.held_taints is not None
    mark = agent.held_taints.mark()  # a resync begins: its pods are read before the binding
    stale = pods.pods_on_node(NODE)
    pods.bind(_dp_pod("new", assigned=[1], phase="Pending"))  # the watch event
    assert [r["spec"]["deviceSelector"]["device"] for r in rules.rules.values()] == ["gpu-1"]
    held = held_gpus(stale, NODE, agent.devices.inventory, {})
    agent.held_taints.sync(held, rules.slices_on_node(NODE), mark)
    assert len(rules.rules) == 1  # the stale pass keeps it
    agent.sync_held_taints()
    assert len(rules.rules) == 1  # held by the pod's assignment
    pods.pods.clear()
    agent.sync_held_taints()
    assert rules.rules == {}
    agent.stop()
    pods.bind(_dp_pod("later", assigned=[0], phase="Pending"))
    assert rules.rules == {}  # the watch stopped with the agent
