"""The standalone scheduler: pods with ``spec.schedulerName: gpusched`` → decisions → bindings.

One scheduling thread pops the pending queue (priority, then creation order) and decides the
popped pod's unit (``schedule``: the pod alone, or its gang's pending members; with its tenant
queue, from the queue directory) by ``core.batch.run_cycle`` on the live books under the cluster
lock, clear of the rooms kept for others (``k8s.preemption.Rooms``): the one decider of every
popped pod. The actuator (``k8s/actuator.py``) carries the outcome out: placed pods are assumed
there, and after the lock is released their bindings go to a small thread pool, so API latency
never blocks the next decision (kube-scheduler binds asynchronously too); a failed binding
forgets the assumption and requeues the pod with backoff. A pod that fits nowhere gets a
``FailedScheduling`` event and ``PodScheduled=False`` (once per distinct message) and waits in
the unschedulable set until the cluster changes or the periodic flush.

Target workload of the fragmentation-aware policies (``default``, ``fgd``), from the core's
``WorkloadSource``: a fixed one when given (``--workload-trace``), else learnt from every pod
seen (bound and pending) when the first decision is made, relearnt when the number of pods
seen has doubled (at most every 5 s) and every ``profile_refresh_s`` (default 5 minutes). The
fragmentation gauge is measured against the workload the profile's policy uses.

Only the leader decides (``start_leading``/``stop_leading``, driven by ``leader.py``); a
standby keeps its informers warm. Becoming leader rebuilds the books from the API objects
(bound pods and their assignment annotations) before the first decision.

Gangs hold nothing while they wait: a PodGroup member is decided with its group's pending pods,
all or nothing, in one cycle (``k8s/gangs.py``: membership and group status; within its tenant
queue's quota, a preemptor as a unit). A pod with DRA claims has them resolved before it is decided
and written before it is bound (``k8s/claims.py``, ``DraClaims``; the actuator writes them); a gang's
members' claims are resolved each, allocated jointly and all written before any member is bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kubernetes import client

from gpusched.core.batch import Outcome, UnitOutcome, run_cycle, single
from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.gang import GangSpec, Unit, without_post_filters
from gpusched.core.gangtopology import InvalidTopology, TopologyLevels
from gpusched.core.model import PodSpec
from gpusched.core.policies import POLICIES, PolicyContext, make_profile
from gpusched.core.workload import WorkloadSource
from gpusched.k8s.actuator import Actuator, Decision, Popped
from gpusched.k8s.binder import APIBinder, read_pod
from gpusched.k8s.binding import Settler
from gpusched.k8s.claims import ClaimsRefusal, DraClaims
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.disruption import BudgetReader
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.gangs import Gangs, Members, Refusal
from gpusched.k8s.gangtopology import gang_topology
from gpusched.k8s.informer import Reflector
from gpusched.k8s.migreshape import MigReshapes
from gpusched.k8s.podevents import PodEvent, PodFeed, parse_pod_event
from gpusched.k8s.podgroups import PodGroups
from gpusched.k8s.preemption import Nominations, Preemptor, Rooms
from gpusched.k8s.queue import QueuedPod, SchedulingQueue
from gpusched.k8s.queues import QueueDirectory
from gpusched.k8s.reservation import LeaseRecord, Reservations
from gpusched.k8s.rest import FastCoreV1
from gpusched.k8s.state import LiveCluster, start_informers
from gpusched.k8s.tenants import TenantQueues
from gpusched.metrics.cluster import cluster_stats
from gpusched.metrics.scheduling import SchedulerMetrics

log = logging.getLogger(__name__)

_WORKLOAD_POLICIES = ("default", "fgd")


@dataclass
class SchedulerConfig:
    scheduler_name: str = "gpusched"
    policy: str = "default"
    workload: TargetWorkload | None = None
    """A fixed target workload; None: learnt from the pods seen."""
    profile_refresh_s: float = 300.0
    bind_workers: int = 16
    flush_s: float = 30.0
    frag_interval_s: float = 5.0
    identity: str = ""
    lease_name: str = "gpusched-scheduler"
    """The leader Lease (the ``name`` of ``leader_election_master_status``)."""
    preemption: bool = True
    """When a pod fits nowhere, evict lower-priority pods to make room (kube-scheduler's
    DefaultPreemption: minimal victims, least-harm node; ``core/plugins/preemption.py``)."""
    preemption_limit: int = 3
    """Preemptions one pod may make on one node within ``preemption_window_s``; then it waits."""
    preemption_window_s: float = 600.0
    gang_topology_levels: TopologyLevels = field(default_factory=TopologyLevels)
    """The topology hierarchy gangs may ask to be kept in (node label keys, narrowest first;
    ``gpusched.io/topology-required|preferred`` on a gang, ``k8s/gangtopology.py``)."""
    defrag_lease: str = "kube-system/gpusched-defrag"
    """The defragmentation controller's Lease (NAMESPACE/NAME): its rooms are held only while it
    records their plan there (``k8s/reservation.py``)."""


class StandaloneScheduler:
    def __init__(
        self, api: Any, config: SchedulerConfig | None = None, metrics: SchedulerMetrics | None = None
    ) -> None:
        self.config = cfg = config or SchedulerConfig()
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy {cfg.policy!r}; choose one of {', '.join(POLICIES)}")
        self.core = client.CoreV1Api(api)  # lists, watches, preemption
        self.fast = FastCoreV1(api)  # the calls made per pod: binding, event, read-back
        self.cluster = LiveCluster()
        self._binder = APIBinder(self.fast, mig=self.cluster)  # MIG slices from the books (issue 31)
        self._settler = Settler(
            self.cluster,
            lambda ns, name: read_pod(self.fast, ns, name),
            on_released=lambda obj: self.queue.add_or_update(parse_pod_event(obj), backoff=True),
        )
        self.queue = SchedulingQueue(flush_s=cfg.flush_s)
        self.events = EventRecorder(self.fast, cfg.scheduler_name, cfg.identity)
        self.mig_reshapes = MigReshapes(self.core, self.cluster, self.events, pending=self.queue)  # issue 31
        self.metrics = metrics or SchedulerMetrics(profile=cfg.scheduler_name)
        self.metrics.set_leader(cfg.lease_name, False)
        self.metrics.watch_event_writes(self.events.counts)
        self.budgets = BudgetReader(client.PolicyV1Api(api))  # PodDisruptionBudgets, for preemption
        self._preemptor = Preemptor(self.core, self.events)  # victims leave by the Eviction API
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(cfg.bind_workers, thread_name_prefix="bind")
        self._reflectors: list[Reflector] = []
        self._thread: threading.Thread | None = None
        self.workloads = WorkloadSource(cfg.workload)
        self._profile: Profile | None = None
        self._profile_at = 0.0
        self._profile_seen = 0
        self._last_state: tuple[object, int] | None = None
        self._tiebreak = np.zeros(0, dtype=np.int64)
        self._gauges_at = -1e9
        # nominated preemptors: their rooms, the victims they wait for (k8s/preemption.py)
        self.nominations = Nominations(
            cfg.scheduler_name, limit=cfg.preemption_limit, window_s=cfg.preemption_window_s
        )
        lease_ns, _, lease_name = cfg.defrag_lease.rpartition("/")  # rooms defragmentation is making
        self.reservations = Reservations(LeaseRecord(client.CoordinationV1Api(api), lease_ns, lease_name))
        self.tenants = TenantQueues(  # the directory, the book, reclaim, status (k8s/tenants.py)
            QueueDirectory(client.CustomObjectsApi(api), self.core), self.core, client.CustomObjectsApi(api),
            cluster=self.cluster, queue=self.queue, events=self.events, pool=self._pool,
            nominations=self.nominations,  # where a reclaim's room is kept for its claimant
            metrics=self.metrics,  # gpusched_queue_*, each time the statuses are computed
        )  # fmt: skip
        self.gangs = Gangs(  # membership and group status (k8s/gangs.py)
            self.queue, self.cluster, self.events, lambda on_change: PodGroups(api, on_change)
        )
        self.rooms = Rooms(self.nominations, self.reservations)  # what each unit is decided clear of
        # DRA: claims resolved before deciding, written before binding; a DRA object changed: retry
        self.claims = DraClaims(api, on_change=self.queue.cluster_changed, cluster=self.cluster)
        self.tenants.claims = self.claims  # claim pods charged per DeviceClass (docs/tenant-queues.md)
        self.actuator = Actuator(  # what a decided unit's outcome does in the API (k8s/actuator.py)
            cluster=self.cluster, queue=self.queue, events=self.events, metrics=self.metrics,
            pool=self._pool, settler=self._settler, nominations=self.nominations,
            preemptor=self._preemptor, budgets=self.budgets, reservations=self.reservations,
            tenants=self.tenants, gangs=self.gangs, claims=self.claims, mig=self.mig_reshapes,
            running=(self.leading, self._stop),
        )  # fmt: skip
        # each pod event parsed once (k8s/podevents.py), for the books, gangs, rooms, then the queue
        self.pods = PodFeed([self.cluster, self.gangs, self.reservations, self])

    @property
    def scheduled(self) -> int:
        """Pods bound."""
        return self.actuator.scheduled

    @property
    def bind_errors(self) -> int:
        return self.actuator.bind_errors

    # ------------------------------------------------------------ lifecycle
    def start(self, lead: bool = True) -> StandaloneScheduler:
        self._reflectors = start_informers(self.core, self.cluster, self.pods)
        self.gangs.groups.discover()
        self.budgets.start()
        self.tenants.start()
        self.claims.start()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()
        if lead:
            self.start_leading()
        return self

    def synced(self) -> bool:
        informers = bool(self._reflectors) and all(r.synced.is_set() for r in self._reflectors)
        # the DRA informers too: deciding a claim pod before they list would refuse it for nothing
        return (
            informers
            and self.claims.synced()
            and self.gangs.groups.synced()
            and self.tenants.directory.ready()
        )

    def wait_synced(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.synced():
            if time.monotonic() > deadline or self._stop.is_set():
                return False
            time.sleep(0.05)
        return True

    def start_leading(self) -> None:
        """Rebuild the books from the API, then decide: never before the informers have
        listed every node and pod (empty books would give away GPUs that are taken)."""
        while not self.wait_synced(30.0):
            if self._stop.is_set():
                return
            log.warning("leading, but the informers have not synced yet: waiting to decide")
        self.cluster.rebuild()
        self.cluster.report_to(self.events)  # the books' warnings (nodes, conflicts) as events: the leader's
        self.queue.move_all_to_active()
        self._profile = None
        self.leading.set()
        self.metrics.set_leader(self.config.lease_name, True)

    def stop_leading(self) -> None:
        self.leading.clear()
        self.cluster.report_to(None)
        self.metrics.set_leader(self.config.lease_name, False)

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_leading()
        self._stop.set()
        self.queue.close()
        for r in self._reflectors:
            r.stop()
        self.gangs.groups.stop()
        self.budgets.stop()
        self.tenants.stop()
        self.claims.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=False)
        self._settler.stop()
        self.events.flush(timeout)
        self.events.stop()

    # -------------------------------------------------------------- informer
    def on_pod_event(self, ev: PodEvent) -> None:
        """The queue's part of a pod event (after the books, the gangs and the rooms): a pending
        pod of ours waits in it; a bound, finished or deleted one leaves it (freeing resources:
        the unschedulable may fit now); nominated preemptors whose last victim left are tried."""
        key = ev.key
        if ready := self.nominations.observe(ev):  # their last victim gone: try them now
            self.queue.activate(ready)
        if ev.deleted:
            self.queue.remove(key)
            self.events.forget(ev.uid)
            if ev.bound:
                self.queue.cluster_changed()
            return
        if not ev.pending:  # bound, being deleted, or finished
            self.queue.remove(key)
            if ev.bound and (ev.finished or ev.deleting):
                self.queue.cluster_changed()
            return
        if ev.gated:  # gated (e.g. by Kueue): not ours to place until the gates go
            if ev.scheduler_name == self.config.scheduler_name:
                self.queue.gate(key)  # counted as gated
            else:
                self.queue.remove(key)
            return
        if ev.scheduler_name == self.config.scheduler_name:
            self.queue.add_or_update(ev)

    # ------------------------------------------------------------ scheduling
    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.leading.wait(0.5):
                continue
            qp = self.queue.pop(timeout=1.0)
            if qp is None:
                self._check_cluster_changed()
                continue
            try:
                self.schedule(qp)
            except Exception:
                log.exception("scheduling %s failed", qp.key)
                self.metrics.observe_attempt("error", 0.0)
                self.queue.done(qp.key, unschedulable=True)

    def _check_cluster_changed(self) -> None:
        with self.cluster.live_books() as snap:
            self._note_state(snap)

    def _note_state(self, snap: ClusterState) -> None:
        """Called under the cluster lock: when nodes changed since the last cycle (a rebuilt
        snapshot, or a node relabelled in place), unschedulable pods may fit now."""
        seen = (snap, self.cluster.node_version)
        if self._last_state is None or seen[0] is not self._last_state[0] or seen[1] != self._last_state[1]:
            if self._last_state is not None:
                self.queue.cluster_changed()
            self._last_state = seen
            self._tiebreak = np.arange(len(snap), dtype=np.int64)  # nodes are in name order

    def schedule(self, qp: QueuedPod) -> None:
        """One cycle for one popped pod: its unit (itself, or its gang's pending members) decided
        by ``core.batch.run_cycle`` and carried out by the actuator."""
        act = self.actuator
        if not self.leading.is_set():
            self.queue.done(qp.key, requeue=True)
            return
        try:
            pod = qp.spec()
        except InvalidRequest as e:
            act.refuse(qp, str(e), reason="InvalidGPURequest", attempt="error")
            return
        if self.cluster.is_bound_or_assumed(qp.key):
            self.queue.done(qp.key)
            return
        prepared = self.claims.prepare(qp.obj, pod)  # DRA claims resolved and attached (k8s/claims.py)
        if isinstance(prepared, ClaimsRefusal):
            act.refuse(qp, prepared.message, reason=prepared.reason)
            return
        pod = prepared
        t0 = time.perf_counter()
        popped = self._popped(qp, pod, t0)
        if popped is None:
            return
        with self.cluster.live_books() as snap:
            self._note_state(snap)
            decision = self._decide(popped, snap)
            acts = act.commit(decision, snap)
        act.act(acts, time.perf_counter() - t0)

    def _popped(self, qp: QueuedPod, pod: PodSpec, t0: float) -> Popped | None:
        """The unit ``qp`` is decided in, with its queue; None when it cannot be decided (told)."""
        act = self.actuator
        gang = self.gangs.members(qp)
        if isinstance(gang, Refusal):
            self.metrics.observe_attempt(gang.attempt, 0.0)
            if gang.group is None:
                act.refuse(qp, gang.message)
            elif gang.reason == "InvalidPodGroup":
                self.gangs.refused(gang.group, gang.message, gang.reason)
                act.tell(gang.keys, gang.message)
            else:
                act.gang_waits(gang.group, gang.keys, gang.message, gang.reason)
            return None
        if gang is None:
            if pod.gang:  # a group of Kubernetes' basic policy: decided alone, under no queue
                return Popped(single(pod), {qp.key: qp})
            queue, problem = self.tenants.queue_of(pod)
            if problem:
                act.refuse(qp, problem)
                return None
            return Popped(
                single(dataclasses.replace(pod, queue=queue) if queue else pod), {qp.key: qp}, queue=queue
            )
        group = gang.group
        for m, why in gang.invalid:
            act.refuse(m, why, attempt="error")
        gang = self._with_claims(gang, qp, pod)
        if not gang.pending:
            act.gang_waits(group, gang.keys, f"{group.ref.describe()}: no member can be decided")
            return None
        if gang.bound + len(gang.pending) < group.min_member:
            act.gang_waits(
                group, [m.key for m, _ in gang.pending],
                f"{group.ref.describe()}: {len(gang.pending)} member(s) can be decided, {gang.bound} bound, "
                f"minimum {group.min_member}; nothing is bound",
            )  # fmt: skip
            return None
        keys = [m.key for m, _ in gang.pending]
        queue, problem = self.tenants.queue_of(gang.pending[0][1])
        if problem:
            for _ in keys:
                self.metrics.observe_attempt("unschedulable", time.perf_counter() - t0)
            act.gang_waits(group, keys, f"{group.ref.describe()}: {problem}; nothing is bound")
            return None
        try:
            members = (
                (m.key, (m.obj.get("metadata") or {}).get("annotations") or {}) for m, _ in gang.pending
            )
            topology = gang_topology(
                self.config.gang_topology_levels, (group.ref.describe(), group.topology), members
            )
        except InvalidTopology as e:
            for _ in keys:
                self.metrics.observe_attempt("error", time.perf_counter() - t0)
            self.gangs.refused(group, f"{e}; nothing is bound", "InvalidGangTopology")
            act.tell(keys, f"{e}; nothing is bound")
            return None
        spec = GangSpec(group.ref.name, group.ref.namespace, group.min_member, int(group.timeout_s), topology)
        pods = tuple(dataclasses.replace(p, queue=queue) if queue else p for _, p in gang.pending)
        unit = Unit(spec.key, pods, max(0, group.min_member - gang.bound), spec)
        return Popped(unit, {m.key: m for m, _ in gang.pending}, group, gang.bound, queue)

    def _with_claims(self, gang: Members, qp: QueuedPod, pod: PodSpec) -> Members:
        """The gang's pending members with their DRA claims resolved and attached (``qp`` as ``pod``,
        prepared already); a member whose claims are not ready is told why and left out."""
        pending: list[tuple[QueuedPod, PodSpec]] = []
        for m, spec in gang.pending:
            if m.key == qp.key:
                prepared: PodSpec | ClaimsRefusal = dataclasses.replace(spec, claims=pod.claims)
            else:
                prepared = self.claims.prepare(m.obj, spec)
            if isinstance(prepared, ClaimsRefusal):
                self.actuator.refuse(m, f"{gang.group.ref.describe()}: member {m.key}: {prepared.message}",
                                     reason=prepared.reason)  # fmt: skip
                continue
            pending.append((m, prepared))
        return dataclasses.replace(gang, pending=pending)

    def _decide(self, popped: Popped, snap: ClusterState) -> Decision:
        """The one decision (``core.batch.run_cycle``) of ``popped``, under the cluster lock: with its
        queue's book (a unit waiting for its reclaim's victims is not tried), clear of the rooms
        kept for others. Placed pods stay booked in ``snap``."""
        unit, queue = popped.unit, popped.queue
        profile = self._current_profile(unit.pods[0], snap)
        book = None
        if queue:
            keys = [p.key for p in unit.pods]
            book = self.tenants.book(snap, self.tenants.directory.current(), leave_out=keys)
            profile = without_post_filters(profile)  # reclaim, never preemption across queues
            if waiting := self.tenants.waiting_on(keys, snap):
                why = f"waiting for {waiting} reclaimed pod(s) to leave"
                why = why if popped.group is not None else f"queue {queue}: {why}"
                return Decision(popped, UnitOutcome(unit, Outcome.WAITING, reason=why), profile, tried=False)
            if popped.group is None and (why := self.claims.room_waits(keys[0])):  # DRA: being made
                why = f"queue {queue}: {why}"
                return Decision(popped, UnitOutcome(unit, Outcome.WAITING, reason=why), profile, tried=False)
        (o,) = run_cycle(
            profile, snap, [unit], book=book, budgets=self.budgets.budgets(), tiebreak=self._tiebreak,
            hold=self.rooms,
        )  # fmt: skip
        log.debug("%s: %s %s", unit.key, o.outcome.value, o.reason)
        return Decision(popped, o, profile, self._tiebreak)

    # --------------------------------------------------------------- profile
    def _current_profile(self, pod: PodSpec, snap: ClusterState) -> Profile:
        now = time.monotonic()
        seen = len(self.queue) + len(snap.allocations)
        stale = self._profile is None or now - self._profile_at >= self.config.profile_refresh_s
        grown = seen >= 2 * self._profile_seen and now - self._profile_at >= 5.0
        if stale or (grown and self.workloads.learns and self.config.policy in _WORKLOAD_POLICIES):
            ctx = PolicyContext(self.workload(extra=pod), np.random.default_rng(0))
            base = make_profile(
                self.config.policy, ctx, preemption=self.config.preemption, budgets=self.budgets.budgets
            )
            self._profile = dataclasses.replace(base, binds=(self._binder,))
            self._profile_at, self._profile_seen = now, seen
        assert self._profile is not None
        return self._profile

    def workload(self, extra: PodSpec | None = None) -> TargetWorkload | None:
        """The target workload: the fixed one, else learnt from the pods seen."""
        if not self.workloads.learns:
            return self.workloads.fixed
        with self.cluster.live_books() as snap:
            pods = [a.pod for a in snap.allocations.values()]
        for qp in self.queue.pending():
            with contextlib.suppress(InvalidRequest):
                pods.append(qp.spec())
        if not pods and extra is not None:
            pods.append(extra)
        return self.workloads.learnt(pods)

    # --------------------------------------------------------------- metrics
    def refresh_gauges(self) -> None:
        self.metrics.set_pending(self.queue.counts())
        self.metrics.pods_pending(qp.key for qp in self.queue.pending())
        now = time.monotonic()
        if now - self._gauges_at < self.config.frag_interval_s:
            return
        self._gauges_at = now
        tw = (self._profile.workload if self._profile is not None else None) or self.workload()
        pending = []
        for qp in self.queue.pending():
            with contextlib.suppress(InvalidRequest):
                pending.append(qp.spec())
        with self.cluster.live_books() as snap:
            self.metrics.set_cluster(cluster_stats(snap, tw, pending))
