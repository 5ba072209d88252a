"""The mutating webhook called by a real kube-apiserver, configured as deploy/manifests/webhook/ configures it
(rules, failurePolicy, namespaceSelector, matchConditions), only its clientConfig pointed at a webhook process
on loopback whose certificate comes from a CA made here (the caBundle).

- a pod with only gpusched.io/gpu-memory is created with gpusched.io/gpu-share: 1 in limits and requests;
- pods that ask for no share (whole GPUs, no GPU) are created as written;
- an invalid share is refused with the webhook's message naming the container and the field;
- kube-system, gpusched-system and namespaces labelled gpusched.io/webhook=disabled are never sent;
- with the webhook down, a share pod is refused (failurePolicy Fail) and any other pod is still created;
- gpusched.io/assignment and gpusched.io/allocated written by anyone but gpusched's service accounts are
  denied on create, update and binding, in every namespace, and still with the webhook down (issue 28 F3);
- a GPU pod naming another scheduler is routed to gpusched, one created with spec.nodeName is denied, and a
  namespace labelled gpusched.io/gpu-routing=disabled is left alone (issue 29 item 7).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.testenv import ControlPlane, ControlPlaneError
from webhookfixture import Webhook

pytestmark = pytest.mark.e2e

SHARE = "gpusched.io/gpu-share"
NAMESPACE = "team-a"


@pytest.fixture(scope="module")
def cluster(
    control_plane_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, Webhook]]:
    tmp = tmp_path_factory.mktemp("webhook")
    cp = ControlPlane(bin_dir=control_plane_bin, scheduler=False, controller_manager=False, kwok=False)
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the e2e control plane did not start: {exc}", pytrace=False)
    hook = Webhook(tmp, ["--scheduler-name", "gpusched"])  # the writers: deploy/manifests' service accounts
    try:
        hook.start()
        hook.register(cp)
        for ns in (NAMESPACE, "gpusched-system", "opted-out", "own-gpus"):
            cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", "opted-out", "gpusched.io/webhook=disabled")
        cp.kubectl("label", "namespace", "own-gpus", "gpusched.io/gpu-routing=disabled")
        yield cp, hook
    finally:
        hook.stop()
        cp.stop()


def pod(name: str, limits: dict[str, str], requests: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]},
    }


SCHEDULER_SA = "system:serviceaccount:gpusched-system:gpusched"
AGENT_SA = "system:serviceaccount:gpusched-node:gpusched-agent"
ASSIGNMENT = "gpusched.io/assignment"
FORGED = '{"node": "n", "gpus": [0], "milli": 1000, "memoryMiB": 0}'


def as_(user: str) -> tuple[str, ...]:
    """kubectl impersonating ``user`` with every right (group system:masters): only the name differs."""
    return ("--as", user, "--as-group", "system:masters") if user else ()


def create(
    cp: ControlPlane, body: dict[str, Any], namespace: str = NAMESPACE, as_user: str = ""
) -> subprocess.CompletedProcess[str]:
    return cp.kubectl(
        *as_(as_user), "create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(body), check=False
    )


def named(body: dict[str, Any], scheduler: str) -> dict[str, Any]:
    body["spec"]["schedulerName"] = scheduler
    return body


def placed(name: str) -> dict[str, Any]:
    """A pod as gpusched's scheduler annotates it before binding: its assignment, no spec.nodeName yet."""
    body = forged(name)
    del body["spec"]["nodeName"]
    return body


def forged(name: str) -> dict[str, Any]:
    """issue 28 F3's pod: spec.nodeName, one GPU, and an assignment of GPU 0 written by its author."""
    body = pod(name, {"nvidia.com/gpu": "1"})
    body["metadata"]["annotations"] = {ASSIGNMENT: FORGED}
    body["spec"] |= {"nodeName": "n", "schedulerName": "gpusched"}
    return body


def created(cp: ControlPlane, body: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, Any]:
    proc = create(cp, body, namespace)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def resources(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["containers"][0]["resources"])


def test_memory_only_share_gets_its_slot(cluster: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = cluster
    obj = created(cp, pod("memory-only", {"gpusched.io/gpu-memory": "8192"}))
    assert resources(obj) == {
        "limits": {"gpusched.io/gpu-memory": "8192", SHARE: "1"},
        "requests": {"gpusched.io/gpu-memory": "8192", SHARE: "1"},
    }
    obj = created(cp, pod("milli", {"gpusched.io/gpu-milli": "250", "cpu": "1"}, {"cpu": "500m"}))
    assert resources(obj)["limits"][SHARE] == "1" and resources(obj)["requests"][SHARE] == "1"
    # the object stored is the mutated one
    stored = json.loads(cp.kubectl("get", "pod", "memory-only", "-n", NAMESPACE, "-o", "json").stdout)
    assert resources(stored)["limits"][SHARE] == "1"


@pytest.mark.parametrize(
    ("name", "limits"),
    [
        ("whole", {"nvidia.com/gpu": "1"}),
        ("whole-with-memory", {"nvidia.com/gpu": "2", "gpusched.io/gpu-memory": "40960"}),
        ("no-gpu", {"cpu": "1"}),
    ],
)
def test_other_pods_are_created_as_written(
    cluster: tuple[ControlPlane, Webhook], name: str, limits: dict[str, str]
) -> None:
    cp, _ = cluster
    obj = created(cp, pod(name, limits))
    assert resources(obj)["limits"] == limits and SHARE not in resources(obj).get("requests", {})


def test_invalid_share_is_denied_naming_container_and_field(cluster: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = cluster
    proc = create(cp, pod("bad", {"gpusched.io/gpu-milli": "0"}))
    assert proc.returncode != 0
    assert 'admission webhook "gpu-share.gpusched.io" denied the request' in proc.stderr, proc.stderr
    assert "pod team-a/bad containers[0] (main): gpusched.io/gpu-milli must be 1–1000, got 0" in proc.stderr
    proc = create(cp, pod("too-much", {"gpusched.io/gpu-milli": "1500"}))
    assert "pod team-a/too-much containers[0] (main): gpusched.io/gpu-milli 1500 is more than one GPU" in (
        proc.stderr
    )
    assert cp.kubectl("get", "pod", "bad", "-n", NAMESPACE, check=False).returncode != 0


@pytest.mark.parametrize("namespace", ["kube-system", "gpusched-system", "opted-out"])
def test_excluded_namespaces_are_never_sent(cluster: tuple[ControlPlane, Webhook], namespace: str) -> None:
    cp, _ = cluster
    obj = created(cp, pod("not-sent", {"gpusched.io/gpu-milli": "0"}), namespace)  # would be denied if sent
    assert SHARE not in resources(obj)["limits"]


def test_webhook_down_refuses_share_pods_only(cluster: tuple[ControlPlane, Webhook]) -> None:
    cp, hook = cluster
    hook.stop()
    try:
        proc = create(cp, pod("share-while-down", {"gpusched.io/gpu-memory": "1024"}))
        assert proc.returncode != 0 and 'failed calling webhook "gpu-share.gpusched.io"' in proc.stderr, (
            proc.stderr
        )
        created(cp, pod("plain-while-down", {"cpu": "1"}))  # matchConditions: never sent
        created(cp, named(pod("whole-while-down", {"nvidia.com/gpu": "1"}), "gpusched"))
        proc = create(cp, pod("unrouted-while-down", {"nvidia.com/gpu": "1"}))  # it would fail on the node
        assert 'failed calling webhook "gpu-routing.gpusched.io"' in proc.stderr, proc.stderr
        # the guard fails closed: no one but gpusched writes an assignment while it is down
        proc = create(cp, forged("forged-while-down"))
        assert 'failed calling webhook "assignment-guard.gpusched.io"' in proc.stderr, proc.stderr
        assert create(cp, placed("placed-while-down"), as_user=SCHEDULER_SA).returncode == 0  # never sent
        # nor any other write of a pod: an annotation of its own, a binding without gpusched's annotations
        ok = cp.kubectl("annotate", "pod", "plain-while-down", "-n", NAMESPACE, "team=a", check=False)
        assert ok.returncode == 0, ok.stderr
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "plain-while-down"},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "n"}}  # fmt: skip
        assert create(cp, binding).returncode == 0
    finally:
        hook.start()
    created(cp, pod("share-after", {"gpusched.io/gpu-memory": "1024"}))


# ------------------------------------------------------------------------- who writes the assignment
@pytest.mark.parametrize("namespace", [NAMESPACE, "kube-system", "opted-out"])
def test_a_forged_assignment_is_denied_in_every_namespace(
    cluster: tuple[ControlPlane, Webhook], namespace: str
) -> None:
    cp, _ = cluster
    proc = create(cp, forged("forged"), namespace)
    assert proc.returncode != 0
    assert 'admission webhook "assignment-guard.gpusched.io" denied the request: gpusched-admin sets ' in (
        proc.stderr
    ), proc.stderr
    assert f"annotation {ASSIGNMENT} on pod {namespace}/forged (CREATE): only {SCHEDULER_SA}" in proc.stderr
    assert cp.kubectl("get", "pod", "forged", "-n", namespace, check=False).returncode != 0


def test_a_forged_assignment_is_denied_on_update_and_binding(cluster: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = cluster
    created(cp, pod("victim-to-be", {"cpu": "1"}))
    proc = cp.kubectl(
        "annotate", "pod", "victim-to-be", "-n", NAMESPACE, f"{ASSIGNMENT}={FORGED}", check=False
    )
    assert proc.returncode != 0 and "gpusched-admin sets annotation gpusched.io/assignment" in proc.stderr
    assert "(UPDATE)" in proc.stderr, proc.stderr
    proc = cp.kubectl(
        "annotate", "pod", "victim-to-be", "-n", NAMESPACE, "gpusched.io/allocated={}", check=False
    )
    assert proc.returncode != 0 and f"only {AGENT_SA} may write it" in proc.stderr, proc.stderr
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "victim-to-be", "annotations": {ASSIGNMENT: FORGED}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n"},
    }
    proc = create(cp, binding)
    assert proc.returncode != 0 and "on the binding of pod team-a/victim-to-be (CREATE)" in proc.stderr, (
        proc.stderr
    )
    stored = json.loads(cp.kubectl("get", "pod", "victim-to-be", "-n", NAMESPACE, "-o", "json").stdout)
    assert not stored["spec"].get("nodeName") and ASSIGNMENT not in stored["metadata"].get("annotations", {})


def test_gpuscheds_identities_write_their_annotations(cluster: tuple[ControlPlane, Webhook]) -> None:
    """The scheduler's service account writes the assignment, the agent's the allocation (neither is sent
    to the webhook); each is denied the other's."""
    cp, _ = cluster
    assert create(cp, placed("placed"), as_user=SCHEDULER_SA).returncode == 0
    allocated = 'gpusched.io/allocated={"main":{"nvidia.com/gpu":["GPU-0"]}}'
    ok = cp.kubectl(*as_(AGENT_SA), "annotate", "pod", "placed", "-n", NAMESPACE, allocated, check=False)
    assert ok.returncode == 0, ok.stderr
    proc = cp.kubectl(
        *as_(AGENT_SA), "annotate", "--overwrite", "pod", "placed", "-n", NAMESPACE, f"{ASSIGNMENT}={{}}",
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and f"{AGENT_SA} changes annotation {ASSIGNMENT}" in proc.stderr, proc.stderr
    # anyone may change the pod's other annotations
    assert cp.kubectl("annotate", "pod", "placed", "-n", NAMESPACE, "team=a", check=False).returncode == 0


# ----------------------------------------------------------------------------------- mixed schedulers
def test_gpu_pods_naming_another_scheduler_are_routed_to_gpusched(
    cluster: tuple[ControlPlane, Webhook],
) -> None:
    cp, _ = cluster
    obj = created(cp, pod("unnamed", {"nvidia.com/gpu": "1"}))
    assert obj["spec"]["schedulerName"] == "gpusched"
    assert obj["metadata"]["annotations"]["gpusched.io/routed-from"] == "default-scheduler"
    share = created(cp, named(pod("share-for-volcano", {"gpusched.io/gpu-milli": "200"}), "volcano"))
    assert share["spec"]["schedulerName"] == "gpusched" and resources(share)["limits"][SHARE] == "1"
    assert created(cp, pod("cpu-only", {"cpu": "1"}))["spec"]["schedulerName"] == "default-scheduler"
    own = created(cp, pod("own-choice", {"nvidia.com/gpu": "1"}), "own-gpus")  # the namespace opted out
    assert own["spec"]["schedulerName"] == "default-scheduler"


def test_a_gpu_pod_created_with_a_node_name_is_denied(cluster: tuple[ControlPlane, Webhook]) -> None:
    cp, _ = cluster
    body = pod("pinned", {"nvidia.com/gpu": "1"})
    body["spec"]["nodeName"] = "n"
    proc = create(cp, body)
    assert (
        proc.returncode != 0
        and 'admission webhook "gpu-routing.gpusched.io" denied the request' in proc.stderr
    )
    assert "nodeSelector kubernetes.io/hostname: n" in proc.stderr, proc.stderr
    assert create(cp, body, "own-gpus").returncode == 0  # opted out: the namespace places its GPU pods itself
