"""Carrying out a preemption: victims leave through the Eviction API, the preemptor is nominated.

The core chose the node and the victims (``DefaultPreemption``, with the PodDisruptionBudgets
as data, so that a choice breaking no budget wins when one exists). ``Preemptor.run`` then:

1. evicts each victim through ``pods/eviction`` (``k8s/eviction.py``) with its UID as a
   precondition and its own grace period: it terminates gracefully and keeps its GPUs in the
   books until the API deletes it;
2. when the API refuses a victim for its budget (429): if the choice *knowingly* broke that
   budget — no choice spared every budget, and kube-scheduler would delete the victim anyway
   (``violate_budgets``, the default) — the victim is deleted gracefully instead, with an event
   naming the budget; otherwise (the budget changed since it was read) the victim stays, and the
   preemptor is told to decide again later (``PreemptionRun.blocked``);
3. sets the preemptor's ``status.nominatedNodeName`` when any victim is leaving (for a gang,
   ``run_gang``: each member's, where it will land); the scheduler
   keeps the room on that node for it (``schedule_with_nominated``) until it binds.

Each victim leaving gets a ``Preempted`` event; the preemptor a ``PreemptionBlocked`` warning
when a budget kept a victim.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusched.core.disruption import DisruptionBudgets
from gpusched.core.model import PodSpec
from gpusched.k8s.binder import describe
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.eviction import Eviction, Evictor, Outcome

log = logging.getLogger(__name__)


@dataclass
class PreemptionRun:
    """What became of one preemption's victims."""

    leaving: list[str] = field(default_factory=list)
    """Victims evicted (or deleted) and terminating, or already gone."""
    blocked: list[Eviction] = field(default_factory=list)
    """Victims a budget kept (not forced): the preemptor decides again after ``retry_after_s``."""
    failed: list[Eviction] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    """Victims deleted despite their budget (no choice spared every budget)."""
    nominated: bool = False

    @property
    def retry_after_s(self) -> float:
        return max((b.retry_after_s for b in self.blocked), default=0.0)


def _meta(p: PodSpec) -> dict[str, Any]:
    return {"name": p.name, "namespace": p.namespace, "uid": p.uid}


class Preemptor:
    """``core``: a ``CoreV1Api``; ``events``: the scheduler's recorder."""

    def __init__(self, core: Any, events: EventRecorder, *, violate_budgets: bool = True) -> None:
        self.core = core
        self.events = events
        self.evictor = Evictor(core)
        self.violate_budgets = violate_budgets

    def run(
        self, pod: PodSpec, node: str, victims: Sequence[PodSpec], budgets: DisruptionBudgets
    ) -> PreemptionRun:
        """Evict ``victims`` for ``pod`` (to land on ``node``), as the module says."""
        out = self._evict(pod.key, node, victims, budgets, [pod])
        if out.leaving:
            out.nominated = self.nominate(pod, node)
        return out

    def run_gang(
        self,
        gang: str,
        placement: Sequence[tuple[PodSpec, str]],
        victims: Sequence[PodSpec],
        budgets: DisruptionBudgets,
    ) -> PreemptionRun:
        """Evict ``victims`` for the members of ``gang`` and nominate each member where it will
        land (``placement``: pod, node) once they are gone."""
        nodes = ", ".join(sorted({n for _, n in placement}))
        out = self._evict(f"gang {gang}", nodes, victims, budgets, [p for p, _ in placement])
        if out.leaving:
            out.nominated = all([self.nominate(p, n) for p, n in placement])
        return out

    def _evict(
        self,
        by: str,
        nodes: str,
        victims: Sequence[PodSpec],
        budgets: DisruptionBudgets,
        told: Sequence[PodSpec],
    ) -> PreemptionRun:
        """Evict ``victims`` for ``by`` (landing on ``nodes``); ``told``: the preemptors warned
        when a budget keeps a victim."""
        ordered = sorted(victims, key=lambda v: (-v.priority, v.key))  # most important first, as counted
        knowingly = {p.key for p in budgets.split(ordered)[0]} if budgets else set()
        out = PreemptionRun()
        for v in victims:
            ev = self.evictor.evict(v.namespace, v.name, v.uid)
            if ev.outcome is Outcome.BLOCKED and v.key in knowingly and self.violate_budgets:
                forced = self.evictor.delete(v.namespace, v.name, v.uid)
                if forced.done:
                    out.forced.append(v.key)
                    why = f" (PodDisruptionBudget {ev.budget or '?'} violated: no choice spared every budget)"
                    self._left(out, v, by + why, nodes)
                else:
                    out.failed.append(forced)
                continue
            if ev.outcome is Outcome.BLOCKED:
                out.blocked.append(ev)
                continue
            if ev.done:
                self._left(out, v, by, nodes)
                continue
            out.failed.append(ev)
            log.warning("preempting %s for %s: %s", v.key, by, ev.message)
        if out.blocked:
            names = ", ".join(f"{b.key} ({b.budget or 'a PodDisruptionBudget'})" for b in out.blocked)
            msg = f"preemption on node {nodes} waits: eviction refused by the disruption budget of {names}"
            for p in told:
                self.events.failed(_pod_obj(p), msg, reason="PreemptionBlocked", condition=False)
        return out

    def _left(self, out: PreemptionRun, v: PodSpec, by: str, nodes: str) -> None:
        out.leaving.append(v.key)
        self.events.preempted(_meta(v), by, nodes)

    def nominate(self, pod: PodSpec, node: str) -> bool:
        """Set ``status.nominatedNodeName`` of the preemptor (kept until it binds)."""
        try:
            status = {"status": {"nominatedNodeName": node}}
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, status, _preload_content=False)
            return True
        except Exception as e:
            log.debug("nominating %s for %s: %s", node, pod.key, describe(e))
            return False


def _pod_obj(p: PodSpec) -> dict[str, Any]:
    return {"metadata": _meta(p)}
