"""The defragmentation adapter's errors: each names what is wrong; the command line prints it and
exits 2."""

from __future__ import annotations

from gpusched.core.errors import GpuschedError, InvalidInput


class DefragError(GpuschedError):
    """The root of the adapter's own errors."""


class UnknownTarget(DefragError, InvalidInput):
    """A pod named for a plan that the cluster does not have, or that is not pending."""


class InvalidBudget(DefragError, InvalidInput):
    """A PodDisruptionBudget that cannot be read as a disruption budget (names it and the field)."""
