from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.cluster import ClusterState
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.sim.synthetic import SyntheticConfig, synthetic_cluster, synthetic_pods, synthetic_workload
from gpusched.sim.traces import TracePod


@cache
def default_workload(seed: int = 0) -> tuple[list[NodeSpec], list[TracePod]]:
    return synthetic_workload(SyntheticConfig(seed=seed))


def demand_pct(nodes: Sequence[NodeSpec], pods: Sequence[TracePod]) -> float:
    cap = sum(n.gpu_count for n in nodes) * GPU_MILLI
    return 100 * sum(p.spec.gpu_demand_milli for p in pods) / cap


def fits_somewhere(pod: PodSpec, nodes: Sequence[NodeSpec]) -> bool:
    return any(
        n.gpu_count >= pod.num_gpu
        and n.cpu_milli >= pod.cpu_milli
        and n.memory_mib >= pod.memory_mib
        and (not pod.gpu_models or not pod.num_gpu or n.gpu_model in pod.gpu_models)
        for n in nodes
    )


def check_valid(cfg: SyntheticConfig, nodes: Sequence[NodeSpec], pods: Sequence[TracePod]) -> None:
    assert len(nodes) == cfg.nodes
    names = [n.name for n in nodes]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(n.name.startswith("syn-node-") for n in nodes)
    pnames = [p.spec.name for p in pods]
    assert pnames == sorted(pnames) and len(set(pnames)) == len(pnames)
    assert all(n.startswith("syn-pod-") for n in pnames)
    created = [p.created for p in pods]
    assert all(c is not None and 0 <= c <= cfg.horizon_s for c in created)
    assert created == sorted(created)  # type: ignore[type-var]
    assert all(p.deleted is not None and p.created is not None and p.deleted > p.created for p in pods)
    for p in pods:
        assert fits_somewhere(p.spec, nodes), p.spec
        assert p.spec.gpu_milli in (0, GPU_MILLI) or (p.spec.is_share and 50 <= p.spec.gpu_milli <= 990)
        assert p.spec.gpu_milli % 10 == 0
        if p.spec.gpu_models:
            assert p.spec.num_gpu > 0 and 1 <= len(p.spec.gpu_models) <= 2
            assert p.spec.gpu_models <= {n.gpu_model for n in nodes}


def test_default_cluster_matches_published_totals() -> None:
    nodes = synthetic_cluster(SyntheticConfig())
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    by_model: dict[str, int] = {}
    for n in nodes:
        by_model[n.gpu_model] = by_model.get(n.gpu_model, 0) + n.gpu_count
    assert by_model == {
        "G2": 4392,
        "T4": 842,
        "P100": 265,
        "G3": 312,
        "V100M16": 195,
        "V100M32": 204,
        "A10": 2,
    }
    g2 = [n for n in nodes if n.gpu_model == "G2"]
    assert len(g2) == 549 and all(
        (n.gpu_count, n.cpu_milli, n.memory_mib) == (8, 96_000, 393_216) for n in g2
    )


@pytest.mark.parametrize("n", [1, 2, 10, 100, 5000])
def test_cluster_scales_proportionally(n: int) -> None:
    nodes = synthetic_cluster(SyntheticConfig(nodes=n))
    assert len(nodes) == n
    g2 = sum(1 for x in nodes if x.gpu_model == "G2")
    assert abs(g2 - n * 549 / 1213) <= 1


def test_same_seed_identical_different_seed_differs() -> None:
    a = synthetic_workload(SyntheticConfig(nodes=50, pods=300, seed=7))
    b = synthetic_workload(SyntheticConfig(nodes=50, pods=300, seed=7))
    c = synthetic_workload(SyntheticConfig(nodes=50, pods=300, seed=8))
    assert a == b
    assert a[1] != c[1]


def test_default_composition() -> None:
    nodes, pods = default_workload()
    check_valid(SyntheticConfig(), nodes, pods)
    n = len(pods)
    assert abs(n - 8152) <= 0.02 * 8152
    specs = [p.spec for p in pods]
    assert abs(100 * sum(s.num_gpu == 0 for s in specs) / n - 100 * 1088 / 8152) <= 3
    assert abs(100 * sum(s.is_share for s in specs) / n - 100 * 3078 / 8152) <= 4
    assert abs(100 * sum(s.num_gpu == 1 and not s.is_share for s in specs) / n - 100 * 3911 / 8152) <= 4
    multi = {k: sum(s.num_gpu == k for s in specs) for k in (2, 4, 8)}
    assert 5 <= multi[2] <= 30 and 5 <= multi[4] <= 30 and 25 <= multi[8] <= 65
    shares = [s.gpu_milli for s in specs if s.is_share]
    top = {v: shares.count(v) for v in (810, 470, 320, 650, 230, 460)}
    assert top[810] > top[470] > top[320] > top[230]
    assert abs(top[810] / len(shares) - 1078 / 3078) <= 0.04
    assert not any(s.gpu_models for s in specs)  # constrained_pct defaults to 0
    # CPU and memory demand stay below the cluster's capacity
    assert sum(s.cpu_milli for s in specs) < sum(x.cpu_milli for x in nodes)
    assert sum(s.memory_mib for s in specs) < sum(x.memory_mib for x in nodes)
    assert all(s.memory_mib % 1024 == 0 for s in specs)


@pytest.mark.parametrize("pct", [40.0, 98.0, 130.0, 250.0])
def test_gpu_demand_on_target(pct: float) -> None:
    cfg = SyntheticConfig(nodes=300, pods=2000, gpu_demand_pct=pct, seed=3)
    nodes, pods = synthetic_workload(cfg)
    assert abs(demand_pct(nodes, pods) - pct) <= 0.03 * pct


def test_default_demand_and_lifetimes() -> None:
    nodes, pods = default_workload()
    assert abs(demand_pct(nodes, pods) - 98.0) <= 0.03 * 98.0
    life = np.array([p.deleted - p.created for p in pods])  # type: ignore[operator]
    assert 400 <= np.median(life) <= 700
    assert np.percentile(life, 99) > 20 * np.median(life)  # heavy tail
    created = np.array([p.created for p in pods])
    assert created.max() > 0.95 * 12_901_761 and created.min() < 0.05 * 12_901_761


def test_every_pod_schedules_on_an_empty_cluster() -> None:
    nodes, pods = default_workload()
    profile = make_profile("bestfit")
    rng = np.random.default_rng(0)
    sample = [pods[i].spec for i in rng.choice(len(pods), 200, replace=False)]
    sample += [p.spec for p in pods if p.spec.num_gpu >= 4]  # the largest pods
    for spec in sample:
        assert schedule_one(profile, spec, ClusterState(nodes), diagnose_failures=False).scheduled, spec


def test_constrained_pods() -> None:
    cfg = SyntheticConfig(nodes=100, pods=700, constrained_pct=30.0, seed=1)
    nodes, pods = synthetic_workload(cfg)
    check_valid(cfg, nodes, pods)
    gpu = [p.spec for p in pods if p.spec.num_gpu]
    share = sum(bool(s.gpu_models) for s in gpu) / len(gpu)
    assert 0.22 <= share <= 0.38
    profile = make_profile("bestfit")
    for s in [s for s in gpu if s.gpu_models][:100]:
        assert schedule_one(profile, s, ClusterState(nodes), diagnose_failures=False).scheduled, s


def test_small_config() -> None:
    cfg = SyntheticConfig(nodes=10, pods=50)
    nodes, pods = synthetic_workload(cfg)
    check_valid(cfg, nodes, pods)
    assert len(nodes) == 10 and 30 <= len(pods) <= 150


def test_pods_for_given_nodes() -> None:
    nodes = [
        NodeSpec("a", cpu_milli=16_000, memory_mib=65_536, gpu_count=2, gpu_model="T4"),
        NodeSpec("b", cpu_milli=8_000, memory_mib=32_768, gpu_count=1, gpu_model="A10"),
    ]
    cfg = SyntheticConfig(nodes=2, pods=30, constrained_pct=50.0)
    pods = synthetic_pods(cfg, nodes)
    for p in pods:
        assert fits_somewhere(p.spec, nodes), p.spec
        assert p.spec.num_gpu <= 2
    with pytest.raises(ValueError, match="nodes"):
        synthetic_pods(cfg, [NodeSpec("c", cpu_milli=8000, memory_mib=1024)])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nodes", 0),
        ("nodes", -3),
        ("pods", 0),
        ("gpu_demand_pct", 0.0),
        ("gpu_demand_pct", 1000.5),
        ("gpu_demand_pct", -1.0),
        ("horizon_s", -1),
        ("median_lifetime_s", 0),
        ("constrained_pct", 101.0),
    ],
)
def test_invalid_config_names_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SyntheticConfig(**{field: value})  # type: ignore[arg-type]


def test_zero_horizon_and_max_pct() -> None:
    cfg = SyntheticConfig(nodes=5, pods=20, horizon_s=0, gpu_demand_pct=1000.0)
    nodes, pods = synthetic_workload(cfg)
    check_valid(cfg, nodes, pods)
    assert all(p.created == 0 for p in pods)
    assert abs(demand_pct(nodes, pods) - 1000.0) <= 30


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(1, 40),
    pods=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    pct=st.floats(5.0, 300.0),
    constrained=st.sampled_from([0.0, 10.0, 100.0]),
    horizon=st.integers(0, 10**6),
)
def test_any_small_config_is_valid(
    nodes: int, pods: int, seed: int, pct: float, constrained: float, horizon: int
) -> None:
    cfg = SyntheticConfig(
        nodes=nodes, pods=pods, seed=seed, gpu_demand_pct=pct, constrained_pct=constrained, horizon_s=horizon
    )
    cluster, result = synthetic_workload(cfg)
    check_valid(cfg, cluster, result)
    cap = sum(n.gpu_count for n in cluster) * GPU_MILLI
    target = pct / 100 * cap
    demand = sum(p.spec.gpu_demand_milli for p in result)
    assert demand <= target + max(25, 0.01 * target)
    assert demand >= target - GPU_MILLI - max(25, 0.01 * target)
