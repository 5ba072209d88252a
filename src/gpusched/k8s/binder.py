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

from kubernetes import client

from gpusched.k8s.convert import ANN_ASSIGNMENT


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
