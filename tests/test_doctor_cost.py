"""What made ``doctor`` cheaper at 5000 nodes keeps its answers: the healed books on a copy of
the arrays (not rebuilt pod by pod), each node converted once (findings on the booked spec),
drift checked on the booked pod, the workload computed once."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import k8s_node, node, profile, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.model import PodSpec, Taint
from gpusched.doctor import Books, doctor_cluster, snapshot_of_state
from gpusched.doctor.checks import ANN_UNHEALTHY, drift_findings, node_findings
from gpusched.doctor.counterfactual import feasible_nodes, healed
from gpusched.doctor.snapshot import Snapshot


def rebuilt_healthy(snap: ClusterState) -> ClusterState:
    """The books rebuilt with every GPU healthy, pod by pod (what doctor did before)."""
    out = ClusterState([replace(n, unhealthy_gpus=frozenset()) for n in snap.nodes])
    for a in snap.allocations.values():
        out.assume(a.pod, a.node, a.gpus, check=False)
    return out


@st.composite
def sick_clusters(draw: st.DrawFn) -> tuple[ClusterState, list[PodSpec]]:
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        gpus = draw(st.integers(0, 4))
        bad = draw(st.sets(st.integers(0, gpus - 1), max_size=gpus)) if gpus else set()
        nodes.append(replace(node(f"n{i}", gpus), unhealthy_gpus=frozenset(bad)))
    snap = ClusterState(nodes)
    for k in range(draw(st.integers(0, 8))):
        i = draw(st.integers(0, n - 1))
        if not snap.gpu_count[i]:
            continue
        g = draw(st.integers(0, int(snap.gpu_count[i]) - 1))
        milli = draw(st.sampled_from([250, 500, 1000]))
        if snap.gpu_free[i, g] >= milli:  # on failed GPUs too: pods stay where they run
            snap.assume(share(f"s{k}", milli) if milli < 1000 else whole(f"s{k}"), i, [g], check=False)
    asks = [share("p", draw(st.sampled_from([250, 500, 750]))), whole("q", draw(st.integers(1, 3)))]
    return snap, asks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sick_clusters())
def test_healed_books_on_a_copy_fit_as_rebuilt_books(
    case: tuple[ClusterState, list[PodSpec]],
) -> None:
    snap, asks = case
    before = snap.gpu_exists.copy(), snap.gpu_free.copy(), dict(snap.allocations)
    fresh = healed(snap)
    rebuilt = rebuilt_healthy(snap)
    prof = profile("default", asks)
    for pod in asks:
        assert feasible_nodes(prof, pod, fresh) == feasible_nodes(prof, pod, rebuilt)
    assert (fresh.gpu_exists == rebuilt.gpu_exists).all() and not fresh.any_unhealthy
    assert not fresh.verify()
    # the books it was made from are untouched
    assert (snap.gpu_exists == before[0]).all() and (snap.gpu_free == before[1]).all()
    assert snap.allocations == before[2]
    assert snap.any_unhealthy == any(n.unhealthy_gpus for n in snap.nodes)


def test_node_findings_on_the_booked_spec_are_those_of_the_object() -> None:
    st_ = ClusterState(
        [node("a", 2), node("b", 4, taints=(Taint("dedicated", "ml"),)), node("cpu"), node("c", 2)]
    )
    st_.assume(whole("w"), 0, [0])
    snap = snapshot_of_state(st_, [whole("p")])
    nodes = [dict(n) for n in snap.nodes]
    nodes[3] = {**nodes[3], "metadata": {**nodes[3]["metadata"], "annotations": {ANN_UNHEALTHY: "1"}}}
    unreadable = k8s_node("broken", gpus=2)
    unreadable["metadata"]["annotations"] = {ANN_UNHEALTHY: "one"}  # not GPU indices: cannot be booked
    b = Books.of(Snapshot([*nodes, unreadable], list(snap.pods), "test"))
    assert "node/broken" in b.invalid and b.node_spec("broken") is None
    for obj in b.snapshot.nodes:
        name = obj["metadata"]["name"]
        assert b.node_findings(name) == node_findings(obj), name
        assert b.node_findings(name) is b.node_findings(name)  # computed once
    assert "node-unreadable" in {f.code for f in b.node_findings("broken")}
    assert "unhealthy-gpu" in {f.code for f in b.node_findings("c")}


def test_drift_on_the_booked_pod_is_drift_on_the_object() -> None:
    st_ = ClusterState([node("a", 2)])
    st_.assume(whole("w"), 0, [1])
    st_.assume(share("s", 300), 0, [0])
    b = Books.of(snapshot_of_state(st_))
    for key, a in b.state.allocations.items():
        obj, nobj = b.pod_objs[key], b.node_objs["a"]
        assert drift_findings(obj, nobj, a.pod) == drift_findings(obj, nobj)
    assert doctor_cluster(b).findings == doctor_cluster(Books.of(snapshot_of_state(st_))).findings


def test_the_workload_is_computed_once() -> None:
    st_ = ClusterState([node("a", 2)])
    st_.assume(share("s", 300), 0, [0])
    b = Books.of(snapshot_of_state(st_, [whole("p")]))
    assert b.workload is b.workload
    assert b.profile is b.profile


def test_the_bench_times_each_step_and_finds_the_moves() -> None:
    from gpusched.doctor.bench import bench_doctor

    r = bench_doctor(30, repeat=1)
    assert r["pods"] == 30 * 8 + 1
    assert set(r["cpu_seconds"]) <= set(r["seconds"]) and len(r["cpu_seconds"]) == 3
    assert "move" in r["counterfactual"]
    assert r["counterfactuals_with_a_failed_gpu"]
