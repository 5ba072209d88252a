"""What one inventory's allocations repeat across candidate nodes and pods, computed once.

Every claim pod runs the allocator on every candidate node, and each run gathers the node's pools
(``gather_pools``: grouping, completeness, validity) and evaluates the class's and the request's CEL
selectors on the node's devices. Neither depends on what is allocated, only on the slices, the
node and the expression, so a ``DraInventory`` keeps them here for as long as it lives. A front end
builds a new inventory (and so a new memo) whenever a ResourceSlice, DeviceClass or DeviceTaintRule
changes (``k8s.dra.books.DraBooks``), and the entries are keyed by the objects themselves:
- pools by node (name and labels), valid only for the very slice objects they were gathered from
  (a different slice tuple, e.g. a gang's search leaving devices out, gathers again);
- a selector's result by (expression, driver, device object): a slice converted again brings new
  device objects, so nothing read from an old one is reused. The device is kept with its entry, so
  its ``id`` cannot be reused while the entry lives.
A selector that fails on a device is remembered as failing, and raised again each time. The selector
results are the only entries that grow with the claims (one per expression and device): past
``MATCHES_LIMIT`` they are dropped and evaluated again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from gpusched.core.dra.capacity import consumption
from gpusched.core.dra.model import Device, Node, ResourceSlice, qualify
from gpusched.core.dra.pools import Pool, gather_pools
from gpusched.core.dra.selector import CompiledSelector, SelectorError, device_view

_PoolKey = tuple[str, tuple[tuple[str, str], ...]]
MATCHES_LIMIT = 1_000_000
_T = TypeVar("_T")


class AllocatorMemo:
    def __init__(self) -> None:
        self._pools: dict[_PoolKey, tuple[tuple[ResourceSlice, ...], tuple[Pool, ...]]] = {}
        self._views: dict[tuple[str, int], tuple[Device, dict[str, object]]] = {}
        self._matches: dict[tuple[str, str, int], tuple[Device, bool | str]] = {}
        self._plain: dict[tuple[str, int], tuple[Device, dict[str, int] | None]] = {}
        self._limits: dict[tuple[str, int], tuple[Device, dict[str, int]]] = {}
        self._alone: dict[tuple[str, int], tuple[Device, bool]] = {}

    def pools(self, slices: Sequence[ResourceSlice], node: Node) -> list[Pool]:
        """``gather_pools(slices, node)``, gathered once per node for the same slice objects."""
        key = (node.name, tuple(sorted(node.labels.items())))
        hit = self._pools.get(key)
        if hit is None or not _same(hit[0], slices):
            hit = self._pools[key] = (tuple(slices), tuple(gather_pools(slices, node)))
        return list(hit[1])

    def matches(self, selector: CompiledSelector, driver: str, device: Device) -> bool:
        """``selector.matches(device_view(driver, device))``, evaluated once per device object;
        raises ``SelectorError`` (again) where it failed."""
        key = (selector.expression, driver, id(device))
        hit = self._matches.get(key)
        if hit is None or hit[0] is not device:
            if len(self._matches) >= MATCHES_LIMIT:
                self._matches.clear()
            try:
                value: bool | str = selector.matches(self._view(driver, device))
            except SelectorError as e:
                value = str(e)
            hit = self._matches[key] = (device, value)
        if isinstance(hit[1], str):
            raise SelectorError(hit[1])
        return hit[1]

    def consumption(self, driver: str, device: Device, requests: Mapping[str, int]) -> dict[str, int] | None:
        """``capacity.consumption``; kept per device object for a request without capacity requests
        (the caller must not change the dict it gets)."""
        if requests:
            return consumption(device, requests, driver)
        return self._kept(self._plain, _plain_consumption, driver, device)

    def fits_alone(self, driver: str, device: Device) -> bool:
        """Whether an allocation without capacity requests fits the device when no claim holds any
        of its capacity (``_capacity_fits`` with nothing held): kept per device object."""
        return self._kept(self._alone, _fits_alone, driver, device)

    def limits(self, driver: str, device: Device) -> dict[str, int]:
        """The device's capacities by qualified name, in their base unit (read-only)."""
        return self._kept(self._limits, _limits_of, driver, device)

    def _view(self, driver: str, device: Device) -> dict[str, object]:
        return self._kept(self._views, _view_of, driver, device)

    def _kept(
        self,
        table: dict[tuple[str, int], tuple[Device, _T]],
        compute: Callable[[AllocatorMemo, str, Device], _T],
        driver: str,
        device: Device,
    ) -> _T:
        """``compute(self, driver, device)``, kept in ``table`` per device object (the device is kept
        with its entry, so its ``id`` is not reused while the entry lives)."""
        key = (driver, id(device))
        hit = table.get(key)
        if hit is None or hit[0] is not device:
            hit = table[key] = (device, compute(self, driver, device))
        return hit[1]


def _plain_consumption(memo: AllocatorMemo, driver: str, device: Device) -> dict[str, int] | None:
    return consumption(device, {}, driver)


def _fits_alone(memo: AllocatorMemo, driver: str, device: Device) -> bool:
    used = memo.consumption(driver, device, {})
    limits = memo.limits(driver, device)
    return used is not None and all(v <= limits[n] for n, v in used.items())


def _limits_of(memo: AllocatorMemo, driver: str, device: Device) -> dict[str, int]:
    return {qualify(driver, n): c.value for n, c in device.capacity.items()}


def _view_of(memo: AllocatorMemo, driver: str, device: Device) -> dict[str, object]:
    return device_view(driver, device)


def _same(a: Sequence[ResourceSlice], b: Sequence[ResourceSlice]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
