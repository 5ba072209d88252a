"""``gpusched scheduler``, ``gpusched extender`` and ``gpusched webhook``: the two Kubernetes front ends
and the share pods' admission webhook, served.

The options are defined here, once; ``gpusched.cli.main`` (``gpusched scheduler|extender|webhook``,
``python -m gpusched.cli ...``: the webhook Deployment's command) parses them through ``standalone``,
without loading the rest of the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from gpusched.cli.common import reports_errors
from gpusched.cli.policies import check_policies
from gpusched.extender.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_SYNC_WAIT_S


@reports_errors
def scheduler(
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
    defrag_lease_name: Annotated[
        str,
        typer.Option(
            help="the defragmentation Lease (in --namespace): its rooms are held while it records them"
        ),
    ] = "gpusched-defrag",
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
    preemption_limit: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="preemptions one pod may make on one node within --preemption-window-s",
        ),
    ] = 3,
    preemption_window_s: Annotated[
        float, typer.Option(metavar="SECONDS", help="the window of --preemption-limit")
    ] = 600.0,
    gang_topology_levels: Annotated[
        str,
        typer.Option(
            metavar="KEY,KEY,...",
            help="node label keys of the topology domains gangs may ask for "
            "(gpusched.io/topology-required|preferred), narrowest first "
            "(default: nvidia.com/gpu.clique, gpusched.io/rack, gpusched.io/block)",
            show_default=False,
        ),
    ] = "nvidia.com/gpu.clique,gpusched.io/rack,gpusched.io/block",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Run the standalone GPU scheduler: binds pending pods whose spec.schedulerName matches,
    writes the GPU assignment annotation, emits Scheduled / FailedScheduling events, and serves
    /healthz, /readyz and /metrics. With --leader-elect only the Lease holder schedules.
    Stops cleanly on SIGTERM or SIGINT (releasing the Lease)."""
    from gpusched.core.gangtopology import InvalidTopology, TopologyLevels
    from gpusched.k8s.scheduler import SchedulerConfig
    from gpusched.k8s.serve import serve_scheduler

    try:
        levels = TopologyLevels.parse(gang_topology_levels)
    except InvalidTopology as e:
        raise typer.BadParameter(f"--gang-topology-levels: {e}") from None

    if preemption_limit < 1:
        raise typer.BadParameter(f"--preemption-limit must be at least 1, got {preemption_limit}")
    if not preemption_window_s > 0:
        raise typer.BadParameter(f"--preemption-window-s must be above 0, got {preemption_window_s}")
    workload = None
    if workload_trace is not None:
        from gpusched.core.fragmentation import TargetWorkload
        from gpusched.sim.traces import read_pods

        workload = TargetWorkload.from_pods(p.spec for p in read_pods(workload_trace))
    config = SchedulerConfig(
        scheduler_name=scheduler_name,
        policy=policy,
        workload=workload,
        profile_refresh_s=profile_refresh_s,
        bind_workers=bind_workers,
        flush_s=flush_s,
        preemption=preemption,
        preemption_limit=preemption_limit,
        preemption_window_s=preemption_window_s,
        gang_topology_levels=levels,
        defrag_lease=f"{namespace}/{defrag_lease_name}",
    )
    serve_scheduler(
        config,
        kubeconfig=kubeconfig,
        namespace=namespace,
        port=port,
        leader_elect=leader_elect,
        lease_name=lease_name,
        log_level=log_level,
    )


@reports_errors
def extender(
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig (default: $KUBECONFIG, else in-cluster).")
    ] = None,
    port: Annotated[
        int, typer.Option(help="Port for /filter, /prioritize, /bind, /preempt, /metrics.")
    ] = 8888,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Placement policy.")] = "default",
    tls_cert: Annotated[str | None, typer.Option(help="Serve HTTPS with this certificate (PEM).")] = None,
    tls_key: Annotated[str | None, typer.Option(help="Key of --tls-cert (PEM).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    bind_threads: Annotated[int, typer.Option(help="Concurrent binding API calls.")] = 32,
    log_level: Annotated[str, typer.Option(help="debug, info, warning.")] = "info",
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body, HTTP 413 above (nodeCacheCapable false: all nodes).")
    ] = DEFAULT_MAX_BODY_BYTES,
    sync_wait_seconds: Annotated[
        float, typer.Option(help="How long a verb waits for the informers to sync before refusing.")
    ] = DEFAULT_SYNC_WAIT_S,
    pick_in_filter: Annotated[
        bool,
        typer.Option(
            help="/filter answers with the one node the policy picks (kube-scheduler then skips scoring "
            "and /prioritize); --no-pick-in-filter returns every passing node for kube-scheduler to score."
        ),
    ] = True,
    event_loop: Annotated[
        str, typer.Option(help="Event loop of the HTTP server and the bindings: uvloop or asyncio.")
    ] = "uvloop",
) -> None:
    """Serve the kube-scheduler extender (see deploy/extender/scheduler-config.yaml)."""
    from gpusched.extender.serve import serve_extender

    check_policies([policy])
    serve_extender(
        kubeconfig,
        port,
        policy,
        tls_cert,
        tls_key,
        host,
        bind_threads,
        log_level,
        max_body_bytes=max_body_bytes,
        sync_wait_s=sync_wait_seconds,
        pick_in_filter=pick_in_filter,
        event_loop=event_loop,
    )


@reports_errors
def webhook(
    tls_cert_file: Annotated[
        Path, typer.Option(help="PEM certificate the webhook serves (the Secret's tls.crt).", exists=True)
    ] = Path("/etc/gpusched/tls/tls.crt"),
    tls_key_file: Annotated[
        Path, typer.Option(help="PEM key of that certificate (the Secret's tls.key).", exists=True)
    ] = Path("/etc/gpusched/tls/tls.key"),
    port: Annotated[int, typer.Option(help="HTTPS port for /mutate, /guard, /route and /healthz.")] = 8443,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    assignment_writer: Annotated[
        list[str] | None,
        typer.Option(
            help="A user (userInfo.username) who may write gpusched.io/assignment; repeat it. Default: "
            "gpusched-system's service accounts gpusched (the scheduler) and gpusched-extender."
        ),
    ] = None,
    allocated_writer: Annotated[
        list[str] | None,
        typer.Option(
            help="A user who may write gpusched.io/allocated; repeat it. Default: gpusched-node's service "
            "account gpusched-agent (the node agent)."
        ),
    ] = None,
    scheduler_name: Annotated[
        list[str] | None,
        typer.Option(
            help="gpusched's scheduler name; repeat it for several. /route gives GPU pods that name none of "
            "them the first. None: /route routes nothing."
        ),
    ] = None,
) -> None:
    """Admission webhook: give every container of a GPU share (gpusched.io/gpu-milli and/or
    gpusched.io/gpu-memory) the node agent's gpusched.io/gpu-share: 1 slot and deny share requests that
    cannot be scheduled (/mutate); deny gpusched.io/assignment and gpusched.io/allocated written by anyone
    but their writers (/guard); route GPU pods to gpusched (/route)."""
    import logging

    from gpusched.webhook.guard import Writers
    from gpusched.webhook.route import Routing
    from gpusched.webhook.server import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    writers = Writers.of(assignment_writer or (), allocated_writer or ())
    serve(host, port, tls_cert_file, tls_key_file, writers, Routing.of(scheduler_name or ()))


def standalone(
    command: Callable[..., None], name: str, argv: Sequence[str] | None = None, *, bare: bool = True
) -> None:
    """Run one command alone, without loading the rest of the CLI: the same options, parsed from
    ``argv`` (default: ``sys.argv[1:]``). ``bare``: errors raised as they are (no ``run_cli``; the
    ``*_main`` functions, for callers that catch them); else reported as by the whole app
    (``gpusched.cli.main``)."""
    app = typer.Typer(add_completion=False)
    app.command(name)(getattr(command, "__wrapped__", command) if bare else command)
    typer.main.get_command(app).main(
        args=list(argv) if argv is not None else None, prog_name=f"gpusched {name}"
    )


def scheduler_main(argv: Sequence[str] | None = None) -> None:
    standalone(scheduler, "scheduler", argv)


def extender_main(argv: Sequence[str] | None = None) -> None:
    standalone(extender, "extender", argv)


def webhook_main(argv: Sequence[str] | None = None) -> None:
    standalone(webhook, "webhook", argv)


SERVED: dict[str, Callable[..., None]] = {"scheduler": scheduler, "extender": extender, "webhook": webhook}
"""The long-running front ends ``gpusched.cli.main`` starts through ``standalone``."""
