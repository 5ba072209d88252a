"""``gpusched bench watch-cost`` at toy size on the real etcd + kube-apiserver: every round is
measured, with the CPU the apiserver and etcd spent per pod lifecycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.bench.watch_cost import bench_watch_cost

pytestmark = pytest.mark.e2e


def test_a_toy_run_measures_every_round(control_plane_bin: Path) -> None:
    notes: list[str] = []
    r = bench_watch_cost(
        pods=30, watchers=(0, 1), rounds=1, threads=4, bin_dir=control_plane_bin, on_progress=notes.append
    )
    assert [x.watchers for x in r.rounds] == [0, 1]
    for x in r.rounds:
        assert x.pods == 30 and x.pods_per_s > 0 and x.apiserver_ms_per_pod > 0 and x.etcd_ms_per_pod > 0
    assert len(notes) >= 3
