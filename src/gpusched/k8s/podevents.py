"""Where a pod event is parsed: each informer event becomes one typed ``PodEvent``, read once and
handed to every subscriber (``PodFeed``), so none of them reads the API dict again.

A ``PodEvent`` says what the scheduler's subscribers ask of a pod: its key and UID, its phase and
node, whether it is bound, finished (``Succeeded``/``Failed``) or being deleted, its scheduler, its
scheduling gates, the gang group it names (``k8s/groupref.py``), and the two gpusched annotations
it may carry, read: the defragmentation room it is nominated into (``gpusched.io/defrag-room``,
``Room``) and its device assignment (``gpusched.io/assignment``). An annotation that cannot be
read is kept as its ``InvalidRequest`` (``room_error``, ``assignment_error``): each subscriber
reports it as before. The raw object stays on the event for the writers that need it (events,
status patches, the conditions a binding reads).

Its ``PodSpec`` is converted on first use and at most once (``spec()``), whatever the number of
subscribers that read it; a conversion that fails keeps its ``InvalidRequest`` and raises it to
each reader. A bound pod is read as it runs (``constraints="lenient"``: its resources are booked
whatever its constraints say), any other as it is to be placed (constraints enforced).

The subscribers, in the order the standalone scheduler feeds them: the books
(``k8s/state.LiveCluster``), the gangs' membership (``k8s/gangs.Gangs``), the defragmentation
rooms (``k8s/reservation.Reservations``) and the scheduler's pending queue
(``k8s/scheduler.StandaloneScheduler``, which hands the event on to its preemptors' rooms,
``k8s/preemption.Nominations``). The extender's feed holds the books, then the extender
(``extender/handlers.Extender``: UIDs for preempt, pending pods for bind).
``doctor/books.py`` parses its snapshot's pods here too.
"""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpusched.core.mig.books import MigSlot
from gpusched.core.model import PodSpec
from gpusched.core.names import ANN_ROOM
from gpusched.k8s.convert import InvalidRequest, parse_assignment, pod_from_k8s
from gpusched.k8s.groupref import GroupRef, group_ref_of
from gpusched.k8s.migconvert import slots_of

TERMINAL = ("Succeeded", "Failed")
"""The phases of a pod that has finished: it holds nothing any more."""


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


# ------------------------------------------------------------------------------------------ rooms
@dataclass(frozen=True, slots=True)
class Steer:
    """A pod of ``namespace`` with exactly ``labels`` is preferred onto ``node`` (a moved MIG pod's
    replacement: onto the MIG slices ``mig`` there, which are held for it)."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    node: str
    mig: tuple[MigSlot, ...] = ()


@dataclass(frozen=True, slots=True)
class Room:
    """A pod's room annotation (``gpusched.io/defrag-room``), read (``k8s/reservation.py``)."""

    node: str
    gpus: tuple[int, ...]
    steer: tuple[Steer, ...] = ()
    plan: str = ""
    expires: float = 0.0
    mig: tuple[MigSlot, ...] = ()
    """A MIG pod's room: the slices held for it on ``node`` (those a move frees; when the plan has the
    scheduler re-cut them, the freed slices it re-cuts)."""


def _steer(s: Mapping[str, Any]) -> Steer:
    labels = tuple(sorted((str(k), str(v)) for k, v in s["labels"].items()))
    return Steer(str(s["namespace"]), labels, str(s["node"]), slots_of(s.get("mig") or ()))


def parse_room(obj: Mapping[str, Any]) -> Room | None:
    """The room a pod's annotation names when its ``status.nominatedNodeName`` is that node; None
    when either is absent. Raises InvalidRequest for an annotation that cannot be read."""
    meta = obj.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANN_ROOM)
    nominated = (obj.get("status") or {}).get("nominatedNodeName")
    if raw is None or not nominated:
        return None
    try:
        data = json.loads(raw)
        room = Room(
            str(data["node"]),
            tuple(int(g) for g in data["gpus"]),
            tuple(_steer(s) for s in data.get("steer") or ()),
            str(data.get("plan") or ""),
            float(data.get("expires") or 0.0),
            slots_of(data.get("mig") or ()),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidRequest(f"pod {pod_key(obj)}: annotation {ANN_ROOM} is not valid: {raw!r}") from None
    return room if room.node == nominated else None


# ------------------------------------------------------------------------------------------ events
class Kind(enum.Enum):
    """What the informer said. It does not tell an added pod from a modified one (a relist replays
    every pod as an upsert), so neither does the event."""

    UPSERT = "upsert"
    """The pod exists, as ``obj`` shows it (added, modified, or listed again)."""
    DELETE = "delete"
    """The pod is deleted; ``obj`` is its last state."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A pod's ``gpusched.io/assignment``, read: the node and GPU indices it was decided onto."""

    node: str
    gpus: tuple[int, ...]


class Conversion:
    """A pod's ``PodSpec``, converted on first use and at most once (thread-safe); a conversion
    that fails keeps its ``InvalidRequest`` and raises it to each reader."""

    __slots__ = ("_constraints", "_lock", "_obj", "_result")

    def __init__(self, obj: Mapping[str, Any], constraints: str) -> None:
        self._obj = obj
        self._constraints = constraints
        self._result: PodSpec | InvalidRequest | None = None
        self._lock = threading.Lock()

    def result(self) -> PodSpec | InvalidRequest:
        """The ``PodSpec``, or the error its conversion raised (converted now if not yet)."""
        r = self._result
        if r is None:
            with self._lock:
                r = self._result
                if r is None:
                    try:
                        r = pod_from_k8s(self._obj, constraints=self._constraints)
                    except InvalidRequest as e:
                        r = e
                    self._result = r
        return r

    def get(self) -> PodSpec:
        """The ``PodSpec``; raises the conversion's ``InvalidRequest``."""
        r = self.result()
        if isinstance(r, InvalidRequest):
            raise r.with_traceback(None)
        return r


@dataclass(frozen=True, slots=True)
class PodEvent:
    """One informer event of one pod, read once (``parse_pod_event``)."""

    kind: Kind
    deleted: bool
    """``kind`` is ``DELETE``."""
    key: str
    """``namespace/name``."""
    uid: str
    """"" when the object has none (a test's)."""
    phase: str
    node: str
    """``spec.nodeName`` ("" when not bound)."""
    bound: bool
    """It has a node (``spec.nodeName``)."""
    finished: bool
    """Its phase is ``Succeeded`` or ``Failed`` (``TERMINAL``): it holds nothing any more."""
    deleting: bool
    """``metadata.deletionTimestamp`` is set: the pod is terminating (a bound one still runs)."""
    live: bool
    """Neither deleted, being deleted, nor finished: it still counts as a pod of its group."""
    pending: bool
    """Waiting for a node: live and not bound."""
    holds_resources: bool
    """Bound, not finished, not deleted (being deleted, it runs until its grace period ends and
    keeps what it holds until the API deletes it, as in kube-scheduler's cache)."""
    scheduler_name: str
    gated: bool
    """``spec.schedulingGates`` is not empty (e.g. Kueue holds it)."""
    priority: int
    created: str
    """``metadata.creationTimestamp`` as written (RFC 3339 in UTC; "" when absent)."""
    nominated_node: str
    """``status.nominatedNodeName`` ("" when none)."""
    group: GroupRef | None
    """The gang group it names, if any."""
    room: Room | None
    """The defragmentation room it is nominated into (None: none, or ``room_error``)."""
    room_error: InvalidRequest | None
    assignment: Assignment | None
    """Its device assignment (None: none, or ``assignment_error``)."""
    assignment_error: InvalidRequest | None
    obj: Mapping[str, Any] = field(repr=False, compare=False)
    """The API object, for the writers that need it (events, status) and the checks that read
    more of it (DRA claims, a GPU share's slot)."""
    conversion: Conversion = field(repr=False, compare=False)
    """Its ``PodSpec``, converted on first use (``spec``)."""

    def spec(self) -> PodSpec:
        """The pod as the core sees it, converted once; raises its ``InvalidRequest``."""
        return self.conversion.get()


def parse_pod_event(obj: Mapping[str, Any], kind: Kind = Kind.UPSERT) -> PodEvent:
    """The one parse of a pod's API object (a dict: the informer's JSON)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    node = str(spec.get("nodeName") or "")
    phase = str(status.get("phase") or "")
    deleted, deleting, finished = kind is Kind.DELETE, bool(meta.get("deletionTimestamp")), phase in TERMINAL
    live = not (deleted or deleting or finished)
    room: Room | None = None
    room_error = assignment_error = None
    assignment: Assignment | None = None
    try:
        room = parse_room(obj)
    except InvalidRequest as e:
        room_error = e
    try:
        if (a := parse_assignment(obj)) is not None:
            assignment = Assignment(*a)
    except InvalidRequest as e:
        assignment_error = e
    return PodEvent(  # positionally, in the order of the fields (keywords cost a third of the parse)
        kind,
        deleted,
        pod_key(obj),
        str(meta.get("uid") or ""),
        phase,
        node,
        bool(node),
        finished,
        deleting,
        live,
        live and not node,
        bool(node) and not finished and not deleted,
        str(spec.get("schedulerName") or ""),
        bool(spec.get("schedulingGates")),
        int(spec.get("priority") or 0),
        str(meta.get("creationTimestamp") or ""),
        str(status.get("nominatedNodeName") or ""),
        group_ref_of(obj),
        room,
        room_error,
        assignment,
        assignment_error,
        obj,
        Conversion(obj, "lenient" if node else "enforce"),
    )


# ---------------------------------------------------------------------------------------- fan-out
class PodSubscriber(Protocol):
    """A reader of pod events (the books, the gangs, the rooms, the queue)."""

    def on_pod_event(self, ev: PodEvent) -> None: ...


class PodFeed:
    """The fan-out: each pod event from the informer (``upsert``/``delete``, the ``Handlers`` of
    its reflector) is parsed once and handed to each subscriber, in order."""

    def __init__(self, subscribers: Sequence[PodSubscriber]) -> None:
        self.subscribers = tuple(subscribers)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        self.publish(parse_pod_event(obj))

    def delete(self, obj: Mapping[str, Any]) -> None:
        self.publish(parse_pod_event(obj, Kind.DELETE))

    def publish(self, ev: PodEvent) -> None:
        for s in self.subscribers:
            s.on_pod_event(ev)
