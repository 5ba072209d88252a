"""Which pod an ``Allocate`` call is for, and what its container gets.

**Matching a call to its pod.** The kubelet's ``Allocate`` names devices, not the pod. As gpushare and HAMi
do,
the agent looks at the pods bound to this node that are still Pending, and takes the oldest (creation time,
then
namespace/name) that has a container requesting this resource in exactly the number of devices asked for and
not yet allocated. "Allocated" is remembered in the pod annotation ``gpusched.io/allocated`` (JSON: container
name -> resource -> device IDs handed out), written before ``Allocate`` answers, and in memory for when the
API
is unreachable; so a restarted agent never hands one container two allocations, and a second container of the
same pod gets the next slice. The kubelet admits one pod at a time on a node, so among pods of equal request
the oldest is the one being admitted. (The PodResources API would name the pod only after ``Allocate``, so it
cannot be used here.)

**What the container gets.** For ``nvidia.com/gpu`` and GPU shares: the GPUs of the scheduler's
``gpusched.io/assignment`` (``{"node","gpus","milli","memoryMiB"}``), whatever device IDs the kubelet picked —
``NVIDIA_VISIBLE_DEVICES`` with their UUIDs (and CDI names ``nvidia.com/gpu=<UUID>`` when CDI is on). A share
also gets its limits as env: HAMi-core's ``CUDA_DEVICE_MEMORY_LIMIT_0`` (``<MiB>m``) and
``CUDA_DEVICE_SM_LIMIT`` (percent), MPS's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, and ``GPUSCHED_GPU_MILLI`` / ``GPUSCHED_GPU_MEMORY_MIB``. These are
enforced only where HAMi-core's library or an MPS daemon runs in the container; otherwise they are scheduled,
not enforced. For MIG slices (``nvidia.com/mig-<profile>``) the kubelet's choice of MIG devices stands: the
scheduler books them as counts.

The scheduler's GPU indices are the positions of this node's non-MIG GPUs in NVML order (what the agent
advertises as ``nvidia.com/gpu``).

**An assignment that overlaps a live pod is refused** (``overlap``). gpusched never writes one; a
``gpusched.io/assignment`` written by hand (with ``spec.nodeName``, around the scheduler) could name a GPU
another pod holds, and the kubelet, which counts devices, not GPUs, would admit it. The live pods are the
others on this node, not Succeeded or Failed (a terminating one still runs), and what they hold is what the
agent handed them (``gpusched.io/allocated``, or its memory of allocations not yet written): a whole GPU
takes nothing beside it; shares on one GPU may add up to 1000 milli and the GPU's memory. The refusal names
both pods (an ``Allocate`` error, so the kubelet fails the newcomer, and a Warning event on it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import GpuschedError
from gpusched.core.names import ANN_ALLOCATED as ANN_ALLOCATED
from gpusched.core.names import ANN_ASSIGNMENT as ANN_ASSIGNMENT
from gpusched.core.names import RES_GPU as RES_GPU
from gpusched.core.names import RES_MEMORY as RES_MEMORY
from gpusched.core.names import RES_MILLI as RES_MILLI
from gpusched.core.names import RES_SHARE as RES_SHARE


class AllocationError(GpuschedError):
    """An Allocate that must fail; the message names the pod and the field."""

    reason = "GPUAllocationFailed"
    """The reason of the Warning event on the pod."""


class OverlapError(AllocationError):
    """The pod's assignment names a GPU that a live pod on the node holds."""

    reason = "GPUAssignmentConflict"


@dataclass(frozen=True)
class Holding:
    """What one live pod holds of one GPU (by UUID), as the agent handed it out."""

    pod: str  # namespace/name
    uuid: str
    whole: bool
    milli: int
    memory_mib: int


@dataclass(frozen=True)
class Assignment:
    node: str
    gpus: tuple[int, ...]
    milli: int
    memory_mib: int


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def parse_assignment(pod: Mapping[str, Any]) -> Assignment:
    """The pod's assignment. Raises AllocationError naming the pod and the field when it is missing or bad."""
    key = pod_key(pod)
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_ASSIGNMENT)
    where = f"pod {key}: annotation {ANN_ASSIGNMENT}"
    if raw is None:
        by = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        raise AllocationError(
            f"{where} is missing: the pod was not placed by gpusched (spec.schedulerName {by!r}, or "
            "spec.nodeName set by hand), and gpusched's agent serves GPUs only to pods gpusched placed. "
            "Name gpusched's scheduler (its webhook routes GPU pods there unless the namespace is "
            "labelled gpusched.io/gpu-routing=disabled)"
        )
    try:
        data = json.loads(raw)
    except ValueError:
        raise AllocationError(f"{where} is not JSON: {raw!r}") from None
    if not isinstance(data, dict):
        raise AllocationError(f"{where} is not a JSON object: {raw!r}")
    node = data.get("node")
    if not isinstance(node, str) or not node:
        raise AllocationError(f"{where}: field node is missing or not a string: {raw!r}")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not all(
        isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus
    ):
        raise AllocationError(f"{where}: field gpus is not a list of GPU indices: {raw!r}")
    if len(set(gpus)) != len(gpus):
        raise AllocationError(f"{where}: field gpus names a GPU twice: {raw!r}")
    out = []
    for f in ("milli", "memoryMiB"):
        v = data.get(f, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise AllocationError(f"{where}: field {f} is not a non-negative integer: {raw!r}")
        out.append(v)
    return Assignment(node, tuple(gpus), out[0], out[1])


def _count(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return -1


def container_requests(pod: Mapping[str, Any], resource: str) -> list[tuple[str, int]]:
    """(container, amount of ``resource``) for the init containers then the containers asking for it."""
    spec = pod.get("spec") or {}
    out = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(resource))
        if v is not None and _count(v) > 0:
            out.append((str(c.get("name", "")), _count(v)))
    return out


def allocated_of(pod: Mapping[str, Any]) -> dict[str, dict[str, list[str]]]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_ALLOCATED)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def admission_order(pod: Mapping[str, Any]) -> tuple[int, str, str]:
    """The order in which the kubelet admits bound pods, and so calls ``Allocate`` (which does not say for
    which pod): the order they were bound. The kubelet watches the pods bound to its node and admits each new
    one as its event arrives, one at a time; the events come in the order of their resource versions. A pod
    bound but not yet admitted has seen no write since its binding (the kubelet has not written its status and
    the agent writes ``gpusched.io/allocated`` only after ``Allocate``), so its resource version is its
    binding's. Creation time, the kubelet's order within one batch, breaks ties and stands in where the
    resource version is not a number (the API calls it opaque; etcd's are revisions). Ordering by creation
    time alone gave a pod bound second the GPU share of the pod bound first (two share pods created in one
    order and bound in the other)."""
    m = pod.get("metadata") or {}
    rv = str(m.get("resourceVersion") or "")
    return (int(rv) if rv.isdigit() else 2**63), str(m.get("creationTimestamp") or ""), pod_key(pod)


def match_pod(
    pods: Sequence[Mapping[str, Any]],
    node: str,
    resource: str,
    n_devices: int,
    allocated: Mapping[str, set[tuple[str, str]]],
) -> tuple[Mapping[str, Any], str] | None:
    """The (pod, container name) an ``Allocate`` of ``n_devices`` of ``resource`` is for: the first Pending
    pod on ``node``, in the order the kubelet admits them (``admission_order``), with a container asking for
    exactly that many and not yet allocated (``allocated``: pod UID -> {(container, resource)} known in
    memory, besides the pod's annotation)."""
    for pod in sorted(pods, key=admission_order):
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            continue
        uid = str((pod.get("metadata") or {}).get("uid", pod_key(pod)))
        done = allocated.get(uid, set())
        ann = allocated_of(pod)
        for name, amount in container_requests(pod, resource):
            if amount != n_devices:
                continue
            if (name, resource) in done or resource in (ann.get(name) or {}):
                continue
            return pod, name
    return None


def container_gpus(
    pod: Mapping[str, Any], container: str, resource: str, assignment: Assignment
) -> tuple[int, ...]:
    """The assignment's GPUs that belong to ``container``: for whole GPUs, the containers asking for
    ``nvidia.com/gpu`` take the assignment's GPUs in order (init containers the first ones); a share's
    containers
    all get its one GPU."""
    if resource != RES_GPU:
        return assignment.gpus
    offset, amount = container_span(pod, container, resource)
    return assignment.gpus[offset : offset + amount]


def container_span(pod: Mapping[str, Any], container: str, resource: str) -> tuple[int, int]:
    """Where ``container``'s devices of ``resource`` start among the pod's, and how many it asks for:
    init containers run one after another, so each starts at 0; the others run together, each after
    the ones before it in the pod's order."""
    spec = pod.get("spec") or {}
    inits = {str(c.get("name", "")) for c in spec.get("initContainers") or []}
    reqs = container_requests(pod, resource)
    amount = dict(reqs)[container]
    if container in inits:
        return 0, amount
    offset = 0
    for name, n in reqs:
        if name in inits:
            continue
        if name == container:
            break
        offset += n
    return offset, amount


def share_env(assignment: Assignment) -> dict[str, str]:
    env = {"GPUSCHED_GPU_MILLI": str(assignment.milli), "GPUSCHED_GPU_MEMORY_MIB": str(assignment.memory_mib)}
    if assignment.memory_mib:
        env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{assignment.memory_mib}m"
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={assignment.memory_mib}M"
    if 0 < assignment.milli < 1000:
        pct = str(max(1, math.ceil(assignment.milli / 10)))
        env["CUDA_DEVICE_SM_LIMIT"] = pct
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = pct
    return env


LIVE_DONE = ("Succeeded", "Failed")


def _assigned_amounts(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli, memoryMiB) of the pod's assignment; (0, 0) when it has none or it does not read."""
    try:
        a = parse_assignment(pod)
    except AllocationError:
        return 0, 0
    return a.milli, a.memory_mib


def live_allocations(
    pods: Sequence[Mapping[str, Any]], node: str, exclude_uid: str, unwritten: Mapping[str, str]
) -> Iterator[tuple[Mapping[str, Any], str, dict[str, Any]]]:
    """(pod, key, what the agent handed it) for each live pod on ``node`` but ``exclude_uid``: from
    ``gpusched.io/allocated``, or ``unwritten`` (pod key -> the annotation's value not yet written) where
    the agent remembers more."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") != node or str(meta.get("uid", "")) == exclude_uid:
            continue
        if (pod.get("status") or {}).get("phase") in LIVE_DONE:
            continue
        key = pod_key(pod)
        done = (
            allocated_of({"metadata": {"annotations": {ANN_ALLOCATED: unwritten[key]}}})
            if key in unwritten
            else {}
        )
        yield pod, key, done or allocated_of(pod)


def holdings(
    pods: Sequence[Mapping[str, Any]], node: str, exclude_uid: str, unwritten: Mapping[str, str]
) -> list[Holding]:
    """What the live pods on ``node`` but ``exclude_uid`` hold, per GPU (``live_allocations``)."""
    out: list[Holding] = []
    for pod, key, done in live_allocations(pods, node, exclude_uid, unwritten):
        whole: set[str] = set()
        shared: set[str] = set()
        for per_resource in done.values():
            if not isinstance(per_resource, dict):
                continue
            for resource, ids in per_resource.items():
                if not isinstance(ids, list):
                    continue
                uuids = {str(i).split("::")[0] for i in ids}
                (whole if resource == RES_GPU else shared if resource == RES_SHARE else set()).update(uuids)
        milli, memory = _assigned_amounts(pod)
        out += [Holding(key, u, True, 1000, 0) for u in sorted(whole)]
        out += [Holding(key, u, False, milli, memory) for u in sorted(shared - whole)]
    return out


def share_amounts(pod: Mapping[str, Any], assignment: Assignment) -> tuple[int, int]:
    """(milli, MiB) a share takes of its GPU: its assignment's, and never less than its containers ask for
    (``gpusched.io/gpu-milli``, ``gpusched.io/gpu-memory``: a written assignment could say 0)."""
    asked = [sum(n for _c, n in container_requests(pod, r)) for r in (RES_MILLI, RES_MEMORY)]
    return max(assignment.milli, asked[0]), max(assignment.memory_mib, asked[1])


def overlap(
    pod: Mapping[str, Any],
    resource: str,
    assignment: Assignment,
    gpus: Sequence[tuple[int, str, int]],
    held: Sequence[Holding],
) -> None:
    """Raise OverlapError naming both pods when ``pod``'s ``gpus`` ((index, UUID, memory MiB) of the GPUs it
    is to get as ``resource``) overlap what ``held`` says live pods hold."""
    key = pod_key(pod)
    for index, uuid, memory_mib in gpus:
        on = [h for h in held if h.uuid == uuid]
        if not on:
            continue
        where = f"pod {key}: annotation {ANN_ASSIGNMENT} names GPU {index} ({uuid})"
        whole = [h.pod for h in on if h.whole]
        if resource == RES_GPU or whole:
            names = ", ".join(sorted({h.pod for h in on}))
            what = "whole" if whole else "as a share"
            raise OverlapError(
                f"{where}, which live pod(s) {names} hold ({what}); {key} is refused it. gpusched never "
                f"assigns a held GPU: {key}'s assignment was written around the scheduler"
            )
        milli, memory = share_amounts(pod, assignment)
        used_milli = sum(h.milli for h in on)
        used_memory = sum(h.memory_mib for h in on)
        if used_milli + milli > 1000 or (memory_mib and used_memory + memory > memory_mib):
            names = ", ".join(sorted({h.pod for h in on}))
            raise OverlapError(
                f"{where} for a share of {milli} milli and {memory} MiB, but live pod(s) {names} hold "
                f"{used_milli} milli and {used_memory} MiB of its 1000 milli and {memory_mib or '?'} MiB; "
                f"{key} is refused it. gpusched never overcommits a GPU: {key}'s assignment was written "
                "around the scheduler"
            )
