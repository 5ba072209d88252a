"""resource.k8s.io/v1 objects → the core's DRA model (k8s/dra/convert.py): what is read, and every
bad object refused with its kind, name and field (never a traceback)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from k8s_objects import allocation, claim, device_class, gpu_device, gpu_slice, whole

from gpusched.core.dra.model import (
    AllocationMode,
    Capacity,
    DeviceId,
    RequestPolicy,
    Taint,
    TaintEffect,
    Version,
)
from gpusched.k8s.dra.convert import (
    DraObjectError,
    allocation_from_k8s,
    claim_from_k8s,
    device_class_from_k8s,
    slice_from_k8s,
    taint_rule_from_k8s,
)

GI = 2**30


def test_an_nvidia_shaped_slice_is_read_with_integers_and_typed_attributes() -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
    s = slice_from_k8s(gpu_slice("node-a", [gpu_device(0), gpu_device(1, "80Gi", taints=[taint])]))
    assert (s.name, s.driver, s.pool, s.generation, s.slice_count) == (
        "node-a-gpu",
        "gpu.nvidia.com",
        "node-a",
        1,
        1,
    )
    assert s.scope.node_name == "node-a"
    d0, d1 = s.devices
    assert d0.attributes == {
        "type": "gpu",
        "productName": "NVIDIA A100-SXM4-40GB",
        "index": 0,
        "driverVersion": Version("550.54.15"),
    }
    assert d0.capacity == {"memory": Capacity(40 * GI)}
    assert d1.capacity["memory"].value == 80 * GI
    assert d1.taints == (Taint("gpu.nvidia.com/xid", "79", TaintEffect.NO_EXECUTE),)


def test_counters_capacity_policies_and_per_device_selection() -> None:
    dev = gpu_device(0, nodeName="node-a")
    dev["capacity"]["cores"] = {
        "value": "100",
        "requestPolicy": {"default": "10", "validRange": {"min": "10", "max": "100", "step": "10"}},
    }
    dev["consumesCounters"] = [{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "40Gi"}}}]
    dev["allowMultipleAllocations"] = True
    counters = [{"name": "gpu-0-counter-set", "counters": {"memory": {"value": "40Gi"}}}]
    obj = gpu_slice("node-a", [dev], sharedCounters=counters)
    del obj["spec"]["nodeName"]
    obj["spec"]["perDeviceNodeSelection"] = True
    s = slice_from_k8s(obj)
    (d,) = s.devices
    assert s.scope.per_device and d.scope is not None and d.scope.node_name == "node-a"
    assert d.capacity["cores"] == Capacity(100, RequestPolicy(default=10, min=10, max=100, step=10))
    assert d.consumes_counters[0].counters == {"memory": 40 * GI}
    assert s.shared_counters[0].counters == {"memory": 40 * GI}
    assert d.allow_multiple_allocations


def test_a_claim_with_first_available_constraints_tolerations_and_capacity_requests() -> None:
    requests = [
        {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "mig",
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": "true"}}],
                },
                {"name": "full", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
            ],
        },
        {
            "name": "share",
            "exactly": {
                "deviceClassName": "hami",
                "count": 2,
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                "capacity": {"requests": {"memory": "10Gi"}},
                "adminAccess": True,
            },
        },
    ]
    obj = claim("c", requests)
    obj["spec"]["devices"]["constraints"] = [
        {"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/productName"}
    ]
    c = claim_from_k8s(obj)
    assert c.name == "ns/c"
    mig, full = c.requests[0].first_available
    assert (mig.name, mig.class_name, mig.selectors, mig.count) == ("mig", "mig.nvidia.com", ("true",), 1)
    assert full.mode is AllocationMode.ALL
    share = c.requests[1].exactly
    assert share is not None
    assert (share.count, share.admin_access, share.capacity_requests) == (2, True, {"memory": 10 * GI})
    assert share.tolerations[0].operator == "Exists"
    assert c.constraints[0].match_attribute == "gpu.nvidia.com/productName"


def test_a_class_a_taint_rule_and_an_allocation() -> None:
    assert device_class_from_k8s(device_class("gpu", "device.driver == 'x'")).selectors == (
        "device.driver == 'x'",
    )
    rule = taint_rule_from_k8s(
        {
            "metadata": {"name": "r"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a"},
                "taint": {"key": "k", "effect": "NoSchedule"},
            },
        }
    )
    assert rule.selects("gpu.nvidia.com", "node-a", "gpu-3") and not rule.selects(
        "gpu.nvidia.com", "node-b", "gpu-3"
    )
    alloc = allocation("node-a", "gpu-0")
    alloc["devices"]["results"].append(
        {
            "request": "s",
            "driver": "d",
            "pool": "p",
            "device": "x",
            "shareID": "u",
            "consumedCapacity": {"memory": "1Gi"},
        }
    )
    held = allocation_from_k8s(claim("c", [whole()], allocation=alloc))
    assert held is not None
    assert [h.device for h in held] == [
        DeviceId("gpu.nvidia.com", "node-a", "gpu-0"),
        DeviceId("d", "p", "x"),
    ]
    assert held[1].shared and held[1].consumed == {"d/memory": GI}  # qualified, as the allocator books it
    assert allocation_from_k8s(claim("c", [whole()])) is None


def _set(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    cur: Any = out
    for p in path[:-1]:
        cur = cur[p]
    if value is _DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return out


_DELETE = object()
SLICE = gpu_slice("node-a", [gpu_device(0)])
CLAIM = claim("c", [whole()])


@pytest.mark.parametrize(
    ("convert", "obj", "expected"),
    [
        (
            slice_from_k8s,
            _set(SLICE, ("spec", "devices", 0, "capacity", "memory", "value"), "1.5Gi"),
            "ResourceSlice node-a-gpu: spec.devices[0].capacity.memory.value: '1.5Gi' is not a whole number",
        ),
        (
            slice_from_k8s,
            _set(SLICE, ("spec", "devices", 0, "attributes", "index"), {"int": 1, "string": "1"}),
            "ResourceSlice node-a-gpu: spec.devices[0].attributes.index: exactly one of int, bool",
        ),
        (
            slice_from_k8s,
            _set(SLICE, ("spec", "nodeName"), _DELETE),
            "ResourceSlice node-a-gpu: spec: one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection",
        ),
        (
            slice_from_k8s,
            _set(SLICE, ("spec", "devices", 0, "taints"), [{"key": "k", "effect": "Sometimes"}]),
            "ResourceSlice node-a-gpu: spec.devices[0].taints[0].effect: 'Sometimes' is not one of",
        ),
        (
            slice_from_k8s,
            _set(SLICE, ("spec", "devices"), {"gpu-0": {}}),
            "ResourceSlice node-a-gpu: spec.devices: expected a list, got dict",
        ),
        (
            claim_from_k8s,
            _set(CLAIM, ("spec", "devices", "requests", 0, "exactly"), _DELETE),
            "ResourceClaim ns/c: spec.devices.requests[0]: exactly one of exactly and firstAvailable",
        ),
        (
            claim_from_k8s,
            _set(
                CLAIM,
                ("spec", "devices", "requests", 0, "exactly", "capacity"),
                {"requests": {"memory": "500m"}},
            ),
            "ResourceClaim ns/c: spec.devices.requests[0].exactly.capacity.requests.memory: '500m'",
        ),
        (
            claim_from_k8s,
            _set(CLAIM, ("spec", "devices", "constraints"), [{"matchAttribute": "productName"}]),
            "ResourceClaim ns/c: spec.devices.constraints[0].matchAttribute: 'productName' must be fully",
        ),
        (
            claim_from_k8s,
            _set(CLAIM, ("spec", "devices", "requests", 0, "exactly", "allocationMode"), "Some"),
            "ResourceClaim ns/c: spec.devices.requests[0].exactly.allocationMode: 'Some' is not ExactCount",
        ),
        (
            device_class_from_k8s,
            _set(device_class("gpu"), ("spec", "selectors", 0, "cel"), {}),
            "DeviceClass gpu: spec.selectors[0].cel.expression: is required",
        ),
        (
            allocation_from_k8s,
            claim(
                "c",
                [whole()],
                allocation={"devices": {"results": [{"request": "gpu", "driver": "d", "pool": "p"}]}},
            ),
            "ResourceClaim ns/c: status.allocation.devices.results[0].device: is required",
        ),
    ],
)
def test_a_bad_object_is_refused_naming_its_kind_name_and_field(
    convert: Any, obj: Any, expected: str
) -> None:
    with pytest.raises(DraObjectError) as err:
        convert(obj)
    assert expected in str(err.value)
