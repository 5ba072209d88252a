"""The extender's verbs as pure request → answer logic over ``LiveCluster`` and the core.

- ``filter``: the core's Filter plugins over the sent nodes; failed nodes carry each plugin's
  ``explain`` reason, in ``FailedAndUnresolvableNodes`` when preemption cannot help there.
- ``prioritize``: the policy's scores (``core.scheduler.score_nodes``) over the sent nodes that
  pass the filters, min-max normalised to 0..10 (best 10, worst 0; all equal → all 10; nodes
  that fail the filters → 0).
- ``bind``: the node is kube-scheduler's decision; the GPUs on it are ours, chosen as
  ``schedule_one`` chooses them (``core.scheduler.choose_devices``: the score plugin's device
  choice there, else best fit). Booked with
  ``LiveCluster.assume`` under its lock (so concurrent binds never double-book a GPU), then the
  annotation + binding go through ``binder`` without the lock; a booking is released only when
  the API refused the binding or the pod is gone, never while the outcome is unknown
  (``k8s/binding.py``).
- ``preempt``: kube-scheduler's proposed victims are kept on the nodes where, once they are
  gone (in a copy of the books), the pod passes the filters; other nodes are dropped. The nodes
  kept are remembered for the pod: a preemptor failing there later is answered after the books
  are checked against the API (``node_to_recheck``, ``recheck_node``; the HTTP app does the read).

Nodes sent by name (``nodeCacheCapable: true``) are the informer's; a name it does not know
yet fails (resolvable). Nodes sent as objects (``false``) that the informer does not know are
evaluated from the sent objects, with empty books.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpusched.core.caches import LRUCache
from gpusched.core.cluster import I64, AccountingError
from gpusched.core.framework import BindPlugin, CycleState, Profile, run_bind
from gpusched.core.model import PodSpec
from gpusched.core.scheduler import choose_devices
from gpusched.core.statement import Statement
from gpusched.core.status import Code, Status
from gpusched.extender.evaluate import UNKNOWN_NODE, UNRES, Evaluator, NodeList, run_filters
from gpusched.extender.protocol import (
    MAX_NODES,
    MAX_VICTIMS_PER_NODE,
    BadRequest,
    LimitExceeded,
    check_count,
    check_name,
    check_quantities,
    dumps,
    field,
    name_of,
    node_items,
    node_names,
    normalise,
    uid_of,
)
from gpusched.k8s.binder import describe
from gpusched.k8s.binding import Result, Settler, bind_until_settled
from gpusched.k8s.convert import InvalidRequest, pod_from_k8s
from gpusched.k8s.podevents import PodEvent
from gpusched.k8s.state import LiveCluster, pod_key

log = logging.getLogger(__name__)

PodGetter = Callable[[str, str], Mapping[str, Any]]
"""``get(namespace, name)``: the pod as an API dict (used when bind sees a pod filter did not)."""
PREEMPTORS_KEPT = 4096
"""Preemptors whose ``/preempt`` answers are remembered (the oldest are dropped first)."""
RECHECK_NODES = 4
"""Of the nodes ``/preempt`` kept for a pod, those a failing filter may read back before the
pod is nominated (kube-scheduler picks one of them)."""
NodePodsLister = Callable[[str], Sequence[Mapping[str, Any]]]
"""``list(node)``: the pods bound to ``node`` as the API has them now (a consistent read), as
API dicts (used to check the books when a nominated pod fails on its nominated node)."""


def soft_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether a v1 Pod carries soft scheduling terms (preferred node or pod (anti-)affinity, a
    ``ScheduleAnyway`` spread constraint): the extender leaves those to kube-scheduler's Score
    plugins, so ``/filter`` must not narrow the choice to one node for such a pod."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    aff = spec.get("affinity")
    if isinstance(aff, Mapping):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = aff.get(kind)
            if isinstance(terms, Mapping) and terms.get("preferredDuringSchedulingIgnoredDuringExecution"):
                return True
    spread = spec.get("topologySpreadConstraints")
    return isinstance(spread, list) and any(
        isinstance(c, Mapping) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in spread
    )


def _by_name(nodes: list[str], failed: dict[str, str] | None = None) -> dict[str, Any]:
    """An ExtenderFilterResult naming the passing ``nodes`` (resolvable ``failed`` ones beside)."""
    return {
        "Nodes": None,
        "NodeNames": nodes,
        "FailedNodes": failed or {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


@dataclass(frozen=True, slots=True)
class BindPlan:
    pod: PodSpec
    uid: str
    node: str
    gpus: tuple[int, ...]


class Extender:
    def __init__(
        self,
        cluster: LiveCluster,
        profile: Profile,
        *,
        binder: BindPlugin | None = None,
        pod_getter: PodGetter | None = None,
        node_pods: NodePodsLister | None = None,
        pod_cache: int = 16384,
        bind_budget_s: float = 6.0,
        pick: bool = False,
    ) -> None:
        self.cluster = cluster
        self.pick = pick
        """``/filter`` answers with the one node ``schedule_one`` would choose among the sent
        nodes (when some pass; by name only; not for pods with soft scheduling terms, which
        kube-scheduler's Score plugins weigh), so that kube-scheduler skips scoring and
        ``/prioritize`` (it scores only when more than one node is feasible)."""
        self.bind_budget_s = bind_budget_s
        """How long ``/bind`` retries a binding whose outcome is unknown (kube-scheduler's
        extender ``httpTimeout`` is 10 s in deploy/extender/scheduler-config.yaml)."""
        self.settler = Settler(cluster, self._read_pod)
        self.profile = dataclasses.replace(profile, binds=(binder,)) if binder is not None else profile
        self.pod_getter = pod_getter
        self.node_pods = node_pods
        """Without it, a nominated pod's failure is answered from the books as they are."""
        self._preempting: LRUCache[str, tuple[str, ...]] = LRUCache(PREEMPTORS_KEPT)
        """Preemptor UID -> the nodes ``/preempt`` last kept for it (kube-scheduler nominates one)."""
        self._plock = threading.Lock()
        self._specs: LRUCache[str, tuple[str, PodSpec]] = LRUCache(pod_cache)  # uid (or key) -> (rv, spec)
        self._uids: dict[str, str] = {}  # uid -> namespace/name, from the informer
        self._pending: dict[str, Mapping[str, Any]] = {}  # uid -> pod not yet bound, from the informer
        self.evaluator = Evaluator(cluster, profile)

    # ------------------------------------------------------------------ pods
    def on_pod_event(self, ev: PodEvent) -> None:
        """The extender's part of a pod event (a ``PodSubscriber`` of its ``PodFeed``, after the
        books): UIDs for preempt, pending pods for bind."""
        uid = ev.uid
        if not uid:
            return
        with self._plock:
            if ev.deleted:
                self._uids.pop(uid, None)
                self._pending.pop(uid, None)
                return
            self._uids[uid] = ev.key
            if ev.bound:
                self._pending.pop(uid, None)
            else:
                self._pending[uid] = ev.obj

    def _pod(self, args: Mapping[str, Any]) -> PodSpec:
        """The request's pod, converted once per (UID, resourceVersion) and remembered for bind."""
        obj = field(args, "Pod", dict)
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        with self._plock:
            hit = self._specs.get(uid) if uid and rv else None
        if hit is not None and hit[0] == rv:
            return hit[1]
        check_quantities(obj)
        try:
            spec = pod_from_k8s(obj, constraints="skip")
        except InvalidRequest as e:
            raise BadRequest(str(e)) from None
        except (TypeError, AttributeError, ValueError, KeyError, ArithmeticError) as e:  # wrong JSON types
            raise BadRequest(f"field 'Pod' is not a valid v1.Pod: {type(e).__name__}: {e}") from None
        ref = uid or spec.key
        with self._plock:
            self._specs.put(ref, (rv, spec))
        return spec

    @staticmethod
    def _request_nodes(args: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
        items = node_items(args)
        if items is not None:
            names = [name_of(o) for o in items]
            check_name("Nodes.items.metadata.name", max(names, key=len, default=""))
            return names, items
        sent = node_names(args)
        if sent is None:
            raise BadRequest("neither 'Nodes' nor 'NodeNames' was sent")
        return sent, None

    # ------------------------------------------------------------------ verbs
    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderArgs → ExtenderFilterResult (``Error`` set for a request that cannot be served).
        Raises LimitExceeded for a request over a limit."""
        try:
            pod = self._pod(args)
            names, objs = self._request_nodes(args)
            held = self._held_node(pod)
            if held is not None:
                return self._filter_held(held, names)
            if self.pick and objs is None and not soft_preferences(args["Pod"]):
                chosen = self.evaluator.pick(pod, names)
                if chosen is not None:
                    return _by_name([chosen.node])
            ev = self.evaluator.evaluate(pod, names, objs, score=False, explain=True)
        except LimitExceeded:
            raise  # HTTP 400
        except BadRequest as e:
            return {
                "Nodes": None,
                "NodeNames": None,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": str(e),
            }
        failed: dict[str, str] = {}
        unres: dict[str, str] = {}
        for p, reason, code in ev.failures:
            (unres if code == UNRES else failed)[names[p]] = reason
        passed = np.flatnonzero(ev.ok)
        out: dict[str, Any] = {"Nodes": None, "NodeNames": None}
        if objs is not None:
            out["Nodes"] = {"metadata": {}, "items": [objs[p] for p in passed.tolist()]}
        elif ev.nodes is not None:
            out["NodeNames"] = ev.nodes.names_at(names, passed)
        out.update(FailedNodes=failed, FailedAndUnresolvableNodes=unres, Error="")
        return out

    def node_to_recheck(self, args: Mapping[str, Any], answer: Mapping[str, Any]) -> str | None:
        """The node whose pods to read from the API before ``answer`` (this extender's filter
        answer to ``args``) is sent: the pod's ``status.nominatedNodeName`` (before the
        nomination reaches the pod: a node ``/preempt`` last kept for it) when the answer fails it
        there for what the books hold (not unresolvably) and the books hold pods bound there.

        kube-scheduler nominates a preemptor, deletes its victims and retries it as soon as its
        own informer shows them gone; this extender's informer may not have delivered those
        deletions yet. A failure answered from such books sends the pod back to wait for a
        cluster event that has already passed (up to five minutes). None: answer as it is."""
        if self.node_pods is None:
            return None
        obj = args.get("Pod")
        if not isinstance(obj, Mapping):
            return None
        status, uid = obj.get("status"), uid_of(obj)
        nominated = status.get("nominatedNodeName") if isinstance(status, Mapping) else None
        with self._plock:  # before kube-scheduler's nomination reaches the pod: where /preempt kept it
            kept = self._preempting.get(uid) if uid else None
        failed = answer.get("FailedNodes") or {}
        candidates = [nominated] if isinstance(nominated, str) and nominated else list(kept or ())
        with self.cluster.live_books() as snap:
            for node in candidates:
                i = snap.index.get(node)
                if node in failed and i is not None and snap.node_pods[i]:
                    return node
        return None

    def recheck_node(self, node: str) -> list[str] | None:
        """Read the pods bound to ``node`` from the API and release from the books those it no
        longer has (``LiveCluster.reconcile_node``); blocking: call it off the event loop.
        Returns the released pods' keys (None when the read failed: the answer stands)."""
        if self.node_pods is None:
            return None
        try:
            items = self.node_pods(node)
        except Exception as e:
            log.warning("cannot read the pods of node %s to check the books: %s", node, describe(e))
            return None
        released = self.cluster.reconcile_node(node, items)
        if released:
            log.info(
                "node %s: the API no longer has %s (their deletion had not come through the informer yet): "
                "released from the books",
                node,
                ", ".join(released),
            )
        return released

    def _held_node(self, pod: PodSpec) -> str | None:
        """The node where the books hold ``pod`` (same UID): an earlier ``/bind`` whose outcome
        is not known yet, which kube-scheduler retries after its own timeout."""
        with self.cluster.live_books() as snap:
            a = snap.allocations.get(pod.key)
            if a is None or (pod.uid and a.pod.uid and a.pod.uid != pod.uid):
                return None
            return snap.names[a.node]

    @staticmethod
    def _filter_held(node: str, names: list[str]) -> dict[str, Any]:
        """A pod held on ``node`` goes back there, the same decision bound again (or found
        bound): another node would book its GPUs twice while the first binding may still land.
        When kube-scheduler did not send ``node``, every node fails (resolvable) until the API
        settles the first binding."""
        if node in names:
            return _by_name([node])
        why = f"held on node {node} until its earlier binding there is settled"
        return _by_name([], dict.fromkeys(names, why))

    def _priorities(self, args: Mapping[str, Any]) -> tuple[list[str], I64, NodeList | None]:
        pod = self._pod(args)
        names, objs = self._request_nodes(args)
        ev = self.evaluator.evaluate(pod, names, objs, score=True, explain=False)
        scored = ~np.isnan(ev.raw)
        scores = np.zeros(len(names), dtype=np.int64)
        scores[scored] = normalise(ev.raw[scored])
        return names, scores, ev.nodes

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """ExtenderArgs → HostPriorityList. Raises BadRequest (answered with HTTP 400)."""
        names, scores, _ = self._priorities(args)
        return [{"Host": n, "Score": s} for n, s in zip(names, scores.tolist(), strict=True)]

    def prioritize_json(self, args: Mapping[str, Any]) -> bytes:
        """``prioritize``, encoded."""
        names, scores, _ = self._priorities(args)
        return dumps([{"Host": n, "Score": s} for n, s in zip(names, scores.tolist(), strict=True)])

    def preempt(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderPreemptionArgs → ExtenderPreemptionResult (UIDs only). Raises BadRequest."""
        pod = self._pod(args)
        meta = field(args, "NodeNameToMetaVictims", dict, required=False) or {}
        full = field(args, "NodeNameToVictims", dict, required=False) or {}
        victims: dict[str, tuple[list[str], int]] = {}
        keys: dict[str, str] = {}
        for source, is_full in ((full, True), (meta, False)):
            what = "NodeNameToVictims" if is_full else "NodeNameToMetaVictims"
            check_count(what, len(source), MAX_NODES)
            for node, v in source.items():
                check_name(what, node)
                if not isinstance(v, dict) or not isinstance(v.get("Pods") or [], list):
                    raise BadRequest(f"victims of node {node!r} must be an object with a 'Pods' list")
                check_count(f"{what}[{node}].Pods", len(v.get("Pods") or []), MAX_VICTIMS_PER_NODE)
                uids = []
                for p in v.get("Pods") or []:
                    uid = (uid_of(p) if is_full else str(p.get("UID") or "")) if isinstance(p, dict) else ""
                    if is_full and uid:
                        keys[uid] = pod_key(p)
                    uids.append(uid)
                pdb = v.get("NumPDBViolations") or 0
                victims[node] = (uids, int(pdb) if isinstance(pdb, int) else 0)
        with self._plock:
            for uids, _ in victims.values():
                keys.update({u: self._uids[u] for u in uids if u not in keys and u in self._uids})
        # Evict the victims tentatively on the live books, ask the filters, undo: no copy of
        # the cluster, and the books are exactly as before when the lock is released.
        with self.cluster.live_books() as snap, Statement(snap) as what_if:
            nodes = [n for n in victims if n in snap.index]
            idx = np.array([snap.index[n] for n in nodes], dtype=np.int64)
            for n, i in zip(nodes, idx.tolist(), strict=True):
                for uid in victims[n][0]:
                    a = snap.allocations.get(keys.get(uid, ""))
                    if a is not None and a.node == i:
                        what_if.evict(a.pod.key)
            ok, _, _ = run_filters(self.profile, pod, snap, idx, explain=False)
        kept = [n for n, fits in zip(nodes, ok.tolist(), strict=True) if fits]
        if pod.uid and kept:
            with self._plock:
                self._preempting.put(pod.uid, tuple(kept[:RECHECK_NODES]))
        return {
            "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": u} for u in victims[n][0]], "NumPDBViolations": victims[n][1]}
                for n in kept
            }
        }

    # ------------------------------------------------------------------- bind
    def bind_target(self, args: Mapping[str, Any]) -> tuple[str, str, str, str, PodSpec | None]:
        """(namespace, name, uid, node, spec if already known) of an ExtenderBindingArgs."""
        ns = field(args, "PodNamespace", str, required=False) or "default"
        name = field(args, "PodName", str)
        uid = field(args, "PodUID", str, required=False) or ""
        node = field(args, "Node", str)
        with self._plock:
            hit = self._specs.get(uid or f"{ns}/{name}")
            spec = hit[1] if hit is not None else None
            obj = self._pending.get(uid) if spec is None and uid else None
        if spec is None and obj is not None:
            try:
                spec = pod_from_k8s(obj, constraints="skip")
            except InvalidRequest as e:
                raise BadRequest(str(e)) from None
        return ns, name, uid, node, spec

    def fetch_pod(self, namespace: str, name: str, uid: str) -> PodSpec:
        """The pod from the API (blocking: call it off the event loop)."""
        if self.pod_getter is None:
            raise BadRequest(f"pod {namespace}/{name} was never filtered here and no API getter is set")
        try:
            obj = self.pod_getter(namespace, name)
        except Exception as e:
            raise BadRequest(f"cannot read pod {namespace}/{name}: {describe(e)}") from None
        if uid and uid_of(obj) and uid_of(obj) != uid:
            raise BadRequest(f"pod {namespace}/{name} has UID {uid_of(obj)}, not {uid}")
        try:
            return pod_from_k8s(obj, constraints="skip")
        except InvalidRequest as e:
            raise BadRequest(str(e)) from None

    def reserve(self, pod: PodSpec, uid: str, node: str) -> BindPlan:
        """Choose the GPUs on ``node`` and book them, under the lock. Raises BadRequest."""
        with self.cluster.live_books() as snap:
            if node not in snap.index:
                raise BadRequest(f"{UNKNOWN_NODE}: {node}")
            n = snap.index[node]
            held = snap.allocations.get(pod.key)
            if held is not None:
                if held.node != n:
                    raise BadRequest(f"pod {pod.key} is already assumed on node {snap.names[held.node]}")
                gpus = held.gpus  # a retried bind: keep its GPUs
            else:
                try:
                    hint = self.evaluator.device_hint(snap, pod, n)  # /filter's pick scored it already
                    gpus = choose_devices(CycleState(), self.profile, pod, snap, n, hint)
                    self.cluster.assume(pod, n, gpus)
                except (ValueError, AccountingError) as e:
                    raise BadRequest(f"pod {pod.key} no longer fits node {node}: {e}") from None
        return BindPlan(pod, uid, node, gpus)

    def complete(self, plan: BindPlan, error: str | None) -> dict[str, str]:
        """After the API calls (``call_binder`` has settled the booking) → ExtenderBindingResult."""
        if error is not None:
            return {"Error": f"binding {plan.pod.key} to {plan.node} failed: {error}"}
        return {"Error": ""}

    @staticmethod
    def bound_pod(plan: BindPlan) -> PodSpec:
        """The pod of ``plan`` with the UID to bind it under (the request's)."""
        if not plan.uid or plan.uid == plan.pod.uid:
            return plan.pod  # most binds: the pod /filter converted, under the same UID
        return dataclasses.replace(plan.pod, uid=plan.uid)

    def call_binder(
        self, plan: BindPlan, first: Status | None = None, deadline: float | None = None
    ) -> str | None:
        """Run the profile's bind plugins (blocking) until the API says what happened, for at
        most ``bind_budget_s`` (``k8s/binding.py``): the error text, or None once the pod is
        bound to ``plan.node`` (by this call, or by an earlier attempt whose answer was lost).
        A booking whose outcome is still unknown stays held until the API settles it.
        ``first``: the answer of a first attempt already made (``apibind``), read as the
        plugins' first answer; ``deadline`` (``time.monotonic()``): when the budget, counted
        from the request's arrival, ends (default: ``bind_budget_s`` from now)."""
        pod = self.bound_pod(plan)
        if deadline is None:
            deadline = time.monotonic() + self.bind_budget_s
        if first is not None and first.code == Code.ERROR and time.monotonic() >= deadline:
            # no time left to read the pod back within kube-scheduler's timeout: the settler will
            self.settler.hold(pod)
            return f"{first.message()} ({Result.HELD.value} after 1 attempt(s))"

        answers = [first] if first is not None else []

        def attempt() -> Status:
            return answers.pop() if answers else run_bind(self.profile, pod, plan.node, plan.gpus)

        out = bind_until_settled(
            attempt,
            pod,
            self.settler,
            keep_trying=lambda: time.monotonic() < deadline,
        )
        if out.result is Result.BOUND and (out.status.ok or out.node == plan.node):
            return None
        if out.result is Result.BOUND:
            return f"the API shows it bound to {out.node or 'another node'}"
        return f"{out.status.message()} ({out.result.value} after {out.attempts} attempt(s))"

    def _read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod from the API for the settler: None when it does not exist."""
        if self.pod_getter is None:
            raise RuntimeError("no API getter is set to read pods back")
        try:
            return self.pod_getter(namespace, name)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise

    def bind(self, args: Mapping[str, Any]) -> dict[str, str]:
        """ExtenderBindingArgs → ExtenderBindingResult, all in the calling thread."""
        try:
            ns, name, uid, node, spec = self.bind_target(args)
            plan = self.reserve(spec or self.fetch_pod(ns, name, uid), uid, node)
        except BadRequest as e:
            return {"Error": str(e)}
        return self.complete(plan, self.call_binder(plan))
