"""Tenant queues in the standalone scheduler: the directory, the book, reclaim and status.

A pod under a queue (``k8s/queues.py``: its annotation, its namespace's label, a Queue's
``spec.namespaces``; a gang's: its first member's, ``queue_of``) is decided as every pod is
(``core.batch.run_cycle``, carried out by ``k8s/actuator.py``), with its queue's book:

1. an unknown or invalid queue, or one with child queues: a ``FailedScheduling`` event naming the
   queue and where the pod got it; nothing is bound;
2. **quota** (``core.queues.QueueBook``: every booked pod under a queue is charged what it asks
   for, with the model of its node; built once and kept while the books change only by this
   scheduler's own decisions, which charge it as they book, ``settled``; rebuilt when a pod
   or node changed otherwise, or the queues did; each decision works on a copy, ``book``): the
   unit is admitted when its queue stays within its quota, or borrows idle quota of its cohort
   within its borrowing limit (and its lenders' lending limits);
3. **placement**: the profile's cycle without preemption (a queued pod takes back quota by
   reclaim, never by priority across queues), clear of the rooms kept for others;
4. **reclaim**: refused by quota or not fitting while its queue would stay within its own quota,
   the unit gets victims among the pods of borrowing queues (``core.queues.reclaim.plan_reclaim``:
   lowest priority first, fewest victims, whole gangs, PodDisruptionBudget-safe choices first).
   They are evicted through the Eviction API (``k8s/eviction.py``, ``start_reclaim``); the unit's
   charge is *reserved* in its queue meanwhile (so the borrower cannot borrow the room back), and
   it waits until the victims are gone (``waiting_on``; reserved at most ``reservation_s``).

``TenantQueues.run_status`` computes each Queue's status every ``status_interval_s``, hands them
all to the scheduler's metrics (``gpusched_queue_*``; a deleted Queue is left out, so its series
go) and writes each Queue's ``status`` (quota, usage, borrowed, admitted and pending pods, a
``Valid`` condition) when it changed; an invalid queue also gets a Warning event naming
``spec.parent``.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.framework import Profile
from gpusched.core.gang import without_post_filters
from gpusched.core.gangclaims import schedule_gang
from gpusched.core.model import PodSpec
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.spec import ANY_MODEL, ResourceKey
from gpusched.core.queues.status import QueueStatus, queue_statuses
from gpusched.core.queues.usage import Usage, charge_of, gpu_charge
from gpusched.core.scheduler import undo
from gpusched.core.statement import Statement
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.eviction import Evictor
from gpusched.k8s.preemption import Nominations
from gpusched.k8s.queue import SchedulingQueue
from gpusched.k8s.queues import (
    GROUP,
    PLURAL,
    VERSION,
    ClaimCharges,
    Directory,
    QueueDirectory,
    charge_booked,
)
from gpusched.k8s.state import LiveCluster
from gpusched.metrics.scheduling import SchedulerMetrics

log = logging.getLogger(__name__)

_STATUS_FIELDS = (("gpus", "gpus"), ("gpuMilli", "gpu_milli"), ("gpuMemoryMiB", "gpu_memory_mib"))


def _amounts(st: QueueStatus, get: Callable[[ResourceKey], int | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, dim in _STATUS_FIELDS:
        v = get(ResourceKey(ANY_MODEL, dim))
        if v is not None:
            out[field] = int(v)
    dra = {}  # the DRA keys of its tree (devices/<class>, capacity/<class>/<capacity>)
    for k in sorted({*st.quota, *st.usage}):
        if k.model == ANY_MODEL and "/" in k.dim and (v := get(k)) is not None:
            dra[k.dim] = int(v)
    if dra:
        out["dra"] = dra
    return out


def status_body(st: QueueStatus, generation: int, problem: str) -> dict[str, Any]:
    """The ``status`` of one Queue object (without timestamps: compared to skip idle writes)."""
    return {
        "quota": _amounts(st, st.quota.get),
        "usage": _amounts(st, lambda k: st.usage[k]),
        "borrowed": _amounts(st, lambda k: st.borrowed.get(k, 0)),
        "admittedPods": st.admitted,
        "pendingPods": st.pending,
        "observedGeneration": generation,
        "conditions": [
            {"type": "Valid", "status": "False", "reason": "InvalidParent", "message": problem}
            if problem else {"type": "Valid", "status": "True", "reason": "Valid", "message": ""}
        ],
    }  # fmt: skip


@dataclass
class _Kept:
    """The book of the booked pods, as of ``snap`` at ``version`` with the queues ``directory``."""

    snap: ClusterState
    directory: Directory
    version: int
    book: QueueBook


class QueueClaims(ClaimCharges, Protocol):
    """The DRA side tenant queues read (``k8s/claims.py`` ``DraClaims``)."""

    def unknown_classes(self, names: Collection[str]) -> list[str]: ...

    def decided_charge(self, pod: str) -> Usage | None: ...


class TenantQueues:
    def __init__(
        self,
        directory: QueueDirectory,
        core: Any,
        custom: Any,
        *,
        cluster: LiveCluster,
        queue: SchedulingQueue,
        events: EventRecorder,
        pool: Executor,
        nominations: Nominations | None = None,
        metrics: SchedulerMetrics | None = None,
        status_interval_s: float = 2.0,
        reservation_s: float = 300.0,
    ) -> None:
        self.cluster = cluster
        self.queue = queue
        self.events = events
        self.pool = pool
        """Runs the evictions off the scheduling thread (the bind pool)."""
        self.nominations = nominations
        """Where a reclaim's room is kept for its claimant while its victims leave (the scheduler's
        nominated rooms: pods of no higher priority stay out of it); None: kept by quota alone."""
        self.metrics = metrics
        """Takes every Queue's status each time they are computed (``gpusched_queue_*``)."""
        self.directory = directory
        self.core = core
        self.custom = custom
        self.evictor = Evictor(core)
        self.status_interval_s = status_interval_s
        self.reservation_s = reservation_s
        self._lock = threading.Lock()
        self._reserved: dict[str, tuple[str, Usage, float]] = {}  # pod -> (queue, charge, until)
        self._reclaiming: dict[str, tuple[str, ...]] = {}  # pod -> victims it waits for
        self._kept: _Kept | None = None  # the booked pods' charges (``_booked``)
        self.keep_book = True
        """Keep the booked pods' charges between decisions (False: rebuilt for each, as before)."""
        self.books_built = 0
        self._written: dict[str, tuple[str, dict[str, Any]]] = {}  # queue -> (uid, status written)
        self._warned: dict[str, tuple[str, str]] = {}  # queue -> (uid, problem warned of)
        self.claims: QueueClaims | None = None
        """DRA: booked claim pods charged per DeviceClass, quotas naming unknown classes refused."""
        self.reclaims = 0
        """Reclaims started (victim sets evicted)."""
        self._stop = threading.Event()

    # -------------------------------------------------------------- the books
    def book(self, snap: ClusterState, d: Directory, *, leave_out: Collection[str] = ()) -> QueueBook:
        """Every booked pod under a valid leaf queue charged, and the reservations of pods whose
        victims are leaving (but those of the pods ``leave_out`` names): a copy of the kept book
        (``_booked``) that the caller may change. Call under the cluster lock."""
        book = self._booked(snap, d).copy()
        now = time.monotonic()
        with self._lock:
            for key, (q, usage, until) in list(self._reserved.items()):
                if until < now or key in snap.allocations:
                    del self._reserved[key]
                    self._reclaiming.pop(key, None)
                elif key not in leave_out and q in d.tree and d.tree.is_leaf(q):
                    book.charge(key, q, usage)
        return book

    def _booked(self, snap: ClusterState, d: Directory) -> QueueBook:
        """The booked pods' charges, built once and kept while the books change only by this
        scheduler's decisions (``settled``); rebuilt when ``snap`` or the queues changed since."""
        k = self._kept
        fresh = k is not None and k.snap is snap and k.directory is d and k.version == snap.version
        if k is None or not fresh or not self.keep_book:
            k = self._kept = _Kept(snap, d, snap.version, charge_booked(snap, d, self.claims))
            self.books_built += 1
        return k.book

    def settled(self, snap: ClusterState, d: Directory, placed: Iterable[str] = ()) -> None:
        """End of a decision made on ``book`` within the same hold of the cluster lock: charge the
        kept book with the pods it booked (``placed``, pod keys), so that the next decision starts
        from it (its what-ifs changed nothing else)."""
        k = self._kept
        if k is None or k.snap is not snap or k.directory is not d:
            return
        for key in placed:
            a = snap.allocations.get(key)
            if a is None or key in k.book.charged:
                continue
            q, _ = d.queue_of(a.pod)
            if q and not d.problem(q, ""):
                model = snap.nodes[a.node].gpu_model  # what its claims took (`All`: every device)
                took = self.claims.decided_charge(key) if self.claims is not None else None
                charge = charge_of(a.pod, model) if took is None else gpu_charge(a.pod, model) + took
                k.book.charge(key, q, charge)
        k.version = snap.version

    def queue_of(self, pod: PodSpec) -> tuple[str, str]:
        """The tenant queue ``pod`` is admitted by and why it cannot be ("" when it can); ("", "")
        when it is under none (or the queues are not installed)."""
        if not self.directory.installed():
            return "", ""
        d = self.directory.current()
        queue, source = d.queue_of(pod)
        if not queue:
            return "", ""
        return queue, d.problem(queue, source) or self._unknown_classes(d, queue, source)

    def _unknown_classes(self, d: Directory, queue: str, source: str) -> str:
        """Why a queue whose quotas (its own or an ancestor's) name a DeviceClass the API does not
        have cannot admit pods ("" when none does, or the DRA informers have not listed yet)."""
        if self.claims is None or queue not in d.tree:
            return ""
        for q in d.tree.paths[queue]:
            unknown = self.claims.unknown_classes(d.tree.specs[q].device_classes())
            if unknown:
                return (
                    f"Queue {q}: spec (nominalQuota, borrowingLimit or lendingLimit).dra names "
                    f"DeviceClass {', '.join(unknown)}, which does not exist (the queue of {source})"
                )
        return ""

    # --------------------------------------------------------------- reclaim
    def waiting_on(self, keys: Collection[str], snap: ClusterState) -> int:
        """How many pods reclaimed for any of ``keys`` are still in the books (leaving)."""
        with self._lock:
            return len({v for k in keys for v in self._reclaiming.get(k, ()) if v in snap.allocations})

    def admitted(self, keys: Collection[str]) -> None:
        """The pods ``keys`` were placed: their reservations and reclaims are over."""
        with self._lock:
            for k in keys:
                self._reserved.pop(k, None)
                self._reclaiming.pop(k, None)

    def start_reclaim(
        self,
        pods: Sequence[PodSpec],
        queue: str,
        victims: Sequence[tuple[PodSpec, str]],
        *,
        by: str,
        rooms: Sequence[tuple[PodSpec, str]] = (),
    ) -> None:
        """Reserve the charges of ``pods`` (a pod, or a gang's members) in ``queue`` and evict
        ``victims`` (pod, node) off the scheduling thread; ``by`` names the claimant in events.
        ``rooms`` (pod, node: where each will land, ``landing``) are kept for them meanwhile as
        a nominated preemptor's room is (issue 28: the victims' replacements stay out of it)."""
        until = time.monotonic() + self.reservation_s
        keys = tuple(v.key for v, _ in victims)
        if self.nominations is not None:
            for p, node in rooms:
                self.nominations.nominate(p, node, keys)
        with self._lock:
            for p in pods:
                self._reserved[p.key] = (queue, charge_of(p), until)
                self._reclaiming[p.key] = keys
        self.reclaims += 1
        self.pool.submit(self._evict, tuple(p.key for p in pods), by, queue, list(victims))

    def _evict(self, keys: tuple[str, ...], by: str, queue: str, victims: list[tuple[PodSpec, str]]) -> None:
        for v, node in victims:
            out = self.evictor.evict(v.namespace, v.name, v.uid)
            if out.done:
                meta = {"name": v.name, "namespace": v.namespace, "uid": v.uid}
                self.events.preempted(meta, f"{by} (queue {queue} reclaims its quota)", node)
            else:
                log.warning("reclaiming %s for %s: %s %s", v.key, by, out.outcome.value, out.message)
                with self._lock:  # not waited for: the claimant plans again
                    for k in keys:
                        self._reclaiming[k] = tuple(x for x in self._reclaiming.get(k, ()) if x != v.key)

    # ----------------------------------------------------------------- status
    def pending_by_queue(self, d: Directory) -> dict[str, int]:
        out: dict[str, int] = {}
        for qp in self.queue.pending():
            try:
                q, _ = d.queue_of(qp.spec())  # converted once, when it was queued
            except InvalidRequest:
                continue
            if q:
                out[q] = out.get(q, 0) + 1
        return out

    def statuses(self, d: Directory, names: Iterable[str]) -> dict[str, QueueStatus]:
        """The status of each queue of ``names``, by name (an invalid one: nothing charged, its
        waiting pods)."""
        with self.cluster.live_books() as snap:
            book = self.book(snap, d)
        pending = self.pending_by_queue(d)
        valid = {s.name: s for s in queue_statuses(book, pending)}
        return {
            n: valid.get(n) or QueueStatus(n, Usage(), {}, {}, pending.get(n, 0), 0) for n in sorted(names)
        }

    def write_status(self) -> int:
        """Compute every Queue's status, publish them all (the scheduler's metrics) and write each
        one that changed; returns how many were written."""
        if not self.directory.synced():
            return 0
        d = self.directory.current()
        objects = self.directory.objects()
        statuses = self.statuses(d, objects)
        if self.metrics is not None:
            self.metrics.set_queue_statuses(list(statuses.values()))
        for gone in [n for n in self._written if n not in objects]:
            del self._written[gone]
        for gone in [n for n in self._warned if n not in objects]:
            del self._warned[gone]
        written = 0
        for name, obj in objects.items():
            st = statuses[name]
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            problem = d.invalid.get(name, "")
            body = status_body(st, int(meta.get("generation") or 0), problem)
            if problem and self._warned.get(name) != (uid, problem):
                self._warned[name] = (uid, problem)
                self._queue_event(obj, problem)
            if self._written.get(name) == (uid, body):  # a Queue deleted and made again: written anew
                continue
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            sent = {**body, "conditions": [{**c, "lastTransitionTime": now} for c in body["conditions"]]}
            try:
                self.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, PLURAL, name, {"status": sent}, _preload_content=False
                )
            except Exception as e:
                log.debug("writing the status of Queue %s: %s", name, e)
                continue
            self._written[name] = (uid, body)
            written += 1
        return written

    def _queue_event(self, obj: Any, message: str) -> None:
        meta = obj.get("metadata") or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": "default"},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "name": meta.get("name"),
                "uid": meta.get("uid"), "fieldPath": "spec.parent",
            },
            "type": "Warning", "reason": "InvalidQueue", "message": message[:1024],
            "source": {"component": self.events.component},
            "reportingComponent": self.events.component,
            "reportingInstance": self.events.instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }  # fmt: skip
        try:
            self.core.create_namespaced_event("default", body, _preload_content=False)
        except Exception as e:
            log.debug("event on Queue %s: %s", meta.get("name"), e)

    def run_status(self) -> None:
        while not self._stop.wait(self.status_interval_s):
            try:
                self.write_status()
            except Exception:
                log.exception("writing queue status")

    def start(self) -> TenantQueues:
        self.directory.start()
        threading.Thread(target=self.run_status, name="queue-status", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.directory.stop()


def landing(
    profile: Profile,
    snap: ClusterState,
    pods: Sequence[PodSpec],
    victims: Collection[str],
    *,
    need: int | None = None,
    tiebreak: I64 | None = None,
) -> list[tuple[PodSpec, str]]:
    """Where ``pods`` (at least ``need`` of them at once) would land once ``victims`` are gone:
    (pod, node name) each, or none when they would not; ``snap`` ends as it began."""
    with Statement(snap) as st:
        for k in victims:
            if k in snap.allocations:
                st.evict(k)
        r = schedule_gang(  # a gang of claim pods: its members' claims jointly, as it will be decided
            without_post_filters(profile),
            pods,
            snap,
            tiebreak=tiebreak,
            min_count=need,
            diagnose_failures=False,
            leaving=frozenset(victims),  # their DRA claims are free there too
        )
        placed = [(x.pod, x.node_name) for x in r.placed]
        for x in r.placed:  # booked by schedule_all's own statement: undone before the victims return
            undo(snap, x)  # (with what Reserve took: a claim pod's DRA devices)
    return placed
