"""Keys no iteration writes: a sink written at string keys (``ts[f"lag_{k}"]``,
``df["p" + c]``, new columns named from a literal list) may still be read at
other constant keys (``ts["y"]``), whose values are those from before the loop,
serially as in parallel."""

from __future__ import annotations

import ast

from gpucell.core.analysis.scope import block_statements, root_name, target_parts
from gpucell.core.analysis.sinks import Candidate

__all__: list[str] = []


def _column_key(e: ast.Subscript, indexers: tuple[str, ...]) -> str | None:
    """The constant string key of ``S["c"]`` (a column, a dict key), or of
    ``S.loc[rows, "c"]`` (the column part), else ``None``."""
    key: ast.expr = e.slice
    if isinstance(e.value, ast.Attribute):
        if e.value.attr not in indexers:
            return None
        if not (isinstance(key, ast.Tuple) and len(key.elts) == 2):
            return None
        key = key.elts[1]
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return None


def _literal_keys(
    loop_target: ast.expr, loop_iter: ast.expr | None, body: list[ast.stmt]
) -> dict[str, tuple[str, ...]]:
    """``{c: ("a", "b")}`` for ``for c in ["a", "b"]`` (a literal list or
    tuple of strings) whose ``c`` the body never rebinds: the keys ``S[c]``
    may read."""
    if not (
        isinstance(loop_target, ast.Name)
        and isinstance(loop_iter, (ast.List, ast.Tuple))
        and all(
            isinstance(v, ast.Constant) and isinstance(v.value, str)
            for v in loop_iter.elts
        )
    ):
        return {}
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, ast.Name) and n.id == loop_target.id:
                if not isinstance(n.ctx, ast.Load):
                    return {}
    return {loop_target.id: tuple(str(v.value) for v in loop_iter.elts)}  # type: ignore[attr-defined]


def _read_keys(
    e: ast.Subscript, indexers: tuple[str, ...], literal: dict[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """The string keys ``e`` may read: a constant's, or every item of the
    literal list the loop's variable walks (``for c in ["a", "b"]: S[c]``)."""
    key = _column_key(e, indexers)
    if key is not None:
        return (key,)
    part: ast.expr = e.slice
    if isinstance(e.value, ast.Attribute):
        if not (isinstance(part, ast.Tuple) and len(part.elts) == 2):
            return ()
        part = part.elts[1]
    if isinstance(part, ast.Name):
        return literal.get(part.id, ())
    return ()


def _differ(written: ast.expr, read: str) -> bool:
    """Is every value ``written`` can take (a key of the loop's writes) other
    than the string ``read``?  A constant other than it; an f-string or a
    ``"p" + x`` / ``x + "s"`` whose constant prefix (suffix) ``read`` does not
    start (end) with: every string it makes does."""
    if isinstance(written, ast.Constant):
        return isinstance(written.value, str) and written.value != read
    parts: list[ast.expr] = []
    if isinstance(written, ast.JoinedStr):
        parts = list(written.values)
    elif isinstance(written, ast.BinOp) and isinstance(written.op, ast.Add):
        parts = [written.left, written.right]
    if not parts:
        return False
    first, last = parts[0], parts[-1]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value:
        if not read.startswith(first.value):
            return True
    if isinstance(last, ast.Constant) and isinstance(last.value, str) and last.value:
        if not read.endswith(last.value):
            return True
    return False


def _write_keys(
    writes: dict[str, list[Candidate]],
    own_elements: dict[str, str],
    body: list[ast.stmt],
) -> dict[str, list[ast.expr]]:
    """Write sinks whose writes are all ``S[k] = ...`` (whole keys: a column,
    a dict key) or ``S.loc[rows, k] = ...`` with ``rows`` ``:`` or a mask made
    from ``S``'s own column (``m = S["c"] == v``: a boolean Series, so never a
    new row): S -> every key ``k`` written.  A read of ``S`` at a constant key
    that differs from every one of them sees the value from before the loop,
    serially as on an engine (`_Flow._own_read`)."""
    out: dict[str, list[ast.expr]] = {}
    bound: dict[str, list[ast.expr]] = {}
    for st in block_statements(body):
        for node in ast.walk(st):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                            v = node.value if isinstance(node, ast.Assign) else None
                            bound.setdefault(n.id, []).append(v)  # type: ignore[arg-type]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.NamedExpr)):
                for n in ast.walk(node):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        bound.setdefault(n.id, []).append(None)  # type: ignore[arg-type]
    for name, cands in writes.items():
        if name in own_elements:
            continue
        masks = {
            m
            for m, values in bound.items()
            if len(values) == 1 and values[0] is not None and _mask(values[0], name)
        }
        keys: list[ast.expr] = []
        for c in cands:
            if not isinstance(c.stmt, ast.Assign):
                break
            parts = [
                part
                for t in c.stmt.targets
                for part in target_parts(t)
                if isinstance(part, ast.Subscript)
                and root_name(part) is not None
                and root_name(part).id == name  # type: ignore[union-attr]
            ]
            if not parts or not all(_whole_key(p, name, masks) for p in parts):
                break
            keys += [_written_key(p) for p in parts]
        else:
            out[name] = keys
    return out


def _mask(e: ast.expr, name: str) -> bool:
    """``S["c"] == v`` (any comparison led by a column of ``S``), and ``&``,
    ``|``, ``~`` of such: a boolean Series of ``S``'s rows."""
    if isinstance(e, ast.Compare):
        left = e.left
        return (
            isinstance(left, ast.Subscript)
            and isinstance(left.value, ast.Name)
            and left.value.id == name
            and _column_key(left, indexers=()) is not None
        )
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.BitAnd, ast.BitOr)):
        return _mask(e.left, name) and _mask(e.right, name)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Invert):
        return _mask(e.operand, name)
    return False


def _whole_key(part: ast.Subscript, name: str, masks: set[str]) -> bool:
    """``S[k]``, or ``S.loc[mask, k]`` / ``S.loc[:, k]`` (rows that exist)."""
    if isinstance(part.value, ast.Name):
        return part.value.id == name and not isinstance(part.slice, ast.Slice)
    v = part.value
    if not (
        isinstance(v, ast.Attribute)
        and v.attr == "loc"
        and isinstance(v.value, ast.Name)
        and v.value.id == name
        and isinstance(part.slice, ast.Tuple)
        and len(part.slice.elts) == 2
    ):
        return False
    rows = part.slice.elts[0]
    return (
        isinstance(rows, ast.Slice)
        and rows.lower is None
        and rows.upper is None
        and rows.step is None
    ) or (isinstance(rows, ast.Name) and rows.id in masks)


def _written_key(part: ast.Subscript) -> ast.expr:
    key = part.slice
    if isinstance(part.value, ast.Attribute) and isinstance(key, ast.Tuple):
        return key.elts[1]
    return key
