"""The DynamicResources plugin in a scheduling cycle (core/plugins/dynamicresources.py): claims are
allocated per node, the chosen node's devices go to the front end's ledger at Reserve, what no node
can change is refused at PreFilter, and pods without claims are untouched."""

from __future__ import annotations

import dataclasses

import numpy as np
from dra_builders import claim, cls, dev, req, slc

from gpusched.core.cluster import ClusterState
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.inventory import DraInventory, PodClaims
from gpusched.core.dra.model import AllocatedState, ClaimAllocation, DeviceId
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code

DRIVER = "driver-a"


class RecordingLedger:
    def __init__(self, held: frozenset[DeviceId] = frozenset()) -> None:
        self.state = AllocatedState(held)
        self.reserved: dict[str, tuple[str, tuple[ClaimAllocation, ...]]] = {}

    def allocated(self) -> AllocatedState:
        return self.state

    def allocated_without(self, leaving: object) -> AllocatedState:
        return self.state

    def reserve(self, pod: str, node: str, allocations: tuple[ClaimAllocation, ...]) -> None:
        self.reserved[pod] = (node, allocations)

    def unreserve(self, pod: str) -> None:
        self.reserved.pop(pod, None)


def setup(ledger: RecordingLedger, class_name: str = "gpu") -> tuple[ClusterState, PodSpec]:
    nodes = [NodeSpec(n, 8000, 16384) for n in ("node-1", "node-2", "node-3")]
    slices = [
        slc("node-2", "node-2", "node-2", DRIVER, dev("gpu-0"), dev("gpu-1")),
        slc("node-3", "node-3", "node-3", DRIVER, dev("gpu-0")),
    ]
    inventory = DraInventory({"gpu": cls("gpu", DRIVER)}, tuple(slices), ledger, CelCompiler())
    c = claim("ns/c", req("gpu", class_name, 2))
    pod = PodSpec("p", cpu_milli=100, namespace="ns", claims=PodClaims((c,), (), inventory))
    return ClusterState(nodes), pod


def test_the_pod_goes_where_its_claims_fit_and_reserve_books_the_devices() -> None:
    ledger = RecordingLedger()
    snap, pod = setup(ledger)
    r = schedule_one(make_profile("bestfit"), pod, snap)
    assert r.scheduled and r.node_name == "node-2"
    node, (alloc,) = ledger.reserved["ns/p"]
    assert node == "node-2" and [res.device for res in alloc.results] == ["gpu-0", "gpu-1"]


def test_devices_other_claims_hold_are_not_given_and_the_reason_is_named() -> None:
    ledger = RecordingLedger(frozenset({DeviceId(DRIVER, "node-2", "gpu-1")}))
    snap, pod = setup(ledger)
    r = schedule_one(make_profile("bestfit"), pod, snap)
    assert not r.scheduled and not ledger.reserved
    assert r.diagnosis is not None
    msg = r.diagnosis.message()  # nodes failing alike count as one reason (no node name in it)
    assert "1 cannot allocate all claims (claim ns/c, request gpu: no device matches class gpu" in msg
    assert "2 cannot allocate all claims (claims ns/c: devices match every request, but not together" in msg


def test_an_unknown_class_is_refused_at_pre_filter() -> None:
    snap, pod = setup(RecordingLedger(), class_name="nope")
    r = schedule_one(make_profile("bestfit"), pod, snap)
    assert r.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert r.diagnosis is not None and r.diagnosis.pre_filter is not None  # before any node is tried
    assert "claim ns/c, request gpu: unknown device class nope" in r.status.message()


def test_a_pod_without_claims_is_not_constrained() -> None:
    snap, pod = setup(RecordingLedger())
    r = schedule_one(make_profile("bestfit"), dataclasses.replace(pod, claims=None), snap)
    assert r.scheduled and r.node_name == "node-1"


def test_claims_pack_onto_the_node_whose_devices_are_already_in_use() -> None:
    """Prefer: with one GPU of node-2 held, a one-GPU claim goes to node-2 (its other GPU), although
    the tie-break ranks the empty node-3 first; with nothing held there is no preference."""
    ledger = RecordingLedger(frozenset({DeviceId(DRIVER, "node-2", "gpu-1")}))
    nodes = [NodeSpec(n, 8000, 16384) for n in ("node-2", "node-3")]
    slices = [
        slc("node-2", "node-2", "node-2", DRIVER, dev("gpu-0"), dev("gpu-1")),
        slc("node-3", "node-3", "node-3", DRIVER, dev("gpu-0"), dev("gpu-1")),
    ]
    inventory = DraInventory({"gpu": cls("gpu", DRIVER)}, tuple(slices), ledger, CelCompiler())
    one = claim("ns/c", req("gpu", "gpu", 1))
    pod = PodSpec("p", cpu_milli=100, namespace="ns", claims=PodClaims((one,), (), inventory))
    node3_first = np.array([1, 0])
    r = schedule_one(make_profile("bestfit"), pod, ClusterState(nodes), tiebreak=node3_first)
    assert r.scheduled and r.node_name == "node-2"
    ledger.state = AllocatedState()
    r = schedule_one(make_profile("bestfit"), pod, ClusterState(nodes), tiebreak=node3_first)
    assert r.scheduled and r.node_name == "node-3"


def test_a_node_that_also_serves_gpus_through_the_device_plugin_gets_no_gpu_claim() -> None:
    ledger = RecordingLedger()
    nodes = [NodeSpec("node-2", 8000, 16384, gpu_count=2, gpu_model="A100"), NodeSpec("node-3", 8000, 16384)]
    slices = [
        slc("node-2", "node-2", "node-2", "gpu.nvidia.com", dev("gpu-0")),
        slc("node-3", "node-3", "node-3", "gpu.nvidia.com", dev("gpu-0")),
    ]
    inventory = DraInventory({"gpu": cls("gpu", "gpu.nvidia.com")}, tuple(slices), ledger, CelCompiler())
    pod = PodSpec(
        "p",
        cpu_milli=100,
        namespace="ns",
        claims=PodClaims((claim("ns/c", req("gpu", "gpu", 1)),), (), inventory),
    )
    r = schedule_one(make_profile("bestfit"), pod, ClusterState(nodes))
    assert r.scheduled and r.node_name == "node-3"
    r = schedule_one(make_profile("bestfit"), pod, ClusterState(nodes[:1]))
    assert not r.scheduled and r.diagnosis is not None
    assert "serves GPUs through the device plugin" in r.diagnosis.message()
