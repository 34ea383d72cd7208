"""Own elements and keys: when the iteration writes only at its own element
(``S[i]``, ``df[c]``) and when the loop's keys are distinct, so that writes of
different iterations never meet."""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpucell.core.analysis.ownrows import OwnRow, find_own_rows, metadata_only
from gpucell.core.analysis.scope import (
    bindings_of,
    block_statements,
    root_name,
    target_names,
    target_parts,
)
from gpucell.core.analysis.sinks import Candidate
from gpucell.core.analysis.taint import _is_range, _lazy_names

__all__ = []


def _int_literal(e: ast.expr) -> int | None:
    """``3`` or ``-3`` written as a literal (not a bool), else ``None``."""
    sign = 1
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        sign, e = -1, e.operand
    if isinstance(e, ast.Constant) and type(e.value) is int:
        return sign * e.value
    return None


def _own_index(
    loop_target: ast.expr, loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> str | None:
    """The loop's index name when every iteration has a distinct one: the target
    of ``range(...)``, or the first name of ``enumerate(...)``'s target."""
    if loop_iter is None:
        return None
    if _is_range(loop_iter, is_builtin) and isinstance(loop_target, ast.Name):
        return loop_target.id
    if (
        isinstance(loop_iter, ast.Attribute)
        and loop_iter.attr == "index"
        and isinstance(loop_target, ast.Name)
    ):
        # a frame's labels (`for idx in df.index`): distinct when the index is
        # unique, which the kernel checks before the loop runs
        return loop_target.id
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Attribute)
        and loop_iter.func.attr in ("iterrows", "items")
        and not loop_iter.args
        and isinstance(loop_target, ast.Tuple)
        and loop_target.elts
        and isinstance(loop_target.elts[0], ast.Name)
    ):
        # pandas rows by label: distinct when the index is unique, which the
        # kernel checks before the loop runs
        return loop_target.elts[0].id
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Name)
        and loop_iter.func.id == "enumerate"
        and is_builtin("enumerate")
        and isinstance(loop_target, ast.Tuple)
        and loop_target.elts
        and isinstance(loop_target.elts[0], ast.Name)
    ):
        return loop_target.elts[0].id
    return None


def _labels_owner(loop_iter: ast.expr | None) -> str | None:
    """``X`` when the loop iterates over ``X``'s labels (``X.index``,
    ``X.iterrows()``, ``X.items()``), else ``None`` (positions: distinct)."""
    node = loop_iter
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr not in ("iterrows", "items"):
            return None
        node = node.func
    elif not (isinstance(node, ast.Attribute) and node.attr == "index"):
        return None
    base = node.value if isinstance(node, ast.Attribute) else None
    return base.id if isinstance(base, ast.Name) else "<expression>"


#: calls whose items are distinct by construction (hash-equal items collapse)
_DISTINCT_MAKERS = frozenset({"set", "frozenset"})
#: builtins that keep the items of a distinct iterable distinct
_DISTINCT_KEEPERS = frozenset({"sorted", "list", "tuple", "reversed"})


def _columns_of(e: ast.expr) -> str | None:
    """``X`` for ``X.columns``, ``X.columns[a:b]``, ``X.columns.tolist()``,
    ``X.columns.drop(...)``, ``X.select_dtypes(...).columns``, ``X.keys()``:
    labels of ``X``'s columns (or a dict's keys), distinct when ``X``'s are
    (which the kernel checks for a written ``X``), else ``None``."""
    while True:
        if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Slice):
            e = e.value  # a slice keeps them distinct (not a list of positions)
        elif (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and e.func.attr in ("tolist", "to_list", "drop")
        ):
            e = e.func.value  # (a subset, in order)
        else:
            break
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
        if e.func.attr == "keys" and not e.args and not e.keywords:
            base = e.func.value
            return base.id if isinstance(base, ast.Name) else None
    if not (isinstance(e, ast.Attribute) and e.attr == "columns"):
        return None
    base = e.value
    if (
        isinstance(base, ast.Call)
        and isinstance(base.func, ast.Attribute)
        and base.func.attr == "select_dtypes"
    ):
        base = base.func.value
    return base.id if isinstance(base, ast.Name) else None


def _distinct_items(
    e: ast.expr, is_builtin: Callable[[str], bool]
) -> tuple[bool, str | None]:
    """Whether every item of the iterable ``e`` is a key no other item equals,
    and of which name's labels that depends on: ``(True, None)`` for a
    literal of distinct constants, ``set(...)``, ``dict.fromkeys(...)`` (and
    ``sorted``/``list``/``tuple`` of those); ``(True, "X")`` for ``X``'s
    columns; ``(False, None)`` when items may repeat (``for c in cols``)."""
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        # strings or ints only: `True` and `None` index a whole array (a mask,
        # a new axis), `...` too; `-3` is no constant (a negative position)
        values = [v.value if isinstance(v, ast.Constant) else None for v in e.elts]
        if not all(
            isinstance(v, (str, int, bytes)) and not isinstance(v, bool) for v in values
        ):
            return False, None
        # one type: a Series takes `s[0]` as the first position when its
        # labels are strings, so `[0, "a"]` may name one element twice
        one_type = len({type(v) for v in values}) <= 1
        return one_type and len(set(values)) == len(values), None
    if isinstance(e, ast.Call) and not e.keywords:
        f = e.func
        if isinstance(f, ast.Attribute) and f.attr == "copy" and not e.args:
            # `for k in prices.copy()`: the same keys (a list's items are its
            # values: the engine program checks a written one is a mapping)
            return _distinct_items(f.value, is_builtin)
        if isinstance(f, ast.Name) and is_builtin(f.id) and len(e.args) == 1:
            if f.id in _DISTINCT_MAKERS:
                return True, None
            if f.id in _DISTINCT_KEEPERS:
                return _distinct_items(e.args[0], is_builtin)
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "fromkeys"
            and isinstance(f.value, ast.Name)
            and f.value.id == "dict"
            and is_builtin("dict")
            and len(e.args) == 1
        ):
            return True, None
    if isinstance(e, ast.Name):
        # the written mapping itself (`for k in settings: settings[k] = ...`):
        # a dict's keys, a frame's columns; the engine program checks it is one
        return True, e.id
    owner = _columns_of(e)
    return owner is not None, owner


def _nonnegative(e: ast.expr) -> bool:
    n = _int_literal(e)
    return n is not None and n >= 0


def _key_check(
    loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> str | None:
    """Which keys of ``loop_iter`` may name one element twice: ``"range"``
    for a ``range`` that may reach negative positions (``range(k, n)``; not
    ``range(n)``, ``range(1, n)``, ``range(n - 1, -1, -1)``), ``"any"`` for
    the items of ``set(..)``, ``dict.fromkeys(..)`` (distinct as dict keys,
    not as positions), ``"mapping"`` for the written sink itself (``for k in
    d``: keys only if ``d`` is a dict or a frame), ``None`` for
    ``enumerate``, labels, columns and literals of strings and ints."""
    if loop_iter is None:
        return None
    if _is_range(loop_iter, is_builtin):
        assert isinstance(loop_iter, ast.Call)
        args = loop_iter.args
        step = _int_literal(args[2]) if len(args) == 3 else 1
        if len(args) <= 1:
            return None
        if step is not None and step > 0 and _nonnegative(args[0]):
            return None
        stop = _int_literal(args[1]) if len(args) > 1 else None
        if step is not None and step < 0 and stop is not None and stop >= -1:
            return None
        return "range"
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Name)
        and loop_iter.func.id == "enumerate"
        and is_builtin("enumerate")
    ):
        return None
    if _labels_owner(loop_iter) is not None or isinstance(
        loop_iter, (ast.List, ast.Tuple, ast.Set)
    ):
        return None
    inner = loop_iter
    while (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id in _DISTINCT_KEEPERS
        and is_builtin(inner.func.id)
        and len(inner.args) == 1
    ):
        inner = inner.args[0]
    if isinstance(inner, ast.Name):
        return "mapping"  # (iterating a list gives values, not keys)
    return None if _columns_of(loop_iter) is not None else "any"


def _own_key(
    loop_target: ast.expr, loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> tuple[str, str | None] | None:
    """``(k, owner)`` when the loop's variable ``k`` is a distinct key in
    every iteration, not a position: a column of ``owner``'s (``for c in
    df.columns``) or one of a literal list of distinct names (``for c in
    ["a", "b"]``, ``owner`` ``None``).  ``for c in cols`` is not: a list's
    items may repeat, and serially the second ``df[c] = f(df[c])`` would read
    what the first wrote."""
    if loop_iter is None or not isinstance(loop_target, ast.Name):
        return None
    distinct, owner = _distinct_items(loop_iter, is_builtin)
    return (loop_target.id, owner) if distinct else None


def _is_own_key(key: ast.expr, i: str) -> bool:
    """``i``, or a tuple led by ``i`` (``a[i, 0]``, ``df.at[i, "c"]``): the
    iteration's own row."""
    if isinstance(key, ast.Tuple) and key.elts:
        key = key.elts[0]
    return isinstance(key, ast.Name) and key.id == i


def _own_elements(
    writes: dict[str, list[Candidate]],
    body: list[ast.stmt],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    bound: set[str],
    is_builtin: Callable[[str], bool],
    several: dict[str, tuple[str, list[int]]] | None = None,
) -> dict[str, str]:
    """Write sinks ``S`` the iteration reads and writes only at its own element:
    one statement ``S[i] = ...`` (not inside a nested loop) with ``i`` the loop's
    distinct, never reassigned index, and every read of ``S`` an ``S[i]`` in that
    statement's value or before it.  Iteration ``i`` alone touches ``S[i]``, and
    reads it only before writing it, so it sees the value from before the loop,
    serially as on an engine.

    ``several`` receives ``S -> (i, lines)`` for the sinks read and written
    only at ``S[i]`` but written by more than one statement (or in a nested
    loop), for the refusal's advice: write it once from a local."""
    i = _own_index(loop_target, loop_iter, is_builtin)
    # labels (`X.index`, `X.iterrows()`, `X.items()`, `X.columns`) are distinct
    # only when X's labels are unique, which the kernel checks for the written
    # sink: so they are the own index of X alone, never of another name
    # written with them
    labels_of = _labels_owner(loop_iter)
    if i is None:
        # a distinct key (`for c in df.columns: df[c] = df[c].fillna(0)`)
        key = _own_key(loop_target, loop_iter, is_builtin)
        if key is not None:
            i, labels_of = key
    if i is None or i in bound:  # `bound`: what the body itself assigns
        return {}
    in_loops = {
        id(s)
        for outer in block_statements(body)
        if isinstance(outer, (ast.For, ast.AsyncFor, ast.While))
        for s in block_statements([*outer.body, *outer.orelse])
    }
    out = {}
    for name, cands in writes.items():
        if labels_of is not None and labels_of != name:
            continue
        stmts = {id(c.stmt): c.stmt for c in cands}
        if len(stmts) != 1 or any(id(w) in in_loops for w in stmts.values()):
            if several is not None and _only_at(name, i, body):
                several[name] = (i, sorted({w.lineno for w in stmts.values()}))
            continue
        (w,) = stmts.values()
        if isinstance(w, ast.Delete):
            if _deletes_own_key(w, name, i, loop_iter, body):
                out[name] = i
            continue
        if not isinstance(w, ast.Assign):
            continue
        keys = [
            part.slice
            for t in w.targets
            for part in target_parts(t)
            if isinstance(part, ast.Subscript)
            and root_name(part.value) is not None
            and root_name(part.value).id == name  # type: ignore[union-attr]
        ]
        if not keys or not all(_is_own_key(k, i) for k in keys):
            continue
        # the write's own `S` (a Load inside the Subscript target) is no read
        inside = {id(n) for n in ast.walk(w.value)} | {
            id(n)
            for t in w.targets
            for part in target_parts(t)
            if isinstance(part, ast.Subscript)
            for n in ast.walk(part.value)
        }
        start = (w.lineno, w.col_offset)
        reads_ok = all(
            id(node) in inside or (node.lineno, node.col_offset) < start
            for s in body
            for node in ast.walk(s)
            if isinstance(node, ast.Name)
            and node.id == name
            and isinstance(node.ctx, ast.Load)
        )
        if reads_ok:
            out[name] = i
    return out


def _deletes_own_key(
    w: ast.Delete,
    name: str,
    i: str,
    loop_iter: ast.expr | None,
    body: list[ast.stmt],
) -> bool:
    """``del D[k]`` with ``k`` the loop's own key of ``D``, ``D`` read only as
    ``D[k]`` and only before the ``del``, and the loop not iterating ``D``
    itself (serially deleting from a dict being iterated raises): iteration
    ``k`` alone removes ``D[k]``, and reads only what was there before."""
    if len(w.targets) != 1:
        return False
    (t,) = w.targets
    if not (
        isinstance(t, ast.Subscript)
        and isinstance(t.value, ast.Name)
        and t.value.id == name
        and isinstance(t.slice, ast.Name)
        and t.slice.id == i
    ):
        return False
    if loop_iter is None or any(
        isinstance(n, ast.Name) and n.id == name
        for n in ([loop_iter] if isinstance(loop_iter, ast.Name) else [])
    ):
        return False
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Attribute)
        and isinstance(loop_iter.func.value, ast.Name)
        and loop_iter.func.value.id == name
    ):
        return False  # (`D.keys()`, `D.items()`: a live view)
    start = (w.lineno, w.col_offset)
    for s in body:
        for node in ast.walk(s):
            for child in ast.iter_child_nodes(node):
                if not (isinstance(child, ast.Name) and child.id == name):
                    continue
                if child is t.value:
                    continue
                at_own = (
                    isinstance(node, ast.Subscript)
                    and node.value is child
                    and _is_own_key(node.slice, i)
                )
                if not at_own or (child.lineno, child.col_offset) >= start:
                    return False
    return True


def _only_at(name: str, i: str, body: list[ast.stmt]) -> bool:
    """Is every use of ``name`` in ``body`` a subscript at the own key ``i``?"""
    for s in body:
        for node in ast.walk(s):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Name) and child.id == name:
                    if not (
                        isinstance(node, ast.Subscript)
                        and node.value is child
                        and _is_own_key(node.slice, i)
                    ):
                        return False
    return True


def _own_rows(
    body: list[ast.stmt],
    nodes: list[ast.AST],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    bound: set[str],
    is_builtin: Callable[[str], bool],
) -> dict[str, OwnRow]:
    """Sinks written and read back under the loop's own position index (from
    ``range`` or ``enumerate``; labels can repeat across objects), or under any
    loop variable for a row the iteration first makes new (``h[k] = []``);
    never the iterable itself (its items would not see the writes on an
    engine)."""
    rebound = bindings_of(nodes)
    iterated = (
        {
            n.id
            for n in _lazy_names(loop_iter, is_builtin)
            if not metadata_only(loop_iter, n.id)
        }
        if loop_iter
        else set()
    )
    names = (
        {
            n.id
            for st in body
            for n in ast.walk(st)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        - bound
        - iterated
    )
    i = (
        None
        if _labels_owner(loop_iter)
        else _own_index(loop_target, loop_iter, is_builtin)
    )
    rows: dict[str, OwnRow] = {}
    if i is not None and i not in rebound:
        rows = find_own_rows(body, i, sorted(names - {i}), is_builtin)
    for t in target_names(loop_target):
        if t.id != i and t.id not in rebound:
            left = sorted(names - set(rows) - {t.id})
            rows.update(find_own_rows(body, t.id, left, is_builtin, distinct=False))
    return {n: r for n, r in rows.items() if not (r.mode == "value" and r.simple)}
