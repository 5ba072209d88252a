"""MIG on the node agent's side (issue 31): the geometry it publishes for the scheduler, and the exact MIG
device it hands a container.

**Publishing.** ``gpusched.io/mig-geometry`` on the Node (``mig_annotation``): the MIG strategy and, per
MIG-capable GPU, its NVML index, its model class (``core.mig.profiles.model_class``), whether it is in MIG
mode and the instances present (profile, start slice, MIG UUID). The scheduler reads it in
``k8s/migconvert.py`` and books every ``nvidia.com/mig-<profile>`` request on one GPU and start.

**Allocating.** The assignment's ``mig`` field (``[{"gpu", "start", "profile"}]``) names the slices the
scheduler booked. The containers asking for ``nvidia.com/mig-<profile>`` take that profile's slices in
order (init containers first, each from the first slice, as whole GPUs are handed out), and each slice is
the instance of that profile at that start on that GPU: ``NVIDIA_VISIBLE_DEVICES=MIG-<uuid>``, as NVIDIA's
device plugin writes it, whatever device IDs the kubelet picked. A slice that names a GPU this node does not
have, an instance that is not there (or of another profile), a failed GPU, or an instance a live pod on the
node already holds fails the ``Allocate`` with an error and a Warning event naming the pod and the field.
A pod whose assignment has no ``mig`` field (placed by books that did not know the geometry) gets the
kubelet's choice, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.agent.allocation import (
    AllocationError,
    OverlapError,
    container_span,
    live_allocations,
    pod_key,
)
from gpusched.agent.allocation import container_requests as container_requests
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.migprofiles import model_class
from gpusched.core.names import ANN_ASSIGNMENT, ANN_MIG

__all__ = ["ANN_MIG", "MigSlice", "assigned_slices", "held_mig", "mig_annotation", "resolve"]

RES_MIG_PREFIX = "nvidia.com/mig-"
WHERE = f"annotation {ANN_ASSIGNMENT} field mig"


def mig_annotation(inv: Inventory, strategy: str) -> str | None:
    """``gpusched.io/mig-geometry``'s value, or None when no GPU of the node is MIG-capable."""
    gpus = []
    for d in inv.devices:
        cls = model_class(d.name, d.memory_mib) if d.mig_capable else None
        if cls is None:
            continue
        gpus.append(
            {
                "index": d.index,
                "model": cls,
                "migEnabled": d.mig_enabled,
                "instances": [
                    {"profile": m.profile, "start": m.placement_start, "uuid": m.uuid}
                    for m in d.mig_instances
                    if m.slices_ci == m.slices_gi
                ],
            }
        )
    if not gpus:
        return None
    doc = {"strategy": strategy if strategy in ("mixed", "single") else "mixed", "gpus": gpus}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class MigSlice:
    gpu: int
    start: int
    profile: str


def profile_of(resource: str) -> str:
    p = resource.removeprefix(RES_MIG_PREFIX)
    return p[: -len(".me")] + "+me" if p.endswith(".me") else p


def assigned_slices(pod: Mapping[str, Any], node: str) -> list[MigSlice] | None:
    """The slices of the pod's assignment; None when it has no assignment or no ``mig`` field. Raises
    AllocationError naming the pod and the field for one that does not read or names another node."""
    key = pod_key(pod)
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_ASSIGNMENT)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        items = data.get("mig") if isinstance(data, dict) else None
    except ValueError:
        raise AllocationError(f"pod {key}: annotation {ANN_ASSIGNMENT} is not JSON: {raw!r}") from None
    if items is None:
        return None
    out = []
    if not isinstance(items, list):
        raise AllocationError(f"pod {key}: {WHERE} is not a list: {raw!r}")
    for it in items:
        vals = [it.get(f) if isinstance(it, dict) else None for f in ("gpu", "start")]
        prof = it.get("profile") if isinstance(it, dict) else None
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vals) or not isinstance(
            prof, str
        ):
            raise AllocationError(f"pod {key}: {WHERE} entry {it!r} is not {{gpu, start, profile}}")
        out.append(MigSlice(int(vals[0]), int(vals[1]), prof))  # type: ignore[arg-type]
    if data.get("node") != node:
        raise AllocationError(
            f"pod {key}: annotation {ANN_ASSIGNMENT} field node is {data.get('node')!r}, "
            f"but this is node {node!r}"
        )
    return out


def container_slices(
    pod: Mapping[str, Any], container: str, resource: str, slices: Sequence[MigSlice], profile: str
) -> list[MigSlice]:
    """The slices of ``profile`` that belong to ``container``, which asks for ``resource`` (init containers
    from the first slice; the others in order after each other)."""
    mine = [s for s in slices if s.profile == profile]
    offset, amount = container_span(pod, container, resource)
    got = mine[offset : offset + amount]
    if len(got) != amount:
        raise AllocationError(
            f"pod {pod_key(pod)}: {WHERE} has {len(mine)} slice(s) of {profile} for containers asking for "
            f"more (container {container} asks for {amount} {resource})"
        )
    return got


def resolve(
    pod: Mapping[str, Any], node: str, inv: Inventory, slices: Sequence[MigSlice]
) -> list[tuple[GpuDevice, MigInstance]]:
    """The instance each slice names. Raises AllocationError naming the pod and the field for a GPU not on
    this node or an instance that is not there."""
    key = pod_key(pod)
    out = []
    for s in slices:
        d = inv.by_index(s.gpu)
        if d is None or not d.mig_enabled:
            what = "is not on" if d is None else "is not in MIG mode on"
            raise AllocationError(
                f"pod {key}: {WHERE} names {s.profile} at slice {s.start} of GPU {s.gpu}, which {what} "
                f"node {node}"
            )
        m = next(
            (m for m in d.mig_instances if m.placement_start == s.start and m.profile == s.profile), None
        )
        if m is None:
            have = ", ".join(f"{m.profile} at {m.placement_start}" for m in d.mig_instances) or "none"
            raise AllocationError(
                f"pod {key}: {WHERE} names MIG {s.profile} at slice {s.start} of GPU {s.gpu}, which node "
                f"{node} does not have (GPU {s.gpu} holds: {have})"
            )
        out.append((d, m))
    return out


def held_mig(
    pods: Sequence[Mapping[str, Any]], node: str, exclude_uid: str, unwritten: Mapping[str, str]
) -> dict[str, str]:
    """MIG UUID -> the live pod on ``node`` (but ``exclude_uid``) the agent handed it to."""
    out: dict[str, str] = {}
    for _pod, key, done in live_allocations(pods, node, exclude_uid, unwritten):
        for per_resource in done.values():
            if isinstance(per_resource, dict):
                for resource, ids in per_resource.items():
                    if resource.startswith(RES_MIG_PREFIX) and isinstance(ids, list):
                        out.update({str(i): key for i in ids})
    return out


def refuse_held(
    pod: Mapping[str, Any], got: Sequence[tuple[GpuDevice, MigInstance]], held: Mapping[str, str]
) -> None:
    key = pod_key(pod)
    for d, m in got:
        if m.uuid in held:
            raise OverlapError(
                f"pod {key}: {WHERE} names MIG {m.profile} at slice {m.placement_start} of GPU {d.index} "
                f"({m.uuid}), which live pod {held[m.uuid]} holds; {key} is refused it. gpusched never "
                f"assigns a held slice: {key}'s assignment was written around the scheduler"
            )
