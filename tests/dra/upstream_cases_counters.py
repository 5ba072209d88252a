"""Upstream allocator cases: partitionable devices (counters), taints, All with selectors, limits."""

from __future__ import annotations

from dra_builders import (
    GI,
    PER_DEVICE,
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
    req,
    slc,
)
from upstream_base import (
    _CS8,
    CA,
    CB,
    D0,
    D1,
    D2,
    D3,
    P1,
    P2,
    Case,
    _id,
    _mem,
    r,
)

from gpusched.core.dra.model import (
    DeviceClass,
    ResourceSlice,
    Taint,
    TaintEffect,
    Toleration,
)

CASES: dict[str, Case] = {}

CASES.update(
    {
        "partitionable-devices-single-device": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, counters=_mem(4)), count=2),
                slc("slice-2", "node-1", P1, A, count=2, counter_sets=_CS8),
            ],
            expect=[[r("req-0", A, P1, D1)]],
        ),
        "partitionable-devices-prioritized-list": Case(
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
                    dev(D1, counters=_mem(4), from_counters=True),
                    dev(D2, counters=_mem(6), from_counters=True),
                    dev(D3, counters=_mem(4), from_counters=True),
                    count=2,
                ),
                slc("slice-2", "node-1", P1, A, count=2, counter_sets=_CS8),
            ],
            expect=[[r("req-0", A, P1, D1), r("req-1/subReq-1", A, P1, D3)]],
        ),
        "partitionable-devices-multiple-devices": Case(
            [claim("claim-0", req("req-0", "class-a"), req("req-1", "class-a"))],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, counters=_mem(4), from_counters=True),
                    dev(D2, counters=_mem(6), from_counters=True),
                    dev(D3, counters=_mem(4), from_counters=True),
                    count=2,
                ),
                slc("slice-2", "node-1", P1, A, count=2, counter_sets=_CS8),
            ],
            expect=[[r("req-0", A, P1, D1), r("req-1", A, P1, D3)]],
        ),
        "partitionable-devices-multiple-capacity-pools": Case(
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
                    dev(D1, counters={**_mem(4), "counter-set-2": {"cpus": 4}}, from_counters=True),
                    dev(D2, counters={**_mem(6), "counter-set-2": {"cpus": 6}}, from_counters=True),
                    dev(D3, counters={**_mem(4), "counter-set-2": {"cpus": 4}}, from_counters=True),
                    count=2,
                ),
                slc(
                    "slice-2",
                    "node-1",
                    P1,
                    A,
                    count=2,
                    counter_sets={"counter-set-1": {"memory": 18 * GI}, "counter-set-2": {"cpus": 8}},
                ),
            ],
            expect=[[r("req-0", A, P1, D1), r("req-1/subReq-1", A, P1, D3)]],
        ),
        "partitionable-devices-multiple-counters": Case(
            [claim("claim-0", req("req-0", "class-a"), req("req-1", "class-a"))],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, counters={**_mem(4, cpus=6), "counter-set-2": {"cpus": 4, "memory": 2 * GI}}),
                    dev(D2, counters={**_mem(6, cpus=4), "counter-set-2": {"cpus": 6, "memory": 6 * GI}}),
                    dev(D3, counters={**_mem(4, cpus=4), "counter-set-2": {"cpus": 4, "memory": 4 * GI}}),
                    count=2,
                ),
                slc(
                    "slice-2",
                    "node-1",
                    P1,
                    A,
                    count=2,
                    counter_sets={
                        "counter-set-1": {"cpus": 8, "memory": 18 * GI},
                        "counter-set-2": {"cpus": 12, "memory": 18 * GI},
                    },
                ),
            ],
            expect=[[r("req-0", A, P1, D2), r("req-1", A, P1, D3)]],
        ),
        "partitionable-devices-multiple-pools": Case(
            [claim("claim-0", req("req-0", "class-a"), req("req-1", "class-a"))],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, counters=_mem(4, cpus=6)),
                    dev(D2, counters=_mem(6, cpus=4)),
                    dev(D3, counters=_mem(4, cpus=4)),
                    count=2,
                ),
                slc(
                    "slice-2",
                    "node-1",
                    P1,
                    A,
                    count=2,
                    counter_sets={"counter-set-1": {"cpus": 8, "memory": 18 * GI}},
                ),
                slc(
                    "slice-3",
                    "node-1",
                    P2,
                    A,
                    dev(D1, counters=_mem(4, cpus=6)),
                    dev(D2, counters=_mem(7, cpus=1)),
                    dev(D3, counters=_mem(7, cpus=1)),
                    count=2,
                ),
                slc(
                    "slice-4",
                    "node-1",
                    P2,
                    A,
                    count=2,
                    counter_sets={"counter-set-1": {"cpus": 8, "memory": 18 * GI}},
                ),
            ],
            allocated=[_id(P1, D2), _id(P1, D3), _id(P2, D1)],
            expect=[[r("req-0", A, P2, D2), r("req-1", A, P2, D3)]],
        ),
        "partitionable-devices-unused-counters-in-counter-set": Case(
            [claim("claim-0", req("req-0", "class-a", 2))],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, counters=_mem(5)),
                    dev(D2, counters=_mem(4)),
                    dev(D3, counters=_mem(4)),
                    count=2,
                ),
                slc(
                    "slice-2",
                    "node-1",
                    P1,
                    A,
                    count=2,
                    counter_sets={"counter-set-1": {"memory": 8 * GI, "unused": GI}},
                ),
            ],
            expect=[[r("req-0", A, P1, D2), r("req-0", A, P1, D3)]],
        ),
        "partitionable-devices-no-capacity-available": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [
                slc(
                    "slice-1", "node-1", P1, A, dev(D1, counters=_mem(4)), dev(D2, counters=_mem(16)), count=2
                ),
                slc("slice-2", "node-1", P1, A, count=2, counter_sets={"counter-set-1": {"memory": 18 * GI}}),
            ],
            allocated=[_id(P1, D2)],
        ),
        "partitionable-devices-overallocated-capacity-pool": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [
                slc(
                    "slice-1", "node-1", P1, A, dev(D1, counters=_mem(4)), dev(D2, counters=_mem(20)), count=2
                ),
                slc("slice-2", "node-1", P1, A, count=2, counter_sets={"counter-set-1": {"memory": 18 * GI}}),
            ],
            allocated=[_id(P1, D2)],
        ),
        "partitionable-devices-per-device-node-selection-nodename": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0",
                        ex("subReq-0", "class-a", 1, mem_at_least(6)),
                        ex("subReq-1", "class-a", 1, mem_at_least(4)),
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    PER_DEVICE,
                    P1,
                    A,
                    dev(D1, counters=_mem(4), from_counters=True, node="node-1"),
                    dev(D2, counters=_mem(6), from_counters=True, node="node-2"),
                    count=2,
                ),
                slc(
                    "slice-2", PER_DEVICE, P1, A, count=2, counter_sets={"counter-set-1": {"memory": 18 * GI}}
                ),
            ],
            expect=[[r("req-0/subReq-1", A, P1, D1)]],
        ),
        "partitionable-devices-per-device-node-selection-node-selector": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [
                slc(
                    "slice-1",
                    PER_DEVICE,
                    P1,
                    A,
                    dev(D1, counters=_mem(4), from_counters=True, node=label_selector("region", "region-1")),
                    count=2,
                ),
                slc(
                    "slice-2", PER_DEVICE, P1, A, count=2, counter_sets={"counter-set-1": {"memory": 18 * GI}}
                ),
            ],
            expect=[[r("req-0", A, P1, D1)]],
            local=False,
        ),
    }
)

_T_SCHED = Taint("taint-key", "taint-value", TaintEffect.NO_SCHEDULE)
_T_EXEC = Taint("taint-key", "taint-value-2", TaintEffect.NO_EXECUTE)
_T_NONE = Taint("taint-key", "taint-value", TaintEffect.NONE)
_TOL_SCHED = Toleration("taint-key", "Exists", effect="NoSchedule")
_TOL_EXEC = Toleration("taint-key", "Equal", "taint-value-2", "NoExecute")
_GEN5, _GEN6 = f'device.attributes["{A}"].generation == "v5"', f'device.attributes["{A}"].generation == "v6"'


def _many(name: str, where: str, pool: str, driver: str, n: int) -> ResourceSlice:
    return slc(name, where, pool, driver, *(dev(f"device-{i}") for i in range(n)))


CASES.update(
    {
        "tainted-two-devices": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED,)), dev(D2, taints=(_T_EXEC,)))],
        ),
        "tainted-one-device-two-taints": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED, _T_EXEC)))],
        ),
        "tainted-two-devices-tolerated": Case(
            [claim("claim-0", req("req-0", "class-a", tolerations=(_TOL_EXEC,)))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED,)), dev(D2, taints=(_T_EXEC,)))],
            expect=[[r("req-0", A, P1, D2)]],
        ),
        "tainted-two-devices-prioritized-list-tolerated": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0",
                        ex("subReq-0", "class-a"),
                        ex("subReq-1", "class-a", tolerations=(_TOL_EXEC,)),
                    ),
                )
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED,)), dev(D2, taints=(_T_EXEC,)))],
            expect=[[r("req-0/subReq-1", A, P1, D2)]],
        ),
        "tainted-no-effect": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_NONE,)))],
            expect=[[r("req-0", A, P1, D1)]],
        ),
        "tainted-one-device-two-taints-both-tolerated": Case(
            [claim("claim-0", req("req-0", "class-a", tolerations=(_TOL_SCHED, _TOL_EXEC)))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED, _T_EXEC)))],
            expect=[[r("req-0", A, P1, D1)]],
        ),
        "tainted-prioritized-list": Case(
            [claim("claim-0", first("req-0", ex("subReq-0", "class-b"), ex("subReq-1", "class-a")))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED,)))],
            classes=[CA, CB],
        ),
        "tainted-admin-access": Case(
            [claim("claim-0", req("req-0", "class-a", admin_access=True))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED,)))],
            allocated=[_id(P1, D1), _id(P1, D2)],
        ),
        "tainted-all-devices-single": Case(
            [claim("claim-0", all_req("req-0", "class-a"))],
            [slc("slice-1", "node-1", P1, A, dev(D1, taints=(_T_SCHED,)))],
        ),
        "prioritized-list-allocation-mode-all": Case(
            [claim("claim-0", first("req-0", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-a")))],
            [slc("slice-1", "node-1", P1, A, dev(D1), dev(D2))],
            allocated=[_id(P1, D2)],
            expect=[[r("req-0/subReq-1", A, P1, D1)]],
        ),
        "prioritized-list-allocation-mode-all-with-selectors": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0", all_ex("subReq-0", "class-a", _GEN6), all_ex("subReq-1", "class-a", _GEN5)
                    ),
                )
            ],
            [slc("slice-1", "node-1", P1, A, dev(D1, attrs={"generation": "v5"}))],
            expect=[[r("req-0/subReq-1", A, P1, D1)]],
        ),
        "prioritized-list-allocation-mode-all-with-selectors-multiple-pools": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0", all_ex("subReq-0", "class-a", _GEN6), all_ex("subReq-1", "class-a", _GEN5)
                    ),
                )
            ],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, attrs={"generation": "v5"})),
                slc("slice-2", "node-1", P2, A, dev(D1, attrs={"generation": "v5"})),
            ],
            expect=[[r("req-0/subReq-1", A, P1, D1), r("req-0/subReq-1", A, P2, D1)]],
        ),
        "prioritized-list-allocation-mode-all-with-selectors-multiple-pools-across-nodes": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0", all_ex("subReq-0", "class-a", _GEN6), all_ex("subReq-1", "class-a", _GEN5)
                    ),
                )
            ],
            [
                slc("slice-1", "node-1", P1, A, dev(D1, attrs={"generation": "v5"})),
                slc(
                    "slice-2",
                    "node-2",
                    P2,
                    A,
                    dev(D1, attrs={"generation": "v5"}),
                    dev(D2, attrs={"generation": "v6"}),
                ),
            ],
            expect=[[r("req-0/subReq-1", A, P1, D1)]],
        ),
        "prioritized-list-allocation-mode-all-with-selectors-deviceclass-subset": Case(
            [
                claim(
                    "claim-0",
                    first(
                        "req-0", all_ex("subReq-0", "class-a", _GEN6), all_ex("subReq-1", "class-a", _GEN5)
                    ),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, attrs={"generation": "v6", "selected": False}),
                    dev(D2, attrs={"generation": "v5", "selected": False}),
                    dev(D3, attrs={"generation": "v5", "selected": True}),
                )
            ],
            classes=[
                DeviceClass("class-a", (f'device.driver == "{A}" && device.attributes["{A}"].selected',))
            ],
            expect=[[r("req-0/subReq-1", A, P1, D3)]],
        ),
        "max-number-devices": Case(
            [claim("claim-0", req("req-0", "class-a", 32))],
            [_many("slice-1", "node-1", P1, A, 32)],
            expect=[[r("req-0", A, P1, f"device-{i}") for i in range(32)]],
        ),
        "partitionable-devices-with-attribute-selector": Case(
            [
                claim(
                    "claim-0",
                    req("req-0", "class-a", 2),
                    req("req-1", "class-a", 1, f'device.attributes["{A}"].special'),
                )
            ],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(
                        D1,
                        attrs={"special": True},
                        counters={"counter-set-1": {"cpu1": 1}, "counter-set-2": {"mem": 10 * GI}},
                    ),
                    dev(
                        D2,
                        attrs={"special": False},
                        counters={"counter-set-1": {"cpu2": 1}, "counter-set-2": {"mem": 10 * GI}},
                    ),
                    dev(
                        D3,
                        attrs={"special": False},
                        counters={"counter-set-1": {"cpu3": 1}, "counter-set-2": {"mem": 10 * GI}},
                    ),
                    count=2,
                ),
                slc(
                    "slice-2",
                    "node-1",
                    P1,
                    A,
                    count=2,
                    counter_sets={
                        "counter-set-1": {"cpu1": 1, "cpu2": 1, "cpu3": 1},
                        "counter-set-2": {"mem": 30 * GI},
                    },
                ),
            ],
            expect=[[r("req-0", A, P1, D2), r("req-0", A, P1, D3), r("req-1", A, P1, D1)]],
        ),
        "prioritized-list-max-allocation-limit-request": Case(
            [
                claim(
                    "claim-0",
                    first("req-0", ex("subReq-0", "class-a", 32), ex("subReq-1", "class-a", 16)),
                    first("req-1", ex("subReq-0", "class-a", 32), ex("subReq-1", "class-a", 16)),
                )
            ],
            [_many("slice-1", "node-1", P1, A, 64)],
            expect=[
                [r("req-0/subReq-1", A, P1, f"device-{i}") for i in range(16)]
                + [r("req-1/subReq-1", A, P1, f"device-{i}") for i in range(16, 32)]
            ],
        ),
        "prioritized-list-max-allocation-allocation-mode-all": Case(
            [
                claim(
                    "claim-0",
                    first("req-0", all_ex("subReq-0", "class-a"), ex("subReq-1", "class-a", 2)),
                    req("req-1", "class-b", 2),
                )
            ],
            [_many("slice-1", "node-1", P1, A, 31), _many("slice-2", "node-1", P2, B, 2)],
            classes=[CA, CB],
            expect=[
                [
                    r("req-0/subReq-1", A, P1, D0),
                    r("req-0/subReq-1", A, P1, D1),
                    r("req-1", B, P2, D0),
                    r("req-1", B, P2, D1),
                ]
            ],
        ),
        "node-restriction": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [slc("slice-1", label_selector("planet", "earth"), P1, A, dev(D1, binds_to_node=True))],
            expect=[[r("req-0", A, P1, D1)]],
        ),
        "device-binding-conditions": Case(
            [claim("claim-0", req("req-0", "class-a"))],
            [
                slc(
                    "slice-1",
                    "node-1",
                    P1,
                    A,
                    dev(D1, binding_conditions=("IsPrepare",), binding_failure_conditions=("BindingFailed",)),
                )
            ],
            expect=[[r("req-0", A, P1, D1)]],
        ),
    }
)
