"""The iteration's own rows in the chunk program: reads and writes of
``S[i]`` (a row, a column, a key) go through a local copy of the row, which the
engine sends back, guarded where the row's key or value may alias another
iteration's."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any, cast

from gpucell.core.analysis.ownrows import OwnRow
from gpucell.core.analysis.reccalls import _const, _rec_call
from gpucell.protocol.program import (
    REC,
    Method,
    own_keys_name,
    own_name,
)

__all__: list[str] = []


class _OwnRowRewriter(ast.NodeTransformer):
    """``S[i]`` -> the iteration's private row ``__gpucell_own_S__`` (``S[i, k]``
    -> ``__gpucell_own_S__[k]``), and each write to it followed by a note of
    the key written (see ownrows.py).  Keys and values are evaluated once, in
    the order Python evaluates the original statement."""

    def __init__(self, rows: Mapping[str, OwnRow]) -> None:
        self.rows = rows
        self._tmp = 0

    def _name(self, n: str, ctx: ast.expr_context, loc: ast.AST) -> ast.Name:
        return ast.copy_location(ast.Name(n, ctx), loc)

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        v = node.value
        row = self.rows.get(v.id) if isinstance(v, ast.Name) else None
        if row is None:
            return self.generic_visit(node)
        key = node.slice
        if isinstance(key, ast.Name) and key.id == row.index:
            return self._name(own_name(row.name), node.ctx, node)
        if isinstance(key, ast.Tuple) and key.elts:  # S[i, k...] -> own[k...]
            rest = [self.visit(e) for e in key.elts[1:]]
            inner: ast.expr = (
                rest[0]
                if len(rest) == 1
                else ast.copy_location(ast.Tuple(rest, ast.Load()), key)
            )
            own = self._name(own_name(row.name), ast.Load(), node)
            return ast.copy_location(ast.Subscript(own, inner, node.ctx), node)
        return self.generic_visit(node)

    def _target(self, t: ast.expr) -> tuple[str, ast.expr] | None:
        """(row name, rewritten target) when ``t`` writes an own row."""
        new = self.visit(t)
        for name in self.rows:
            own = own_name(name)
            if isinstance(new, ast.Name) and new.id == own:
                return name, new
            if (
                isinstance(new, ast.Subscript)
                and isinstance(new.value, ast.Name)
                and new.value.id == own
            ):
                return name, new
        return None

    def _tmp_name(self, what: str, loc: ast.AST) -> tuple[ast.Name, ast.Name]:
        self._tmp += 1
        n = f"__gpucell_{what}{self._tmp}__"
        return self._name(n, ast.Store(), loc), self._name(n, ast.Load(), loc)

    def _written(self, name: str, key: ast.expr | None, loc: ast.stmt) -> ast.stmt:
        keys = own_keys_name(name)
        if key is None:  # the whole element: a flag
            return ast.copy_location(
                ast.Assign([self._name(keys, ast.Store(), loc)], _const(True, loc)),
                loc,
            )
        return _rec_call(Method.TOUCH, [self._name(keys, ast.Load(), loc), key], loc)

    def _write(
        self, node: ast.Assign | ast.AugAssign, target: ast.expr
    ) -> list[ast.stmt] | None:
        hit = self._target(target)
        if hit is None:
            return None
        name, new = hit
        out: list[ast.stmt] = []
        value = self.visit(node.value)
        if isinstance(node, ast.Assign):
            v_store, v_load = self._tmp_name("v", node)
            out.append(ast.copy_location(ast.Assign([v_store], value), node))
            value = v_load
        key_load: ast.expr | None = None
        if isinstance(new, ast.Subscript):
            k_store, key_load = self._tmp_name("k", node)
            out.append(ast.copy_location(ast.Assign([k_store], new.slice), node))
            new = ast.copy_location(
                ast.Subscript(new.value, key_load, ast.Store()), new
            )
        if isinstance(node, ast.Assign):
            out.append(ast.copy_location(ast.Assign([new], value), node))
        else:
            aug_target = cast("ast.Name | ast.Subscript", new)
            out.append(
                ast.copy_location(ast.AugAssign(aug_target, node.op, value), node)
            )
        out.append(self._written(name, key_load, node))
        return out

    def visit_Assign(self, node: ast.Assign) -> Any:
        if len(node.targets) == 1:
            done = self._write(node, node.targets[0])
            if done is not None:
                return done
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        done = self._write(node, node.target)
        return done if done is not None else self.generic_visit(node)

    def wrap(self, body: list[ast.stmt], loc: ast.AST) -> list[ast.stmt]:
        """Each row's private copy before the body; its writes recorded after
        (also after ``continue``)."""
        before: list[ast.stmt] = []
        after: list[ast.stmt] = []
        for name, row in self.rows.items():
            index = self._name(row.index, ast.Load(), loc)
            copy_call = ast.copy_location(
                ast.Call(
                    func=ast.copy_location(
                        ast.Attribute(
                            self._name(REC, ast.Load(), loc),
                            Method.OWN_COPY,
                            ast.Load(),
                        ),
                        loc,
                    ),
                    args=[self._name(name, ast.Load(), loc), index],
                    keywords=[],
                ),
                loc,
            )
            before.append(
                ast.copy_location(
                    ast.Assign(
                        [self._name(own_name(name), ast.Store(), loc)], copy_call
                    ),
                    loc,
                )
            )
            start: ast.expr = (
                ast.copy_location(ast.Dict([], []), loc)
                if row.mode == "row"
                else _const(False, loc)
            )
            before.append(
                ast.copy_location(
                    ast.Assign(
                        [self._name(own_keys_name(name), ast.Store(), loc)], start
                    ),
                    loc,
                )
            )
            after.append(
                _rec_call(
                    Method.OWN_DONE,
                    [
                        _const(name, loc),
                        self._name(row.index, ast.Load(), loc),
                        self._name(own_name(name), ast.Load(), loc),
                        self._name(own_keys_name(name), ast.Load(), loc),
                    ],
                    loc,
                )
            )
        guarded = ast.copy_location(
            ast.Try(body=body, handlers=[], orelse=[], finalbody=after), loc
        )
        return [*before, guarded]


def _key_guard(name: str, key: str, how: str, loc: ast.AST) -> ast.stmt:
    """Each iteration: an own element or row of anything but a dict under a
    key that may name another iteration's element.  ``y[-3]`` and ``y[0]``
    are one element of a 3-item list (``how == "range"``: ``range(k, n)``);
    the items of ``set(idx)`` (``"any"``) may also be ``True`` or a tuple,
    which overlap ``a[0]`` of an array, or mix ``0`` and ``"a"``, one element
    of a Series labelled by strings: only non-negative ints (not of a Series)
    and a DataFrame's string labels pass.  Serially the later iteration reads
    what the earlier wrote, on an engine the value from before the loop: the
    iteration raises instead, and nothing is merged."""
    text = (
        f"%%gpu_parallel: the loop writes `{name}[{key}]` as each iteration's "
        f"own item, and `{key}` is {{!r}}, which may name the element of "
        f"another iteration (`{name}[-1]` is the last element, `{name}[True]` "
        f"or `{name}[(0, 1)]` overlap `{name}[0]` of an array), so two "
        f"iterations could share one. Loop over positions that cannot "
        f"(`range(len({name}))`), or run the cell without %%gpu_parallel. "
        f"Nothing from the loop was merged."
    )
    b = "__import__('builtins')"
    kind = f"{b}.type({name})"
    pandas = f"{kind}.__module__.startswith('pandas')"
    if how == "range":  # ints
        bad = f"{key} < 0"
    elif how == "mapping":  # `for k in d`: keys of a dict, columns of a frame
        bad = f"not ({pandas} and {kind}.__name__ == 'DataFrame')"
    else:
        # a non-negative int of anything but a Series (which takes `s[0]` as
        # a position or a label, as its labels are strings or not); a string
        # of a DataFrame (a column's label, never a position)
        bad = (
            f"not (({b}.type({key}) is {b}.int and {key} >= 0 and not "
            f"({pandas} and {kind}.__name__ == 'Series')) or ({b}.type({key}) "
            f"is {b}.str and {pandas} and {kind}.__name__ == 'DataFrame'))"
        )
    src = (
        f"if ({bad}) and not {b}.isinstance({name}, {b}.dict):\n"
        f"    raise {b}.IndexError({text!r}.format({key}))\n"
    )
    if how == "mapping":
        src = src.replace(
            f"{text!r}.format({key})",
            f"{_mapping_text(name, key)!r}.format({b}.type({name}).__name__)",
        )
    guard = ast.parse(src).body[0]
    for node in ast.walk(guard):
        ast.copy_location(node, loc)
    return guard


def _mapping_text(name: str, key: str) -> str:
    return (
        f"%%gpu_parallel: the loop iterates over `{name}` and writes "
        f"`{name}[{key}]` as each iteration's own item, which holds only for a "
        f"dict (distinct keys) or a DataFrame (distinct columns); `{name}` is a "
        f"{{}}, whose items may repeat or be its values. Loop over "
        f"`range(len({name}))` for positions, or run the cell without "
        f"%%gpu_parallel. Nothing from the loop was merged."
    )


def _value_row_guard(row: OwnRow, loc: ast.AST) -> ast.stmt:
    """Before a chunk: whole elements read back (``y[i] = 0``, ``y[i] += v``)
    only of a list or a dict, which store what they are given.  A frame aligns
    what it stores to its index and an array casts it to its dtype (the kernel
    refuses arrays before the loop), while the engine's private element would
    keep the value as written: numbers that differ without a word.  The chunk
    raises instead, and nothing is merged."""
    name = row.name
    text = (
        f"%%gpu_parallel: `{name}` (line {row.line}) is a {{}} whose elements "
        f"the loop assigns whole and reads back; gpucell does that only for "
        f"lists and dicts, which store what they are given (a frame aligns "
        f"what it stores, an array casts it, and an engine's private element "
        f"would not). Keep the value in a local and store it once (`v = ...`, "
        f"then `{name}[{row.index}] = v`), or run the cell without %%gpu_parallel. "
        f"Nothing from the loop was merged."
    )
    src = (
        f"if not isinstance({name}, (__import__('builtins').list, "
        "__import__('builtins').dict)):\n"
        f"    raise __import__('builtins').TypeError({text!r}.format("
        f"__import__('builtins').type({name}).__name__))\n"
    )
    guard = ast.parse(src).body[0]
    for node in ast.walk(guard):
        ast.copy_location(node, loc)
    return guard
