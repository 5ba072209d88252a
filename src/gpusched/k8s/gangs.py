"""Gangs in the standalone scheduler: a PodGroup's pods bind together, or none of them does.

This module keeps the membership (which pods name which group) and each group's status; the
decision is ``core.batch.run_cycle``'s and the acting ``k8s/actuator.py``'s, as for every pod.
A popped pod that names a group (``k8s/podgroups.py``: Kubernetes' ``PodGroup``, coscheduling's,
Volcano's) is not decided alone: the group's pending pods (``Gangs.members``) are decided as one
unit, in one cycle, under the cluster lock (``core.gang.place_gang``): at least the members still
missing from the group's minimum fit at once (they are assumed, then bound), or nothing is booked. So the
scheduler never holds part of a gang while it waits for the rest, and two gangs that each need
more than half the free GPUs cannot deadlock: the first one decided runs, the other waits as a
unit, its pods and its group told why (``FailedScheduling`` / ``GangWaiting``).

- A group that is missing, not served (its CRD absent), or malformed, and a group whose minimum
  is larger than the pods that name it: an event naming the field; nothing is bound; the pods
  wait (they are tried again when the group changes or a pod joins it).
- Timeout (``scheduleTimeoutSeconds``; 60 s for the APIs without one): a group still waiting
  after it gets ``GangTimeout`` on the group and its pods; as nothing is held, nothing needs
  releasing: its pods go on backing off as unschedulable pods do, and the clock starts again.
- The group's status says whether it was placed, where its API has one (``groupstatus.py``).
- Members beyond the minimum that did not fit with the gang are scheduled later one by one,
  as coscheduling does, once the minimum is bound.
- **Tenant queues** (``k8s/tenants.py``): a gang under a queue (its members' queue, from the
  first member) is admitted by it as a unit (``core.batch.run_cycle`` with the queue book): its
  members that would bind this cycle fit its quota (plus borrowing) together, or none binds; an
  unknown or invalid queue makes it wait with an event naming the queue. A gang whose queue would
  stay within its own quota reclaims borrowed quota as a single pod does: the victims leave by
  the Eviction API, and the members' charges are reserved in the queue until they are gone.
- **Preemption** (a gang under no queue, preemption on): a gang that does not fit is a
  preemptor as a unit (``core.preemption_gang``): the fewest lower-priority victims (whole gangs,
  PodDisruptionBudget-safe first) with which its minimum fits at once; they leave by the
  Eviction API and each member is nominated where it will land (the room kept while they go).
- **Rooms**: a gang never lands in a room kept for another pod of at least its priority (a
  nominated preemptor's, or defragmentation's): ``k8s.preemption.Rooms`` holds them in the
  snapshot while it is decided.
- **DRA claims**: each member's claims are resolved as a single pod's (``k8s/claims.py``; a member
  whose claim is not ready is told why and left out, like an unconvertible one); the core allocates
  the members' claims jointly (``core/gangclaims.py``) and the actuator writes every member's claims
  before it binds any, or none (``DraClaims.write_all``).
- Each decision counts one scheduling attempt per member tried (``Actuator.act``), with its
  result, as kube-scheduler counts pods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpusched.core.model import PodSpec
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.groupref import API, GroupRef
from gpusched.k8s.groupstatus import GroupStatusWriter
from gpusched.k8s.podevents import PodEvent
from gpusched.k8s.podgroups import DEFAULT_TIMEOUT_S, GroupSpec, PodGroups
from gpusched.k8s.queue import QueuedPod, SchedulingQueue
from gpusched.k8s.state import LiveCluster

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Members:
    """A popped gang member's group, to be decided as a unit: ``pending`` (queued pod, spec named
    as the gang) the members that can be decided, in pending order; ``invalid`` those that
    cannot (queued pod, why); ``keys`` every member; ``bound`` the members bound already."""

    group: GroupSpec
    keys: list[str]
    pending: list[tuple[QueuedPod, PodSpec]]
    bound: int
    invalid: list[tuple[QueuedPod, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A popped gang member whose group cannot be decided: ``group`` None (it is missing: the pod
    alone is told), or the group refused (``reason`` ``InvalidPodGroup``) or waiting for members
    (``GangIncomplete``); ``attempt`` the result its attempt counts as."""

    message: str
    attempt: str
    group: GroupSpec | None = None
    keys: list[str] = field(default_factory=list)
    reason: str = ""


class Gangs:
    """Which pods name which group, and each group's status (decided by ``core.batch.run_cycle``
    and carried out by ``k8s/actuator.py`` like every popped pod)."""

    def __init__(
        self,
        queue: SchedulingQueue,
        cluster: LiveCluster,
        events: EventRecorder,
        groups_of: Callable[[Callable[[GroupRef], None]], PodGroups],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queue = queue
        self.cluster = cluster
        self.events = events
        self.groups = groups_of(self._group_changed)
        self.status = GroupStatusWriter(self.groups.custom, events)
        self._clock = clock
        self._lock = threading.Lock()
        self._members: dict[GroupRef, set[str]] = {}
        self._ref_of: dict[str, GroupRef] = {}
        self._waiting_since: dict[GroupRef, float] = {}

    # ------------------------------------------------------------ membership
    def on_pod_event(self, ev: PodEvent) -> None:
        """Every pod event: keep the members of each group (live pods, pending or bound)."""
        key, ref, gone = ev.key, ev.group, not ev.live
        with self._lock:
            old = self._ref_of.get(key)
            if old is not None and (gone or old != ref):
                self._ref_of.pop(key, None)
                members = self._members.get(old)
                if members is not None:
                    members.discard(key)
                    if not members:
                        del self._members[old]
                        self._waiting_since.pop(old, None)
            if ref is None or gone or old == ref:
                return
            self._ref_of[key] = ref
            self._members.setdefault(ref, set()).add(key)
            others = list(self._members[ref] - {key})
        self.queue.activate(others)  # one more member: the group may be complete now

    def _group_changed(self, ref: GroupRef) -> None:
        if self.groups.get(ref) is None:  # deleted
            self.status.forget(ref)
        with self._lock:
            keys = list(self._members.get(ref, ()))
        self.queue.activate(keys)

    def group_of(self, qp: QueuedPod) -> GroupRef | None:
        with self._lock:
            return self._ref_of.get(qp.key)

    # ------------------------------------------------------------ the unit
    def members(self, qp: QueuedPod) -> Members | Refusal | None:
        """The group ``qp`` belongs to, with its pending members (each with its converted spec; one
        that cannot be converted is listed invalid); a ``Refusal`` when the group cannot be decided;
        None when ``qp`` is no gang member (decided alone)."""
        ref = self.group_of(qp) or qp.event.group
        if ref is None:
            return None
        group = self.groups.get(ref)
        if group is None:
            return Refusal(self._missing(ref), "unschedulable", keys=[qp.key])
        with self._lock:
            keys = sorted(self._members.get(ref, set()) | {qp.key})
        if not group.problem and group.min_member == 0:
            return None  # Kubernetes' basic policy: not a gang
        if group.problem:
            msg = f"{group.ref.describe()}: {group.problem}; nothing is bound"
            return Refusal(msg, "error", group, keys, "InvalidPodGroup")
        bound = sum(1 for k in keys if self.cluster.is_bound_or_assumed(k))
        pending = self._pending_members(keys, qp)
        if bound + len(pending) < group.min_member:
            field_ = _min_field(ref)
            msg = (
                f"{group.ref.describe()}: {field_} is {group.min_member} but only {bound + len(pending)} "
                f"pod(s) name the group ({bound} bound); nothing is bound until "
                f"{group.min_member - bound - len(pending)} more arrive"
            )
            return Refusal(msg, "unschedulable", group, keys, "GangIncomplete")
        out = Members(group, keys, [], bound)
        for m in pending:  # the members that can be decided: converted (claims: ``scheduler``)
            try:
                out.pending.append((m, _in_gang(m.spec(), group)))
            except InvalidRequest as e:
                out.invalid.append((m, f"{group.ref.describe()}: member {m.key}: {e}"))
        return out

    def _pending_members(self, keys: list[str], qp: QueuedPod) -> list[QueuedPod]:
        out = [qp]
        for k in keys:
            if k == qp.key or self.cluster.is_bound_or_assumed(k):
                continue
            other = self.queue.get(k)
            if other is not None:
                out.append(other)
        return sorted(out, key=lambda m: m.order)

    def _missing(self, ref: GroupRef) -> str:
        a = ref.api.value
        if not self.groups.watching(ref.api):
            return (
                f"{a.field} names {ref.describe()}, but the API server does not serve {a.api_version} "
                f"{a.plural} (is its CRD installed?); nothing is bound"
            )
        return f"{a.field} names {ref.describe()}, which does not exist; the pod waits, nothing is bound"

    # ------------------------------------------------------------ group status
    def refused(self, group: GroupSpec, msg: str, reason: str) -> None:
        """Bad input: the group told (an event, its status)."""
        self.events.about(self.status.involved(group), "Warning", reason, msg)
        self.status.unschedulable(group, msg)

    def waited(self, group: GroupSpec, msg: str, reason: str = "GangWaiting") -> str:
        """The group waits as a unit (too few pods, or not all fit at once): told so; past its
        timeout also ``GangTimeout``, and the clock starts again. Returns the timeout message for
        its pods ("" when not past it)."""
        now = self._clock()
        with self._lock:
            since = self._waiting_since.setdefault(group.ref, now)
            expired = now - since >= group.timeout_s
            if expired:
                self._waiting_since[group.ref] = now
        self.events.about(self.status.involved(group), "Warning", reason, msg)
        self.status.unschedulable(group, msg)
        if not expired:
            return ""
        timeout = (
            f"{group.ref.describe()}: not placed within {group.timeout_s:g}s "
            f"({_timeout_field(group.ref)}); released: no member holds anything, "
            "its pods back off and are tried again"
        )
        self.events.about(self.status.involved(group), "Warning", "GangTimeout", timeout)
        return timeout

    def placed(self, group: GroupSpec, placed: int, bound: int) -> None:
        """``placed`` members were placed at once (``bound`` were already)."""
        with self._lock:
            self._waiting_since.pop(group.ref, None)
        self.status.placed(group, bound + placed)
        self.events.about(
            self.status.involved(group), "Normal", "GangScheduled",
            f"{placed} pod(s) placed at once ({bound} already bound; minimum {group.min_member})",
        )  # fmt: skip


def _in_gang(pod: PodSpec, group: GroupSpec) -> PodSpec:
    return pod if pod.gang == group.ref.name else replace(pod, gang=group.ref.name)


def _min_field(ref: GroupRef) -> str:
    return "spec.schedulingPolicy.gang.minCount" if ref.api is API.WORKLOAD else "spec.minMember"


def _timeout_field(ref: GroupRef) -> str:
    if ref.api is API.COSCHEDULING:
        return "spec.scheduleTimeoutSeconds"
    return f"{ref.api.value.api_version} has no timeout field: gpusched's {DEFAULT_TIMEOUT_S:g}s"
