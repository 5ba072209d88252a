"""``bench extender-pick``: kube-scheduler's window, and both modes answering for the same pods."""

from __future__ import annotations

import pytest

from gpusched.bench.extender_pick import bench_extender_pick, window_size
from gpusched.core.errors import GpuschedError


def test_window_is_kube_schedulers_adaptive_share() -> None:
    assert window_size(50) == 50  # under 100 nodes: all
    assert window_size(1000) == 420  # 50 - 1000/125 = 42 %
    assert window_size(5000) == 500  # 10 %
    assert window_size(20000) == 1000  # at least 5 %
    assert window_size(150) == 100  # at least 100 nodes


def test_pick_chooses_a_best_scored_node_for_every_pod() -> None:
    r = bench_extender_pick(nodes=60, pods=12)
    assert r.window == 60 and r.pods == 12
    assert r.same_best == 1.0
    assert r.pick_cpu_ms_per_pod > 0 and r.filter_prioritize_cpu_ms_per_pod > 0


def test_bad_sizes_are_named() -> None:
    with pytest.raises(GpuschedError, match="pods at least 2"):
        bench_extender_pick(nodes=10, pods=1)
