"""The webhook's HTTPS server (aiohttp): ``GET /healthz`` and three AdmissionReview v1 endpoints, each
registered as its own webhook (deploy/): ``POST /mutate`` (a GPU share's slot, ``mutate``), ``POST /guard``
(who may write the assignment annotations, ``guard``) and ``POST /route`` (GPU pods to gpusched, ``route``).

TLS is required (the API server calls admission webhooks over HTTPS only). The certificate and key
are read from files (a Secret mounted by the chart: helm's ``genSignedCert`` or cert-manager) and
read again when they change, so a rotated certificate is served without a restart.

Bodies over ``MAX_BODY_BYTES`` get HTTP 413; a body that is not an AdmissionReview gets HTTP 400 with
``{"error": ...}``; an unexpected exception is logged and answered with HTTP 500, never a traceback.
The API server's ``failurePolicy`` (Fail, in the chart) decides what happens to a pod then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from gpusched.webhook.guard import Writers, guard_review
from gpusched.webhook.mutate import review
from gpusched.webhook.route import Routing, route_review

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
"""An AdmissionReview of a pod: the pod (etcd holds at most 1.5 MiB per object) twice at most."""
RELOAD_EVERY_S = 30.0


class CertReloader:
    """An SSL context whose certificate chain is loaded again when the files' mtimes change."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] | None = None
        self.reload()

    def _mtimes(self) -> tuple[float, float]:
        return (self.cert.stat().st_mtime, self.key.stat().st_mtime)

    def reload(self) -> bool:
        """Load the files again if they changed; True when loaded. Errors are left to the caller."""
        stamp = self._mtimes()
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(str(self.cert), str(self.key))
        self._stamp = stamp
        return True

    async def watch(self, every_s: float = RELOAD_EVERY_S) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                if self.reload():
                    log.info("reloaded the TLS certificate from %s", self.cert)
            except (OSError, ssl.SSLError) as e:  # a half-written Secret update: keep the old one
                log.warning("could not reload the TLS certificate from %s: %s", self.cert, e)


Review = Callable[[dict[str, Any]], dict[str, Any]]


def handler(answer_review: Review) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        return await _answer(request, answer_review)

    return handle


async def mutate_handler(request: web.Request) -> web.Response:
    return await _answer(request, review)


async def _answer(request: web.Request, answer_review: Review) -> web.Response:
    try:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
        answer = answer_review(body)
    except web.HTTPException:
        raise
    except ValueError as e:  # also json.JSONDecodeError
        return web.json_response({"error": f"bad AdmissionReview: {e}"}, status=400)
    except Exception:
        log.exception("unexpected error answering an AdmissionReview")
        return web.json_response({"error": "internal error"}, status=500)
    response = answer["response"]
    if not response["allowed"]:
        log.info("denied: %s", response["status"]["message"])
    return web.json_response(answer)


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(writers: Writers | None = None, routing: Routing | None = None) -> web.Application:
    """``writers``: who may write the assignment annotations (default: deploy/manifests' service accounts);
    ``routing``: gpusched's scheduler names (none: ``/route`` routes nothing)."""
    w, r = writers or Writers(), routing or Routing(())
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_post("/guard", handler(lambda body: guard_review(body, w)))
    app.router.add_post("/route", handler(lambda body: route_review(body, r)))
    app.router.add_get("/healthz", healthz)
    return app


def serve(
    host: str,
    port: int,
    cert: Path,
    key: Path,
    writers: Writers | None = None,
    routing: Routing | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT."""
    certs = CertReloader(cert, key)
    app = make_app(writers, routing)

    async def watcher(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(certs.watch())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watcher)
    w, r = writers or Writers(), routing or Routing(())
    routed = (
        f"to {r.schedulers[0]} (gpusched's: {', '.join(r.schedulers)})" if r.enabled else "not (no names)"
    )
    log.info(
        "gpusched webhook serving https://%s:%d/{mutate,guard,route}; writers of the assignment: %s, of the "
        "allocation: %s; GPU pods routed %s",
        host,
        port,
        ", ".join(sorted(w.assignment)),
        ", ".join(sorted(w.allocated)),
        routed,
    )
    web.run_app(app, host=host, port=port, ssl_context=certs.context, print=None, access_log=None)
