"""How good a full solution of the allocator is: better choices than first-fit (issue 32 item 2).

kube-scheduler takes the first solution in device order (KEP-4970, device scoring, is open). The
allocator can enumerate more of them (``SearchBudget``) and keep the one with the least ``Score``,
compared field by field (lower is better; a tie keeps the earlier solution, so first-fit wins ties):

1. ``misaligned`` -- per claim, the PCIe roots beyond the first and the NUMA nodes beyond the first
   over its devices (the standard attributes ``resource.kubernetes.io/pcieRoot`` and
   ``resource.kubernetes.io/numaNode``; devices without them count for nothing);
2. ``counters_lost`` -- how much less usable the counter sets the solution consumes are left, for
   the demand seen (below);
3. ``sets_opened`` -- counter sets (GPUs in dynamic-MIG mode) wholly free before and consumed after:
   of placements that lose as much, one on a GPU already cut, keeping whole GPUs whole;
4. ``opened`` -- devices that allow multiple allocations and were not shared before (best fit for
   consumable capacity: a share goes onto a device already shared when it fits, keeping whole
   devices free);
5. ``slack`` -- per mille of each capacity left on the shared devices the solution uses (the tightest
   fit first);
6. ``broken`` -- loss of free connected groups of whole devices: the free devices of each PCIe root
   (else NUMA node) weigh ``free**2``, so a solution takes from the group with the fewest free
   devices and leaves the best-connected free sets unbroken (the core's rule for GPUs).

**Counters.** A counter set whose devices map to one MIG model's profiles and starts (the profile
attribute names a profile of the model, the ``memory-slice-<n>`` counters it consumes are the
profile's span at a legal start; the device consuming every memory slice is the full GPU) is
measured by the core's MIG fragmentation (``core/mig/measure.py``): the growth of F, the free memory
slices the demand cannot use. Any other counter set gets a generic measure: the devices consuming it
are grouped in kinds (by profile attribute, else by what they consume); a kind can still take
``fit`` more devices (free ones that fit what is left, bounded by what is left of the counters all
its devices consume alike, e.g. multiprocessors), each worth its per-mille share of the set; the
measure is the weighted worth lost. The **demand seen** weighs each kind: one for every kind the set
offers, plus one for each device of that kind held on the node's pools.

Everything is an integer; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.dra.model import AttrValue, Device, DeviceId, DeviceResult, qualify
from gpusched.core.dra.pools import Candidate, Pool
from gpusched.core.mig.geometry import ME_BIT, SM_SHIFT, Geometry, span
from gpusched.core.mig.measure import I64, DemandMix, lost_table
from gpusched.core.mig.profiles import MODEL_CLASSES, Kind

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
_SLICE = re.compile(r"^memory-slice-(\d+)$")


@dataclass(frozen=True, order=True)
class Score:
    """A solution's cost, compared field by field; lower is better (see the module's docstring)."""

    misaligned: int = 0
    counters_lost: int = 0
    sets_opened: int = 0
    opened: int = 0
    slack: int = 0
    broken: int = 0


@dataclass(frozen=True)
class SearchBudget:
    """How many full solutions the allocator enumerates per node and claims, and how many device
    tries it may spend after the first one; beyond either it keeps the best found so far (at least
    the first solution, kube-scheduler's). ``solutions == 1`` is kube-scheduler's first-fit."""

    solutions: int = 1
    tries: int = 0


FIRST_FIT = SearchBudget(1, 0)
SCORED = SearchBudget(8, 500)
"""The scheduler's default: up to 8 solutions, 500 device tries after the first (measured in
docs/dra.md with ``gpusched bench dra-score``: as good as 32 / 2000 on NVIDIA-shaped dynamic-MIG
nodes, at a third of the extra cost)."""


class Usage:
    """What the search holds at a full solution (read-only views of its books)."""

    def __init__(
        self,
        exclusive: set[DeviceId],
        consumed: Mapping[DeviceId, Mapping[str, int]],
        shares: Mapping[DeviceId, int],
        counters: Mapping[tuple[str, str, str], Mapping[str, int]],
    ) -> None:
        self.exclusive = exclusive
        self.consumed = consumed
        self.shares = shares
        self.counters = counters

    def in_use(self, did: DeviceId) -> bool:
        return did in self.exclusive or bool(self.shares.get(did))


def _attr(cand: Candidate, name: str) -> AttrValue | None:
    for key, value in cand.device.attributes.items():
        if qualify(cand.driver, key) == name:
            return value
    return None


def _did(c: Candidate) -> DeviceId:
    return DeviceId(c.driver, c.pool, c.device.name)


@dataclass(frozen=True)
class _Demand:
    counts: Counter[str]
    weights: I64 | None  # the MIG measure's, per kind of the model's layout


class _CounterMeasure:
    """One counter set: how usable it is in a given state (higher: more usable), by the MIG measure
    when the devices map to a MIG model, else generically."""

    def __init__(
        self, driver: str, pool: str, name: str, cap: Mapping[str, int], devs: list[Candidate]
    ) -> None:
        self.key = (driver, pool, name)
        self.cap = cap
        self.devices = [(c, _did(c), _use(c.device, name)) for c in devs]
        self.mig = _mig_map(cap, self.devices)
        self.kinds = [_kind(c, use) for c, _, use in self.devices]
        common: dict[str, dict[str, int]] = {}  # per kind, the counters all its devices consume alike
        self.worth: dict[str, int] = {}  # per kind, one device's per-mille share of the set, summed
        for kk, (_, _, use) in zip(self.kinds, self.devices, strict=True):
            if kk not in common:
                common[kk] = dict(use)
                self.worth[kk] = sum(v * 1000 // cap[n] for n, v in use.items() if cap.get(n))
            else:
                common[kk] = {n: v for n, v in common[kk].items() if use.get(n) == v}
        self.common = {kk: {n: v for n, v in c.items() if v > 0} for kk, c in common.items()}

    def weigh(self, demand: Counter[str]) -> _Demand:
        """The demand seen (a weight per kind), with the MIG measure's weight vector."""
        if self.mig is None:
            return _Demand(demand, None)
        mix = DemandMix()
        for name, n in demand.items():
            mix.add(name, n)
        return _Demand(demand, mix.weights(self.mig[0]))

    def value(self, usage: Usage, weighed: _Demand) -> int:
        """How usable the set is for the demand; the score is the loss of it."""
        demand = weighed.counts
        if self.mig is not None:
            geom, kinds = self.mig
            mem = sm = me = 0
            for _, did, _ in self.devices:
                if not usage.in_use(did):
                    continue
                k = kinds[did]
                if k is None:  # the full GPU
                    mem, sm = (1 << geom.mem_slices) - 1, geom.sm_slices
                    continue
                kind, start = k
                mem |= span(kind, start)
                sm += kind.sm_slices
                if kind.key == "1g+me":
                    me = ME_BIT
            code = mem | me | min(sm, geom.sm_slices) << SM_SHIFT
            assert weighed.weights is not None
            return -int(lost_table(geom.model)[code] @ weighed.weights)  # measure.fragmentation
        left = {n: v - usage.counters.get(self.key, {}).get(n, 0) for n, v in self.cap.items()}
        fits: Counter[str] = Counter()
        for kk, (_, did, use) in zip(self.kinds, self.devices, strict=True):
            if not usage.in_use(did) and all(left.get(n, 0) >= v for n, v in use.items()):
                fits[kk] += 1
        total = 0
        for kk, f in fits.items():
            bound = min((left.get(n, 0) // v for n, v in self.common[kk].items()), default=f)
            total += demand.get(kk, 0) * self.worth[kk] * min(f, bound)
        return total


def _use(device: Device, counter_set: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for use in device.consumes_counters:
        if use.counter_set == counter_set:
            for n, v in use.counters.items():
                out[n] = out.get(n, 0) + v
    return out


def _kind(c: Candidate, use: Mapping[str, int]) -> str:
    profile = _attr(c, qualify(c.driver, "profile"))
    if isinstance(profile, str):
        return profile
    return "counters:" + ",".join(f"{n}={v}" for n, v in sorted(use.items()) if not _SLICE.match(n))


def _mig_map(
    cap: Mapping[str, int], devices: list[tuple[Candidate, DeviceId, dict[str, int]]]
) -> tuple[Geometry, dict[DeviceId, tuple[Kind, int] | None]] | None:
    """The MIG model whose profiles and starts the set's devices are, with each device's kind and
    start (None for the full GPU); None when no model fits them all."""
    slices = sorted(int(m.group(1)) for n in cap if (m := _SLICE.match(n)))
    if not slices or slices != list(range(len(slices))):
        return None
    spans: dict[DeviceId, tuple[str | None, int, int]] = {}
    for c, did, use in devices:
        used = sorted(int(m.group(1)) for n in use if (m := _SLICE.match(n)))
        if not used or used != list(range(used[0], used[0] + len(used))):
            return None
        profile = _attr(c, qualify(c.driver, "profile"))
        if len(used) == len(slices) and not isinstance(profile, str):
            spans[did] = (None, 0, len(used))
        elif isinstance(profile, str):
            spans[did] = (profile, used[0], len(used))
        else:
            return None
    for model in MODEL_CLASSES:
        geom = Geometry.of(model)
        if geom.mem_slices != len(slices):
            continue
        kinds: dict[DeviceId, tuple[Kind, int] | None] = {}
        for did, (profile, start, size) in spans.items():
            if profile is None:
                kinds[did] = None
                continue
            kind = geom.kinds.get(profile)
            if kind is None or kind.mem_slices != size or start not in kind.starts:
                break
            kinds[did] = (kind, start)
        else:
            return geom, kinds
    return None


class _Layout:
    """What a pool's devices are, for scoring (no state): counter sets with their measures, the
    sets each device consumes, shared devices' capacities, PCIe root / NUMA node of each device,
    the connected group of each whole device, each counter consumer's kind."""

    def __init__(self, pool: Pool) -> None:
        self.attrs: dict[DeviceId, tuple[AttrValue | None, AttrValue | None]] = {}
        self.group: dict[DeviceId, AttrValue] = {}
        self.sets: dict[tuple[str, str, str], _CounterMeasure] = {}
        self.consumes: dict[DeviceId, tuple[tuple[str, str, str], ...]] = {}
        self.caps: dict[DeviceId, dict[str, int]] = {}
        self.kind: dict[DeviceId, str] = {}
        by_set: dict[str, list[Candidate]] = {}
        for c in pool.every_device:
            did = _did(c)
            sets = []
            for use in c.device.consumes_counters:
                by_set.setdefault(use.counter_set, []).append(c)
                sets.append((c.driver, c.pool, use.counter_set))
            self.consumes[did] = tuple(dict.fromkeys(sets))
            if c.device.consumes_counters:
                self.kind[did] = _kind(c, _use(c.device, c.device.consumes_counters[0].counter_set))
        for name, devs in by_set.items():
            cset = pool.counter_sets.get(name)
            if cset is not None:
                self.sets[(pool.driver, pool.name, name)] = _CounterMeasure(
                    pool.driver, pool.name, name, cset.counters, devs
                )
        for c in pool.devices:
            did = _did(c)
            pcie, numa = _attr(c, PCIE_ROOT), _attr(c, NUMA_NODE)
            self.attrs[did] = (pcie, numa)
            if c.device.allow_multiple_allocations:
                self.caps[did] = {qualify(c.driver, n): cap.value for n, cap in c.device.capacity.items()}
            elif not c.device.consumes_counters:
                group = pcie if pcie is not None else numa
                if group is not None:
                    self.group[did] = group


_LAYOUTS: dict[tuple[object, ...], tuple[tuple[object, ...], _Layout]] = {}
"""A pool's layout depends only on its slices and the devices that reach the node: kept by their
identity (holding them, so an id is never reused while kept); cleared when large."""


def _layout(pool: Pool) -> _Layout:
    refs = (*pool.slices, *(c.device for c in pool.devices))
    key = (pool.driver, pool.name, len(pool.slices), *map(id, refs))
    hit = _LAYOUTS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], refs, strict=True)):
        return hit[1]
    if len(_LAYOUTS) > 1024:
        _LAYOUTS.clear()
    layout = _Layout(pool)
    if pool.slices:
        _LAYOUTS[key] = (refs, layout)
    return layout


class Scorer:
    """Scores full solutions on one node's pools, against what was held before the search."""

    def __init__(self, pools: Sequence[Pool], before: Usage) -> None:
        self._attrs: dict[DeviceId, tuple[AttrValue | None, AttrValue | None]] = {}
        self._group: dict[DeviceId, AttrValue] = {}
        self._sets: dict[tuple[str, str, str], _CounterMeasure] = {}
        self._consumes: dict[DeviceId, tuple[tuple[str, str, str], ...]] = {}
        self._caps: dict[DeviceId, dict[str, int]] = {}
        held: Counter[str] = Counter()
        for pool in pools:
            if pool.invalid is not None:
                continue
            layout = _layout(pool)
            self._attrs.update(layout.attrs)
            self._group.update(layout.group)
            self._sets.update(layout.sets)
            self._consumes.update(layout.consumes)
            self._caps.update(layout.caps)
            held.update(k for did, k in layout.kind.items() if before.in_use(did))
        self._shared_before = {did for did, n in before.shares.items() if n}
        self._free: Counter[AttrValue] = Counter(
            g for did, g in self._group.items() if not before.in_use(did)
        )
        self._demand = {
            key: m.weigh(Counter({k: 1 + held[k] for k in m.worth})) for key, m in self._sets.items()
        }
        self._before = {key: m.value(before, self._demand[key]) for key, m in self._sets.items()}
        self._untouched = {
            key for key, m in self._sets.items() if not any(before.in_use(d) for _, d, _ in m.devices)
        }
        self.floor_is_zero = all(m.mig is None for m in self._sets.values())
        """No solution can score below ``Score()`` (only the MIG measure can shrink): a solution
        scoring ``Score()`` cannot be beaten."""

    def score(self, results: Iterable[Sequence[DeviceResult]], usage: Usage) -> Score:
        misaligned = opened = slack = 0
        touched: set[tuple[str, str, str]] = set()
        shared: set[DeviceId] = set()
        taken: Counter[AttrValue] = Counter()
        for claim_results in results:
            roots: set[AttrValue] = set()
            numas: set[AttrValue] = set()
            for r in claim_results:
                did = r.device_id
                pcie, numa = self._attrs.get(did, (None, None))
                if pcie is not None:
                    roots.add(pcie)
                if numa is not None:
                    numas.add(numa)
                if r.admin_access:
                    continue
                touched.update(self._consumes.get(did, ()))
                if r.shared:
                    shared.add(did)
                elif did in self._group:
                    taken[self._group[did]] += 1
            misaligned += max(len(roots) - 1, 0) + max(len(numas) - 1, 0)
        for did in shared:
            if did not in self._shared_before:
                opened += 1
            held = usage.consumed.get(did, {})
            for name, cap in self._caps.get(did, {}).items():
                if cap > 0:
                    slack += (cap - held.get(name, 0)) * 1000 // cap
        sets_opened = sum(1 for key in touched if key in self._untouched)
        lost = sum(
            self._before[key] - self._sets[key].value(usage, self._demand[key])
            for key in touched
            if key in self._sets
        )
        broken = sum(self._free[g] ** 2 - (self._free[g] - t) ** 2 for g, t in taken.items())
        return Score(misaligned, lost, sets_opened, opened, slack, broken)
