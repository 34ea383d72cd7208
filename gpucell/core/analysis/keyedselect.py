"""A keyed running max/min: ``D[k] = max(D[k], e)`` as the keyed reduction
matches it (:func:`selecting`, for sinks.KeyedSink), and the spellings
rewritten to it where the loop as written is refused (``D[k] = max(D.get(k,
c), e)``, ``if k not in D or e > D[k]: D[k] = e``, ``D[k] =
max(D.setdefault(k, e), e)``: :func:`_keyed_select`, for spellings.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from gpucell.core.analysis.spellbase import (
    FIRST,
    _get_call,
    _number,
    _pure,
    _reads,
    _same,
)
from gpucell.core.reducers import SELECTING

__all__ = ["selecting"]


def _pure_key(e: ast.expr) -> bool:
    """A key evaluated once here and twice serially (``D[k] = max(D[k], e)``):
    names, constants, attributes and items of them, tuples, arithmetic."""
    return all(
        isinstance(
            n,
            (
                ast.Name,
                ast.Constant,
                ast.Attribute,
                ast.Subscript,
                ast.Tuple,
                ast.BinOp,
                ast.UnaryOp,
                ast.expr_context,
                ast.operator,
                ast.unaryop,
            ),
        )
        for n in ast.walk(e)
    )


def selecting(
    stmt: ast.Assign, is_builtin: Callable[[str], bool]
) -> tuple[ast.Name, ast.Name, str, ast.expr] | None:
    """``D[k] = max(D[k], e)`` (``min``), ``k`` pure and ``e`` not reading
    ``D``: the stored ``D``, the read one, the operator and ``e``.  The
    builtin keeps ``D[k]`` unless ``e`` is larger (smaller), as the keyed
    reduction folds."""
    if len(stmt.targets) != 1:
        return None
    t, v = stmt.targets[0], stmt.value
    if not (
        isinstance(t, ast.Subscript)
        and isinstance(t.value, ast.Name)
        and isinstance(v, ast.Call)
        and isinstance(v.func, ast.Name)
        and v.func.id in SELECTING
        and is_builtin(v.func.id)
        and len(v.args) == 2
        and not v.keywords
    ):
        return None
    read, e = v.args
    d = t.value.id
    if not (
        isinstance(read, ast.Subscript)
        and isinstance(read.value, ast.Name)
        and read.value.id == d
        and ast.dump(read.slice) == ast.dump(t.slice)
        and _pure_key(t.slice)
        and not any(
            isinstance(n, ast.Name) and n.id == d
            for part in (e, t.slice)
            for n in ast.walk(part)
        )
    ):
        return None
    return t.value, read.value, v.func.id, e


def _start(e: ast.expr) -> Any:
    """A keyed max/min's starting value: a number, ``float("inf")`` or
    ``float("-inf")`` (also negated), else ``...``."""
    if _number(e):
        return ast.literal_eval(e)
    sign = 1.0
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        sign, e = -1.0, e.operand
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id == "float"
        and len(e.args) == 1
        and not e.keywords
        and isinstance(e.args[0], ast.Constant)
        and isinstance(e.args[0].value, str)
        and e.args[0].value.strip().lower() in ("inf", "+inf", "-inf", "infinity")
    ):
        return sign * float(e.args[0].value)
    return ...


def _select_call(
    e: ast.expr, is_builtin: Callable[[str], bool]
) -> tuple[str, ast.expr, ast.expr] | None:
    """``max(a, b)`` / ``min(a, b)`` of the builtin: ``(op, a, b)``."""
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id in SELECTING
        and is_builtin(e.func.id)
        and len(e.args) == 2
        and not e.keywords
        and not any(isinstance(a, ast.Starred) for a in e.args)
    ):
        return e.func.id, e.args[0], e.args[1]
    return None


def _keyed_select(
    s: ast.stmt, is_builtin: Callable[[str], bool]
) -> tuple[ast.Assign, str, Any] | None:
    """A keyed running max/min spelled otherwise, as ``D[k] = max(D[k], e)``
    (and its starting value): ``D[k] = max(D.get(k, c), e)`` (from ``c``),
    ``if k not in D or e > D[k]: D[k] = e`` and ``D[k] = max(D.setdefault(k,
    e), e)`` (from the first ``e``; ``min`` with ``<``).  ``k`` and ``e`` are
    pure: serially evaluated more often."""
    if isinstance(s, ast.Assign) and len(s.targets) == 1:
        t = s.targets[0]
        found = _select_call(s.value, is_builtin)
        if found is None or not isinstance(t, ast.Subscript):
            return None
        op, first, e = found
        if not isinstance(t.value, ast.Name):
            return None
        d = t.value.id
        if not _pure(t.slice, is_builtin) or _reads(e, d) or _reads(t.slice, d):
            return None
        c = _get_call(first, d, t.slice)
        if c is not None:
            start = _start(c)
            return None if start is ... else (_select_stmt(s, t, op, e), d, start)
        c = _get_call(first, d, t.slice, "setdefault")
        if c is not None and _same(c, e) and _pure(e, is_builtin):
            # `D[k] = max(D.setdefault(k, e), e)`: a missing key takes `e`
            return _select_stmt(s, t, op, e), d, FIRST
        return None
    if not (isinstance(s, ast.If) and not s.orelse and len(s.body) == 1):
        return None
    st = s.body[0]
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
        return None
    t, e = st.targets[0], st.value
    if not (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)):
        return None
    d, k = t.value.id, t.slice
    better = _missing_or_better(s.test, d, k, e)
    if (
        better is None
        or not _pure(k, is_builtin)
        or not _pure(e, is_builtin)
        or _reads(e, d)
        or _reads(k, d)
    ):
        return None
    return _select_stmt(st, t, better, e), d, FIRST


def _missing_or_better(test: ast.expr, d: str, k: ast.expr, e: ast.expr) -> str | None:
    """``k not in D or e > D[k]`` (``D[k] < e``): ``"max"``; ``<``: ``"min"``."""
    if not (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.Or)
        and len(test.values) == 2
    ):
        return None
    missing, better = test.values
    if not (
        isinstance(missing, ast.Compare)
        and len(missing.ops) == 1
        and isinstance(missing.ops[0], ast.NotIn)
        and _same(missing.left, k)
        and isinstance(missing.comparators[0], ast.Name)
        and missing.comparators[0].id == d
        and isinstance(better, ast.Compare)
        and len(better.ops) == 1
    ):
        return None

    def item(x: ast.expr) -> bool:
        return (
            isinstance(x, ast.Subscript)
            and isinstance(x.value, ast.Name)
            and x.value.id == d
            and _same(x.slice, k)
        )

    left, right, cmp = better.left, better.comparators[0], better.ops[0]
    if _same(left, e) and item(right):  # e > D[k]
        return {ast.Gt: "max", ast.Lt: "min"}.get(type(cmp))
    if item(left) and _same(right, e):  # D[k] < e
        return {ast.Lt: "max", ast.Gt: "min"}.get(type(cmp))
    return None


def _select_stmt(s: ast.stmt, t: ast.Subscript, op: str, e: ast.expr) -> ast.Assign:
    """``D[k] = op(D[k], e)`` at ``s``'s place."""
    d = t.value
    read = ast.copy_location(ast.Subscript(value=d, slice=t.slice, ctx=ast.Load()), t)
    target = ast.copy_location(
        ast.Subscript(value=d, slice=t.slice, ctx=ast.Store()), t
    )
    func = ast.copy_location(ast.Name(op, ast.Load()), s)
    call = ast.copy_location(ast.Call(func, [read, e], []), s)
    return ast.copy_location(ast.Assign(targets=[target], value=call), s)
