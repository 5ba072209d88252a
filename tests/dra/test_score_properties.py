"""The scored choice against kube-scheduler's first-fit (Hypothesis, issue 32 item 2).

Over generated slices (devices with PCIe roots and NUMA nodes, taints, counters, shared devices with
capacity policies) and claims (``ExactCount`` and ``All``, ``firstAvailable``, selectors,
tolerations, ``matchAttribute`` / ``distinctAttribute``), in two batches (the second allocated
against what the first holds):
- the scored allocator fits exactly where first-fit fits, and raises the same error where it does;
- its choice is a valid solution, checked from scratch: every device reaches the node, matches its
  class's and request's selectors and tolerates its taints, a request gets its count (``All``: the
  devices first-fit takes), the alternatives are first-fit's, constraints hold, a claim takes a
  device once (a shared one once per request), shares consume what the policy says, and over both
  batches no device is held twice, no capacity or counter is overdrawn (``test_properties``' check).
"""

from __future__ import annotations

from collections import defaultdict

from dra_builders import NODE1, cls, slc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import _results, _state, check_invariants

from gpusched.core.dra.allocator import Allocator, Fits
from gpusched.core.dra.capacity import consumption
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import (
    AllocatedState,
    AllocationMode,
    AttrValue,
    Capacity,
    Claim,
    Constraint,
    CounterConsumption,
    Device,
    DeviceId,
    ExactRequest,
    Request,
    RequestPolicy,
    ResourceSlice,
    Taint,
    Toleration,
    qualify,
)
from gpusched.core.dra.score import FIRST_FIT, SCORED, SearchBudget
from gpusched.core.dra.selector import DraError, device_view

D = "gpu.example.com"
CLASSES = {"gpu": cls("gpu", D)}
COMPILER = CelCompiler()
ROOT, NUMA = "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/numaNode"
SELECTORS = ("", f'device.attributes["{D}"].index % 2 == 0', f'device.attributes["{D}"].model == "x"')
TAINT = Taint("xid", "79")
BUDGETS = st.sampled_from([SCORED, SearchBudget(3, 20), SearchBudget(64, 5000)])


@st.composite
def devices(draw: st.DrawFn, i: int) -> Device:
    attrs: dict[str, AttrValue] = {
        "index": i,
        ROOT: draw(st.sampled_from("ab")),
        NUMA: draw(st.integers(0, 1)),
    }
    if draw(st.booleans()):
        attrs["model"] = "x"  # devices without it fail the model selector at run time (a CEL error)
    multi = draw(st.integers(0, 3)) == 0
    caps = {
        "memory": Capacity(8, draw(st.sampled_from([None, RequestPolicy(default=2, min=2, step=2, max=8)])))
    }
    uses: tuple[CounterConsumption, ...] = ()
    if draw(st.booleans()):
        s = draw(st.integers(0, 1))
        uses = (CounterConsumption(f"set-{s}", {"slices": draw(st.integers(1, 4)), f"slice-{i % 4}": 1}),)
    taints = (TAINT,) if draw(st.integers(0, 5)) == 0 else ()
    return Device(f"dev-{i}", attrs, caps, uses, multi, taints)


@st.composite
def node_slices(draw: st.DrawFn) -> list[ResourceSlice]:
    devs = tuple(draw(devices(i)) for i in range(draw(st.integers(1, 7))))
    sets = {
        f"set-{s}": {"slices": draw(st.integers(0, 8)), **{f"slice-{k}": 1 for k in range(4)}} for s in (0, 1)
    }
    return [slc("slice-0", "node-1", "pool-0", D, *devs, counter_sets=sets)]


@st.composite
def exact(draw: st.DrawFn, name: str) -> ExactRequest:
    sel = draw(st.sampled_from(SELECTORS))
    all_mode = draw(st.integers(0, 7)) == 0
    amount = draw(st.none() | st.integers(1, 6))
    return ExactRequest(
        name,
        "gpu",
        (sel,) if sel else (),
        AllocationMode.ALL if all_mode else AllocationMode.EXACT_COUNT,
        0 if all_mode else draw(st.integers(1, 3)),
        tolerations=(Toleration("xid", "Exists"),) if draw(st.booleans()) else (),
        capacity_requests={} if amount is None else {"memory": amount},
    )


@st.composite
def claims(draw: st.DrawFn, prefix: str) -> list[Claim]:
    out = []
    for c in range(draw(st.integers(0, 2))):
        requests = []
        for r in range(draw(st.integers(1, 2))):
            if draw(st.integers(0, 3)) == 0:
                requests.append(Request(f"r{r}", first_available=(draw(exact("a")), draw(exact("b")))))
            else:
                requests.append(Request(f"r{r}", exactly=draw(exact(f"r{r}"))))
        kind = draw(st.sampled_from(["", "match", "distinct"]))
        attr = draw(st.sampled_from([qualify(D, ROOT), qualify(D, NUMA), qualify(D, "index")]))
        cons = (
            ()
            if not kind
            else (
                Constraint(match_attribute=attr) if kind == "match" else Constraint(distinct_attribute=attr),
            )
        )
        out.append(Claim(f"{prefix}-{c}", tuple(requests), cons))
    return out


def attempt(
    slices: list[ResourceSlice], batch: list[Claim], held: AllocatedState, budget: SearchBudget
) -> object:
    try:
        return Allocator(CLASSES, slices, COMPILER, held, budget).allocate(NODE1, batch)
    except DraError as e:
        return e


def check_solution(slices: list[ResourceSlice], batch: list[Claim], scored: Fits, first: Fits) -> None:
    devs = {DeviceId(s.driver, s.pool, d.name): d for s in slices for d in s.devices}
    klass = [COMPILER.compile(e) for e in CLASSES["gpu"].selectors]
    for claim, alloc, ff in zip(batch, scored.allocations, first.allocations, strict=True):
        assert alloc.claim == claim.name
        by_request: dict[str, list] = defaultdict(list)  # type: ignore[type-arg]
        for r in alloc.results:
            by_request[r.request].append(r)
        assert sorted(by_request) == sorted({r.request for r in ff.results}), "other alternatives"
        seen: set[tuple[DeviceId, str]] = set()
        for request in claim.requests:
            alts = (request.exactly,) if request.exactly else request.first_available
            for ex in alts:
                assert ex is not None
                name = request.name if request.exactly else f"{request.name}/{ex.name}"
                if name not in by_request:
                    continue
                got = by_request[name]
                if ex.mode is AllocationMode.ALL:
                    assert {r.device for r in got} == {r.device for r in ff.results if r.request == name}
                else:
                    assert len(got) == ex.count, (name, got)
                for r in got:
                    dev = devs[r.device_id]
                    view = device_view(D, dev)
                    assert all(s.matches(view) for s in klass)
                    assert all(COMPILER.compile(e).matches(view) for e in ex.selectors)
                    assert all(any(t.tolerates(taint) for t in ex.tolerations) for taint in dev.taints)
                    key = (r.device_id, r.request if r.shared else "")
                    assert key not in seen and (r.device_id, "") not in seen, (
                        f"{r.device_id} twice in a claim"
                    )
                    seen.add(key)
                    if r.shared:
                        assert dev.allow_multiple_allocations
                        assert dict(r.consumed_capacity) == consumption(dev, ex.capacity_requests, D)
        for con in claim.constraints:
            attr = con.match_attribute or con.distinct_attribute
            values = [
                next(v for k, v in devs[r.device_id].attributes.items() if qualify(D, k) == attr)
                for r in alloc.results
            ]
            if con.match_attribute:
                assert len(set(values)) <= 1, values
            else:
                assert len(set(values)) == len(values), values


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_slices(), claims("a"), claims("b"), BUDGETS)
def test_the_scored_choice_fits_where_first_fit_fits_and_is_a_valid_solution(
    slices: list[ResourceSlice], one: list[Claim], two: list[Claim], budget: SearchBudget
) -> None:
    held = AllocatedState()
    everything = []
    for batch in (one, two):
        scored = attempt(slices, batch, held, budget)
        first = attempt(slices, batch, held, FIRST_FIT)
        assert type(scored) is type(first), (scored, first)
        if isinstance(first, DraError):
            assert str(scored) == str(first)
        if isinstance(scored, Fits):
            assert isinstance(first, Fits)
            check_solution(slices, batch, scored, first)
            everything += _results(scored)
            held = _state(everything)
    check_invariants(slices, everything)
