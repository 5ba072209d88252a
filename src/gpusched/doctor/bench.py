"""Doctor's cost: one pending pod on a large synthetic cluster, every counterfactual tried.

The cluster: ``nodes`` nodes of 8 GPUs (A100 40 GiB, a fifth of them tainted), each GPU holding
a share of 300–700 milli, so that a pending 2-GPU pod fits nowhere without moves. Timed: turning
the API objects into books (what ``doctor`` does on every call), and ``doctor_pod`` (the
per-node reasons, the node findings and the counterfactuals, the move planner included).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec, Taint
from gpusched.doctor.analysis import doctor_pod
from gpusched.doctor.books import Books
from gpusched.doctor.snapshot import snapshot_of_state


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
                PodSpec(f"s-{k}", cpu_milli=1000, num_gpu=1, gpu_milli=milli, gpu_memory_mib=4096), n, [g]
            )
            k += 1
    pending = PodSpec("waiting", cpu_milli=4000, num_gpu=2, gpu_milli=GPU_MILLI)
    return Books.of(snapshot_of_state(st, [pending], source="synthetic")), pending.key


def bench_doctor(nodes: int = 5000, *, repeat: int = 3, seed: int = 0) -> dict[str, Any]:
    """Seconds (best of ``repeat``) to build the books and to run ``doctor pod`` for one pod."""
    t0 = time.perf_counter()
    books, key = synthetic_books(nodes, seed)
    snap = books.snapshot
    setup = time.perf_counter() - t0
    build, diagnose = [], []
    report = None
    for _ in range(repeat):
        t = time.perf_counter()
        books = Books.of(snap)
        build.append(time.perf_counter() - t)
        t = time.perf_counter()
        report = doctor_pod(books, key)
        diagnose.append(time.perf_counter() - t)
    assert report is not None
    return {
        "nodes": nodes,
        "pods": len(snap.pods),
        "seconds": {
            "books from API objects": min(build),
            "doctor pod (reasons, findings, counterfactuals)": min(diagnose),
            "total": min(build) + min(diagnose),
            "setup (not doctor)": setup,
        },
        "counterfactual": report.counterfactuals[0].message if report.counterfactuals else "",
    }
