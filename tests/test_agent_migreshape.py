"""The agent re-cuts a GPU's free MIG slices through its backend (issue 31 item 3 way (a), first part):
the fake backend creates and destroys instances as NVML would; a failed step rolls everything back; a plan
that would destroy a held instance is refused. With the core's plan, a pending slice then fits."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.allocation import ANN_ALLOCATED
from gpusched.agent.fake import FakeBackend
from gpusched.agent.mig import mig_annotation
from gpusched.agent.migprofiles import MigError
from gpusched.agent.migreshape import ReshapeError, apply
from gpusched.agent.pods import MemoryPods
from gpusched.agent.run import Agent, AgentConfig
from gpusched.agent.testing import FakeKubelet
from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import plan_node
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.names import ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS
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


# ------------------------------------------------------------- the request on the Node (the agent loop)
def holder() -> dict[str, Any]:
    """A running pod that was handed the 3g (MIG-3g)."""
    return {
        "metadata": {"name": "holder", "namespace": "t", "uid": "u-h", "annotations": {
            ANN_ALLOCATED: json.dumps({"main": {"nvidia.com/mig-3g.40gb": ["MIG-3g"]}})}},
        "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


@pytest.fixture
def agent_env() -> Iterator[dict[str, Any]]:
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    kubelet = FakeKubelet(d).start()
    pods = MemoryPods([holder()])
    agent = Agent(AgentConfig(node="n", plugin_dir=d), backend(), pods, pods)
    agent.plugin.start(watch_interval_s=0.05)
    yield {"agent": agent, "pods": pods, "kubelet": kubelet}
    agent.plugin.stop()
    kubelet.stop()
    shutil.rmtree(d, ignore_errors=True)


def ask(pods: MemoryPods, rid: str, destroy: list[tuple[str, int]], create: list[tuple[str, int]]) -> None:
    places = [[{"profile": p, "start": s} for p, s in x] for x in (destroy, create)]
    req = {"id": rid, "gpu": 0, "destroy": places[0], "create": places[1]}
    pods.patch_node("n", {"metadata": {"annotations": {ANN_MIG_RESHAPE: json.dumps(req)}}})


def status(pods: MemoryPods) -> dict[str, Any]:
    return dict(json.loads(pods.get_node("n")["metadata"]["annotations"][ANN_MIG_RESHAPE_STATUS]))


def test_the_agent_applies_a_request_once_lists_the_new_devices_and_answers(
    agent_env: dict[str, Any],
) -> None:
    agent: Agent = agent_env["agent"]
    pods: MemoryPods = agent_env["pods"]
    ask(pods, "r1", [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)], [("4g.40gb", 0)])
    agent.sync_node()
    assert status(pods) == {"id": "r1", "state": "success", "message": "GPU 0: created 4g.40gb at 0"}
    assert "nvidia.com/mig-4g.40gb" in {s.resource for s in agent.plugin.servers}  # a new resource, served
    assert agent.devices.devices("nvidia.com/mig-1g.10gb") == []
    regs = agent_env["kubelet"].wait_registrations(len(agent.plugin.servers))
    assert "nvidia.com/mig-4g.40gb" in {r.resource_name for r in regs}  # and registered with the kubelet
    geometry = json.loads(pods.get_node("n")["metadata"]["annotations"]["gpusched.io/mig-geometry"])
    assert {(i["profile"], i["start"]) for i in geometry["gpus"][0]["instances"]} == {
        ("4g.40gb", 0),
        ("3g.40gb", 4),
    }
    n = len(pods.node_patches)
    agent.sync_node()  # answered: not applied again
    assert len(pods.node_patches) == n


def test_a_request_destroying_a_held_instance_fails_and_changes_nothing(agent_env: dict[str, Any]) -> None:
    agent: Agent = agent_env["agent"]
    pods: MemoryPods = agent_env["pods"]
    ask(pods, "r2", [("3g.40gb", 4)], [("4g.40gb", 4)])
    agent.sync_node()
    st = status(pods)
    assert (st["id"], st["state"]) == ("r2", "failed") and "(MIG-3g) is held by a live pod" in st["message"]
    assert len(agent.devices.devices("nvidia.com/mig-1g.10gb")) == 2  # as it was


# ------------------------------------------------------------------ the node pool's way (way (b), item 3)
def label_way(pods: MemoryPods, way: str) -> None:
    pods.patch_node("n", {"metadata": {"labels": {"gpusched.io/mig-reshape-way": way}}})


def test_a_request_on_a_node_whose_way_is_off_or_unknown_is_refused(agent_env: dict[str, Any]) -> None:
    agent: Agent = agent_env["agent"]
    pods: MemoryPods = agent_env["pods"]
    for rid, way, why in (
        ("r3", "off", "MIG reshaping is off on node n"),
        ("r4", "sideways", "'sideways' is not a MIG reshape way"),
        ("r5", "mig-manager", "the mig-manager way is not set up on its agent"),  # no ConfigMaps given
    ):
        label_way(pods, way)
        ask(pods, rid, [("2g.20gb", 0)], [("1g.10gb", 0)])
        agent.sync_node()
        st = status(pods)
        assert (st["id"], st["state"]) == (rid, "failed") and why in st["message"], st
    assert len(agent.devices.devices("nvidia.com/mig-1g.10gb")) == 2  # nothing changed


def test_way_b_goes_through_mig_manager_and_never_recuts_a_gpu_a_live_pod_holds_part_of() -> None:
    """On a mig-manager node the agent hands the request to mig-manager (the label, the ConfigMap entry) and
    answers once the state says so; a GPU on which a live pod holds an instance is refused, since mig-manager
    re-creates every instance of a GPU it changes."""
    import threading

    from gpusched.agent.migrequest import MigReshapes
    from gpusched.agent.reshape.manager import LABEL_CONFIG, LABEL_STATE, ManagerSettings, MigManagerWay
    from migmanager_standin import StandInMigManager
    from test_agent_mig_manager import MemoryConfigMaps

    b = backend()
    pods = MemoryPods([holder()], nodes={"n": {"metadata": {"name": "n", "labels": {}}}})
    label_way(pods, "mig-manager")
    cms = MemoryConfigMaps()
    settings = ManagerSettings(timeout_s=10, poll_s=0.01)
    way = MigManagerWay(pods, cms, settings)
    plugin = type(
        "P",
        (),
        {"replace_inventory": lambda self, inv: None, "allocator": type("A", (), {"_unwritten": {}})()},
    )()

    def node_labels() -> dict[str, str]:
        return dict(pods.get_node("n")["metadata"]["labels"])

    def read_config() -> str | None:
        found = cms.read(settings.namespace, settings.configmap)
        return None if found is None else found[0].get("config.yaml")

    standin = StandInMigManager(
        "n", b, node_labels, lambda ch: pods.patch_node("n", {"metadata": {"labels": dict(ch)}}), read_config
    )
    stop = threading.Event()
    standin.run(stop, period=0.01)
    r = MigReshapes(b, plugin, pods, pods, "n", manager=way)  # type: ignore[arg-type]
    try:
        ask(pods, "held", [("2g.20gb", 0)], [("1g.10gb", 0), ("1g.10gb", 1)])
        assert r.check(pods.get_node("n"))
        st = status(pods)
        assert st["state"] == "failed" and "live pods hold MIG-3g" in st["message"] and standin.applied == []
        pods.pods = []  # the holder is gone
        ask(pods, "free", [("3g.40gb", 4)], [("1g.10gb", 4), ("1g.10gb", 5)])
        deadline = time.monotonic() + 10
        while not r.check(pods.get_node("n")) and time.monotonic() < deadline:
            time.sleep(0.02)
        st = status(pods)
        assert (st["id"], st["state"]) == ("free", "success"), (st, standin.errors)
        assert standin.applied == [node_labels()[LABEL_CONFIG]] and node_labels()[LABEL_STATE] == "success"
        assert sorted(m.profile for m in b.inventory().devices[0].mig_instances) == [
            "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb"
        ]  # fmt: skip
    finally:
        stop.set()
