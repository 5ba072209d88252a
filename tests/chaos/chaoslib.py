"""The chaos suite's harness: a seeded GPU workload on kwok nodes, the two front ends as processes that can
be SIGKILLed and restarted, background pod creation and deletion, and the one read-back checker.

The checker trusts nothing but the API: after a run it lists every node and pod of the run, recomputes the
GPU books from the ``gpusched.io/assignment`` annotation of every bound, non-terminal pod and each pod's own
requests, and counts GPUs over 1000 milli, GPUs over their memory, nodes over their ``nvidia.com/gpu`` count,
bound GPU pods without a valid assignment naming their node, and pending pods that would fit.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.k8s.convert import ANN_ASSIGNMENT, LABEL_MEMORY, RES_GPU, RES_MEMORY, RES_MILLI
from gpusched.testenv import ControlPlane, free_port, wait_until
from gpusched.testenv.kwoknodes import kwok_gpu_node

GROUP = "gpusched.io/chaos-group"
MODEL = "NVIDIA-A100-SXM4-80GB"
GPU_MEMORY_MIB = 81920
TERMINAL = ("Succeeded", "Failed")
ENV_SEEDS = "GPUSCHED_CHAOS_SEEDS"
ENV_REPORT = "GPUSCHED_CHAOS_REPORT"


# ----------------------------------------------------------------------------------------- parameters
def parse_seeds(text: str | None) -> list[int]:
    """``"1"``, ``"1-5"``, ``"1,4,9-11"`` → seeds (default ``[1]``)."""
    seeds: list[int] = []
    for part in (text or "1").replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return seeds or [1]


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


@dataclass(frozen=True)
class Workload:
    """Scaled down from the original probe (200 nodes × 8 A100-80GB, 3000 pods at 30/s) to fit CI; the
    ``GPUSCHED_CHAOS_NODES`` / ``_PODS`` / ``_RATE`` variables scale it back up. About 60 % of the GPUs are
    asked in total, so that everything fits even after fragmentation: every pod must end bound."""

    nodes: int = field(default_factory=lambda: _env_int("GPUSCHED_CHAOS_NODES", 40))
    gpus_per_node: int = 8
    pods: int = field(default_factory=lambda: _env_int("GPUSCHED_CHAOS_PODS", 300))
    rate: float = field(default_factory=lambda: float(os.environ.get("GPUSCHED_CHAOS_RATE") or 25.0))
    whole_share: float = 0.12
    """Fraction of pods asking 1, 2, 4 or 8 whole ``nvidia.com/gpu``; the rest are shares."""


def pod_requests(rng: random.Random, wl: Workload) -> dict[str, str]:
    """One pod's requests: mostly a share of 100–700 milli (a third also 1–20 GiB of GPU memory), some
    1, 2, 4 or 8 whole GPUs."""
    res = {"cpu": "100m", "memory": "256Mi"}
    if rng.random() < wl.whole_share:
        res[RES_GPU] = str(rng.choice([1, 1, 1, 2, 2, 4, 8]))
    else:
        res[RES_MILLI] = str(rng.randint(100, 700))
        if rng.random() < 1 / 3:
            res[RES_MEMORY] = str(1024 * rng.randint(1, 20))
    return res


# -------------------------------------------------------------------------------------- the checker
def _quantity(v: Any) -> int:
    return int(str(v))


def _requests(pod: dict[str, Any]) -> tuple[int, int, int]:
    """(whole GPUs, milli of a share, GPU memory MiB per GPU) from the pod's own containers."""
    num = milli = mem = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        r = (c.get("resources") or {}).get("limits") or (c.get("resources") or {}).get("requests") or {}
        num += _quantity(r.get(RES_GPU, 0))
        milli += _quantity(r.get(RES_MILLI, 0))
        mem += _quantity(r.get(RES_MEMORY, 0))
    return num, milli, mem


@dataclass
class Books:
    """The GPU books recomputed from the API, and what is wrong with them."""

    pods: int = 0
    bound: int = 0
    pending: int = 0
    terminal: int = 0
    gpus_over_milli: dict[str, int] = field(default_factory=dict)
    """``node/gpu`` → milli booked, where > 1000."""
    gpus_over_memory: dict[str, int] = field(default_factory=dict)
    """``node/gpu`` → MiB booked, where > the GPU's memory."""
    nodes_over_count: dict[str, int] = field(default_factory=dict)
    """node → whole GPUs booked (or a GPU index out of range: -1), where over ``nvidia.com/gpu``."""
    unassigned: dict[str, str] = field(default_factory=dict)
    """bound GPU pod → what is wrong with its assignment annotation."""
    pending_fit: list[str] = field(default_factory=list)
    """pending GPU pods that fit on some node of the books as they are."""
    pending_names: list[str] = field(default_factory=list)
    holders: dict[str, list[str]] = field(default_factory=dict)
    """``node/gpu`` → the pods booked on it (name, milli, MiB), for the GPUs over milli or memory."""

    @property
    def broken(self) -> bool:
        return bool(self.gpus_over_milli or self.gpus_over_memory or self.nodes_over_count or self.unassigned)

    def summary(self) -> str:
        def some(d: Any) -> str:
            items = list(d.items())[:8] if isinstance(d, dict) else list(d)[:8]
            return f"{len(d)} {items}" if d else "0"

        return (
            f"pods {self.pods}: bound {self.bound}, pending {self.pending}, terminal {self.terminal}; "
            f"GPUs over milli {some(self.gpus_over_milli)}; GPUs over memory {some(self.gpus_over_memory)}; "
            f"nodes over count {some(self.nodes_over_count)}; bound without a valid assignment "
            f"{some(self.unassigned)}; pending that fit {some(self.pending_fit)}; "
            f"holders of the overbooked GPUs {some(self.holders)}"
        )


def read_books(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Books:
    """Recompute the GPU books of ``nodes`` from ``pods`` (both as read from the API) and check them."""
    b = Books()
    count: dict[str, int] = {}
    gmem: dict[str, int] = {}
    for n in nodes:
        name = n["metadata"]["name"]
        alloc = (n.get("status") or {}).get("allocatable") or {}
        count[name] = _quantity(alloc.get(RES_GPU, 0))
        gmem[name] = _quantity(((n["metadata"].get("labels") or {}).get(LABEL_MEMORY)) or 0)
    milli: dict[tuple[str, int], int] = defaultdict(int)
    mem: dict[tuple[str, int], int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    npods: dict[str, int] = defaultdict(int)
    pending: list[dict[str, Any]] = []
    held: dict[tuple[str, int], list[str]] = defaultdict(list)
    for p in pods:
        b.pods += 1
        meta = p["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if (p.get("status") or {}).get("phase") in TERMINAL:
            b.terminal += 1
            continue
        node = (p.get("spec") or {}).get("nodeName")
        num, share, gm = _requests(p)
        if not node:
            b.pending += 1
            b.pending_names.append(key)
            pending.append(p)
            continue
        b.bound += 1
        npods[node] += 1
        if not num and not share and not gm:
            continue
        raw = (meta.get("annotations") or {}).get(ANN_ASSIGNMENT)
        try:
            a = json.loads(raw) if raw else None
            a_node, gpus = (str(a["node"]), [int(g) for g in a["gpus"]]) if a else ("", [])
        except (ValueError, KeyError, TypeError):
            b.unassigned[key] = f"unreadable {raw!r}"
            continue
        want = num if num else 1
        if raw is None:
            b.unassigned[key] = "no assignment annotation"
            continue
        if a_node != node:
            b.unassigned[key] = f"assignment names {a_node!r}, bound to {node!r}"
            continue
        if len(gpus) != want or len(set(gpus)) != len(gpus):
            b.unassigned[key] = f"assignment GPUs {gpus}, asks {want}"
            continue
        if node not in count:
            b.unassigned[key] = f"bound to {node!r}, not a node of the run"
            continue
        if any(not 0 <= g < count[node] for g in gpus):
            b.nodes_over_count[node] = -1
        whole[node] += num
        for g in gpus:
            milli[node, g] += 1000 if num else share
            held[node, g].append(f"{meta['name']}({1000 if num else share}m,{gm}Mi)")
            mem[node, g] += gm
    for (node, g), m in milli.items():
        if m > 1000:
            b.gpus_over_milli[f"{node}/{g}"] = m
            b.holders[f"{node}/{g}"] = held[node, g]
    for (node, g), m in mem.items():
        if gmem.get(node) and m > gmem[node]:
            b.gpus_over_memory[f"{node}/{g}"] = m
            b.holders[f"{node}/{g}"] = held[node, g]
    for node, w in whole.items():
        if w > count.get(node, 0):
            b.nodes_over_count[node] = w
    for p in pending:
        num, share, gm = _requests(p)
        if not (num or share or gm):
            continue

        def fits(node: str, num: int = num, share: int = share, gm: int = gm) -> bool:
            if npods[node] >= 110:
                return False
            free = [g for g in range(count[node]) if milli[node, g] == 0 and mem[node, g] == 0]
            if num:
                return len(free) >= num and (not gm or gm <= gmem[node])
            return any(
                milli[node, g] + share <= 1000 and (not gmem[node] or mem[node, g] + gm <= gmem[node])
                for g in range(count[node])
            )

        if any(fits(n) for n in count):
            meta = p["metadata"]
            b.pending_fit.append(f"{meta['namespace']}/{meta['name']}")
    return b


# ---------------------------------------------------------------------------------------- front ends
def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


class FrontEnd:
    """A front end as a process that can be SIGKILLed and restarted (same command line, same port)."""

    kind = ""

    def __init__(self, kubeconfig: Path, log: Path, port: int) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0

    @property
    def scheduler_name(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, wait_ready: float = 0.0) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n===== start #{self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.starts += 1
        if wait_ready:
            wait_until(self._ready, timeout=wait_ready, what=f"the {self.kind} to be ready")

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the {self.kind} exited ({self.proc.returncode}): {self.log_tail()}")
        return _http_status(f"http://127.0.0.1:{self.port}/readyz") == 200

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Until the process answers ``/healthz`` (it listens; its books may still be syncing)."""

        def serving() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise AssertionError(f"the {self.kind} is not running: {self.log_tail()}")
            return _http_status(f"http://127.0.0.1:{self.port}/healthz") == 200

        wait_until(serving, timeout=timeout, what=f"the {self.kind} to serve", interval=0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.kills += 1
            with self.log.open("ab") as out:
                out.write(f"\n===== SIGKILL at {time.time():.3f}\n".encode())

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


class Standalone(FrontEnd):
    """``gpusched scheduler`` for pods with ``spec.schedulerName: <name>`` (no leader election)."""

    kind = "standalone"

    def __init__(self, kubeconfig: Path, log: Path, name: str) -> None:
        super().__init__(kubeconfig, log, free_port())
        self.name = name

    @property
    def scheduler_name(self) -> str:
        return self.name

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "gpusched.cli", "scheduler", "--kubeconfig", str(self.kubeconfig)),
            *("--scheduler-name", self.name, "--no-leader-elect", "--port", str(self.port)),
        ]


class Extender(FrontEnd):
    """``gpusched extender`` on the port that the control plane's kube-scheduler calls (profile
    ``gpusched`` of deploy/extender/scheduler-config.yaml)."""

    kind = "extender"

    @property
    def scheduler_name(self) -> str:
        return "gpusched"

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "gpusched.cli", "extender", "--kubeconfig", str(self.kubeconfig)),
            *("--host", "127.0.0.1", "--port", str(self.port), "--policy", "default"),
        ]


# ------------------------------------------------------------------------------------------ the run
def _api_error(e: BaseException) -> int | None:
    status = getattr(e, "status", None)
    return status if isinstance(status, int) else None


class Run:
    """One seeded chaos run: its namespace, kwok node group, pods, front end and report."""

    def __init__(
        self, cp: ControlPlane, scenario: str, seed: int, front: FrontEnd, workload: Workload | None = None
    ) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.scenario = scenario
        self.seed = seed
        self.front = front
        self.wl = workload or Workload()
        self.rng = random.Random(f"{scenario}/{front.kind}/{seed}")
        self.tag = uuid.uuid4().hex[:6]
        self.ns = f"chaos-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path), qps_pool=32)
        self.v1: Any = client.CoreV1Api(self.api)  # raw dict bodies and _preload_content=False
        self.created = 0
        self.expected = self.wl.pods
        self._created_lock = threading.Lock()
        self.deleted: list[str] = []
        self.events: list[str] = []
        self.extra: dict[str, Any] = {}
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.books: Books | None = None
        self.report: dict[str, Any] = {}
        self.on_report: Callable[[dict[str, Any]], None] | None = None

    # --- setup
    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.2f}s {what}")

    def setup(self) -> None:
        self.v1.create_namespace({"metadata": {"name": self.ns}}, _preload_content=False)
        names = [f"chaos-{self.tag}-n{i:03d}" for i in range(self.wl.nodes)]

        def make(name: str) -> None:
            body = kwok_gpu_node(
                name,
                self.wl.gpus_per_node,
                model=MODEL,
                gpu_memory_mib=GPU_MEMORY_MIB,
                labels={GROUP: self.tag},
            )
            self.v1.create_node(body, _preload_content=False)

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(make, names))

        def ready() -> bool:
            items = self.list_nodes()
            return len(items) == len(names) and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                and not n["spec"].get("taints")
                for n in items
            )

        wait_until(
            ready, timeout=180, what="kwok nodes Ready and untainted", control_plane=self.cp, interval=1
        )
        self.note(f"{len(names)} nodes ready")

    def cleanup(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self.front.stop()
        with contextlib.suppress(Exception):
            self.v1.delete_namespace(self.ns, _preload_content=False)
        with contextlib.suppress(Exception):
            self.v1.delete_collection_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False)

    # --- API reads (tolerant of an apiserver that is down for a moment)
    def _retry(self, fn: Callable[[], Any], timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fn()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def list_nodes(self) -> list[dict[str, Any]]:
        resp = self._retry(
            lambda: self.v1.list_node(label_selector=f"{GROUP}={self.tag}", _preload_content=False)
        )
        return list(json.loads(resp.data)["items"])

    def list_pods(self) -> list[dict[str, Any]]:
        resp = self._retry(lambda: self.v1.list_namespaced_pod(self.ns, _preload_content=False))
        return list(json.loads(resp.data)["items"])

    def bound(self) -> int:
        return sum(1 for p in self.list_pods() if (p.get("spec") or {}).get("nodeName"))

    # --- workload
    def pod_bodies(
        self, n: int | None = None, prefix: str = "c", shares_only: bool = False
    ) -> list[dict[str, Any]]:
        # the same pods for both front ends and every scenario
        rng = random.Random(f"pods/{self.seed}" if prefix == "c" else f"pods/{prefix}/{self.seed}")
        wl = (
            Workload(self.wl.nodes, self.wl.gpus_per_node, self.wl.pods, self.wl.rate, 0.0)
            if shares_only
            else self.wl
        )
        bodies = []
        for i in range(self.wl.pods if n is None else n):
            res = pod_requests(rng, wl)
            bodies.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{prefix}-{i:04d}",
                        "namespace": self.ns,
                        "labels": {"app": "chaos"},
                    },
                    "spec": {
                        "schedulerName": self.front.scheduler_name,
                        "nodeSelector": {GROUP: self.tag},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}
                        ],
                    },
                }
            )
        return bodies

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                target()
            except Exception as e:  # reported by finish()
                self.errors.append(f"{name}: {type(e).__name__}: {e}")

        t = threading.Thread(target=guarded, name=f"chaos-{name}", daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def start_creating(self) -> threading.Thread:
        """Create the workload's pods at its steady rate in a thread; a create that fails (the apiserver is
        down) is retried, and 409 AlreadyExists counts as created (the failed try was committed)."""
        bodies = self.pod_bodies()
        self.note(f"creating {len(bodies)} pods at {self.wl.rate}/s")

        def create() -> None:
            start = time.monotonic()
            for i, body in enumerate(bodies):
                delay = start + i / self.wl.rate - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
                self._create(body)
            self.note(f"all {len(bodies)} steady pods created")

        return self._spawn("creator", create)

    def _create(self, body: dict[str, Any]) -> None:
        deadline = time.monotonic() + 90
        while True:
            try:
                self.v1.create_namespaced_pod(self.ns, body, _preload_content=False)
                break
            except Exception as e:
                if _api_error(e) == 409:
                    break
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                time.sleep(0.2)
        with self._created_lock:
            self.created += 1

    def burst(self, n: int, name: str) -> None:
        """Create ``n`` more pods (GPU shares) at once, 8 at a time, and return when they exist: the front
        end then has many bindings in flight for a moment."""
        bodies = self.pod_bodies(n, prefix=name, shares_only=True)
        with self._created_lock:
            self.expected += n
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(self._create, bodies))

    def wait_created(self, fraction: float, timeout: float = 120.0) -> None:
        want = int(fraction * self.wl.pods)
        wait_until(
            lambda: self.created >= want or bool(self.errors), timeout=timeout, what=f"{want} pods created"
        )

    def start_deleting(self, until: threading.Thread, mean_interval_s: float = 0.35) -> threading.Thread:
        """While ``until`` runs, delete a random bound pod (grace 0) every ~``mean_interval_s``."""
        rng = random.Random(f"delete/{self.seed}")

        def delete() -> None:
            while until.is_alive() and not self._stop.wait(rng.uniform(0.5, 1.5) * mean_interval_s):
                try:
                    pods = self.list_pods()
                except Exception:
                    continue
                bound = sorted(
                    p["metadata"]["name"]
                    for p in pods
                    if (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
                )
                if not bound:
                    continue
                victim = rng.choice(bound)
                try:
                    self.v1.delete_namespaced_pod(
                        victim, self.ns, grace_period_seconds=0, _preload_content=False
                    )
                    self.deleted.append(victim)
                except Exception as e:
                    if _api_error(e) != 404:
                        self.note(f"delete {victim}: {type(e).__name__}")

        return self._spawn("deleter", delete)

    def join(self, thread: threading.Thread, timeout: float = 180.0) -> None:
        thread.join(timeout)
        if thread.is_alive():
            self.errors.append(f"{thread.name} still running after {timeout:.0f}s")

    # --- the end of a run
    def drain(self, timeout: float = 120.0) -> Books:
        """Wait (bounded) until every pod is bound, or no pending pod fits and nothing moved for a while;
        the books as read back then."""
        deadline = time.monotonic() + timeout
        last: tuple[int, int] | None = None
        still = 0
        while True:
            pods = self.list_pods()
            books = read_books(self.list_nodes(), pods)
            gone = sum(1 for p in pods if p["metadata"].get("deletionTimestamp"))
            if (books.pending == 0 or not books.pending_fit) and gone == 0:
                now = (books.bound, books.pending)
                still = still + 1 if now == last else 0
                last = now
                if books.pending == 0 or still >= 3:
                    return books
            if time.monotonic() > deadline:
                self.note(f"drain timed out: {books.summary()}")
                return books
            time.sleep(2.0)

    def finish(self, drain_timeout: float = 120.0) -> dict[str, Any]:
        """Stop the chaos threads, let the backlog drain, read everything back and report; the caller
        asserts with ``check``."""
        for t in self._threads:
            self.join(t)
        self.note("chaos over; draining")
        if not self.front.alive():
            self.errors.append(f"the {self.front.kind} is not running at the end: {self.front.log_tail()}")
        books = self.books = self.drain(drain_timeout)
        self.note("read back")
        report = {
            "scenario": self.scenario,
            "front_end": self.front.kind,
            "seed": self.seed,
            "nodes": self.wl.nodes,
            "pods_created": self.created,
            "pods_deleted": len(self.deleted),
            "pods_bound": books.bound,
            "pods_pending": books.pending,
            "pending_that_fit": len(books.pending_fit),
            "gpus_over_milli": len(books.gpus_over_milli),
            "gpus_over_memory": len(books.gpus_over_memory),
            "nodes_over_count": len(books.nodes_over_count),
            "bound_without_assignment": len(books.unassigned),
            "front_end_kills": self.front.kills,
            "pending_pods": sorted(books.pending_names)[:10],
            "timeline": list(self.events),
            "duration_s": round(time.monotonic() - self.t0, 1),
            **self.extra,
        }
        self.report = report
        emit_report(report)
        if self.on_report is not None:
            self.on_report(report)
        return report

    def keep_logs(self) -> Path:
        """Copy the control plane's logs beside the front end's (the control plane's workdir goes away)."""
        dest = self.front.log.parent / f"controlplane-logs-{self.tag}"
        dest.mkdir(exist_ok=True)
        for name, path in self.cp.log_paths.items():
            with contextlib.suppress(OSError):
                shutil.copy(path, dest / f"{name}.log")
        return dest

    def check(self) -> None:
        """Assert the promise: no GPU booked twice, each bound GPU pod assigned, each pod that fits bound."""
        books = self.books
        assert books is not None, "finish() first"
        detail = (
            f"\n{self.scenario} / {self.front.kind} / seed {self.seed}: {books.summary()}\n"
            f"errors: {self.errors}\ntimeline:\n  " + "\n  ".join(self.events) + f"\n{self.front.kind} log: "
            f"{self.front.log}\ncontrol plane logs: {self.cp.log_paths.get('kube-apiserver', '')}"
        )
        if self.errors or books.broken or books.pending_fit or self.created != self.expected:
            detail += f"\nlogs kept in {self.keep_logs()}"
        assert not self.errors, detail
        assert self.created == self.expected, f"only {self.created} of {self.expected} pods created" + detail
        assert not books.gpus_over_milli, "GPUs booked over 1000 milli" + detail
        assert not books.gpus_over_memory, "GPUs booked over their memory" + detail
        assert not books.nodes_over_count, "nodes booked over their nvidia.com/gpu count" + detail
        assert not books.unassigned, "bound GPU pods without a valid assignment" + detail
        assert not books.pending_fit, "pods that fit are still pending" + detail


# ------------------------------------------------------------------------------------------ reports
_REPORTED: list[dict[str, Any]] = []


def emit_report(report: dict[str, Any]) -> None:
    """Print one run's numbers, keep them for the terminal summary, append them to ``$GPUSCHED_CHAOS_REPORT``
    (JSON lines) when set."""
    _REPORTED.append(report)
    line = json.dumps(report, sort_keys=False)
    print(f"chaos-run {line}", flush=True)
    path = os.environ.get(ENV_REPORT)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


# ----------------------------------------------------------------------------------------- fixtures
RunFactory = Callable[[ControlPlane, str, int, FrontEnd], Run]
"""``chaos_run(cp, scenario, seed, front)``: a ``Run`` set up (namespace, Ready kwok nodes)."""
