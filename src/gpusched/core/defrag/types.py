"""The planner's inputs and answers, typed: rules, budgets, moves and plans.

A *move* evicts one running pod and recreates it on another node (or other GPUs) at once; a
*plan* is a sequence of moves, in the order they are to be carried out, and for a plan made for
pending pods, where each pending pod then lands. Every moved pod has a destination, so no plan
leaves a pod worse off than pending.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.books import MigSlot
from gpusched.core.selectors import LabelSelector

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})

RECREATING_KINDS: frozenset[str] = frozenset(
    {"ReplicaSet.apps", "StatefulSet.apps", "Job.batch", "ReplicationController"}
)
"""The controllers (``Controller.qualified_kind``) that recreate an evicted pod, wherever the
scheduler then puts it: the Deployment's ReplicaSet, a StatefulSet (same name, new pod), a Job
(until it completes), a ReplicationController. Not a DaemonSet (its pod belongs on its node;
the descheduler and ``kubectl drain`` leave them too), not a mirror pod's Node (the kubelet runs a
static pod, an eviction does not move it), not a kind this list does not know (a custom
controller may not recreate its pods: add its kind to ``Rules.recreating`` when it does)."""

_QUALIFIED_KIND = re.compile(r"[A-Z][A-Za-z0-9]*(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def recreating_kinds(extra: Iterable[str]) -> frozenset[str]:
    """``RECREATING_KINDS`` and ``extra``: more controller kinds, each ``Kind.group`` as
    ``Controller.qualified_kind`` names it (``TFJob.kubeflow.org``; ``Kind`` alone for the core
    group), for custom controllers that recreate the pods they own. Raises ``PlanError`` naming
    an entry that is no such name (a resource name such as ``tfjobs.kubeflow.org``, a
    ``group/Kind``)."""
    kinds = set(RECREATING_KINDS)
    for kind in extra:
        if not isinstance(kind, str) or not _QUALIFIED_KIND.fullmatch(kind):
            raise PlanError(
                f"recreating kind {kind!r} is not KIND.GROUP (the ownerReference's kind, then its "
                "API group: TFJob.kubeflow.org; the kind alone for the core group)"
            )
        kinds.add(kind)
    return frozenset(kinds)


REFUSAL_TEXT: Mapping[str, str] = MappingProxyType(
    {
        "opted-out": 'opted out (gpusched.io/defrag: "false")',
        "no-controller": "no controller owns it (an eviction would lose it)",
        "not-recreated": "its controller does not recreate it elsewhere",
        "priority": "its priority is above what the plan may move",
        "move-cap": "moved as often as the window allows",
        "pending": "one of the pods the plan is for",
        "gang-member-blocked": "another member of its gang may not move",
        "budget-exhausted": "a PodDisruptionBudget allows no more disruptions",
    }
)
"""Each ``Refusal``'s value in words, for plans and reports."""


class PlanError(InvalidInput):
    """Planner input that cannot be used as given (the message names the field and the value)."""


class Method(enum.Enum):
    """Which method answered."""

    FITS_NOW = "fits-now"  # the pending pods fit without any move
    MILP = "milp"  # the exact model (HiGHS through scipy.optimize.milp) on a neighbourhood
    GREEDY = "greedy"  # the heuristic
    NONE = "none"  # no plan: see ``Plan.reason``


class PriorityRule(enum.Enum):
    """Which running pods a plan for a pending pod of priority p may move."""

    LOWER = "lower"  # priority < p only
    NOT_HIGHER = "not-higher"  # priority <= p (a move is not a preemption: the pod runs on elsewhere)


class Refusal(enum.Enum):
    """Why a running pod may not move (``eligibility``)."""

    OPTED_OUT = "opted-out"  # PodSpec.movable is False
    NO_CONTROLLER = "no-controller"  # a bare pod: nothing recreates it, an eviction would lose it
    NOT_RECREATED = "not-recreated"  # its controller does not recreate it elsewhere (Rules.recreating)
    PRIORITY = "priority"
    MOVE_CAP = "move-cap"  # moved max_moves_per_pod times already in the window
    PENDING = "pending"  # one of the pods the plan is for
    GANG_MEMBER_BLOCKED = "gang-member-blocked"  # another member of its gang may not move
    BUDGET_EXHAUSTED = "budget-exhausted"  # a disruption budget that selects it allows no more


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget as a pure input: at most ``allowed`` pods of ``namespace`` that
    ``selector`` selects may be moved by one plan (Kubernetes: ``status.disruptionsAllowed``)."""

    name: str
    namespace: str
    selector: LabelSelector
    allowed: int

    def __post_init__(self) -> None:
        if not self.name:
            raise PlanError("disruption budget: name is empty")
        if not isinstance(self.allowed, int) or isinstance(self.allowed, bool) or self.allowed < 0:
            raise PlanError(
                f"disruption budget {self.namespace}/{self.name}: allowed must be a non-negative "
                f"integer, got {self.allowed!r}"
            )

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class Rules:
    """What a plan may do.

    - ``priority``: which priorities a plan for a pending pod may move (consolidation, which has
      no pending pod, moves pods of priority <= ``max_priority`` when that is set);
    - ``budgets``: PodDisruptionBudgets (moves per label group);
    - ``max_moves``: moves in one plan (the caller's per-window allowance);
    - ``max_moves_per_pod`` with ``moved``: a pod moved that many times in the window (``moved``
      counts them, by pod key) stays put;
    - ``recreating``: the controller kinds that recreate an evicted pod (``RECREATING_KINDS``).
    Gangs among the running pods (``PodSpec.gang``) move whole or not at all; pods with
    ``PodSpec.movable`` False never move, nor pods without a controller (``PodSpec.controller``
    None) or whose controller's kind is not in ``recreating``: a move is an eviction, and only a
    controller that recreates the pod makes it a move rather than a loss.
    """

    priority: PriorityRule = PriorityRule.NOT_HIGHER
    max_priority: int | None = None
    budgets: tuple[DisruptionBudget, ...] = ()
    max_moves: int = 8
    max_moves_per_pod: int = 1
    moved: Mapping[str, int] = field(default_factory=lambda: _NO_COUNTS)
    recreating: frozenset[str] = RECREATING_KINDS

    def __post_init__(self) -> None:
        if not isinstance(self.priority, PriorityRule):
            raise PlanError(f"rules: priority must be a PriorityRule, got {self.priority!r}")
        for fname in ("max_moves", "max_moves_per_pod"):
            v = getattr(self, fname)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise PlanError(f"rules: {fname} must be a non-negative integer, got {v!r}")
        names = [(b.namespace, b.name) for b in self.budgets]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise PlanError(f"rules: disruption budget {dup[0]}/{dup[1]} given twice")
        if not isinstance(self.recreating, frozenset) or not all(
            isinstance(k, str) and k for k in self.recreating
        ):
            raise PlanError(f"rules: recreating must be a frozenset of kinds, got {self.recreating!r}")
        for key, n in self.moved.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise PlanError(f"rules: moved[{key!r}] must be a non-negative integer, got {n!r}")


@dataclass(frozen=True, slots=True)
class WorkBudget:
    """How much work the planner may do. The core reads no clock: ``max_work`` counts units of
    work (one scheduling cycle of a pod against the nodes, one MILP solved), ``should_stop``
    (if given) is polled between units so that a caller can stop on its own deadline.

    The exact model runs when it has at most ``exact_max_binaries`` binaries, over the
    ``exact_targets`` most promising nodes for the pending pod and, for each moved pod, its
    ``exact_dests`` best destinations; HiGHS explores at most ``milp_node_limit`` branch-and-bound
    nodes (a count, not a time, so that answers repeat)."""

    max_work: int = 400
    exact: bool = True
    greedy: bool = True
    """False: the exact model alone (for measuring it against the heuristic)."""
    exact_targets: int = 6
    exact_dests: int = 10
    exact_max_binaries: int = 6000
    milp_node_limit: int = 2000
    should_stop: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        for fname in (
            "max_work",
            "exact_targets",
            "exact_dests",
            "exact_max_binaries",
            "milp_node_limit",
        ):
            v = getattr(self, fname)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanError(f"work budget: {fname} must be a positive integer, got {v!r}")


@dataclass(frozen=True, slots=True)
class Move:
    """Evict ``pod`` from ``from_node`` (its GPUs ``from_gpus``) and recreate it on ``to_node``,
    GPUs ``to_gpus``. Nodes by name (stable across snapshots). A MIG pod's move names its slices:
    ``from_mig`` the ones it holds, ``to_mig`` the free instances it takes (``core.defrag.mig``)."""

    pod: str
    from_node: str
    from_gpus: tuple[int, ...]
    to_node: str
    to_gpus: tuple[int, ...]
    gpu_milli: int  # the pod's GPU demand, for reports
    from_mig: tuple[MigSlot, ...] = ()
    to_mig: tuple[MigSlot, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pending pod lands once the moves are done (the nominated node; ``mig``: its MIG slices)."""

    pod: str
    node: str
    gpus: tuple[int, ...]
    mig: tuple[MigSlot, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A planner's answer. ``feasible`` False: no plan within the rules and the work budget
    (``reason`` says why); ``moves`` is then empty.

    ``optimal`` is True only when the plan is proven to have the fewest moves (the MILP's optimum
    over a neighbourhood that every node outside could not beat, by a lower bound), False when
    not proven. ``greedy_moves`` is what the heuristic found (for the heuristic's gap) or None.
    For consolidation, ``frag_before``/``frag_after`` are the cluster's FGD fragmentation
    (milli-GPU) for the target workload before and after the moves."""

    pending: tuple[str, ...]
    feasible: bool
    method: Method
    moves: tuple[Move, ...] = ()
    placements: tuple[Placement, ...] = ()
    optimal: bool = False
    reason: str = ""
    work: int = 0
    greedy_moves: int | None = None
    exact_moves: int | None = None
    budgets_used: tuple[tuple[str, int], ...] = ()
    frag_before: float | None = None
    frag_after: float | None = None
    kept: tuple[tuple[str, Refusal], ...] = ()
    """The running pods on the nodes that could take the pending pod that the rules keep in place,
    with why (for the ``Refusal`` values that say something about the pod itself: no controller,
    not recreated, opted out, a budget), so that a plan (or no plan) says what it could not move."""

    @property
    def move_count(self) -> int:
        return len(self.moves)

    def to_dict(self) -> dict[str, object]:
        """Plain values (JSON-ready)."""
        return {
            "pending": list(self.pending),
            "feasible": self.feasible,
            "method": self.method.value,
            "optimal": self.optimal,
            "reason": self.reason,
            "work": self.work,
            "moves": [
                {
                    "pod": m.pod,
                    "from_node": m.from_node,
                    "from_gpus": list(m.from_gpus),
                    "to_node": m.to_node,
                    "to_gpus": list(m.to_gpus),
                    "gpu_milli": m.gpu_milli,
                    **_mig_fields(from_mig=m.from_mig, to_mig=m.to_mig),
                }
                for m in self.moves
            ],
            "placements": [
                {"pod": p.pod, "node": p.node, "gpus": list(p.gpus), **_mig_fields(mig=p.mig)}
                for p in self.placements
            ],
            "greedy_moves": self.greedy_moves,
            "exact_moves": self.exact_moves,
            "budgets_used": [{"budget": b, "moves": n} for b, n in self.budgets_used],
            "frag_before": self.frag_before,
            "frag_after": self.frag_after,
            "kept": [{"pod": k, "why": r.value, "reason": REFUSAL_TEXT[r.value]} for k, r in self.kept],
        }


def _mig_fields(**slots: tuple[MigSlot, ...]) -> dict[str, list[dict[str, object]]]:
    """The MIG slices of a move or placement, only where it has some (plans of whole GPUs and shares read as
    before)."""
    return {
        k: [{"gpu": x.gpu, "start": x.start, "profile": x.profile} for x in v] for k, v in slots.items() if v
    }
