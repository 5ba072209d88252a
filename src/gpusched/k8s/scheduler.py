"""The standalone scheduler: pods with ``spec.schedulerName: gpusched`` → decisions → bindings.

One scheduling thread pops the pending queue (priority, then creation order), runs
``schedule_one`` on the live books under the cluster lock (the decision is assumed there),
releases the lock and hands the binding to a small thread pool, so API latency never blocks
the next decision (kube-scheduler binds asynchronously too). A failed binding forgets the
assumption and requeues the pod with backoff. A pod that fits nowhere gets a
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

A pod a Permit plugin makes wait (``ScheduleResult.waiting``) is rejected at once (its booking
given back) and waits in the unschedulable set: no profile of this scheduler waits. Gangs hold
nothing while they wait: a PodGroup member is decided with its group's pending pods, all or
nothing, in one cycle (``k8s/gangs.py``: within its tenant queue's quota, a preemptor as a unit,
clear of the rooms nominated pods and defragmentation keep, through ``PreemptionHost``, which this
class is); a pod with DRA claims is never bound (``k8s/claims.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubernetes import client

from gpusched.core.disruption import DisruptionBudgets
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile, run_bind
from gpusched.core.model import PodSpec
from gpusched.core.policies import POLICIES, PolicyContext, make_profile
from gpusched.core.statement import holding, schedule_with_nominated
from gpusched.core.workload import WorkloadSource
from gpusched.k8s.binder import APIBinder, read_pod
from gpusched.k8s.binding import Result, Settler, bind_until_settled
from gpusched.k8s.claims import claims_message
from gpusched.k8s.convert import InvalidRequest, pod_from_k8s
from gpusched.k8s.disruption import BudgetReader
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.gangs import GangHost, Gangs
from gpusched.k8s.informer import Reflector
from gpusched.k8s.migreshape import MigReshapes
from gpusched.k8s.podgroups import PodGroups
from gpusched.k8s.preemption import Nominations, PreemptionRun, Preemptor
from gpusched.k8s.queue import QueuedPod, SchedulingQueue
from gpusched.k8s.queues import QueueDirectory
from gpusched.k8s.reservation import LeaseRecord, Reservations
from gpusched.k8s.rest import FastCoreV1
from gpusched.k8s.state import TERMINAL, LiveCluster, pod_key, start_informers
from gpusched.k8s.tenants import TenantHost, TenantQueues
from gpusched.metrics.cluster import cluster_stats
from gpusched.metrics.scheduling import SchedulerMetrics, diagnosis_labels

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
            on_released=lambda obj: self.queue.add_or_update(obj, pod_key(obj), backoff=True),
        )
        self.queue = SchedulingQueue(flush_s=cfg.flush_s)
        self.events = EventRecorder(self.fast, cfg.scheduler_name, cfg.identity)
        self.mig_reshapes = MigReshapes(self.core, self.cluster, self.events)  # MIG re-cuts (issue 31)
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
        self.scheduled = 0
        self.bind_errors = 0
        # nominated preemptors: their rooms, the victims they wait for (k8s/preemption.py)
        self.nominations = Nominations(
            cfg.scheduler_name, pod_from_k8s, limit=cfg.preemption_limit, window_s=cfg.preemption_window_s
        )
        lease_ns, _, lease_name = cfg.defrag_lease.rpartition("/")  # rooms defragmentation is making
        self.reservations = Reservations(LeaseRecord(client.CoordinationV1Api(api), lease_ns, lease_name))
        self.tenants = TenantQueues(  # tenant queues: quota, borrowing, reclaim (k8s/tenants.py)
            TenantHost(
                self.cluster, self.queue, self.events, self._spec, self._current_profile,
                self._note_state, lambda: self._tiebreak,
                lambda *bind: self._pool.submit(self._bind, *bind), self.budgets.budgets, self._pool.submit,
                self.metrics.set_queue_statuses,  # gpusched_queue_*, each time the statuses are computed
                self.rooms,  # nominated preemptors' and defragmentation's rooms
                self.nominations,  # where a reclaim's room is kept for its claimant
            ),
            QueueDirectory(client.CustomObjectsApi(api), self.core), self.core, client.CustomObjectsApi(api),
        )  # fmt: skip
        host = GangHost(
            self.queue, self.cluster, self.events, self._spec, self._current_profile, self._gang_tiebreak,
            lambda *bind: self._pool.submit(self._bind, *bind), self.tenants, self, self._attempts,
        )  # fmt: skip
        self.gangs = Gangs(host, lambda on_change: PodGroups(api, on_change))  # k8s/gangs.py

    # ------------------------------------------------------------ lifecycle
    def start(self, lead: bool = True) -> StandaloneScheduler:
        self._reflectors = start_informers(self.core, self.cluster, self._on_pod)
        self.gangs.groups.discover()
        self.budgets.start()
        self.tenants.start()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()
        if lead:
            self.start_leading()
        return self

    def synced(self) -> bool:
        informers = bool(self._reflectors) and all(r.synced.is_set() for r in self._reflectors)
        return informers and self.gangs.groups.synced() and self.tenants.directory.ready()

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
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=False)
        self._settler.stop()
        self.events.flush(timeout)
        self.events.stop()

    # -------------------------------------------------------------- informer
    def _on_pod(self, obj: dict[str, Any], deleted: bool) -> None:
        key = pod_key(obj)
        self.gangs.on_pod(obj, deleted)
        self.reservations.observe(obj, deleted)
        if ready := self.nominations.observe(obj, deleted):  # their last victim gone: try them now
            self.queue.activate(ready)
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        phase = (obj.get("status") or {}).get("phase")
        if deleted:
            self.queue.remove(key)
            self.events.forget(str(meta.get("uid", "")))
            if spec.get("nodeName"):
                self.queue.cluster_changed()
            return
        if spec.get("nodeName") or meta.get("deletionTimestamp") or phase in TERMINAL:
            self.queue.remove(key)
            if spec.get("nodeName") and (phase in TERMINAL or meta.get("deletionTimestamp")):
                self.queue.cluster_changed()
            return
        if spec.get("schedulingGates"):  # gated (e.g. by Kueue): not ours to place until the gates go
            if spec.get("schedulerName") == self.config.scheduler_name:
                self.queue.gate(key)  # counted as gated
            else:
                self.queue.remove(key)
            return
        if spec.get("schedulerName") == self.config.scheduler_name:
            self.queue.add_or_update(obj, key)

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
        with self.cluster.snapshot() as snap:
            self._note_state(snap)

    def _gang_tiebreak(self, snap: Any) -> Any:
        self._note_state(snap)
        return self._tiebreak

    def _note_state(self, snap: Any) -> None:
        """Called under the cluster lock: when nodes changed since the last cycle (a rebuilt
        snapshot, or a node relabelled in place), unschedulable pods may fit now."""
        seen = (snap, self.cluster.node_version)
        if self._last_state is None or seen[0] is not self._last_state[0] or seen[1] != self._last_state[1]:
            if self._last_state is not None:
                self.queue.cluster_changed()
            self._last_state = seen
            self._tiebreak = np.arange(len(snap), dtype=np.int64)  # nodes are in name order

    def _spec(self, qp: QueuedPod) -> PodSpec:
        spec = qp.payload.get("spec")
        if spec is None:
            spec = qp.payload["spec"] = pod_from_k8s(qp.obj)
        assert isinstance(spec, PodSpec)
        return spec

    def schedule(self, qp: QueuedPod) -> None:
        """One cycle for one popped pod."""
        if not self.leading.is_set():
            self.queue.done(qp.key, requeue=True)
            return
        try:
            pod = self._spec(qp)
        except InvalidRequest as e:
            self.events.failed(qp.obj, str(e), reason="InvalidGPURequest")
            self.metrics.observe_attempt("error", 0.0)
            self.queue.done(qp.key, unschedulable=True)
            return
        if self.cluster.is_bound_or_assumed(qp.key):
            self.queue.done(qp.key)
            return
        if claims := claims_message(qp.obj):  # DRA claims: never bound here (k8s/claims.py)
            self.events.failed(qp.obj, claims)
            self.queue.done(qp.key, unschedulable=True)
            return
        if self.gangs.schedule(qp):  # a gang member: decided with its group, all or nothing
            return
        if self.tenants.schedule(qp, pod):  # under a tenant queue: quota, borrowing, reclaim
            return
        t0 = time.perf_counter()
        victims: list[PodSpec] = []
        wait = ""
        given_up = False
        noms = self.nominations
        with self.cluster.snapshot() as snap:
            self._note_state(snap)
            profile = self._current_profile(pod, snap)
            rooms = noms.rooms(snap, skip=(qp.key,))
            with self.reservations.hold(snap, pod) as steered:  # defragmentation's rooms and moves
                # clear of the rooms of nominated pods of at least its priority, fitting yet or not
                r = schedule_with_nominated(
                    profile, steered, snap, rooms, tiebreak=self._tiebreak, leaving=noms.leaving()
                )
            if r.waiting is not None:
                r = dataclasses.replace(r, status=r.waiting.reject("waiting on Permit: not held here yet"))
            if r.scheduled:
                self.cluster.assume(pod, r.node, r.gpus)
            elif r.victims:
                node_name = snap.names[r.nominated_node]
                wait = noms.may_preempt(qp.key, node_name, snap)
                if not wait:
                    victims = [snap.allocations[k].pod for k in r.victims]
                    noms.nominate(pod, node_name, r.victims)
            elif r.nominated_node < 0:  # no preemption helps any more: its room is given up
                given_up = noms.drop(qp.key) is not None
        dt = time.perf_counter() - t0
        if not r.scheduled:
            self.metrics.observe_attempt("unschedulable", dt)
            msg = r.diagnosis.message() if r.diagnosis else r.status.message()
            msg += self.reservations.note(pod)  # the defragmentation rooms that kept it off
            msg += self.mig_reshapes.consider(pod, qp.obj)  # MIG: a re-cut of free slices (issue 31)
            self.events.failed(qp.obj, f"{msg}; preemption {wait}" if wait else msg)
            self.metrics.pod_unschedulable(qp.key, *diagnosis_labels(r.diagnosis, r.status))
            if victims:
                self.metrics.preempted(len(victims))
                self._pool.submit(self._preempt, pod, node_name, victims)
            if given_up:
                self._pool.submit(self._preemptor.clear, pod)
            self.queue.done(qp.key, unschedulable=True)
            return
        self.metrics.observe_attempt("scheduled", dt)
        self.metrics.pod_scheduled(qp.key)
        self.queue.done(qp.key)
        self._pool.submit(self._bind, profile, qp, pod, r.node_name, r.gpus)

    def _bind(self, profile: Profile, qp: QueuedPod, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> None:
        """Bind the booked decision until the API says what happened (``k8s/binding.py``): the
        GPUs stay booked while the outcome is unknown, so nothing else is placed on them."""
        t0 = time.perf_counter()
        out = bind_until_settled(
            lambda: run_bind(profile, pod, node, gpus),
            pod,
            self._settler,
            keep_trying=lambda: self.leading.is_set() and not self._stop.is_set(),
        )
        if out.result is Result.BOUND and (out.status.ok or out.node == node):
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
        if out.result is Result.REFUSED:  # nothing was written: decide again after backoff
            self.queue.add_or_update(qp.obj, qp.key, backoff=True)

    # ------------------------------------------------------------ preemption
    def _preempt(self, pod: PodSpec, node: str, victims: list[PodSpec]) -> None:
        """Evict the victims through the Eviction API and nominate the node (``k8s/preemption.py``):
        victims already leaving are not evicted again, and a budget this room broke is not broken
        again. Victims a budget kept, or that failed, are no longer waited for: the preemptor
        decides again (after the next cluster change or flush) instead of waiting on them forever."""
        noms = self.nominations
        run = self._preemptor.run(
            pod, node, victims, self.budgets.budgets(),
            leaving=noms.leaving(skip=(pod.key,)), spent=noms.spent(pod.key, node),
        )  # fmt: skip
        noms.broke(pod.key, node, run.broken)
        self._still_waiting(run, [(pod, node)])

    def _still_waiting(self, run: PreemptionRun, nominated: Sequence[tuple[PodSpec, str]]) -> None:
        """After a preemption: the preemptors wait only for the victims that are leaving."""
        if run.blocked or run.failed:
            for pod, _node in nominated:
                self.nominations.waiting_for(pod.key, run.leaving)

    # ------------------------------------------------- gangs (PreemptionHost)
    @contextlib.contextmanager
    def rooms(self, snap: Any, pods: Sequence[PodSpec]) -> Iterator[None]:
        top = max(pods, key=lambda p: p.priority)
        keys = {p.key for p in pods}
        rooms, leaving = self.nominations.rooms(snap, skip=keys), self.nominations.leaving()
        with self.reservations.hold(snap, top), holding(snap, rooms, top.priority, leaving=leaving):
            yield

    def may_preempt(self, placement: Sequence[tuple[str, str]], snap: Any) -> str:
        for key, node in placement:
            if wait := self.nominations.may_preempt(key, node, snap):
                return wait
        return ""

    def disruption_budgets(self) -> DisruptionBudgets:
        return self.budgets.budgets()

    def preempt_gang(
        self, gang: str, placement: Sequence[tuple[PodSpec, str]], victims: Sequence[PodSpec]
    ) -> None:
        keys = tuple(v.key for v in victims)
        for p, node in placement:
            self.nominations.nominate(p, node, keys)
        self.metrics.preempted(len(victims))
        self._pool.submit(self._preempt_gang, gang, list(placement), list(victims))

    def _preempt_gang(self, gang: str, placement: list[tuple[PodSpec, str]], victims: list[PodSpec]) -> None:
        noms = self.nominations
        members = tuple(p.key for p, _ in placement)
        spent = frozenset().union(*(noms.spent(p.key, node) for p, node in placement))
        run = self._preemptor.run_gang(
            gang, placement, victims, self.budgets.budgets(), leaving=noms.leaving(skip=members), spent=spent
        )
        for p, node in placement:
            noms.broke(p.key, node, run.broken)
        self._still_waiting(run, placement)

    def _attempts(self, result: str, seconds: float, pods: int) -> None:
        for _ in range(pods):  # one attempt per pod, as kube-scheduler counts them
            self.metrics.observe_attempt(result, seconds)

    # --------------------------------------------------------------- profile
    def _current_profile(self, pod: PodSpec, snap: Any) -> Profile:
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
        with self.cluster.snapshot() as snap:
            pods = [a.pod for a in snap.allocations.values()]
        for qp in self.queue.pending():
            with contextlib.suppress(InvalidRequest):
                pods.append(self._spec(qp))
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
        with self.cluster.snapshot() as snap:
            self.metrics.set_cluster(cluster_stats(snap, tw))
