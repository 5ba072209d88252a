"""Required node affinity: Kubernetes operator semantics, validation, scheduling, conversion."""

from __future__ import annotations

from typing import Any

import pytest

from builders import gpu_node
from gpusched.core.cluster import ClusterState
from gpusched.core.model import InvalidSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.selectors import NodeSelectorTerm, PreferredNodeTerm, SelectorRequirement
from gpusched.core.status import Code
from gpusched.k8s.convert import InvalidRequest, pod_from_k8s

DRIVER = "nvidia.com/cuda.driver-version.major"


def req(key: str, op: str, *values: str) -> SelectorRequirement:
    return SelectorRequirement(key, op, tuple(values))


LABELS = {"zone": "a", DRIVER: "535", "odd": "v2"}


@pytest.mark.parametrize(
    ("r", "want"),
    [
        (req("zone", "In", "a", "b"), True),
        (req("zone", "In", "b"), False),
        (req("missing", "In", "a"), False),
        (req("zone", "NotIn", "b"), True),
        (req("zone", "NotIn", "a"), False),
        (req("missing", "NotIn", "a"), True),  # NotIn holds where the label is absent
        (req("zone", "Exists"), True),
        (req("missing", "Exists"), False),
        (req("zone", "DoesNotExist"), False),
        (req("missing", "DoesNotExist"), True),
        (req(DRIVER, "Gt", "534"), True),
        (req(DRIVER, "Gt", "535"), False),  # strictly greater
        (req(DRIVER, "Lt", "550"), True),
        (req(DRIVER, "Lt", "535"), False),
        (req("missing", "Gt", "0"), False),
        (req("missing", "Lt", "1000"), False),
        (req("odd", "Gt", "1"), False),  # not an integer label: no match
        (req(DRIVER, "Gt", "-1"), True),
    ],
)
def test_requirement_semantics(r: SelectorRequirement, want: bool) -> None:
    assert r.matches(LABELS) is want


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", "In", ("a",)), "key is empty"),
        (("zone", "Equals", ("a",)), "operator 'Equals' is not one of In, NotIn, Exists"),
        (("zone", "In", ()), "In needs values"),
        (("zone", "NotIn", ()), "NotIn needs values"),
        (("zone", "Exists", ("a",)), "Exists takes no values"),
        (("zone", "DoesNotExist", ("a",)), "DoesNotExist takes no values"),
        ((DRIVER, "Gt", ()), "Gt needs exactly one integer value, got \\[\\]"),
        ((DRIVER, "Lt", ("1", "2")), "Lt needs exactly one integer value"),
        ((DRIVER, "Gt", ("v535",)), "Gt needs exactly one integer value, got \\['v535'\\]"),
    ],
)
def test_invalid_requirements_name_the_problem(args: tuple[str, str, tuple[str, ...]], match: str) -> None:
    with pytest.raises(InvalidSpec, match=match):
        SelectorRequirement(*args)


def test_terms() -> None:
    both = NodeSelectorTerm((req("zone", "In", "a"), req(DRIVER, "Gt", "530")))
    assert both.matches("n1", LABELS)
    assert not NodeSelectorTerm((req("zone", "In", "a"), req(DRIVER, "Gt", "540"))).matches("n1", LABELS)
    assert not NodeSelectorTerm().matches("n1", LABELS)  # an empty term matches nothing
    by_name = NodeSelectorTerm(match_fields=(req("metadata.name", "In", "n1"),))
    assert by_name.matches("n1", LABELS) and not by_name.matches("n2", LABELS)
    not_name = NodeSelectorTerm(match_fields=(req("metadata.name", "NotIn", "n1"),))
    assert not_name.matches("n2", {}) and not not_name.matches("n1", {})
    with pytest.raises(InvalidSpec, match=r"matchFields supports only metadata\.name"):
        NodeSelectorTerm(match_fields=(req("metadata.namespace", "In", "x"),))
    with pytest.raises(InvalidSpec, match=r"metadata\.name with In or NotIn and one value"):
        NodeSelectorTerm(match_fields=(req("metadata.name", "In", "n1", "n2"),))
    with pytest.raises(InvalidSpec, match="node_affinity must be a tuple of NodeSelectorTerm"):
        PodSpec(name="p", node_affinity=[both])  # type: ignore[arg-type]


CLUSTER = [
    gpu_node("old", 1, labels={"zone": "a", DRIVER: "470"}),
    gpu_node("new", 8, labels={"zone": "a", DRIVER: "550"}),
    gpu_node("other", 2, labels={"zone": "b", DRIVER: "535"}),
    gpu_node("unlabelled", 4),
]


@pytest.mark.parametrize(
    ("terms", "selector", "want"),
    [
        ((), {}, "old"),  # bestfit: fullest fit
        ((NodeSelectorTerm((req(DRIVER, "Gt", "534"),)),), {}, "other"),
        ((NodeSelectorTerm((req(DRIVER, "Gt", "534"),)),), {"zone": "a"}, "new"),  # selector AND affinity
        (
            (NodeSelectorTerm((req(DRIVER, "Gt", "540"),)), NodeSelectorTerm((req("zone", "In", "b"),))),
            {},
            "other",
        ),
        ((NodeSelectorTerm((req(DRIVER, "DoesNotExist"),)),), {}, "unlabelled"),
        ((NodeSelectorTerm(match_fields=(req("metadata.name", "In", "new"),)),), {}, "new"),
        ((NodeSelectorTerm((req(DRIVER, "Gt", "600"),)),), {}, None),
        ((NodeSelectorTerm(),), {}, None),
    ],
)
def test_scheduling_honours_required_affinity(
    terms: tuple[NodeSelectorTerm, ...], selector: dict[str, str], want: str | None
) -> None:
    snap = ClusterState(CLUSTER)
    pod = PodSpec(name="p", num_gpu=1, gpu_milli=1000, node_affinity=terms, node_selector=selector)
    r = schedule_one(make_profile("bestfit"), pod, snap)
    if want is None:
        assert not r.scheduled
        assert r.status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        assert (
            r.status.message()
            == "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
        )
    else:
        assert r.node_name == want


def k8s_pod(affinity: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "affinity": affinity,
        },
    }


def required(*terms: Any) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def test_pod_from_k8s_reads_required_affinity() -> None:
    spec = pod_from_k8s(
        k8s_pod(
            required(
                {"matchExpressions": [{"key": DRIVER, "operator": "Gt", "values": ["534"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            )
        )
    )
    assert spec.node_affinity == (
        NodeSelectorTerm((req(DRIVER, "Gt", "534"),)),
        NodeSelectorTerm(match_fields=(req("metadata.name", "In", "n1"),)),
    )
    # preferred affinity alone is a preference: no constraint
    term = {"matchExpressions": [{"key": DRIVER, "operator": "Gt", "values": ["540"]}]}
    preferred = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 7, "preference": term}]
        }
    }
    spec = pod_from_k8s(k8s_pod(preferred))
    assert spec.node_affinity == ()
    assert spec.preferred_node_affinity == (
        PreferredNodeTerm(7, NodeSelectorTerm((req(DRIVER, "Gt", "540"),))),
    )
    assert pod_from_k8s(k8s_pod(None)).node_affinity == ()


REQ = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("affinity", "match"),
    [
        (required(), f"pod ml/p: {REQ}.nodeSelectorTerms must be a non-empty list"),
        (required("x"), r"nodeSelectorTerms\[0\]: must be an object"),
        (
            required({"matchExpressions": {"key": "a"}}),
            r"nodeSelectorTerms\[0\].matchExpressions: must be a list",
        ),
        (
            required({}, {"matchExpressions": [{"key": DRIVER, "operator": "Gte", "values": ["1"]}]}),
            r"nodeSelectorTerms\[1\].matchExpressions\[0\]: selector requirement .* operator 'Gte'",
        ),
        (
            required({"matchExpressions": [{"key": "zone", "operator": "In", "values": [1]}]}),
            r"matchExpressions\[0\]: values must be a list of strings",
        ),
        (
            required({"matchFields": [{"key": "spec.nodeName", "operator": "In", "values": ["a"]}]}),
            r"nodeSelectorTerms\[0\]: node selector term: matchFields supports only metadata.name",
        ),
    ],
)
def test_invalid_affinity_is_rejected_naming_pod_and_field(affinity: Any, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        pod_from_k8s(k8s_pod(affinity))
