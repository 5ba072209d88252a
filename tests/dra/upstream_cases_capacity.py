"""Upstream allocator cases: consumable capacity and distinct constraints."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dra_builders import (
    GI,
    A,
    all_req,
    claim,
    cls,
    dev,
    ex,
    first,
    mem_at_least,
    req,
    slc,
)
from upstream_base import (
    _CS8,
    BOOL_ATTR,
    D1,
    D2,
    D3,
    INT_ATTR,
    P1,
    STR_ATTR,
    VER_ATTR,
    Case,
    _id,
    _mem,
)

from gpusched.core.dra.model import (
    AttrValue,
    Capacity,
    Constraint,
    Device,
    ExactRequest,
    Request,
    RequestPolicy,
    Version,
)

CASES: dict[str, Case] = {}

C0, C1 = f"{A}/capacity-0", f"{A}/capacity-1"
_RANGE = RequestPolicy(default=2, min=2, step=2, max=4)  # upstream's withCapacityRequestPolicyRange
CM = cls("class-a", A, multi=True)
CD = cls("class-a", A, multi=False)


def rc(request: str, pool: str, device: str, **consumed: int) -> tuple[object, ...]:
    """A result with its consumed capacity (names without domain belong to driver-a)."""
    items = tuple(sorted((f"{A}/{n.replace('_', '-')}", v) for n, v in consumed.items()))
    return (request, A, pool, device, False, items)


def mdev(name: str, caps: dict[str, object] | None = None, **kw: Any) -> Device:
    """A multi-allocatable device; an int capacity has no policy, ("range", v) upstream's range policy."""
    device = dev(name, allow_multiple_allocations=True, **kw)
    more = {}
    for n, v in (caps or {}).items():
        more[n] = Capacity(v[1], _RANGE) if isinstance(v, tuple) else Capacity(v)  # type: ignore[arg-type]
    return replace(device, capacity={**device.capacity, **more})


def vdev(name: str, default: int, value: int, extra: tuple[int, ...] = ()) -> Device:
    """upstream's withCapacityRequestPolicyValidValues: default first, then the extra valid values."""
    policy = RequestPolicy(default=default, valid_values=(default, *extra))
    return replace(mdev(name), capacity={"capacity-0": Capacity(value, policy)})


def creq(name: str, cls_name: str = "class-a", amount: int | None = None, count: int = 1) -> Request:
    caps = {"capacity-0": amount} if amount is not None else {}
    return req(name, cls_name, count, capacity_requests=caps)


def call(name: str, amount: int) -> Request:
    return all_req(name, "class-a", capacity_requests={"capacity-0": amount})


def cex(name: str, amount: int | None, *selectors: str) -> ExactRequest:
    caps = {"capacity-0": amount} if amount is not None else {}
    return ex(name, "class-a", 1, *selectors, capacity_requests=caps)


CASES.update(
    {
        "consumable-capacity-multi-allocatable-device-with-missing-capacity-request": Case(
            [claim("claim-0", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-1": 1}))],
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-with-missing-capacity-request": Case(  # noqa: E501 (upstream case name)
            [claim("claim-0", call("req-0", 1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-1": 1}))],
            classes=[CM],
        ),
        "consumable-capacity-multi-allocatable-device-without-capacity-without-capacity-request": Case(
            [claim("claim-0", creq("req-0")), claim("claim-1", creq("req-0"))],
            [slc("slice-1", "node-1", P1, A, mdev(D1))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1)], [rc("req-0", P1, D1)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request": Case(
            [claim("claim-0", creq("req-0")), claim("claim-1", creq("req-0"))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 1}), mdev(D2, {"capacity-0": 1}))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=1)], [rc("req-0", P1, D2, capacity_0=1)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request-block": Case(
            [claim("claim-0", creq("req-0")), claim("claim-1", creq("req-0"))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 2}))],
            classes=[CM],
        ),
        "consumable-capacity-multi-allocatable-device-without-policy-with-capacity-request": Case(
            [claim("claim-0", creq("req-0", amount=1)), claim("claim-1", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 2}))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=1)], [rc("req-0", P1, D1, capacity_0=1)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-policy-without-capacity-request": Case(
            [claim("claim-0", creq("req-0")), claim("claim-1", creq("req-0"))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 4)}))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=2)], [rc("req-0", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-zero-request-policy": Case(
            [claim("claim-0", creq("req-0")), claim("claim-1", creq("req-0"))],
            [slc("slice-1", "node-1", P1, A, vdev(D1, 0, 1))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=0)], [rc("req-0", P1, D1, capacity_0=0)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-violates-zero-request-policy": Case(
            [claim("claim-0", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, vdev(D1, 0, 1))],
            classes=[CM],
        ),
        "consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request": Case(
            [claim("claim-0", creq("req-0", amount=1)), claim("claim-1", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 4)}))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=2)], [rc("req-0", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-range-policy-step": Case(
            [claim("claim-0", creq("req-0", amount=3))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 4)}))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=4)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-valid-values-policy": Case(
            [claim("claim-0", creq("req-0", amount=2))],
            [slc("slice-1", "node-1", P1, A, vdev(D1, 1, 4, (2,)))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-valid-values-policy-round-up": Case(
            [claim("claim-0", creq("req-0", amount=2))],
            [slc("slice-1", "node-1", P1, A, vdev(D1, 1, 3, (3,)))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=3)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-exceeded-consumable-capacity-request": Case(
            [claim("claim-0", creq("req-0", amount=1)), claim("claim-1", creq("req-0", amount=2))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 2)}))],
            classes=[CM],
        ),
        "consumable-capacity-multi-allocatable-device-with-request-over-max-sharing-policy": Case(
            [claim("claim-0", creq("req-0", amount=6))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 10)}))],
            classes=[CM],
        ),
        "consumable-capacity-multi-allocatable-device-with-allocated-capacity-use-remaining": Case(
            [claim("claim-0", creq("req-0", amount=2))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 4)}))],
            classes=[CM],
            consumed={_id(P1, D1): {C0: 2}},
            expect=[[rc("req-0", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-allocated-capacity-next-device": Case(
            [claim("claim-0", creq("req-0", amount=2))],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D1, {"capacity-0": ("range", 2)}),
                    mdev(D2, {"capacity-0": ("range", 2)}),
                )
            ],
            classes=[CM],
            consumed={_id(P1, D1): {C0: 2}},
            expect=[[rc("req-0", P1, D2, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-with-multi-allocatable-device-backtrack": Case(
            [
                claim(
                    "claim-0",
                    creq("req-0", amount=2),
                    creq("req-1", amount=2),
                    constraints=(Constraint(match_attribute=STR_ATTR),),
                ),
                claim("claim-1", creq("req-0", amount=2)),
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D2, {"capacity-0": ("range", 2)}, attrs={"stringAttribute": "v1"}),
                    mdev(D1, {"capacity-0": ("range", 4)}, attrs={"stringAttribute": "v2"}),
                )
            ],
            expect=[
                [rc("req-0", P1, D1, capacity_0=2), rc("req-1", P1, D1, capacity_0=2)],
                [rc("req-0", P1, D2, capacity_0=2)],
            ],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-subrequest": Case(
            [claim("claim-0", first("req-0", cex("subReq-0", 4), cex("subReq-1", 2), cex("subReq-1", None)))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 2)}))],
            classes=[CM],
            expect=[[rc("req-0/subReq-1", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-with-no-available-consumable-capacity": Case(
            [claim("claim-0", creq("req-0", amount=2))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 2)}))],
            classes=[CM],
            consumed={_id(P1, D1): {C0: 2}},
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-filter-out-no-capacity": Case(
            [claim("claim-0", call("req-0", 2))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 2}), mdev(D2))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-filter-out-insufficient-capacity": Case(  # noqa: E501 (upstream case name)
            [claim("claim-0", call("req-0", 2))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 2}), mdev(D2, {"capacity-0": 1}))],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=2)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-sufficient": Case(
            [claim("claim-0", creq("req-0", amount=1), call("req-1", 1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 2}), mdev(D2, {"capacity-0": 1}))],
            expect=[
                [
                    rc("req-0", P1, D1, capacity_0=1),
                    rc("req-1", P1, D1, capacity_0=1),
                    rc("req-1", P1, D2, capacity_0=1),
                ]
            ],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-in-use-sufficient": Case(
            [claim("claim-0", call("req-0", 1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 2}), mdev(D2, {"capacity-0": 1}))],
            consumed={_id(P1, D1): {C0: 1}},
            expect=[[rc("req-0", P1, D1, capacity_0=1), rc("req-0", P1, D2, capacity_0=1)]],
            check_consumed=True,
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-insufficient": Case(
            [claim("claim-0", creq("req-0", amount=1), call("req-1", 1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 1}), mdev(D2, {"capacity-0": 1}))],
        ),
        "consumable-capacity-multi-allocatable-device-allocation-mode-all-in-use-insufficient": Case(
            [claim("claim-0", call("req-0", 1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 1}), mdev(D2, {"capacity-0": 1}))],
            consumed={_id(P1, D1): {C0: 1}},
            expect=[[rc("req-0", P1, D2, capacity_0=1)]],
            check_consumed=True,
        ),
        "consumable-capacity-dedicated-device-with-consumable-capacity-request": Case(
            [claim("claim-0", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, dev(D1, {"capacity-0": 1}))],
            classes=[CD],
            expect=[[rc("req-0", P1, D1)]],
            check_consumed=True,
        ),
        "consumable-capacity-dedicated-device-with-multiple-consumable-capacity-request": Case(
            [claim("claim-0", creq("req-0", amount=1)), claim("claim-1", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, replace(dev(D1), capacity={"capacity-0": Capacity(2, _RANGE)}))],
            classes=[CD],
        ),
        "allow-multiple-allocations-exclude-multi-allocatable-device-by-class-selector": Case(
            [claim("claim-0", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": 1}))],
            classes=[CD],
        ),
        "allow-multiple-allocations-not-allocate-multi-allocatable-device-which-already-dedicated": Case(
            [claim("claim-0", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, mdev(D1, {"capacity-0": ("range", 2)}))],
            classes=[CM],
            allocated=[_id(P1, D1)],
        ),
        "allow-multiple-allocations-not-allocate-dedicated-device-which-change-from-multi-allocatable": Case(
            [claim("claim-0", creq("req-0", amount=1))],
            [slc("slice-1", "node-1", P1, A, replace(dev(D1), capacity={"capacity-0": Capacity(2, _RANGE)}))],
            classes=[CM],
            consumed={_id(P1, D1): {C0: 1}},
        ),
        "allow-multiple-allocations-with-partitionable-device": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    first(
                        "req-1",
                        ex("subReq-0", "class-a", 1, mem_at_least(6)),
                        ex("subReq-1", "class-a", 1, mem_at_least(4)),
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    *(mdev(d, counters=_mem(g), from_counters=True) for d, g in ((D1, 4), (D2, 6), (D3, 4))),
                    count=2,
                ),
                slc("slice-2", "node-1", P1, A, count=2, counter_sets=_CS8),
            ],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, memory=4 * GI), rc("req-1/subReq-1", P1, D3, memory=4 * GI)]],
            check_consumed=True,
        ),
        "consumable-capacity-with-partitionable-device-multiple-capacity-pools": Case(
            [
                claim(
                    "claim-0",
                    creq("req-0", amount=1),
                    creq("req-2", amount=2),
                    first(
                        "req-1",
                        cex(
                            "subReq-0",
                            1,
                            f'device.capacity["{A}"]["capacity-0"].compareTo(quantity("4")) >= 0',
                        ),
                        cex(
                            "subReq-1",
                            1,
                            f'device.capacity["{A}"]["capacity-0"].compareTo(quantity("2")) >= 0',
                        ),
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    *(
                        replace(
                            mdev(
                                d,
                                counters={
                                    "counter-set-1": {"capacity-0": c0},
                                    "counter-set-2": {"capacity-1": 4},
                                },
                                from_counters=True,
                            ),
                            capacity={"capacity-0": Capacity(c0), "capacity-1": Capacity(4, _RANGE)},
                        )
                        for d, c0 in ((D1, 2), (D2, 4), (D3, 2))
                    ),
                    count=2,
                ),
                slc(
                    "slice-2",
                    "node-1",
                    P1,
                    A,
                    count=2,
                    counter_sets={"counter-set-1": {"capacity-0": 4}, "counter-set-2": {"capacity-1": 8}},
                ),
            ],
            expect=[
                [
                    rc("req-0", P1, D1, capacity_0=1, capacity_1=2),
                    rc("req-2", P1, D3, capacity_0=2, capacity_1=2),
                    rc("req-1/subReq-1", P1, D1, capacity_0=1, capacity_1=2),
                ]
            ],
            check_consumed=True,
        ),
    }
)


_BOOL_TRUE = f'device.attributes["{A}"].boolAttribute'


def _attrs(version: str, numa: int, flag: bool) -> dict[str, AttrValue]:
    return {"driverVersion": Version(version), "numa": numa, "boolAttribute": flag}


CASES.update(
    {
        "with-distinct-constraints": Case(
            [
                claim(
                    "claim-0",
                    *(req(f"req-{i}", "class-a") for i in range(4)),
                    constraints=(
                        Constraint(("req-0", "req-1"), distinct_attribute=BOOL_ATTR),
                        Constraint(("req-0", "req-1", "req-2"), distinct_attribute=VER_ATTR),
                        Constraint(("req-0", "req-1", "req-2", "req-3"), distinct_attribute=INT_ATTR),
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D1, attrs=_attrs("1.0.0", 0, True)),
                    mdev(D2, attrs=_attrs("1.0.1", 1, False)),
                    mdev(D3, attrs=_attrs("1.0.2", 2, True)),
                    mdev("device-4", attrs=_attrs("1.0.0", 3, True)),
                )
            ],
            expect=[
                [rc("req-0", P1, D1), rc("req-1", P1, D2), rc("req-2", P1, D3), rc("req-3", P1, "device-4")]
            ],
            check_consumed=True,
        ),
        "with-distinct-constraints-attribute-not-set": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    constraints=(Constraint(("req-0",), distinct_attribute=BOOL_ATTR),),
                )
            ],
            [slc("slice-1", "node-1", P1, A, mdev(D1))],
        ),
        "with-distinct-constraints-with-subrequests": Case(
            [
                claim(
                    "claim-0",
                    *(
                        first(f"req-{i}", ex("subReq-0", "class-a", 1, _BOOL_TRUE), ex("subReq-1", "class-a"))
                        for i in range(3)
                    ),
                    constraints=(Constraint(("req-0", "req-1"), distinct_attribute=BOOL_ATTR),),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D1, attrs={"boolAttribute": True}),
                    mdev(D2, attrs={"boolAttribute": False}),
                )
            ],
            expect=[
                [rc("req-0/subReq-0", P1, D1), rc("req-1/subReq-1", P1, D2), rc("req-2/subReq-0", P1, D1)]
            ],
            check_consumed=True,
        ),
        "distinct-constraint-one-multi-allocatable-device-with-distinct-constraint": Case(
            [
                claim(
                    "claim-0",
                    creq("req-0", amount=1),
                    creq("req-1", amount=1),
                    constraints=(Constraint(distinct_attribute=STR_ATTR),),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D1, {"capacity-0": ("range", 2)}, attrs={"stringAttribute": "v"}),
                )
            ],
            classes=[CM],
        ),
        "distinct-constraint-two-multi-allocatable-devices-with-distinct-constraint": Case(
            [
                claim(
                    "claim-0",
                    creq("req-0", amount=2),
                    creq("req-1", amount=2),
                    constraints=(Constraint(distinct_attribute=STR_ATTR),),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D1, {"capacity-0": ("range", 4)}, attrs={"stringAttribute": "v1"}),
                    count=2,
                ),
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    mdev(D2, {"capacity-0": ("range", 4)}, attrs={"stringAttribute": "v2"}),
                    count=2,
                ),
            ],
            classes=[CM],
            expect=[[rc("req-0", P1, D1, capacity_0=2), rc("req-1", P1, D2, capacity_0=2)]],
            check_consumed=True,
        ),
    }
)
