"""The plugin framework, after kube-scheduler's: extension points, cycle state, profiles.

Extension points, in the order ``schedule_one`` runs them (``feasible`` runs PreFilter and
Filter, ``pick_host`` Prefer and Score, both side-effect free; then Reserve, and the pod is
assumed). kube-scheduler's Permit is left out: no pod waits within a cycle here (a gang is
decided whole in one cycle, ``core.gang``):

- **PreFilter** — checks the pod alone and precomputes, once per pod and cycle, what its
  Filter needs into the typed cycle state (InterPodAffinity and PodTopologySpread: a verdict
  per node).
- **Filter** — a boolean mask over *all* nodes at once (vectorised); ``explain`` gives the
  per-node reason for failed nodes, only when a diagnosis is asked for.
- **PostFilter** — runs when no node fits (preemption lives here).
- **Prefer** — the pod's soft constraints (preferred node and pod affinity, ScheduleAnyway
  spread, PreferNoSchedule taints): each plugin rates the feasible nodes 0–100, the weighted
  sum is taken with kube-scheduler's default weights, and only the best-rated nodes go on.
  Preferences come first, as in kube-scheduler where they outweigh resource scoring.
- **Score** — a score per candidate node, with an optional device choice per node (which GPU
  a share would take there); weighted and summed across score plugins: the placement policy.
- **Reserve/Unreserve** — side bookkeeping once a node is chosen (DRA: the devices a claim is
  allocated); when a later Reserve fails, the plugins already reserved are unreserved in reverse
  order; a front end whose bind fails unreserves them all (``core.scheduler.unreserve``).
- **Bind** — carries a decision out. Bind plugins are supplied by the front ends (the core
  does no I/O): the Kubernetes front ends bind through the API; the simulator needs none.
  ``run_bind`` tries them in order; the first that does not answer ``SKIP`` decides.

Multi-pod decisions (gangs, preemption) go through ``gpusched.core.statement.Statement``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Diagnosis, Status

F64 = npt.NDArray[np.float64]


T = TypeVar("T")


class StateKey(Generic[T]):
    """A key of the cycle state that carries the type of its value: a plugin declares one
    (``AFFINITY: StateKey[Verdicts] = StateKey("InterPodAffinity")``) and reads back what it
    wrote, typed, without a cast. Keys compare by identity: two plugins never share one by
    accident of naming."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


LEAVING: StateKey[frozenset[str]] = StateKey("leaving")
"""The pods (namespace/name) a what-if has taken out of the snapshot (preemption's victims), written
into the what-if's fresh cycle state (``core.scheduler.fits``): a plugin whose books live outside the
snapshot (DynamicResources' claim ledger) counts as free what only these pods held."""


class CycleState:
    """Data one scheduling cycle passes between extension points (per pod, per cycle): what
    PreFilter precomputes for Filter, Prefer and Score, what Reserve books for Unreserve.

    A cycle state belongs to one pod and one snapshot version: a what-if on a changed snapshot
    (preemption) starts a fresh one."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[StateKey[Any], object] = {}

    def write(self, key: StateKey[T], value: T) -> None:
        self._data[key] = value

    def read(self, key: StateKey[T]) -> T | None:
        return cast("T | None", self._data.get(key))

    def __contains__(self, key: StateKey[Any]) -> bool:
        return key in self._data

    def read_or_fill(self, key: StateKey[T], fill: Callable[[], object]) -> T:
        """The value at ``key``; when it is absent, ``fill()`` first (a plugin's PreFilter, for a
        caller that skipped it), which must write it."""
        if key not in self._data:
            fill()
        value = self.read(key)
        if value is None:
            raise KeyError(f"{key!r} was not written by its fill")
        return value


@runtime_checkable
class PreFilterPlugin(Protocol):
    name: str

    def pre_filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> Status: ...


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        """Which nodes the pod may run on: over every node of ``snap``, or over the node indices
        ``nodes`` in that order (one node for preemption's what-if checks)."""
        ...

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]: ...


@dataclass(frozen=True, slots=True)
class NodeScores:
    """Raw scores for ``nodes`` (higher is better) and, optionally, the GPU a share takes on each."""

    scores: F64 | I64
    gpu_choice: I64 | None = None


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> NodeScores: ...


@runtime_checkable
class ReservePlugin(Protocol):
    name: str

    def reserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> Status: ...

    def unreserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> None: ...


@dataclass(frozen=True, slots=True)
class PostFilterResult:
    status: Status
    nominated_node: int = -1
    victims: tuple[str, ...] = ()


@runtime_checkable
class PostFilterPlugin(Protocol):
    name: str

    def post_filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, diagnosis: Diagnosis | None
    ) -> PostFilterResult: ...


@runtime_checkable
class BindPlugin(Protocol):
    """Carries out a decision. Answers SKIP to leave the pod to the next bind plugin;
    UNSCHEDULABLE_AND_UNRESOLVABLE when the pod is gone; UNSCHEDULABLE when the binding was
    refused and nothing was carried out (decide again later); ERROR when the outcome is unknown
    (it may have been carried out: the front end keeps the decision booked until it knows)."""

    name: str

    def bind(self, pod: PodSpec, node_name: str, gpus: tuple[int, ...]) -> Status: ...


@dataclass(frozen=True, slots=True)
class WeightedScore:
    plugin: ScorePlugin
    weight: float = 1.0


@runtime_checkable
class PreferPlugin(Protocol):
    name: str

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        """0–100 per node of ``nodes`` (higher is preferred), or None when the pod has no such
        preference there (cheap: most pods have none)."""
        ...


@dataclass(frozen=True, slots=True)
class WeightedPreference:
    plugin: PreferPlugin
    weight: float = 1.0


@dataclass(frozen=True)
class Profile:
    """One scheduler profile: the plugins enabled at each extension point."""

    name: str
    pre_filters: Sequence[PreFilterPlugin] = ()
    filters: Sequence[FilterPlugin] = ()
    post_filters: Sequence[PostFilterPlugin] = ()
    preferences: Sequence[WeightedPreference] = ()
    scores: Sequence[WeightedScore] = ()
    reserves: Sequence[ReservePlugin] = ()
    binds: Sequence[BindPlugin] = ()
    workload: TargetWorkload | None = None
    """The target workload its score plugins judge fragmentation against, as they use it (None:
    they use none); a front end reports the cluster's fragmentation against the same one."""


def run_bind(profile: Profile, pod: PodSpec, node_name: str, gpus: tuple[int, ...]) -> Status:
    """Run the profile's bind plugins in order; the first answer other than SKIP is final."""
    for b in profile.binds:
        st = b.bind(pod, node_name, gpus)
        if st.code != Code.SKIP:
            return st if st.plugin else Status(st.code, st.reasons, b.name)
    return Status(Code.ERROR, (f"no bind plugin of profile {profile.name!r} bound pod {pod.key}",), "Bind")
