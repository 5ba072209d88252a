"""The CEL seam: the allocator evaluates compiled selectors through this Protocol.

A ``SelectorCompiler`` (the adapter around a CEL library, ``gpusched.core.dra.celexpr``) turns an
expression into a ``CompiledSelector``; ``matches`` answers for one device's CEL view (see
``device_view``) or raises ``SelectorError``. The allocator adds the claim, request and expression
to any such error, so a bad selector is one clear ``DraError``, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpusched.core.dra.model import Device, Version
from gpusched.core.errors import InvalidSpec


class DraError(InvalidSpec):
    """A claim, class or slice that cannot be allocated as written; the message names which."""


class SelectorError(InvalidSpec):
    """Raised by a selector adapter: the library's compile or runtime message (no location)."""


class CompiledSelector(Protocol):
    expression: str

    def matches(self, device: Mapping[str, object]) -> bool: ...


class SelectorCompiler(Protocol):
    def compile(self, expression: str) -> CompiledSelector: ...


CelValue = str | int | bool


def device_view(driver: str, device: Device) -> dict[str, object]:
    """The CEL variable ``device``: driver, attributes and capacity by domain, allowMultipleAllocations.
    Versions are seen as their text; capacities as integers in their base unit."""
    attributes: dict[str, dict[str, CelValue]] = {}
    for name, value in device.attributes.items():
        domain, short = _split(driver, name)
        attributes.setdefault(domain, {})[short] = value.text if isinstance(value, Version) else value
    capacity: dict[str, dict[str, int]] = {}
    for name, cap in device.capacity.items():
        domain, short = _split(driver, name)
        capacity.setdefault(domain, {})[short] = cap.value
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": device.allow_multiple_allocations,
    }


def _split(driver: str, name: str) -> tuple[str, str]:
    domain, _, short = name.rpartition("/")
    return (domain or driver, short)
