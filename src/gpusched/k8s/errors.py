"""The Kubernetes adapters' error for objects that cannot be read."""

from __future__ import annotations

from gpusched.core.errors import InvalidInput


class InvalidRequest(InvalidInput):
    """A pod or node whose GPU request cannot be read; the message names the field and pod."""
