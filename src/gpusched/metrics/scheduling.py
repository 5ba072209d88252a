"""Scheduling metrics, named and labelled as kube-scheduler's where one exists
(kubernetes/kubernetes ``pkg/scheduler/metrics/metrics.go``), so its dashboards work on gpusched:

- ``scheduler_schedule_attempts_total{result,profile}`` — scheduled | unschedulable | error
- ``scheduler_scheduling_attempt_duration_seconds{result,profile}`` — one scheduling cycle
- ``scheduler_pending_pods{queue}`` — active | backoff | unschedulable | gated
- ``scheduler_unschedulable_pods{plugin,profile}`` — pending pods by the plugin that last
  rejected them (kube-scheduler counts a pod once per rejecting plugin; here: its main plugin)
- ``scheduler_preemption_attempts_total`` — preemptions started (victims chosen)
- ``scheduler_preemption_victims`` — histogram: victims of each preemption
- ``leader_election_master_status{name}`` — 1 on the replica holding the Lease (client-go's name)

gpusched's own:

- ``gpusched_binding_duration_seconds{result}`` — annotate + bind through the API
- ``gpusched_extender_request_duration_seconds{verb}`` — extender filter/prioritize/bind/preempt
- ``gpusched_is_leader`` — as ``leader_election_master_status`` (kept: tests and scripts read it)
- ``gpusched_gpu_allocation_ratio`` — allocated / total GPU milli, whole cluster
- ``gpusched_pending_pods_by_reason{reason}`` — pending pods by the reason most nodes gave
- ``gpusched_event_writes_total{result}`` — the asynchronous writes of events, ``PodScheduled``
  conditions and group status: sent | dropped (the queue was full: the API cannot keep up) |
  failed (refused, or no answer) | stale (not sent: the pod was bound, replaced or
  deleted first, or a newer write of the same status went first)
- per ``{model,pool}`` (``metrics.cluster``): ``gpusched_nodes``, ``gpusched_gpus{state}``,
  ``gpusched_gpus_allocated``, ``gpusched_gpu_memory_bytes``,
  ``gpusched_gpu_memory_allocated_bytes``, ``gpusched_gpus_free``, ``gpusched_gpus_stranded``,
  ``gpusched_gpu_fragmentation_ratio``
- per GPU ``{node,gpu,model,pool}``: ``gpusched_gpu_allocated_ratio``, ``gpusched_gpu_healthy``
- per node and MIG profile ``{node,pool,model,profile,state}`` (``model``: the MIG model class, e.g.
  ``a100-80gb``; ``state``: held | free | reshaping; their sum is the instances present):
  ``gpusched_mig_instances``; per profile: ``gpusched_mig_pending_slices`` (slices pending pods ask for)
- per tenant queue ``{queue}`` (the standalone scheduler's ``Queue`` objects, published with
  their status: ``set_queue_statuses``; a deleted queue's series go with the next refresh):
  ``gpusched_queue_gpus_used``, ``gpusched_queue_gpus_quota`` (absent when GPUs are not limited),
  ``gpusched_queue_gpus_borrowed``, ``gpusched_queue_pending_pods``,
  ``gpusched_queue_admitted_pods``; in GPUs of the quota's dimension (whole GPUs when the quota
  is ``gpus``, else milli-GPU / 1000)
- per tenant queue and quota dimension ``{queue,resource,model}`` (``resource``: gpus, gpu_milli,
  gpu_memory_mib; ``model`` absent for the total, as Kueue's per-flavor
  ``kueue_cluster_queue_resource_usage``): ``gpusched_queue_resource_usage``,
  ``gpusched_queue_resource_quota`` and ``gpusched_queue_resource_borrowed`` (limited dimensions
  only)
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gpusched.core.queues.spec import ANY_MODEL, ResourceKey
from gpusched.core.queues.status import QueueStatus
from gpusched.core.status import Diagnosis, Status
from gpusched.metrics.cluster import ClusterStats

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_VICTIM_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # kube-scheduler: exponential 1, 2, 7 buckets

CONTENT_TYPE = CONTENT_TYPE_LATEST

PENDING_QUEUES = ("active", "backoff", "unschedulable", "gated")


@dataclass(frozen=True)
class QueueResource:
    """One dimension of a queue's books: ``resource`` (a ``core.queues.spec.DIMENSIONS`` name) of
    ``model`` ("" = every model); ``quota`` None when the dimension is not limited."""

    resource: str
    model: str
    usage: int
    quota: int | None
    borrowed: int


@dataclass(frozen=True)
class QueueUsage:
    """One queue as its gauges show it: GPUs in use, its GPU quota (None: not limited), what it
    borrows, its pending and admitted pods, and every dimension of its books."""

    queue: str
    gpus_used: float
    gpus_quota: float | None
    pending_pods: int
    gpus_borrowed: float = 0.0
    admitted_pods: int = 0
    resources: tuple[QueueResource, ...] = ()

    @classmethod
    def of(cls, st: QueueStatus) -> QueueUsage:
        """From the core's status. The GPU figures are in the quota's dimension, so that used over
        quota is how full the quota is: whole GPUs when ``gpus`` is limited (shares do not count
        there), else milli-GPU / 1000 (whole GPUs and shares)."""
        whole, milli = ResourceKey(ANY_MODEL, "gpus"), ResourceKey(ANY_MODEL, "gpu_milli")
        quota: float | None
        if whole in st.quota:
            used, quota = float(st.usage[whole]), float(st.quota[whole])
            borrowed = float(st.borrowed.get(whole, 0))
        else:
            used = st.usage[milli] / 1000
            quota = st.quota[milli] / 1000 if milli in st.quota else None
            borrowed = st.borrowed.get(milli, 0) / 1000
        keys = sorted(set(st.usage) | set(st.quota))
        resources = tuple(
            QueueResource(k.dim, k.model, st.usage[k], st.quota.get(k), st.borrowed.get(k, 0)) for k in keys
        )
        return cls(st.name, used, quota, st.pending, borrowed, st.admitted, resources)


class ClusterCollector(Collector):
    """Exposes the last ``ClusterStats`` and pending-pod reasons (series of nodes, GPUs and
    reasons that are gone disappear with the next refresh)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: ClusterStats | None = None
        self._unschedulable: dict[str, tuple[str, str]] = {}  # pod key -> (plugin, reason)
        self._queues: list[QueueUsage] = []
        self._per_gpu_text: tuple[ClusterStats, bytes] | None = None
        self.profile = "gpusched"

    def set_stats(self, stats: ClusterStats) -> None:
        with self._lock:
            self._stats = stats

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            stats, unsched, queues = self._stats, dict(self._unschedulable), list(self._queues)
        yield from self._unschedulable_families(unsched)
        yield from self._queue_families(queues)
        if stats is None:
            return
        gl = ["model", "pool"]
        fams = {
            "nodes": GaugeMetricFamily("gpusched_nodes", "GPU nodes, by GPU model and node pool.", labels=gl),
            "gpus": GaugeMetricFamily(
                "gpusched_gpus",
                "GPUs by model, pool and state (idle, shared, full, unhealthy).",
                labels=[*gl, "state"],
            ),
            "alloc": GaugeMetricFamily(
                "gpusched_gpus_allocated", "GPUs allocated (shares summed).", labels=gl
            ),
            "mem": GaugeMetricFamily("gpusched_gpu_memory_bytes", "GPU memory on the nodes.", labels=gl),
            "mem_alloc": GaugeMetricFamily(
                "gpusched_gpu_memory_allocated_bytes", "GPU memory allocated to pods.", labels=gl
            ),
            "free": GaugeMetricFamily("gpusched_gpus_free", "Free GPU capacity, in GPUs.", labels=gl),
            "stranded": GaugeMetricFamily(
                "gpusched_gpus_stranded",
                "Free GPU capacity (in GPUs) the target workload cannot use: FGD's fragmentation.",
                labels=gl,
            ),
            "frag": GaugeMetricFamily(
                "gpusched_gpu_fragmentation_ratio", "Stranded over free GPU capacity.", labels=gl
            ),
        }
        for (model, pool), g in sorted(stats.groups.items()):
            lv = [model, pool]
            fams["nodes"].add_metric(lv, g.nodes)
            for state, n in g.gpus.items():
                fams["gpus"].add_metric([*lv, state], n)
            fams["alloc"].add_metric(lv, g.gpus_allocated)
            fams["mem"].add_metric(lv, g.gpu_memory_bytes)
            fams["mem_alloc"].add_metric(lv, g.gpu_memory_allocated_bytes)
            fams["free"].add_metric(lv, g.free_gpus)
            fams["stranded"].add_metric(lv, g.stranded_gpus)
            fams["frag"].add_metric(lv, g.fragmentation_ratio)
        yield from fams.values()
        yield from self._mig_families(stats)

    @staticmethod
    def _mig_families(stats: ClusterStats) -> Iterable[Metric]:
        inst = GaugeMetricFamily(
            "gpusched_mig_instances",
            "MIG instances present on a node's GPUs in MIG mode, by profile and state (held by a pod, free, "
            "or on a GPU being re-cut).",
            labels=["node", "pool", "model", "profile", "state"],
        )
        for c in stats.mig:
            for state, n in (("held", c.held), ("free", c.free), ("reshaping", c.reshaping)):
                inst.add_metric([c.node, c.pool, c.model, c.profile, state], n)
        pend = GaugeMetricFamily(
            "gpusched_mig_pending_slices",
            "MIG slices asked for by pending pods, by profile.",
            labels=["profile"],
        )
        for p, n in stats.mig_pending.items():
            pend.add_metric([p], n)
        return (inst, pend)

    def per_gpu_text(self) -> bytes:
        """The per-GPU families in the text format, rendered here: at 5000 nodes of 8 GPUs
        prometheus_client's generic path takes over a second for them, this about 50 ms. Cached
        until the next ``set_stats``."""
        with self._lock:
            stats, cached = self._stats, self._per_gpu_text
        if stats is None:
            return b""
        if cached is not None and cached[0] is stats:
            return cached[1]
        g = stats.per_gpu
        per_node = [
            f'node="{_esc(n)}",model="{_esc(m)}",pool="{_esc(p)}",gpu="'
            for n, m, p in zip(g.nodes, g.models, g.pools, strict=True)
        ]
        idx = [per_node[i] + str(j) + '"' for i, j in zip(g.node.tolist(), g.gpu.tolist(), strict=True)]
        ratio = [
            f"gpusched_gpu_allocated_ratio{{{lv}}} {v!r}"
            for lv, v in zip(idx, g.allocated_ratio.tolist(), strict=True)
        ]
        healthy = [
            f"gpusched_gpu_healthy{{{lv}}} {1.0 if h else 0.0}"
            for lv, h in zip(idx, g.healthy.tolist(), strict=True)
        ]
        text = (
            "\n".join(
                [
                    "# HELP gpusched_gpu_allocated_ratio Share of one GPU allocated to pods (0..1).",
                    "# TYPE gpusched_gpu_allocated_ratio gauge",
                    *ratio,
                    "# HELP gpusched_gpu_healthy 1 unless the node agent marked the GPU unhealthy.",
                    "# TYPE gpusched_gpu_healthy gauge",
                    *healthy,
                ]
            )
            + "\n"
        )
        out = text.encode()
        with self._lock:
            self._per_gpu_text = (stats, out)
        return out

    def _unschedulable_families(self, unsched: Mapping[str, tuple[str, str]]) -> Iterable[Metric]:
        by_plugin = GaugeMetricFamily(
            "scheduler_unschedulable_pods",
            "Pending pods the scheduler found unschedulable, by the plugin that rejected them.",
            labels=["plugin", "profile"],
        )
        by_reason = GaugeMetricFamily(
            "gpusched_pending_pods_by_reason",
            "Unschedulable pending pods by the reason most nodes gave.",
            labels=["reason"],
        )
        for plugin, n in sorted(Tally(p for p, _ in unsched.values()).items()):
            by_plugin.add_metric([plugin, self.profile], n)
        for reason, n in sorted(Tally(r for _, r in unsched.values()).items()):
            by_reason.add_metric([reason], n)
        return (by_plugin, by_reason)

    @staticmethod
    def _queue_families(queues: list[QueueUsage]) -> Iterable[Metric]:
        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["queue", *labels])

        used = gauge("gpusched_queue_gpus_used", "GPUs in use by a queue's pods (in its quota's dimension).")
        quota = gauge("gpusched_queue_gpus_quota", "A queue's GPU quota (absent when GPUs are not limited).")
        borrowed = gauge("gpusched_queue_gpus_borrowed", "GPUs a queue uses over its quota (borrowed).")
        pend = gauge("gpusched_queue_pending_pods", "Pods waiting in a queue (and the queues under it).")
        admitted = gauge("gpusched_queue_admitted_pods", "Pods charged to a queue (and the queues under it).")
        r_used = gauge(
            "gpusched_queue_resource_usage", "A queue's usage per quota dimension.", "resource", "model"
        )
        r_quota = gauge(
            "gpusched_queue_resource_quota", "A queue's quota per limited dimension.", "resource", "model"
        )
        r_borrowed = gauge(
            "gpusched_queue_resource_borrowed",
            "How far a queue is over its quota per limited dimension.",
            "resource",
            "model",
        )
        for q in queues:
            used.add_metric([q.queue], q.gpus_used)
            if q.gpus_quota is not None:
                quota.add_metric([q.queue], q.gpus_quota)
            borrowed.add_metric([q.queue], q.gpus_borrowed)
            pend.add_metric([q.queue], q.pending_pods)
            admitted.add_metric([q.queue], q.admitted_pods)
            for r in q.resources:
                lv = [q.queue, r.resource, r.model]
                r_used.add_metric(lv, r.usage)
                if r.quota is not None:
                    r_quota.add_metric(lv, r.quota)
                    r_borrowed.add_metric(lv, r.borrowed)
        return (used, quota, borrowed, pend, admitted, r_used, r_quota, r_borrowed)


class EventWritesCollector(Collector):
    """``gpusched_event_writes_total{result}`` from the event recorder's counts, read at scrape."""

    def __init__(self) -> None:
        self.counts: Callable[[], Mapping[str, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.counts is None:
            return
        fam = CounterMetricFamily(
            "gpusched_event_writes",
            "Asynchronous writes of events, PodScheduled conditions and group status, by result.",
            labels=["result"],
        )
        for result, n in sorted(self.counts().items()):
            fam.add_metric([result], n)
        yield fam


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, profile: str = "gpusched") -> None:
        self.registry = registry or CollectorRegistry()
        self.profile = profile
        r = self.registry
        self.attempts = Counter(
            "scheduler_schedule_attempts",
            "Number of attempts to schedule pods, by the result and the profile.",
            ["result", "profile"],
            registry=r,
        )
        self.attempt_duration = Histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding decision).",
            ["result", "profile"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pending_pods = Gauge(
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type (active, backoff, unschedulable, gated).",
            ["queue"],
            registry=r,
        )
        self.preemption_attempts = Counter(
            "scheduler_preemption_attempts", "Total preemption attempts in the cluster till now.", registry=r
        )
        self.preemption_victims = Histogram(
            "scheduler_preemption_victims",
            "Number of selected preemption victims.",
            buckets=_VICTIM_BUCKETS,
            registry=r,
        )
        self.leader_status = Gauge(
            "leader_election_master_status",
            "1 when this replica is the leader of the named lease, else 0.",
            ["name"],
            registry=r,
        )
        self.binding_duration = Histogram(
            "gpusched_binding_duration_seconds",
            "Latency of annotating and binding one pod.",
            ["result"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.extender_duration = Histogram(
            "gpusched_extender_request_duration_seconds",
            "Latency of extender requests by verb.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.is_leader = Gauge(
            "gpusched_is_leader", "1 when this replica holds the leader Lease.", registry=r
        )
        self.gpu_allocation = Gauge(
            "gpusched_gpu_allocation_ratio", "Allocated GPU milli over total GPU milli.", registry=r
        )
        self.cluster = ClusterCollector()
        self._cluster_at = -1e9
        self._by_result: dict[str, tuple[Counter, Histogram]] = {}
        """The labelled children of each result, resolved once: ``labels()`` is most of the cost
        of recording a decision (``gpusched bench metrics-overhead``)."""
        self.cluster.profile = profile
        r.register(self.cluster)
        self.event_writes = EventWritesCollector()
        r.register(self.event_writes)

    # ------------------------------------------------------------ feeding
    def observe_attempt(self, result: str, seconds: float) -> None:
        children = self._by_result.get(result)
        if children is None:
            children = self._by_result[result] = (
                self.attempts.labels(result, self.profile),
                self.attempt_duration.labels(result, self.profile),
            )
        children[0].inc()
        children[1].observe(seconds)

    def watch_event_writes(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Expose ``counts()`` (the event recorder's, by result) as ``gpusched_event_writes_total``."""
        self.event_writes.counts = counts

    def set_leader(self, lease: str, leading: bool) -> None:
        self.is_leader.set(1 if leading else 0)
        self.leader_status.labels(lease).set(1 if leading else 0)

    def set_pending(self, counts: Mapping[str, int]) -> None:
        """``counts`` by queue; the queues of ``PENDING_QUEUES`` it does not name are 0."""
        for q in PENDING_QUEUES:
            self.pending_pods.labels(q).set(counts.get(q, 0))

    def preempted(self, victims: int) -> None:
        self.preemption_attempts.inc()
        self.preemption_victims.observe(victims)

    def pod_unschedulable(self, key: str, plugin: str, reason: str) -> None:
        with self.cluster._lock:
            self.cluster._unschedulable[key] = (plugin or "unknown", reason or "unknown")

    def pods_pending(self, keys: Iterable[str]) -> None:
        """Forget the unschedulable reasons of pods no longer pending (``keys``: the pending ones)."""
        keep = set(keys)
        with self.cluster._lock:
            for k in [k for k in self.cluster._unschedulable if k not in keep]:
                del self.cluster._unschedulable[k]

    def pod_scheduled(self, key: str) -> None:
        with self.cluster._lock:
            self.cluster._unschedulable.pop(key, None)

    def set_cluster(self, stats: ClusterStats) -> None:
        self.cluster.set_stats(stats)
        total = sum(sum(g.gpus.values()) for g in stats.groups.values())
        alloc = sum(g.gpus_allocated for g in stats.groups.values())
        self.gpu_allocation.set(alloc / total if total else 0.0)

    def refresh_cluster(self, compute: Callable[[], ClusterStats], min_interval_s: float = 5.0) -> None:
        """``set_cluster(compute())`` unless that was done less than ``min_interval_s`` ago (a scrape
        should not hold the books' lock every time)."""
        now = time.monotonic()
        if now - self._cluster_at < min_interval_s:
            return
        self._cluster_at = now
        self.set_cluster(compute())

    def set_queue_usage(self, usage: Iterable[QueueUsage]) -> None:
        """Every queue's usage, on each refresh (a queue left out loses its series): the
        ``gpusched_queue_*`` series, the "Tenants and queues" dashboard and the
        ``GPUSchedQueueQuotaExhausted`` alert read them."""
        with self.cluster._lock:
            self.cluster._queues = list(usage)

    def set_queue_statuses(self, statuses: Iterable[QueueStatus]) -> None:
        """``set_queue_usage`` from the core's statuses (the standalone scheduler's tenant queues
        call it each time they compute them)."""
        self.set_queue_usage(QueueUsage.of(s) for s in statuses)

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + self.cluster.per_gpu_text()


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def diagnosis_labels(diagnosis: Diagnosis | None, status: Status) -> tuple[str, str]:
    """(plugin, reason) of a pod that fits nowhere: the reason most nodes gave (ties: the first
    in sorted order) and its plugin; a PreFilter rejection, else the status, when no node did."""
    if diagnosis is not None and diagnosis.pre_filter is not None and not diagnosis.pre_filter.ok:
        return diagnosis.pre_filter.plugin, diagnosis.pre_filter.message()
    if diagnosis is not None and diagnosis.failures:
        counts = diagnosis.reason_counts()
        reason = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        plugin = next(f.plugin for f in diagnosis.failures if f.reason == reason)
        return plugin, reason
    return status.plugin, status.message()
