"""The one actuator of the standalone scheduler: what a decided unit's outcome does in the API.

Every popped pod is decided by ``core.batch.run_cycle`` as a unit (a pod outside any gang is a unit
of one; a gang's pending members are one unit), under the cluster lock. ``Actuator`` then carries
the ``UnitOutcome`` out, in two steps:

- ``commit`` (still under the cluster lock, on the snapshot it was decided on): books the placed
  pods (assumed: their GPUs are taken while the binding is on its way), charges them in the kept
  queue book, records the rooms (a preemptor is nominated where it lands; a reclaim reserves its
  charge and starts evicting), and composes the one message the unit's pods are told;
- ``act`` (after the lock): binds the placed pods through the bind pool (``bind``: until the API
  says what happened, ``k8s/binding.py``'s outcomes), evicts a preemption's victims
  (``k8s/preemption.py``'s ``Preemptor``), and for the pods not placed writes the
  ``FailedScheduling`` event and ``PodScheduled=False`` condition and requeues them as
  unschedulable. This is the only place that does so for a decided pod; a gang's group is told
  too (``Gangs``: its status, ``GangWaiting``, ``GangTimeout``, ``GangScheduled``).

Outcomes and what they do:

- PLACED: each placed pod assumed, its attempt counted ``scheduled``, bound off the scheduling
  thread; a failed bind forgets the assumption and requeues it with backoff. A gang's members
  that did not fit beyond its minimum wait (unschedulable). A gang with DRA claims has every
  member's claims written before any member is bound, or none (``_bind_gang``).
- PREEMPT: a single pod is nominated on the PostFilter's node and its victims evicted; a gang's
  members are each nominated where they land and the victims evicted once for the gang. Unless
  the preemptor may not preempt yet (``Nominations.may_preempt``: its victims still leaving, too
  many preemptions): then it waits, and the reason says why.
- RECLAIM: the unit's charge is reserved in its queue, the borrowers' pods are evicted, and the
  unit's pods are given rooms where they will land (``TenantQueues.start_reclaim``).
- WAITING: told and requeued; a single pod whose PostFilter found no help gives up its room.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from gpusched.core.batch import Outcome, UnitOutcome
from gpusched.core.cluster import I64, ClusterState
from gpusched.core.dra.model import Node as DraNode
from gpusched.core.framework import Profile, run_bind
from gpusched.core.gang import Unit
from gpusched.core.model import PodSpec
from gpusched.k8s.binding import Result, Settler, bind_until_settled
from gpusched.k8s.claims import DraClaims
from gpusched.k8s.disruption import BudgetReader
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.gangs import Gangs
from gpusched.k8s.migreshape import MigReshapes
from gpusched.k8s.podgroups import GroupSpec
from gpusched.k8s.preemption import Nominations, PreemptionRun, Preemptor
from gpusched.k8s.queue import QueuedPod, SchedulingQueue
from gpusched.k8s.reservation import Reservations
from gpusched.k8s.state import LiveCluster
from gpusched.k8s.tenants import TenantQueues, landing
from gpusched.metrics.scheduling import SchedulerMetrics, diagnosis_labels

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Popped:
    """A unit to decide with the queued pods it decides (``members``: pod key → queued pod).
    ``group``/``bound``: a gang's group and its members already bound; ``queue``: the tenant
    queue the unit is admitted by ("" when none)."""

    unit: Unit
    members: dict[str, QueuedPod]
    group: GroupSpec | None = None
    bound: int = 0
    queue: str = ""

    def spec(self, key: str) -> PodSpec:
        """The unit's own spec of ``key`` (not the one a room steered)."""
        return next(p for p in self.unit.pods if p.key == key)


@dataclass(frozen=True, slots=True)
class Decision:
    """``outcome`` of ``popped`` decided with ``profile``; ``tried`` False: it waited for its
    reclaim's victims without being tried."""

    popped: Popped
    outcome: UnitOutcome
    profile: Profile
    tiebreak: I64 | None = None
    tried: bool = True


@dataclass(slots=True)
class Acts:
    """What ``commit`` decided to do once the cluster lock is released."""

    decision: Decision
    message: str = ""
    """What the pods not placed (and a waiting group) are told."""
    binds: list[tuple[QueuedPod, PodSpec, str, tuple[int, ...]]] = field(default_factory=list)
    preempt: tuple[list[tuple[PodSpec, str]], list[PodSpec]] | None = None
    """(placement: pod, node; victims) to evict for."""
    given_up: PodSpec | None = None
    """A single preemptor that gave its room up: its nomination is cleared."""


class Actuator:
    def __init__(
        self,
        *,
        cluster: LiveCluster,
        queue: SchedulingQueue,
        events: EventRecorder,
        metrics: SchedulerMetrics,
        pool: Executor,
        settler: Settler,
        nominations: Nominations,
        preemptor: Preemptor,
        budgets: BudgetReader,
        reservations: Reservations,
        tenants: TenantQueues,
        gangs: Gangs,
        claims: DraClaims,
        mig: MigReshapes,
        running: tuple[threading.Event, threading.Event],
    ) -> None:
        self.cluster = cluster
        self.queue = queue
        self.events = events
        self.metrics = metrics
        self.pool = pool
        self.settler = settler
        self.nominations = nominations
        self.preemptor = preemptor
        self.budgets = budgets
        self.reservations = reservations
        self.tenants = tenants
        self.gangs = gangs
        self.claims = claims
        self.mig = mig
        self._leading, self._stop = running
        """Bindings keep trying while the first is set and the second is not."""
        self.scheduled = 0
        self.bind_errors = 0

    # ------------------------------------------------------------- under the lock
    def commit(self, d: Decision, snap: ClusterState) -> Acts:
        """Book what ``d`` placed and record its rooms, on the snapshot it was decided on (under
        the cluster lock); returns what ``act`` does after the lock."""
        o, p = d.outcome, d.popped
        acts = Acts(d)
        for res in o.placed if o.outcome is Outcome.PLACED else ():
            pod = p.spec(res.pod.key)
            self.cluster.assume(pod, res.node, res.gpus)
            acts.binds.append((p.members[pod.key], pod, res.node_name, res.gpus))
        if p.queue:  # the kept queue book follows the bookings
            placed = [pod.key for _, pod, _, _ in acts.binds]
            self.tenants.settled(snap, self.tenants.directory.current(), placed)
        if not acts.binds:
            acts.message = self._rooms(d, snap, acts)
        return acts

    def _rooms(self, d: Decision, snap: ClusterState, acts: Acts) -> str:
        """A unit not placed: record the rooms its outcome makes (a preemptor nominated, a reclaim
        started) or gives up; returns what its pods are told."""
        o, p, unit = d.outcome, d.popped, d.popped.unit
        held = [snap.allocations[k] for k in o.victims if k in snap.allocations]
        acted = ""
        if o.outcome is Outcome.RECLAIM and held:
            victims = [(a.pod, snap.names[a.node]) for a in held]
            rooms = landing(d.profile, snap, unit.pods, o.victims, need=unit.need, tiebreak=d.tiebreak)
            by = f"gang {p.group.ref.describe()}" if p.group is not None else unit.pods[0].key
            self.tenants.start_reclaim(unit.pods, p.queue, victims, by=by, rooms=rooms)
            for q, n in rooms:  # DRA: what its victims' claims free held for it (a gang: each member in
                spec = snap.nodes[snap.index[n]]  # turn, seeing the rooms held before it)
                self.claims.hold_room(q, DraNode(spec.name, spec.labels), o.victims)
            acted = f"; reclaiming {len(held)} pod(s) from borrowing queues"
        elif o.outcome is Outcome.PREEMPT:
            placement = (
                [(q, snap.names[n]) for q, n in o.nominated]
                if p.group is not None
                else [(unit.pods[0], snap.names[o.nominated_node])]
            )
            wait = next((w for q, n in placement if (w := self.nominations.may_preempt(q.key, n, snap))), "")
            wait = wait or next((w for q in unit.pods if (w := self.claims.room_waits(q.key))), "")  # DRA
            wait = wait or next((w for q in unit.pods if (w := self.claims.room_freed(q.key))), "")
            if wait:
                acted = f"; preemption {wait}"
            elif held:
                keys = tuple(a.pod.key for a in held)
                for q, n in placement:
                    self.nominations.nominate(p.spec(q.key), n, keys)
                    spec = snap.nodes[snap.index[n]]  # DRA: its victims' claims' devices held for it
                    self.claims.hold_room(p.spec(q.key), DraNode(spec.name, spec.labels), keys)
                acts.preempt = ([(p.spec(q.key), n) for q, n in placement], [a.pod for a in held])
                if p.group is not None:
                    acted = (
                        f"; preempting {len(held)} lower-priority pod(s), nominated where its members land"
                    )
        elif o.outcome is Outcome.WAITING and p.group is None and d.tried and o.nominated_node < 0:
            gave_up = self.nominations.drop(unit.key) is not None  # no preemption helps any more
            self.claims.drop_room(unit.key)
            acts.given_up = unit.pods[0] if gave_up and not p.queue else None  # (a reclaim's room: no API)
        if p.group is not None:
            where = f" (queue {p.queue})" if p.queue else ""
            return f"{p.group.ref.describe()}{where}: {o.reason}{acted}"
        note = "" if p.queue else self.reservations.note(unit.pods[0])  # the rooms that kept it off
        return f"{o.reason}{note}{acted}"

    # ------------------------------------------------------------- after the lock
    def act(self, acts: Acts, seconds: float) -> None:
        """Bind, evict, tell and requeue as ``commit`` decided; counts one attempt per pod."""
        d = acts.decision
        o, p = d.outcome, d.popped
        placed = len(acts.binds)
        self._attempts("scheduled", seconds, placed)
        self._attempts("unschedulable", seconds, len(p.members) - placed)
        if placed:
            self.tenants.admitted(list(p.members))
            jointly = p.group is not None and any(pod.claims is not None for _, pod, _, _ in acts.binds)
            for qp, pod, node, gpus in acts.binds:
                if p.group is None:
                    self.metrics.pod_scheduled(qp.key)
                self.queue.done(qp.key)
                self.queue.remove(qp.key)
                if not jointly:
                    self.pool.submit(self.bind, d.profile, qp, pod, node, gpus)
            if p.group is not None and jointly:
                self.pool.submit(self._bind_gang, d.profile, p.group, list(acts.binds))
            if p.group is not None:
                left_out = sorted(set(p.members) - {qp.key for qp, _, _, _ in acts.binds})
                for key in left_out:
                    self.queue.park(key)
                self.gangs.placed(p.group, placed, p.bound)
            return
        if acts.preempt is not None:
            placement, victims = acts.preempt
            self.metrics.preempted(len(victims))
            if p.group is None:
                self.pool.submit(self._preempt, placement[0][0], placement[0][1], victims)
            else:
                self.pool.submit(self._preempt_gang, p.group.ref.describe(), placement, victims)
        if acts.given_up is not None:
            self.pool.submit(self.preemptor.clear, acts.given_up)
        if p.group is not None:
            self.gang_waits(p.group, list(p.members), acts.message)
            return
        qp = next(iter(p.members.values()))
        if o.last is not None:
            self.metrics.pod_unschedulable(qp.key, *diagnosis_labels(o.last.diagnosis, o.last.status))
        recut = self.mig.consider(p.spec(qp.key), qp.obj)  # MIG: a re-cut of free slices (k8s/migreshape.py)
        self.refuse(qp, acts.message + recut)

    # ------------------------------------------------------------- refusals
    def refuse(
        self, qp: QueuedPod, message: str, *, reason: str = "FailedScheduling", attempt: str = ""
    ) -> None:
        """A popped pod that cannot be decided (bad input, DRA claims, an invalid queue): told,
        requeued as unschedulable; ``attempt``: counted with that result ("" not counted)."""
        if attempt:
            self.metrics.observe_attempt(attempt, 0.0)
        self.events.failed(qp.obj, message, reason=reason)
        self.queue.park(qp.key)

    def gang_waits(
        self, group: GroupSpec, keys: list[str], message: str, reason: str = "GangWaiting"
    ) -> None:
        """The group waits as a unit: the group told (and, past its timeout, ``GangTimeout``), then
        each pending member told and requeued as unschedulable."""
        timeout = self.gangs.waited(group, message, reason)
        if timeout:
            self.tell(keys, timeout, reason="GangTimeout")
        self.tell(keys, message)

    def tell(self, keys: Sequence[str], message: str, reason: str = "FailedScheduling") -> None:
        """Tell each pending pod of ``keys`` why it waits, and requeue it as unschedulable."""
        for k in keys:
            m = self.queue.get(k)
            if m is None:
                continue
            self.events.failed(m.obj, message, reason=reason, condition=reason == "FailedScheduling")
            self.queue.park(m.key)

    def _attempts(self, result: str, seconds: float, pods: int) -> None:
        for _ in range(pods):  # one attempt per pod, as kube-scheduler counts them
            self.metrics.observe_attempt(result, seconds)

    # ------------------------------------------------------------- binding
    def _keep_trying(self) -> bool:
        return self._leading.is_set() and not self._stop.is_set()

    def bind(self, profile: Profile, qp: QueuedPod, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> None:
        """Bind the booked decision until the API says what happened (``k8s/binding.py``): the
        GPUs stay booked while the outcome is unknown, so nothing else is placed on them."""
        t0 = time.perf_counter()
        claims = self.claims.write(qp.obj, pod, keep_trying=self._keep_trying)  # DRA: status.allocation first
        if not claims.ok:
            self.cluster.forget(pod.key)
            self.bind_errors += 1
            log.warning("writing the claims of %s: %s: %s", qp.key, claims.result.value, claims.message)
            self.events.failed(qp.obj, f"writing its ResourceClaims: {claims.message}")
            self.queue.add_or_update(qp.event, backoff=True)
            return
        self._bind_written(profile, qp, pod, node, gpus, t0)

    def _bind_gang(
        self, profile: Profile, group: GroupSpec, binds: list[tuple[QueuedPod, PodSpec, str, tuple[int, ...]]]
    ) -> None:
        """A gang whose members have DRA claims: every member's claims written before any member
        is bound (``DraClaims.write_all``), then each bound; or none bound, what was written taken
        back, every member's devices and booking given back, and each member told why."""
        t0 = time.perf_counter()
        w = self.claims.write_all([(qp.obj, pod) for qp, pod, _, _ in binds], keep_trying=self._keep_trying)
        if not w.ok:
            assert w.outcome is not None
            self.bind_errors += 1
            msg = (
                f"{group.ref.describe()}: writing the ResourceClaims of member {w.failed} failed "
                f"({w.outcome.result.value}: {w.outcome.message}); no member is bound, the claims "
                "written for the others were taken back"
            )
            log.warning("%s", msg)
            self.gangs.waited(group, msg)  # the group told too (its status: not placed)
            for qp, pod, _, _ in binds:
                self.cluster.forget(pod.key)
                self.events.failed(qp.obj, msg)
                self.queue.add_or_update(qp.event, backoff=True)
            return
        for qp, pod, node, gpus in binds:
            self._bind_written(profile, qp, pod, node, gpus, t0)

    def _bind_written(
        self, profile: Profile, qp: QueuedPod, pod: PodSpec, node: str, gpus: tuple[int, ...], t0: float
    ) -> None:
        """Bind a decision whose claims are written (or that has none); ``t0``: when its binding began."""
        keep_trying = self._keep_trying
        out = bind_until_settled(
            lambda: run_bind(profile, pod, node, gpus), pod, self.settler, keep_trying=keep_trying
        )
        if out.result is Result.BOUND and (out.status.ok or out.node == node):
            self.claims.bound(pod)
            self.scheduled += 1
            self.metrics.binding_duration.labels("ok").observe(time.perf_counter() - t0)
            self.events.scheduled(qp.obj, node)
            return
        self.bind_errors += 1
        self.metrics.binding_duration.labels("error").observe(time.perf_counter() - t0)
        log.warning(
            "binding %s to %s: %s after %d attempt(s): %s",
            qp.key, node, out.result.value, out.attempts, out.status.message(),
        )  # fmt: skip
        if out.result in (Result.REFUSED, Result.GONE):
            self.claims.release(qp.obj, pod)  # out of its claims' reservedFor (k8s/claims.py)
        if out.result is Result.REFUSED:  # nothing was written: decide again after backoff
            self.queue.add_or_update(qp.event, backoff=True)

    # ------------------------------------------------------------- preemption
    def _preempt(self, pod: PodSpec, node: str, victims: list[PodSpec]) -> None:
        """Evict the victims through the Eviction API and nominate the node (``k8s/preemption.py``):
        victims already leaving are not evicted again, and a budget this room broke is not broken
        again. Victims a budget kept, or that failed, are no longer waited for: the preemptor
        decides again (after the next cluster change or flush) instead of waiting on them forever."""
        noms = self.nominations
        run = self.preemptor.run(
            pod, node, victims, self.budgets.budgets(),
            leaving=noms.leaving(skip=(pod.key,)), spent=noms.spent(pod.key, node),
        )  # fmt: skip
        noms.broke(pod.key, node, run.broken)
        self._still_waiting(run, [(pod, node)])

    def _preempt_gang(self, gang: str, placement: list[tuple[PodSpec, str]], victims: list[PodSpec]) -> None:
        noms = self.nominations
        members = tuple(p.key for p, _ in placement)
        spent = frozenset().union(*(noms.spent(p.key, node) for p, node in placement))
        run = self.preemptor.run_gang(
            gang, placement, victims, self.budgets.budgets(), leaving=noms.leaving(skip=members), spent=spent
        )
        for p, node in placement:
            noms.broke(p.key, node, run.broken)
        self._still_waiting(run, placement)

    def _still_waiting(self, run: PreemptionRun, nominated: Sequence[tuple[PodSpec, str]]) -> None:
        """After a preemption: the preemptors wait only for the victims that are leaving."""
        if run.blocked or run.failed:
            for pod, _node in nominated:
                self.nominations.waiting_for(pod.key, run.leaving)
