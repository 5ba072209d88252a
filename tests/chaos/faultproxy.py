"""A fault-injecting HTTPS proxy between a front end and the test control plane's kube-apiserver.

Test infrastructure (not a product adapter). The proxy terminates TLS with a certificate of its own CA for
127.0.0.1, forwards every request to the real apiserver with the admin client certificate, streams the
response back (watches included, chunk by chunk), and, for requests that match a ``Rule``, injects a fault:

* ``AFTER``: forward the request, wait for the apiserver's answer (the write is committed, or refused),
  then drop the client's connection without returning it. The client sees ``Connection aborted`` / a
  remote disconnect although the API did what it asked: an ambiguous outcome.
* ``BEFORE``: drop the client's connection without forwarding anything: nothing is committed.
* ``DELAY``: hold the request ``delay_s`` seconds, then forward it (e.g. an informer's list that takes
  seconds, as in a big cluster).

A rule may also break every watch stream open through the proxy when it faults (``sever_watches``), as a
broken connection to the apiserver does.

Which matching requests fault is decided in the order they arrive, by their 1-based index (``nth``,
``every``) or a seeded coin (``probability``, ``seed``), so a run is reproducible up to request order.

    proxy = FaultProxy.for_control_plane(cp, tmp_path, rules=[binding_rule(Fault.AFTER, every=5)]).start()
    kubeconfig = proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")  # give this to the front end
    ...
    proxy.enabled = False   # stop injecting; requests still flow
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import json
import random
import re
import ssl
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

from gpusched.testenv import ControlPlane, generate_pki

#: ``POST`` here binds a pod: ``.../bindings`` (the pod named in the Binding) or ``.../pods/<name>/binding``.
BINDING_PATH = r"/api/v1/namespaces/[^/]+/(?:bindings|pods/[^/]+/binding)"
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)  # fmt: skip


class Fault(enum.Enum):
    AFTER = "after"
    """Forward, let the apiserver answer, then drop the client's connection (committed; the client errs)."""
    BEFORE = "before"
    """Drop the client's connection without forwarding (not committed)."""
    DELAY = "delay"
    """Hold the request ``Rule.delay_s`` seconds, then forward it (a slow apiserver, a big list)."""
    LAG = "lag"
    """Forward at once, and hand each piece of the answer on ``Rule.delay_s`` seconds after it came
    (a watch whose client sees every event that late: an informer behind the others)."""


@dataclass
class Rule:
    """Which requests fault, and how. ``path`` is a regular expression matched against the whole path
    (no query). Of the matching requests (counted from 1 in arrival order), those in ``nth``, every
    ``every``-th one, and each with probability ``probability`` (a coin seeded by ``seed``) fault, at most
    ``limit`` times."""

    mode: Fault
    method: str = "POST"
    path: str = BINDING_PATH
    nth: frozenset[int] = frozenset()
    every: int = 0
    probability: float = 0.0
    seed: int = 0
    limit: int | None = None
    watch: bool | None = None
    """Match only watches (True), only other requests (False: e.g. the list of an informer), or both."""
    delay_s: float = 0.0
    """How long a ``DELAY`` fault holds the request."""
    sever_watches: bool = False
    """On a fault, first break every watch stream open through the proxy, as when the connection to the
    apiserver breaks: the client learns what the faulted request did only after it re-watches (client-go
    and gpusched's reflector back off about a second), so its books run on without that change meanwhile."""
    matched: int = 0
    faulted: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _re: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._re = re.compile(self.path)

    def matches(self, method: str, path: str, watch: bool = False) -> bool:
        return (
            method.upper() == self.method.upper()
            and self._re.fullmatch(path) is not None
            and (self.watch is None or self.watch == watch)
        )

    def roll(self) -> bool:
        """Count one more matching request and say whether this rule would fault it."""
        self.matched += 1
        n = self.matched
        coin = self._rng.random() < self.probability if self.probability > 0 else False
        hit = n in self.nth or (self.every > 0 and n % self.every == 0) or coin
        return hit and (self.limit is None or self.faulted < self.limit)


def binding_rule(mode: Fault, **kw: Any) -> Rule:
    """A rule on the calls that bind a pod (``POST .../bindings``, ``POST .../pods/<name>/binding``)."""
    return Rule(mode, "POST", BINDING_PATH, **kw)


@dataclass(frozen=True)
class FaultRecord:
    mode: Fault
    method: str
    path: str
    status: int | None
    """The apiserver's answer (AFTER), None when the request was never forwarded (BEFORE)."""
    pod: str
    """``namespace/name`` of the pod the request is about (from the path, or a Binding's body), else ""."""


def _pod_of(path: str, body: bytes) -> str:
    m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(?:/.*)?", path)
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/bindings", path)
    if m and body:
        try:
            return f"{m.group(1)}/{json.loads(body)['metadata']['name']}"
        except (ValueError, KeyError, TypeError):
            pass
    return ""


async def _write_late(up: Any, resp: web.StreamResponse, lag_s: float) -> None:
    """Each chunk of ``up`` written to ``resp`` ``lag_s`` seconds after it arrived, in order (a
    reader keeps reading meanwhile, so the lags do not add up)."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def read() -> None:
        try:
            async for chunk in up.content.iter_any():
                pieces.put_nowait((loop.time(), chunk))
        finally:
            pieces.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (piece := await pieces.get()) is not None:
            came, chunk = piece
            await asyncio.sleep(max(0.0, came + lag_s - loop.time()))
            await resp.write(chunk)
    finally:  # also when the handler is closed with the proxy's loop already closed (RuntimeError)
        with contextlib.suppress(asyncio.CancelledError, ClientError, OSError, RuntimeError):
            reader.cancel()
            await reader


class _Dropped(Exception):
    """The client's connection was dropped on purpose."""


class FaultProxy:
    """See the module docstring. Runs its own event loop in a daemon thread (``start``/``stop``)."""

    def __init__(
        self,
        upstream: str,
        upstream_ssl: ssl.SSLContext,
        serving_ssl: ssl.SSLContext,
        ca_pem: bytes,
        client_cert_pem: bytes,
        client_key_pem: bytes,
        rules: Iterable[Rule] = (),
        host: str = "127.0.0.1",
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.rules = list(rules)
        self.enabled = True
        self.faults: list[FaultRecord] = []
        self.requests = 0
        self.upstream_errors = 0
        self.host = host
        self.port = 0
        self._upstream_ssl = upstream_ssl
        self._serving_ssl = serving_ssl
        self._ca_pem, self._client_cert_pem, self._client_key_pem = ca_pem, client_cert_pem, client_key_pem
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._watches: set[asyncio.Transport] = set()
        self._lagging: set[asyncio.Task[Any]] = set()
        """The handlers writing a ``LAG`` answer: cancelled (and awaited) on ``stop``."""
        self.watches_severed = 0

    # -------------------------------------------------------------- construction
    @classmethod
    def for_control_plane(
        cls, cp: ControlPlane, workdir: Path, rules: Iterable[Rule] = (), kubeconfig: Path | None = None
    ) -> FaultProxy:
        """A proxy in front of ``cp``'s apiserver, forwarding as the identity of ``kubeconfig`` (default
        the admin's). It serves a certificate of a CA of its own (made under ``workdir``), for 127.0.0.1."""
        kc = json.loads(Path(kubeconfig or cp.kubeconfig_path).read_text())
        user = kc["users"][0]["user"]
        cert_pem = base64.b64decode(user["client-certificate-data"])
        key_pem = base64.b64decode(user["client-key-data"])
        ca_pem = base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"])
        pki = generate_pki(workdir / "faultproxy-pki")
        up = ssl.create_default_context(cadata=ca_pem.decode())
        with tempfile.TemporaryDirectory() as d:  # ssl wants files for the client certificate
            (Path(d) / "c.crt").write_bytes(cert_pem)
            (Path(d) / "c.key").write_bytes(key_pem)
            up.load_cert_chain(str(Path(d) / "c.crt"), str(Path(d) / "c.key"))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
        return cls(cp.server, up, serving, pki.ca_cert.read_bytes(), cert_pem, key_pem, rules)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig that reaches the apiserver through this proxy (its CA, the client identity)."""

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "faultproxy",
                    "cluster": {"server": self.url, "certificate-authority-data": b64(self._ca_pem)},
                }
            ],
            "users": [
                {
                    "name": "client",
                    "user": {
                        "client-certificate-data": b64(self._client_cert_pem),
                        "client-key-data": b64(self._client_key_pem),
                    },
                }
            ],
            "contexts": [{"name": "faultproxy", "context": {"cluster": "faultproxy", "user": "client"}}],
            "current-context": "faultproxy",
        }

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps(self.kubeconfig(), indent=2))
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------------ counters
    def faulted(self, mode: Fault | None = None) -> list[FaultRecord]:
        with self._lock:
            return [f for f in self.faults if mode is None or f.mode == mode]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "requests": self.requests,
                "faults_after": sum(1 for f in self.faults if f.mode == Fault.AFTER),
                "faults_before": sum(1 for f in self.faults if f.mode == Fault.BEFORE),
                "faults_delay": sum(1 for f in self.faults if f.mode == Fault.DELAY),
                "faults_lag": sum(1 for f in self.faults if f.mode == Fault.LAG),
                "upstream_errors": self.upstream_errors,
                "watches_severed": self.watches_severed,
            }

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the fault proxy did not start")
        if self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error}") from self._error
        return self

    def stop(self, timeout: float = 15.0) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
        self._thread.join(timeout)
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._session = ClientSession(
            connector=TCPConnector(ssl=self._upstream_ssl, limit=0),
            timeout=ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, ssl_context=self._serving_ssl)
        await site.start()
        server = getattr(site, "_server", None)
        self.port = int(server.sockets[0].getsockname()[1]) if server is not None else 0

    async def _shutdown(self) -> None:
        for task in list(self._lagging):  # waiting for their next piece: they would outlive the loop
            task.cancel()
        await asyncio.gather(*self._lagging, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

    # ------------------------------------------------------------------- serving
    def _decide(self, method: str, path: str, watch: bool) -> Rule | None:
        with self._lock:
            self.requests += 1
            if not self.enabled:
                return None
            chosen: Rule | None = None
            for rule in self.rules:  # every matching rule counts the request; the first that hits wins
                if rule.matches(method, path, watch) and rule.roll() and chosen is None:
                    chosen = rule
            if chosen is None:
                return None
            chosen.faulted += 1
            return chosen

    def _drop(self, request: web.BaseRequest, record: FaultRecord) -> None:
        with self._lock:
            self.faults.append(record)
        transport = request.transport
        if transport is not None:
            transport.abort()  # no response, no TLS close_notify: the connection just dies
        raise _Dropped(record.path)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._forward(request)
        except _Dropped:
            # aiohttp must not try to answer on the dead connection: an empty, already-closed response
            raise asyncio.CancelledError from None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        is_watch = request.query.get("watch") in ("true", "1")
        rule = self._decide(request.method, request.path, is_watch)
        fault = rule.mode if rule is not None else None
        pod = _pod_of(request.path, body) if rule is not None else ""
        if rule is not None and rule.sever_watches:
            self._sever_watches()
        if fault == Fault.BEFORE:
            self._drop(request, FaultRecord(Fault.BEFORE, request.method, request.path, None, pod))
        if rule is not None and fault == Fault.DELAY:
            with self._lock:
                self.faults.append(FaultRecord(Fault.DELAY, request.method, request.path, None, pod))
            await asyncio.sleep(rule.delay_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        watch = request.transport if is_watch else None
        if watch is not None:
            self._watches.add(watch)
        try:
            async with self._session.request(
                request.method,
                URL(self.upstream + request.raw_path, encoded=True),  # the request target exactly as sent
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
                # the kubernetes client sends bodies without a Content-Type (the apiserver assumes JSON);
                # aiohttp would add application/octet-stream, which the apiserver refuses (415)
                skip_auto_headers=() if "Content-Type" in request.headers else ("Content-Type",),
            ) as up:
                if fault == Fault.AFTER:
                    await up.read()  # the apiserver answered: whatever it did is done
                    self._drop(
                        request, FaultRecord(Fault.AFTER, request.method, request.path, up.status, pod)
                    )
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in _HOP_BY_HOP:
                        resp.headers.add(k, v)
                await resp.prepare(request)
                if rule is not None and fault == Fault.LAG:
                    with self._lock:
                        self.faults.append(
                            FaultRecord(Fault.LAG, request.method, request.path, up.status, pod)
                        )
                    task = asyncio.current_task()
                    assert task is not None
                    self._lagging.add(task)
                    try:
                        await _write_late(up, resp, rule.delay_s)
                    finally:
                        self._lagging.discard(task)
                else:
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (ClientError, OSError) as e:
            if request.transport is None or request.transport.is_closing():
                # the client went away (it was killed, or its watch severed): nobody to answer
                raise asyncio.CancelledError from None
            with self._lock:
                self.upstream_errors += 1
            return web.Response(status=502, text=f"faultproxy: upstream error: {e}")
        finally:
            if watch is not None:
                self._watches.discard(watch)

    def _sever_watches(self) -> None:
        """Abort every watch stream (on the event loop's thread, as every handler runs)."""
        for transport in list(self._watches):
            transport.abort()
        with self._lock:
            self.watches_severed += len(self._watches)
        self._watches.clear()
