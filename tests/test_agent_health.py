"""GPU health on the Node object: the annotation the scheduler reads, and the taint when every GPU failed."""

from __future__ import annotations

import pytest

from gpusched.agent.health import (
    ANN_UNHEALTHY_GPUS,
    TAINT_UNHEALTHY,
    format_unhealthy_gpus,
    health_patch,
    labels_patch,
    parse_unhealthy_gpus,
    unhealthy_gpus_of_node,
)
from gpusched.agent.inventory import is_critical_xid


def node(ann: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict:
    return {"metadata": {"name": "n1", "annotations": ann or {}}, "spec": {"taints": taints or []}}


def test_round_trip_and_parse_errors() -> None:
    assert format_unhealthy_gpus([3, 0, 3]) == "0,3"
    assert parse_unhealthy_gpus("0,3") == frozenset({0, 3})
    assert parse_unhealthy_gpus(" 3 , 0 ") == frozenset({0, 3})
    assert parse_unhealthy_gpus(None) == frozenset() and parse_unhealthy_gpus("") == frozenset()
    for bad in ("a", "0,,1", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"node x: annotation {ANN_UNHEALTHY_GPUS} '{bad}'"):
            parse_unhealthy_gpus(bad, "node x")
    assert unhealthy_gpus_of_node(node({ANN_UNHEALTHY_GPUS: "1"})) == frozenset({1})
    assert unhealthy_gpus_of_node({"metadata": {"name": "n"}}) == frozenset()


def test_patch_sets_the_annotation_then_the_taint_when_all_fail_and_recovery_clears_both() -> None:
    other = {"key": "team", "value": "a", "effect": "NoSchedule"}
    n = node(taints=[other])
    assert health_patch(n, [], 4) is None
    p = health_patch(n, [2], 4)
    assert p == {"metadata": {"annotations": {ANN_UNHEALTHY_GPUS: "2"}}}
    p = health_patch(node({ANN_UNHEALTHY_GPUS: "2"}, [other]), [0, 1, 2, 3], 4)
    assert p == {
        "metadata": {"annotations": {ANN_UNHEALTHY_GPUS: "0,1,2,3"}},
        "spec": {"taints": [other, {"key": TAINT_UNHEALTHY, "value": "true", "effect": "NoSchedule"}]},
    }
    tainted = node({ANN_UNHEALTHY_GPUS: "0,1,2,3"}, [other, {"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}])
    assert health_patch(tainted, [0, 1, 2, 3], 4) is None
    assert health_patch(tainted, [], 4) == {
        "metadata": {"annotations": {ANN_UNHEALTHY_GPUS: None}},
        "spec": {"taints": [other]},
    }
    assert health_patch(node(), [], 0) is None  # a node without GPUs is never tainted


def test_labels_patch_writes_only_what_differs() -> None:
    n = {"metadata": {"labels": {"a": "1", "b": "2"}, "annotations": {"t": "x"}}}
    assert labels_patch(n, {"a": "1"}, {"t": "x"}) is None
    assert labels_patch(n, {"a": "1", "b": "3"}, {"t": "y"}) == {
        "metadata": {"labels": {"b": "3"}, "annotations": {"t": "y"}}
    }


def test_critical_xids() -> None:
    assert all(is_critical_xid(x) for x in (48, 63, 64, 74, 79, 92, 94, 95))
    assert not any(is_critical_xid(x) for x in (13, 31, 43, 45, 68))
