"""Wire format of the kube-scheduler extender protocol: parsing requests, shaping answers.

The structs (``k8s.io/kube-scheduler/extender/v1``) have no JSON tags, so every key is the Go
field name: ``Pod``, ``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``, ``Host``, ``Score``, ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``,
``NodeNameToVictims``, ``NodeNameToMetaVictims``, ``Pods``, ``UID``, ``NumPDBViolations``.

Errors (kube-scheduler treats every non-200 answer as an error, and an ``Error`` field too;
either way it schedules nothing for the pod this cycle and retries it after a backoff):

- a body that is not a JSON object → HTTP 400 ``{"Error": "..."}``, on every verb;
- a request over one of the limits below → HTTP 400 ``{"Error": "..."}`` naming the field and
  the limit, on every verb (HTTP 413 for a body over ``--max-body-bytes``);
- the books not yet rebuilt from the API (the informers have not synced) once the verb has
  waited ``--sync-wait-seconds`` → HTTP 200 with ``Error`` set on ``/filter`` and ``/bind``
  (kube-scheduler only reads the body of a 200: so its FailedScheduling event says why),
  HTTP 503 ``{"Error": "..."}`` on ``/prioritize`` and ``/preempt``;
- a well-formed request that cannot be served (no ``Pod``, wrong types, an invalid GPU request)
  → HTTP 200 with ``Error`` set on ``/filter`` and ``/bind`` (their answers have that field, and
  kube-scheduler puts its text in the pod's FailedScheduling event), HTTP 400 with
  ``{"Error": "..."}`` on ``/prioritize`` and ``/preempt`` (their answers have no such field;
  kube-scheduler ignores prioritize errors and skips the extender's preemption advice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gpusched.core.errors import InvalidInput
from gpusched.k8s.quantity import parse_quantity

MAX_PRIORITY = 10
"""``MaxExtenderPriority``: extender scores are 0..10."""

DEFAULT_SYNC_WAIT_S = 2.0
"""Default ``--sync-wait-seconds``: how long a verb waits for the informers before refusing.
Well under kube-scheduler's extender ``httpTimeout`` (5 s by default, 10 s in deploy/), so that
/bind still has time for its API calls when the books come in just before the deadline."""

# Limits on what one request may carry (over one: HTTP 400 naming the field and the limit).
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Default ``--max-body-bytes``. With ``nodeCacheCapable: false`` a filter carries every
candidate node as a v1.Node: 10–20 KB for a GPU node as the API serves it (GPU feature discovery
labels, conditions and the 50 container images the kubelet reports dominate), so 32 MiB is
about 2000 nodes. Bigger clusters should use ``nodeCacheCapable: true`` (names only: about 30
bytes a node) or raise the limit."""
MAX_NODES = 65_536
"""Nodes (``Nodes.items`` or ``NodeNames``, victims' nodes) in one request: the largest
Kubernetes clusters run about 65 000 nodes."""
MAX_NAME_CHARS = 253
"""A node name (a DNS subdomain, as the API enforces)."""
MAX_VICTIMS_PER_NODE = 10_000
"""Victim pods proposed on one node (``--max-pods`` of a kubelet is at most a few hundred)."""
MAX_DEPTH = 100
"""JSON nesting: Kubernetes objects nest about 20 deep (managedFields included), the answers
must stay under orjson's 254 levels, and error messages must never recurse without end."""
MAX_QUANTITY_CHARS = 64
"""A resource quantity string of a pod (``"1e999999999"`` would make a 1-billion-digit integer)."""
MAX_QUANTITY = 10**18
"""The largest pod resource quantity accepted (in its own unit: cores, bytes, GPUs, ...)."""


class BadRequest(InvalidInput):
    """A request that cannot be served; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class LimitExceeded(BadRequest):
    """A request over one of the limits: answered with HTTP 400 (413 for the body) on every
    verb, never with a 200 whose ``Error`` is set."""


_STEP_CHUNK = 1 << 22


def json_depth(body: bytes | bytearray | memoryview, stop_at: int | None = None) -> int:
    """The deepest nesting of arrays and objects in ``body`` (brackets inside strings do not
    count), read from the bytes with numpy, 4 MiB at a time, before anything is parsed; stops
    once past ``stop_at``. Not a validator: any bytes give a number."""
    data = np.frombuffer(body, dtype=np.uint8)
    depth = deepest = 0
    in_string = False
    run = 0  # backslashes ending the previous chunk
    for start in range(0, len(data), _STEP_CHUNK):
        c = data[start : start + _STEP_CHUNK]
        quotes = np.flatnonzero(c == 34)
        slashes = np.flatnonzero(c == 92)
        if len(quotes) and (len(slashes) or run):
            # a quote is escaped when an odd number of backslashes comes right before it
            first = np.ones(len(slashes), dtype=bool)
            first[1:] = slashes[1:] != slashes[:-1] + 1
            head = np.maximum.accumulate(np.where(first, np.arange(len(slashes)), 0))
            last = np.searchsorted(slashes, quotes) - 1
            adjacent = np.zeros(len(quotes), dtype=bool)
            adjacent[last >= 0] = slashes[last[last >= 0]] == quotes[last >= 0] - 1
            runs = np.zeros(len(quotes), dtype=np.int64)
            runs[adjacent] = last[adjacent] - head[last[adjacent]] + 1
            from_before = np.zeros(len(quotes), dtype=bool)
            from_before[adjacent] = slashes[head[last[adjacent]]] == 0
            runs[from_before] += run
            runs[quotes == 0] = run
            quotes = quotes[runs % 2 == 0]
        if len(slashes) and slashes[-1] == len(c) - 1:
            k = len(slashes) - 1
            while k > 0 and slashes[k - 1] == slashes[k] - 1:
                k -= 1
            run = len(slashes) - k + (run if slashes[k] == 0 else 0)
        else:
            run = 0
        folded = c | 32  # "[" -> "{", "]" -> "}"
        opens, closes = np.flatnonzero(folded == 123), np.flatnonzero(folded == 125)
        where = np.concatenate((opens, closes))
        moves = np.concatenate((np.ones(len(opens), np.int64), np.full(len(closes), -1, np.int64)))
        order = np.argsort(where, kind="stable")
        where, moves = where[order], moves[order]
        outside = (np.searchsorted(quotes, where) + in_string) % 2 == 0
        moves = moves[outside]
        if len(moves):
            levels = depth + np.cumsum(moves)
            deepest = max(deepest, int(levels.max()))
            depth = int(levels[-1])
        in_string = (in_string + len(quotes)) % 2 == 1
        if stop_at is not None and deepest > stop_at:
            break
    return deepest


def parse_json(body: bytes | bytearray | memoryview, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest (HTTP 400): not JSON, not an object, or
    nested deeper than ``max_depth`` (checked on the bytes, before parsing)."""
    # nesting needs an opening bracket per level: a body with few of them skips the scan
    few = not isinstance(body, memoryview) and body.count(b"{") + body.count(b"[") <= max_depth
    if not few and json_depth(body, max_depth) > max_depth:
        raise LimitExceeded(f"request body nests JSON arrays and objects deeper than {max_depth} levels")
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


def check_count(what: str, n: int, limit: int) -> None:
    if n > limit:
        raise LimitExceeded(f"field {what!r} has {n} entries, more than the limit of {limit}")


def check_name(what: str, name: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise LimitExceeded(
            f"field {what!r}: a node name of {len(name)} characters, more than the limit of {MAX_NAME_CHARS}"
        )


def node_items(args: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """``Nodes.items`` of an ExtenderArgs (nodeCacheCapable false), or None when not sent."""
    nodes = field(args, "Nodes", dict, required=False)
    if nodes is None:
        return None
    items = nodes.get("items") or []
    if not isinstance(items, list) or not all(isinstance(o, dict) for o in items):
        raise BadRequest("field 'Nodes.items' must be a list of v1.Node objects")
    check_count("Nodes.items", len(items), MAX_NODES)
    return items


def node_names(args: Mapping[str, Any]) -> list[str] | None:
    """``NodeNames`` (nodeCacheCapable true); its items are checked where the list is first indexed."""
    names: list[str] | None = field(args, "NodeNames", list, required=False)
    if names is not None:
        check_count("NodeNames", len(names), MAX_NODES)
    return names


def check_names(names: list[Any]) -> None:
    if not set(map(type, names)) <= {str}:
        raise BadRequest("field 'NodeNames' must be a list of strings")
    if names and max(map(len, names)) > MAX_NAME_CHARS:
        check_name("NodeNames", max(names, key=len))


def check_quantities(pod: Mapping[str, Any]) -> None:
    """Every resource quantity of a pod's containers, init containers and overhead is short and
    at most ``MAX_QUANTITY``: checked before the pod is converted, where an integer is built
    from each (``int(Decimal("1e999999999"))`` would never return). Raises LimitExceeded."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return  # the conversion names what is wrong
    lists: list[tuple[str, Mapping[str, Any]]] = []
    for kind in ("containers", "initContainers"):
        cs = spec.get(kind)
        for i, c in enumerate(cs if isinstance(cs, list) else []):
            res = c.get("resources") if isinstance(c, dict) else None
            for part in ("limits", "requests"):
                m = res.get(part) if isinstance(res, dict) else None
                if isinstance(m, dict):
                    lists.append((f"Pod.spec.{kind}[{i}].resources.{part}", m))
    if isinstance(spec.get("overhead"), dict):
        lists.append(("Pod.spec.overhead", spec["overhead"]))
    for at, m in lists:
        for name, value in m.items():
            where = f"{at}[{str(name)[:MAX_NAME_CHARS]}]"
            if isinstance(value, str) and len(value) > MAX_QUANTITY_CHARS:
                raise LimitExceeded(
                    f"field '{where}': a quantity of {len(value)} characters, "
                    f"more than the limit of {MAX_QUANTITY_CHARS}"
                )
            try:
                q = parse_quantity(value)
            except (ValueError, TypeError, ArithmeticError):
                continue  # not a quantity: the conversion names it
            if q.is_nan():
                raise BadRequest(f"field '{where}': {value!r} is not a quantity")
            if q > MAX_QUANTITY:  # exact (no Decimal context): "1e999999999" too; negatives: the conversion
                raise LimitExceeded(
                    f"field '{where}': {value!r} is more than the limit of {MAX_QUANTITY:.0e}".replace(
                        "+", ""
                    )
                )


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
