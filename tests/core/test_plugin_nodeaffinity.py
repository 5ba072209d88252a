"""NodeAffinity (Filter): the node selector."""

from __future__ import annotations

import pytest

from builders import node, share
from gpusched.core.cluster import ClusterState
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code


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
