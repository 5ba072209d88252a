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
  nominated preemptor's, or defragmentation's): ``PreemptionHost.rooms`` holds them in the
  snapshot while it is decided.
- Each decision counts one scheduling attempt per member tried (``GangHost.attempts``), with
  its result, as kube-scheduler counts pods.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Protocol

from gpusched.core.batch import Outcome, UnitOutcome, run_cycle
from gpusched.core.cluster import I64, ClusterState
from gpusched.core.disruption import DisruptionBudgets
from gpusched.core.framework import Profile
from gpusched.core.gang import GangSpec, Unit, without_post_filters
from gpusched.core.model import PodSpec
from gpusched.core.queues.quota import QueueBook
from gpusched.k8s.claims import claims_message
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.groupref import API, GroupRef, group_ref_of
from gpusched.k8s.groupstatus import GroupStatusWriter
from gpusched.k8s.podevents import PodEvent
from gpusched.k8s.podgroups import DEFAULT_TIMEOUT_S, GroupSpec, PodGroups
from gpusched.k8s.queue import QueuedPod, SchedulingQueue
from gpusched.k8s.state import LiveCluster
from gpusched.k8s.tenants import TenantQueues, landing

log = logging.getLogger(__name__)

Bind = Callable[[Profile, QueuedPod, PodSpec, str, tuple[int, ...]], object]


class PreemptionHost(Protocol):
    """What a gang preemptor needs from the scheduler: its nominations and rooms, its
    disruption budgets, and the evictions."""

    def rooms(self, snap: ClusterState, pods: Sequence[PodSpec]) -> AbstractContextManager[object]:
        """Within the block ``snap`` holds the rooms ``pods`` must leave alone (nominated
        preemptors' and defragmentation's, of at least their priority)."""
        ...

    def may_preempt(self, placement: Sequence[tuple[str, str]], snap: ClusterState) -> str:
        """Why the members (pod key, node where it would land) may not preempt now ("" when they
        may): the victims of an earlier preemption are leaving, or too many preemptions."""
        ...

    def preempt_gang(
        self, gang: str, placement: Sequence[tuple[PodSpec, str]], victims: Sequence[PodSpec]
    ) -> None:
        """Evict ``victims`` and nominate each member where it will land."""
        ...

    def disruption_budgets(self) -> DisruptionBudgets: ...


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
    tenants: TenantQueues | None = None
    """The tenant queues (quota, borrowing, reclaim); None: none."""
    preemption: PreemptionHost | None = None
    """Rooms and preemption; None: gangs keep no rooms and preempt no one."""
    attempts: Callable[[str, float, int], object] = lambda result, seconds, pods: None
    """Counts ``pods`` scheduling attempts with ``result`` that took ``seconds``."""


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
        self.host.queue.activate(others)  # one more member: the group may be complete now

    def _group_changed(self, ref: GroupRef) -> None:
        if self.groups.get(ref) is None:  # deleted
            self.status.forget(ref)
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
            self.host.attempts("unschedulable", 0.0, 1)
            self._missing(qp, ref)
            return True
        with self._lock:
            keys = sorted(self._members.get(ref, set()) | {qp.key})
        if not group.problem and group.min_member == 0:
            return False  # Kubernetes' basic policy: not a gang
        if group.problem:
            msg = f"{group.ref.describe()}: {group.problem}; nothing is bound"
            self.host.attempts("error", 0.0, 1)
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
            self.host.attempts("unschedulable", 0.0, 1)
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
                self.host.attempts("error", 0.0, 1)
                self._done(m, unschedulable=True)
                continue
            out.append((m, _in_gang(spec, group)))
        return out

    def _place(self, group: GroupSpec, members: list[tuple[QueuedPod, PodSpec]], bound: int) -> GangOutcome:
        if not members:
            return GangOutcome(0, 0, f"{group.ref.describe()}: no member can be decided")
        t0 = time.perf_counter()
        queue, problem = self._queue_of([p for _, p in members])
        if problem:
            self.host.attempts("unschedulable", time.perf_counter() - t0, len(members))
            return GangOutcome(0, len(members), f"{group.ref.describe()}: {problem}; nothing is bound")
        gang = GangSpec(group.ref.name, group.ref.namespace, group.min_member, int(group.timeout_s))
        pods = tuple(replace(p, queue=queue) if queue else p for _, p in members)
        unit = Unit(gang.key, pods, max(0, group.min_member - bound), gang)
        by_key = {p.key: m for m, p in members}
        with self.host.cluster.snapshot() as snap:
            profile, o = self._decide(unit, queue, snap)
            log.debug(
                "%s: need %d (%d bound) of %s: %s %s", group.ref.describe(), unit.need, bound,
                [p.key for p in pods], o.outcome.value, o.reason,
            )  # fmt: skip
            for res in o.placed:
                self.host.cluster.assume(res.pod, res.node, res.gpus)
            if queue and self.host.tenants is not None:  # the kept queue book follows the bookings
                t = self.host.tenants
                t.settled(snap, t.directory.current(), [r.pod.key for r in o.placed])
            acted = self._act(group, unit, queue, snap, o, profile)
        dt = time.perf_counter() - t0
        placed = list(o.placed) if o.outcome is Outcome.PLACED else []
        self.host.attempts("scheduled", dt, len(placed))
        self.host.attempts("unschedulable", dt, len(members) - len(placed))
        if not placed:
            where = f" (queue {queue})" if queue else ""
            return GangOutcome(0, len(members), f"{group.ref.describe()}{where}: {o.reason}{acted}")
        if self.host.tenants is not None:
            self.host.tenants.admitted([p.key for p in pods])
        left_out = {p.key for p in pods} - {r.pod.key for r in placed}
        for res in placed:
            m = by_key[res.pod.key]
            self._done(m, unschedulable=False)
            self.host.bind(profile, m, res.pod, res.node_name, res.gpus)
        for key in sorted(left_out):
            self._done(by_key[key], unschedulable=True)
        with self._lock:
            self._waiting_since.pop(group.ref, None)
        self.status.placed(group, bound + len(placed))
        self.host.events.about(
            self.status.involved(group), "Normal", "GangScheduled",
            f"{len(placed)} pod(s) placed at once ({bound} already bound; minimum {group.min_member})",
        )  # fmt: skip
        return GangOutcome(len(placed), len(left_out))

    def _queue_of(self, pods: Sequence[PodSpec]) -> tuple[str, str]:
        """The gang's tenant queue (its first member's) and why it cannot be used ("" when it
        can); ("", "") when the gang is under no queue."""
        t = self.host.tenants
        if t is None or not t.directory.installed():
            return "", ""
        d = t.directory.current()
        queue, source = d.queue_of(pods[0])
        return (queue, d.problem(queue, source)) if queue else ("", "")

    def _decide(self, unit: Unit, queue: str, snap: ClusterState) -> tuple[Profile, UnitOutcome]:
        """One ``run_cycle`` for the gang, under the cluster lock, with its queue's book and the
        rooms of others held. Placed members stay booked in ``snap``."""
        tiebreak = self.host.tiebreak(snap)
        profile = self.host.profile(unit.pods[0], snap)
        pre, t = self.host.preemption, self.host.tenants
        keys = [p.key for p in unit.pods]
        book: QueueBook | None = None
        if queue and t is not None:
            book = t.book(snap, t.directory.current(), leave_out=keys)
            if waiting := t.waiting_on(keys, snap):
                return profile, UnitOutcome(
                    unit, Outcome.WAITING, reason=f"waiting for {waiting} reclaimed pod(s) to leave"
                )
        if pre is None:
            profile = without_post_filters(profile)
        rooms = pre.rooms(snap, unit.pods) if pre is not None else contextlib.nullcontext()
        budgets = (
            pre.disruption_budgets() if pre is not None else (t.host.budgets() if t is not None else None)
        )
        with rooms:
            (o,) = run_cycle(profile, snap, [unit], book=book, budgets=budgets, tiebreak=tiebreak)
        wait = ""
        if o.outcome is Outcome.PREEMPT and pre is not None:
            wait = pre.may_preempt([(p.key, snap.names[n]) for p, n in o.nominated], snap)
        if wait:
            o = UnitOutcome(unit, Outcome.WAITING, reason=f"{o.reason}; preemption {wait}")
        return profile, o

    def _act(
        self, group: GroupSpec, unit: Unit, queue: str, snap: ClusterState, o: UnitOutcome, profile: Profile
    ) -> str:
        """Start the reclaim or the preemption ``o`` asks for; returns what to add to the reason."""
        held = [snap.allocations[k] for k in o.victims if k in snap.allocations]
        if o.outcome is Outcome.RECLAIM and self.host.tenants is not None and held:
            victims = [(a.pod, snap.names[a.node]) for a in held]
            tiebreak = self.host.tiebreak(snap)
            rooms = landing(profile, snap, unit.pods, o.victims, need=unit.need, tiebreak=tiebreak)
            by = f"gang {group.ref.describe()}"
            self.host.tenants.start_reclaim(unit.pods, queue, victims, by=by, rooms=rooms)
            return f"; reclaiming {len(held)} pod(s) from borrowing queues"
        if o.outcome is Outcome.PREEMPT and self.host.preemption is not None and held:
            placement = [(p, snap.names[n]) for p, n in o.nominated]
            self.host.preemption.preempt_gang(group.ref.describe(), placement, [a.pod for a in held])
            return f"; preempting {len(held)} lower-priority pod(s), nominated where its members land"
        return ""

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
