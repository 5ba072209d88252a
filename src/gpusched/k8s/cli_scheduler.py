"""``gpusched scheduler``: run the standalone scheduler against a cluster.

Registered by ``gpusched.cli``; also runnable as ``python -m gpusched.k8s.cli_scheduler``.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from gpusched.k8s.httpserver import ProbeServer, text
from gpusched.k8s.leader import LeaderElector, default_identity
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.metrics.scheduling import CONTENT_TYPE

log = logging.getLogger("gpusched.scheduler")


def scheduler_command(
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    ] = None,
    scheduler_name: Annotated[
        str, typer.Option(help="schedule pods with this spec.schedulerName")
    ] = "gpusched",
    policy: Annotated[str, typer.Option(help="placement policy (default, fgd, bestfit, ...)")] = "default",
    namespace: Annotated[str, typer.Option(help="namespace of the leader-election Lease")] = "kube-system",
    port: Annotated[int, typer.Option(help="port of /healthz, /readyz and /metrics (0: any)")] = 10251,
    leader_elect: Annotated[bool, typer.Option(help="elect a leader among replicas via a Lease")] = True,
    lease_name: Annotated[str, typer.Option(help="name of the Lease")] = "gpusched-scheduler",
    workload_trace: Annotated[
        Path | None,
        typer.Option(help="pod CSV (Alibaba openb format) giving the target workload; default: learnt"),
    ] = None,
    bind_workers: Annotated[int, typer.Option(help="concurrent bindings")] = 16,
    profile_refresh_s: Annotated[float, typer.Option(help="relearn the target workload this often")] = 300.0,
    flush_s: Annotated[float, typer.Option(help="retry unschedulable pods at least this often")] = 30.0,
    preemption: Annotated[
        bool, typer.Option(help="evict lower-priority pods to make room for a pod that fits nowhere")
    ] = True,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Run the standalone GPU scheduler: binds pending pods whose spec.schedulerName matches,
    writes the GPU assignment annotation, emits Scheduled / FailedScheduling events, and serves
    /healthz, /readyz and /metrics. With --leader-elect only the Lease holder schedules.
    Stops cleanly on SIGTERM or SIGINT (releasing the Lease)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpusched.k8s.client import api_client

    workload = None
    if workload_trace is not None:
        from gpusched.core.fragmentation import TargetWorkload
        from gpusched.sim.traces import read_pods

        workload = TargetWorkload.from_pods(p.spec for p in read_pods(workload_trace))
    api = api_client(kubeconfig, qps_pool=max(32, 2 * bind_workers))
    identity = default_identity()
    cfg = SchedulerConfig(
        scheduler_name=scheduler_name,
        policy=policy,
        workload=workload,
        profile_refresh_s=profile_refresh_s,
        bind_workers=bind_workers,
        flush_s=flush_s,
        identity=identity,
        preemption=preemption,
    )
    sched = StandaloneScheduler(api, cfg)
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
    log.info("gpusched scheduler %s: schedulerName=%s policy=%s port=%d", identity, scheduler_name, policy,
             server.port)  # fmt: skip
    stop.wait()
    log.info("shutting down")
    sched.stop()  # stops deciding, finishes the bindings in flight
    if elector is not None:
        elector.stop(release=True)  # then hands the Lease over
    server.stop()


def main() -> None:
    typer.run(scheduler_command)


if __name__ == "__main__":
    main()
