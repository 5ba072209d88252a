"""The core's error for specs that cannot be scheduled as written."""

from __future__ import annotations


class InvalidSpec(ValueError):
    """A node or pod spec that cannot be scheduled as written. The message names the field."""
