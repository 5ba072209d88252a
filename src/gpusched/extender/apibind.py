"""``/bind``'s first binding attempt, on the extender's event loop (aiohttp, kept-alive connections).

kube-scheduler runs its binding cycles in parallel goroutines, so ``/bind`` requests arrive many at
once. Sent from a thread pool through the ``kubernetes`` client, each costs a thread switch, the
client's serialisation and, as its response is never released to urllib3's pool, a TLS handshake;
those threads also take the GIL from the loop that answers kube-scheduler's ``/filter`` and
``/prioritize``, which sit on its serial scheduling cycle. Here the Binding goes out as one
``POST pods/<name>/binding`` from the loop itself, over connections kept alive between bindings.

The request is the one ``k8s.binder.APIBinder`` sends with ``in_binding=True`` (the assignment
annotation in the Binding's metadata, which the apiserver copies onto the pod in the write that
sets ``spec.nodeName``; the pod's UID as a precondition), and its answer reads the same: SUCCESS,
or the code of ``k8s.binder.outcome_code`` with ``<status> <reason>: <message>``; no answer (a
connection lost, a timeout) is ERROR, an unknown outcome. Anything but SUCCESS goes on to the
extender's threaded binding loop (``Extender.call_binder``), which settles unknown outcomes by
reading the pod back and binds again with ``APIBinder``: the retries and their rules are unchanged.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson

from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.k8s.aio import CONNECTIONS, AioAPI
from gpusched.k8s.binder import REQUEST_TIMEOUT_S, outcome_code
from gpusched.k8s.convert import ANN_ASSIGNMENT, assignment_annotation

USER_AGENT = "gpusched-extender"
"""How the apiserver's audit log and metrics name these requests."""


class AsyncBinder(Protocol):
    """What ``make_app`` needs of a first binder (``AsyncAPIBinder``; tests fake it)."""

    async def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status: ...

    async def close(self) -> None: ...


def binding_body(pod: PodSpec, node: str, gpus: tuple[int, ...]) -> bytes:
    """The v1 Binding of ``pod`` to ``node``, the assignment of ``gpus`` in its annotations."""
    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
    if pod.uid:
        meta["uid"] = pod.uid
    meta["annotations"] = {ANN_ASSIGNMENT: assignment_annotation(node, gpus, pod)}
    return orjson.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


class AsyncAPIBinder:
    """Binds on the running event loop; ``bind`` must be awaited on one loop only, ``close`` at the end."""

    name = "APIBinder"

    def __init__(
        self,
        cfg: Any,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        connections: int = CONNECTIONS,
        api: AioAPI | None = None,
    ) -> None:
        """``cfg``: the ``kubernetes.client.Configuration`` of the extender's API client (its host,
        TLS files and credentials, refreshed tokens included); ``api``: a session to share (the
        extender's watches run on it too), else one of its own, closed by ``close``."""
        self.api = api or AioAPI(cfg, user_agent=USER_AGENT, connections=connections)
        self._owns = api is None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status:
        ns, name = quote(pod.namespace, safe=""), quote(pod.name, safe="")
        url = f"{self.api.host}/api/v1/namespaces/{ns}/pods/{name}/binding"
        body = binding_body(pod, node, gpus)
        headers = self.api.headers("application/json")
        try:
            async with self.api.session().post(url, data=body, headers=headers, timeout=self.timeout) as r:
                status, reason, body = r.status, r.reason or "", await r.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:  # no answer: the outcome is unknown
            return Status(Code.ERROR, (f"{type(e).__name__}: {e}",), self.name)
        if 200 <= status < 300:
            return Status.success()
        try:
            msg = orjson.loads(body).get("message") if body else None
        except (orjson.JSONDecodeError, AttributeError):
            msg = None
        text = f"{status} {reason}: {msg or body.decode(errors='replace')}".strip(": ")
        return Status(outcome_code(status), (text,), self.name)

    async def close(self) -> None:
        if self._owns:
            await self.api.close()
