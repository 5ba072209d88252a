"""The extender's HTTP server (aiohttp): the four verbs, health, readiness and metrics.

- ``POST /filter``, ``/prioritize``, ``/preempt``: decided on the event loop; the numpy work
  runs under ``LiveCluster``'s lock for about a millisecond and never awaits while holding it.
- ``POST /bind``: the GPUs are chosen and booked under the lock, then the API calls (annotate,
  bind) run in a thread pool without it, so binds to different nodes proceed in parallel and
  the loop keeps serving filters meanwhile.
- ``GET /healthz`` (the process is up), ``/readyz`` (the informers have synced: 503 before),
  ``/metrics`` (Prometheus), ``/state`` (a JSON summary of the books, for operators and tests).

Answers are JSON (orjson). A body that is not a JSON object gets HTTP 400 ``{"Error": ...}``;
see ``gpusched.extender.protocol`` for the other error answers. An unexpected exception is
logged here and answered with HTTP 500 ``{"Error": "internal error: ..."}``, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from gpusched.extender.handlers import Extender
from gpusched.extender.protocol import BadRequest, dumps, parse_json
from gpusched.metrics.scheduling import CONTENT_TYPE, SchedulerMetrics

log = logging.getLogger(__name__)

MAX_BODY = 256 * 1024 * 1024
"""Largest request accepted: a filter with ``nodeCacheCapable: false`` carries every node object."""

EXTENDER_KEY: web.AppKey[Extender] = web.AppKey("extender", Extender)
METRICS_KEY: web.AppKey[SchedulerMetrics] = web.AppKey("metrics", SchedulerMetrics)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


def make_app(
    extender: Extender,
    *,
    metrics: SchedulerMetrics | None = None,
    ready: Callable[[], bool] = lambda: True,
    executor: ThreadPoolExecutor | None = None,
) -> web.Application:
    """The aiohttp application serving ``extender``. ``ready`` answers ``/readyz``; binding API
    calls run in ``executor`` (default: a pool of 32 threads, shut down with the app)."""
    m = metrics or SchedulerMetrics()
    pool = executor or ThreadPoolExecutor(max_workers=32, thread_name_prefix="gpusched-bind")

    def timed(verb: str, fn: Callable[[web.Request], Awaitable[web.Response]]) -> Handler:
        hist = m.extender_duration.labels(verb)

        async def handle(request: web.Request) -> web.StreamResponse:
            t0 = time.perf_counter()
            try:
                return await fn(request)
            except BadRequest as e:
                return _json({"Error": str(e)}, e.status)
            except web.HTTPException as e:  # e.g. 413 for a body over MAX_BODY
                return _json({"Error": e.reason}, e.status)
            except Exception as e:  # a bug: log it here, answer without a traceback
                log.exception("extender %s failed", verb)
                return _json({"Error": f"internal error: {type(e).__name__}: {e}"}, 500)
            finally:
                hist.observe(time.perf_counter() - t0)

        return handle

    async def body(request: web.Request) -> dict[str, Any]:
        return parse_json(await request.read())

    async def filter_(request: web.Request) -> web.Response:
        return _json(extender.filter(await body(request)))

    async def prioritize(request: web.Request) -> web.Response:
        return web.Response(
            body=extender.prioritize_json(await body(request)), content_type="application/json"
        )

    async def preempt(request: web.Request) -> web.Response:
        return _json(extender.preempt(await body(request)))

    async def bind(request: web.Request) -> web.Response:
        args = await body(request)
        loop = asyncio.get_running_loop()
        try:
            ns, name, uid, node, spec = extender.bind_target(args)
            if spec is None:
                spec = await loop.run_in_executor(pool, extender.fetch_pod, ns, name, uid)
            plan = extender.reserve(spec, uid, node)
        except BadRequest as e:
            return _json({"Error": str(e)})
        t0 = time.perf_counter()
        error = await loop.run_in_executor(pool, extender.call_binder, plan)
        m.binding_duration.labels("error" if error else "bound").observe(time.perf_counter() - t0)
        return _json(extender.complete(plan, error))

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(text="informers not synced", status=503)

    def summary() -> dict[str, Any]:
        with extender.cluster.snapshot() as snap:
            return {
                "nodes": len(snap),
                "gpus": int(snap.gpu_count.sum()),
                "pods": len(snap.allocations),
                "allocated_gpu_milli": snap.allocated_gpu_milli(),
                "gpu_allocation_ratio": snap.gpu_allocation_ratio(),
            }

    async def state(request: web.Request) -> web.Response:
        return _json(summary())

    async def metrics_(request: web.Request) -> web.Response:
        m.gpu_allocation.set(summary()["gpu_allocation_ratio"])
        return web.Response(body=m.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def shutdown(app: web.Application) -> None:
        if executor is None:
            pool.shutdown(wait=False, cancel_futures=True)

    app = web.Application(client_max_size=MAX_BODY)
    app[EXTENDER_KEY] = extender
    app[METRICS_KEY] = m
    app.router.add_post("/filter", timed("filter", filter_))
    app.router.add_post("/prioritize", timed("prioritize", prioritize))
    app.router.add_post("/bind", timed("bind", bind))
    app.router.add_post("/preempt", timed("preempt", preempt))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_)
    app.router.add_get("/state", state)
    app.on_shutdown.append(shutdown)
    return app
