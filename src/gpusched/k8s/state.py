"""The scheduler cache for the Kubernetes front ends: nodes and bound pods → ``ClusterState``.

Fed by the informer (node events as API dicts; pod events parsed once, as ``PodEvent``s) and by
the front end's own decisions (``assume`` before binding, ``forget`` when a binding fails). The
books are rebuilt from what the API says: a bound pod's GPUs come from its
``gpusched.io/assignment`` annotation, so a restarted scheduler double-books nothing; pods bound
by someone else that ask for GPUs take the tightest free GPUs in the books. Two bound pods whose
assignments overlap (never written by gpusched: a forged annotation, or a pod bound around it)
are booked in the order they were bound (the ``PodScheduled`` condition's time, else creation):
the earlier one keeps its GPUs and the newcomer is named, in the log and in a Warning event on
it (``GPUAssignmentConflict``).

With a ``Reporter`` (the front end's event recorder, ``report_to``): a Node that cannot be read
gets one Warning event (``NodeUnreadable``) per distinct reason, and one when it reads again;
a bound GPU share without its ``gpusched.io/gpu-share`` slot on a node whose device plugin
offers slots gets a Warning event (``GPUShareWithoutSlot``): it runs with no GPU isolation.

One lock guards the state; front ends hold it only for the in-memory decision (about a
millisecond), never across API calls: ``live_books`` hands out the books themselves under it.
Pod events come parsed (``k8s/podevents.py``): ``on_pod_event`` is this class as a subscriber.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

from gpusched.core.caches import LRUCache
from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.mig.books import MigSlot
from gpusched.core.model import Allocation, NodeSpec, PodSpec, Taint
from gpusched.core.names import TAINT_NODE_UNREADABLE as TAINT_NODE_UNREADABLE
from gpusched.k8s.convert import (
    ANN_ASSIGNMENT,
    RES_GPU,
    RES_MEMORY,
    RES_MILLI,
    RES_SHARE,
    InvalidRequest,
    gpu_uuids,
    node_from_k8s,
)
from gpusched.k8s.migconvert import assignment_mig
from gpusched.k8s.podevents import TERMINAL as TERMINAL
from gpusched.k8s.podevents import PodEvent, PodFeed, parse_pod_event
from gpusched.k8s.podevents import pod_key as pod_key

log = logging.getLogger(__name__)

UNREADABLE_TAINT = Taint(TAINT_NODE_UNREADABLE, "true", "NoSchedule")
"""Put (in the books only) on a known node whose Node object stopped converting."""

GONE_KEPT = 10_000
"""UIDs of pods the API said are gone, kept so that their late watch events book nothing
(the oldest are dropped first)."""


class Reporter(Protocol):
    """Where the books' warnings go as events (``gpusched.k8s.events.EventRecorder``)."""

    def about(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> bool: ...

    def forget(self, uid: str, reasons: tuple[str, ...] = ...) -> None: ...


NODE_UNREADABLE = "NodeUnreadable"
NODE_READABLE = "NodeReadable"
ASSIGNMENT_CONFLICT = "GPUAssignmentConflict"
SHARE_WITHOUT_SLOT = "GPUShareWithoutSlot"


def bound_at(obj: Mapping[str, Any]) -> tuple[str, str]:
    """When the pod was bound, as the API says: its ``PodScheduled=True`` condition's
    ``lastTransitionTime`` (the binding, or the kubelet's first status of a pod created with
    ``spec.nodeName``), else its creation time; then the creation time (RFC 3339 in UTC, so they
    sort as text). "" sorts first (an object without times: a test's)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    created = str(meta.get("creationTimestamp") or "")
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True" and c.get("lastTransitionTime"):
            return str(c["lastTransitionTime"]), created
    return created, created


def share_without_slot(obj: Mapping[str, Any]) -> bool:
    """Whether a container asks for a GPU share (``gpusched.io/gpu-milli`` or ``gpu-memory``, no
    ``nvidia.com/gpu``) without the ``gpusched.io/gpu-share`` slot that makes the kubelet call the
    device plugin (what the webhook adds)."""
    spec = obj.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = c.get("resources") or {}
        names = {*(res.get("limits") or {}), *(res.get("requests") or {})}
        share = names & {RES_MILLI, RES_MEMORY} and RES_GPU not in names
        if share and RES_SHARE not in (res.get("limits") or {}):
            return True
    return False


def _involved(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    out = {"apiVersion": "v1", "kind": kind, "name": meta.get("name"), "uid": meta.get("uid")}
    if kind == "Pod":
        out["namespace"] = meta.get("namespace", "default")
    return out


class Verdict(enum.Enum):
    """What the API says of a pod whose binding outcome was unknown (``LiveCluster.settle``)."""

    BOUND = "bound"
    """The API shows the pod bound; the books hold it where the API says."""
    GONE = "gone"
    """The pod no longer exists (or was recreated under another UID); its booking is released."""
    PENDING = "pending"
    """The API shows the pod unbound; the booking is still held."""


class ClaimedGpus(Protocol):
    """Which GPUs DRA claims hold, per node, given each node's GPU UUIDs (``k8s/dra/mixed.py``)."""

    def claimed(
        self, uuids: Mapping[str, Mapping[str, int]], gpu_counts: Mapping[str, int]
    ) -> dict[str, frozenset[int]]: ...


class LiveCluster:
    def __init__(
        self,
        on_invalid: Callable[[Mapping[str, Any], str], None] | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self._nodes: dict[str, NodeSpec] = {}
        self._bound: dict[str, tuple[PodSpec, str, tuple[int, ...]]] = {}  # key -> (pod, node, gpus from API)
        self._bound_at: dict[str, tuple[str, str]] = {}  # key -> bound_at() of the bound pod
        self._reporter = reporter
        self.unreadable: dict[str, tuple[Mapping[str, Any], str]] = {}
        """Nodes whose Node object does not convert now: name -> (the object, why)."""
        self._share_nodes: set[str] = set()  # nodes whose device plugin offers gpusched.io/gpu-share
        self._assumed: dict[str, tuple[PodSpec, str, tuple[int, ...]]] = {}  # decided here, not yet bound
        self._mig: dict[str, tuple[MigSlot, ...]] = {}  # MIG slices of bound pods and decisions (issue 31)
        self._state: ClusterState | None = None
        self._gone: LRUCache[str, bool] = LRUCache(GONE_KEPT)
        """UIDs the API answered for as gone (a read-back found no pod or another UID, a binding
        got 404) before the informer delivered their deletion: their earlier events, still on
        the way, are history and must not book them again (``gone``)."""
        self._on_invalid = on_invalid
        self.conflicts: list[str] = []
        """Pods whose recorded assignment did not fit the books on rebuild (never expected)."""
        self._gpu_uuids: dict[str, dict[str, int]] = {}  # node -> GPU UUID -> index (the agent's)
        self._claimed: dict[str, frozenset[int]] = {}  # node -> GPUs DRA claims hold (``set_claimed_gpus``)
        self.claimed_source: ClaimedGpus | None = None
        """Asked for a node's claimed GPUs when its GPU UUIDs change (set by ``MixedNodes``)."""
        self.node_version = 0
        """Bumped whenever a node is added, changed or removed (a relabelled node keeps the
        snapshot: compare this, not snapshots, to notice that nodes changed)."""

    def report_to(self, reporter: Reporter | None) -> None:
        """Send the books' warnings as events to ``reporter`` from now on (None: only log them), and
        tell it of the nodes unreadable now (the leader reports; a replica taking over repeats
        what its predecessor may have sent, once)."""
        with self.lock:
            self._reporter = reporter
            unreadable = list(self.unreadable.values())
        if reporter is not None:
            for obj, why in unreadable:
                reporter.about(_involved(obj, "Node"), "Warning", NODE_UNREADABLE, why)

    # ------------------------------------------------------------ nodes
    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        try:
            spec = node_from_k8s(obj)
        except InvalidRequest as e:
            self._withhold_node(obj, e)
            return
        name = spec.name
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        uuids = gpu_uuids(obj)
        source = self.claimed_source
        fresh = None
        if source is not None and spec.gpu_count:
            with self.lock:
                known = self._nodes.get(name)
                changed = self._gpu_uuids.get(name, {}) != uuids or known is None
                changed = changed or (known is not None and known.gpu_count != spec.gpu_count)
            if changed:  # outside the lock: the DRA books have their own
                got = source.claimed({name: uuids} if uuids else {}, {name: spec.gpu_count})
                fresh = got.get(name, frozenset())
        with self.lock:
            (self._gpu_uuids.__setitem__(name, uuids) if uuids else self._gpu_uuids.pop(name, None))
            if fresh is not None:
                (self._claimed.__setitem__(name, fresh) if fresh else self._claimed.pop(name, None))
            claimed = frozenset(g for g in self._claimed.get(name, ()) if g < spec.gpu_count)
            if claimed:
                spec = replace(spec, claimed_gpus=claimed)
            (self._share_nodes.add if RES_SHARE in alloc else self._share_nodes.discard)(name)
            was = self.unreadable.pop(name, None)
            reporter = self._reporter
        if was is not None:
            log.info("node %s reads again", name)
            if reporter is not None:
                reporter.forget(str((obj.get("metadata") or {}).get("uid") or ""), (NODE_UNREADABLE,))
                reporter.about(
                    _involved(obj, "Node"),
                    "Normal",
                    NODE_READABLE,
                    f"node {name} reads again: it takes new pods",
                )
        with self.lock:
            old = self._nodes.get(spec.name)
            if old == spec:
                return
            self._nodes[spec.name] = spec
            self.node_version += 1
            st = self._state
            i = st.index.get(spec.name) if st is not None and old is not None else None
            # labels or taints only (a taint added or lifted): in place, the bookings kept;
            # a new node or another capacity: rebuilt on the next snapshot
            if st is None or i is None or not st.relabel_node(i, spec):
                self._state = None

    def _withhold_node(self, obj: Mapping[str, Any], error: InvalidRequest) -> None:
        """A node that cannot be read (e.g. a malformed health annotation) takes no new pod: never seen
        before, it is ignored; known, it keeps its last readable spec (so the pods on it stay booked)
        with every GPU withheld and a NoSchedule taint, until it reads again. Its last spec may offer a
        GPU that has failed since."""
        name = (obj.get("metadata") or {}).get("name", "")
        with self.lock:
            old = self._nodes.get(name)
            why = (
                f"node {name} is ignored (gpusched places no pod on it) until it reads: {error}"
                if old is None
                else f"node {name} is withheld from new pods (its GPUs and a NoSchedule taint in "
                f"gpusched's books) until it reads again: {error}"
            )
            news = self.unreadable.get(name, (None, ""))[1] != why
            self.unreadable[name] = (obj, why)
            reporter = self._reporter
            if news:  # once per change, not on every update of the Node (its heartbeats)
                log.warning("%s", why)
                if reporter is not None:
                    reporter.about(_involved(obj, "Node"), "Warning", NODE_UNREADABLE, why)
            if old is None:
                return
            withheld = replace(
                old,
                unhealthy_gpus=frozenset(range(old.gpu_count)),
                taints=(*(t for t in old.taints if t != UNREADABLE_TAINT), UNREADABLE_TAINT),
            )
            if withheld != old:
                self._nodes[name] = withheld
                self.node_version += 1
                self._state = None

    def gpu_counts(self) -> dict[str, int]:
        """Per node that serves GPUs (``nvidia.com/gpu``): how many."""
        with self.lock:
            return {n: s.gpu_count for n, s in self._nodes.items() if s.gpu_count}

    def gpu_uuids(self) -> dict[str, dict[str, int]]:
        """Per node with the agent's topology annotation: GPU UUID -> index."""
        with self.lock:
            return {n: dict(u) for n, u in self._gpu_uuids.items()}

    def set_claimed_gpus(self, claimed: Mapping[str, frozenset[int]]) -> list[str]:
        """The GPUs DRA claims hold, per node (every node not named holds none): they take no new
        pod (``NodeSpec.claimed_gpus``). Returns the nodes whose set changed; the books are rebuilt
        on the next snapshot when any did."""
        changed = []
        with self.lock:
            for name in set(self._claimed) | set(claimed):
                gpus = frozenset(claimed.get(name, ()))
                if self._claimed.get(name, frozenset()) == gpus:
                    continue
                changed.append(name)
                (self._claimed.__setitem__(name, gpus) if gpus else self._claimed.pop(name, None))
                spec = self._nodes.get(name)
                if spec is not None:
                    self._nodes[name] = replace(
                        spec, claimed_gpus=frozenset(g for g in gpus if g < spec.gpu_count)
                    )
            if changed:
                self.node_version += 1
                self._state = None
        return sorted(changed)

    def delete_node(self, name: str) -> None:
        with self.lock:
            self._gpu_uuids.pop(name, None)
            self.unreadable.pop(name, None)
            self._share_nodes.discard(name)
            if self._nodes.pop(name, None) is not None:
                self.node_version += 1
                self._state = None

    # ------------------------------------------------------------- pods
    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        """A pod as the API shows it now (a read-back, a test): parsed, then ``on_pod_event``."""
        self.on_pod_event(parse_pod_event(obj))

    def on_pod_event(self, ev: PodEvent) -> None:
        """A pod event (``k8s/podevents.py``): a bound pod is booked where the API says, a
        deleted or finished one released; a pending one holds nothing but a decision of ours."""
        if ev.deleted:
            self.delete_pod(ev.key, ev.uid)
            return
        key = ev.key
        if ev.pending:
            return  # holds nothing but a decision of ours (kept until bound or forgotten)
        if not ev.holds_resources:
            self.delete_pod(key)
            return
        # A bound pod being deleted (deletionTimestamp set) still runs until its grace period
        # ends and keeps its GPUs until the API deletes it: it stays booked, as in
        # kube-scheduler's cache. Otherwise a preemptor could land on a GPU still in use.
        node, uid = ev.node, ev.uid
        with self.lock:
            if key in self._bound and self._bound[key][1] == node:
                return  # already booked (a status update): skip the conversion
            if uid and uid in self._gone:
                return  # an event from before the API said the pod is gone
            if self._confirm(key, ev):
                self._bound_at[key] = bound_at(ev.obj)
                return  # our own decision, bound as decided: the books hold it already
        try:
            spec = ev.spec()  # lenient: a running pod is booked whatever its constraints say
            if ev.assignment_error is not None:
                raise ev.assignment_error
            assigned_here = ev.assignment is not None and ev.assignment.node == node
            mig = assignment_mig(ev.obj) if assigned_here else None  # its MIG slices, where recorded
        except InvalidRequest as e:
            if self._on_invalid:
                self._on_invalid(ev.obj, str(e))
            return
        a = ev.assignment
        gpus = a.gpus if a is not None and a.node == node else ()
        with self.lock:
            if (key in self._bound and self._bound[key][1] == node) or (uid and uid in self._gone):
                return  # booked, or found gone, while it was converted
            self._bound[key] = (spec, node, gpus)
            self._bound_at[key] = bound_at(ev.obj)
            if mig is not None:
                self._mig[key] = mig
            if node in self._share_nodes and share_without_slot(ev.obj):
                self._warn_share_without_slot(ev.obj, node, gpus)
            assumed = self._assumed.pop(key, None)
            st = self._state
            if st is None:
                return
            if assumed is not None and assumed[1] == node and (not gpus or gpus == assumed[2]):
                return  # our own decision, already in the books
            if assumed is not None:
                st.forget(key)
            self._book(st, spec, node, gpus)

    def _warn_share_without_slot(self, obj: Mapping[str, Any], node: str, gpus: tuple[int, ...]) -> None:
        where = f"GPU {gpus[0]} of node {node}" if gpus else f"node {node}"
        msg = (
            f"pod {pod_key(obj)} asks for a GPU share without the {RES_SHARE}: 1 slot that gpusched's "
            f"webhook adds (its namespace is not sent to the webhook, or the pod was created while it was "
            f"not installed): it is booked on {where}, but the kubelet never asks the device plugin for "
            "it, so its containers run with no GPU isolation (no NVIDIA_VISIBLE_DEVICES or limits; under "
            "the NVIDIA runtime's default they see every GPU). Delete it and create it again where the "
            "webhook sees it, or add the slot to each share container's limits"
        )
        log.warning("%s", msg)
        if self._reporter is not None:
            self._reporter.about(_involved(obj, "Pod"), "Warning", SHARE_WITHOUT_SLOT, msg)

    def _confirm(self, key: str, ev: PodEvent) -> bool:
        """When the bound pod of ``ev`` is a decision of ours (same UID) bound where it was decided,
        with the GPUs decided (or no assignment annotation): record it as bound with the spec the
        decision was made with, without converting the pod again (the books already hold that
        spec; a rebuild then books the same). False (nothing changed) otherwise. Holds the lock."""
        assumed = self._assumed.get(key)
        if assumed is None or assumed[1] != ev.node or not ev.uid or assumed[0].uid != ev.uid:
            return False
        if ev.assignment_error is not None:
            return False  # the conversion path reports it
        a = ev.assignment
        gpus = a.gpus if a is not None and a.node == ev.node else ()
        if gpus and gpus != assumed[2]:
            return False
        self._bound[key] = (assumed[0], ev.node, gpus)
        del self._assumed[key]
        return True

    def delete_pod(self, key: str, uid: str = "") -> None:
        """The pod ``key`` is deleted (``uid``: the deleted pod's, when known: its last event).
        A booking of another pod under the same name (a StatefulSet's pod created again, and
        booked here before the old one's deletion came through the informer) is kept."""
        with self.lock:
            if uid:
                self._gone.pop(uid)  # nothing of it comes after its deletion
                if self._holder_uid(key) not in ("", uid):
                    return
            held = self._bound.pop(key, None) is not None
            self._bound_at.pop(key, None)
            held |= self._assumed.pop(key, None) is not None
            self._mig.pop(key, None)
            if held and self._state is not None and key in self._state.allocations:
                self._state.forget(key)

    def _holder_uid(self, key: str) -> str:
        """The UID of the pod the books hold under ``key`` ("" when none or unknown). Holds the lock."""
        held = self._bound.get(key) or self._assumed.get(key)
        return held[0].uid if held is not None else ""

    def reconcile_node(self, node: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
        """Make the bound pods the books hold on ``node`` agree with ``items``, the pods the API
        has on it now (a consistent read): a pod held there as bound that the API no longer
        has, or that has finished, is released now, before its event comes through the informer;
        its earlier events still on their way book nothing (as after ``gone``). Decisions of
        ours not yet seen bound are not touched. Returns the released keys, sorted.

        For the extender, whose informer can lag behind kube-scheduler's: kube-scheduler retries
        a preemptor as soon as it sees the victims deleted, and a filter answered from books that
        still hold them sends the pod back to wait for an event that has already passed."""
        holding: dict[str, str] = {}
        for obj in items:
            ev = parse_pod_event(obj)
            if ev.holds_resources and ev.node == node:
                holding[ev.key] = ev.uid
        released = []
        with self.lock:
            for key, (spec, at, _) in list(self._bound.items()):
                if at != node or (key in holding and (not spec.uid or holding[key] in ("", spec.uid))):
                    continue
                if spec.uid:
                    self._gone.put(spec.uid, True)
                self.delete_pod(key)
                released.append(key)
        return sorted(released)

    def sync_nodes(self, items: list[Mapping[str, Any]]) -> None:
        """After a (re)list: forget nodes the API no longer has."""
        names = {(o.get("metadata") or {}).get("name") for o in items}
        with self.lock:
            for gone in [n for n in {*self._nodes, *self.unreadable} if n not in names]:
                self.delete_node(gone)

    def sync_pods(self, items: list[Mapping[str, Any]]) -> None:
        """After a (re)list: release pods the API no longer has."""
        keys = {pod_key(o) for o in items}
        with self.lock:
            for gone in [k for k in self._bound if k not in keys]:
                self.delete_pod(gone)

    # -------------------------------------------------------- decisions
    @contextmanager
    def live_books(self) -> Iterator[ClusterState]:
        """The live books themselves (no copy), with the lock held for the block: use them only
        inside it. What is booked inside (``assume``, a ``Statement`` committed) stays booked; a
        decision is made here in place (a copy of the books would cost a decision its speed)."""
        with self.lock:
            yield self._current()

    def assume(self, pod: PodSpec, node: int, gpus: tuple[int, ...]) -> Allocation:
        """Book a decision (unless ``schedule_one`` already did) until the API shows it bound."""
        with self.lock:
            st = self._current()
            a = st.allocations.get(pod.key) or st.assume(pod, node, gpus)
            self._assumed[pod.key] = (pod, st.names[a.node], a.gpus)
            if a.mig:
                self._mig[pod.key] = a.mig
            return a

    def mig_of(self, key: str) -> tuple[MigSlot, ...]:
        """The MIG slices booked for pod ``key`` (the binder writes them into its assignment)."""
        with self.lock:
            a = self._current().allocations.get(key)
            return a.mig if a is not None else self._mig.get(key, ())

    def gone(self, key: str, uid: str) -> None:
        """The API says pod ``key`` of UID ``uid`` no longer exists (a read-back found none or
        another UID, a binding got 404): forget its decision and ignore its earlier events still
        on their way through the informer. A binding committed before the pod was deleted comes
        as a bound event after the read-back already said gone: booked then, it would hold GPUs
        that may have been given to another pod since (until the deletion's event arrives)."""
        with self.lock:
            if uid:
                self._gone.put(uid, True)
                if self._holder_uid(key) not in ("", uid):
                    return  # the books hold a successor under the same name (decided since): kept
            self.forget(key)  # booked as bound by an earlier event: kept until its deletion's event

    def forget(self, key: str) -> None:
        """Undo an assumed decision whose binding failed."""
        with self.lock:
            st = self._state
            was_assumed = self._assumed.pop(key, None) is not None
            if was_assumed and key not in self._bound:
                self._mig.pop(key, None)
            if was_assumed and st is not None and key not in self._bound and key in st.allocations:
                st.forget(key)

    def settle(self, key: str, uid: str, obj: Mapping[str, Any] | None) -> Verdict:
        """Make the books agree with ``obj``, the pod ``key`` (UID ``uid``) as just read from
        the API (None: it does not exist), after a binding whose outcome was unknown. Bound:
        booked where the API says (as the informer would); gone or recreated: the decision's
        booking is released; still pending: the booking is kept."""
        ev = parse_pod_event(obj) if obj is not None else None
        if ev is None or (uid and ev.uid and ev.uid != uid):
            self.gone(key, uid)
            return Verdict.GONE
        if ev.bound:
            self.on_pod_event(ev)
            return Verdict.BOUND
        if ev.deleting or ev.finished:
            self.forget(key)
            return Verdict.GONE
        return Verdict.PENDING

    def assumed(self) -> list[str]:
        """Keys of the decisions booked here and not yet seen bound by the informer."""
        with self.lock:
            return sorted(self._assumed)

    def bound_node(self, key: str) -> str:
        """The node the API shows ``key`` bound to ("" if not seen bound)."""
        with self.lock:
            held = self._bound.get(key)
            return held[1] if held is not None else ""

    def is_bound_or_assumed(self, key: str) -> bool:
        with self.lock:
            return key in self._bound or key in self._assumed

    def rebuild(self) -> None:
        """Drop the books; the next snapshot rebuilds them from the API objects seen
        (bound pods and their assignment annotations) and the decisions still assumed."""
        with self.lock:
            self._state = None

    def node_names(self) -> list[str]:
        with self.lock:
            return sorted(self._nodes)

    # ---------------------------------------------------------- rebuild
    def _current(self) -> ClusterState:
        if self._state is None:
            self._state = self._rebuild()
        return self._state

    def _rebuild(self) -> ClusterState:
        st = ClusterState(sorted(self._nodes.values(), key=lambda n: n.name))
        self.conflicts = []

        # exact GPUs first: bound pods with a recorded assignment, then our own decisions still
        # being bound; bound pods without an assignment (bound by someone else) take what is left
        # (booked before the decisions, they could take a decision's GPU and drop it). Each in
        # the order they were bound: of two whose assignments overlap, the earlier keeps its GPUs
        # and the newcomer is the one named (in key order, a forged assignment could name the
        # pod it took the GPU from).
        def order(kv: tuple[str, Any]) -> tuple[tuple[str, str], str]:
            return self._bound_at.get(kv[0], ("", "")), kv[0]

        recorded = sorted((kv for kv in self._bound.items() if kv[1][2]), key=order)
        for _key, (spec, node, gpus) in recorded:
            self._book(st, spec, node, gpus)
        for key, (spec, node, gpus) in list(self._assumed.items()):
            if key in st.allocations or key in self._bound:
                continue
            try:
                st.assume(spec, st.index[node], gpus, mig=self._mig.get(key))
            except (KeyError, AccountingError):
                log.warning("dropping assumed pod %s: node %s changed or left", key, node)
                del self._assumed[key]
        for _key, (spec, node, gpus) in sorted((kv for kv in self._bound.items() if not kv[1][2]), key=order):
            self._book(st, spec, node, gpus)
        return st

    def _book(self, st: ClusterState, spec: PodSpec, node: str, gpus: tuple[int, ...]) -> None:
        if node not in st.index:
            return  # node not known (yet); booked on the rebuild after it appears
        n = st.index[node]
        try:
            if len(gpus) != spec.num_gpu:
                gpus = pick_gpus(st, spec, n) if spec.num_gpu else ()
            st.assume(spec, n, gpus, mig=self._mig.get(spec.key))
            return
        except (AccountingError, ValueError) as e:
            self.conflicts.append(f"{spec.key}: {e}")
            self._report_conflict(st, spec, node, gpus, e)
        # The pod runs there whatever the books say (a device plugin that restarted, a pod bound
        # by someone else): book it unchecked so that nothing else is placed on what it holds.
        # Without a recorded assignment it holds the GPUs with the most free milli.
        if len(gpus) != spec.num_gpu or st.check_indices(spec, n, gpus) is not None:
            count = int(st.gpu_count[n])
            order = sorted(range(count), key=lambda g: (-int(st.gpu_free[n, g]), g))
            gpus = tuple(order[: spec.num_gpu])
        try:
            st.assume(spec, n, gpus, check=False, mig=self._mig.get(spec.key))
        except AccountingError as e:  # never expected: the indices were just chosen on this node
            log.error("cannot book bound pod %s on %s: %s", spec.key, node, e)

    def _report_conflict(
        self, st: ClusterState, spec: PodSpec, node: str, gpus: tuple[int, ...], error: Exception
    ) -> None:
        """Name the newcomer whose booking does not fit, and the pods bound before it that hold
        its GPUs (a log ERROR, and a Warning event on the newcomer)."""
        n = st.index[node]
        holders = sorted(
            k for k, a in st.allocations.items() if a.node == n and k != spec.key and set(a.gpus) & set(gpus)
        )
        when = self._bound_at.get(spec.key, ("", ""))[0] or "?"
        held = ", ".join(f"{k} (bound {self._bound_at.get(k, ('', ''))[0] or '?'})" for k in holders)
        what = (
            f"{ANN_ASSIGNMENT} names GPU(s) {list(gpus)} of node {node}" if gpus else f"it overcommits {node}"
        )
        msg = (
            f"pod {spec.key} (bound {when}): {what}"
            + (f", held by {held}, bound before it" if holders else "")
            + f"; it is booked anyway (it may be running): {error}. gpusched never writes overlapping "
            f"assignments: {spec.key} was placed around gpusched or its annotation was written by hand"
        )
        log.error("%s", msg)
        if self._reporter is not None:
            involved = {"apiVersion": "v1", "kind": "Pod", "namespace": spec.namespace, "name": spec.name}
            self._reporter.about({**involved, "uid": spec.uid}, "Warning", ASSIGNMENT_CONFLICT, msg)


def start_informers(core_api: Any, cluster: LiveCluster, pods: PodFeed) -> list[Any]:
    """Reflectors for nodes and pods: node events feed ``cluster``, pod events go through
    ``pods``, the fan-out that parses each once (``k8s/podevents.py``; the standalone scheduler's
    and the extender's hold ``cluster`` first)."""
    from gpusched.k8s.informer import Handlers, Reflector

    nodes = Reflector(
        "nodes",
        core_api.list_node,
        Handlers(
            cluster.upsert_node,
            lambda o: cluster.delete_node((o.get("metadata") or {}).get("name", "")),
            cluster.sync_nodes,
        ),
    )
    pods_reflector = Reflector(
        "pods", core_api.list_pod_for_all_namespaces, Handlers(pods.upsert, pods.delete, cluster.sync_pods)
    )
    return [nodes.start(), pods_reflector.start()]
