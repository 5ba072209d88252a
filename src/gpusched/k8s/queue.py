"""The standalone scheduler's pending queue, after kube-scheduler's ``SchedulingQueue``.

- **active**: a heap in ``core.pending.pending_order``: priority (highest first), then creation
  time, then arrival order (the informer's order: resourceVersion order for watch events, name
  order within a list); ``pop`` blocks until a pod is there. The replay (``sim.replay``) tries its
  pending pods in the same order; why its queue is not this one is said in ``core.pending``.
- **unschedulable**: pods that fit nowhere at their last attempt. They go back to active
  when the cluster changes (``cluster_changed``: a pod deleted, a node added or changed) once
  their backoff (1 s doubling to 10 s) has passed, and in any case after ``flush_s``.
- **in flight**: popped and being decided; the scheduler calls ``done`` when finished. A cluster
  change or an update of the pod that comes while it is decided is not lost: a pod refused by that
  attempt goes back to active once its backoff has passed (kube-scheduler's in-flight events), not
  at the next change or flush (a claim pod refused "waiting for its ResourceClaim" while the
  informer delivered the claim waited 30 s for the flush).
- **gated**: pods with scheduling gates (``gate``), held nowhere else, only counted.

``counts`` splits the unschedulable pods as kube-scheduler's queues do: **backoff** once a
cluster change (or a failed binding) released them and they wait out their backoff, else
**unschedulable** (waiting for a change).

An update of a pending pod replaces its event (``k8s/podevents.py``); an update that changes what
scheduling reads (spec, annotations other than our own, ``status.resourceClaimStatuses``: the
claims kube-controller-manager made from the pod's templates) moves an unschedulable pod back to
active and brings the spec converted from it (``QueuedPod.spec``); any other keeps the spec it has.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gpusched.core.model import PodSpec
from gpusched.core.pending import pending_order
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.k8s.podevents import Conversion, PodEvent

Order = tuple[int, str, int]  # pending_order(priority, creationTimestamp, arrival)


@dataclass
class QueuedPod:
    key: str
    event: PodEvent
    """Its latest event (``k8s/podevents.py``)."""
    order: Order
    fingerprint: bytes
    conversion: Conversion
    """Its ``PodSpec`` (or the ``InvalidRequest`` its conversion raised), converted once: from the
    event that last changed what scheduling reads (``fingerprint``); kept across status updates."""
    attempts: int = 0
    since: float = 0.0  # when it became unschedulable
    event_seq: int = 0  # the cluster-change counter its last attempt saw (at its pop)
    popped_seq: int = 0  # the counter at its pop; -1 once it changed while in flight

    @property
    def obj(self) -> Mapping[str, Any]:
        """The API object of its latest event (for events and status written about it)."""
        return self.event.obj

    @property
    def uid(self) -> str:
        return self.event.uid

    def spec(self) -> PodSpec:
        """The pod as the core sees it; raises ``InvalidRequest`` when it cannot be read."""
        return self.conversion.get()


def fingerprint(obj: Mapping[str, Any]) -> bytes:
    """What scheduling reads of a pending pod (UID, spec, labels, annotations but our own, the
    ResourceClaims made for it), as canonical JSON. Labels are in it: topology spread and pod
    (anti-)affinity read them; ``status.resourceClaimStatuses`` too: a claim pod from a template
    waits for it (``k8s/dra/podclaims.py``)."""
    meta = obj.get("metadata") or {}
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANN_ASSIGNMENT}
    claims = (obj.get("status") or {}).get("resourceClaimStatuses")
    return orjson.dumps(
        [meta.get("uid"), obj.get("spec"), meta.get("labels") or {}, ann, claims],
        option=orjson.OPT_SORT_KEYS,
        default=str,
    )


class SchedulingQueue:
    def __init__(
        self,
        flush_s: float = 30.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flush_s = flush_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._cond = threading.Condition()
        self._pods: dict[str, QueuedPod] = {}
        self._heap: list[tuple[Order, int, str]] = []
        self._active: dict[str, int] = {}  # key -> generation of its valid heap entry
        self._unschedulable: set[str] = set()
        self._in_flight: set[str] = set()
        self._gated: set[str] = set()
        self._gen = itertools.count()
        self._seq = itertools.count()
        self._event_seq = 0
        self._last_flush = clock()
        self.closed = False

    # ----------------------------------------------------------- feeding
    def add_or_update(self, ev: PodEvent, *, backoff: bool = False) -> None:
        """A pending pod appeared or changed. ``backoff``: it comes back from a failed
        binding, so it waits its backoff before the next attempt."""
        fp = fingerprint(ev.obj)
        key = ev.key
        with self._cond:
            self._gated.discard(key)
            qp = self._pods.get(key)
            if qp is not None and qp.uid == ev.uid:
                changed = qp.fingerprint != fp
                qp.event, qp.fingerprint = ev, fp
                if changed:
                    qp.conversion = ev.conversion
                    if key in self._unschedulable:
                        self._unschedulable.discard(key)
                        self._push(qp)
                    elif key in self._in_flight:
                        qp.popped_seq = -1  # its attempt read the old pod: retried after backoff
                return
            order = pending_order(ev.priority, ev.created, next(self._seq))
            qp = QueuedPod(key, ev, order, fp, ev.conversion)
            self._pods[key] = qp
            self._unschedulable.discard(key)
            if backoff:
                qp.attempts, qp.since, qp.event_seq = 1, self._clock(), -1
                self._unschedulable.add(key)
            elif key not in self._in_flight:
                self._push(qp)
            else:  # came while a pod of its name is decided: retried after backoff
                qp.popped_seq = -1

    def remove(self, key: str) -> None:
        with self._cond:
            self._pods.pop(key, None)
            self._active.pop(key, None)
            self._unschedulable.discard(key)
            self._gated.discard(key)

    def gate(self, key: str) -> None:
        """The pod has scheduling gates: out of the queue until they go, counted as gated."""
        with self._cond:
            self.remove(key)
            self._gated.add(key)

    def activate(self, keys: Iterable[str]) -> None:
        """Move these pods from unschedulable to active now (their gang may be complete)."""
        with self._cond:
            for key in keys:
                if key in self._unschedulable:
                    self._unschedulable.discard(key)
                    self._push(self._pods[key])

    def park(self, key: str) -> None:
        """Make the pod unschedulable, whether popped or still waiting in active (the other
        members of a gang that was just decided as a unit and did not fit)."""
        with self._cond:
            if key in self._pods:
                if key not in self._in_flight:  # decided with its unit's popped pod: as of now
                    self._pods[key].popped_seq = self._event_seq
                self._active.pop(key, None)
                self._in_flight.add(key)
        self.done(key, unschedulable=True)

    def get(self, key: str) -> QueuedPod | None:
        with self._cond:
            return self._pods.get(key)

    def cluster_changed(self) -> None:
        """Resources were freed or added: unschedulable pods may fit now (after backoff)."""
        with self._cond:
            self._event_seq += 1
            self._cond.notify_all()

    def move_all_to_active(self) -> None:
        with self._cond:
            for key in list(self._unschedulable):
                self._push(self._pods[key])
            self._unschedulable.clear()

    def _push(self, qp: QueuedPod) -> None:
        gen = next(self._gen)
        self._active[qp.key] = gen
        heapq.heappush(self._heap, (qp.order, gen, qp.key))
        self._cond.notify()

    # ---------------------------------------------------------- draining
    def pop(self, timeout: float = 1.0) -> QueuedPod | None:
        deadline = self._clock() + timeout
        with self._cond:
            while not self.closed:
                self._flush_unschedulable()
                while self._heap:
                    _, gen, key = heapq.heappop(self._heap)
                    if self._active.get(key) == gen:
                        del self._active[key]
                        self._in_flight.add(key)
                        qp = self._pods[key]
                        qp.popped_seq = self._event_seq
                        return qp
                left = deadline - self._clock()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))
        return None

    def done(self, key: str, *, unschedulable: bool = False, requeue: bool = False) -> None:
        """Finish an attempt: keep the pod as unschedulable, put it back to active (after a
        failed bind), or (neither) forget it: it is assumed and the informer will say bound."""
        with self._cond:
            self._in_flight.discard(key)
            qp = self._pods.get(key)
            if qp is None:
                return
            if unschedulable:
                qp.attempts += 1
                qp.since = self._clock()
                # what its attempt saw: a change since its pop (or of the pod) retries it after backoff
                qp.event_seq = qp.popped_seq
                self._unschedulable.add(key)
            elif requeue:
                qp.attempts += 1
                self._push(qp)
            else:
                del self._pods[key]

    def _backoff(self, attempts: int) -> float:
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, attempts - 1)))

    def _flush_unschedulable(self) -> None:
        now = self._clock()
        if now - self._last_flush < 0.5 or not self._unschedulable:
            return
        self._last_flush = now
        for key in list(self._unschedulable):
            qp = self._pods[key]
            age = now - qp.since
            if age >= self.flush_s or (self._event_seq > qp.event_seq and age >= self._backoff(qp.attempts)):
                self._unschedulable.discard(key)
                self._push(qp)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------- views
    def __len__(self) -> int:
        with self._cond:
            return len(self._pods)

    def counts(self) -> dict[str, int]:
        with self._cond:
            backoff = sum(1 for k in self._unschedulable if self._pods[k].event_seq < self._event_seq)
            return {
                "active": len(self._active),
                "backoff": backoff,
                "unschedulable": len(self._unschedulable) - backoff,
                "gated": len(self._gated),
                "in_flight": len(self._in_flight),
            }

    def pending(self) -> list[QueuedPod]:
        with self._cond:
            return list(self._pods.values())
