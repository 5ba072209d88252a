"""GPU health on the Node object, for the scheduler's books.

The agent writes the annotation ``gpusched.io/unhealthy-gpus`` on its Node: the scheduler's GPU indices (the
``gpus`` of ``gpusched.io/assignment``) of the GPUs that failed, comma-separated in ascending order ("0,3");
absent
or "" when all are healthy. When every GPU of the node has failed it also adds the taint
``gpusched.io/gpu-unhealthy=true:NoSchedule``; recovery removes both.

The scheduler side (``gpusched.k8s.convert.node_from_k8s``) calls :func:`parse_unhealthy_gpus` on the
annotation
and keeps those GPUs out of its books. It must take the GPU count from ``status.capacity["nvidia.com/gpu"]``:
the kubelet leaves unhealthy devices out of ``allocatable``, which would renumber the GPUs.

This module is pure (dicts in, dicts out) so that both sides can import it without the agent's dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpusched.core.names import ANN_UNHEALTHY_GPUS as ANN_UNHEALTHY_GPUS
from gpusched.core.names import TAINT_UNHEALTHY as TAINT_UNHEALTHY
from gpusched.core.names import format_unhealthy_gpus as format_unhealthy_gpus
from gpusched.core.names import parse_unhealthy_gpus as parse_unhealthy_gpus


def unhealthy_gpus_of_node(node: Mapping[str, Any]) -> frozenset[int]:
    """:func:`parse_unhealthy_gpus` on a v1.Node dict: what ``node_from_k8s`` should call."""
    meta = node.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANN_UNHEALTHY_GPUS)
    return parse_unhealthy_gpus(value, f"node {meta.get('name', '?')}")


def health_patch(node: Mapping[str, Any], unhealthy: Iterable[int], gpu_count: int) -> dict[str, Any] | None:
    """A JSON merge patch that brings the node's annotation and taint in line with ``unhealthy`` (None when
    the
    node already agrees). ``spec.taints`` is replaced whole, keeping every taint but ours."""
    bad = sorted(set(unhealthy))
    meta = node.get("metadata") or {}
    current = (meta.get("annotations") or {}).get(ANN_UNHEALTHY_GPUS)
    want_ann = format_unhealthy_gpus(bad) or None
    taints = list((node.get("spec") or {}).get("taints") or [])
    has_taint = any(t.get("key") == TAINT_UNHEALTHY for t in taints)
    want_taint = gpu_count > 0 and len([i for i in bad if i < gpu_count]) >= gpu_count
    patch: dict[str, Any] = {}
    if (current or None) != want_ann:
        patch["metadata"] = {"annotations": {ANN_UNHEALTHY_GPUS: want_ann}}
    if has_taint != want_taint:
        kept = [t for t in taints if t.get("key") != TAINT_UNHEALTHY]
        if want_taint:
            kept.append({"key": TAINT_UNHEALTHY, "value": "true", "effect": "NoSchedule"})
        patch["spec"] = {"taints": kept}
    return patch or None


def labels_patch(
    node: Mapping[str, Any], labels: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any] | None:
    """A merge patch for only the labels and annotations whose values differ (so that where GFD writes the
    same
    labels, neither writer changes anything)."""
    meta = node.get("metadata") or {}
    have_l = meta.get("labels") or {}
    have_a = meta.get("annotations") or {}
    dl = {k: v for k, v in labels.items() if have_l.get(k) != v}
    da = {k: v for k, v in annotations.items() if have_a.get(k) != v}
    if not dl and not da:
        return None
    m: dict[str, Any] = {}
    if dl:
        m["labels"] = dl
    if da:
        m["annotations"] = da
    return {"metadata": m}
