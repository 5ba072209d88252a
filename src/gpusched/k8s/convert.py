"""Kubernetes objects ⇄ the core model. Pods and nodes are plain dicts (the API's JSON).

How a pod asks for GPUs (documented in README, "Requesting GPUs"):

- ``nvidia.com/gpu: N`` in a container's limits — N whole GPUs, booked whole (1000 milli and all
  their memory: the kubelet hands the pod whole devices, so nothing shares them). With
  ``gpusched.io/gpu-memory`` it is N whole GPUs of at least that much memory each, as with
  NVIDIA's device plugin; with ``gpusched.io/gpu-milli`` it must be 1000 (a share is refused).
- ``gpusched.io/gpu-milli: M`` (1–1000) without ``nvidia.com/gpu`` — M milli-GPU of one GPU (a
  share; M = 1000 is one whole GPU); with ``gpusched.io/gpu-memory`` also that much of its memory.
- ``gpusched.io/gpu-memory: MiB`` alone — a share of one GPU by memory: that much of its memory
  and no milli, beside other shares but never on a GPU a whole-GPU pod holds.
- A 0 for ``gpusched.io/gpu-milli`` or ``gpusched.io/gpu-memory`` is refused (it would ask for
  no GPU at all); a running pod is booked as the kubelet admitted it whatever its request says.
- annotation ``gpusched.io/gpu-models: "NVIDIA-A100-SXM4-80GB|NVIDIA-H100-80GB-HBM3"`` — allowed GPU
  models: the node label ``nvidia.com/gpu.product`` as gpu-feature-discovery and the agent write it,
  with or without its vendor prefix (``A100-SXM4-80GB``, ``Tesla-T4`` or ``T4``); both sides are
  compared in ``gpusched.core.gpumodel.canonical_gpu_model``'s form.
- other resources in the requests — device plugins' extended resources (``rdma/hca``, MIG slices
  like ``nvidia.com/mig-1g.10gb``) in whole units, ``ephemeral-storage`` and ``hugepages-*`` in
  MiB — and the node's allocatable ``pods`` are checked as kube-scheduler does.
- ``nodeSelector`` and required node affinity (``nodeSelectorTerms`` with In, NotIn, Exists,
  DoesNotExist, Gt, Lt) on any node label, e.g. a minimum driver with
  ``nvidia.com/cuda.driver-version.major`` Gt 534; an invalid term is rejected with an Event.

A node's GPUs are counted from ``status.capacity["nvidia.com/gpu"]`` (allocatable when the
node reports no capacity): the kubelet leaves a device plugin's unhealthy devices out of
allocatable, and counting those would renumber the GPUs after a failed one. Its model comes from
the label ``nvidia.com/gpu.product`` and the memory of one GPU from ``nvidia.com/gpu.memory``
(MiB), as NVIDIA's gpu-feature-discovery labels them. The GPUs that gpusched's node agent
names in the annotation ``gpusched.io/unhealthy-gpus`` ("0,3": scheduler indices) take no new
pod; the pods already on them stay booked there. A malformed value makes the node invalid
(``InvalidRequest`` naming the node and the annotation), as any other unreadable node field.

MIG slices (``nvidia.com/mig-<profile>``) and a node's MIG geometry (annotation
``gpusched.io/mig-geometry``) are read in ``k8s/migconvert.py``.

The scheduler writes the device assignment to the annotation ``gpusched.io/assignment``
(JSON ``{"node", "gpus", "milli", "memoryMiB"}``, and ``"mig"`` for MIG slices) before binding;
the node side exposes exactly those GPUs, and a restarted scheduler rebuilds its books from the annotations.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from gpusched.core.mig.books import MigSlot
from gpusched.core.model import (
    GPU_MILLI,
    Allocation,
    Controller,
    InvalidSpec,
    NodeSpec,
    PodSpec,
    Taint,
    Toleration,
)
from gpusched.core.names import ANN_ASSIGNMENT as ANN_ASSIGNMENT
from gpusched.core.names import ANN_DEFRAG as ANN_DEFRAG
from gpusched.core.names import ANN_GANG as ANN_GANG
from gpusched.core.names import ANN_MODELS as ANN_MODELS
from gpusched.core.names import ANN_QUEUE as ANN_QUEUE
from gpusched.core.names import ANN_TOPOLOGY as ANN_TOPOLOGY
from gpusched.core.names import ANN_UNHEALTHY_GPUS as ANN_UNHEALTHY_GPUS
from gpusched.core.names import RES_GPU as RES_GPU
from gpusched.core.names import RES_MEMORY as RES_MEMORY
from gpusched.core.names import RES_MILLI as RES_MILLI
from gpusched.core.names import RES_SHARE as RES_SHARE
from gpusched.core.names import parse_unhealthy_gpus as parse_unhealthy_gpus
from gpusched.core.selectors import (
    NodeSelectorTerm,
    PodAffinityTerm,
    PreferredNodeTerm,
    PreferredPodTerm,
    SpreadConstraint,
)
from gpusched.core.topology import UNKNOWN_NUMA, GpuTopology
from gpusched.k8s.constraints import node_affinity, pod_affinity, preferred_affinity, spread_constraints
from gpusched.k8s.errors import InvalidRequest as InvalidRequest
from gpusched.k8s.groupref import group_name_of
from gpusched.k8s.migconvert import assignment_mig, node_mig, pod_mig, slots_json
from gpusched.k8s.quantity import parse_quantity

log = logging.getLogger(__name__)

ANN_MIRROR = "kubernetes.io/config.mirror"
"""Set by the kubelet on a static pod's mirror: the kubelet runs it, no controller recreates it."""
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
MANAGED_RESOURCES = (RES_GPU, RES_MILLI, RES_MEMORY)
NOT_EXTENDED = frozenset({"cpu", "memory", "pods", *MANAGED_RESOURCES})
"""Resources with fields of their own in the core model."""


def is_extended(name: str) -> bool:
    """Any other resource, checked per node as kube-scheduler does: device plugins' extended
    resources (``rdma/hca``, ``nvidia.com/mig-1g.10gb``, ...) in whole units, and
    ``ephemeral-storage`` and ``hugepages-*`` in MiB (``in_mib``)."""
    return name not in NOT_EXTENDED


def in_mib(name: str) -> bool:
    """Byte quantities, booked in MiB: requests round up, allocatable rounds down."""
    return name == "ephemeral-storage" or name.startswith("hugepages-")


def _amount(name: str, value: object, where: str, *, request: bool) -> int:
    if not in_mib(name):
        return _count(value, where)
    q = _quantity(value, where) / _MIB
    return math.ceil(q) if request else math.floor(q)


_MODEL_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$")
_MIB = 1024 * 1024


MAX_QUANTITY = 10**18
"""The largest quantity read from any pod or node, in its own unit (bytes, cores, units): far
above any machine, below int64; ``int(Decimal("1e999999999"))`` would never return."""


def _quantity(value: object, where: str) -> Decimal:
    try:
        q = parse_quantity(value)
        negative, over = q < 0, q > MAX_QUANTITY  # exact Decimal comparisons; NaN raises here
    except (ValueError, TypeError, ArithmeticError):
        raise InvalidRequest(f"{where}: {_shown(value)} is not a Kubernetes quantity") from None
    if negative:
        raise InvalidRequest(f"{where}: {_shown(value)} is negative")
    if over:
        raise InvalidRequest(f"{where}: {_shown(value)} is more than {MAX_QUANTITY}, the most accepted")
    return Decimal(q)


def _count(value: object, where: str) -> int:
    q = _quantity(value, where)
    if q != q.to_integral_value():
        shown = format(value.normalize(), "f") if isinstance(value, Decimal) else repr(value)
        raise InvalidRequest(f"{where}: {shown} must be a whole number")
    return int(q)


def _key(meta: Mapping[str, Any]) -> str:
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests as kube-scheduler computes them: the sum over containers, at least
    the largest init container, plus pod overhead. Limits stand in for missing requests."""
    spec = pod.get("spec") or {}
    key = _key(pod.get("metadata") or {})

    def of(c: Mapping[str, Any], i: int, kind: str) -> dict[str, Decimal]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {n: _quantity(v, f"pod {key} {kind}[{i}] {n}") for n, v in merged.items()}

    total: dict[str, Decimal] = {}
    for i, c in enumerate(spec.get("containers") or []):
        for n, q in of(c, i, "containers").items():
            total[n] = total.get(n, Decimal(0)) + q
    for i, c in enumerate(spec.get("initContainers") or []):
        for n, q in of(c, i, "initContainers").items():
            total[n] = max(total.get(n, Decimal(0)), q)
    for n, v in (spec.get("overhead") or {}).items():
        total[n] = total.get(n, Decimal(0)) + _quantity(v, f"pod {key} overhead {n}")
    return total


def parse_models(text: str, where: str) -> frozenset[str]:
    models = frozenset(m.strip() for m in text.split("|") if m.strip())
    bad = [m for m in models if not _MODEL_RE.match(m)]
    if bad or (text.strip() and not models):
        raise InvalidRequest(
            f"{where}: invalid GPU model name(s) {bad or [text]}; use the node label {LABEL_PRODUCT} "
            "with or without its vendor prefix, '|' between models, e.g. NVIDIA-A100-SXM4-80GB|Tesla-T4"
        )
    return models


def _gpu_request(req: Mapping[str, Decimal], key: str, *, running: bool) -> tuple[int, int, int]:
    """(num_gpu, gpu_milli, gpu_memory_mib) of the core model. Never less than the kubelet hands
    out: ``nvidia.com/gpu: N`` is N whole GPUs (1000 milli each; a memory figure only picks GPUs
    with at least that much). A ``running`` pod's conflicting request is booked as the kubelet
    admitted it instead of refused: whole GPUs for ``nvidia.com/gpu``, nothing for a 0."""
    num = _count(req[RES_GPU], f"pod {key} {RES_GPU}") if RES_GPU in req else 0
    milli = _count(req[RES_MILLI], f"pod {key} {RES_MILLI}") if RES_MILLI in req else 0
    gmem = _count(req[RES_MEMORY], f"pod {key} {RES_MEMORY}") if RES_MEMORY in req else 0
    if milli > GPU_MILLI:
        raise InvalidRequest(
            f"pod {key}: {RES_MILLI} {milli} is more than one GPU ({GPU_MILLI}); use {RES_GPU}"
        )
    if not running:
        if RES_MILLI in req and milli == 0:
            raise InvalidRequest(f"pod {key}: {RES_MILLI} must be 1–{GPU_MILLI}, got 0")
        if RES_MEMORY in req and gmem == 0:
            raise InvalidRequest(f"pod {key}: {RES_MEMORY} must be at least 1 (MiB), got 0")
        if num and 0 < milli < GPU_MILLI:
            raise InvalidRequest(
                f"pod {key}: a GPU share ({RES_MILLI} {milli}) needs no {RES_GPU}: {RES_GPU} {num} "
                f"is {num} whole GPU(s), which the kubelet hands out whole; drop one of the two"
            )
    if num:
        return num, GPU_MILLI, gmem  # whole GPUs; gmem: the least memory a GPU must have
    if milli or gmem:
        return 1, milli, gmem  # a share of one GPU, by milli, by memory (milli 0) or both
    return 0, 0, 0


def controller_of(pod: Mapping[str, Any], *, strict: bool = True) -> Controller | None:
    """The pod's controller: its ``ownerReference`` with ``controller: true`` (as ``kubectl drain``
    and the descheduler read it), the Node for a static pod's mirror (the kubelet runs it), None
    for a pod that nothing owns as its controller. An ``ownerReferences`` that cannot be read
    raises InvalidRequest when ``strict``, else counts as none (the safe reading: such a pod is
    never moved)."""
    meta = pod.get("metadata") or {}
    key = _key(meta)
    if ANN_MIRROR in (meta.get("annotations") or {}):
        return Controller("Node", str((pod.get("spec") or {}).get("nodeName") or "?"))
    refs = meta.get("ownerReferences")
    if refs is None:
        return None
    try:
        if not isinstance(refs, list):
            raise TypeError("not a list")
        for ref in refs:
            if not isinstance(ref, Mapping):
                raise TypeError(f"entry {ref!r} is not an object")
            if ref.get("controller") is not True:
                continue
            api_version, kind, name = ref.get("apiVersion"), ref.get("kind"), ref.get("name")
            if not all(isinstance(v, str) and v for v in (api_version, kind, name)):
                raise TypeError(f"controller entry {dict(ref)!r} lacks apiVersion, kind or name")
            group = str(api_version).rpartition("/")[0]
            return Controller(str(kind), str(name), group)
    except (TypeError, InvalidSpec) as e:
        if strict:
            raise InvalidRequest(f"pod {key}: metadata.ownerReferences cannot be read: {e}") from None
    return None


def owner_reference(c: Controller, uid: str = "") -> dict[str, Any]:
    """``c`` as the ``ownerReference`` that ``controller_of`` reads back (snapshots written from
    the simulator's books carry their pods' controllers so)."""
    version = {"apps": "apps/v1", "batch": "batch/v1", "": "v1"}.get(c.group, f"{c.group}/v1")
    return {
        "apiVersion": version,
        "kind": c.kind,
        "name": c.name,
        "uid": uid or f"uid-{c.kind.lower()}-{c.name}",
        "controller": True,
    }


def _movable(ann: Mapping[str, Any], key: str) -> bool:
    value = ann.get(ANN_DEFRAG)
    if value is None:
        return True
    if not isinstance(value, str) or value.strip().lower() not in ("true", "false"):
        raise InvalidRequest(f'pod {key}: annotation {ANN_DEFRAG} must be "true" or "false", got {value!r}')
    return value.strip().lower() == "true"


def pod_from_k8s(pod: Mapping[str, Any], *, constraints: str = "enforce") -> PodSpec:
    """The core's view of a pod. Raises InvalidRequest (naming pod and field) for a request
    that cannot be scheduled as written.

    ``constraints`` says what to do with required node affinity, topology spread and pod
    (anti-)affinity: ``enforce`` reads them (an invalid one raises), ``lenient`` drops them
    when they cannot be read (a running pod: its resources must be booked whatever its
    constraints say), ``skip`` leaves them out (the extender: kube-scheduler applies them)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    key = _key(meta)
    if not meta.get("name"):
        raise InvalidRequest("pod without metadata.name")
    req = pod_requests(pod)
    cpu = req.get("cpu", Decimal(0))
    mem = req.get("memory", Decimal(0))
    num, milli, gmem = _gpu_request(req, key, running=constraints == "lenient")
    mig = pod_mig(req, running=constraints == "lenient")
    if constraints == "lenient" and num:
        mig = ()  # running with both: booked as the kubelet admitted it (the slices by count only)
    extended = {n: _amount(n, q, f"pod {key} {n}", request=True) for n, q in req.items() if is_extended(n)}
    ann = meta.get("annotations") or {}
    models = parse_models(ann.get(ANN_MODELS, ""), f"pod {key} annotation {ANN_MODELS}")
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidRequest(f"pod {key}: metadata.labels must map keys to strings")
    if constraints not in ("enforce", "lenient", "skip"):
        raise ValueError(f"constraints must be enforce, lenient or skip, got {constraints!r}")
    affinity: tuple[NodeSelectorTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    pod_aff: tuple[PodAffinityTerm, ...] = ()
    pod_anti: tuple[PodAffinityTerm, ...] = ()
    prefs: tuple[tuple[PreferredNodeTerm, ...], tuple[PreferredPodTerm, ...], tuple[PreferredPodTerm, ...]]
    prefs = ((), (), ())
    if constraints != "skip":
        try:
            affinity = node_affinity(spec, key)
            spread = spread_constraints(spec, key, labels)
            pod_aff, pod_anti = pod_affinity(spec, key, labels)
            prefs = preferred_affinity(spec, key, labels)
        except InvalidRequest:
            if constraints == "enforce":
                raise
            affinity, spread, pod_aff, pod_anti, prefs = (), (), (), (), ((), (), ())
    try:
        return PodSpec(
            name=meta["name"],
            namespace=meta.get("namespace", "default"),
            uid=str(meta.get("uid") or ""),
            cpu_milli=math.ceil(cpu * 1000),
            memory_mib=math.ceil(mem / _MIB),
            num_gpu=num,
            gpu_milli=milli,
            gpu_memory_mib=gmem,
            gpu_models=models if num else frozenset(),
            priority=int(spec.get("priority") or 0),
            preemption_policy=str(spec.get("preemptionPolicy") or "PreemptLowerPriority"),
            node_selector=dict(spec.get("nodeSelector") or {}),
            node_affinity=affinity,
            labels=dict(labels),
            spread=spread,
            pod_affinity=pod_aff,
            pod_anti_affinity=pod_anti,
            preferred_node_affinity=prefs[0],
            preferred_pod_affinity=prefs[1],
            preferred_pod_anti_affinity=prefs[2],
            extended={n: v for n, v in extended.items() if v},
            tolerations=tuple(
                Toleration(
                    t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""), t.get("effect", "")
                )
                for t in spec.get("tolerations") or []
            ),
            gang=ann.get(ANN_GANG, "") or group_name_of(pod),  # a PodGroup of any of the three APIs
            queue=ann.get(ANN_QUEUE, ""),
            movable=_movable(ann, key),
            controller=controller_of(pod, strict=constraints == "enforce"),
            mig=mig,
        )
    except InvalidSpec as e:
        raise InvalidRequest(str(e)) from None


def container_gpu_request(pod: Mapping[str, Any], kind: str, index: int) -> tuple[int, int, int]:
    """(num_gpu, gpu_milli, gpu_memory_mib) that one container asks for (``kind`` is ``containers``
    or ``initContainers``), checked by the rules ``pod_from_k8s`` applies to a whole pod. Raises
    InvalidRequest naming the pod, the container and the field."""
    spec = pod.get("spec") or {}
    c = (spec.get(kind) or [])[index]
    where = f"{_key(pod.get('metadata') or {})} {kind}[{index}] ({c.get('name') or '?'})"
    res = c.get("resources") or {}
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    req = {n: _quantity(v, f"pod {where} {n}") for n, v in merged.items() if n in MANAGED_RESOURCES}
    return _gpu_request(req, where, running=False)


def wants_gpu(pod: Mapping[str, Any]) -> bool:
    """Does the pod ask for one of the resources gpusched manages?"""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        names = {*(res.get("limits") or {}), *(res.get("requests") or {})}
        if names & set(MANAGED_RESOURCES):
            return True
    return False


MAX_GPUS_PER_NODE = 128
"""The most GPUs a node may claim (allocatable ``nvidia.com/gpu``). Real nodes have 16 at most;
MIG slices (8 × 7) and time-slicing replicas advertise more, but the books are as wide as the
widest node and a node's cost grows with its GPU count: a node claiming more is refused."""
MAX_NODE_AMOUNT = 10**15
"""The largest other amount a node may claim (cores, bytes, pods, units of an extended
resource; ``nvidia.com/gpu.memory`` in MiB): far above any machine, far below int64."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _node_amount(value: object, where: str, limit: int = MAX_NODE_AMOUNT, *, mib: bool = False) -> Decimal:
    """A node's quantity, checked against ``limit`` (in MiB when ``mib``) before any integer is
    built from it: ``int(Decimal("1e999999999"))`` would never return."""
    try:
        q = _quantity(value, where)
        over = q > limit * _MIB if mib else q > limit  # exact: no Decimal context, no overflow
    except ArithmeticError:  # NaN
        raise InvalidRequest(f"{where}: {_shown(value)} is not a Kubernetes quantity") from None
    if over:
        raise InvalidRequest(f"{where}: {_shown(value)} is more than {limit}, the most gpusched accepts")
    return q


def _node_count(value: object, where: str, limit: int = MAX_NODE_AMOUNT) -> int:
    q = _node_amount(value, where, limit)
    if q != q.to_integral_value():
        raise InvalidRequest(f"{where}: {_shown(value)} must be a whole number")
    return int(q)


def node_from_k8s(node: Mapping[str, Any]) -> NodeSpec:
    """The core's view of a node. Raises InvalidRequest (naming node and field) for a node that
    cannot be booked: an unreadable quantity, more than ``MAX_GPUS_PER_NODE`` GPUs, an amount
    over ``MAX_NODE_AMOUNT``."""
    meta = node.get("metadata") or {}
    name = meta.get("name") or ""
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    alloc = status.get("allocatable") or capacity or {}
    labels = dict(meta.get("labels") or {})
    where = f"node {name}"
    cpu = _node_amount(alloc.get("cpu", 0), f"{where} allocatable cpu")
    mem = _node_amount(alloc.get("memory", 0), f"{where} allocatable memory", mib=True)
    # GPUs by capacity: allocatable leaves out the devices the kubelet was told are unhealthy
    gpu_field, gpu_value = (
        ("capacity", capacity[RES_GPU]) if RES_GPU in capacity else ("allocatable", alloc.get(RES_GPU, 0))
    )
    gpus = _node_count(gpu_value, f"{where} {gpu_field} {RES_GPU}")
    if gpus > MAX_GPUS_PER_NODE:
        raise InvalidRequest(
            f"{where}: {gpu_field} {RES_GPU} {gpus} is more than {MAX_GPUS_PER_NODE}, "
            "the most GPUs gpusched accepts on one node"
        )
    unhealthy = unhealthy_gpus(node, gpus)
    model = labels.get(LABEL_PRODUCT, "") or ("unknown-gpu" if gpus else "")
    gmem = _node_count(labels[LABEL_MEMORY], f"{where} label {LABEL_MEMORY}") if LABEL_MEMORY in labels else 0
    taints = tuple(
        Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "NoSchedule"))
        for t in (node.get("spec") or {}).get("taints") or []
    )
    if (node.get("spec") or {}).get("unschedulable"):
        taints += (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),)
    max_pods = _node_count(alloc["pods"], f"{where} allocatable pods") if "pods" in alloc else 0
    extended = {}
    for n, v in alloc.items():
        if is_extended(n):
            at = f"{where} allocatable {n}"
            extended[n] = _amount(n, _node_amount(v, at, mib=in_mib(n)), at, request=False)
    try:
        return NodeSpec(
            name=name,
            cpu_milli=int(cpu * 1000),
            memory_mib=int(mem / _MIB),
            gpu_count=gpus,
            gpu_model=model if gpus else "",
            gpu_memory_mib=gmem,
            labels=labels,
            taints=taints,
            max_pods=max_pods,
            extended=extended,
            unhealthy_gpus=unhealthy,
            gpu_topology=gpu_topology(node, gpus),
            mig=node_mig(node),
        )
    except InvalidSpec as e:
        raise InvalidRequest(str(e)) from None


def unhealthy_gpus(node: Mapping[str, Any], gpu_count: int) -> frozenset[int]:
    """The node's GPUs (indices below ``gpu_count``) that the node agent reported failed, from the
    annotation ``gpusched.io/unhealthy-gpus``. Indices at or beyond ``gpu_count`` name no GPU in the
    books and are left out. Raises InvalidRequest naming the node and the annotation for a value
    that is not a comma-separated list of GPU indices."""
    try:
        meta = node.get("metadata") or {}
        named = parse_unhealthy_gpus((meta.get("annotations") or {}).get(ANN_UNHEALTHY_GPUS))
    except (ValueError, TypeError, AttributeError):  # int() of 5000 digits or "²" raises too
        meta = node.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(ANN_UNHEALTHY_GPUS)
        raise InvalidRequest(
            f"node {meta.get('name') or '?'}: annotation {ANN_UNHEALTHY_GPUS} {_shown(raw)} is not a "
            "list of GPU indices like '0,3'"
        ) from None
    return frozenset(g for g in named if g < gpu_count)


def gpu_topology(node: Mapping[str, Any], gpu_count: int) -> GpuTopology | None:
    """The node's GPU topology from the agent's ``gpusched.io/gpu-topology`` annotation
    (``gpusched.agent.labels.topology_annotation``: per GPU its index, NUMA node and NVLink peers).
    None without one; None too, with a warning naming the node, the annotation and what is wrong,
    for one that cannot be read or does not describe the node's ``gpu_count`` GPUs: the node is
    then still used, its GPU sets chosen topology-blind."""
    meta = node.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANN_TOPOLOGY)
    if raw is None or not gpu_count:
        return None
    try:
        return _parse_topology(raw, gpu_count)
    except (InvalidSpec, ValueError, TypeError, AttributeError, KeyError) as e:
        _warn_topology(str(meta.get("name") or "?"), str(raw)[:200], str(e))
        return None


def gpu_uuids(node: Mapping[str, Any]) -> dict[str, int]:
    """UUID -> GPU index, from the agent's ``gpusched.io/gpu-topology`` annotation (each GPU's
    ``uuid``); empty without one or for one that cannot be read (``gpu_topology`` warns about it)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_TOPOLOGY)
    if not isinstance(raw, str) or len(raw) > 65536:
        return {}
    try:
        gpus = orjson.loads(raw).get("gpus")
    except (orjson.JSONDecodeError, AttributeError):
        return {}
    out: dict[str, int] = {}
    for g in gpus if isinstance(gpus, list) else ():
        if isinstance(g, Mapping) and isinstance(g.get("uuid"), str) and type(g.get("index")) is int:
            out[g["uuid"]] = g["index"]
    return out


def _parse_topology(raw: object, gpu_count: int) -> GpuTopology:
    if not isinstance(raw, str) or len(raw) > 65536:
        raise ValueError("is not a JSON document of at most 64 KiB")
    doc = orjson.loads(raw)
    gpus = doc["gpus"]
    if not isinstance(gpus, list):
        raise ValueError('"gpus" is not a list')
    numa: dict[int, int] = {}
    peers: dict[int, list[int]] = {}
    for g in gpus:
        i, v, ps = g["index"], g.get("numa"), g.get("nvlink") or []
        if not isinstance(i, int) or isinstance(i, bool) or i in numa:
            raise ValueError(f"GPU index {_shown(i)} is not an integer or is listed twice")
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"GPU {i} numa {_shown(v)} is not a non-negative integer or null")
        if not isinstance(ps, list):
            raise ValueError(f"GPU {i} nvlink {_shown(ps)} is not a list of GPU indices")
        numa[i] = UNKNOWN_NUMA if v is None else v
        peers[i] = ps
    if sorted(numa) != list(range(gpu_count)):
        raise ValueError(f"lists GPUs {sorted(numa)}, the node has GPUs 0..{gpu_count - 1}")
    return GpuTopology.of([numa[i] for i in range(gpu_count)], [peers[i] for i in range(gpu_count)])


@functools.lru_cache(maxsize=1024)
def _warn_topology(node: str, raw: str, why: str) -> None:
    """Once per node and value (node objects are re-read on every status update)."""
    log.warning(
        "node %s: annotation %s is not used (GPU sets chosen topology-blind): %s", node, ANN_TOPOLOGY, why
    )


def assignment_annotation(
    node: str, gpus: tuple[int, ...], pod: PodSpec, mig: tuple[MigSlot, ...] = ()
) -> str:
    """``milli`` is 1000 for whole GPUs (the pod holds them whole; ``memoryMiB`` is then the
    least memory it asked of each), else the share's milli and memory. ``mig``: the MIG slices
    it holds (``[{"gpu", "start", "profile"}]``), only when there are some."""
    doc: dict[str, Any] = {
        "node": node,
        "gpus": list(gpus),
        "milli": pod.gpu_milli,
        "memoryMiB": pod.gpu_memory_mib,
    }
    if mig:
        doc["mig"] = slots_json(mig)
    return orjson.dumps(doc).decode()


def parse_assignment(pod: Mapping[str, Any]) -> tuple[str, tuple[int, ...]] | None:
    """(node, GPU indices) from the assignment annotation, or None when absent.
    Raises InvalidRequest for an annotation that is present but unreadable."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANN_ASSIGNMENT)
    if raw is None:
        return None
    try:
        data = orjson.loads(raw)
        node = str(data["node"])
        gpus = tuple(int(g) for g in data["gpus"])
    except (ValueError, KeyError, TypeError):
        raise InvalidRequest(f"pod {_key(meta)}: annotation {ANN_ASSIGNMENT} is not valid: {raw!r}") from None
    return node, gpus


def allocation_from_k8s(pod: Mapping[str, Any], node_index: Mapping[str, int]) -> Allocation | None:
    """What a bound pod holds, for rebuilding the books: its assignment annotation when
    present, else no GPU indices (the caller picks GPUs for pods bound by others)."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or node not in node_index:
        return None
    core = pod_from_k8s(pod, constraints="lenient")
    a = parse_assignment(pod)
    gpus = a[1] if a and a[0] == node else ()
    mig = (assignment_mig(pod) or ()) if a and a[0] == node else ()
    return Allocation(core, node_index[node], gpus, mig)
