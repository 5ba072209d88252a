"""Hand-computed unit tests of the scheduling core: specs, books, fragmentation, filters, diagnosis,
tie-breaks, device choice and each baseline policy on scenarios small enough to score by hand."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.devices import pick_gpus
from gpusched.core.fragmentation import (
    TargetWorkload,
    TypeKey,
    cluster_fragmentation,
    node_fragmentation,
    placement_frag,
)
from gpusched.core.framework import CycleState, Profile
from gpusched.core.model import GPU_MILLI, InvalidSpec, NodeSpec, PodSpec, Taint, Toleration
from gpusched.core.policies import POLICIES, PolicyContext, make_profile
from gpusched.core.policies.default import DefaultParams, DefaultScore
from gpusched.core.scheduler import ScheduleResult, schedule_one, select_host
from gpusched.core.status import Code, Diagnosis, NodeFailure, Status

NONE: frozenset[str] = frozenset()


def node(
    name: str, gpus: int = 0, cpu: int = 32_000, model: str = "A", gmem: int = 16_384, **kw: object
) -> NodeSpec:
    return NodeSpec(
        name,
        cpu_milli=cpu,
        memory_mib=65_536,
        gpu_count=gpus,
        gpu_model=model if gpus else "",
        gpu_memory_mib=gmem if gpus else 0,
        **kw,
    )  # type: ignore[arg-type]


def share(name: str, milli: int, cpu: int = 0, **kw: object) -> PodSpec:
    return PodSpec(name, cpu_milli=cpu, num_gpu=1, gpu_milli=milli, **kw)  # type: ignore[arg-type]


def whole(name: str, num: int = 1, cpu: int = 0, **kw: object) -> PodSpec:
    return PodSpec(name, cpu_milli=cpu, num_gpu=num, gpu_milli=GPU_MILLI, **kw)  # type: ignore[arg-type]


def profile(policy: str, pods: Sequence[PodSpec]) -> Profile:
    return make_profile(
        policy, PolicyContext(workload=TargetWorkload.from_pods(pods), rng=np.random.default_rng(0))
    )


def with_gpu_free(snap: ClusterState, n: int, free: Sequence[int]) -> ClusterState:
    """Book share pods so that GPU ``i`` of node ``n`` has ``free[i]`` milli left."""
    for i, f in enumerate(free):
        if f < GPU_MILLI:
            snap.assume(share(f"fill-{snap.names[n]}-{i}", GPU_MILLI - f), n, [i])
    assert snap.node_gpu_free(n) == list(free)
    return snap


# ------------------------------------------------------------------------------------------ specs
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "p", "cpu_milli": -1}, "cpu_milli"),
        ({"name": "p", "memory_mib": -5}, "memory_mib"),
        ({"name": "p", "cpu_milli": True}, "cpu_milli"),  # a bool is not an integer amount
        ({"name": "p", "memory_mib": 1.5}, "memory_mib"),
        ({"name": "p", "num_gpu": 1, "gpu_milli": 1200}, "gpu_milli"),
        ({"name": "p", "num_gpu": 1, "gpu_memory_mib": -1}, "gpu_memory_mib"),
        ({"name": "p", "num_gpu": 2, "gpu_milli": 500}, "num_gpu"),  # a share needs num_gpu 1
        ({"name": "p", "num_gpu": 1}, "num_gpu"),  # neither milli nor memory
        ({"name": "p", "gpu_milli": 500}, "num_gpu"),  # milli without GPUs
        ({"name": "p", "num_gpu": 1, "gpu_milli": 500, "gpu_models": frozenset({"A|B"})}, "gpu_models"),
        ({"name": "p", "num_gpu": 1, "gpu_milli": 500, "gpu_models": frozenset({""})}, "gpu_models"),
        ({"name": ""}, "name"),
    ],
)
def test_podspec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec, match=rf"\b{field}\b"):
        PodSpec(**kwargs)  # type: ignore[arg-type]


def test_podspec_accepts_the_valid_shapes() -> None:
    assert share("s", 10).is_share and share("s", 990).gpu_demand_milli == 990
    assert not whole("w", 1).is_share and whole("w", 8).gpu_demand_milli == 8000
    mem_only = PodSpec("m", num_gpu=2, gpu_memory_mib=4096)
    assert mem_only.gpu_demand_milli == 0 and not mem_only.is_share
    assert PodSpec("c", cpu_milli=0).key == "default/c"
    assert PodSpec("c", namespace="ns").key == "ns/c"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "", "cpu_milli": 1, "memory_mib": 1}, "name"),
        ({"name": "n", "cpu_milli": -1, "memory_mib": 1}, "cpu_milli"),
        ({"name": "n", "cpu_milli": 1, "memory_mib": -1}, "memory_mib"),
        ({"name": "n", "cpu_milli": 1, "memory_mib": 1, "gpu_count": -2, "gpu_model": "A"}, "gpu_count"),
        (
            {
                "name": "n",
                "cpu_milli": 1,
                "memory_mib": 1,
                "gpu_count": 1,
                "gpu_model": "A",
                "gpu_memory_mib": -1,
            },
            "gpu_memory_mib",
        ),
        ({"name": "n", "cpu_milli": 1, "memory_mib": 1, "gpu_count": 2}, "gpu_model"),
    ],
)
def test_nodespec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec, match=rf"\b{field}\b"):
        NodeSpec(**kwargs)  # type: ignore[arg-type]


def test_duplicate_node_names_are_refused_by_name() -> None:
    with pytest.raises(InvalidSpec, match=r"duplicate node name 'n1'"):
        ClusterState([node("n0"), node("n1"), node("n2"), node("n1")])


# ------------------------------------------------------------------------------------------ books
def test_accounting_errors_leave_the_books_untouched() -> None:
    snap = ClusterState([node("a", gpus=2, cpu=4000), node("b", gpus=1, model="B")])
    p = share("p", 600, cpu=1000)
    snap.assume(p, 0, [1])
    before = [a.copy() for a in (snap.cpu_free, snap.mem_free, snap.gpu_free, snap.gpu_mem_free)]
    with pytest.raises(AccountingError, match="already assumed on a"):
        snap.assume(p, 1, [0])
    with pytest.raises(AccountingError, match="not assumed"):
        snap.forget("default/nobody")
    with pytest.raises(AccountingError, match="milli free"):
        snap.assume(share("q", 500), 0, [1])  # GPU 1 has 400 left
    with pytest.raises(AccountingError, match="cpu"):
        snap.assume(PodSpec("r", cpu_milli=3001), 0, [])
    with pytest.raises(AccountingError, match="GPU model B"):
        snap.assume(share("s", 100, gpu_models=frozenset({"A"})), 1, [0])
    with pytest.raises(AccountingError, match="has no GPU 1"):
        snap.assume(share("t", 100), 1, [1])  # node b has one GPU; slot 1 is padding
    with pytest.raises(AccountingError, match="repeat"):
        snap.assume(whole("u", 2), 0, [0, 0])
    with pytest.raises(AccountingError, match="asks for 2 GPUs"):
        snap.assume(whole("v", 2), 0, [0])
    for arr, want in zip(
        (snap.cpu_free, snap.mem_free, snap.gpu_free, snap.gpu_mem_free), before, strict=True
    ):
        assert np.array_equal(arr, want)
    assert snap.verify() == [] and list(snap.allocations) == ["default/p"]


def test_gen_moves_on_every_change_of_a_node_only() -> None:
    snap = ClusterState([node("a", gpus=1), node("b", gpus=1)])
    snap.assume(share("p", 100), 1, [0])
    snap.forget("default/p")
    assert snap.gen.tolist() == [0, 2]


# ---------------------------------------------------------------------------------- fragmentation
A1: TypeKey = (1000, 1000, 1, NONE)  # one whole GPU
B1: TypeKey = (1000, 500, 1, NONE)  # half a GPU
C2: TypeKey = (1000, 1000, 2, NONE)  # two whole GPUs
D1: TypeKey = (64_000, 100, 1, NONE)  # needs more CPU than the node has
E1: TypeKey = (1000, 100, 1, frozenset({"B"}))  # model B only


def test_target_workload_keeps_the_popular_types_and_renormalises() -> None:
    tw = TargetWorkload.from_counts(Counter({A1: 6, B1: 3, C2: 1}), coverage=0.9)
    assert tw.keys == (A1, B1)  # 6 + 3 = 9 >= 0.9 * 10
    np.testing.assert_allclose(tw.p, [2 / 3, 1 / 3])
    assert tw.cpu.tolist() == [1000, 1000] and tw.milli.tolist() == [1000, 500] and tw.num.tolist() == [1, 1]
    # equal counts: the larger type first (descending cpu, milli, num)
    tw2 = TargetWorkload.from_counts(Counter({B1: 2, A1: 2}), coverage=0.5)
    assert tw2.keys == (A1,)
    with pytest.raises(ValueError, match="at least one pod"):
        TargetWorkload.from_counts(Counter())


def test_fgd_fragment_of_a_hand_made_node() -> None:
    snap = with_gpu_free(ClusterState([node("n0", gpus=4), node("cpu-only")]), 0, [1000, 1000, 500, 200])
    tw = TargetWorkload.from_counts(Counter({A1: 4, B1: 2, C2: 1, D1: 1}), coverage=1.0)
    np.testing.assert_allclose(tw.p, [0.5, 0.25, 0.125, 0.125])
    # Free milli per GPU [1000, 1000, 500, 200], 32 cores free, total 2700:
    #   A1 (1×1000, p=.5):   two GPUs fit; slivers below 1000: 500 + 200     -> 700
    #   B1 (1×500,  p=.25):  three GPUs fit; sliver below 500: 200           -> 200
    #   C2 (2×1000, p=.125): two whole GPUs fit; slivers 500 + 200           -> 700
    #   D1 (64 cores, p=.125): does not fit (CPU): all idle milli            -> 2700
    #   F = .5·700 + .25·200 + .125·700 + .125·2700 = 350 + 50 + 87.5 + 337.5 = 825
    # The node without GPUs has no idle GPU milli: 0.
    np.testing.assert_allclose(node_fragmentation(snap, tw), [825.0, 0.0])
    assert cluster_fragmentation(snap, tw) == pytest.approx(825.0)
    # A type limited to model B cannot use this model-A node at all: .5·700 (A1) + .5·2700 (E1) = 1700
    tw_b = TargetWorkload.from_counts(Counter({A1: 1, E1: 1}), coverage=1.0)
    np.testing.assert_allclose(node_fragmentation(snap, tw_b, np.array([0])), [1700.0])


def test_placement_frag_and_fgd_choice_for_a_share_on_the_hand_made_node() -> None:
    snap = with_gpu_free(ClusterState([node("n0", gpus=4)]), 0, [1000, 1000, 500, 200])
    tw = TargetWorkload.from_counts(Counter({A1: 4, B1: 2, C2: 1, D1: 1}), coverage=1.0)
    pod = share("p", 200)
    before, after = placement_frag(snap, pod, np.array([0]), tw)
    # GPU 0 (or 1) 1000 -> 800: A1 fits on GPU 1, slivers 800+500+200 = 1500; B1 sliver 200;
    #   C2 no longer fits (2500 idle); D1 2500  -> .5·1500 + .25·200 + .125·2500 + .125·2500 = 1425
    # GPU 2 500 -> 300: A1 500, B1 500, C2 500, D1 2500 -> 250 + 125 + 62.5 + 312.5 = 750
    # GPU 3 200 -> 0:   A1 500, B1 0,   C2 500, D1 2500 -> 250 + 0 + 62.5 + 312.5 = 625
    np.testing.assert_allclose(before, [825.0])
    np.testing.assert_allclose(after, [[1425.0, 1425.0, 750.0, 625.0]])
    r = schedule_one(make_profile("fgd", PolicyContext(workload=tw)), pod, snap)
    # FGD score = int(100·sigmoid((825 − 625)/1000)) = int(54.98) = 54
    assert r.scheduled and r.gpus == (3,) and r.score == 54.0


def test_placement_frag_marks_misfits_infinite() -> None:
    snap = with_gpu_free(ClusterState([node("n0", gpus=2)]), 0, [1000, 300])
    tw = TargetWorkload.from_counts(Counter({A1: 1}), coverage=1.0)
    _, after = placement_frag(snap, share("p", 400), np.array([0]), tw)
    assert np.isfinite(after[0, 0]) and after[0, 1] == np.inf
    _, after2 = placement_frag(snap, whole("w", 2), np.array([0]), tw)
    assert after2.shape == (1, 1) and after2[0, 0] == np.inf


def test_model_table() -> None:
    snap = ClusterState([node("a", gpus=1, model="A"), node("b", gpus=1, model="B"), node("c")])
    cpu_only: TypeKey = (1000, 0, 0, NONE)
    tw = TargetWorkload.from_counts(Counter({A1: 3, E1: 2, cpu_only: 1}), coverage=1.0)
    t = tw.model_table(snap)
    # rows: models A, B, then "no GPUs"; columns: A1 (any model), E1 (B only), CPU-only (needs no GPU)
    assert t.tolist() == [[True, False, False], [True, True, False], [False, False, False]]
    assert snap.model_id.tolist() == [0, 1, -1]  # -1 reads the last row


def test_fragment_of_memory_only_type_ignores_padding_gpu_slots() -> None:
    snap = ClusterState([node("one", gpus=1), node("eight", gpus=8)])
    tw = TargetWorkload.from_pods([PodSpec("m", num_gpu=4, gpu_memory_mib=1024)])
    # the 4-GPU type does not fit on the 1-GPU node: all its idle milli (1000) is fragment
    np.testing.assert_allclose(node_fragmentation(snap, tw), [1000.0, 0.0])


def test_whole_gpu_closed_form_matches_recomputation_with_memory_only_type() -> None:
    snap = ClusterState([node("n0", gpus=2)])
    tw = TargetWorkload.from_pods([PodSpec("m", num_gpu=2, gpu_memory_mib=1024)])
    pod = whole("w", 1)
    _, after = placement_frag(snap, pod, np.array([0]), tw)
    c = snap.copy()
    c.assume(pod, 0, [0])
    np.testing.assert_allclose(after[:, 0], node_fragmentation(c, tw))  # 1000 vs 0


# ------------------------------------------------------------------------------- diagnosis, status
def crowded() -> ClusterState:
    """n1, n2: model A, 8 cores of which 6 are taken; n3: model B, 32 cores free."""
    snap = ClusterState(
        [node("n1", gpus=1, cpu=8000), node("n2", gpus=1, cpu=8000), node("n3", gpus=1, model="B")]
    )
    snap.assume(PodSpec("busy1", cpu_milli=6000), 0, [])
    snap.assume(PodSpec("busy2", cpu_milli=6000), 1, [])
    return snap


WANTS_A = whole("gpu-a", 1, cpu=4000, gpu_models=frozenset({"A"}))


def test_diagnosis_counts_one_reason_per_node() -> None:
    snap = crowded()
    r = schedule_one(make_profile("bestfit"), WANTS_A, snap, diagnose_failures=True)
    assert not r.scheduled and r.node == -1
    assert r.diagnosis is not None
    assert dict(r.diagnosis.reason_counts()) == {"Insufficient cpu": 2, "GPU model mismatch": 1}
    assert {(f.node, f.plugin) for f in r.diagnosis.failures} == {
        ("n1", "NodeResourcesFit"),
        ("n2", "NodeResourcesFit"),
        ("n3", "GPUFit"),
    }
    msg = r.diagnosis.message()
    assert msg.startswith("0/3 nodes are available: ") and msg.endswith(".")
    assert sorted(msg.removeprefix("0/3 nodes are available: ").removesuffix(".").split(", ")) == [
        "1 GPU model mismatch",
        "2 Insufficient cpu",
    ]
    assert r.status.reasons == (msg,) and r.status.plugin == "Filter"
    # n1 and n2 would take the pod once the busy pods leave: resolvable; n3 never would
    assert r.diagnosis.unresolvable_nodes() == frozenset({"n3"})
    assert r.status.code == Code.UNSCHEDULABLE


def test_diagnosis_message_is_ordered_like_kube_scheduler() -> None:
    r = schedule_one(make_profile("bestfit"), WANTS_A, crowded(), diagnose_failures=True)
    assert r.status.message() == "0/3 nodes are available: 1 GPU model mismatch, 2 Insufficient cpu."


def test_diagnosis_message_format() -> None:
    fails = (
        NodeFailure("a", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
        NodeFailure("b", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
        NodeFailure("c", "Insufficient cpu", Code.UNSCHEDULABLE, "NodeResourcesFit"),
    )
    assert Diagnosis(3, fails).message() == "0/3 nodes are available: 3 Insufficient cpu."
    pre = Status.unschedulable("pod has unbound gang members", "Gang")
    assert (
        Diagnosis(5, (), pre_filter=pre).message() == "0/5 nodes are available: pod has unbound gang members."
    )


def test_all_nodes_unresolvable_gives_unschedulable_and_unresolvable() -> None:
    snap = ClusterState(
        [node("n1", gpus=2, model="B"), node("n2", gpus=2, model="C"), node("n3", gpus=8, model="B")]
    )
    r = schedule_one(make_profile("bestfit"), WANTS_A, snap, diagnose_failures=True)
    assert r.status.message() == "0/3 nodes are available: 3 GPU model mismatch."
    assert r.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    # CPU capacity below the request is unresolvable too
    snap2 = ClusterState([node("small", gpus=1, cpu=2000), node("b", gpus=1, model="B")])
    r2 = schedule_one(make_profile("bestfit"), WANTS_A, snap2, diagnose_failures=True)
    assert r2.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert dict(r2.diagnosis.reason_counts()) == {"Insufficient cpu": 1, "GPU model mismatch": 1}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("pod", "reason", "code"),
    [
        (whole("too-many", 4), "Insufficient GPU count", Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
        (
            share("big-mem", 100, gpu_memory_mib=32_768),
            "Insufficient GPU memory",
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        ),
        (whole("busy", 1), "Insufficient GPU", Code.UNSCHEDULABLE),
        (share("busy-share", 800), "Insufficient GPU share", Code.UNSCHEDULABLE),
        (share("mem-now", 100, gpu_memory_mib=12_000), "Insufficient GPU memory", Code.UNSCHEDULABLE),
        (PodSpec("mem", memory_mib=70_000), "Insufficient memory", Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
    ],
)
def test_gpufit_and_resources_reasons(pod: PodSpec, reason: str, code: Code) -> None:
    snap = ClusterState([node("n", gpus=2)])
    snap.assume(share("half0", 500, gpu_memory_mib=8192), 0, [0])
    snap.assume(share("half1", 500, gpu_memory_mib=8192), 0, [1])
    r = schedule_one(make_profile("bestfit"), pod, snap, diagnose_failures=True)
    assert not r.scheduled
    assert r.status.message() == f"0/1 nodes are available: 1 {reason}."
    assert r.status.code == code


def test_without_diagnosis_no_per_node_reasons() -> None:
    r = schedule_one(make_profile("bestfit"), WANTS_A, crowded(), diagnose_failures=False)
    assert not r.scheduled and r.diagnosis is None
    assert r.status.message().startswith("0/3 nodes are available")


# ------------------------------------------------------------------------------ taints, selectors
TAINTED = Taint("dedicated", "gpu", "NoSchedule")


@pytest.mark.parametrize(
    ("tolerations", "ok"),
    [
        ((), False),
        ((Toleration("dedicated", value="gpu"),), True),
        ((Toleration("dedicated", operator="Exists"),), True),
        ((Toleration(operator="Exists"),), True),  # empty key + Exists tolerates everything
        ((Toleration("dedicated", value="cpu"),), False),
        ((Toleration("other", operator="Exists"),), False),
        ((Toleration("dedicated", value="gpu", effect="NoExecute"),), False),
        ((Toleration("dedicated", value="gpu", effect="NoSchedule"),), True),
        ((Toleration("x", operator="Exists"), Toleration("dedicated", value="gpu")), True),
    ],
)
def test_taints_and_tolerations(tolerations: tuple[Toleration, ...], ok: bool) -> None:
    snap = ClusterState([node("tainted", gpus=1, taints=(TAINTED,))])
    r = schedule_one(make_profile("bestfit"), share("p", 100, tolerations=tolerations), snap)
    assert r.scheduled is ok
    if not ok:
        assert (
            r.status.message() == "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}."
        )
        assert r.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE


@pytest.mark.parametrize(
    ("effect", "blocks"), [("NoSchedule", True), ("NoExecute", True), ("PreferNoSchedule", False)]
)
def test_only_hard_taint_effects_filter(effect: str, blocks: bool) -> None:
    snap = ClusterState([node("t", gpus=1, taints=(Taint("k", "v", effect),))])
    assert schedule_one(make_profile("bestfit"), share("p", 100), snap).scheduled is not blocks


def test_taint_filter_skips_the_tainted_node_for_another() -> None:
    # the tainted node is the best fit (fewer free GPUs) but must be passed over
    snap = ClusterState([node("tainted", gpus=1, taints=(TAINTED,)), node("free", gpus=8)])
    r = schedule_one(make_profile("bestfit"), share("p", 100), snap)
    assert r.node_name == "free"
    r2 = schedule_one(
        make_profile("bestfit"), share("q", 100, tolerations=(Toleration("dedicated", value="gpu"),)), snap
    )
    assert r2.node_name == "tainted"


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        ({}, "a"),  # bestfit: a has fewer GPUs
        ({"zone": "b"}, "b"),
        ({"zone": "a", "tier": "gpu"}, "a"),
        ({"zone": "b", "tier": "gpu"}, None),
        ({"zone": "c"}, None),
    ],
)
def test_node_selector(selector: dict[str, str], want: str | None) -> None:
    snap = ClusterState(
        [node("a", gpus=1, labels={"zone": "a", "tier": "gpu"}), node("b", gpus=8, labels={"zone": "b"})]
    )
    r = schedule_one(make_profile("bestfit"), share("p", 100, node_selector=selector), snap)
    if want is None:
        assert not r.scheduled
        assert (
            r.status.message()
            == "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
        )
        assert r.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    else:
        assert r.node_name == want


# -------------------------------------------------------------------------------------- tie-break
@pytest.mark.parametrize(("tiebreak", "want"), [(None, 0), ([2, 0, 1], 1), ([1, 2, 0], 2), ([0, 1, 2], 0)])
def test_equal_scores_go_to_the_lowest_tiebreak_rank(tiebreak: list[int] | None, want: int) -> None:
    snap = ClusterState([node(f"n{i}", gpus=2) for i in range(3)])
    tb = None if tiebreak is None else np.array(tiebreak, dtype=np.int64)
    r = schedule_one(make_profile("bestfit"), share("p", 500), snap, tiebreak=tb)
    assert r.node == want


def test_tiebreak_ranks_only_feasible_nodes() -> None:
    # n1 has the best rank but is tainted: among n0 (rank 2) and n2 (rank 1), n2 wins
    snap = ClusterState([node("n0", gpus=2), node("n1", gpus=2, taints=(TAINTED,)), node("n2", gpus=2)])
    r = schedule_one(make_profile("bestfit"), share("p", 500), snap, tiebreak=np.array([2, 0, 1]))
    assert r.node == 2


def test_select_host() -> None:
    nodes = np.array([0, 1, 2], dtype=np.int64)
    tb = np.array([9, 3, 0], dtype=np.int64)
    assert select_host(np.array([5.0, 5.0 + 1e-12, 4.0]), nodes, tb) == 1  # 0 and 1 tie; node 2 scores lower
    assert select_host(np.array([5.0, 4.9, 4.0]), nodes, tb) == 0
    assert select_host(np.array([5.0, 5.0, 5.0]), nodes, None) == 0
    # positions index ``nodes``; ranks are looked up by node index
    assert select_host(np.array([1.0, 1.0]), np.array([2, 0], dtype=np.int64), tb) == 0


# ----------------------------------------------------------------------------------------- devices
def test_pick_gpus_best_fit_and_hint() -> None:
    snap = with_gpu_free(ClusterState([node("n", gpus=4)]), 0, [1000, 300, 600, 500])
    pod = share("p", 400)
    assert pick_gpus(snap, pod, 0) == (3,)  # tightest GPU with room: 500 (300 is too small)
    assert pick_gpus(snap, pod, 0, hint=2) == (2,)  # a fitting hint is honoured
    assert pick_gpus(snap, pod, 0, hint=0) == (0,)
    assert pick_gpus(snap, pod, 0, hint=1) == (3,)  # a hint that does not fit is ignored
    assert pick_gpus(snap, share("q", 600), 0) == (2,)
    assert pick_gpus(snap, whole("w", 1), 0) == (0,)
    assert pick_gpus(snap, PodSpec("c"), 0) == ()
    with pytest.raises(ValueError, match="does not fit"):
        pick_gpus(snap, whole("w2", 2), 0)


def test_pick_gpus_breaks_milli_ties_by_least_free_memory_then_index() -> None:
    snap = ClusterState([node("n", gpus=3)])
    snap.assume(PodSpec("m", num_gpu=1, gpu_memory_mib=8192), 0, [2])  # GPU 2: 1000 milli, 8192 MiB left
    assert pick_gpus(snap, share("p", 100, gpu_memory_mib=4096), 0) == (2,)
    assert pick_gpus(snap, share("q", 100, gpu_memory_mib=10_000), 0) == (0,)  # GPU 2 lacks memory
    # whole GPUs: never GPU 2, which a share by memory holds (a whole GPU shares with nothing)
    assert pick_gpus(snap, whole("w", 2), 0) == (0, 1)
    snap.assume(share("s", 300, gpu_memory_mib=8192), 0, [0])  # GPU 0: 700 milli, 8192 MiB left
    # shares: the least free milli first (GPU 0), then the least free memory (GPU 2 before GPU 1)
    assert pick_gpus(snap, share("t", 700), 0) == (0,)
    assert pick_gpus(snap, share("u", 800), 0) == (2,)


# --------------------------------------------------------------------------------------- policies
def test_bestfit_prefers_least_leftover() -> None:
    snap = ClusterState([node("big", gpus=8), node("small", gpus=2)])
    r = schedule_one(profile("bestfit", [whole("w", 1, cpu=1000)]), whole("w", 1, cpu=1000), snap)
    # leftover: big 0.5·31000/128000 + 0.5·7000/8000 = .5586 -> 44; small 0.5·.2422 + 0.5·.125 = .1836 -> 81
    assert r.node_name == "small" and r.score == 81.0


def test_bestfit_counts_gpu_leftover_for_a_cpu_pod_but_dotprod_does_not() -> None:
    # cpu-rich node without GPUs vs a node with few free cores and 8 idle GPUs; a CPU-only pod
    snap = ClusterState([node("gpus", gpus=8, cpu=16_000), node("cpus", cpu=64_000)])
    pod = PodSpec("c", cpu_milli=8000)
    # bestfit: gpus .5·8000/128000 + .5·8000/8000 = .53 -> 46; cpus .5·56000/128000 = .22 -> 78
    r = schedule_one(profile("bestfit", [pod]), pod, snap.copy())
    assert (r.node_name, r.score) == ("cpus", 78.0)
    # dotprod (only along the request): gpus (16000/128000)(8000/128000)/2 = .0039 -> 99; cpus .0156 -> 98
    r = schedule_one(profile("dotprod", [pod]), pod, snap.copy())
    assert (r.node_name, r.score) == ("gpus", 99.0)


def test_dotprod_prefers_least_free_along_the_request() -> None:
    snap = ClusterState([node("roomy", gpus=4, cpu=64_000), node("tight", gpus=2, cpu=8000)])
    pod = whole("w", 1, cpu=4000)
    # roomy: (.5·.03125 + .5·.125)/2 = .0391 -> 96; tight: (.0625·.03125 + .25·.125)/2 = .0166 -> 98
    r = schedule_one(profile("dotprod", [pod]), pod, snap)
    assert (r.node_name, r.score) == ("tight", 98.0)


def test_packing_prefers_a_partially_used_gpu() -> None:
    snap = with_gpu_free(ClusterState([node("idle", gpus=2), node("used", gpus=2)]), 1, [1000, 600])
    r = schedule_one(profile("packing", [share("s", 300)]), share("s", 300), snap)
    # used: the GPU with 600 free -> max(100 − 60/10, 50) = 94; idle node: max(33 − 2, 2) = 31
    assert (r.node_name, r.gpus, r.score) == ("used", (1,), 94.0)
    # a whole GPU: a used node (max(50 − 1, 33) = 49) before an idle one (31)
    r2 = schedule_one(profile("packing", [whole("w")]), whole("w"), snap)
    assert (r2.node_name, r2.gpus, r2.score) == ("used", (0,), 49.0)


def test_clustering_prefers_a_node_hosting_the_same_class() -> None:
    snap = ClusterState([node("shares", gpus=2), node("wholes", gpus=2), node("empty", gpus=2)])
    snap.assume(share("s0", 500), 0, [0])
    snap.assume(whole("w0"), 1, [0])
    snap.assume(PodSpec("c0", cpu_milli=1000), 2, [])  # CPU-only pods are no class
    # base = 25·(8000 − free)//8000: shares 20, wholes 21, empty 18;
    # bonus: 75 same class only, 25 no class, 0 other classes
    r = schedule_one(profile("clustering", [share("s", 200)]), share("s1", 200), snap)
    assert (r.node_name, r.score) == ("shares", 95.0)
    r2 = schedule_one(profile("clustering", [whole("w")]), whole("w1"), snap)
    assert (r2.node_name, r2.score) == ("wholes", 96.0)
    r3 = schedule_one(profile("clustering", [whole("w", 2)]), whole("w2", 2), snap)
    assert (r3.node_name, r3.score) == ("empty", 43.0)  # the only node with two free GPUs: 25 + 18


def test_fgd_keeps_whole_gpus_free_for_a_whole_gpu_workload() -> None:
    workload = [whole(f"w{i}") for i in range(5)]
    fgd = profile("fgd", workload)
    snap = with_gpu_free(ClusterState([node("idle", gpus=2), node("used", gpus=2)]), 1, [500, 1000])
    # used: F_before = 500 (GPU 0's sliver); 300 on GPU 0 -> 200: Δ = −300 -> int(100·σ(.3)) = 57;
    #   on GPU 1 -> 700: no whole GPU left, F = 1200: Δ = +700 -> 33. idle: F 0 -> 700 -> 33
    r = schedule_one(fgd, share("s", 300), snap)
    assert (r.node_name, r.gpus, r.score) == ("used", (0,), 57.0)
    # used is now [200, 1000]: a second 300 would break its whole GPU (Δ +700 -> 33), as on idle (33): a tie,
    # idle by rank, GPU 0. The third stacks onto idle's GPU 0 (700 -> 400: Δ −300 -> 57), not its GPU 1 (33)
    for name in ("t0", "t1"):
        r = schedule_one(fgd, share(name, 300), snap, tiebreak=np.array([0, 1]))
        assert (r.node_name, r.gpus) == ("idle", (0,))
    assert snap.node_gpu_free(0) == [400, 1000] and snap.node_gpu_free(1) == [200, 1000]
    assert all(schedule_one(fgd, whole(f"x{i}"), snap).scheduled for i in range(2))


def test_fgd_leaves_no_sliver_that_the_workload_cannot_use_where_bestfit_would() -> None:
    # workload: half-GPU shares only. GPUs free [1000, 600]; a 500 share:
    #   GPU 1 (best fit) 600 -> 100 leaves a 100 sliver no 500-share can use: Δ = +100 -> int(100·σ(−.1)) = 47
    #   GPU 0 1000 -> 500 still takes a 500-share: Δ = 0 -> 50
    workload = [share(f"h{i}", 500) for i in range(4)]
    snap = with_gpu_free(ClusterState([node("n", gpus=2)]), 0, [1000, 600])
    r = schedule_one(profile("fgd", workload), share("p", 500), snap.copy())
    assert (r.gpus, r.score) == ((0,), 50.0)
    assert schedule_one(profile("bestfit", workload), share("p", 500), snap.copy()).gpus == (1,)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_a_pod_only_where_it_fits(policy: str) -> None:
    snap = ClusterState([node("a", gpus=1, model="B"), node("b", gpus=4, cpu=2000), node("c", gpus=2)])
    snap.assume(whole("taken"), 2, [1])
    pods = [
        whole("w", 1, cpu=4000, gpu_models=frozenset({"A"})),
        share("s", 700, cpu=4000),
        PodSpec("c", cpu_milli=100),
    ]
    prof = profile(policy, pods)
    r = schedule_one(prof, pods[0], snap)
    assert (r.node_name, r.gpus) == ("c", (0,))  # only c has CPU and a free model-A GPU
    r = schedule_one(prof, pods[1], snap)
    assert r.node_name == "a"  # c is full now, b lacks CPU
    assert schedule_one(prof, pods[2], snap).scheduled
    assert snap.verify() == []


def test_unknown_policy_and_missing_workload() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_profile("nope")
    for policy in ("fgd", "default"):
        with pytest.raises(ValueError, match="needs a target workload"):
            make_profile(policy)


def test_default_score_cache_key_distinguishes_configurations() -> None:
    snap = with_gpu_free(ClusterState([node("a", gpus=2), node("b", gpus=2)]), 0, [700, 1000])
    pod = share("p", 200)
    tw = TargetWorkload.from_pods([pod])
    plain, sliver = DefaultScore(tw), DefaultScore(tw, DefaultParams(deficit_weight=50.0))
    idx = np.arange(2, dtype=np.int64)
    plain.score(CycleState(), pod, snap, idx)
    got = sliver.score(CycleState(), pod, snap, idx).scores
    want = sliver.score(CycleState(), pod, snap.copy(), idx).scores
    np.testing.assert_allclose(got, want)


# ------------------------------------------------------------------------ framework extension points
class Recorder:
    def __init__(
        self, name: str, log: list[str], reserve_ok: bool = True, permit: Code = Code.SUCCESS
    ) -> None:
        self.name, self.log, self.reserve_ok, self.permit_code = name, log, reserve_ok, permit

    def reserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> Status:
        self.log.append(f"reserve {self.name}")
        return Status.success() if self.reserve_ok else Status.unschedulable("no", self.name)

    def unreserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> None:
        self.log.append(f"unreserve {self.name}")

    def permit(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> Status:
        self.log.append(f"permit {self.name} assumed={pod.key in snap.allocations}")
        return Status(self.permit_code, ("denied",), self.name)


def _with(reserves: Sequence[Recorder], permits: Sequence[Recorder]) -> Profile:
    base = make_profile("bestfit")
    return Profile("t", filters=base.filters, scores=base.scores, reserves=reserves, permits=permits)


def test_permit_rejection_forgets_and_unreserves_in_reverse() -> None:
    log: list[str] = []
    snap = ClusterState([node("n", gpus=1)])
    prof = _with([Recorder("r1", log), Recorder("r2", log)], [Recorder("p", log, permit=Code.UNSCHEDULABLE)])
    r = schedule_one(prof, share("s", 100), snap)
    assert not r.scheduled and r.status.plugin == "p" and r.feasible_nodes == 1
    assert log == ["reserve r1", "reserve r2", "permit p assumed=True", "unreserve r2", "unreserve r1"]
    assert snap.allocations == {} and snap.node_gpu_free(0) == [1000] and snap.verify() == []


def test_reserve_failure_unreserves_the_earlier_ones() -> None:
    log: list[str] = []
    snap = ClusterState([node("n", gpus=1)])
    prof = _with([Recorder("r1", log), Recorder("r2", log, reserve_ok=False), Recorder("r3", log)], [])
    r = schedule_one(prof, share("s", 100), snap)
    assert not r.scheduled and r.status.plugin == "r2"
    assert log[:2] == ["reserve r1", "reserve r2"] and "reserve r3" not in log
    assert log[-1] == "unreserve r1"  # rolled back, last in first out
    assert snap.allocations == {}


def test_permit_wait_keeps_the_pod_assumed_and_assume_false_books_nothing() -> None:
    log: list[str] = []
    snap = ClusterState([node("n", gpus=1)])
    r = schedule_one(_with([], [Recorder("p", log, permit=Code.WAIT)]), share("s", 100), snap)
    assert not r.scheduled and r.status.code == Code.WAIT and r.waiting is not None
    assert snap.node_gpu_free(0) == [900]
    r2 = schedule_one(make_profile("bestfit"), share("t", 100), snap, assume=False)
    assert isinstance(r2, ScheduleResult) and r2.scheduled and r2.gpus == (0,)
    assert "default/t" not in snap.allocations and snap.node_gpu_free(0) == [900]


def test_score_cache_drops_the_least_recently_used_entry() -> None:
    from gpusched.core.caches import LRUCache

    c: LRUCache[str, int] = LRUCache(capacity=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the most recently used
    c.put("c", 3)
    assert c.keys() == ["a", "c"] and c.get("b") is None and c.get("missing") is None
    c.put("a", 10)  # overwriting refreshes too
    c.put("d", 4)
    assert c.keys() == ["a", "d"]
    with pytest.raises(ValueError, match="capacity must be positive"):
        LRUCache(0)


def test_policy_key_hashes_once_and_compares_by_value() -> None:
    from gpusched.core.policies.cache import PolicyKey

    a = PolicyKey(("P", (1, 2, frozenset({"x"}))))
    b = PolicyKey(("P", (1, 2, frozenset({"x"}))))
    c = PolicyKey(("P", (1, 3, frozenset({"x"}))))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != c and a != ("P", (1, 2, frozenset({"x"})))
