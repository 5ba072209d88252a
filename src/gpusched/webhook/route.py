"""GPU pods go to gpusched (``/route``): the mixed-schedulers rule (issue 29 item 7).

gpusched's agent serves a GPU only to the pod its ``gpusched.io/assignment`` names; a GPU pod that
another scheduler placed (kube-scheduler for a pod that names no ``schedulerName``) would be refused
on the node (``UnexpectedAdmissionError``) after being booked nowhere. So at admission, a new pod
that asks for GPUs (``nvidia.com/gpu``, ``gpusched.io/gpu-milli``, ``gpusched.io/gpu-memory``):

- naming one of gpusched's schedulers is left as it is;
- naming another scheduler is routed: its ``spec.schedulerName`` becomes gpusched's (the first
  name given) and the annotation ``gpusched.io/routed-from`` keeps what it named;
- created with ``spec.nodeName`` (placed by no scheduler) is denied, with the way out: a
  ``nodeSelector`` on ``kubernetes.io/hostname`` puts it on that node through gpusched. Mirror pods
  (a kubelet's static pods) are left alone: the kubelet runs them whatever the API says.

A namespace opts out with the label ``gpusched.io/gpu-routing=disabled`` (the registration's
namespaceSelector): its GPU pods then go where they name, and on a node that runs gpusched's agent
as the device plugin of ``nvidia.com/gpu`` a pod gpusched did not place fails there with a Warning
event saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.core.names import ANN_ROUTED_FROM as ANN_ROUTED_FROM
from gpusched.core.names import LABEL_GPU_ROUTING
from gpusched.k8s.convert import InvalidRequest, wants_gpu
from gpusched.webhook.review import deny, object_key, open_review, patch, pointer

OPT_OUT_LABEL = LABEL_GPU_ROUTING
ANN_MIRROR = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Routing:
    """gpusched's scheduler names: GPU pods naming none of them get the first."""

    schedulers: tuple[str, ...]

    @classmethod
    def of(cls, names: Sequence[str]) -> Routing:
        return cls(tuple(dict.fromkeys(n for n in names if n)))

    @property
    def enabled(self) -> bool:
        return bool(self.schedulers)


def route_patch(request: Mapping[str, Any], routing: Routing) -> list[dict[str, Any]]:
    """The JSONPatch that routes the pod of a CREATE request to gpusched ([] when it needs none). Raises
    InvalidRequest (the denial's message) for a GPU pod created with ``spec.nodeName``."""
    pod = request.get("object")
    if (
        not routing.enabled
        or (request.get("kind") or {}).get("kind") != "Pod"
        or request.get("operation") != "CREATE"
        or not isinstance(pod, Mapping)
        or not wants_gpu(pod)
    ):
        return []
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if ANN_MIRROR in annotations:
        return []
    key, target = object_key(request, pod), routing.schedulers[0]
    if spec.get("nodeName"):
        node = spec["nodeName"]
        raise InvalidRequest(
            f"pod {key} asks for GPUs and is created with spec.nodeName {node}, placed by no scheduler: "
            f"gpusched's agent serves GPUs only to pods gpusched placed, so it would fail on the node. "
            f"Leave spec.nodeName out and set spec.schedulerName: {target} (a nodeSelector "
            f"kubernetes.io/hostname: {node} keeps it on that node), or label the namespace "
            f"{OPT_OUT_LABEL}=disabled to place GPU pods yourself there"
        )
    named = str(spec.get("schedulerName") or "default-scheduler")
    if named in routing.schedulers:
        return []
    ops: list[dict[str, Any]] = [{"op": "add", "path": pointer("spec", "schedulerName"), "value": target}]
    if "annotations" not in meta or meta["annotations"] is None:
        ops.append(
            {"op": "add", "path": pointer("metadata", "annotations"), "value": {ANN_ROUTED_FROM: named}}
        )
    else:
        ops.append({"op": "add", "path": pointer("metadata", "annotations", ANN_ROUTED_FROM), "value": named})
    return ops


def route_review(body: Mapping[str, Any], routing: Routing) -> dict[str, Any]:
    """An AdmissionReview answered: allowed untouched, allowed with the routing patch, or denied (400)."""
    request, answer = open_review(body)
    try:
        ops = route_patch(request, routing)
    except InvalidRequest as e:
        return deny(answer, 400, "BadRequest", str(e))
    return patch(answer, ops)
