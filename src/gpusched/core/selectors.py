"""Kubernetes selectors in the core: node selector terms (required node affinity), label
selectors, topology spread constraints and pod (anti-)affinity terms, with their matching rules.

Plain frozen data, validated on construction (``InvalidSpec`` names what is wrong), and pure
functions that match them against labels; the filter plugins apply them to a snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpusched.core.errors import InvalidSpec

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
"""Operators of a label selector (pods): no Gt / Lt, as in Kubernetes."""
NODE_NAME_FIELD = "metadata.name"
"""The one field a node selector term's ``match_fields`` may name (as in Kubernetes)."""
WHEN_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
NODE_POLICIES = ("Honor", "Ignore")


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """One ``matchExpressions`` (or ``matchFields``) entry, with the Kubernetes operators: In,
    NotIn, Exists, DoesNotExist, and Gt / Lt on integer label values (node selectors only;
    e.g. ``nvidia.com/cuda.driver-version.major`` Gt 534)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.key:
            raise InvalidSpec("selector requirement: key is empty")
        if self.operator not in SELECTOR_OPERATORS:
            raise InvalidSpec(
                f"selector requirement {self.key!r}: operator {self.operator!r} is not one of "
                f"{', '.join(SELECTOR_OPERATORS)}"
            )
        n = len(self.values)
        if self.operator in ("In", "NotIn") and n == 0:
            raise InvalidSpec(f"selector requirement {self.key!r}: {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and n:
            raise InvalidSpec(f"selector requirement {self.key!r}: {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (n != 1 or not _is_int(self.values[0])):
            raise InvalidSpec(
                f"selector requirement {self.key!r}: {self.operator} needs exactly one integer "
                f"value, got {list(self.values)}"
            )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """NotIn and DoesNotExist hold where the label is absent; Gt and Lt need a label whose
        value is an integer."""
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or not _is_int(value):
            return False
        have, want = int(value), int(self.values[0])
        return have > want if op == "Gt" else have < want


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements that must all hold (an empty term matches no node, as in Kubernetes).
    ``match_fields`` may only name ``metadata.name``, with In or NotIn and one value."""

    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()

    def __post_init__(self) -> None:
        for r in self.match_fields:
            if r.key != NODE_NAME_FIELD or r.operator not in ("In", "NotIn") or len(r.values) != 1:
                raise InvalidSpec(
                    f"node selector term: matchFields supports only {NODE_NAME_FIELD} with In or NotIn "
                    f"and one value, got {r.key} {r.operator} {list(r.values)}"
                )

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.match_expressions and not self.match_fields:
            return False
        fields = {NODE_NAME_FIELD: name}
        return all(r.matches(labels) for r in self.match_expressions) and all(
            r.matches(fields) for r in self.match_fields
        )


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector over pods: ``match_labels`` and ``match_expressions`` all
    hold. An empty selector matches every pod."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def __post_init__(self) -> None:
        for r in self.match_expressions:
            if r.operator not in LABEL_OPERATORS:
                raise InvalidSpec(
                    f"label selector requirement {r.key!r}: operator {r.operator} is for node selectors; "
                    f"use one of {', '.join(LABEL_OPERATORS)}"
                )

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """A missing (null) selector selects no pod, as in Kubernetes; an empty one selects all."""
    return selector is not None and selector.matches(labels)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A topology spread constraint: pods matching ``selector`` (in the pod's namespace; None
    matches none) may differ by at most ``max_skew`` between the domains of ``topology_key``,
    among the nodes that the pod's node selector and required affinity admit
    (``node_affinity_policy`` Honor) and, with ``node_taints_policy`` Honor, whose taints it
    tolerates. ``ScheduleAnyway`` is a preference that the filter does not enforce; with
    ``min_domains`` and fewer domains, the minimum counts as 0."""

    topology_key: str
    max_skew: int = 1
    selector: LabelSelector | None = None
    when_unsatisfiable: str = "DoNotSchedule"
    min_domains: int = 0  # 0 = not set
    node_affinity_policy: str = "Honor"
    node_taints_policy: str = "Ignore"

    def __post_init__(self) -> None:
        if not self.topology_key:
            raise InvalidSpec("topology spread constraint: topologyKey is empty")
        if not isinstance(self.max_skew, int) or isinstance(self.max_skew, bool) or self.max_skew < 1:
            raise InvalidSpec(
                f"topology spread constraint on {self.topology_key}: maxSkew must be an integer ≥ 1, "
                f"got {self.max_skew!r}"
            )
        if self.when_unsatisfiable not in WHEN_UNSATISFIABLE:
            raise InvalidSpec(
                f"topology spread constraint on {self.topology_key}: whenUnsatisfiable "
                f"{self.when_unsatisfiable!r} is not one of {', '.join(WHEN_UNSATISFIABLE)}"
            )
        md = self.min_domains
        if not isinstance(md, int) or isinstance(md, bool) or md < 0:
            raise InvalidSpec(
                f"topology spread constraint on {self.topology_key}: minDomains must be a positive "
                f"integer, got {self.min_domains!r}"
            )
        for name, v in (
            ("nodeAffinityPolicy", self.node_affinity_policy),
            ("nodeTaintsPolicy", self.node_taints_policy),
        ):
            if v not in NODE_POLICIES:
                raise InvalidSpec(
                    f"topology spread constraint on {self.topology_key}: {name} {v!r} is not one of "
                    f"{', '.join(NODE_POLICIES)}"
                )

    @property
    def hard(self) -> bool:
        return self.when_unsatisfiable == "DoNotSchedule"


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """A required pod (anti-)affinity term: pods matching ``selector`` (None matches none) in
    ``namespaces`` (empty: the pod's own namespace; ``all_namespaces``: every one) in the same
    ``topology_key`` domain."""

    topology_key: str
    selector: LabelSelector | None = None
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False

    def __post_init__(self) -> None:
        if not self.topology_key:
            raise InvalidSpec("pod affinity term: topologyKey is empty")

    def namespaces_of(self, owner_namespace: str) -> tuple[str, ...] | None:
        """The namespaces this term (of a pod in ``owner_namespace``) looks at; None: all."""
        return None if self.all_namespaces else (self.namespaces or (owner_namespace,))

    def covers(self, owner_namespace: str, namespace: str, labels: Mapping[str, str]) -> bool:
        """Does this term (of a pod in ``owner_namespace``) select a pod in ``namespace`` with ``labels``?"""
        if not self.all_namespaces and namespace not in (self.namespaces or (owner_namespace,)):
            return False
        return selects(self.selector, labels)


def _check_weight(weight: object, what: str) -> None:
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
        raise InvalidSpec(f"{what}: weight must be an integer in 1..100, got {weight!r}")


@dataclass(frozen=True, slots=True)
class PreferredNodeTerm:
    """A preferred node affinity term: nodes it matches earn ``weight``."""

    weight: int
    term: NodeSelectorTerm

    def __post_init__(self) -> None:
        _check_weight(self.weight, "preferred node affinity term")


@dataclass(frozen=True, slots=True)
class PreferredPodTerm:
    """A preferred pod (anti-)affinity term: ``weight`` per matching pod in the node's domain."""

    weight: int
    term: PodAffinityTerm

    def __post_init__(self) -> None:
        _check_weight(self.weight, "preferred pod affinity term")
