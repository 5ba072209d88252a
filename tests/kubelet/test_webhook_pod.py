"""issue 29 item 1, "(and the webhook)": the chart's webhook Deployment run as a pod from the image of
hack/build-image.sh on the session's real node, serving the session's apiserver (tests/kubelet/webhookpod.py
says what differs from an install and why), compared with the host-process webhook (tests/webhookfixture.py).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from agentpod import ImageUnavailable, image_archive
from kubeletlib import EXTENDER, STANDALONE, KubeletEnv, Ns
from webhookpod import PORT, WebhookPod

from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MEMORY, RES_MILLI, RES_SHARE
from gpusched.testenv.node import POD_SUBNET
from realparts import unavailable
from webhookfixture import Webhook

pytestmark = pytest.mark.kubelet

ADMIN = "gpusched-admin"  # the session's front ends and agent write as the control plane's admin


def _share(name: str, image: str) -> dict[str, Any]:
    """A share as users write it: gpu-milli and gpu-memory, no gpusched.io/gpu-share slot."""
    res = {RES_MILLI: "300", RES_MEMORY: "8192"}
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                 "resources": {"requests": res, "limits": res}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": STANDALONE, "containers": [container]}}  # fmt: skip


def _forged(image: str, node: str) -> dict[str, Any]:
    """A whole-GPU pod with a hand-written gpusched.io/assignment (issue 28 F3)."""
    assignment = json.dumps({"node": node, "gpus": [0], "milli": 1000, "memoryMiB": 0})
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                 "resources": {"limits": {RES_GPU: "1"}}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "forged", "annotations": {ANN_ASSIGNMENT: assignment}},
            "spec": {"nodeName": node, "containers": [container]}}  # fmt: skip


def _admitted(ns: Ns, body: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver would store (server-side dry run, every admission webhook called)."""
    out = ns.cp.kubectl(
        "create", "--dry-run=server", "-n", ns.name, "-o", "json", "-f", "-", input=json.dumps(body)
    )
    return dict(json.loads(out.stdout))


def _forge(ns: Ns, body: dict[str, Any]) -> str:
    """A user (not a writer) creates ``body``; returns kubectl's error."""
    proc = ns.cp.kubectl(
        *("--as", "alice", "--as-group", "system:masters", "create", "-n", ns.name, "-f", "-"),
        input=json.dumps(body),
        check=False,
    )
    assert proc.returncode != 0, f"a user wrote an assignment: {proc.stdout}"
    return proc.stderr.strip()


def test_the_webhook_pod_from_the_image_as_the_charts_deployment_serves_the_apiserver_as_the_host_one_does(
    kubelet_env: KubeletEnv, webhook: Webhook, ns: Ns
) -> None:
    """The chart's webhook Deployment, from the image, runs on the real node with a pod-network IP; with the
    chart's MutatingWebhookConfiguration pointed at that IP, a share written without its slot is stored with
    ``gpusched.io/gpu-share: 1`` and a user's forged ``gpusched.io/assignment`` is denied (403) by the pod
    (its log says so), both exactly as the host-process webhook answers; the session's registration is
    restored after."""
    node = kubelet_env.node
    image = node.busybox_image
    try:
        archive, ref = image_archive()
    except ImageUnavailable as e:
        unavailable(str(e))
    if ref not in node.ctr("images", "ls", "-q").stdout.split():
        out = node.ctr("images", "import", str(archive), timeout=300)
        assert out.returncode == 0, out.stderr

    share, forged = _share("share", image), _forged(image, node.name)
    by_host = (_admitted(ns, share), _forge(ns, forged))
    assert by_host[0]["spec"]["containers"][0]["resources"]["limits"].get(RES_SHARE) == "1", by_host[0]

    hook = WebhookPod(node, ref, writers=[ADMIN], scheduler_name=STANDALONE)
    try:
        hook.apply(pod_scheduler=EXTENDER)  # kube-scheduler's only profile here; the pod asks for no GPU
        pod_ip = hook.ready_pod_ip()
        assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_SUBNET), pod_ip
        config = hook.register(pod_ip)
        assert config["metadata"]["name"] == webhook.configuration()["metadata"]["name"]  # it replaces it
        urls = {h["name"]: h["clientConfig"]["url"] for h in config["webhooks"]}
        assert urls == {
            "gpu-share.gpusched.io": f"https://{pod_ip}:{PORT}/mutate",
            "assignment-guard.gpusched.io": f"https://{pod_ip}:{PORT}/guard",
            "gpu-routing.gpusched.io": f"https://{pod_ip}:{PORT}/route",
        }

        def pod_denies() -> str | None:  # the apiserver has the new configuration once the pod answers
            msg = _forge(ns, forged)
            return msg if "denied: alice sets annotation" in hook.logs() else None

        try:
            by_pod_denial = ns.wait("the apiserver calling the webhook pod", pod_denies, 30)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{hook.describe()}") from None
        by_pod = (_admitted(ns, share), by_pod_denial)
        created = ns.pod(ns.create({**share, "metadata": {"name": "share"}}))
    finally:
        webhook.register(kubelet_env.cp)  # the session's host process again, for the tests after this one
        hook.delete()

    assert "Error from server (Forbidden)" in by_pod[1], by_pod[1]  # kubectl's words for a 403
    denied = 'admission webhook "assignment-guard.gpusched.io" denied the request: alice sets annotation'
    assert denied in by_pod[1], by_pod[1]
    assert by_pod[1] == by_host[1]
    want = by_host[0]["spec"]["containers"][0]["resources"]
    assert by_pod[0]["spec"]["containers"][0]["resources"] == want
    assert created["spec"]["containers"][0]["resources"] == want
    assert want["limits"][RES_SHARE] == want["requests"][RES_SHARE] == "1", want
    assert by_pod[0]["metadata"].get("annotations") == by_host[0]["metadata"].get("annotations")
