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

import asyncio
import ssl
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson

from gpusched.core.mig.books import MigSlot
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status
from gpusched.k8s.binder import REQUEST_TIMEOUT_S, MigBooks, outcome_code
from gpusched.k8s.convert import ANN_ASSIGNMENT, assignment_annotation

CONNECTIONS = 64
"""Connections to the apiserver at most (kube-scheduler binds up to its parallelism at once)."""
USER_AGENT = "gpusched-extender"
"""How the apiserver's audit log and metrics name these requests."""


class AsyncBinder(Protocol):
    """What ``make_app`` needs of a first binder (``AsyncAPIBinder``; tests fake it)."""

    async def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status: ...

    async def close(self) -> None: ...


def binding_body(pod: PodSpec, node: str, gpus: tuple[int, ...], mig: tuple[MigSlot, ...] = ()) -> bytes:
    """The v1 Binding of ``pod`` to ``node``, the assignment of ``gpus`` and ``mig`` in its annotations."""
    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
    if pod.uid:
        meta["uid"] = pod.uid
    meta["annotations"] = {ANN_ASSIGNMENT: assignment_annotation(node, gpus, pod, mig)}
    return orjson.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


def _ssl_context(cfg: Any) -> ssl.SSLContext | bool:
    """The TLS settings of a ``kubernetes.client.Configuration``: its CA, client certificate and
    ``verify_ssl``; True (the system's defaults) when it names none."""
    if not str(cfg.host).startswith("https"):
        return False
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return ctx


class AsyncAPIBinder:
    """Binds on the running event loop; ``bind`` must be awaited on one loop only, ``close`` at the end."""

    name = "APIBinder"

    def __init__(
        self,
        cfg: Any,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        connections: int = CONNECTIONS,
        mig: MigBooks | None = None,
    ) -> None:
        """``cfg``: the ``kubernetes.client.Configuration`` of the extender's API client (its host,
        TLS files and credentials, refreshed tokens included); ``mig``: the books' MIG slices, written
        into the assignment (None: MIG slices are not placed)."""
        self.cfg = cfg
        self.mig = mig
        self.host = str(cfg.host).rstrip("/")
        self.ssl = _ssl_context(cfg)
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT}
        for auth in self.cfg.auth_settings().values():  # a bearer token (refreshed by its hook), if any
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(limit=self.connections, ssl=self.ssl, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=conn, timeout=self.timeout)
        return self._session

    async def bind(self, pod: PodSpec, node: str, gpus: tuple[int, ...]) -> Status:
        ns, name = quote(pod.namespace, safe=""), quote(pod.name, safe="")
        url = f"{self.host}/api/v1/namespaces/{ns}/pods/{name}/binding"
        mig = self.mig.mig_of(pod.key) if self.mig is not None and pod.mig else ()
        body = binding_body(pod, node, gpus, mig)
        try:
            async with self.session().post(url, data=body, headers=self._headers()) as r:
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
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector close its transports
