"""Placement constraints of a v1.Pod → the core's selectors: required node affinity, topology
spread constraints and required pod (anti-)affinity. Every error names the pod and the field.

Preferred (soft) node and pod affinity are placement preferences that gpusched's scoring does
not read. A pod affinity term's ``namespaceSelector`` is read when null (the listed namespaces,
else the pod's own) or empty (every namespace); one with labels is refused, since gpusched does
not watch namespaces, rather than applied wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched.core.errors import InvalidSpec
from gpusched.core.selectors import (
    LabelSelector,
    NodeSelectorTerm,
    PodAffinityTerm,
    SelectorRequirement,
    SpreadConstraint,
)
from gpusched.k8s.errors import InvalidRequest

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _obj(value: object, where: str) -> Mapping[str, Any]:
    """``value`` as an object ({} when absent); anything else is named as an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where}: must be an object")
    return value


def _requirements(items: object, where: str) -> tuple[SelectorRequirement, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidRequest(f"{where}: must be a list")
    out = []
    for i, r in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(r, Mapping):
            raise InvalidRequest(f"{at}: must be an object with key, operator and values")
        values = r.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidRequest(f"{at}: values must be a list of strings")
        try:
            out.append(
                SelectorRequirement(str(r.get("key") or ""), str(r.get("operator") or ""), tuple(values))
            )
        except InvalidSpec as e:
            raise InvalidRequest(f"{at}: {e}") from None
    return tuple(out)


def node_affinity(spec: Mapping[str, Any], key: str) -> tuple[NodeSelectorTerm, ...]:
    """The pod's required node affinity as selector terms (empty: none)."""
    affinity = _obj(spec.get("affinity"), f"pod {key}: spec.affinity")
    required = _obj(affinity.get("nodeAffinity"), f"pod {key}: spec.affinity.nodeAffinity").get(_REQUIRED)
    if required is None:
        return ()
    field = f"spec.affinity.nodeAffinity.{_REQUIRED}"
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list) or not terms:
        raise InvalidRequest(f"pod {key}: {field}.nodeSelectorTerms must be a non-empty list")
    out = []
    for i, t in enumerate(terms):
        where = f"pod {key}: {field}.nodeSelectorTerms[{i}]"
        if not isinstance(t, Mapping):
            raise InvalidRequest(f"{where}: must be an object")
        exprs = _requirements(t.get("matchExpressions"), f"{where}.matchExpressions")
        fields = _requirements(t.get("matchFields"), f"{where}.matchFields")
        try:
            out.append(NodeSelectorTerm(exprs, fields))
        except InvalidSpec as e:
            raise InvalidRequest(f"{where}: {e}") from None
    return tuple(out)


def _keys(keys: object, where: str) -> list[str]:
    if keys is None:
        return []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InvalidRequest(f"{where}: must be a list of label keys")
    return keys


def _label_selector(
    obj: object,
    where: str,
    labels: Mapping[str, str],
    match_keys: object = None,
    mismatch_keys: object = None,
) -> LabelSelector | None:
    """A label selector (None when null: it selects no pod). ``matchLabelKeys`` /
    ``mismatchLabelKeys`` add the pod's own values of those labels as In / NotIn terms."""
    parent = where.rsplit(".", 1)[0]
    match = _keys(match_keys, f"{parent}.matchLabelKeys")
    mismatch = _keys(mismatch_keys, f"{parent}.mismatchLabelKeys")
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise InvalidRequest(f"{where}: must be an object")
    ml = obj.get("matchLabels") or {}
    if not isinstance(ml, Mapping) or not all(isinstance(v, str) for v in ml.values()):
        raise InvalidRequest(f"{where}.matchLabels: must map label keys to strings")
    exprs = list(_requirements(obj.get("matchExpressions"), f"{where}.matchExpressions"))
    for k in match:
        if k in labels:
            exprs.append(SelectorRequirement(k, "In", (labels[k],)))
    for k in mismatch:
        if k in labels:
            exprs.append(SelectorRequirement(k, "NotIn", (labels[k],)))
    try:
        return LabelSelector(tuple(sorted((str(k), v) for k, v in ml.items())), tuple(exprs))
    except InvalidSpec as e:
        raise InvalidRequest(f"{where}: {e}") from None


def spread_constraints(
    spec: Mapping[str, Any], key: str, labels: Mapping[str, str]
) -> tuple[SpreadConstraint, ...]:
    items = spec.get("topologySpreadConstraints")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidRequest(f"pod {key}: spec.topologySpreadConstraints must be a list")
    out = []
    for i, c in enumerate(items):
        where = f"pod {key}: spec.topologySpreadConstraints[{i}]"
        if not isinstance(c, Mapping):
            raise InvalidRequest(f"{where}: must be an object")
        selector = _label_selector(
            c.get("labelSelector"), f"{where}.labelSelector", labels, c.get("matchLabelKeys")
        )
        try:
            out.append(
                SpreadConstraint(
                    topology_key=str(c.get("topologyKey") or ""),
                    max_skew=c.get("maxSkew", 0),
                    selector=selector,
                    when_unsatisfiable=str(c.get("whenUnsatisfiable") or ""),
                    min_domains=c.get("minDomains") or 0,
                    node_affinity_policy=str(c.get("nodeAffinityPolicy") or "Honor"),
                    node_taints_policy=str(c.get("nodeTaintsPolicy") or "Ignore"),
                )
            )
        except InvalidSpec as e:
            raise InvalidRequest(f"{where}: {e}") from None
    return tuple(out)


def _terms(required: object, where: str, labels: Mapping[str, str]) -> tuple[PodAffinityTerm, ...]:
    if required is None:
        return ()
    if not isinstance(required, list):
        raise InvalidRequest(f"{where}: must be a list")
    out = []
    for i, t in enumerate(required):
        at = f"{where}[{i}]"
        if not isinstance(t, Mapping):
            raise InvalidRequest(f"{at}: must be an object")
        selector = _label_selector(
            t.get("labelSelector"),
            f"{at}.labelSelector",
            labels,
            t.get("matchLabelKeys"),
            t.get("mismatchLabelKeys"),
        )
        namespaces = t.get("namespaces") or []
        if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
            raise InvalidRequest(f"{at}.namespaces: must be a list of namespace names")
        ns_selector = t.get("namespaceSelector")
        if ns_selector is not None and (
            not isinstance(ns_selector, Mapping)
            or ns_selector.get("matchLabels")
            or ns_selector.get("matchExpressions")
        ):
            raise InvalidRequest(
                f"{at}.namespaceSelector: only null (the listed namespaces) or {{}} (every namespace) "
                "is supported; list the namespaces in 'namespaces' instead"
            )
        try:
            out.append(
                PodAffinityTerm(
                    topology_key=str(t.get("topologyKey") or ""),
                    selector=selector,
                    namespaces=tuple(namespaces),
                    all_namespaces=ns_selector is not None,
                )
            )
        except InvalidSpec as e:
            raise InvalidRequest(f"{at}: {e}") from None
    return tuple(out)


def pod_affinity(
    spec: Mapping[str, Any], key: str, labels: Mapping[str, str]
) -> tuple[tuple[PodAffinityTerm, ...], tuple[PodAffinityTerm, ...]]:
    """The pod's required pod affinity and anti-affinity terms."""
    affinity = _obj(spec.get("affinity"), f"pod {key}: spec.affinity")
    out = []
    for kind in ("podAffinity", "podAntiAffinity"):
        section = _obj(affinity.get(kind), f"pod {key}: spec.affinity.{kind}")
        where = f"pod {key}: spec.affinity.{kind}.{_REQUIRED}"
        out.append(_terms(section.get(_REQUIRED), where, labels))
    return out[0], out[1]
