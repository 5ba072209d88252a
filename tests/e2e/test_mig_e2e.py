"""MIG end to end on kwok (issue 31 items 1 and 5): the standalone scheduler reads the agent's
``gpusched.io/mig-geometry`` from the Node, books each ``nvidia.com/mig-<profile>`` pod on the GPU and start
that the core's placement plans, writes them into ``gpusched.io/assignment``, and the pods start; no two
slices overlap. Bad input (an unknown profile, a profile the GPU model lacks, a slice with a whole GPU) gets
an event naming it, and nothing is booked for it. ``kubectl gpusched doctor pod`` names the slice a pending
pod waits for and the re-cut that would host it; the scheduler asks for that re-cut, and once it is
published (as the agent would) the pod lands where doctor said."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.mig import ANN_MIG, mig_annotation
from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot
from gpusched.core.mig.geometry import Geometry
from gpusched.k8s.convert import ANN_ASSIGNMENT, node_from_k8s, pod_from_k8s
from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

GROUP = "gpusched.io/e2e-group"
A100 = "NVIDIA A100-SXM4-80GB"
LAYOUTS = (  # GPU 0: mig-manager's all-balanced; GPU 1: 4g + 3g
    (("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)),
    (("4g.40gb", 0, 4), ("3g.40gb", 4, 4)),
)
GOOD = (
    ("big", "4g.40gb"),
    ("half-a", "3g.40gb"),
    ("small", "1g.10gb"),
    ("half-b", "3g.40gb"),
    ("mid", "2g.20gb"),
)


def inventory(layouts: tuple[tuple[tuple[str, int, int], ...], ...] = LAYOUTS) -> Inventory:
    devs = tuple(
        GpuDevice(
            g, f"GPU-{g}", A100, 81920, f"00000000:{g + 16:02x}:00.0", 8, 0,
            mig_capable=True, mig_enabled=True,
            mig_instances=tuple(
                MigInstance(p, start, size, f"MIG-{g}-{p}-{start}", slices_gi=size, slices_ci=size)
                for p, start, size in layout
            ),
        )
        for g, layout in enumerate(layouts)
    )  # fmt: skip
    return Inventory("mig", "550.107.02", (12, 4), devs)


def mig_node_body(
    name: str, tag: str, layouts: tuple[tuple[tuple[str, int, int], ...], ...] = LAYOUTS,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A kwok node of node group ``tag`` with A100 80GB GPUs cut as ``layouts``: the MIG geometry the agent
    publishes and the ``nvidia.com/mig-<profile>`` counts the device plugin advertises."""
    cap = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    for layout in layouts:
        for p, _s, _n in layout:
            res = f"nvidia.com/mig-{p}"
            cap[res] = str(int(cap.get(res, "0")) + 1)
    return {
        "metadata": {
            "name": name,
            "labels": {
                "type": "kwok",
                GROUP: tag,
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/mig.strategy": "mixed",
                **(labels or {}),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                ANN_MIG: str(mig_annotation(inventory(layouts), "mixed")),  # as the agent writes it
            },
        },
        "status": {"capacity": cap, "allocatable": cap},
    }


def create_mig_node(cp: ControlPlane, v1: Any, body: dict[str, Any]) -> None:
    """Create the node ``body`` and wait until kwok says it is Ready."""
    name = body["metadata"]["name"]
    v1.create_node(body, _preload_content=False)

    def ready() -> bool:
        n = json.loads(v1.read_node(name, _preload_content=False).data)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))

    wait_until(ready, timeout=120, what="kwok node Ready", control_plane=cp, interval=1)


class Mig:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:8]
        self.ns = f"mig-{self.tag}"
        self.node = f"mig-{self.tag}"
        self.scheduler = f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path))
        self.v1 = client.CoreV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})

    def node_body(self, layouts: tuple[tuple[tuple[str, int, int], ...], ...] = LAYOUTS) -> dict[str, Any]:
        return mig_node_body(self.node, self.tag, layouts)

    def create_node(self) -> None:
        create_mig_node(self.cp, self.v1, self.node_body())

    def pod_body(self, name: str, limits: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "schedulerName": self.scheduler,
                "nodeSelector": {GROUP: self.tag},
                "containers": [{"name": "c", "image": "pause", "resources": {"limits": limits}}],
            },
        }

    def pod(self, name: str, limits: dict[str, str]) -> None:
        self.v1.create_namespaced_pod(self.ns, self.pod_body(name, limits), _preload_content=False)

    def read(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.v1.read_namespaced_pod(name, self.ns, _preload_content=False).data))

    def running(self, name: str) -> dict[str, Any] | None:
        """The pod's assignment once it is bound and Running, else None."""
        p = self.read(name)
        ann = (p["metadata"].get("annotations") or {}).get(ANN_ASSIGNMENT)
        if p["spec"].get("nodeName") and ann and p["status"].get("phase") == "Running":
            return dict(json.loads(ann))
        return None

    def events(self, name: str) -> list[tuple[str, str]]:
        evs = json.loads(
            self.v1.list_namespaced_event(
                self.ns, field_selector=f"involvedObject.name={name}", _preload_content=False
            ).data
        )["items"]
        return [(e["reason"], e.get("message") or "") for e in evs]

    def cleanup(self) -> None:
        self.v1.delete_namespace(self.ns, _preload_content=False)
        self.v1.delete_node(self.node, _preload_content=False)


@pytest.fixture
def mig(control_plane: ControlPlane) -> Iterator[Mig]:
    m = Mig(control_plane)
    try:
        yield m
    finally:
        m.cleanup()


def plan(m: Mig) -> dict[str, tuple[MigSlot, ...]]:
    """Where the core's placement puts the pods, one after the other, on a copy of the node's books."""
    books = ClusterState([node_from_k8s(m.node_body())])
    out = {}
    for name, profile in GOOD:
        body = m.pod_body(name, {f"nvidia.com/mig-{profile}": "1"})
        out[name] = books.assume(pod_from_k8s(body), 0, ()).mig
    return out


def test_pods_of_mixed_profiles_land_on_the_planned_slices_and_bad_ones_are_named(mig: Mig) -> None:
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    mig.create_node()
    want = plan(mig)
    sched = StandaloneScheduler(mig.api, SchedulerConfig(scheduler_name=mig.scheduler)).start()
    try:
        bad = {
            "unknown": (
                {"nvidia.com/mig-3g.41gb": "1"},
                "InvalidGPURequest",
                "unknown MIG profile '3g.41gb'",
            ),
            "lacking": ({"nvidia.com/mig-1g.5gb": "1"}, "FailedScheduling", "has no MIG profile 1g.5gb"),
            "both": (
                {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"},
                "InvalidGPURequest",
                "asks for both a MIG slice (1g.10gb) and a whole GPU",
            ),
        }
        for name, (limits, _r, _m) in bad.items():
            mig.pod(name, limits)
        for name, (_l, reason, message) in bad.items():
            wait_until(
                lambda n=name, r=reason, msg=message: any(e[0] == r and msg in e[1] for e in mig.events(n)),
                timeout=60,
                what=f"a {reason} event on {name} naming what is wrong",
                interval=1,
            )
        got: dict[str, list[dict[str, Any]]] = {}
        for name, profile in GOOD:  # one after the other: the scheduler sees them in the plan's order
            mig.pod(name, {f"nvidia.com/mig-{profile}": "1"})
            try:
                wait_until(
                    lambda n=name: mig.running(n), timeout=60, what=f"{name} bound and Running", interval=1
                )
            except TimeoutError as e:  # say why: its events and status
                node = json.loads(mig.v1.read_node(mig.node, _preload_content=False).data)
                ann = node["metadata"].get("annotations")
                seen = {n: mig.events(n) for n, _p in GOOD}
                raise AssertionError(f"{e}: {seen} {mig.read(name).get('status')} {ann}") from None
            a = mig.running(name)
            assert a is not None and a["node"] == mig.node and a["gpus"] == [], a
            got[name] = a["mig"]
        for name, _p in GOOD:
            assert [MigSlot(s["gpu"], s["start"], s["profile"]) for s in got[name]] == list(want[name]), name
        geom = Geometry.of("a100-80gb")
        for g in (0, 1):  # nothing overlaps: the memory slices of the slices on one GPU are disjoint
            used = [
                i for s in (s for sl in got.values() for s in sl) if s["gpu"] == g
                for i in range(s["start"], s["start"] + geom.kind(s["profile"]).mem_slices)
            ]  # fmt: skip
            assert len(used) == len(set(used)), (g, got)
        assert sum(len(v) for v in got.values()) == len(GOOD)
        for name in bad:
            assert not mig.read(name)["spec"].get("nodeName"), name  # nothing booked for them
    finally:
        sched.stop()


def doctor_pod(m: Mig, name: str) -> dict[str, Any]:
    """``kubectl gpusched doctor pod NS/NAME --json`` against the API, as kubectl runs the plugin."""
    code = "from gpusched.cli.doctor import kubectl_main; kubectl_main()"
    args = ["doctor", "pod", f"{m.ns}/{name}", "--kubeconfig", str(m.cp.kubeconfig_path), "--json"]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_doctor_names_the_re_cut_a_pending_slice_needs_and_the_pod_lands_there(mig: Mig) -> None:
    """GPU 1 is held whole by a 4g and a 3g pod; a 7g.80gb pod waits. doctor names why (no 7g present) and
    the re-cut of idle GPU 0 that would host it; the scheduler asks that very re-cut; published as the agent
    would, the pod lands on GPU 0 at slice 0."""
    from gpusched.core.names import ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler

    mig.create_node()
    sched = StandaloneScheduler(mig.api, SchedulerConfig(scheduler_name=mig.scheduler)).start()
    try:
        for name, profile in (("big", "4g.40gb"), ("half", "3g.40gb")):
            mig.pod(name, {f"nvidia.com/mig-{profile}": "1"})
            wait_until(lambda n=name: mig.running(n), timeout=60, what=f"{name} Running", interval=1)
    finally:
        sched.stop()
    held = {s["gpu"] for n in ("big", "half") for s in (mig.running(n) or {})["mig"]}
    assert held == {1}, held  # GPU 1 held whole, GPU 0 idle (the core's placement)
    mig.pod("whole", {"nvidia.com/mig-7g.80gb": "1"})
    report = doctor_pod(mig, "whole")
    codes = {f["code"] for f in report["findings"] if f["severity"] == "error"}
    assert "mig-too-few" in codes, report["findings"]
    cf = report["counterfactuals"][0]
    assert cf["kind"] == "mig-recut" and cf["verified"] and cf["node"] == mig.node, cf
    assert f"GPU 0 of node {mig.node} could host it after re-cutting its free slices (idle)" in cf["message"]
    assert cf["change"]["create"] == [{"profile": "7g.80gb", "start": 0}]
    config = SchedulerConfig(scheduler_name=mig.scheduler, frag_interval_s=0.0)
    sched = StandaloneScheduler(mig.api, config).start()
    try:

        def gauges() -> bool:  # what /metrics shows: the pending slice, the one 3g slice held on the node
            sched.refresh_gauges()
            text = sched.metrics.exposition().decode()
            held = f'model="a100-80gb",node="{mig.node}",pool="default",profile="3g.40gb",state="held"}} 1.0'
            return 'gpusched_mig_pending_slices{profile="7g.80gb"} 1.0' in text and held in text

        wait_until(gauges, timeout=60, what="the MIG gauges", interval=1)

        def asked() -> dict[str, Any] | None:
            node = json.loads(mig.v1.read_node(mig.node, _preload_content=False).data)
            raw = (node["metadata"].get("annotations") or {}).get(ANN_MIG_RESHAPE)
            return dict(json.loads(raw)) if raw else None

        req = wait_until(asked, timeout=60, what="the scheduler's re-cut request", interval=1)
        assert (req["gpu"], req["create"]) == (cf["change"]["gpu"], cf["change"]["create"]), req
        assert sorted(req["destroy"], key=str) == sorted(cf["change"]["destroy"], key=str), req
        recut = ((("7g.80gb", 0, 8),), LAYOUTS[1])  # what the agent publishes after the re-cut
        body = mig.node_body(recut)
        status = json.dumps({"id": req["id"], "state": "success", "message": "re-cut"})
        ann = {ANN_MIG: body["metadata"]["annotations"][ANN_MIG], ANN_MIG_RESHAPE_STATUS: status}
        gone = {f"nvidia.com/mig-{p}": None for p in ("2g.20gb", "1g.10gb")}
        cap = {**gone, **body["status"]["capacity"]}
        mig.v1.patch_node_status(mig.node, {"status": {"capacity": cap, "allocatable": cap}})
        mig.v1.patch_node(mig.node, {"metadata": {"annotations": ann}})
        wait_until(lambda: mig.running("whole"), timeout=90, what="whole bound and Running", interval=1)
        a = mig.running("whole")
        assert a is not None and a["node"] == mig.node
        assert a["mig"] == [{"gpu": 0, "start": 0, "profile": "7g.80gb"}], a
    finally:
        sched.stop()
