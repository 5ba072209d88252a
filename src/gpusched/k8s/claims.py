"""Pods with Dynamic Resource Allocation claims (``spec.resourceClaims``).

The standalone scheduler does not allocate ResourceClaims (kube-scheduler's DynamicResources
plugin does, with the DRA drivers' ResourceSlices): binding such a pod would start it without the
devices it claims. So it is never bound here: it gets a clear ``FailedScheduling`` event and waits
(as unschedulable; a change to the pod, e.g. another scheduler name, moves it on).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def claims_message(pod: Mapping[str, Any]) -> str:
    """Why ``pod`` cannot be scheduled here ("" when it claims nothing)."""
    claims = (pod.get("spec") or {}).get("resourceClaims") or []
    if not claims:
        return ""
    names = ", ".join(str(c.get("name", "?")) for c in claims if isinstance(c, Mapping)) or "?"
    return (
        f"spec.resourceClaims ({names}): gpusched's standalone scheduler cannot allocate DRA "
        "ResourceClaims; the pod waits unbound (schedule it with kube-scheduler, which allocates them)"
    )
