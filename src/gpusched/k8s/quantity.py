"""Kubernetes quantities (``kubernetes.utils.parse_quantity``), each distinct text parsed once.

The same few texts ("500m", "1Gi", "470") come pod after pod; the client's parser builds
several Decimals per call. Texts are kept up to ``KEPT``; a text that does not parse is not
kept (it raises again, each time). A Decimal is immutable, so callers may share one.
"""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity as _parse

KEPT = 4096


@lru_cache(maxsize=KEPT)
def _parse_text(text: str) -> Decimal:
    q: Decimal = _parse(text)  # type: ignore[no-untyped-call]
    return q


def parse_quantity(value: object) -> Decimal:
    """``value`` (a string, int, float or Decimal) as a Decimal; raises ValueError (or TypeError
    for other types) as the client's parser does."""
    if type(value) is str:
        return _parse_text(value)
    q: Decimal = _parse(value)  # type: ignore[no-untyped-call]
    return q
