"""Gangs: pods that start together or not at all (coscheduling, Volcano and Kubernetes PodGroups).

A gang is named by ``PodSpec.gang`` within the pod's namespace and described by a ``GangSpec``:
its minimum member count (``minMember``) and how long its pods may wait for it
(``scheduleTimeoutSeconds``). The core treats a gang as one *unit* of scheduling:

- ``group_units`` gathers pending pods into units (a gang's pending pods; a pod outside any gang
  is a unit of its own) in the pending order of their most urgent pod, so that one cycle tries a
  whole gang at once and never interleaves two gangs' pods: two gangs that each need more than
  half the free GPUs cannot deadlock, the first one runs and the second waits as a unit;
- ``place_gang`` places a unit through ``statement.schedule_all``: at least the members still
  missing from ``min_member`` fit at once, or nothing stays booked and the reason names the gang,
  how many fit and the pod that did not. Members with DRA claims are allocated jointly
  (``gangclaims.schedule_gang``: the members' claim choices searched, within a bound, when the
  first choices do not fit together).

The core reads no clock: ``GangSpec.expired`` compares times the caller gives (seconds), so a
front end drops what a gang holds once its timeout passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpusched.core.cluster import I64, ClusterState
from gpusched.core.errors import InvalidSpec
from gpusched.core.framework import Profile
from gpusched.core.gangclaims import schedule_gang
from gpusched.core.gangtopology import GangTopology, place_in_domain
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.pending import pending_order
from gpusched.core.statement import GroupResult
from gpusched.core.status import Code, Status


class InvalidGang(InvalidSpec):
    """A gang that cannot be scheduled as written (the message names the gang and the field)."""


@dataclass(frozen=True, slots=True)
class GangSpec:
    """One gang: ``namespace``/``name`` as pods name it in ``PodSpec.gang``.

    ``min_member``: pods that must run at once (>= 1); ``timeout_s``: seconds a gang's pods may
    wait for the rest before what they hold is released (0 = no timeout)."""

    name: str
    namespace: str = "default"
    min_member: int = 1
    timeout_s: int = 0
    topology: GangTopology | None = None
    """Keep the members in one topology domain (``core.gangtopology``); None: anywhere."""

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidGang("gang: name is empty")
        for fname, low in (("min_member", 1), ("timeout_s", 0)):
            v = getattr(self, fname)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise InvalidGang(f"gang {self.key}: {fname} must be an integer >= {low}, got {v!r}")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def expired(self, first_pending_s: int, now_s: int) -> bool:
        """Whether a gang pending since ``first_pending_s`` is past its timeout at ``now_s``."""
        return self.timeout_s > 0 and now_s - first_pending_s >= self.timeout_s


def gang_key(pod: PodSpec) -> str:
    """``namespace/gang`` of the pod's gang, or "" when it belongs to none."""
    return f"{pod.namespace}/{pod.gang}" if pod.gang else ""


def check_gang(spec: GangSpec, members: int) -> None:
    """InvalidGang when the gang can never start: ``min_member`` larger than its pods."""
    if spec.min_member > members:
        raise InvalidGang(f"gang {spec.key}: minMember {spec.min_member} is larger than its {members} pod(s)")


@dataclass(frozen=True, slots=True)
class Unit:
    """What one cycle tries at once: a gang's pending pods, or a single pod.

    ``need``: how many of ``pods`` must fit at once (``min_member`` less the members already
    running; ``len(pods)`` for a single pod, i.e. 1)."""

    key: str
    """The gang key, or the pod key for a pod outside any gang."""
    pods: tuple[PodSpec, ...]
    need: int
    gang: GangSpec | None = None

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)

    @property
    def queue(self) -> str:
        return self.pods[0].queue

    @property
    def namespace(self) -> str:
        return self.pods[0].namespace


def group_units(
    pending: Sequence[PodSpec],
    gangs: Mapping[str, GangSpec],
    *,
    running: Mapping[str, int] | None = None,
    created: Mapping[str, int] | None = None,
) -> list[Unit]:
    """Pending pods as units in the order a cycle tries them.

    ``gangs`` by key (``GangSpec.key``); a pod naming a gang missing there is a gang of
    ``min_member`` 1 (it waits for nothing). ``running``: members of each gang already bound (by
    gang key). ``created``: creation time per pod key (default: position in ``pending``). Units
    are ordered by ``pending_order`` of their most urgent pod: priority, then creation, then
    arrival. A gang whose pending pods cannot reach its minimum raises ``InvalidGang``.
    """
    running = running or {}
    groups: dict[str, list[PodSpec]] = {}
    first: dict[str, tuple[int, int, int]] = {}
    for i, pod in enumerate(pending):
        key = gang_key(pod) or pod.key
        groups.setdefault(key, []).append(pod)
        t = created.get(pod.key, i) if created is not None else i
        order = pending_order(pod.priority, t, i)
        if key not in first or order < first[key]:
            first[key] = order
    units: list[Unit] = []
    for key, pods in groups.items():
        g = gang_key(pods[0])
        if not g:
            units.append(Unit(key, tuple(pods), 1))
            continue
        spec = gangs.get(g) or GangSpec(pods[0].gang, pods[0].namespace)
        have = running.get(g, 0)
        check_gang(spec, have + len(pods))
        units.append(Unit(key, tuple(pods), max(0, spec.min_member - have), spec))
    units.sort(key=lambda u: first[u.key])
    return units


def without_post_filters(profile: Profile) -> Profile:
    """The profile a gang's members are tried with: no preemption per member (gang-aware
    preemption looks at the whole gang, after the gang failed)."""
    return replace(profile, post_filters=()) if profile.post_filters else profile


def place_gang(
    profile: Profile,
    unit: Unit,
    snap: ClusterState,
    *,
    tiebreak: I64 | None = None,
    diagnose: bool = True,
    leaving: frozenset[str] = frozenset(),
) -> GroupResult:
    """Place ``unit`` all-or-nothing: at least ``unit.need`` of its pods at once (those that fit
    beyond the minimum come along; the rest stay pending), or nothing booked and a status whose
    reason names the gang. Members are tried without PostFilters; ``diagnose`` False leaves the
    per-node reasons out of the message (cheaper: what-ifs and the simulator). A gang whose
    minimum asks for more whole GPUs than are free is refused before any member is tried."""
    short = _whole_gpus_short(unit, snap)
    if short:
        return GroupResult(Status(Code.UNSCHEDULABLE, (short,), "Gang"), ())
    if unit.gang is not None and unit.gang.topology is not None:
        r = place_in_domain(
            without_post_filters(profile), unit.pods, snap, unit.gang.topology,
            need=unit.need, gang=unit.key, tiebreak=tiebreak, diagnose=diagnose, leaving=leaving,
        ).result  # fmt: skip
    else:
        r = schedule_gang(
            without_post_filters(profile),
            unit.pods,
            snap,
            tiebreak=tiebreak,
            min_count=unit.need,
            diagnose_failures=diagnose,
            leaving=leaving,  # a what-if's evicted pods: what only they hold outside the books is free
        )
    if r.scheduled or unit.gang is None:
        return r
    why = f"gang {unit.key} waits as a unit (minMember {unit.gang.min_member}): {r.status.message()}"
    code = r.status.code if r.status.code != Code.SUCCESS else Code.UNSCHEDULABLE
    return GroupResult(Status(code, (why,), "Gang"), r.results)


def _whole_gpus_short(unit: Unit, snap: ClusterState) -> str:
    """The reason a gang cannot fit whatever the placement (its ``need`` smallest members ask
    for more whole GPUs than are free in the cluster), or "" when it may fit: a cheap refusal
    before trying every member."""
    wholes = sorted(p.num_gpu for p in unit.pods if p.is_whole)
    if unit.gang is None or len(wholes) < unit.need or not wholes:
        return ""
    need = sum(wholes[: unit.need])
    free = int(((snap.gpu_free == GPU_MILLI) & snap.gpu_exists).sum())
    if need <= free:
        return ""
    return (
        f"gang {unit.key} waits as a unit (minMember {unit.gang.min_member}): it needs {need} whole "
        f"GPUs at once, {free} are free"
    )


def partly_bound(bound: Iterable[PodSpec], gangs: Mapping[str, GangSpec]) -> list[str]:
    """Keys of gangs with at least one but fewer than ``min_member`` pods among ``bound`` (the
    invariant every cycle keeps: the list is empty at the end of a cycle)."""
    counts: dict[str, int] = {}
    for p in bound:
        g = gang_key(p)
        if g:
            counts[g] = counts.get(g, 0) + 1
    return sorted(g for g, n in counts.items() if g in gangs and n < gangs[g].min_member)
