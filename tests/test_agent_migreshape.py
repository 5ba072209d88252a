"""The agent re-cuts a GPU's free MIG slices through its backend (issue 31 item 3 way (a), first part):
the fake backend creates and destroys instances as NVML would; a failed step rolls everything back; a plan
that would destroy a held instance is refused. With the core's plan, a pending slice then fits."""

from __future__ import annotations

import json

import pytest

from gpusched.agent.fake import FakeBackend
from gpusched.agent.mig import mig_annotation
from gpusched.agent.migprofiles import MigError
from gpusched.agent.migreshape import ReshapeError, apply
from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import plan_node
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.k8s.migconvert import node_mig

DOC = {
    "hostname": "n",
    "gpus": [
        {
            "model": "NVIDIA A100-SXM4-80GB",
            "migMode": True,
            "mig": [
                {"profile": "2g.20gb", "start": 0, "uuid": "MIG-2g"},
                {"profile": "1g.10gb", "start": 2, "uuid": "MIG-1a"},
                {"profile": "1g.10gb", "start": 3, "uuid": "MIG-1b"},
                {"profile": "3g.40gb", "start": 4, "uuid": "MIG-3g"},
            ],
        },
        {"model": "NVIDIA A100-SXM4-80GB"},
    ],
}


def backend() -> FakeBackend:
    return FakeBackend.from_dict(json.loads(json.dumps(DOC)), "test")


def layout(b: FakeBackend) -> set[tuple[str, int]]:
    d = b.inventory().by_index(0)
    assert d is not None
    return {(m.profile, m.placement_start) for m in d.mig_instances}


def test_free_slices_are_recut_and_the_held_instance_stays() -> None:
    b = backend()
    made = apply(b, 0, [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)], [("4g.40gb", 0)], held={"MIG-3g"})
    assert [(m.profile, m.placement_start) for m in made] == [("4g.40gb", 0)]
    assert made[0].uuid.startswith("MIG-")
    assert layout(b) == {("4g.40gb", 0), ("3g.40gb", 4)}
    assert b.inventory().by_index(0).mig_instances[0].uuid == "MIG-3g"  # type: ignore[union-attr]


def test_a_failed_step_rolls_everything_back() -> None:
    b = backend()
    before = layout(b)
    with pytest.raises(ReshapeError, match=r"GPU 0: re-cut failed and was rolled back: .*overlaps"):
        apply(b, 0, [("1g.10gb", 2)], [("2g.20gb", 2), ("1g.10gb", 0)], held=set())  # 1g at 0: on the 2g
    assert layout(b) == before


def test_a_plan_destroying_a_held_or_missing_instance_is_refused_and_changes_nothing() -> None:
    b = backend()
    before = layout(b)
    with pytest.raises(ReshapeError, match=r"MIG 3g\.40gb at slice 4 \(MIG-3g\) is held by a live pod"):
        apply(b, 0, [("3g.40gb", 4)], [("4g.40gb", 4)], held={"MIG-3g"})
    with pytest.raises(ReshapeError, match=r"no MIG 7g\.80gb at slice 0 to destroy"):
        apply(b, 0, [("7g.80gb", 0)], [], held=set())
    with pytest.raises(ReshapeError, match="GPU 1: not a GPU in MIG mode"):
        apply(b, 1, [], [("1g.10gb", 0)], held=set())
    assert layout(b) == before
    with pytest.raises(MigError, match="GPU 1 is not a GPU in MIG mode"):
        b.create_mig_instance(1, "1g.10gb", 0)


def test_with_the_cores_plan_a_pending_slice_fits_after_the_recut() -> None:
    """A 4g pod waits (all-balanced, its 3g held): the core plans, the agent applies, the node's new
    geometry (its annotation, as the scheduler reads it) books the 4g."""
    b = backend()

    def spec() -> NodeSpec:
        nm = node_mig(
            {
                "metadata": {
                    "name": "n",
                    "annotations": {"gpusched.io/mig-geometry": mig_annotation(b.inventory(), "mixed")},
                }
            }
        )
        return NodeSpec("n", 8000, 8000, mig=nm)

    books = ClusterState([spec()])
    books.assume(PodSpec("runs", mig=("3g.40gb",)), 0, (), mig=(MigSlot(0, 4, "3g.40gb"),))
    want = PodSpec("waits", mig=("4g.40gb",))
    assert not books.mig_fits(want, 0)
    nm = books.nodes[0].mig
    assert nm is not None
    plan = plan_node(nm, books.mig_books[0], want.mig, DemandMix(["3g.40gb", "4g.40gb"]))
    assert plan is not None
    apply(
        b,
        plan.gpu,
        [(i.profile, i.start) for i in plan.destroy],
        [(i.profile, i.start) for i in plan.create],
        held={"MIG-3g"},
    )
    after = ClusterState([spec()])
    after.assume(PodSpec("runs", mig=("3g.40gb",)), 0, (), mig=(MigSlot(0, 4, "3g.40gb"),))
    assert after.assume(want, 0, ()).mig == (MigSlot(0, 0, "4g.40gb"),)
