"""The pairing plan: which shares the cutting-stock LP would put on one GPU."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.policies.pairing import PairingPlan, patterns


def test_complements_pair_and_halves_pair_with_halves() -> None:
    plan = PairingPlan.from_counts({650: 10, 350: 10, 500: 20})
    assert (350, 650) in plan.on_plan_patterns and (500, 500) in plan.on_plan_patterns
    assert (350, 500) not in plan.on_plan_patterns  # 150 idle where the plan leaves none
    assert plan.waste_milli == pytest.approx(0.0, abs=1e-6)
    fits = {s: plan.fits(s) for s in (350, 500, 650)}
    assert fits[500] is not None and fits[350] is not None and fits[650] is not None
    assert fits[500][500] and not fits[500][650] and not fits[500][350]
    assert fits[350][650] and fits[650][350] and not fits[650][500]
    assert all(f[0] for f in fits.values())  # an idle GPU is always on plan
    off = plan.off_plan(500, np.array([0, 350, 500, 650]))
    np.testing.assert_array_equal(off, [False, True, False, True])


def test_a_size_outside_the_plan_is_on_plan_everywhere() -> None:
    plan = PairingPlan.from_counts({500: 4})
    assert plan.fits(300) is None
    assert not plan.off_plan(300, np.arange(0, 701, 50)).any()
    assert not PairingPlan.empty().off_plan(500, np.array([0, 500])).any()


def test_rarest_sizes_beyond_the_limit_are_left_out() -> None:
    plan = PairingPlan.from_counts({100: 1, 200: 5, 300: 9}, max_sizes=2)
    assert [s for s, _ in plan.counts] == [200, 300]
    assert plan.fits(100) is None


def test_sizes_outside_a_share_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1000\]"):
        PairingPlan.from_counts({0: 1, 1000: 2, 400: 3})
    with pytest.raises(ValueError, match=r"\[300\] have negative counts"):
        PairingPlan.from_counts({300: -1, 400: 3})


def test_many_tiny_sizes_keep_the_lp_small() -> None:
    plan = PairingPlan.from_counts({s: 10 for s in range(5, 165, 5)})  # 32 sizes, all under 250
    assert max(len(p) for p in plan.on_plan_patterns) == 3
    assert all(any(s in p for p in plan.on_plan_patterns) for s in range(5, 165, 5))


def test_plan_learnt_from_a_workload_counts_shares_only() -> None:
    pods = [PodSpec(f"s{i}", cpu_milli=1000, num_gpu=1, gpu_milli=400 if i % 2 else 600) for i in range(6)]
    pods += [PodSpec("w", cpu_milli=1000, num_gpu=2, gpu_milli=GPU_MILLI), PodSpec("c", cpu_milli=500)]
    plan = PairingPlan.from_workload(TargetWorkload.from_pods(pods, coverage=1.0))
    assert dict(plan.counts) == {400: 3, 600: 3}
    assert (400, 600) in plan.on_plan_patterns


def test_patterns_are_every_multiset_that_fits() -> None:
    listed = patterns([300, 400, 700], 3)
    assert listed is not None
    got = set(listed)
    want = {
        tuple(sorted(c))
        for k in (1, 2, 3)
        for c in itertools.combinations_with_replacement([300, 400, 700], k)
        if sum(c) <= GPU_MILLI
    }
    assert got == want


def test_pattern_listing_stops_past_its_limit() -> None:
    assert patterns([300, 400, 700], 3, limit=3) is None
    assert patterns([300, 400, 700], 3, limit=100) == patterns([300, 400, 700], 3)


def test_a_hundred_sizes_are_all_planned_the_rare_ones_in_pairs() -> None:
    counts = {s: 10 for s in range(50, 1000, 10)}  # 95 sizes; ties: the smallest 32 are the head
    plan = PairingPlan.from_counts(counts)
    assert len(plan.counts) == 95
    head = set(range(50, 370, 10))
    assert max(len(p) for p in plan.on_plan_patterns) > 2  # the head still combines in threes or more
    assert all(len(p) <= 2 for p in plan.on_plan_patterns if not set(p) <= head)
    f = plan.fits(300)
    assert f is not None and f[700]  # complements pair exactly, head with tail


def ffd_waste(counts: dict[int, int]) -> int:
    """An integer packing (first fit decreasing): its waste bounds the LP's from above."""
    bins: list[int] = []
    for s in sorted((s for s, c in counts.items() for _ in range(c)), reverse=True):
        for i, used in enumerate(bins):
            if used + s <= GPU_MILLI:
                bins[i] += s
                break
        else:
            bins.append(s)
    return sum(GPU_MILLI - b for b in bins)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(1, 999), st.integers(1, 6), min_size=1, max_size=5))
def test_plan_is_a_feasible_optimum(counts: dict[int, int]) -> None:
    plan = PairingPlan.from_counts(counts, max_items=4)
    assert dict(plan.counts) == counts
    # the LP packs no worse than an integer packing that uses patterns of at most 4 shares
    if all(s * 4 > GPU_MILLI for s in counts):
        assert plan.waste_milli <= ffd_waste(counts) + 1e-6
    for p in plan.on_plan_patterns:
        assert sum(p) <= GPU_MILLI and len(p) <= 4
    for s in counts:
        assert any(s in p for p in plan.on_plan_patterns), f"{s} is in no pattern of the plan"
        f = plan.fits(s)
        assert f is not None and f[0]
        used = np.nonzero(f)[0]
        assert (used + s <= GPU_MILLI).all()  # on plan never means over a GPU
