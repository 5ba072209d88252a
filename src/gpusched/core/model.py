"""Specs of nodes and pods in integer units: milli-CPU, MiB, milli-GPU. Never floats.

A GPU is 1000 milli-GPU. A pod asks for ``num_gpu`` GPUs with ``gpu_milli`` of each
and optionally ``gpu_memory_mib`` MiB of GPU memory:

- whole GPUs (``gpu_milli == 1000``) are booked whole, 1000 milli and all of each GPU's memory,
  so nothing else shares them; ``gpu_memory_mib`` only says which GPUs qualify (at least that
  much memory), as with ``nvidia.com/gpu: N`` and a memory figure in Kubernetes;
- a share (``gpu_milli < 1000``, one GPU) books ``gpu_milli`` and ``gpu_memory_mib`` of its GPU;
  ``gpu_milli == 0`` is a share by memory alone (the front ends make it with ``num_gpu`` 1).

Node placement constraints follow Kubernetes: a node selector, required node
affinity (selector terms with In/NotIn/Exists/DoesNotExist/Gt/Lt, e.g. on the GPU driver
version labels), taints and tolerations. Room is left for what later front ends bring
(priority, gang groups, queues); the core treats them as plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from gpusched.core.errors import InvalidSpec
from gpusched.core.gpumodel import canonical_gpu_model, canonical_gpu_models
from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.mig.profiles import ALL_PROFILE_NAMES
from gpusched.core.selectors import (
    LabelSelector,
    NodeSelectorTerm,
    PodAffinityTerm,
    PreferredNodeTerm,
    PreferredPodTerm,
    SpreadConstraint,
)
from gpusched.core.topology import GpuTopology

if TYPE_CHECKING:
    from gpusched.core.dra.inventory import PodClaims

__all__ = [
    "GPU_MILLI",
    "Allocation",
    "Controller",
    "InvalidSpec",
    "LabelSelector",
    "NodeSelectorTerm",
    "NodeSpec",
    "PodAffinityTerm",
    "PodSpec",
    "PreferredNodeTerm",
    "PreferredPodTerm",
    "SpreadConstraint",
    "Taint",
    "Toleration",
]

GPU_MILLI = 1000
"""Milli-GPU in one whole GPU."""

_EMPTY: Mapping[str, str] = MappingProxyType({})
_NO_RESOURCES: Mapping[str, int] = MappingProxyType({})
PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def _check_extended(extended: Mapping[str, int], who: str) -> None:
    for name, v in extended.items():
        if not isinstance(name, str) or not name:
            raise InvalidSpec(f"{who}: extended resource name {name!r} is not a non-empty string")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidSpec(f"{who}: extended resource {name} must be a non-negative integer, got {v!r}")


def _check_mig(pod: PodSpec) -> None:
    if not isinstance(pod.mig, tuple) or list(pod.mig) != sorted(pod.mig):
        raise InvalidSpec(f"pod {pod.key}: mig must be a sorted tuple of MIG profile names, got {pod.mig!r}")
    for p in pod.mig:
        if p not in ALL_PROFILE_NAMES:
            raise InvalidSpec(
                f"pod {pod.key}: unknown MIG profile {p!r} (nvidia.com/mig-<profile>; no GPU model has it, "
                "e.g. A100 80GB: 1g.10gb, 1g.10gb.me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
            )
    if pod.mig and pod.num_gpu:
        raise InvalidSpec(
            f"pod {pod.key} asks for both a MIG slice ({', '.join(sorted(set(pod.mig)))}) and a whole GPU "
            "or share (nvidia.com/gpu, gpusched.io/gpu-milli or gpusched.io/gpu-memory): a MIG slice is a "
            "GPU of its own; drop one of the two"
        )


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node. All GPUs of a node are of one model (as GPU feature discovery labels them)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    gpu_memory_mib: int = 0  # per GPU; 0 when the model's memory is unknown
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    taints: tuple[Taint, ...] = ()
    max_pods: int = 0  # pods the node takes (allocatable "pods"); 0 = no limit
    extended: Mapping[str, int] = field(default_factory=lambda: _NO_RESOURCES)
    """Other allocatable resources, counted in whole units by name (e.g. ``rdma/hca``,
    ``nvidia.com/mig-1g.10gb``)."""
    unhealthy_gpus: frozenset[int] = frozenset()
    """Indices (0..gpu_count-1) of GPUs that failed: they take no new pod; pods already on them
    stay booked there until they leave."""
    gpu_topology: GpuTopology | None = None
    """NVLink peers and NUMA node per GPU (``core.topology``); None: GPU sets are chosen topology-blind."""
    mig: NodeMig | None = None
    """The node's MIG GPUs and the instances present (``core.mig.books``); None: MIG slices are booked as
    counts only (``extended``), as where no gpusched agent publishes the geometry."""
    claimed_gpus: frozenset[int] = frozenset()
    """Indices of GPUs a DRA ResourceClaim holds (allocated by another allocator on a node whose GPUs a
    DRA driver also publishes, ``docs/dra.md``): they take no new pod, as unhealthy GPUs do; pods
    already on them stay booked."""

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidSpec("node: name is empty")
        for fname in ("cpu_milli", "memory_mib", "gpu_count", "gpu_memory_mib", "max_pods"):
            v = getattr(self, fname)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidSpec(f"node {self.name}: {fname} must be a non-negative integer, got {v!r}")
        _check_extended(self.extended, f"node {self.name}")
        if self.gpu_count and not self.gpu_model:
            raise InvalidSpec(f"node {self.name}: has {self.gpu_count} GPUs but no gpu_model")
        if self.gpu_model:
            object.__setattr__(self, "gpu_model", canonical_gpu_model(self.gpu_model))
        bad = sorted(g for g in self.unhealthy_gpus if not isinstance(g, int) or not 0 <= g < self.gpu_count)
        if bad:
            raise InvalidSpec(f"node {self.name}: unhealthy GPU(s) {bad} not among its {self.gpu_count} GPUs")
        bad = sorted(g for g in self.claimed_gpus if not isinstance(g, int) or not 0 <= g < self.gpu_count)
        if bad:
            raise InvalidSpec(f"node {self.name}: claimed GPU(s) {bad} not among its {self.gpu_count} GPUs")
        if self.gpu_topology is not None and self.gpu_topology.gpu_count != self.gpu_count:
            raise InvalidSpec(
                f"node {self.name}: GPU topology describes {self.gpu_topology.gpu_count} GPUs, "
                f"the node has {self.gpu_count}"
            )


@dataclass(frozen=True, slots=True)
class Controller:
    """What manages a pod (Kubernetes: its ``ownerReference`` with ``controller: true``): the
    object's ``kind``, its API ``group`` ("" for the core group) and ``name``. Whether it
    recreates the pod after an eviction is the reader's rule (``core.defrag``: ReplicaSet,
    StatefulSet, Job, ReplicationController do; a DaemonSet or a mirror pod's Node do not move it)."""

    kind: str
    name: str
    group: str = ""

    def __post_init__(self) -> None:
        for fname in ("kind", "name", "group"):
            v = getattr(self, fname)
            if not isinstance(v, str):
                raise InvalidSpec(f"controller: {fname} must be a string, got {v!r}")
        if not self.kind or not self.name:
            raise InvalidSpec(f"controller: kind and name must be given, got {self.kind!r} {self.name!r}")

    @property
    def qualified_kind(self) -> str:
        """``Kind.group`` as kubectl names a resource (``ReplicaSet.apps``), ``Kind`` for the core group."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __str__(self) -> str:
        return f"{self.qualified_kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod's request. ``key`` (namespace/name) identifies it in the cluster state."""

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0  # per GPU; GPU_MILLI for whole GPUs, 0 for a share by memory alone
    gpu_memory_mib: int = 0  # per GPU: booked by a share, the minimum GPU memory of whole GPUs; 0 = none
    gpu_models: frozenset[str] = frozenset()  # empty = any model
    namespace: str = "default"
    priority: int = 0
    preemption_policy: str = "PreemptLowerPriority"  # or "Never": waits, evicts no one
    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    node_affinity: tuple[NodeSelectorTerm, ...] = ()  # required node affinity: any term; () = none
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # the pod's own labels
    spread: tuple[SpreadConstraint, ...] = ()  # topology spread constraints
    pod_affinity: tuple[PodAffinityTerm, ...] = ()  # required: every term holds
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()  # required: no term holds
    preferred_node_affinity: tuple[PreferredNodeTerm, ...] = ()
    preferred_pod_affinity: tuple[PreferredPodTerm, ...] = ()
    preferred_pod_anti_affinity: tuple[PreferredPodTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    extended: Mapping[str, int] = field(default_factory=lambda: _NO_RESOURCES)  # other resources, by name
    gang: str = ""  # all-or-nothing group, empty = none
    queue: str = ""  # tenant queue, empty = default
    uid: str = ""  # the API object's UID where there is one (bind preconditions); not part of the shape
    movable: bool = True
    """Whether defragmentation may move this pod (evict it for recreation elsewhere); False is the
    opt-out (Kubernetes: the annotation ``gpusched.io/defrag: "false"``). Not part of the shape."""
    controller: Controller | None = None
    """What recreates this pod when it is evicted (None: nothing, a bare pod). Defragmentation moves
    only pods whose controller recreates them (``core.defrag.units``). Not part of the shape."""
    claims: PodClaims | None = None
    """Its DRA ResourceClaims and the inventory they are allocated against (``core.dra.inventory``),
    for the DynamicResources plugin; None: no claims. Part of the shape by identity."""
    mig: tuple[str, ...] = ()
    """MIG slices asked for (``nvidia.com/mig-<profile>``), one profile name per slice, sorted. They are
    also counted in ``extended``; a node with a MIG geometry (``NodeSpec.mig``) books each on a GPU and
    start (``Allocation.mig``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidSpec("pod: name is empty")
        for fname in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_memory_mib"):
            v = getattr(self, fname)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidSpec(f"pod {self.key}: {fname} must be a non-negative integer, got {v!r}")
        if self.gpu_milli > GPU_MILLI:
            raise InvalidSpec(
                f"pod {self.key}: gpu_milli {self.gpu_milli} is more than one GPU ({GPU_MILLI})"
            )
        if self.num_gpu == 0 and (self.gpu_milli or self.gpu_memory_mib):
            raise InvalidSpec(f"pod {self.key}: gpu_milli/gpu_memory_mib given but num_gpu is 0")
        if self.num_gpu > 0 and self.gpu_milli == 0 and self.gpu_memory_mib == 0:
            raise InvalidSpec(
                f"pod {self.key}: num_gpu {self.num_gpu} but neither gpu_milli nor gpu_memory_mib"
            )
        if self.num_gpu > 1 and 0 < self.gpu_milli < GPU_MILLI:
            raise InvalidSpec(
                f"pod {self.key}: a GPU share (gpu_milli {self.gpu_milli} < {GPU_MILLI}) "
                f"needs num_gpu 1, got {self.num_gpu}"
            )
        for m in self.gpu_models:
            if not m or "|" in m or m.strip() != m:
                raise InvalidSpec(f"pod {self.key}: invalid GPU model name {m!r} in gpu_models")
        if self.gpu_models:
            object.__setattr__(self, "gpu_models", canonical_gpu_models(self.gpu_models))
        _check_extended(self.extended, f"pod {self.key}")
        if self.preemption_policy not in PREEMPTION_POLICIES:
            raise InvalidSpec(
                f"pod {self.key}: preemptionPolicy {self.preemption_policy!r} is not one of "
                f"{', '.join(PREEMPTION_POLICIES)}"
            )
        if not isinstance(self.node_affinity, tuple) or not all(
            isinstance(t, NodeSelectorTerm) for t in self.node_affinity
        ):
            raise InvalidSpec(f"pod {self.key}: node_affinity must be a tuple of NodeSelectorTerm")
        for fname, kind in (
            ("spread", SpreadConstraint),
            ("pod_affinity", PodAffinityTerm),
            ("pod_anti_affinity", PodAffinityTerm),
            ("preferred_node_affinity", PreferredNodeTerm),
            ("preferred_pod_affinity", PreferredPodTerm),
            ("preferred_pod_anti_affinity", PreferredPodTerm),
        ):
            v = getattr(self, fname)
            if not isinstance(v, tuple) or not all(isinstance(x, kind) for x in v):
                raise InvalidSpec(f"pod {self.key}: {fname} must be a tuple of {kind.__name__}")
        _check_mig(self)
        if not isinstance(self.movable, bool):
            raise InvalidSpec(f"pod {self.key}: movable must be True or False, got {self.movable!r}")
        if self.controller is not None and not isinstance(self.controller, Controller):
            raise InvalidSpec(
                f"pod {self.key}: controller must be a Controller or None, got {self.controller!r}"
            )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    @property
    def is_whole(self) -> bool:
        """Whole GPUs: each booked whole (1000 milli and all its memory), shared with nothing."""
        return self.num_gpu > 0 and self.gpu_milli >= GPU_MILLI

    def gpu_memory_booked(self, gpu_memory_mib: int) -> int:
        """MiB booked on each of this pod's GPUs when one GPU has ``gpu_memory_mib``: all of it
        for whole GPUs (``self.gpu_memory_mib`` only selected the GPU), else the pod's figure."""
        return gpu_memory_mib if self.is_whole else self.gpu_memory_mib

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def shape(self) -> tuple[object, ...]:
        """Everything that a node-local filter or score may read of this pod. Pods with
        equal shapes are interchangeable for scheduling (an equivalence class)."""
        return (
            self.cpu_milli,
            self.memory_mib,
            self.num_gpu,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.gpu_models,
            tuple(sorted(self.node_selector.items())),
            self.node_affinity,
            self.tolerations,
            tuple(sorted(self.extended.items())),
            self.namespace,
            tuple(sorted(self.labels.items())),
            self.spread,
            self.pod_affinity,
            self.pod_anti_affinity,
            self.preferred_node_affinity,
            self.preferred_pod_affinity,
            self.preferred_pod_anti_affinity,
            self.claims,
            self.mig,
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one pod holds: its node and, per assigned GPU, the GPU index on that node."""

    pod: PodSpec
    node: int
    gpus: tuple[int, ...]
    mig: tuple[MigSlot, ...] = ()
    """The MIG slices it holds (GPU index, start, profile), on a node with a MIG geometry."""
