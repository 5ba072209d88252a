"""Topology spread and required pod (anti-)affinity: kube-scheduler's semantics, checked by hand
and against an independent oracle over random streams; conversion from Kubernetes objects."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import builders
from builders import HOST, ZONE
from gpusched.core.cluster import ClusterState
from gpusched.core.model import InvalidSpec, NodeSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.selectors import (
    LabelSelector,
    PodAffinityTerm,
    PreferredPodTerm,
    SelectorRequirement,
    SpreadConstraint,
)
from gpusched.core.status import Code
from gpusched.k8s.convert import InvalidRequest, pod_from_k8s


def node(name: str, zone: str | None, cpu: int = 8000, **labels: str) -> NodeSpec:
    """A CPU node labelled with its hostname and, unless None, its zone."""
    return builders.node(
        name, cpu=cpu, mem=8192, labels={HOST: name, **labels} | ({ZONE: zone} if zone else {})
    )


def app(value: str) -> LabelSelector:
    return LabelSelector((("app", value),))


def pod(name: str, labels: str = "web", ns: str = "default", **kw: Any) -> PodSpec:
    """A 100m pod labelled app=``labels``."""
    return builders.pod(name, 100, namespace=ns, labels={"app": labels}, **kw)


def cluster() -> ClusterState:
    return ClusterState([node("a1", "z1"), node("a2", "z1"), node("b1", "z2"), node("c1", None)])


def place(snap: ClusterState, p: PodSpec, at: str) -> None:
    snap.assume(p, snap.index[at], ())


def run(snap: ClusterState, p: PodSpec) -> Any:
    return schedule_one(make_profile("bestfit"), p, snap, tiebreak=None)


def feasible(snap: ClusterState, p: PodSpec) -> set[str]:
    from gpusched.core.scheduler import feasible as first_half

    return {snap.names[i] for i in first_half(make_profile("bestfit"), p, snap).indices()}


WEB_SPREAD = SpreadConstraint(ZONE, max_skew=1, selector=app("web"))


def test_spread_counts_matching_pods_per_zone() -> None:
    snap = cluster()
    place(snap, pod("w1"), "a1")
    place(snap, pod("w2"), "a2")
    place(snap, pod("d1", "db"), "b1")  # does not match the selector
    place(snap, pod("w9", ns="other"), "b1")  # another namespace: not counted
    # z1 has 2, z2 has 0: only z2 keeps the skew at 1; c1 has no zone label
    assert feasible(snap, pod("new", spread=(WEB_SPREAD,))) == {"b1"}
    # a pod that its own selector does not match adds nothing: skew 2 - 0 is still over 1
    assert feasible(snap, pod("db2", "db", spread=(WEB_SPREAD,))) == {"b1"}
    loose = SpreadConstraint(ZONE, max_skew=2, selector=app("web"))
    assert feasible(snap, pod("db3", "db", spread=(loose,))) == {"a1", "a2", "b1"}
    assert feasible(snap, pod("w3", spread=(loose,))) == {"b1"}  # 2 + 1 - 0 > 2
    # ScheduleAnyway is a preference: not enforced
    soft = SpreadConstraint(ZONE, max_skew=1, selector=app("web"), when_unsatisfiable="ScheduleAnyway")
    assert feasible(snap, pod("w4", spread=(soft,))) == {"a1", "a2", "b1", "c1"}
    # a null selector selects no pod: only the missing-label rule is left
    assert feasible(snap, pod("w5", spread=(SpreadConstraint(ZONE),))) == {"a1", "a2", "b1"}


def test_spread_reasons_and_min_domains() -> None:
    snap = cluster()
    place(snap, pod("w1"), "a1")
    place(snap, pod("w2"), "a2")
    place(snap, pod("w3"), "b1")
    # z1 2, z2 1: minimum 1, so z2 takes the next one (1 + 1 - 1)
    assert feasible(snap, pod("w4", spread=(WEB_SPREAD,))) == {"b1"}
    # minDomains 3 with 2 zones: the minimum counts as 0 and no zone is low enough
    strict = SpreadConstraint(ZONE, max_skew=1, selector=app("web"), min_domains=3)
    r = run(snap, pod("w5", spread=(strict,)))
    assert not r.scheduled
    assert r.status.message() == (
        "0/4 nodes are available: "
        "1 node(s) didn't match pod topology spread constraints (missing required label), "
        "3 node(s) didn't match pod topology spread constraints."
    )
    codes = {f.node: f.code for f in r.diagnosis.failures}
    assert codes["c1"] == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and codes["b1"] == Code.UNSCHEDULABLE


def test_spread_domains_follow_node_affinity_and_taint_policies() -> None:
    snap = cluster()
    place(snap, pod("w1"), "a1")
    place(snap, pod("w2"), "a2")
    in_z1 = {ZONE: "z1"}
    # Honor (default): only z1 is a domain, so its own count is the minimum
    assert feasible(snap, pod("w3", spread=(WEB_SPREAD,), node_selector=in_z1)) == {"a1", "a2"}
    ignore = SpreadConstraint(ZONE, max_skew=1, selector=app("web"), node_affinity_policy="Ignore")
    assert feasible(snap, pod("w4", spread=(ignore,), node_selector=in_z1)) == set()
    with pytest.raises(InvalidSpec, match="nodeTaintsPolicy 'Always' is not one of Honor, Ignore"):
        SpreadConstraint(ZONE, node_taints_policy="Always")


def test_required_anti_affinity_both_ways() -> None:
    snap = cluster()
    place(snap, pod("w1"), "a1")
    apart = PodAffinityTerm(HOST, app("web"))
    assert feasible(snap, pod("w2", pod_anti_affinity=(apart,))) == {"a2", "b1", "c1"}
    by_zone = PodAffinityTerm(ZONE, app("web"))
    assert feasible(snap, pod("w3", pod_anti_affinity=(by_zone,))) == {"b1", "c1"}  # c1 has no zone
    # a running pod's anti-affinity keeps matching pods away from it, though they ask nothing
    place(snap, pod("db", "db", pod_anti_affinity=(PodAffinityTerm(HOST, app("cache")),)), "b1")
    r = run(snap.copy(), pod("c", "cache", node_selector={HOST: "b1"}))
    assert r.status.message() == (
        "0/4 nodes are available: 1 node(s) didn't satisfy existing pods anti-affinity rules, "
        "3 node(s) didn't match Pod's node affinity/selector."
    )
    snap.forget("default/db")
    assert feasible(snap, pod("c2", "cache", node_selector={HOST: "b1"})) == {"b1"}
    # terms look at their own namespace unless told otherwise
    place(snap, pod("o1", ns="other"), "b1")
    assert feasible(snap, pod("w4", pod_anti_affinity=(apart,))) == {"a2", "b1", "c1"}
    listed = PodAffinityTerm(HOST, app("web"), namespaces=("other",))
    assert feasible(snap, pod("w5", pod_anti_affinity=(listed,))) == {"a1", "a2", "c1"}
    everywhere = PodAffinityTerm(HOST, app("web"), all_namespaces=True)
    assert feasible(snap, pod("w6", pod_anti_affinity=(everywhere,))) == {"a2", "c1"}


def test_required_affinity_and_the_first_pod_of_a_group() -> None:
    snap = cluster()
    near_cache = PodAffinityTerm(ZONE, app("cache"))
    r = run(snap.copy(), pod("w1", pod_affinity=(near_cache,)))
    assert not r.scheduled and "4 node(s) didn't match pod affinity rules" in r.status.message()
    assert r.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    # the first cache pod, with affinity to caches, may start anywhere with a zone
    assert feasible(snap, pod("c1", "cache", pod_affinity=(near_cache,))) == {"a1", "a2", "b1"}
    place(snap, pod("c1", "cache"), "b1")
    assert feasible(snap, pod("w2", pod_affinity=(near_cache,))) == {"b1"}
    assert feasible(snap, pod("c2", "cache", pod_affinity=(near_cache,))) == {"b1"}


def test_label_selectors_reject_node_operators() -> None:
    with pytest.raises(InvalidSpec, match="operator Gt is for node selectors"):
        LabelSelector(match_expressions=(SelectorRequirement("tier", "Gt", ("1",)),))
    with pytest.raises(InvalidSpec, match="maxSkew must be an integer ≥ 1, got 0"):
        SpreadConstraint(ZONE, max_skew=0)
    with pytest.raises(InvalidSpec, match="pod affinity term: topologyKey is empty"):
        PodAffinityTerm("")


# ------------------------------------------------------------------------------ random streams
def oracle_ok(snap: ClusterState, p: PodSpec, n: int) -> bool:
    """Written again from the Kubernetes docs, for CPU-only pods and no node selectors."""
    nd = snap.nodes[n]
    if snap.cpu_free[n] < p.cpu_milli:
        return False
    running = [(a.pod, snap.nodes[a.node]) for a in snap.allocations.values()]

    def picks(sel: LabelSelector | None, labels: dict[str, str] | Any) -> bool:
        return sel is not None and all(labels.get(k) == v for k, v in sel.match_labels)

    for c in p.spread:
        if nd.labels.get(c.topology_key) is None:
            return False
        zones = {x.labels[c.topology_key] for x in snap.nodes if c.topology_key in x.labels}
        count = Counter(
            other_node.labels[c.topology_key]
            for q, other_node in running
            if c.topology_key in other_node.labels
            and q.namespace == p.namespace
            and picks(c.selector, q.labels)
        )
        low = min(count[z] for z in zones)
        if count[nd.labels[c.topology_key]] + picks(c.selector, p.labels) - low > c.max_skew:
            return False
    for t in p.pod_anti_affinity:
        here = nd.labels.get(t.topology_key)
        if here is not None and any(
            o.labels.get(t.topology_key) == here
            and q.namespace == p.namespace
            and picks(t.selector, q.labels)
            for q, o in running
        ):
            return False
    for q, o in running:
        for t in q.pod_anti_affinity:
            here = nd.labels.get(t.topology_key)
            same = here is not None and o.labels.get(t.topology_key) == here
            if same and q.namespace == p.namespace and picks(t.selector, p.labels):
                return False
    return True


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[NodeSpec], list[PodSpec | int]]:
    nodes = [
        node(f"n{i}", draw(st.sampled_from(["z1", "z2", "z3", None])), cpu=draw(st.sampled_from([300, 1000])))
        for i in range(draw(st.integers(1, 6)))
    ]
    pods: list[PodSpec | int] = []  # an int deletes a booked pod
    for i in range(draw(st.integers(1, 25))):
        if i and draw(st.integers(0, 5)) == 0:
            pods.append(draw(st.integers(0, 100)))
            continue
        label = draw(st.sampled_from(["web", "db"]))
        other = draw(st.sampled_from(["web", "db"]))  # selectors need not pick the pod itself
        # two labels: the index finds pods by the first; the second must still be checked
        two = LabelSelector((("app", other), ("tier", "gold")))
        skew = draw(st.integers(1, 2))
        spread = draw(
            st.sampled_from(
                [
                    (),
                    (),
                    (
                        SpreadConstraint(
                            ZONE, max_skew=skew, selector=draw(st.sampled_from([app(other), two]))
                        ),
                    ),
                ]
            )
        )
        anti = draw(
            st.sampled_from([(), (), (PodAffinityTerm(HOST, app(label)),), (PodAffinityTerm(ZONE, two),)])
        )
        ns = draw(st.sampled_from(["default", "default", "other"]))
        p = pod(f"p{i}", label, ns=ns, spread=spread, pod_anti_affinity=anti)
        pods.append(replace(p, labels={**p.labels, "tier": draw(st.sampled_from(["gold", "iron"]))}))
    return nodes, pods


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_filters_agree_with_the_oracle(stream: tuple[list[NodeSpec], list[PodSpec | int]]) -> None:
    nodes, pods = stream
    snap = ClusterState(nodes)
    for p in pods:
        if isinstance(p, int):
            if snap.allocations:
                snap.forget(sorted(snap.allocations)[p % len(snap.allocations)])
            continue
        want = {snap.names[n] for n in range(len(snap)) if oracle_ok(snap, p, n)}
        assert feasible(snap, p) == want, p
        r = run(snap, p)
        assert r.scheduled == bool(want)
        assert snap.verify() == []


# ------------------------------------------------------------------------------ conversion
def k8s_pod(spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "labels": labels or {"app": "web", "pod-template-hash": "abc"},
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}], **spec},
    }


def test_pod_from_k8s_reads_spread_and_pod_affinity() -> None:
    p = pod_from_k8s(
        k8s_pod(
            {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": ZONE,
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                        "matchLabelKeys": ["pod-template-hash"],
                        "minDomains": 2,
                    }
                ],
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "topologyKey": HOST,
                                "labelSelector": {
                                    "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]
                                },
                            }
                        ],
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 30, "podAffinityTerm": {"topologyKey": ZONE, "labelSelector": {}}}
                        ],
                    },
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "topologyKey": ZONE,
                                "labelSelector": {"matchLabels": {"app": "cache"}},
                                "namespaceSelector": {},
                            }
                        ]
                    },
                },
            }
        )
    )
    assert p.labels == {"app": "web", "pod-template-hash": "abc"}
    (c,) = p.spread
    assert (c.topology_key, c.max_skew, c.min_domains, c.hard) == (ZONE, 1, 2, True)
    assert c.selector == LabelSelector(
        (("app", "web"),), (SelectorRequirement("pod-template-hash", "In", ("abc",)),)
    )
    (anti,) = p.pod_anti_affinity
    assert anti.topology_key == HOST and anti.namespaces == () and not anti.all_namespaces
    (aff,) = p.pod_affinity
    assert aff.all_namespaces and aff.selector == app("cache")
    assert p.preferred_pod_anti_affinity == (PreferredPodTerm(30, PodAffinityTerm(ZONE, LabelSelector())),)
    assert p.preferred_pod_affinity == ()


SPREAD = "pod ml/p: spec.topologySpreadConstraints"
ANTI = "pod ml/p: spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"topologySpreadConstraints": {"maxSkew": 1}}, f"{SPREAD} must be a list"),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 0, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}
                ]
            },
            r"\[0\]: .*maxSkew must be an integer ≥ 1, got 0",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "Sometimes"}
                ]
            },
            r"whenUnsatisfiable 'Sometimes' is not one of",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": ZONE,
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {
                            "matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]
                        },
                    }
                ]
            },
            r"labelSelector: label selector requirement 'a': operator Gt is for node selectors",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]
                    }
                }
            },
            rf"{ANTI}\[0\]: pod affinity term: topologyKey is empty",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOST, "namespaceSelector": {"matchLabels": {"team": "a"}}}
                        ]
                    }
                }
            },
            r"namespaceSelector: only null .* or \{\} .* is supported",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOST, "matchLabelKeys": "app"}
                        ]
                    }
                }
            },
            r"\[0\].matchLabelKeys: must be a list of label keys",
        ),
    ],
)
def test_invalid_constraints_name_pod_and_field(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        pod_from_k8s(k8s_pod(spec))


def test_running_pods_are_booked_whatever_their_constraints() -> None:
    from gpusched.k8s.state import LiveCluster

    unsupported = {
        "nodeName": "n1",
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "namespaceSelector": {"matchLabels": {"team": "a"}}}
                ]
            }
        },
    }
    obj = k8s_pod(unsupported)
    with pytest.raises(InvalidRequest, match="namespaceSelector"):
        pod_from_k8s(obj)
    assert pod_from_k8s(obj, constraints="lenient").pod_anti_affinity == ()
    assert pod_from_k8s(k8s_pod({"topologySpreadConstraints": "x"}), constraints="skip").spread == ()
    lc = LiveCluster()
    lc.upsert_node(
        {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"cpu": "4", "memory": "1Gi"}}}
    )
    lc.upsert_pod({**obj, "status": {"phase": "Running"}})
    with lc.live_books() as st:
        assert list(st.allocations) == ["ml/p"] and int(st.cpu_free[0]) == 3000


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"affinity": "near"}, r"pod ml/p: spec\.affinity: must be an object"),
        ({"affinity": {"nodeAffinity": []}}, r"spec\.affinity\.nodeAffinity: must be an object"),
        ({"affinity": {"podAffinity": 3}}, r"spec\.affinity\.podAffinity: must be an object"),
        (
            {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
            r"must be a list",
        ),
    ],
)
def test_malformed_affinity_objects_are_named(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        pod_from_k8s(k8s_pod(spec))
