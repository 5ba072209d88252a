"""Placement constraints of a v1.Pod → the core's selectors: required node affinity, topology
spread constraints and required pod (anti-)affinity. Every error names the pod and the field.

Preferred node and pod affinity weigh nodes before the placement policy does (see the core's
Prefer extension point). A pod affinity term's ``namespaceSelector`` is read when null (the listed namespaces,
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
    PreferredNodeTerm,
    PreferredPodTerm,
    SelectorRequirement,
    SpreadConstraint,
)
from gpusched.k8s.errors import InvalidRequest

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _obj(value: object, where: str) -> Mapping[str, Any]:
    """``value`` as an object ({} when absent); anything else is named as an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where}: must be an object")
    return value


def _requirements(items: object, where: str) -> tuple[SelectorRequirement, ...]:
    out = []
    for i, r in enumerate(_list(items, where)):
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
    return tuple(_node_term(t, f"pod {key}: {field}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))


def _node_term(t: object, where: str) -> NodeSelectorTerm:
    if not isinstance(t, Mapping):
        raise InvalidRequest(f"{where}: must be an object")
    exprs = _requirements(t.get("matchExpressions"), f"{where}.matchExpressions")
    fields = _requirements(t.get("matchFields"), f"{where}.matchFields")
    try:
        return NodeSelectorTerm(exprs, fields)
    except InvalidSpec as e:
        raise InvalidRequest(f"{where}: {e}") from None


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


def label_selector(obj: object, where: str) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` (e.g. a PodDisruptionBudget's ``spec.selector``): None when
    null, ``LabelSelector()`` when empty; a malformed one is an ``InvalidRequest`` naming ``where``."""
    return _label_selector(obj, where, {})


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


def _pod_term(t: object, at: str, labels: Mapping[str, str]) -> PodAffinityTerm:
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
        return PodAffinityTerm(
            topology_key=str(t.get("topologyKey") or ""),
            selector=selector,
            namespaces=tuple(namespaces),
            all_namespaces=ns_selector is not None,
        )
    except InvalidSpec as e:
        raise InvalidRequest(f"{at}: {e}") from None


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}: must be a list")
    return value


def _weight(item: object, at: str) -> int:
    if not isinstance(item, Mapping):
        raise InvalidRequest(f"{at}: must be an object with weight")
    w = item.get("weight")
    if not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= 100:
        raise InvalidRequest(f"{at}.weight: must be an integer in 1..100, got {w!r}")
    return w


def pod_affinity(
    spec: Mapping[str, Any], key: str, labels: Mapping[str, str]
) -> tuple[tuple[PodAffinityTerm, ...], tuple[PodAffinityTerm, ...]]:
    """The pod's required pod affinity and anti-affinity terms."""
    affinity = _obj(spec.get("affinity"), f"pod {key}: spec.affinity")
    out = []
    for kind in ("podAffinity", "podAntiAffinity"):
        section = _obj(affinity.get(kind), f"pod {key}: spec.affinity.{kind}")
        where = f"pod {key}: spec.affinity.{kind}.{_REQUIRED}"
        items = _list(section.get(_REQUIRED), where)
        out.append(tuple(_pod_term(t, f"{where}[{i}]", labels) for i, t in enumerate(items)))
    return out[0], out[1]


def preferred_affinity(
    spec: Mapping[str, Any], key: str, labels: Mapping[str, str]
) -> tuple[tuple[PreferredNodeTerm, ...], tuple[PreferredPodTerm, ...], tuple[PreferredPodTerm, ...]]:
    """The pod's preferred node affinity, pod affinity and pod anti-affinity terms."""
    affinity = _obj(spec.get("affinity"), f"pod {key}: spec.affinity")
    node = _obj(affinity.get("nodeAffinity"), f"pod {key}: spec.affinity.nodeAffinity")
    where = f"pod {key}: spec.affinity.nodeAffinity.{_PREFERRED}"
    nodes = []
    for i, item in enumerate(_list(node.get(_PREFERRED), where)):
        at = f"{where}[{i}]"
        w = _weight(item, at)
        nodes.append(PreferredNodeTerm(w, _node_term(item.get("preference"), f"{at}.preference")))
    pods: list[tuple[PreferredPodTerm, ...]] = []
    for kind in ("podAffinity", "podAntiAffinity"):
        section = _obj(affinity.get(kind), f"pod {key}: spec.affinity.{kind}")
        where = f"pod {key}: spec.affinity.{kind}.{_PREFERRED}"
        terms = []
        for i, item in enumerate(_list(section.get(_PREFERRED), where)):
            at = f"{where}[{i}]"
            w = _weight(item, at)
            terms.append(
                PreferredPodTerm(w, _pod_term(item.get("podAffinityTerm"), f"{at}.podAffinityTerm", labels))
            )
        pods.append(tuple(terms))
    return tuple(nodes), pods[0], pods[1]
