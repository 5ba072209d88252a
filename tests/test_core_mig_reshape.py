"""The MIG reshape planner (gpusched.core.mig.reshape): which GPUs it re-cuts for pending MIG requests,
that it never touches an instance in use, that its plans give legal layouts, and its errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.mig.geometry import (
    Geometry,
    Instance,
    MigGpu,
    MigPlacementError,
    MigProfileNotOnModel,
    UnknownMigProfile,
)
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import (
    GpuNow,
    GpuRecut,
    GpuReshape,
    ReshapeScope,
    apply_step,
    demand_layout,
    plan_node,
    plan_node_batch,
    plan_reshape,
)

A100 = Geometry.of("a100-80gb")
A30 = Geometry.of("a30")
WHOLE, FREE = ReshapeScope.WHOLE_GPU, ReshapeScope.FREE_SLICES


def gpu(name: str, *instances: tuple[str, int], geom: Geometry = A100, mig: bool = True) -> MigGpu:
    return MigGpu(name, geom, mig, tuple(Instance(p, s) for p, s in instances))


def balanced(name: str) -> MigGpu:
    return gpu(name, ("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3))


# ------------------------------------------------------------------------------------------------ choices
def test_a_free_instance_of_the_profile_serves_without_any_change() -> None:
    plan = plan_reshape([GpuNow(balanced("n/0"))], ["1g.10gb", "1g.10gb"])
    assert plan.served_by_free == ("1g.10gb", "1g.10gb") and plan.steps == () and plan.unserved == ()


def test_an_idle_gpu_is_recut_for_what_waits_and_a_busy_one_is_not_touched() -> None:
    busy = balanced("n/0")
    idle = balanced("n/1")
    now = [GpuNow(busy, in_use=frozenset({Instance("1g.10gb", 2)})), GpuNow(idle)]
    plan = plan_reshape(now, ["7g.80gb"], scope=WHOLE)
    (step,) = plan.steps
    assert step.gpu == "n/1" and step.serves == ("7g.80gb",)
    assert set(step.destroy) == set(idle.instances) and step.create == (Instance("7g.80gb", 0),)
    assert apply_step(idle, step).instances == step.target == (Instance("7g.80gb", 0),)


def test_free_slices_scope_keeps_instances_in_use_and_recuts_the_rest() -> None:
    g = balanced("n/0")  # 2g at 0, 1g at 2 and 3, 3g at 4
    used = frozenset({Instance("3g.40gb", 4)})
    assert plan_reshape([GpuNow(g, used)], ["4g.40gb"], scope=WHOLE).unserved == ("4g.40gb",)
    plan = plan_reshape([GpuNow(g, used)], ["4g.40gb"], scope=FREE)
    (step,) = plan.steps
    assert set(step.destroy) == {Instance("2g.20gb", 0), Instance("1g.10gb", 2), Instance("1g.10gb", 3)}
    assert step.create == (Instance("4g.40gb", 0),) and Instance("3g.40gb", 4) in step.target


def test_free_space_is_used_before_anything_is_destroyed() -> None:
    ones = gpu("a/0", *[("1g.10gb", s) for s in range(7)])  # idle but cut small: a 4g needs all 7 destroyed
    half = gpu("b/0", ("3g.40gb", 4))  # slices 0-3 free, the 3g in use
    plan = plan_reshape([GpuNow(ones), GpuNow(half, frozenset(half.instances))], ["4g.40gb"])
    (step,) = plan.steps
    assert step.gpu == "b/0" and step.destroy == () and step.create == (Instance("4g.40gb", 0),)


def test_the_start_leaves_room_for_what_is_asked_most() -> None:
    plan = plan_reshape([GpuNow(gpu("n/0"))], ["3g.40gb"], DemandMix(["4g.40gb"] * 5 + ["3g.40gb"]))
    (step,) = plan.steps
    assert step.create[0] == Instance("3g.40gb", 4)  # slice 0 stays for the 4g the demand asks for


def test_a_gpu_outside_mig_mode_is_switched_on_and_a_held_one_never() -> None:
    off = gpu("n/0", mig=False)
    held = GpuNow(gpu("n/1", mig=False), held=True)
    plan = plan_reshape([GpuNow(off), held], ["3g.40gb"], scope=WHOLE)
    (step,) = plan.steps
    assert step.gpu == "n/0" and step.enable_mig and step.create[0].profile == "3g.40gb"
    assert apply_step(off, step).mig_enabled
    assert plan_reshape([held], ["3g.40gb"]).unserved == ("3g.40gb",)
    plan = plan_reshape([GpuNow(off), GpuNow(balanced("n/2"))], ["7g.80gb"], scope=WHOLE)
    assert [s.gpu for s in plan.steps] == ["n/2"]  # a GPU in MIG mode goes before a mode switch


def test_a_recut_gpu_is_filled_with_the_demand_mix() -> None:
    demand = DemandMix(["1g.10gb"] * 10 + ["4g.40gb"])
    plan = plan_reshape([GpuNow(balanced("n/0"))], ["4g.40gb"], demand, scope=WHOLE)
    (step,) = plan.steps
    assert sorted(i.profile for i in step.target) == ["1g.10gb"] * 3 + ["4g.40gb"]
    assert plan_reshape([GpuNow(balanced("n/0"))], ["4g.40gb"], demand, fill=False).steps[0].target == (
        Instance("4g.40gb", 0),
    )


def test_nothing_fits_is_unserved_not_an_error() -> None:
    full = gpu("n/0", ("7g.80gb", 0))
    plan = plan_reshape([GpuNow(full, frozenset(full.instances))], ["1g.10gb"])
    assert plan.unserved == ("1g.10gb",) and plan.steps == ()


def test_demand_layout_is_the_simulators_rule() -> None:
    assert demand_layout(A100, "4g.40gb", DemandMix(["3g.40gb"] * 5 + ["1g.10gb"])) == (
        Instance("4g.40gb", 0),
        Instance("3g.40gb", 4),
    )
    with pytest.raises(MigPlacementError, match="does not fit"):
        demand_layout(A100, "4g.40gb", DemandMix(), base=[Instance("3g.40gb", 0)])


@dataclass(frozen=True)
class Node:
    gpus: tuple[MigGpu, ...]
    indices: tuple[int, ...]
    reshaping: frozenset[int] = frozenset()


def test_the_agent_requests_one_gpu_per_node_the_one_that_serves_most() -> None:
    a, b = balanced("n/0"), gpu("n/1", ("3g.40gb", 0), ("3g.40gb", 4))
    held_a = MigGpu("n/0", A100, True, (Instance("3g.40gb", 4),))
    held_b = MigGpu("n/1", A100, True, (Instance("3g.40gb", 0),))
    plan = plan_node(Node((a, b), (0, 1)), {0: held_a, 1: held_b}, ["4g.40gb"], DemandMix(["4g.40gb"]))
    destroy = (Instance("2g.20gb", 0), Instance("1g.10gb", 2), Instance("1g.10gb", 3))
    assert plan == GpuRecut(0, destroy, (Instance("4g.40gb", 0),), ("4g.40gb",))  # GPU 1's 3g at 0 is held
    same = plan_reshape([GpuNow(a, frozenset(held_a.instances))], ["4g.40gb"]).steps[0]
    assert (set(same.destroy), same.create) == (set(plan.destroy), plan.create)  # as the node planner does
    assert plan_node(Node((a,), (0,)), {0: a}, ["1g.10gb"], DemandMix(["1g.10gb"])) is None  # all held
    free_b = MigGpu("n/1", A100, True, ())
    plan = plan_node(Node((a, b), (0, 1)), {0: held_a, 1: free_b}, ["4g.40gb"], DemandMix(["4g.40gb"]))
    assert plan is not None and plan.gpu == 1 and plan.destroy == (Instance("3g.40gb", 0),)  # 3g at 4 stays


ALL_1G = tuple(("1g.10gb", s) for s in range(7))


def test_a_batch_of_three_pods_of_two_profiles_gets_one_recut_where_one_at_a_time_needs_three() -> None:
    """A GPU cut in seven 1g, idle; a 3g pod and two 2g pods wait. The batch: one re-cut (3g + 2g + 2g) serves
    all three. One pod at a time: each re-cut serves its pod and keeps the 1g that still fit, so the next pod
    needs another re-cut: three."""
    node = Node((gpu("n/0", *ALL_1G),), (0,))
    idle = {0: MigGpu("n/0", A100, True, ())}
    pods = [["3g.40gb"], ["2g.20gb"], ["2g.20gb"]]
    demand = DemandMix(["3g.40gb", "2g.20gb", "2g.20gb"])
    found = plan_node_batch(node, idle, pods, demand)
    assert found is not None
    plan, served = found
    assert served == (0, 1, 2) and sorted(plan.serves) == ["2g.20gb", "2g.20gb", "3g.40gb"]
    after = apply_step(node.gpus[0], _step(node.gpus[0], plan))
    assert sorted(i.profile for i in after.instances) == ["2g.20gb", "2g.20gb", "3g.40gb"]

    recuts, g, held = 0, node.gpus[0], MigGpu("n/0", A100, True, ())
    for (p,) in pods:  # one at a time, as the scheduler asked before: each pod lands before the next asks
        assert not [i for i in g.instances if i.profile == p and i not in held.instances]  # no free one
        one = plan_node(Node((g,), (0,)), {0: held}, [p], demand)
        assert one is not None and one.serves == (p,)
        g, recuts = apply_step(g, _step(g, one)), recuts + 1
        new = next(i for i in one.create if i.profile == p)
        held = held.place(new.profile, new.start)
    assert recuts == 3


def test_a_batch_keeps_its_order_a_pod_that_does_not_fit_with_those_before_it_waits() -> None:
    """First come the 7g (the whole GPU), then a 3g and a 1g: the 7g is served, the others are left for a
    later re-cut, never served in its place; an empty request or one the node cannot host serves nothing.
    A pod that waits does not end the batch: a later one joins, until ``misses`` pods in a row did not."""
    node = Node((gpu("n/0", *ALL_1G),), (0,))
    idle = {0: MigGpu("n/0", A100, True, ())}
    found = plan_node_batch(node, idle, [["7g.80gb"], ["3g.40gb"], ["1g.10gb"]], DemandMix(["7g.80gb"]))
    assert found is not None and found[1] == (0,) and found[0].create == (Instance("7g.80gb", 0),)
    found = plan_node_batch(node, idle, [["4g.40gb", "4g.40gb"], ["3g.40gb"]], DemandMix(["3g.40gb"]))
    assert found is not None and found[1] == (1,)  # two 4g never fit one GPU: that pod waits, the 3g goes
    assert plan_node_batch(node, idle, [[], ["4g.40gb", "4g.40gb"]], DemandMix()) is None
    # a pod that waits does not end the batch: a later one that fits with those before joins, until
    # ``misses`` in a row did not
    reqs = [["4g.40gb"], ["7g.80gb"], ["7g.80gb"], ["3g.40gb"]]
    demand = DemandMix([p for r in reqs for p in r])
    found = plan_node_batch(node, idle, reqs, demand, misses=3)
    assert found is not None and found[1] == (0, 3)
    assert found[0].create == (Instance("3g.40gb", 4), Instance("4g.40gb", 0))
    found = plan_node_batch(node, idle, reqs, demand, misses=2)
    assert found is not None and found[1] == (0,) and found[0].create == (Instance("4g.40gb", 0),)
    reqs = [["4g.40gb"], ["7g.80gb"], ["1g.10gb"], ["7g.80gb"], ["1g.10gb"]]  # one that joins: count anew
    found = plan_node_batch(node, idle, reqs, DemandMix([p for r in reqs for p in r]), misses=2)
    assert found is not None and found[1] == (0, 2, 4)


def test_whole_gpu_scope_recuts_only_a_gpu_no_pod_holds_anything_of() -> None:
    """mig-manager re-creates every instance of a GPU it changes: with a 1g held on GPU 0, only GPU 1 (idle)
    is re-cut in the WHOLE_GPU scope, where FREE_SLICES takes GPU 0 (the lower index, as cheap)."""
    node = Node((gpu("n/0", *ALL_1G), gpu("n/1", *ALL_1G)), (0, 1))
    books = {0: MigGpu("n/0", A100, True, (Instance("1g.10gb", 6),)), 1: MigGpu("n/1", A100, True, ())}
    demand = DemandMix(["4g.40gb"])
    free = plan_node(node, books, ["4g.40gb"], demand, FREE)
    whole = plan_node(node, books, ["4g.40gb"], demand, WHOLE)
    assert free is not None and free.gpu == 0
    assert whole is not None and whole.gpu == 1
    books[1] = books[1].place("1g.10gb", 6)
    assert plan_node(node, books, ["4g.40gb"], demand, WHOLE) is None


def _step(g: MigGpu, plan: GpuRecut) -> GpuReshape:
    return GpuReshape(g.name, False, plan.destroy, plan.create, plan.serves, g.instances, ())


# ------------------------------------------------------------------------------------------------ bad input
def test_unknown_profile_and_profile_no_gpu_has_are_named() -> None:
    with pytest.raises(UnknownMigProfile, match=r"'3g\.41gb'.*profiles of a100-80gb"):
        plan_reshape([GpuNow(gpu("n/0"))], ["3g.41gb"])
    with pytest.raises(MigProfileNotOnModel, match=r"'1g\.5gb' does not exist on a100-80gb"):
        plan_reshape([GpuNow(gpu("n/0"))], ["1g.5gb"])
    with pytest.raises(MigProfileNotOnModel, match="a30"):
        plan_reshape([GpuNow(gpu("n/0", geom=A30))], ["1g.20gb"])


def test_in_use_instances_the_gpu_lacks_and_duplicate_names_are_refused() -> None:
    with pytest.raises(MigPlacementError, match=r"n/0: instances in use that it does not hold: 3g\.40gb"):
        GpuNow(gpu("n/0"), frozenset({Instance("3g.40gb", 4)}))
    with pytest.raises(MigPlacementError, match="share a device name"):
        plan_reshape([GpuNow(gpu("n/0")), GpuNow(gpu("n/0"))], ["1g.10gb"])
    step = plan_reshape([GpuNow(gpu("n/0"))], ["1g.10gb"]).steps[0]
    with pytest.raises(MigPlacementError, match="applied to n/1"):
        apply_step(gpu("n/1"), step)


# ---------------------------------------------------------------------------------------------- properties
@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[GpuNow], list[str], ReshapeScope]:
    geom = draw(st.sampled_from([A100, A100, A30]))
    names = sorted(geom.kinds)
    out = []
    for i in range(draw(st.integers(1, 4))):
        mig = draw(st.booleans()) or i > 0
        g = MigGpu(f"n/{i}", geom, mig)
        if mig:
            for p, s in draw(st.lists(st.tuples(st.sampled_from(names), st.integers(0, 7)), max_size=8)):
                if s in g.free_starts(p):
                    g = g.place(p, s)
        used = frozenset(i for i in g.instances if draw(st.booleans()))
        out.append(GpuNow(g, used, held=draw(st.integers(0, 9)) == 0))
    pending = draw(st.lists(st.sampled_from(names), min_size=1, max_size=5))
    return out, pending, draw(st.sampled_from(list(ReshapeScope)))


def _could_host(now: GpuNow, profile: str, scope: ReshapeScope) -> bool:
    """Whether some layout of this GPU that keeps what the scope must keep has room for ``profile``."""
    if now.held or profile not in now.gpu.geometry.kinds:
        return False
    if any(i.profile == profile and i not in now.in_use for i in now.gpu.instances):
        return True
    if scope is WHOLE and now.in_use:
        return False
    keep = MigGpu(now.gpu.name, now.gpu.geometry, True, tuple(now.in_use))
    return bool(keep.free_starts(profile))


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_a_plan_never_destroys_in_use_gives_legal_layouts_and_hosts_what_it_serves(
    case: tuple[list[GpuNow], list[str], ReshapeScope],
) -> None:
    now, pending, scope = case
    plan = plan_reshape(now, pending, scope=scope)
    by_name = {g.gpu.name: g for g in now}
    recut = tuple(p for s in plan.steps for p in s.serves)
    assert sorted(plan.served_by_free + plan.unserved + recut) == sorted(pending)  # each request once
    for step in plan.steps:
        g = by_name[step.gpu]
        assert not g.held
        assert not set(step.destroy) & g.in_use  # never an instance in use
        if scope is WHOLE:
            assert not g.in_use
        after = apply_step(g.gpu, step)  # legal: every remove and place checked
        assert sorted(after.instances, key=lambda i: i.start) == sorted(step.target, key=lambda i: i.start)
        assert after.code < 1 << 13 and after.used_slices <= after.geometry.mem_slices
        for p in set(step.serves):  # the new layout hosts what it was cut for, on free instances
            free = [i for i in step.target if i.profile == p and i not in g.in_use]
            assert len(free) >= step.serves.count(p)
    if len(pending) == 1 and any(_could_host(g, pending[0], scope) for g in now):
        assert plan.unserved == ()  # when any layout can host it, the plan does
