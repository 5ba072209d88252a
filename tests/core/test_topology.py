"""GPU topology on the core NodeSpec and the GPU sets pick_gpus chooses with it (issue 31 item 4)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import node, share, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.devices import fitting_gpus, pick_gpus
from gpusched.core.errors import InvalidSpec
from gpusched.core.topology import GpuTopology

# 8 PCIe GPUs as 4 NVLink pairs, pairs 0-1 and 2-3 on NUMA 0, 4-5 and 6-7 on NUMA 1
PAIRS = GpuTopology.of([0, 0, 0, 0, 1, 1, 1, 1], [[1], [0], [3], [2], [5], [4], [7], [6]])
# 2 sockets, one NVLink island of 4 (all pairs) per socket
SOCKETS = GpuTopology.of(
    [0, 0, 0, 0, 1, 1, 1, 1],
    [[p for p in range(4 * (g // 4), 4 * (g // 4) + 4) if p != g] for g in range(8)],
)


def snap_of(topo: GpuTopology | None, gpus: int = 8) -> ClusterState:
    return ClusterState([node("n", gpus, gpu_topology=topo)])


def take(snap: ClusterState, gpus: list[int]) -> None:
    for g in gpus:
        snap.assume(whole(f"fill-{g}"), 0, [g])


# ------------------------------------------------------------------------------- the spec


def test_of_makes_peers_symmetric_and_islands_are_components() -> None:
    t = GpuTopology.of([0, 0, 1], [[1], [], []])
    assert t.peers == ((1,), (0,), ())
    assert t.islands() == (0, 0, 2)
    assert SOCKETS.islands() == (0, 0, 0, 0, 4, 4, 4, 4)


@pytest.mark.parametrize(
    ("numa", "peers", "fragment"),
    [
        ([0, 0], [[1], []], "lists 1 as NVLink peer but 1 does not list 0"),
        ([0, 0], [[0], []], "peer 0 is not another"),
        ([0, 0], [[2], []], "peer 2 is not another"),
        ([0, -2], [[], []], "NUMA node must be an integer >= -1"),
        ([0], [[], []], "1 NUMA nodes but 2"),
    ],
)
def test_a_malformed_topology_is_refused_naming_what(
    numa: list[int], peers: list[list[int]], fragment: str
) -> None:
    with pytest.raises(InvalidSpec, match=fragment):
        GpuTopology(tuple(numa), tuple(tuple(p) for p in peers))


def test_node_refuses_a_topology_of_another_gpu_count() -> None:
    with pytest.raises(InvalidSpec, match="describes 8 GPUs, the node has 4"):
        node("n", 4, gpu_topology=PAIRS)


def test_is_complete() -> None:
    assert PAIRS.is_complete([0, 1]) and not PAIRS.is_complete([1, 2]) and not PAIRS.is_complete([0, 1, 2, 3])
    assert SOCKETS.is_complete([4, 5, 6, 7]) and not SOCKETS.is_complete([2, 3, 4, 5])


# --------------------------------------------------------------------------- the choice


def test_four_gpus_take_one_island_not_the_lowest_indices() -> None:
    snap = snap_of(SOCKETS)
    take(snap, [0])  # island 0 broken: blind best fit would take 1, 2, 3, 4
    assert pick_gpus(snap_of(None), whole("p", 4), 0) == (0, 1, 2, 3)
    assert pick_gpus(snap, whole("p", 4), 0) == (4, 5, 6, 7)


def test_two_gpus_take_an_nvlink_pair_on_one_numa_node() -> None:
    snap = snap_of(PAIRS)
    take(snap, [0, 2])  # pairs 0-1 and 2-3 broken: blind takes 1, 3 (no NVLink)
    assert pick_gpus(snap, whole("p", 2), 0) == (4, 5)


def test_no_complete_set_the_best_connected_one() -> None:
    snap = snap_of(SOCKETS)
    take(snap, [0, 1, 4, 5, 6])  # free: 2, 3 (one island) and 7: three GPUs, best 2-3 + 7
    assert pick_gpus(snap, whole("p", 3), 0) == (2, 3, 7)
    snap = snap_of(PAIRS)
    take(snap, [0, 2, 4])  # free: 1, 3 (NUMA 0), 5, 6, 7: 6-7 is the only NVLink pair
    assert pick_gpus(snap, whole("p", 3), 0) == (5, 6, 7)  # ... with the one NUMA node of its peers


def test_one_gpu_breaks_the_most_broken_island_first() -> None:
    snap = snap_of(PAIRS)
    take(snap, [4])  # pair 4-5 broken: a one-GPU pod takes 5, keeping pair 0-1 whole
    assert pick_gpus(snap_of(None), whole("p"), 0) == (0,)
    assert pick_gpus(snap, whole("p"), 0) == (5,)
    assert pick_gpus(snap, share("s", 300), 0) == (5,)


def test_a_share_still_goes_to_the_tightest_gpu_first() -> None:
    snap = snap_of(SOCKETS)
    take(snap, [4, 5])  # island 1 more broken than island 0 ...
    snap.assume(share("a", 600), 0, [1])  # ... but GPU 1 is used by a share: the share goes there
    assert pick_gpus(snap, share("s", 300), 0) == (1,)


def test_a_hint_on_a_used_gpu_is_honoured_one_on_an_untouched_gpu_reads_as_any_untouched_gpu() -> None:
    snap = snap_of(PAIRS)
    take(snap, [6])
    snap.assume(share("a", 600), 0, [2])
    assert pick_gpus(snap, share("s", 300), 0, hint=2) == (2,)
    assert pick_gpus(snap, share("s", 300), 0, hint=0) == (3,)  # untouched, in a broken pair (3 or 7)
    assert pick_gpus(snap_of(None), share("s", 300), 0, hint=0) == (0,)


# ------------------------------------------------------------------------------- property

N_GPUS = 8


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterState, int, int]:
    n = draw(st.integers(2, N_GPUS))
    numa = draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n))
    pairs = draw(
        st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda t: t[0] != t[1]))
    )
    peers: list[list[int]] = [[] for _ in range(n)]
    for a, b in pairs:
        peers[a].append(b)
    snap = ClusterState([node("n", n, gpu_topology=GpuTopology.of(numa, peers))])
    fills = draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from([300, 1000]))))
    for i, (g, milli) in enumerate(fills):
        if snap.gpu_free[0, g] >= milli:
            snap.assume(share(f"f{i}", milli) if milli < 1000 else whole(f"f{i}"), 0, [g])
    return snap, draw(st.integers(1, n)), draw(st.sampled_from([300, 1000]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_the_choice_fits_has_the_right_size_and_is_complete_when_a_complete_set_fits(
    sc: tuple[ClusterState, int, int],
) -> None:
    snap, k, milli = sc
    p = whole("p", k) if milli == 1000 else share("p", milli)
    k = p.num_gpu
    ok = fitting_gpus(snap, p, 0)
    topo = snap.nodes[0].gpu_topology
    assert topo is not None
    fitting = [int(g) for g in ok.nonzero()[0]]
    if len(fitting) < k:
        with pytest.raises(ValueError, match="does not fit"):
            pick_gpus(snap, p, 0)
        return
    got = pick_gpus(snap, p, 0)
    assert len(got) == k == len(set(got)) and list(got) == sorted(got)
    assert all(ok[g] for g in got)
    assert snap.check_fits(p, 0, got) is None
    sets = list(itertools.combinations(fitting, k))
    best_pairs = max(topo.nvlink_pairs(s) for s in sets)
    if any(topo.is_complete(s) for s in sets):
        assert topo.is_complete(got)
    assert topo.nvlink_pairs(got) == best_pairs


# ------------------------------------------------------------------------ node preference


def test_a_multi_gpu_pod_goes_to_the_node_where_a_complete_set_fits() -> None:
    from builders import profile
    from gpusched.core.scheduler import schedule_one

    def cluster(topo: GpuTopology | None) -> ClusterState:
        snap = ClusterState([node("a", 8, gpu_topology=topo), node("b", 8, gpu_topology=topo)])
        for g in (0, 4):  # node a: both islands broken, tighter for best fit
            snap.assume(whole(f"a{g}"), 0, [g])
        snap.assume(whole("b0"), 1, [0])  # node b: island 1 whole
        return snap

    blind = schedule_one(profile("bestfit"), whole("p", 4), cluster(None))
    assert (blind.node, blind.gpus) == (0, (1, 2, 3, 5))
    aware = schedule_one(profile("bestfit"), whole("p", 4), cluster(SOCKETS))
    assert (aware.node, aware.gpus) == (1, (4, 5, 6, 7))
    share_pod = schedule_one(profile("bestfit"), whole("s", 1), cluster(SOCKETS))
    assert share_pod.node == 0  # one-GPU pods: the policy alone picks the node


def test_a_node_whose_topology_has_no_complete_set_of_the_size_is_not_passed_over() -> None:
    from builders import profile
    from gpusched.core.scheduler import schedule_one

    no_nvlink = GpuTopology.of([0, 0, 0, 0, 1, 1, 1, 1], [[] for _ in range(8)])
    snap = ClusterState([node("a", 8, gpu_topology=no_nvlink), node("b", 8)])
    snap.assume(whole("a0"), 0, [0])  # node a tighter: best fit wants it
    r = schedule_one(profile("bestfit"), whole("p", 2), snap)
    assert (r.node, r.gpus) == (0, (1, 2))  # one NUMA node, the most broken
    snap = ClusterState([node("a", 8, gpu_topology=PAIRS), node("b", 8)])
    snap.assume(whole("a0"), 0, [0])
    r = schedule_one(profile("bestfit"), whole("p", 4), snap)
    assert (r.node, r.gpus) == (
        0,
        (4, 5, 6, 7),
    )  # no complete 4 on pairs: node by best fit, 2 pairs on NUMA 1
