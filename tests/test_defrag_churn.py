"""The churn protocol (sim.churn), the paper protocol with one-shot consolidation, and the bench
entry points of defragmentation (bench.defrag), on small clusters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpusched.bench.defrag import churn_comparison, churn_runs, churn_summary, planner_cost, write_churn_plots
from gpusched.core.errors import InvalidInput
from gpusched.sim.churn import ChurnConfig, DefragConfig, draw_pods, run_churn
from gpusched.sim.paper import run_paper
from gpusched.sim.paper_consolidate import run_paper_consolidated
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload
from gpusched.sim.traces import TracePod
from gpusched.sim.workload import load_workload

NODES, POOL = synthetic_workload(SyntheticConfig(nodes=40))
SHORT = ChurnConfig(load=0.95, horizon_s=6 * 3600, warmup_s=3600, seed=3)
TRIGGERED = DefragConfig(mode="triggered", move_budget=0.02, wait_threshold_s=300)


def test_offered_load_and_lifetimes_follow_the_config() -> None:
    specs, created, life = draw_pods(POOL, NODES, replace(SHORT, horizon_s=48 * 3600))
    cap = sum(n.gpu_count for n in NODES) * 1000
    offered = sum(s.gpu_demand_milli * min(v, 10**9) for s, v in zip(specs, life, strict=True))
    rho = offered / (cap * 48 * 3600)
    assert 0.85 < rho < 1.05
    assert created == sorted(created) and max(created) < 48 * 3600
    assert max(life) <= SHORT.max_lifetime_s and min(life) >= 1
    again = draw_pods(POOL, NODES, replace(SHORT, horizon_s=48 * 3600))
    assert [s.key for s in again[0]] == [s.key for s in specs] and again[2] == life


def test_trace_lifetimes_need_deletion_times() -> None:
    pool = [TracePod(POOL[0].spec, None, None)]
    with pytest.raises(InvalidInput, match="lifetime 'trace' needs creation and deletion times"):
        draw_pods(pool, NODES, SHORT)
    specs, _, life = draw_pods(pool, NODES, replace(SHORT, lifetime="lognormal"))
    assert specs and all(v >= 1 for v in life)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"ChurnConfig\.warmup_s must be in \[0, horizon_s\)"):
        ChurnConfig(horizon_s=10, warmup_s=10)
    with pytest.raises(InvalidInput, match=r"DefragConfig\.mode must be one of off, triggered, periodic"):
        DefragConfig(mode="sometimes")
    with pytest.raises(InvalidInput, match=r"move budgets are fractions in \(0, 1\]"):
        churn_comparison(load_workload(None, None, SyntheticConfig(nodes=10)), budgets=(2.0,))


def test_triggered_defrag_places_big_pods_within_the_budget_and_keeps_the_books() -> None:
    off = run_churn(NODES, POOL, SHORT, DefragConfig(mode="off"), audit=True)
    on = run_churn(NODES, POOL, SHORT, TRIGGERED, audit=True)
    assert off.moves == 0 and off.plans["attempted"] == 0
    assert on.pods_arrived == off.pods_arrived  # the same pods arrive
    assert on.moves <= 0.02 * on.pods_arrived and on.moved_pct <= 2.0
    assert on.plans["carried_out"] > 0
    assert on.pods_moved <= on.moves
    big = [c for c in ("4 GPUs", "8 GPUs") if c in off.pending and off.pending[c]["still_pending"]]
    assert big, "the setting should leave big pods waiting without defragmentation"
    for c in big:
        assert on.pending[c]["placed"] > off.pending[c]["placed"]
    again = run_churn(NODES, POOL, SHORT, TRIGGERED)
    assert again.to_dict() == on.to_dict()  # deterministic


def test_zero_budget_is_the_run_without_defrag() -> None:
    off = run_churn(NODES, POOL, SHORT, DefragConfig(mode="off"))
    none = run_churn(NODES, POOL, SHORT, replace(TRIGGERED, move_budget=0.0))
    assert none.moves == 0
    assert none.mean_alloc_pct == off.mean_alloc_pct and none.pending == off.pending


def test_periodic_consolidation_moves_within_the_budget() -> None:
    cfg = replace(SHORT, horizon_s=3 * 3600)
    on = run_churn(
        NODES, POOL, cfg, DefragConfig(mode="periodic", move_budget=0.01, period_s=1800), audit=True
    )
    assert on.plans["consolidations"] > 0
    assert on.moves <= 0.01 * on.pods_arrived


def test_churn_comparison_and_plots(tmp_path: Path) -> None:
    wl = load_workload(None, None, SyntheticConfig(nodes=20))
    cfg = ChurnConfig(horizon_s=2 * 3600, warmup_s=1800)
    seen: list[tuple[int, int]] = []
    rep = churn_comparison(
        wl,
        seeds=(0,),
        budgets=(0.01, 0.02),
        modes=("triggered",),
        config=cfg,
        on_progress=lambda d, n: seen.append((d, n)),
    )
    assert seen[-1] == (3, 3) == (churn_runs(("triggered",), (0.01, 0.02), (0,)),) * 2
    assert [r.label for r in rep.results] == ["off", "triggered (1 % budget)", "triggered (2 % budget)"]
    assert len(rep.gains()) == 2 and {r["label"] for r in churn_summary(rep)} == {
        r.label for r in rep.results
    }
    paths = write_churn_plots(rep, tmp_path)
    assert all(Path(p).stat().st_size > 1000 for p in paths)
    d = rep.to_dict()
    assert d["protocol"] == "churn" and len(d["results"]) == 3  # type: ignore[arg-type]


def test_paper_consolidation_without_moves_is_the_paper_run() -> None:
    specs = [tp.spec for tp in POOL]
    r = run_paper_consolidated(NODES, specs, 42, max_moves=0)
    base = run_paper(NODES, specs, "default", 42)
    assert r.moves == {100: 0, 130: 0}
    assert r.alloc_at_100_without == base.alloc_at(100)
    assert r.alloc_at_100 == pytest.approx(base.alloc_at(100), abs=0.5)  # retries of failed pods only
    with_moves = run_paper_consolidated(NODES, specs, 42, max_moves=8)
    assert with_moves.alloc_at_130 >= r.alloc_at_130 - 0.5


def test_planner_cost_reports_every_method() -> None:
    r = planner_cost((60,), instances=3)
    (row,) = r["sizes"]  # type: ignore[misc]
    assert row["nodes"] == 60
    for name in ("greedy", "exact", "both"):
        assert row[name]["p50_ms"] >= 0 and row[name]["p99_ms"] >= row[name]["p50_ms"]
