"""``gpusched bench dra`` at toy size on the session's control plane: every part runs through
kube-scheduler then gpusched on the same nodes and streams, no device is given twice, the quality
streams saturate the cluster, the throughput stream is placed in full by both, and gpusched never
leaves a gang partly placed (nor does kube-scheduler with its own gang scheduling on)."""

from __future__ import annotations

import pytest

from gpusched.bench.dra import (
    GANG_SCHEDULERS,
    GANGS,
    SCHEDULERS,
    THROUGHPUT,
    DraBenchConfig,
    run_dra_bench,
)
from gpusched.bench.dra_shape import MIXES
from gpusched.testenv import ControlPlane

pytestmark = pytest.mark.e2e


def test_bench_dra_runs_both_schedulers_on_the_same_streams(control_plane: ControlPlane) -> None:
    parts = ("mixed", THROUGHPUT, GANGS)  # each kind of run: fed pod by pod, a backlog, gangs; ~35 s
    cfg = DraBenchConfig(
        nodes=1,
        gpus_per_node=2,
        parts=parts,
        throughput_per_gpu=2,
        throughput_rounds=1,
        gang_size=2,
        quiet_s=4.0,
    )
    ticks: list[str] = []
    report = run_dra_bench(control_plane, cfg, on_progress=ticks.append)

    assert len(ticks) == cfg.steps()  # the progress bar ends full
    kube, wl, gs = GANG_SCHEDULERS
    assert [(r.part, r.scheduler) for r in report.runs] == [
        *[("mixed", s) for s in SCHEDULERS],
        *[(THROUGHPUT, s) for s in SCHEDULERS],
        *[(GANGS, s) for s in (kube, wl, gs)],
    ]
    streams = cfg.streams()
    for r in report.runs:
        where = f"{r.part} · {r.scheduler}"
        assert r.pods == len(streams[r.part][0]), where
        assert r.rebound == 0 and r.overlapping == 0, where  # no pod bound twice, no memory slice twice
        assert r.placed + r.refused + r.undecided == r.pods, where
        assert r.gpu_sevenths_placed <= 7 * cfg.gpus, where
        if r.part in MIXES:  # longer than the cluster holds: saturated, and fed in order
            first, sevenths = r.placed_at_first_refusal, r.gpu_sevenths_at_first_refusal
            assert first is not None and 0 < first <= r.placed < r.pods, where
            assert sevenths is not None and sevenths <= r.gpu_sevenths_placed, where
            assert r.refused == r.pods - r.placed, where
        else:  # a backlog is not taken in the stream's order: no first refusal to speak of
            assert r.placed_at_first_refusal is None and r.gpu_sevenths_at_first_refusal is None, where
        if r.part == THROUGHPUT:
            assert r.placed == r.pods and r.pods_per_s > 0, where
    gangs = {r.scheduler: r for r in report.runs if r.part == GANGS}
    assert all(r.gangs_complete is not None for r in gangs.values())
    assert gangs[kube].placed == cfg.gpus  # pod by pod until the GPUs run out
    assert gangs[wl].gangs_partial == 0 and gangs[wl].gangs_complete  # its own gangs: all or nothing
    assert gangs[gs].gangs_partial == 0  # all or nothing (before joint claim allocation: nothing)
    out = report.as_dict()
    assert out["throughput_ratio_gpusched_to_kube_scheduler"] == report.ratio() and report.ratio()
    assert out["command"] == (
        "gpusched bench dra --nodes 1 --seed 0 --gpus-per-node 2 --only mixed,throughput,gangs "
        "--throughput-per-gpu 2 --throughput-rounds 1 --gang-size 2 --gang-load 1.5"
    )
    assert sum(len(t.rows) for t in report.tables()) == len(report.runs)
