"""The score plugins (placement policies), each on a scenario small enough to score by hand."""

from __future__ import annotations

import numpy as np
import pytest

from builders import node, profile, share, whole, with_gpu_free
from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import (
    TargetWorkload,
)
from gpusched.core.framework import CycleState
from gpusched.core.model import PodSpec
from gpusched.core.policies import POLICIES, make_profile
from gpusched.core.policies.default import DefaultParams, DefaultScore
from gpusched.core.scheduler import schedule_one

# --------------------------------------------------------------------------------------- policies


def test_bestfit_prefers_least_leftover() -> None:
    snap = ClusterState([node("big", gpus=8), node("small", gpus=2)])
    r = schedule_one(profile("bestfit", [whole("w", 1, cpu=1000)]), whole("w", 1, cpu=1000), snap)
    # leftover: big 0.5·31000/128000 + 0.5·7000/8000 = .5586 -> 44; small 0.5·.2422 + 0.5·.125 = .1836 -> 81
    assert r.node_name == "small" and r.score == 81.0


def test_bestfit_counts_gpu_leftover_for_a_cpu_pod_but_dotprod_does_not() -> None:
    # cpu-rich node without GPUs vs a node with few free cores and 8 idle GPUs; a CPU-only pod
    snap = ClusterState([node("gpus", gpus=8, cpu=16_000), node("cpus", cpu=64_000)])
    pod = PodSpec("c", cpu_milli=8000)
    # bestfit: gpus .5·8000/128000 + .5·8000/8000 = .53 -> 46; cpus .5·56000/128000 = .22 -> 78
    r = schedule_one(profile("bestfit", [pod]), pod, snap.copy())
    assert (r.node_name, r.score) == ("cpus", 78.0)
    # dotprod (only along the request): gpus (16000/128000)(8000/128000)/2 = .0039 -> 99; cpus .0156 -> 98
    r = schedule_one(profile("dotprod", [pod]), pod, snap.copy())
    assert (r.node_name, r.score) == ("gpus", 99.0)


def test_dotprod_prefers_least_free_along_the_request() -> None:
    snap = ClusterState([node("roomy", gpus=4, cpu=64_000), node("tight", gpus=2, cpu=8000)])
    pod = whole("w", 1, cpu=4000)
    # roomy: (.5·.03125 + .5·.125)/2 = .0391 -> 96; tight: (.0625·.03125 + .25·.125)/2 = .0166 -> 98
    r = schedule_one(profile("dotprod", [pod]), pod, snap)
    assert (r.node_name, r.score) == ("tight", 98.0)


def test_packing_prefers_a_partially_used_gpu() -> None:
    snap = with_gpu_free(ClusterState([node("idle", gpus=2), node("used", gpus=2)]), 1, [1000, 600])
    r = schedule_one(profile("packing", [share("s", 300)]), share("s", 300), snap)
    # used: the GPU with 600 free -> max(100 − 60/10, 50) = 94; idle node: max(33 − 2, 2) = 31
    assert (r.node_name, r.gpus, r.score) == ("used", (1,), 94.0)
    # a whole GPU: a used node (max(50 − 1, 33) = 49) before an idle one (31)
    r2 = schedule_one(profile("packing", [whole("w")]), whole("w"), snap)
    assert (r2.node_name, r2.gpus, r2.score) == ("used", (0,), 49.0)


def test_clustering_prefers_a_node_hosting_the_same_class() -> None:
    snap = ClusterState([node("shares", gpus=2), node("wholes", gpus=2), node("empty", gpus=2)])
    snap.assume(share("s0", 500), 0, [0])
    snap.assume(whole("w0"), 1, [0])
    snap.assume(PodSpec("c0", cpu_milli=1000), 2, [])  # CPU-only pods are no class
    # base = 25·(8000 − free)//8000: shares 20, wholes 21, empty 18;
    # bonus: 75 same class only, 25 no class, 0 other classes
    r = schedule_one(profile("clustering", [share("s", 200)]), share("s1", 200), snap)
    assert (r.node_name, r.score) == ("shares", 95.0)
    r2 = schedule_one(profile("clustering", [whole("w")]), whole("w1"), snap)
    assert (r2.node_name, r2.score) == ("wholes", 96.0)
    r3 = schedule_one(profile("clustering", [whole("w", 2)]), whole("w2", 2), snap)
    assert (r3.node_name, r3.score) == ("empty", 43.0)  # the only node with two free GPUs: 25 + 18


def test_fgd_keeps_whole_gpus_free_for_a_whole_gpu_workload() -> None:
    workload = [whole(f"w{i}") for i in range(5)]
    fgd = profile("fgd", workload)
    snap = with_gpu_free(ClusterState([node("idle", gpus=2), node("used", gpus=2)]), 1, [500, 1000])
    # used: F_before = 500 (GPU 0's sliver); 300 on GPU 0 -> 200: Δ = −300 -> int(100·σ(.3)) = 57;
    #   on GPU 1 -> 700: no whole GPU left, F = 1200: Δ = +700 -> 33. idle: F 0 -> 700 -> 33
    r = schedule_one(fgd, share("s", 300), snap)
    assert (r.node_name, r.gpus, r.score) == ("used", (0,), 57.0)
    # used is now [200, 1000]: a second 300 would break its whole GPU (Δ +700 -> 33), as on idle (33): a tie,
    # idle by rank, GPU 0. The third stacks onto idle's GPU 0 (700 -> 400: Δ −300 -> 57), not its GPU 1 (33)
    for name in ("t0", "t1"):
        r = schedule_one(fgd, share(name, 300), snap, tiebreak=np.array([0, 1]))
        assert (r.node_name, r.gpus) == ("idle", (0,))
    assert snap.node_gpu_free(0) == [400, 1000] and snap.node_gpu_free(1) == [200, 1000]
    assert all(schedule_one(fgd, whole(f"x{i}"), snap).scheduled for i in range(2))


def test_fgd_leaves_no_sliver_that_the_workload_cannot_use_where_bestfit_would() -> None:
    # workload: half-GPU shares only. GPUs free [1000, 600]; a 500 share:
    #   GPU 1 (best fit) 600 -> 100 leaves a 100 sliver no 500-share can use: Δ = +100 -> int(100·σ(−.1)) = 47
    #   GPU 0 1000 -> 500 still takes a 500-share: Δ = 0 -> 50
    workload = [share(f"h{i}", 500) for i in range(4)]
    snap = with_gpu_free(ClusterState([node("n", gpus=2)]), 0, [1000, 600])
    r = schedule_one(profile("fgd", workload), share("p", 500), snap.copy())
    assert (r.gpus, r.score) == ((0,), 50.0)
    assert schedule_one(profile("bestfit", workload), share("p", 500), snap.copy()).gpus == (1,)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_a_pod_only_where_it_fits(policy: str) -> None:
    snap = ClusterState([node("a", gpus=1, model="B"), node("b", gpus=4, cpu=2000), node("c", gpus=2)])
    snap.assume(whole("taken"), 2, [1])
    pods = [
        whole("w", 1, cpu=4000, gpu_models=frozenset({"A"})),
        share("s", 700, cpu=4000),
        PodSpec("c", cpu_milli=100),
    ]
    prof = profile(policy, pods)
    r = schedule_one(prof, pods[0], snap)
    assert (r.node_name, r.gpus) == ("c", (0,))  # only c has CPU and a free model-A GPU
    r = schedule_one(prof, pods[1], snap)
    assert r.node_name == "a"  # c is full now, b lacks CPU
    assert schedule_one(prof, pods[2], snap).scheduled
    assert snap.verify() == []


def test_unknown_policy_and_missing_workload() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_profile("nope")
    for policy in ("fgd", "default"):
        with pytest.raises(ValueError, match="needs a target workload"):
            make_profile(policy)


def test_default_score_cache_key_distinguishes_configurations() -> None:
    snap = with_gpu_free(ClusterState([node("a", gpus=2), node("b", gpus=2)]), 0, [700, 1000])
    pod = share("p", 200)
    tw = TargetWorkload.from_pods([pod])
    plain, sliver = DefaultScore(tw), DefaultScore(tw, DefaultParams(deficit_weight=50.0))
    idx = np.arange(2, dtype=np.int64)
    plain.score(CycleState(), pod, snap, idx)
    got = sliver.score(CycleState(), pod, snap, idx).scores
    want = sliver.score(CycleState(), pod, snap.copy(), idx).scores
    np.testing.assert_allclose(got, want)


def test_policy_key_hashes_once_and_compares_by_value() -> None:
    from gpusched.core.policies.cache import PolicyKey

    a = PolicyKey(("P", (1, 2, frozenset({"x"}))))
    b = PolicyKey(("P", (1, 2, frozenset({"x"}))))
    c = PolicyKey(("P", (1, 3, frozenset({"x"}))))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != c and a != ("P", (1, 2, frozenset({"x"})))
