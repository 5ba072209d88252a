"""``gpusched doctor``'s pure analysis: findings at the three levels, and counterfactuals that
hold when applied (checked here again, independently of doctor, on the core)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from builders import RS, k8s_node, k8s_pod, node, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.model import GPU_MILLI, PodSpec, Taint
from gpusched.doctor import Books, UnknownObject, doctor_cluster, doctor_node, doctor_pod, snapshot_of_state
from gpusched.doctor.checks import ANN_ALLOCATED, ANN_TOPOLOGY, drift_findings, node_findings
from gpusched.doctor.counterfactual import changed_pod, feasible_nodes
from gpusched.doctor.demo import demo_snapshot
from gpusched.doctor.errors import SnapshotError
from gpusched.doctor.snapshot import Snapshot, load_snapshot, parse_snapshot, save_snapshot


def books(st: ClusterState, pending: list[PodSpec]) -> Books:
    return Books.of(snapshot_of_state(st, pending))


def codes(report: Any) -> set[str]:
    return {f.code for f in report.findings}


def fits_after(b: Books, key: str) -> bool:
    """Apply the first counterfactual to the pod (or the books) and run the core's cycle."""
    r = doctor_pod(b, key)
    cf = r.counterfactuals[0]
    pod, snap = b.pending[key], b.state.copy()
    if cf.kind == "moves":
        for m in cf.change["plan"]["moves"]:  # each move carried out on the books, checked
            a = snap.forget(m["pod"])
            assert snap.names[a.node] == m["from_node"] and list(a.gpus) == m["from_gpus"]
            snap.assume(a.pod, snap.index[m["to_node"]], m["to_gpus"])
    elif cf.kind == "healthy-gpu":
        nodes = [replace(n, unhealthy_gpus=frozenset()) if n.name == cf.node else n for n in snap.nodes]
        healed = ClusterState(nodes)
        for a in snap.allocations.values():
            healed.assume(a.pod, a.node, a.gpus, check=False)
        snap = healed
    return snap.index[cf.node] in feasible_nodes(b.profile, changed_pod(pod, cf), snap)


# ------------------------------------------------------------------------- seeded faults
def test_missing_toleration_is_named_and_the_toleration_makes_it_fit() -> None:
    st = ClusterState([node("busy", 1), node("tainted", 2, taints=(Taint("dedicated", "ml"),))])
    st.assume(whole("w"), 0, [0])
    b = books(st, [whole("p")])
    r = doctor_pod(b, "default/p")
    assert "untolerated-taint" in codes(r)
    assert r.reasons == {"Insufficient GPU": 1, "node(s) had untolerated taint {dedicated: ml}": 1}
    cf = r.counterfactuals[0]
    assert cf.kind == "toleration" and "dedicated=ml:NoSchedule" in cf.message and cf.node == "tainted"
    assert fits_after(b, "default/p")
    assert not feasible_nodes(b.profile, b.pending["default/p"], b.state)  # and not without it


def test_impossible_model_is_named_with_a_model_that_fits() -> None:
    st = ClusterState([node("a", 2, model="A100"), node("t", 2, model="T4")])
    st.assume(whole("w", 2), 1, [0, 1])
    b = books(st, [PodSpec("p", num_gpu=1, gpu_milli=GPU_MILLI, gpu_models=frozenset({"B200"}))])
    r = doctor_pod(b, "default/p")
    assert "no-such-model" in codes(r) and "B200" in r.summary + str([f.message for f in r.findings])
    cf = r.counterfactuals[0]
    assert cf.kind == "gpu-model" and cf.change["gpu_models"] == ["A100"]  # T4 is full
    assert fits_after(b, "default/p")


def test_more_gpu_memory_than_any_gpu_has_gives_the_largest_that_fits() -> None:
    st = ClusterState([node("small", 1, gmem=16_384), node("big", 1, gmem=24_576)])
    b = books(st, [PodSpec("p", num_gpu=1, gpu_milli=500, gpu_memory_mib=40_960)])
    r = doctor_pod(b, "default/p")
    assert "gpu-memory-too-large" in codes(r)
    cf = r.counterfactuals[0]
    assert cf.kind == "gpu-memory" and cf.change["gpu_memory_mib"] == 24_576 and "≤ 24 GiB" in cf.message
    assert fits_after(b, "default/p")
    too_much = replace(b.pending["default/p"], gpu_memory_mib=24_577)
    assert not feasible_nodes(b.profile, too_much, b.state)  # the figure is the largest


def test_fragmentation_that_moves_fix_names_the_moves() -> None:
    st = ClusterState([node("n1", 2), node("n2", 2)])
    st.assume(share("a", 400, controller=RS), 0, [0])  # a ReplicaSet recreates them: they may move
    st.assume(share("b", 400, controller=RS), 1, [1])
    b = books(st, [whole("p", 2)])
    r = doctor_pod(b, "default/p")
    assert "fragmented" in codes(r)
    cf = r.counterfactuals[0]
    assert cf.kind == "moves" and cf.cost == 1 and "(1 move)" in cf.message and "shares" in cf.message
    assert fits_after(b, "default/p")


def test_unhealthy_gpu_is_named_at_node_and_scheduling_level_and_repair_fits() -> None:
    st = ClusterState([node("sick", 2, unhealthy_gpus=frozenset({1})), node("full", 1)])
    st.assume(whole("w"), 1, [0])
    b = books(st, [whole("p", 2)])
    r = doctor_pod(b, "default/p")
    assert {"unhealthy-gpu"} <= codes(r)
    assert any(f.level == "node" and f.code == "unhealthy-gpu" for f in r.findings)
    cf = r.counterfactuals[0]
    assert cf.kind == "healthy-gpu" and cf.node == "sick" and cf.change["unhealthy"] == [1]
    assert fits_after(b, "default/p")


def topo(gpus: int, name: str) -> str:
    return json.dumps({"gpus": [{"index": g, "uuid": f"GPU-{name}-{g}"} for g in range(gpus)]})


def bound_pod(assigned: list[int], handed: list[int] | None, node_name: str = "n") -> dict[str, Any]:
    ann = {"gpusched.io/assignment": json.dumps({"node": node_name, "gpus": assigned, "milli": 1000})}
    if handed is not None:
        ann[ANN_ALLOCATED] = json.dumps({"c": {"nvidia.com/gpu": [f"GPU-n-{g}" for g in handed]}})
    return k8s_pod("p", {"nvidia.com/gpu": str(len(assigned))}, node_name="n", annotations=ann)


def test_drift_between_assignment_and_device_plugin_allocation_is_named() -> None:
    n = k8s_node("n", 4)
    n["metadata"]["annotations"] = {ANN_TOPOLOGY: topo(4, "n")}
    (f,) = drift_findings(bound_pod([0, 1], [0, 2]), n)
    assert (
        f.code == "drift-gpus" and f.severity == "error" and "[0, 1]" in f.message and "[0, 2]" in f.message
    )
    (ok,) = drift_findings(bound_pod([0, 1], [1, 0]), n)
    assert ok.code == "allocation-agrees"
    codes_ = {x.code for x in drift_findings(bound_pod([0], [0], node_name="elsewhere"), n)}
    assert "drift-node" in codes_
    bare = k8s_node("n", 4)  # no topology: only the count can be compared
    assert drift_findings(bound_pod([0, 1], [3]), bare)[0].code == "drift-count"
    assert drift_findings(bound_pod([0, 1], None), n)[0].code == "no-allocation-record"


def test_drift_in_a_pod_report_and_the_cluster_report() -> None:
    n = k8s_node("n", 4)
    n["metadata"]["annotations"] = {ANN_TOPOLOGY: topo(4, "n")}
    b = Books.of(Snapshot([n], [bound_pod([0], [3])], "test"))
    assert "drift-gpus" in doctor_pod(b, "default/p").cause
    c = doctor_cluster(b)
    assert [f.code for f in c.findings if f.code.startswith("drift")] == ["drift-gpus"]
    assert "drift-gpus" in codes(doctor_node(b, "n"))


# ------------------------------------------------------------------------------ node level
def test_node_checks_registration_inventory_and_readiness() -> None:
    unregistered = k8s_node("u", 0, labels={"nvidia.com/gpu.product": "A100"})
    del unregistered["status"]["allocatable"]["nvidia.com/gpu"]
    assert "device-plugin-not-registered" in {f.code for f in node_findings(unregistered)}
    mismatch = k8s_node("m", 8, labels={"nvidia.com/gpu.count": "4"})
    assert "inventory-mismatch" in {f.code for f in node_findings(mismatch)}
    held_back = k8s_node("h", 8)
    held_back["status"]["capacity"] = {**held_back["status"]["allocatable"], "nvidia.com/gpu": "8"}
    held_back["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    assert "allocatable-below-capacity" in {f.code for f in node_findings(held_back)}
    not_ready = k8s_node("r", 8)
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert "node-not-ready" in {f.code for f in node_findings(not_ready)}
    good = k8s_node("g", 8, labels={"nvidia.com/cuda.driver-version.major": "550"})
    good["status"]["allocatable"]["gpusched.io/gpu-share"] = "128"
    assert {f.severity for f in node_findings(good)} == {"ok"}


def test_reasons_grouped_as_kube_scheduler_groups_them() -> None:
    st = ClusterState([node(f"t{i}", 1, taints=(Taint("k", "v"),)) for i in range(3)] + [node("f", 1)])
    st.assume(whole("w"), 3, [0])
    r = doctor_pod(books(st, [whole("p")]), "default/p")
    msg = next(f.message for f in r.findings if f.code == "unschedulable")
    assert msg == "0/4 nodes are available: 1 Insufficient GPU, 3 node(s) had untolerated taint {k: v}."


def test_a_pod_that_fits_now_says_so() -> None:
    b = books(ClusterState([node("n", 1)]), [whole("p")])
    (cf,) = doctor_pod(b, "default/p").counterfactuals
    assert cf.kind == "fits-now" and cf.node == "n"


def test_no_change_found_is_said_plainly() -> None:
    st = ClusterState([node("n", 1)])
    st.assume(PodSpec("w", num_gpu=1, gpu_milli=GPU_MILLI, movable=False, controller=RS), 0, [0])
    (cf,) = doctor_pod(books(st, [whole("p")]), "default/p").counterfactuals
    assert cf.kind == "none" and not cf.verified


def test_cluster_report_top_reasons_and_stranded_capacity() -> None:
    b = Books.of(demo_snapshot())
    c = doctor_cluster(b)
    assert c.nodes == 12 and c.pending == 4
    assert dict(c.top_reasons)["GPU model mismatch"] == 3
    assert set(c.stranded_by_model) == {"A100", "H100", "T4"}
    a100 = c.stranded_by_model["A100"]
    assert 0 < a100["stranded_milli"] <= a100["free_milli"]
    assert any(f.code == "drift-gpus" and f.subject == "team-a/notebook-1" for f in c.findings)


# ------------------------------------------------------------------------------- bad input
def test_unknown_pod_and_node_are_named_with_a_suggestion() -> None:
    b = Books.of(demo_snapshot())
    with pytest.raises(
        UnknownObject, match=r"pod team-c/wants-b20 not found.*did you mean team-c/wants-b200"
    ):
        doctor_pod(b, "team-c/wants-b20")
    with pytest.raises(UnknownObject, match="node nope not found"):
        doctor_node(b, "nope")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"kind": "x", "version": 1}', "field kind"),
        ('{"kind": "gpusched.io/doctor-snapshot", "version": 7}', "field version"),
        (
            '{"kind": "gpusched.io/doctor-snapshot", "version": 1, "nodes": {}, "pods": []}',
            "'nodes' must be a list",
        ),
        (
            '{"kind": "gpusched.io/doctor-snapshot", "version": 1, "nodes": [{}], "pods": []}',
            r"nodes\[0\] has no",
        ),
    ],
)
def test_malformed_snapshot_names_what_is_wrong(tmp_path: Any, text: str, match: str) -> None:
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(SnapshotError, match=match):
        load_snapshot(p)


def test_missing_snapshot_file_is_named(tmp_path: Any) -> None:
    with pytest.raises(SnapshotError, match=r"nope\.json: cannot read"):
        load_snapshot(tmp_path / "nope.json")


def test_saved_snapshot_rebuilds_the_same_books(tmp_path: Any) -> None:
    st = ClusterState(
        [node("n1", 2, taints=(Taint("a", "b"),)), node("n2", 4, model="T4", unhealthy_gpus=frozenset({3}))]
    )
    st.assume(share("s", 300, gpu_memory_mib=1024), 0, [1])
    st.assume(whole("w", 2), 1, [0, 2])
    path = save_snapshot(tmp_path / "snap.json", st, [whole("p")])
    b = Books.of(load_snapshot(path))
    assert {k: (a.node, a.gpus) for k, a in b.state.allocations.items()} == {
        k: (a.node, a.gpus) for k, a in st.allocations.items()
    }
    assert b.state.gpu_free.tolist() == st.gpu_free.tolist()
    assert b.state.nodes[0].taints == st.nodes[0].taints and b.state.nodes[1].unhealthy_gpus == {3}
    assert list(b.pending) == ["default/p"]
    assert parse_snapshot(json.loads(path.read_text())).source == "gpusched simulate"


def test_simulator_snapshot_holds_the_simulated_books(tmp_path: Any) -> None:
    from gpusched.doctor.simsnap import paper_books, save_paper_snapshot
    from gpusched.sim.synthetic import SyntheticConfig
    from gpusched.sim.workload import load_workload

    wl = load_workload(None, None, SyntheticConfig(nodes=20, pods=120, seed=0))
    specs = [p.spec for p in wl.pods]
    path = save_paper_snapshot(tmp_path / "sim.json", wl.nodes, specs, "fgd", 42)
    st, failed = paper_books(wl.nodes, specs, "fgd", 42)
    b = Books.of(load_snapshot(path))
    assert b.state.gpu_free.tolist() == st.gpu_free.tolist() and not b.conflicts
    assert set(b.pending) == {p.key for p in failed} and b.pending
    r = doctor_pod(b, next(iter(b.pending)))
    assert r.reasons and r.counterfactuals  # every pending pod gets reasons and an answer


def test_a_failed_gpu_that_does_not_matter_is_not_named_a_cause() -> None:
    """The pod would not fit on the sick node even were its GPU healthy (the other GPU is held)."""
    st = ClusterState([node("sick", 2, unhealthy_gpus=frozenset({1})), node("n", 2)])
    st.assume(whole("w"), 0, [0])
    st.assume(share("a", 400), 1, [0])
    st.assume(share("b", 400), 1, [1])
    r = doctor_pod(books(st, [whole("p", 2)]), "default/p")
    (f,) = [f for f in r.findings if f.code == "unhealthy-gpu"]
    assert f.level == "scheduling" and f.severity == "info" and "even healthy" in f.message
    assert "unhealthy-gpu" not in r.cause and not any(c.kind == "healthy-gpu" for c in r.counterfactuals)


def test_doctor_reads_the_names_the_node_agent_writes() -> None:
    # The layers keep gpusched.doctor from importing gpusched.agent, so doctor spells the agent's
    # annotation and taint names itself: they must stay the agent's.
    from gpusched.agent import allocation, health, labels
    from gpusched.doctor import checks

    assert checks.ANN_ALLOCATED == allocation.ANN_ALLOCATED
    assert checks.ANN_TOPOLOGY == labels.ANN_TOPOLOGY
    assert checks.ANN_UNHEALTHY == health.ANN_UNHEALTHY_GPUS
    assert checks.TAINT_UNHEALTHY == health.TAINT_UNHEALTHY
