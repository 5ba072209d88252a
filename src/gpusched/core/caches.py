"""The typed caches a snapshot carries for its plugins, each bounded, least recently used
dropped first.

A long-running scheduler sees an open-ended number of pod shapes and relearns its profile now
and then; without a bound the cached rows of shapes and profiles long gone would grow without
end. A dropped entry is simply recomputed when asked for again, so the bound never changes a
placement. Each kind of value has its own cache:

- ``masks``: node masks of label and taint constraints, by constraint (``NodeAffinity``,
  ``TaintToleration``; ``node_mask``): a node relabelled in place (a taint lifted, a label
  added) has its own entry of each mask recomputed when the mask is next read, the others kept;
- ``domains``: per label key, each node's domain (``ClusterState.domains``);
- ``tables``: per-snapshot tables of the policies computed from node capacities alone;
- ``rows``: node-local values by pod shape, refreshed by node generation (``policies.cache``);
- ``soft_taints``: whether any node has a PreferNoSchedule taint.

A copy of the snapshot starts with empty caches (``fresh``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """A mapping of at most ``capacity`` entries; reading or writing an entry makes it the most
    recently used, and the least recently used goes first."""

    __slots__ = ("_data", "capacity")

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Remove ``key``'s entry and return its value (None if there was none)."""
        return self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> list[K]:
        return list(self._data)

    def clear(self) -> None:
        self._data.clear()


@dataclass(slots=True)
class Rows:
    """Node-local arrays (first axis = node) and the node generation each row was computed at."""

    arrays: tuple[npt.NDArray[np.generic], ...]
    seen: npt.NDArray[np.int64]


@dataclass(slots=True)
class Mask:
    """A node mask, the length of the relabel log when it was brought up to date, and whether
    every node passes."""

    mask: npt.NDArray[np.bool_]
    seen: int
    everywhere: bool


class SnapshotCaches:
    __slots__ = ("capacity", "domains", "masks", "relabelled", "rows", "soft_taints", "tables")

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.masks: LRUCache[Hashable, Mask] = LRUCache(capacity)
        self.relabelled: list[int] = []
        """The nodes relabelled in place, in order (a log the masks catch up with)."""
        self.domains: LRUCache[str, tuple[npt.NDArray[np.int64], tuple[str, ...]]] = LRUCache(capacity)
        self.tables: LRUCache[Hashable, npt.NDArray[Any]] = LRUCache(capacity)
        self.rows: LRUCache[Hashable, Rows] = LRUCache(capacity)
        self.soft_taints: bool | None = None

    def fresh(self) -> SnapshotCaches:
        """Empty caches of the same capacity (for a copy of the snapshot)."""
        return SnapshotCaches(self.capacity)

    def __len__(self) -> int:
        return len(self.masks) + len(self.domains) + len(self.tables) + len(self.rows)

    def clear(self) -> None:
        for c in (self.masks, self.domains, self.tables, self.rows):
            c.clear()
        self.relabelled.clear()
        self.soft_taints = None

    def node_mask(
        self, key: Hashable, size: int, passes: Callable[[int], bool]
    ) -> npt.NDArray[np.bool_] | None:
        """The mask of constraint ``key`` over the ``size`` nodes (``passes(node)``: whether one
        node passes), None when every node passes. Computed once per snapshot; after relabels
        only the nodes relabelled since it was last read are asked again."""
        entry = self.masks.get(key)
        if entry is None:
            mask = np.fromiter(map(passes, range(size)), dtype=bool, count=size)
            mask.flags.writeable = False
            entry = Mask(mask, len(self.relabelled), bool(mask.all()))
            self.masks.put(key, entry)
        elif entry.seen != len(self.relabelled):
            mask = entry.mask.copy()  # a mask handed out before stays as it was
            for node in set(self.relabelled[entry.seen :]):
                mask[node] = passes(node)
            mask.flags.writeable = False
            entry.mask, entry.seen, entry.everywhere = mask, len(self.relabelled), bool(mask.all())
        return None if entry.everywhere else entry.mask

    def labels_changed(self, node: int, size: int) -> None:
        """Node ``node``'s labels or taints changed, and its generation moved: the masks
        recompute its entry when next read (``node_mask``); ``domains`` and ``soft_taints`` are
        dropped. ``tables`` read node capacities alone, and ``rows`` are node-local and
        refreshed by generation, so they stay: one relabelled node costs one entry per mask and
        one row per pod shape, not every node's. A log grown past four entries a node is
        dropped with the masks (recomputed whole once)."""
        self.relabelled.append(node)
        if len(self.relabelled) > 4 * max(size, 16):
            self.masks.clear()
            self.relabelled.clear()
        self.domains.clear()
        self.soft_taints = None
