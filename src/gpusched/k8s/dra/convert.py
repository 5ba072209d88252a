"""resource.k8s.io/v1 objects (decoded JSON) → the core's typed DRA model (``gpusched.core.dra.model``).

Each converter names the object and the field of anything it cannot read (``DraObjectError``): a
slice with a fractional capacity, a claim with a request that has neither ``exactly`` nor
``firstAvailable``, an attribute with no value. Nothing is dropped silently and nothing is a bare
traceback. Opaque device configs stay in the API objects: the claim writer copies them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.core.dra.model import (
    AllocationMode,
    AttrValue,
    Capacity,
    Claim,
    Constraint,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceClass,
    DeviceId,
    ExactRequest,
    NodeScope,
    NodeSelector,
    Request,
    RequestPolicy,
    Requirement,
    ResourceSlice,
    Taint,
    TaintEffect,
    Toleration,
    Version,
    qualify,
)
from gpusched.core.dra.quantity import parse_quantity
from gpusched.core.errors import InvalidSpec
from gpusched.k8s.errors import InvalidRequest

Obj = Mapping[str, Any]


class DraObjectError(InvalidRequest):
    """A resource.k8s.io object that cannot be read; the message names the object and the field."""


class _At:
    """Where a value is read from: the object (``ResourceSlice node-a``) and the field path."""

    def __init__(self, what: str, path: str = "") -> None:
        self.what, self.path = what, path

    def __truediv__(self, part: str | int) -> _At:
        if isinstance(part, int):
            return _At(self.what, f"{self.path}[{part}]")
        return _At(self.what, f"{self.path}.{part}" if self.path else part)

    def fail(self, message: str) -> DraObjectError:
        return DraObjectError(f"{self.what}: {self.path}: {message}")


def _map(value: object, at: _At) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise at.fail(f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object, at: _At) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise at.fail(f"expected a list, got {type(value).__name__}")
    return value


def _str(value: object, at: _At, required: bool = True) -> str:
    if value is None or value == "":
        if required:
            raise at.fail("is required")
        return ""
    if not isinstance(value, str):
        raise at.fail(f"expected a string, got {value!r}")
    return value


def _int(value: object, at: _At, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise at.fail(f"expected an integer, got {value!r}")
    return value


def _quantity(value: object, at: _At) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise at.fail(f"expected a quantity, got {value!r}")
    try:
        return parse_quantity(value, at.path)
    except InvalidSpec as e:
        raise DraObjectError(f"{at.what}: {e}") from None


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '?')}" if ns else str(meta.get("name", "?"))


def claim_key(obj: Obj) -> str:
    """namespace/name of a ResourceClaim (the core's ``Claim.name``)."""
    return _name(obj)


# ---------------------------------------------------------------------------------- DeviceClass
def device_class_from_k8s(obj: Obj) -> DeviceClass:
    at = _At(f"DeviceClass {_name(obj)}", "spec")
    spec = _map(obj.get("spec"), at)
    return DeviceClass(_name(obj), _selectors(spec.get("selectors"), at / "selectors"))


def _selectors(value: object, at: _At) -> tuple[str, ...]:
    out = []
    for i, sel in enumerate(_list(value, at)):
        sat = at / i
        cel = _map(_map(sel, sat).get("cel"), sat / "cel")
        out.append(_str(cel.get("expression"), sat / "cel" / "expression"))
    return tuple(out)


# -------------------------------------------------------------------------------- ResourceSlice
def slice_from_k8s(obj: Obj) -> ResourceSlice:
    at = _At(f"ResourceSlice {_name(obj)}", "spec")
    spec = _map(obj.get("spec"), at)
    driver = _str(spec.get("driver"), at / "driver")
    pool = _map(spec.get("pool"), at / "pool")
    scope = _scope(spec, at, per_device_allowed=True)
    if scope is None:
        raise at.fail("one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required")
    devices = tuple(
        _device(d, at / "devices" / i, scope.per_device)
        for i, d in enumerate(_list(spec.get("devices"), at / "devices"))
    )
    counters = tuple(
        _counter_set(cs, at / "sharedCounters" / i)
        for i, cs in enumerate(_list(spec.get("sharedCounters"), at / "sharedCounters"))
    )
    return ResourceSlice(
        name=_name(obj),
        driver=driver,
        pool=_str(pool.get("name"), at / "pool" / "name"),
        scope=scope,
        generation=_int(pool.get("generation"), at / "pool" / "generation", 0),
        slice_count=_int(pool.get("resourceSliceCount"), at / "pool" / "resourceSliceCount", 1),
        devices=devices,
        shared_counters=counters,
    )


def _scope(spec: Mapping[str, Any], at: _At, *, per_device_allowed: bool) -> NodeScope | None:
    set_ = []
    if spec.get("nodeName"):
        set_.append(NodeScope(node_name=_str(spec["nodeName"], at / "nodeName")))
    if spec.get("nodeSelector") is not None:
        set_.append(NodeScope(selector=node_selector_from_k8s(spec["nodeSelector"], at / "nodeSelector")))
    if spec.get("allNodes"):
        set_.append(NodeScope(all_nodes=True))
    if per_device_allowed and spec.get("perDeviceNodeSelection"):
        set_.append(NodeScope(per_device=True))
    if len(set_) > 1:
        raise at.fail(
            "nodeName, nodeSelector, allNodes and perDeviceNodeSelection are exclusive; more than one is set"
        )
    return set_[0] if set_ else None


def node_selector_from_k8s(value: object, at: _At) -> NodeSelector:
    terms = []
    sel = _map(value, at)
    for i, term in enumerate(_list(sel.get("nodeSelectorTerms"), at / "nodeSelectorTerms")):
        tat = at / "nodeSelectorTerms" / i
        t = _map(term, tat)
        reqs = []
        for kind, is_field in (("matchExpressions", False), ("matchFields", True)):
            for j, r in enumerate(_list(t.get(kind), tat / kind)):
                rat = tat / kind / j
                rm = _map(r, rat)
                op = _str(rm.get("operator"), rat / "operator")
                if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
                    raise (rat / "operator").fail(
                        f"{op!r} is not supported (In, NotIn, Exists, DoesNotExist)"
                    )
                values = tuple(
                    _str(v, rat / "values" / k) for k, v in enumerate(_list(rm.get("values"), rat / "values"))
                )
                reqs.append(Requirement(_str(rm.get("key"), rat / "key"), op, values, is_field))
        terms.append(tuple(reqs))
    return NodeSelector(tuple(terms))


def _device(value: object, at: _At, per_device: bool) -> Device:
    d = _map(value, at)
    name = _str(d.get("name"), at / "name")
    attributes: dict[str, AttrValue] = {}
    for key, attr in _map(d.get("attributes"), at / "attributes").items():
        attributes[key] = _attribute(attr, at / "attributes" / key)
    capacity = {
        key: _capacity(cap, at / "capacity" / key)
        for key, cap in _map(d.get("capacity"), at / "capacity").items()
    }
    consumes = tuple(
        CounterConsumption(
            _str(
                _map(c, at / "consumesCounters" / i).get("counterSet"),
                at / "consumesCounters" / i / "counterSet",
            ),
            _counters(c.get("counters"), at / "consumesCounters" / i / "counters"),
        )
        for i, c in enumerate(_list(d.get("consumesCounters"), at / "consumesCounters"))
    )
    scope = None
    if per_device:
        scope = _scope(d, at, per_device_allowed=False)
        if scope is None:
            raise at.fail(
                "the slice sets perDeviceNodeSelection: each device needs nodeName, nodeSelector or allNodes"
            )
    taints = tuple(
        taint_from_k8s(t, at / "taints" / i) for i, t in enumerate(_list(d.get("taints"), at / "taints"))
    )
    return Device(
        name=name,
        attributes=attributes,
        capacity=capacity,
        consumes_counters=consumes,
        allow_multiple_allocations=bool(d.get("allowMultipleAllocations")),
        taints=taints,
        scope=scope,
        binds_to_node=bool(d.get("bindsToNode")),
        binding_conditions=tuple(
            _str(c, at / "bindingConditions" / i)
            for i, c in enumerate(_list(d.get("bindingConditions"), at / "bindingConditions"))
        ),
        binding_failure_conditions=tuple(
            _str(c, at / "bindingFailureConditions" / i)
            for i, c in enumerate(_list(d.get("bindingFailureConditions"), at / "bindingFailureConditions"))
        ),
    )


def _attribute(value: object, at: _At) -> AttrValue:
    a = _map(value, at)
    given = [k for k in ("int", "bool", "string", "version") if a.get(k) is not None]
    if len(given) != 1:
        raise at.fail(f"exactly one of int, bool, string, version is required, got {given or 'none'}")
    kind = given[0]
    v = a[kind]
    if kind == "int":
        return _int(v, at / "int")
    if kind == "bool":
        if not isinstance(v, bool):
            raise (at / "bool").fail(f"expected a boolean, got {v!r}")
        return v
    if kind == "string":
        return _str(v, at / "string", required=False)
    return Version(_str(v, at / "version"))


def _capacity(value: object, at: _At) -> Capacity:
    c = _map(value, at)
    if c.get("value") is None:
        raise (at / "value").fail("is required")
    policy = None
    if c.get("requestPolicy") is not None:
        pat = at / "requestPolicy"
        p = _map(c["requestPolicy"], pat)
        rng = _map(p.get("validRange"), pat / "validRange")
        policy = RequestPolicy(
            default=_opt(p.get("default"), pat / "default"),
            valid_values=tuple(
                _quantity(v, pat / "validValues" / i)
                for i, v in enumerate(_list(p.get("validValues"), pat / "validValues"))
            ),
            min=_opt(rng.get("min"), pat / "validRange" / "min"),
            max=_opt(rng.get("max"), pat / "validRange" / "max"),
            step=_opt(rng.get("step"), pat / "validRange" / "step"),
        )
    return Capacity(_quantity(c["value"], at / "value"), policy)


def _opt(value: object, at: _At) -> int | None:
    return None if value is None else _quantity(value, at)


def _counters(value: object, at: _At) -> dict[str, int]:
    out = {}
    for name, counter in _map(value, at).items():
        cat = at / name
        v = _map(counter, cat).get("value")
        if v is None:
            raise (cat / "value").fail("is required")
        out[name] = _quantity(v, cat / "value")
    return out


def _counter_set(value: object, at: _At) -> CounterSet:
    cs = _map(value, at)
    return CounterSet(_str(cs.get("name"), at / "name"), _counters(cs.get("counters"), at / "counters"))


def taint_from_k8s(value: object, at: _At) -> Taint:
    t = _map(value, at)
    effect = _str(t.get("effect"), at / "effect")
    try:
        eff = TaintEffect(effect)
    except ValueError:
        raise (at / "effect").fail(f"{effect!r} is not one of NoSchedule, NoExecute, None") from None
    return Taint(_str(t.get("key"), at / "key"), _str(t.get("value"), at / "value", required=False), eff)


# ------------------------------------------------------------------------------ DeviceTaintRule
@dataclass(frozen=True)
class TaintRule:
    """A DeviceTaintRule: its taint on every device it selects (an empty field selects all)."""

    name: str
    taint: Taint
    driver: str = ""
    pool: str = ""
    device: str = ""

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return (
            (not self.driver or self.driver == driver)
            and (not self.pool or self.pool == pool)
            and (not self.device or self.device == device)
        )


def taint_rule_from_k8s(obj: Obj) -> TaintRule:
    at = _At(f"DeviceTaintRule {_name(obj)}", "spec")
    spec = _map(obj.get("spec"), at)
    sel = _map(spec.get("deviceSelector"), at / "deviceSelector")
    sat = at / "deviceSelector"
    if sel.get("deviceClassName") or sel.get("selectors"):
        raise sat.fail("deviceClassName and selectors are not supported (name driver, pool and device)")
    return TaintRule(
        _name(obj),
        taint_from_k8s(spec.get("taint"), at / "taint"),
        _str(sel.get("driver"), sat / "driver", required=False),
        _str(sel.get("pool"), sat / "pool", required=False),
        _str(sel.get("device"), sat / "device", required=False),
    )


# -------------------------------------------------------------------------------- ResourceClaim
def claim_from_k8s(obj: Obj) -> Claim:
    at = _At(f"ResourceClaim {_name(obj)}", "spec.devices")
    devices = _map(_map(obj.get("spec"), _At(at.what, "spec")).get("devices"), at)
    requests = tuple(
        _request(r, at / "requests" / i)
        for i, r in enumerate(_list(devices.get("requests"), at / "requests"))
    )
    constraints = []
    for i, c in enumerate(_list(devices.get("constraints"), at / "constraints")):
        cat = at / "constraints" / i
        cm = _map(c, cat)
        match = _str(cm.get("matchAttribute"), cat / "matchAttribute", required=False) or None
        distinct = _str(cm.get("distinctAttribute"), cat / "distinctAttribute", required=False) or None
        if (match is None) == (distinct is None):
            raise cat.fail("exactly one of matchAttribute and distinctAttribute is required")
        for name, attr in (("matchAttribute", match), ("distinctAttribute", distinct)):
            if attr is not None and "/" not in attr:
                raise (cat / name).fail(f"{attr!r} must be fully qualified (domain/name)")
        names = tuple(
            _str(r, cat / "requests" / k) for k, r in enumerate(_list(cm.get("requests"), cat / "requests"))
        )
        constraints.append(Constraint(names, match, distinct))
    return Claim(_name(obj), requests, tuple(constraints))


def _request(value: object, at: _At) -> Request:
    r = _map(value, at)
    name = _str(r.get("name"), at / "name")
    exactly, first = r.get("exactly"), r.get("firstAvailable")
    if (exactly is None) == (first is None):
        raise at.fail("exactly one of exactly and firstAvailable is required")
    if exactly is not None:
        return Request(name, exactly=_exact(name, exactly, at / "exactly"))
    subs = _list(first, at / "firstAvailable")
    if not subs:
        raise (at / "firstAvailable").fail("must not be empty")
    return Request(
        name,
        first_available=tuple(
            _exact(
                _str(_map(s, at / "firstAvailable" / i).get("name"), at / "firstAvailable" / i / "name"),
                s,
                at / "firstAvailable" / i,
            )
            for i, s in enumerate(subs)
        ),
    )


def _exact(name: str, value: object, at: _At) -> ExactRequest:
    e = _map(value, at)
    mode_text = _str(e.get("allocationMode"), at / "allocationMode", required=False) or "ExactCount"
    try:
        mode = AllocationMode(mode_text)
    except ValueError:
        raise (at / "allocationMode").fail(f"{mode_text!r} is not ExactCount or All") from None
    count = _int(e.get("count"), at / "count", 1)
    if mode is AllocationMode.EXACT_COUNT and count < 1:
        raise (at / "count").fail(f"must be at least 1, got {count}")
    tolerations = []
    for i, t in enumerate(_list(e.get("tolerations"), at / "tolerations")):
        tat = at / "tolerations" / i
        tm = _map(t, tat)
        op = _str(tm.get("operator"), tat / "operator", required=False) or "Equal"
        if op not in ("Equal", "Exists"):
            raise (tat / "operator").fail(f"{op!r} is not Equal or Exists")
        tolerations.append(
            Toleration(
                _str(tm.get("key"), tat / "key", required=False),
                op,
                _str(tm.get("value"), tat / "value", required=False),
                _str(tm.get("effect"), tat / "effect", required=False),
            )
        )
    cap = _map(_map(e.get("capacity"), at / "capacity").get("requests"), at / "capacity" / "requests")
    return ExactRequest(
        name=name,
        class_name=_str(e.get("deviceClassName"), at / "deviceClassName"),
        selectors=_selectors(e.get("selectors"), at / "selectors"),
        mode=mode,
        count=count if mode is AllocationMode.EXACT_COUNT else 0,
        admin_access=bool(e.get("adminAccess")),
        tolerations=tuple(tolerations),
        capacity_requests={k: _quantity(v, at / "capacity" / "requests" / k) for k, v in cap.items()},
    )


# ------------------------------------------------------------------- a claim's allocation (status)
@dataclass(frozen=True)
class HeldDevice:
    """One device a claim's ``status.allocation`` holds: whole (``consumed`` empty, not ``shared``),
    as a share of a multi-allocation device, or with admin access (holds nothing)."""

    device: DeviceId
    shared: bool = False
    consumed: Mapping[str, int] | None = None
    admin_access: bool = False


def allocation_from_k8s(obj: Obj) -> tuple[HeldDevice, ...] | None:
    """The devices of a claim's ``status.allocation`` (None when the claim is not allocated)."""
    at = _At(f"ResourceClaim {_name(obj)}", "status.allocation")
    alloc = (obj.get("status") or {}).get("allocation")
    if alloc is None:
        return None
    results = _list(
        _map(_map(alloc, at).get("devices"), at / "devices").get("results"), at / "devices" / "results"
    )
    out = []
    for i, r in enumerate(results):
        rat = at / "devices" / "results" / i
        rm = _map(r, rat)
        did = DeviceId(
            _str(rm.get("driver"), rat / "driver"),
            _str(rm.get("pool"), rat / "pool"),
            _str(rm.get("device"), rat / "device"),
        )
        consumed = {  # qualified, as the allocator books capacity
            qualify(did.driver, k): _quantity(v, rat / "consumedCapacity" / k)
            for k, v in _map(rm.get("consumedCapacity"), rat / "consumedCapacity").items()
        }
        out.append(HeldDevice(did, bool(rm.get("shareID")), consumed or None, bool(rm.get("adminAccess"))))
    return tuple(out)


def allocated_node_selector(obj: Obj) -> NodeSelector | None:
    """The node selector of a claim's allocation (None: not allocated, or reachable from every node)."""
    alloc = (obj.get("status") or {}).get("allocation") or {}
    if alloc.get("nodeSelector") is None:
        return None
    return node_selector_from_k8s(
        alloc["nodeSelector"], _At(f"ResourceClaim {_name(obj)}", "status.allocation.nodeSelector")
    )


def names(items: Sequence[Obj]) -> list[str]:
    return [_name(o) for o in items]
