"""Room kept for a pending pod that defragmentation is making room for.

The defragmentation controller (``gpusched defrag run``) nominates the node where the pending pod
is to land (``status.nominatedNodeName``) and names the GPUs there in the annotation
``gpusched.io/defrag-room`` (``{"node": "n1", "gpus": [0, 1]}``) before it evicts the first pod.
Until the pod is bound (or gone, or the annotation removed), the standalone scheduler keeps that
room from every pod of lower or equal priority (``Reservations.hold``): if the pod fits there now,
it is booked there for the cycle (as ``core.statement.holding`` does for a
preemptor); while it does not fit yet (the evictions are under way), the free part of each of its
GPUs there is booked, so that a recreated pod never takes back the room its eviction freed.
Pods of higher priority are not held back (kube-scheduler's nomination rule).

A room is honoured only while the defragmentation controller's own record backs it (issue 28 F4):
the annotation names the plan (``"plan": id``) and when the room lapses (``"expires"``, Unix
seconds), and the controller's Lease (``gpusched.io/defrag-plan``, ``PlanRecord``) names the same
plan, the pod among its pending pods, a time not yet passed, and (when the Lease has a holder) that
holder. A hand-written room, one left by a controller killed mid-plan or by a former leader, or
one past its time holds nothing; the scheduler names the rooms it holds in the message of a pod
they keep off a node (``Reservations.note``), and doctor names every room with its state.

The annotation may also say where the plan puts the pods it moves (``"steer": [{"namespace":
..., "labels": {...}, "node": ...}]``): a pod created while the room is held whose namespace and
labels are those of a moved pod (its owner recreated it from the same template) gets a preferred
node affinity for the plan's node (weight 100) for its cycle, so the scheduler places it there
when it fits, elsewhere when not.

MIG rooms (``"mig"``: the slices, ``[{"gpu": 0, "start": 4, "profile": "3g.40gb"}]``): a plan that moves
MIG slices (``core.defrag.mig``) names the slice the pending pod takes (or, when the scheduler is to
re-cut the freed slices, the freed slices) in the pod's room, and the slice each moved pod is to take in
its steer. Both are held as GPUs are: the room's slices from every pod of lower or equal priority (the
free ones, one placeholder per slice, until the pod fits there), each steer's slices from every pod but
the replacement the steer matches; that replacement is steered onto the node and, there, onto its
slices (the node's other free instances of its profiles are held for its cycle).
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.whatif import mig_resource
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.names import ANN_MOVES as ANN_MOVES
from gpusched.core.names import ANN_PLAN as ANN_PLAN
from gpusched.core.names import ANN_ROOM as ANN_ROOM
from gpusched.core.selectors import NODE_NAME_FIELD, NodeSelectorTerm, PreferredNodeTerm, SelectorRequirement
from gpusched.core.statement import Statement
from gpusched.k8s.convert import InvalidRequest
from gpusched.k8s.migconvert import slots_json
from gpusched.k8s.podevents import PodEvent
from gpusched.k8s.podevents import Room as Room
from gpusched.k8s.podevents import Steer as Steer
from gpusched.k8s.podevents import parse_room as parse_room

log = logging.getLogger(__name__)

ROOM_SUFFIX = "#room"
"""Names the placeholder bookings of held GPUs (``<pod key>#room<gpu>``)."""


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """The plan the defragmentation controller is carrying out, as its Lease records it: the plan
    ``id``, the pending ``pods`` it makes room for, the ``holder`` (the controller's identity) and
    when it lapses (``expires``, Unix seconds)."""

    id: str
    pods: tuple[str, ...]
    holder: str
    expires: float

    def annotation(self) -> str:
        data = {"id": self.id, "pods": list(self.pods), "holder": self.holder, "expires": self.expires}
        return json.dumps(data, separators=(",", ":"))


def parse_plan_record(raw: str, where: str) -> PlanRecord:
    """A ``PlanRecord`` from its annotation; InvalidRequest naming ``where`` when unreadable."""
    try:
        data = json.loads(raw)
        return PlanRecord(
            str(data["id"]), tuple(str(p) for p in data["pods"]), str(data.get("holder") or ""),
            float(data["expires"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidRequest(f"{where}: annotation {ANN_PLAN} is not valid: {raw!r}") from None


def room_annotation(
    node: str, gpus: tuple[int, ...], steer: Sequence[Steer] = (), *, plan: str = "", expires: float = 0.0,
    mig: tuple[MigSlot, ...] = (),
) -> str:  # fmt: skip
    data: dict[str, Any] = {"node": node, "gpus": list(gpus), "plan": plan, "expires": expires}
    if mig:
        data["mig"] = slots_json(mig)
    if steer:
        data["steer"] = [_steer_json(s) for s in steer]
    return json.dumps(data, separators=(",", ":"))


def _steer_json(s: Steer) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": s.namespace, "labels": dict(s.labels), "node": s.node}
    if s.mig:
        out["mig"] = slots_json(s.mig)
    return out


def unbacked(key: str, room: Room, record: PlanRecord | None, now: float) -> str:
    """Why the room of pod ``key`` holds nothing ("" when the controller's ``record`` backs it)."""
    if not room.plan:
        return "it names no plan (not written by the defragmentation controller)"
    if now >= room.expires:
        return f"it expired {now - room.expires:.0f} s ago"
    if record is None:
        return "the defragmentation controller's Lease records no plan"
    if record.id != room.plan or key not in record.pods:
        return f"the defragmentation controller's Lease records another plan ({record.id})"
    if now >= record.expires:
        return f"its plan {record.id} expired {now - record.expires:.0f} s ago"
    return ""


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LeaseRecord:
    """The defragmentation controller's current plan, read from its Lease ``namespace/name`` at
    most every ``refresh_s`` (a callable for ``Reservations``), or every ``recheck_s`` while a room
    names a plan the last read did not record (the controller records a plan just before its first
    eviction: the replacement must not find a stale read). A plan written by another than the
    Lease's holder, an unreadable Lease or annotation: no plan (no room is honoured)."""

    def __init__(
        self, coord: Any, namespace: str, name: str, refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic, recheck_s: float = 0.2,
    ) -> None:  # fmt: skip
        self.coord, self.namespace, self.name = coord, namespace, name
        self.refresh_s, self.clock, self.recheck_s = refresh_s, clock, recheck_s
        self._at = -1e18
        self._record: PlanRecord | None = None
        self._lock = threading.Lock()

    def __call__(self, wanted: Sequence[str] = ()) -> PlanRecord | None:
        with self._lock:
            age = self.clock() - self._at
            unknown = any(w and (self._record is None or self._record.id != w) for w in wanted)
            if age >= self.refresh_s or (unknown and age >= self.recheck_s):
                self._record = self._read()
                self._at = self.clock()
            return self._record

    def _read(self) -> PlanRecord | None:
        where = f"Lease {self.namespace}/{self.name}"
        try:
            resp = self.coord.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
            obj = json.loads(resp.data)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                log.warning("%s: cannot be read (defragmentation rooms are not held): %s", where, e)
            return None
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_PLAN)
        if not raw:
            return None
        try:
            record = parse_plan_record(raw, where)
        except InvalidRequest as e:
            log.warning("%s", e)
            return None
        holder = str((obj.get("spec") or {}).get("holderIdentity") or "")
        if holder and holder != record.holder:
            return None  # written by a former leader
        return record


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: PodSpec
    room: Room

    @property
    def node(self) -> str:
        return self.room.node

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.room.gpus

    @property
    def steer(self) -> tuple[Steer, ...]:
        return self.room.steer


class Reservations:
    """The rooms named now, fed by the scheduler's pod events (``on_pod_event``); those that the
    defragmentation controller's record (``backing``: ``LeaseRecord``) backs are held. Thread-safe."""

    def __init__(
        self,
        backing: Callable[[Sequence[str]], PlanRecord | None] = lambda wanted: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Reservation] = {}
        self.backing = backing
        self.wall = wall
        self._said: set[tuple[str, str]] = set()  # (pod key, plan) whose room was said to hold nothing

    def on_pod_event(self, ev: PodEvent) -> None:
        """A pending pod nominated into a room holds it; bound, deleted, being deleted or
        finished, it holds none. An unreadable room or pod is logged and holds none."""
        res: Reservation | None = None
        if ev.pending:
            try:
                if ev.room_error is not None:
                    raise ev.room_error
                if ev.room is not None:
                    res = Reservation(ev.spec(), ev.room)
            except InvalidRequest as e:
                log.warning("%s", e)
        with self._lock:
            if res is None:
                self._held.pop(ev.key, None)
            else:
                self._held[ev.key] = res

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def backed(self) -> dict[str, Reservation]:
        """The rooms honoured now (pod key -> its reservation); the others are logged once each."""
        with self._lock:
            named = dict(self._held)
        if not named:
            return {}
        record, now = self.backing(sorted({r.room.plan for r in named.values()})), self.wall()
        out = {}
        for k, r in named.items():
            why = unbacked(k, r.room, record, now)
            if not why:
                out[k] = r
            elif (k, r.room.plan) not in self._said:
                self._said.add((k, r.room.plan))
                log.warning("the defragmentation room of %s on %s holds nothing: %s", k, r.node, why)
        return out

    def _against(self, pod: PodSpec) -> list[tuple[str, Reservation]]:
        return [(k, r) for k, r in self.backed().items() if k != pod.key and r.pod.priority >= pod.priority]

    def _steering(self, pod: PodSpec) -> list[Reservation]:
        """The rooms whose steers' MIG slices ``pod`` must leave alone: those held against it and its own
        (a pending pod never takes the slice its plan keeps for a moved pod)."""
        return [r for k, r in self.backed().items() if k == pod.key or r.pod.priority >= pod.priority]

    @contextmanager
    def hold(self, snap: ClusterState, pod: PodSpec) -> Iterator[PodSpec]:
        """Within the block, ``snap`` holds the rooms that ``pod`` must leave alone; afterwards it
        is as it was. Yields the pod to schedule: ``pod``, or ``pod`` steered to where a plan put
        the pod it replaces."""
        rooms = [r for _, r in self._against(pod)] if len(self) else []
        steering = [r for r in self._steering(pod) if any(s.mig for s in r.steer)] if len(self) else []
        if not rooms and not steering:
            yield pod
            return
        with Statement(snap) as st:
            for r in rooms:
                _hold(st, r)
            mine = _steer_of(pod, steering)
            for r in steering:
                for s in r.steer:
                    if s.mig and s is not mine:
                        _hold_slices(st, r.pod, s.node, s.mig)
            if mine is not None and mine.mig:
                _pin(st, pod, mine)
            yield _steered(pod, rooms)

    def note(self, pod: PodSpec) -> str:
        """The rooms held against ``pod``, for its unschedulable message ("" when none)."""
        rooms = self._against(pod) if len(self) else []
        if not rooms:
            return ""
        shown = "; ".join(
            f"node {r.node} {room_text(r.gpus, r.room.mig)} for {k} "
            f"(plan {r.room.plan}, until {_utc(r.room.expires)})"
            for k, r in sorted(rooms)[:3]
        )
        more = f"; and {len(rooms) - 3} more" if len(rooms) > 3 else ""
        return f" Defragmentation holds: {shown}{more}."


def room_text(gpus: Sequence[int], mig: Sequence[MigSlot]) -> str:
    """A room's GPUs, or its MIG slices, in words."""
    if mig:
        return "MIG slices " + ", ".join(f"{x.profile} on GPU {x.gpu} at {x.start}" for x in mig)
    return f"GPUs {list(gpus)}"


def _steer_of(pod: PodSpec, rooms: Sequence[Reservation]) -> Steer | None:
    """The steer of ``rooms`` that ``pod`` matches (its namespace and exactly its labels: the moved
    pod's owner recreated it from the same template), or None."""
    if not pod.labels:
        return None
    labels = tuple(sorted(pod.labels.items()))
    for r in rooms:
        for s in r.steer:
            if s.namespace == pod.namespace and s.labels == labels:
                return s
    return None


def _steered(pod: PodSpec, rooms: Sequence[Reservation]) -> PodSpec:
    s = _steer_of(pod, rooms)
    if s is None:
        return pod
    term = NodeSelectorTerm(match_fields=(SelectorRequirement(NODE_NAME_FIELD, "In", (s.node,)),))
    prefer = (*pod.preferred_node_affinity, PreferredNodeTerm(100, term))
    return replace(pod, preferred_node_affinity=prefer)


def _hold_slices(st: Statement, owner: PodSpec, node: str, slots: Sequence[MigSlot]) -> None:
    """Book each free slice of ``slots`` on ``node`` in ``st`` under a placeholder named after ``owner``
    (a slice held, absent or gone is skipped: the books refuse it)."""
    snap = st.snap
    n = snap.index.get(node)
    if n is None or snap.nodes[n].mig is None:
        return
    for x in slots:
        hold = PodSpec(
            f"{owner.name}{ROOM_SUFFIX}{x.gpu}.{x.start}",
            mig=(x.profile,),
            extended={mig_resource(x.profile): 1},
            namespace=owner.namespace,
            priority=owner.priority,
            movable=False,
        )
        try:
            st.assume(hold, n, (), mig=(x,))
        except (AccountingError, ValueError):
            continue


def _pin(st: Statement, pod: PodSpec, s: Steer) -> None:
    """For ``pod``'s cycle, the free instances of its profiles on the steer's node other than the
    steer's slices are held: there, it takes the slices the plan chose for it."""
    snap = st.snap
    n = snap.index.get(s.node)
    nm = snap.nodes[n].mig if n is not None else None
    if n is None or nm is None:
        return
    profiles = set(pod.mig)
    others = [
        MigSlot(i, x.start, x.profile)
        for i, g in zip(nm.indices, nm.gpus, strict=True)
        for x in g.instances
        if x.profile in profiles and x not in snap.mig_books[n][i].instances
        and MigSlot(i, x.start, x.profile) not in s.mig
    ]  # fmt: skip
    _hold_slices(st, pod, s.node, others)


def _hold(st: Statement, r: Reservation) -> None:
    snap = st.snap
    n = snap.index.get(r.node)
    if n is None or r.pod.key in snap.allocations:
        return
    mig = r.room.mig
    own = mig if mig and sorted(x.profile for x in mig) == list(r.pod.mig) else None  # else: slices to re-cut
    try:
        st.assume(r.pod, n, r.gpus, mig=own)
        return  # it fits there now: keep its whole room
    except (AccountingError, ValueError):
        pass
    if mig:
        _hold_slices(st, r.pod, r.node, mig)
        return
    free = snap.node_gpu_free(n)
    want = GPU_MILLI if r.pod.is_whole else r.pod.gpu_milli
    for g in r.gpus:
        if not 0 <= g < len(free) or free[g] <= 0:
            continue
        milli = min(free[g], want or free[g])
        hold = PodSpec(
            f"{r.pod.name}{ROOM_SUFFIX}{g}",
            num_gpu=1,
            gpu_milli=milli,
            namespace=r.pod.namespace,
            priority=r.pod.priority,
            movable=False,
        )
        try:
            st.assume(hold, n, (g,))
        except (AccountingError, ValueError):
            continue
