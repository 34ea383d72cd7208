"""Own rows: a sink the iteration reads and writes only under its own index.

``C[i][j] += A[i][k] * B[k][j]`` in loops over ``j`` and ``k``, ``x[i][0] = ...``,
``m[i, j] = m[i, j - 1] + 1``, or ``out[i] = 0`` followed by ``out[i] += ...``:
iteration ``i`` alone touches ``S[i]``, but it also reads what it wrote, so
replaying recorded writes is not enough.  Each engine gives the iteration a
private copy of its row, rewrites every ``S[i]`` to it (reads see the
iteration's own writes, as serially), and records the final value of every key
the iteration wrote; the kernel applies them to the row in place, in iteration
order.  Two modes:

- ``row``: every write is one level under the row (``S[i][k] = v``, ``S[i, k] += v``);
  the kernel writes ``S[i][k]`` for each key written;
- ``value``: every write is the element itself (``S[i] = v``, ``S[i] += v``); the
  kernel writes ``S[i] = final``.

The detector is strict: any other use of ``S`` (a method call on a row other
than the pure ones, ``S[i, c].mean()``, a row passed to a function that could
change it, ``S`` without its own index, a deeper write) leaves ``S`` to the
ordinary rules, which refuse it.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from gpucell.core.analysis.scope import SAFE_BUILTINS

__all__ = ["OwnRow", "find_own_rows", "metadata_only", "own_chain"]

#: attributes of a row that only read it (numpy and torch metadata)
READ_ATTRS = frozenset({"shape", "dtype", "ndim", "size"})

#: methods of numpy arrays and torch tensors (and lists) that read their
#: receiver and return a new object, never the receiver, a view of it or
#: anything sharing its memory (so ``.reshape``, ``.view``, ``.T``, ``.ravel``,
#: ``.detach``, ``.numpy``, ``.float``, ``.to``, ``.astype`` are not here: they
#: may hand back the row itself or its memory); an ``out=`` argument is refused
PURE_METHODS = frozenset(
    {
        "mean", "sum", "std", "var", "min", "max", "prod", "argmin", "argmax",
        "all", "any", "item", "tolist", "copy", "clone", "cumsum", "cumprod",
        "round", "clip", "clamp", "abs", "median", "norm", "nanmean", "nansum",
        "count_nonzero", "dot", "count", "index",
    }
)  # fmt: skip

Mode = Literal["row", "value"]


@dataclass(frozen=True)
class OwnRow:
    """``name`` is written only at ``name[index]`` (``mode``: see module doc)."""

    name: str
    index: str
    mode: Mode
    line: int
    augmented: bool
    #: one write statement, outside nested loops, every read before it: the
    #: plain own-element rule (or a keyed reduction) covers it already
    simple: bool = False
    #: lines of the whole-element writes whose value the body then hands to a
    #: function or method (``d[k] = [x]``, then ``f(d[k])``): what that value
    #: holds from outside the iteration is checked on the engines
    handed: tuple[int, ...] = ()


def own_chain(node: ast.Subscript, name: str, index: str) -> tuple[int, ...] | None:
    """Depth of the chain whose base subscript ``node`` is ``name[index]`` or
    ``name[index, ...]``: ``(levels,)`` of the first subscript, or ``None``."""
    if not (isinstance(node.value, ast.Name) and node.value.id == name):
        return None
    key = node.slice
    if isinstance(key, ast.Name) and key.id == index:
        return (1,)
    if (
        isinstance(key, ast.Tuple)
        and key.elts
        and isinstance(key.elts[0], ast.Name)
        and key.elts[0].id == index
        and not any(isinstance(e, ast.Starred) for e in key.elts)
    ):
        return (len(key.elts),)
    return None


def _metadata_read(node: ast.Name, parent: ast.AST | None) -> bool:
    """``S.shape`` (``ndim``, ``dtype``, ``size``) or ``len(S)``: what writes to
    elements of ``S`` cannot change."""
    if isinstance(parent, ast.Attribute):
        return parent.value is node and parent.attr in READ_ATTRS
    return (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id == "len"
        and parent.args == [node]
        and not parent.keywords
    )


def metadata_only(expr: ast.AST, name: str) -> bool:
    """Does ``expr`` read ``name`` only through :func:`_metadata_read`?"""
    parents = _parents([expr])
    return all(
        _metadata_read(n, parents.get(id(n)))
        for n in ast.walk(expr)
        if isinstance(n, ast.Name) and n.id == name
    )


def _parents(body: Iterable[ast.AST]) -> dict[int, ast.AST]:
    out: dict[int, ast.AST] = {}
    for s in body:
        for node in ast.walk(s):
            for child in ast.iter_child_nodes(node):
                out[id(child)] = node
    return out


def _binds(node: ast.AST, name: str) -> bool:
    """Does ``node`` (a comprehension, lambda or def) bind ``name`` itself?"""
    if isinstance(node, ast.comprehension):
        return any(
            isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.target)
        )
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return any(_binds(g, name) for g in node.generators)
    if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
        return True  # a nested scope: rows are not followed into it
    return False


def _use_ok(
    top: ast.expr,
    parent: ast.AST | None,
    is_builtin: Callable[[str], bool],
) -> bool:
    """Is a read of the chain ``top`` one that cannot change the row?"""
    if isinstance(parent, ast.Attribute):
        return parent.attr in READ_ATTRS
    if isinstance(parent, ast.Call):
        if parent.func is top:
            return False
        f = parent.func
        if isinstance(f, ast.Name):
            return f.id in SAFE_BUILTINS and is_builtin(f.id)
        return (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "math"
        )
    if isinstance(parent, (ast.keyword, ast.Starred)):
        return False
    return not isinstance(
        parent, (ast.Delete, ast.With, ast.withitem, ast.NamedExpr, ast.Await)
    )


def _method_call(
    top: ast.expr, up: ast.AST | None, parents: dict[int, ast.AST]
) -> bool:
    """``S[i].append(x)``: a method called on the row itself."""
    return (
        isinstance(up, ast.Attribute)
        and up.value is top
        and isinstance(parents.get(id(up)), ast.Call)
        and getattr(parents.get(id(up)), "func", None) is up
    )


#: numpy and torch functions that read their arguments and return a new
#: object (not ``asarray``/``as_tensor``, which may return the argument)
PURE_FUNCTIONS = frozenset(
    {
        "mean", "std", "var", "sum", "min", "max", "amin", "amax", "median",
        "prod", "abs", "sqrt", "exp", "log", "nanmean", "nansum", "nanstd",
        "argmax", "argmin", "count_nonzero", "all", "any", "dot",
    }
)  # fmt: skip


def _pure_function_call(top: ast.expr, up: ast.AST | None) -> bool:
    """``np.mean(S[i, c])``: the row (or a part) passed to one of numpy's or
    torch's :data:`PURE_FUNCTIONS`, without ``out=``: a read."""
    if not (isinstance(up, ast.Call) and up.func is not top and top in up.args):
        return False
    f = up.func
    return (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and f.value.id in ("np", "numpy", "torch")
        and f.attr in PURE_FUNCTIONS
        and not any(k.arg == "out" for k in up.keywords)
    )


def _pure_method_call(
    top: ast.expr, up: ast.AST | None, parents: dict[int, ast.AST]
) -> bool:
    """``S[i, c].mean()``: a method of :data:`PURE_METHODS` called on the row
    (or a part of it) without ``out=``: a read."""
    if not _method_call(top, up, parents):
        return False
    assert isinstance(up, ast.Attribute)
    call = parents.get(id(up))
    assert isinstance(call, ast.Call)
    return up.attr in PURE_METHODS and not any(k.arg == "out" for k in call.keywords)


def _passed_to_call(
    top: ast.expr, up: ast.AST | None, parents: dict[int, ast.AST]
) -> bool:
    """``f(S[k])``, ``log.info("%s", S[k])``, ``f(x=S[k])``: the element
    handed to a function as an argument."""
    if isinstance(up, ast.keyword):
        return isinstance(parents.get(id(up)), ast.Call)
    return (
        isinstance(up, ast.Call)
        and up.func is not top
        and any(a is top for a in up.args)
    )


def _fresh_value(e: ast.expr, is_builtin: Callable[[str], bool]) -> bool:
    """A new object no one else holds: a display, a comprehension, a literal,
    ``list()``/``dict()``/``set()`` of anything."""
    if isinstance(
        e,
        (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp),
    ):
        return True
    if isinstance(e, ast.Constant):
        return True
    return (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id in ("list", "dict", "set", "bytearray")
        and is_builtin(e.func.id)
    )


def _may_alias(e: ast.expr) -> bool:
    """Could ``e`` evaluate to an object held elsewhere (``xs``, ``a.b[0]``)?
    Calls and operators make new objects, as elsewhere in the analysis."""
    if isinstance(e, (ast.Name, ast.Attribute, ast.Subscript, ast.Starred)):
        return True
    if isinstance(e, ast.IfExp):
        return _may_alias(e.body) or _may_alias(e.orelse)
    if isinstance(e, ast.BoolOp):
        return any(_may_alias(v) for v in e.values)
    if isinstance(e, ast.NamedExpr):
        return _may_alias(e.value)
    return False


def _fresh_first(
    name: str,
    body: list[ast.stmt],
    uses: list[ast.Name],
    is_builtin: Callable[[str], bool],
    display: bool = True,
) -> bool:
    """Does a top-level ``S[i] = <new object>`` come before every other use of
    ``S``?  Then the iteration never sees the row from before it (nor from an
    earlier iteration with the same key): it works on its own new object, even
    through method calls, and the row's final value is all that comes back.
    With ``display`` false (no method is called on the row) any value that is
    no alias of another object will do: ``scores[name] = est.score(X, y)``,
    then ``log.info("%s", scores[name])`` reads what the iteration wrote."""
    for pos, st in enumerate(body):
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            continue
        t = st.targets[0]
        if not (
            isinstance(t, ast.Subscript)
            and isinstance(t.value, ast.Name)
            and t.value.id == name
        ):
            continue
        if not _fresh_value(st.value, is_builtin) and (display or _may_alias(st.value)):
            return False
        later = {id(n) for s in body[pos + 1 :] for n in ast.walk(s)}
        return all(u is t.value or id(u) in later for u in uses)
    return False


def _candidate(
    name: str,
    index: str,
    body: list[ast.stmt],
    parents: dict[int, ast.AST],
    is_builtin: Callable[[str], bool],
    distinct: bool = True,
) -> OwnRow | None:
    writes: list[tuple[int, bool, ast.stmt]] = []
    reads: list[tuple[int, int]] = []
    uses: list[ast.Name] = []
    meta = methods = pure = calls = False
    for s in body:
        for node in ast.walk(s):
            if not (isinstance(node, ast.Name) and node.id == name):
                continue
            uses.append(node)
            base = parents.get(id(node))
            if _metadata_read(node, base) and not (
                isinstance(parents.get(id(base)), ast.Call)
                and getattr(parents.get(id(base)), "func", None) is base
            ):
                meta = True
                continue
            if not isinstance(base, ast.Subscript) or base.value is not node:
                return None
            depth = own_chain(base, name, index)
            if depth is None:
                return None
            if not distinct and isinstance(base.slice, ast.Tuple):
                # `results[a, b] = [a]` keyed by loop variables that may repeat:
                # for a dict that is one tuple key, not row `a`, column `b`
                # (the plain keyed write covers it)
                return None
            levels, top = depth[0], base
            up = parents.get(id(top))
            while isinstance(up, ast.Subscript) and up.value is top:
                levels, top = levels + 1, up
                up = parents.get(id(top))
            # i must mean the loop's index here: not a comprehension's or a
            # nested function's own name
            scope: ast.AST | None = base
            while scope is not None:
                if _binds(scope, index) or isinstance(scope, ast.Lambda):
                    return None
                scope = parents.get(id(scope))
            if isinstance(top.ctx, ast.Store):
                if isinstance(up, ast.Assign) and up.targets == [top]:
                    writes.append((levels, False, up))
                elif isinstance(up, ast.AugAssign) and up.target is top:
                    writes.append((levels, True, up))
                else:
                    return None
            elif _pure_method_call(top, up, parents) or _pure_function_call(top, up):
                pure = True  # reads it; the value it holds must be the row's own
                reads.append((node.lineno, node.col_offset))
            elif levels == 1 and _method_call(top, up, parents):
                methods = True  # allowed on a row made new in this iteration
                reads.append((node.lineno, node.col_offset))
            elif isinstance(top.ctx, ast.Del):
                return None
            elif not _use_ok(top, up, is_builtin):
                if not _passed_to_call(top, up, parents):
                    return None
                # `log.info("%s", S[k])`, `np.round(S[k][0])`: whole-element
                # rows only (their final value comes back whole)
                calls = True
                reads.append((node.lineno, node.col_offset))
            else:
                reads.append((node.lineno, node.col_offset))
    if not writes:
        return None
    depths = {d for d, _aug, _s in writes}
    if depths == {2}:
        mode: Mode = "row"
    elif depths == {1}:
        mode = "value"
    else:
        return None
    if calls and mode != "value":
        return None  # (a row handed to a function could be changed unrecorded)
    # an element handed to a function or a method may be changed in place:
    # it must be the iteration's own (no write stores an object from outside)
    if mode == "value" and not _value_ok(writes, meta, methods or calls or pure):
        return None
    if pure and any(
        isinstance(s, ast.Assign) and _may_alias(s.value) for _d, _a, s in writes
    ):
        # `S[i][k] = obj` then `S[i][k].mean()`: a method named like a pure one
        # on an object from outside the iteration could change it unseen
        return None
    if (methods or not distinct) and not _fresh_first(
        name, body, uses, is_builtin, display=methods
    ):
        return None
    row = _own_row(name, index, mode, writes, reads, parents)
    if calls or methods or pure:
        lines = tuple(
            sorted({st.lineno for _d, _a, st in writes if isinstance(st, ast.Assign)})
        )
        row = dataclasses.replace(row, handed=lines)
    return row


def _value_ok(
    writes: list[tuple[int, bool, ast.stmt]], meta: bool, methods: bool
) -> bool:
    """Whole-element writes read back: ``len(S)`` would change as new keys of
    a dict are written (serially, not on an engine), and ``S[i] = xs`` then
    ``S[i] += ...`` (or a method) would change ``xs`` in place."""
    if meta:
        return False
    if not (methods or any(aug for _d, aug, _s in writes)):
        return True
    return not any(
        isinstance(s, ast.Assign) and _may_alias(s.value) for _d, _a, s in writes
    )


def _own_row(
    name: str,
    index: str,
    mode: Mode,
    writes: list[tuple[int, bool, ast.stmt]],
    reads: list[tuple[int, int]],
    parents: dict[int, ast.AST],
) -> OwnRow:
    """The record, with ``simple`` set when the plain own-element rule fits."""
    first = min(s.lineno for _d, _a, s in writes)
    stmts = {id(s): s for _d, _a, s in writes}
    simple = False
    if len(stmts) == 1:
        (w,) = stmts.values()
        inside = {
            (n.lineno, n.col_offset) for n in ast.walk(w) if isinstance(n, ast.Name)
        }
        above: ast.AST | None = parents.get(id(w))
        looped = False
        while above is not None:
            looped = looped or isinstance(above, (ast.For, ast.AsyncFor, ast.While))
            above = parents.get(id(above))
        simple = not looped and all(
            r in inside or r < (w.lineno, w.col_offset) for r in reads
        )
    return OwnRow(
        name, index, mode, first, any(a for _d, a, _s in writes), simple=simple
    )


def find_own_rows(
    body: list[ast.stmt],
    index: str | None,
    candidates: Collection[str],
    is_builtin: Callable[[str], bool],
    distinct: bool = True,
) -> dict[str, OwnRow]:
    """The own-row sinks among ``candidates`` (names the body neither binds nor
    iterates over), given the loop's index ``index``.  An index that may repeat
    (``distinct=False``: any loop variable) is enough for a row the iteration
    first replaces with a new object (``h[k] = []``, then ``h[k].append(x)``):
    an earlier iteration with the same key cannot leak into it."""
    if index is None:
        return {}
    parents = _parents(body)
    found = {}
    for name in candidates:
        row = _candidate(name, index, body, parents, is_builtin, distinct)
        if row is not None:
            found[name] = row
    return found
