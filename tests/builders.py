"""Pod and node builders shared by the tests: core specs (``node``, ``gpu_node``, ``pod``,
``share``, ``whole``), profiles, and Kubernetes API objects (``k8s_node``, ``k8s_pod``).

Every argument a test cares about is a keyword with a plain default; a test names what it
depends on (``node("n", gpus=2, cpu=64_000)``) instead of keeping a local builder whose
defaults the reader must look up.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.model import GPU_MILLI, Controller, NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import ScheduleResult, schedule_one
from gpusched.core.statement import holding

NONE: frozenset[str] = frozenset()
HOST = "kubernetes.io/hostname"
RS = Controller("ReplicaSet", "web", "apps")
"""A controller that recreates its pods (defragmentation moves only such pods):
``share(..., controller=RS)``."""
ZONE = "topology.kubernetes.io/zone"


# ------------------------------------------------------------------------------ core specs
def node(
    name: str,
    gpus: int = 0,
    cpu: int = 32_000,
    model: str = "A",
    gmem: int = 16_384,
    *,
    mem: int = 65_536,
    **kw: Any,
) -> NodeSpec:
    """A node; ``model`` and ``gmem`` (per-GPU memory, MiB) apply only when it has GPUs."""
    return NodeSpec(
        name,
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_count=gpus,
        gpu_model=model if gpus else "",
        gpu_memory_mib=gmem if gpus else 0,
        **kw,
    )


def gpu_node(
    name: str,
    gpus: int,
    cpu: int = 32_000,
    model: str = "A100",
    *,
    mem: int = 131_072,
    gmem: int = 0,
    **kw: Any,
) -> NodeSpec:
    """A GPU node whose GPU memory is unknown unless ``gmem`` is given."""
    return node(name, gpus, cpu, model, gmem, mem=mem, **kw)


def pod(name: str, cpu: int = 0, **kw: Any) -> PodSpec:
    return PodSpec(name, cpu_milli=cpu, **kw)


def share(name: str, milli: int, cpu: int = 0, **kw: Any) -> PodSpec:
    """One GPU share of ``milli`` (1..999)."""
    return PodSpec(name, cpu_milli=cpu, num_gpu=1, gpu_milli=milli, **kw)


def whole(name: str, num: int = 1, cpu: int = 0, **kw: Any) -> PodSpec:
    """``num`` whole GPUs."""
    return PodSpec(name, cpu_milli=cpu, num_gpu=num, gpu_milli=GPU_MILLI, **kw)


# ----------------------------------------------------------------------------- profiles
def profile(policy: str = "bestfit", pods: Sequence[PodSpec] = (), *, preemption: bool = False) -> Profile:
    """``make_profile(policy)`` with the target workload of ``pods`` (a one-pod workload when
    none) and a random generator seeded 0."""
    workload = TargetWorkload.from_pods(pods or [PodSpec("w", 1, 1)])
    return make_profile(policy, PolicyContext(workload, np.random.default_rng(0)), preemption=preemption)


def with_gpu_free(snap: ClusterState, n: int, free: Sequence[int]) -> ClusterState:
    """Book share pods so that GPU ``i`` of node ``n`` has ``free[i]`` milli left."""
    for i, f in enumerate(free):
        if f < GPU_MILLI:
            snap.assume(share(f"fill-{snap.names[n]}-{i}", GPU_MILLI - f), n, [i])
    assert snap.node_gpu_free(n) == list(free)
    return snap


# ------------------------------------------------------------------ Kubernetes API objects
def k8s_node(
    name: str,
    gpus: int = 8,
    *,
    cpu: str = "64",
    mem: str = "256Gi",
    model: str = "A100",
    gpu_mem_mib: int = 40960,
    pods: str | None = None,
    capacity: bool = False,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Node as the API shows it: GPU product and memory labels, allocatable (and, with
    ``capacity``, the same capacity), an optional ``spec`` (taints, unschedulable)."""
    alloc = {"cpu": cpu, "memory": mem, "nvidia.com/gpu": str(gpus)}
    if pods is not None:
        alloc["pods"] = pods
    lab = {"nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": str(gpu_mem_mib), **(labels or {})}
    obj: dict[str, Any] = {"metadata": {"name": name, "labels": lab}}
    if spec is not None:
        obj["spec"] = dict(spec)
    obj["status"] = {"allocatable": alloc, "capacity": alloc} if capacity else {"allocatable": alloc}
    return obj


def k8s_pod(
    name: str,
    requests: Mapping[str, str] | None = None,
    *,
    limits: bool = False,
    node_name: str = "",
    ns: str = "default",
    uid: str = "",
    annotations: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod with one container asking for ``requests`` (and the same ``limits``), Running when
    bound to ``node_name``, else Pending."""
    res = dict(requests or {})
    resources: dict[str, Any] = {"requests": res, "limits": res} if limits else {"requests": res}
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": {"containers": [{"name": "c", "resources": resources}], **spec},
        "status": {"phase": "Running" if node_name else "Pending"},
    }
    if node_name:
        obj["spec"]["nodeName"] = node_name
    return obj


def schedule_with_nominated(
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    nominated: Sequence[tuple[PodSpec, int]],
    *,
    leaving: Collection[str] = (),
) -> ScheduleResult:
    """One cycle of ``pod`` clear of the rooms of ``nominated`` pods (``core.statement.holding``, the
    rule the scheduler's ``Rooms`` applies to every unit); nothing stays booked."""
    with holding(snap, nominated, pod.priority, skip=(pod.key,), leaving=leaving):
        return schedule_one(profile, pod, snap, assume=False)
