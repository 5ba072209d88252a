"""NVIDIA's ``single`` MIG strategy on the agent's side: every GPU of the node is in MIG mode and cut into
instances of one profile, and each instance is one ``nvidia.com/gpu`` device (ID: its MIG UUID).

The rules are NVIDIA's device plugin's (internal/rm/rm.go, device_map.go; ../shared/reference/mig.md §4):
all GPUs MIG-enabled, none empty, one MIG type (``single_profile``). The labels are GFD's single strategy
(internal/lm/mig-strategy.go): ``nvidia.com/gpu.product`` is ``<product>-MIG-<profile>``, and
``nvidia.com/gpu.{count,memory,multiprocessors,slices.gi,slices.ci,engines.*}`` describe one MIG device,
``count`` being the number of MIG devices; a node that breaks the rules gets ``<product>-MIG-INVALID`` with
count 0 (and the agent refuses to serve it: ``SingleStrategyError``).
"""

from __future__ import annotations

import re

from gpusched.agent.inventory import Inventory, MigInstance
from gpusched.core.errors import InvalidInput


class SingleStrategyError(InvalidInput):
    """A node that the single strategy cannot serve; the message says which rule it breaks."""


def _sanitise(text: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def devices(inv: Inventory) -> list[MigInstance]:
    """Every MIG device of the node (CIs spanning their GI), in NVML order."""
    return [m for d in inv.devices if d.mig_enabled for m in d.mig_instances if m.slices_ci == m.slices_gi]


def single_profile(inv: Inventory) -> str:
    """The one profile behind the node's ``nvidia.com/gpu``; raises SingleStrategyError naming the rule
    broken."""
    if not inv.devices:
        raise SingleStrategyError("MIG strategy single: the node has no GPU")
    off = [d.index for d in inv.devices if not d.mig_enabled]
    if off:
        raise SingleStrategyError(
            f"MIG strategy single: GPU(s) {off} are not in MIG mode (every GPU must be)"
        )
    empty = [d.index for d in inv.devices if not any(m.slices_ci == m.slices_gi for m in d.mig_instances)]
    if empty:
        raise SingleStrategyError(
            f"MIG strategy single: GPU(s) {empty} have no MIG device (none may be empty)"
        )
    profiles = sorted({m.profile for m in devices(inv)})
    if len(profiles) != 1:
        raise SingleStrategyError(
            f"MIG strategy single: one MIG profile per node, found {', '.join(profiles)}"
        )
    return profiles[0]


def single_labels(inv: Inventory) -> dict[str, str]:
    """GFD's single-strategy labels (over the per-GPU ones)."""
    product = _sanitise(inv.devices[0].name) if inv.devices else "unknown"
    try:
        profile = single_profile(inv)
    except SingleStrategyError:
        return {"nvidia.com/gpu.product": f"{product}-MIG-INVALID", "nvidia.com/gpu.count": "0"}
    devs = devices(inv)
    m = devs[0]
    return {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": f"{product}-MIG-{_sanitise(profile)}",
        "nvidia.com/gpu.count": str(len(devs)),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": str(m.memory_mib),
        "nvidia.com/gpu.multiprocessors": str(m.multiprocessors),
        "nvidia.com/gpu.slices.gi": str(m.slices_gi),
        "nvidia.com/gpu.slices.ci": str(m.slices_ci),
        "nvidia.com/gpu.engines.copy": str(m.engines_copy),
        "nvidia.com/gpu.engines.decoder": str(m.engines_decoder),
        "nvidia.com/gpu.engines.encoder": str(m.engines_encoder),
        "nvidia.com/gpu.engines.jpeg": str(m.engines_jpeg),
        "nvidia.com/gpu.engines.ofa": str(m.engines_ofa),
    }
