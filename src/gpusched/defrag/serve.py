"""Serve the defragmentation controller: leader election on its own Lease (``k8s/leader.py``, as
the scheduler), probes and metrics."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading

from gpusched.defrag.controller import ControllerConfig, DefragController
from gpusched.doctor.books import Books
from gpusched.k8s.httpserver import ProbeServer, text
from gpusched.k8s.leader import LeaderElector, default_identity
from gpusched.metrics.scheduling import CONTENT_TYPE

log = logging.getLogger("gpusched.defrag")


def serve_defrag(
    config: ControllerConfig,
    *,
    kubeconfig: str | None = None,
    namespace: str = "kube-system",
    port: int = 10259,
    leader_elect: bool = True,
    log_level: str = "INFO",
) -> None:
    """Run the controller until SIGTERM or SIGINT; serve /healthz, /readyz and /metrics on
    ``port``. With ``leader_elect`` only the holder of the Lease ``namespace/config.lease_name``
    acts; on the way out the Lease is released."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpusched.doctor.source import from_api
    from gpusched.k8s.client import api_client

    api = api_client(kubeconfig)
    identity = default_identity()
    config = dataclasses.replace(config, identity=identity, lease_namespace=namespace)
    ctl = DefragController(api, lambda: Books.of(from_api(kubeconfig, queues=False), config.policy), config)
    stop = threading.Event()
    server = ProbeServer(
        port,
        {
            "/healthz": lambda: text(200, "ok\n"),
            "/readyz": lambda: text(200, "ok\n") if ctl.synced() else text(503, "not synced\n"),
            "/metrics": lambda: (200, CONTENT_TYPE, ctl.metrics.exposition()),
        },
    ).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ctl.start(lead=not leader_elect)
    elector = None
    if leader_elect:
        elector = LeaderElector(
            api,
            name=config.lease_name,
            namespace=namespace,
            identity=identity,
            on_started=ctl.start_leading,
            on_stopped=ctl.stop_leading,
        ).start()
    log.info("gpusched defrag %s: schedulerName=%s wait=%gs port=%d", identity, config.scheduler_name,
             config.wait_s, server.port)  # fmt: skip
    stop.wait()
    log.info("shutting down")
    ctl.stop()
    if elector is not None:
        elector.stop(release=True)
    server.stop()
