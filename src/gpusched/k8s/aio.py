"""The kube-apiserver over aiohttp, for the calls a front end makes on its event loop.

``AioAPI`` takes the host, TLS files and credentials of a ``kubernetes.client.Configuration``
(the one ``k8s.client.api_client`` loads from a kubeconfig or the in-cluster service account) and
keeps one ``aiohttp.ClientSession`` whose connections stay alive between calls. The extender
sends its bindings (``extender.apibind``) and runs its watches (``k8s.informer_async``) through
it, on the loop that answers kube-scheduler: no thread, and so no hand-over of the interpreter
lock, per call or per watch event.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp

CONNECTIONS = 64
"""Connections to the apiserver at most (the extender binds up to kube-scheduler's parallelism
at once, beside its two watches)."""


def ssl_context(cfg: Any) -> ssl.SSLContext | bool:
    """The TLS settings of a ``kubernetes.client.Configuration``: its CA, client certificate and
    ``verify_ssl``; False for a plain-HTTP host."""
    if not str(cfg.host).startswith("https"):
        return False
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return ctx


class AioAPI:
    """One session to the apiserver of ``cfg``; use it on one event loop, ``close`` it at the end."""

    def __init__(self, cfg: Any, *, user_agent: str, connections: int = CONNECTIONS) -> None:
        self.cfg = cfg
        self.host = str(cfg.host).rstrip("/")
        self.ssl = ssl_context(cfg)
        self.user_agent = user_agent
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        """Accept JSON, uncompressed, the user agent, and the bearer token if the configuration has
        one (read on each call: a token refreshed by the configuration's hook is picked up).
        ``identity``: aiohttp would otherwise accept gzip, and the apiserver would compress every
        answer over 128 KB and, since 1.37 (``WatchListCompression``), every watch event, one gzip
        member each (kube-rs/kube#2079): CPU on both ends, for bytes that cross a local link.
        The ``kubernetes`` client never asks for it either."""
        headers = {"Accept": "application/json", "Accept-Encoding": "identity", "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        for auth in self.cfg.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def session(self) -> aiohttp.ClientSession:
        """The session (created on first use, on the running loop), without a default timeout:
        each call sets its own."""
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(limit=self.connections, ssl=self.ssl, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector close its transports
