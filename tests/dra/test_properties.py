"""Accounting invariants of the DRA allocator, over generated slices and claims (Hypothesis).

A first batch of claims is allocated, its results become the allocated state, and a second batch is
allocated against it; over both batches together:
- no device is held twice, unless it allows multiple allocations (every holder then has a share);
- the capacity consumed on a device never exceeds its capacity;
- the counters consumed from a counter set never exceed (never go below zero remaining).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from dra_builders import NODE1, claim, cls, req, slc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.dra.allocator import Allocator, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import (
    AllocatedState,
    Capacity,
    Claim,
    CounterConsumption,
    Device,
    DeviceId,
    DeviceResult,
    RequestPolicy,
    ResourceSlice,
)

D = "gpu.example.com"
CLASSES = {"gpu": cls("gpu", D)}
COMPILER = CelCompiler()
POLICIES = st.sampled_from(
    [None, RequestPolicy(default=2, min=2, step=2, max=8), RequestPolicy(default=1, valid_values=(1, 2, 4))]
)


@st.composite
def devices(draw: st.DrawFn, i: int) -> Device:
    multi = draw(st.booleans())
    caps = {"memory": Capacity(draw(st.integers(0, 8)), draw(POLICIES))}
    uses: tuple[CounterConsumption, ...] = ()
    if draw(st.booleans()):
        uses = (CounterConsumption("set-0", {"slices": draw(st.integers(1, 4))}),)
    return Device(f"dev-{i}", {}, caps, uses, multi)


@st.composite
def node_slices(draw: st.DrawFn) -> list[ResourceSlice]:
    n = draw(st.integers(1, 5))
    devs = tuple(draw(devices(i)) for i in range(n))
    budget = {"set-0": {"slices": draw(st.integers(0, 8))}}
    return [slc("slice-0", "node-1", "pool-0", D, *devs, counter_sets=budget)]


@st.composite
def claims(draw: st.DrawFn, prefix: str) -> list[Claim]:
    out = []
    for c in range(draw(st.integers(0, 3))):
        requests = []
        for r in range(draw(st.integers(1, 2))):
            amount = draw(st.none() | st.integers(0, 6))
            caps = {} if amount is None else {"memory": amount}
            requests.append(req(f"r{r}", "gpu", draw(st.integers(1, 2)), capacity_requests=caps))
        out.append(claim(f"{prefix}-{c}", *requests))
    return out


def _state(results: list[DeviceResult]) -> AllocatedState:
    exclusive = frozenset(r.device_id for r in results if not r.shared)
    consumed: dict[DeviceId, dict[str, int]] = defaultdict(dict)
    for r in results:
        if r.shared:
            book = consumed[r.device_id]
            for n, v in r.consumed_capacity.items():
                book[n] = book.get(n, 0) + v
    return AllocatedState(exclusive, dict(consumed))


def _results(outcome: object) -> list[DeviceResult]:
    return [d for a in outcome.allocations for d in a.results] if isinstance(outcome, Fits) else []


def check_invariants(slices: list[ResourceSlice], results: list[DeviceResult]) -> None:
    devs = {DeviceId(s.driver, s.pool, d.name): d for s in slices for d in s.devices}
    holders = Counter(r.device_id for r in results)
    used: dict[DeviceId, Counter[str]] = defaultdict(Counter)
    for r in results:
        dev = devs[r.device_id]
        if holders[r.device_id] > 1:
            assert dev.allow_multiple_allocations and r.shared, f"{r.device_id} held twice"
        used[r.device_id].update(r.consumed_capacity)
    for did, amounts in used.items():
        for name, amount in amounts.items():
            assert amount <= devs[did].capacity[name.rpartition("/")[2]].value, f"{did} {name} over capacity"
    budget = {cs.name: dict(cs.counters) for s in slices for cs in s.shared_counters}
    for did in holders:
        for use in devs[did].consumes_counters:
            for name, value in use.counters.items():
                budget[use.counter_set][name] -= value
    assert all(v >= 0 for counters in budget.values() for v in counters.values()), budget


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_slices(), claims("a"), claims("b"))
def test_allocations_never_double_book_capacity_or_counters(
    slices: list[ResourceSlice], first: list[Claim], second: list[Claim]
) -> None:
    one = _results(Allocator(CLASSES, slices, COMPILER).allocate(NODE1, first))
    two = _results(Allocator(CLASSES, slices, COMPILER, _state(one)).allocate(NODE1, second))
    check_invariants(slices, one + two)


def test_the_invariant_check_catches_a_device_held_twice() -> None:
    """Guards the property against passing vacuously: a forged double booking is caught."""
    slices = [slc("slice-0", "node-1", "pool-0", D, Device("dev-0"))]
    twice = [DeviceResult("r0", D, "pool-0", "dev-0"), DeviceResult("r0", D, "pool-0", "dev-0")]
    try:
        check_invariants(slices, twice)
    except AssertionError:
        return
    raise AssertionError("a device held twice passed the invariant check")
