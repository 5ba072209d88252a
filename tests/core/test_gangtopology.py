"""Gang topology domains (core.gangtopology): required keeps a gang in one domain of its level or
it waits naming the level; preferred falls back to wider levels; the tightest domain is taken."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import node, profile, whole
from gpusched.core.cluster import ClusterState
from gpusched.core.gang import GangSpec, group_units, place_gang
from gpusched.core.gangtopology import (
    DEFAULT_LEVELS,
    GangTopology,
    InvalidTopology,
    Mode,
    TopologyLevels,
    domains,
    place_in_domain,
)
from gpusched.core.names import LABEL_BLOCK, LABEL_CLIQUE, LABEL_RACK
from gpusched.core.statement import schedule_all

LEVELS = TopologyLevels()


def labelled(name: str, clique: str, rack: str, block: str = "b0", gpus: int = 4) -> object:
    return node(name, gpus=gpus, labels={LABEL_CLIQUE: clique, LABEL_RACK: rack, LABEL_BLOCK: block})


def cluster() -> ClusterState:
    """c0 = n0-n1 (8 GPUs) and c1 = n2-n4 (12) in rack r0; c2 = n5-n7 (12) in rack r1; one block."""
    where = ["c0", "c0", "c1", "c1", "c1", "c2", "c2", "c2"]
    return ClusterState(
        [labelled(f"n{i}", c, "r0" if c != "c2" else "r1") for i, c in enumerate(where)]  # type: ignore[misc]
    )


def unit(name: str, n: int, num: int, mode: Mode | None, key: str = LABEL_CLIQUE):  # type: ignore[no-untyped-def]
    topo = LEVELS.request(mode, key) if mode is not None else None
    pods = [whole(f"{name}-{i}", num, gang=name) for i in range(n)]
    return group_units(pods, {f"default/{name}": GangSpec(name, min_member=n, topology=topo)})[0]


def cliques_of(snap: ClusterState, r) -> set[str]:  # type: ignore[no-untyped-def]
    return {snap.nodes[x.node].labels[LABEL_CLIQUE] for x in r.placed}


def test_a_required_gang_lands_in_one_clique_the_tightest_that_holds_it() -> None:
    snap = cluster()
    r = place_gang(profile(), unit("g", 2, 4, Mode.REQUIRED), snap)
    assert r.scheduled and cliques_of(snap, r) == {"c0"}  # 8 GPUs: the tightest clique that holds 8
    r = place_gang(profile(), unit("h", 3, 4, Mode.REQUIRED), snap)
    assert r.scheduled and cliques_of(snap, r) == {"c1"}  # c1 and c2 equal: by name


def test_a_required_gang_too_big_for_any_clique_waits_naming_the_level_and_books_nothing() -> None:
    snap = cluster()
    r = place_gang(profile(), unit("g", 4, 4, Mode.REQUIRED), snap)  # 16 GPUs; cliques hold 8, 12, 12
    assert not r.scheduled and not snap.allocations
    msg = r.status.message()
    assert "gang default/g waits as a unit (minMember 4)" in msg
    assert "topology-required nvidia.com/gpu.clique: no nvidia.com/gpu.clique domain takes 4 member(s)" in msg
    # topology-blind, the same gang fits (32 GPUs free)
    assert place_gang(profile(), unit("g", 4, 4, None), snap).scheduled


def test_a_preferred_gang_too_big_for_a_clique_lands_in_one_rack() -> None:
    snap = cluster()
    r = place_gang(profile(), unit("g", 4, 4, Mode.PREFERRED), snap)  # 16 GPUs: rack r0 has 20
    assert r.scheduled and {snap.nodes[x.node].labels[LABEL_RACK] for x in r.placed} == {"r0"}
    # too big for any rack (20 and 12): anywhere, still placed
    r = place_gang(profile(), unit("h", 4, 4, Mode.PREFERRED), snap)
    assert r.scheduled and len(r.placed) == 4


def test_required_at_rack_level_keeps_a_gang_in_one_rack() -> None:
    snap = cluster()
    r = place_gang(profile(), unit("g", 5, 4, Mode.REQUIRED, LABEL_RACK), snap)
    assert r.scheduled and {snap.nodes[x.node].labels[LABEL_RACK] for x in r.placed} == {"r0"}
    r = place_gang(profile(), unit("h", 6, 4, Mode.REQUIRED, LABEL_RACK), cluster())  # 24 GPUs: racks 20, 12
    assert not r.scheduled and "topology-required gpusched.io/rack" in r.status.message()


def test_bound_members_anchor_the_rest_of_the_gang() -> None:
    snap = cluster()
    snap.assume(whole("g-0", 4, gang="g"), 6, [0, 1, 2, 3])  # a member already runs in c2
    pods = [whole(f"g-{i}", 4, gang="g") for i in (1, 2)]
    r = place_in_domain(
        profile(), pods, snap, LEVELS.request(Mode.REQUIRED, LABEL_CLIQUE), need=2, gang="default/g"
    )
    assert r.result.scheduled and r.domain is not None and r.domain.values[0] == "c2"
    assert cliques_of(snap, r.result) == {"c2"}


def test_a_domain_is_named_by_its_values_at_every_wider_level() -> None:
    # two racks called r1, in two blocks: two racks, not one of 16 GPUs
    snap = ClusterState([labelled(f"n{i}", f"c{i}", "r1", f"b{i // 2}") for i in range(4)])  # type: ignore[misc]
    racks = domains(snap, (LABEL_RACK, LABEL_BLOCK))
    assert [(d.values, d.nodes.tolist()) for d in racks] == [(("r1", "b0"), [0, 1]), (("r1", "b1"), [2, 3])]
    r = place_gang(profile(), unit("g", 3, 4, Mode.REQUIRED, LABEL_RACK), snap)
    assert not r.scheduled


def test_a_clique_needs_no_rack_or_block_label() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4, labels={LABEL_CLIQUE: f"c{i // 2}"}) for i in range(4)])
    r = place_gang(profile(), unit("g", 2, 4, Mode.REQUIRED), snap)
    assert r.scheduled and len(cliques_of(snap, r)) == 1


def test_nodes_without_the_label_are_in_no_domain() -> None:
    snap = ClusterState([node(f"n{i}", gpus=4) for i in range(2)])
    r = place_gang(profile(), unit("g", 1, 4, Mode.REQUIRED), snap)
    assert not r.scheduled and "no node carries the label nvidia.com/gpu.clique" in r.status.message()
    assert place_gang(profile(), unit("g", 1, 4, Mode.PREFERRED), snap).scheduled


def test_levels_and_requests_refuse_bad_input_naming_the_key() -> None:
    assert TopologyLevels.parse(" a/x , b ,c").keys == ("a/x", "b", "c")
    assert TopologyLevels().keys == DEFAULT_LEVELS
    with pytest.raises(InvalidTopology, match="b is listed twice"):
        TopologyLevels(("a", "b", "b"))
    with pytest.raises(InvalidTopology, match="at least one"):
        TopologyLevels.parse(" , ")
    with pytest.raises(
        InvalidTopology, match=r"'zone' is not one of the topology levels \(nvidia.com/gpu.clique"
    ):
        LEVELS.request(Mode.REQUIRED, "zone")
    assert LEVELS.request(Mode.PREFERRED, LABEL_RACK) == GangTopology(
        Mode.PREFERRED, (LABEL_RACK, LABEL_BLOCK)
    )


# ----------------------------------------------------------------------------- the property
@st.composite
def scenes(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(2, 9))
    nodes = []
    for i in range(n):
        labels = {}  # each label present or not, values reused across wider domains
        for key, values in ((LABEL_CLIQUE, 3), (LABEL_RACK, 2), (LABEL_BLOCK, 2)):
            if draw(st.integers(0, 5)):
                labels[key] = f"v{draw(st.integers(0, values - 1))}"
        nodes.append(node(f"n{i}", gpus=draw(st.sampled_from([2, 4, 8])), labels=labels))
    taken = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 7)), max_size=12))
    size = draw(st.integers(1, 6))
    num = draw(st.sampled_from([1, 2, 4]))
    key = draw(st.sampled_from([LABEL_CLIQUE, LABEL_RACK]))
    return nodes, taken, size, num, key


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_a_required_gang_is_never_split_across_domains_of_its_level_and_is_placed_when_one_holds_it(
    scene,  # type: ignore[no-untyped-def]
) -> None:
    nodes, taken, size, num, key = scene
    snap = ClusterState(nodes)
    for j, (n, g) in enumerate(taken):
        if g < snap.gpu_count[n] and snap.gpu_free[n, g] == 1000:
            snap.assume(whole(f"x{j}"), n, [g])
    request = LEVELS.request(Mode.REQUIRED, key)
    pods = [whole(f"g-{i}", num, gang="g") for i in range(size)]
    # which domains hold the gang on their own (each tried on a copy)
    holds = []
    for d in domains(snap, request.keys):
        trial = snap.copy()
        if schedule_all(profile(), pods, trial, min_count=size, nodes=d.nodes).scheduled:
            holds.append(d.values)
    before = dict(snap.allocations)
    r = place_in_domain(profile(), pods, snap, request, need=size, gang="default/g")
    if not r.result.scheduled:
        assert not holds, "a domain holds the gang, yet it was not placed"
        assert snap.allocations == before
        assert "topology-required" in r.result.status.message()
        return
    paths = {tuple(snap.nodes[x.node].labels.get(k) for k in request.keys) for x in r.result.placed}
    assert len(paths) == 1 and next(iter(paths))[0] is not None, f"split across {paths}"
    assert r.domain is not None and tuple(v or "" for v in next(iter(paths))) == r.domain.values
    assert len(r.result.placed) == size


def test_gang_preemption_frees_room_inside_one_domain() -> None:
    """A required gang on a full cluster: the victims chosen let it land in one clique (the
    what-if runs the topology-aware placement), evicted now, it lands there."""
    from gpusched.core.batch import Outcome, run_cycle

    snap = cluster()
    for n, prio in enumerate([0, 1, 0, 5, 5, 5, 5, 5]):  # the two cheapest victims are in c0 and c1
        snap.assume(whole(f"low-{n}", 4, priority=prio), n, [0, 1, 2, 3])
    pods = [whole(f"g-{i}", 4, gang="g", priority=10) for i in range(2)]
    u = group_units(
        pods, {"default/g": GangSpec("g", min_member=2, topology=LEVELS.request(Mode.REQUIRED, LABEL_CLIQUE))}
    )[0]
    (o,) = run_cycle(profile(preemption=True), snap, [u], evict_now=True)
    assert o.outcome is Outcome.PLACED, o.reason
    assert {snap.nodes[x.node].labels[LABEL_CLIQUE] for x in o.placed} == {"c0"}
    assert {"default/low-0", "default/low-1"} <= set(o.victims)


def test_a_preferred_gang_no_block_holds_spreads_over_the_fewest_blocks() -> None:
    """3 blocks of 2 nodes; blocks b1 and b2 half taken. A preferred gang of 6 x 2 GPUs (12; a block
    has 8) lands on 2 blocks (b0 whole, then b1), where blind best fit takes the tight GPUs of b1
    and b2 first and spans all 3."""

    def blocks() -> ClusterState:
        snap = ClusterState([labelled(f"n{i}", f"c{i}", f"r{i}", f"b{i // 2}") for i in range(6)])  # type: ignore[misc]
        for n in range(2, 6):
            snap.assume(whole(f"x{n}", 2), n, [0, 1])
        return snap

    def spread(mode: Mode | None) -> set[str]:
        snap = blocks()
        r = place_gang(profile(), unit("g", 6, 2, mode), snap)
        assert r.scheduled and len(r.placed) == 6
        return {snap.nodes[x.node].labels[LABEL_BLOCK] for x in r.placed}

    assert spread(None) == {"b0", "b1", "b2"}
    assert spread(Mode.PREFERRED) == {"b0", "b1"}
