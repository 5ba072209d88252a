"""Serve the standalone scheduler: informers, the decision loop, leader election, probes, metrics.

The options are parsed by ``gpusched scheduler`` (``gpusched.cli.serve``); ``python -m
gpusched.k8s.cli_scheduler`` is kept for the scripts and tests that start it so.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading

from gpusched.k8s.heap import freeze_heap, freeze_when
from gpusched.k8s.httpserver import ProbeServer, text
from gpusched.k8s.leader import LeaderElector, default_identity
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.metrics.scheduling import CONTENT_TYPE

log = logging.getLogger("gpusched.scheduler")


def serve_scheduler(
    config: SchedulerConfig,
    *,
    kubeconfig: str | None = None,
    namespace: str = "kube-system",
    port: int = 10251,
    leader_elect: bool = True,
    lease_name: str = "gpusched-scheduler",
    log_level: str = "INFO",
) -> None:
    """Run the standalone GPU scheduler until SIGTERM or SIGINT: binds pending pods whose
    spec.schedulerName is ``config.scheduler_name``, writes the GPU assignment annotation, emits
    Scheduled / FailedScheduling events, and serves /healthz, /readyz and /metrics on ``port``.
    With ``leader_elect`` only the holder of the Lease ``namespace/lease_name`` schedules; on the
    way out the bindings in flight finish, then the Lease is released."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpusched.k8s.client import api_client

    api = api_client(kubeconfig, qps_pool=max(32, 2 * config.bind_workers))
    identity = default_identity()
    config = dataclasses.replace(config, identity=identity, lease_name=lease_name)
    sched = StandaloneScheduler(api, config)
    stop = threading.Event()

    def metrics() -> tuple[int, str, bytes]:
        sched.refresh_gauges()
        return 200, CONTENT_TYPE, sched.metrics.exposition()

    server = ProbeServer(
        port,
        {
            "/healthz": lambda: text(200, "ok\n"),
            "/readyz": lambda: text(200, "ok\n") if sched.synced() else text(503, "informers not synced\n"),
            "/metrics": metrics,
        },
    ).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sched.start(lead=not leader_elect)
    freeze_heap("start-up")  # the modules: out of every full pass of the cycle collector
    freeze_when(sched.synced, "informers synced", stop=stop)  # and the books of the nodes and pods listed
    elector = None
    if leader_elect:
        elector = LeaderElector(
            api,
            name=lease_name,
            namespace=namespace,
            identity=identity,
            on_started=sched.start_leading,
            on_stopped=sched.stop_leading,
        ).start()
    log.info("gpusched scheduler %s: schedulerName=%s policy=%s port=%d", identity, config.scheduler_name,
             config.policy, server.port)  # fmt: skip
    stop.wait()
    log.info("shutting down")
    sched.stop()  # stops deciding, finishes the bindings in flight
    if elector is not None:
        elector.stop(release=True)  # then hands the Lease over
    server.stop()
