"""Tenant queues as pure input: quotas, limits, weights, and the validated tree they form.

A queue has a nominal quota (what it is guaranteed), optionally a borrowing limit (how much more
it may take from its parent's pool, like Kueue's ``borrowingLimit``; None = no limit) and a
lending limit (how much of its own quota its siblings may borrow, like Kueue's ``lendingLimit``;
None = all of it), a parent (the hierarchy: Kueue cohorts, KAI and Volcano parent queues) and a
weight for sharing the surplus (KAI's over-quota weight, Kueue's fair-sharing weight).

Quotas are integers in three dimensions, optionally per GPU model:

- ``gpus``: whole GPUs (a pod's ``num_gpu`` when it takes whole GPUs; shares count 0 here);
- ``gpu_milli``: milli-GPU (``num_gpu * gpu_milli``; a whole GPU is 1000);
- ``gpu_memory_mib``: GPU memory the pod asks for (``num_gpu * gpu_memory_mib``).

and DRA devices per DeviceClass (``Quota.devices``, keys as ``dra_key`` writes them):

- ``devices/<class>``: devices of that DeviceClass a pod's claims ask for (whole GPUs, MIG
  partitions; a share of a device with consumable capacity counts 0 here);
- ``capacity/<class>/<capacity>``: capacity a pod's claims ask of that class's shared devices
  (``capacity.requests``, e.g. ``capacity/gpu-share.example.com/memory`` in bytes).

A dimension left out (None) is not limited by that queue's tree unless another queue of the tree
gives it, in which case the queue has 0 of it (as Kueue treats a resource a ClusterQueue does not
cover). A per-model quota (``per_model``) limits the pods that land on GPUs of that model, in
addition to the total. Pods are charged to leaf queues only; inner queues pool their children.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpusched.core.errors import InvalidInput
from gpusched.core.gpumodel import canonical_gpu_model

DIMENSIONS = ("gpus", "gpu_milli", "gpu_memory_mib")
ANY_MODEL = ""
"""The model of the total (every GPU model together) in a ``ResourceKey``."""


DRA_DEVICES, DRA_CAPACITY = "devices", "capacity"
_CLASS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CAPACITY_NAME = re.compile(r"^([a-z0-9.-]+/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$", re.IGNORECASE)


def dra_key(class_name: str, capacity: str = "") -> str:
    """The quota dimension of DeviceClass ``class_name``: its devices, or one capacity of its shares."""
    return f"{DRA_CAPACITY}/{class_name}/{capacity}" if capacity else f"{DRA_DEVICES}/{class_name}"


def dra_class(dim: str) -> str:
    """The DeviceClass a DRA dimension names ("" for the GPU dimensions)."""
    kind, _, rest = dim.partition("/")
    if kind == DRA_DEVICES:
        return rest
    return rest.partition("/")[0] if kind == DRA_CAPACITY else ""


def check_dra_key(dim: str, where: str) -> None:
    """``InvalidQueue`` naming ``where`` unless ``dim`` is ``devices/<class>`` or
    ``capacity/<class>/<capacity>`` with a DeviceClass name (a DNS subdomain) and a capacity name."""
    kind, _, rest = dim.partition("/")
    cls, _, cap = rest.partition("/") if kind == DRA_CAPACITY else (rest, "", "")
    if (
        kind not in (DRA_DEVICES, DRA_CAPACITY)
        or not _CLASS_NAME.match(cls)
        or len(cls) > 253
        or (kind == DRA_CAPACITY and not _CAPACITY_NAME.match(cap))
    ):
        raise InvalidQueue(
            f"{where}: {dim!r} is not a DRA quota key: devices/<DeviceClass name> or "
            "capacity/<DeviceClass name>/<capacity name> (docs/tenant-queues.md)"
        )


class InvalidQueue(InvalidInput):
    """A queue, or a tree of queues, that cannot be used as given: the message names the queue and
    the field (negative quota, unknown parent, a cycle of parents, a pod naming an unknown queue)."""


@dataclass(frozen=True, slots=True, order=True)
class ResourceKey:
    """One quota dimension: ``dim`` (one of ``DIMENSIONS``) of ``model`` (``ANY_MODEL``: all)."""

    model: str
    dim: str

    def __str__(self) -> str:
        return f"{self.dim}[{self.model}]" if self.model else self.dim


_NO_DEVICES: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Quota:
    """Amounts per dimension; None = not given."""

    gpus: int | None = None
    gpu_milli: int | None = None
    gpu_memory_mib: int | None = None
    devices: Mapping[str, int] = field(default_factory=lambda: _NO_DEVICES)
    """DRA dimensions (``dra_key``) and their amounts."""

    def amount(self, dim: str) -> int | None:
        return self.devices.get(dim) if "/" in dim else getattr(self, dim)

    def raised(self, dim: str, by: int) -> Quota:
        """This quota with ``dim`` raised by ``by`` (a dimension not given: 0 + by)."""
        if "/" in dim:
            return replace(self, devices={**self.devices, dim: self.devices.get(dim, 0) + by})
        amount: int = (getattr(self, dim) or 0) + by
        if dim == "gpus":
            return replace(self, gpus=amount)
        if dim == "gpu_milli":
            return replace(self, gpu_milli=amount)
        return replace(self, gpu_memory_mib=amount)

    def items(self) -> Iterable[tuple[str, int]]:
        for d in DIMENSIONS:
            v = getattr(self, d)
            if v is not None:
                yield d, v
        yield from sorted(self.devices.items())

    def check(self, where: str) -> None:
        for d in DIMENSIONS:
            v = getattr(self, d)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise InvalidQueue(f"{where}.{d} must be a non-negative integer, got {v!r}")
        for d, v in self.devices.items():
            check_dra_key(d, f"{where}.dra")
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidQueue(f"{where}.dra[{d}] must be a non-negative integer, got {v!r}")


_NO_MODELS: Mapping[str, Quota] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One queue. ``parent`` "" = a root. ``weight`` >= 1 (surplus is shared in proportion)."""

    name: str
    parent: str = ""
    nominal: Quota = field(default_factory=Quota)
    borrowing_limit: Quota | None = None
    """How much beyond its (subtree's) quota the queue may use; None = no limit; a dimension
    left out of a given Quota is not limited either."""
    lending_limit: Quota | None = None
    """How much of its quota others may use; None = all; a dimension left out: all of it."""
    per_model: Mapping[str, Quota] = field(default_factory=lambda: _NO_MODELS)
    """Nominal quota per GPU model (on top of the total ``nominal``)."""
    weight: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidQueue("queue: name is empty")
        where = f"queue {self.name}"
        self.nominal.check(f"{where}: nominal")
        if self.borrowing_limit is not None:
            self.borrowing_limit.check(f"{where}: borrowingLimit")
        if self.lending_limit is not None:
            self.lending_limit.check(f"{where}: lendingLimit")
        canonical: dict[str, Quota] = {}
        for model, q in self.per_model.items():
            if not model:
                raise InvalidQueue(f"{where}: perModel has an empty model name")
            q.check(f"{where}: perModel[{model}]")
            if q.devices:
                raise InvalidQueue(f"{where}: perModel[{model}]: DRA quotas are per DeviceClass, not model")
            key = canonical_gpu_model(model)
            if key in canonical:
                raise InvalidQueue(
                    f"{where}: perModel names GPU model {key} twice ({model!r} is the same model as "
                    "another entry, with or without its vendor prefix)"
                )
            canonical[key] = q
        if set(canonical) != set(self.per_model):
            object.__setattr__(self, "per_model", MappingProxyType(canonical))
        if not isinstance(self.weight, int) or isinstance(self.weight, bool) or self.weight < 1:
            raise InvalidQueue(f"{where}: weight must be a positive integer, got {self.weight!r}")
        if self.parent == self.name:
            raise InvalidQueue(f"{where}: parent names the queue itself")

    def nominal_of(self, key: ResourceKey) -> int | None:
        q = self.nominal if key.model == ANY_MODEL else self.per_model.get(key.model)
        return None if q is None else q.amount(key.dim)

    def device_classes(self) -> set[str]:
        """The DeviceClasses its quotas and limits name."""
        quotas = [self.nominal, self.borrowing_limit, self.lending_limit]
        return {dra_class(d) for q in quotas if q is not None for d in q.devices}

    def given(self) -> set[ResourceKey]:
        out = {ResourceKey(ANY_MODEL, d) for d, _ in self.nominal.items()}
        for m, q in self.per_model.items():
            out |= {ResourceKey(m, d) for d, _ in q.items()}
        return out


def _limit(q: Quota | None, key: ResourceKey) -> int | None:
    """A borrowing or lending limit for ``key`` (limits apply to every model's key alike)."""
    return None if q is None else q.amount(key.dim)


class QueueTree:
    """Validated queues: parents known, no cycles, names unique. Read-only after construction.

    ``keys(root)``: the resource keys limited in a root's tree (given by some queue there)."""

    def __init__(self, queues: Iterable[QueueSpec]) -> None:
        self.specs: dict[str, QueueSpec] = {}
        for q in queues:
            if q.name in self.specs:
                raise InvalidQueue(f"queue {q.name}: defined twice")
            self.specs[q.name] = q
        for q in self.specs.values():
            if q.parent and q.parent not in self.specs:
                raise InvalidQueue(f"queue {q.name}: parent {q.parent!r} is not a known queue")
        self.children: dict[str, list[str]] = {n: [] for n in self.specs}
        for q in self.specs.values():
            if q.parent:
                self.children[q.parent].append(q.name)
        self.paths: dict[str, tuple[str, ...]] = {}
        """Each queue and its ancestors, the queue first, the root last."""
        for name in self.specs:
            path: list[str] = []
            seen: set[str] = set()
            cur = name
            while cur:
                if cur in seen:
                    cyc = " -> ".join([*path[path.index(cur) :], cur])
                    raise InvalidQueue(f"queue {name}: parent cycle {cyc}")
                seen.add(cur)
                path.append(cur)
                cur = self.specs[cur].parent
            self.paths[name] = tuple(path)
        self._keys: dict[str, tuple[ResourceKey, ...]] = {}
        for name in self.specs:
            root = self.root(name)
            self._keys.setdefault(root, ())
            self._keys[root] = tuple(sorted(set(self._keys[root]) | self.specs[name].given()))
        self.order: tuple[str, ...] = tuple(sorted(self.specs, key=lambda n: (-len(self.paths[n]), n)))
        """Every queue, deepest first (children before their parents)."""

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __len__(self) -> int:
        return len(self.specs)

    def root(self, name: str) -> str:
        return self.paths[name][-1]

    def keys(self, name: str) -> tuple[ResourceKey, ...]:
        """The resource keys limited in the tree of ``name``."""
        return self._keys[self.root(name)]

    def is_leaf(self, name: str) -> bool:
        return not self.children[name]

    def leaves(self) -> tuple[str, ...]:
        return tuple(n for n in sorted(self.specs) if not self.children[n])

    def leaf(self, name: str, *, who: str = "pod") -> QueueSpec:
        """The leaf queue a pod names; InvalidQueue naming ``who`` when unknown or not a leaf."""
        if name not in self.specs:
            raise InvalidQueue(f"{who}: queue {name!r} is not a known queue")
        if self.children[name]:
            raise InvalidQueue(f"{who}: queue {name!r} has child queues; pods go to leaf queues")
        return self.specs[name]

    def borrowing_limit(self, name: str, key: ResourceKey) -> int | None:
        return _limit(self.specs[name].borrowing_limit, key)

    def lending_limit(self, name: str, key: ResourceKey) -> int | None:
        return _limit(self.specs[name].lending_limit, key)
