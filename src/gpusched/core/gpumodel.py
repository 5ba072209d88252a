"""GPU model names, compared in one form: ``canonical_gpu_model``.

Nodes name their GPU model in the label ``nvidia.com/gpu.product``, as NVIDIA's gpu-feature-discovery
and gpusched's node agent write it: NVML's name with spaces turned into ``-`` and the vendor or brand
prefix kept (``NVIDIA-A100-SXM4-80GB``, ``NVIDIA-H100-80GB-HBM3``, ``Tesla-T4``). Users write the same
model with or without that prefix (``A100-SXM4-80GB``, ``T4``). Every place that compares models — a
pod's ``gpusched.io/gpu-models``, a node's product label, a queue's ``perModel`` quota, doctor's
suggestions — holds the canonical form, so the forms above all name one model:

1. surrounding whitespace is dropped and each run of spaces becomes one ``-`` (NVML's name as GFD
   sanitises it: ``NVIDIA A100-SXM4-80GB`` -> ``NVIDIA-A100-SXM4-80GB``);
2. leading ``NVIDIA-`` and ``Tesla-`` prefixes are dropped, in any letter case, as many as there are
   (``NVIDIA-A100-SXM4-80GB`` -> ``A100-SXM4-80GB``, ``Tesla-T4`` -> ``T4``,
   ``NVIDIA-Tesla-V100`` -> ``V100``); a prefix with nothing after it is kept;
3. nothing else changes: the rest is compared exactly, letter case included (``A100-SXM4-80GB`` and
   ``A100-SXM4-40GB`` stay two models, as do ``GeForce-RTX-4090`` and ``RTX-4090``).

The core model applies it when a ``NodeSpec``, ``PodSpec`` or ``QueueSpec`` is built, so a model
never reaches a comparison in any other form; messages show the canonical form.
"""

from __future__ import annotations

import re
from functools import lru_cache

VENDOR_PREFIXES = ("nvidia-", "tesla-")
"""Dropped from the front of a model name, in any letter case (compared case-folded)."""

_SPACES = re.compile(r"\s+")


@lru_cache(maxsize=1024)
def canonical_gpu_model(name: str) -> str:
    """The one form in which GPU model names are compared (see the module's rules)."""
    text = _SPACES.sub("-", name.strip())
    while True:
        head = text.casefold()
        prefix = next((p for p in VENDOR_PREFIXES if head.startswith(p) and len(text) > len(p)), None)
        if prefix is None:
            return text
        text = text[len(prefix) :]


def canonical_gpu_models(names: frozenset[str]) -> frozenset[str]:
    """``canonical_gpu_model`` of each name (the set itself when none changes)."""
    out = frozenset(canonical_gpu_model(n) for n in names)
    return names if out == names else out
