"""Defragmentation moves MIG slices (issue 31 item 5): a MIG pod moves to a free instance of its profile on
another GPU or node when that frees a whole GPU or makes room for a pending pod (on a freed instance, or after
the scheduler re-cuts the freed slices); each target slice is booked on the copy as it is chosen, so a plan
never books a slice twice and only moves pods to instances that are free at that step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import profile
from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import Method, Rules, apply_plan
from gpusched.core.defrag.mig import free_a_gpu, replay, room_for
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.geometry import Instance, MigGpu
from gpusched.core.model import Controller, PodSpec
from gpusched.core.statement import Statement
from migbuilders import A100, BALANCED, HALVES, held, mig_node, mig_pod

RS = Controller("ReplicaSet", "web", "apps")


def moved(snap: ClusterState, name: str, node: int, slot: tuple[int, int, str], **kw: Any) -> None:
    held(snap, name, node, slot, controller=RS, **kw)


def gpu_holds(snap: ClusterState, node: str, gpu: int) -> tuple[Instance, ...]:
    return snap.mig_books[snap.index[node]][gpu].instances


# ------------------------------------------------------------------------------------------------ free a GPU
def test_a_lone_slice_moves_off_to_free_its_gpu() -> None:
    snap = ClusterState([mig_node("a", BALANCED, BALANCED)])
    moved(snap, "x", 0, (0, 2, "1g.10gb"))
    moved(snap, "y", 0, (1, 4, "3g.40gb"))
    moved(snap, "z", 0, (1, 0, "2g.20gb"))
    plan = free_a_gpu(profile(), snap, Rules())
    assert plan.feasible and plan.reason == "frees GPU 0 of node a"
    (mv,) = plan.moves
    assert (mv.pod, mv.from_mig, mv.to_node) == ("default/x", (MigSlot(0, 2, "1g.10gb"),), "a")
    assert mv.to_mig[0].gpu == 1 and mv.to_mig[0].profile == "1g.10gb"
    after = replay(profile(), snap, plan.moves)
    assert gpu_holds(after, "a", 0) == () and after.verify() == []
    assert snap.allocations["default/x"].mig == (MigSlot(0, 2, "1g.10gb"),)  # the books as they were


def test_a_pod_no_controller_recreates_stays_and_nothing_is_freed() -> None:
    snap = ClusterState([mig_node("a", BALANCED, BALANCED)])
    held(snap, "bare", 0, (0, 2, "1g.10gb"))
    held(snap, "bare2", 0, (1, 2, "1g.10gb"))
    plan = free_a_gpu(profile(), snap, Rules())
    assert not plan.feasible and plan.moves == ()


def test_the_plans_moves_are_booked_exactly_by_apply_plan() -> None:
    snap = ClusterState([mig_node("a", BALANCED, BALANCED)])
    moved(snap, "x", 0, (0, 2, "1g.10gb"))
    plan = free_a_gpu(profile(), snap, Rules())
    st = Statement(snap)
    assert apply_plan(st, profile(), plan) is None
    assert snap.allocations["default/x"].mig == plan.moves[0].to_mig
    st.discard()
    assert snap.allocations["default/x"].mig == (MigSlot(0, 2, "1g.10gb"),) and snap.verify() == []
    assert plan.to_dict()["moves"][0]["to_mig"] == [
        {"gpu": s.gpu, "start": s.start, "profile": s.profile} for s in plan.moves[0].to_mig
    ]


# ---------------------------------------------------------------------------------------------- room for
def test_a_held_instance_is_freed_for_a_pod_that_may_only_use_that_node() -> None:
    snap = ClusterState([mig_node("x", HALVES, labels={"pool": "x"}), mig_node("y", BALANCED)])
    moved(snap, "holder", 0, (0, 4, "3g.40gb"))
    held(snap, "big", 0, (0, 0, "4g.40gb"))  # bare: stays
    pod = mig_pod("w", "3g.40gb", node_selector={"pool": "x"})
    room = room_for(profile(), snap, pod, Rules())
    assert room.plan.feasible and room.recut is None and room.node == "x"
    (mv,) = room.plan.moves
    assert mv.to_node == "y" and mv.to_mig == (MigSlot(0, 4, "3g.40gb"),)
    (pl,) = room.plan.placements
    assert (pl.node, pl.mig) == ("x", (MigSlot(0, 4, "3g.40gb"),))


def test_a_slice_moves_so_that_the_freed_gpu_can_be_re_cut_for_a_larger_profile() -> None:
    snap = ClusterState([mig_node("a", BALANCED, HALVES), mig_node("b", BALANCED)])
    moved(snap, "small", 0, (0, 2, "1g.10gb"))  # blocks a 4g at 0 on GPU 0
    held(snap, "h4", 0, (1, 0, "4g.40gb"))
    held(snap, "h3", 0, (1, 4, "3g.40gb"))  # GPU 1 full, bare pods
    held(snap, "b2", 1, (0, 0, "2g.20gb"))
    held(snap, "b3", 1, (0, 4, "3g.40gb"))  # node b: only its two 1g slices free, no room for a 4g
    pod = mig_pod("w", "4g.40gb", node_selector={})
    room = room_for(profile(), snap, pod, Rules())
    assert room.plan.feasible and room.node == "a" and room.recut is not None
    assert room.recut.gpu == 0 and room.recut.create[0] == Instance("4g.40gb", 0)
    (mv,) = room.plan.moves
    assert mv.pod == "default/small" and (mv.to_node, mv.to_mig[0].gpu) != ("a", 0)
    assert "after re-cutting it" in room.plan.reason


def test_a_holder_of_higher_priority_is_not_moved_for_a_lower_pod() -> None:
    snap = ClusterState([mig_node("x", HALVES, labels={"pool": "x"}), mig_node("y", BALANCED)])
    moved(snap, "holder", 0, (0, 4, "3g.40gb"), priority=100)
    held(snap, "big", 0, (0, 0, "4g.40gb"))
    room = room_for(profile(), snap, mig_pod("w", "3g.40gb", node_selector={"pool": "x"}), Rules())
    assert not room.plan.feasible and room.plan.moves == ()


def test_a_pod_that_lands_already_needs_no_move() -> None:
    snap = ClusterState([mig_node("a", BALANCED)])
    room = room_for(profile(), snap, mig_pod("w", "1g.10gb"), Rules())
    assert room.plan.feasible and room.plan.method is Method.FITS_NOW and room.plan.moves == ()
    assert "without moving" in room.plan.reason


# ---------------------------------------------------------------------------------------------- property
@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterState, PodSpec]:
    """1-3 nodes of 1-2 A100s cut at random, instances held (mostly by pods a controller recreates; node n0
    the most), and a pending pod of a profile present, often bound by its selector to node n0."""
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        layouts = []
        for _g in range(draw(st.integers(1, 2))):
            g = MigGpu("x/0", A100)
            for _ in range(draw(st.integers(0, 10))):
                p = draw(st.sampled_from(sorted(A100.kinds)))
                starts = g.free_starts(p)
                if starts:
                    g = g.place(p, draw(st.sampled_from(starts)))
            layouts.append(tuple((x.profile, x.start) for x in g.instances))
        nodes.append(mig_node(f"n{k}", *layouts, labels={"pool": "x"} if k == 0 else {}))
    snap = ClusterState(nodes)
    j = 0
    for n, nd in enumerate(snap.nodes):
        assert nd.mig is not None
        for i, g in zip(nd.mig.indices, nd.mig.gpus, strict=True):
            for x in g.instances:
                if draw(st.integers(0, 9)) < (8 if n == 0 else 4):  # n0 full, room elsewhere
                    kw = {"controller": RS} if draw(st.integers(0, 9)) else {}
                    held(snap, f"h{j}", n, (i, x.start, x.profile), **kw)
                    j += 1
    present = sorted({x.profile for nd in snap.nodes if nd.mig for g in nd.mig.gpus for x in g.instances})
    want = draw(st.sampled_from(present or sorted(A100.kinds)))
    return snap, mig_pod("w", want, node_selector={"pool": "x"} if draw(st.booleans()) else {})


def check_steps(snap: ClusterState, moves: Any) -> ClusterState:
    """Carry the moves out by hand: before each, the target instance is present on its node and no pod holds
    it; no slice is the target of two moves; the books agree with the allocations after."""
    work = snap.copy()
    targets = [(mv.to_node, s) for mv in moves for s in mv.to_mig]
    assert len(targets) == len(set(targets))  # no slice booked twice
    for mv in moves:
        n = work.index[mv.to_node]
        nm = work.nodes[n].mig
        assert nm is not None and len(mv.to_mig) == 1 and mv.from_mig == work.allocations[mv.pod].mig
        (s,) = mv.to_mig
        g = nm.gpu(s.gpu)
        assert g is not None and Instance(s.profile, s.start) in g.instances  # present
        assert Instance(s.profile, s.start) not in work.mig_books[n][s.gpu].instances  # free at this step
        a = work.forget(mv.pod)
        assert a.pod.controller is not None  # only pods a controller recreates move
        work.assume(a.pod, n, (), mig=mv.to_mig)
    assert work.verify() == []
    return work


@settings(max_examples=100, deadline=None)
@given(clusters())
def test_a_plan_never_books_a_slice_twice_and_moves_only_to_free_instances(
    case: tuple[ClusterState, PodSpec],
) -> None:
    snap, pod = case
    plan = free_a_gpu(profile(), snap, Rules())
    if plan.feasible:
        after = check_steps(snap, plan.moves)
        name, gpu = plan.reason.removeprefix("frees GPU ").split(" of node ")[::-1]
        assert gpu_holds(after, name, int(gpu)) == ()
    room = room_for(profile(), snap, pod, Rules())
    if room.plan.feasible:
        after = check_steps(snap, room.plan.moves)
        for pl in room.plan.placements:
            after.assume(pod, after.index[pl.node], (), mig=pl.mig)  # the freed slice is free
        assert after.verify() == []
    assert snap.verify() == []  # the planner left the books as they were


# ------------------------------------------------------------------------------- gpusched defrag plan
def test_the_dry_run_plans_for_a_pending_mig_pod_and_leaves_the_books() -> None:
    from gpusched.defrag.dryrun import dry_run
    from gpusched.doctor import Books, snapshot_of_state

    snap = ClusterState([mig_node("x", HALVES, labels={"pool": "x"}), mig_node("y", BALANCED)])
    moved(snap, "holder", 0, (0, 4, "3g.40gb"))
    held(snap, "big", 0, (0, 0, "4g.40gb"))
    books = Books.of(snapshot_of_state(snap, [mig_pod("w", "3g.40gb", node_selector={"pool": "x"})]))
    before = {k: a.mig for k, a in books.state.allocations.items()}
    run = dry_run(books)
    (pf,) = run.plans
    assert pf.pods == ("default/w",) and pf.plan.feasible
    assert [(m.pod, m.to_node, m.to_mig) for m in pf.plan.moves] == [
        ("default/holder", "y", (MigSlot(0, 4, "3g.40gb"),))
    ]
    assert run.to_dict()["plans"][0]["placements"][0]["mig"] == [{"gpu": 0, "start": 4, "profile": "3g.40gb"}]
    assert {k: a.mig for k, a in books.state.allocations.items()} == before


def test_gpusched_defrag_plan_names_the_slices_a_move_takes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpusched.cli.commands import app
    from gpusched.doctor.snapshot import save_snapshot

    snap = ClusterState([mig_node("x", HALVES, labels={"pool": "x"}), mig_node("y", BALANCED)])
    moved(snap, "holder", 0, (0, 4, "3g.40gb"))
    held(snap, "big", 0, (0, 0, "4g.40gb"))
    path = save_snapshot(tmp_path / "s.json", snap, [mig_pod("w", "3g.40gb", node_selector={"pool": "x"})])
    r = CliRunner().invoke(app, ["defrag", "plan", "--snapshot", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "x 3g.40gb@4 of GPU 0" in r.output and "y 3g.40gb@4 of GPU 0" in r.output
    assert "then default/w lands on x MIG 3g.40gb@4 of GPU 0" in r.output
