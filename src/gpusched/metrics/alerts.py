"""gpusched's Prometheus alert rules: one source for the plain rules file
(``deploy/prometheus/gpusched-rules.yaml``) and the chart's PrometheusRule (the same groups, read
by ``templates/prometheusrule.yaml``); ``hack/gen-dashboards.py`` writes both.

Where the series come from:

- ``scheduler_*``, ``leader_election_master_status``, ``gpusched_*``: the standalone scheduler
  (scrape job ``gpusched-scheduler``) and the extender (job ``gpusched-extender``);
- ``DCGM_FI_*``: the node agent's exporter, or NVIDIA's dcgm-exporter (same names);
- ``kube_node_status_condition``, ``kube_node_status_allocatable``, ``kube_resourcequota``:
  kube-state-metrics (not part of gpusched; installed with kube-prometheus-stack);
- ``up``: Prometheus itself, per scrape job.

The scrape jobs must be named ``JOBS`` (a ServiceMonitor's ``jobLabel``, or ``job_name`` in a
scrape config); ``up`` alerts match them by name.

``GPUSchedQueueQuotaExhausted`` reads ``gpusched_queue_*``, which the standalone scheduler
exposes for its tenant queues (``Queue`` objects): one alert per queue and quota dimension
(``resource``, and ``model`` for a per-model quota) used up while pods wait in the queue.
``GPUSchedResourceQuotaExhausted`` covers Kubernetes ResourceQuotas on GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

SCHEDULER_JOB = "gpusched-scheduler"
EXTENDER_JOB = "gpusched-extender"
AGENT_JOB = "gpusched-agent"
JOBS = (SCHEDULER_JOB, EXTENDER_JOB, AGENT_JOB)
GROUP = "gpusched"


@dataclass(frozen=True)
class Thresholds:
    stranded_ratio: float = 0.3
    """Stranded over free GPU capacity of a (model, pool) above which it alerts..."""
    stranded_gpus: float = 1.0
    """...when at least this many GPUs are stranded."""
    p99_seconds: float = 1.0
    """Scheduling attempt p99 latency (scheduler) and filter/prioritize p99 (extender)."""
    rate_window: str = "5m"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    summary: str
    description: str
    for_: str = "5m"
    severity: str = "warning"
    source: str = "gpusched"
    labels: dict[str, str] = field(default_factory=dict)

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ and self.for_ != "0s":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {"summary": self.summary, "description": self.description}
        return out


def _dedup(metric: str, by: str) -> str:
    """The scheduler, the extender and standby replicas expose the same books: one value per group."""
    return f"max by ({by}) ({metric})"


def alerts(t: Thresholds | None = None) -> list[Alert]:
    t = t or Thresholds()
    w = t.rate_window
    pending = 'scheduler_pending_pods{queue=~"active|backoff|unschedulable"}'
    stranded = _dedup("gpusched_gpus_stranded", "model, pool")
    free = _dedup("gpusched_gpus_free", "model, pool")
    idle = _dedup('gpusched_gpus{state="idle"}', "model, pool")
    queue_usage = _dedup("gpusched_queue_resource_usage", "queue, resource, model")
    queue_quota = _dedup("gpusched_queue_resource_quota", "queue, resource, model")
    return [
        Alert(
            "GPUSchedGPUsIdleWhilePodsPending",
            f"sum({idle}) > 0\nand on () sum(max by (queue) ({pending})) > 0",
            "GPUs are idle while GPU pods wait",
            "{{ $value }} GPU(s) idle while gpusched has pods pending: the pending pods cannot use them "
            "(model, selector, taint, memory?). Run `gpusched doctor cluster`.",
            for_="10m",
        ),
        Alert(
            "GPUSchedStrandedCapacityHigh",
            f"({stranded} / ({free} > 0)) > {t.stranded_ratio:g}\nand {stranded} >= {t.stranded_gpus:g}",
            "Free GPU capacity is stranded in {{ $labels.model }} / {{ $labels.pool }}",
            "{{ $value | humanizePercentage }} of the free {{ $labels.model }} capacity in pool "
            "{{ $labels.pool }} cannot be used by the current workload (fragmentation).",
            for_="30m",
        ),
        Alert(
            "GPUSchedGPUXidError",
            "max by (Hostname, gpu, UUID, modelName) (DCGM_FI_DEV_XID_ERRORS) > 0",
            "XID {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
            "The GPU reported XID error {{ $value }} (DCGM_FI_DEV_XID_ERRORS, the last XID seen).",
            for_="0s",
            severity="critical",
            source="agent or dcgm-exporter",
        ),
        Alert(
            "GPUSchedGPUUnhealthy",
            "max by (node, gpu, model) (gpusched_gpu_healthy) == 0",
            "GPU {{ $labels.gpu }} of {{ $labels.node }} is unhealthy",
            "The node agent marked the GPU unhealthy (gpusched.io/unhealthy-gpus): it takes no new pods.",
            for_="1m",
            severity="critical",
        ),
        Alert(
            "GPUSchedGPUNodeNotReady",
            'kube_node_status_condition{condition="Ready", status="true"} == 0\n'
            'and on (node) max by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"}) > 0',
            "GPU node {{ $labels.node }} is NotReady",
            "The GPU node has not been Ready for 5 minutes; its GPUs take no pods.",
            severity="critical",
            source="kube-state-metrics",
        ),
        Alert(
            "GPUSchedSchedulerDown",
            f'up{{job="{SCHEDULER_JOB}"}} == 0',
            "The gpusched scheduler {{ $labels.instance }} is down",
            "Prometheus cannot scrape the gpusched scheduler: GPU pods are not being placed.",
            for_="2m",
            severity="critical",
            source="prometheus",
        ),
        Alert(
            "GPUSchedExtenderDown",
            f'up{{job="{EXTENDER_JOB}"}} == 0',
            "The gpusched extender {{ $labels.instance }} is down",
            "Prometheus cannot scrape the gpusched extender: kube-scheduler's GPU filter fails.",
            for_="2m",
            severity="critical",
            source="prometheus",
        ),
        Alert(
            "GPUSchedSchedulingLatencyHigh",
            f"histogram_quantile(0.99, sum by (le, profile) "
            f"(rate(scheduler_scheduling_attempt_duration_seconds_bucket[{w}]))) > {t.p99_seconds:g}",
            "gpusched p99 scheduling latency is {{ $value | humanizeDuration }}",
            f"The 99th percentile of scheduling attempts of profile {{{{ $labels.profile }}}} is over "
            f"{t.p99_seconds:g} s.",
            for_="10m",
        ),
        Alert(
            "GPUSchedExtenderLatencyHigh",
            f"histogram_quantile(0.99, sum by (le, verb) "
            f'(rate(gpusched_extender_request_duration_seconds_bucket{{verb=~"filter|prioritize"}}[{w}]))) '
            f"> {t.p99_seconds:g}",
            "gpusched extender p99 {{ $labels.verb }} latency is {{ $value | humanizeDuration }}",
            f"kube-scheduler waits on the extender's {{{{ $labels.verb }}}}: p99 over {t.p99_seconds:g} s.",
            for_="10m",
        ),
        Alert(
            "GPUSchedQueueQuotaExhausted",
            f"{queue_usage}\n>= {queue_quota}\n"
            f"and on (queue) {_dedup('gpusched_queue_pending_pods', 'queue')} > 0",
            "Queue {{ $labels.queue }} has used its {{ $labels.resource }} quota"
            "{{ if $labels.model }} of {{ $labels.model }}{{ end }} and has pods waiting",
            "{{ $value }} {{ $labels.resource }} in use of its quota: its pending pods are admitted when its "
            "own pods end or its cohort lends idle quota (within its borrowingLimit). "
            "`kubectl get queue {{ $labels.queue }}` shows its quota, usage and borrowing.",
            for_="15m",
            severity="info",
        ),
        Alert(
            "GPUSchedResourceQuotaExhausted",
            'kube_resourcequota{type="used", resource=~"requests.nvidia.com/gpu|requests.gpusched.io/.*"}\n'
            '>= on (namespace, resourcequota, resource) kube_resourcequota{type="hard"} > 0',
            "{{ $labels.namespace }} has used its {{ $labels.resource }} quota",
            "The ResourceQuota {{ $labels.resourcequota }} is exhausted: new GPU pods are refused.",
            for_="15m",
            severity="info",
            source="kube-state-metrics",
        ),
        Alert(
            "GPUSchedNoLeader",
            f'max by (name) (leader_election_master_status{{job="{SCHEDULER_JOB}"}}) < 1',
            "No gpusched scheduler replica leads lease {{ $labels.name }}",
            "Replicas are up but none holds the leader Lease: no pod is being scheduled.",
            for_="5m",
            severity="critical",
        ),
    ]


def rule_groups(t: Thresholds | None = None, *, for_override: str | None = None) -> dict[str, Any]:
    """The rules file (``groups:``). ``for_override``: every alert's ``for`` (tests: ``0s``)."""
    rules = [(replace(a, for_=for_override) if for_override is not None else a).rule() for a in alerts(t)]
    return {"groups": [{"name": GROUP, "rules": rules}]}
