"""Binding outcomes and informer events in any order never leave a GPU booked twice.

A hypothesis state machine drives the books of the Kubernetes front ends (``LiveCluster``),
the binding loop (``bind_until_settled``) and the settler of ``k8s/binding.py`` against a
small fake API. Each binding attempt ends in one of the outcomes seen on real control planes:

- ``ok``: committed, answered;
- ``committed``: committed, but the answer is lost (the connection dropped: the apiserver killed
  or a proxy dropping it after forwarding);
- ``lost``: never committed, and no answer either;
- ``refused``: answered with a 4xx that wrote nothing (403);

and the API answers 409 to a pod already bound or recreated, 404 to a pod deleted. Informer
events (pod added, bound, deleted) are delivered late, any number at a time, also *during* a
binding loop (between an attempt and its read-back). Pods are deleted and recreated under the
same name, read-backs fail, loops give up (lost leadership, the extender's budget), and the
settler's clock moves.

After every step: every pod the API shows bound is booked at exactly the node and GPUs of its
binding (the books never lose a committed binding, which is what a double booking needs), no
GPU is booked over 1000 milli or its memory, and every booking not yet bound in the API
belongs to a decision whose binding is still in flight or held by the settler, or to a pod
whose events the informer has still to deliver (nothing leaks).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpusched.core.model import PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code, Status
from gpusched.k8s.binding import Result, Settler, bind_until_settled
from gpusched.k8s.convert import ANN_ASSIGNMENT, assignment_annotation, parse_assignment, pod_from_k8s
from gpusched.k8s.state import LiveCluster, pod_key

GPU_MEM = 16384
NODES = ("n0", "n1")
GPUS = 2
OUTCOMES = ("ok", "committed", "lost", "refused")
GRACE_S = 60.0


def node_obj(name: str) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(GPUS), "pods": "110"}
    labels = {"nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": str(GPU_MEM)}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": alloc}}


class FakeAPI:
    """Pods as the apiserver holds them, with a queue of watch events for the informer."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[dict[str, Any], bool]] = []  # (object, deleted)
        self.uids = itertools.count()
        self.read_fails = False

    def create(self, name: str, resources: dict[str, str]) -> None:
        obj = {
            "metadata": {"name": name, "namespace": "default", "uid": f"u{next(self.uids)}"},
            "spec": {"schedulerName": "gpusched", "containers": [
                {"name": "c", "resources": {"requests": resources, "limits": resources}}
            ]},
            "status": {"phase": "Pending"},
        }  # fmt: skip
        self.pods[pod_key(obj)] = obj
        self.events.append((copy.deepcopy(obj), False))

    def delete(self, key: str) -> None:
        obj = self.pods.pop(key)
        self.events.append((copy.deepcopy(obj), True))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.read_fails:
            raise ConnectionError("read-back failed")
        obj = self.pods.get(f"{namespace}/{name}")
        return copy.deepcopy(obj) if obj is not None else None

    def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...], outcome: str) -> Status:
        obj = self.pods.get(pod.key)
        if obj is None:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ("404 Not Found",))
        if obj["metadata"]["uid"] != pod.uid or obj["spec"].get("nodeName"):
            return Status(Code.ERROR, ("409 Conflict",))
        if outcome == "refused":
            return Status(Code.UNSCHEDULABLE, ("403 Forbidden",))
        if outcome in ("ok", "committed"):
            obj["spec"]["nodeName"] = node
            obj["metadata"]["annotations"] = {ANN_ASSIGNMENT: assignment_annotation(node, gpus, pod)}
            obj["status"]["phase"] = "Running"
            self.events.append((copy.deepcopy(obj), False))
        return Status.success() if outcome == "ok" else Status(Code.ERROR, ("ProtocolError",))


class BindingOutcomes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.api = FakeAPI()
        self.cluster = LiveCluster()
        for n in NODES:
            self.cluster.upsert_node(node_obj(n))
        self.now = 0.0
        self.settler = Settler(
            self.cluster, self.api.read, grace_s=GRACE_S, interval_s=0, clock=lambda: self.now
        )
        self.profile = make_profile("bestfit", PolicyContext(None, np.random.default_rng(0)))
        self.seen: dict[str, dict[str, Any]] = {}  # pending pods as the informer delivered them
        self.in_flight: dict[str, tuple[PodSpec, str, tuple[int, ...]]] = {}
        self.names = itertools.count()

    # ------------------------------------------------------------------ the informer
    def deliver(self, count: int) -> None:
        for obj, deleted in self.api.events[:count]:
            key = pod_key(obj)
            if deleted:
                self.cluster.delete_pod(key)
                self.seen.pop(key, None)
            else:
                self.cluster.upsert_pod(obj)
                if obj["spec"].get("nodeName"):
                    self.seen.pop(key, None)
                else:
                    self.seen[key] = obj
        del self.api.events[:count]

    @rule(count=st.integers(1, 4))
    def informer(self, count: int) -> None:
        self.deliver(count)

    # ------------------------------------------------------------------ the API's users
    @rule(milli=st.sampled_from([0, 250, 500, 700, 1000]), mem=st.sampled_from([0, 4096, 12288]),
          whole=st.integers(0, 2))  # fmt: skip
    def create(self, milli: int, mem: int, whole: int) -> None:
        if whole:
            res = {"nvidia.com/gpu": str(whole)}
        elif milli or not mem:
            res = {"gpusched.io/gpu-milli": str(milli or 100)}
            if mem:
                res["gpusched.io/gpu-memory"] = str(mem)
        else:
            res = {"gpusched.io/gpu-memory": str(mem)}
        self.api.create(f"p{next(self.names)}", res)

    @precondition(lambda self: self.api.pods)
    @rule(data=st.data(), recreate=st.booleans())
    def delete(self, data: st.DataObject, recreate: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.api.pods)))
        obj = self.api.pods[key]
        self.api.delete(key)
        if recreate:
            res = obj["spec"]["containers"][0]["resources"]["requests"]
            self.api.create(obj["metadata"]["name"], res)

    # ------------------------------------------------------------------ the scheduler
    @precondition(lambda self: self.seen)
    @rule(data=st.data())
    def decide(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.seen)))
        if self.cluster.is_bound_or_assumed(key) or key in self.in_flight:
            return
        pod = pod_from_k8s(self.seen[key])
        with self.cluster.live_books() as snap:
            r = schedule_one(self.profile, pod, snap)
            if r.scheduled:
                self.cluster.assume(pod, r.node, r.gpus)
                self.in_flight[key] = (pod, r.node_name, r.gpus)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.in_flight)))
        pod, node, gpus = self.in_flight.pop(key)

        def attempt() -> Status:
            answer = self.api.bind(pod, node, gpus, data.draw(st.sampled_from(OUTCOMES), label="outcome"))
            self.deliver(data.draw(st.integers(0, 3), label="events during the binding"))
            self.api.read_fails = data.draw(st.booleans(), label="read-back fails")
            return answer

        out = bind_until_settled(
            attempt, pod, self.settler,
            keep_trying=lambda: data.draw(st.booleans(), label="keep trying"), sleep=lambda s: None,
        )  # fmt: skip
        self.api.read_fails = False
        if out.result is Result.BOUND:
            assert self.api.pods[key]["spec"]["nodeName"] == out.node or out.status.ok

    @rule(advance=st.sampled_from([0.0, 1.0, GRACE_S]))
    def settler_runs(self, advance: float) -> None:
        self.now += advance
        self.settler.run_once()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def the_books_hold_every_binding_the_api_committed(self) -> None:
        with self.cluster.live_books() as snap:
            for key, obj in self.api.pods.items():
                node = obj["spec"].get("nodeName")
                if not node:
                    continue
                held = snap.allocations.get(key)
                assert held is not None, f"{key} is bound to {node} in the API but not booked"
                assignment = parse_assignment(obj)
                assert assignment is not None
                assert (snap.names[held.node], held.gpus) == assignment, f"{key} booked elsewhere"

    @invariant()
    def no_gpu_is_booked_over_its_capacity(self) -> None:
        with self.cluster.live_books() as snap:
            assert (snap.gpu_free >= 0).all() and (snap.gpu_mem_free >= 0).all()
        assert not self.cluster.conflicts

    @invariant()
    def nothing_is_held_without_a_reason(self) -> None:
        held = set(self.settler.held())
        undelivered = {pod_key(obj) for obj, _ in self.api.events}  # the informer will settle these
        for key in self.cluster.assumed():
            bound_in_api = bool(self.api.pods.get(key, {}).get("spec", {}).get("nodeName"))
            reason = key in self.in_flight or key in held or bound_in_api or key in undelivered
            assert reason, f"{key} is booked for nothing"


TestBindingOutcomes = BindingOutcomes.TestCase
TestBindingOutcomes.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_held_booking_is_released_only_after_the_grace_period_and_handed_back() -> None:
    api, cluster, now = FakeAPI(), LiveCluster(), [0.0]
    cluster.upsert_node(node_obj("n0"))
    api.create("p", {"nvidia.com/gpu": "1"})
    pod = pod_from_k8s(api.pods["default/p"])
    released: list[str] = []
    settler = Settler(
        cluster, api.read, grace_s=GRACE_S, interval_s=0, clock=lambda: now[0],
        on_released=lambda obj: released.append(pod_key(obj)),
    )  # fmt: skip
    with cluster.live_books() as snap:
        cluster.assume(pod, snap.index["n0"], (0,))
    settler.hold(pod)
    api.read_fails = True
    now[0] = 2 * GRACE_S
    settler.run_once()  # the API cannot say: kept, however long
    assert cluster.assumed() == ["default/p"] and settler.held() == ["default/p"] and not released
    api.read_fails, now[0] = False, 0.0
    settler.hold(pod)
    now[0] = GRACE_S - 1
    settler.run_once()  # pending, but a late commit is still possible: kept
    assert cluster.assumed() == ["default/p"] and not released
    now[0] = GRACE_S
    settler.run_once()
    assert cluster.assumed() == [] and settler.held() == [] and released == ["default/p"]
    with cluster.live_books() as snap:
        assert snap.node_gpu_free(0) == [1000, 1000]


def test_a_binding_event_arriving_after_the_api_said_gone_books_nothing() -> None:
    """The state machine's find: a binding is committed but its answer lost, the pod is deleted,
    the settler's read-back finds it gone and releases its GPU, another pod takes that GPU; then
    the informer delivers the first pod's (late) bound event, then its deletion. The late event
    is history (the read-back was newer): it must not book the gone pod over the other one."""
    api, cluster = FakeAPI(), LiveCluster()
    for n in NODES:
        cluster.upsert_node(node_obj(n))
    api.create("p", {"gpusched.io/gpu-milli": "500"})
    cluster.upsert_pod(api.events.pop(0)[0])
    pod = pod_from_k8s(api.pods["default/p"])
    with cluster.live_books() as snap:
        cluster.assume(pod, snap.index["n0"], (1,))
    settler = Settler(cluster, api.read, grace_s=GRACE_S, interval_s=0, clock=lambda: 0.0)
    api.read_fails = True  # committed, the answer lost, and nobody can read it back now
    out = bind_until_settled(
        lambda: api.bind(pod, "n0", (1,), "committed"), pod, settler, keep_trying=lambda: False
    )
    assert out.result is Result.HELD
    api.read_fails = False
    api.delete("default/p")
    settler.run_once()  # read back: gone, released
    assert cluster.assumed() == [] and settler.held() == []
    api.create("q", {"nvidia.com/gpu": "2"})  # takes both GPUs, the released one included
    other = pod_from_k8s(api.pods["default/q"])
    with cluster.live_books() as snap:
        cluster.assume(other, snap.index["n0"], (0, 1))
    late_bound, deleted, _q_added = api.events
    assert late_bound[0]["spec"]["nodeName"] == "n0" and deleted[1]
    cluster.upsert_pod(late_bound[0])
    with cluster.live_books() as snap:
        assert (snap.gpu_free >= 0).all() and "default/p" not in snap.allocations
    assert not cluster.conflicts
    cluster.delete_pod(pod_key(deleted[0]), deleted[0]["metadata"]["uid"])
    api.events.clear()
    api.create("p", {"gpusched.io/gpu-milli": "500"})  # the same name, a new UID: its events count
    again = pod_from_k8s(api.pods["default/p"])
    assert api.bind(again, "n1", (0,), "ok").ok
    cluster.upsert_pod(api.events[-1][0])
    with cluster.live_books() as snap:
        a = snap.allocations["default/p"]
        assert (snap.names[a.node], a.gpus) == ("n1", (0,)) and (snap.gpu_free >= 0).all()


def test_a_stale_decision_found_gone_keeps_the_booking_of_its_successor() -> None:
    """The state machine's find: a pod decided from its old object (deleted and created again under the
    same name before the informer said so) gets 409 and no read-back, and the settler holds it; the
    informer then delivers the deletion, and the new pod is decided and bound. The settler's read-back
    finds the old UID gone: it must not release the new pod's booking (it did, by name)."""
    api, cluster = FakeAPI(), LiveCluster()
    for n in NODES:
        cluster.upsert_node(node_obj(n))
    api.create("p", {"gpusched.io/gpu-milli": "100"})
    old = pod_from_k8s(api.pods["default/p"])
    api.delete("default/p")
    api.create("p", {"gpusched.io/gpu-milli": "100"})
    new = pod_from_k8s(api.pods["default/p"])
    settler = Settler(cluster, api.read, grace_s=GRACE_S, interval_s=0, clock=lambda: 0.0)
    with cluster.live_books() as snap:
        cluster.assume(old, snap.index["n0"], (0,))
    api.read_fails = True
    out = bind_until_settled(lambda: api.bind(old, "n0", (0,), "ok"), old, settler, keep_trying=lambda: False)
    assert out.result is Result.HELD
    api.read_fails = False
    cluster.delete_pod("default/p")  # the informer: the old pod's deletion
    with cluster.live_books() as snap:
        cluster.assume(new, snap.index["n0"], (1,))
    assert api.bind(new, "n0", (1,), "ok").ok
    settler.run_once()  # the old UID is gone
    with cluster.live_books() as snap:
        a = snap.allocations.get("default/p")
        assert a is not None and a.pod.uid == new.uid and a.gpus == (1,)
    assert cluster.assumed() == ["default/p"] and settler.held() == []
