"""What the standalone scheduler writes on a gang's group object: its status, where its API has one.

- Kubernetes ``scheduling.k8s.io/v1beta1`` PodGroup: the condition ``PodGroupInitiallyScheduled``
  (True / reason ``Scheduled`` once placed; False / ``Unschedulable`` with the reason before; never
  back to False once True, as the API documents), through the ``status`` subresource.
- coscheduling ``scheduling.x-k8s.io/v1alpha1``: ``phase`` (``Pending`` / ``Scheduled``), through
  ``status``.
- Volcano ``scheduling.volcano.sh/v1beta1`` (its CRD has no status subresource): ``phase``
  (``Pending`` / ``Running``) and the ``Unschedulable`` / ``Scheduled`` condition, on the object.

Writes are best effort and asynchronous (behind the events); each distinct state once per group
object (a group deleted is forgotten, so one created again under its name starts afresh). The event
recorder runs writes on several threads, so a queued write does not carry its body: it sends the
group's latest wanted state when it runs, one send at a time. Two writes queued in a row (waiting,
then placed) therefore cannot land in the wrong order and leave a placed group marked waiting.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

from gpusched.k8s.events import STALE, EventRecorder
from gpusched.k8s.groupref import API, GroupRef
from gpusched.k8s.podgroups import GroupSpec


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(api: API, placed: bool, count: int, message: str, since: str = "") -> dict[str, Any]:
    """The merge patch that records the group as placed (``count`` members) or waiting;
    ``since``: when it last went from one to the other (the conditions' ``lastTransitionTime``;
    now when empty)."""
    now = since or _now()
    if api is API.WORKLOAD:
        cond = {
            "type": "PodGroupInitiallyScheduled",
            "status": "True" if placed else "False",
            "reason": "Scheduled" if placed else "Unschedulable",
            "message": message[:1024],
            "lastTransitionTime": now,
        }
        return {"status": {"conditions": [cond]}}
    if api is API.COSCHEDULING:
        return {"status": {"phase": "Scheduled" if placed else "Pending"}}  # its status has no count
    cond = {
        "type": "Scheduled" if placed else "Unschedulable",
        "status": "True",
        "reason": "tasks in gang are ready to be scheduled" if placed else "NotEnoughResources",
        "message": message[:1024],
        "lastTransitionTime": now,
    }
    return {"status": {"phase": "Running" if placed else "Pending", "conditions": [cond]}}


class GroupStatusWriter:
    def __init__(self, custom: Any, events: EventRecorder) -> None:
        self.custom = custom
        self.events = events
        self._lock = threading.Lock()  # guards the maps and the set below
        self._send_lock = threading.Lock()  # one patch at a time: the latest wanted state wins
        self._want: dict[GroupRef, tuple[bool, int, str]] = {}
        self._since: dict[GroupRef, tuple[bool, str]] = {}  # placed or not, since when
        self._sent: dict[GroupRef, tuple[bool, int, str]] = {}
        self._placed_once: set[GroupRef] = set()

    @staticmethod
    def involved(group: GroupSpec) -> dict[str, Any]:
        """The group as an event's ``involvedObject``."""
        a = group.ref.api.value
        return {
            "apiVersion": a.api_version,
            "kind": a.kind,
            "namespace": group.ref.namespace,
            "name": group.ref.name,
            "uid": group.uid,
        }

    def placed(self, group: GroupSpec, count: int) -> None:
        msg = f"{count} pod(s) placed (minimum {group.min_member})"
        with self._lock:
            self._placed_once.add(group.ref)
        self._write(group.ref, (True, count, msg))

    def unschedulable(self, group: GroupSpec, message: str) -> None:
        with self._lock:
            if group.ref.api is API.WORKLOAD and group.ref in self._placed_once:
                return  # PodGroupInitiallyScheduled never goes back to False
        self._write(group.ref, (False, 0, message))

    def forget(self, ref: GroupRef) -> None:
        """The group was deleted: drop what was wanted and sent for it, so that a group created
        again under its name (a Job run again) gets its own status, and nothing is kept for it."""
        with self._lock:
            self._want.pop(ref, None)
            self._since.pop(ref, None)
            self._sent.pop(ref, None)
            self._placed_once.discard(ref)

    def _write(self, ref: GroupRef, state: tuple[bool, int, str]) -> None:
        with self._lock:
            if self._want.get(ref) == state:
                return
            self._want[ref] = state
            if self._since.get(ref, (None,))[0] != state[0]:  # a transition, not a new count or message
                self._since[ref] = (state[0], _now())
        self.events.write(lambda: self._send(ref))

    def _send(self, ref: GroupRef) -> str | None:
        """Patch the group with its latest wanted state, unless that was sent already. A failed
        patch raises: the recorder logs it and counts it failed, and the next state is sent anew."""
        with self._send_lock:
            with self._lock:
                want = self._want.get(ref)
                if want is None or self._sent.get(ref) == want:
                    return STALE  # the group is gone, or an earlier write sent this state
                since = self._since[ref][1]
            self._patch(ref, status_body(ref.api, *want, since=since))
            with self._lock:
                self._sent[ref] = want
            return None

    def _patch(self, ref: GroupRef, body: dict[str, Any]) -> None:
        a = ref.api.value
        args = (a.group, a.version, ref.namespace, a.plural, ref.name, body)
        if ref.api is API.VOLCANO:  # its CRD has no status subresource
            self.custom.patch_namespaced_custom_object(*args, _preload_content=False)
        else:
            self.custom.patch_namespaced_custom_object_status(*args, _preload_content=False)
