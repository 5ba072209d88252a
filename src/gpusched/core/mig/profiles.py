"""MIG GPU-instance profiles per GPU model: names, slices, allowed placements, and the attributes GFD labels.

From ../shared/reference/mig.md §2 (NVIDIA's MIG user guide tables): every 8-memory-slice GPU (A100, H100,
H200, B200) shares one layout; only the profile names and per-slice numbers differ. A30 uses quarters. This is
the one table: the core's MIG model (``gpusched.core.mig``) places slices by it, and the node agent
(``gpusched.agent.migprofiles``) fills its fake backend's attributes and checks instances by it. Memory per
profile is approximate (the driver reports slightly less than the name); SM and engine counts are the lgip
listings' for A100 and H100 and the Hopper values for later parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpusched.core.errors import InvalidInput


class MigError(InvalidInput):
    """A MIG instance or request the GPU model cannot have."""


@dataclass(frozen=True)
class Kind:
    key: str  # "1g", "1g+me", "1g2" (double memory), "2g", "3g", "4g", "7g"
    mem_slices: int
    sm_slices: int
    starts: tuple[int, ...]
    max_count: int


EIGHT_SLICE = (
    Kind("1g", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    Kind("1g+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    Kind("1g2", 2, 1, (0, 2, 4, 6), 4),
    Kind("2g", 2, 2, (0, 2, 4), 3),
    Kind("3g", 4, 3, (0, 4), 2),
    Kind("4g", 4, 4, (0,), 1),
    Kind("7g", 8, 7, (0,), 1),
)
A30_LAYOUT = (
    Kind("1g", 1, 1, (0, 1, 2, 3), 4),
    Kind("1g+me", 1, 1, (0, 1, 2, 3), 1),
    Kind("2g", 2, 2, (0, 2), 2),
    Kind("4g", 4, 4, (0,), 1),
)

# Profile name per kind, per model class (mig.md §2b, §2c).
_NAMES: dict[str, dict[str, str]] = {
    "a100-40gb": {
        "1g": "1g.5gb",
        "1g+me": "1g.5gb+me",
        "1g2": "1g.10gb",
        "2g": "2g.10gb",
        "3g": "3g.20gb",
        "4g": "4g.20gb",
        "7g": "7g.40gb",
    },
    "a100-80gb": {
        "1g": "1g.10gb",
        "1g+me": "1g.10gb+me",
        "1g2": "1g.20gb",
        "2g": "2g.20gb",
        "3g": "3g.40gb",
        "4g": "4g.40gb",
        "7g": "7g.80gb",
    },
    "h100-80gb": {
        "1g": "1g.10gb",
        "1g+me": "1g.10gb+me",
        "1g2": "1g.20gb",
        "2g": "2g.20gb",
        "3g": "3g.40gb",
        "4g": "4g.40gb",
        "7g": "7g.80gb",
    },
    "h100-94gb": {
        "1g": "1g.12gb",
        "1g+me": "1g.12gb+me",
        "1g2": "1g.24gb",
        "2g": "2g.24gb",
        "3g": "3g.47gb",
        "4g": "4g.47gb",
        "7g": "7g.94gb",
    },
    "h100-96gb": {
        "1g": "1g.12gb",
        "1g+me": "1g.12gb+me",
        "1g2": "1g.24gb",
        "2g": "2g.24gb",
        "3g": "3g.48gb",
        "4g": "4g.48gb",
        "7g": "7g.96gb",
    },
    "h200-141gb": {
        "1g": "1g.18gb",
        "1g+me": "1g.18gb+me",
        "1g2": "1g.35gb",
        "2g": "2g.35gb",
        "3g": "3g.71gb",
        "4g": "4g.71gb",
        "7g": "7g.141gb",
    },
    "b200": {
        "1g": "1g.23gb",
        "1g+me": "1g.23gb+me",
        "1g2": "1g.45gb",
        "2g": "2g.45gb",
        "3g": "3g.90gb",
        "4g": "4g.90gb",
        "7g": "7g.180gb",
    },
    "a30": {"1g": "1g.6gb", "1g+me": "1g.6gb+me", "2g": "2g.12gb", "4g": "4g.24gb"},
}

# SMs per kind (mig.md §2e) and (copy, decoder, encoder, jpeg, ofa) engines (lgip listings).
_AMPERE_SMS = {"1g": 14, "1g+me": 14, "1g2": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_HOPPER_SMS = {"1g": 16, "1g+me": 16, "1g2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}
_BLACKWELL_SMS = {"1g": 18, "1g+me": 18, "1g2": 30, "2g": 36, "3g": 72, "4g": 72, "7g": 144}
_A30_SMS = {"1g": 14, "1g+me": 14, "2g": 28, "4g": 56}
_AMPERE_ENGINES = {
    "1g": (1, 0, 0, 0, 0),
    "1g+me": (1, 1, 0, 1, 1),
    "1g2": (1, 1, 0, 0, 0),
    "2g": (2, 1, 0, 0, 0),
    "3g": (3, 2, 0, 0, 0),
    "4g": (4, 2, 0, 0, 0),
    "7g": (7, 5, 0, 1, 1),
}
_HOPPER_ENGINES = {
    "1g": (1, 1, 0, 1, 0),
    "1g+me": (1, 1, 0, 1, 1),
    "1g2": (1, 1, 0, 1, 0),
    "2g": (2, 2, 0, 2, 0),
    "3g": (3, 3, 0, 3, 0),
    "4g": (4, 4, 0, 4, 0),
    "7g": (8, 7, 0, 7, 1),
}


def model_class(name: str, memory_mib: int) -> str | None:
    """The MIG table that applies to a GPU (its NVML name and memory), or None when it has no MIG."""
    n = name.upper()
    if "A100" in n:
        return "a100-80gb" if memory_mib > 60_000 else "a100-40gb"
    if "GH200" in n or re.search(r"\bH20\b", n):
        return "h100-96gb" if memory_mib < 120_000 else None
    if "H200" in n:
        return "h200-141gb"
    if "H100" in n:
        if memory_mib > 95_500:
            return "h100-96gb"
        return "h100-94gb" if memory_mib > 85_000 else "h100-80gb"
    if "B200" in n:
        return "b200"
    if "A30" in n:
        return "a30"
    return None


@dataclass(frozen=True)
class Profile:
    name: str
    kind: Kind
    memory_mib: int
    multiprocessors: int
    engines: tuple[int, int, int, int, int]  # copy, decoder, encoder, jpeg, ofa


def profiles(name: str, memory_mib: int) -> dict[str, Profile]:
    """Every GPU-instance profile of this model, by name ({} for a GPU without MIG)."""
    cls = model_class(name, memory_mib)
    if cls is None:
        return {}
    layout = A30_LAYOUT if cls == "a30" else EIGHT_SLICE
    total_slices = 4 if cls == "a30" else 8
    if cls.startswith("a100") or cls == "a30":
        sms, engines = (_A30_SMS if cls == "a30" else _AMPERE_SMS), _AMPERE_ENGINES
    elif cls == "b200":
        sms, engines = _BLACKWELL_SMS, _HOPPER_ENGINES
    else:
        sms, engines = _HOPPER_SMS, _HOPPER_ENGINES
    out = {}
    for k in layout:
        pname = _NAMES[cls][k.key]
        mem = (memory_mib * k.mem_slices // total_slices) // 256 * 256
        out[pname] = Profile(pname, k, mem, sms[k.key], engines[k.key])
    return out


MODEL_CLASSES: tuple[str, ...] = tuple(_NAMES)
ALL_PROFILE_NAMES: frozenset[str] = frozenset(n for names in _NAMES.values() for n in names.values())


def layout(model_cls: str) -> tuple[Kind, ...]:
    """The GPU-instance kinds of a model class (``model_class``'s answer)."""
    if model_cls not in _NAMES:
        raise MigError(f"unknown MIG model class {model_cls!r} (known: {', '.join(MODEL_CLASSES)})")
    return A30_LAYOUT if model_cls == "a30" else EIGHT_SLICE


def kinds_by_name(model_cls: str) -> dict[str, Kind]:
    """Profile name -> kind for one model class, e.g. ``{"1g.10gb": Kind("1g", ...), ...}``."""
    return {_NAMES[model_cls][k.key]: k for k in layout(model_cls)}
