"""Fragmentation measures against a target workload, on nodes small enough to count by hand."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from builders import NONE, node, share, whole, with_gpu_free
from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import (
    TargetWorkload,
    TypeKey,
    cluster_fragmentation,
    node_fragmentation,
    placement_frag,
)
from gpusched.core.model import PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one

# ---------------------------------------------------------------------------------- fragmentation
A1: TypeKey = (1000, 1000, 1, NONE)  # one whole GPU
B1: TypeKey = (1000, 500, 1, NONE)  # half a GPU
C2: TypeKey = (1000, 1000, 2, NONE)  # two whole GPUs
D1: TypeKey = (64_000, 100, 1, NONE)  # needs more CPU than the node has
E1: TypeKey = (1000, 100, 1, frozenset({"B"}))  # model B only


def test_target_workload_keeps_the_popular_types_and_renormalises() -> None:
    tw = TargetWorkload.from_counts(Counter({A1: 6, B1: 3, C2: 1}), coverage=0.9)
    assert tw.keys == (A1, B1)  # 6 + 3 = 9 >= 0.9 * 10
    np.testing.assert_allclose(tw.p, [2 / 3, 1 / 3])
    assert tw.cpu.tolist() == [1000, 1000] and tw.milli.tolist() == [1000, 500] and tw.num.tolist() == [1, 1]
    # equal counts: the larger type first (descending cpu, milli, num)
    tw2 = TargetWorkload.from_counts(Counter({B1: 2, A1: 2}), coverage=0.5)
    assert tw2.keys == (A1,)
    with pytest.raises(ValueError, match="at least one pod"):
        TargetWorkload.from_counts(Counter())


def test_fgd_fragment_of_a_hand_made_node() -> None:
    snap = with_gpu_free(ClusterState([node("n0", gpus=4), node("cpu-only")]), 0, [1000, 1000, 500, 200])
    tw = TargetWorkload.from_counts(Counter({A1: 4, B1: 2, C2: 1, D1: 1}), coverage=1.0)
    np.testing.assert_allclose(tw.p, [0.5, 0.25, 0.125, 0.125])
    # Free milli per GPU [1000, 1000, 500, 200], 32 cores free, total 2700:
    #   A1 (1×1000, p=.5):   two GPUs fit; slivers below 1000: 500 + 200     -> 700
    #   B1 (1×500,  p=.25):  three GPUs fit; sliver below 500: 200           -> 200
    #   C2 (2×1000, p=.125): two whole GPUs fit; slivers 500 + 200           -> 700
    #   D1 (64 cores, p=.125): does not fit (CPU): all idle milli            -> 2700
    #   F = .5·700 + .25·200 + .125·700 + .125·2700 = 350 + 50 + 87.5 + 337.5 = 825
    # The node without GPUs has no idle GPU milli: 0.
    np.testing.assert_allclose(node_fragmentation(snap, tw), [825.0, 0.0])
    assert cluster_fragmentation(snap, tw) == pytest.approx(825.0)
    # A type limited to model B cannot use this model-A node at all: .5·700 (A1) + .5·2700 (E1) = 1700
    tw_b = TargetWorkload.from_counts(Counter({A1: 1, E1: 1}), coverage=1.0)
    np.testing.assert_allclose(node_fragmentation(snap, tw_b, np.array([0])), [1700.0])


def test_placement_frag_and_fgd_choice_for_a_share_on_the_hand_made_node() -> None:
    snap = with_gpu_free(ClusterState([node("n0", gpus=4)]), 0, [1000, 1000, 500, 200])
    tw = TargetWorkload.from_counts(Counter({A1: 4, B1: 2, C2: 1, D1: 1}), coverage=1.0)
    pod = share("p", 200)
    before, after = placement_frag(snap, pod, np.array([0]), tw)
    # GPU 0 (or 1) 1000 -> 800: A1 fits on GPU 1, slivers 800+500+200 = 1500; B1 sliver 200;
    #   C2 no longer fits (2500 idle); D1 2500  -> .5·1500 + .25·200 + .125·2500 + .125·2500 = 1425
    # GPU 2 500 -> 300: A1 500, B1 500, C2 500, D1 2500 -> 250 + 125 + 62.5 + 312.5 = 750
    # GPU 3 200 -> 0:   A1 500, B1 0,   C2 500, D1 2500 -> 250 + 0 + 62.5 + 312.5 = 625
    np.testing.assert_allclose(before, [825.0])
    np.testing.assert_allclose(after, [[1425.0, 1425.0, 750.0, 625.0]])
    r = schedule_one(make_profile("fgd", PolicyContext(workload=tw)), pod, snap)
    # FGD score = int(100·sigmoid((825 − 625)/1000)) = int(54.98) = 54
    assert r.scheduled and r.gpus == (3,) and r.score == 54.0


def test_placement_frag_marks_misfits_infinite() -> None:
    snap = with_gpu_free(ClusterState([node("n0", gpus=2)]), 0, [1000, 300])
    tw = TargetWorkload.from_counts(Counter({A1: 1}), coverage=1.0)
    _, after = placement_frag(snap, share("p", 400), np.array([0]), tw)
    assert np.isfinite(after[0, 0]) and after[0, 1] == np.inf
    _, after2 = placement_frag(snap, whole("w", 2), np.array([0]), tw)
    assert after2.shape == (1, 1) and after2[0, 0] == np.inf


def test_model_table() -> None:
    snap = ClusterState([node("a", gpus=1, model="A"), node("b", gpus=1, model="B"), node("c")])
    cpu_only: TypeKey = (1000, 0, 0, NONE)
    tw = TargetWorkload.from_counts(Counter({A1: 3, E1: 2, cpu_only: 1}), coverage=1.0)
    t = tw.model_table(snap)
    # rows: models A, B, then "no GPUs"; columns: A1 (any model), E1 (B only), CPU-only (needs no GPU)
    assert t.tolist() == [[True, False, False], [True, True, False], [False, False, False]]
    assert snap.model_id.tolist() == [0, 1, -1]  # -1 reads the last row


def test_fragment_of_memory_only_type_ignores_padding_gpu_slots() -> None:
    snap = ClusterState([node("one", gpus=1), node("eight", gpus=8)])
    tw = TargetWorkload.from_pods([PodSpec("m", num_gpu=4, gpu_memory_mib=1024)])
    # the 4-GPU type does not fit on the 1-GPU node: all its idle milli (1000) is fragment
    np.testing.assert_allclose(node_fragmentation(snap, tw), [1000.0, 0.0])


def test_whole_gpu_closed_form_matches_recomputation_with_memory_only_type() -> None:
    snap = ClusterState([node("n0", gpus=2)])
    tw = TargetWorkload.from_pods([PodSpec("m", num_gpu=2, gpu_memory_mib=1024)])
    pod = whole("w", 1)
    _, after = placement_frag(snap, pod, np.array([0]), tw)
    c = snap.copy()
    c.assume(pod, 0, [0])
    np.testing.assert_allclose(after[:, 0], node_fragmentation(c, tw))  # 1000 vs 0
