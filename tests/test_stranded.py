from __future__ import annotations

import pytest

from builders import node, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.sim.experiment import RunSummary
from gpusched.sim.report import HolderShare, free_at_end
from gpusched.sim.stranded import IDLE, free_by_holder, holder


def test_free_milli_grouped_by_what_holds_the_gpu() -> None:
    nodes = [
        node("a", 2, 8000, "T4", 16384, mem=8192),
        node("b", 3, 8000, "T4", 16384, mem=8192),
        node("cpu", 0, 8000, mem=8192),
    ]
    s = ClusterState(nodes)
    s.assume(share("x", 470), 0, [0])
    s.assume(share("y", 470), 0, [0])
    s.assume(share("z", 810), 0, [1])
    s.assume(share("w", 810), 1, [2])
    s.assume(whole("whole"), 1, [0])
    s.assume(share("m", 0, gpu_memory_mib=4096), 1, [1])  # a share by GPU memory only holds no milli
    assert free_by_holder(s) == {"470+470": 60, "810": 380, "4096MiB": 1000}
    s.forget("default/m")
    assert free_by_holder(s) == {"470+470": 60, "810": 380, IDLE: 1000}
    assert holder([share("p", 320), share("q", 650), share("r", 30)]) == "650+320+30"
    assert holder([]) == IDLE


def summary(policy: str, seed: int, free: dict[str, int], total: int = 10_000) -> RunSummary:
    return RunSummary(policy, seed, [], [], 0, 0, 0.0, free_by_holder=free, total_gpu_milli=total)


def test_free_at_end_is_a_mean_over_runs_with_the_rest_as_other() -> None:
    runs = [
        summary("d", 1, {"810": 300, "470+470": 60, "idle": 1000}),
        summary("d", 2, {"810": 100, "650+320": 30}),
    ]
    out = free_at_end(runs, top=2)
    # per run % of 10 000 milli: 810 → 3.0 and 1.0; idle → 10.0 and 0; 470+470 → 0.6; 650+320 → 0.3
    assert [h.to_dict() for h in out] == [
        {"holder": "idle", "pct": 5.0},
        {"holder": "810", "pct": 2.0},
        {"holder": "other", "pct": pytest.approx(0.45)},
    ]
    assert free_at_end(runs[1:], top=5) == [HolderShare("810", 1.0), HolderShare("650+320", 0.3)]
    assert free_at_end([]) == []
