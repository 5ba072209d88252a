"""Who may write gpusched's assignment annotations (``/guard``): only gpusched's own identities.

``gpusched.io/assignment`` (the GPUs a pod holds, written by the scheduler or the extender when it
binds) and ``gpusched.io/allocated`` (the devices the node agent handed out) are trusted by the
agent's ``Allocate`` and by the scheduler's books after a restart. Anyone else who writes them could
take a GPU another pod holds (issue 28 F3): a pod created with ``spec.nodeName`` and a hand-written
assignment. So a request that sets, changes or removes either annotation is denied (HTTP 403) unless
its user (``request.userInfo.username``) is one of that annotation's writers: on a Pod CREATE and
UPDATE, and on a Binding CREATE (``bindings`` or ``pods/binding``: its annotations are copied onto
the pod).

The registration (deploy/) sends only such requests (matchConditions: the annotations present or
changed, the user not a writer), so no other request waits for the webhook, and fails closed
(failurePolicy Fail): with the webhook down, nobody but gpusched's identities writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.core.names import ANN_ALLOCATED as ANN_ALLOCATED
from gpusched.core.names import ANN_ASSIGNMENT as ANN_ASSIGNMENT
from gpusched.webhook.review import deny, object_key, open_review


def service_account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


DEFAULT_ASSIGNMENT_WRITERS = (
    service_account("gpusched-system", "gpusched"),  # the standalone scheduler (deploy/manifests/standalone)
    service_account("gpusched-system", "gpusched-extender"),  # the extender binds in extender mode
)
DEFAULT_ALLOCATED_WRITERS = (service_account("gpusched-node", "gpusched-agent"),)


@dataclass(frozen=True)
class Writers:
    """The users who may write each guarded annotation (exact ``userInfo.username`` values)."""

    assignment: frozenset[str] = frozenset(DEFAULT_ASSIGNMENT_WRITERS)
    allocated: frozenset[str] = frozenset(DEFAULT_ALLOCATED_WRITERS)

    @classmethod
    def of(cls, assignment: Iterable[str] = (), allocated: Iterable[str] = ()) -> Writers:
        """The given writers; an empty list stands for the defaults (deploy/manifests' service accounts)."""
        a, b = frozenset(assignment), frozenset(allocated)
        return cls(a or frozenset(DEFAULT_ASSIGNMENT_WRITERS), b or frozenset(DEFAULT_ALLOCATED_WRITERS))

    def of_annotation(self) -> dict[str, frozenset[str]]:
        return {ANN_ASSIGNMENT: self.assignment, ANN_ALLOCATED: self.allocated}


def _annotations(obj: object) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        return {}
    return (obj.get("metadata") or {}).get("annotations") or {}


def forged(request: Mapping[str, Any], writers: Writers) -> str | None:
    """Why ``request`` is denied (None: allowed): it sets, changes or removes a guarded annotation and its
    user is not one of that annotation's writers."""
    kind = (request.get("kind") or {}).get("kind")
    op = request.get("operation")
    if kind not in ("Pod", "Binding") or op not in ("CREATE", "UPDATE"):
        return None
    obj = request.get("object")
    new = _annotations(obj)
    old = _annotations(request.get("oldObject")) if op == "UPDATE" else {}
    user = str((request.get("userInfo") or {}).get("username") or "")
    for annotation, allowed in writers.of_annotation().items():
        if new.get(annotation) == old.get(annotation) or user in allowed:
            continue
        what = "sets" if annotation not in old else "removes" if annotation not in new else "changes"
        target = f"pod {object_key(request, obj if isinstance(obj, Mapping) else {})}"
        if kind == "Binding":
            target = f"the binding of {target}"
        return (
            f"{user or 'an anonymous user'} {what} annotation {annotation} on {target} ({op}): only "
            f"{', '.join(sorted(allowed))} may write it. gpusched's scheduler writes the assignment when it "
            "binds a pod and its node agent the allocation; set spec.schedulerName (never spec.nodeName "
            "with an assignment) and let them. A pod copied from another (kubectl get -o yaml) must leave "
            "both annotations out"
        )
    return None


def guard_review(body: Mapping[str, Any], writers: Writers) -> dict[str, Any]:
    """An AdmissionReview answered: allowed untouched, or denied (403 Forbidden) naming the user, the
    annotation, the pod and who may write it."""
    request, answer = open_review(body)
    why = forged(request, writers)
    return answer if why is None else deny(answer, 403, "Forbidden", why)
