"""Carrying a plan out on a snapshot, one step at a time, each step checked.

The steps are the plan's moves in order (evict the pod, then book it at its destination: the
filters must pass there on the books as they are at that step, and the books must take it), then
the pending pods' placements. ``apply_plan`` does it within a ``Statement`` so that the caller
keeps (``commit``) or undoes (``discard``) the whole plan; the planner verifies every plan this
way before it answers, the simulator carries plans out with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpusched.core.cluster import AccountingError
from gpusched.core.defrag.types import Plan
from gpusched.core.framework import Profile
from gpusched.core.mig.books import MigSlot
from gpusched.core.model import PodSpec
from gpusched.core.scheduler import fits
from gpusched.core.statement import Statement


def apply_plan(
    st: Statement,
    profile: Profile,
    plan: Plan,
    pending: Mapping[str, PodSpec] | None = None,
    *,
    check_filters: bool = True,
) -> str | None:
    """Carry ``plan`` out within ``st``: None when every step held, else why the first one that
    failed did (the steps before it stay in ``st``: discard it). ``pending`` gives the specs of the
    pods of ``plan.placements`` (they are not in the books yet)."""
    snap = st.snap
    for i, mv in enumerate(plan.moves, 1):
        a = snap.allocations.get(mv.pod)
        if a is None:
            return f"move {i}: pod {mv.pod} is not running"
        if snap.names[a.node] != mv.from_node or a.gpus != mv.from_gpus:
            return f"move {i}: pod {mv.pod} is on {snap.names[a.node]} {list(a.gpus)}, not {mv.from_node}"
        to = snap.index.get(mv.to_node)
        if to is None:
            return f"move {i}: no node {mv.to_node}"
        st.evict(mv.pod)
        why = _book(st, profile, a.pod, to, mv.to_gpus, check_filters, mv.to_mig)
        if why is not None:
            return f"move {i}: {why}"
    for pl in plan.placements:
        spec = (pending or {}).get(pl.pod)
        if spec is None:
            return f"placement of {pl.pod}: its spec was not given"
        to = snap.index.get(pl.node)
        if to is None:
            return f"placement of {pl.pod}: no node {pl.node}"
        why = _book(st, profile, spec, to, pl.gpus, check_filters, pl.mig)
        if why is not None:
            return f"placement: {why}"
    return None


def _book(
    st: Statement,
    profile: Profile,
    pod: PodSpec,
    node: int,
    gpus: tuple[int, ...],
    check_filters: bool,
    mig: tuple[MigSlot, ...] = (),
) -> str | None:
    """Book ``pod`` at ``node``/``gpus`` (and at the MIG slices ``mig``, where a move names them)."""
    snap = st.snap
    if check_filters and not fits(profile, pod, snap, node):
        return f"pod {pod.key} does not pass the filters on {snap.names[node]}"
    try:
        st.assume(pod, node, gpus, mig=mig or None)
    except AccountingError as e:
        return f"pod {pod.key} does not fit on {snap.names[node]} GPUs {list(gpus)}: {e}"
    return None
