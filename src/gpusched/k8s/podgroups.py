"""The gang APIs users' jobs already carry, read into one typed view (``GroupSpec``).

Three APIs name a pod's all-or-nothing group:

- **Kubernetes' own** ``scheduling.k8s.io/v1beta1`` ``PodGroup`` (feature gate ``GenericWorkload``):
  the pod names it in ``spec.schedulingGroup.podGroupName``; the group's minimum is
  ``spec.schedulingPolicy.gang.minCount`` (a ``basic`` policy is no gang). Status: the condition
  ``PodGroupInitiallyScheduled``.
- **scheduler-plugins coscheduling** ``scheduling.x-k8s.io/v1alpha1`` ``PodGroup`` (Kubeflow,
  mpi-operator): label ``scheduling.x-k8s.io/pod-group``; ``spec.minMember``,
  ``spec.scheduleTimeoutSeconds``. Status: ``phase``, ``scheduled``.
- **Volcano** ``scheduling.volcano.sh/v1beta1`` ``PodGroup`` (KubeRay, Spark, Kubeflow Trainer):
  annotation ``scheduling.k8s.io/group-name``; ``spec.minMember``. Status: ``phase`` and the
  ``Unschedulable`` condition.

``PodGroups`` watches the ones the API server serves (discovery; an absent CRD is no error, it is
looked for again when a pod names it) and keeps the groups it saw. A malformed group is kept with
``problem`` set (naming the field), so that its pods get a clear event instead of a silent wait.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpusched.core.names import ANN_TOPOLOGY_PREFERRED, ANN_TOPOLOGY_REQUIRED
from gpusched.k8s.groupref import API, GroupRef
from gpusched.k8s.informer import Handlers, Reflector

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
"""How long a group waits as a whole before it is reported timed out and backs off, when its API
has no timeout of its own (coscheduling's default ``permitWaitingTimeSeconds``)."""

_REDISCOVER_S = 5.0
TOPOLOGY_ANNOTATIONS = (ANN_TOPOLOGY_REQUIRED, ANN_TOPOLOGY_PREFERRED)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    ref: GroupRef
    uid: str
    min_member: int
    """Pods that must be placed at once; 0: not a gang (Kubernetes' ``basic`` policy)."""
    timeout_s: float
    problem: str = ""
    """Why the group cannot be used as it is (names the field); empty when it is sound."""
    topology: tuple[tuple[str, str], ...] = ()
    """The group's ``gpusched.io/topology-*`` annotations (name, value), read by ``k8s/gangtopology.py``."""


def _count(value: Any, field: str, *, minimum: int) -> tuple[int, str]:
    if isinstance(value, bool) or not isinstance(value, int):
        return 0, f"{field} must be an integer, got {value!r}"
    if value < minimum:
        return 0, f"{field} must be at least {minimum}, got {value}"
    return value, ""


def group_from_k8s(api: API, obj: Mapping[str, Any]) -> GroupSpec:
    """Read a group object of ``api``; a malformed one comes back with ``problem`` set."""
    meta = obj.get("metadata") or {}
    ref = GroupRef(api, str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    uid = str(meta.get("uid") or "")
    ann = tuple(
        sorted(
            (str(k), str(v)) for k, v in (meta.get("annotations") or {}).items() if k in TOPOLOGY_ANNOTATIONS
        )
    )
    spec = obj.get("spec") or {}
    timeout, problem = DEFAULT_TIMEOUT_S, ""
    if api is API.WORKLOAD:
        policy = spec.get("schedulingPolicy") or {}
        if "gang" not in policy:
            return GroupSpec(ref, uid, 0, timeout, topology=ann)  # basic: every pod on its own
        minimum, problem = _count(
            (policy.get("gang") or {}).get("minCount"), "spec.schedulingPolicy.gang.minCount", minimum=1
        )
    else:
        minimum, problem = _count(spec.get("minMember", 1), "spec.minMember", minimum=1)
        if api is API.COSCHEDULING and spec.get("scheduleTimeoutSeconds") is not None:
            secs, why = _count(spec["scheduleTimeoutSeconds"], "spec.scheduleTimeoutSeconds", minimum=1)
            problem = problem or why
            timeout = float(secs) if not why else timeout
    return GroupSpec(ref, uid, minimum, timeout, problem, ann)


class PodGroups:
    """The groups of every served gang API, kept by reflectors; ``on_change(ref)`` after each change."""

    def __init__(
        self,
        api_client: Any,
        on_change: Callable[[GroupRef], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[GroupRef, GroupSpec] = {}
        self._reflectors: dict[API, Reflector] = {}
        self._looked_at = -1e9
        self._stopped = False

    # ------------------------------------------------------------ discovery
    def served(self, api: API) -> bool:
        a = api.value
        try:
            resources = self.custom.get_api_resources(a.group, a.version)
        except Exception as e:  # 404: the API (or the CRD) is not there
            if getattr(e, "status", None) != 404:
                log.debug("discovering %s: %s", a.api_version, e)
            return False
        return any(getattr(r, "name", "") == a.plural for r in getattr(resources, "resources", None) or [])

    def discover(self) -> list[API]:
        """Start a reflector for each served API not watched yet; returns the APIs watched."""
        with self._lock:
            self._looked_at = self._clock()
            missing = [api for api in API if api not in self._reflectors]
        for api in missing:
            if self._stopped or not self.served(api):
                continue
            a = api.value
            reflector = Reflector(
                f"{a.group}-{a.plural}",
                functools.partial(self.custom.list_cluster_custom_object, a.group, a.version, a.plural),
                Handlers(
                    functools.partial(self._upsert, api),
                    functools.partial(self._delete, api),
                    functools.partial(self._synced, api),
                ),
            )
            with self._lock:
                if api in self._reflectors or self._stopped:
                    continue
                self._reflectors[api] = reflector
            reflector.start()
            log.info("watching %s %s", a.api_version, a.plural)
        with self._lock:
            return list(self._reflectors)

    def watching(self, api: API) -> bool:
        """Whether ``api`` is watched; if not, it is looked for again (at most every few seconds)."""
        with self._lock:
            if api in self._reflectors:
                return True
            due = self._clock() - self._looked_at >= _REDISCOVER_S
        return api in self.discover() if due else False

    def synced(self) -> bool:
        with self._lock:
            return all(r.synced.is_set() for r in self._reflectors.values())

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            reflectors = list(self._reflectors.values())
        for r in reflectors:
            r.stop()

    # ------------------------------------------------------------ the groups
    def get(self, ref: GroupRef) -> GroupSpec | None:
        with self._lock:
            return self._groups.get(ref)

    def _upsert(self, api: API, obj: Mapping[str, Any]) -> None:
        g = group_from_k8s(api, obj)
        with self._lock:
            changed = self._groups.get(g.ref) != g
            self._groups[g.ref] = g
        if changed:
            self._on_change(g.ref)

    def _delete(self, api: API, obj: Mapping[str, Any]) -> None:
        ref = group_from_k8s(api, obj).ref
        with self._lock:
            self._groups.pop(ref, None)
        self._on_change(ref)

    def _synced(self, api: API, items: list[Mapping[str, Any]]) -> None:
        keep = {group_from_k8s(api, o).ref for o in items}
        with self._lock:
            gone = [r for r in self._groups if r.api is api and r not in keep]
            for r in gone:
                del self._groups[r]
        for r in gone:
            self._on_change(r)
