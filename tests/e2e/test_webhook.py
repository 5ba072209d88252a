"""The mutating webhook called by a real kube-apiserver, configured as deploy/manifests/webhook/ configures it
(rules, failurePolicy, namespaceSelector, matchConditions), only its clientConfig pointed at a webhook process
on loopback whose certificate comes from a CA made here (the caBundle).

- a pod with only gpusched.io/gpu-memory is created with gpusched.io/gpu-share: 1 in limits and requests;
- pods that ask for no share (whole GPUs, no GPU) are created as written;
- an invalid share is refused with the webhook's message naming the container and the field;
- kube-system, gpusched-system and namespaces labelled gpusched.io/webhook=disabled are never sent;
- with the webhook down, a share pod is refused (failurePolicy Fail) and any other pod is still created.
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
    hook = Webhook(tmp)
    try:
        hook.start()
        hook.register(cp)
        for ns in (NAMESPACE, "gpusched-system", "opted-out"):
            cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", "opted-out", "gpusched.io/webhook=disabled")
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


def create(
    cp: ControlPlane, body: dict[str, Any], namespace: str = NAMESPACE
) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(body), check=False)


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
        created(cp, pod("whole-while-down", {"nvidia.com/gpu": "1"}))
    finally:
        hook.start()
    created(cp, pod("share-after", {"gpusched.io/gpu-memory": "1024"}))
