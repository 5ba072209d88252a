"""The extender's HTTP server (aiohttp): the four verbs, health, readiness and metrics.

- ``POST /filter``, ``/prioritize``, ``/preempt``: decided on the event loop; the numpy work
  runs under ``LiveCluster``'s lock for about a millisecond and never awaits while holding it.
  A preemptor failing on its node reads that node's pods from the API in the thread pool first
  (``Extender.node_to_recheck``): the books may still hold victims kube-scheduler has deleted.
- ``POST /bind``: the GPUs are chosen and booked under the lock, then the Binding (which carries
  the assignment annotation) is sent without it: from the loop itself over kept-alive
  connections when a ``first_binder`` is set (``apibind``; what gpusched extender does), so
  kube-scheduler's parallel binding cycles proceed in parallel here too; a binding that attempt
  does not complete, and every binding without a ``first_binder``, runs its attempts, retries and
  read-backs in a thread pool, and the loop keeps serving filters meanwhile.
- ``GET /healthz`` (the process is up), ``/readyz`` (the informers have synced: 503 before),
  ``/metrics`` (Prometheus), ``/state`` (a JSON summary of the books, for operators and tests).

Before answering, each verb waits (without blocking the loop) for the books to be whole: until
``ready()`` (the informers have listed every node and pod) or ``sync_wait_s``; then it refuses
with an ``Error`` saying so, as ``protocol`` describes. Without that, an extender restarted
under a running kube-scheduler would book GPUs from empty books, on GPUs already taken.

Bodies: over ``max_body_bytes`` → HTTP 413 (from ``Content-Length`` before anything is read, or
as soon as a chunked body passes it). A body of more than ``LARGE_BODY_BYTES`` is read, parsed,
answered and written holding one of ``LARGE_BODIES`` slots, within ``body_timeout_s`` for the
slot and the read (HTTP 408 after) and as long again for the write (the connection is closed
after): so however many clients send big bodies at once, at most ``LARGE_BODIES`` of them are
in memory, each in one buffer of its declared length; after the last one the freed memory is
handed back to the system (glibc's ``malloc_trim``), which it otherwise keeps.

Malformed HTTP never reaches a handler: aiohttp 3.14's parser (llhttp, C) answers
``HTTP/1.0 400 Bad Request`` in text/plain, naming the fault, and closes: garbage bytes, a bad
request line, method or version, a header without a colon or with a control character, a bad,
duplicate or negative Content-Length, Content-Length with Transfer-Encoding, a bad chunk size,
a line or header over 8190 bytes, too many headers, bare LF line ends, TLS on the HTTP port.
It answers nothing, by design, to: empty lines before a request line (RFC 9112 §2.2: ignored,
it waits for the request); an incomplete request line or headers (it waits for the rest:
aiohttp has no timeout of its own for headers); ``GET /`` with no version, taken as
HTTP/0.9 (served, with an ``HTTP/0.9`` status line). A valid request followed by garbage in the
same packet loses the valid request's answer: the parse error replaces the whole batch. A body
that stops coming, or a malformed chunk once the handler reads (aiohttp then leaves the body
unfinished), is answered HTTP 408 here after ``body_timeout_s``; a client gone mid-body gets
nothing (logged as nothing: nobody reads the answer).

The shape: four aiohttp middlewares around the verbs, outside in (``MIDDLEWARES``):
``observe_duration`` (the request-duration histogram), ``answer_errors`` (errors as JSON),
``admit`` (the declared-size limit, then the wait for the books) and ``hold_large_bodies``; they
act on the four verb routes only (named by verb), and read what they hold (``Admission``,
``LargeBodies``) from the app. The verbs' handlers are ``Verbs``' methods; health, readiness,
metrics and state are plain functions.

Answers are JSON (orjson). A body that is not a JSON object gets HTTP 400 ``{"Error": ...}``;
see ``gpusched.extender.protocol`` for the other error answers. An unexpected exception is
logged here and answered with HTTP 500 ``{"Error": "internal error: ..."}``, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import Counter

from gpusched.core.status import Code, Status
from gpusched.extender.apibind import AsyncBinder
from gpusched.extender.handlers import Extender
from gpusched.extender.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SYNC_WAIT_S,
    BadRequest,
    LimitExceeded,
    dumps,
    parse_json,
)
from gpusched.metrics.cluster import ClusterStats, cluster_stats
from gpusched.metrics.scheduling import CONTENT_TYPE, SchedulerMetrics

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_SYNC_WAIT_S", "limit_heap_growth", "make_app"]

LARGE_BODY_BYTES = 1024 * 1024
"""A body over this (or of unknown length) takes one of ``LARGE_BODIES`` slots. A filter with
``nodeCacheCapable: true`` is a pod and names: about 30 bytes a node, 150 KB at 5000 nodes."""
LARGE_BODIES = 2
"""Large bodies read, parsed and answered at once. kube-scheduler sends one filter at a time."""
DEFAULT_BODY_TIMEOUT_S = 5.0
"""Time for a large body to get its slot and be read, and again for its answer to be written."""
_POLL_S = 0.02

_VERB_ERRORS = {"filter": 200, "bind": 200, "prioritize": 503, "preempt": 503}
"""HTTP status of the answer refusing a verb while the informers have not synced: kube-scheduler
reads the ``Error`` of a 200 on /filter and /bind into its event; the other two have no such field."""

EXTENDER_KEY: web.AppKey[Extender] = web.AppKey("extender", Extender)
METRICS_KEY: web.AppKey[SchedulerMetrics] = web.AppKey("metrics", SchedulerMetrics)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


class GuardMetrics:
    """``gpusched_extender_sync_waits_total{verb,result}`` (a verb that found the informers not
    synced: ``served`` once they were, ``refused`` after the wait),
    ``gpusched_extender_rejected_requests_total{verb,reason}`` (over a limit, too slow) and
    ``gpusched_extender_node_rechecks_total{result}`` (``Verbs.filter``)."""

    def __init__(self, m: SchedulerMetrics) -> None:
        self.sync_waits = Counter(
            "gpusched_extender_sync_waits",
            "Extender requests that arrived before the informers had synced, by verb and result.",
            ["verb", "result"],
            registry=m.registry,
        )
        self.rejected = Counter(
            "gpusched_extender_rejected_requests",
            "Extender requests refused for their size or shape, by verb and reason.",
            ["verb", "reason"],
            registry=m.registry,
        )
        self.rechecks = Counter(
            "gpusched_extender_node_rechecks",
            "Filters of a nominated pod failing on its nominated node that read the node's pods from "
            "the API first, by result: released (the books held pods the API no longer has; answered "
            "again), unchanged, or failed (the read failed; answered from the books).",
            ["result"],
            registry=m.registry,
        )


_GUARD_METRICS: weakref.WeakKeyDictionary[SchedulerMetrics, GuardMetrics] = weakref.WeakKeyDictionary()


def _guard_metrics(m: SchedulerMetrics) -> GuardMetrics:
    if m not in _GUARD_METRICS:
        _GUARD_METRICS[m] = GuardMetrics(m)
    return _GUARD_METRICS[m]


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``: hand freed heap memory back to the system. glibc raises its
    mmap threshold after a large buffer is freed, so the next ones come from the heap, which
    it keeps: without a trim the process stays at its peak. A no-op elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def release() -> None:
        trim(0)

    return release


def limit_heap_growth(threshold: int = LARGE_BODY_BYTES) -> bool:
    """Fix glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``) at ``threshold`` bytes: buffers
    of that size or more (request bodies, answers) are then always mapped apart and unmapped when
    freed, instead of landing on the heap once glibc has raised its dynamic threshold. For a
    server process (the CLI calls it at start): 32 clients sending 5 MB filters at once peak
    about 100 MB lower. Returns whether it was set (False where libc is not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(-3, threshold))  # M_MMAP_THRESHOLD


# ------------------------------------------------------------------- what the middlewares hold
class Admission:
    """Which verb requests are let in: a declared body over ``max_body_bytes`` is refused
    (``LimitExceeded``, 413), and a verb waits up to ``sync_wait_s`` for the books to be whole
    (``ready``), then is refused with ``refusal``."""

    def __init__(
        self, ready: Callable[[], bool], sync_wait_s: float, max_body_bytes: int, metrics: GuardMetrics
    ) -> None:
        self.ready = ready
        self.sync_wait_s = sync_wait_s
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    def too_large(self, n: int | None) -> LimitExceeded:
        size, limit = (f"{n} bytes" if n is not None else "more bytes"), self.max_body_bytes
        msg = (
            f"request body of {size} is over the limit of {limit} bytes (--max-body-bytes); with "
            "nodeCacheCapable: false every node object is sent: raise the limit or set nodeCacheCapable: true"
        )
        return LimitExceeded(msg, 413)

    async def synced(self, verb: str) -> bool:
        """Whether the books are whole, waiting up to ``sync_wait_s`` for them (polling: the
        informers are threads, ``ready`` reads their events)."""
        if self.ready():
            return True
        wait, t0 = self.sync_wait_s, time.monotonic()
        while time.monotonic() - t0 < wait:
            await asyncio.sleep(min(_POLL_S, max(0.0, wait - (time.monotonic() - t0))))
            if self.ready():
                self.metrics.sync_waits.labels(verb, "served").inc()
                log.info("extender %s waited %.2f s for the informers to sync", verb, time.monotonic() - t0)
                return True
        self.metrics.sync_waits.labels(verb, "refused").inc()
        log.warning("extender %s refused: the informers have not synced after %.1f s", verb, wait)
        return False

    def refusal(self, verb: str) -> web.Response:
        wait = self.sync_wait_s
        msg = (
            f"gpusched extender: the node and pod informers have not synced yet (waited {wait:g} s): "
            "its GPU books are not whole, so it decides nothing; kube-scheduler retries the pod"
        )
        if verb == "filter":
            answer: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                      "FailedAndUnresolvableNodes": {}, "Error": msg}  # fmt: skip
        else:
            answer = {"Error": msg}
        return _json(answer, _VERB_ERRORS[verb])


class LargeBodies:
    """The ``LARGE_BODIES`` slots a large body is read, answered and written in (module doc)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(LARGE_BODIES)
        self._in_flight = 0
        self._trim = _malloc_trim()

    @contextlib.asynccontextmanager
    async def slot(self, request: web.Request) -> AsyncIterator[bool]:
        """A slot when the body is large (yields whether it is); trims the heap after the last."""
        n = request.content_length
        if not request.body_exists or (n is not None and n <= LARGE_BODY_BYTES):
            yield False
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise BadRequest(f"no slot for a large request body within {self.timeout_s:g} s", 503) from None
        self._in_flight += 1
        try:
            yield True
        finally:
            self._in_flight -= 1
            self._slots.release()
            if self._in_flight == 0:
                self._trim()

    async def write(self, request: web.Request, resp: web.StreamResponse) -> None:
        """Write the answer within the timeout (its body is as large as the request's), else
        close the connection."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await resp.prepare(request)
                await resp.write_eof()
        except TimeoutError:
            if request.transport is not None:
                request.transport.close()


ADMISSION_KEY: web.AppKey[Admission] = web.AppKey("admission", Admission)
LARGE_BODIES_KEY: web.AppKey[LargeBodies] = web.AppKey("large_bodies", LargeBodies)


def _verb(request: web.Request) -> str | None:
    """The extender verb a request is for (its route's name), None for the other routes."""
    name = request.match_info.route.name
    return name if name in _VERB_ERRORS else None


# ------------------------------------------------------------------ the middlewares, outside in
@web.middleware
async def observe_duration(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``gpusched_extender_request_duration_seconds{verb}``: the whole answer, refusals included."""
    verb = _verb(request)
    if verb is None:
        return await handler(request)
    t0 = time.perf_counter()
    try:
        return await handler(request)
    finally:
        request.app[METRICS_KEY].extender_duration.labels(verb).observe(time.perf_counter() - t0)


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors as JSON ``{"Error": ...}``: a ``BadRequest`` with its status (counted as rejected
    when a limit or a timeout refused it), an aiohttp HTTP error with its own, anything else
    logged here and answered 500, never with a traceback."""
    verb = _verb(request)
    if verb is None:
        return await handler(request)
    try:
        return await handler(request)
    except BadRequest as e:
        if isinstance(e, LimitExceeded) or e.status != 400:
            reason = {413: "body_too_large", 408: "body_timeout", 503: "busy"}.get(e.status, "invalid")
            rejected = request.app[ADMISSION_KEY].metrics.rejected
            rejected.labels(verb, reason if e.status != 400 else "limit").inc()
        return _json({"Error": str(e)}, e.status)
    except web.HTTPException as e:
        return _json({"Error": e.reason}, e.status)
    except Exception as e:  # a bug: log it here, answer without a traceback
        log.exception("extender %s failed", verb)
        return _json({"Error": f"internal error: {type(e).__name__}: {e}"}, 500)


@web.middleware
async def admit(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A declared body over the limit: 413 before anything is read; then the wait for the books."""
    verb = _verb(request)
    if verb is None:
        return await handler(request)
    adm = request.app[ADMISSION_KEY]
    n = request.content_length
    if n is not None and n > adm.max_body_bytes:
        raise adm.too_large(n)
    if not await adm.synced(verb):
        return adm.refusal(verb)
    return await handler(request)


@web.middleware
async def hold_large_bodies(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A large body is read, answered and written holding a slot."""
    if _verb(request) is None:
        return await handler(request)
    large = request.app[LARGE_BODIES_KEY]
    async with large.slot(request) as big:
        resp = await handler(request)
        if big:
            await large.write(request, resp)
        return resp


MIDDLEWARES = (observe_duration, answer_errors, admit, hold_large_bodies)


# ------------------------------------------------------------------------------------ the verbs
async def read_body(request: web.Request, adm: Admission) -> bytearray:
    """The body, in one buffer of its declared length (chunked: grown up to the limit)."""
    n = request.content_length
    if n is not None:
        buf = bytearray(n)
        view, pos = memoryview(buf), 0
        while pos < n:
            chunk = await request.content.readany()
            if not chunk:
                raise BadRequest(f"request body ended after {pos} of {n} bytes")
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        view.release()
        return buf
    out = bytearray()
    while chunk := await request.content.readany():
        out += chunk
        if len(out) > adm.max_body_bytes:
            raise adm.too_large(None)
    return out


async def read_json(request: web.Request, adm: Admission, timeout_s: float) -> dict[str, Any]:
    """The body as a JSON object, read within ``timeout_s`` unless all of it has arrived."""
    try:
        if request.content.is_eof():  # all of it has arrived (most bodies): no wait, no timer
            data = await read_body(request, adm)
        else:
            async with asyncio.timeout(timeout_s):
                data = await read_body(request, adm)
    except TimeoutError:
        raise BadRequest(f"request body not received within {timeout_s:g} s", 408) from None
    except HttpProcessingError as e:  # a malformed chunk, a body cut short
        raise BadRequest(f"request body is malformed: {e.message}") from None
    except ConnectionError:  # the client went away: nobody reads the answer
        raise BadRequest("connection lost while reading the request body") from None
    return parse_json(data)


class Verbs:
    """The four verbs' handlers: read the body, call ``Extender``, answer JSON. Binding API calls
    run in ``pool`` (shut down with the app when ``own_pool``); with ``first_binder`` the first
    attempt runs on the loop."""

    def __init__(
        self,
        extender: Extender,
        metrics: SchedulerMetrics,
        admission: Admission,
        body_timeout_s: float,
        pool: ThreadPoolExecutor,
        first_binder: AsyncBinder | None,
        *,
        own_pool: bool,
    ) -> None:
        self.extender = extender
        self.metrics = metrics
        self.admission = admission
        self.body_timeout_s = body_timeout_s
        self.pool = pool
        self.first_binder = first_binder
        self.own_pool = own_pool

    async def close(self, app: web.Application) -> None:
        """On the app's shutdown: close the first binder, and the pool when it is ours."""
        if self.first_binder is not None:
            await self.first_binder.close()
        if self.own_pool:
            self.pool.shutdown(wait=False, cancel_futures=True)

    async def _args(self, request: web.Request) -> dict[str, Any]:
        return await read_json(request, self.admission, self.body_timeout_s)

    async def filter(self, request: web.Request) -> web.Response:
        """The filter's answer; a nominated pod failing on its nominated node is answered again
        after the pods the books hold there are checked against the API (``node_to_recheck``)."""
        ext = self.extender
        args = await self._args(request)
        answer = ext.filter(args)
        node = ext.node_to_recheck(args, answer)
        if node is not None:
            released = await asyncio.get_running_loop().run_in_executor(self.pool, ext.recheck_node, node)
            result = "failed" if released is None else "released" if released else "unchanged"
            self.admission.metrics.rechecks.labels(result).inc()
            if released:
                answer = ext.filter(args)
        return _json(answer)

    async def prioritize(self, request: web.Request) -> web.Response:
        answer = self.extender.prioritize_json(await self._args(request))
        return web.Response(body=answer, content_type="application/json")

    async def preempt(self, request: web.Request) -> web.Response:
        return _json(self.extender.preempt(await self._args(request)))

    async def bind(self, request: web.Request) -> web.Response:
        ext = self.extender
        deadline = time.monotonic() + ext.bind_budget_s  # under kube-scheduler's httpTimeout
        args = await self._args(request)
        loop = asyncio.get_running_loop()
        try:
            ns, name, uid, node, spec = ext.bind_target(args)
            if spec is None:
                spec = await loop.run_in_executor(self.pool, ext.fetch_pod, ns, name, uid)
            plan = ext.reserve(spec, uid, node)
        except BadRequest as e:
            return _json({"Error": str(e)})
        t0 = time.perf_counter()
        first = None
        if self.first_binder is not None:  # the first attempt on the loop; anything but success: the threads
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    first = await self.first_binder.bind(ext.bound_pod(plan), plan.node, plan.gpus)
            except TimeoutError:  # no answer within the budget: the outcome is unknown
                first = Status(Code.ERROR, (f"no answer within {ext.bind_budget_s:g} s",), "APIBinder")
        if first is not None and first.ok:
            error = None
        else:
            error = await loop.run_in_executor(self.pool, ext.call_binder, plan, first, deadline)
        self.metrics.binding_duration.labels("error" if error else "bound").observe(time.perf_counter() - t0)
        return _json(ext.complete(plan, error))


# ------------------------------------------------------------------- health, readiness, the books
async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    if request.app[ADMISSION_KEY].ready():
        return web.Response(text="ok")
    return web.Response(text="informers not synced", status=503)


async def state(request: web.Request) -> web.Response:
    """A JSON summary of the books."""
    with request.app[EXTENDER_KEY].cluster.live_books() as snap:
        summary = {
            "nodes": len(snap),
            "gpus": int(snap.gpu_count.sum()),
            "pods": len(snap.allocations),
            "allocated_gpu_milli": snap.allocated_gpu_milli(),
            "gpu_allocation_ratio": snap.gpu_allocation_ratio(),
            "claimed_gpus": sum(len(nd.claimed_gpus) for nd in snap.nodes),  # held by DRA claims
        }
    return _json(summary)


async def metrics_page(request: web.Request) -> web.Response:
    ext, m = request.app[EXTENDER_KEY], request.app[METRICS_KEY]

    def stats() -> ClusterStats:
        with ext.cluster.live_books() as snap:
            return cluster_stats(snap, ext.profile.workload)

    m.refresh_cluster(stats)
    return web.Response(body=m.exposition(), headers={"Content-Type": CONTENT_TYPE})


def make_app(
    extender: Extender,
    *,
    metrics: SchedulerMetrics | None = None,
    ready: Callable[[], bool] = lambda: True,
    executor: ThreadPoolExecutor | None = None,
    sync_wait_s: float = DEFAULT_SYNC_WAIT_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    first_binder: AsyncBinder | None = None,
) -> web.Application:
    """The aiohttp application serving ``extender``: the middlewares (``MIDDLEWARES``) around the
    verbs' handlers (``Verbs``), and health, readiness, metrics and state. ``ready`` answers
    ``/readyz`` and gates the verbs (each waits up to ``sync_wait_s`` for it); binding API calls
    run in ``executor`` (default: a pool of 32 threads, shut down with the app); with
    ``first_binder`` (``apibind.AsyncAPIBinder``) the first attempt of each binding is made on
    the loop, and only what it does not bind goes to the threads. Bodies over ``max_body_bytes``
    get HTTP 413; large ones share ``LARGE_BODIES`` slots (see the module doc)."""
    if sync_wait_s < 0 or body_timeout_s <= 0 or max_body_bytes <= 0:
        raise ValueError("sync_wait_s must be >= 0, body_timeout_s and max_body_bytes > 0")
    m = metrics or SchedulerMetrics()
    admission = Admission(ready, sync_wait_s, max_body_bytes, _guard_metrics(m))
    pool = executor or ThreadPoolExecutor(max_workers=32, thread_name_prefix="gpusched-bind")
    verbs = Verbs(extender, m, admission, body_timeout_s, pool, first_binder, own_pool=executor is None)

    app = web.Application(client_max_size=max_body_bytes, middlewares=MIDDLEWARES)
    app[EXTENDER_KEY] = extender
    app[METRICS_KEY] = m
    app[ADMISSION_KEY] = admission
    app[LARGE_BODIES_KEY] = LargeBodies(body_timeout_s)
    for verb in _VERB_ERRORS:
        app.router.add_post(f"/{verb}", getattr(verbs, verb), name=verb)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/state", state)
    app.on_shutdown.append(verbs.close)
    return app
