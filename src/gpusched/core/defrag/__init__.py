"""Defragmentation planning, pure: which running pods to move, and where, so that a pending pod (or
gang) fits (``plan_for``), or so that the cluster's fragmentation drops (``consolidate``); and
carrying a plan out on the books step by step (``apply_plan``). No I/O and no clock: the work
budget is a count, and a caller's deadline comes in as a callable polled between units of work.
"""

from gpusched.core.defrag.apply import apply_plan
from gpusched.core.defrag.consolidate import consolidate
from gpusched.core.defrag.planner import plan_for
from gpusched.core.defrag.types import (
    RECREATING_KINDS,
    REFUSAL_TEXT,
    DisruptionBudget,
    Method,
    Move,
    Placement,
    Plan,
    PlanError,
    PriorityRule,
    Refusal,
    Rules,
    WorkBudget,
    recreating_kinds,
)
from gpusched.core.defrag.units import Eligibility, Unit, eligibility

__all__ = [
    "RECREATING_KINDS",
    "REFUSAL_TEXT",
    "DisruptionBudget",
    "Eligibility",
    "Method",
    "Move",
    "Placement",
    "Plan",
    "PlanError",
    "PriorityRule",
    "Refusal",
    "Rules",
    "Unit",
    "WorkBudget",
    "apply_plan",
    "consolidate",
    "eligibility",
    "plan_for",
    "recreating_kinds",
]
