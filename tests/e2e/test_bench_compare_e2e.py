"""``gpusched bench k8s --compare`` at toy size on the real control plane: every case runs, every
pod is bound exactly once, no GPU is over-booked, and the report has the documented shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpusched
from gpusched.bench.k8s_compare import CASES, EXTRA_CASES, CompareConfig, bench_compare

pytestmark = pytest.mark.e2e

KEYS = (
    "kube_scheduler_pods_per_s",
    "kube_scheduler_default_pods_per_s",
    "standalone_pods_per_s",
    "standalone_shares_pods_per_s",
    "extender_pods_per_s",
    "standalone_ratio",
    "standalone_shares_ratio",
    "extender_ratio",
)


def test_compare_binds_every_pod_once_per_scheduler(control_plane_bin: Path) -> None:
    src = Path(gpusched.__file__).resolve().parents[1]  # this very source, as a variant of itself
    variants = (("same", src),)
    cfg = CompareConfig(
        nodes=20, pods=40, warmup=4, arrival_rate=20.0, arrival_pods=10, timeout_s=240.0, variants=variants
    )
    notes: list[str] = []
    report = bench_compare(cfg, on_progress=notes.append, bin_dir=control_plane_bin)

    for key in KEYS:
        assert isinstance(report[key], float) and report[key] > 0, (key, report[key])
    assert report["nodes_unsettled"] == 0 and report["nodes_settle_s"] >= 0  # settled before any case
    assert len(report["kube_scheduler_runs_pods_per_s"]) == 2  # first and last
    assert report["kube_scheduler_pods_per_s"] == max(report["kube_scheduler_runs_pods_per_s"])
    assert set(report["latency_p99_ms"]) == set(CASES + EXTRA_CASES)
    assert all(report["latency_p99_ms"][c] is None for c in EXTRA_CASES)  # not run unless named
    runs = [(c["case"], c["run"]) for c in report["cases"]]
    assert runs[0] == ("kube-scheduler", 1) and runs[-1] == ("kube-scheduler", 2)
    assert sorted({c for c, _ in runs}) == sorted([*CASES, "standalone@same", "extender@same"])
    assert runs.index(("extender@same", 1)) == runs.index(("extender", 1)) + 1
    assert set(report["variants_pods_per_s"]) == {"standalone@same", "extender@same"}
    for c in report["cases"]:
        where = f"{c['case']} run {c['run']}"
        assert c["bound"] == c["pods"] == 40, where
        assert c["arrival_bound"] == c["arrival_pods"] == 10, where
        assert c["unbound"] == 0 and c["rebound"] == 0, where
        assert c["overbooked_gpus"] == 0, where
        assert 0 < c["latency_p50_ms"] <= c["latency_p99_ms"], where
        cpu = c["cpu_ms_per_pod"]  # from /proc, first binding to last
        kube = ("kube-scheduler",)
        by_case = {"kube-scheduler": kube, "kube-scheduler-default": kube, "extender": (*kube, "gpusched")}
        schedulers = by_case.get(c["case"].split("@")[0], ("gpusched",))
        # a toy backlog binds in 0.04-0.15 s, a few of /proc's 10 ms ticks: every process is
        # there, but one may not have ticked; the full-size runs show the values
        for proc in (*schedulers, "kube-apiserver", "etcd"):
            assert cpu[proc] >= 0, (where, proc, cpu)
        assert cpu["all"] > 0, (where, cpu)
        assert ("gpusched" in cpu) == ("gpusched" in schedulers), (where, cpu)
        assert abs(cpu["all"] - sum(v for k, v in cpu.items() if k != "all")) < 0.01, (where, cpu)  # rounded
        assert 0 < c["cores_used"] <= (os.cpu_count() or 1) + 0.1, where
        if c["case"].startswith("extender"):  # read from its /metrics: at least one of each per pod
            assert c["extender_requests"]["filter"] >= 50 and c["extender_requests"]["bind"] >= 50, where
        else:
            assert c["extender_requests"] is None, where
    assert any("extender" in n for n in notes)
    # each case (the warm-up too) ends once its namespace is gone and etcd is compacted; etcd is
    # compacted once more before the first, after the nodes joined
    cases = len(report["cases"]) + 1
    assert sum(n.startswith("namespace ") and " deleted in " in n for n in notes) == cases
    assert sum(n.startswith("etcd compacted at revision ") for n in notes) == cases + 1
