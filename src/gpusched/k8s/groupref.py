"""Which gang group a pod names, in the three APIs jobs carry (no I/O; ``podgroups.py`` watches
the groups themselves, ``convert.py`` records the name as ``PodSpec.gang``).

- Kubernetes ``scheduling.k8s.io/v1beta1`` PodGroup: the pod's ``spec.schedulingGroup.podGroupName``;
- scheduler-plugins coscheduling ``scheduling.x-k8s.io/v1alpha1``: label ``scheduling.x-k8s.io/pod-group``;
- Volcano ``scheduling.volcano.sh/v1beta1``: annotation ``scheduling.k8s.io/group-name``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GroupAPI:
    group: str
    version: str
    plural: str
    kind: str
    field: str
    """Where a pod names its group (for messages)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


class API(enum.Enum):
    WORKLOAD = GroupAPI(
        "scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup", "spec.schedulingGroup.podGroupName"
    )
    COSCHEDULING = GroupAPI(
        "scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", "label scheduling.x-k8s.io/pod-group"
    )
    VOLCANO = GroupAPI(
        "scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", "annotation scheduling.k8s.io/group-name"
    )


LABEL_COSCHEDULING = "scheduling.x-k8s.io/pod-group"
ANN_VOLCANO = "scheduling.k8s.io/group-name"


@dataclass(frozen=True, slots=True)
class GroupRef:
    api: API
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.api.value.group}/{self.namespace}/{self.name}"

    def describe(self) -> str:
        a = self.api.value
        return f"{a.kind} {self.namespace}/{self.name} ({a.api_version})"


def group_ref_of(pod: Mapping[str, Any]) -> GroupRef | None:
    """The group ``pod`` names, if any (Kubernetes' field first, then coscheduling, then Volcano)."""
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    sg = (pod.get("spec") or {}).get("schedulingGroup") or {}
    if sg.get("podGroupName"):
        return GroupRef(API.WORKLOAD, ns, str(sg["podGroupName"]))
    name = (meta.get("labels") or {}).get(LABEL_COSCHEDULING)
    if name:
        return GroupRef(API.COSCHEDULING, ns, str(name))
    name = (meta.get("annotations") or {}).get(ANN_VOLCANO)
    if name:
        return GroupRef(API.VOLCANO, ns, str(name))
    return None


def group_name_of(pod: Mapping[str, Any]) -> str:
    """The name of the group ``pod`` names ("" for none): its ``PodSpec.gang`` (within its namespace)."""
    ref = group_ref_of(pod)
    return ref.name if ref is not None else ""
