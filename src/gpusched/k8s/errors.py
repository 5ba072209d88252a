"""The Kubernetes adapters' error for objects that cannot be read."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A pod or node whose GPU request cannot be read; the message names the field and pod."""
