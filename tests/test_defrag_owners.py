"""Defragmentation moves only pods that a controller recreates (issue 28 F2), and moves within a
node (issue 29 item 8): the core's refusal, the Kubernetes reading of ``ownerReferences``, the dry
run (``defrag plan``) and doctor's counterfactual."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import builders
from builders import RS, gpu_node, k8s_pod, profile
from gpusched.cli.commands import app
from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import Refusal, Rules, eligibility, plan_for
from gpusched.core.model import Controller, PodSpec
from gpusched.defrag.dryrun import dry_run
from gpusched.doctor import Books, doctor_pod, snapshot_of_state
from gpusched.doctor.snapshot import write_snapshot
from gpusched.k8s.convert import ANN_MIRROR, InvalidRequest, controller_of, pod_from_k8s

BESTFIT = profile("bestfit")
share = partial(builders.share, controller=RS)
whole = partial(builders.whole, controller=RS)
bare = builders.whole  # no controller: nothing recreates it


def issue_cluster(owner: Controller | None) -> ClusterState:
    """Issue 28 F2's reproduction: two nodes of 8 GPUs, three 1-GPU pods at priority 0, two on a
    and one on b, all of ``owner``."""
    snap = ClusterState([gpu_node("a", 8, cpu=64_000), gpu_node("b", 8, cpu=64_000)])
    snap.assume(builders.whole("bare-0", controller=owner), 0, (0,))
    snap.assume(builders.whole("bare-1", controller=owner), 0, (1,))
    snap.assume(builders.whole("bare-2", controller=owner), 1, (0,))
    return snap


# ------------------------------------------------------------------------------------- the core
def test_pods_without_a_controller_are_never_moved_and_the_plan_says_why() -> None:
    snap = issue_cluster(None)
    plan = plan_for(BESTFIT, snap, bare("big", 8))
    assert not plan.feasible and plan.moves == ()
    assert [k for k, _ in plan.kept] == ["default/bare-0", "default/bare-1", "default/bare-2"]
    assert {r for _, r in plan.kept} == {Refusal.NO_CONTROLLER}
    bare3 = "default/bare-0, default/bare-1, default/bare-2"
    assert f"kept in place: {bare3}: no controller owns it" in plan.reason
    assert json.loads(json.dumps(plan.to_dict()))["kept"][0] == {
        "pod": "default/bare-0",
        "why": "no-controller",
        "reason": "no controller owns it (an eviction would lose it)",
    }
    # the same pods owned by a ReplicaSet: the one pod on b moves to a, and the 8-GPU pod lands
    owned = plan_for(BESTFIT, issue_cluster(RS), whole("big", 8))
    assert owned.feasible and [(m.pod, m.to_node) for m in owned.moves] == [("default/bare-2", "a")]
    assert owned.kept == ()


@pytest.mark.parametrize(
    ("owner", "why"),
    [
        (None, Refusal.NO_CONTROLLER),
        (Controller("DaemonSet", "agent", "apps"), Refusal.NOT_RECREATED),
        (Controller("Node", "a"), Refusal.NOT_RECREATED),  # a static pod's mirror
        (Controller("RayCluster", "r", "ray.io"), Refusal.NOT_RECREATED),  # unknown: not assumed
        (Controller("ReplicaSet", "web", "apps"), None),
        (Controller("StatefulSet", "db", "apps"), None),
        (Controller("Job", "train", "batch"), None),
        (Controller("ReplicationController", "old"), None),
    ],
)
def test_which_controllers_recreate_a_moved_pod(owner: Controller | None, why: Refusal | None) -> None:
    snap = ClusterState([gpu_node("a", 2)])
    snap.assume(builders.share("p", 500, controller=owner), 0, (0,))
    el = eligibility(snap, Rules(), 0)
    assert el.refused.get("default/p") is why
    assert ("default/p" in el.unit_of) is (why is None)


def test_a_custom_controller_that_recreates_its_pods_can_be_named() -> None:
    snap = ClusterState([gpu_node("a", 2)])
    snap.assume(builders.share("p", 500, controller=Controller("RayCluster", "r", "ray.io")), 0, (0,))
    rules = Rules(recreating=frozenset({"RayCluster.ray.io"}))
    assert "default/p" in eligibility(snap, rules, 0).unit_of


def test_a_gang_with_one_bare_member_stays_put() -> None:
    snap = ClusterState([gpu_node("a", 4), gpu_node("b", 4)])
    snap.assume(builders.share("g-0", 500, controller=RS, gang="g"), 0, (0,))
    snap.assume(builders.share("g-1", 500, gang="g"), 0, (1,))
    el = eligibility(snap, Rules(), 0)
    assert el.refused == {"default/g-0": Refusal.GANG_MEMBER_BLOCKED, "default/g-1": Refusal.NO_CONTROLLER}


# ------------------------------------------------------------------------- moves within a node
def two_shares_on_two_gpus() -> ClusterState:
    """Issue 29 item 8: one node, two shares on its two GPUs; a 1-GPU pod cannot land."""
    snap = ClusterState([gpu_node("a", 2, cpu=64_000)])
    snap.assume(share("s-0", 400), 0, (0,))
    snap.assume(share("s-1", 300), 0, (1,))
    return snap


def test_a_share_moves_to_another_gpu_of_its_node_to_free_a_whole_gpu() -> None:
    snap = two_shares_on_two_gpus()
    plan = plan_for(BESTFIT, snap, whole("w", 1))
    assert plan.feasible and plan.move_count == 1 and plan.optimal
    (mv,) = plan.moves
    assert mv.from_node == mv.to_node == "a" and mv.to_gpus != mv.from_gpus
    (pl,) = plan.placements
    assert pl.node == "a" and pl.gpus == mv.from_gpus  # lands on the GPU the move frees
    assert len(snap.allocations) == 2 and snap.verify() == []  # left as it was


def test_another_node_is_preferred_to_a_move_within_the_node() -> None:
    """As before moves within a node were planned: a moved pod goes to another node when one
    takes it (here b, whose DaemonSet share stays), and only else to another GPU of its own."""
    snap = ClusterState([gpu_node("a", 2, cpu=64_000), gpu_node("b", 1, cpu=64_000)])
    snap.assume(share("s-0", 400), 0, (0,))
    snap.assume(share("s-1", 300), 0, (1,))
    snap.assume(builders.share("agent", 700, controller=Controller("DaemonSet", "d", "apps")), 1, (0,))
    plan = plan_for(BESTFIT, snap, whole("w", 1))
    assert plan.feasible and [(m.pod, m.to_node) for m in plan.moves] == [("default/s-1", "b")]


# ---------------------------------------------------------------------------- Kubernetes side
def owned_pod(**meta: object) -> dict[str, Any]:
    obj = k8s_pod("p", {"nvidia.com/gpu": "1"}, node_name="a")
    obj["metadata"].update(meta)
    return obj


def ref(kind: str, api: str, controller: bool = True) -> dict[str, object]:
    return {"apiVersion": api, "kind": kind, "name": "x", "uid": "u", "controller": controller}


@pytest.mark.parametrize(
    ("refs", "want"),
    [
        (None, None),
        ([], None),
        ([ref("ReplicaSet", "apps/v1")], Controller("ReplicaSet", "x", "apps")),
        ([ref("Job", "batch/v1")], Controller("Job", "x", "batch")),
        ([ref("ReplicationController", "v1")], Controller("ReplicationController", "x")),
        ([ref("ConfigMap", "v1", controller=False)], None),  # an owner, not a controller
        (
            [ref("ConfigMap", "v1", False), ref("StatefulSet", "apps/v1")],
            Controller("StatefulSet", "x", "apps"),
        ),
    ],
)
def test_the_controller_is_the_owner_reference_marked_controller(
    refs: list[dict[str, object]] | None, want: Controller | None
) -> None:
    obj = owned_pod(**({} if refs is None else {"ownerReferences": refs}))
    assert controller_of(obj) == want
    assert pod_from_k8s(obj, constraints="lenient").controller == want


def test_a_mirror_pod_is_its_nodes_and_unreadable_owners_are_refused_or_count_as_none() -> None:
    mirror = owned_pod(annotations={ANN_MIRROR: "abc"}, ownerReferences=[ref("Node", "v1")])
    assert controller_of(mirror) == Controller("Node", "a")
    bad = owned_pod(ownerReferences=[{"kind": "ReplicaSet", "controller": True}])
    with pytest.raises(InvalidRequest, match=r"pod default/p: metadata\.ownerReferences cannot be read"):
        pod_from_k8s(bad)
    assert pod_from_k8s(bad, constraints="lenient").controller is None  # booked, never moved
    assert controller_of(owned_pod(ownerReferences="rs"), strict=False) is None


# ---------------------------------------------------------------- defrag plan and doctor show it
def issue_books(owner: Controller | None) -> Books:
    return Books.of(snapshot_of_state(issue_cluster(owner), [bare("big", 8)]))


def test_defrag_plan_names_the_pods_it_may_not_move(tmp_path: Path) -> None:
    report = dry_run(issue_books(None)).to_dict()
    (p,) = report["plans"]
    assert not p["feasible"] and report["moves"] == 0
    assert {k["pod"]: k["why"] for k in p["kept"]} == {f"default/bare-{i}": "no-controller" for i in range(3)}
    f = write_snapshot(tmp_path / "s.json", issue_books(None).snapshot)
    res = CliRunner().invoke(app, ["defrag", "plan", "--snapshot", str(f)])
    assert (
        res.exit_code == 0
        and "no plan" in res.stdout
        and "default/bare-2: no controller owns it" in res.stdout
    )
    owned = dry_run(issue_books(RS)).to_dict()
    assert owned["moves"] == 1 and owned["plans"][0]["kept"] == []


def test_defrag_plan_recreating_moves_a_named_custom_controllers_pods(tmp_path: Path) -> None:
    """``defrag plan --recreating KIND.GROUP`` plans as ``defrag run`` with the same flag would: the
    pods of a TFJob stay put by default and move once its kind is named."""
    f = write_snapshot(tmp_path / "s.json", issue_books(Controller("TFJob", "t", "kubeflow.org")).snapshot)
    by_default = CliRunner().invoke(app, ["defrag", "plan", "--snapshot", str(f), "--json"])
    assert by_default.exit_code == 0, by_default.output
    report = json.loads(by_default.stdout)
    assert report["moves"] == 0
    assert {k["why"] for k in report["plans"][0]["kept"]} == {"not-recreated"}
    named = CliRunner().invoke(
        app, ["defrag", "plan", "--snapshot", str(f), "--json", "--recreating", "TFJob.kubeflow.org"]
    )
    assert named.exit_code == 0, named.output
    report = json.loads(named.stdout)
    assert report["moves"] == 1 and report["plans"][0]["kept"] == []


def test_doctor_names_the_bare_pods_instead_of_a_move() -> None:
    report = doctor_pod(issue_books(None), "default/big")
    kinds = [c.kind for c in report.counterfactuals]
    assert "moves" not in kinds and "kept" in kinds
    kept = next(c for c in report.counterfactuals if c.kind == "kept")
    bare3 = "default/bare-0, default/bare-1, default/bare-2"
    assert f"may not move {bare3} (no controller owns it" in kept.message
    assert not kept.verified
    owned = doctor_pod(issue_books(RS), "default/big")
    assert owned.counterfactuals[0].kind == "moves"


def test_doctor_finds_the_one_move_within_a_node() -> None:
    """Issue 29 item 8: two shares on two GPUs of one node, a 1-GPU pod pending: one move."""
    books = Books.of(snapshot_of_state(two_shares_on_two_gpus(), [whole("w", 1)]))
    report = doctor_pod(books, "default/w")
    first = report.counterfactuals[0]
    assert first.kind == "moves" and first.cost == 1 and first.verified and first.node == "a"
    assert "to another GPU of a" in first.message
    assert json.dumps(first.to_dict())  # plain values


# ------------------------------------------------------------------- property: dense clusters
@st.composite
def dense(draw: st.DrawFn) -> tuple[ClusterState, PodSpec]:
    """Every GPU holds one share (so a whole-GPU pod needs moves, within a node or across),
    each share of a ReplicaSet, bare, or of a DaemonSet."""
    nodes = [
        gpu_node(f"n{i}", draw(st.sampled_from([2, 4])), cpu=64_000) for i in range(draw(st.integers(1, 3)))
    ]
    snap = ClusterState(nodes)
    owners = [RS, None, Controller("DaemonSet", "d", "apps")]
    k = 0
    for n, nd in enumerate(nodes):
        for g in range(nd.gpu_count):
            owner = draw(st.sampled_from(owners))
            snap.assume(
                builders.share(f"s{k}", draw(st.sampled_from([200, 300, 400, 500])), controller=owner),
                n,
                (g,),
            )
            k += 1
    return snap, whole("w", draw(st.sampled_from([1, 1, 2])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dense())
def test_only_recreated_pods_move_and_every_step_fits(scene: tuple[ClusterState, PodSpec]) -> None:
    snap, pending = scene
    plan = plan_for(BESTFIT, snap, pending)
    if not plan.feasible:
        return
    c = snap.copy()
    for mv in plan.moves:
        a = c.allocations[mv.pod]
        assert a.pod.controller == RS, f"{mv.pod} ({a.pod.controller}) moved"
        assert (mv.to_node, mv.to_gpus) != (mv.from_node, mv.from_gpus)
        c.forget(mv.pod)
        c.assume(a.pod, c.index[mv.to_node], mv.to_gpus)  # AccountingError if it would overcommit
    (pl,) = plan.placements
    c.assume(pending, c.index[pl.node], pl.gpus)
    assert c.verify() == []
