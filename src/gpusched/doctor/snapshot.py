"""The doctor's input: the API's Node and Pod objects, from a live cluster or a file.

The file format is JSON (``SNAPSHOT_KIND``, version 1)::

    {"kind": "gpusched.io/doctor-snapshot", "version": 1, "source": "...",
     "nodes": [<Node as the API shows it>, ...], "pods": [<Pod as the API shows it>, ...],
     "queues": [<Queue (gpusched.io/v1alpha1) as the API shows it>, ...],
     "namespaces": [{"metadata": {"name": ..., "labels": {...}}}, ...],
     "dra": {"deviceClasses": [...], "resourceSlices": [...], "resourceClaims": [...],
             "deviceTaintRules": [...]}}

``queues`` is optional: absent (an older snapshot, or a cluster that does not serve the Queue
CRD) means no queues, and the scheduler then ignores ``gpusched.io/queue``; ``namespaces`` (their
names and labels: a Namespace's ``gpusched.io/queue`` label puts its pods in a queue) too.

A bound pod's GPUs are its ``gpusched.io/assignment`` annotation, as on a live cluster, and the
device plugin's allocation its ``gpusched.io/allocated`` annotation; a Node's failed GPUs its
``gpusched.io/unhealthy-gpus`` annotation. ``snapshot_of_state`` writes the simulator's books in
this form (``gpusched simulate --snapshot FILE``): node labels, taints, allocatable, GPU model and
memory; pods with their requests, node selector, tolerations, priority and assignment. Pod
affinity and topology spread are not written (the simulator's traces have none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import ResourceError
from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.names import ANN_MIG, ANN_MIG_RESHAPE
from gpusched.doctor.checks import ANN_UNHEALTHY
from gpusched.doctor.errors import SnapshotError
from gpusched.k8s.convert import (
    ANN_ASSIGNMENT,
    ANN_GANG,
    ANN_MODELS,
    ANN_QUEUE,
    LABEL_MEMORY,
    LABEL_PRODUCT,
    RES_GPU,
    RES_MEMORY,
    RES_MILLI,
    assignment_annotation,
    owner_reference,
)

SNAPSHOT_KIND = "gpusched.io/doctor-snapshot"
DRA_KINDS = ("deviceClasses", "resourceSlices", "resourceClaims", "deviceTaintRules")
SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class Snapshot:
    """Nodes and pods as the API shows them (plain dicts), and where they came from."""

    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    source: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    queues: Sequence[Mapping[str, Any]] | None = None
    """The Queue objects; None: the cluster does not serve Queues (or an older snapshot)."""
    namespaces: Sequence[Mapping[str, Any]] = ()
    """The Namespaces (name and labels), for the queue a namespace's label names."""
    queues_unreadable: str = ""
    """Why the Queues could not be listed (the API refused: 403), "" otherwise."""
    dra: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """``resource.k8s.io`` objects by kind (``DRA_KINDS``): DeviceClasses, ResourceSlices,
    ResourceClaims, DeviceTaintRules; empty: none served or an older snapshot."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": SNAPSHOT_KIND,
            "version": SNAPSHOT_VERSION,
            "source": self.source,
            "nodes": list(self.nodes),
            "pods": list(self.pods),
        }
        if self.queues is not None:
            out["queues"] = list(self.queues)
        if self.queues_unreadable:
            out["queues_unreadable"] = self.queues_unreadable
        if any(self.dra.values()):
            out["dra"] = {k: list(v) for k, v in self.dra.items()}
        if self.namespaces:
            out["namespaces"] = [
                {"metadata": {k: v for k, v in (n.get("metadata") or {}).items() if k in ("name", "labels")}}
                for n in self.namespaces
            ]
        return out


# ------------------------------------------------------------------------- core -> API objects
def node_object(nd: NodeSpec) -> dict[str, Any]:
    alloc: dict[str, str] = {"cpu": f"{nd.cpu_milli}m", "memory": f"{nd.memory_mib}Mi"}
    if nd.max_pods:
        alloc["pods"] = str(nd.max_pods)
    labels = dict(nd.labels)
    if nd.gpu_count:
        alloc[RES_GPU] = str(nd.gpu_count)
        labels.setdefault(LABEL_PRODUCT, nd.gpu_model)
        if nd.gpu_memory_mib:
            labels.setdefault(LABEL_MEMORY, str(nd.gpu_memory_mib))
    alloc.update((k, str(v)) for k, v in nd.extended.items())
    meta: dict[str, Any] = {"name": nd.name, "labels": labels}
    ann: dict[str, str] = {}
    if nd.unhealthy_gpus:
        ann[ANN_UNHEALTHY] = ",".join(str(g) for g in sorted(nd.unhealthy_gpus))
    if nd.mig is not None:
        ann.update(mig_annotations(nd.mig))
    if ann:
        meta["annotations"] = ann
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if nd.taints:
        obj["spec"] = {"taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in nd.taints]}
    obj["status"] = {
        "capacity": dict(alloc),
        "allocatable": alloc,
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return obj


def mig_annotations(mig: NodeMig) -> dict[str, str]:
    """A node's MIG geometry as its agent writes it (``gpusched.io/mig-geometry``; MIG UUIDs made up), and a
    re-cut request outstanding for each GPU being re-cut (``gpusched.io/mig-reshape``)."""
    gpus = [
        {
            "index": i,
            "model": g.geometry.model,
            "migEnabled": g.mig_enabled,
            "instances": [
                {"profile": x.profile, "start": x.start, "uuid": f"MIG-{g.name}-{x.profile}-{x.start}"}
                for x in g.instances
            ],
        }
        for i, g in zip(mig.indices, mig.gpus, strict=True)
    ]
    out = {ANN_MIG: json.dumps({"strategy": "mixed", "gpus": gpus}, separators=(",", ":"))}
    for i in sorted(mig.reshaping)[:1]:  # one request at a time per node
        out[ANN_MIG_RESHAPE] = json.dumps({"id": f"snapshot-{i}", "gpu": i, "destroy": [], "create": []})
    return out


def pod_object(
    pod: PodSpec, node: str = "", gpus: Sequence[int] = (), mig: Sequence[MigSlot] = ()
) -> dict[str, Any]:
    req: dict[str, str] = {}
    if pod.cpu_milli:
        req["cpu"] = f"{pod.cpu_milli}m"
    if pod.memory_mib:
        req["memory"] = f"{pod.memory_mib}Mi"
    if pod.is_whole:
        req[RES_GPU] = str(pod.num_gpu)
        if pod.gpu_memory_mib:
            req[RES_MEMORY] = str(pod.gpu_memory_mib)
    elif pod.num_gpu:
        if pod.gpu_milli:
            req[RES_MILLI] = str(pod.gpu_milli)
        if pod.gpu_memory_mib:
            req[RES_MEMORY] = str(pod.gpu_memory_mib)
    req.update((k, str(v)) for k, v in pod.extended.items())
    ann: dict[str, str] = {}
    if pod.gpu_models:
        ann[ANN_MODELS] = "|".join(sorted(pod.gpu_models))
    if pod.gang:
        ann[ANN_GANG] = pod.gang
    if pod.queue:
        ann[ANN_QUEUE] = pod.queue
    if node and (pod.num_gpu or mig):
        ann[ANN_ASSIGNMENT] = assignment_annotation(node, tuple(gpus), pod, tuple(mig))
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": req, "limits": dict(req)}}],
    }
    if pod.priority:
        spec["priority"] = pod.priority
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        spec["tolerations"] = [
            {
                k: v
                for k, v in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if v
            }
            for t in pod.tolerations
        ]
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid or f"uid-{pod.namespace}-{pod.name}",
        "labels": dict(pod.labels),
        "annotations": ann,
    }
    if pod.controller is not None:
        meta["ownerReferences"] = [owner_reference(pod.controller)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def snapshot_of_state(
    state: ClusterState, pending: Sequence[PodSpec] = (), *, source: str = "gpusched simulate"
) -> Snapshot:
    """The simulator's books (every booked pod where it is booked) and its pending pods."""
    nodes = [node_object(nd) for nd in state.nodes]
    pods = [pod_object(a.pod, state.names[a.node], a.gpus, a.mig) for a in state.allocations.values()]
    pods += [pod_object(p) for p in pending if p.key not in state.allocations]
    return Snapshot(nodes, pods, source)


def save_snapshot(
    path: Path | str,
    state: ClusterState,
    pending: Sequence[PodSpec] = (),
    *,
    source: str = "gpusched simulate",
) -> Path:
    """Write ``snapshot_of_state`` to ``path`` (JSON); raises ResourceError naming the file."""
    p = Path(path)
    data = snapshot_of_state(state, pending, source=source).to_json()
    try:
        p.write_text(json.dumps(data, separators=(",", ":")))
    except OSError as e:
        raise ResourceError(f"snapshot {p}: cannot write it: {e.strerror or e}") from None
    return p


def write_snapshot(path: Path | str, snap: Snapshot) -> Path:
    p = Path(path)
    try:
        p.write_text(json.dumps(snap.to_json(), separators=(",", ":")))
    except OSError as e:
        raise ResourceError(f"snapshot {p}: cannot write it: {e.strerror or e}") from None
    return p


# ----------------------------------------------------------------------------------- reading
def _objects(data: Mapping[str, Any], name: str, where: str) -> list[Mapping[str, Any]]:
    items = data.get(name)
    if not isinstance(items, list):
        raise SnapshotError(f"{where}: field {name!r} must be a list of {name[:-1]} objects")
    for i, o in enumerate(items):
        meta = o.get("metadata") if isinstance(o, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise SnapshotError(f"{where}: {name}[{i}] has no metadata.name")
        for part in ("spec", "status"):
            if part in o and not isinstance(o[part], dict):
                raise SnapshotError(f"{where}: {name}[{i}] ({meta['name']}): {part} must be an object")
    return items


def parse_snapshot(data: object, where: str = "snapshot") -> Snapshot:
    """A snapshot from its JSON value; SnapshotError names the field that is wrong."""
    if not isinstance(data, dict):
        raise SnapshotError(f"{where}: not a JSON object (a doctor snapshot has kind {SNAPSHOT_KIND!r})")
    if data.get("kind") != SNAPSHOT_KIND:
        raise SnapshotError(f"{where}: field kind is {data.get('kind')!r}, expected {SNAPSHOT_KIND!r}")
    if data.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{where}: field version is {data.get('version')!r}; this doctor reads version 1")
    queues = _objects(data, "queues", where) if data.get("queues") is not None else None
    namespaces = _objects(data, "namespaces", where) if data.get("namespaces") is not None else []
    dra_data = data.get("dra") or {}
    if not isinstance(dra_data, dict):
        raise SnapshotError(f"{where}: field 'dra' must be an object of {', '.join(DRA_KINDS)}")
    dra = {k: _objects(dra_data, k, f"{where} dra") for k in DRA_KINDS if dra_data.get(k) is not None}
    return Snapshot(
        _objects(data, "nodes", where),
        _objects(data, "pods", where),
        str(data.get("source") or where),
        queues=queues,
        namespaces=namespaces,
        queues_unreadable=str(data.get("queues_unreadable") or ""),
        dra=dra,
    )


def load_snapshot(path: Path | str) -> Snapshot:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SnapshotError(f"snapshot {p}: cannot read it: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SnapshotError(f"snapshot {p}: not JSON ({e})") from None
    return parse_snapshot(data, f"snapshot {p}")
