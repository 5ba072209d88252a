"""Geometry that follows demand (issue 31 item 3, first part, core.mig.reshape): the target layout keeps
every instance a pod holds and cuts the free slices for the pending requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.mig.books import NodeMig
from gpusched.core.mig.geometry import Geometry, Instance, MigGpu
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import plan_node, target_layout

A100 = Geometry.of("a100-80gb")
BALANCED = (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))


def gpu(layout: tuple[tuple[str, int], ...], name: str = "n/0") -> MigGpu:
    g = MigGpu(name, A100)
    for p, s in layout:
        g = g.place(p, s)
    return g


def held(present: MigGpu, keep: set[Instance]) -> MigGpu:
    return MigGpu(present.name, present.geometry, True, tuple(i for i in present.instances if i in keep))


def test_an_empty_gpu_is_cut_for_the_pending_requests() -> None:
    layout, served = target_layout(A100, (), ["3g.40gb", "4g.40gb"], DemandMix(["3g.40gb", "4g.40gb"]))
    assert set(layout) == {Instance("4g.40gb", 0), Instance("3g.40gb", 4)}
    assert sorted(served) == ["3g.40gb", "4g.40gb"]


def test_only_free_slices_are_recut_and_the_held_instance_stays() -> None:
    """all-balanced with a pod on the 3g: a pending 4g gets slices 0-3 (the 2g and two 1g destroyed)."""
    present = gpu(BALANCED)
    node = NodeMig((present,), (0,))
    plan = plan_node(node, {0: held(present, {Instance("3g.40gb", 4)})}, ["4g.40gb"], DemandMix(["4g.40gb"]))
    assert plan is not None and plan.gpu == 0 and plan.serves == ("4g.40gb",)
    assert set(plan.destroy) == {Instance("2g.20gb", 0), Instance("1g.10gb", 2), Instance("1g.10gb", 3)}
    assert plan.create == (Instance("4g.40gb", 0),)


def test_the_gpu_that_serves_most_with_least_destroyed_is_chosen_and_none_when_nothing_helps() -> None:
    a, b = gpu(BALANCED, "n/0"), gpu((("3g.40gb", 0), ("3g.40gb", 4)), "n/1")
    node = NodeMig((a, b), (0, 1))
    books = {0: held(a, set()), 1: held(b, {Instance("3g.40gb", 0)})}
    plan = plan_node(node, books, ["4g.40gb"], DemandMix(["4g.40gb"]))
    assert plan is not None and plan.gpu == 0  # GPU 1's 3g at 0 is held: no 4g fits there
    assert plan_node(node, books, ["1g.5gb"], DemandMix(["1g.5gb"])) is None  # a profile the A100 lacks
    full = {0: held(a, set(a.instances)), 1: held(b, set(b.instances))}
    assert plan_node(node, full, ["1g.10gb"], DemandMix(["1g.10gb"])) is None  # every slice held


LAYOUTS = (
    BALANCED,
    (("3g.40gb", 0), ("3g.40gb", 4)),
    (("4g.40gb", 0), ("3g.40gb", 4)),
    tuple(("1g.10gb", s) for s in range(7)),
    (("7g.80gb", 0),),
    (),
)
PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@settings(max_examples=80, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    keep_bits=st.integers(0, 255),
    pending=st.lists(st.sampled_from(PROFILES), min_size=1, max_size=4),
    seen=st.lists(st.sampled_from(PROFILES), max_size=6),
)
def test_a_plan_keeps_every_held_instance_and_leaves_a_legal_layout(
    layout: tuple[tuple[str, int], ...], keep_bits: int, pending: list[str], seen: list[str]
) -> None:
    present = gpu(layout)
    keep = {i for k, i in enumerate(present.instances) if keep_bits >> k & 1}
    books = {0: held(present, keep)}
    plan = plan_node(NodeMig((present,), (0,)), books, pending, DemandMix([*pending, *seen]))
    if plan is None:
        return
    assert not set(plan.destroy) & keep  # never a held instance
    after = (set(present.instances) - set(plan.destroy)) | set(plan.create)
    assert keep <= after
    g = MigGpu("n/0", A100)
    for i in sorted(after, key=lambda i: i.start):  # the result is a layout the GPU can hold (raises if not)
        g = g.place(i.profile, i.start)
    for p in set(plan.serves):  # the requests it serves find free instances of their profiles afterwards
        assert sum(i.profile == p for i in after - keep) >= plan.serves.count(p)
