"""Consumable capacity: how much of a device's capacity one allocation consumes (request policies)."""

from __future__ import annotations

from collections.abc import Mapping

from gpusched.core.dra.model import Capacity, Device, qualify


def consumed_amount(cap: Capacity, requested: int | None) -> int | None:
    """What an allocation asking ``requested`` (None: not asked) consumes of ``cap``, or None when
    the policy cannot satisfy it. Without a request: the policy's default, else the whole value.
    Valid values round up to the smallest one not below the request; a range raises to ``min`` and
    rounds up to ``min + k*step``, and must stay within ``max``."""
    policy = cap.policy
    if requested is None:
        if policy is None or policy.default is None:
            return cap.value
        requested = policy.default
    if policy is None:
        return requested
    if policy.valid_values:
        fitting = [v for v in sorted(policy.valid_values) if v >= requested]
        return fitting[0] if fitting else None
    amount = requested
    if policy.min is not None:
        amount = max(amount, policy.min)
        if policy.step:
            over = amount - policy.min
            amount = policy.min + -(-over // policy.step) * policy.step
    if policy.max is not None and amount > policy.max:
        return None
    return amount


def consumption(device: Device, requests: Mapping[str, int], driver: str) -> dict[str, int] | None:
    """Per capacity name (qualified), what one allocation consumes; None if it cannot fit the policy
    or asks for a capacity the device does not have."""
    if not device.capacity and not requests:
        return {}  # the common case (whole devices, MIG slices): nothing to qualify
    caps = {qualify(driver, n): c for n, c in device.capacity.items()}
    wanted = {qualify(driver, n): v for n, v in requests.items()}
    if any(n not in caps for n in wanted):
        return None
    out: dict[str, int] = {}
    for name, cap in caps.items():
        amount = consumed_amount(cap, wanted.get(name))
        if amount is None:
            return None
        out[name] = amount
    return out
