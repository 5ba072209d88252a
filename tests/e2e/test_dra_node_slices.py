"""The DRA driver's ResourceSlices on the real apiserver (``resource.k8s.io/v1``): every shape the agent
publishes (whole GPUs, MIG devices, taints, shared GPUs with consumable capacity) passes the apiserver's
validation, and the publisher creates, leaves alone, updates with a new generation and deletes them through
``KubeSlices``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpusched.agent.dra.claims import ClaimNotFound
from gpusched.agent.dra.publish import KubeSlices, SlicePublisher
from gpusched.agent.dra.slices import build_slice
from gpusched.agent.fake import FakeBackend
from gpusched.testenv import ControlPlane

pytestmark = pytest.mark.e2e

DRIVER = "gpu.gpusched-e2e.io"
NODE = "dra-e2e-node"
DOC: dict[str, Any] = {
    "hostname": NODE,
    "driverVersion": "550.107.02",
    "cudaVersion": "12.4",
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "count": 2},
        {"model": "NVIDIA A100-SXM4-80GB", "migMode": True, "mig": [{"profile": "3g.40gb", "start": 4},
                                                                  {"profile": "1g.10gb", "start": 0}]},
    ],
}  # fmt: skip


def test_every_slice_shape_is_valid_and_the_publisher_keeps_it_on_the_real_apiserver(
    control_plane: ControlPlane,
) -> None:
    inv = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "t").inventory()
    api = KubeSlices(str(control_plane.kubeconfig_path))
    pub = SlicePublisher(api)
    bad = {inv.devices[0].uuid: 79, inv.devices[2].uuid: 48}
    try:
        assert pub.sync(build_slice(inv, NODE, DRIVER))
        (s,) = api.list_slices(DRIVER, NODE)
        assert [d["name"] for d in s["spec"]["devices"]] == [
            "gpu-0", "gpu-1", "gpu-2-mig-1g10gb-0", "gpu-2-mig-3g40gb-4"
        ]  # fmt: skip
        assert s["spec"]["pool"]["generation"] == 1
        assert not pub.sync(build_slice(inv, NODE, DRIVER))  # stored normalised, still unchanged
        assert pub.sync(build_slice(inv, NODE, DRIVER, unhealthy=bad, effect="NoExecute", shares=True))
        (s,) = api.list_slices(DRIVER, NODE)
        assert s["spec"]["pool"]["generation"] == 2
        gpu0 = s["spec"]["devices"][0]
        assert gpu0["allowMultipleAllocations"] is True
        assert [(t["key"], t["value"], t["effect"]) for t in gpu0["taints"]] == [
            (f"{DRIVER}/xid", "79", "NoExecute")
        ]
        assert set(gpu0["capacity"]) == {"memory", "milli"}
        assert not pub.sync(build_slice(inv, NODE, DRIVER, unhealthy=bad, effect="NoExecute", shares=True))
        try:
            api.get_claim("default", "no-such-claim")
            raise AssertionError("a claim that does not exist was read")
        except ClaimNotFound as e:
            assert "ResourceClaim default/no-such-claim not found" in str(e)
    finally:
        pub.delete(build_slice(inv, NODE, DRIVER))
    assert api.list_slices(DRIVER, NODE) == []


def test_dynamic_mig_pools_of_several_slices_are_valid_on_the_real_apiserver(
    control_plane: ControlPlane,
) -> None:
    """Nine A100s in MIG mode, every placement published (``--dra-mig dynamic``): 225 devices consuming
    counters (64 per slice at most) and nine counter sets (8 per slice at most) make a pool of six slices,
    which the apiserver accepts and the publisher keeps, generation by generation."""
    doc = {"hostname": NODE, "gpus": [{"model": "NVIDIA A100-SXM4-40GB", "count": 9, "migMode": True}]}
    backend = FakeBackend.from_dict(doc, "t")
    api = KubeSlices(str(control_plane.kubeconfig_path))
    pub = SlicePublisher(api)
    try:
        assert pub.sync(build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic"))
        stored = {s["metadata"]["name"]: s["spec"] for s in api.list_slices(DRIVER, NODE)}
        assert len(stored) == 6 and {s["pool"]["resourceSliceCount"] for s in stored.values()} == {6}
        assert sum(len(s.get("devices") or []) for s in stored.values()) == 9 * 25
        assert sum(len(s.get("sharedCounters") or []) for s in stored.values()) == 9
        assert not pub.sync(build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic"))
        backend.create_mig_instance(0, "3g.20gb", 4)  # an instance nobody prepared: its placements go
        assert pub.sync(build_slice(backend.inventory(), NODE, DRIVER, mig="dynamic"))
        assert {s["spec"]["pool"]["generation"] for s in api.list_slices(DRIVER, NODE)} == {2}
    finally:
        pub.delete(build_slice(backend.inventory(), NODE, DRIVER))
    assert api.list_slices(DRIVER, NODE) == []
