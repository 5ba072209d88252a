"""Clear errors for bad selectors and quantities, and what a result carries."""

from __future__ import annotations

import pytest
from dra_builders import GI, NODE1, claim, cls, dev, ex, first, req, slc

from gpusched.core.dra.allocator import Allocator, DoesNotFit, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import DeviceClass, Version
from gpusched.core.dra.quantity import format_quantity, parse_quantity
from gpusched.core.dra.selector import DraError, device_view
from gpusched.core.errors import GpuschedError

NV = "gpu.nvidia.com"
GPU_CLASS = DeviceClass(NV, (f'device.driver == "{NV}" && device.attributes["{NV}"].type == "gpu"',))
H100 = dev(
    "gpu-0", {"memory": 80 * GI}, {"type": "gpu", "productName": "H100", "driverVersion": Version("570.1.0")}
)
SLICES = [slc("node-1-gpus", "node-1", "node-1", NV, H100)]


def _allocate(*selectors: str) -> object:
    alloc = Allocator({NV: GPU_CLASS}, SLICES, CelCompiler())
    return alloc.allocate(NODE1, [claim("trainer", req("gpu", NV, 1, *selectors))])


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("device.driver ==", "CEL compile error"),
        ("noSuchVar", "undeclared reference"),
        ('device.attributes["other.com"].type == "gpu"', "CEL runtime error"),
        ("device.driver", "must evaluate to bool"),
    ],
)
def test_a_bad_selector_is_one_clear_error_naming_claim_request_and_expression(
    expression: str, says: str
) -> None:
    with pytest.raises(DraError) as info:
        _allocate(expression)
    message = str(info.value)
    assert isinstance(info.value, GpuschedError)
    assert "claim trainer, request gpu" in message and repr(expression) in message and says in message


def test_nvidia_class_and_quantity_selectors_pick_the_gpu() -> None:
    fits = _allocate(f'device.capacity["{NV}"].memory.compareTo(quantity("40Gi")) >= 0')
    assert isinstance(fits, Fits)
    assert [(r.request, r.pool, r.device) for r in fits.allocations[0].results] == [
        ("gpu", "node-1", "gpu-0")
    ]
    too_small = _allocate(f'device.capacity["{NV}"].memory.isGreaterThan(quantity("80Gi"))')
    assert not isinstance(too_small, Fits)


def test_device_view_groups_attributes_by_domain_and_versions_as_text() -> None:
    view = device_view(NV, H100)
    assert view["attributes"] == {NV: {"type": "gpu", "productName": "H100", "driverVersion": "570.1.0"}}
    assert view["capacity"] == {NV: {"memory": 80 * GI}}


@pytest.mark.parametrize(("text", "value"), [("8", 8), ("40Gi", 40 * GI), ("2k", 2000), ("1M", 10**6)])
def test_quantities_are_integers_in_base_units(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["500m", "0.5", "1.5Gi", "ten"])
def test_fractional_or_malformed_quantities_are_refused_by_name(text: str) -> None:
    with pytest.raises(GpuschedError, match="capacity memory"):
        parse_quantity(text, "capacity memory")


def test_a_result_carries_binding_conditions_and_is_node_local() -> None:
    device = dev("gpu-0", binding_conditions=("Ready",), binding_failure_conditions=("Failed",))
    slices = [slc("s", "node-1", "node-1", "d", device)]
    fits = Allocator({"c": cls("c", "d")}, slices, CelCompiler()).allocate(
        NODE1, [claim("c0", req("r", "c"))]
    )
    assert isinstance(fits, Fits)
    (result,) = fits.allocations[0].results
    assert (result.binding_conditions, result.binding_failure_conditions) == (("Ready",), ("Failed",))
    assert fits.allocations[0].node_name == "node-1"


def test_first_available_prefers_its_first_alternative_and_falls_back_in_order() -> None:
    """The upstream table never has two fitting alternatives; the order matters (a MIG slice before a GPU)."""
    mig = DeviceClass(
        "mig.nvidia.com", (f'device.driver == "{NV}" && device.attributes["{NV}"].type == "mig"',)
    )
    classes = {NV: GPU_CLASS, mig.name: mig}
    slice_ = dev("gpu-0-mig-1g10gb-19-6", {"memory": 10 * GI}, {"type": "mig", "profile": "1g.10gb"})
    wanted = claim("c", first("gpu", ex("mig", "mig.nvidia.com"), ex("full", NV)))
    both = [slc("s", "node-1", "node-1", NV, H100, slice_)]
    fits = Allocator(classes, both, CelCompiler()).allocate(NODE1, [wanted])
    assert isinstance(fits, Fits) and fits.allocations[0].results[0].request == "gpu/mig"
    only_gpu = [slc("s", "node-1", "node-1", NV, H100)]
    fits = Allocator(classes, only_gpu, CelCompiler()).allocate(NODE1, [wanted])
    assert isinstance(fits, Fits) and fits.allocations[0].results[0].request == "gpu/full"


def test_does_not_fit_names_the_request_without_devices_or_says_they_do_not_fit_together() -> None:
    alloc = Allocator({NV: GPU_CLASS}, SLICES, CelCompiler())
    none = alloc.allocate(
        NODE1, [claim("big", req("gpu", NV, 1, f'device.attributes["{NV}"].productName == "B200"'))]
    )
    assert isinstance(none, DoesNotFit)
    assert none.reason.startswith(
        "claim big, request gpu: no device on node node-1 matches class gpu.nvidia.com"
    )
    two = alloc.allocate(NODE1, [claim("a", req("gpu", NV)), claim("b", req("gpu", NV))])
    assert isinstance(two, DoesNotFit)
    assert two.reason.startswith("claims a, b: devices match every request on node node-1, but not together")


def test_a_selector_is_evaluated_only_on_devices_the_search_reaches_as_upstream_does() -> None:
    """kube-scheduler checks "in use" before the selectors and walks devices in order: a selector that
    fails on a device it never tries is no error (the differential test found the difference)."""
    anyone = DeviceClass("any", (f'device.driver == "{NV}"',))
    mig = dev("gpu-0-mig-1g5gb-0", {}, {"type": "mig", "profile": "1g.5gb"})
    full = dev("gpu-0", {}, {"type": "gpu"})  # no "profile": the selector fails to evaluate on it
    slices = [slc("s", "node-1", "node-1", NV, mig, full)]
    profile = f'device.attributes["{NV}"].profile == "1g.5gb"'
    fits = Allocator({"any": anyone}, slices, CelCompiler()).allocate(
        NODE1, [claim("c", req("r", "any", 1, profile))]
    )
    assert isinstance(fits, Fits) and fits.allocations[0].results[0].device == "gpu-0-mig-1g5gb-0"
    # the full GPU taken by an earlier request is in use: the selector is not evaluated on it either
    first_full = claim(
        "c", req("a", "any", 1, f'device.attributes["{NV}"].type == "gpu"'), req("b", "any", 1, profile)
    )
    reordered = [slc("s", "node-1", "node-1", NV, full, mig)]
    fits = Allocator({"any": anyone}, reordered, CelCompiler()).allocate(NODE1, [first_full])
    assert isinstance(fits, Fits)
    # reached while free, it is an error naming the device
    with pytest.raises(DraError, match=r"on device gpu\.nvidia\.com/node-1/gpu-0: CEL runtime error"):
        Allocator({"any": anyone}, reordered, CelCompiler()).allocate(
            NODE1, [claim("c", req("r", "any", 1, profile))]
        )


@pytest.mark.parametrize(
    ("value", "text"), [(15 * GI, "15Gi"), (1536 * 2**20, "1536Mi"), (50, "50"), (0, "0"), (1000, "1000")]
)
def test_quantities_are_written_in_canonical_form(value: int, text: str) -> None:
    assert format_quantity(value) == text and parse_quantity(text) == value
