"""PodDisruptionBudgets as data: which pods may be disrupted now, and how victim choosers count them.

The core does no I/O: a front end reads the cluster's PodDisruptionBudgets (``policy/v1``) and
hands them in as ``DisruptionBudgets`` (``gpusched.k8s.disruption.BudgetReader`` does it for
Kubernetes). One budget is the defragmentation planner's ``DisruptionBudget`` (namespace, label
selector, ``allowed`` = ``status.disruptionsAllowed``); ``DisruptionBudgets`` adds the pods each
budget counts as disrupted already (``status.disruptedPods``), which cost it nothing again.

Two questions, with the two rules Kubernetes itself uses:

- **May this pod be evicted now?** (``may_disrupt``, ``blocking``, ``allowed_together``) — the
  Eviction API's rule: every budget of the pod's namespace whose selector selects the pod must
  allow one more disruption. An empty selector selects every pod of the namespace (``policy/v1``).
- **Which of these victims violate a budget?** (``split``) — kube-scheduler's DefaultPreemption
  (``filterPodsWithPDBViolation``): the pods are taken in the order given (most important
  first); each takes one from every budget that matches it (same namespace, a *non-empty*
  selector that matches its non-empty labels, not already disrupted); a pod that drives any of
  them below zero is *violating*. Preemption (``plugins.preemption``) and reclaim
  (``queues.reclaim``) count violations this way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gpusched.core.defrag.types import DisruptionBudget
from gpusched.core.model import PodSpec

__all__ = ["NO_BUDGETS", "DisruptionBudget", "DisruptionBudgets"]

_NONE: Mapping[str, frozenset[str]] = MappingProxyType({})


def _key(b: DisruptionBudget) -> str:
    return f"{b.namespace}/{b.name}"


@dataclass(frozen=True, slots=True)
class DisruptionBudgets:
    """Every budget the front end knows of, at one moment."""

    budgets: tuple[DisruptionBudget, ...] = ()
    disrupted: Mapping[str, frozenset[str]] = field(default_factory=lambda: _NONE)
    """Budget (``namespace/name``) → names of the pods it counts as disrupted already."""

    def __bool__(self) -> bool:
        return bool(self.budgets)

    def _gone(self, b: DisruptionBudget, pod: PodSpec) -> bool:
        return pod.name in self.disrupted.get(_key(b), frozenset())

    def of(self, pod: PodSpec) -> tuple[DisruptionBudget, ...]:
        """The budgets that select ``pod`` (the Eviction API's match)."""
        return tuple(b for b in self.budgets if b.selects(pod.namespace, pod.labels))

    def blocking(self, pod: PodSpec) -> tuple[DisruptionBudget, ...]:
        """The budgets that would make the Eviction API refuse ``pod`` now."""
        return tuple(b for b in self.of(pod) if b.allowed <= 0 and not self._gone(b, pod))

    def may_disrupt(self, pod: PodSpec) -> bool:
        """Whether the Eviction API would let ``pod`` go now, as far as budgets are concerned."""
        return not self.blocking(pod)

    def allowed_together(self, pods: Iterable[PodSpec]) -> bool:
        """Whether evicting all of ``pods`` at once leaves every budget at zero or above."""
        left = {_key(b): b.allowed for b in self.budgets}
        for pod in pods:
            for b in self.of(pod):
                if not self._gone(b, pod):
                    left[_key(b)] -= 1
                    if left[_key(b)] < 0:
                        return False
        return True

    def _counts(self, b: DisruptionBudget, pod: PodSpec) -> bool:
        sel = b.selector
        if pod.namespace != b.namespace or not pod.labels or not (sel.match_labels or sel.match_expressions):
            return False  # kube-scheduler: a pod without labels, or an empty selector, matches nothing
        return sel.matches(pod.labels) and not self._gone(b, pod)

    def split(self, pods: Sequence[PodSpec]) -> tuple[list[PodSpec], list[PodSpec]]:
        """kube-scheduler's ``filterPodsWithPDBViolation``: (violating, non-violating), each in
        the order given; ``pods`` come most important first."""
        left = [b.allowed for b in self.budgets]
        violating: list[PodSpec] = []
        fine: list[PodSpec] = []
        for pod in pods:
            violated = False
            for i, b in enumerate(self.budgets):
                if self._counts(b, pod):
                    left[i] -= 1
                    violated |= left[i] < 0
            (violating if violated else fine).append(pod)
        return violating, fine


NO_BUDGETS = DisruptionBudgets()
