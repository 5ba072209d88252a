"""Soft constraints (the Prefer extension point): preferred node and pod affinity, ScheduleAnyway
spread and PreferNoSchedule taints pick among the feasible nodes before the placement policy."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import builders
from builders import HOST, ZONE
from gpusched.core.cluster import ClusterState
from gpusched.core.model import NodeSpec, PodSpec, Taint, Toleration
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import feasible, schedule_one
from gpusched.core.selectors import (
    LabelSelector,
    NodeSelectorTerm,
    PodAffinityTerm,
    PreferredNodeTerm,
    PreferredPodTerm,
    SelectorRequirement,
    SpreadConstraint,
)
from gpusched.k8s.convert import InvalidRequest, pod_from_k8s


def node(name: str, zone: str, gpus: int = 8, taints: tuple[Taint, ...] = (), **labels: str) -> NodeSpec:
    return builders.gpu_node(
        name, gpus, 64_000, mem=262_144, taints=taints, labels={HOST: name, ZONE: zone, **labels}
    )


def web(name: str, **kw: Any) -> PodSpec:
    return builders.share(name, 250, 1000, labels={"app": "web"}, **kw)


def place_all(snap: ClusterState, pods: list[PodSpec]) -> list[str]:
    prof = make_profile("bestfit")
    out = []
    for p in pods:
        r = schedule_one(prof, p, snap)
        assert r.scheduled, r.status.message()
        out.append(r.node_name)
    return out


def test_without_preferences_the_policy_packs() -> None:
    snap = ClusterState([node("a", "z1"), node("b", "z1"), node("c", "z2")])
    assert place_all(snap, [web(f"w{i}") for i in range(3)]) == ["a", "a", "a"]


def test_preferred_anti_affinity_spreads_replicas_but_never_blocks() -> None:
    apart = (PreferredPodTerm(100, PodAffinityTerm(HOST, LabelSelector((("app", "web"),)))),)
    snap = ClusterState([node("a", "z1"), node("b", "z1"), node("c", "z2")])
    where = place_all(snap, [web(f"w{i}", preferred_pod_anti_affinity=apart) for i in range(4)])
    assert sorted(where[:3]) == ["a", "b", "c"]  # one per node first
    assert where[3] in {"a", "b", "c"}  # soft: a fourth still lands


def test_schedule_anyway_spread_balances_zones() -> None:
    soft = (SpreadConstraint(ZONE, 1, LabelSelector((("app", "web"),)), when_unsatisfiable="ScheduleAnyway"),)
    snap = ClusterState([node("a", "z1"), node("b", "z1"), node("c", "z2")])
    where = place_all(snap, [web(f"w{i}", spread=soft) for i in range(4)])
    zones = [snap.nodes[snap.index[n]].labels[ZONE] for n in where]
    assert zones.count("z1") == 2 and zones.count("z2") == 2


def test_preferred_node_affinity_weights() -> None:
    snap = ClusterState(
        [node("a", "z1", gpus=1), node("b", "z1", tier="gold"), node("c", "z2", tier="silver")]
    )
    gold = PreferredNodeTerm(10, NodeSelectorTerm((SelectorRequirement("tier", "In", ("gold",)),)))
    silver = PreferredNodeTerm(50, NodeSelectorTerm((SelectorRequirement("tier", "In", ("silver",)),)))
    assert place_all(snap, [web("p0")]) == ["a"]  # bestfit: the fullest fit
    assert place_all(snap, [web("p1", preferred_node_affinity=(gold,))]) == ["b"]
    assert place_all(snap, [web("p2", preferred_node_affinity=(gold, silver))]) == ["c"]


def test_preferred_pod_affinity_joins_the_cache() -> None:
    snap = ClusterState([node("a", "z1", gpus=1), node("b", "z2"), node("c", "z2")])
    snap.assume(PodSpec(name="cache", cpu_milli=100, labels={"app": "cache"}), snap.index["c"], ())
    near = (PreferredPodTerm(5, PodAffinityTerm(HOST, LabelSelector((("app", "cache"),)))),)
    assert place_all(snap, [web("w", preferred_pod_affinity=near)]) == ["c"]


def test_prefer_no_schedule_taints() -> None:
    spot = Taint("spot", "true", "PreferNoSchedule")
    snap = ClusterState([node("a", "z1", gpus=1, taints=(spot,)), node("b", "z1")])
    assert place_all(snap, [web("w1")]) == ["b"]  # bestfit would take a
    tolerant = web("w2", tolerations=(Toleration("spot", value="true"),))
    assert place_all(snap, [tolerant]) == ["a"]


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[NodeSpec], list[PodSpec]]:
    nodes = [
        node(
            f"n{i}",
            draw(st.sampled_from(["z1", "z2"])),
            gpus=draw(st.integers(1, 4)),
            tier=draw(st.sampled_from("gs")),
        )
        for i in range(draw(st.integers(1, 5)))
    ]
    prefs = st.lists(
        st.builds(
            PreferredNodeTerm,
            st.integers(1, 100),
            st.sampled_from([NodeSelectorTerm((SelectorRequirement("tier", "In", (t,)),)) for t in "gs"]),
        ),
        max_size=2,
    )
    pods = [web(f"p{i}", preferred_node_affinity=tuple(draw(prefs))) for i in range(draw(st.integers(1, 12)))]
    return nodes, pods


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_preferences_pick_among_feasible_nodes_only(case: tuple[list[NodeSpec], list[PodSpec]]) -> None:
    nodes, pods = case
    snap = ClusterState(nodes)
    prof = make_profile("bestfit")
    for p in pods:
        fits = feasible(prof, p, snap).indices().tolist()
        gain = {
            n: sum(
                t.weight
                for t in p.preferred_node_affinity
                if t.term.matches(snap.names[n], snap.nodes[n].labels)
            )
            for n in fits
        }
        r = schedule_one(prof, p, snap)
        assert r.scheduled == bool(fits)  # a preference never makes a pod unschedulable
        if r.scheduled:
            assert r.node in fits and gain[r.node] == max(gain.values())


def k8s_pod(affinity: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}], "affinity": affinity},
    }


PREF = "preferredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("affinity", "match"),
    [
        (
            {"nodeAffinity": {PREF: [{"weight": 0, "preference": {}}]}},
            rf"nodeAffinity\.{PREF}\[0\]\.weight: must be an integer in 1\.\.100, got 0",
        ),
        ({"nodeAffinity": {PREF: [{"weight": 5}]}}, rf"{PREF}\[0\]\.preference: must be an object"),
        (
            {"podAntiAffinity": {PREF: [{"weight": 101, "podAffinityTerm": {"topologyKey": HOST}}]}},
            r"weight: must be an integer in 1\.\.100, got 101",
        ),
        (
            {"podAffinity": {PREF: [{"weight": 1, "podAffinityTerm": {"topologyKey": ""}}]}},
            r"podAffinityTerm: pod affinity term: topologyKey is empty",
        ),
        ({"podAffinity": {PREF: {"weight": 1}}}, rf"podAffinity\.{PREF}: must be a list"),
    ],
)
def test_invalid_preferences_name_the_field(affinity: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        pod_from_k8s(k8s_pod(affinity))
