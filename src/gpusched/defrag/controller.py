"""``gpusched defrag run``: the opt-in defragmentation controller.

Each ``interval_s`` (only while it holds the Lease, ``serve.py``), it reads the cluster into the
standalone scheduler's books (``live``) and looks for a pending GPU pod of the gpusched scheduler
(or a gang) that has waited longer than ``wait_s`` and was not tried in the last ``wait_s``. It
plans for the most important one (``core.defrag.plan_for``, the cluster's PodDisruptionBudgets as
budgets, the moves of the window so far counted against ``max_moves_per_window`` and
``max_moves_per_pod``) and carries the plan out:

1. **Reserve.** The pending pod gets ``status.nominatedNodeName`` and the annotation
   ``gpusched.io/defrag-room`` (node and GPUs): the standalone scheduler keeps that room from
   pods of lower or equal priority from then on (``k8s/reservation.py``), so no recreated pod
   takes back what an eviction freed. The annotation also names each moved pod's planned node:
   the scheduler prefers it for the pod's replacement (same namespace and labels). A plan for a
   pending MIG pod (``core.defrag.mig.room_for``) names slices: the pod's room is the slice it takes
   (or the freed slices the scheduler re-cuts for it), each moved pod's the free instance it is to
   take; the scheduler holds both (``k8s/reservation.py``).
2. **Each move, checked first.** The books are read again and the rest of the plan is carried
   out on them in a ``Statement`` (``core.defrag.apply_plan``, then undone); if a step no longer
   holds, the controller plans again from the fresh books (at most ``replans`` times), else the
   plan is abandoned (``stale``). Then the pod is evicted through the Eviction API (UID
   precondition, graceful), never past a PodDisruptionBudget: a 429 plans again without that
   pod, or abandons (``blocked-by-pdb``). The pod gets an Event that names the pod it made room
   for; the controller waits until it has left before the next step (its owner recreates it;
   the scheduler places the new pod elsewhere, the room being held).
3. **Landing.** Once the moves are done the pod should bind on its nominated node; bound in
   ``bind_timeout_s``: ``completed`` (gain: its GPUs). A pending pod that disappears (or is
   bound elsewhere) at any step ends the plan at once: no further eviction.

An abandoned plan clears the nomination and the room. Metrics: ``metrics/defrag.py``.

What outlives the process (``defrag/ledger.py``, on the controller's Lease): each move is recorded
there before its eviction, and the window's moves are read back from there before each plan, so the
per-window and per-pod budgets hold across restarts and changes of leader; the plan being carried
out is recorded there too (id, pending pods, holder, when it lapses), and each room names that plan
and lapses with it: the scheduler holds only rooms that the Lease backs (``k8s/reservation.py``).

Only pods that a controller recreates move (``core.defrag``: ``PodSpec.controller``); just before
each eviction the pod is read again and its ``ownerReferences`` checked once more (a pod orphaned
since the plan was made abandons it: ``no-controller``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpusched.core.defrag import (
    RECREATING_KINDS,
    Method,
    Placement,
    Plan,
    Rules,
    WorkBudget,
    apply_plan,
    plan_for,
)
from gpusched.core.defrag.mig import room_for
from gpusched.core.model import PodSpec
from gpusched.core.statement import Statement
from gpusched.defrag.dryrun import pending_targets
from gpusched.defrag.errors import DefragError
from gpusched.defrag.ledger import LeaseLedger, LedgerError
from gpusched.doctor.books import Books
from gpusched.k8s.convert import controller_of
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.eviction import Evictor, Outcome
from gpusched.k8s.reservation import ANN_ROOM, PlanRecord, Steer, room_annotation, room_text
from gpusched.metrics.defrag import DefragMetrics

log = logging.getLogger(__name__)


@dataclass
class ControllerConfig:
    scheduler_name: str = "gpusched"
    """Plan only for pending pods of this ``spec.schedulerName`` (the scheduler that keeps rooms)."""
    policy: str = "default"
    wait_s: float = 300.0
    """A pod that waited longer than this gets a plan (and is tried again after as long)."""
    interval_s: float = 10.0
    max_moves: int = 8
    """Moves in one plan."""
    max_moves_per_window: int = 32
    window_s: float = 3600.0
    max_moves_per_pod: int = 1
    """Times one pod may be moved in the window."""
    plan_timeout_s: float = 5.0
    leave_timeout_s: float = 120.0
    """How long an evicted pod may take to leave (its grace period) before the plan is abandoned."""
    bind_timeout_s: float = 120.0
    replans: int = 2
    grace_period_s: int | None = None
    """None: each evicted pod's own ``terminationGracePeriodSeconds``."""
    poll_s: float = 0.5
    identity: str = ""
    lease_name: str = "gpusched-defrag"
    lease_namespace: str = "kube-system"
    """The Lease (leader election, and the record of moves and of the plan under way)."""
    recreating: frozenset[str] = RECREATING_KINDS
    """The controller kinds (``Kind.group``) that recreate an evicted pod: only their pods move."""


@dataclass(frozen=True)
class Attempt:
    """What became of one target (``result``: completed, abandoned, fits-now, infeasible)."""

    pods: tuple[str, ...]
    result: str
    reason: str = ""
    moves: tuple[str, ...] = ()


class _Abandon(DefragError):
    """A plan stops here (control flow inside the controller; ``reason`` is the metric's label)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _created(obj: Mapping[str, Any]) -> float:
    raw = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _involved(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": meta.get("namespace", "default"),
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
    }


def _rooms(plan: Plan) -> tuple[Placement, ...]:
    """The rooms a plan keeps: its placements; for a MIG plan whose pending pod lands after the scheduler
    re-cuts the freed slices (no placement), the slices its moves free, on their node, for that pod."""
    if plan.placements or not plan.moves or not all(m.from_mig for m in plan.moves):
        return plan.placements
    freed = tuple(x for m in plan.moves for x in m.from_mig)
    return tuple(Placement(k, plan.moves[0].from_node, (), freed) for k in plan.pending)


class DefragController:
    def __init__(
        self,
        api: Any,
        read: Callable[[], Books],
        config: ControllerConfig | None = None,
        metrics: DefragMetrics | None = None,
        *,
        wall: Callable[[], float] = time.time,
        ledger: Any = None,
    ) -> None:
        from kubernetes import client

        from gpusched.k8s.disruption import BudgetReader

        self.config = cfg = config or ControllerConfig()
        self.core = client.CoreV1Api(api)
        self.read = read
        self.evictor = Evictor(self.core)
        self.budgets = BudgetReader(client.PolicyV1Api(api))
        self.events = EventRecorder(self.core, "gpusched-defrag", cfg.identity)
        self.metrics = metrics or DefragMetrics()
        self.metrics.set_leader(cfg.lease_name, False)
        self.wall = wall
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ledger = ledger or LeaseLedger(
            client.CoordinationV1Api(api), cfg.lease_namespace, cfg.lease_name, cfg.window_s
        )
        self._moved: deque[tuple[float, str]] = deque()  # the window's moves, as the Lease last said
        self._plan_id = ""
        self._tried: dict[str, float] = {}
        self.attempts: list[Attempt] = []

    # ------------------------------------------------------------ lifecycle
    def start(self, lead: bool = True) -> DefragController:
        self.budgets.start()
        self._thread = threading.Thread(target=self._loop, name="defrag", daemon=True)
        self._thread.start()
        if lead:
            self.start_leading()
        return self

    def start_leading(self) -> None:
        self.budgets.wait_synced(30.0)
        self._recover()
        self.leading.set()
        self.metrics.set_leader(self.config.lease_name, True)

    def _recover(self) -> None:
        """A plan recorded by another controller (one killed mid-plan, a former leader) is over:
        its record is cleared and its pods' rooms and nominations released, at once rather than
        when the room lapses."""
        try:
            record = self.ledger.plan()
            if record is None or record.holder == self.config.identity:
                return
            log.info("plan %s of %s found on the Lease: released", record.id, record.holder or "another")
            self.ledger.clear_plan(record.id)
        except LedgerError as e:
            log.warning("the plan on the Lease could not be read or cleared (its rooms lapse): %s", e)
            return
        self._release(record.pods, f"the controller that made plan {record.id} stopped")

    def stop_leading(self) -> None:
        self.leading.clear()
        self.metrics.set_leader(self.config.lease_name, False)

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_leading()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.budgets.stop()
        self.events.flush(timeout)
        self.events.stop()

    def synced(self) -> bool:
        return self.budgets.synced()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.leading.is_set():
                try:
                    self.run_once()
                except Exception:
                    log.exception("defragmentation cycle failed")
            self._stop.wait(self.config.interval_s)

    # ------------------------------------------------------------- one cycle
    def run_once(self) -> Attempt | None:
        """Plan for the most important pod that waited too long and carry the plan out (one
        target per cycle). None when no pod waited too long."""
        books = self.read()
        group = self._target(books)
        if group is None:
            return None
        keys = tuple(p.key for p in group)
        now = self.wall()
        for k in keys:
            self._tried[k] = now
        try:
            plan = self._plan(books, group)
        except LedgerError as e:  # the budget cannot be read: no move
            log.warning("defragmentation for %s not planned: %s", ", ".join(keys), e)
            self.metrics.no_plan.labels("record-unreadable").inc()
            return self._record(Attempt(keys, "infeasible", str(e)))
        if not plan.feasible or not plan.moves:
            result = "infeasible" if not plan.feasible else "fits-now"
            self.metrics.no_plan.labels(result).inc()
            return self._record(Attempt(keys, result, plan.reason))
        moved: list[str] = []
        try:
            self._carry_out(books, group, plan, moved)
        except _Abandon as a:
            log.info("defragmentation for %s abandoned: %s %s", ", ".join(keys), a.reason, a.detail)
            self.metrics.abandon(a.reason)
            self._release(keys, f"{a.reason}{': ' + a.detail if a.detail else ''}")
            return self._record(Attempt(keys, "abandoned", a.reason, tuple(moved)))
        self._clear_plan()
        self.metrics.completed(sum(p.gpu_demand_milli for p in group) / 1000)
        return self._record(Attempt(keys, "completed", "", tuple(moved)))

    def _record(self, a: Attempt) -> Attempt:
        self.attempts.append(a)
        return a

    def _target(self, books: Books) -> list[PodSpec] | None:
        cfg, now = self.config, self.wall()
        for group in pending_targets(books, mig=True):
            objs = [books.pod_objs[p.key] for p in group]
            if any((o.get("spec") or {}).get("schedulerName") != cfg.scheduler_name for o in objs):
                continue
            if any((o.get("spec") or {}).get("schedulingGates") for o in objs):
                continue
            if min(now - _created(o) for o in objs) < cfg.wait_s:
                continue
            if any(now - self._tried.get(p.key, -1e18) < cfg.wait_s for p in group):
                continue
            return group
        return None

    def _window_moves(self) -> dict[str, int]:
        """The moves of the window by pod, read from the Lease (LedgerError when it cannot be)."""
        self._moved = deque(self.ledger.moves(self.wall()))
        counts: dict[str, int] = {}
        for _, k in self._moved:
            counts[k] = counts.get(k, 0) + 1
        return counts

    def _plan(self, books: Books, group: Sequence[PodSpec], refused: Sequence[str] = ()) -> Plan:
        cfg = self.config
        moved = self._window_moves()
        for k in refused:  # blocked by a budget just now: stays put in this plan
            moved[k] = cfg.max_moves_per_pod
        left = max(0, cfg.max_moves_per_window - len(self._moved))  # _window_moves read them
        rules = Rules(
            budgets=self.budgets.budgets().budgets,
            max_moves=min(cfg.max_moves, left),
            max_moves_per_pod=cfg.max_moves_per_pod,
            moved=moved,
            recreating=cfg.recreating,
        )
        deadline = time.monotonic() + cfg.plan_timeout_s
        budget = WorkBudget(should_stop=lambda: time.monotonic() >= deadline)
        tiebreak = np.arange(len(books.state), dtype=np.int64)  # the scheduler's: nodes in name order
        t0 = time.perf_counter()
        if len(group) == 1 and group[0].mig:  # MIG slices move to free instances (core.defrag.mig)
            plan = room_for(books.profile, books.state, group[0], rules).plan
        else:
            plan = plan_for(books.profile, books.state, list(group), rules, budget, tiebreak=tiebreak)
        self.metrics.planning.labels(plan.method.value).observe(time.perf_counter() - t0)
        return plan

    # ------------------------------------------------------------ carrying out
    def _carry_out(self, books: Books, group: Sequence[PodSpec], plan: Plan, moved: list[str]) -> None:
        cfg = self.config
        specs = {p.key: p for p in group}
        keys = tuple(specs)
        for_whom = ", ".join(keys)
        self._plan_id = uuid.uuid4().hex[:12]
        self._reserve(books, plan)
        replans = cfg.replans
        refused: list[str] = []
        i = 0
        while i < len(plan.moves):
            if not self.leading.is_set() or self._stop.is_set():
                raise _Abandon("leadership-lost")
            books = self.read()
            if self._landed_or_gone(books, keys):
                return
            rest = replace(plan, moves=plan.moves[i:])
            with Statement(books.state) as st:
                why = apply_plan(st, books.profile, rest, specs)
            if why is not None:
                plan, replans = self._replan(books, group, refused, replans, why)
                i = 0
                if not plan.moves:
                    break
                continue
            mv = plan.moves[i]
            obj = self._still_recreated(books.pod_objs[mv.pod], mv.pod)
            meta = obj.get("metadata") or {}
            at = self.wall()
            try:
                self.ledger.add_move(at, mv.pod)  # before the eviction: a kill in between over-counts
            except LedgerError as e:
                raise _Abandon("record-failed", str(e)) from None
            out = self.evictor.evict(
                str(meta.get("namespace", "default")),
                str(meta.get("name", "")),
                str(meta.get("uid", "")),
                grace_period_s=cfg.grace_period_s,
            )
            self.metrics.evictions.labels(out.outcome.value).inc()
            if out.outcome is not Outcome.EVICTED:
                self._take_back(at, mv.pod)
            if out.outcome is Outcome.BLOCKED:
                refused.append(mv.pod)
                plan, replans = self._replan(books, group, refused, replans, out.message, "blocked-by-pdb")
                i = 0
                if not plan.moves:
                    break
                continue
            if out.outcome is Outcome.FAILED:
                raise _Abandon("eviction-failed", f"{mv.pod}: {out.message}")
            if out.outcome is Outcome.EVICTED:
                self.metrics.moves.inc()
                self._moved.append((at, mv.pod))
                moved.append(mv.pod)
                self.events.about(
                    _involved(obj),
                    "Normal",
                    "Defragmented",
                    f"Evicted to make room for {for_whom} on node {mv.from_node}; "
                    f"planned to run on node {mv.to_node}",
                )
                self._wait_gone(
                    str(meta.get("namespace", "default")),
                    str(meta.get("name", "")),
                    str(meta.get("uid", "")),
                    mv.pod,
                )
            i += 1
        self._wait_bound(keys)

    def _still_recreated(self, planned: Mapping[str, Any], key: str) -> dict[str, Any]:
        """The pod as the API has it now, when it is still the planned pod (same UID) and a controller
        that recreates it still owns it; else the plan is abandoned (``stale``, ``no-controller``)."""
        meta = planned.get("metadata") or {}
        ns, name = str(meta.get("namespace", "default")), str(meta.get("name", ""))
        fresh = self._read_pod(ns, name)
        if fresh is None or (fresh.get("metadata") or {}).get("uid") != meta.get("uid"):
            raise _Abandon("stale", f"{key} is gone or was replaced")
        owner = controller_of(fresh, strict=False)
        if owner is None or owner.qualified_kind not in self.config.recreating:
            what = f"its controller {owner} does not recreate it" if owner else "no controller owns it"
            raise _Abandon("no-controller", f"{key}: {what}: evicting it would lose it")
        return fresh

    def _take_back(self, at: float, key: str) -> None:
        try:
            self.ledger.drop_move(at, key)
        except LedgerError as e:  # counted once too often until the window passes: the safe side
            log.warning("the refused move of %s stays recorded: %s", key, e)

    def _clear_plan(self) -> None:
        if not self._plan_id:
            return
        try:
            self.ledger.clear_plan(self._plan_id)
        except LedgerError as e:  # it lapses at its expiry anyway
            log.warning("the record of plan %s stays until it lapses: %s", self._plan_id, e)
        self._plan_id = ""

    def _expiry(self, plan: Plan) -> float:
        """When a plan's rooms lapse: time for every pod to leave, then for the pod to bind."""
        cfg = self.config
        return self.wall() + cfg.leave_timeout_s * max(1, len(plan.moves)) + cfg.bind_timeout_s + 30.0

    def _replan(
        self, books: Books, group: Sequence[PodSpec], refused: Sequence[str], replans: int, why: str,
        reason: str = "stale",
    ) -> tuple[Plan, int]:  # fmt: skip
        if replans <= 0:
            raise _Abandon(reason, why)
        plan = self._plan(books, group, refused)
        if not plan.feasible:
            raise _Abandon(reason, f"{why}; no new plan: {plan.reason}")
        if plan.method is not Method.FITS_NOW:
            self._reserve(books, plan)
        return plan, replans - 1

    def _reserve(self, books: Books, plan: Plan) -> None:
        """Nominate each placement's node and name the room (the scheduler keeps it) and where the
        moved pods go (the scheduler steers their replacements there)."""
        expires = self._expiry(plan)
        rooms = _rooms(plan)
        keys = tuple(pl.pod for pl in rooms)
        try:
            self.ledger.set_plan(PlanRecord(self._plan_id, keys, self.config.identity, expires))
        except LedgerError as e:
            raise _Abandon("record-failed", str(e)) from None
        steer = []
        for m in plan.moves:
            a = books.state.allocations.get(m.pod)
            if a is not None and a.pod.labels:
                steer.append(Steer(a.pod.namespace, tuple(sorted(a.pod.labels.items())), m.to_node, m.to_mig))
        for pl in rooms:
            obj = books.pod_objs[pl.pod]
            meta = obj.get("metadata") or {}
            ns, name = str(meta.get("namespace", "default")), str(meta.get("name", ""))
            room = room_annotation(pl.node, pl.gpus, steer, plan=self._plan_id, expires=expires, mig=pl.mig)
            ann = {"metadata": {"annotations": {ANN_ROOM: room}}}
            self.core.patch_namespaced_pod(name, ns, ann, _preload_content=False)
            status = {"status": {"nominatedNodeName": pl.node}}
            self.core.patch_namespaced_pod_status(name, ns, status, _preload_content=False)
            self.events.about(
                _involved(obj),
                "Normal",
                "DefragPlanned",
                f"Making room on node {pl.node} ({room_text(pl.gpus, pl.mig)}): {len(plan.moves)} pod(s) "
                f"to move ({plan.method.value})",
            )

    def _release(self, keys: Sequence[str], why: str) -> None:
        self._clear_plan()
        for key in keys:
            ns, name = key.split("/", 1)
            try:
                self.core.patch_namespaced_pod(
                    name, ns, {"metadata": {"annotations": {ANN_ROOM: None}}}, _preload_content=False
                )
                self.core.patch_namespaced_pod_status(
                    name, ns, {"status": {"nominatedNodeName": None}}, _preload_content=False
                )
            except Exception as e:  # gone: nothing to release
                if getattr(e, "status", None) != 404:
                    log.warning("releasing the room of %s: %s", key, e)
                continue
            self.events.about(
                {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name},
                "Normal",
                "DefragAbandoned",
                f"Defragmentation stopped: {why}",
            )

    def _read_pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            resp: Any = self.core.read_namespaced_pod(name, ns, _preload_content=False)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise
        obj: dict[str, Any] = json.loads(resp.data)
        return obj

    def _landed_or_gone(self, books: Books, keys: Sequence[str]) -> bool:
        """True when every pod of ``keys`` is bound (the plan's purpose is met); raises _Abandon
        when one is gone (deleted, finished, being deleted)."""
        bound = 0
        for k in keys:
            obj = books.pod_objs.get(k)
            if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                raise _Abandon("pending-pod-gone", k)
            if k not in books.pending:
                if not (obj.get("spec") or {}).get("nodeName"):
                    raise _Abandon("pending-pod-gone", f"{k} finished")
                bound += 1
        return bound == len(keys)

    def _wait_gone(self, ns: str, name: str, uid: str, key: str) -> None:
        """Until the evicted pod (``uid``) has left: no pod of that name, or another (a StatefulSet
        recreates its pod under the same name once the old one is gone)."""
        deadline = time.monotonic() + self.config.leave_timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            now = self._read_pod(ns, name)
            if now is None or (now.get("metadata") or {}).get("uid") != uid:
                return
            self._stop.wait(self.config.poll_s)
        raise _Abandon("eviction-timeout", f"{key} did not leave in {self.config.leave_timeout_s:g} s")

    def _wait_bound(self, keys: Sequence[str]) -> None:
        deadline = time.monotonic() + self.config.bind_timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            bound = 0
            for k in keys:
                ns, name = k.split("/", 1)
                obj = self._read_pod(ns, name)
                if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                    raise _Abandon("pending-pod-gone", k)
                bound += bool((obj.get("spec") or {}).get("nodeName"))
            if bound == len(keys):
                return
            self._stop.wait(self.config.poll_s)
        raise _Abandon("not-placed", f"not bound {self.config.bind_timeout_s:g} s after the moves")
