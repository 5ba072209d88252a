"""gpusched's Grafana dashboards as code (``grafana-foundation-sdk``, the ``dev`` extra).

``hack/gen-dashboards.py`` writes them to ``deploy/helm/gpusched/dashboards/*.json``; the chart
ships each as a ConfigMap labelled ``grafana_dashboard: "1"`` (Grafana's sidecar), and
``tests/test_dashboards.py`` checks the committed JSON is this module's output.

Every panel query is plain PromQL on one Prometheus data source (the ``datasource`` variable);
the only Grafana macro is ``$__rate_interval``. GPU metrics use dcgm-exporter's names
(``DCGM_FI_*``, labels ``Hostname``, ``gpu``, ``modelName``, ``namespace``, ``pod``), so the
node agent and NVIDIA's dcgm-exporter both feed them. The scheduler and the extender expose the
same books, so gpusched's gauges are read through ``max by (...)``.

The "Tenants and queues" dashboard's queue panels read ``gpusched_queue_*``, which the standalone
scheduler exposes for its tenant queues (``Queue`` objects); its per-namespace panels read
dcgm-exporter's pod mapping.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DS = "${datasource}"
RI = "$__rate_interval"
UID_PREFIX = "gpusched-"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # timeseries | stat | table
    unit: str = ""
    description: str = ""
    width: int = 12
    height: int = 8
    stack: bool = False


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    panels: tuple[PanelSpec, ...]
    tags: tuple[str, ...] = field(default=("gpusched", "gpu"))


def _q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def _p(title: str, *queries: Query, **kw: Any) -> PanelSpec:
    return PanelSpec(title, tuple(queries), **kw)


def _books(metric: str, by: str = "model, pool") -> str:
    return f"max by ({by}) ({metric})"


GPUS_BY_STATE = "max by (model, pool, state) (gpusched_gpus)"
ALLOCATED = _books("gpusched_gpus_allocated")
STRANDED = _books("gpusched_gpus_stranded")
PENDING = 'scheduler_pending_pods{queue=~"active|backoff|unschedulable"}'
MIG = "max by (node, model, profile, state) (gpusched_mig_instances)"
MIG_PENDING = "max by (profile) (gpusched_mig_pending_slices)"
MIG_FREE = 'max by (node, model, profile) (gpusched_mig_instances{state="free"})'


def specs() -> list[DashboardSpec]:
    overview = DashboardSpec(
        "overview",
        "gpusched / Cluster overview",
        "GPUs, their allocation, stranded capacity and pending pods, by GPU model and node pool.",
        (
            _p("GPUs", _q(f"sum({GPUS_BY_STATE})"), kind="stat", width=4, height=4),
            _p(
                "GPUs allocated",
                _q(f"sum({_books('gpusched_gpus_allocated')})"),
                kind="stat",
                width=4,
                height=4,
            ),
            _p(
                "Allocation",
                _q(f"sum({ALLOCATED}) / sum({GPUS_BY_STATE})"),
                kind="stat",
                unit="percentunit",
                width=4,
                height=4,
            ),
            _p(
                "GPUs stranded",
                _q(f"sum({_books('gpusched_gpus_stranded')})"),
                kind="stat",
                width=4,
                height=4,
            ),
            _p("Pending pods", _q(f"sum(max by (queue) ({PENDING}))"), kind="stat", width=4, height=4),
            _p(
                "Unhealthy GPUs",
                _q(f"sum({_books('gpusched_gpus{state=' + chr(34) + 'unhealthy' + chr(34) + '}')})"),
                kind="stat",
                width=4,
                height=4,
            ),
            _p("GPUs by state", _q(GPUS_BY_STATE, "{{model}} {{pool}} {{state}}"), stack=True),
            _p(
                "GPUs allocated / total",
                _q(_books("gpusched_gpus_allocated"), "allocated {{model}} {{pool}}"),
                _q("sum by (model, pool) (" + GPUS_BY_STATE + ")", "total {{model}} {{pool}}"),
            ),
            _p(
                "GPU memory allocated",
                _q(
                    _books("gpusched_gpu_memory_allocated_bytes")
                    + " / "
                    + _books("gpusched_gpu_memory_bytes"),
                    "{{model}} {{pool}}",
                ),
                unit="percentunit",
            ),
            _p(
                "Stranded GPU capacity",
                _q(_books("gpusched_gpus_stranded"), "stranded {{model}} {{pool}}"),
                _q(_books("gpusched_gpus_free"), "free {{model}} {{pool}}"),
                description="Free GPU capacity the current target workload cannot use (FGD's fragmentation).",
            ),
            _p(
                "Fragmentation ratio",
                _q(_books("gpusched_gpu_fragmentation_ratio"), "{{model}} {{pool}}"),
                unit="percentunit",
            ),
            _p(
                "GPU utilization (DCGM)",
                _q("avg by (modelName) (DCGM_FI_DEV_GPU_UTIL)", "{{modelName}}"),
                unit="percent",
            ),
            _p(
                "MIG instances by profile and state",
                _q(f"sum by (profile, state) ({MIG})", "{{profile}} {{state}}"),
                stack=True,
                description="MIG instances present on GPUs in MIG mode: held by a pod, free, or on a GPU "
                "being re-cut (gpusched_mig_instances).",
            ),
            _p(
                "MIG slices pending vs free",
                _q(MIG_PENDING, "pending {{profile}}"),
                _q(
                    f"sum by (profile) ({MIG.replace('gpusched_mig_instances', MIG_FREE)})",
                    "free {{profile}}",
                ),
                description="Slices pending pods ask for against free instances of the profile: pending with "
                "none free is what a re-cut serves.",
            ),
        ),
    )
    gpu_map = DashboardSpec(
        "gpu-map",
        "gpusched / GPU map",
        "Every GPU of every node: what gpusched booked on it and what DCGM measures.",
        (
            _p(
                "Allocated share per GPU",
                _q("max by (node, gpu, model) (gpusched_gpu_allocated_ratio)", "{{node}}/{{gpu}}"),
                kind="table",
                unit="percentunit",
                width=24,
                height=10,
            ),
            _p(
                "MIG instances per node and profile",
                _q(MIG, "{{node}} {{profile}} {{state}}"),
                kind="table",
                width=24,
                description="Per node, MIG model and profile: instances held by pods, free, and on a GPU "
                "being re-cut (gpusched_mig_instances; doctor node and gpusched ui show each slice's start "
                "and pod).",
            ),
            _p(
                "GPU health (gpusched)",
                _q("max by (node, gpu) (gpusched_gpu_healthy)", "{{node}}/{{gpu}}"),
                kind="table",
                width=12,
            ),
            _p(
                "Last XID (DCGM)",
                _q("max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS)", "{{Hostname}}/{{gpu}}"),
                kind="table",
                width=12,
            ),
            _p(
                "GPU utilization",
                _q("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}}/{{gpu}}"),
                unit="percent",
            ),
            _p(
                "Framebuffer used",
                _q(
                    "max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) / (max by (Hostname, gpu) "
                    "(DCGM_FI_DEV_FB_USED) + max by (Hostname, gpu) (DCGM_FI_DEV_FB_FREE))",
                    "{{Hostname}}/{{gpu}}",
                ),
                unit="percentunit",
            ),
            _p(
                "Temperature",
                _q("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP)", "{{Hostname}}/{{gpu}}"),
                unit="celsius",
            ),
            _p(
                "Power",
                _q("max by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)", "{{Hostname}}/{{gpu}}"),
                unit="watt",
            ),
            _p(
                "GPUs by pod",
                _q(
                    'count by (namespace, pod, Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{pod!=""})',
                    "{{namespace}}/{{pod}} on {{Hostname}}/{{gpu}}",
                ),
                kind="table",
                width=24,
            ),
        ),
    )
    scheduling = DashboardSpec(
        "scheduling",
        "gpusched / Scheduling latency and throughput",
        "Scheduling attempts, their latency, bindings, the extender's verbs, preemption and leadership.",
        (
            _p(
                "Attempts by result",
                _q(
                    f"sum by (result, profile) (rate(scheduler_schedule_attempts_total[{RI}]))",
                    "{{profile}} {{result}}",
                ),
                unit="ops",
            ),
            _p(
                "Attempt latency",
                *(
                    _q(
                        f"histogram_quantile({q}, sum by (le) "
                        f"(rate(scheduler_scheduling_attempt_duration_seconds_bucket[{RI}])))",
                        f"p{round(q * 100)}",
                    )
                    for q in (0.5, 0.9, 0.99)
                ),
                unit="s",
            ),
            _p(
                "Binding latency p99",
                _q(
                    f"histogram_quantile(0.99, sum by (le, result) "
                    f"(rate(gpusched_binding_duration_seconds_bucket[{RI}])))",
                    "{{result}}",
                ),
                unit="s",
            ),
            _p(
                "Bindings",
                _q(f"sum by (result) (rate(gpusched_binding_duration_seconds_count[{RI}]))", "{{result}}"),
                unit="ops",
            ),
            _p(
                "Extender requests",
                _q(
                    f"sum by (verb) (rate(gpusched_extender_request_duration_seconds_count[{RI}]))",
                    "{{verb}}",
                ),
                unit="reqps",
            ),
            _p(
                "Extender latency p99",
                _q(
                    f"histogram_quantile(0.99, sum by (le, verb) "
                    f"(rate(gpusched_extender_request_duration_seconds_bucket[{RI}])))",
                    "{{verb}}",
                ),
                unit="s",
            ),
            _p(
                "Preemptions",
                _q(f"sum(rate(scheduler_preemption_attempts_total[{RI}]))", "attempts"),
                _q(f"sum(rate(scheduler_preemption_victims_sum[{RI}]))", "victims"),
                unit="ops",
            ),
            _p(
                "Leader",
                _q("max by (name, instance) (leader_election_master_status)", "{{name}} {{instance}}"),
                kind="table",
            ),
            _p("Up", _q('up{job=~"gpusched-.*"}', "{{job}} {{instance}}"), kind="table"),
        ),
    )
    pending = DashboardSpec(
        "pending",
        "gpusched / Pending pods and reasons",
        "Why pods wait: the scheduler's queues, the reason most nodes gave, the rejecting plugin.",
        (
            _p("Pending pods by queue", _q(f"max by (queue) ({PENDING})", "{{queue}}"), stack=True),
            _p(
                "Pending pods by reason",
                _q("max by (reason) (gpusched_pending_pods_by_reason)", "{{reason}}"),
                stack=True,
            ),
            _p(
                "Unschedulable pods by plugin",
                _q("max by (plugin, profile) (scheduler_unschedulable_pods)", "{{profile}} {{plugin}}"),
                stack=True,
            ),
            _p(
                "Unschedulable attempts",
                _q(
                    f'sum(rate(scheduler_schedule_attempts_total{{result="unschedulable"}}[{RI}]))',
                    "attempts",
                ),
                unit="ops",
            ),
            _p(
                "Idle GPUs while pods pend",
                _q(_books('gpusched_gpus{state="idle"}'), "idle {{model}} {{pool}}"),
                _q(f"sum({PENDING})", "pending pods"),
            ),
            _p(
                "Pending reasons now",
                _q("sort_desc(max by (reason) (gpusched_pending_pods_by_reason))", "{{reason}}"),
                kind="table",
            ),
            _p("Pending MIG slices by profile", _q(MIG_PENDING, "{{profile}}"), stack=True, width=24),
        ),
    )
    queues = DashboardSpec(
        "queues",
        "gpusched / Tenants and queues",
        "GPU use by namespace (DCGM's pod mapping) and by tenant queue against its quota.",
        (
            _p(
                "GPUs in use by namespace",
                _q(
                    "count by (namespace) "
                    '(max by (namespace, Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{namespace!=""}))',
                    "{{namespace}}",
                ),
                stack=True,
            ),
            _p(
                "GPU utilization by namespace",
                _q('avg by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!=""})', "{{namespace}}"),
                unit="percent",
            ),
            _p(
                "Queue GPUs used / quota",
                _q("max by (queue) (gpusched_queue_gpus_used)", "used {{queue}}"),
                _q("max by (queue) (gpusched_queue_gpus_quota)", "quota {{queue}}"),
                _q("max by (queue) (gpusched_queue_gpus_borrowed)", "borrowed {{queue}}"),
                description="GPUs in the quota's dimension: whole GPUs when the Queue's quota is gpus, "
                "else gpuMilli / 1000. Borrowed: used over quota, lent by its cohort.",
            ),
            _p(
                "Queue quota usage",
                _q(
                    "max by (queue) (gpusched_queue_gpus_used) / max by (queue) (gpusched_queue_gpus_quota)",
                    "{{queue}}",
                ),
                unit="percentunit",
                description="Over 100%: the queue borrows. Queues without a GPU quota are not shown.",
            ),
            _p(
                "Queue pending pods",
                _q("max by (queue) (gpusched_queue_pending_pods)", "{{queue}}"),
                description="Pods waiting in the queue (an inner queue counts its leaves').",
            ),
        ),
    )
    return [overview, gpu_map, scheduling, pending, queues]


def _panel(spec: PanelSpec, x: int, y: int) -> Any:
    from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
    from grafana_foundation_sdk.builders.common import StackingConfig
    from grafana_foundation_sdk.models.common import StackingMode
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

    builder: Any
    if spec.kind == "stat":
        builder = stat.Panel()
    elif spec.kind == "table":
        builder = table.Panel()
    else:
        builder = timeseries.Panel().fill_opacity(10)
        if spec.stack:
            builder = builder.stacking(StackingConfig().mode(StackingMode.NORMAL))
    builder = builder.title(spec.title).datasource(DataSourceRef(type_val="prometheus", uid=DS))
    builder = builder.grid_pos(GridPos(h=spec.height, w=spec.width, x=x, y=y))
    if spec.unit:
        builder = builder.unit(spec.unit)
    if spec.description:
        builder = builder.description(spec.description)
    for i, q in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i))
        if q.legend:
            target = target.legend_format(q.legend)
        if spec.kind == "table":
            target = target.instant().format(_table_format())
        builder = builder.with_target(target)
    return builder


def _table_format() -> Any:
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    return PromQueryFormat.TABLE


def build(spec: DashboardSpec) -> dict[str, Any]:
    """The dashboard's JSON model (a dict)."""
    from grafana_foundation_sdk.builders.dashboard import Dashboard as DashboardBuilder
    from grafana_foundation_sdk.builders.dashboard import DatasourceVariable
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    d = (
        DashboardBuilder(spec.title)
        .uid(UID_PREFIX + spec.uid)
        .description(spec.description)
        .tags(list(spec.tags))
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    x = y = 0
    row_h = 0
    for p in spec.panels:
        if x + p.width > 24:
            x, y, row_h = 0, y + row_h, 0
        d = d.with_panel(_panel(p, x, y))
        x += p.width
        row_h = max(row_h, p.height)
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def render(spec: DashboardSpec) -> str:
    """The file's text: sorted keys, two-space indent, a final newline (stable diffs)."""
    return json.dumps(build(spec), indent=2, sort_keys=True) + "\n"


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of a dashboard's JSON model."""
    return [
        (p.get("title", ""), t["expr"])
        for p in dashboard.get("panels", [])
        for t in p.get("targets", [])
        if t.get("expr")
    ]
