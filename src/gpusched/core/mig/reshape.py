"""Geometry that follows demand: a plan that re-cuts idle MIG GPUs (or the idle slices of a GPU) so that the
pending MIG requests find an instance of their profile.

Pure: the caller says what each GPU holds and which of its instances are in use; the plan says, per GPU,
which instances to destroy and which to create (profile and start), and never names an instance in use.

Two scopes, by how the plan is applied (docs/mig.md, "Reshaping"):

- ``FREE_SLICES``: instances in use stay; the rest of the GPU may be re-cut. NVML creates and destroys GPU
  instances one by one while MIG mode is on (../shared/reference/mig.md §3, "dynamic"), so the agent's NVML
  way takes this scope.
- ``WHOLE_GPU``: only a GPU with nothing in use is re-cut, and then as a whole. NVIDIA's mig-manager applies a
  per-GPU configuration (profile counts) and re-creates every instance of a GPU whose configuration changes,
  so the mig-manager way takes this scope.

The rule per pending request, in the order largest profile first (the hardest to place):

1. a free instance of exactly its profile that already exists serves it (nothing to change);
2. else a GPU already in MIG mode before one that must switch (a mode switch takes a whole GPU from whole-GPU
   pods and, on Ampere, a GPU reset), then the fewest destroyed free instances, then a GPU the plan already
   touches, then the least growth of the MIG fragmentation measure (``measure``), then name: on each GPU first
   without destroying anything (free space), else after destroying its free instances (those not in use and
   not kept for another pending request);
3. a GPU that lost instances or switched MIG mode is then filled with the profiles seen most often that still
   fit (``fill_layout``), so that re-cut capacity is not left uncut.

The start of each new instance is where the measure grows least (``placement.MigPolicy.GPUSCHED``).
"""

from __future__ import annotations

import enum
import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.geometry import (
    Geometry,
    Instance,
    MigGpu,
    MigPlacementError,
    MigProfileNotOnModel,
    UnknownMigProfile,
    code_after,
)
from gpusched.core.mig.measure import I64, DemandMix, frag_by_code
from gpusched.core.mig.placement import MigFleet, MigPolicy
from gpusched.core.mig.profiles import ALL_PROFILE_NAMES


class ReshapeScope(enum.Enum):
    FREE_SLICES = "free-slices"  # keep instances in use, re-cut the rest of the GPU (NVML)
    WHOLE_GPU = "whole-gpu"  # re-cut only GPUs with nothing in use, as a whole (mig-manager)


class ReshapeWay(enum.Enum):
    """How a node's MIG geometry is reshaped, per node pool (the node label ``gpusched.io/mig-reshape-way``;
    docs/mig.md, "Reshaping", says when to take which)."""

    NVML = "nvml"  # way (a): the agent creates and destroys GPU and compute instances through NVML
    MIG_MANAGER = "mig-manager"  # way (b): NVIDIA's mig-manager applies a mig-parted configuration
    OFF = "off"  # the geometry is the operator's: never reshaped

    @property
    def scope(self) -> ReshapeScope | None:
        """What the planner may re-cut on a node reshaped this way (None: nothing)."""
        return {
            ReshapeWay.NVML: ReshapeScope.FREE_SLICES,
            ReshapeWay.MIG_MANAGER: ReshapeScope.WHOLE_GPU,
        }.get(self)

    @staticmethod
    def parse(value: str, where: str) -> ReshapeWay:
        try:
            return ReshapeWay(value)
        except ValueError:
            allowed = ", ".join(w.value for w in ReshapeWay)
            raise InvalidInput(f"{where}: {value!r} is not a MIG reshape way ({allowed})") from None


@dataclass(frozen=True)
class GpuNow:
    """One GPU as the planner sees it: what it holds, which instances are in use, and whether it is off limits
    as a whole (``held``: a whole-GPU pod runs on it, or a reshape of it is under way)."""

    gpu: MigGpu
    in_use: frozenset[Instance] = frozenset()
    held: bool = False

    def __post_init__(self) -> None:
        stray = self.in_use - set(self.gpu.instances)
        if stray:
            names = ", ".join(f"{i.profile} at {i.start}" for i in sorted(stray, key=lambda i: i.start))
            raise MigPlacementError(f"GPU {self.gpu.name}: instances in use that it does not hold: {names}")


@dataclass(frozen=True)
class GpuReshape:
    """The change to one GPU: switch MIG mode on (``enable_mig``), destroy, then create. ``serves`` lists the
    pending requests (one profile name each) this change makes room for; ``before``/``target`` the layouts."""

    gpu: str
    enable_mig: bool
    destroy: tuple[Instance, ...]
    create: tuple[Instance, ...]
    serves: tuple[str, ...]
    before: tuple[Instance, ...]
    target: tuple[Instance, ...]


@dataclass(frozen=True)
class ReshapePlan:
    steps: tuple[GpuReshape, ...]
    served_by_free: tuple[str, ...]  # pending requests an existing free instance already serves
    unserved: tuple[str, ...]  # pending requests no idle GPU or idle slices can host

    def step(self, gpu: str) -> GpuReshape | None:
        return next((s for s in self.steps if s.gpu == gpu), None)


def demand_layout(
    geom: Geometry, first: str, demand: DemandMix, base: Iterable[Instance] = ()
) -> tuple[Instance, ...]:
    """A layout for a GPU holding ``base`` (empty by default), re-cut for a request of ``first``: ``first``,
    then by demand rank (most requested first) each requested profile as often as it fits, except ``first``
    itself, which gets at most one more (the simulator's ``gpusched-reshape`` rule, kept as it was measured).
    Starts where the measure grows least. Raises MigPlacementError when ``first`` does not fit."""
    fleet = MigFleet([MigGpu("x/0", geom, True, tuple(base))], ["x"])
    pl = fleet.choose(first, MigPolicy.GPUSCHED, demand)
    if pl is None:
        raise MigPlacementError(f"MIG {first} does not fit on a {geom.model} holding {_names(base)}")
    fleet.place(0, first, pl.start)
    for p in sorted(geom.kinds, key=lambda p: (-demand.count(p), p)):
        if p != first and demand.count(p) == 0:
            continue
        while (pl := fleet.choose(p, MigPolicy.GPUSCHED, demand)) is not None:
            fleet.place(0, p, pl.start)
            if p == first:
                break
    return fleet.gpus[0].instances


def fill_layout(geom: Geometry, layout: Iterable[Instance], demand: DemandMix) -> tuple[Instance, ...]:
    """``layout`` with its free space cut for demand: by demand rank, each requested profile as often as it
    fits, starts where the measure grows least."""
    fleet = MigFleet([MigGpu("x/0", geom, True, tuple(layout))], ["x"])
    for p in sorted(geom.kinds, key=lambda p: (-demand.count(p), p)):
        if demand.count(p) == 0:
            break
        while (pl := fleet.choose(p, MigPolicy.GPUSCHED, demand)) is not None:
            fleet.place(0, p, pl.start)
    return fleet.gpus[0].instances


def apply_step(gpu: MigGpu, step: GpuReshape) -> MigGpu:
    """The GPU after ``step``: every destroy and create checked as MIG would (raises MigPlacementError)."""
    if step.gpu != gpu.name:
        raise MigPlacementError(f"a reshape of {step.gpu} applied to {gpu.name}")
    g = MigGpu(gpu.name, gpu.geometry, gpu.mig_enabled or step.enable_mig, gpu.instances)
    if not g.mig_enabled:
        raise MigPlacementError(f"GPU {gpu.name} is not in MIG mode and the reshape does not switch it on")
    for i in step.destroy:
        g = g.remove(i.profile, i.start)
    for i in step.create:
        g = g.place(i.profile, i.start)
    return g


def check_pending(gpus: Sequence[GpuNow], pending: Iterable[str]) -> None:
    """Raises UnknownMigProfile for a name no model has, MigProfileNotOnModel for one no GPU here has."""
    models = sorted({g.gpu.geometry.model for g in gpus})
    for p in pending:
        if p not in ALL_PROFILE_NAMES:
            geom = Geometry.of(models[0]) if models else None
            known = f" (profiles of {geom.model}: {', '.join(geom.kinds)})" if geom else ""
            raise UnknownMigProfile(f"unknown MIG profile {p!r}{known}")
        if models and not any(p in Geometry.of(m).kinds for m in models):
            raise MigProfileNotOnModel(f"MIG profile {p!r} does not exist on {', '.join(models)}")


def plan_reshape(
    gpus: Sequence[GpuNow],
    pending: Sequence[str],
    demand: DemandMix | None = None,
    scope: ReshapeScope = ReshapeScope.FREE_SLICES,
    *,
    fill: bool = True,
) -> ReshapePlan:
    """The plan that makes room for ``pending`` (one profile name per waiting request). ``demand`` weighs the
    measure and the fill (default: the pending requests themselves)."""
    check_pending(gpus, pending)
    names = [g.gpu.name for g in gpus]
    if len(set(names)) != len(names):
        raise MigPlacementError("two GPUs share a device name")
    demand = demand if demand is not None else DemandMix(pending)
    state = {g.gpu.name: _Work(g) for g in sorted(gpus, key=lambda g: g.gpu.name)}
    served_free: list[str] = []
    rest: list[str] = []
    for p in pending:
        w = next((w for w in state.values() if w.take_free(p)), None)
        (served_free if w is not None else rest).append(p)
    unserved: list[str] = []
    tables = {m: frag_by_code(Geometry.of(m), demand) for m in {g.gpu.geometry.model for g in gpus}}
    for p in sorted(rest, key=lambda p: (-_size(gpus, p), p)):
        best = min(
            (c for w in state.values() if (c := w.option(p, scope, tables[w.geom.model])) is not None),
            key=lambda c: c.rank,
            default=None,
        )
        if best is None:
            unserved.append(p)
        else:
            state[best.gpu].commit(best, p)
    steps = []
    for w in state.values():
        if fill and (w.destroyed or w.enable):
            w.fill(demand)
        s = w.step()
        if s is not None:
            steps.append(s)
    unserved.sort(key=list(pending).index)
    return ReshapePlan(tuple(steps), tuple(served_free), tuple(unserved))


# ------------------------------------------------------------------------------------------------ the work
def _names(instances: Iterable[Instance]) -> str:
    return ", ".join(f"{i.profile} at {i.start}" for i in instances) or "nothing"


def _size(gpus: Sequence[GpuNow], profile: str) -> int:
    kinds = [g.gpu.geometry.kinds[profile] for g in gpus if profile in g.gpu.geometry.kinds]
    return max((k.mem_slices for k in kinds), default=0)


@dataclass(frozen=True)
class _Option:
    rank: tuple[int, int, int, int, str]
    gpu: str
    keep: tuple[Instance, ...]  # the layout the new instance joins
    start: int


class _Work:
    """One GPU during planning: its layout so far and which instances must stay (in use, kept for a pending
    request, or created by this plan)."""

    def __init__(self, now: GpuNow) -> None:
        self.now = now
        self.geom = now.gpu.geometry
        self.layout: list[Instance] = list(now.gpu.instances)
        self.kept: set[Instance] = set(now.in_use)
        self.created: set[Instance] = set()
        self.serves: list[str] = []
        self.enable = False
        self.destroyed = False
        self._options: dict[str, _Option | None] = {}  # per profile, until this GPU changes

    def take_free(self, profile: str) -> bool:
        if self.now.held:
            return False
        free = next((i for i in self.layout if i.profile == profile and i not in self.kept), None)
        if free is None:
            return False
        self.kept.add(free)
        self._options.clear()
        return True

    def option(self, profile: str, scope: ReshapeScope, frag: I64) -> _Option | None:
        """Where ``profile`` would go on this GPU and at what cost; ``frag`` is the measure per state code."""
        if profile not in self._options:
            self._options[profile] = self._option(profile, scope, frag)
        return self._options[profile]

    def _option(self, profile: str, scope: ReshapeScope, frag: I64) -> _Option | None:
        if self.now.held or profile not in self.geom.kinds:
            return None
        if scope is ReshapeScope.WHOLE_GPU and self.kept - self.created:
            return None  # something of the GPU's own stays: mig-manager would re-cut it all
        enable = not self.now.gpu.mig_enabled
        touched = 0 if (self.created or self.enable) else 1
        kind = self.geom.kinds[profile]
        for keep in (self.layout, [i for i in self.layout if i in self.kept]):
            gpu = MigGpu(self.now.gpu.name, self.geom, True, tuple(keep))
            code = gpu.code
            starts = gpu.free_starts(profile)
            if starts:  # the start where the measure grows least, then the lowest (MigPolicy.GPUSCHED)
                growth, start = min((int(frag[code_after(code, kind, s)] - frag[code]), s) for s in starts)
                destroys = len(self.layout) - len(keep)
                rank = (int(enable), destroys, touched, growth, self.now.gpu.name)
                return _Option(rank, self.now.gpu.name, tuple(keep), start)
        return None

    def commit(self, option: _Option, profile: str) -> None:
        self._options.clear()
        new = Instance(profile, option.start)
        self.destroyed |= len(option.keep) < len(self.layout)
        self.layout = [*option.keep, new]
        self.kept.add(new)
        self.created.add(new)
        self.serves.append(profile)
        self.enable |= not self.now.gpu.mig_enabled

    def fill(self, demand: DemandMix) -> None:
        self.layout = list(fill_layout(self.geom, self.layout, demand))

    def step(self) -> GpuReshape | None:
        before = self.now.gpu.instances
        have, want = Counter(before), Counter(self.layout)
        destroy = tuple(i for i in before if have[i] > want[i])
        create = tuple(i for i in self.layout if want[i] > have[i])
        if not (destroy or create or self.enable):
            return None
        return GpuReshape(
            self.now.gpu.name, self.enable, destroy, create, tuple(self.serves), before, tuple(self.layout)
        )


# ------------------------------------------------------------------ one GPU per node (the agent's request)
# The contract of the node agent's re-cut request (one GPU per node, instances pods hold kept): the best GPU
# of a node by the pending requests it makes room for, then the fewest free instances destroyed, its index.
@dataclass(frozen=True)
class GpuRecut:
    """Re-cut GPU ``gpu`` (its index on the node): destroy ``destroy`` (free instances), create ``create``;
    ``serves`` the pending requests the new instances are for."""

    gpu: int
    destroy: tuple[Instance, ...]
    create: tuple[Instance, ...]
    serves: tuple[str, ...]


class NodeGpus(Protocol):
    """A node's MIG GPUs and their indices (``core.mig.books.NodeMig``)."""

    @property
    def gpus(self) -> Sequence[MigGpu]: ...

    @property
    def indices(self) -> Sequence[int]: ...

    @property
    def reshaping(self) -> frozenset[int]: ...


def target_layout(
    geom: Geometry,
    keep: Sequence[Instance],
    pending: Sequence[str],
    demand: DemandMix,
    present: Sequence[Instance] = (),
) -> tuple[tuple[Instance, ...], tuple[str, ...]]:
    """The layout of a GPU that keeps ``keep`` and serves as many of ``pending`` as fit (larger profiles
    first, each where the measure grows least), keeps the other ``present`` instances that still fit (a
    re-cut destroys only what it must), then fills with the demand (``fill_layout``); and the requests
    served."""
    gpu = MigGpu("plan", geom, True, tuple(keep))
    frag = frag_by_code(geom, demand)
    served = []
    for p in sorted((p for p in pending if p in geom.kinds), key=lambda p: (-geom.kinds[p].mem_slices, p)):
        starts = gpu.free_starts(p)
        if starts:
            code, kind = gpu.code, geom.kinds[p]
            gpu = gpu.place(
                p, min(starts, key=lambda s: (int(frag[code_after(code, kind, s)] - frag[code]), s))
            )
            served.append(p)
    for i in present:
        if i not in gpu.instances and i.start in gpu.free_starts(i.profile):
            gpu = gpu.place(i.profile, i.start)
    return fill_layout(geom, gpu.instances, demand), tuple(served)


def plan_gpu(
    index: int, present: MigGpu, held: MigGpu, pending: Sequence[str], demand: DemandMix
) -> GpuRecut | None:
    """The re-cut of GPU ``index`` (``present``: its instances; ``held``: those pods hold), or None when it
    serves no pending request or creates nothing."""
    return _plan_gpu(index, present, held, tuple(sorted(pending)), _weights(present.geometry, demand))


def _weights(geom: Geometry, demand: DemandMix) -> tuple[int, ...]:
    return tuple(demand.count(p) for p in geom.kinds)  # all that a plan reads of the demand


def _plan_gpu(
    index: int, present: MigGpu, held: MigGpu, pending: tuple[str, ...], weights: tuple[int, ...]
) -> GpuRecut | None:
    if not present.mig_enabled:
        return None
    found = _recut(present.geometry.model, present.instances, held.instances, pending, weights)
    return None if found is None else GpuRecut(index, *found)


@functools.lru_cache(maxsize=16384)
def _recut(
    model: str,
    present: tuple[Instance, ...],
    held: tuple[Instance, ...],
    pending: tuple[str, ...],
    weights: tuple[int, ...],
) -> tuple[tuple[Instance, ...], tuple[Instance, ...], tuple[str, ...]] | None:
    """``plan_gpu``'s (destroy, create, serves) by content: GPUs of one model in one state plan alike, so a
    fleet of like GPUs (and a batch tried pod by pod) plans each state once."""
    geom = Geometry.of(model)
    demand = DemandMix()
    for p, n in zip(geom.kinds, weights, strict=True):
        demand.add(p, n)
    target, served = target_layout(geom, held, pending, demand, present)
    destroy = tuple(i for i in present if i not in target and i not in held)
    create = tuple(i for i in target if i not in present)
    if not served or not create:
        return None
    return destroy, create, served


def plan_node(
    node: NodeGpus,
    books: Mapping[int, MigGpu],
    pending: Sequence[str],
    demand: DemandMix,
    scope: ReshapeScope = ReshapeScope.FREE_SLICES,
) -> GpuRecut | None:
    """The GPU of ``node`` to re-cut for ``pending`` (requests that find no free instance), or None;
    ``books[i]`` holds the instances pods hold on GPU ``i``. ``WHOLE_GPU`` (mig-manager re-creates every
    instance of a GPU it changes): only a GPU that no pod holds anything of is re-cut."""
    best: tuple[tuple[int, int, int], GpuRecut] | None = None
    if node.reshaping:
        return None  # one re-cut at a time per node
    want = tuple(sorted(pending))
    weights: dict[str, tuple[int, ...]] = {}
    for i, g in zip(node.indices, node.gpus, strict=True):
        if scope is ReshapeScope.WHOLE_GPU and books[i].instances:
            continue
        w = weights.get(g.geometry.model) or weights.setdefault(
            g.geometry.model, _weights(g.geometry, demand)
        )
        plan = _plan_gpu(i, g, books[i], want, w)
        if plan is None:
            continue
        key = (-len(plan.serves), len(plan.destroy), i)
        if best is None or key < best[0]:
            best = (key, plan)
    return best[1] if best else None


def plan_node_batch(
    node: NodeGpus,
    books: Mapping[int, MigGpu],
    requests: Sequence[Sequence[str]],
    demand: DemandMix,
    scope: ReshapeScope = ReshapeScope.FREE_SLICES,
    misses: int = 8,
) -> tuple[GpuRecut, tuple[int, ...]] | None:
    """One re-cut of ``node`` for a batch of pending pods (``requests``: each pod's profiles, in the order
    they are to be served, most important first): each pod in turn joins the batch when one re-cut of one GPU
    (``plan_node``) still serves every slice of the pods taken so far and of it; a pod that does not fit
    with them is left for a later re-cut, never displacing one before it. Once one is taken, ``misses`` pods
    in a row that do not join end the batch (a GPU hosts at most 7 instances: the re-cut is then as good as
    full). Returns the re-cut and the indices of the requests it serves, or None when it serves none."""
    taken: list[int] = []
    plan: GpuRecut | None = None
    missed = 0
    for k, req in enumerate(requests):
        want = [p for j in (*taken, k) for p in requests[j]]
        trial = plan_node(node, books, want, demand, scope) if req else None
        if trial is not None and Counter(trial.serves) == Counter(want):
            taken.append(k)
            plan, missed = trial, 0
        elif taken:
            missed += 1
            if missed >= misses:
                break
    return (plan, tuple(taken)) if plan is not None else None
