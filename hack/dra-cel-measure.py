"""Measure CEL libraries on DRA device selectors: same answers, evaluation and compile time.

    pip install cel-python==0.5.0   # only for this comparison; gpusched uses cel-expr-python
    PYTHONPATH=src python hack/dra-cel-measure.py

Both evaluate the drivers' selectors (NVIDIA's classes, MIG profiles, quantity comparisons, HAMi's
shares) on a whole GPU, a MIG slice and a shareable device; quantities are integers in base units and
``quantity``/``compareTo``/``isGreaterThan`` are given to both libraries as functions on integers.
"""

from __future__ import annotations

import timeit

import celpy
from celpy import celtypes

from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import Capacity, Device
from gpusched.core.dra.quantity import parse_quantity
from gpusched.core.dra.selector import device_view

NV, HAMI = "gpu.nvidia.com", "hami.io"
GI = 2**30
SELECTORS = [
    f'device.driver == "{NV}" && device.attributes["{NV}"].type == "gpu"',
    f'device.driver == "{NV}" && device.attributes["{NV}"].type == "mig"',
    f"device.attributes['{NV}'].profile == '1g.10gb'",
    f'device.attributes["{NV}"].productName == "NVIDIA H100 80GB HBM3"'
    f' && device.attributes["{NV}"].type == "gpu"',
    f'device.capacity["{NV}"].memory.compareTo(quantity("40Gi")) >= 0',
    f'device.capacity["{NV}"].memory.isGreaterThan(quantity("10Gi"))',
    f'device.driver == "{HAMI}" && device.allowMultipleAllocations == true',
]
DEVICES = [
    (
        NV,
        Device(
            "gpu-0",
            {"type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "profile": ""},
            {"memory": Capacity(80 * GI)},
        ),
    ),
    (
        NV,
        Device(
            "gpu-0-mig-1g10gb-19-6",
            {"type": "mig", "productName": "NVIDIA H100 80GB HBM3", "profile": "1g.10gb"},
            {"memory": Capacity(10 * GI)},
        ),
    ),
    (
        HAMI,
        Device(
            "gpu-0",
            {},
            {"memory": Capacity(80 * GI), "cores": Capacity(100)},
            allow_multiple_allocations=True,
        ),
    ),
]


def celpy_programs() -> list[object]:
    env = celpy.Environment()
    functions = {
        "quantity": lambda s: celtypes.IntType(parse_quantity(str(s))),
        "compareTo": lambda a, b: celtypes.IntType((a > b) - (a < b)),
        "isGreaterThan": lambda a, b: celtypes.BoolType(a > b),
    }
    return [env.program(env.compile(e), functions=functions) for e in SELECTORS]


def celpy_eval(program: object, view: dict[str, object]) -> bool | None:
    try:
        return bool(program.evaluate({"device": celpy.json_to_cel(view)}))  # type: ignore[attr-defined]
    except celpy.CELEvalError:
        return None  # a missing key: an error, as in Kubernetes


def main() -> None:
    compiler = CelCompiler()
    ours = [compiler.compile(e) for e in SELECTORS]
    theirs = celpy_programs()
    views = [device_view(d, dev) for d, dev in DEVICES]
    agree = 0
    for sel, prog in zip(ours, theirs, strict=True):
        for view in views:
            try:
                a: bool | None = sel.matches(view)
            except Exception:
                a = None
            agree += a == celpy_eval(prog, view)
    print(f"agreement: {agree}/{len(SELECTORS) * len(views)} (selector x device)")
    n = 300
    view = views[0]
    per_ours = timeit.timeit(lambda: [s.matches(view) for s in ours[:1] + ours[4:6]], number=n) / (3 * n)
    per_theirs = timeit.timeit(lambda: [celpy_eval(p, view) for p in theirs[:1] + theirs[4:6]], number=n) / (
        3 * n
    )
    fresh = CelCompiler()
    comp_ours = timeit.timeit(lambda: [fresh._env.compile(e) for e in SELECTORS], number=20) / (
        20 * len(SELECTORS)
    )  # type: ignore[attr-defined]
    env = celpy.Environment()
    comp_theirs = timeit.timeit(lambda: [env.compile(e) for e in SELECTORS], number=20) / (
        20 * len(SELECTORS)
    )
    print(
        f"cel-expr-python: eval {per_ours * 1e6:.1f} us/selector, compile {comp_ours * 1e3:.2f} ms/selector"
    )
    print(
        f"cel-python:      eval {per_theirs * 1e6:.1f} us/selector,"
        f" compile {comp_theirs * 1e3:.2f} ms/selector"
    )
    print(f"ratio (eval): {per_theirs / per_ours:.1f}x")


if __name__ == "__main__":
    main()
