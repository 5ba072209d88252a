"""The mutating webhook without a control plane: the JSONPatch it makes (applied here), its denials, and
its HTTPS server (aiohttp, with a certificate of a CA made here)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.allocation import RES_SHARE as AGENT_RES_SHARE
from gpusched.k8s.convert import RES_SHARE, InvalidRequest
from gpusched.webhook.mutate import review, share_patch


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", **meta}, "spec": spec}


def ctr(
    name: str = "c", limits: dict[str, str] | None = None, requests: dict[str, str] | None = None
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "image": "x", "resources": res}


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 'add' (all the webhook emits), strictly: the parent must exist, as the API server
    requires."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] == "add", op
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        assert isinstance(target, dict), op
        target[parts[-1]] = op["value"]
    return out


def resources(doc: dict[str, Any], i: int = 0, kind: str = "containers") -> dict[str, Any]:
    return dict(doc["spec"][kind][i]["resources"])


def test_share_names_agree_with_the_agent() -> None:
    assert RES_SHARE == AGENT_RES_SHARE == "gpusched.io/gpu-share"


@pytest.mark.parametrize(
    "limits",
    [
        {"gpusched.io/gpu-memory": "8192"},  # a memory-only share
        {"gpusched.io/gpu-milli": "300"},
        {"gpusched.io/gpu-milli": "300", "gpusched.io/gpu-memory": "8192", "cpu": "1"},
        {"gpusched.io/gpu-milli": "1000"},  # one whole GPU asked by milli: still through a slot
    ],
)
def test_share_container_gets_its_slot_in_limits_and_requests(limits: dict[str, str]) -> None:
    p = pod(ctr(limits=limits, requests={"cpu": "1"}))
    out = apply(p, share_patch(p))
    assert resources(out) == {
        "limits": {**limits, RES_SHARE: "1"},
        "requests": {"cpu": "1", RES_SHARE: "1"},
    }


def test_missing_maps_are_created() -> None:
    p = pod(ctr(limits={"gpusched.io/gpu-memory": "1Gi"}))  # no requests map (defaulted from limits)
    assert resources(apply(p, share_patch(p)))["requests"] == {RES_SHARE: "1"}
    p = pod(ctr(requests={"gpusched.io/gpu-milli": "200"}))
    assert resources(apply(p, share_patch(p)))["limits"] == {RES_SHARE: "1"}


def test_every_share_container_and_init_container_gets_one_and_others_none() -> None:
    p = pod(
        ctr("a", limits={"gpusched.io/gpu-milli": "200"}),
        ctr("plain", limits={"cpu": "1"}),
        ctr("b", limits={"gpusched.io/gpu-memory": "4096"}),
        init=[ctr("init", limits={"gpusched.io/gpu-milli": "100"})],
    )
    out = apply(p, share_patch(p))
    assert resources(out, 0)["limits"][RES_SHARE] == "1" and resources(out, 2)["limits"][RES_SHARE] == "1"
    assert RES_SHARE not in resources(out, 1)["limits"]
    assert resources(out, 0, "initContainers")["requests"] == {RES_SHARE: "1"}


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": "2"},
        {"nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "40960"},  # whole GPUs of at least 40 GiB
        {"cpu": "2", "memory": "1Gi"},
        {"gpusched.io/gpu-milli": "300", RES_SHARE: "1"},  # already carries its slot
    ],
)
def test_other_pods_are_left_untouched(limits: dict[str, str]) -> None:
    p = pod(ctr(limits=limits))
    assert share_patch(p) == []
    answer = review(admission(p))["response"]
    assert answer["allowed"] is True and "patch" not in answer


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"gpusched.io/gpu-milli": "0"},
            "pod ns/p containers[1] (worker): gpusched.io/gpu-milli must be 1–1000, got 0",
        ),
        (
            {"gpusched.io/gpu-milli": "1500"},
            "pod ns/p containers[1] (worker): gpusched.io/gpu-milli 1500 is more than one GPU (1000)",
        ),
        (
            {"gpusched.io/gpu-memory": "0"},
            "pod ns/p containers[1] (worker): gpusched.io/gpu-memory must be at least 1 (MiB), got 0",
        ),
        (
            {"gpusched.io/gpu-milli": "300", "nvidia.com/gpu": "1"},
            "pod ns/p containers[1] (worker): a GPU share (gpusched.io/gpu-milli 300) needs no "
            "nvidia.com/gpu",
        ),
        (
            {"gpusched.io/gpu-milli": "300", RES_SHARE: "2"},
            "pod ns/p containers[1] (worker): resources.limits.gpusched.io/gpu-share must be 1",
        ),
        (
            {"gpusched.io/gpu-memory": "1.5"},
            "pod ns/p containers[1] (worker) gpusched.io/gpu-memory: 1.5 must be a whole number",
        ),
    ],
)
def test_invalid_share_is_denied_naming_container_and_field(limits: dict[str, str], message: str) -> None:
    p = pod(ctr("sidecar", limits={"cpu": "1"}), ctr("worker", limits=limits))
    with pytest.raises(InvalidRequest) as info:
        share_patch(p)
    assert str(info.value).startswith(message), str(info.value)
    answer = review(admission(p))["response"]
    assert answer["allowed"] is False and answer["status"]["message"] == str(info.value)
    assert answer["status"]["code"] == 400 and "patch" not in answer


def test_shares_of_a_pod_adding_up_to_more_than_a_gpu_are_denied() -> None:
    p = pod(
        ctr("a", limits={"gpusched.io/gpu-milli": "600"}), ctr("b", limits={"gpusched.io/gpu-milli": "600"})
    )
    with pytest.raises(InvalidRequest, match=r"pod ns/p: gpusched.io/gpu-milli 1200 is more than one GPU"):
        share_patch(p)


def test_generated_names_and_the_request_namespace_name_the_pod() -> None:
    p = pod(ctr("w", limits={"gpusched.io/gpu-milli": "0"}))
    p["metadata"] = {"generateName": "job-"}
    body = admission(p)
    body["request"]["namespace"] = "team-a"
    answer = review(body)["response"]
    assert answer["status"]["message"].startswith("pod team-a/job-<generated> containers[0] (w):")
    assert p["metadata"] == {"generateName": "job-"}  # the object itself is not changed


def admission(p: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "operation": operation,
            "namespace": "ns",
            "object": p,
        },
    }


def test_review_answers_with_a_base64_jsonpatch() -> None:
    p = pod(ctr(limits={"gpusched.io/gpu-memory": "8192"}, requests={"gpusched.io/gpu-memory": "8192"}))
    answer = review(admission(p))
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops == [
        {"op": "add", "path": "/spec/containers/0/resources/limits/gpusched.io~1gpu-share", "value": "1"},
        {"op": "add", "path": "/spec/containers/0/resources/requests/gpusched.io~1gpu-share", "value": "1"},
    ]


def test_review_lets_other_operations_and_kinds_pass() -> None:
    bad = pod(ctr(limits={"gpusched.io/gpu-milli": "0"}))
    for body in (admission(bad, "UPDATE"), admission(bad, kind="Deployment")):
        assert review(body)["response"] == {"uid": body["request"]["uid"], "allowed": True}
    with pytest.raises(ValueError, match=r"request\.uid"):
        review({"kind": "AdmissionReview"})


# ------------------------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("cryptography")
    from gpusched.testenv.pki import generate_pki

    return generate_pki(tmp_path_factory.mktemp("pki"), backend="cryptography")


def test_https_server(tls: Any) -> None:
    from aiohttp import ClientSession, TCPConnector, web

    from gpusched.webhook.server import MAX_BODY_BYTES, CertReloader, make_app

    certs = CertReloader(Path(tls.serving_cert), Path(tls.serving_key))
    client_ctx = ssl.create_default_context(cafile=str(tls.ca_cert))

    async def scenario() -> None:
        runner = web.AppRunner(make_app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certs.context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"https://127.0.0.1:{port}"
        try:
            async with ClientSession(connector=TCPConnector(ssl=client_ctx)) as s:
                async with s.get(f"{url}/healthz") as r:
                    assert r.status == 200 and await r.text() == "ok"
                p = pod(ctr(limits={"gpusched.io/gpu-milli": "250"}))
                async with s.post(f"{url}/mutate", json=admission(p)) as r:
                    assert r.status == 200
                    response = (await r.json())["response"]
                    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
                async with s.post(f"{url}/mutate", data=b"{not json") as r:
                    assert r.status == 400 and "bad AdmissionReview" in (await r.json())["error"]
                async with s.post(f"{url}/mutate", json={"request": {}}) as r:
                    assert r.status == 400 and "request.uid" in (await r.json())["error"]
                async with s.post(f"{url}/mutate", data=b" " * (MAX_BODY_BYTES + 1)) as r:
                    assert r.status == 413
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert certs.reload() is False  # unchanged files are not read again
