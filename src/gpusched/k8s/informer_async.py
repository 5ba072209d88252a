"""List + watch on an event loop, as ``informer.Reflector`` does in a thread.

The extender answers kube-scheduler on an event loop. A threaded reflector wakes for every watch
event (several per pod scheduled), takes the interpreter lock from that loop, and reads the
chunked stream in Python (urllib3). ``AsyncReflector`` reads the same watch on the loop itself,
through ``k8s.aio.AioAPI`` (aiohttp: chunked decoding in C), between two requests; its events
cost no thread switch. Its protocol is the threaded one's (``informer.apply_list``,
``informer.dispatch``): list, then watch from the list's resourceVersion with bookmarks; a watch
that ends resumes from the last version seen; ``410 Gone`` (an event or an answer) relists; any
other failure is logged and retried after ``backoff_s``.

Handlers run on the loop: they must be short and never block on I/O (``LiveCluster``'s are).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import aiohttp
import orjson
from kubernetes.client.exceptions import ApiException

from gpusched.k8s.aio import AioAPI
from gpusched.k8s.informer import Gone, Handlers, apply_list, dispatch, split_lines

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 120.0
"""A list of every node or pod (tens of MB at 5000 nodes and their pods) must arrive within this."""
READ_SLACK_S = 60.0
"""A watch that sends nothing (not even a bookmark, which the apiserver sends about once a
minute) for ``watch_timeout_s`` plus this is taken as lost and resumed."""


class AsyncReflector:
    """Keeps ``handlers`` in sync with the collection at ``path`` (e.g. ``/api/v1/pods``)."""

    def __init__(
        self,
        name: str,
        api: AioAPI,
        path: str,
        handlers: Handlers,
        *,
        field_selector: str | None = None,
        watch_timeout_s: int = 300,
        backoff_s: float = 1.0,
    ) -> None:
        self.name = name
        self.api = api
        self.path = path
        self.handlers = handlers
        self.field_selector = field_selector
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.resource_version = ""
        self.synced = threading.Event()
        """Set after the first list (a threading.Event: readiness is read from other threads)."""
        self.relists = 0
        self._task: asyncio.Task[None] | None = None

    def _params(self, **extra: str) -> dict[str, str]:
        params = {"fieldSelector": self.field_selector} if self.field_selector else {}
        params.update(extra)
        return params

    async def _get(self, params: dict[str, str], timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        resp = await self.api.session().get(
            self.api.host + self.path, params=params, headers=self.api.headers(), timeout=timeout
        )
        if resp.status >= 300:
            text = (await resp.read()).decode(errors="replace")
            resp.release()
            raise ApiException(status=resp.status, reason=f"{resp.reason}: {text[:200]}")
        return resp

    async def list_once(self) -> None:
        resp = await self._get(self._params(), aiohttp.ClientTimeout(total=LIST_TIMEOUT_S))
        try:
            data = orjson.loads(await resp.read())
        finally:
            resp.release()
        self.resource_version = apply_list(self.handlers, data)
        self.relists += 1
        self.synced.set()

    async def watch_once(self) -> None:
        params = self._params(
            watch="true",
            resourceVersion=self.resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(self.watch_timeout_s),
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.watch_timeout_s + READ_SLACK_S)
        resp = await self._get(params, timeout)
        try:
            buf = b""
            async for chunk in resp.content.iter_any():
                lines, buf = split_lines(buf, chunk)
                for line in lines:
                    self._event(line)
            if buf.strip():  # a last event without its newline
                self._event(buf)
        finally:
            resp.release()

    def _event(self, line: bytes) -> None:
        rv = dispatch(self.name, self.handlers, line)
        if rv:
            self.resource_version = rv

    async def run(self) -> None:
        while True:
            try:
                if not self.resource_version:
                    await self.list_once()
                await self.watch_once()
            except Gone:
                log.info("%s: resourceVersion expired, relisting", self.name)
                self.resource_version = ""
            except ApiException as e:
                if e.status == 410:
                    self.resource_version = ""
                else:
                    log.warning("%s: API error %s %s, retrying", self.name, e.status, e.reason)
                    await asyncio.sleep(self.backoff_s)
            except Exception as e:  # network errors, a broken line: back off and resume
                log.warning("%s: %s: %s, retrying", self.name, type(e).__name__, e)
                await asyncio.sleep(self.backoff_s)

    def start(self) -> AsyncReflector:
        """Run on the running loop until ``stop``."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"reflector-{self.name}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def reflectors_for(api: AioAPI, node_handlers: Handlers, pod_handlers: Handlers) -> list[AsyncReflector]:
    """The node and pod reflectors of a front end (not started)."""
    return [
        AsyncReflector("nodes", api, "/api/v1/nodes", node_handlers),
        AsyncReflector("pods", api, "/api/v1/pods", pod_handlers),
    ]

