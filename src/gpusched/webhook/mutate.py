"""The mutation, pure: which containers of a pod get ``gpusched.io/gpu-share: 1``, as a JSONPatch.

A container gets the slot (in ``resources.limits`` and ``resources.requests``) when it asks for
``gpusched.io/gpu-milli`` and/or ``gpusched.io/gpu-memory`` without ``nvidia.com/gpu`` (whole GPUs
come through ``nvidia.com/gpu`` devices and need no slot) and carries no ``gpusched.io/gpu-share``
yet. Init containers are treated alike. A pod asking for none of gpusched's resources is left
untouched (allowed, no patch).

A share request that gpusched would refuse anyway is denied at admission, with the message of
``gpusched.k8s.convert`` naming the container and the field: ``gpu-milli`` 0 or over 1000, ``gpu-memory``
0, a share's milli beside ``nvidia.com/gpu``, a ``gpu-share`` other than 1 on a share container, or a
pod whose containers together ask for more than one GPU's share.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any

from gpusched.k8s.convert import (
    RES_GPU,
    RES_MEMORY,
    RES_MILLI,
    RES_SHARE,
    InvalidRequest,
    container_gpu_request,
    pod_from_k8s,
    wants_gpu,
)

SHARE_SLOT = "1"
KINDS = ("initContainers", "containers")


def _pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` in a key escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _named(pod: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The pod with a name and namespace for the messages (a pod from a ReplicaSet has only a
    generateName at admission, and the namespace may be only in the request)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    if not meta.get("name"):
        meta["name"] = f"{meta.get('generateName') or ''}<generated>"
    if not meta.get("namespace") and namespace:
        meta["namespace"] = namespace
    return out


def share_patch(pod: Mapping[str, Any], namespace: str = "") -> list[dict[str, Any]]:
    """The JSONPatch that gives every share container its ``gpusched.io/gpu-share: 1`` (``[]`` when
    none needs it). Raises InvalidRequest naming the pod, the container and the field for a share
    request gpusched would refuse."""
    if not wants_gpu(pod):
        return []
    named = _named(pod, namespace)
    spec = named.get("spec") or {}
    ops: list[dict[str, Any]] = []
    for kind in KINDS:
        for i, c in enumerate(spec.get(kind) or []):
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            names = {*limits, *requests}
            if not names & {RES_MILLI, RES_MEMORY, RES_GPU}:
                continue
            container_gpu_request(named, kind, i)  # raises naming the container and the field
            if RES_GPU in names or not (RES_MILLI in names or RES_MEMORY in names):
                continue  # whole GPUs: nvidia.com/gpu devices, no slot
            if RES_SHARE in names:
                for field, have in (("limits", limits), ("requests", requests)):
                    if RES_SHARE in have and str(have[RES_SHARE]) != SHARE_SLOT:
                        key = f"{named['metadata'].get('namespace', 'default')}/{named['metadata']['name']}"
                        raise InvalidRequest(
                            f"pod {key} {kind}[{i}] ({c.get('name') or '?'}): resources.{field}.{RES_SHARE} "
                            f"must be {SHARE_SLOT} for a GPU share (one slot of the GPU the scheduler "
                            f"assigns), got {have[RES_SHARE]!r}"
                        )
                continue  # already carries its slot
            base = ("spec", kind, i, "resources")
            if "resources" not in c or c["resources"] is None:
                ops.append(
                    {
                        "op": "add",
                        "path": _pointer(*base),
                        "value": {"limits": {RES_SHARE: SHARE_SLOT}, "requests": {RES_SHARE: SHARE_SLOT}},
                    }
                )
                continue
            for field in ("limits", "requests"):
                if res.get(field) is None:
                    op = {"op": "add", "path": _pointer(*base, field), "value": {RES_SHARE: SHARE_SLOT}}
                else:
                    op = {"op": "add", "path": _pointer(*base, field, RES_SHARE), "value": SHARE_SLOT}
                ops.append(op)
    pod_from_k8s(named, constraints="skip")  # the pod as a whole (e.g. shares adding up to over one GPU)
    return ops


def review(body: Mapping[str, Any]) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview answered: the pod allowed with its JSONPatch, allowed
    untouched, or denied (HTTP-like code 400) with a message naming the container and the field."""
    request = body.get("request")
    if not isinstance(request, Mapping) or not request.get("uid"):
        raise ValueError("not an AdmissionReview: request.uid is missing")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    kind = request.get("kind") or {}
    obj = request.get("object")
    if kind.get("kind") != "Pod" or request.get("operation") != "CREATE" or not isinstance(obj, Mapping):
        return out
    try:
        ops = share_patch(obj, str(request.get("namespace") or ""))
    except InvalidRequest as e:
        response["allowed"] = False
        response["status"] = {"code": 400, "reason": "BadRequest", "message": str(e)}
        return out
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return out
