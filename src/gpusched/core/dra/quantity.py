"""Kubernetes quantities as integers in their base unit (bytes, or a count)."""

from __future__ import annotations

import re

from gpusched.core.errors import InvalidSpec

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_RE = re.compile(r"^([+-]?\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def parse_quantity(text: str, what: str = "quantity") -> int:
    """``"40Gi"`` -> 42949672960. Refuses fractions and milli units: the core counts whole units."""
    m = _RE.match(text.strip())
    if m is None:
        raise InvalidSpec(
            f"{what}: {text!r} is not a whole number of base units (e.g. 8, 40Gi, 2k); fractions and"
            " milli-units are not supported for DRA capacities"
        )
    return int(m.group(1)) * _SUFFIX[m.group(2) or ""]


def format_quantity(value: int) -> str:
    """An integer in its canonical Kubernetes form: the largest binary suffix that divides it exactly
    (``16106127360`` -> ``"15Gi"``), else the plain number (``"50"``), as the API writes byte amounts."""
    if value:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = _SUFFIX[suffix]
            if value % unit == 0:
                return f"{value // unit}{suffix}"
    return str(value)
