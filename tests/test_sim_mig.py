"""MIG workloads and ``gpusched bench mig`` (gpusched.sim.mig, gpusched.sim.mig_bench)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from gpusched.cli import app
from gpusched.core.errors import InvalidInput
from gpusched.core.mig.geometry import Geometry, Instance
from gpusched.core.mig.measure import DemandMix
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.sim.mig import (
    STATIC,
    MigWorkload,
    inference_workload,
    openb_mig_cluster,
    openb_workload,
    smallest_profile,
)
from gpusched.sim.mig_bench import draw, mig_bench, run_one, summarize
from gpusched.sim.mig_churn import churn_rows, churn_run
from gpusched.sim.mig_reshape import ReshapingBooks, balanced, demand_layout
from gpusched.sim.traces import TracePod

A100 = Geometry.of("a100-80gb")


@pytest.mark.parametrize(
    ("milli", "profile"),
    [
        (50, "1g.10gb"),
        (125, "1g.10gb"),  # 1/8 of memory, under 1/7 of SMs
        (140, "1g.20gb"),  # more than 1/8 of memory but under 1/7 of SMs: the double-memory 1g
        (160, "2g.20gb"),  # more than 1/7 of SMs
        (250, "2g.20gb"),
        (270, "3g.40gb"),
        (470, "4g.40gb"),  # 3.29 SM slices: 3g's 3 do not cover it
        (500, "4g.40gb"),
        (550, "7g.80gb"),
        (1000, "7g.80gb"),
    ],
)
def test_a_share_maps_to_the_smallest_covering_profile(milli: int, profile: str) -> None:
    assert smallest_profile(milli, A100) == profile


def test_a_share_out_of_range_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"1\.\.1000 milli, got 0"):
        smallest_profile(0, A100)


def _node(name: str, model: str, gpus: int = 8) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=96000, memory_mib=1 << 20, gpu_count=gpus, gpu_model=model)


def _pod(name: str, num: int, milli: int) -> TracePod:
    return TracePod(PodSpec(name=name, cpu_milli=1000, memory_mib=1024, num_gpu=num, gpu_milli=milli))


def test_openb_cluster_keeps_g2_and_g3_and_the_workload_only_shares() -> None:
    cluster = openb_mig_cluster([_node("a", "G2"), _node("b", "T4"), _node("c", "G3", 4)])
    assert [g.name for g in cluster.gpus][:2] == ["a/0", "a/1"] and len(cluster.gpus) == 12
    assert {g.geometry.model for g in cluster.gpus} == {"a100-80gb", "h100-80gb"}
    assert cluster.slices == 96
    wl = openb_workload([_pod("s", 1, 470), _pod("w", 1, 1000), _pod("m", 2, 1000), _pod("c", 0, 0)], A100)
    assert wl.pool == ("4g.40gb",) and "3 other pods left out" in wl.note
    with pytest.raises(InvalidInput, match="no node of model"):
        openb_mig_cluster([_node("b", "T4")])
    with pytest.raises(InvalidInput, match="no GPU shares"):
        openb_workload([_pod("w", 1, 1000)], A100)


def test_draw_stops_once_the_target_slices_arrived() -> None:
    wl = inference_workload()
    size = {p: A100.kind(p).mem_slices for p in wl.pool}
    reqs = draw(wl, size, 200, seed=7)
    total = sum(size[p] for p in reqs)
    assert total >= 200 and total - size[reqs[-1]] < 200
    assert reqs == draw(wl, size, 200, seed=7) != draw(wl, size, 200, seed=8)


def test_static_balanced_serves_only_its_own_profiles() -> None:
    cluster = openb_mig_cluster([_node("a", "G2", 2)])
    only_4g = MigWorkload("x", ("4g.40gb",), None, "")
    run = run_one(cluster, only_4g, STATIC, seed=1, tune=1.0)
    assert run.accepted == 0 and run.gpus_used == 0
    one_g = MigWorkload("y", ("1g.10gb",), None, "")
    run = run_one(cluster, one_g, STATIC, seed=1, tune=1.0)
    assert run.accepted == 4 and run.gpus_used == 2  # 2 x 1g per GPU in all-balanced
    dyn = run_one(cluster, one_g, "first-fit", seed=1, tune=1.0)
    assert dyn.accepted == 14 and dyn.accepted_slices == 14  # 7 x 1g per GPU


def test_bench_runs_every_policy_on_the_same_requests() -> None:
    cluster = openb_mig_cluster([_node("a", "G2"), _node("b", "G3")])
    runs = mig_bench(cluster, [inference_workload()], ["first-fit", "gpusched"], [1, 2])
    assert len({(r.seed, r.requests, r.arrived_slices) for r in runs}) == 2  # one sequence per seed
    assert all(r.accepted_slices <= r.capacity_slices for r in runs)
    rows = summarize(runs)
    assert [r["policy"] for r in rows] == ["first-fit", "gpusched"] and rows[0]["seeds"] == [1, 2]
    with pytest.raises(InvalidInput, match="unknown MIG policy worst-fit"):
        mig_bench(cluster, [inference_workload()], ["worst-fit"], [1])


def test_churn_waits_only_when_the_cluster_is_full() -> None:
    cluster = openb_mig_cluster([_node("a", "G2", 4)])
    whole = MigWorkload("w", ("7g.80gb",), None, "")
    light = churn_run(cluster, whole, "first-fit", seed=3, load=0.05, arrivals=200)
    assert light.placed_now_pct == 100.0 and light.pending_p99_s == 0.0 and light.still_pending == 0
    heavy = churn_run(cluster, whole, "gpusched", seed=3, load=3.0, arrivals=200)
    assert heavy.placed_now_pct < 50 and heavy.pending_p99_s > 0 and heavy.still_pending > 0
    assert heavy.placed_after_waiting > 0  # departures let waiting requests land
    assert heavy.used_slices_pct > 90 and heavy.gpus_used_pct > 90  # the queue keeps every GPU busy
    reshaped = churn_run(cluster, whole, "gpusched-reshape", seed=3, load=0.05, arrivals=200)
    assert reshaped.placed_now_pct == 100.0 and 1 <= reshaped.reshapes <= 4  # a 7g re-cuts an idle GPU once
    static = churn_run(cluster, whole, STATIC, seed=3, load=0.05, arrivals=50)
    assert static.placed_now_pct == 0.0 and static.still_pending == 50  # all-balanced has no 7g
    with pytest.raises(InvalidInput, match="load 0"):
        churn_run(cluster, whole, "first-fit", seed=3, load=0)


def test_churn_rows_average_the_seeds() -> None:
    cluster = openb_mig_cluster([_node("a", "G2", 2)])
    runs = [
        churn_run(cluster, inference_workload(), "best-fit", seed=s, load=1.5, arrivals=300) for s in (1, 2)
    ]
    (row,) = churn_rows(runs)
    assert row["seeds"] == [1, 2] and row["pending_p99_s_per_seed"] == [r.pending_p99_s for r in runs]
    assert row["still_pending"] == sum(r.still_pending for r in runs)


def test_demand_layout_puts_the_request_first_and_fills_with_what_is_asked_most() -> None:
    layout = demand_layout(A100, "4g.40gb", DemandMix(["3g.40gb"] * 5 + ["1g.10gb"]))
    assert layout == (Instance("4g.40gb", 0), Instance("3g.40gb", 4))
    assert balanced(A100) == (
        Instance("3g.40gb", 4), Instance("2g.20gb", 0), Instance("1g.10gb", 2), Instance("1g.10gb", 3)
    )  # fmt: skip


def test_reshaping_recuts_only_idle_gpus() -> None:
    books = ReshapingBooks(openb_mig_cluster([_node("a", "G2", 2)]))
    demand = DemandMix(["1g.10gb", "7g.80gb"])
    assert books.take("1g.10gb", demand) == (0, 2)  # the pre-cut all-balanced 1g of GPU 0
    assert books.take("7g.80gb", demand) == (1, 0) and books.reshapes == 1  # GPU 1 was idle: re-cut
    assert books.take("7g.80gb", demand) is None and books.reshapes == 1  # GPU 0 is busy: never touched
    books.release("1g.10gb", 0, 2)
    assert books.take("4g.40gb", demand) == (0, 0) and books.reshapes == 2
    assert books.used_slices == 12 and books.gpus_used == 2


def test_cli_bench_mig_json(tmp_path: Path) -> None:
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    (csv_dir / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,786432,8,G2\nn1,96000,786432,8,G3\nn2,96000,786432,4,T4\n"
    )
    (csv_dir / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,470\np1,1000,1024,1,320\n"
        "p2,1000,1024,1,110\np3,1000,1024,1,1000\n"
    )
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "mig",
            "--traces",
            str(tmp_path),
            "--seeds",
            "1-3",
            "-p",
            "first-fit",
            "-p",
            "gpusched",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = orjson.loads(res.stdout)
    assert out["seeds"] == [1, 2, 3]
    assert {(r["workload"], r["policy"]) for r in out["results"]} == {
        (w, p) for w in ("openb", "inference") for p in ("first-fit", "gpusched")
    }
    assert len(out["runs"]) == 12 and len(out["churn_runs"]) == 12
    assert {(r["workload"], r["policy"]) for r in out["churn"]} == {
        (w, p) for w in ("openb", "inference") for p in ("first-fit", "gpusched")
    }
    table = CliRunner().invoke(
        app, ["bench", "mig", "--traces", str(tmp_path), "--seeds", "1", "-p", "best-fit"]
    )
    assert table.exit_code == 0, table.output
    assert "best-fit" in table.stdout and "no pending p99" in table.stdout and "under churn" in table.stdout
    bad = CliRunner().invoke(app, ["bench", "mig", "--traces", str(tmp_path / "nope"), "--seeds", "1"])
    assert bad.exit_code == 2 and "file not found" in bad.output
