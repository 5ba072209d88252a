"""Evicting pods through the Eviction API (``policy/v1``, ``pods/eviction``), with graceful termination.

An eviction is a delete that the API server first checks against the pod's PodDisruptionBudgets:
it is refused (``429 TooManyRequests``, cause ``DisruptionBudget``) when the pod's budget has no
disruption left. Accepted, the pod gets its ``deletionTimestamp`` and terminates gracefully
(its ``terminationGracePeriodSeconds`` unless ``grace_period_s`` says otherwise), holding its
node's resources until it is gone — the scheduler's books keep it until then.

``Evictor.evict`` answers with one ``Eviction`` whose ``outcome`` says what happened:

====================  =========================================================================
``EVICTED``           201/200: accepted; the pod is terminating (or already was).
``BLOCKED``           429 with a ``DisruptionBudget`` cause: a PodDisruptionBudget forbids it now;
                      ``budget`` names it when the API said which; retry later
                      (``retry_after_s``).
``GONE``              404: no such pod; or 409: the pod of that name has another UID (it was
                      replaced): the pod meant is gone either way.
``FAILED``            anything else (403, 500 — e.g. a pod matched by more than one budget,
                      which the API refuses to evict —, a 429 from API priority and fairness,
                      a network error); ``message`` says what.
====================  =========================================================================

``Evictor.delete`` is the plain graceful delete (UID precondition), for a caller that must
remove a pod a budget protects (kube-scheduler's preemption does, when no choice spares every
budget); its outcome is ``EVICTED`` or ``GONE`` or ``FAILED`` in the same terms.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from gpusched.k8s.binder import REQUEST_TIMEOUT_S, describe

log = logging.getLogger(__name__)

_DEFAULT_RETRY_S = 10.0


class Outcome(enum.Enum):
    EVICTED = "evicted"
    BLOCKED = "blocked"
    GONE = "gone"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Eviction:
    """What the API said to one eviction (or delete) of ``namespace/name``."""

    namespace: str
    name: str
    outcome: Outcome
    status: int = 0
    """The HTTP status (0: no answer)."""
    message: str = ""
    budget: str = ""
    """For ``BLOCKED``: the PodDisruptionBudget the API named (``""`` when it named none)."""
    retry_after_s: float = 0.0
    """For ``BLOCKED``: when to try again."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def done(self) -> bool:
        """The pod is leaving or gone: nothing more to do for it."""
        return self.outcome in (Outcome.EVICTED, Outcome.GONE)


def _body(e: Exception) -> dict[str, Any]:
    raw = getattr(e, "body", None)
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _budget_named(message: str) -> str:
    """The budget's name in the API's cause message ("The disruption budget NAME needs ...",
    "The disruption budget NAME is still being processed by the server.")."""
    prefix = "The disruption budget "
    if message.startswith(prefix):
        return message[len(prefix) :].split(" ", 1)[0]
    return ""


def _retry_after(e: Exception, details: dict[str, Any]) -> float:
    headers = getattr(e, "headers", None) or {}
    for value in (details.get("retryAfterSeconds"), headers.get("Retry-After")):
        try:
            if value is not None and float(value) > 0:
                return float(value)
        except (TypeError, ValueError):
            continue
    return _DEFAULT_RETRY_S


def classify(namespace: str, name: str, e: Exception) -> Eviction:
    """The ``Eviction`` that an API error of an eviction (or delete) call stands for."""
    status = getattr(e, "status", None)
    if not isinstance(status, int):
        return Eviction(namespace, name, Outcome.FAILED, 0, describe(e))
    body = _body(e)
    details = body.get("details") or {}
    message = str(body.get("message") or describe(e))
    if status == 404:
        return Eviction(namespace, name, Outcome.GONE, status, message)
    if status == 409:  # the UID precondition failed: the pod of that name is another one
        return Eviction(namespace, name, Outcome.GONE, status, message)
    if status == 429:
        causes = [c for c in details.get("causes") or [] if isinstance(c, dict)]
        budget = [
            c for c in causes if c.get("reason") == "DisruptionBudget" or c.get("type") == "DisruptionBudget"
        ]
        if budget or "disruption budget" in message:
            named = next((_budget_named(str(c.get("message") or "")) for c in budget), "")
            why = "; ".join(str(c.get("message")) for c in budget if c.get("message")) or message
            return Eviction(namespace, name, Outcome.BLOCKED, status, why, named, _retry_after(e, details))
    return Eviction(namespace, name, Outcome.FAILED, status, message)


class Evictor:
    """Evicts pods through ``pods/eviction``. ``core`` is a ``kubernetes.client.CoreV1Api``."""

    def __init__(self, core: Any, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.core = core
        self.timeout_s = timeout_s

    @staticmethod
    def _options(uid: str, grace_period_s: int | None, dry_run: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if uid:
            opts["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            opts["gracePeriodSeconds"] = int(grace_period_s)
        if dry_run:
            opts["dryRun"] = ["All"]
        return opts

    def evict(
        self,
        namespace: str,
        name: str,
        uid: str = "",
        *,
        grace_period_s: int | None = None,
        dry_run: bool = False,
    ) -> Eviction:
        """Ask the API to evict ``namespace/name`` (only if its UID is still ``uid``, when given).
        ``grace_period_s`` None: the pod's own ``terminationGracePeriodSeconds``. ``dry_run``:
        the API checks everything (budgets included) and changes nothing. Never raises for an
        API answer: the outcome says it."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": self._options(uid, grace_period_s, dry_run),
        }
        try:
            resp = self.core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=self.timeout_s
            )
        except Exception as e:
            out = classify(namespace, name, e)
            log.debug("evicting %s/%s: %s %s", namespace, name, out.outcome.value, out.message)
            return out
        return Eviction(namespace, name, Outcome.EVICTED, int(getattr(resp, "status", 201) or 201))

    def delete(
        self, namespace: str, name: str, uid: str = "", *, grace_period_s: int | None = None
    ) -> Eviction:
        """A graceful delete that no budget checks (``BLOCKED`` never comes back)."""
        body = self._options(uid, grace_period_s, False)
        try:
            resp = self.core.delete_namespaced_pod(
                name, namespace, body=body, _preload_content=False, _request_timeout=self.timeout_s
            )
        except Exception as e:
            out = classify(namespace, name, e)
            if out.outcome is Outcome.BLOCKED:  # never from a delete; keep the promise anyway
                return Eviction(namespace, name, Outcome.FAILED, out.status, out.message)
            return out
        return Eviction(namespace, name, Outcome.EVICTED, int(getattr(resp, "status", 200) or 200))
