"""The CEL adapter: Google's cel-expr-python (the C++ CEL runtime) behind ``SelectorCompiler``.

Chosen over cel-python (celpy) for speed (about 25x faster per evaluation, docs/dra.md) with the same
results on the drivers' selectors. Pure computation, no I/O. Kubernetes' ``quantity`` type is given
as integers in their base unit: ``quantity("10Gi")`` is 10737418240, and ``compareTo``,
``isGreaterThan``, ``isLessThan``, ``asInteger`` work on those integers, as does plain ``<``/``==``.
"""

from __future__ import annotations

from collections.abc import Mapping

from cel_expr_python import cel

from gpusched.core.dra.quantity import parse_quantity
from gpusched.core.dra.selector import CompiledSelector, SelectorError
from gpusched.core.errors import InvalidSpec

_INT, _BOOL, _STR = cel.Type.INT, cel.Type.BOOL, cel.Type.STRING


def _quantity(text: str) -> int:
    try:
        return parse_quantity(text)
    except InvalidSpec as e:
        raise ValueError(str(e)) from None


def _member(name: str, ret: object, impl: object) -> object:
    overload = cel.Overload(f"int_{name}_int", ret, [_INT, _INT], is_member=True, impl=impl)
    return cel.FunctionDecl(name, [overload])


def _env() -> object:
    functions = [
        cel.FunctionDecl("quantity", [cel.Overload("quantity_string", _INT, [_STR], impl=_quantity)]),
        _member("compareTo", _INT, lambda a, b: (a > b) - (a < b)),
        _member("isGreaterThan", _BOOL, lambda a, b: a > b),
        _member("isLessThan", _BOOL, lambda a, b: a < b),
        cel.FunctionDecl(
            "asInteger", [cel.Overload("int_asInteger", _INT, [_INT], is_member=True, impl=lambda a: a)]
        ),
    ]
    return cel.NewEnv(variables={"device": cel.Type.DYN}, functions=functions)


class CelSelector:
    def __init__(self, expression: str, program: object) -> None:
        self.expression = expression
        self._program = program

    def matches(self, device: Mapping[str, object]) -> bool:
        value = self._program.eval(data={"device": device})  # type: ignore[attr-defined]
        kind = str(value.type())
        if kind == "ERROR":
            raise SelectorError(f"CEL runtime error: {value}")
        if kind != "BOOL":
            raise SelectorError(f"must evaluate to bool, got {kind} {value}")
        return bool(value.value())


class CelCompiler:
    """Compiles each expression once and keeps it (classes' selectors repeat across claims)."""

    def __init__(self) -> None:
        self._env = _env()
        self._cache: dict[str, CelSelector] = {}

    def compile(self, expression: str) -> CompiledSelector:
        hit = self._cache.get(expression)
        if hit is None:
            try:
                program = self._env.compile(expression)  # type: ignore[attr-defined]
            except RuntimeError as e:
                raise SelectorError(f"CEL compile error: {e}") from None
            hit = self._cache[expression] = CelSelector(expression, program)
        return hit
