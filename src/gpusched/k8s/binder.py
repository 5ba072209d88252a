"""Binding a pod: write the device assignment annotation, then create ``pods/binding``.

The annotation goes first so that the node side (device plugin) and a restarted scheduler
see exactly which GPUs the pod holds before it can start. Both calls carry the pod's UID
as a precondition, so a pod deleted and recreated under the same name is never bound by
mistake.

With ``in_binding=True`` the annotation travels in the Binding's own metadata instead: the
apiserver copies a Binding's annotations onto the pod in the same write that sets
``spec.nodeName`` (one API call instead of two, and annotation and binding are atomic).
"""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client

from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.k8s.convert import ANN_ASSIGNMENT, assignment_annotation


def describe(e: Exception) -> str:
    """One line for an exception; for a kubernetes ApiException, its status and message."""
    status = getattr(e, "status", None)
    if isinstance(status, int):
        body = getattr(e, "body", None)
        try:
            msg = orjson.loads(body).get("message") if body else None
        except (orjson.JSONDecodeError, AttributeError):
            msg = None
        return f"{status} {getattr(e, 'reason', '') or ''}: {msg or body or ''}".strip(": ")
    return f"{type(e).__name__}: {e}"


def bind_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    assignment: str,
    *,
    in_binding: bool = False,
) -> None:
    """Annotate and bind; raises kubernetes ApiException on failure (e.g. 409 already bound)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if assignment and in_binding:
        meta["annotations"] = {ANN_ASSIGNMENT: assignment}
    elif assignment:
        patch: dict[str, Any] = {"metadata": {"annotations": {ANN_ASSIGNMENT: assignment}}}
        if uid:
            patch["metadata"]["uid"] = uid  # a strategic-merge precondition: fails if the UID differs
        core.patch_namespaced_pod(name, namespace, patch, _preload_content=False)
    body: Any = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    core.create_namespaced_binding(namespace, body, _preload_content=False)


class APIBinder:
    """The Bind plugin of the Kubernetes front ends (kube-scheduler's DefaultBinder plus the
    device assignment): a ``pods/binding`` call that carries the assignment annotation.

    Answers SUCCESS, UNSCHEDULABLE_AND_UNRESOLVABLE when the API says the pod is gone (404)
    or already bound / recreated under another UID (409: retrying cannot help), and ERROR
    with the API's status for anything worth retrying. ``in_binding``: the assignment
    annotation travels in the Binding (one call) or is patched onto the pod first.
    """

    name = "APIBinder"

    def __init__(self, core: client.CoreV1Api, *, in_binding: bool = True) -> None:
        self.core = core
        self.in_binding = in_binding

    def bind(self, pod: PodSpec, node_name: str, gpus: tuple[int, ...]) -> Status:
        try:
            bind_pod(
                self.core, pod.namespace, pod.name, pod.uid, node_name,
                assignment_annotation(node_name, gpus, pod), in_binding=self.in_binding,
            )  # fmt: skip
        except Exception as e:
            final = getattr(e, "status", None) in (404, 409)
            code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if final else Code.ERROR
            return Status(code, (describe(e),), self.name)
        return Status.success()
