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

from gpucell.core.analysis.concats import _concat, _concat_targets
from gpucell.core.analysis.keyedselect import _keyed_select
from gpucell.core.analysis.replays import _frame_rows, _ufunc_at, _ufunc_at_targets
from gpucell.core.analysis.replaystmts import Replayed, replay_loop_statements
from gpucell.core.analysis.spellbase import (
    FIRST,
    _blocks,
    _get_call,
    _number,
    _pure,
    _same,
)

__all__ = ["FIRST", "Spelled", "respell"]

_OPS = (ast.Add, ast.Sub, ast.Mult)


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
    # `x = np.append(x, e)`, `x = torch.cat([x, t])`, `df = pd.concat([df,
    # p])`: the hidden list each call is recorded into -> x; the merge makes
    # the calls on the kernel, in order, from x's value before the loop
    concats: dict[str, str] = field(default_factory=dict)
    # statements that only change a container from before the loop
    # (`index.setdefault(w, set()).add(i)`, `heapq.heappush(heap, x)`): the
    # hidden list of (statement, its values) -> what the merge replays
    replayed: dict[str, Replayed] = field(default_factory=dict)

    def add_replayed(self, replayed: dict[str, Replayed]) -> None:
        """Statements replayed whatever the loop's reading (driver.analyse)."""
        self.replayed = {**replayed, **self.replayed}
        self.hidden |= set(replayed)


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


def _read_lazily(iterable: ast.expr | None) -> set[str]:
    """Names the loop's iterable reads as the loop goes, not once before it:
    in a generator expression's items and later ``for``s, in a lambda."""
    out: set[str] = set()
    for node in ast.walk(iterable or ast.Pass()):
        parts: list[ast.AST] = []
        if isinstance(node, ast.GeneratorExp):
            parts = [node.elt, *node.generators[1:], *node.generators[0].ifs]
        elif isinstance(node, ast.Lambda):
            parts = [node.body]
        out |= {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}
    return out


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

    # (an array or frame the loop iterates over: serially its later items see
    # the earlier iterations' changes)
    iterated = {
        n.id
        for n in ast.walk(loop[1] if loop and loop[1] is not None else ast.Pass())
        if isinstance(n, ast.Name)
    }
    at_targets = _ufunc_at_targets(body) - iterated
    own = {
        n.id
        for n in ast.walk(loop[0] if loop else ast.Pass())
        if isinstance(n, ast.Name)
    }
    # (a name the body rebinds to a new object: the loop goes on over the old
    # one, unless the iterable reads the name as it goes)
    cat_targets = _concat_targets(body, own | _read_lazily(loop[1] if loop else None))

    def rewrite(s: ast.stmt) -> list[ast.stmt] | None:
        cat = _concat(s, cat_targets)
        if cat is not None:
            out.concats[cat[1]] = cat[2]
            out.hidden.add(cat[1])
            out.hidden.add(f"__gpucell_cat_first_{cat[2]}__")
            out.names[cat[2]] = out.names.get(cat[2], 0) + 1
            return cat[0]
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
        out.replayed = replay_loop_statements(body, *loop, True, is_builtin)
        out.hidden |= set(out.replayed)
    if loop is not None:
        from gpucell.core.analysis.keys import _own_index

        own_index = _own_index(loop[0], loop[1], is_builtin)
        if own_index is not None:
            for d, (hidden, n) in _frame_rows(body, own_index).items():
                out.frame_rows[hidden] = d
                out.hidden |= {hidden, f"__gpucell_fr_{d}__"}
                out.names[d] = out.names.get(d, 0) + n
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
