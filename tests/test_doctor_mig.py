"""Doctor for MIG pods (issue 31 item 5): the slice a pending pod waits for and why (no model has the profile,
too few present, all held, a GPU being re-cut), and the re-cut that would host it, checked on a copy of the
books by the scheduler's own filters; the copy (``core.mig.whatif``) keeps the books consistent."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from builders import profile
from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.mig.geometry import Instance, MigGpu, MigPlacementError
from gpusched.core.mig.reshape import GpuRecut
from gpusched.core.mig.whatif import recut, with_node_mig
from gpusched.core.model import Controller, PodSpec, Taint
from gpusched.core.scheduler import feasible
from gpusched.doctor import Books, doctor_node, doctor_pod, snapshot_of_state
from gpusched.doctor.analysis import gpu_map
from gpusched.doctor.demo import mig_demo_snapshot
from gpusched.doctor.mig import mig_counterfactual, mig_findings
from gpusched.doctor.render import render_node, render_pod
from migbuilders import A100, BALANCED, HALVES, held, mig_node, mig_pod, res


def codes(fs: list[Any]) -> set[str]:
    return {f.code for f in fs}


def applied(snap: ClusterState, change: dict[str, Any]) -> ClusterState:
    """The counterfactual's change carried out independently: books rebuilt with the node's new geometry (as
    its agent would publish it) and every pod booked again at its slices."""
    n = snap.index[change["node"]]
    old = snap.nodes[n]
    assert old.mig is not None
    k = old.mig.indices.index(change["gpu"])
    g = old.mig.gpus[k]
    for x in change["destroy"]:
        g = g.remove(x["profile"], x["start"])
    for x in change["create"]:
        g = g.place(x["profile"], x["start"])
    gpus = list(old.mig.gpus)
    gpus[k] = g
    counts = {r: v for r, v in old.extended.items() if not r.startswith("nvidia.com/mig-")}
    for gg in gpus:
        for x in gg.instances:
            counts[res(x.profile)] = counts.get(res(x.profile), 0) + 1
    nodes = list(snap.nodes)
    nodes[n] = replace(old, extended=counts, mig=NodeMig(tuple(gpus), old.mig.indices))
    out = ClusterState(nodes)
    for a in snap.allocations.values():
        out.assume(a.pod, a.node, a.gpus, mig=a.mig)
    return out


# ---------------------------------------------------------------------------------------------- findings
def test_too_few_present_is_named_and_an_idle_gpu_re_cut_hosts_it() -> None:
    snap = ClusterState([mig_node("a", BALANCED, HALVES)])
    held(snap, "big", 0, (1, 0, "4g.40gb"), (1, 4, "3g.40gb"))
    pod = mig_pod("w", "7g.80gb")
    fs = mig_findings(profile(), pod, snap)
    assert codes(fs) == {"mig-too-few"}
    assert fs[0].message.startswith("waits for a 7g.80gb slice: too few 7g.80gb instances present (0 on 1")
    cfs = mig_counterfactual(profile(), pod, snap)
    assert [c.kind for c in cfs] == ["mig-recut"] and cfs[0].verified
    assert cfs[0].message.startswith(
        "waits for a 7g.80gb slice: GPU 0 of node a could host it after re-cutting its free slices (idle)"
    )
    ch = cfs[0].change
    assert ch["gpu"] == 0 and ch["create"] == [{"profile": "7g.80gb", "start": 0}]
    assert len(ch["destroy"]) == 4 and ch["in_use"] == []
    after = applied(snap, dict(ch))
    assert after.verify() == [] and snap.index["a"] in feasible(profile(), pod, after).indices().tolist()


def test_all_held_names_the_holders_and_the_re_cut_keeps_them() -> None:
    snap = ClusterState([mig_node("a", BALANCED, HALVES)])
    held(snap, "p0", 0, (0, 4, "3g.40gb"))
    held(snap, "p1", 0, (1, 4, "3g.40gb"))
    pod = mig_pod("w", "3g.40gb")
    fs = mig_findings(profile(), pod, snap)
    assert codes(fs) == {"mig-all-held"}
    assert "all 2 3g.40gb instance(s) present are held (by default/p0, default/p1)" in fs[0].message
    assert fs[0].evidence["held_by"] == ["default/p0", "default/p1"]
    (cf,) = mig_counterfactual(profile(), pod, snap)
    assert "beside 1 slice(s) in use: 3g.40gb at 4" in cf.message
    assert {"profile": "3g.40gb", "start": 4} not in cf.change["destroy"]  # a held instance never goes
    after = applied(snap, dict(cf.change))
    assert after.verify() == [] and snap.index[cf.node] in feasible(profile(), pod, after).indices().tolist()


def test_a_profile_no_model_has_gets_no_re_cut() -> None:
    snap = ClusterState([mig_node("a", BALANCED)])
    pod = mig_pod("w", "1g.5gb")  # an A100 40GB profile
    fs = mig_findings(profile(), pod, snap)
    assert codes(fs) == {"mig-no-model"} and "(a100-80gb)" in fs[0].message
    assert mig_counterfactual(profile(), pod, snap) == []


def test_a_gpu_being_re_cut_is_named_and_nothing_more_is_asked_of_its_node() -> None:
    snap = ClusterState([mig_node("a", BALANCED, HALVES, reshaping=frozenset({1}))])
    held(snap, "p0", 0, (0, 4, "3g.40gb"))
    pod = mig_pod("w", "4g.40gb")
    fs = mig_findings(profile(), pod, snap)
    assert codes(fs) == {"mig-reshaping"}
    assert "GPU 1 of node a is being re-cut" in fs[0].message
    assert mig_counterfactual(profile(), pod, snap) == []  # one re-cut at a time per node


def test_slices_that_fit_give_no_mig_finding() -> None:
    snap = ClusterState([mig_node("a", BALANCED)])
    assert mig_findings(profile(), mig_pod("w", "1g.10gb"), snap) == []
    assert mig_findings(profile(), PodSpec("x", cpu_milli=1), snap) == []


def test_a_re_cut_the_scheduler_would_still_refuse_is_not_offered() -> None:
    """The only MIG node has a taint the pod does not tolerate: the planner finds a re-cut, but the
    scheduler's filters on the re-cut copy still refuse the pod, so doctor does not offer it."""
    snap = ClusterState([mig_node("a", BALANCED, taints=(Taint("dedicated", "x", "NoSchedule"),))])
    pod = mig_pod("w", "7g.80gb")
    assert mig_counterfactual(profile(), pod, snap) == []
    ok = replace(snap.nodes[0], taints=())
    assert [c.kind for c in mig_counterfactual(profile(), pod, ClusterState([ok]))] == ["mig-recut"]


def test_the_node_the_pod_may_use_is_chosen_not_another() -> None:
    snap = ClusterState([mig_node("a", BALANCED), mig_node("b", BALANCED, labels={"pool": "x"})])
    pod = mig_pod("w", "7g.80gb", node_selector={"pool": "x"})
    (cf,) = mig_counterfactual(profile(), pod, snap)
    assert cf.node == "b"
    fs = mig_findings(profile(), pod, snap)
    assert fs[0].evidence["present"] == 0 and "on 1 MIG node(s)" in fs[0].message


# ------------------------------------------------------------------------------------- through doctor pod
def test_doctor_pod_text_and_json_name_the_slice_and_the_re_cut() -> None:
    snap = ClusterState([mig_node("a", BALANCED, HALVES)])
    held(snap, "big", 0, (1, 0, "4g.40gb"), (1, 4, "3g.40gb"))
    pending = mig_pod("w", "7g.80gb")
    books = Books.of(snapshot_of_state(snap, [pending]))
    assert (
        books.state.allocations["default/big"].mig == snap.allocations["default/big"].mig
    )  # the snapshot kept them
    r = doctor_pod(books, "default/w")
    assert "mig-too-few" in codes(list(r.findings))
    assert r.counterfactuals[0].kind == "mig-recut"
    out = Console(record=True, width=400)
    render_pod(r, out)
    text = out.export_text()
    assert "GPU 0 of node a could host it after re-cutting its free slices (idle)" in text
    doc = json.loads(json.dumps(r.to_dict()))
    cf = doc["counterfactuals"][0]
    assert cf["kind"] == "mig-recut" and cf["verified"] and cf["change"]["gpu"] == 0


# ----------------------------------------------------------------------------------------- the what-if copy
def test_with_node_mig_keeps_the_books_consistent_and_leaves_the_original() -> None:
    snap = ClusterState([mig_node("a", BALANCED, HALVES), mig_node("b", HALVES)])
    held(snap, "p", 0, (0, 4, "3g.40gb"))
    before = (snap.mig_free[0].copy(), snap.ext_cap.copy(), snap.nodes)
    nm = snap.nodes[0].mig
    assert nm is not None
    change = GpuRecut(0, (Instance("2g.20gb", 0), Instance("1g.10gb", 2), Instance("1g.10gb", 3)),
                      (Instance("3g.40gb", 0),), ("3g.40gb",))  # fmt: skip
    after = with_node_mig(snap, 0, recut(nm, change))
    assert after.verify() == []
    assert after.mig_free[0]["3g.40gb"] == 2 and after.mig_free[0]["1g.10gb"] == 0
    assert after.ext_cap[0, after.ext_index["nvidia.com/mig-1g.10gb"]] == 0
    assert (snap.mig_free[0], snap.nodes) == (before[0], before[2]) and (snap.ext_cap == before[1]).all()
    assert snap.verify() == []


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_re_cut_copy_always_verifies(data: st.DataObject) -> None:
    """Random A100 layouts, random pods holding some instances: the re-cut the scheduler's planner picks for
    a random profile, applied on the copy, leaves books that ``verify`` agrees with, the held slices still
    booked, and the pod passing the filters there whenever doctor offers it."""
    layouts = []
    for _g in range(data.draw(st.integers(1, 3))):
        g = MigGpu("x/0", A100)
        for _ in range(data.draw(st.integers(0, 5))):
            p = data.draw(st.sampled_from(sorted(A100.kinds)))
            starts = g.free_starts(p)
            if starts:
                g = g.place(p, data.draw(st.sampled_from(starts)))
        layouts.append(tuple((x.profile, x.start) for x in g.instances))
    snap = ClusterState([mig_node("a", *layouts)])
    nm = snap.nodes[0].mig
    assert nm is not None
    k = 0
    for i, g in zip(nm.indices, nm.gpus, strict=True):
        for x in g.instances:
            if data.draw(st.booleans()):
                held(snap, f"h{k}", 0, (i, x.start, x.profile))
                k += 1
    pod = mig_pod("w", data.draw(st.sampled_from(sorted(A100.kinds))))
    for cf in mig_counterfactual(profile(), pod, snap):
        after = applied(snap, dict(cf.change))
        assert after.verify() == []
        assert all(a.mig == snap.allocations[key].mig for key, a in after.allocations.items())
        assert 0 in feasible(profile(), pod, after).indices().tolist()


def test_a_re_cut_that_would_destroy_a_held_slice_is_refused() -> None:
    snap = ClusterState([mig_node("a", BALANCED)])
    held(snap, "p", 0, (0, 4, "3g.40gb"))
    nm = snap.nodes[0].mig
    assert nm is not None
    everything = tuple(Instance(p, s) for p, s in BALANCED)
    bad = recut(nm, GpuRecut(0, everything, (Instance("7g.80gb", 0),), ("7g.80gb",)))
    with pytest.raises(MigPlacementError, match=r"would destroy held 3g\.40gb at slice 4"):
        with_node_mig(snap, 0, bad)


# ------------------------------------------------------------------------------------------- the GPU map
def test_the_map_and_doctor_node_show_each_slice_and_who_holds_it() -> None:
    books = Books.of(mig_demo_snapshot())
    (node,) = gpu_map(books)["nodes"]
    slices = {(g["index"], x["profile"], x["start"]): x["pod"] for g in node["mig"] for x in g["slices"]}
    assert slices == {
        (0, "2g.20gb", 0): None,
        (0, "1g.10gb", 2): None,
        (0, "1g.10gb", 3): None,
        (0, "3g.40gb", 4): "team-a/infer-3g",
        (1, "4g.40gb", 0): "team-a/train-4g",
        (1, "3g.40gb", 4): "team-a/infer-3g-b",
    }
    r = doctor_node(books, "a100-mig-0")
    assert r.to_dict()["mig"] == node["mig"]
    assert "device-plugin-not-registered" not in codes(list(r.findings))  # mixed: slices, no nvidia.com/gpu
    out = Console(record=True, width=400)
    render_node(r, out)
    text = out.export_text()
    assert "1g.10gb@2: free" in text and "4g.40gb@0: team-a/train-4g" in text
    pending = doctor_pod(books, "team-b/needs-4g")
    assert "mig-all-held" in codes(list(pending.findings))
    assert pending.counterfactuals[0].message.startswith(
        "waits for a 4g.40gb slice: GPU 0 of node a100-mig-0 could host it after re-cutting its free slices "
        "(beside 1 slice(s) in use: 3g.40gb at 4)"
    )


def test_when_no_re_cut_alone_serves_doctor_names_the_slice_moves_that_make_room() -> None:
    """Node x (the only one the pod may use) holds a 3g another pod could hold on node y: moving it frees the
    instance; the plan is carried out independently and the pod then fits on x."""
    snap = ClusterState([mig_node("x", HALVES, labels={"pool": "x"}), mig_node("y", BALANCED)])
    held(snap, "holder", 0, (0, 4, "3g.40gb"), controller=Controller("ReplicaSet", "web", "apps"))
    held(snap, "big", 0, (0, 0, "4g.40gb"))
    pod = mig_pod("w", "3g.40gb", node_selector={"pool": "x"})
    books = Books.of(snapshot_of_state(snap, [pod]))
    r = doctor_pod(books, "default/w")
    cf = r.counterfactuals[0]
    assert cf.kind == "moves" and cf.verified and cf.node == "x"
    assert cf.message.startswith(
        "fits on x if MIG pods move (1 move: default/holder to 3g.40gb at 4 of GPU 0 of y)"
    )
    after = books.state.copy()
    for m in cf.change["plan"]["moves"]:
        a = after.forget(m["pod"])
        after.assume(a.pod, after.index[m["to_node"]], (), mig=tuple(MigSlot(**s) for s in m["to_mig"]))
    assert after.verify() == [] and after.index["x"] in feasible(profile(), pod, after).indices().tolist()
