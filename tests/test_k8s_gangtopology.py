"""A gang's topology request read from its pods' and group's annotations (k8s/gangtopology.py):
Kueue-style keys, and each kind of bad input refused with a message naming it."""

from __future__ import annotations

import pytest

from gpusched.core.gangtopology import GangTopology, InvalidTopology, Mode, TopologyLevels
from gpusched.core.names import ANN_TOPOLOGY_PREFERRED as PREF
from gpusched.core.names import ANN_TOPOLOGY_REQUIRED as REQ
from gpusched.k8s.gangtopology import gang_topology
from gpusched.k8s.groupref import API
from gpusched.k8s.podgroups import group_from_k8s

LEVELS = TopologyLevels(("nvidia.com/gpu.clique", "example.com/rack"))
CLIQUE = "nvidia.com/gpu.clique"


def ask(group: dict[str, str], *pods: dict[str, str]) -> GangTopology | None:
    return gang_topology(
        LEVELS, ("PodGroup ns/g", tuple(group.items())), [(f"ns/p{i}", a) for i, a in enumerate(pods)]
    )


def test_members_and_group_ask_for_one_level() -> None:
    assert ask({}, {}, {"other": "x"}) is None
    assert ask({}, {REQ: CLIQUE}, {REQ: CLIQUE}) == GangTopology(Mode.REQUIRED, (CLIQUE, "example.com/rack"))
    assert ask({PREF: "example.com/rack"}, {}, {}) == GangTopology(Mode.PREFERRED, ("example.com/rack",))
    assert ask({}, {PREF: CLIQUE}, {}) == GangTopology(
        Mode.PREFERRED, (CLIQUE, "example.com/rack")
    )  # silent members follow


def test_bad_input_is_refused_naming_it() -> None:
    with pytest.raises(
        InvalidTopology, match=r"pod ns/p0: gpusched.io/topology-required: 'zone' is not one of"
    ):
        ask({}, {REQ: "zone"})
    with pytest.raises(
        InvalidTopology, match=r"pod ns/p1: both gpusched.io/topology-required and .*preferred"
    ):
        ask({}, {REQ: CLIQUE}, {REQ: CLIQUE, PREF: CLIQUE})
    with pytest.raises(
        InvalidTopology,
        match=r"pod ns/p0 asks gpusched.io/topology-required: nvidia.com/gpu.clique "
        r"but pod ns/p1 asks gpusched.io/topology-preferred: nvidia.com/gpu.clique",
    ):
        ask({}, {REQ: CLIQUE}, {PREF: CLIQUE})
    with pytest.raises(InvalidTopology, match=r"PodGroup ns/g asks .* but pod ns/p0 asks .*example.com/rack"):
        ask({REQ: CLIQUE}, {REQ: "example.com/rack"})


def test_a_group_object_carries_its_topology_annotations() -> None:
    obj = {
        "metadata": {"name": "g", "namespace": "ns", "annotations": {REQ: CLIQUE, "x": "y"}},
        "spec": {"minMember": 2},
    }
    assert group_from_k8s(API.COSCHEDULING, obj).topology == ((REQ, CLIQUE),)
