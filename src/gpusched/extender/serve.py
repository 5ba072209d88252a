"""Serve the kube-scheduler extender: informers, the HTTP app, the binding threads.

The options are parsed by ``gpusched extender`` (``gpusched.cli.serve``; also ``python -m
gpusched.cli extender``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson

from gpusched.core.errors import InvalidInput, ResourceError
from gpusched.core.framework import Profile
from gpusched.core.policies import POLICIES, PolicyContext, make_profile
from gpusched.core.workload import typical_workload
from gpusched.extender.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_SYNC_WAIT_S

log = logging.getLogger("gpusched.extender")

DEFAULT_PORT = 8888
GIL_SWITCH_INTERVAL_S = 0.001
"""How long a thread may hold the GIL while another waits (CPython's default is 5 ms). The event
loop answers kube-scheduler's ``/filter`` inside its serial scheduling cycle; the informer, binding
and settler threads are background work and must not make it wait 5 ms for the interpreter."""


EVENT_LOOPS = ("uvloop", "asyncio")
"""``uvloop`` (libuv: the sockets, TLS and timers of the event loop in C; about 30 % less CPU per
HTTP request served than the standard loop, measured by ``gpusched bench k8s --compare --only
extender,extender-asyncio``) or the standard library's ``asyncio`` loop."""


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind`` (one of ``EVENT_LOOPS``). Raises InvalidInput for another
    name, ResourceError when uvloop is asked for and not installed (it does not run on Windows)."""
    if kind == "asyncio":
        return asyncio.new_event_loop()
    if kind != "uvloop":
        raise InvalidInput(f"unknown event loop {kind!r}; choose one of {', '.join(EVENT_LOOPS)}")
    try:
        import uvloop
    except ImportError:
        raise ResourceError("--event-loop uvloop: uvloop is not installed; use asyncio") from None
    return uvloop.new_event_loop()


def build_profile(policy: str, seed: int = 0) -> Profile:
    """The standard filters and ``policy``'s score; fragmentation-aware policies (``default``,
    ``fgd``) judge fragments against the typical workload of ``core.workload.typical_workload``."""
    return make_profile(policy, PolicyContext(workload=typical_workload(), rng=np.random.default_rng(seed)))


def serve_extender(
    kubeconfig: str | None = None,
    port: int = DEFAULT_PORT,
    policy: str = "default",
    tls_cert: str | None = None,
    tls_key: str | None = None,
    host: str = "0.0.0.0",
    bind_threads: int = 32,
    log_level: str = "info",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    sync_wait_s: float = DEFAULT_SYNC_WAIT_S,
    pick_in_filter: bool = True,
    event_loop: str = "uvloop",
) -> None:
    """Serve the gpusched kube-scheduler extender until interrupted.

    Watches nodes and pods through the API (``kubeconfig``, else ``$KUBECONFIG``, else the
    in-cluster service account) and answers kube-scheduler's ``/filter``, ``/prioritize``,
    ``/bind`` and ``/preempt`` on ``host:port`` (HTTPS when ``tls_cert`` and ``tls_key`` are
    given), with ``/healthz``, ``/readyz`` (informers synced) and ``/metrics``. ``policy`` is a
    placement policy of ``gpusched policies``; binding API calls use up to ``bind_threads``
    threads. Point kube-scheduler at it with ``deploy/extender/scheduler-config.yaml``.
    Request bodies over ``max_body_bytes`` get HTTP 413; until the informers have synced each
    verb waits up to ``sync_wait_s`` seconds, then refuses (kube-scheduler retries the pod).
    With ``pick_in_filter``, ``/filter`` answers with the one node the policy chooses among the
    sent ones, so kube-scheduler skips scoring and ``/prioritize``; without it, every passing node
    is returned and kube-scheduler weighs ``/prioritize``'s scores with its own plugins'.
    ``event_loop``: ``uvloop`` or ``asyncio`` (``EVENT_LOOPS``).
    """
    from aiohttp import web
    from kubernetes import client

    from gpusched.extender.apibind import AsyncAPIBinder
    from gpusched.extender.app import limit_heap_growth, make_app
    from gpusched.extender.handlers import Extender
    from gpusched.k8s.binder import APIBinder
    from gpusched.k8s.claims import DraClaims
    from gpusched.k8s.client import api_client
    from gpusched.k8s.events import EventRecorder
    from gpusched.k8s.heap import freeze_heap, freeze_when
    from gpusched.k8s.podevents import PodFeed
    from gpusched.k8s.process import configure_logging
    from gpusched.k8s.state import LiveCluster, start_informers

    configure_logging(log_level)
    if policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if bool(tls_cert) != bool(tls_key):
        raise InvalidInput("--tls-cert and --tls-key go together")
    if max_body_bytes < 4096:
        raise InvalidInput(f"--max-body-bytes must be at least 4096, got {max_body_bytes}")
    if not 0 <= sync_wait_s <= 60:
        raise InvalidInput(
            f"--sync-wait-seconds must be 0-60 (under kube-scheduler's httpTimeout), got {sync_wait_s}"
        )
    loop = new_event_loop(event_loop)
    ssl_ctx = None
    if tls_cert and tls_key:
        ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_ctx.load_cert_chain(tls_cert, tls_key)
        except OSError as e:
            raise ResourceError(f"--tls-cert {tls_cert} / --tls-key {tls_key}: {e}") from None
    core = client.CoreV1Api(api_client(kubeconfig, qps_pool=bind_threads))

    def get_pod(namespace: str, name: str) -> Mapping[str, Any]:
        resp: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
        obj: Mapping[str, Any] = orjson.loads(resp.data)
        return obj

    def node_pods(node: str) -> list[Mapping[str, Any]]:
        resp: Any = core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        items: list[Mapping[str, Any]] = orjson.loads(resp.data).get("items") or []
        return items

    cluster = LiveCluster(reporter=EventRecorder(core, "gpusched-extender"))  # nodes unreadable, conflicts
    extender = Extender(
        cluster,
        build_profile(policy),
        binder=APIBinder(core, in_binding=True, mig=cluster),  # MIG slices from the books (issue 31)
        pod_getter=get_pod,
        node_pods=node_pods,  # a nominated pod failing on its node: the books checked against the API
        pick=pick_in_filter,
    )
    # each pod event parsed once (k8s/podevents.py), for the books, then the extender's UIDs and pods
    reflectors = start_informers(core, cluster, PodFeed([cluster, extender]))
    # DRA: GPUs that claims hold on nodes the agent also serves are booked as taken (docs/dra.md)
    dra = DraClaims(core.api_client, cluster=cluster)
    dra.start()
    pool = ThreadPoolExecutor(max_workers=bind_threads, thread_name_prefix="gpusched-bind")
    limit_heap_growth()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    def synced() -> bool:
        return all(r.synced.is_set() for r in reflectors) and dra.synced()

    app = make_app(
        extender,
        ready=synced,
        executor=pool,
        sync_wait_s=sync_wait_s,
        max_body_bytes=max_body_bytes,
        first_binder=AsyncAPIBinder(core.api_client.configuration, mig=cluster),
    )
    freeze_heap("start-up")  # the modules: out of every full pass of the cycle collector
    freeze_when(synced, "informers synced")  # and the books of the nodes and pods listed
    log.info(
        "gpusched extender: policy %s%s, listening on %s:%d (%s, %s event loop)",
        policy,
        ", /filter picks the node" if pick_in_filter else "",
        host,
        port,
        "https" if ssl_ctx else "http",
        event_loop,
    )
    try:
        web.run_app(app, host=host, port=port, ssl_context=ssl_ctx, access_log=None, print=None, loop=loop)
    except OSError as e:  # the address is taken or not ours
        raise ResourceError(f"cannot serve on {host}:{port}: {e}") from None
    finally:
        for r in reflectors:
            r.stop()
        dra.stop()
        pool.shutdown(wait=False, cancel_futures=True)


extender_command = serve_extender  # the name the tests and scripts know
