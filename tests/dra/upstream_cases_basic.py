"""Upstream allocator cases: basics, All, admin access, node selection, constraints, CEL, firstAvailable."""

from __future__ import annotations

from dra_builders import (
    ALL_NODES,
    GI,
    NODE2,
    A,
    B,
    all_ex,
    all_req,
    claim,
    dev,
    ex,
    first,
    label_selector,
    mem_at_least,
    one,
    req,
    slc,
)
from upstream_base import (
    BOOL_ATTR,
    CA,
    CB,
    D1,
    D2,
    D3,
    INT_ATTR,
    P1,
    P2,
    P3,
    P4,
    STR_ATTR,
    VER_ATTR,
    Case,
    _id,
    _two,
    r,
)

from gpusched.core.dra.model import (
    AttrValue,
    Constraint,
    DeviceClass,
    Version,
)

CASES: dict[str, Case] = {}

CASES.update(
    {
        "simple": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
            expect=[[r("req-0", A, P1, D1)]],
        ),
        "other-node": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, B), one("slice-2", "node-2", P2, A)],
            node=NODE2,
            expect=[[r("req-0", A, P2, D1)]],
        ),
        "small-and-large": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 1, mem_at_least(1)),
                    req("req-1", "class-a", 1, mem_at_least(2)),
                )
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1, {"memory": GI}), dev(D2, {"memory": 2 * GI}))],
            expect=[[r("req-0", A, P1, D1), r("req-1", A, P1, D2)]],
        ),
        "small-and-large-backtrack-requests": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 1, mem_at_least(1)),
                    req("req-1", "class-a", 1, mem_at_least(2)),
                )
            ],
            [slc("slice-1", "node-1", P1, A, dev(D2, {"memory": 2 * GI}), dev(D1, {"memory": GI}))],
            expect=[[r("req-0", A, P1, D1), r("req-1", A, P1, D2)]],
        ),
        "small-and-large-backtrack-claims": Case(
            [
                claim("claim-0", req("req-0", "class-a", 1, mem_at_least(1))),
                claim("claim-1", req("req-1", "class-a", 1, mem_at_least(2))),
            ],
            [slc("slice-1", "node-1", P1, A, dev(D2, {"memory": 2 * GI}), dev(D1, {"memory": GI}))],
            expect=[[r("req-0", A, P1, D1)], [r("req-1", A, P1, D2)]],
        ),
        "devices-split-across-different-slices": Case(
            [claim("claim-0", req("req-0", "class-a", 2))],
            [one("slice-1", "node-1", P1, A), one("slice-2", "node-1", P2, A)],
            expect=[[r("req-0", A, P1, D1), r("req-0", A, P2, D1)]],
        ),
        "obsolete-slice": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [
                slc("slice-1-obsolete", "node-1", P1, A, dev(D1), count=2),
                slc("slice-1-obsolete", "node-1", P1, A, dev(D2), count=2, gen=2),
            ],
        ),
        "duplicate-slice": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A, count=2), one("slice-1-2", "node-1", P1, A, count=2)],
            error="invalid resource pools were encountered",
        ),
        "no-slices": Case([claim("claim-0", req("req-0", "class-a"))], []),
        "not-enough-suitable-devices": Case(
            [claim("claim-0", req("req-0", "class-a")), claim("claim-0", req("req-1", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
        ),
        "no-classes": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
            classes=[],
            error="class-a",
        ),
        "unknown-class": Case(
            [claim("claim-0", req("req-0", "unknown-class"))],
            [one("slice-1", "node-1", P1, A)],
            error="unknown-class",
        ),
        "empty-class": Case(
            [claim("claim-0", req("req-0", ""))],
            [one("slice-1", "node-1", P1, A)],
            error="claim claim-0, request req-0: missing device class name",
        ),
        "no-claims-to-allocate": Case([], [one("slice-1", "node-1", P1, A)], expect=[]),
        "all-devices-single": Case(
            [claim("claim-0", all_req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
            expect=[[r("req-0", A, P1, D1)]],
        ),
        "all-devices-many": Case(
            [claim("claim-0", all_req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A), one("slice-1", "node-1", P2, A)],
            expect=[[r("req-0", A, P1, D1), r("req-0", A, P2, D1)]],
        ),
        "all-devices-of-the-incomplete-pool": Case(
            [claim("claim-0", all_req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A, count=2)],
            error="claim claim-0, request req-0: asks for all devices, but resource pool driver-a/pool-1"
            " is currently"
            " being updated",
        ),
        "all-devices-plus-another": Case(
            [claim("claim-0", all_req("req-0", "class-a")), claim("claim-1", req("req-0", "class-b"))],
            [one("slice-1", "node-1", P1, A), one("slice-1", "node-1", P1, B)],
            classes=[CA, CB],
            expect=[[r("req-0", A, P1, D1)], [r("req-0", B, P1, D1)]],
        ),
        "all-devices-plus-another-reversed": Case(
            [claim("claim-1", req("req-0", "class-b")), claim("claim-0", all_req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A), one("slice-1", "node-1", P1, B)],
            classes=[CA, CB],
            expect=[[r("req-0", B, P1, D1)], [r("req-0", A, P1, D1)]],
        ),
        "all-devices-many-plus-another": Case(
            [claim("claim-0", all_req("req-0", "class-a")), claim("claim-1", req("req-0", "class-b"))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2)), one("slice-1", "node-1", P1, B)],
            classes=[CA, CB],
            expect=[[r("req-0", A, P1, D1), r("req-0", A, P1, D2)], [r("req-0", B, P1, D1)]],
        ),
        "all-devices-many-plus-another-reversed": Case(
            [claim("claim-1", req("req-0", "class-b")), claim("claim-0", all_req("req-0", "class-a"))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2)), one("slice-1", "node-1", P1, B)],
            classes=[CA, CB],
            expect=[[r("req-0", B, P1, D1)], [r("req-0", A, P1, D1), r("req-0", A, P1, D2)]],
        ),
        "all-devices-no-solution": Case(
            [claim("claim-1", req("req-0", "class-a")), claim("claim-0", all_req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
        ),
        "all-devices-no-solution-reversed": Case(
            [claim("claim-0", all_req("req-0", "class-a")), claim("claim-1", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
        ),
        "all-devices-slice-without-devices": Case(
            [claim("claim-0", all_req("req-0", "class-a"))], [slc("slice-1", "node-1", P1, A)]
        ),
        "all-devices-no-slices": Case([claim("claim-0", all_req("req-0", "class-a"))], []),
        "all-devices-some-allocated": Case(
            [claim("claim-0", all_req("req-0", "class-a"))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            allocated=[_id(P1, D1)],
        ),
        "all-devices-some-allocated-admin-access": Case(
            [claim("claim-0", all_req("req-0", "class-a", admin_access=True))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            allocated=[_id(P1, D1)],
            expect=[[r("req-0", A, P1, D1, True), r("req-0", A, P1, D2, True)]],
        ),
        "all-devices-some-allocating-admin-access": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", admin_access=True),
                    all_req("req-1", "class-a", admin_access=True),
                )
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
        ),
        "count-devices-some-allocated-admin-access": Case(
            [claim("claim-0", req("req-0", "class-a", 2, admin_access=True))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            allocated=[_id(P1, D1)],
            expect=[[r("req-0", A, P1, D1, True), r("req-0", A, P1, D2, True)]],
        ),
        "separate-claims-share-device-admin-access": Case(
            [
                claim("claim-0", req("req-0", "class-a", admin_access=True)),
                claim("claim-1", req("req-0", "class-a", admin_access=True)),
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            expect=[[r("req-0", A, P1, D1, True)], [r("req-0", A, P1, D1, True)]],
        ),
        "admin-access-claims-device-allocating-for-non-admin-access": Case(
            [
                claim("claim-0", req("req-0", "class-a")),
                claim("claim-1", req("req-0", "class-a", admin_access=True)),
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            expect=[[r("req-0", A, P1, D1)], [r("req-0", A, P1, D1, True)]],
        ),
        "all-devices-slice-without-devices-prioritized-list": Case(
            [claim("claim-0", first("req-0", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-b")))],
            [slc("slice-1", "node-1", P1, A), one("slice-2", "node-1", P2, B)],
            classes=[CA, CB],
            expect=[[r("req-0/subReq-1", B, P2, D1)]],
        ),
        "all-devices-no-slices-prioritized-list": Case(
            [claim("claim-0", first("req-0", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-b")))],
            [one("slice-2", "node-1", P2, B)],
            classes=[CA, CB],
            expect=[[r("req-0/subReq-1", B, P2, D1)]],
        ),
        "all-devices-some-allocated-prioritized-list": Case(
            [claim("claim-0", first("req-0", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-b")))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2)), one("slice-2", "node-1", P2, B)],
            classes=[CA, CB],
            allocated=[_id(P1, D1)],
            expect=[[r("req-0/subReq-1", B, P2, D1)]],
        ),
        "network-attached-device": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", label_selector("region", "region-1"), P1, A)],
            expect=[[r("req-0", A, P1, D1)]],
            local=False,
        ),
        "unsuccessful-allocation-network-attached-device": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", label_selector("region", "region-1"), P1, A)],
            node=NODE2,
        ),
        "many-network-attached-devices": Case(
            [claim("claim-0", req("req-0", "class-a", 4))],
            [
                one("slice-1", label_selector("region", "region-1"), P1, A),
                one("slice-1", ALL_NODES, P2, A),
                one("slice-1", label_selector("planet", "earth"), P3, A),
                one("slice-1", "node-1", P4, A),
            ],
            expect=[
                [r("req-0", A, P1, D1), r("req-0", A, P2, D1), r("req-0", A, P3, D1), r("req-0", A, P4, D1)]
            ],
        ),
        "local-and-network-attached-devices": Case(
            [claim("claim-0", req("req-0", "class-a", 2))],
            [one("slice-1", label_selector("region", "region-1"), P1, A), one("slice-1", "node-1", P2, A)],
            expect=[[r("req-0", A, P1, D1), r("req-0", A, P2, D1)]],
        ),
        "several-different-drivers": Case(
            [claim("claim-0", req("req-0", "class-a")), claim("claim-0", req("req-0", "class-b"))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2)), one("slice-1", "node-1", P1, B)],
            classes=[CA, CB],
            expect=[[r("req-0", A, P1, D1)], [r("req-0", B, P1, D1)]],
        ),
        "already-allocated-devices": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
            allocated=[_id(P1, D1), _id(P1, D2)],
        ),
        "admin-access-enabled": Case(
            [claim("claim-0", req("req-0", "class-a", admin_access=True))],
            [one("slice-1", "node-1", P1, A)],
            allocated=[_id(P1, D1), _id(P1, D2)],
            expect=[[r("req-0", A, P1, D1, True)]],
        ),
    }
)

_FULL: dict[str, AttrValue] = {
    "driverVersion": Version("1.0.0"),
    "numa": 1,
    "stringAttribute": "stringAttributeValue",
    "boolAttribute": True,
}

CASES.update(
    {
        "with-constraint": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    req("req-1", "class-a"),
                    constraints=tuple(
                        Constraint(match_attribute=a) for a in (INT_ATTR, VER_ATTR, STR_ATTR, BOOL_ATTR)
                    ),
                )
            ],
            [slc("slice-1", "node-1", P1, A, *_two(_FULL, _FULL))],
            expect=[[r("req-0", A, P1, D1), r("req-1", A, P1, D2)]],
        ),
        "with-constraint-non-existent-attribute": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    constraints=(Constraint(match_attribute=f"{A}/NonExistent"),),
                )
            ],
            [one("slice-1", "node-1", P1, A)],
        ),
        "with-constraint-not-matching-int-attribute": Case(
            [
                claim(
                    "claim-0", req("req-0", "class-a", 2), constraints=(Constraint(match_attribute=INT_ATTR),)
                )
            ],
            [slc("slice-1", "node-1", P1, A, *_two({"numa": 1}, {"numa": 2}))],
        ),
        "with-constraint-not-matching-int-attribute-all-devices": Case(
            [
                claim(
                    "claim-0",
                    all_req("req-0", "class-a"),
                    constraints=(Constraint(match_attribute=INT_ATTR),),
                )
            ],
            [slc("slice-1", "node-1", P1, A, *_two({"numa": 1}, {"numa": 2}))],
            error="claim claim-0, request req-0: cannot add device driver-a/pool-1/device-2 because a claim"
            " constraint"
            " would not be satisfied",
        ),
        "with-constraint-not-matching-string-attribute": Case(
            [
                claim(
                    "claim-0", req("req-0", "class-a", 2), constraints=(Constraint(match_attribute=STR_ATTR),)
                )
            ],
            [slc("slice-1", "node-1", P1, A, *_two({"stringAttribute": "v"}, {"stringAttribute": "v2"}))],
        ),
        "with-constraint-not-matching-bool-attribute": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 2),
                    constraints=(Constraint(match_attribute=BOOL_ATTR),),
                )
            ],
            [slc("slice-1", "node-1", P1, A, *_two({"boolAttribute": True}, {"boolAttribute": False}))],
        ),
        "with-constraint-not-matching-version-attribute": Case(
            [
                claim(
                    "claim-0", req("req-0", "class-a", 2), constraints=(Constraint(match_attribute=VER_ATTR),)
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    *_two({"driverVersion": Version("1.0.0")}, {"driverVersion": Version("2.0.0")}),
                )
            ],
        ),
        "with-constraint-for-request": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    req("req-1", "class-a"),
                    constraints=(Constraint(("req-0",), match_attribute=VER_ATTR),),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    *_two({"driverVersion": Version("1.0.0")}, {"driverVersion": Version("2.0.0")}),
                )
            ],
            expect=[[r("req-0", A, P1, D1), r("req-1", A, P1, D2)]],
        ),
        "with-constraint-for-request-retry": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    req("req-1", "class-a"),
                    constraints=(
                        Constraint(("req-0",), match_attribute=VER_ATTR),
                        Constraint(match_attribute=STR_ATTR),
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    *_two(
                        {"driverVersion": Version("1.0.0"), "stringAttribute": "a"},
                        {"driverVersion": Version("2.0.0"), "stringAttribute": "b"},
                        {"driverVersion": Version("3.0.0"), "stringAttribute": "b"},
                    ),
                )
            ],
            expect=[[r("req-0", A, P1, D2), r("req-1", A, P1, D3)]],
        ),
        "invalid-CEL-one-device": Case(
            [claim("claim-0", req("req-0", "class-a", 1, "noSuchVar"))],
            [one("slice-1", "node-1", P1, A)],
            error="undeclared reference",
        ),
        "invalid-CEL-one-device-class": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [one("slice-1", "node-1", P1, A)],
            classes=[DeviceClass("class-a", ("noSuchVar",))],
            error="undeclared reference",
        ),
        "invalid-CEL-all-devices": Case(
            [claim("claim-0", all_req("req-0", "class-a", "noSuchVar"))],
            [one("slice-1", "node-1", P1, A)],
            error="undeclared reference",
        ),
        "prioritized-list-first-unavailable": Case(
            [claim("claim-0", first("req-0", ex("subReq-0", "class-b"), ex("subReq-1", "class-a")))],
            [one("slice-1", "node-1", P1, A)],
            classes=[CA, CB],
            expect=[[r("req-0/subReq-1", A, P1, D1)]],
        ),
        "prioritized-list-non-available": Case(
            [claim("claim-0", first("req-0", ex("subReq-0", "class-b", 2), ex("subReq-1", "class-a", 2)))],
            [one("slice-1", "node-1", P1, A), one("slice-2", "node-1", P2, B)],
            classes=[CA, CB],
        ),
        "prioritized-list-device-config": Case(
            [claim("claim-0", first("req-0", ex("subReq-0", "class-a"), ex("subReq-1", "class-b", 2)))],
            [slc("slice-1", "node-1", P1, B, dev(D1), dev(D2))],
            classes=[CA, CB],
            expect=[[r("req-0/subReq-1", B, P1, D1), r("req-0/subReq-1", B, P1, D2)]],
        ),
        "prioritized-list-class-config": Case(
            [claim("claim-0", first("req-0", ex("subReq-0", "class-a", 2), ex("subReq-1", "class-b", 2)))],
            [slc("slice-1", "node-1", P1, B, dev(D1), dev(D2)), slc("slice-2", "node-1", P2, A, dev(D3))],
            classes=[CA, CB],
            expect=[[r("req-0/subReq-1", B, P1, D1), r("req-0/subReq-1", B, P1, D2)]],
        ),
        "prioritized-list-subrequests-with-expressions": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 1, mem_at_least(1)),
                    first(
                        "req-1",
                        ex("subReq-0", "class-a", 1, mem_at_least(4)),
                        ex("subReq-1", "class-a", 2, mem_at_least(2)),
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, {"memory": 2 * GI}),
                    dev(D2, {"memory": 2 * GI}),
                    dev(D3, {"memory": GI}),
                )
            ],
            expect=[[r("req-0", A, P1, D3), r("req-1/subReq-1", A, P1, D1), r("req-1/subReq-1", A, P1, D2)]],
        ),
    }
)

_V1, _V2 = {"driverVersion": Version("1.0.0")}, {"driverVersion": Version("2.0.0")}
CASES.update(
    {
        "prioritized-list-subrequests-with-constraints-ref-parent-request": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 1, mem_at_least(8)),
                    first(
                        "req-1",
                        ex("subReq-0", "class-a", 1, mem_at_least(2)),
                        ex("subReq-1", "class-a", 1, mem_at_least(1)),
                    ),
                    constraints=(Constraint(("req-0", "req-1"), match_attribute=VER_ATTR),),
                )
            ],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, {"memory": 8 * GI}, _V1)),
                slc(
                    "slice-2", "node-1", P2, A, dev(D2, {"memory": 2 * GI}, _V2), dev(D3, {"memory": GI}, _V1)
                ),
            ],
            expect=[[r("req-0", A, P1, D1), r("req-1/subReq-1", A, P2, D3)]],
        ),
        "prioritized-list-subrequests-with-constraints-ref-sub-request": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 1, mem_at_least(8)),
                    first(
                        "req-1",
                        ex("subReq-0", "class-a", 1, mem_at_least(2)),
                        ex("subReq-1", "class-a", 1, mem_at_least(1)),
                    ),
                    constraints=(Constraint(("req-0", "req-1/subReq-0"), match_attribute=VER_ATTR),),
                )
            ],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, {"memory": 8 * GI}, _V1)),
                slc("slice-2", "node-1", P2, A, dev(D2, {"memory": 2 * GI}, _V2)),
            ],
            expect=[[r("req-0", A, P1, D1), r("req-1/subReq-1", A, P2, D2)]],
        ),
        "prioritized-list-subrequests-with-allocation-mode-all": Case(
            [claim("claim-0", first("req-0", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-a")))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            allocated=[_id(P1, D1)],
            expect=[[r("req-0/subReq-1", A, P1, D2)]],
        ),
        "prioritized-list-allocation-mode-all-multiple-requests": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a"),
                    first("req-1", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-a")),
                )
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            expect=[[r("req-0", A, P1, D1), r("req-1/subReq-1", A, P1, D2)]],
        ),
        "prioritized-list-multi-request": Case(
            [
                claim(
                    "claim-0",
                    req("req-1", "class-a", 1, mem_at_least(8)),
                    first(
                        "req-0",
                        ex("subReq-0", "class-a", 1, mem_at_least(8)),
                        ex("subReq-1", "class-a", 1, mem_at_least(4)),
                    ),
                )
            ],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, {"memory": 8 * GI})),
                slc("slice-2", "node-1", P2, A, dev(D2, {"memory": 4 * GI})),
            ],
            expect=[[r("req-1", A, P1, D1), r("req-0/subReq-1", A, P2, D2)]],
        ),
        "prioritized-list-with-backtracking": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0",
                        ex("subReq-0", "class-a", 1, mem_at_least(8)),
                        ex("subReq-1", "class-a", 1, mem_at_least(4)),
                    ),
                    req("req-1", "class-a", 1, mem_at_least(8)),
                )
            ],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, {"memory": 8 * GI})),
                slc("slice-2", "node-1", P2, A, dev(D2, {"memory": 4 * GI})),
            ],
            expect=[[r("req-0/subReq-1", A, P2, D2), r("req-1", A, P1, D1)]],
        ),
        "prioritized-list-too-many-in-first-subrequest": Case(
            [claim("claim-0", first("req-0", ex("subReq-0", "class-b", 500), ex("subReq-1", "class-a")))],
            [one("slice-1", "node-1", P1, A)],
            classes=[CA, CB],
            expect=[[r("req-0/subReq-1", A, P1, D1)]],
        ),
        "too-many-devices-single-request": Case(
            [claim("claim-0", req("req-0", "class-a", 500))], [], error="exceeds the claim limit"
        ),
        "too-many-devices-total": Case(
            [claim("claim-0", req("req-0", "class-a", 32), req("req-1", "class-a"))],
            [slc("slice-1", "node-1", P1, A, *(dev(f"device-{i}") for i in range(33)))],
            error="exceeds the claim limit",
        ),
    }
)
