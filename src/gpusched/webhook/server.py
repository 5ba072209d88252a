"""The webhook's HTTPS server (aiohttp): ``POST /mutate`` (AdmissionReview v1), ``GET /healthz``.

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
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gpusched.webhook.mutate import review

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


async def mutate_handler(request: web.Request) -> web.Response:
    try:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
        answer = review(body)
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


def make_app() -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_get("/healthz", healthz)
    return app


def serve(host: str, port: int, cert: Path, key: Path) -> None:
    """Serve until SIGTERM/SIGINT."""
    certs = CertReloader(cert, key)
    app = make_app()

    async def watcher(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(certs.watch())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watcher)
    log.info("gpusched webhook serving https://%s:%d/mutate", host, port)
    web.run_app(app, host=host, port=port, ssl_context=certs.context, print=None, access_log=None)
