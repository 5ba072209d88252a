"""DRA claims allocated by the standalone scheduler on the real control plane (issue 32 item 1).

kwok nodes; the test publishes ResourceSlices shaped like NVIDIA's DRA driver (driver gpu.nvidia.com,
a pool per node, whole GPUs ``gpu-<i>`` with productName/uuid/index and capacity memory) and its
DeviceClasses; kube-controller-manager's resourceclaim controller makes claims from templates. One
standalone scheduler serves the module; each test uses its own nodes (a label its pods select), so
tests never take each other's devices.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"
DRIVER = "gpu.nvidia.com"
A100 = ("NVIDIA A100-SXM4-40GB", "40Gi")
H100 = ("NVIDIA H100 80GB HBM3", "80Gi")


def gpu(i: int, model: tuple[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": model[0]},
            "uuid": {"string": f"GPU-{uuid.uuid4()}"},
            "index": {"int": i},
        },
        "capacity": {"memory": {"value": model[1]}},
    }
    if taints:
        out["taints"] = taints
    return out


class DraEnv:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client
        from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

        self.cp = cp
        self.tag = uuid.uuid4().hex[:6]
        self.ns = f"dra-{self.tag}"
        self.scheduler_name = f"gpusched-dra-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=16)
        self.v1 = client.CoreV1Api(self.api)
        self.res = client.ResourceV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})
        self.gpu_class = f"gpu-{self.tag}.nvidia.com"
        self.mig_class = f"mig-{self.tag}.nvidia.com"
        self.device_class(
            self.gpu_class,
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        )
        self.device_class(
            self.mig_class,
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        )
        self.nodes: list[str] = []
        self.counter_slices: list[str] = []
        self.cluster_objects: list[tuple[str, str]] = []
        self.sched = StandaloneScheduler(
            self.api, SchedulerConfig(scheduler_name=self.scheduler_name)
        ).start()

    # -------------------------------------------------------------------- cluster objects
    def device_class(self, name: str, expression: str) -> None:
        self.res.create_device_class(
            {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
        )

    def node_with_gpus(
        self,
        group: str,
        name: str,
        gpus: list[dict[str, Any]],
        counters: list[dict[str, Any]] = (),  # type: ignore[assignment]
        slice_count: int | None = None,
    ) -> str:
        node = f"dra-{self.tag}-{name}"
        res = {"cpu": "32", "memory": "128Gi", "pods": "110"}
        self.v1.create_node(
            {
                "metadata": {
                    "name": node,
                    "labels": {"type": "kwok", GROUP: group},
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
                "status": {"capacity": res, "allocatable": res},
            },
            _preload_content=False,
        )
        self.nodes.append(node)
        pool = {"name": node, "generation": 1, "resourceSliceCount": slice_count or 1 + len(counters)}
        spec = {"driver": DRIVER, "nodeName": node, "pool": pool}
        self.res.create_resource_slice(
            {"metadata": {"name": f"{node}-{DRIVER}"}, "spec": {**spec, "devices": gpus}}
        )
        if counters:  # a slice of its own, as the API wants sharedCounters
            body = {"metadata": {"name": f"{node}-counters"}, "spec": {**spec, "sharedCounters": counters}}
            self.res.create_resource_slice(body)
            self.counter_slices.append(f"{node}-counters")

        def ready() -> bool:
            n = json.loads(self.v1.read_node(node, _preload_content=False).data)
            conds = n["status"].get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not n["spec"].get(
                "taints"
            )

        wait_until(ready, timeout=120, what=f"kwok node {node} Ready", control_plane=self.cp, interval=0.5)
        return node

    def taint_rule(self, name: str, node: str, device: str) -> None:
        self.res.create_device_taint_rule(
            {
                "metadata": {"name": f"{self.tag}-{name}"},
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": node, "device": device},
                    "taint": {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
                },
            }
        )
        self.cluster_objects.append(("devicetaintrule", f"{self.tag}-{name}"))

    def template(self, name: str, requests: list[dict[str, Any]]) -> None:
        self.res.create_namespaced_resource_claim_template(
            self.ns, {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": requests}}}}
        )

    def claim(self, name: str, requests: list[dict[str, Any]]) -> None:
        self.res.create_namespaced_resource_claim(
            self.ns, {"metadata": {"name": name}, "spec": {"devices": {"requests": requests}}}
        )

    def pod(
        self,
        name: str,
        group: str,
        claims: list[dict[str, str]],
        *,
        scheduler: str = "",
        priority_class: str = "",
        annotations: dict[str, str] | None = None,
        **labels: str,
    ) -> None:
        """A pod with ``claims`` on the nodes of ``group``, for gpusched (or ``scheduler``), of
        ``priority_class``, with ``annotations`` and ``labels``."""
        extra = {"priorityClassName": priority_class} if priority_class else {}
        self.v1.create_namespaced_pod(
            self.ns,
            {
                "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
                "spec": {
                    **extra,
                    "schedulerName": scheduler or self.scheduler_name,
                    "nodeSelector": {GROUP: group},
                    "containers": [
                        {
                            "name": "c",
                            "image": "pause",
                            "resources": {
                                "requests": {"cpu": "100m"},
                                "claims": [{"name": c["name"]} for c in claims],
                            },
                        }
                    ],
                    "resourceClaims": claims,
                },
            },
            _preload_content=False,
        )

    # -------------------------------------------------------------------- reads
    def read_pod(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.v1.read_namespaced_pod(name, self.ns, _preload_content=False).data))

    def bound(self, name: str, timeout: float = 60) -> str:
        return str(
            wait_until(
                lambda: self.read_pod(name)["spec"].get("nodeName"),
                timeout=timeout,
                what=f"pod {name} bound",
                control_plane=self.cp,
            )
        )

    def claim_of(self, pod: str, entry: str) -> dict[str, Any]:
        st = self.read_pod(pod).get("status") or {}
        (name,) = [
            s["resourceClaimName"] for s in st.get("resourceClaimStatuses") or [] if s["name"] == entry
        ]
        return self.read_claim(name)

    def read_claim(self, name: str) -> dict[str, Any]:
        return dict(
            json.loads(self.res.read_namespaced_resource_claim(name, self.ns, _preload_content=False).data)
        )

    def failure(
        self, pod: str, reason: str = "FailedScheduling", timeout: float = 30, contains: str = ""
    ) -> str:
        def find() -> str | None:
            resp = self.v1.list_namespaced_event(
                self.ns, field_selector=f"involvedObject.name={pod},reason={reason}", _preload_content=False
            )
            msgs = [e["message"] for e in json.loads(resp.data)["items"] if contains in e["message"]]
            return msgs[-1] if msgs else None

        return str(
            wait_until(
                find,
                timeout=timeout,
                what=f"a {reason} event of {pod} with {contains!r}",
                control_plane=self.cp,
            )
        )

    def devices_held(self) -> list[tuple[str, str]]:
        """(pool, device) of every allocated result of this namespace's claims, from the API."""
        resp = self.res.list_namespaced_resource_claim(self.ns, _preload_content=False)
        out = []
        for c in json.loads(resp.data)["items"]:
            alloc = (c.get("status") or {}).get("allocation")
            for r in (alloc or {}).get("devices", {}).get("results", []):
                out.append((r["pool"], r["device"]))
        return out

    def cleanup(self) -> None:
        self.sched.stop()
        self.v1.delete_namespace(self.ns, _preload_content=False)
        with ThreadPoolExecutor(4) as ex:
            for n in self.nodes:
                ex.submit(self.v1.delete_node, n, _preload_content=False)
                ex.submit(self.res.delete_resource_slice, f"{n}-{DRIVER}", _preload_content=False)
            for name in self.counter_slices:
                ex.submit(self.res.delete_resource_slice, name, _preload_content=False)
            for c in (self.gpu_class, self.mig_class):
                ex.submit(self.res.delete_device_class, c, _preload_content=False)
            for _, name in self.cluster_objects:
                ex.submit(self.res.delete_device_taint_rule, name, _preload_content=False)


@pytest.fixture(scope="module")
def dra(control_plane: ControlPlane) -> Iterator[DraEnv]:
    env = DraEnv(control_plane)
    try:
        yield env
    finally:
        env.cleanup()


def exactly(cls: str, count: int = 1, selectors: list[str] = (), **extra: Any) -> dict[str, Any]:  # type: ignore[assignment]
    out: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if selectors:
        out["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return out


def test_whole_gpu_claims_from_a_template_each_get_their_own_device(dra: DraEnv) -> None:
    group = f"whole-{dra.tag}"
    node = dra.node_with_gpus(group, "whole", [gpu(0, A100), gpu(1, A100)])
    dra.template(
        "a100",
        [
            {
                "name": "gpu",
                "exactly": exactly(
                    dra.gpu_class,
                    selectors=[
                        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-40GB'",
                        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
                    ],
                ),
            }
        ],
    )
    names = [f"whole-{i}" for i in range(3)]
    for name in names:
        dra.pod(name, group, [{"name": "gpu", "resourceClaimTemplateName": "a100"}])

    # Which two get the GPUs is not the creation order: kube-controller-manager makes and records each
    # pod's claim in its own time (several workers), and a pod is decided once its claim is seen (the
    # claims and the pods come by two watches), as with kube-scheduler
    def two_bound() -> list[str] | None:
        placed = [n for n in names if dra.read_pod(n)["spec"].get("nodeName")]
        return placed if len(placed) >= 2 else None

    placed = wait_until(two_bound, timeout=60, what="two of the three pods bound", control_plane=dra.cp)
    assert len(placed) == 2, f"three pods bound on two GPUs: {placed}"
    (waiting,) = set(names) - set(placed)
    got = set()
    for name in placed:
        assert dra.read_pod(name)["spec"]["nodeName"] == node
        claim = dra.claim_of(name, "gpu")
        alloc = claim["status"]["allocation"]
        (result,) = alloc["devices"]["results"]
        assert (result["request"], result["driver"], result["pool"]) == ("gpu", DRIVER, node)
        got.add(result["device"])
        assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        pod = dra.read_pod(name)
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}
        ]
        assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
    assert got == {"gpu-0", "gpu-1"}
    msg = dra.failure(waiting, contains="cannot allocate all claims")
    assert node in msg or "1 cannot allocate" in msg
    assert not dra.read_pod(waiting)["spec"].get("nodeName")
    assert not (dra.claim_of(waiting, "gpu").get("status") or {}).get("allocation")
    # a pod leaves: the resourceclaim controller deletes its claim; the waiting pod gets the GPU
    dra.v1.delete_namespaced_pod(placed[0], dra.ns, grace_period_seconds=0, _preload_content=False)
    assert dra.bound(waiting, timeout=90) == node
    held = dra.devices_held()
    assert sorted(held) == sorted(set(held)), f"a device allocated twice: {held}"


def test_first_available_falls_back_to_a_whole_gpu(dra: DraEnv) -> None:
    group = f"fallback-{dra.tag}"
    node = dra.node_with_gpus(group, "fallback", [gpu(0, H100)])
    dra.claim(
        "mig-or-full",
        [
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "mig", "deviceClassName": dra.mig_class},
                    {"name": "full", "deviceClassName": dra.gpu_class},
                ],
            }
        ],
    )
    dra.pod("fallback", group, [{"name": "gpu", "resourceClaimName": "mig-or-full"}])
    assert dra.bound("fallback") == node
    (result,) = dra.read_claim("mig-or-full")["status"]["allocation"]["devices"]["results"]
    assert (result["request"], result["device"]) == ("gpu/full", "gpu-0")


def test_a_tainted_device_is_avoided_unless_tolerated(dra: DraEnv) -> None:
    group = f"taint-{dra.tag}"
    sick = [{"key": "gpu.nvidia.com/gpu-lost", "value": "true", "effect": "NoSchedule"}]
    node = dra.node_with_gpus(group, "taint", [gpu(0, A100, taints=sick), gpu(1, A100), gpu(2, A100)])
    dra.taint_rule("xid", node, "gpu-2")  # a DeviceTaintRule taints gpu-2
    dra.claim("healthy", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
    dra.pod("healthy", group, [{"name": "gpu", "resourceClaimName": "healthy"}])
    assert dra.bound("healthy") == node
    (result,) = dra.read_claim("healthy")["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-1"
    dra.claim("another", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
    dra.pod("another", group, [{"name": "gpu", "resourceClaimName": "another"}])
    dra.failure("another", contains="cannot allocate all claims")
    assert not dra.read_pod("another")["spec"].get("nodeName")
    tolerate = [{"key": "gpu.nvidia.com/gpu-lost", "operator": "Exists", "effect": "NoSchedule"}]
    dra.claim("tolerant", [{"name": "gpu", "exactly": exactly(dra.gpu_class, tolerations=tolerate)}])
    dra.pod("tolerant", group, [{"name": "gpu", "resourceClaimName": "tolerant"}])
    assert dra.bound("tolerant") == node
    (result,) = dra.read_claim("tolerant")["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0"


@pytest.mark.parametrize(
    ("case", "request_", "expected"),
    [
        # the apiserver refuses a selector that does not compile; one that fails at run time gets here
        ("cel", {"selectors": ["device.attributes['gpu.nvidia.com'].noSuch == 'x'"]}, "CEL runtime error"),
        ("class", {"cls": "no-such-class.nvidia.com"}, "unknown device class no-such-class.nvidia.com"),
        ("big", {"count": 9}, "cannot allocate all claims"),
    ],
)
def test_bad_claims_are_named_in_an_event_and_nothing_is_bound(
    dra: DraEnv, case: str, request_: dict[str, Any], expected: str
) -> None:
    group = f"bad-{case}-{dra.tag}"
    dra.node_with_gpus(group, f"bad-{case}", [gpu(0, A100), gpu(1, A100)])
    cls = request_.pop("cls", dra.gpu_class)
    dra.claim(f"bad-{case}", [{"name": "gpu", "exactly": exactly(cls, **request_)}])
    dra.pod(f"bad-{case}", group, [{"name": "gpu", "resourceClaimName": f"bad-{case}"}])
    msg = dra.failure(f"bad-{case}", contains=expected)
    assert (f"{dra.ns}/bad-{case}" in msg and "request gpu" in msg) or case == "big", msg
    assert not dra.read_pod(f"bad-{case}")["spec"].get("nodeName")
    assert not (dra.read_claim(f"bad-{case}").get("status") or {}).get("allocation")


def _counters(start: int, size: int, sm: int) -> dict[str, Any]:
    out: dict[str, Any] = {f"memory-slice-{k}": {"value": "1"} for k in range(start, start + size)}
    out["multiprocessors"] = {"value": str(sm)}
    return out


def test_dynamic_mig_placements_share_a_gpu_through_its_counters(dra: DraEnv) -> None:
    """NVIDIA's dynamic-MIG shape: a counter set per GPU, the full GPU and every placement consuming
    it. Two 3g.20gb and a 1g.5gb fit one A100 together; then the full GPU does not."""
    group = f"mig-{dra.tag}"
    cset = "gpu-0-counter-set"
    devices = [
        {
            "name": "gpu-0",
            "attributes": {"type": {"string": "gpu"}, "index": {"int": 0}},
            "consumesCounters": [{"counterSet": cset, "counters": _counters(0, 8, 98)}],
        }
    ]
    for profile, size, starts in (("1g.5gb", 1, range(7)), ("3g.20gb", 3, (0, 4))):
        for start in starts:
            devices.append(
                {
                    "name": f"gpu-0-mig-{profile.replace('.', '')}-{start}",
                    "attributes": {
                        "type": {"string": "mig"},
                        "profile": {"string": profile},
                        "index": {"int": 0},
                    },
                    "consumesCounters": [{"counterSet": cset, "counters": _counters(start, size, 14 * size)}],
                }
            )
    node = dra.node_with_gpus(
        group, "mig", devices, counters=[{"name": cset, "counters": _counters(0, 8, 98)}]
    )

    def mig(profile: str) -> list[dict[str, Any]]:
        sel = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
        return [{"name": "gpu", "exactly": exactly(dra.mig_class, selectors=[sel])}]

    got = []
    for name, requests in (("big-a", mig("3g.20gb")), ("big-b", mig("3g.20gb")), ("small", mig("1g.5gb"))):
        dra.claim(f"mig-{name}", requests)
        dra.pod(f"mig-{name}", group, [{"name": "gpu", "resourceClaimName": f"mig-{name}"}])
        assert dra.bound(f"mig-{name}") == node  # one after the other: each sees the last one's counters
        (result,) = dra.read_claim(f"mig-{name}")["status"]["allocation"]["devices"]["results"]
        got.append(result["device"])
    assert got == ["gpu-0-mig-3g20gb-0", "gpu-0-mig-3g20gb-4", "gpu-0-mig-1g5gb-3"]
    dra.claim("mig-full", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
    dra.pod("mig-full", group, [{"name": "gpu", "resourceClaimName": "mig-full"}])
    dra.failure("mig-full", contains="cannot allocate all claims")
    assert not dra.read_pod("mig-full")["spec"].get("nodeName")


def test_consumable_capacity_shares_never_exceed_the_device(dra: DraEnv) -> None:
    """HAMi's shape: one GPU that allows multiple allocations, memory as consumable capacity. Two 15Gi
    shares fit a 40Gi GPU, each with a shareID and its consumedCapacity; a third does not."""
    group = f"share-{dra.tag}"
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
    shareable = gpu(0, A100)
    shareable["allowMultipleAllocations"] = True
    shareable["capacity"]["memory"]["requestPolicy"] = policy
    node = dra.node_with_gpus(group, "share", [shareable])
    request = [{"name": "gpu", "exactly": exactly(dra.gpu_class, capacity={"requests": {"memory": "15Gi"}})}]
    shares = set()
    for name in ("share-a", "share-b"):
        dra.claim(name, request)
        dra.pod(name, group, [{"name": "gpu", "resourceClaimName": name}])
        assert dra.bound(name) == node
        (result,) = dra.read_claim(name)["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0" and result["consumedCapacity"] == {"memory": "15Gi"}
        shares.add(result["shareID"])
    assert len(shares) == 2
    dra.claim("share-c", request)
    dra.pod("share-c", group, [{"name": "gpu", "resourceClaimName": "share-c"}])
    dra.failure("share-c", contains="cannot allocate all claims")
    assert not dra.read_pod("share-c")["spec"].get("nodeName")


def test_a_gpu_kube_scheduler_gave_to_a_claim_is_not_given_to_a_device_plugin_pod(dra: DraEnv) -> None:
    """A mixed node (docs/dra.md, Mixed nodes): gpusched's agent serves its two GPUs as nvidia.com/gpu
    (UUIDs in gpusched.io/gpu-topology) and a DRA driver publishes the same GPUs in a ResourceSlice.
    A claim allocated by another allocator (written here, as kube-scheduler would) holds gpu-0: the
    device-plugin pod gets GPU 1, and a second one waits."""
    group = f"mixed-{dra.tag}"
    node = f"dra-{dra.tag}-mixed"
    uuids = [f"GPU-{uuid.uuid4()}" for _ in range(2)]
    topo = {"gpus": [{"index": i, "uuid": u, "numa": None, "nvlink": []} for i, u in enumerate(uuids)]}
    res = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2"}
    labels = {
        "type": "kwok",
        GROUP: group,
        "nvidia.com/gpu.product": "A100",
        "nvidia.com/gpu.memory": "40960",
    }
    ann = {"node.alpha.kubernetes.io/ttl": "0", "gpusched.io/gpu-topology": json.dumps(topo)}
    dra.v1.create_node(
        {
            "metadata": {"name": node, "labels": labels, "annotations": ann},
            "status": {"capacity": res, "allocatable": res},
        },
        _preload_content=False,
    )
    dra.nodes.append(node)
    devices = [gpu(i, A100) for i in range(2)]
    for d, u in zip(devices, uuids, strict=True):
        d["attributes"]["uuid"] = {"string": u}
    pool = {"name": node, "generation": 1, "resourceSliceCount": 1}
    dra.res.create_resource_slice(
        {
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices},
        }
    )
    dra.claim("held-by-kube-scheduler", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
    c = dra.read_claim("held-by-kube-scheduler")
    c["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    dra.res.replace_namespaced_resource_claim_status("held-by-kube-scheduler", dra.ns, c)

    def claimed() -> frozenset[int] | None:
        with dra.sched.cluster.live_books() as snap:
            i = snap.index.get(node)
            return snap.nodes[i].claimed_gpus if i is not None and snap.nodes[i].claimed_gpus else None

    assert wait_until(claimed, timeout=30, what="gpu-0 booked as claimed", control_plane=dra.cp) == {0}

    def gpu_pod(name: str) -> None:
        dra.v1.create_namespaced_pod(
            dra.ns,
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": dra.scheduler_name,
                    "nodeSelector": {GROUP: group},
                    "containers": [
                        {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                },
            },
            _preload_content=False,
        )

    from gpusched.k8s.convert import parse_assignment

    gpu_pod("dp-1")
    assert dra.bound("dp-1") == node
    assert parse_assignment(dra.read_pod("dp-1")) == (node, (1,))
    gpu_pod("dp-2")
    assert "1 Insufficient GPU" in dra.failure("dp-2")
    assert not dra.read_pod("dp-2")["spec"].get("nodeName")


def _mig_devices(cset: str, consumed_set: str, full_sm: int) -> list[dict[str, Any]]:
    """A GPU in NVIDIA's dynamic-MIG shape (the full GPU and its 1g.5gb placements) consuming
    ``consumed_set``, the full GPU ``full_sm`` multiprocessors."""
    devices = [
        {
            "name": "gpu-0",
            "attributes": {"type": {"string": "gpu"}, "index": {"int": 0}},
            "consumesCounters": [{"counterSet": consumed_set, "counters": _counters(0, 8, full_sm)}],
        }
    ]
    for start in range(7):
        devices.append(
            {
                "name": f"gpu-0-mig-1g5gb-{start}",
                "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.5gb"}},
                "consumesCounters": [{"counterSet": consumed_set, "counters": _counters(start, 1, 14)}],
            }
        )
    return devices


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("incomplete", "spec.pool.resourceSliceCount"),
        ("unknown-set", "consumesCounters[0].counterSet"),
        ("overdrawn", "consumesCounters[0].counters.multiprocessors"),
    ],
)
def test_bad_slices_are_named_in_an_event_nothing_is_bound_and_kube_scheduler_agrees(
    dra: DraEnv, case: str, expected: str
) -> None:
    """An incomplete pool (resourceSliceCount 2, one slice published) is not used, as kube-scheduler
    does not use it, until its second slice appears; a slice that lies about counters (a device
    consuming a counter set no slice declares, or more of a counter than its set declares) is never
    allocated. Each gets a FailedScheduling event naming the field, nothing is bound or allocated, and
    kube-scheduler, given a twin pod and claim on the same node, binds nothing either."""
    group = f"badslice-{case}-{dra.tag}"
    cset = "gpu-0-counter-set"
    declared = [{"name": cset, "counters": _counters(0, 8, 98)}]
    cls = dra.gpu_class
    if case == "incomplete":
        node = dra.node_with_gpus(group, f"bs-{case}", [gpu(0, A100)], slice_count=2)
    elif case == "unknown-set":
        devices = _mig_devices(cset, "gpu-9-counter-set", 98)
        node = dra.node_with_gpus(group, f"bs-{case}", devices, counters=declared)
        cls = dra.mig_class
    else:
        node = dra.node_with_gpus(group, f"bs-{case}", _mig_devices(cset, cset, 200), counters=declared)
    for who, scheduler in (("ours", ""), ("theirs", "default-scheduler")):
        dra.claim(f"bs-{case}-{who}", [{"name": "gpu", "exactly": exactly(cls)}])
        dra.pod(
            f"bs-{case}-{who}",
            group,
            [{"name": "gpu", "resourceClaimName": f"bs-{case}-{who}"}],
            scheduler=scheduler,
        )
    msg = dra.failure(f"bs-{case}-ours", contains=expected)
    theirs = dra.failure(f"bs-{case}-theirs")
    print(f"{case}: gpusched: {msg}\n{case}: kube-scheduler: {theirs}")
    for who in ("ours", "theirs"):
        assert not dra.read_pod(f"bs-{case}-{who}")["spec"].get("nodeName"), who
        assert not (dra.read_claim(f"bs-{case}-{who}").get("status") or {}).get("allocation"), who
    held = [d for pool, d in dra.devices_held() if pool == node]
    assert held == [], held
    if case != "incomplete":
        return
    # the pool's second slice appears: the pool is used (kube-scheduler's twin is deleted first: two
    # schedulers allocating one node's devices at once could give a device twice, kubernetes#128980)
    dra.v1.delete_namespaced_pod(f"bs-{case}-theirs", dra.ns, grace_period_seconds=0, _preload_content=False)
    spec = {
        "driver": DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 2},
    }
    dra.res.create_resource_slice(
        {"metadata": {"name": f"{node}-second"}, "spec": {**spec, "devices": [gpu(1, A100)]}}
    )
    dra.counter_slices.append(f"{node}-second")
    assert dra.bound(f"bs-{case}-ours") == node
    held = [d for pool, d in dra.devices_held() if pool == node]
    assert held == ["gpu-0"], held
