"""The AdmissionReview envelope shared by the webhook's endpoints: the request read, the answer built."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any


def open_review(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """(the request, the answer: allowed, untouched); ValueError when ``body`` is no AdmissionReview."""
    request = body.get("request")
    if not isinstance(request, Mapping) or not request.get("uid"):
        raise ValueError("not an AdmissionReview: request.uid is missing")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    return request, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def deny(answer: dict[str, Any], code: int, reason: str, message: str) -> dict[str, Any]:
    answer["response"]["allowed"] = False
    answer["response"]["status"] = {"code": code, "reason": reason, "message": message}
    return answer


def patch(answer: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    if ops:
        answer["response"]["patchType"] = "JSONPatch"
        answer["response"]["patch"] = base64.b64encode(
            json.dumps(ops, separators=(",", ":")).encode()
        ).decode()
    return answer


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` in a key escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def object_key(request: Mapping[str, Any], obj: Mapping[str, Any]) -> str:
    """namespace/name of the object reviewed (a pod of a ReplicaSet has only a generateName yet)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or request.get("namespace") or "default"
    name = meta.get("name") or request.get("name") or f"{meta.get('generateName') or ''}<generated>"
    return f"{ns}/{name}"
