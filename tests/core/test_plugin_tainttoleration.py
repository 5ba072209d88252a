"""TaintToleration (Filter): hard taint effects and tolerations."""

from __future__ import annotations

import pytest

from builders import node, share
from gpusched.core.cluster import ClusterState
from gpusched.core.model import Taint, Toleration
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code

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
