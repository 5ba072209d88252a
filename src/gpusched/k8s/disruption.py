"""PodDisruptionBudgets (``policy/v1``) read from the API → the core's ``DisruptionBudget`` data.

``BudgetReader`` lists and watches every PodDisruptionBudget (one ``Reflector``) and keeps them
as data: ``budgets()`` is the whole set at one moment (a frozen
``gpusched.core.disruption.DisruptionBudgets``, cheap to take: rebuilt only when a budget
changed), the input of the core's victim choosers (preemption, reclaim; ``.budgets`` is the
tuple of ``DisruptionBudget`` the defragmentation planner's ``Rules`` take);
``may_disrupt(pod)`` says whether the Eviction API would let one pod go now.

Selectors as in ``policy/v1``: an empty selector (``{}``) selects every pod of the budget's
namespace; a null one selects none (such a budget is left out: it protects nothing). A pod in
a budget's ``status.disruptedPods`` is being evicted already and costs that budget nothing again
(``DisruptionBudgets.disrupted``). The budget's ``status.disruptionsAllowed`` is what the disruption
controller (kube-controller-manager) computed last; a budget it has not processed yet
(``status.observedGeneration`` behind ``metadata.generation``) allows nothing, as the Eviction
API treats it.

``budget_from_k8s`` converts one object; a malformed selector is an ``InvalidRequest`` naming
the budget and field. The reader logs such a budget, keeps it in ``invalid`` and leaves it out of
``budgets()`` (the Eviction API still enforces it: an eviction it forbids is refused with 429).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from gpusched.core.disruption import DisruptionBudget, DisruptionBudgets
from gpusched.core.errors import GpuschedError
from gpusched.core.model import PodSpec
from gpusched.k8s.constraints import label_selector
from gpusched.k8s.errors import InvalidRequest
from gpusched.k8s.informer import Handlers, Reflector

log = logging.getLogger(__name__)


def budget_from_k8s(obj: Mapping[str, Any]) -> tuple[DisruptionBudget | None, frozenset[str]]:
    """One ``policy/v1`` PodDisruptionBudget (a dict as the API returns it) → the core's
    ``DisruptionBudget`` (None when its selector is null: it selects no pod) and the names of the
    pods it counts as disrupted already (``status.disruptedPods``)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    where = f"PodDisruptionBudget {ns}/{name}"
    selector = label_selector(spec.get("selector"), f"{where}: spec.selector")
    allowed = status.get("disruptionsAllowed", 0)
    if not isinstance(allowed, int) or isinstance(allowed, bool):
        raise InvalidRequest(f"{where}: status.disruptionsAllowed must be an integer, got {allowed!r}")
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if isinstance(generation, int) and (not isinstance(observed, int) or observed < generation):
        allowed = 0  # not processed by the disruption controller yet: the Eviction API refuses too
    disrupted = status.get("disruptedPods") or {}
    if not isinstance(disrupted, Mapping):
        raise InvalidRequest(f"{where}: status.disruptedPods must map pod names to times")
    names = frozenset(str(k) for k in disrupted)
    if selector is None:
        return None, names
    try:
        return DisruptionBudget(name, ns, selector, max(0, allowed)), names
    except GpuschedError as e:
        raise InvalidRequest(f"{where}: {e}") from None


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


class BudgetReader:
    """Every PodDisruptionBudget of the cluster, kept current by list + watch.

    ``policy`` is a ``kubernetes.client.PolicyV1Api``. ``start()`` begins watching;
    ``wait_synced()`` waits for the first list. Thread-safe."""

    def __init__(self, policy: Any) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[DisruptionBudget | None, frozenset[str]]] = {}
        self._frozen: DisruptionBudgets | None = DisruptionBudgets()
        self.invalid: dict[str, str] = {}
        """Budgets that could not be read: key → why."""
        self.reflector = Reflector(
            "poddisruptionbudgets",
            policy.list_pod_disruption_budget_for_all_namespaces,
            Handlers(self.upsert, self.delete, self.sync),
        )

    # ----------------------------------------------------------- informer
    def upsert(self, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        try:
            b = budget_from_k8s(obj)
        except InvalidRequest as e:
            log.warning("%s", e)
            with self._lock:
                self.invalid[key] = str(e)
                self._items.pop(key, None)
                self._frozen = None
            return
        with self._lock:
            self.invalid.pop(key, None)
            if self._items.get(key) != b:
                self._items[key] = b
                self._frozen = None

    def delete(self, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        with self._lock:
            self.invalid.pop(key, None)
            if self._items.pop(key, None) is not None:
                self._frozen = None

    def sync(self, items: list[Mapping[str, Any]]) -> None:
        keys = {_key(o) for o in items}
        with self._lock:
            for gone in [k for k in self._items if k not in keys]:
                del self._items[gone]
                self._frozen = None

    # ------------------------------------------------------------- reads
    def budgets(self) -> DisruptionBudgets:
        """Every budget now, in key order (the same object until one changes)."""
        with self._lock:
            if self._frozen is None:
                held = [(k, *self._items[k]) for k in sorted(self._items)]
                self._frozen = DisruptionBudgets(
                    tuple(b for _, b, _ in held if b is not None),
                    {k: gone for k, b, gone in held if b is not None and gone},
                )
            return self._frozen

    def may_disrupt(self, pod: PodSpec) -> bool:
        """Whether the Eviction API would let ``pod`` go now, as far as budgets go."""
        return self.budgets().may_disrupt(pod)

    # ---------------------------------------------------------- lifecycle
    def start(self) -> BudgetReader:
        self.reflector.start()
        return self

    def synced(self) -> bool:
        return self.reflector.synced.is_set()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        return self.reflector.wait_synced(timeout)

    def stop(self) -> None:
        self.reflector.stop()
