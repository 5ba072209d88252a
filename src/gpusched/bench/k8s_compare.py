"""``gpusched bench k8s --compare``: gpusched's front ends beside kube-scheduler, in one run.

One control plane (etcd, kube-apiserver, kube-controller-manager, kwok) and the same ``nodes``
kwok nodes (8 GPUs each) serve every case; each scheduler runs as its own process, as users
start it (``bench.k8s_procs``):

- ``kube-scheduler``: the kube-scheduler binary with ``clientConnection.qps/burst`` lifted
  (the reference of every ratio), run first and last; its best run counts (on a control plane
  whose nodes just joined, the first run is often the slowest);
- ``kube-scheduler-default``: the same binary at its shipped client limits (QPS 50, burst 100);
- ``standalone``: ``gpusched scheduler``, pods asking for whole GPUs (``nvidia.com/gpu``), the
  same pods as the kube-scheduler cases;
- ``standalone-shares``: ``gpusched scheduler``, pods asking for GPU shares
  (``gpusched.io/gpu-milli``);
- ``extender``: kube-scheduler (limit lifted) calling ``gpusched extender``, the same shares.

With ``rounds`` > 1 the cases between run that many times, kube-scheduler between each round,
and every case counts by its best run (its lowest p99 for latency): where one run varies a lot
(a 2-core VM: the extender pair's rate spread over 146-276 pods/s between invocations), one run
of a case against the best of two kube-scheduler runs is biased against the case; best against
best gives each the same number of tries.

A warm-up (``warmup`` pods through kube-scheduler, not reported) comes first. Each case then
creates a backlog of ``pods`` pending pods for its own ``schedulerName`` in its own namespace,
starts its scheduler and counts the binding rate from the first binding to the last, as a
watch in this process sees them (``bench.k8s_watch``); then, with the scheduler still running,
``arrival_pods`` more pods are created at ``arrival_rate`` per second, and their creation →
binding latency (from sending the create to seeing the binding) gives p50/p99. Afterwards every
pod must be bound, none to two nodes, and no GPU booked beyond its capacity by the assignment
annotations; then the case's pods and namespace are deleted. The next case starts once the
namespace is gone (the namespace controller works on it for 5.5 s after a 40-pod case and 6-10 s
after a 3000-pod one, deleting its Events among others; before, that fell into the next case's
backlog) and etcd is compacted (``testenv.etcd``; the apiserver's own compaction every 5 minutes
is off: it fell into whichever case ran at that moment).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.bench.k8s_procs import (
    LIFTED_QPS,
    SchedulerProcess,
    gpusched_extender,
    gpusched_scheduler,
    kube_scheduler,
    kube_scheduler_config,
    served_requests,
)
from gpusched.bench.k8s_standalone import bench_node, ready_nodes, settled_nodes
from gpusched.bench.k8s_watch import BindingRate, BindingWatcher
from gpusched.bench.proc_cpu import MACHINE, CpuSampler
from gpusched.core.errors import InvalidInput
from gpusched.k8s.client import api_client
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MILLI
from gpusched.k8s.heap import freeze_heap
from gpusched.k8s.rest import FastCoreV1
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.etcd import compact

KUBE = "kube-scheduler"
KUBE_DEFAULT = "kube-scheduler-default"
STANDALONE = "standalone"
STANDALONE_SHARES = "standalone-shares"
EXTENDER = "extender"
EXTENDER_PRIORITIZE = "extender-prioritize"
EXTENDER_ASYNCIO = "extender-asyncio"
CASES = (KUBE, KUBE_DEFAULT, STANDALONE, STANDALONE_SHARES, EXTENDER)
"""The cases a plain ``--compare`` runs."""
EXTRA_CASES = (EXTENDER_PRIORITIZE, EXTENDER_ASYNCIO)
"""Cases run only when named in ``--only``: the extender with ``--no-pick-in-filter`` (every
passing node back to kube-scheduler, which scores them and calls ``/prioritize``), and the
extender on the standard library's event loop (``--event-loop asyncio``) instead of uvloop."""
_SHARES = (STANDALONE_SHARES, EXTENDER, EXTENDER_PRIORITIZE, EXTENDER_ASYNCIO)
VARIANT = "@"
"""Joins a case and a variant's label: ``standalone@base``, ``extender@base``."""
_VARIED = (STANDALONE, EXTENDER)
"""The cases a variant runs again, from its source."""


@dataclass(frozen=True)
class CompareConfig:
    nodes: int = 1000
    pods: int = 3000
    """The backlog of each case."""
    warmup: int = 500
    arrival_rate: float = 50.0
    """Pods created per second in the steady-arrival part of each case."""
    arrival_pods: int = 500
    only: tuple[str, ...] = CASES
    seed: int = 0
    timeout_s: float = 900.0
    """Per wait (nodes Ready, a backlog bound, ...)."""
    create_threads: int = 16
    profile_dir: Path | None = None
    """py-spy samples every gpusched process into this folder (``<case>-<run>.txt``, collapsed stacks)."""
    variants: tuple[tuple[str, Path], ...] = ()
    """(label, source folder): gpusched from another source tree (e.g. a git worktree of an earlier
    commit), as case ``standalone@<label>`` right after ``standalone`` and ``extender@<label>``
    right after ``extender`` (each where that case runs): the same front end, the same pods."""
    rounds: int = 1
    """Every case this many times, kube-scheduler before the first round, between rounds and
    after the last (``plan``); each case is reported by its best run. More than 1 where one run
    varies a lot: best against best, each case as many tries as the others."""

    def check(self) -> None:
        unknown = sorted(set(self.only) - set(CASES + EXTRA_CASES))
        if unknown:
            raise InvalidInput(
                f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES + EXTRA_CASES)}"
            )
        if not self.only:
            raise InvalidInput("no case to run")
        if self.nodes <= 0 or self.pods <= 1 or self.warmup < 0 or self.arrival_pods < 0:
            raise InvalidInput(
                "nodes must be positive, pods at least 2, warmup and arrival pods not negative"
            )
        for label, src in self.variants:
            if (
                not (label.replace("-", "").isalnum() and label.islower())
                or not (Path(src) / "gpusched").is_dir()
            ):
                raise InvalidInput(
                    f"variant {label}={src}: a label of lowercase letters, digits and '-', "
                    "and a folder holding the gpusched package (a src/ folder)"
                )
        if self.arrival_pods and self.arrival_rate <= 0:
            raise InvalidInput("arrival rate must be positive")
        if self.rounds < 1:
            raise InvalidInput(f"rounds must be at least 1, got {self.rounds}")


@dataclass
class CaseResult:
    case: str
    run: int
    """1, or 2 for kube-scheduler's last run."""
    pods: int
    bound: int
    pods_per_s: float
    seconds: float
    """From the first binding seen to the last."""
    arrival_pods: int = 0
    arrival_bound: int = 0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    unbound: int = 0
    """Pods of the case without a node at the end (must be 0)."""
    rebound: int = 0
    """Pods seen bound to two nodes (must be 0)."""
    overbooked_gpus: int = 0
    """GPUs whose assignment annotations add up to more than the GPU (must be 0)."""
    extender_requests: dict[str, int] | None = None
    """Extender cases: the requests it served by verb, backlog and arrivals together (one
    ``filter`` and one ``bind`` per pod unless kube-scheduler retried pods)."""
    cpu_ms_per_pod: dict[str, float] | None = None
    """CPU milliseconds per bound pod of the backlog, by process (``kube-scheduler``,
    ``gpusched``, ``kube-apiserver``, ``etcd``, ``kwok``, ``kube-controller-manager``, ``bench``:
    this process's watch; ``all``: their sum), from the first binding to the last (``/proc``)."""
    cores_used: float | None = None
    """The machine's busy cores over the same window (every process on it): near the core count,
    throughput follows the CPU per pod of all the processes together."""


@dataclass
class CompareReport:
    config: CompareConfig
    cases: list[CaseResult] = field(default_factory=list)
    nodes_settle_s: float | None = None
    """Seconds from every node Ready to every node settled (``_Bench.settle``)."""
    nodes_unsettled: int = 0
    """Nodes still not settled when the cases began (0 unless the wait timed out)."""

    def _best(self, case: str) -> CaseResult | None:
        runs = [c for c in self.cases if c.case == case]
        return max(runs, key=lambda c: c.pods_per_s) if runs else None

    def _best_p99(self, case: str) -> float | None:
        """The lowest steady-arrival p99 of ``case``'s runs (kube-scheduler's and every other
        case's alike: each case's best)."""
        return min(
            (c.latency_p99_ms for c in self.cases if c.case == case and c.latency_p99_ms), default=None
        )

    def _own_cpu_ratio(self, case: str, *procs: str) -> float | None:
        """CPU per pod of ``procs`` in ``case``'s best run against kube-scheduler's own in its best."""
        mine, ref = self._best(case), self._best(KUBE)
        if not (mine and ref and mine.cpu_ms_per_pod and ref.cpu_ms_per_pod):
            return None
        base = ref.cpu_ms_per_pod.get("kube-scheduler")
        used = sum(mine.cpu_ms_per_pod.get(p, 0.0) for p in procs)
        return round(used / base, 3) if base else None

    def to_dict(self) -> dict[str, Any]:
        rate = {c: (r.pods_per_s if (r := self._best(c)) else None) for c in CASES + EXTRA_CASES}
        ref = rate[KUBE]

        def ratio(v: float | None, base: float | None) -> float | None:
            return round(v / base, 3) if v is not None and base else None

        p99 = {c: self._best_p99(c) for c in CASES + EXTRA_CASES}
        kube_p99 = p99[KUBE]
        runs = {c: [r.pods_per_s for r in self.cases if r.case == c] for c in CASES + EXTRA_CASES}
        cfg = self.config
        return {
            "nodes": cfg.nodes,
            "pods": cfg.pods,
            "warmup_pods": cfg.warmup,
            "nodes_settle_s": self.nodes_settle_s,
            "nodes_unsettled": self.nodes_unsettled,
            "arrival_rate_per_s": cfg.arrival_rate,
            "arrival_pods": cfg.arrival_pods,
            "kube_scheduler_pods_per_s": ref,
            "kube_scheduler_runs_pods_per_s": runs[KUBE],
            "rounds": cfg.rounds,
            "runs_pods_per_s": runs,
            "kube_scheduler_default_pods_per_s": rate[KUBE_DEFAULT],
            "standalone_pods_per_s": rate[STANDALONE],
            "standalone_shares_pods_per_s": rate[STANDALONE_SHARES],
            "extender_pods_per_s": rate[EXTENDER],
            "kube_scheduler_default_ratio": ratio(rate[KUBE_DEFAULT], ref),
            "standalone_ratio": ratio(rate[STANDALONE], ref),
            "standalone_shares_ratio": ratio(rate[STANDALONE_SHARES], ref),
            "extender_ratio": ratio(rate[EXTENDER], ref),
            "extender_prioritize_pods_per_s": rate[EXTENDER_PRIORITIZE],
            "extender_prioritize_ratio": ratio(rate[EXTENDER_PRIORITIZE], ref),
            "extender_asyncio_pods_per_s": rate[EXTENDER_ASYNCIO],
            "extender_asyncio_ratio": ratio(rate[EXTENDER_ASYNCIO], ref),
            "latency_p50_ms": {
                c: (r.latency_p50_ms if (r := self._best(c)) else None) for c in CASES + EXTRA_CASES
            },
            "latency_p99_ms": p99,
            "kube_scheduler_p99_ms": kube_p99,
            "standalone_p99_latency_ratio": ratio(p99[STANDALONE], kube_p99),
            "standalone_shares_p99_latency_ratio": ratio(p99[STANDALONE_SHARES], kube_p99),
            "extender_p99_latency_ratio": ratio(p99[EXTENDER], kube_p99),
            "cpu_ms_per_pod": {
                c: (r.cpu_ms_per_pod if (r := self._best(c)) else None) for c in CASES + EXTRA_CASES
            },
            "extender_own_cpu_ratio": self._own_cpu_ratio(EXTENDER, "gpusched"),
            "extender_scheduler_cpu_ratio": self._own_cpu_ratio(EXTENDER, "kube-scheduler", "gpusched"),
            "cpus": os.cpu_count(),
            "variants_pods_per_s": {c.case: c.pods_per_s for c in self.cases if VARIANT in c.case},
            "variants_ratio": {c.case: ratio(c.pods_per_s, ref) for c in self.cases if VARIANT in c.case},
            "variants_cpu_ms_per_pod": {c.case: c.cpu_ms_per_pod for c in self.cases if VARIANT in c.case},
            "cases": [asdict(c) for c in self.cases],
        }


_TOLERATE_FLAPPING = [
    {"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": e}
    for t in ("not-ready", "unreachable")
    for e in ("NoSchedule", "NoExecute")
]


def _pod(name: str, tag: str, scheduler: str, shares: bool, rng: np.random.Generator) -> dict[str, Any]:
    res: dict[str, str] = {"cpu": "1", "memory": "2Gi"}
    if shares:
        res[RES_MILLI] = str(int(rng.choice([100, 250, 300, 500, 700])))
    else:
        res[RES_GPU] = str(int(rng.choice([1, 1, 1, 2])))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpusched.io/bench": tag}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"gpusched.io/bench": tag},
            # kwok renews 1000 node leases; on a busy machine some lapse and the node lifecycle
            # controller taints those nodes for a while: that must not change what is measured
            "tolerations": _TOLERATE_FLAPPING,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": res, "limits": res},
                },
            ],
        },
    }


def _retrying(call: Callable[..., Any], *args: Any, tries: int = 6, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, again after 1, 2, 4 ... s while an overloaded apiserver answers
    429 or 5xx (504 "request did not complete"); a create answered 409 (it was created by an
    attempt whose answer was lost) counts as done."""
    for attempt in range(tries):
        try:
            return call(*args, _preload_content=False, **kwargs)
        except ApiException as e:
            if e.status == 409 and attempt > 0:
                return None
            if attempt == tries - 1 or not (e.status == 429 or (e.status or 0) >= 500):
                raise
            time.sleep(2.0**attempt)
    return None


def _overbooked(items: Sequence[dict[str, Any]]) -> int:
    """GPUs whose pods' assignment annotations add up to more than 1000 milli."""
    milli: dict[tuple[str, int], int] = defaultdict(int)
    for p in items:
        raw = ((p.get("metadata") or {}).get("annotations") or {}).get(ANN_ASSIGNMENT)
        if raw and (p.get("spec") or {}).get("nodeName"):
            a = orjson.loads(raw)
            for g in a["gpus"]:
                milli[(a["node"], int(g))] += int(a["milli"])
    return sum(1 for v in milli.values() if v > 1000)


class _Bench:
    def __init__(self, cp: ControlPlane, cfg: CompareConfig, note: Callable[[str], None]) -> None:
        self.cp, self.cfg, self.note = cp, cfg, note
        self.tag = uuid.uuid4().hex[:8]
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=2 * cfg.create_threads)
        self.v1: Any = client.CoreV1Api(self.api)
        self.fast = FastCoreV1(self.api)  # pod creation: the generated client's CPU is not the schedulers'
        self.log_dir = Path(cp.workdir) / "bench-logs"
        self.rng = np.random.default_rng(cfg.seed)
        self.settle_s: float | None = None  # how long the nodes took to settle after turning Ready
        self.unsettled = 0  # nodes not settled when the cases began

    # ---------------------------------------------------------------- nodes
    def add_nodes(self) -> None:
        cfg, tag = self.cfg, self.tag
        self.note(f"creating {cfg.nodes} kwok nodes (8 GPUs each)")

        def create(i: int) -> None:
            _retrying(self.v1.create_node, bench_node(f"n-{tag}-{i:05d}", tag, i))

        with ThreadPoolExecutor(cfg.create_threads) as ex:
            list(ex.map(create, range(cfg.nodes)))
        self.note(f"{cfg.nodes} nodes created; waiting until each is Ready")
        ready: set[str] = set()
        said = [time.monotonic()]

        def all_ready_once() -> bool:  # each seen Ready at least once (on a busy machine some flap)
            ready.update(ready_nodes(self.v1, tag))
            if time.monotonic() - said[0] > 20:
                self.note(f"{len(ready)} of {cfg.nodes} nodes seen Ready")
                said[0] = time.monotonic()
            return len(ready) >= cfg.nodes

        wait_until(all_ready_once, timeout=cfg.timeout_s, what="the bench nodes to be Ready",
                   control_plane=self.cp, interval=2.0)  # fmt: skip
        self.settle()

    def settle(self) -> None:
        """Wait until every node is done joining (``k8s_standalone.settled``): otherwise the node
        lifecycle controller lifts the not-ready taints and adds the legacy labels, node after
        node, while the first cases run (145 such updates during one 3000-pod backlog at 1000
        nodes), and every scheduler and the apiserver pay for them there. Not settled within
        ``timeout_s``: noted, recorded in the report, and measured anyway."""
        cfg, t0 = self.cfg, time.monotonic()
        said = [t0]

        def all_settled() -> bool:
            n = settled_nodes(self.v1, self.tag)
            if time.monotonic() - said[0] > 20:
                self.note(f"{n} of {cfg.nodes} nodes settled (untainted, labels reconciled)")
                said[0] = time.monotonic()
            self.unsettled = cfg.nodes - n
            return n >= cfg.nodes

        try:
            wait_until(all_settled, timeout=cfg.timeout_s, what="the bench nodes to settle",
                       control_plane=self.cp, interval=2.0)  # fmt: skip
        except TimeoutError:
            self.note(f"{self.unsettled} of {cfg.nodes} nodes still not settled; measuring anyway")
        self.settle_s = round(time.monotonic() - t0, 1)
        if not self.unsettled:
            self.note(f"nodes settled in {self.settle_s:g} s")

    # ------------------------------------------------------------ schedulers
    @contextlib.contextmanager
    def scheduler(self, case: str, run: int, sched: str) -> Iterator[list[SchedulerProcess]]:
        name = f"{case}-{run}"
        kc = self.cp.kubeconfig_path
        if case in (KUBE, KUBE_DEFAULT, "warmup"):
            qps = None if case == KUBE_DEFAULT else LIFTED_QPS
            conf = kube_scheduler_config(kc, sched, qps=qps)
            with kube_scheduler(self.cp, name, conf, self.log_dir) as p:
                yield [p]
        else:
            base, _, label = case.partition(VARIANT)
            src = dict(self.cfg.variants)[label] if label else None
            if base in (STANDALONE, STANDALONE_SHARES):
                prof = self.cfg.profile_dir
                with gpusched_scheduler(self.cp, slug(name), sched, self.log_dir, prof, src) as p:
                    yield [p]
                return
            ext_name = f"{slug(name)}-gpusched"
            pick = base != EXTENDER_PRIORITIZE
            loop = "asyncio" if base == EXTENDER_ASYNCIO else "uvloop"
            started = gpusched_extender(
                self.cp, ext_name, self.log_dir, self.cfg.profile_dir, pick=pick, event_loop=loop, source=src
            )
            with started as (ext, url):
                conf = kube_scheduler_config(kc, sched, qps=LIFTED_QPS, extender_url=url)
                with kube_scheduler(self.cp, name, conf, self.log_dir) as p:
                    yield [ext, p]

    # ----------------------------------------------------------------- cases
    def run_case(self, case: str, run: int, pods: int) -> CaseResult:
        cfg, v1 = self.cfg, self.v1
        ns = f"bench-{self.tag}-{slug(case)}-{run}"
        sched = f"bench-{slug(case)}-{run}"
        shares = case.partition(VARIANT)[0] in _SHARES
        _retrying(v1.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        watch = BindingWatcher(v1, ns).start()
        try:
            backlog = [_pod(f"b-{i:06d}", self.tag, sched, shares, self.rng) for i in range(pods)]
            self.note(f"{case} (run {run}): creating a backlog of {pods} pods")
            with ThreadPoolExecutor(cfg.create_threads) as ex:
                list(ex.map(lambda b: _retrying(self.fast.create_namespaced_pod, ns, b), backlog))
            wait_until(
                lambda: watch.count_seen() >= pods, timeout=cfg.timeout_s, what="the backlog in the watch"
            )
            names = {b["metadata"]["name"] for b in backlog}
            arrivals = [] if case == "warmup" else [
                _pod(f"a-{i:06d}", self.tag, sched, shares, self.rng) for i in range(cfg.arrival_pods)
            ]  # fmt: skip
            with self.scheduler(case, run, sched) as procs:
                self.note(f"{case} (run {run}): scheduler started, binding")
                sampler = CpuSampler(self._pids(procs)).start()
                try:
                    self._wait_bound(watch, names, procs, case)
                finally:
                    sampler.stop()
                rate = watch.rate(names)
                cpu, cores = _cpu_per_pod(sampler, rate)
                if cpu is not None:
                    top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])[:5])
                    self.note(f"{case} (run {run}): CPU ms per bound pod: {top}; {cores} cores busy")
                self.note(
                    f"{case} (run {run}): {rate.bound} pods in {rate.seconds:.1f} s, {rate.pods_per_s} pods/s"
                )
                sent = self._arrive(ns, arrivals, case, run) if arrivals else {}
                if sent:
                    self._wait_bound(watch, set(sent), procs, case)
                served = next((served_requests(p.metrics_url) for p in procs if p.metrics_url), None)
            if served is not None:
                verbs = ", ".join(f"{n} /{verb}" for verb, n in sorted(served.items()))
                self.note(f"{case} (run {run}): the extender served {verbs} for {pods + len(sent)} pods")
            lat = watch.times(set(sent))
            ms = np.array([1e3 * (lat[n] - sent[n]) for n in lat]) if lat else np.zeros(0)
            items = orjson.loads(_retrying(v1.list_namespaced_pod, ns).data)["items"]
            result = CaseResult(
                case, run, pods, rate.bound, rate.pods_per_s, rate.seconds,
                arrival_pods=len(arrivals), arrival_bound=len(lat),
                latency_p50_ms=round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
                latency_p99_ms=round(float(np.percentile(ms, 99)), 1) if len(ms) else None,
                unbound=sum(1 for p in items if not (p.get("spec") or {}).get("nodeName")),
                rebound=len(watch.rebound),
                overbooked_gpus=_overbooked(items),
                extender_requests=served, cpu_ms_per_pod=cpu, cores_used=cores,
            )  # fmt: skip
            if sent:
                self.note(f"{case} (run {run}): {len(lat)} arrivals at {cfg.arrival_rate:g}/s, "
                          f"p50 {result.latency_p50_ms} ms, p99 {result.latency_p99_ms} ms")  # fmt: skip
            return result
        finally:
            watch.stop()
            try:
                self._clear(ns)
                self.compact()
            except Exception as e:  # an overloaded apiserver: say so, keep the error that matters
                self.note(f"cleaning up {ns} failed: {e}")

    def _pids(self, procs: list[SchedulerProcess]) -> dict[str, list[int]]:
        """The processes whose CPU a case reports: the schedulers, the control plane, this one."""
        pids: dict[str, list[int]] = {name: [pid] for name, pid in self.cp.pids().items()}
        for p in procs:
            args = p.popen.args
            exe = args[0] if isinstance(args, list) and args else args
            kind = "kube-scheduler" if Path(str(exe)).name == "kube-scheduler" else "gpusched"
            pids.setdefault(kind, []).append(p.popen.pid)
        pids["bench"] = [os.getpid()]
        return pids

    def _wait_bound(
        self, watch: BindingWatcher, names: set[str], procs: list[SchedulerProcess], case: str
    ) -> None:
        def done() -> bool:
            for p in procs:
                p.alive()
            return watch.count_bound(names) >= len(names)

        wait_until(done, timeout=self.cfg.timeout_s, what=f"{case}: {len(names)} pods bound", interval=0.1)

    def _arrive(self, ns: str, bodies: list[dict[str, Any]], case: str, run: int) -> dict[str, float]:
        """Create ``bodies`` at the configured rate; the time each create was sent, by pod name."""
        sent: dict[str, float] = {}
        lock = threading.Lock()
        self.note(f"{case} (run {run}): {len(bodies)} pods arriving at {self.cfg.arrival_rate:g}/s")

        def create(body: dict[str, Any]) -> None:
            t = time.monotonic()
            _retrying(self.fast.create_namespaced_pod, ns, body)
            with lock:
                sent[body["metadata"]["name"]] = t

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as ex:
            futures = []
            for i, body in enumerate(bodies):
                delay = t0 + i / self.cfg.arrival_rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append(ex.submit(create, body))
            for f in futures:
                f.result()
        return sent

    def _clear(self, ns: str) -> None:
        """Delete the case's pods at once (grace 0) and wait until they are gone, then the namespace,
        and wait until it is gone too: the namespace controller then deletes what is left in it
        (the case's Events, one per binding), and that work must not fall into the next case."""
        _retrying(self.v1.delete_collection_namespaced_pod, ns, grace_period_seconds=0)

        def empty() -> bool:
            resp = _retrying(self.v1.list_namespaced_pod, ns, limit=1)
            return not orjson.loads(resp.data)["items"]

        wait_until(empty, timeout=self.cfg.timeout_s, what=f"the pods of {ns} to be deleted", interval=0.5)
        _retrying(self.v1.delete_namespace, ns)
        t0 = time.monotonic()
        wait_until(lambda: self._gone(ns), timeout=self.cfg.timeout_s, what=f"namespace {ns} to be deleted",
                   interval=0.5)  # fmt: skip
        self.note(f"namespace {ns} deleted in {time.monotonic() - t0:.1f} s")

    def compact(self) -> None:
        """Compact etcd between cases (the apiserver's periodic compaction is off, see
        ``testenv.etcd``): every case starts on a compacted store and none pays for a compaction."""
        t0 = time.monotonic()
        revision = compact(self.cp.etcd_url, timeout=self.cfg.timeout_s)
        self.note(f"etcd compacted at revision {revision} in {time.monotonic() - t0:.1f} s")

    def _gone(self, ns: str) -> bool:
        try:
            _retrying(self.v1.read_namespace, ns)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False


def _cpu_per_pod(sampler: CpuSampler, rate: BindingRate) -> tuple[dict[str, float] | None, float | None]:
    """CPU ms per bound pod by process (and ``all``) and the machine's busy cores, over the
    window from the first binding to the last (None where there is no window or no ``/proc``)."""
    span = rate.last - rate.first
    used = sampler.used(rate.first, rate.last) if span > 0 and rate.bound > 1 else {}
    if not used:
        return None, None
    pods = rate.bound - 1  # the bindings after the first, as in the rate
    machine = used.pop(MACHINE, None)
    per_pod = {name: round(1e3 * s / pods, 3) for name, s in sorted(used.items())}
    per_pod["all"] = round(1e3 * sum(used.values()) / pods, 3)
    return per_pod, (round(machine / span, 2) if machine is not None else None)


def slug(case: str) -> str:
    """A case's name as a DNS label (namespace, schedulerName): ``standalone@a`` -> ``standalone-at-a``."""
    return case.replace("@", "-at-").lower()


def plan(only: Sequence[str], variants: Sequence[str] = (), rounds: int = 1) -> list[tuple[str, int]]:
    """The runs in order: kube-scheduler (limit lifted) first and last, the others between
    (each variant's ``standalone`` and ``extender`` right after the current one's); with
    ``rounds`` > 1 the others that many times (kube-scheduler at its shipped defaults, a reference
    that takes a minute, once), kube-scheduler between each round too."""
    out: list[tuple[str, int]] = [(KUBE, 1)] if KUBE in only else []
    for r in range(1, rounds + 1):
        for c in CASES + EXTRA_CASES:
            if c in only and c != KUBE and (r == 1 or c != KUBE_DEFAULT):  # a reference: a minute a run
                out.append((c, r))
                if c in _VARIED:
                    out += [(f"{c}{VARIANT}{v}", r) for v in variants]
        if KUBE in only:
            out.append((KUBE, r + 1))
    return out


def bench_compare(
    cfg: CompareConfig, *, on_progress: Callable[[str], None] = lambda _m: None, bin_dir: Path | None = None
) -> dict[str, Any]:
    """Run the comparison (module doc) and return its report as one JSON-ready dict."""
    cfg.check()
    report = CompareReport(cfg)
    on_progress("starting the control plane (etcd, kube-apiserver, kube-controller-manager, kwok)")
    extra = {
        # etcd is compacted between cases instead of every 5 minutes, in whichever case runs then
        "kube-apiserver": ["--etcd-compaction-interval=0"],
        "kwok": ["--v=WARN"],  # not a log line per node lease renewal: that CPU belongs to the apiserver
        # a lease renewal late on a busy machine must not taint the node (an update to every scheduler)
        "kube-controller-manager": [
            "--node-monitor-grace-period=300s",
            # its client limit (20/s by default) would settle 1000 new nodes (two updates each:
            # the not-ready taint lifted, the legacy labels added) over minutes
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
        ],
    }
    with ControlPlane(
        bin_dir=bin_dir, scheduler=False, controller_manager=True, kwok=True, extra_args=extra
    ) as cp:
        b = _Bench(cp, cfg, on_progress)
        b.add_nodes()
        report.nodes_settle_s, report.nodes_unsettled = b.settle_s, b.unsettled
        b.compact()  # the nodes' joining
        freeze_heap("bench set-up")  # no full-collection stalls in the watch that times the bindings
        if cfg.warmup:
            b.run_case("warmup", 1, max(2, cfg.warmup))
        for case, run in plan(cfg.only, [label for label, _ in cfg.variants], cfg.rounds):
            report.cases.append(b.run_case(case, run, cfg.pods))
    return report.to_dict()
