"""Serve the standalone scheduler: informers, the decision loop, leader election, probes, metrics.

The options are parsed by ``gpusched scheduler`` (``gpusched.cli.serve``); the process shell
(probes, signals, Lease, shutdown order) is ``gpusched.k8s.process``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from gpusched.k8s.heap import freeze_heap, freeze_when
from gpusched.k8s.leader import default_identity
from gpusched.k8s.process import Lease, configure_logging, run_until_signal
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

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
    configure_logging(log_level)
    from gpusched.k8s.client import api_client

    api = api_client(kubeconfig, qps_pool=max(32, 2 * config.bind_workers))
    identity = default_identity()
    config = dataclasses.replace(config, identity=identity, lease_name=lease_name)
    sched = StandaloneScheduler(api, config)

    def metrics() -> bytes:
        sched.refresh_gauges()
        return sched.metrics.exposition()

    def started(stop: threading.Event) -> None:
        freeze_heap("start-up")  # the modules: out of every full pass of the cycle collector
        freeze_when(sched.synced, "informers synced", stop=stop)  # and the books of the nodes and pods listed

    run_until_signal(
        api,
        sched,
        port=port,
        metrics=metrics,
        not_ready="informers not synced\n",
        lease=Lease(lease_name, namespace, identity) if leader_elect else None,
        log=log,
        banner=f"gpusched scheduler {identity}: schedulerName={config.scheduler_name} policy={config.policy}",
        started=started,
    )
