"""A small populated cluster with one pending pod per fault doctor names: for the GPU map's
screenshot, the docs and the tests (``demo_snapshot``)."""

from __future__ import annotations

import json

from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.mig.geometry import Geometry, MigGpu
from gpusched.core.model import GPU_MILLI, Controller, NodeSpec, PodSpec, Taint
from gpusched.doctor.checks import ANN_ALLOCATED, ANN_TOPOLOGY
from gpusched.doctor.snapshot import Snapshot, snapshot_of_state

_MIB = {"A100": 40_960, "T4": 15_360, "H100": 81_920}


def _node(name: str, gpus: int, model: str, **kw: object) -> NodeSpec:
    return NodeSpec(name, 64_000, 512 * 1024, gpus, model, _MIB[model], **kw)  # type: ignore[arg-type]


def _share(name: str, milli: int, mem: int = 0) -> PodSpec:
    owner = Controller("ReplicaSet", name.rsplit("-", 1)[0], "apps")
    return PodSpec(
        name,
        namespace="team-a",
        cpu_milli=1000,
        num_gpu=1,
        gpu_milli=milli,
        gpu_memory_mib=mem,
        controller=owner,
    )


def _whole(name: str, n: int = 1) -> PodSpec:
    owner = Controller("Job", name, "batch")
    return PodSpec(name, namespace="team-b", cpu_milli=4000, num_gpu=n, gpu_milli=GPU_MILLI, controller=owner)


def demo_snapshot() -> Snapshot:
    """12 nodes (A100, T4, H100), most GPUs held, and pending pods for: a missing toleration, a
    GPU model no node has, more GPU memory than any GPU has, fragmentation that moves fix, a
    failed GPU; and one running pod whose device plugin allocation drifted from its assignment."""
    nodes = [_node(f"a100-{i}", 4, "A100") for i in range(4)]
    nodes += [_node(f"t4-{i}", 4, "T4") for i in range(4)]
    nodes += [_node("h100-0", 8, "H100", taints=(Taint("dedicated", "training"),))]
    nodes += [_node("h100-1", 8, "H100", taints=(Taint("dedicated", "training"),))]
    nodes += [_node("a100-4", 2, "A100", unhealthy_gpus=frozenset({1}))]
    nodes += [_node("a100-5", 2, "A100")]
    st = ClusterState(nodes)
    k = 0
    for i in range(4):  # A100 nodes: each GPU half held by a share: fragmentation
        for g in range(4):
            st.assume(_share(f"infer-{k}", 500 if g % 2 else 600, 8192), i, [g])
            k += 1
    for i in range(4, 8):  # T4 nodes: whole GPUs, one free on each
        for g in range(3):
            st.assume(_whole(f"train-{k}"), i, [g])
            k += 1
    st.assume(_whole("llm-0", 8), 8, list(range(8)))
    st.assume(_whole("llm-1", 4), 9, [0, 1, 2, 3])
    st.assume(_whole("batch-0"), 10, [0])
    st.assume(_share("notebook-0", 300, 4096), 11, [0])
    st.assume(_share("notebook-1", 300, 4096), 11, [1])
    pending = [
        PodSpec(
            "needs-h100-toleration",
            namespace="team-c",
            cpu_milli=8000,
            num_gpu=4,
            gpu_milli=GPU_MILLI,
            gpu_models=frozenset({"H100"}),
        ),
        PodSpec(
            "wants-b200", namespace="team-c", num_gpu=1, gpu_milli=GPU_MILLI, gpu_models=frozenset({"B200"})
        ),
        PodSpec("wants-120gib", namespace="team-c", num_gpu=1, gpu_milli=500, gpu_memory_mib=120 * 1024),
        PodSpec(
            "needs-two-a100",
            namespace="team-a",
            cpu_milli=4000,
            num_gpu=2,
            gpu_milli=GPU_MILLI,
            gpu_models=frozenset({"A100"}),
        ),
    ]
    snap = snapshot_of_state(st, pending, source="demo cluster")
    nodes_out = [dict(n) for n in snap.nodes]
    pods_out = [dict(p) for p in snap.pods]
    for n in nodes_out:  # the agent's topology annotation, with made-up UUIDs
        name = n["metadata"]["name"]
        count = int(n["status"]["capacity"].get("nvidia.com/gpu", 0))
        topo = {"gpus": [{"index": g, "uuid": f"GPU-{name}-{g}"} for g in range(count)], "nvlinkGroups": []}
        n["metadata"].setdefault("annotations", {})[ANN_TOPOLOGY] = json.dumps(topo)
        n["metadata"]["labels"]["nvidia.com/cuda.driver-version.major"] = "550"
        for part in ("capacity", "allocatable"):
            n["status"][part]["gpusched.io/gpu-share"] = str(16 * count)
    for p in pods_out:  # the device plugin's record, as assigned; notebook-1's drifted to GPU 0
        meta = p["metadata"]
        node, ann = p["spec"].get("nodeName"), meta["annotations"]
        if not node or "gpusched.io/assignment" not in ann:
            continue
        gpus = json.loads(ann["gpusched.io/assignment"])["gpus"]
        if meta["name"] == "notebook-1":
            gpus = [0]
        res = (
            "nvidia.com/gpu"
            if "nvidia.com/gpu" in p["spec"]["containers"][0]["resources"]["requests"]
            else "gpusched.io/gpu-share"
        )
        ann[ANN_ALLOCATED] = json.dumps({"main": {res: [f"GPU-{node}-{g}" for g in gpus]}})
    return Snapshot(nodes_out, pods_out, snap.source)


def _mig_pod(name: str, namespace: str, profile: str) -> PodSpec:
    res = "nvidia.com/mig-" + profile.replace("+", ".")
    owner = Controller("Job", name, "batch")
    return PodSpec(
        name, namespace=namespace, cpu_milli=1000, mig=(profile,), extended={res: 1}, controller=owner
    )


def mig_demo_snapshot() -> Snapshot:
    """One A100 80GB node with two MIG GPUs: GPU 0 cut as mig-manager's all-balanced with its 3g held,
    GPU 1 as 4g + 3g, both held; a 4g.40gb pod waits, and re-cutting GPU 0's free slices would host it."""
    geom = Geometry.of("a100-80gb")
    layouts = (
        (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)),
        (("4g.40gb", 0), ("3g.40gb", 4)),
    )
    gpus: list[MigGpu] = []
    counts: dict[str, int] = {}
    for i, lay in enumerate(layouts):
        g = MigGpu(f"a100-mig-0/{i}", geom)
        for p, s in lay:
            g = g.place(p, s)
            res = "nvidia.com/mig-" + p
            counts[res] = counts.get(res, 0) + 1
        gpus.append(g)
    node = NodeSpec(
        "a100-mig-0", 64_000, 512 * 1024, extended=counts, mig=NodeMig(tuple(gpus), (0, 1)),
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed"},
    )  # fmt: skip
    state = ClusterState([node])
    for name, profile, gpu, start in (
        ("infer-3g", "3g.40gb", 0, 4),
        ("train-4g", "4g.40gb", 1, 0),
        ("infer-3g-b", "3g.40gb", 1, 4),
    ):
        state.assume(_mig_pod(name, "team-a", profile), 0, (), mig=(MigSlot(gpu, start, profile),))
    return snapshot_of_state(state, [_mig_pod("needs-4g", "team-b", "4g.40gb")], source="demo MIG cluster")
