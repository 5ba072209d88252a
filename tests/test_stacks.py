"""``bench stacks``: the stacks' scoring (kube-scheduler's resource scores, HAMi-like), what each
stack books (whole GPUs, time-slicing replicas), the meter (work carried, OOM risk), the run on
the churn protocol and the report, on small clusters."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from builders import gpu_node, share, whole
from gpusched.bench.stacks import stacks_comparison, write_stacks_json, write_stacks_plot
from gpusched.cli import app
from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import CycleState
from gpusched.core.policies import PolicyContext
from gpusched.core.policies.kube import (
    BalancedAllocationScore,
    NodeResourcesFitScore,
    NodesToScore,
    nodes_to_find,
)
from gpusched.core.scheduler import schedule_one
from gpusched.sim.churn import Churn, ChurnConfig, DefragConfig
from gpusched.sim.stacks.catalog import STACK_NAMES, stacks_named
from gpusched.sim.stacks.meter import StackMeter
from gpusched.sim.stacks.report import StackRow, headline, sustained_load
from gpusched.sim.stacks.run import StackChurn, run_stack
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload
from gpusched.sim.workload import load_workload

NODES, POOL = synthetic_workload(SyntheticConfig(nodes=24))
SHORT = ChurnConfig(load=0.9, horizon_s=4 * 3600, warmup_s=3600, seed=1)
CTX = PolicyContext()


def _stack(name: str):  # type: ignore[no-untyped-def]
    return stacks_named([name])[0]


def _scores(plugin: object, pod: object, snap: ClusterState) -> list[int]:
    nodes = np.arange(len(snap), dtype=np.int64)
    return [int(v) for v in plugin.score(CycleState(), pod, snap, nodes).scores]  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ kube-scheduler's scores
def test_kube_resource_scores_are_kube_schedulers_integer_formulas() -> None:
    snap = ClusterState([gpu_node("a", 1, cpu=10_000, mem=10_000)])
    snap.assume(whole("held", cpu=2000, memory_mib=5000), 0, (0,))
    pod = share("p", 300, cpu=1000, memory_mib=1000)
    # requested after the pod: CPU 3000/10000, memory 6000/10000
    assert _scores(NodeResourcesFitScore("least"), pod, snap) == [(70 + 40) // 2]
    assert _scores(NodeResourcesFitScore("most"), pod, snap) == [(30 + 60) // 2]
    # balance 100 * (1 - |f_cpu - f_mem| / 2): 85 with the pod (0.3, 0.6), 85 without (0.2, 0.5)
    assert _scores(BalancedAllocationScore(), pod, snap) == [50 + (50 + 85 - 85) // 2]
    evener = share("e", 300, cpu=3000, memory_mib=0)  # to (0.5, 0.5): balance 100
    assert _scores(BalancedAllocationScore(), evener, snap) == [50 + (50 + 100 - 85) // 2]
    # a request of 0 counts as kube-scheduler's non-zero defaults (100 milli-CPU, 200 MB)
    bare = share("q", 300)
    assert _scores(NodeResourcesFitScore("least"), bare, snap) == [
        ((8000 - 100) * 100 // 10_000 + 4810 * 100 // 10_000) // 2
    ]
    with pytest.raises(ValueError, match="not one of least, most"):
        NodeResourcesFitScore("random")


def test_stock_spreads_and_most_allocated_packs() -> None:
    nodes = [gpu_node("busy", 4, cpu=32_000), gpu_node("idle", 4, cpu=32_000)]
    for name, want in (("stock", "idle"), ("kube-most", "busy")):
        snap = ClusterState(nodes)
        snap.assume(whole("held", cpu=16_000, memory_mib=1024), 0, (0,))
        prof = _stack(name).profile(CTX)
        r = schedule_one(prof, whole("p", cpu=1000, memory_mib=1024), snap)
        assert r.node_name == want, name


# ------------------------------------------------------------------------------------ what stacks book
def test_stock_books_a_whole_gpu_for_a_share_and_timeslicing_books_replicas() -> None:
    one_gpu = [gpu_node("n", 1)]
    pods = [share(f"s{i}", 300) for i in range(5)]

    def placed(name: str) -> int:
        st = _stack(name)
        snap = ClusterState(st.placement_nodes(one_gpu))
        prof = st.profile(PolicyContext(workload=None))
        return sum(schedule_one(prof, st.placement_spec(p), snap).scheduled for p in pods)

    assert placed("stock") == 1  # nvidia.com/gpu is an integer
    assert placed("timeslice-4") == 4  # four replicas, no memory check
    assert placed("hami") == 3  # shares by memory and cores: 3 x 300 fit, the fourth does not
    assert _stack("stock").placement_spec(pods[0]).gpu_milli == 1000
    assert _stack("hami").placement_spec(pods[0]) == pods[0]
    assert [n.gpu_count for n in _stack("timeslice-8").placement_nodes([gpu_node("m", 2)])] == [16]


def test_hami_packs_nodes_and_spreads_gpus() -> None:
    snap = ClusterState([gpu_node("a", 2), gpu_node("b", 2)])
    snap.assume(share("held", 400), 1, (0,))
    r = schedule_one(_stack("hami").profile(CTX), share("p", 300), snap)
    assert r.node_name == "b"  # binpack: the node already in use
    assert r.gpus == (1,)  # spread: the idle GPU of that node


def test_unknown_stack_is_named() -> None:
    with pytest.raises(InvalidInput, match="unknown stack 'slurm'"):
        stacks_named(["slurm"])


# -------------------------------------------------------------------------------------------- meter
def test_meter_counts_requests_caps_time_sliced_gpus_and_flags_oom_risk() -> None:
    m = StackMeter(warmup_s=0, horizon_s=100, sample_every_s=50, physical_gpus={0: 2})
    m.start(1, 0, 1, 600)  # distributed: GPU 0
    m.start(2, 0, 1, 600)  # GPU 1 (fewest replicas)
    assert m.at_risk == 0
    m.start(3, 0, 1, 1000)  # GPU 0 again: 600 + 1000 > 1000
    assert m.at_risk == 2
    m.advance(10)
    assert m.work == 10 * (1000 + 600)  # GPU 0 gives at most one GPU
    assert m.risk_pod_s == 20
    m.stop(3, completed=True)
    assert m.at_risk == 0 and m.completed == 1
    assert m.share_at_risk == pytest.approx(2 / 3)
    plain = StackMeter(warmup_s=0, horizon_s=100, sample_every_s=50)
    plain.start(1, 0, 2, 1000)
    plain.start(2, 0, 1, 300)
    plain.advance(4)
    assert plain.work == 4 * 2300 and plain.at_risk == 0


# ------------------------------------------------------------------------------------------ the runs
def test_the_faster_retry_pass_places_as_the_engines() -> None:
    cfg = replace(SHORT, load=1.2, policy="default")
    base = Churn(NODES, POOL, cfg, DefragConfig())
    base.run()
    ours = StackChurn(_stack("gpusched"), NODES, POOL, cfg, base.tw)
    ours.run()
    assert ours.waited == base.waited and ours.m.pending.order() == base.m.pending.order()
    assert len(base.m.pending) > 0  # the queue was exercised


def test_every_stack_sees_the_same_arrivals_and_stock_wastes_shares() -> None:
    tw = None
    results = {n: run_stack(_stack(n), NODES, POOL, SHORT, tw) for n in ("stock", "timeslice-4", "gpusched")}
    assert len({r.pods_arrived for r in results.values()}) == 1
    assert len({r.pods_measured for r in results.values()}) == 1
    stock = results["stock"]
    assert stock.booked_pct > stock.work_pct  # shares booked as whole GPUs
    assert results["gpusched"].booked_pct == pytest.approx(results["gpusched"].work_pct)
    assert results["timeslice-4"].oom_risk_pod_h > 0 and stock.oom_risk_pod_h == 0
    assert set(results["gpusched"].pending) >= {"all GPU pods"}


def test_overload_grows_the_queue_and_light_load_does_not() -> None:
    heavy = run_stack(_stack("stock"), NODES, POOL, replace(SHORT, load=2.0))
    light = run_stack(_stack("gpusched"), NODES, POOL, replace(SHORT, load=0.3))
    assert not heavy.stable and heavy.backlog_growth > 0.02 and heavy.never_ran > 0
    assert light.stable and light.never_ran == 0


def test_comparison_report_plot_and_headline(tmp_path: Path) -> None:
    wl = load_workload(None, None, SyntheticConfig(nodes=16))
    cfg = ChurnConfig(horizon_s=3 * 3600, warmup_s=3600)
    report = stacks_comparison(
        wl, stacks_named(["stock", "gpusched"]), loads=(0.5, 1.5), seeds=(0, 1), config=cfg
    )
    assert len(report.results) == 2 * 2 * 2
    d = report.to_dict(0.5)
    assert "On the same" in str(d["headline"]) and d["sustained_load"]["gpusched"] == 0.5
    assert {r["stack"] for r in d["summary"]} == {"stock", "gpusched"}
    assert Path(write_stacks_plot(report, tmp_path)[0]).stat().st_size > 1000
    assert write_stacks_json(d, tmp_path).exists()
    rows = report.rows()
    assert sustained_load([replace(r, stable=False) for r in rows], "stock") is None
    with pytest.raises(InvalidInput, match="at least one stack"):
        stacks_comparison(wl, [], config=cfg)


def test_all_stacks_are_listed_and_gpusched_is_the_standalone_schedulers_profile() -> None:
    assert STACK_NAMES[0] == "stock" and "gpusched+defrag" in STACK_NAMES and len(STACK_NAMES) == 9
    # the profile tests/e2e/test_standalone.py::test_trace_slice_matches_the_core holds the standalone
    # scheduler to: make_profile("default"), its one score plugin DefaultScore
    tw = TargetWorkload.from_pods([tp.spec for tp in POOL])
    prof = _stack("gpusched").profile(PolicyContext(workload=tw))
    assert prof.name == "default" and [type(w.plugin).__name__ for w in prof.scores] == ["DefaultScore"]


def test_kube_scheduler_scores_only_the_feasible_nodes_it_finds_first() -> None:
    assert [nodes_to_find(n) for n in (50, 100, 200, 1213, 5000)] == [50, 100, 100, 497, 500]
    window = NodesToScore()
    snap = ClusterState([gpu_node(f"n{i:03d}", 1) for i in range(150)])
    everyone = np.arange(150, dtype=np.int64)
    first = window.prefer(CycleState(), whole("p"), snap, everyone)
    assert first is not None and np.flatnonzero(first).tolist() == list(range(100))
    second = window.prefer(CycleState(), whole("q"), snap, everyone)
    assert second is not None and np.flatnonzero(second).tolist() == list(range(50)) + list(range(100, 150))
    assert window.prefer(CycleState(), whole("r"), snap, everyone[:80]) is None  # fewer: all scored
    r = schedule_one(_stack("stock").profile(CTX), whole("s"), snap)
    assert r.node is not None and r.node < 100  # a fresh scheduler starts at the first node


def test_headline_counts_waits_under_the_retry_interval_as_a_minute() -> None:
    def row(stack: str, work: float, p99: float) -> StackRow:
        pending = {"all GPU pods": {"p50_s": 0.0, "p99_s": p99}}
        return StackRow(stack, stack, 0.9, 3, work, work, 1.0, 0, 0, 0, 0, 0, True, pending)

    rows = [row("gpusched", 84.0, 1.0), row("stock", 75.0, 600.0)]
    h = headline(rows, 975, 0.9, 0.9)
    assert h.p99_ratio == pytest.approx(10.0) and h.work_gain_pct == pytest.approx(12.0)
    assert "12 % more work" in h.sentence and "under 1 min vs 10 min" in h.sentence
    with pytest.raises(InvalidInput, match=r"no run of stack 'gpusched' at load 0\.7"):
        headline(rows, 975, 0.7, 0.9)


def test_the_command_prints_json_writes_its_files_and_names_bad_input(tmp_path: Path) -> None:
    nodes = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},64000,262144,4,T4\n" for i in range(6))
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time"]
    pods += [f"s{i},2000,4096,1,{300 + 100 * (i % 5)},,0,{600 + 60 * i}" for i in range(20)]
    pods += [f"w{i},8000,16384,{1 + i % 4},1000,,0,{1200 + 60 * i}" for i in range(8)]
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "pods.csv").write_text("\n".join(pods) + "\n")
    out = tmp_path / "out"
    args = ["bench", "stacks", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    args += ["--sample", "0", "--stacks", "stock,gpusched", "--loads", "0.8", "--seeds", "0", "--hours", "2"]
    res = CliRunner().invoke(app, [*args, "--out", str(out), "--json", "-j", "1"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert [r["stack"] for r in report["summary"]] == ["stock", "gpusched"]
    assert report["config"]["gpus"] == 24 and "headline" not in report  # no run at the headline's load 0.9
    assert (out / "stacks.json").exists() and (out / "stacks_work_vs_load.png").exists()
    bad = CliRunner().invoke(app, [*args[:-6], "--stacks", "slurm", "--out", str(out)])
    assert bad.exit_code == 2 and "unknown stack 'slurm'" in bad.output and "Traceback" not in bad.output
    bad = CliRunner().invoke(app, [*args, "--loads", "0.8,x", "--out", str(out)])
    assert bad.exit_code != 0 and "comma-separated numbers" in bad.output
