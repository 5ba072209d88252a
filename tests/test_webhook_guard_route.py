"""The webhook's /guard (only gpusched's identities write gpusched.io/assignment and gpusched.io/allocated,
issue 28 F3) and /route (GPU pods go to gpusched, issue 29 item 7), without a control plane."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from gpusched.webhook.guard import ANN_ALLOCATED, DEFAULT_ASSIGNMENT_WRITERS, Writers, guard_review
from gpusched.webhook.route import ANN_ROUTED_FROM, Routing, route_review

ASSIGNMENT = "gpusched.io/assignment"
SCHEDULER = "system:serviceaccount:gpusched-system:gpusched"
AGENT = "system:serviceaccount:gpusched-node:gpusched-agent"
USER = "alice@example.com"
FORGED = '{"node": "n", "gpus": [0], "milli": 1000, "memoryMiB": 0}'


def gpu_pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "forged", "namespace": "team"}
    if annotations is not None:
        meta["annotations"] = annotations
    containers = [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers, **spec}}


def review_of(
    obj: dict[str, Any],
    op: str = "CREATE",
    user: str = USER,
    old: dict[str, Any] | None = None,
    kind: str = "Pod",
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "operation": op,
        "namespace": "team",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def guard(body: dict[str, Any], writers: Writers | None = None) -> dict[str, Any]:
    return dict(guard_review(body, writers or Writers())["response"])


# ----------------------------------------------------------------------------------------- /guard
def test_a_forged_assignment_on_create_is_denied_naming_user_annotation_and_writers() -> None:
    """issue 28 F3's reproduction: a user creates a pod with spec.nodeName and an assignment."""
    r = guard(review_of(gpu_pod({ASSIGNMENT: FORGED}, nodeName="n")))
    assert r["allowed"] is False and r["status"]["code"] == 403 and r["status"]["reason"] == "Forbidden"
    msg = r["status"]["message"]
    assert msg.startswith(f"{USER} sets annotation {ASSIGNMENT} on pod team/forged (CREATE): only ")
    assert all(w in msg for w in DEFAULT_ASSIGNMENT_WRITERS)


@pytest.mark.parametrize(
    ("old", "new", "verb"),
    [
        ({}, {ASSIGNMENT: FORGED}, "sets"),  # added to a running pod
        ({ASSIGNMENT: '{"node": "n", "gpus": [1]}'}, {ASSIGNMENT: FORGED}, "changes"),
        ({ASSIGNMENT: FORGED}, {}, "removes"),  # the books would forget what it holds
        ({ANN_ALLOCATED: "{}"}, {ANN_ALLOCATED: '{"main": {"nvidia.com/gpu": ["GPU-0"]}}'}, "changes"),
    ],
)
def test_a_forged_update_is_denied(old: dict[str, str], new: dict[str, str], verb: str) -> None:
    r = guard(review_of(gpu_pod(new, nodeName="n"), "UPDATE", old=gpu_pod(old, nodeName="n")))
    assert r["allowed"] is False and f"{USER} {verb} annotation" in r["status"]["message"]


def test_a_forged_binding_is_denied() -> None:
    """A Binding's annotations are copied onto the pod: pods/binding is guarded too."""
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "forged", "annotations": {ASSIGNMENT: FORGED}},
    }
    r = guard(review_of(binding, kind="Binding"))
    assert r["allowed"] is False and "on the binding of pod team/forged" in r["status"]["message"]


def test_gpuscheds_own_identities_may_write_their_annotation() -> None:
    allowed = [
        review_of(gpu_pod({ASSIGNMENT: FORGED}, nodeName="n"), user=SCHEDULER),  # a create by the scheduler
        review_of(gpu_pod({ASSIGNMENT: FORGED}), "UPDATE", SCHEDULER, old=gpu_pod({})),  # its patch
        review_of(gpu_pod({ANN_ALLOCATED: "{}"}), "UPDATE", AGENT, old=gpu_pod({})),  # the agent's record
        review_of(gpu_pod({ASSIGNMENT: FORGED, "x": "y"}), "UPDATE", USER, old=gpu_pod({ASSIGNMENT: FORGED})),
        review_of(gpu_pod({"team": "a"})),  # a pod without them
        review_of(gpu_pod({ASSIGNMENT: FORGED}), "DELETE"),
    ]
    for body in allowed:
        assert guard(body) == {"uid": "u-1", "allowed": True}, body
    # each annotation has its writers: the agent may not write an assignment, nor the scheduler an allocation
    assert (
        guard(review_of(gpu_pod({ASSIGNMENT: FORGED}), "UPDATE", AGENT, old=gpu_pod({})))["allowed"] is False
    )
    assert (
        guard(review_of(gpu_pod({ANN_ALLOCATED: "{}"}), "UPDATE", SCHEDULER, old=gpu_pod({})))["allowed"]
        is False
    )


def test_the_writers_are_configurable() -> None:
    mine = Writers.of(["system:serviceaccount:ops:my-gpusched"])
    body = review_of(gpu_pod({ASSIGNMENT: FORGED}), user="system:serviceaccount:ops:my-gpusched")
    assert guard(body, mine)["allowed"] is True
    assert guard(review_of(gpu_pod({ASSIGNMENT: FORGED}), user=SCHEDULER), mine)["allowed"] is False
    assert Writers.of() == Writers()  # none given: the defaults


# ----------------------------------------------------------------------------------------- /route
ROUTING = Routing.of(["gpusched", "gpusched-standalone"])


def ops_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return list(json.loads(base64.b64decode(response["patch"]))) if "patch" in response else []


def test_a_gpu_pod_for_another_scheduler_is_routed_to_gpusched() -> None:
    pod = gpu_pod(schedulerName="default-scheduler")
    r = route_review(review_of(pod), ROUTING)["response"]
    assert r["allowed"] is True and r["patchType"] == "JSONPatch"
    assert ops_of(r) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpusched"},
        {"op": "add", "path": "/metadata/annotations", "value": {ANN_ROUTED_FROM: "default-scheduler"}},
    ]
    pod = gpu_pod({"a": "b"}, schedulerName="volcano")
    assert ops_of(route_review(review_of(pod), ROUTING)["response"])[1] == {
        "op": "add",
        "path": "/metadata/annotations/gpusched.io~1routed-from",
        "value": "volcano",
    }


@pytest.mark.parametrize(
    "pod",
    [
        gpu_pod(schedulerName="gpusched"),
        gpu_pod(schedulerName="gpusched-standalone"),  # any of gpusched's names
        {
            "metadata": {"name": "cpu"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]},
        },
        gpu_pod({"kubernetes.io/config.mirror": "x"}, nodeName="n"),  # a static pod's mirror
    ],
)
def test_other_pods_are_not_routed(pod: dict[str, Any]) -> None:
    assert route_review(review_of(pod), ROUTING)["response"] == {"uid": "u-1", "allowed": True}


def test_a_gpu_pod_created_with_a_node_name_is_denied_with_the_way_out() -> None:
    r = route_review(review_of(gpu_pod(nodeName="n")), ROUTING)["response"]
    assert r["allowed"] is False and r["status"]["code"] == 400
    msg = r["status"]["message"]
    assert "pod team/forged asks for GPUs and is created with spec.nodeName n" in msg
    assert "kubernetes.io/hostname: n" in msg and "gpusched.io/gpu-routing=disabled" in msg


def test_routing_without_names_routes_nothing() -> None:
    body = review_of(gpu_pod(nodeName="n"))
    assert route_review(copy.deepcopy(body), Routing.of([]))["response"]["allowed"] is True
