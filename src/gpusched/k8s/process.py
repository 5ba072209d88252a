"""The process shell of a long-running gpusched service (the scheduler, the defrag controller): logging,
probes and metrics, SIGTERM/SIGINT, the Lease, and the shutdown order. ``k8s/serve.py`` and
``defrag/serve.py`` build their service and hand it here; what they serve differs, the shell does not.

The order, once: probes up, signals caught, the service started (leading at once without leader
election), the caller's start-up work (``started``), then the Lease taken; on a signal, the service
stops first (the work in flight finishes), then the Lease is released, then the probes go down.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpusched.k8s.httpserver import ProbeServer, text
from gpusched.k8s.leader import LeaderElector
from gpusched.metrics.scheduling import CONTENT_TYPE

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """The log format every gpusched process writes, at ``level`` (INFO, DEBUG, ...)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


class Service(Protocol):
    """What the shell runs: started (leading or waiting for the Lease), led, and stopped."""

    def synced(self) -> bool: ...
    def start(self, lead: bool = ...) -> object: ...
    def start_leading(self) -> None: ...
    def stop_leading(self) -> None: ...
    def stop(self) -> None: ...


@dataclass(frozen=True)
class Lease:
    """The Lease ``namespace/name`` that ``identity`` must hold to act."""

    name: str
    namespace: str
    identity: str


def run_until_signal(
    api: Any,
    service: Service,
    *,
    port: int,
    metrics: Callable[[], bytes],
    not_ready: str,
    lease: Lease | None,
    log: logging.Logger,
    banner: str,
    started: Callable[[threading.Event], None] | None = None,
) -> None:
    """Serve /healthz, /readyz (503 ``not_ready`` until ``service.synced()``) and /metrics
    (``metrics()``, Prometheus text) on ``port``, run ``service`` until SIGTERM or SIGINT, then shut
    down in order. ``lease=None``: no leader election, the service leads from the start.
    ``started(stop)`` runs after the service starts and before the Lease is sought; ``log`` gets
    the start line (``banner`` and the port the probes listen on) and the shutdown line."""
    stop = threading.Event()
    server = ProbeServer(
        port,
        {
            "/healthz": lambda: text(200, "ok\n"),
            "/readyz": lambda: text(200, "ok\n") if service.synced() else text(503, not_ready),
            "/metrics": lambda: (200, CONTENT_TYPE, metrics()),
        },
    ).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service.start(lead=lease is None)
    if started is not None:
        started(stop)
    elector = None
    if lease is not None:
        elector = LeaderElector(
            api,
            name=lease.name,
            namespace=lease.namespace,
            identity=lease.identity,
            on_started=service.start_leading,
            on_stopped=service.stop_leading,
        ).start()
    log.info("%s port=%d", banner, server.port)
    stop.wait()
    log.info("shutting down")
    service.stop()  # stops acting, finishes the work in flight
    if elector is not None:
        elector.stop(release=True)  # then hands the Lease over
    server.stop()
