"""Choosing the node (score, then tie-break rank) and the GPUs on it."""

from __future__ import annotations

import numpy as np
import pytest

from builders import node, share, whole, with_gpu_free
from gpusched.core.cluster import ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.model import PodSpec, Taint
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one, select_host

TAINTED = Taint("dedicated", "gpu", "NoSchedule")


# -------------------------------------------------------------------------------------- tie-break


@pytest.mark.parametrize(("tiebreak", "want"), [(None, 0), ([2, 0, 1], 1), ([1, 2, 0], 2), ([0, 1, 2], 0)])
def test_equal_scores_go_to_the_lowest_tiebreak_rank(tiebreak: list[int] | None, want: int) -> None:
    snap = ClusterState([node(f"n{i}", gpus=2) for i in range(3)])
    tb = None if tiebreak is None else np.array(tiebreak, dtype=np.int64)
    r = schedule_one(make_profile("bestfit"), share("p", 500), snap, tiebreak=tb)
    assert r.node == want


def test_tiebreak_ranks_only_feasible_nodes() -> None:
    # n1 has the best rank but is tainted: among n0 (rank 2) and n2 (rank 1), n2 wins
    snap = ClusterState([node("n0", gpus=2), node("n1", gpus=2, taints=(TAINTED,)), node("n2", gpus=2)])
    r = schedule_one(make_profile("bestfit"), share("p", 500), snap, tiebreak=np.array([2, 0, 1]))
    assert r.node == 2


def test_select_host() -> None:
    nodes = np.array([0, 1, 2], dtype=np.int64)
    tb = np.array([9, 3, 0], dtype=np.int64)
    assert select_host(np.array([5.0, 5.0 + 1e-12, 4.0]), nodes, tb) == 1  # 0 and 1 tie; node 2 scores lower
    assert select_host(np.array([5.0, 4.9, 4.0]), nodes, tb) == 0
    assert select_host(np.array([5.0, 5.0, 5.0]), nodes, None) == 0
    # positions index ``nodes``; ranks are looked up by node index
    assert select_host(np.array([1.0, 1.0]), np.array([2, 0], dtype=np.int64), tb) == 0


# ----------------------------------------------------------------------------------------- devices


def test_pick_gpus_best_fit_and_hint() -> None:
    snap = with_gpu_free(ClusterState([node("n", gpus=4)]), 0, [1000, 300, 600, 500])
    pod = share("p", 400)
    assert pick_gpus(snap, pod, 0) == (3,)  # tightest GPU with room: 500 (300 is too small)
    assert pick_gpus(snap, pod, 0, hint=2) == (2,)  # a fitting hint is honoured
    assert pick_gpus(snap, pod, 0, hint=0) == (0,)
    assert pick_gpus(snap, pod, 0, hint=1) == (3,)  # a hint that does not fit is ignored
    assert pick_gpus(snap, share("q", 600), 0) == (2,)
    assert pick_gpus(snap, whole("w", 1), 0) == (0,)
    assert pick_gpus(snap, PodSpec("c"), 0) == ()
    with pytest.raises(ValueError, match="does not fit"):
        pick_gpus(snap, whole("w2", 2), 0)


def test_pick_gpus_breaks_milli_ties_by_least_free_memory_then_index() -> None:
    snap = ClusterState([node("n", gpus=3)])
    snap.assume(PodSpec("m", num_gpu=1, gpu_memory_mib=8192), 0, [2])  # GPU 2: 1000 milli, 8192 MiB left
    assert pick_gpus(snap, share("p", 100, gpu_memory_mib=4096), 0) == (2,)
    assert pick_gpus(snap, share("q", 100, gpu_memory_mib=10_000), 0) == (0,)  # GPU 2 lacks memory
    # whole GPUs: never GPU 2, which a share by memory holds (a whole GPU shares with nothing)
    assert pick_gpus(snap, whole("w", 2), 0) == (0, 1)
    snap.assume(share("s", 300, gpu_memory_mib=8192), 0, [0])  # GPU 0: 700 milli, 8192 MiB left
    # shares: the least free milli first (GPU 0), then the least free memory (GPU 2 before GPU 1)
    assert pick_gpus(snap, share("t", 700), 0) == (0,)
    assert pick_gpus(snap, share("u", 800), 0) == (2,)
