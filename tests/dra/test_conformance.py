"""Upstream's allocator test cases (k8s.io/dynamic-resource-allocation/structured/internal/
allocatortesting/allocator_testing.go), transcribed as data: input claims, classes, slices, node and
already-allocated devices; expected results per claim (request, driver, pool, device, admin access),
None for "does not fit", or a substring of the expected error.

Upstream compares results as unordered sets per claim and checks a node selector; here the node
selector is reduced to "node-local or not" (ClaimAllocation.node_name). Cases that need features this
allocator does not model are listed in SKIPPED with the reason (counted in docs/dra.md).
"""

from __future__ import annotations

import pytest
import upstream_cases_basic
import upstream_cases_capacity
import upstream_cases_counters
import upstream_cases_pools
from upstream_base import Case
from upstream_cases_pools import SKIPPED

from gpusched.core.dra.allocator import Allocator, DoesNotFit, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import AllocatedState
from gpusched.core.dra.selector import DraError

CASES: dict[str, Case] = {}
for _part in (upstream_cases_basic, upstream_cases_counters, upstream_cases_capacity, upstream_cases_pools):
    assert not set(CASES) & set(_part.CASES), "a case name twice"
    CASES.update(_part.CASES)


def test_ported_and_skipped_cases_are_disjoint() -> None:
    assert not set(CASES) & set(SKIPPED)


def _run(case: Case) -> object:
    classes = {c.name: c for c in case.classes}
    state = AllocatedState(frozenset(case.allocated), case.consumed)
    return Allocator(classes, case.slices, CelCompiler(), state).allocate(case.node, case.claims)


def _normal(results: object, consumed: bool, binding: bool = False) -> list[list[tuple[object, ...]]]:
    assert isinstance(results, Fits)
    out: list[list[tuple[object, ...]]] = []
    for a in results.allocations:
        rows: list[tuple[object, ...]] = []
        for d in a.results:
            row: tuple[object, ...] = (d.request, d.driver, d.pool, d.device, d.admin_access)
            if consumed:
                row += (tuple(sorted(d.consumed_capacity.items())),)
            if binding:
                row += (d.binding_conditions, d.binding_failure_conditions)
            rows.append(row)
        out.append(sorted(rows))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_upstream_case(name: str) -> None:
    case = CASES[name]
    if case.error is not None:
        with pytest.raises(DraError, match=None) as info:
            _run(case)
        assert case.error in str(info.value)
        return
    out = _run(case)
    if case.expect is None:
        assert isinstance(out, DoesNotFit), f"expected no allocation, got {out}"
        return
    assert _normal(out, case.check_consumed, case.check_binding) == [sorted(e) for e in case.expect]
    assert isinstance(out, Fits)
    for alloc in out.allocations:
        assert alloc.node_name == (case.node.name if case.local else None)
