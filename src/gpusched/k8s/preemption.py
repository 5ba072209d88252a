"""Carrying out a preemption: victims leave through the Eviction API, the preemptor is nominated.

The core chose the node and the victims (``DefaultPreemption``, with the PodDisruptionBudgets
as data, so that a choice breaking no budget wins when one exists). ``Preemptor.run`` then:

1. evicts each victim through ``pods/eviction`` (``k8s/eviction.py``) with its UID as a
   precondition and its own grace period: it terminates gracefully and keeps its GPUs in the
   books until the API deletes it;
2. when the API refuses a victim for its budget (429): if the choice *knowingly* broke that
   budget — no choice spared every budget, and kube-scheduler would delete the victim anyway
   (``violate_budgets``, the default) — the victim is deleted gracefully instead, with an event
   naming the budget; otherwise (the budget changed since it was read) the victim stays, and the
   preemptor is told to decide again later (``PreemptionRun.blocked``);
3. sets the preemptor's ``status.nominatedNodeName`` (for a gang, ``run_gang``: each member's,
   where it will land) *before* the evictions, so that a scheduler killed half-way finds the room
   when it starts again, and clears it when no victim is leaving after all; the scheduler keeps
   the room on that node for it (``core.statement.holding``) until it binds.

Each victim leaving gets a ``Preempted`` event; the preemptor a ``PreemptionBlocked`` warning
when a budget kept a victim. A victim already leaving (terminating, or evicted for another
preemptor) is not evicted again and gets no second event. A budget is broken by at most one
preemption per room (preemptor and node): one that a room broke already (``spent``) is never
forced again for it, its victims wait; a victim deleted despite its budget first gets the
``DisruptionTarget`` condition kube-scheduler gives it (the Eviction API adds its own).

``Nominations`` is the scheduler's record of those rooms (issue 28, F1): who is nominated
where, the victims it waits for, the pods terminating, how often each pod preempted on each
node and the budgets each room broke; rebuilt from ``status.nominatedNodeName`` after a restart.
``Rooms`` holds them (and defragmentation's) while a unit is decided.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from gpusched.core.cluster import ClusterState
from gpusched.core.disruption import DisruptionBudgets
from gpusched.core.gang import Unit
from gpusched.core.model import PodSpec
from gpusched.core.names import ANN_ROOM
from gpusched.core.statement import holding
from gpusched.k8s.binder import describe
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.eviction import Eviction, Evictor, Outcome
from gpusched.k8s.podevents import PodEvent
from gpusched.k8s.reservation import Reservations

log = logging.getLogger(__name__)


@dataclass
class PreemptionRun:
    """What became of one preemption's victims."""

    leaving: list[str] = field(default_factory=list)
    """Victims evicted (or deleted) and terminating, or already gone."""
    blocked: list[Eviction] = field(default_factory=list)
    """Victims a budget kept (not forced): the preemptor decides again after ``retry_after_s``."""
    failed: list[Eviction] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    """Victims deleted despite their budget (no choice spared every budget)."""
    broken: list[str] = field(default_factory=list)
    """The budgets those deletions broke (as the API named them, "?" when it did not)."""
    nominated: bool = False

    @property
    def retry_after_s(self) -> float:
        return max((b.retry_after_s for b in self.blocked), default=0.0)


def _meta(p: PodSpec) -> dict[str, Any]:
    return {"name": p.name, "namespace": p.namespace, "uid": p.uid}


class Preemptor:
    """``core``: a ``CoreV1Api``; ``events``: the scheduler's recorder."""

    def __init__(self, core: Any, events: EventRecorder, *, violate_budgets: bool = True) -> None:
        self.core = core
        self.events = events
        self.evictor = Evictor(core)
        self.violate_budgets = violate_budgets

    def run(
        self,
        pod: PodSpec,
        node: str,
        victims: Sequence[PodSpec],
        budgets: DisruptionBudgets,
        *,
        leaving: Collection[str] = (),
        spent: Collection[str] = (),
    ) -> PreemptionRun:
        """Evict ``victims`` for ``pod`` (to land on ``node``), as the module says. ``leaving``:
        keys of pods already on their way out (not evicted again); ``spent``: budgets this room
        broke already (not broken again: the victim waits as if no choice had been forced)."""
        nominated = self.nominate(pod, node)  # first: a scheduler restarted mid-way finds the room
        out = self._evict(pod.key, node, victims, budgets, [pod], leaving, spent)
        out.nominated = nominated and bool(out.leaving)
        if nominated and not out.leaving:
            self.clear(pod)
        return out

    def run_gang(
        self,
        gang: str,
        placement: Sequence[tuple[PodSpec, str]],
        victims: Sequence[PodSpec],
        budgets: DisruptionBudgets,
        *,
        leaving: Collection[str] = (),
        spent: Collection[str] = (),
    ) -> PreemptionRun:
        """Evict ``victims`` for the members of ``gang`` and nominate each member where it will
        land (``placement``: pod, node) once they are gone; ``leaving``, ``spent`` as in ``run``."""
        nodes = ", ".join(sorted({n for _, n in placement}))
        told = [p for p, _ in placement]
        nominated = all([self.nominate(p, n) for p, n in placement])
        out = self._evict(f"gang {gang}", nodes, victims, budgets, told, leaving, spent)
        out.nominated = nominated and bool(out.leaving)
        if not out.leaving:
            for p in told:
                self.clear(p)
        return out

    def _evict(
        self,
        by: str,
        nodes: str,
        victims: Sequence[PodSpec],
        budgets: DisruptionBudgets,
        told: Sequence[PodSpec],
        leaving: Collection[str] = (),
        spent: Collection[str] = (),
    ) -> PreemptionRun:
        """Evict ``victims`` for ``by`` (landing on ``nodes``); ``told``: the preemptors warned
        when a budget keeps a victim."""
        ordered = sorted(victims, key=lambda v: (-v.priority, v.key))  # most important first, as counted
        knowingly = {p.key for p in budgets.split(ordered)[0]} if budgets else set()
        out = PreemptionRun()
        for v in victims:
            if v.key in leaving:  # on its way out already: no second eviction, no second event
                out.leaving.append(v.key)
                continue
            ev = self.evictor.evict(v.namespace, v.name, v.uid)
            budget = ev.budget or "?"
            if (
                ev.outcome is Outcome.BLOCKED
                and v.key in knowingly
                and self.violate_budgets
                and budget not in spent
            ):
                self._disruption_target(v)
                forced = self.evictor.delete(v.namespace, v.name, v.uid)
                if forced.done:
                    out.forced.append(v.key)
                    out.broken.append(budget)
                    why = f" (PodDisruptionBudget {ev.budget or '?'} violated: no choice spared every budget)"
                    self._left(out, v, by + why, nodes)
                else:
                    out.failed.append(forced)
                continue
            if ev.outcome is Outcome.BLOCKED:
                out.blocked.append(ev)
                continue
            if ev.done:
                self._left(out, v, by, nodes)
                continue
            out.failed.append(ev)
            log.warning("preempting %s for %s: %s", v.key, by, ev.message)
        if out.blocked:
            names = ", ".join(f"{b.key} ({b.budget or 'a PodDisruptionBudget'})" for b in out.blocked)
            msg = f"preemption on node {nodes} waits: eviction refused by the disruption budget of {names}"
            for p in told:
                self.events.failed(_pod_obj(p), msg, reason="PreemptionBlocked", condition=False)
        return out

    def _disruption_target(self, v: PodSpec) -> None:
        """kube-scheduler's condition on a victim it deletes (the Eviction API sets its own)."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": f"{self.events.component}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": now,
        }  # fmt: skip
        try:
            self.core.patch_namespaced_pod_status(
                v.name, v.namespace, {"status": {"conditions": [cond]}}, _preload_content=False
            )
        except Exception as e:
            log.warning("DisruptionTarget on %s not written: %s", v.key, describe(e))

    def _left(self, out: PreemptionRun, v: PodSpec, by: str, nodes: str) -> None:
        out.leaving.append(v.key)
        self.events.preempted(_meta(v), by, nodes)

    def nominate(self, pod: PodSpec, node: str) -> bool:
        """Set ``status.nominatedNodeName`` of the preemptor (kept until it binds)."""
        try:
            status = {"status": {"nominatedNodeName": node}}
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, status, _preload_content=False)
            return True
        except Exception as e:
            log.debug("nominating %s for %s: %s", node, pod.key, describe(e))
            return False

    def clear(self, pod: PodSpec) -> None:
        """Clear ``status.nominatedNodeName`` of a preemptor that gave its room up."""
        try:
            status = {"status": {"nominatedNodeName": None}}
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, status, _preload_content=False)
        except Exception as e:
            log.debug("clearing the nomination of %s: %s", pod.key, describe(e))


def _pod_obj(p: PodSpec) -> dict[str, Any]:
    return {"metadata": _meta(p)}


@dataclass(frozen=True, slots=True)
class Nomination:
    """``pod`` waits to land on ``node`` once ``victims`` (pod keys) are gone. ``seen``: the API
    showed it (``status.nominatedNodeName``), so an update without it means it was cleared."""

    pod: PodSpec
    node: str
    victims: tuple[str, ...] = ()
    seen: bool = False


class Nominations:
    """The rooms of nominated preemptors (thread-safe), fed by the scheduler's decisions and its
    pod informer (``observe``). A room is kept until its pod binds, is deleted, has its
    nomination cleared, or gives it up (``drop``: no preemption helps any more).

    ``limit`` preemptions per pod and node within ``window_s`` seconds (``clock``), then it
    waits: a preemption that cannot finish must not evict for ever."""

    def __init__(
        self,
        scheduler_name: str,
        *,
        limit: int = 3,
        window_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("limit must be >= 1 and window_s > 0")
        self.scheduler_name = scheduler_name
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._by_pod: dict[str, Nomination] = {}
        self._terminating: set[str] = set()
        self._preempted: dict[tuple[str, str], list[float]] = {}
        self._broken: dict[tuple[str, str], set[str]] = {}

    # -------------------------------------------------------------- informer
    def observe(self, ev: PodEvent) -> list[str]:
        """One pod event: bound or deleted pods hold no room; a bound pod being deleted is
        leaving; a pending pod of ours showing ``status.nominatedNodeName`` has its room
        (rebuilt after a restart: issue 28, F5), with the event's ``PodSpec`` (converted once,
        ``PodEvent.spec``); one whose nomination was cleared has none.
        Returns the preemptors whose last victim this deletion was (their room is free now)."""
        key, nominated = ev.key, ev.nominated_node
        with self._lock:
            if ev.deleted or ev.bound:
                self._forget(key)
                if ev.bound and ev.deleting and not ev.deleted:
                    self._terminating.add(key)
                else:
                    self._terminating.discard(key)
                return self._victim_gone(key) if ev.deleted else []
            held = self._by_pod.get(key)
            if ev.deleting or ev.scheduler_name != self.scheduler_name:
                self._forget(key)
                return []
            if not nominated:
                if held is not None and held.seen:  # cleared by someone: the room is given up
                    self._forget(key)
                return []
            if held is not None:
                if held.node == nominated and not held.seen:
                    self._by_pod[key] = replace(held, seen=True)
                elif held.node != nominated and held.seen:  # renominated by someone else
                    self._by_pod[key] = replace(held, node=nominated, victims=())
                return []  # (not seen yet: our own nomination, its status patch on the way)
            if ANN_ROOM in ((ev.obj.get("metadata") or {}).get("annotations") or {}):
                return []  # a room defragmentation keeps (k8s/reservation.py), not a preemptor's
        try:
            pod = ev.spec()
        except InvalidRequest as e:  # an invalid pod: the scheduler reports it when it pops
            log.debug("not rebuilding the nomination of %s: %s", key, e)
            return []
        with self._lock:
            self._by_pod.setdefault(key, Nomination(pod, nominated, (), seen=True))
        return []

    def _victim_gone(self, victim: str) -> list[str]:
        ready = []
        for k, n in list(self._by_pod.items()):
            if victim in n.victims:
                left = tuple(v for v in n.victims if v != victim)
                self._by_pod[k] = replace(n, victims=left)
                if not left:
                    ready.append(k)
        return ready

    def _forget(self, key: str) -> None:
        self._by_pod.pop(key, None)
        for d in (self._preempted, self._broken):
            for k in [k for k in d if k[0] == key]:
                del d[k]

    # ------------------------------------------------------------- decisions
    def nominate(self, pod: PodSpec, node: str, victims: Sequence[str]) -> None:
        """``pod`` preempted ``victims`` to land on ``node``: its room, one preemption counted."""
        with self._lock:
            self._by_pod[pod.key] = Nomination(pod, node, tuple(victims))
            times = self._preempted.setdefault((pod.key, node), [])
            times.append(self._clock())

    def waiting_for(self, key: str, victims: Sequence[str]) -> None:
        """After the evictions: ``key`` waits only for ``victims`` (none: its room is given up)."""
        with self._lock:
            held = self._by_pod.get(key)
            if held is None:
                return
            if victims:
                self._by_pod[key] = replace(held, victims=tuple(victims))
            else:
                del self._by_pod[key]

    def drop(self, key: str) -> Nomination | None:
        """``key`` gives its room up (no preemption helps it any more); returns what it held."""
        with self._lock:
            return self._by_pod.pop(key, None)

    def broke(self, key: str, node: str, budgets: Sequence[str]) -> None:
        with self._lock:
            self._broken.setdefault((key, node), set()).update(budgets)

    def spent(self, key: str, node: str) -> frozenset[str]:
        """The budgets the room of ``key`` on ``node`` broke already."""
        with self._lock:
            return frozenset(self._broken.get((key, node), ()))

    # ---------------------------------------------------------------- reading
    def get(self, key: str) -> Nomination | None:
        with self._lock:
            return self._by_pod.get(key)

    def all(self) -> list[Nomination]:
        with self._lock:
            return list(self._by_pod.values())

    def leaving(self, skip: Collection[str] = ()) -> frozenset[str]:
        """Pods on their way out: terminating, or evicted for a preemptor (not of ``skip``) that
        waits for them."""
        with self._lock:
            victims = (n.victims for k, n in self._by_pod.items() if k not in skip)
            return frozenset(self._terminating).union(*victims)

    def rooms(self, snap: ClusterState, skip: Collection[str] = ()) -> list[tuple[PodSpec, int]]:
        """(pod, node index) of every room but those of ``skip``, for ``core.statement.holding``."""
        with self._lock:
            return [(n.pod, snap.index.get(n.node, -1)) for k, n in self._by_pod.items() if k not in skip]

    def may_preempt(self, key: str, node: str, snap: ClusterState) -> str:
        """Nothing ("") when ``key`` may preempt on ``node`` now, else why it waits: the victims of its last
        preemption are still in the books; a pod of lower priority is terminating on its
        nominated node (kube-scheduler's rule: the room is being made); or it preempted on
        ``node`` ``limit`` times within ``window_s``."""
        with self._lock:
            held = self._by_pod.get(key)
            if held is not None:
                still = [v for v in held.victims if v in snap.allocations]
                if still:
                    return f"waiting for {len(still)} pod(s) it preempted to leave"
                i = snap.index.get(held.node)
                if i is not None and any(
                    k in self._terminating and snap.allocations[k].pod.priority < held.pod.priority
                    for k in snap.node_pods[i]
                ):
                    return f"waiting for a lower-priority pod terminating on its nominated node {held.node}"
            now = self._clock()
            times = [t for t in self._preempted.get((key, node), ()) if now - t < self.window_s]
            if times:
                self._preempted[(key, node)] = times
            if len(times) >= self.limit:
                return (
                    f"preempted on node {node} {len(times)} times in the last {self.window_s:g}s "
                    f"(at most {self.limit}): not again before {self.window_s - (now - times[0]):.0f}s"
                )
            return ""


class Rooms:
    """The rooms a unit is decided clear of (``core.batch.Hold``): nominated preemptors' of at
    least its priority, fitting yet or not (``core.statement.holding``, kube-scheduler's rule), and
    defragmentation's (``Reservations.hold``, which steers a single pod to where a plan put the pod
    it replaces). The unit's own rooms are left out."""

    def __init__(self, nominations: Nominations, reservations: Reservations) -> None:
        self.nominations = nominations
        self.reservations = reservations

    @contextmanager
    def hold(self, snap: ClusterState, unit: Unit) -> Iterator[Unit]:
        top = max(unit.pods, key=lambda p: p.priority)
        keys = {p.key for p in unit.pods}
        rooms, leaving = self.nominations.rooms(snap, skip=keys), self.nominations.leaving()
        held = holding(snap, rooms, top.priority, leaving=leaving)
        with self.reservations.hold(snap, top) as steered, held:
            alone = unit.gang is None and len(unit.pods) == 1
            yield replace(unit, pods=(steered,)) if alone and steered is not top else unit
