"""Reductions spelled otherwise, rewritten to the form the analysis knows.

Tutorials count with ``counts[w] = counts.get(w, 0) + 1``, gather with
``index.setdefault(k, []).append(v)``, keep a range with ``lo, hi = min(lo,
x), max(hi, x)``.  Each is, statement for statement, the same as a form the
analysis already proves and merges (``counts[w] += 1`` from 0,
``index[k].append(v)`` onto a new list, two running minimum/maximum
statements), provided what is rewritten is pure: ``get``'s key a name, a
constant or an attribute/subscript of them (evaluated twice serially, once
here; ``setdefault``'s once either way), the
default a numeric constant or an empty list, the tuple's parts reading no
other target and calling nothing but ``min``/``max``/``abs``.

The body's statements are replaced in place (the classification and the
chunk program both see the rewritten form); what the merge must know (a
missing key's starting value, a ``D[k] = D[k] + e`` that rebinds instead of
changing in place) is returned as :class:`Spelled`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpucell.core.reducers import SELECTING

__all__ = ["FIRST", "Spelled", "respell"]

_OPS = (ast.Add, ast.Sub, ast.Mult)
_PURE_CALLS = ("min", "max", "abs")


@dataclass(eq=False)  # (a frozen LoopPlan holds it: hashed by identity)
class Spelled:
    """What the merge needs about the rewritten statements."""

    # D -> the value a missing key starts from (`D.get(k, 0) + e`)
    defaults: dict[str, Any] = field(default_factory=dict)
    # D whose rewritten reductions rebind (`D[k] = D[k] + e`): the merge
    # applies the binary operator, never the in-place one
    rebinding: set[str] = field(default_factory=set)
    # D whose lists start empty where a key is missing (`D.setdefault(k, [])`)
    new_lists: set[str] = field(default_factory=set)
    # D rebinding in some statements, changed in place (`D[k] += e`) in
    # others: the merge refuses where a value is not a number or a string
    mixed: set[str] = field(default_factory=set)
    # D rewritten from another spelling, and how many statements
    names: dict[str, int] = field(default_factory=dict)
    # names the rewrite introduced (`S[-1]` read back after `S.append(e)`):
    # the iteration's own, never bound in the notebook
    hidden: set[str] = field(default_factory=set)
    # D whose missing key takes its first value (`if k not in D or v > D[k]:
    # D[k] = v`, a keyed max/min with no starting value)
    first: set[str] = field(default_factory=set)
    # a frame's own row read back (`df.loc[i, c] = e`, then `df.loc[i, c]`):
    # the hidden list of each iteration's written values -> D (framerows.py)
    frame_rows: dict[str, str] = field(default_factory=dict)
    # `np.add.at(D, idx, w)` (any ufunc's `.at`): the hidden list its
    # arguments are gathered into, in iteration order -> D; the merge replays
    # the calls into D in that order (exact, floats included)
    ufunc_at: dict[str, str] = field(default_factory=dict)


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


def _keyed(
    s: ast.Assign, is_builtin: Callable[[str], bool]
) -> tuple[ast.AugAssign, str, Any] | None:
    """``D[k] = D.get(k, c) + e`` or ``D[k] = D[k] + e`` as ``D[k] += e``
    (and the default, or ``...`` for none)."""
    if len(s.targets) != 1 or not isinstance(s.value, ast.BinOp):
        return None
    t, v = s.targets[0], s.value
    if not (
        isinstance(t, ast.Subscript)
        and isinstance(t.value, ast.Name)
        and isinstance(v.op, _OPS)
        and _pure(t.slice, is_builtin)
    ):
        return None
    d = t.value.id
    if any(isinstance(n, ast.Name) and n.id == d for n in ast.walk(t.slice)):
        return None
    if any(isinstance(n, ast.Name) and n.id == d for n in ast.walk(v.right)):
        return None
    default: Any = ...
    c = _get_call(v.left, d, t.slice)
    if c is not None:
        if not _number(c):
            return None
        default = ast.literal_eval(c)
    elif not (
        isinstance(v.left, ast.Subscript)
        and isinstance(v.left.value, ast.Name)
        and v.left.value.id == d
        and _same(v.left.slice, t.slice)
    ):
        return None
    target = ast.Subscript(
        value=ast.Name(d, ast.Load()), slice=t.slice, ctx=ast.Store()
    )
    ast.copy_location(target, t)
    ast.copy_location(target.value, t.value)
    aug = ast.AugAssign(target=target, op=v.op, value=v.right)
    return ast.copy_location(aug, s), d, default


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


def _ufunc_at_call(s: ast.stmt) -> tuple[ast.Call, str] | None:
    """``m.ufunc.at(D, idx[, w])`` as a statement: the call and ``D``."""
    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
        return None
    call = s.value
    f = call.func
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "at"
        and isinstance(f.value, ast.Attribute)
        and isinstance(f.value.value, ast.Name)
        and 2 <= len(call.args) <= 3
        and not call.keywords
        and not any(isinstance(a, ast.Starred) for a in call.args)
        and isinstance(call.args[0], ast.Name)
    ):
        return call, call.args[0].id
    return None


def _ufunc_at_targets(body: list[ast.stmt]) -> set[str]:
    """The arrays only ever given to ``m.ufunc.at`` as its first argument in
    the body: any other use would see the calls' effects so far."""
    calls: dict[str, int] = {}
    uses: dict[str, int] = {}
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Name):
                uses[node.id] = uses.get(node.id, 0) + 1
            if isinstance(node, ast.stmt):
                found = _ufunc_at_call(node)
                if found is not None:
                    calls[found[1]] = calls.get(found[1], 0) + 1
    return {d for d, n in calls.items() if uses.get(d) == n}


def _ufunc_at(s: ast.stmt, targets: set[str]) -> tuple[ast.stmt, str, str] | None:
    """``np.add.at(D, idx, w)`` on an array from before the loop as
    ``__gpucell_at_D__.append((np.add, deepcopy((idx, w))))``: the ufunc and
    a private copy of its arguments, gathered for the merge to replay."""
    found = _ufunc_at_call(s)
    if found is None or found[1] not in targets:
        return None
    call, d = found
    f = call.func
    assert isinstance(f, ast.Attribute)
    hidden = f"__gpucell_at_{d}__"
    copied = ast.parse("__import__('copy').deepcopy(())", mode="eval").body
    assert isinstance(copied, ast.Call)
    copied.args = [ast.Tuple(elts=list(call.args[1:]), ctx=ast.Load())]
    entry = ast.Tuple(elts=[f.value, copied], ctx=ast.Load())
    append = ast.Attribute(ast.Name(hidden, ast.Load()), "append", ast.Load())
    new = ast.Expr(ast.Call(append, [entry], []))
    for node in ast.walk(new):
        if not hasattr(node, "lineno") or node is not f.value:
            ast.copy_location(node, s)
    return new, hidden, d


def _reads(e: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(e))


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


def _setdefault(
    s: ast.Expr, is_builtin: Callable[[str], bool]
) -> tuple[ast.Expr, str] | None:
    """``D.setdefault(k, []).append(e)`` as ``D[k].append(e)``."""
    call = s.value
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("append", "extend")
        and len(call.args) == 1
        and not call.keywords
        and not isinstance(call.args[0], ast.Starred)
    ):
        return None
    inner = call.func.value
    if not (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr == "setdefault"
        and isinstance(inner.func.value, ast.Name)
        and len(inner.args) == 2
        and not inner.keywords
        and isinstance(inner.args[1], ast.List)
        and not inner.args[1].elts
    ):  # (the key is evaluated once either way, before the value: any key)
        return None
    d = inner.func.value.id
    if any(
        isinstance(n, ast.Name) and n.id == d
        for part in (inner.args[0], call.args[0])
        for n in ast.walk(part)
    ):
        return None
    sub = ast.copy_location(
        ast.Subscript(value=inner.func.value, slice=inner.args[0], ctx=ast.Load()),
        inner,
    )
    func = ast.copy_location(ast.Attribute(sub, call.func.attr, ast.Load()), call.func)
    new = ast.copy_location(ast.Call(func, call.args, []), call)
    return ast.copy_location(ast.Expr(new), s), d


def _split_tuple(
    s: ast.Assign, is_builtin: Callable[[str], bool]
) -> list[ast.stmt] | None:
    """``a, b = f(a, x), g(b, x)`` as two statements, where no part reads
    another part's target and nothing but min/max/abs is called."""
    if len(s.targets) != 1:
        return None
    t, v = s.targets[0], s.value
    if not (
        isinstance(t, ast.Tuple)
        and isinstance(v, ast.Tuple)
        and len(t.elts) == len(v.elts) >= 2
        and all(isinstance(x, ast.Name) for x in t.elts)
    ):
        return None
    names = [x.id for x in t.elts if isinstance(x, ast.Name)]
    if len(set(names)) != len(names):
        return None
    for j, part in enumerate(v.elts):
        if isinstance(part, ast.Starred) or not _pure(part, is_builtin, calls=True):
            return None
        used = {n.id for n in ast.walk(part) if isinstance(n, ast.Name)}
        if used & (set(names) - {names[j]}):
            return None
    return [
        ast.copy_location(ast.Assign(targets=[x], value=part), s)
        for x, part in zip(t.elts, v.elts, strict=True)
    ]


def respell(
    body: list[ast.stmt],
    is_builtin: Callable[[str], bool],
    loop: tuple[ast.expr, ast.expr | None] | None = None,
) -> Spelled:
    """Rewrite, in place, every statement of ``body`` (nested blocks too)
    spelled otherwise; return what the merge needs.  A name counted with
    ``get`` is rewritten only where every keyed statement of it has the same
    default (serially a ``D[k] += e`` on a missing key raises)."""
    forms: dict[str, list[Any]] = {}
    augmented: set[str] = set()
    for node in body:
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.AugAssign)
                and isinstance(sub.target, ast.Subscript)
                and isinstance(sub.target.value, ast.Name)
            ):
                augmented.add(sub.target.value.id)
    _walk(body, is_builtin, lambda s: _record(s, is_builtin, forms))
    allowed = {
        d
        for d, fs in forms.items()
        if all(f is ... for f in fs)
        or (len(set(map(repr, fs))) == 1 and d not in augmented)
    }
    out = Spelled()
    for d in allowed:
        fs = forms[d]
        if fs[0] is FIRST:
            out.first.add(d)
        elif fs[0] is not ...:
            out.defaults[d] = fs[0]
        out.rebinding.add(d)
        if d in augmented:
            out.mixed.add(d)

    at_targets = _ufunc_at_targets(body)

    def rewrite(s: ast.stmt) -> list[ast.stmt] | None:
        at = _ufunc_at(s, at_targets)
        if at is not None:
            hidden, target = at[1], at[2]
            out.ufunc_at[hidden] = target
            out.hidden.add(hidden)
            out.names[target] = out.names.get(target, 0) + 1
            return [at[0]]
        sel = _keyed_select(s, is_builtin)
        if sel is not None:
            if sel[1] not in allowed:
                return None
            out.names[sel[1]] = out.names.get(sel[1], 0) + 1
            return [sel[0]]
        if isinstance(s, ast.Assign):
            k = _keyed(s, is_builtin)
            if k is not None:
                if k[1] not in allowed:
                    return None
                out.names[k[1]] = out.names.get(k[1], 0) + 1
                return [k[0]]
            return _split_tuple(s, is_builtin)
        if isinstance(s, ast.Expr):
            g = _setdefault(s, is_builtin)
            if g is not None:
                out.new_lists.add(g[1])
                out.names[g[1]] = out.names.get(g[1], 0) + 1
                return [g[0]]
        return None

    _walk(body, is_builtin, rewrite)
    _blocks(body, lambda stmts: _last_reads(stmts, out))
    if loop is not None:
        from gpucell.core.analysis.keys import _own_index

        own_index = _own_index(loop[0], loop[1], is_builtin)
        if own_index is not None:
            _frame_rows(body, own_index, out)
    for node in body:
        ast.fix_missing_locations(node)
    return out


def _record(
    s: ast.stmt, is_builtin: Callable[[str], bool], forms: dict[str, list[Any]]
) -> None:
    if isinstance(s, ast.Assign):
        k = _keyed(s, is_builtin)
        if k is not None:
            forms.setdefault(k[1], []).append(k[2])
    sel = _keyed_select(s, is_builtin)
    if sel is not None:
        forms.setdefault(sel[1], []).append(sel[2])


def _walk(
    stmts: list[ast.stmt],
    is_builtin: Callable[[str], bool],
    visit: Callable[[ast.stmt], list[ast.stmt] | None],
) -> None:
    """Every statement of the body's blocks (not into nested definitions);
    ``visit`` may return statements that replace the one it was given."""
    i = 0
    while i < len(stmts):
        s = stmts[i]
        new = visit(s)
        if new is not None:
            stmts[i : i + 1] = new
            i += len(new)
            continue
        if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(s, name, None)
                if isinstance(inner, list):
                    _walk(inner, is_builtin, visit)
            for h in getattr(s, "handlers", ()):
                _walk(h.body, is_builtin, visit)
            for c in getattr(s, "cases", ()):
                _walk(c.body, is_builtin, visit)
        i += 1


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


def _appended(s: ast.stmt) -> tuple[str, ast.Call] | None:
    """``S.append(e)`` as a statement: ``(S, the call)``."""
    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
        return None
    call = s.value
    f = call.func
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "append"
        and isinstance(f.value, ast.Name)
        and len(call.args) == 1
        and not call.keywords
        and not isinstance(call.args[0], ast.Starred)
    ):
        return f.value.id, call
    return None


def _is_last(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and isinstance(node.slice, ast.UnaryOp)
        and isinstance(node.slice.op, ast.USub)
        and isinstance(node.slice.operand, ast.Constant)
        and node.slice.operand.value == 1
    )


def _last_reads(stmts: list[ast.stmt], out: Spelled) -> None:
    """``S.append(e)`` then ``S[-1]`` later in the same block, ``S`` used no
    other way after the append: the element read back is ``e`` itself (the
    same object, serially), so ``t = e; S.append(t)`` and ``t`` for each
    ``S[-1]``; ``S`` stays an ordered gather."""
    i = 0
    while i < len(stmts):
        hit = _appended(stmts[i])
        if hit is None:
            i += 1
            continue
        name, call = hit
        reads: list[ast.Subscript] = []
        ok = True
        for later in stmts[i + 1 :]:
            inside_def = {
                id(n)
                for d in ast.walk(later)
                if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                for n in ast.walk(d)
            }
            lasts: dict[int, ast.Subscript] = {
                id(n.value): n
                for n in ast.walk(later)
                if isinstance(n, ast.Subscript)
                and _is_last(n, name)
                and id(n) not in inside_def
            }
            for n in ast.walk(later):
                if isinstance(n, ast.Name) and n.id == name:
                    if id(n) not in lasts:
                        ok = False
                    else:
                        reads.append(lasts[id(n)])
        if not ok or not reads:
            i += 1
            continue
        temp = f"__gpucell_last_{name}__"
        out.hidden.add(temp)
        keep = ast.copy_location(
            ast.Assign(targets=[ast.Name(temp, ast.Store())], value=call.args[0]),
            stmts[i],
        )
        call.args[0] = ast.copy_location(ast.Name(temp, ast.Load()), call.args[0])
        for r in reads:
            _replace(
                stmts[i + 1 :], r, ast.copy_location(ast.Name(temp, ast.Load()), r)
            )
        stmts[i:i] = [keep]
        i += 2


def _replace(stmts: list[ast.stmt], old: ast.AST, new: ast.expr) -> None:
    """Put ``new`` where ``old`` is, in whatever field holds it."""
    for s in stmts:
        for parent in ast.walk(s):
            for field_name, value in ast.iter_fields(parent):
                if value is old:
                    setattr(parent, field_name, new)
                    return
                if isinstance(value, list):
                    for j, x in enumerate(value):
                        if x is old:
                            value[j] = new
                            return


# ------------------------------------------------ a frame's own row read back

_LABEL_ACCESSORS = ("loc", "at")


def _own_cell(node: ast.AST, index: str) -> tuple[str, str] | None:
    """``D.loc[i, "c"]`` / ``D.at[i, "c"]``, ``i`` the loop's own label:
    ``(D, "c")``."""
    if not (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in _LABEL_ACCESSORS
        and isinstance(node.value.value, ast.Name)
        and isinstance(node.slice, ast.Tuple)
        and len(node.slice.elts) == 2
    ):
        return None
    i, c = node.slice.elts
    if (
        isinstance(i, ast.Name)
        and i.id == index
        and isinstance(c, ast.Constant)
        and isinstance(c.value, str)
    ):
        return node.value.value.id, c.value
    return None


def _frame_rows(body: list[ast.stmt], index: str, out: Spelled) -> None:
    """Each frame the body uses only as ``D.loc[i, "c"]`` (or ``.at``), ``i``
    the loop's own label never rebound, writing some cell and reading one:
    every use goes to a private one-row copy made first in the iteration, and
    the iteration's written cells are gathered last (``core/framerows.py``)."""
    uses: dict[str, int] = {}
    cells: dict[str, list[ast.Subscript]] = {}
    stores: dict[str, list[str]] = {}
    rebinds_index = False
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Name):
                uses[node.id] = uses.get(node.id, 0) + 1
                if node.id == index and not isinstance(node.ctx, ast.Load):
                    rebinds_index = True
            found = _own_cell(node, index)
            if found is None:
                continue
            assert isinstance(node, ast.Subscript)
            cells.setdefault(found[0], []).append(node)
            if isinstance(node.ctx, ast.Store):
                cols = stores.setdefault(found[0], [])
                if found[1] not in cols:
                    cols.append(found[1])
    if rebinds_index:
        return
    frames = [
        d for d, subs in cells.items() if uses.get(d) == len(subs) and d in stores
    ]
    for d in sorted(frames):
        row, hidden = f"__gpucell_fr_{d}__", f"__gpucell_frw_{d}__"
        for sub in cells[d]:
            assert isinstance(sub.value, ast.Attribute)
            sub.value.value = ast.copy_location(ast.Name(row, ast.Load()), sub)
        first = body[0]
        make = ast.parse(f"{row} = {d}.loc[[{index}]].copy()").body[0]
        written = ", ".join(repr(c) for c in stores[d]) + ","
        keep = ast.parse(
            f"{hidden}.append(__import__('gpucell.core.framerows', "
            f"fromlist=['written']).written({row}, {index}, ({written})))"
        ).body[0]
        for node in ast.walk(make):
            ast.copy_location(node, first)
        for node in ast.walk(keep):
            ast.copy_location(node, body[-1])
        guarded = ast.copy_location(
            ast.Try(body=list(body), handlers=[], orelse=[], finalbody=[keep]),
            first,
        )
        body[:] = [make, guarded]
        out.frame_rows[hidden] = d
        out.hidden |= {row, hidden}
        out.names[d] = out.names.get(d, 0) + len(cells[d])
