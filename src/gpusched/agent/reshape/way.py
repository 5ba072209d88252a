"""Which way a node's MIG geometry is reshaped, per node pool: the node label ``gpusched.io/mig-reshape-way``
(``nvml``, ``mig-manager``, ``off``) when the node has it, else the agent's flag (``gpusched agent
mig-reshape --way``; one value per DaemonSet, so per node pool). docs/mig.md, "Reshaping", says when to
take which."""

from __future__ import annotations

from collections.abc import Mapping

from gpusched.core.mig.reshape import ReshapeWay
from gpusched.core.names import LABEL_MIG_RESHAPE_WAY

__all__ = ["ReshapeWay", "reshape_way"]


def reshape_way(node: str, labels: Mapping[str, str], flag: ReshapeWay) -> ReshapeWay:
    """The node label wins over the agent's flag; a label with another value is an error naming the node."""
    value = labels.get(LABEL_MIG_RESHAPE_WAY)
    if value is None:
        return flag
    return ReshapeWay.parse(value, f"node {node}: label {LABEL_MIG_RESHAPE_WAY}")
