"""Which way a node's MIG geometry is reshaped, per node pool: the node label ``gpusched.io/mig-reshape-way``
(``nvml``, ``mig-manager``, ``off``) when the node has it, else the agent's flag (``gpusched agent
mig-reshape --way``; one value per DaemonSet, so per node pool). docs/mig.md, "Reshaping", says when to
take which."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.reshape import ReshapeScope
from gpusched.core.names import LABEL_MIG_RESHAPE_WAY


class ReshapeWay(enum.Enum):
    NVML = "nvml"  # way (a): the agent creates and destroys GPU and compute instances through NVML
    MIG_MANAGER = "mig-manager"  # way (b): NVIDIA's mig-manager applies a mig-parted configuration
    OFF = "off"  # the geometry is the operator's: never reshaped

    @property
    def scope(self) -> ReshapeScope | None:
        """What the planner may re-cut on a node reshaped this way (None: nothing)."""
        return {
            ReshapeWay.NVML: ReshapeScope.FREE_SLICES,
            ReshapeWay.MIG_MANAGER: ReshapeScope.WHOLE_GPU,
        }.get(self)

    @staticmethod
    def parse(value: str, where: str) -> ReshapeWay:
        try:
            return ReshapeWay(value)
        except ValueError:
            allowed = ", ".join(w.value for w in ReshapeWay)
            raise InvalidInput(f"{where}: {value!r} is not a MIG reshape way ({allowed})") from None


def reshape_way(node: str, labels: Mapping[str, str], flag: ReshapeWay) -> ReshapeWay:
    """The node label wins over the agent's flag; a label with another value is an error naming the node."""
    value = labels.get(LABEL_MIG_RESHAPE_WAY)
    if value is None:
        return flag
    return ReshapeWay.parse(value, f"node {node}: label {LABEL_MIG_RESHAPE_WAY}")
