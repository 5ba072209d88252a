"""Node-level and device-plugin-level findings, read from the API objects.

Node: the GPU inventory (``nvidia.com/gpu`` capacity, the product, memory and count labels of
gpu-feature-discovery or gpusched's agent), its health (``gpusched.io/unhealthy-gpus``, the
``gpusched.io/gpu-unhealthy`` taint, the Ready condition), the driver labels, whether the device
plugin registered (allocatable ``nvidia.com/gpu``, and ``gpusched.io/gpu-share`` for shares) and
whether allocatable matches the inventory.

Device plugin / container: the scheduler's ``gpusched.io/assignment`` against the device
plugin's ``gpusched.io/allocated`` (``{container: {resource: [device IDs]}}``, GPU UUIDs, share
slots ``UUID::k``), mapped to scheduler indices through the node's ``gpusched.io/gpu-topology``
annotation (``{"gpus": [{"index", "uuid"}, ...]}``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.names import ANN_ALLOCATED as ANN_ALLOCATED
from gpusched.core.names import ANN_CONFLICT as ANN_CONFLICT
from gpusched.core.names import ANN_ISOLATION as ANN_ISOLATION
from gpusched.core.names import ANN_TOPOLOGY as ANN_TOPOLOGY
from gpusched.core.names import ANN_UNHEALTHY_GPUS
from gpusched.core.names import TAINT_UNHEALTHY as TAINT_UNHEALTHY
from gpusched.doctor.findings import Finding
from gpusched.k8s.convert import (
    ANN_ASSIGNMENT,
    LABEL_MEMORY,
    LABEL_PRODUCT,
    RES_GPU,
    RES_SHARE,
    InvalidRequest,
    node_from_k8s,
    parse_assignment,
    pod_from_k8s,
)
from gpusched.k8s.dra.mixed import SharedGpu, UnmappedNode, describe, describe_unmapped
from gpusched.k8s.state import share_without_slot

ANN_UNHEALTHY = ANN_UNHEALTHY_GPUS
LABEL_COUNT = "nvidia.com/gpu.count"
DRIVER_PREFIXES = ("nvidia.com/cuda.driver", "nvidia.com/cuda.runtime", "nvidia.com/gpu.driver")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ann(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _int(v: object) -> int | None:
    try:
        return int(str(v))
    except ValueError:
        return None


# ------------------------------------------------------------------------------------- DRA
def mixed_findings(
    shared: Mapping[str, tuple[SharedGpu, ...]], unmapped: Mapping[str, UnmappedNode] | None = None
) -> list[Finding]:
    """A warning per node whose GPUs a DRA driver's ResourceSlice and gpusched's agent (device plugin)
    both serve, naming the GPUs, the claims' GPUs gpusched books as taken, and what it does; an
    error per node where the two cannot be matched (``UnmappedNode``), which gpusched refuses."""
    unmapped = unmapped or {}
    lines = describe(shared)
    refused = [
        Finding("node", "error", "dra-mixed-refused", line, {"gpus": u.gpus, "driver": u.driver}, n)
        for line, (n, u) in zip(describe_unmapped(unmapped), unmapped.items(), strict=True)
    ]
    return refused + [
        Finding(
            "node",
            "warn",
            "dra-mixed-node",
            line,
            {
                "gpus": [g.index for g in gs],
                "claimed": [g.index for g in gs if g.claimed],
                "driver": gs[0].device.driver,
                "pool": gs[0].device.pool,
            },
            node,
        )
        for line, (node, gs) in zip(lines, shared.items(), strict=True)
    ]


# ------------------------------------------------------------------------------------- node
def node_findings(node: Mapping[str, Any], spec: NodeSpec | None = None) -> list[Finding]:
    """Inventory, health, driver labels, registration and allocatable of one Node object;
    ``spec``: the node as already converted (``node_from_k8s``), else it is converted here."""
    meta = _meta(node)
    name = str(meta.get("name"))
    labels: Mapping[str, str] = meta.get("labels") or {}
    status = node.get("status") or {}
    cap: Mapping[str, Any] = status.get("capacity") or {}
    alloc: Mapping[str, Any] = status.get("allocatable") or cap
    out: list[Finding] = []

    def add(sev: str, code: str, msg: str, **ev: Any) -> None:
        out.append(Finding("node", sev, code, msg, ev, name))

    if spec is None:
        try:
            spec = node_from_k8s(node)
        except InvalidRequest as e:
            add("error", "node-unreadable", f"node {name} cannot be booked: {e}")
            return out
    product, count_label = labels.get(LABEL_PRODUCT), labels.get(LABEL_COUNT)
    inventory = {
        "gpus": spec.gpu_count,
        "model": spec.gpu_model,
        "gpu_memory_mib": spec.gpu_memory_mib,
        LABEL_PRODUCT: product,
        LABEL_MEMORY: labels.get(LABEL_MEMORY),
        LABEL_COUNT: count_label,
    }
    if spec.gpu_count == 0 and not product:
        add("info", "no-gpus", f"node {name} has no GPUs (no {RES_GPU} and no {LABEL_PRODUCT} label)")
        return out
    mig_only = spec.mig is not None and not spec.gpu_count  # mixed strategy: slices, no nvidia.com/gpu
    mig_res = {k: v for k, v in alloc.items() if str(k).startswith("nvidia.com/mig-")}
    add(
        "ok",
        "inventory",
        f"{len(spec.mig.gpus)} MIG GPU(s) ({', '.join(sorted({g.geometry.model for g in spec.mig.gpus}))})"
        if mig_only and spec.mig is not None
        else f"{spec.gpu_count} × {spec.gpu_model}"
        + (f", {spec.gpu_memory_mib} MiB each" if spec.gpu_memory_mib else ""),
        **inventory,
    )
    if spec.gpu_count and not product:
        add(
            "warn",
            "no-product-label",
            f"node {name}: no {LABEL_PRODUCT} label: its GPUs are booked as "
            "'unknown-gpu' and pods asking for a model never land there",
            **inventory,
        )
    if spec.gpu_count and not spec.gpu_memory_mib:
        add(
            "warn",
            "no-memory-label",
            f"node {name}: no {LABEL_MEMORY} label: GPU memory unknown, so no pod "
            "asking for gpu-memory lands there",
            **inventory,
        )
    # registration: the device plugin advertises nvidia.com/gpu (and gpu-share for shares)
    if mig_only:
        add(
            "ok",
            "device-plugin-registered",
            f"MIG slices advertised: {mig_res or 'none'}",
            allocatable=mig_res,
        )
    elif RES_GPU not in cap and RES_GPU not in alloc:
        add(
            "error",
            "device-plugin-not-registered",
            f"node {name} has a {product} label but no {RES_GPU} "
            "in capacity: the device plugin (gpusched agent) has not registered",
            capacity=dict(cap),
        )
    elif RES_SHARE not in alloc:
        add(
            "info",
            "no-share-slots",
            f"node {name}: no {RES_SHARE} in allocatable: gpusched's agent is not "
            "the device plugin here, so GPU shares cannot be admitted",
            allocatable=dict(alloc),
        )
    else:
        add(
            "ok",
            "device-plugin-registered",
            f"{RES_GPU} and {RES_SHARE} advertised",
            allocatable={RES_GPU: alloc.get(RES_GPU), RES_SHARE: alloc.get(RES_SHARE)},
        )
    out.extend(_conflict_findings(node, name))
    # allocatable against the inventory
    n_cap, n_alloc = _int(cap.get(RES_GPU, alloc.get(RES_GPU, 0))), _int(alloc.get(RES_GPU, 0))
    if (
        count_label is not None
        and _int(count_label) is not None
        and n_cap is not None
        and _int(count_label) != n_cap
    ):
        add(
            "error",
            "inventory-mismatch",
            f"node {name}: label {LABEL_COUNT}={count_label} but capacity "
            f"{RES_GPU}={n_cap}: the labels and the device plugin disagree",
            label=count_label,
            capacity=n_cap,
        )
    if n_cap is not None and n_alloc is not None and n_alloc < n_cap:
        add(
            "warn",
            "allocatable-below-capacity",
            f"node {name}: allocatable {RES_GPU}={n_alloc} < capacity "
            f"{n_cap}: the kubelet holds back {n_cap - n_alloc} unhealthy device(s)",
            capacity=n_cap,
            allocatable=n_alloc,
        )
    # health
    bad = sorted(spec.unhealthy_gpus)
    if bad:
        add(
            "error",
            "unhealthy-gpu",
            f"node {name}: GPU(s) {', '.join(map(str, bad))} unhealthy "
            f"(annotation {ANN_UNHEALTHY}): they take no new pod",
            unhealthy=bad,
            annotation=_ann(node).get(ANN_UNHEALTHY),
        )
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == TAINT_UNHEALTHY]
    if taints:
        add("warn", "unhealthy-taint", f"node {name}: tainted {TAINT_UNHEALTHY}", taints=taints)
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conds and conds.get("Ready") != "True":
        add("error", "node-not-ready", f"node {name} is not Ready ({conds.get('Ready')})", conditions=conds)
    if (node.get("spec") or {}).get("unschedulable"):
        add("warn", "cordoned", f"node {name} is cordoned (spec.unschedulable)")
    out += isolation_findings(node)
    driver = {k: v for k, v in labels.items() if k.startswith(DRIVER_PREFIXES)}
    if driver:
        add("ok", "driver-labels", ", ".join(f"{k}={v}" for k, v in sorted(driver.items())), **driver)
    else:
        add(
            "info",
            "no-driver-labels",
            f"node {name}: no driver labels (nvidia.com/cuda.driver-version.*): "
            "pods selecting a driver version never land here",
        )
    return out


def _conflict_findings(node: Mapping[str, Any], name: str) -> list[Finding]:
    """Two device plugins serving the same GPUs (the agent's ``gpusched.io/device-plugin-conflict``)."""
    raw = _ann(node).get(ANN_CONFLICT)
    if raw is None:
        return []
    try:
        found = json.loads(raw)
        resources = {str(r): [str(s) for s in socks] for r, socks in found["resources"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return [
            Finding("node", "error", "device-plugin-conflict-unreadable",
                    f"node {name}: annotation {ANN_CONFLICT} is not JSON of resources to sockets: {raw!r}",
                    {"annotation": raw}, name)
        ]  # fmt: skip
    others = sorted({s for socks in resources.values() for s in socks})
    msg = (
        f"node {name}: two device plugins serve its GPUs: gpusched's agent and {', '.join(others)} both "
        f"advertise {', '.join(sorted(resources))}. The kubelet hands out the devices of whichever "
        "registered last (a restart of either flips it), so containers may not get the GPUs "
        f"{ANN_ASSIGNMENT} names: run one of them here (remove NVIDIA's device plugin from this node, or "
        "run the agent with --no-nvidia-resources)"
    )
    return [Finding("node", "error", "device-plugin-conflict", msg, {"resources": resources}, name)]


def isolation_findings(node: Mapping[str, Any]) -> list[Finding]:
    """What enforces GPU shares on the node, and whether an unprivileged pod can pick its GPUs by
    ``NVIDIA_VISIBLE_DEVICES``: from the agent's ``gpusched.io/gpu-isolation`` annotation (nothing
    without it)."""
    name = str(_meta(node).get("name"))
    raw = _ann(node).get(ANN_ISOLATION)
    if raw is None:
        return []
    out: list[Finding] = []

    def add(sev: str, code: str, msg: str, **ev: Any) -> None:
        out.append(Finding("node", sev, code, msg, ev, name))

    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        add("warn", "isolation-unreadable", f"node {name}: annotation {ANN_ISOLATION} is not JSON: {raw!r}")
        return out
    mode = data.get("sharing")
    if mode == "none":
        add(
            "warn",
            "shares-not-enforced",
            f"node {name}: GPU shares are scheduled but not enforced (agent --sharing none): a share can "
            "use its whole GPU's memory and compute and crash its neighbours; run the agent with "
            "--sharing mps (or hami-core)",
            sharing=mode,
        )
    elif mode in ("mps", "hami-core"):
        add("ok", "shares-enforced", f"GPU shares enforced by {mode}", sharing=mode)
    if data.get("visibleDevicesEnvvar") is True:
        add(
            "warn",
            "visible-devices-envvar",
            f"node {name}: the NVIDIA container toolkit ({data.get('toolkitConfig')}) has "
            "accept-nvidia-visible-devices-envvar-when-unprivileged = true: any pod can set "
            "NVIDIA_VISIBLE_DEVICES itself and use GPUs it was not given; set it to false "
            "(volume-mounts or CDI)",
            toolkitConfig=data.get("toolkitConfig"),
        )
    return out


# ---------------------------------------------------------------------------- device plugin
def topology_indices(node: Mapping[str, Any] | None) -> dict[str, int]:
    """GPU UUID -> scheduler index from the node's topology annotation ({} when absent or bad)."""
    raw = _ann(node or {}).get(ANN_TOPOLOGY)
    if not raw:
        return {}
    try:
        gpus = json.loads(raw)["gpus"]
        return {str(g["uuid"]): int(g["index"]) for g in gpus}
    except (ValueError, KeyError, TypeError):
        return {}


def allocated_devices(pod: Mapping[str, Any]) -> tuple[list[str], str]:
    """Device IDs of nvidia.com/gpu and gpu-share that the device plugin recorded (share slots
    cut to their GPU's UUID), and "" or why the annotation could not be read."""
    raw = _ann(pod).get(ANN_ALLOCATED)
    if raw is None:
        return [], ""
    try:
        data = json.loads(raw)
        ids = [
            str(d)
            for res in data.values()
            for r, devs in res.items()
            if r in (RES_GPU, RES_SHARE)
            for d in devs
        ]
    except (ValueError, AttributeError, TypeError):
        return [], f"annotation {ANN_ALLOCATED} is not valid JSON of containers to devices: {raw!r}"
    return [d.split("::", 1)[0] for d in ids], ""


def drift_findings(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, booked: PodSpec | None = None
) -> list[Finding]:
    """What the scheduler believes (the assignment) against what the node did (nodeName, the
    device plugin's allocation). Empty for a pod not bound or without GPUs. ``booked``: the pod
    as the books already hold it, else it is converted here."""
    meta, spec = _meta(pod), pod.get("spec") or {}
    key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
    bound = spec.get("nodeName")
    out: list[Finding] = []

    def add(sev: str, code: str, msg: str, **ev: Any) -> None:
        out.append(Finding("device", sev, code, msg, ev, key))

    try:
        core = booked or pod_from_k8s(pod, constraints="lenient")
        assignment = parse_assignment(pod)
    except InvalidRequest as e:
        add("error", "pod-unreadable", str(e))
        return out
    if not bound or not core.num_gpu:
        return out
    slots = ((node or {}).get("status") or {}).get("allocatable") or {}
    if RES_SHARE in slots and share_without_slot(pod):
        add(
            "error",
            "share-without-slot",
            f"pod {key} asks for a GPU share without the {RES_SHARE}: 1 slot that gpusched's webhook adds: "
            f"the kubelet on {bound} never asks gpusched's agent for it, so it runs with no GPU isolation "
            "(no NVIDIA_VISIBLE_DEVICES, no limits; under the NVIDIA runtime's default it sees every GPU). "
            "Create it again where the webhook sees it (its namespace not excluded) or with the slot",
        )
    raw = _ann(pod).get(ANN_ASSIGNMENT)
    if assignment is None:
        add(
            "warn",
            "no-assignment",
            f"pod {key} is bound to {bound} with GPUs but has no {ANN_ASSIGNMENT}: "
            "not placed by gpusched; the books give it the freest GPUs",
        )
        return out
    a_node, a_gpus = assignment
    if a_node != bound:
        add(
            "error",
            "drift-node",
            f"drift: {ANN_ASSIGNMENT} says node {a_node}, the pod runs on {bound}",
            assignment=raw,
            node_name=bound,
        )
    devices, why = allocated_devices(pod)
    if why:
        add("error", "allocated-unreadable", f"pod {key}: {why}")
        return out
    if not devices:
        add(
            "info",
            "no-allocation-record",
            f"pod {key}: no {ANN_ALLOCATED} from the device plugin (not "
            "gpusched's agent on this node, or not admitted yet): drift cannot be checked",
            assignment=raw,
        )
        return out
    index = topology_indices(node)
    unknown = [d for d in devices if d not in index]
    got = sorted({index[d] for d in devices if d in index})
    ev = {"assignment": raw, "allocated": _ann(pod).get(ANN_ALLOCATED), "allocated_gpus": got}
    if unknown and index:
        add(
            "error",
            "drift-unknown-device",
            f"drift: the device plugin handed pod {key} device(s) "
            f"{', '.join(sorted(set(unknown)))} that node {bound}'s {ANN_TOPOLOGY} does not list",
            **ev,
        )
    elif not index:
        n_dev = len(set(devices))
        if n_dev != len(a_gpus):
            add(
                "error",
                "drift-count",
                f"drift: {ANN_ASSIGNMENT} names {len(a_gpus)} GPU(s), the device plugin handed out {n_dev}",
                **ev,
            )
        else:
            add(
                "info",
                "allocation-unmapped",
                f"pod {key}: node {bound} has no {ANN_TOPOLOGY}: only the GPU "
                "count could be compared (it agrees)",
                **ev,
            )
    elif got != sorted(a_gpus):
        add(
            "error",
            "drift-gpus",
            f"drift: the scheduler booked GPU(s) {sorted(a_gpus)} of {bound} for pod "
            f"{key}, the device plugin handed out GPU(s) {got}",
            **ev,
        )
    else:
        add("ok", "allocation-agrees", f"device plugin handed out GPU(s) {got} as assigned", **ev)
    return out
