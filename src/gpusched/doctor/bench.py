"""Doctor's cost: one pending pod on a large synthetic cluster, every counterfactual tried.

The cluster: ``nodes`` nodes of 8 GPUs (A100 40 GiB, a fifth of them tainted), each GPU holding
a share of 300–700 milli, so that a pending 2-GPU pod fits nowhere without moves. Timed: turning
the API objects into books (what ``doctor`` does on every call), and ``doctor_pod`` (the
per-node reasons, the node findings and the counterfactuals, the move planner included); then
``doctor_pod`` again once one GPU of the cluster has failed (a large cluster usually has one),
which adds the repair counterfactual. Best of ``repeat``; wall and CPU seconds (CPU: what a
shared machine's load does not inflate as much).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.model import GPU_MILLI, Controller, NodeSpec, PodSpec, Taint
from gpusched.doctor.analysis import doctor_pod
from gpusched.doctor.books import Books
from gpusched.doctor.checks import ANN_UNHEALTHY
from gpusched.doctor.snapshot import Snapshot, snapshot_of_state

T = TypeVar("T")

OWNER = Controller("ReplicaSet", "synthetic", "apps")  # the synthetic shares may move


def synthetic_books(nodes: int, seed: int = 0) -> tuple[Books, str]:
    rng = np.random.default_rng(seed)
    specs = [
        NodeSpec(
            f"node-{i:05d}",
            cpu_milli=96_000,
            memory_mib=1 << 20,
            gpu_count=8,
            gpu_model="A100",
            gpu_memory_mib=40_960,
            taints=(Taint("dedicated", "batch"),) if i % 5 == 0 else (),
        )
        for i in range(nodes)
    ]
    st = ClusterState(specs)
    k = 0
    for n in range(nodes):
        for g in range(8):
            milli = int(rng.integers(3, 8)) * 100
            st.assume(
                PodSpec(
                    f"s-{k}",
                    cpu_milli=1000,
                    num_gpu=1,
                    gpu_milli=milli,
                    gpu_memory_mib=4096,
                    controller=OWNER,
                ),
                n,
                [g],
            )
            k += 1
    pending = PodSpec("waiting", cpu_milli=4000, num_gpu=2, gpu_milli=GPU_MILLI)
    return Books.of(snapshot_of_state(st, [pending], source="synthetic")), pending.key


def with_failed_gpu(snap: Snapshot, node: int = 1) -> Snapshot:
    """``snap`` with GPU 0 of its ``node``-th Node marked failed by the node agent."""
    nodes = list(snap.nodes)
    sick = copy.deepcopy(nodes[node])
    sick["metadata"].setdefault("annotations", {})[ANN_UNHEALTHY] = "0"
    nodes[node] = sick
    return replace(snap, nodes=nodes)


def _timed(f: Callable[[], T], wall: list[float], cpu: list[float]) -> T:
    t, c = time.perf_counter(), time.process_time()
    out = f()
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
    return out


def bench_doctor(nodes: int = 5000, *, repeat: int = 3, seed: int = 0) -> dict[str, Any]:
    """Seconds (best of ``repeat``, wall and CPU) to build the books and to run ``doctor pod``
    for one pod, in a healthy cluster and with one failed GPU."""
    t0 = time.perf_counter()
    books, key = synthetic_books(nodes, seed)
    snap = books.snapshot
    sick = with_failed_gpu(snap)
    setup = time.perf_counter() - t0
    steps = (
        "books from API objects",
        "doctor pod (reasons, findings, counterfactuals)",
        "doctor pod, one failed GPU",
    )
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    report = sick_report = None
    for _ in range(repeat):
        healthy = _timed(lambda: Books.of(snap), wall[steps[0]], cpu[steps[0]])
        report = _timed(functools.partial(doctor_pod, healthy, key), wall[steps[1]], cpu[steps[1]])
        failed = Books.of(sick)
        sick_report = _timed(functools.partial(doctor_pod, failed, key), wall[steps[2]], cpu[steps[2]])
    assert report is not None and sick_report is not None
    best = {k: min(v) for k, v in wall.items()}
    return {
        "nodes": nodes,
        "pods": len(snap.pods),
        "seconds": {**best, "total": best[steps[0]] + best[steps[1]], "setup (not doctor)": setup},
        "cpu_seconds": {k: min(v) for k, v in cpu.items()},
        "counterfactual": report.counterfactuals[0].message if report.counterfactuals else "",
        "counterfactuals_with_a_failed_gpu": [c.kind for c in sick_report.counterfactuals],
    }


def bench_doctor_queues(nodes: int = 5000, *, repeat: int = 3, seed: int = 0) -> dict[str, Any]:
    """The cost of tenant queues in doctor, side by side in one run: the synthetic cluster
    without Queues, and with a Queue tree over every pod (leaf ``a`` at its milli-GPU quota,
    ``b`` idle beside it under ``org``), so the pending pod waits for quota and the raise is
    searched. CPU seconds, best of ``repeat``, alternating; ratios queues / none."""
    books, key = synthetic_books(nodes, seed)
    plain = books.snapshot
    used = sum(a.pod.gpu_demand_milli for a in books.state.allocations.values())
    queues = [
        {"metadata": {"name": "org"}, "spec": {"nominalQuota": {"gpuMilli": 0}}},
        {"metadata": {"name": "a"}, "spec": {"parent": "org", "namespaces": ["default"],
                                             "nominalQuota": {"gpuMilli": used}}},
        {"metadata": {"name": "b"}, "spec": {"parent": "org", "nominalQuota": {"gpuMilli": 1000}}},
    ]  # fmt: skip
    runs = {"none": plain, "queues": replace(plain, queues=queues)}
    cpu: dict[str, dict[str, list[float]]] = {r: {"books": [], "doctor pod": []} for r in runs}
    wall: list[float] = []
    first = ""
    for _ in range(repeat):
        for name, snap in runs.items():
            b = _timed(functools.partial(Books.of, snap), wall, cpu[name]["books"])
            r = _timed(functools.partial(doctor_pod, b, key), wall, cpu[name]["doctor pod"])
            if name == "queues":
                first = r.counterfactuals[0].message
    best = {n: {k: min(v) for k, v in steps.items()} for n, steps in cpu.items()}
    return {
        "nodes": nodes,
        "pods": len(plain.pods),
        "cpu_seconds": best,
        "ratio": {k: best["queues"][k] / best["none"][k] for k in best["none"]},
        "counterfactual": first,
    }
