"""The differential test of issue 32: generated ResourceSlices and ResourceClaims, each on a kwok node of
its own; kube-scheduler (the real one of the control plane) schedules a pod with the claim, and gpusched's
allocator (the adapter's conversion, then ``core.dra``, as the DynamicResources plugin runs it) answers on
the same objects. Where one says "fits" the other must too, and the other way round; where both fit, the
devices must be the same (both take the first solution in device order). The scored allocator (``SCORED``,
the standalone scheduler's) must give the same outcome (fits, does not fit, error); its devices may differ.

Cases are drawn from a fixed seed: whole GPUs shaped like NVIDIA's driver (productName, index, memory),
some tainted; claims of one or two requests (ExactCount 1-3 or All, CEL selectors on product and memory,
tolerations, firstAvailable) and matchAttribute / distinctAttribute constraints.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpusched.core.dra.allocator import Allocator, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import Node
from gpusched.core.dra.score import FIRST_FIT, SCORED, SearchBudget
from gpusched.core.dra.selector import DraError
from gpusched.k8s.dra.convert import claim_from_k8s, device_class_from_k8s, slice_from_k8s
from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

CASES = int(os.environ.get("GPUSCHED_DRA_DIFF_CASES", "60"))  # 60 in CI (about 30 s with the control plane)
SEED = 32
DRIVER = "gpu.nvidia.com"
PRODUCTS = {"NVIDIA A100-SXM4-40GB": "40Gi", "NVIDIA H100 80GB HBM3": "80Gi", "NVIDIA L4": "24Gi"}
TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
SELECTORS = [
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",
    "device.attributes['gpu.nvidia.com'].productName != 'NVIDIA L4'",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    "device.attributes['gpu.nvidia.com'].index % 2 == 0",
]


def draw_devices(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(rng.randint(1, 5)):
        product = rng.choice(sorted(PRODUCTS))
        dev: dict[str, Any] = {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": product},
                "index": {"int": i},
                "uuid": {"string": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}"},
            },
            "capacity": {"memory": {"value": PRODUCTS[product]}},
        }
        if rng.random() < 0.15:
            dev["taints"] = [TAINT]
        out.append(dev)
    return out


def draw_exact(rng: random.Random, cls: str) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceClassName": cls}
    if rng.random() < 0.12:
        out["allocationMode"] = "All"
    else:
        out["count"] = rng.choice([1, 1, 1, 2, 2, 3])
    if rng.random() < 0.5:
        out["selectors"] = [{"cel": {"expression": rng.choice(SELECTORS)}}]
    if rng.random() < 0.2:
        out["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
    return out


def draw_whole(rng: random.Random, cls: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return [{"devices": draw_devices(rng)}], draw_claim(rng, cls)


# Dynamic MIG as NVIDIA's driver publishes it (A100 40GB): a counter set per GPU, the full GPU consuming
# all of it, every legal placement of each profile consuming its share and its memory slices.
MIG = {
    "1g.5gb": (1, [0, 1, 2, 3, 4, 5, 6]),
    "2g.10gb": (2, [0, 2, 4]),
    "3g.20gb": (3, [0, 4]),
    "7g.40gb": (8, [0]),
}


def _mig_counters(start: int, size: int, sm: int) -> dict[str, Any]:
    counters = {f"memory-slice-{k}": {"value": "1"} for k in range(start, start + size)}
    counters["multiprocessors"] = {"value": str(sm)}
    return counters


def draw_mig(rng: random.Random, cls: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    sets, devices = [], []
    for g in range(rng.randint(1, 2)):
        cset = f"gpu-{g}-counter-set"
        sets.append({"name": cset, "counters": _mig_counters(0, 8, 98)})
        full = {"name": f"gpu-{g}", "attributes": {"type": {"string": "gpu"}, "index": {"int": g}}}
        full["consumesCounters"] = [{"counterSet": cset, "counters": _mig_counters(0, 8, 98)}]
        devices.append(full)
        for profile, (size, starts) in MIG.items():
            for start in starts:
                sm = 98 if profile == "7g.40gb" else 14 * size
                devices.append(
                    {
                        "name": f"gpu-{g}-mig-{profile.replace('.', '')}-{start}",
                        "attributes": {
                            "type": {"string": "mig"},
                            "profile": {"string": profile},
                            "index": {"int": g},
                        },
                        "consumesCounters": [
                            {"counterSet": cset, "counters": _mig_counters(start, size, sm)}
                        ],
                    }
                )
    requests = []
    for r in range(rng.choice([1, 1, 2, 3])):
        profile = rng.choice([*MIG, "gpu"])
        if profile == "gpu":
            expr = "device.attributes['gpu.nvidia.com'].type == 'gpu'"
        else:  # NVIDIA's mig class checks the type first; unguarded, the full GPU fails to evaluate
            expr = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
            if rng.random() < 0.7:
                expr = f"device.attributes['gpu.nvidia.com'].type == 'mig' && {expr}"
        exact = {
            "deviceClassName": cls,
            "count": rng.choice([1, 1, 2, 3]),
            "selectors": [{"cel": {"expression": expr}}],
        }
        if rng.random() < 0.2:
            fallback = {"deviceClassName": cls, "count": 1}
            requests.append(
                {"name": f"r{r}", "firstAvailable": [{"name": "a", **exact}, {"name": "b", **fallback}]}
            )
        else:
            requests.append({"name": f"r{r}", "exactly": exact})
    devices_spec: dict[str, Any] = {"requests": requests}
    if rng.random() < 0.2:
        devices_spec["constraints"] = [{"matchAttribute": f"{DRIVER}/index"}]
    return [{"sharedCounters": sets}, {"devices": devices}], {"devices": devices_spec}


def draw_shares(rng: random.Random, cls: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """HAMi-like shares: devices that allow multiple allocations, memory and cores as consumable capacity."""
    devices = []
    for i in range(rng.randint(1, 3)):
        policy_mem = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
        policy_cores = {"default": "10", "validRange": {"min": "1", "max": "100", "step": "1"}}
        devices.append(
            {
                "name": f"gpu-{i}",
                "allowMultipleAllocations": True,
                "attributes": {"type": {"string": "gpu"}, "index": {"int": i}},
                "capacity": {
                    "memory": {"value": "40Gi", "requestPolicy": policy_mem},
                    "cores": {"value": "100", "requestPolicy": policy_cores},
                },
            }
        )
    requests = []
    for r in range(rng.choice([1, 2, 3, 4])):
        wanted = {"memory": f"{rng.choice([5, 10, 15, 20, 30])}Gi"}
        if rng.random() < 0.7:
            wanted["cores"] = str(rng.choice([10, 25, 50, 75]))
        requests.append(
            {"name": f"r{r}", "exactly": {"deviceClassName": cls, "capacity": {"requests": wanted}}}
        )
    devices_spec: dict[str, Any] = {"requests": requests}
    if rng.random() < 0.25:
        devices_spec["constraints"] = [
            {rng.choice(["matchAttribute", "distinctAttribute"]): f"{DRIVER}/index"}
        ]
    return [{"devices": devices}], {"devices": devices_spec}


def draw_claim(rng: random.Random, cls: str) -> dict[str, Any]:
    requests = []
    for r in range(rng.choice([1, 1, 2])):
        if rng.random() < 0.2:
            subs = [{"name": f"s{k}", **draw_exact(rng, cls)} for k in range(2)]
            requests.append({"name": f"r{r}", "firstAvailable": subs})
        else:
            requests.append({"name": f"r{r}", "exactly": draw_exact(rng, cls)})
    devices: dict[str, Any] = {"requests": requests}
    if rng.random() < 0.25:
        kind = rng.choice(["matchAttribute", "distinctAttribute"])
        devices["constraints"] = [{kind: f"{DRIVER}/productName"}]
    return {"devices": devices}


FITS, NO_FIT, ERROR = "fits", "does not fit", "error"
SAID = {"Unschedulable": NO_FIT, "SchedulerError": ERROR}


class Differential:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:6]
        self.ns = f"dradiff-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=16)
        self.v1 = client.CoreV1Api(self.api)
        self.res = client.ResourceV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})
        self.cls = {
            "metadata": {"name": f"gpu-{self.tag}.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        }
        self.res.create_device_class(self.cls)
        self.nodes: list[str] = []
        self.slices: list[str] = []
        self.messages: dict[int, str] = {}  # kube-scheduler's reason per case it refused

    def publish(
        self, i: int, slices: list[dict[str, Any]], claim_spec: dict[str, Any]
    ) -> tuple[list[Any], Any, str]:
        """A kwok node, its pool of ``slices`` (devices and/or sharedCounters each) and claim ``c<i>``;
        the objects as the API stored them (what any scheduler reads)."""
        node = f"dradiff-{self.tag}-{i}"
        res = {"cpu": "8", "memory": "32Gi", "pods": "110"}
        labels = {
            "type": "kwok",
            "gpusched.io/e2e-group": f"dradiff-{self.tag}",
            "kubernetes.io/hostname": node,
        }
        meta = {"name": node, "labels": labels, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}
        self.v1.create_node({"metadata": meta, "status": {"capacity": res, "allocatable": res}})
        self.nodes.append(node)
        pool = {"name": node, "generation": 1, "resourceSliceCount": len(slices)}
        stored = []
        for k, part in enumerate(slices):
            body = {
                "metadata": {"name": f"{node}-{k}"},
                "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, **part},
            }
            stored.append(json.loads(self.res.create_resource_slice(body, _preload_content=False).data))
            self.slices.append(f"{node}-{k}")
        claim_obj = {"metadata": {"name": f"c{i}", "namespace": self.ns}, "spec": claim_spec}
        claim_obj = json.loads(
            self.res.create_namespaced_resource_claim(self.ns, claim_obj, _preload_content=False).data
        )
        return stored, claim_obj, node

    def start_pod(self, i: int, node: str) -> None:
        self.v1.create_namespaced_pod(
            self.ns,
            {
                "metadata": {"name": f"p{i}"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}],
                    "resourceClaims": [{"name": "c", "resourceClaimName": f"c{i}"}],
                },
            },
            _preload_content=False,
        )

    def kube_scheduler_says(self, i: int) -> tuple[str, list[tuple[str, str]]] | None:
        """("fits", [(request, device)]), ("does not fit", []) or ("error", []) once kube-scheduler
        has decided pod ``i`` (bound, Unschedulable, SchedulerError); None before."""
        pod = json.loads(self.v1.read_namespaced_pod(f"p{i}", self.ns, _preload_content=False).data)
        if pod["spec"].get("nodeName"):
            claim = json.loads(
                self.res.read_namespaced_resource_claim(f"c{i}", self.ns, _preload_content=False).data
            )
            results = claim["status"]["allocation"]["devices"]["results"]
            return FITS, sorted((r["request"], r["device"]) for r in results)
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") in SAID:
                self.messages[i] = c.get("message", "")
                return SAID[c["reason"]], []
        return None

    def cleanup(self) -> None:
        self.v1.delete_namespace(self.ns, _preload_content=False)
        with ThreadPoolExecutor(4) as ex:
            for n in self.nodes:
                ex.submit(self.v1.delete_node, n, _preload_content=False)
            for name in self.slices:
                ex.submit(self.res.delete_resource_slice, name, _preload_content=False)
        self.res.delete_device_class(self.cls["metadata"]["name"], _preload_content=False)


@pytest.fixture
def diff(control_plane: ControlPlane) -> Iterator[Differential]:
    d = Differential(control_plane)
    try:
        yield d
    finally:
        d.cleanup()


def ours(
    cls_obj: Any, slices: list[Any], claim_obj: Any, node: str, budget: SearchBudget = FIRST_FIT
) -> tuple[str, list[tuple[str, str]]]:
    """gpusched's answer: first-fit (kube-scheduler's devices), or with ``budget`` the scored choice."""
    cls = device_class_from_k8s(cls_obj)
    try:
        out = Allocator(
            {cls.name: cls}, [slice_from_k8s(s) for s in slices], CelCompiler(), budget=budget
        ).allocate(Node(node, {"kubernetes.io/hostname": node}), [claim_from_k8s(claim_obj)])
    except DraError:
        return ERROR, []
    if isinstance(out, Fits):
        return FITS, sorted((r.request, r.device) for r in out.allocations[0].results)
    return NO_FIT, []


@pytest.mark.parametrize("shape", ["whole", "mig", "shares"])
def test_kube_scheduler_and_gpusched_agree_on_generated_claims(diff: Differential, shape: str) -> None:
    rng = random.Random(SEED)
    cls_name = diff.cls["metadata"]["name"]
    draw = {"whole": draw_whole, "mig": draw_mig, "shares": draw_shares}[shape]
    published = {}
    for i in range(CASES):
        slices, claim_spec = draw(rng, cls_name)
        published[i] = diff.publish(i, slices, claim_spec)

    def nodes_ready() -> bool:
        items = json.loads(
            diff.v1.list_node(
                label_selector=f"gpusched.io/e2e-group=dradiff-{diff.tag}", _preload_content=False
            ).data
        )["items"]
        return len(items) == CASES and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
            and not n["spec"].get("taints")
            for n in items
        )

    wait_until(
        nodes_ready, timeout=120, what="the differential test's kwok nodes Ready", control_plane=diff.cp
    )
    for i, (_, _, node) in published.items():
        diff.start_pod(i, node)
    theirs: dict[int, tuple[str, list[tuple[str, str]]]] = {}

    def all_decided() -> bool:
        for i in range(CASES):
            if i not in theirs and (said := diff.kube_scheduler_says(i)) is not None:
                theirs[i] = said
        return len(theirs) == CASES

    wait_until(
        all_decided,
        timeout=180,
        what="kube-scheduler's decision on every case",
        control_plane=diff.cp,
        interval=1,
    )
    disagree = []
    for i, (slices, claim_obj, node) in published.items():
        mine = ours(diff.cls, slices, claim_obj, node)
        scored = ours(diff.cls, slices, claim_obj, node, SCORED)  # the scheduler's choice: same outcome
        if mine != theirs[i] or scored[0] != theirs[i][0]:
            names = [d["name"] for sl in slices for d in sl["spec"].get("devices") or []]
            disagree.append((i, mine, scored, theirs[i], diff.messages.get(i), claim_obj["spec"], names))
    said = Counter(o for o, _ in theirs.values())
    print(f"differential {shape}: {CASES} cases, kube-scheduler {dict(said)}, {len(disagree)} disagree")
    assert not disagree, "\n".join(map(repr, disagree))
    assert said[FITS] and said[NO_FIT]  # both outcomes are exercised
