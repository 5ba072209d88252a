"""Every ``gpusched.io`` name on a Kubernetes object, once: the extended resources, annotations,
labels and taints that the scheduler, the extender, the node agent, the webhook, doctor and the
defragmentation controller write and read. Plain strings (and the one annotation value every side
parses, the unhealthy-GPU list), so that each adapter imports them from here instead of from
another adapter; the modules that used to define them re-export them under their old names.
"""

from __future__ import annotations

from collections.abc import Iterable

# ------------------------------------------------------------------ extended resources
RES_GPU = "nvidia.com/gpu"
"""Whole GPUs, as NVIDIA's device plugin and gpusched's node agent advertise them."""
RES_MILLI = "gpusched.io/gpu-milli"
"""A share of one GPU in thousandths (``1000`` = a whole GPU's compute)."""
RES_MEMORY = "gpusched.io/gpu-memory"
"""A share's GPU memory in MiB."""
RES_SHARE = "gpusched.io/gpu-share"
"""The node agent's per-GPU share slots: a ticket to its device plugin's ``Allocate`` for each container
of a share, added by gpusched's mutating webhook (``gpusched.webhook``); booked as an extended resource."""

# ------------------------------------------------------------------ annotations on pods
ANN_ASSIGNMENT = "gpusched.io/assignment"
"""The scheduler's GPU assignment of a pod (JSON: the GPUs and each one's share)."""
ANN_ALLOCATED = "gpusched.io/allocated"
"""The node agent's record of the devices its device plugin handed a pod's containers."""
ANN_QUEUE = "gpusched.io/queue"
"""A pod's queue (on a Namespace: a label of the same name, ``LABEL_QUEUE``)."""
ANN_GANG = "gpusched.io/gang"
ANN_TOPOLOGY_REQUIRED = "gpusched.io/topology-required"
"""On a gang's pods or its group: a topology level's node label key; every member lands in one domain of
it, or the gang waits (``core.gangtopology``; after Kueue's ``podset-required-topology``)."""
ANN_TOPOLOGY_PREFERRED = "gpusched.io/topology-preferred"
"""As ``ANN_TOPOLOGY_REQUIRED``, but a gang that no domain of that level holds tries the wider levels, then
anywhere (after Kueue's ``podset-preferred-topology``)."""
ANN_DEFRAG = "gpusched.io/defrag"
"""``"false"``: defragmentation never moves this pod (``PodSpec.movable``); ``"true"`` or absent: it may."""
ANN_ROOM = "gpusched.io/defrag-room"
"""On a placeholder pod: the room the defragmentation controller keeps for a pending pod."""
ANN_ROUTED_FROM = "gpusched.io/routed-from"
"""Set by the webhook on a pod it routed to gpusched: the scheduler name it came with."""

# ------------------------------------------------------------------ annotations on nodes
ANN_MODELS = "gpusched.io/gpu-models"
ANN_TOPOLOGY = "gpusched.io/gpu-topology"
"""The node agent's GPU topology: per GPU its index, NUMA node and NVLink peers."""
ANN_MIG = "gpusched.io/mig-geometry"
"""The node agent's MIG geometry: the MIG strategy and, per MIG-capable GPU, its index, model class, MIG mode
and the instances present (profile, start, MIG UUID)."""
ANN_MIG_RESHAPE = "gpusched.io/mig-reshape"
"""A re-cut of one GPU's free MIG slices for the node agent to apply (JSON: ``id``, ``gpu``, ``destroy`` and
``create`` lists of ``{"profile", "start"}``)."""
ANN_MIG_RESHAPE_STATUS = "gpusched.io/mig-reshape-status"
"""The node agent's answer to ``ANN_MIG_RESHAPE``: ``{"id", "state": "success"|"failed", "message"}``."""
ANN_UNHEALTHY_GPUS = "gpusched.io/unhealthy-gpus"
"""The GPU indices the node agent found failed, comma-separated (``parse_unhealthy_gpus``)."""
ANN_CONFLICT = "gpusched.io/device-plugin-conflict"
"""JSON ``{"resources": {resource: [other sockets]}, "sockets": {socket: [device IDs]}}`` while another
plugin serves devices that the agent serves too; absent otherwise."""
ANN_ISOLATION = "gpusched.io/gpu-isolation"
"""JSON ``{"sharing": MODE, "visibleDevicesEnvvar": true|false|null, "toolkitConfig": PATH}``."""

# ------------------------------------------------------------------ annotations on the defrag Lease
ANN_PLAN = "gpusched.io/defrag-plan"
"""On the defragmentation controller's Lease: the plan it is carrying out (``PlanRecord``)."""
ANN_MOVES = "gpusched.io/defrag-moves"
"""On the defragmentation controller's Lease: the moves of its window (``defrag/ledger.py``)."""

# ------------------------------------------------------------------ labels and taints
LABEL_QUEUE = "gpusched.io/queue"
"""On a Namespace: the queue of its pods (a pod's own annotation of that name wins)."""
LABEL_GPU_ROUTING = "gpusched.io/gpu-routing"
"""On a Namespace or pod: opts out of the webhook's routing to gpusched."""
LABEL_CLIQUE = "nvidia.com/gpu.clique"
"""GPU feature discovery's NVLink domain of a node (GB200/NVL systems): the narrowest default gang
topology level (``core.gangtopology.DEFAULT_LEVELS``)."""
LABEL_RACK = "gpusched.io/rack"
"""A node's rack, set by the administrator: the default gang topology level above the clique."""
LABEL_BLOCK = "gpusched.io/block"
"""A node's block (racks under one spine), set by the administrator: the widest default level."""
LABEL_MIG_RESHAPE_WAY = "gpusched.io/mig-reshape-way"
"""On a node: how its MIG geometry is reshaped, ``nvml`` (the node agent creates and destroys instances),
``mig-manager`` (NVIDIA's mig-manager applies a configuration) or ``off``; absent: the agent's flag
decides."""
TAINT_UNHEALTHY = "gpusched.io/gpu-unhealthy"
"""On a node whose every GPU failed (the node agent's)."""
TAINT_NODE_UNREADABLE = "gpusched.io/node-unreadable"
# DeviceTaintRules the agent writes, in device-plugin mode, for another DRA driver's devices that are GPUs its
# pods hold (agent/dra/heldtaints.py): the taint's key, the rule's node label, the GPU's UUID annotation.
TAINT_HELD_BY_DEVICE_PLUGIN = "gpusched.io/held-by-device-plugin"
LABEL_HELD_GPU_NODE = "gpusched.io/held-gpu-node"
ANN_HELD_GPU = "gpusched.io/held-gpu"
"""The scheduler's own NoSchedule taint on a node whose object it cannot read."""
LABEL_TESTENV = "gpusched.io/testenv"
"""On what the test environment (``gpusched up``, ``gpusched.testenv``) creates."""
LABEL_BENCH = "gpusched.io/bench"
"""On the nodes and pods a Kubernetes benchmark creates (``gpusched.bench``)."""


def format_unhealthy_gpus(indices: Iterable[int]) -> str:
    """``ANN_UNHEALTHY_GPUS``'s value for ``indices``: sorted, each once, comma-separated."""
    return ",".join(str(i) for i in sorted(set(indices)))


def parse_unhealthy_gpus(value: str | None, where: str = "node") -> frozenset[int]:
    """The GPU indices named by the annotation's value (None or "" -> none). Raises ValueError naming
    ``where``
    and the annotation for anything but comma-separated non-negative integers."""
    if value is None or not value.strip():
        return frozenset()
    out = set()
    for part in value.split(","):
        p = part.strip()
        if not p.isdigit():
            raise ValueError(
                f"{where}: annotation {ANN_UNHEALTHY_GPUS} {value!r} is not a list of GPU indices like '0,3'"
            )
        out.add(int(p))
    return frozenset(out)
