"""Wire format of the kube-scheduler extender protocol: parsing requests, shaping answers.

The structs (``k8s.io/kube-scheduler/extender/v1``) have no JSON tags, so every key is the Go
field name: ``Pod``, ``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``, ``Host``, ``Score``, ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``,
``NodeNameToVictims``, ``NodeNameToMetaVictims``, ``Pods``, ``UID``, ``NumPDBViolations``.

Errors (kube-scheduler treats every non-200 answer as an error, and an ``Error`` field too):

- a body that is not a JSON object → HTTP 400 ``{"Error": "..."}``, on every verb;
- a well-formed request that cannot be served (no ``Pod``, wrong types, an invalid GPU request)
  → HTTP 200 with ``Error`` set on ``/filter`` and ``/bind`` (their answers have that field, and
  kube-scheduler puts its text in the pod's FailedScheduling event), HTTP 400 with
  ``{"Error": "..."}`` on ``/prioritize`` and ``/preempt`` (their answers have no such field;
  kube-scheduler ignores prioritize errors and skips the extender's preemption advice).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gpusched.core.fragmentation import TargetWorkload, TypeKey

MAX_PRIORITY = 10
"""``MaxExtenderPriority``: extender scores are 0..10."""


class BadRequest(ValueError):
    """A request that cannot be served; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest (HTTP 400)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(data).__name__}")
    return data


def dumps(obj: object) -> bytes:
    return orjson.dumps(obj)


def field(args: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    """``args[name]`` checked against ``kind``; None when absent (or JSON null) and not required."""
    value = args.get(name)
    if value is None:
        if required:
            raise BadRequest(f"missing field {name!r}")
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BadRequest(f"field {name!r} must be {want}, got {type(value).__name__}")
    return value


def node_items(args: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """``Nodes.items`` of an ExtenderArgs (nodeCacheCapable false), or None when not sent."""
    nodes = field(args, "Nodes", dict, required=False)
    if nodes is None:
        return None
    items = nodes.get("items") or []
    if not isinstance(items, list) or not all(isinstance(o, dict) for o in items):
        raise BadRequest("field 'Nodes.items' must be a list of v1.Node objects")
    return items


def node_names(args: Mapping[str, Any]) -> list[str] | None:
    """``NodeNames`` (nodeCacheCapable true); its items are checked where the list is first indexed."""
    names: list[str] | None = field(args, "NodeNames", list, required=False)
    return names


def check_names(names: list[Any]) -> None:
    if not all(type(n) is str for n in names):
        raise BadRequest("field 'NodeNames' must be a list of strings")


def encode_priorities(names: list[str]) -> npt.NDArray[np.object_]:
    """Per node, the encoded ``{"Host": name, "Score": s}`` for s = 0..MAX_PRIORITY: an object array
    (nodes × 11) of bytes, so that an answer is one fancy-indexing and one join."""
    out = np.empty((len(names), MAX_PRIORITY + 1), dtype=object)
    for i, n in enumerate(names):
        head = b'{"Host":' + orjson.dumps(n) + b',"Score":'
        out[i] = [head + str(s).encode() + b"}" for s in range(MAX_PRIORITY + 1)]
    return out


def name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def uid_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("uid") or "") if isinstance(meta, dict) else ""


def normalise(scores: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Min-max normalisation of a float array to integers 0..MAX_PRIORITY, rounded half to even
    (best → 10, worst → 0); all equal → all MAX_PRIORITY."""
    raw = np.asarray(scores, dtype=np.float64)
    if len(raw) == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = float(raw.min()), float(raw.max())
    if hi - lo <= 1e-12:
        return np.full(len(raw), MAX_PRIORITY, dtype=np.int64)
    return np.rint((raw - lo) * (MAX_PRIORITY / (hi - lo))).astype(np.int64)


# Typical pod types for the fragmentation-aware policies (``default``, ``fgd``) when nothing
# better is known: the published mix of the Alibaba GPU trace 2023 (share sizes and counts,
# whole-GPU pods by GPU count, CPU-only pods), at 8 cores per GPU. (cpu milli, gpu milli, num, count)
_TYPICAL: tuple[tuple[int, int, int, int], ...] = (
    (8000, 810, 1, 1078),
    (8000, 470, 1, 750),
    (8000, 320, 1, 328),
    (8000, 650, 1, 253),
    (8000, 230, 1, 140),
    (8000, 460, 1, 128),
    (8000, 1000, 1, 3911),
    (16000, 1000, 2, 16),
    (32000, 1000, 4, 15),
    (64000, 1000, 8, 44),
    (8000, 0, 0, 1088),
)


def typical_workload() -> TargetWorkload:
    counts: Counter[TypeKey] = Counter({(cpu, milli, num, frozenset()): n for cpu, milli, num, n in _TYPICAL})
    return TargetWorkload.from_counts(counts)
