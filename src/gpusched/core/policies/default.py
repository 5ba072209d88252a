"""The project's default policy (placeholder: FGD until measured otherwise)."""

from __future__ import annotations

from gpusched.core.policies.fgd import FGDScore


class DefaultScore(FGDScore):
    name = "DefaultScore"
