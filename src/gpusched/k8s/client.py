"""Kubernetes API clients: kubeconfig (``--kubeconfig`` / ``$KUBECONFIG``) or in-cluster."""

from __future__ import annotations

import os

from kubernetes import client, config


def api_client(kubeconfig: str | None = None, *, qps_pool: int = 32) -> client.ApiClient:
    """An ApiClient with a connection pool large enough for concurrent binds."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = qps_pool
    return client.ApiClient(cfg)
