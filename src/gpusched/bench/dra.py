"""``gpusched bench dra``: kube-scheduler and gpusched's standalone scheduler side by side on DRA claims,
on one real control plane, in one run.

One control plane (etcd, kube-apiserver, kube-controller-manager, kwok) and the same ``nodes`` kwok
nodes, each with the ResourceSlices of NVIDIA's DRA driver in dynamic-MIG mode (``bench.dra_shape``:
8 A100 40GB, whole GPUs and every MIG placement through per-GPU counters), the same DeviceClasses,
and the same seeded streams of claim pods (one ResourceClaim each). Each part runs the stream through
kube-scheduler first, then, after its pods and claims are gone, through ``gpusched scheduler``: each
as its own process, as users start it (``bench.k8s_procs``), kube-scheduler with its client limit
lifted.

The throughput and gang runs are backlogs: the stream's claims and pods are created with no scheduler
running, then the scheduler starts. A backlog run ends when
every pod is bound or marked unschedulable (``PodScheduled=False``), or when nothing changed for
``quiet_s`` after the scheduler's first sign (a binding, a refusal or an event in the namespace):
gpusched reports a waiting gang by events only.

Parts:

- **quality** (``mig-heavy``, ``mixed``): the stream is fed pod by pod, each pod (and its claim)
  created once the one before is bound or refused, so both schedulers see exactly the stream's order
  (a backlog is not taken in order by kube-scheduler: a pod whose claim its informer has not seen yet
  waits). Reported: pods placed when the first pod is refused (the index of the first pod left
  without a node) and pods placed at saturation (all of the stream placed; the stream is longer than
  the cluster holds);
- **throughput**: a stream that fits whatever either scheduler chooses (1g.5gb slices), bound pods
  per second from the first binding to the last as a watch in this process sees them
  (``bench.k8s_watch``), and the ratio gpusched / kube-scheduler;
- **gangs**: gangs of ``gang_size`` pods (Kubernetes' own PodGroup, ``minCount`` = size), one whole
  GPU each, ``gang_load`` times as many pods as GPUs, members of all gangs interleaved (seeded) as
  jobs submitted together arrive: gangs whose members all landed, and gangs left partly placed
  (their devices held for nothing). Three schedulers: kube-scheduler as shipped (``GenericWorkload``
  off: members one by one), kube-scheduler with its own gang scheduling on (``KUBE_WORKLOAD``), and
  gpusched with its gang support.
- **gangs-mig**: gangs of two MIG pods, a 4g.20gb and a 3g.20gb (``MIG_PAIR``), which fill an A100
  exactly only as 4g at start 0 and 3g at start 4; ``gang_load`` gangs per GPU, which member arrives
  first drawn per gang. A 3g placed first-fit at start 0 leaves its GPU no room for a 4g: placing the
  members one at a time in device-name order strands gangs where choosing the pair together does not.

Every run is checked: no pod bound twice, and no two claims' devices sharing a memory slice of one GPU.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from gpusched.bench.dra_shape import (
    GPUS_PER_NODE,
    LABEL,
    MIG_PAIR,
    MIXES,
    WHOLE,
    Ask,
    Classes,
    claim_pod,
    gang_members,
    kwok_node,
    memory_slices_of,
    mig_pair_asks,
    node_slices,
    pod_group,
    slices_used,
    stream,
    throughput_stream,
)
from gpusched.bench.k8s_procs import (
    LIFTED_QPS,
    SchedulerProcess,
    gpusched_scheduler,
    kube_scheduler,
    kube_scheduler_config,
)
from gpusched.bench.k8s_standalone import ready_untainted
from gpusched.bench.k8s_watch import BindingWatcher
from gpusched.core.errors import InvalidInput
from gpusched.k8s.client import api_client
from gpusched.k8s.groupref import API
from gpusched.testenv import ControlPlane, wait_until

KUBE = "kube-scheduler"
GPUSCHED = "gpusched"
KUBE_WORKLOAD = "kube-scheduler+GenericWorkload"
"""kube-scheduler with its own gang scheduling on (feature gate ``GenericWorkload``, beta and off by
default in 1.37): a PodGroup's pods are decided in one pod-group cycle, their claims still allocated
pod by pod (no joint allocation, kubernetes#138765). Gang part only."""
SCHEDULERS = (KUBE, GPUSCHED)
GANG_SCHEDULERS = (KUBE, KUBE_WORKLOAD, GPUSCHED)
_SHORT = {KUBE: "kube", KUBE_WORKLOAD: "kubewl", GPUSCHED: "gs"}
THROUGHPUT = "throughput"
GANGS = "gangs"
GANGS_MIG = "gangs-mig"
GANG_PARTS = (GANGS, GANGS_MIG)
PARTS = (*MIXES, THROUGHPUT, *GANG_PARTS)


class DecisionWatcher(BindingWatcher):
    """``BindingWatcher`` that also records when each pod was seen marked unschedulable
    (``PodScheduled=False``) with the message it ends with: a new message restarts its time, so a
    pod turned away while the scheduler warmed up and refused for good later counts from the later."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.refused_at: dict[str, tuple[str, float]] = {}
        super().__init__(core, namespace)

    def _upsert(self, obj: Mapping[str, Any]) -> None:
        super()._upsert(obj)
        now = time.monotonic()
        name = str((obj.get("metadata") or {}).get("name", ""))
        for c in (obj.get("status") or {}).get("conditions") or ():
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                message = str(c.get("message", ""))
                with self._lock:
                    if self.refused_at.get(name, ("", 0.0))[0] != message:
                        self.refused_at[name] = (message, now)

    def refused(self) -> dict[str, float]:
        """Pods seen refused and not bound: when each was first seen with its latest message."""
        with self._lock:
            return {n: t for n, (_m, t) in self.refused_at.items() if n not in self.bound_at}


@dataclass(frozen=True)
class DraBenchConfig:
    nodes: int = 4
    gpus_per_node: int = GPUS_PER_NODE
    seed: int = 0
    parts: tuple[str, ...] = PARTS
    throughput_per_gpu: int = 5
    """Throughput stream: 1g.5gb pods per GPU (1-7: it must fit)."""
    gang_size: int = 4
    gang_load: float = 1.5
    """Gang streams: whole-GPU gang pods per GPU, MIG-pair gangs per GPU (> 1: devices are tight)."""
    throughput_rounds: int = 2
    """Throughput: kube-scheduler and gpusched alternate this many times; each is reported by its
    best run (on a shared machine one run varies a lot: best against best)."""
    quiet_s: float = 6.0
    timeout_s: float = 600.0
    """Per wait (nodes Ready, a run decided, a run's objects gone)."""
    create_threads: int = 8

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gangs(self) -> int:
        return max(1, round(self.gang_load * self.gpus / self.gang_size))

    def gang_count(self, part: str) -> int:
        """Gangs of a gang part: ``gangs`` whole-GPU gangs, or one MIG pair per GPU times ``gang_load``."""
        return self.gangs if part == GANGS else max(1, round(self.gang_load * self.gpus))

    def gang_size_of(self, part: str) -> int:
        return self.gang_size if part == GANGS else len(MIG_PAIR)

    def check(self) -> None:
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown:
            raise InvalidInput(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
        if not self.parts:
            raise InvalidInput("no part to run")
        if self.throughput_rounds < 1:
            raise InvalidInput(f"throughput rounds must be at least 1, got {self.throughput_rounds}")
        if (
            self.nodes < 1
            or not 1 <= self.gpus_per_node <= GPUS_PER_NODE
            or self.gang_size < 1
            or self.gang_load <= 0
            or self.quiet_s <= 0
        ):
            raise InvalidInput(
                f"nodes and gang size must be positive, GPUs per node 1-{GPUS_PER_NODE}, gang load and "
                "quiet seconds above 0"
            )
        throughput_stream(self.gpus, self.throughput_per_gpu)  # raises on a bad per-GPU count

    def streams(self) -> dict[str, tuple[list[Ask], list[int] | None]]:
        """Each part's asks in creation order, and for gangs each pod's gang."""
        out: dict[str, tuple[list[Ask], list[int] | None]] = {}
        for part in self.parts:
            if part in MIXES:
                out[part] = (stream(part, self.gpus, self.seed), None)
            elif part == THROUGHPUT:
                out[part] = (throughput_stream(self.gpus, self.throughput_per_gpu), None)
            elif part == GANGS:
                members = gang_members(self.gangs, self.gang_size, self.seed)
                out[part] = ([Ask(WHOLE)] * len(members), members)
            else:
                members = gang_members(self.gang_count(part), len(MIG_PAIR), self.seed)
                out[part] = (mig_pair_asks(members, self.seed), members)
        return out

    def plan(self) -> list[tuple[str, str]]:
        """(part, scheduler) of every run, in order: each part's kube-scheduler first."""
        out = []
        for part in self.parts:
            if part == THROUGHPUT:
                out += [(part, s) for _ in range(self.throughput_rounds) for s in SCHEDULERS]
            else:
                out += [(part, s) for s in (GANG_SCHEDULERS if part in GANG_PARTS else SCHEDULERS)]
        return out

    def steps(self) -> int:
        """Progress steps: every pod of every run (decided or given up)."""
        streams = self.streams()
        return sum(len(streams[part][0]) for part, _ in self.plan())


@dataclass(frozen=True, slots=True)
class Run:
    part: str
    scheduler: str
    pods: int
    placed: int
    placed_at_first_refusal: int | None
    """Quality streams (fed pod by pod): the index of the first pod left without a node, that is the
    pods placed when the first is refused; None for a backlog (not taken in the stream's order)."""
    refused: int
    """Pods marked ``PodScheduled=False`` at the end."""
    undecided: int
    """Pods neither placed nor marked (gang members waiting, in gpusched's case)."""
    gpu_sevenths_placed: int
    """Compute slices of the placed pods (a whole GPU is 7)."""
    gpu_sevenths_at_first_refusal: int | None
    """Compute slices of the pods placed when the first pod was refused (the cluster's use then);
    None for a backlog."""
    seconds: float
    """From the first binding seen to the last."""
    pods_per_s: float
    """Bound pods per second over ``seconds``; meaningful for backlogs only (throughput, gangs): a
    quality stream is fed pod by pod."""
    gangs_complete: int | None = None
    gangs_partial: int | None = None
    """Gangs with some, not all, members placed (their devices held, the job not running)."""
    rebound: int = 0
    """Pods seen bound to two nodes (must be 0)."""
    overlapping: int = 0
    """Allocated devices sharing a memory slice of one GPU with another claim's (must be 0)."""


@dataclass
class DraBenchReport:
    config: DraBenchConfig
    runs: list[Run] = field(default_factory=list)
    setup_s: float = 0.0

    def run(self, part: str, scheduler: str) -> Run | None:
        """``scheduler``'s run of ``part``; its best by pods/s where it ran more than once."""
        runs = [r for r in self.runs if r.part == part and r.scheduler == scheduler]
        return max(runs, key=lambda r: r.pods_per_s) if runs else None

    def ratio(self) -> float | None:
        """Throughput: gpusched's best pods/s over kube-scheduler's best, same control plane and run."""
        k, g = self.run(THROUGHPUT, KUBE), self.run(THROUGHPUT, GPUSCHED)
        return round(g.pods_per_s / k.pods_per_s, 3) if k and g and k.pods_per_s else None

    def as_dict(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "nodes": cfg.nodes,
            "gpus": cfg.gpus,
            "seed": cfg.seed,
            "parts": list(cfg.parts),
            "gangs": {p: [cfg.gang_count(p), cfg.gang_size_of(p)] for p in GANG_PARTS if p in cfg.parts},
            "setup_s": self.setup_s,
            "throughput_rounds": cfg.throughput_rounds if THROUGHPUT in cfg.parts else 0,
            "throughput_pods_per_s": {
                s: (r.pods_per_s if (r := self.run(THROUGHPUT, s)) else None) for s in SCHEDULERS
            },
            "throughput_ratio_gpusched_to_kube_scheduler": self.ratio(),
            "runs": [asdict(r) for r in self.runs],
            "command": self.command(),
        }

    def command(self) -> str:
        cfg, base = self.config, DraBenchConfig()
        opts = [f"--nodes {cfg.nodes}", f"--seed {cfg.seed}"]
        if cfg.gpus_per_node != base.gpus_per_node:
            opts.append(f"--gpus-per-node {cfg.gpus_per_node}")
        if cfg.parts != base.parts:
            opts.append(f"--only {','.join(cfg.parts)}")
        if cfg.throughput_per_gpu != base.throughput_per_gpu:
            opts.append(f"--throughput-per-gpu {cfg.throughput_per_gpu}")
        if cfg.throughput_rounds != base.throughput_rounds:
            opts.append(f"--throughput-rounds {cfg.throughput_rounds}")
        if (cfg.gang_size, cfg.gang_load) != (base.gang_size, base.gang_load):
            opts.append(f"--gang-size {cfg.gang_size} --gang-load {cfg.gang_load}")
        return "gpusched bench dra " + " ".join(opts)

    def tables(self) -> list[Table]:
        """The side-by-side tables: quality (the streams fed pod by pod), then throughput and gangs
        (the backlogs); one row a run, empty tables left out."""
        quality = Table(
            "placement quality: pods placed, and a GPU's compute sevenths placed (a whole GPU is 7)",
            ("part", "scheduler", "pods", "at 1st refusal", "7ths then", "saturated", "7ths then"),
            [
                [r.part, r.scheduler, str(r.pods), str(r.placed_at_first_refusal),
                 str(r.gpu_sevenths_at_first_refusal), str(r.placed), str(r.gpu_sevenths_placed)]
                for r in self.runs if r.part in MIXES
            ],
        )  # fmt: skip
        backlog = Table(
            "backlogs: bound pods/s (first binding to last), gangs complete / partly placed",
            ("part", "scheduler", "pods", "placed", "gangs", "pods/s"),
            [
                [r.part, r.scheduler, str(r.pods), str(r.placed),
                 f"{r.gangs_complete} / {r.gangs_partial}" if r.gangs_complete is not None else "",
                 f"{r.pods_per_s:.1f}"]
                for r in self.runs if r.part not in MIXES
            ],
        )  # fmt: skip
        return [t for t in (quality, backlog) if t.rows]


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]


class _Bench:
    def __init__(self, cp: ControlPlane, cfg: DraBenchConfig, on_progress: Callable[[str], None]) -> None:
        self.cp, self.cfg, self.tick = cp, cfg, on_progress
        self.tag = uuid.uuid4().hex[:6]
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=max(32, 2 * cfg.create_threads))
        self.v1: Any = client.CoreV1Api(self.api)
        self.res: Any = client.ResourceV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.classes = Classes.for_tag(self.tag)
        self.names = [f"dra-{self.tag}-{i:03d}" for i in range(cfg.nodes)]
        self.log_dir = cp.workdir / f"bench-dra-{self.tag}"
        self.count = 0

    def _each(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> None:
        with ThreadPoolExecutor(self.cfg.create_threads) as ex:
            list(ex.map(fn, items))

    def setup(self) -> None:
        for obj in self.classes.objects():
            self.res.create_device_class(obj)
        self._each(lambda n: self.v1.create_node(kwok_node(n, self.tag), _preload_content=False), self.names)
        slices = [s for n in self.names for s in node_slices(n, self.cfg.gpus_per_node)]
        self._each(lambda s: self.res.create_resource_slice(s, _preload_content=False), slices)
        wait_until(lambda: ready_untainted(self.v1, self.tag) == self.cfg.nodes, timeout=self.cfg.timeout_s,
                   what="the DRA bench nodes Ready", control_plane=self.cp, interval=0.5)  # fmt: skip

    def teardown(self) -> None:
        for name in (self.classes.gpu, self.classes.mig):
            self.res.delete_device_class(name, _preload_content=False)
        slices = [s["metadata"]["name"] for n in self.names for s in node_slices(n, self.cfg.gpus_per_node)]
        self._each(lambda s: self.res.delete_resource_slice(s, _preload_content=False), slices)
        self.v1.delete_collection_node(label_selector=f"{LABEL}={self.tag}", _preload_content=False)

    def _scheduler(self, which: str, name: str) -> AbstractContextManager[SchedulerProcess]:
        if which in (KUBE, KUBE_WORKLOAD):
            cfg = kube_scheduler_config(self.cp.kubeconfig_path, name, qps=LIFTED_QPS)
            gates = "GenericWorkload=true" if which == KUBE_WORKLOAD else ""
            return kube_scheduler(self.cp, name, cfg, self.log_dir, feature_gates=gates)
        return gpusched_scheduler(self.cp, name, name, self.log_dir)

    def run(self, part: str, which: str, asks: list[Ask], groups: list[int] | None) -> Run:
        """The stream through one scheduler: quality streams pod by pod (each pod and its claim created
        once the one before is bound or refused: arrivals in the stream's order, exactly), the others
        as a backlog (all created, then the scheduler starts)."""
        self.count += 1
        short = f"{_SHORT[which]}{self.count}"
        ns, sched = f"dra-{part}-{short}-{self.tag}", f"{short}-{part}-{self.tag}"
        self.v1.create_namespace({"metadata": {"name": ns}})
        if groups is not None:
            p = API.WORKLOAD.value
            self._each(lambda g: self.custom.create_namespaced_custom_object(
                p.group, p.version, ns, p.plural, pod_group(f"g-{g:03d}", self.cfg.gang_size_of(part))),
                sorted(set(groups)))  # fmt: skip
        watcher = DecisionWatcher(self.v1, ns)
        watcher.start()
        try:
            if part in MIXES:
                with self._scheduler(which, sched) as proc:
                    for i in range(len(asks)):
                        self._create(ns, sched, asks, groups, [i])
                        self._wait_decided(watcher, f"p-{i:05d}", proc)
                        self.tick(f"{part} · {which}")
            else:
                self._create(ns, sched, asks, groups, range(len(asks)))
                wait_until(lambda: watcher.count_seen() >= len(asks), timeout=self.cfg.timeout_s,
                           what=f"{part}: every pod seen")  # fmt: skip
                with self._scheduler(which, sched) as proc:
                    self._decide(ns, part, which, watcher, len(asks), proc)
            return self._result(ns, part, which, asks, groups, watcher)
        finally:
            watcher.stop()
            self._clear(ns)

    def _create(
        self, ns: str, sched: str, asks: list[Ask], groups: list[int] | None, which: Sequence[int]
    ) -> None:
        """Pods ``which`` of the stream, each claim before its pod."""
        claims = [self.classes.claim(f"c-{i:05d}", asks[i]) for i in which]
        self._each(lambda c: self.res.create_namespaced_resource_claim(ns, c, _preload_content=False), claims)
        bodies = [
            claim_pod(f"p-{i:05d}", f"c-{i:05d}", self.tag, sched, f"g-{groups[i]:03d}" if groups else "")
            for i in which
        ]
        self._each(lambda b: self.v1.create_namespaced_pod(ns, b, _preload_content=False), bodies)

    def _wait_decided(self, watcher: DecisionWatcher, pod: str, proc: SchedulerProcess) -> None:
        t_end = time.monotonic() + self.cfg.timeout_s
        while pod not in watcher.bound_at and pod not in watcher.refused():
            proc.alive()
            if time.monotonic() > t_end:
                raise TimeoutError(f"{pod} neither bound nor refused in {self.cfg.timeout_s} s")
            time.sleep(0.01)

    def _events(self, ns: str) -> int:
        return len(json.loads(self.v1.list_namespaced_event(ns, _preload_content=False).data)["items"])

    def _decide(
        self, ns: str, part: str, which: str, watcher: DecisionWatcher, n: int, proc: SchedulerProcess
    ) -> None:
        """Until every pod is bound or refused, or quiet for ``quiet_s`` after the first sign."""
        t_end = time.monotonic() + self.cfg.timeout_s
        last, last_change, shown = (0, 0, 0), None, 0
        while True:
            proc.alive()
            bound = watcher.count_bound()
            refused = len(watcher.refused())
            state = (bound, refused, self._events(ns))
            decided = bound + refused
            for _ in range(shown, min(decided, n)):
                self.tick(f"{part} · {which}")
            shown = max(shown, min(decided, n))
            now = time.monotonic()
            if state != last:
                last, last_change = state, now
            if decided >= n:
                break
            if last_change is not None and any(state) and now - last_change >= self.cfg.quiet_s:
                break
            if now > t_end:
                raise TimeoutError(
                    f"{part} · {which}: {decided} of {n} pods decided in {self.cfg.timeout_s} s"
                )
            time.sleep(0.25)
        for _ in range(shown, n):
            self.tick(f"{part} · {which}")

    def _result(
        self,
        ns: str,
        part: str,
        which: str,
        asks: list[Ask],
        groups: list[int] | None,
        watcher: DecisionWatcher,
    ) -> Run:
        items = json.loads(self.v1.list_namespaced_pod(ns, _preload_content=False).data)["items"]
        node_of = {p["metadata"]["name"]: (p.get("spec") or {}).get("nodeName") for p in items}
        placed = [i for i in range(len(asks)) if node_of.get(f"p-{i:05d}")]
        refused = {n for n in watcher.refused() if not node_of.get(n)}
        first_gap = next((i for i in range(len(asks)) if not node_of.get(f"p-{i:05d}")), len(asks))
        fed = part in MIXES  # in the stream's order: the first refusal is the first gap
        rate = watcher.rate()
        complete = partial = None
        if groups is not None:
            size = self.cfg.gang_size_of(part)
            landed = [sum(1 for i in placed if groups[i] == g) for g in sorted(set(groups))]
            complete = sum(1 for k in landed if k == size)
            partial = sum(1 for k in landed if 0 < k < size)
        return Run(
            part=part,
            scheduler=which,
            pods=len(asks),
            placed=len(placed),
            placed_at_first_refusal=first_gap if fed else None,
            refused=len(refused),
            undecided=len(asks) - len(placed) - len(refused),
            gpu_sevenths_placed=slices_used([asks[i] for i in placed]),
            gpu_sevenths_at_first_refusal=slices_used(asks[:first_gap]) if fed else None,
            seconds=rate.seconds,
            pods_per_s=rate.pods_per_s,
            gangs_complete=complete,
            gangs_partial=partial,
            rebound=len(watcher.rebound),
            overlapping=self._overlapping(ns),
        )

    def _overlapping(self, ns: str) -> int:
        """Allocated devices whose memory slices another allocation of this run also holds."""
        items = json.loads(self.res.list_namespaced_resource_claim(ns, _preload_content=False).data)["items"]
        held: dict[tuple[str, int], list[frozenset[int]]] = {}
        for c in items:
            alloc = (c.get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or ():
                gpu, slices = memory_slices_of(str(r["device"]))
                held.setdefault((str(r["pool"]), gpu), []).append(slices)
        bad = 0
        for parts in held.values():
            for k, s in enumerate(parts):
                bad += any(s & other for j, other in enumerate(parts) if j != k)
        return bad

    def _clear(self, ns: str) -> None:
        """Delete the run's pods (at once: kwok runs no container) and claims, wait until they are gone
        (their devices free again), then the namespace (not waited for: the namespace controller takes
        seconds, and nothing of it holds a device)."""
        self.v1.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False)
        self.res.delete_collection_namespaced_resource_claim(ns, _preload_content=False)

        def gone() -> bool:
            pods = json.loads(self.v1.list_namespaced_pod(ns, _preload_content=False).data)["items"]
            claims = self.res.list_namespaced_resource_claim(ns, _preload_content=False)
            return not pods and not json.loads(claims.data)["items"]

        wait_until(gone, timeout=self.cfg.timeout_s, what=f"{ns}'s pods and claims gone", interval=0.2)
        self.v1.delete_namespace(ns, _preload_content=False)


def run_dra_bench(
    cp: ControlPlane, cfg: DraBenchConfig, on_progress: Callable[[str], None] = lambda _m: None
) -> DraBenchReport:
    """Every part of ``cfg`` on ``cp`` (kwok and kube-controller-manager running; its own kube-scheduler,
    if any, serves other scheduler names): kube-scheduler, then gpusched, on the same nodes."""
    cfg.check()
    bench = _Bench(cp, cfg, on_progress)
    report = DraBenchReport(cfg)
    t0 = time.perf_counter()
    bench.setup()
    report.setup_s = round(time.perf_counter() - t0, 1)
    try:
        streams = cfg.streams()
        for part, which in cfg.plan():
            asks, groups = streams[part]
            report.runs.append(bench.run(part, which, asks, groups))
    finally:
        bench.teardown()
    return report


def bench_dra(
    cfg: DraBenchConfig, *, on_progress: Callable[[str], None] = lambda _m: None, bin_dir: Path | None = None
) -> DraBenchReport:
    """Start a control plane (no kube-scheduler of its own) and run every part on it."""
    cfg.check()
    with ControlPlane(bin_dir=bin_dir, scheduler=False, controller_manager=True, kwok=True) as cp:
        return run_dra_bench(cp, cfg, on_progress)
