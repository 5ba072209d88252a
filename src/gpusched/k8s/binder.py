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

from typing import Any, Protocol

import orjson
from kubernetes import client

from gpusched.core.mig.books import MigSlot
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.k8s.convert import ANN_ASSIGNMENT, assignment_annotation
from gpusched.k8s.rest import FastCoreV1

Core = client.CoreV1Api | FastCoreV1
"""Either client for the binder's calls: ``FastCoreV1`` (the hot path), or the generated one."""


def fast(core: Core) -> Core:
    """``FastCoreV1`` on a ``CoreV1Api``'s connection pool; anything else (a fake) as it is."""
    return FastCoreV1(core.api_client) if isinstance(core, client.CoreV1Api) else core


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


REQUEST_TIMEOUT_S = 30.0
"""Client-side limit on one binding or read-back call: an apiserver that hangs must not hold a
binding thread forever (the outcome then counts as unknown)."""


def read_pod(core: Core, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as the API has it now (a quorum read), None when it does not exist (404);
    raises on any other failure."""
    try:
        resp: Any = core.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )
    except Exception as e:
        if getattr(e, "status", None) == 404:
            return None
        raise
    obj: dict[str, Any] = orjson.loads(resp.data)
    return obj


def bind_pod(
    core: Core,
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
        core.patch_namespaced_pod(
            name, namespace, patch, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )
    body: Any = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    core.create_namespaced_binding(
        namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
    )


class MigBooks(Protocol):
    """Where the binder reads the MIG slices booked for a pod (``k8s.state.LiveCluster``)."""

    def mig_of(self, key: str) -> tuple[MigSlot, ...]: ...


class APIBinder:
    """The Bind plugin of the Kubernetes front ends (kube-scheduler's DefaultBinder plus the
    device assignment): a ``pods/binding`` call that carries the assignment annotation.

    Answers SUCCESS; UNSCHEDULABLE_AND_UNRESOLVABLE when the API says the pod is gone (404);
    UNSCHEDULABLE when the API answered with a refusal that wrote nothing (4xx but 404, 409,
    429); ERROR when **the outcome is unknown**: no answer (connection lost, timeout), 5xx, 429,
    or 409 (already bound, perhaps by an earlier attempt whose answer was lost; or recreated
    under another UID). ``k8s/binding.py`` settles those by reading the pod back.
    ``in_binding``: the assignment annotation travels in the Binding (one call) or is patched
    onto the pod first. A ``CoreV1Api`` is used through ``FastCoreV1`` on its connection pool
    (the generated client's per-call work off the hot path, each answer read so that its
    connection goes back to the pool).
    """

    name = "APIBinder"

    def __init__(self, core: Core, *, in_binding: bool = True, mig: MigBooks | None = None) -> None:
        self.core = fast(core)
        self.in_binding = in_binding
        self.mig = mig
        """The books' MIG slices, written into the assignment (None: MIG slices are not placed)."""

    def bind(self, pod: PodSpec, node_name: str, gpus: tuple[int, ...]) -> Status:
        try:
            bind_pod(
                self.core, pod.namespace, pod.name, pod.uid, node_name,
                assignment_annotation(node_name, gpus, pod, self._mig(pod)), in_binding=self.in_binding,
            )  # fmt: skip
        except Exception as e:
            return Status(outcome_code(getattr(e, "status", None)), (describe(e),), self.name)
        return Status.success()

    def _mig(self, pod: PodSpec) -> tuple[MigSlot, ...]:
        return self.mig.mig_of(pod.key) if self.mig is not None and pod.mig else ()


def outcome_code(http_status: object) -> Code:
    """The bind plugin's code for a failed API call with ``http_status`` (None: no answer)."""
    if http_status == 404:
        return Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    if isinstance(http_status, int) and 400 <= http_status < 500 and http_status not in (409, 429):
        return Code.UNSCHEDULABLE
    return Code.ERROR
