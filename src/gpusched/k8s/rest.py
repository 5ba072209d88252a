"""The API calls on the front ends' hot path, without the generated client's per-call work.

Every pod the standalone scheduler places costs a binding, a ``Scheduled`` event and, when the
binding's outcome is unknown, a read-back. The ``kubernetes`` client validates each call's
arguments with pydantic, serialises the body through its model layer and builds the request
in several layers: about 0.2 ms of CPU per call before a byte is sent, on a machine where the
apiserver needs that CPU. ``FastCoreV1`` sends the same requests on the same connection pool
(``ApiClient.rest_client.pool_manager``: the kubeconfig's TLS settings, client certificate,
proxy and pool size), with the same authentication headers (``update_params_for_auth``:
bearer tokens, refreshed as the client refreshes them), a body serialised by orjson, and
answers read whole.

The benchmarks create their pods through it too (``create_namespaced_pod``): creating 50 pods/s
with the generated client, ``bench k8s --compare``'s own process took 0.35-0.47 of a core (its
watch included), CPU taken from the schedulers being measured; through this, 0.08.

It offers the ``CoreV1Api`` methods the hot path calls, under their names and positional
arguments, so that the binder, the event recorder and the read-back take either. A call
answered with a status outside 2xx raises ``ApiException`` with that status, reason and body,
as the client does; a call without an answer raises urllib3's error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class FastCoreV1:
    """``CoreV1Api``'s hot calls on ``api``'s connection pool (module doc)."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api
        self._pool: urllib3.PoolManager = api.rest_client.pool_manager
        self._host = str(api.configuration.host).rstrip("/")
        self._user_agent = str(api.user_agent)

    def _call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        headers = {"Accept": JSON, "User-Agent": self._user_agent}
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        self._api.update_params_for_auth(headers, [], ["BearerToken"], path, method, body)
        resp = self._pool.request(
            method,
            self._host + path,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout) if timeout else None,
            preload_content=True,
        )
        if not 200 <= resp.status < 300:
            raise ApiException(
                status=resp.status, reason=resp.reason, body=resp.data.decode(errors="replace")
            )
        return resp

    @staticmethod
    def _pod_path(namespace: str, name: str = "", sub: str = "") -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        if name:
            path += f"/{quote(name, safe='')}"
        return f"{path}/{sub}" if sub else path

    # ------------------------------------------------- CoreV1Api's names
    def create_namespaced_binding(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: float | None = None, **_: Any
    ) -> urllib3.BaseHTTPResponse:
        name = str((body.get("metadata") or {}).get("name", ""))
        return self._call("POST", self._pod_path(namespace, name, "binding"), body, timeout=_request_timeout)

    def patch_namespaced_pod(
        self, name: str, namespace: str, body: object, *, _request_timeout: float | None = None, **_: Any
    ) -> urllib3.BaseHTTPResponse:
        return self._call(
            "PATCH",
            self._pod_path(namespace, name),
            body,
            content_type=STRATEGIC_MERGE,
            timeout=_request_timeout,
        )

    def patch_namespaced_pod_status(
        self, name: str, namespace: str, body: object, *, _request_timeout: float | None = None, **_: Any
    ) -> urllib3.BaseHTTPResponse:
        return self._call(
            "PATCH",
            self._pod_path(namespace, name, "status"),
            body,
            content_type=STRATEGIC_MERGE,
            timeout=_request_timeout,
        )

    def read_namespaced_pod(
        self, name: str, namespace: str, *, _request_timeout: float | None = None, **_: Any
    ) -> urllib3.BaseHTTPResponse:
        return self._call("GET", self._pod_path(namespace, name), timeout=_request_timeout)

    def create_namespaced_pod(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: float | None = None, **_: Any
    ) -> urllib3.BaseHTTPResponse:
        return self._call("POST", self._pod_path(namespace), body, timeout=_request_timeout)

    def create_namespaced_event(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: float | None = None, **_: Any
    ) -> urllib3.BaseHTTPResponse:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/events"
        return self._call("POST", path, body, timeout=_request_timeout)
