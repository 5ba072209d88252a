"""MIG in the core: geometry, the fragmentation measure, placement policies (gpusched.core.mig)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.agent import migprofiles
from gpusched.core.errors import GpuschedError
from gpusched.core.mig.geometry import (
    Geometry,
    MigGpu,
    MigPlacementError,
    MigProfileNotOnModel,
    UnknownMigProfile,
    code_fits,
)
from gpusched.core.mig.measure import DemandMix, fit_count, fragmentation, lost_slices
from gpusched.core.mig.placement import MigFleet, MigPolicy
from gpusched.core.mig.profiles import MigError, profiles

A100 = Geometry.of("a100-80gb")
A30 = Geometry.of("a30")


def fleet(n: int, model: str = "a100-80gb", per_node: int = 8) -> MigFleet:
    gpus = [MigGpu(f"node-{i // per_node:03d}/{i % per_node}", Geometry.of(model)) for i in range(n)]
    return MigFleet(gpus, [g.name.split("/")[0] for g in gpus])


def spans(g: MigGpu) -> list[set[int]]:
    return [set(range(i.start, i.start + g.geometry.kind(i.profile).mem_slices)) for i in g.instances]


# ----------------------------------------------------------------------------------------------- the table
def test_agent_reads_the_core_table() -> None:
    assert migprofiles.profiles is profiles
    assert migprofiles.MigError is MigError and issubclass(MigError, GpuschedError)
    assert list(A100.kinds) == list(profiles("NVIDIA A100-SXM4-80GB", 81920))
    assert (A100.mem_slices, A100.sm_slices, A30.mem_slices, A30.sm_slices) == (8, 7, 4, 4)


# ------------------------------------------------------------------------------------------- bad input
def test_unknown_profile_and_profile_the_model_lacks_are_named() -> None:
    gpu = MigGpu("n/0", A100)
    with pytest.raises(UnknownMigProfile, match=r"unknown MIG profile '3g\.41gb'"):
        gpu.place("3g.41gb", 0)
    with pytest.raises(MigProfileNotOnModel, match=r"'1g\.5gb' does not exist on a100-80gb"):
        gpu.place("1g.5gb", 0)
    with pytest.raises(MigProfileNotOnModel, match=r"1g\.20gb"):
        fleet(2, "a30").choose("1g.20gb", MigPolicy.GPUSCHED)
    with pytest.raises(UnknownMigProfile):
        fleet(2).choose("9g.99gb", MigPolicy.FIRST_FIT)
    assert issubclass(UnknownMigProfile, GpuschedError) and issubclass(MigProfileNotOnModel, GpuschedError)


def test_illegal_placements_are_refused_with_the_reason() -> None:
    gpu = MigGpu("n/0", A100).place("4g.40gb", 0)
    with pytest.raises(MigPlacementError, match=r"cannot start at slice 2 .*allowed starts: \[0, 4\]"):
        gpu.place("3g.40gb", 2)
    with pytest.raises(MigPlacementError, match="does not fit"):
        gpu.place("2g.20gb", 2)  # overlaps the 4g
    assert not code_fits(A100, 0, A100.kind("3g.40gb"), 2)  # free, but not a 3g start
    full = gpu.place("3g.40gb", 4)  # 4g + 3g: all 7 SM slices (mig.md §3)
    three_2g = MigGpu("n/1", A100).place("2g.20gb", 4).place("2g.20gb", 2).place("2g.20gb", 0)
    assert three_2g.free_starts("1g.10gb") == (6,) and three_2g.free_starts("2g.20gb") == ()
    assert full.free_starts("1g.10gb") == ()
    one_me = MigGpu("n/2", A100).place("1g.10gb+me", 0)
    with pytest.raises(MigPlacementError):
        one_me.place("1g.10gb+me", 1)
    with pytest.raises(MigPlacementError, match="not in MIG mode"):
        MigGpu("n/3", A100, mig_enabled=False).place("1g.10gb", 0)
    with pytest.raises(MigPlacementError, match="holds no MIG"):
        gpu.remove("3g.40gb", 4)


def test_a_fleet_refuses_duplicate_names_and_skips_gpus_outside_mig_mode() -> None:
    g = MigGpu("n/0", A100)
    with pytest.raises(MigPlacementError, match="share a device name"):
        MigFleet([g, g], ["n", "n"])
    f = MigFleet([MigGpu("n/0", A100, mig_enabled=False), MigGpu("n/1", A100)], ["n", "n"])
    pl = f.choose("7g.80gb", MigPolicy.FIRST_FIT)
    assert pl is not None and pl.gpu == 1


# ------------------------------------------------------------------------------------------- the measure
def test_lost_slices_of_an_empty_and_a_half_full_gpu() -> None:
    empty = MigGpu("n/0", A100).code
    k = A100.kinds
    assert lost_slices(A100, empty, k["1g.10gb"]) == 1  # 7 x 1g leave slice 7
    assert lost_slices(A100, empty, k["3g.40gb"]) == 0
    assert lost_slices(A100, empty, k["4g.40gb"]) == 4  # one 4g, at 0 only
    assert lost_slices(A100, empty, k["7g.80gb"]) == 0
    # a 3g at 0 leaves 4-7 free, but a 4g can only start at 0: all 4 lost for 4g, none for 3g
    low = MigGpu("n/0", A100).place("3g.40gb", 0).code
    assert lost_slices(A100, low, k["4g.40gb"]) == 4
    assert lost_slices(A100, low, k["3g.40gb"]) == 0
    assert fit_count(A100, low, k["2g.20gb"]) == 1  # at 4; 2g cannot start at 6
    assert lost_slices(A100, low, k["2g.20gb"]) == 2
    demand = DemandMix(["4g.40gb", "3g.40gb", "4g.40gb"])
    high = MigGpu("n/0", A100).place("3g.40gb", 4).code
    assert fragmentation(A100, low, demand) == 2 * 4 + 0
    assert fragmentation(A100, high, demand) == 0  # 4g still fits at 0


def test_demand_weights_ignore_names_the_model_lacks() -> None:
    d = DemandMix(["1g.5gb", "1g.10gb", "1g.10gb"])
    w = d.weights(A100)
    assert w.sum() == 2 and w[A100.profile_index("1g.10gb")] == 2
    with pytest.raises(ValueError):
        d.add("1g.10gb", -1)


def test_gpusched_keeps_the_start_a_larger_profile_needs() -> None:
    """A 3g goes to slice 4 so that a 4g (start 0 only) still fits; first-fit takes slice 0."""
    for policy, start in ((MigPolicy.FIRST_FIT, 0), (MigPolicy.GPUSCHED, 4)):
        f = fleet(1)
        d = DemandMix(["4g.40gb", "3g.40gb"])
        pl = f.choose("3g.40gb", policy, d)
        assert pl is not None and pl.start == start
        f.place(pl.gpu, "3g.40gb", pl.start)
        assert (f.choose("4g.40gb", policy, d) is not None) == (policy is MigPolicy.GPUSCHED)


def test_packing_prefers_the_most_used_node_and_best_fit_the_fullest_gpu() -> None:
    f = fleet(16)
    for gpu in (0, 1):  # node-000: two GPUs with three 1g each (6 slices)
        for start in (0, 1, 2):
            f.place(gpu, "1g.10gb", start)
    f.place(9, "4g.40gb", 0)  # node-001: 4 + 1 slices
    f.place(10, "1g.10gb", 0)
    pk = f.choose("2g.20gb", MigPolicy.PACKING)
    bf = f.choose("2g.20gb", MigPolicy.BEST_FIT)
    ff = f.choose("2g.20gb", MigPolicy.FIRST_FIT)
    assert pk is not None and (pk.gpu, pk.start) == (0, 4)  # most-used node, its most-used GPU
    assert bf is not None and (bf.gpu, bf.start) == (9, 4)  # 4 + 2 used: 2 free afterwards (GPU 0: 3)
    assert ff is not None and (ff.gpu, ff.start) == (0, 4)
    f.place(8, "1g.10gb", 6)  # node-001 now 6 slices too: on a node tie the most-used GPU wins
    pk = f.choose("2g.20gb", MigPolicy.PACKING)
    assert pk is not None and pk.gpu == 9


def test_full_fleet_returns_none() -> None:
    f = fleet(1)
    f.place(0, "7g.80gb", 0)
    for p in MigPolicy:
        assert f.choose("1g.10gb", p, DemandMix(["1g.10gb"])) is None


# ---------------------------------------------------------------------------------------------- properties
PROFILES = sorted(A100.kinds)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(PROFILES), st.sampled_from(list(MigPolicy)), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_placements_are_legal_never_overlap_and_slices_balance(
    ops: list[tuple[str, MigPolicy, bool]],
) -> None:
    """Whatever the policy and the mix of placements and removals: every placement is one of the profile's
    legal starts, no two instances on a GPU overlap nor exceed the SM slices, and the slices booked minus the
    slices freed are the slices in use."""
    f = fleet(6, per_node=3)
    demand = DemandMix()
    booked = freed = 0
    for profile, policy, remove in ops:
        if remove and any(g.instances for g in f.gpus):
            gi = next(i for i, g in enumerate(f.gpus) if g.instances)
            inst = f.gpus[gi].instances[0]
            f.remove(gi, inst.profile, inst.start)
            freed += A100.kind(inst.profile).mem_slices
            continue
        demand.add(profile)
        pl = f.choose(profile, policy, demand)
        if pl is None:
            assert all(not g.free_starts(profile) for g in f.gpus)  # None only when nothing fits
            continue
        assert pl.start in A100.kind(profile).starts
        assert pl.start in f.gpus[pl.gpu].free_starts(profile)
        f.place(pl.gpu, profile, pl.start)
        booked += A100.kind(profile).mem_slices
    for g in f.gpus:
        s = spans(g)
        assert sum(len(x) for x in s) == len(set().union(*s)) if s else True
        assert sum(A100.kind(i.profile).sm_slices for i in g.instances) <= A100.sm_slices
        assert all(i.start in A100.kind(i.profile).starts for i in g.instances)
        assert g.code == f.codes[f.gpus.index(g)]
    assert f.used_slices == booked - freed == sum(g.used_slices for g in f.gpus)


@settings(max_examples=40, deadline=None)
@given(picks=st.lists(st.sampled_from(PROFILES), min_size=1, max_size=30))
def test_migprofiles_validate_accepts_every_layout_the_core_builds(picks: list[str]) -> None:
    """The agent's check and the core's model agree: what the core places, the agent calls legal."""
    gpu = MigGpu("n/0", A100)
    for p in picks:
        starts = gpu.free_starts(p)
        if starts:
            gpu = gpu.place(p, starts[-1])
    insts = [
        migprofiles.instance("NVIDIA A100-SXM4-80GB", 81920, i.profile, i.start, f"MIG-{n}")
        for n, i in enumerate(gpu.instances)
    ]
    migprofiles.validate("NVIDIA A100-SXM4-80GB", 81920, insts)
