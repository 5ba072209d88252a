"""Serve the defragmentation controller: leader election on its own Lease (``k8s/leader.py``, as
the scheduler), probes and metrics, in the process shell of ``k8s/process.py``."""

from __future__ import annotations

import dataclasses
import logging

from gpusched.defrag.controller import ControllerConfig, DefragController
from gpusched.doctor.books import Books
from gpusched.k8s.leader import default_identity
from gpusched.k8s.process import Lease, configure_logging, run_until_signal

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
    configure_logging(log_level)
    from gpusched.doctor.source import from_api
    from gpusched.k8s.client import api_client

    api = api_client(kubeconfig)
    identity = default_identity()
    config = dataclasses.replace(config, identity=identity, lease_namespace=namespace)
    ctl = DefragController(api, lambda: Books.of(from_api(kubeconfig, queues=False), config.policy), config)
    run_until_signal(
        api,
        ctl,
        port=port,
        metrics=ctl.metrics.exposition,
        not_ready="not synced\n",
        lease=Lease(config.lease_name, namespace, identity) if leader_elect else None,
        log=log,
        banner=f"gpusched defrag {identity}: schedulerName={config.scheduler_name} wait={config.wait_s:g}s",
    )
