"""The pending queue never loses the event a pod waits for (found by the DRA e2e test of template
claims under load: a claim pod left waiting for the periodic flush).

A claim pod from a template waits twice: for kube-controller-manager to create its ResourceClaim (an
event of the DRA informers: ``cluster_changed``) and to record the claim's name in the pod's
``status.resourceClaimStatuses`` (a pod update). Either can come while the pod is being decided, or
after it was refused; neither may be dropped, as kube-scheduler's queue drops neither (its in-flight
events and the DynamicResources plugin's pod-update hint).
"""

from __future__ import annotations

from typing import Any

from builders import k8s_pod
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.queue import SchedulingQueue

KEY = "default/whole-0"


def claim_pod(recorded: bool = False) -> dict[str, Any]:
    obj = k8s_pod(
        "whole-0", {"cpu": "100m"}, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "a100"}]
    )
    if recorded:  # the resourceclaim controller made the claim and recorded it
        obj["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "whole-0-gpu-x7k2p"}]
    return obj


def refused_once(q: SchedulingQueue) -> None:
    q.add_or_update(parse_pod_event(claim_pod()))
    qp = q.pop(timeout=0)
    assert qp is not None and qp.key == KEY
    q.done(KEY, unschedulable=True)


def test_a_cluster_change_while_the_pod_is_decided_retries_it_after_backoff_not_at_the_flush() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    q.add_or_update(parse_pod_event(claim_pod(recorded=True)))
    assert q.pop(timeout=0) is not None  # popped: its claim is not in the books yet, it is refused...
    q.cluster_changed()  # ...while the informer delivers the claim
    q.done(KEY, unschedulable=True)
    now[0] = 1.5  # the backoff (1 s) has passed
    qp = q.pop(timeout=0)
    assert qp is not None and qp.key == KEY, "the claim's event was lost: the pod waits for the 30 s flush"


def test_a_cluster_change_before_the_pop_is_not_counted_again() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    q.cluster_changed()
    refused_once(q)
    now[0] = 5.0
    assert q.pop(timeout=0) is None  # nothing changed since it was decided: it waits (no hot loop)
    q.cluster_changed()
    now[0] = 5.5
    assert q.pop(timeout=0) is not None


def test_the_claim_recorded_in_the_pods_status_brings_it_back_at_once() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    refused_once(q)  # no resourceClaimStatuses yet
    q.add_or_update(parse_pod_event(claim_pod(recorded=True)))
    qp = q.pop(timeout=0)
    assert qp is not None and qp.key == KEY, "a status update naming its claim left the pod waiting"
    assert qp.obj["status"]["resourceClaimStatuses"][0]["resourceClaimName"] == "whole-0-gpu-x7k2p"


def test_other_status_updates_leave_an_unschedulable_pod_waiting() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    refused_once(q)
    obj = claim_pod()
    obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    q.add_or_update(parse_pod_event(obj))  # our own PodScheduled=False: nothing to retry for
    assert q.pop(timeout=0) is None


def test_a_pod_updated_while_it_is_decided_is_retried_after_backoff() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    q.add_or_update(parse_pod_event(claim_pod()))
    assert q.pop(timeout=0) is not None  # decided without the claim's name...
    q.add_or_update(parse_pod_event(claim_pod(recorded=True)))  # ...which the controller records now
    q.done(KEY, unschedulable=True)
    now[0] = 1.5
    qp = q.pop(timeout=0)
    assert qp is not None and qp.key == KEY, "the update that came while it was decided was dropped"
    assert qp.obj["status"]["resourceClaimStatuses"]


def test_a_gang_member_parked_without_its_own_pop_waits_for_the_next_change() -> None:
    """The other members of a gang decided with the popped pod are parked as of now: no change since
    means no retry (else a waiting gang would be retried every backoff, for nothing)."""
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    for name in ("a", "b"):
        q.add_or_update(parse_pod_event(k8s_pod(name, {"cpu": "100m"})))
    q.cluster_changed()
    qp = q.pop(timeout=0)
    assert qp is not None and qp.key == "default/a"
    q.park("default/b")  # decided with a, not popped itself
    q.park("default/a")
    now[0] = 5.0
    assert q.pop(timeout=0) is None
    q.cluster_changed()
    now[0] = 5.5
    assert {qp.key for qp in (q.pop(timeout=0), q.pop(timeout=0)) if qp is not None} == {
        "default/a",
        "default/b",
    }


def test_a_pod_recreated_while_its_namesake_is_decided_is_retried_after_backoff() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    q.add_or_update(parse_pod_event(claim_pod()))
    assert q.pop(timeout=0) is not None
    again = claim_pod(recorded=True)
    again["metadata"]["uid"] = "uid-whole-0-again"  # deleted and created again meanwhile
    q.add_or_update(parse_pod_event(again))
    q.done(KEY, unschedulable=True)  # the old pod's attempt ends
    now[0] = 1.5
    qp = q.pop(timeout=0)
    assert qp is not None and qp.uid == "uid-whole-0-again"
