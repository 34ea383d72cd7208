"""What the respellings share (spellings.py, keyedselect.py): whether an
expression is pure (evaluated a different number of times once rewritten),
two trees the same, a numeric constant, ``D.get(k, c)``, and the starting
value of a keyed max/min that has none."""

from __future__ import annotations

import ast
from collections.abc import Callable

__all__ = ["FIRST"]


_PURE_CALLS = ("min", "max", "abs")


class _First:
    """The starting value of a keyed max/min that has none: the first value."""

    def __repr__(self) -> str:
        return "<first>"


FIRST = _First()


def _pure(e: ast.expr, is_builtin: Callable[[str], bool], calls: bool = False) -> bool:
    """An expression without effects: names, constants, attributes, subscripts,
    tuples, arithmetic (and, with ``calls``, builtin min/max/abs)."""
    for node in ast.walk(e):
        if isinstance(node, ast.Call):
            f = node.func
            if not (
                calls
                and isinstance(f, ast.Name)
                and f.id in _PURE_CALLS
                and is_builtin(f.id)
                and not node.keywords
            ):
                return False
        elif not isinstance(
            node,
            (
                ast.Name,
                ast.Constant,
                ast.Attribute,
                ast.Subscript,
                ast.Tuple,
                ast.Load,
                ast.BinOp,
                ast.UnaryOp,
                ast.Slice,
                ast.operator,
                ast.unaryop,
            ),
        ):
            return False
    return True


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _number(e: ast.expr) -> bool:
    return (
        isinstance(e, ast.Constant)
        and type(e.value) in (int, float)
        or isinstance(e, ast.UnaryOp)
        and isinstance(e.op, ast.USub)
        and isinstance(e.operand, ast.Constant)
        and type(e.operand.value) in (int, float)
    )


def _get_call(
    e: ast.expr, d: str, key: ast.expr, method: str = "get"
) -> ast.expr | None:
    """The default of ``d.get(key, default)`` (or ``method``), if ``e`` is
    that call."""
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Attribute)
        and e.func.attr == method
        and isinstance(e.func.value, ast.Name)
        and e.func.value.id == d
        and len(e.args) == 2
        and not e.keywords
        and _same(e.args[0], key)
    ):
        return e.args[1]
    return None


def _reads(e: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(e))


def _blocks(stmts: list[ast.stmt], visit: Callable[[list[ast.stmt]], None]) -> None:
    """``visit`` every statement list of the body (not nested definitions)."""
    visit(stmts)
    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(s, name, None)
            if isinstance(inner, list):
                _blocks(inner, visit)
        for h in getattr(s, "handlers", ()):
            _blocks(h.body, visit)
        for c in getattr(s, "cases", ()):
            _blocks(c.body, visit)
