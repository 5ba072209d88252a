"""Gangs in the standalone scheduler: a PodGroup's pods bind together, or none of them does.

A popped pod that names a group (``k8s/podgroups.py``: Kubernetes' ``PodGroup``, coscheduling's,
Volcano's) is not decided alone: the group's pending pods are decided as one unit, in one cycle,
under the cluster lock (``core.gang.place_gang``): at least the members still missing from the
group's minimum fit at once (they are assumed, then bound), or nothing is booked. So the
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
- A member is never a preemptor: gang-aware preemption (a whole gang making room) is left to
  the core's DefaultPreemption for single pods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import Profile
from gpusched.core.gang import GangSpec, Unit, place_gang
from gpusched.core.model import PodSpec
from gpusched.core.scheduler import ScheduleResult
from gpusched.k8s.claims import claims_message
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.groupref import API, GroupRef, group_ref_of
from gpusched.k8s.groupstatus import GroupStatusWriter
from gpusched.k8s.podgroups import DEFAULT_TIMEOUT_S, GroupSpec, PodGroups
from gpusched.k8s.queue import QueuedPod, SchedulingQueue
from gpusched.k8s.state import TERMINAL, LiveCluster, pod_key

log = logging.getLogger(__name__)

Bind = Callable[[Profile, QueuedPod, PodSpec, str, tuple[int, ...]], object]


@dataclass(frozen=True, slots=True)
class GangHost:
    """What the gang path needs from the scheduler that owns it."""

    queue: SchedulingQueue
    cluster: LiveCluster
    events: EventRecorder
    spec: Callable[[QueuedPod], PodSpec]
    """The pod's converted spec (raises ``InvalidRequest``)."""
    profile: Callable[[PodSpec, ClusterState], Profile]
    tiebreak: Callable[[ClusterState], I64]
    """Called under the snapshot: notes the state, returns the tie-break order."""
    bind: Bind
    """Bind one assumed member (asynchronously)."""


@dataclass(frozen=True, slots=True)
class GangOutcome:
    placed: int
    waiting: int
    message: str = ""


class Gangs:
    """Which pods name which group, and the all-or-nothing decision for a popped member."""

    def __init__(self, host: GangHost, groups_of: Callable[[Callable[[GroupRef], None]], PodGroups],
                 *, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.host = host
        self.groups = groups_of(self._group_changed)
        self.status = GroupStatusWriter(self.groups.custom, host.events)
        self._clock = clock
        self._lock = threading.Lock()
        self._members: dict[GroupRef, set[str]] = {}
        self._ref_of: dict[str, GroupRef] = {}
        self._waiting_since: dict[GroupRef, float] = {}

    # ------------------------------------------------------------ membership
    def on_pod(self, obj: Mapping[str, Any], deleted: bool) -> None:
        """Every pod event: keep the members of each group (live pods, pending or bound)."""
        key = pod_key(obj)
        ref = group_ref_of(obj)
        gone = deleted or (obj.get("metadata") or {}).get("deletionTimestamp") is not None
        gone = gone or (obj.get("status") or {}).get("phase") in TERMINAL
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
        self.host.queue.activate(others)  # one more member: the group may be complete now

    def _group_changed(self, ref: GroupRef) -> None:
        with self._lock:
            keys = list(self._members.get(ref, ()))
        self.host.queue.activate(keys)

    def group_of(self, qp: QueuedPod) -> GroupRef | None:
        with self._lock:
            return self._ref_of.get(qp.key)

    # ------------------------------------------------------------ deciding
    def schedule(self, qp: QueuedPod) -> bool:
        """Decide ``qp`` if it names a gang (and its pending fellow members with it); returns
        False when it is not a gang member (the caller decides it alone)."""
        ref = self.group_of(qp) or group_ref_of(qp.obj)
        if ref is None:
            return False
        group = self.groups.get(ref)
        if group is None:
            self._missing(qp, ref)
            return True
        with self._lock:
            keys = sorted(self._members.get(ref, set()) | {qp.key})
        if not group.problem and group.min_member == 0:
            return False  # Kubernetes' basic policy: not a gang
        if group.problem:
            msg = f"{group.ref.describe()}: {group.problem}; nothing is bound"
            self._refuse(group, keys, msg, "InvalidPodGroup")
            return True
        bound = sum(1 for k in keys if self.host.cluster.is_bound_or_assumed(k))
        pending = self._pending_members(keys, qp)
        if bound + len(pending) < group.min_member:
            field = _min_field(ref)
            msg = (
                f"{group.ref.describe()}: {field} is {group.min_member} but only {bound + len(pending)} "
                f"pod(s) name the group ({bound} bound); nothing is bound until "
                f"{group.min_member - bound - len(pending)} more arrive"
            )
            self._waited(group, keys, msg, "GangIncomplete")
            return True
        members = self._specs(group, pending)
        outcome = self._place(group, members, bound)
        if not outcome.placed:
            self._waited(group, [m.key for m, _ in members] or keys, outcome.message)
        return True

    def _pending_members(self, keys: list[str], qp: QueuedPod) -> list[QueuedPod]:
        out = [qp]
        for k in keys:
            if k == qp.key or self.host.cluster.is_bound_or_assumed(k):
                continue
            other = self.host.queue.get(k)
            if other is not None:
                out.append(other)
        return sorted(out, key=lambda m: m.order)

    def _specs(self, group: GroupSpec, pending: list[QueuedPod]) -> list[tuple[QueuedPod, PodSpec]]:
        """The members that can be decided: converted, without DRA claims, named as the gang."""
        out = []
        for m in pending:
            claims = claims_message(m.obj)
            try:
                if claims:
                    raise InvalidRequest(claims)
                spec = self.host.spec(m)
            except InvalidRequest as e:
                self.host.events.failed(m.obj, f"{group.ref.describe()}: member {m.key}: {e}")
                self._done(m, unschedulable=True)
                continue
            out.append((m, _in_gang(spec, group)))
        return out

    def _place(self, group: GroupSpec, members: list[tuple[QueuedPod, PodSpec]], bound: int) -> GangOutcome:
        if not members:
            return GangOutcome(0, 0, f"{group.ref.describe()}: no member can be decided")
        need = max(0, group.min_member - bound)
        gang = GangSpec(group.ref.name, group.ref.namespace, group.min_member, int(group.timeout_s))
        unit = Unit(gang.key, tuple(p for _, p in members), need, gang)
        by_key = {p.key: m for m, p in members}
        with self.host.cluster.snapshot() as snap:
            tiebreak = self.host.tiebreak(snap)
            profile = self.host.profile(unit.pods[0], snap)
            r = place_gang(profile, unit, snap, tiebreak=tiebreak)
            placed: list[ScheduleResult] = list(r.placed)
            log.debug(
                "%s: need %d (%d bound) of %s: %s", group.ref.describe(), need, bound,
                [p.key for p in unit.pods], r.status.message() or f"{len(placed)} placed",
            )  # fmt: skip
            for res in placed:
                self.host.cluster.assume(res.pod, res.node, res.gpus)
        if not placed:
            why = r.status.message() if not r.scheduled else "no member fits"
            return GangOutcome(0, len(members), f"{group.ref.describe()}: {why}")
        for res in placed:
            m = by_key[res.pod.key]
            self._done(m, unschedulable=False)
            self.host.bind(profile, m, res.pod, res.node_name, res.gpus)
        for key in r.left_out:
            self._done(by_key[key], unschedulable=True)
        with self._lock:
            self._waiting_since.pop(group.ref, None)
        self.status.placed(group, bound + len(placed))
        self.host.events.about(
            self.status.involved(group), "Normal", "GangScheduled",
            f"{len(placed)} pod(s) placed at once ({bound} already bound; minimum {group.min_member})",
        )  # fmt: skip
        return GangOutcome(len(placed), len(r.left_out))

    # ------------------------------------------------------------ waiting
    def _missing(self, qp: QueuedPod, ref: GroupRef) -> None:
        a = ref.api.value
        if not self.groups.watching(ref.api):
            msg = (
                f"{a.field} names {ref.describe()}, but the API server does not serve {a.api_version} "
                f"{a.plural} (is its CRD installed?); nothing is bound"
            )
        else:
            msg = f"{a.field} names {ref.describe()}, which does not exist; the pod waits, nothing is bound"
        self.host.events.failed(qp.obj, msg)
        self._done(qp, unschedulable=True)

    def _refuse(self, group: GroupSpec, keys: list[str], msg: str, reason: str) -> None:
        """Bad input: the group and every pending member told, nothing bound."""
        self.host.events.about(self.status.involved(group), "Warning", reason, msg)
        self.status.unschedulable(group, msg)
        self._tell(keys, msg)

    def _waited(self, group: GroupSpec, keys: list[str], msg: str, reason: str = "GangWaiting") -> None:
        """The group waits as a unit (too few pods, or not all fit at once); past its timeout it
        is told so (``GangTimeout``) and the clock starts again."""
        now = self._clock()
        with self._lock:
            since = self._waiting_since.setdefault(group.ref, now)
            expired = now - since >= group.timeout_s
            if expired:
                self._waiting_since[group.ref] = now
        self.host.events.about(self.status.involved(group), "Warning", reason, msg)
        self.status.unschedulable(group, msg)
        if expired:
            timeout = (
                f"{group.ref.describe()}: not placed within {group.timeout_s:g}s "
                f"({_timeout_field(group.ref)}); released: no member holds anything, "
                "its pods back off and are tried again"
            )
            self.host.events.about(self.status.involved(group), "Warning", "GangTimeout", timeout)
            self._tell(keys, timeout, reason="GangTimeout")
        self._tell(keys, msg)

    def _tell(self, keys: list[str], msg: str, reason: str = "FailedScheduling") -> None:
        for k in keys:
            m = self.host.queue.get(k)
            if m is None:
                continue
            self.host.events.failed(m.obj, msg, reason=reason, condition=reason == "FailedScheduling")
            self._done(m, unschedulable=True)

    def _done(self, m: QueuedPod, *, unschedulable: bool) -> None:
        if unschedulable:
            self.host.queue.park(m.key)
        else:
            self.host.queue.done(m.key)
            self.host.queue.remove(m.key)


def _in_gang(pod: PodSpec, group: GroupSpec) -> PodSpec:
    return pod if pod.gang == group.ref.name else replace(pod, gang=group.ref.name)


def _min_field(ref: GroupRef) -> str:
    return "spec.schedulingPolicy.gang.minCount" if ref.api is API.WORKLOAD else "spec.minMember"


def _timeout_field(ref: GroupRef) -> str:
    if ref.api is API.COSCHEDULING:
        return "spec.scheduleTimeoutSeconds"
    return f"{ref.api.value.api_version} has no timeout field: gpusched's {DEFAULT_TIMEOUT_S:g}s"
