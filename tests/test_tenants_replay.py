"""The multi-tenant replay: tenants' jobs with gangs under gpusched's queues and under a plain
priority queue, side by side on the same jobs."""

from __future__ import annotations

import pytest

from gpusched.core.errors import InvalidInput
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload
from gpusched.sim.tenants import TenantConfig, make_jobs, run_tenants


@pytest.fixture(scope="module")
def workload():  # type: ignore[no-untyped-def]
    return synthetic_workload(SyntheticConfig(nodes=24, pods=300, seed=3, horizon_s=86_400))


def test_queues_never_break_quota_nor_hold_gpus_in_partial_gangs(workload) -> None:  # type: ignore[no-untyped-def]
    nodes, pods = workload
    cfg = TenantConfig(borrow_pct=0, load=4.0, gang_pct=50)
    queues, plain = run_tenants(nodes, pods, cfg)
    assert queues.mode == "queues" and plain.mode == "plain"
    assert [r["tenant"] for r in queues.rows] == list(cfg.tenants)
    for r in queues.rows:
        assert r["quota_violations"] == 0 and r["partial_gang_idle_gpu_hours"] == 0
        assert r["pending_p50_s"] <= r["pending_p99_s"]  # type: ignore[operator]
    # the plain queue knows no quota and no gangs: someone goes over, partial gangs sit idle
    assert sum(r["quota_violations"] for r in plain.rows) > 0  # type: ignore[misc]
    assert sum(r["partial_gang_idle_gpu_hours"] for r in plain.rows) > 0  # type: ignore[misc]
    # the same jobs ran: every job bound in the end under both (nothing left pending)
    assert all(r["still_pending"] == 0 for r in queues.rows + plain.rows)


def test_jobs_are_tenants_gangs_and_deterministic(workload) -> None:  # type: ignore[no-untyped-def]
    nodes, pods = workload
    cfg = TenantConfig(gang_pct=100, max_gang=3)
    gpu_milli = sum(n.gpu_count for n in nodes) * 1000
    jobs = make_jobs(pods, cfg, gpu_milli)
    assert jobs == make_jobs(pods, cfg, gpu_milli)
    assert {j.tenant for j in jobs} == set(cfg.tenants)
    for j in jobs:
        assert all(p.queue == j.tenant and p.namespace == j.tenant for p in j.pods)
        if len(j.pods) > 1:
            assert j.pods[0].is_whole and 2 <= len(j.pods) <= 3 and len({p.gang for p in j.pods}) == 1


def test_bad_scenarios_name_the_setting() -> None:
    with pytest.raises(InvalidInput, match="3 names need 3 shares"):
        TenantConfig(shares_pct=(50, 50))
    with pytest.raises(InvalidInput, match="sum to at most 100"):
        TenantConfig(shares_pct=(60, 30, 20))
    with pytest.raises(InvalidInput, match=r"gang_pct must be in 0\.\.100"):
        TenantConfig(gang_pct=101)
