"""gpusched.k8s.convert and gpusched.k8s.state.LiveCluster, without a control plane."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from builders import k8s_node, k8s_pod
from gpusched.core.model import PodSpec
from gpusched.k8s.convert import (
    ANN_ASSIGNMENT,
    ANN_MODELS,
    InvalidRequest,
    assignment_annotation,
    node_from_k8s,
    parse_assignment,
    pod_from_k8s,
)
from gpusched.k8s.podevents import parse_pod_event
from gpusched.k8s.queue import SchedulingQueue
from gpusched.k8s.state import LiveCluster


def node(name: str, gpus: int = 8, cpu: str = "64", mem: str = "256Gi", **labels: str) -> dict[str, Any]:
    return k8s_node(name, gpus, cpu=cpu, mem=mem, labels=labels)


def pod(
    name: str,
    res: dict[str, str] | None = None,
    *,
    node_name: str = "",
    gpus: tuple[int, ...] | None = None,
    ann: dict[str, str] | None = None,
    ns: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    """``builders.k8s_pod``; bound to ``node_name`` with ``gpus``, it carries their assignment."""
    obj = k8s_pod(name, res, node_name=node_name, ns=ns, annotations=ann, **spec)
    if node_name and gpus is not None:
        obj["metadata"]["annotations"][ANN_ASSIGNMENT] = assignment_annotation(
            node_name, gpus, pod_from_k8s(obj)
        )
    return obj


# ------------------------------------------------------------------ convert
def test_quantities() -> None:
    p = pod_from_k8s(pod("a", {"cpu": "500m", "memory": "1Gi"}))
    assert (p.cpu_milli, p.memory_mib, p.num_gpu) == (500, 1024, 0)
    p = pod_from_k8s(pod("b", {"cpu": "1.5", "memory": "1G"}))
    assert (p.cpu_milli, p.memory_mib) == (1500, 954)  # 10^9 bytes, rounded up to MiB


def test_whole_gpus_and_shares() -> None:
    p = pod_from_k8s(pod("w", {"nvidia.com/gpu": "2"}))
    assert (p.num_gpu, p.gpu_milli, p.gpu_memory_mib) == (2, 1000, 0)
    p = pod_from_k8s(pod("s", {"gpusched.io/gpu-milli": "300"}))
    assert (p.num_gpu, p.gpu_milli) == (1, 300) and p.is_share
    p = pod_from_k8s(pod("m", {"gpusched.io/gpu-memory": "4096"}))
    assert (p.num_gpu, p.gpu_milli, p.gpu_memory_mib) == (1, 0, 4096)
    p = pod_from_k8s(pod("ms", {"gpusched.io/gpu-milli": "300", "gpusched.io/gpu-memory": "4096"}))
    assert (p.num_gpu, p.gpu_milli, p.gpu_memory_mib) == (1, 300, 4096) and p.is_share


@pytest.mark.parametrize("num", [1, 2, 8])
def test_whole_gpus_with_a_memory_figure_are_whole_gpus(num: int) -> None:
    """nvidia.com/gpu: N + gpu-memory is N whole GPUs of at least that much memory (NVIDIA's device
    plugin hands out whole devices): 1000 milli each, never a share by memory."""
    p = pod_from_k8s(pod("wm", {"nvidia.com/gpu": str(num), "gpusched.io/gpu-memory": "10000"}))
    assert (p.num_gpu, p.gpu_milli, p.gpu_memory_mib) == (num, 1000, 10000)
    assert p.is_whole and not p.is_share and p.gpu_demand_milli == 1000 * num
    assert p.gpu_memory_booked(15360) == 15360  # books the whole GPU's memory, not 10000
    # with gpu-milli 1000 it says the same; limits stand in for requests as for every resource
    both = pod(
        "wmm",
        {"nvidia.com/gpu": str(num), "gpusched.io/gpu-milli": "1000", "gpusched.io/gpu-memory": "10000"},
    )
    assert pod_from_k8s(both).shape() == replace(p, name="wmm").shape()
    obj = pod("l")
    obj["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "10000"}
    }
    assert (pod_from_k8s(obj).num_gpu, pod_from_k8s(obj).gpu_milli) == (1, 1000)


def test_assignment_of_a_whole_gpu_with_memory_says_1000_milli() -> None:
    core = pod_from_k8s(pod("wm", {"nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "10000"}))
    raw = assignment_annotation("n1", (0,), core)
    assert json.loads(raw) == {"node": "n1", "gpus": [0], "milli": 1000, "memoryMiB": 10000}
    obj = pod("wm", {"nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "10000"}, ann={ANN_ASSIGNMENT: raw})
    assert parse_assignment(obj) == ("n1", (0,))


def test_limits_stand_in_for_requests() -> None:
    obj = pod("l")
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}
    p = pod_from_k8s(obj)
    assert (p.num_gpu, p.cpu_milli) == (1, 2000)


def test_models_annotation() -> None:
    p = pod_from_k8s(pod("m", {"nvidia.com/gpu": "1"}, ann={ANN_MODELS: "A100-SXM4-80GB|T4"}))
    assert p.gpu_models == frozenset({"A100-SXM4-80GB", "T4"})
    with pytest.raises(InvalidRequest, match=r"pod default/bad annotation gpusched.io/gpu-models"):
        pod_from_k8s(pod("bad", {"nvidia.com/gpu": "1"}, ann={ANN_MODELS: "not a model!"}))


@pytest.mark.parametrize(
    ("res", "match"),
    [
        (
            {"gpusched.io/gpu-milli": "3000"},
            r"pod default/x: gpusched.io/gpu-milli 3000 is more than one GPU",
        ),
        ({"nvidia.com/gpu": "1.5"}, r"pod default/x containers\[0\] nvidia.com/gpu|must be a whole number"),
        ({"cpu": "lots"}, r"pod default/x containers\[0\] cpu: 'lots' is not a Kubernetes quantity"),
        ({"nvidia.com/gpu": "2", "gpusched.io/gpu-milli": "500"}, r"pod default/x: a GPU share .* needs"),
        (
            {"nvidia.com/gpu": "1", "gpusched.io/gpu-milli": "300"},
            r"pod default/x: a GPU share \(gpusched.io/gpu-milli 300\) needs no nvidia.com/gpu: "
            r"nvidia.com/gpu 1 is 1 whole GPU",
        ),
        ({"gpusched.io/gpu-milli": "0"}, r"pod default/x: gpusched.io/gpu-milli must be 1–1000, got 0"),
        (
            {"gpusched.io/gpu-milli": "0", "gpusched.io/gpu-memory": "4096"},
            r"pod default/x: gpusched.io/gpu-milli must be 1–1000, got 0",
        ),
        (
            {"nvidia.com/gpu": "1", "gpusched.io/gpu-milli": "0"},
            r"pod default/x: gpusched.io/gpu-milli must be 1–1000, got 0",
        ),
        (
            {"gpusched.io/gpu-memory": "0"},
            r"pod default/x: gpusched.io/gpu-memory must be at least 1 \(MiB\), got 0",
        ),
        ({"nvidia.com/gpu": "-1"}, r"pod default/x containers\[0\] nvidia.com/gpu: '-1' is negative"),
    ],
)
def test_invalid_requests_name_pod_and_field(res: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        pod_from_k8s(pod("x", res))


def test_running_pods_are_booked_as_the_kubelet_admitted_them() -> None:
    """What the scheduler refuses to place, it still books in full once the API shows it bound
    (an older gpusched placed it, or another scheduler): never less than the kubelet hands out."""
    running = {"metadata": {"name": "r", "namespace": "default"}, "spec": {"nodeName": "n1"}}

    def bound(res: dict[str, str]) -> PodSpec:
        obj = json.loads(json.dumps(running))
        obj["spec"]["containers"] = [{"name": "c", "resources": {"requests": res}}]
        return pod_from_k8s(obj, constraints="lenient")

    p = bound({"nvidia.com/gpu": "1", "gpusched.io/gpu-milli": "300"})
    assert (p.num_gpu, p.gpu_milli) == (1, 1000)  # the kubelet gave it a whole GPU
    p = bound({"cpu": "1", "gpusched.io/gpu-milli": "0"})
    assert (p.num_gpu, p.gpu_milli, p.cpu_milli) == (0, 0, 1000)
    p = bound({"nvidia.com/gpu": "1", "gpusched.io/gpu-memory": "10000"})
    assert (p.num_gpu, p.gpu_milli, p.gpu_memory_mib) == (1, 1000, 10000)


def test_init_containers_and_overhead() -> None:
    obj = pod("i", {"cpu": "1", "nvidia.com/gpu": "1"})
    obj["spec"]["initContainers"] = [
        {"name": "i1", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "2"}}},
        {"name": "i2", "resources": {"requests": {"cpu": "2"}}},
    ]
    obj["spec"]["overhead"] = {"cpu": "250m", "memory": "64Mi"}
    p = pod_from_k8s(obj)
    assert (p.cpu_milli, p.num_gpu, p.memory_mib) == (4250, 2, 64)  # max(sum, largest init) + overhead


def test_node_from_k8s() -> None:
    n = node_from_k8s(node("n1", gpus=4, cpu="32", mem="128Gi"))
    assert (n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_model, n.gpu_memory_mib) == (
        32000, 131072, 4, "A100", 40960,
    )  # fmt: skip
    cordoned = node("n2")
    cordoned["spec"] = {"unschedulable": True}
    assert any(t.key == "node.kubernetes.io/unschedulable" for t in node_from_k8s(cordoned).taints)
    cpu_only = node_from_k8s(node("n3", gpus=0))
    assert (cpu_only.gpu_count, cpu_only.gpu_model) == (0, "")


def test_assignment_roundtrip_and_invalid() -> None:
    core = PodSpec("p", num_gpu=2, gpu_milli=1000)
    obj = {
        "metadata": {"name": "p", "annotations": {ANN_ASSIGNMENT: assignment_annotation("n1", (3, 5), core)}}
    }
    assert parse_assignment(obj) == ("n1", (3, 5))
    assert json.loads(obj["metadata"]["annotations"][ANN_ASSIGNMENT])["milli"] == 1000
    assert parse_assignment({"metadata": {"name": "p"}}) is None
    with pytest.raises(InvalidRequest, match=r"default/p: annotation gpusched\.io/assignment is not valid"):
        parse_assignment({"metadata": {"name": "p", "annotations": {ANN_ASSIGNMENT: "{nope"}}})


# --------------------------------------------------------------- LiveCluster
def books(lc: LiveCluster) -> dict[str, tuple[str, tuple[int, ...]]]:
    with lc.live_books() as st:
        assert st.verify() == []
        return {k: (st.names[a.node], a.gpus) for k, a in st.allocations.items()}


def test_bound_pods_with_annotations_rebuild_the_same_books() -> None:
    objs = [
        pod("a", {"nvidia.com/gpu": "2"}, node_name="n1", gpus=(6, 7)),
        pod("b", {"gpusched.io/gpu-milli": "500"}, node_name="n1", gpus=(3,)),
        pod("c", {"cpu": "2"}, node_name="n2"),
    ]
    lc = LiveCluster()
    for n in (node("n1"), node("n2")):
        lc.upsert_node(n)
    for o in objs:
        lc.upsert_pod(o)
    want = {"default/a": ("n1", (6, 7)), "default/b": ("n1", (3,)), "default/c": ("n2", ())}
    assert books(lc) == want
    restarted = LiveCluster()  # a restart: same objects, fresh process, pods first this time
    for o in reversed(objs):
        restarted.upsert_pod(o)
    for n in (node("n2"), node("n1")):
        restarted.upsert_node(n)
    assert books(restarted) == want


def test_pods_without_annotation_get_gpus_left_over() -> None:
    lc = LiveCluster()
    lc.upsert_node(node("n1", gpus=2))
    lc.upsert_pod(pod("mine", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(0,)))
    lc.upsert_pod(pod("theirs", {"nvidia.com/gpu": "1"}, node_name="n1"))
    assert books(lc) == {"default/mine": ("n1", (0,)), "default/theirs": ("n1", (1,))}
    assert lc.conflicts == []


def test_node_removal_and_readd() -> None:
    lc = LiveCluster()
    lc.upsert_node(node("n1"))
    lc.upsert_pod(pod("a", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(4,)))
    lc.delete_node("n1")
    assert books(lc) == {}
    lc.upsert_node(node("n1"))
    assert books(lc) == {"default/a": ("n1", (4,))}
    lc.upsert_node(node("n1", gpus=8, cpu="32"))  # changed: rebuilt, pod kept
    assert books(lc) == {"default/a": ("n1", (4,))}


def test_assume_forget_and_bound_event() -> None:
    lc = LiveCluster()
    lc.upsert_node(node("n1"))
    spec = pod_from_k8s(pod("p", {"nvidia.com/gpu": "1"}))
    with lc.live_books() as st:
        lc.assume(spec, st.index["n1"], (2,))
    assert lc.is_bound_or_assumed("default/p")
    lc.upsert_pod(pod("p", {"nvidia.com/gpu": "1"}))  # a pending update (e.g. a status patch) keeps it
    assert books(lc) == {"default/p": ("n1", (2,))}
    lc.forget("default/p")
    assert books(lc) == {} and not lc.is_bound_or_assumed("default/p")
    with lc.live_books() as st:
        lc.assume(spec, st.index["n1"], (2,))
    lc.upsert_pod(pod("p", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(2,)))  # the informer: bound
    lc.forget("default/p")  # too late to forget: it is bound
    assert books(lc) == {"default/p": ("n1", (2,))}
    lc.delete_pod("default/p")
    assert books(lc) == {}


def test_terminal_pods_release_and_terminating_pods_hold_until_deleted() -> None:
    lc = LiveCluster()
    lc.upsert_node(node("n1"))
    done = pod("d", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(0,))
    lc.upsert_pod(done)
    done = json.loads(json.dumps(done))
    done["status"]["phase"] = "Succeeded"
    lc.upsert_pod(done)
    assert books(lc) == {}
    going = pod("g", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(1,))
    lc.upsert_pod(going)
    going = json.loads(json.dumps(going))
    going["metadata"]["deletionTimestamp"] = "2026-12-02T17:00:00Z"  # still running its grace period
    lc.upsert_pod(going)
    assert books(lc) == {"default/g": ("n1", (1,))}
    lc.delete_pod("default/g")  # the informer's DELETED event
    assert books(lc) == {}
    pending = pod("p", {"nvidia.com/gpu": "1"})
    pending["metadata"]["deletionTimestamp"] = "2026-12-02T17:00:00Z"
    lc.upsert_pod(pending)  # never bound: holds nothing
    assert books(lc) == {}


def test_relist_sync_drops_vanished_objects() -> None:
    lc = LiveCluster()
    objs = [pod("a", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(0,)), pod("b", {}, node_name="n2")]
    for n in (node("n1"), node("n2")):
        lc.upsert_node(n)
    for o in objs:
        lc.upsert_pod(o)
    lc.sync_pods([objs[1]])
    lc.sync_nodes([node("n1")])
    assert lc.node_names() == ["n1"]
    assert books(lc) == {}


# --------------------------------------------------------------------- queue
def test_queue_orders_by_priority_then_creation() -> None:
    q = SchedulingQueue()
    objs = [
        pod("late", {}, priority=0),
        pod("urgent", {}, priority=100),
        pod("early", {}, priority=0),
    ]
    objs[0]["metadata"]["creationTimestamp"] = "2025-01-01T00:00:02Z"
    objs[1]["metadata"]["creationTimestamp"] = "2025-01-01T00:00:03Z"
    objs[2]["metadata"]["creationTimestamp"] = "2025-01-01T00:00:01Z"
    for o in objs:
        q.add_or_update(parse_pod_event(o))
    got = []
    while (qp := q.pop(timeout=0.01)) is not None:
        got.append(qp.key)
        q.done(qp.key, unschedulable=True)
    assert got == ["default/urgent", "default/early", "default/late"]
    assert q.counts()["unschedulable"] == 3
    q.move_all_to_active()
    assert q.counts()["active"] == 3


def test_queue_backoff_and_flush() -> None:
    now = [0.0]
    q = SchedulingQueue(flush_s=30.0, clock=lambda: now[0])
    q.add_or_update(parse_pod_event(pod("p", {})))
    qp = q.pop(timeout=0)
    assert qp is not None
    q.done(qp.key, unschedulable=True)
    now[0] = 5.0
    assert q.pop(timeout=0) is None  # no cluster change, no flush yet
    q.cluster_changed()
    now[0] = 6.0
    assert q.pop(timeout=0) is not None  # backoff (1 s) passed and the cluster changed
    q.done("default/p", unschedulable=True)
    now[0] = 37.0
    assert q.pop(timeout=0) is not None  # periodic flush
    q.done("default/p")
    assert len(q) == 0


def test_bound_pods_that_overcommit_are_booked_anyway() -> None:
    """The API shows them running: the books must hold them, or their GPUs look free."""
    lc = LiveCluster()
    n = node("n1", gpus=1)
    n["status"]["allocatable"]["rdma/hca"] = "1"
    lc.upsert_node(n)
    lc.upsert_pod(pod("a", {"cpu": "1", "nvidia.com/gpu": "1", "rdma/hca": "1"}, node_name="n1", gpus=(0,)))
    lc.upsert_pod(pod("b", {"cpu": "2", "nvidia.com/gpu": "1", "rdma/hca": "1"}, node_name="n1"))
    lc.upsert_pod(pod("c", {"cpu": "4", "example.com/gone": "1"}, node_name="n1"))
    with lc.live_books() as st:
        assert sorted(st.allocations) == ["default/a", "default/b", "default/c"]
        assert int(st.gpu_free[0, 0]) == -1000  # both on the one GPU: overcommitted, not free
        assert st.ext_free[0, st.ext_index["rdma/hca"]] == -1
        assert int(st.cpu_free[0]) == 64_000 - 7_000
        pending = pod_from_k8s(pod("d", {"nvidia.com/gpu": "1"}))
        assert st.check_fits(pending, 0, (0,)) is not None
    assert len(lc.conflicts) == 2 and lc.conflicts[0].startswith("default/b: ")
    lc.delete_pod("default/b")
    lc.delete_pod("default/c")
    with lc.live_books() as st:
        assert int(st.gpu_free[0, 0]) == 0 and st.ext_free[0, st.ext_index["rdma/hca"]] == 0
        assert st.verify() == []


def test_preemption_policy_is_read() -> None:
    assert (
        pod_from_k8s(pod("p", {"nvidia.com/gpu": "1"}, preemptionPolicy="Never")).preemption_policy == "Never"
    )
    assert pod_from_k8s(pod("q", {"nvidia.com/gpu": "1"})).preemption_policy == "PreemptLowerPriority"
    with pytest.raises(InvalidRequest, match="preemptionPolicy 'Always' is not one of"):
        pod_from_k8s(pod("r", {"nvidia.com/gpu": "1"}, preemptionPolicy="Always"))


@pytest.mark.parametrize("value", ["1e999999999", "Infinity", "1e19", "NaN"])
@pytest.mark.parametrize(
    "resource", ["cpu", "memory", "nvidia.com/gpu", "gpusched.io/gpu-memory", "rdma/hca"]
)
def test_absurd_pod_quantities_are_refused_at_once(resource: str, value: str) -> None:
    """``int(Decimal("1e999999999"))`` never returns: a pod carrying it would hang the informer
    thread of either front end. It is refused, naming the field, before any integer is built."""
    import threading

    outcome: list[str] = []

    def convert() -> None:
        try:
            pod_from_k8s(pod("p", {resource: value}))
            outcome.append("accepted")
        except InvalidRequest as e:
            outcome.append(str(e))

    t = threading.Thread(target=convert, daemon=True)
    t.start()
    t.join(20.0)
    assert outcome, f"converting {resource}: {value} did not return"
    assert f"containers[0] {resource}" in outcome[0] and value in outcome[0]


@pytest.mark.parametrize(
    ("value", "movable"), [(None, True), ("true", True), ("false", False), (" False ", False)]
)
def test_the_defrag_annotation_opts_a_pod_out_of_moves(value: str | None, movable: bool) -> None:
    from gpusched.k8s.convert import ANN_DEFRAG

    obj = _defrag_pod({ANN_DEFRAG: value} if value is not None else {})
    assert pod_from_k8s(obj).movable is movable


@pytest.mark.parametrize("value", ["no", "", "0"])
def test_a_malformed_defrag_annotation_names_pod_and_annotation(value: str) -> None:
    from gpusched.k8s.convert import ANN_DEFRAG

    with pytest.raises(InvalidRequest, match=rf"pod default/p: annotation {ANN_DEFRAG} must be"):
        pod_from_k8s(_defrag_pod({ANN_DEFRAG: value}))


def _defrag_pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpusched.io/gpu-milli": "300"}}}]},
    }


def test_a_rebuild_keeps_our_decisions_before_pods_bound_without_an_assignment() -> None:
    """Pods bound by someone else (no assignment annotation) take the GPUs left after the
    decisions still being bound: a rebuild never drops a decision for them."""
    lc = LiveCluster()
    lc.upsert_node(node("n1", gpus=2))
    lc.upsert_pod(pod("c", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(1,)))
    with lc.live_books() as st:
        lc.assume(pod_from_k8s(pod("a", {"gpusched.io/gpu-milli": "500"})), st.index["n1"], (0,))
    lc.upsert_pod(pod("b", {"cpu": "1"}, node_name="n1"))  # no GPU: books in place
    lc.upsert_pod(pod("theirs", {"nvidia.com/gpu": "1"}, node_name="n1"))  # bound elsewhere's way
    lc.rebuild()
    got = books_unchecked(lc)
    assert lc.assumed() == ["default/a"]
    assert got["default/a"] == ("n1", (0,)) and got["default/c"] == ("n1", (1,))


def books_unchecked(lc: LiveCluster) -> dict[str, tuple[str, tuple[int, ...]]]:
    with lc.live_books() as st:
        return {k: (st.names[a.node], a.gpus) for k, a in st.allocations.items()}


def _assumed(lc: LiveCluster, name: str, gpus: tuple[int, ...], **spec: Any) -> PodSpec:
    """Our decision: pod ``name`` (one GPU) assumed on n1 with ``gpus``."""
    decided = pod_from_k8s(pod(name, {"nvidia.com/gpu": "1"}, **spec))
    with lc.live_books() as st:
        lc.assume(decided, st.index["n1"], gpus)
    return decided


def test_our_decision_seen_bound_as_decided_is_not_converted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpusched.k8s.podevents as state  # where the conversion is made

    lc = LiveCluster()
    lc.upsert_node(node("n1"))
    decided = _assumed(lc, "p", (2,))
    converted: list[str] = []
    real = state.pod_from_k8s
    monkeypatch.setattr(
        state, "pod_from_k8s", lambda o, **kw: converted.append(o["metadata"]["name"]) or real(o, **kw)
    )
    lc.upsert_pod(pod("p", {"nvidia.com/gpu": "1"}, node_name="n1", gpus=(2,)))
    assert converted == [] and lc.assumed() == [] and lc.bound_node("default/p") == "n1"
    assert books(lc) == {"default/p": ("n1", (2,))}
    lc.rebuild()  # the books rebuilt from what was seen bound: the decision's spec and GPUs
    assert books(lc) == {"default/p": ("n1", (2,))}
    with lc.live_books() as st:
        assert st.allocations["default/p"].pod is decided
    # bound without an assignment annotation (e.g. by hand): ours stands until a rebuild
    _assumed(lc, "q", (3,))
    lc.upsert_pod(pod("q", {"nvidia.com/gpu": "1"}, node_name="n1"))
    assert converted == [] and books(lc)["default/q"] == ("n1", (3,))


@pytest.mark.parametrize(
    ("seen", "why"),
    [
        ({"node_name": "n2", "gpus": (2,)}, "bound elsewhere"),
        ({"node_name": "n1", "gpus": (5,)}, "other GPUs recorded"),
        ({"node_name": "n1", "gpus": (2,), "uid": "uid-recreated"}, "another pod of the same name"),
    ],
)
def test_a_bound_pod_that_is_not_our_decision_as_decided_is_converted(
    seen: dict[str, Any], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpusched.k8s.podevents as state  # where the conversion is made

    lc = LiveCluster()
    lc.upsert_node(node("n1"))
    lc.upsert_node(node("n2"))
    _assumed(lc, "p", (2,))
    converted: list[str] = []
    real = state.pod_from_k8s
    monkeypatch.setattr(
        state, "pod_from_k8s", lambda o, **kw: converted.append(o["metadata"]["name"]) or real(o, **kw)
    )
    where = {k: v for k, v in seen.items() if k != "uid"}
    obj = pod("p", {"nvidia.com/gpu": "1"}, uid=seen.get("uid", ""), **where)
    lc.upsert_pod(obj)
    assert converted == ["p"], why
    assert books(lc) == {"default/p": (seen["node_name"], seen["gpus"])}, why
    lc.rebuild()  # what was seen bound is this pod as the API has it
    with lc.live_books() as st:
        assert st.allocations["default/p"].pod.uid == obj["metadata"]["uid"], why
